//! The stall guard: a team whose turns stop making progress fails with
//! `team.stalled` after `stall_turns` such turns, with the evidence; a team
//! that keeps making progress never does.

use std::sync::Arc;

use crate::common::*;
use baton_run::{FailureKind, MemoryStore, Payload, Quota, Termination};
use baton_team::{Config, Decision, Mode, STALLED, TaskRequest, compile};
use proptest::prelude::*;
use serde_json::{Value, json};

/// What a scripted coordinator does on one turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Move {
    /// Continue with the same state and nothing to do: no progress.
    Idle,
    /// Continue with a changed state.
    Change,
    /// Wait on a new task (its outcome arrives before the next turn).
    Task,
}

/// A coordinator that plays `script` turn by turn (the state is a counter),
/// then completes with the state.
fn scripted(script: Vec<Move>, build: &str) -> baton_run::Program {
    policy(build, move |turn| {
        let counter: u64 = turn.state.decode().expect("a counter");
        let index = usize::try_from(turn.number - 1).expect("fits");
        Ok(match script.get(index) {
            None => Decision::complete(turn.state.clone(), turn.state.clone()),
            Some(Move::Idle) => Decision::new(Mode::Continue, turn.state.clone()),
            Some(Move::Change) => Decision::new(
                Mode::Continue,
                Payload::encode(&(counter + 1)).expect("encodes"),
            ),
            Some(Move::Task) => {
                Decision::new(Mode::Wait, turn.state.clone()).with_task(TaskRequest::new(
                    key(&format!("t{}", turn.number)),
                    name("test.echo"),
                    payload(json!(turn.number)),
                ))
            }
        })
    })
}

fn team_config(script: Vec<Move>, stall_turns: Quota) -> Config {
    let mut config = config(
        scripted(script, "stall 1"),
        vec![worker(Kind::Echo, "test.echo")],
    );
    config.stall_turns = stall_turns;
    config
}

async fn run(config: Config) -> Termination {
    let team = compile::<u64, Value>(config).expect("valid");
    let engine = engine(Arc::new(MemoryStore::new()), &team);
    let handle = engine
        .start(&team, request("stall", 0u64))
        .await
        .expect("starts");
    handle.join().await.expect("joins")
}

/// The turn at which a run of `limit` idle turns in a row is complete, if any.
fn stalls_at(script: &[Move], limit: usize) -> Option<usize> {
    let mut run = 0;
    for (index, step) in script.iter().enumerate() {
        run = if *step == Move::Idle { run + 1 } else { 0 };
        if run == limit {
            return Some(index + 1);
        }
    }
    None
}

#[tokio::test]
async fn a_coordinator_that_keeps_deciding_the_same_nothing_fails_team_stalled_with_the_evidence() {
    let ended = run(team_config(
        vec![Move::Idle; 10],
        baton_team::DEFAULT_STALL_TURNS,
    ))
    .await;
    let failure = ended.failure().expect("the team fails");
    assert_eq!(
        (failure.kind, failure.code()),
        (FailureKind::Execution, STALLED)
    );
    assert!(
        failure.message.contains("turns 1 to 3 made no progress"),
        "{}",
        failure.message
    );
}

#[tokio::test]
async fn without_the_guard_the_same_team_runs_into_its_turn_limit() {
    let mut config = team_config(vec![Move::Idle; 10], Quota::Unlimited);
    config.max_turns = Quota::Finite(5);
    let ended = run(config).await;
    let failure = ended.failure().expect("the team fails");
    assert_eq!(failure.code(), baton_team::LIMIT_TURNS);
}

#[test]
fn a_zero_stall_limit_is_refused_when_the_team_is_built() {
    let refused =
        compile::<u64, Value>(team_config(vec![], Quota::Finite(0))).expect_err("zero is refused");
    assert_eq!(refused.code(), "team.config.stall_turns");
}

fn moves() -> impl Strategy<Value = Vec<Move>> {
    prop::collection::vec(
        prop_oneof![Just(Move::Idle), Just(Move::Change), Just(Move::Task)],
        0..9,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Over scripted decision sequences: the team fails with `team.stalled`
    /// exactly when `limit` idle turns come in a row, at that turn; any
    /// other script completes.
    #[test]
    fn the_guard_fires_exactly_on_a_run_of_idle_turns(script in moves(), limit in 1u64..4) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let ended = runtime.block_on(run(team_config(script.clone(), Quota::Finite(limit))));
        match stalls_at(&script, usize::try_from(limit).expect("fits")) {
            Some(turn) => {
                let failure = ended.failure().expect("the team stalls");
                prop_assert_eq!(failure.code(), STALLED);
                let first = turn + 1 - usize::try_from(limit).expect("fits");
                let evidence = format!("turns {first} to {turn} made no progress");
                prop_assert!(failure.message.contains(&evidence), "{}", failure.message);
            }
            None => {
                prop_assert!(ended.failure().is_none(), "{:?}", ended.failure());
                let output: u64 = ended.output().expect("completed").decode().expect("a counter");
                let changes = script.iter().filter(|step| **step == Move::Change).count();
                prop_assert_eq!(output, changes as u64);
            }
        }
    }
}
