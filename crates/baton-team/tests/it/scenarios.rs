//! Teams run by the engine with scripted coordinators: continue and wait,
//! controls and receipts, follow-up work, outcomes during a turn (also
//! across a crash), completion, limits and failures.

use std::sync::Arc;

use crate::common::*;
use baton_run::log::RecordKind;
use baton_run::program::ChildSignal;
use baton_run::{
    Capabilities, Cause, FailureKind, MemoryStore, Name, Payload, Quota, RecoverOptions, Scope,
    SignalId, SignalRequest, Status, WaitId,
};
use baton_team::{Binding, Control, Decision, Mode, TaskRequest, compile};
use baton_testkit::{Cut, FaultStore};
use serde_json::{Value, json};

fn task(key_text: &str, worker: &str, input: Value) -> TaskRequest {
    TaskRequest::new(key(key_text), name(worker), payload(input))
}

/// A signal answering `wait` with `value`.
fn answer(id: &str, wait: WaitId, value: Value) -> SignalRequest {
    SignalRequest {
        id: SignalId::new(id).expect("valid"),
        wait: Some(wait),
        payload: payload(value),
    }
}

fn state(turn: &baton_team::Turn) -> Payload {
    turn.state.clone()
}

#[tokio::test]
async fn continue_runs_the_next_turn_while_a_task_runs_and_completion_cancels_it() {
    let seen = Seen::default();
    let log = seen.clone();
    let coordinator = policy("continue 1", move |turn| {
        log.record(turn);
        match turn.number {
            1 => Ok(Decision::new(Mode::Continue, state(turn)).with_task(task(
                "ask",
                "test.ask",
                json!("question"),
            ))),
            2 => {
                let ask = turn.task("ask").expect("the task is listed");
                assert!(ask.is_running(), "the task still runs in turn 2");
                Ok(Decision::complete(state(turn), payload(json!("done"))))
            }
            _ => Err(unexpected(turn)),
        }
    });
    let team = compile::<String, String>(config(coordinator, vec![worker(Kind::Ask, "test.ask")]))
        .expect("valid");
    let engine = engine(Arc::new(MemoryStore::new()), &team);
    let handle = engine
        .start(&team, request("continue", "start".to_owned()))
        .await
        .expect("starts");
    let ended = handle.join().await.expect("joins");
    assert_eq!(ended.output(), Some(&payload(json!("done"))));
    let ask = handle
        .child::<Value>(&key("ask"))
        .await_result()
        .await
        .expect("the task ended");
    assert_eq!(
        (ask.status(), ask.cause()),
        (Status::Canceled, Cause::ParentCancellation)
    );
    let view = handle.inspect().await.expect("inspects");
    assert!(
        view.processes.iter().all(|p| p.status.is_terminal()),
        "join waited for the drain"
    );
    assert_eq!(seen.turns().len(), 2);
}

#[tokio::test]
async fn signal_and_cancel_controls_are_receipted_and_the_canceled_task_drains_canceled() {
    let seen = Seen::default();
    let log = seen.clone();
    let coordinator = policy("controls 1", move |turn| {
        log.record(turn);
        match turn.number {
            1 => Ok(Decision::new(Mode::Continue, state(turn))
                .with_task(task("a", "test.ask", json!("a?")))
                .with_task(task("b", "test.ask", json!("b?")))),
            2 => {
                let a = turn.task("a").and_then(|t| t.process).expect("a runs");
                let answer = ChildSignal {
                    id: SignalId::new("answer-a").expect("valid"),
                    wait: Some(first_wait(a)),
                    payload: payload(json!("yes")),
                };
                Ok(Decision::new(Mode::Wait, state(turn))
                    .with_control(Control::signal(key("a"), answer))
                    .with_control(Control::cancel(key("b"), "not needed")))
            }
            _ if turn.tasks.iter().all(|t| t.outcome.is_some()) => {
                let summary: Vec<Value> = turn
                    .tasks
                    .iter()
                    .map(|t| {
                        json!([
                            t.key().as_str(),
                            t.status().expect("drained").to_string(),
                            t.output().map(Payload::to_value)
                        ])
                    })
                    .collect();
                Ok(Decision::complete(state(turn), payload(json!(summary))))
            }
            _ => Ok(Decision::new(Mode::Wait, state(turn))),
        }
    });
    let team = compile::<String, Value>(config(coordinator, vec![worker(Kind::Ask, "test.ask")]))
        .expect("valid");
    let engine = engine(Arc::new(MemoryStore::new()), &team);
    let handle = engine
        .start(&team, request("controls", "go".to_owned()))
        .await
        .expect("starts");
    let output = handle.output().await.expect("completes");
    assert_eq!(
        output,
        json!([["a", "completed", "yes"], ["b", "canceled", null]])
    );
    let turns = seen.turns();
    let third = &turns[2];
    assert_eq!(
        third.controls.len(),
        2,
        "turn 3 shows the receipts of turn 2's controls"
    );
    for receipt in &third.controls {
        assert!(
            matches!(receipt.result, baton_run::Settlement::Succeeded { .. }),
            "{receipt:?}"
        );
    }
    assert!(
        turns.iter().skip(3).all(|t| t.controls.is_empty()),
        "receipts appear once"
    );
}

#[tokio::test]
async fn follow_up_work_runs_under_a_new_key_carrying_the_prior_result() {
    let coordinator = policy("follow-up 1", |turn| match turn.number {
        1 => Ok(Decision::new(Mode::Wait, state(turn)).with_task(task(
            "draft",
            "test.echo",
            json!("draft of x"),
        ))),
        2 => {
            let draft = turn
                .task("draft")
                .and_then(|t| t.output())
                .expect("draft done");
            Ok(Decision::new(Mode::Wait, state(turn)).with_task(task(
                "review",
                "test.echo",
                json!({"previous": draft.to_value()}),
            )))
        }
        3 => {
            let review = turn
                .task("review")
                .and_then(|t| t.output())
                .expect("review done");
            Ok(Decision::complete(state(turn), review.clone()))
        }
        _ => Err(unexpected(turn)),
    });
    let team = compile::<String, Value>(config(coordinator, vec![worker(Kind::Echo, "test.echo")]))
        .expect("valid");
    let engine = engine(Arc::new(MemoryStore::new()), &team);
    let handle = engine
        .start(&team, request("follow-up", "x".to_owned()))
        .await
        .expect("starts");
    assert_eq!(
        handle.output().await.expect("completes"),
        json!({"previous": "draft of x"})
    );
}

#[tokio::test]
async fn reusing_a_task_key_is_an_invalid_decision() {
    let coordinator = policy("reuse 1", |turn| match turn.number {
        1 => Ok(Decision::new(Mode::Wait, state(turn)).with_task(task(
            "draft",
            "test.echo",
            json!(1),
        ))),
        _ => Ok(Decision::new(Mode::Wait, state(turn)).with_task(task(
            "draft",
            "test.echo",
            json!(2),
        ))),
    });
    let team = compile::<String, Value>(config(coordinator, vec![worker(Kind::Echo, "test.echo")]))
        .expect("valid");
    let engine = engine(Arc::new(MemoryStore::new()), &team);
    let handle = engine
        .start(&team, request("reuse", "x".to_owned()))
        .await
        .expect("starts");
    let ended = handle.join().await.expect("joins");
    let failure = ended.failure().expect("failed");
    assert_eq!(
        (failure.kind, failure.code()),
        (FailureKind::Contract, "team.decision.invalid")
    );
    assert!(
        failure.message.contains("already used"),
        "{}",
        failure.message
    );
}

/// The coordinator of turn 2 waits for the host; meanwhile the worker
/// finishes. Turn 3 shows the outcome, and `wait` does not block on it.
async fn outcome_during_a_turn(crash: bool) {
    let seen = Seen::default();
    let log = seen.clone();
    let coordinator = special_coordinator(Kind::Pause, 2, move |turn| {
        log.record(turn);
        match turn.number {
            1 => Ok(Decision::new(Mode::Continue, state(turn)).with_task(task(
                "w",
                "test.ask",
                json!("w?"),
            ))),
            2 => {
                assert!(turn.task("w").is_some_and(|t| t.is_running()));
                Ok(Decision::new(Mode::Wait, state(turn)))
            }
            3 => {
                let w = turn.task("w").expect("listed");
                Ok(Decision::complete(
                    state(turn),
                    w.output().expect("w completed").clone(),
                ))
            }
            _ => Err(unexpected(turn)),
        }
    });
    let team = compile::<String, Value>(config(coordinator, vec![worker(Kind::Ask, "test.ask")]))
        .expect("valid");
    let memory = MemoryStore::keeping_history();
    let faulty = FaultStore::new(Arc::new(memory.clone()));
    let first = engine(Arc::new(faulty.clone()), &team);
    let handle = first
        .start(&team, request("during", "go".to_owned()))
        .await
        .expect("starts")
        .into_handle();
    // Turn 1 decides at once; turn 2's coordinator pauses.
    let turn2 = handle.child::<Value>(&key("team.turn.2"));
    let pause = open_wait(&turn2).await;
    let w = handle.child::<Value>(&key("w"));
    let question = open_wait(&w).await;
    if crash {
        // The commit that adopts w's completing step is cut after it reached the store.
        faulty.arm(RecordKind::StepAdopted, Cut::After, 1);
    }
    let answered = w
        .signal(answer("answer-w", question, json!("from w")))
        .await;
    // With group commit the answer's admission may share the cut commit; it
    // reached the store either way.
    assert!(crash || answered.is_ok(), "{answered:?}");
    let (handle, turn2) = if crash {
        assert!(handle.await_result().await.is_err(), "the writer stopped");
        let tree = handle.tree();
        drop(first);
        let second = engine(faulty.inner(), &team);
        let report = second
            .recover(RecoverOptions::default())
            .await
            .expect("recovers");
        assert!(
            report.iter().all(|(_, result)| result.is_ok()),
            "{report:?}"
        );
        let handle = second
            .process::<Value>(&Scope::new("acme").expect("valid"), tree)
            .await
            .expect("attached");
        let turn2 = handle.child::<Value>(&key("team.turn.2"));
        // Keep the engine alive with the handle.
        std::mem::forget(second);
        (handle, turn2)
    } else {
        terminated(&w).await;
        (handle, turn2)
    };
    turn2
        .signal(answer("go-2", pause, json!(true)))
        .await
        .expect("admitted");
    let output = handle.output().await.expect("completes");
    assert_eq!(output, json!("from w"));
    let turns = seen.turns();
    assert_eq!(
        turns.len(),
        3,
        "wait did not block: the outcome arrived during turn 2"
    );
    assert!(turns[1].task("w").is_some_and(|t| t.outcome.is_none()));
    assert_eq!(
        turns[2].task("w").and_then(|t| t.status()),
        Some(Status::Completed)
    );
}

#[tokio::test]
async fn an_outcome_arriving_during_a_turn_shows_in_the_next_turn() {
    outcome_during_a_turn(false).await;
}

#[tokio::test]
async fn an_outcome_arriving_during_a_turn_survives_a_crash() {
    outcome_during_a_turn(true).await;
}

#[tokio::test]
async fn max_tasks_counts_refused_starts() {
    let seen = Seen::default();
    let log = seen.clone();
    let coordinator = policy("refused 1", move |turn| {
        log.record(turn);
        let n = turn.number;
        Ok(Decision::new(Mode::Wait, state(turn)).with_task(task(
            &format!("t{n}"),
            if n < 3 {
                "test.privileged"
            } else {
                "test.echo"
            },
            json!(n),
        )))
    });
    let mut config = config(
        coordinator,
        vec![
            worker(Kind::Echo, "test.privileged"),
            worker(Kind::Echo, "test.echo"),
        ],
    );
    config.workers[0] = Binding::new(&config.workers[0].program)
        .with_capabilities(Capabilities::of([Name::new("admin").expect("valid")]));
    config.max_tasks = Quota::Finite(2);
    let team = compile::<String, Value>(config).expect("valid");
    let engine = engine(Arc::new(MemoryStore::new()), &team);
    let handle = engine
        .start(&team, request("refused", "go".to_owned()))
        .await
        .expect("starts");
    let ended = handle.join().await.expect("joins");
    let failure = ended.failure().expect("failed");
    assert_eq!(failure.code(), "team.decision.invalid");
    assert!(
        failure.message.contains("limit of 2 tasks"),
        "{}",
        failure.message
    );
    let turns = seen.turns();
    assert_eq!(
        turns.len(),
        3,
        "a refused start with nothing running starts the next turn"
    );
    let rejection = turns[1].tasks[0].rejection.as_ref().expect("refused");
    assert_eq!(rejection.code(), "engine.child.capability_escalation");
    assert!(
        turns[2]
            .tasks
            .iter()
            .all(|t| t.rejection.is_some() && t.process.is_none())
    );
}

#[tokio::test]
async fn max_turns_stops_the_team() {
    let coordinator = policy("forever 1", |turn| {
        Ok(Decision::new(Mode::Continue, state(turn)))
    });
    let mut config = config(coordinator, vec![worker(Kind::Echo, "test.echo")]);
    config.max_turns = Quota::Finite(3);
    config.stall_turns = Quota::Unlimited;
    let team = compile::<String, Value>(config).expect("valid");
    let engine = engine(Arc::new(MemoryStore::new()), &team);
    let handle = engine
        .start(&team, request("turns", "go".to_owned()))
        .await
        .expect("starts");
    let ended = handle.join().await.expect("joins");
    let failure = ended.failure().expect("failed");
    assert_eq!(
        (failure.kind, failure.code()),
        (FailureKind::Execution, "team.limit.turns")
    );
    let view = handle.inspect().await.expect("inspects");
    assert_eq!(view.root().children.len(), 3, "three coordinators ran");
}

#[tokio::test]
async fn worker_failures_are_facts_and_a_failed_coordinator_fails_the_team_with_its_own_failure() {
    let coordinator = policy("facts 1", |turn| match turn.number {
        1 => Ok(Decision::new(Mode::Wait, state(turn)).with_task(task("f", "test.fail", json!(0)))),
        2 => {
            let f = turn
                .task("f")
                .and_then(|t| t.outcome.as_ref())
                .expect("drained");
            assert_eq!(f.failure().map(|f| f.code()), Some("test.worker.failed"));
            Err(baton_run::Failure::external(
                "test.coordinator.gave_up",
                "enough",
            ))
        }
        _ => Err(unexpected(turn)),
    });
    let team = compile::<String, Value>(config(coordinator, vec![worker(Kind::Fail, "test.fail")]))
        .expect("valid");
    let engine = engine(Arc::new(MemoryStore::new()), &team);
    let handle = engine
        .start(&team, request("facts", "go".to_owned()))
        .await
        .expect("starts");
    let ended = handle.join().await.expect("joins");
    let failure = ended.failure().expect("failed");
    assert_eq!(
        (failure.kind, failure.code(), failure.message.as_str()),
        (FailureKind::External, "test.coordinator.gave_up", "enough")
    );
}

#[tokio::test]
async fn a_coordinator_subtree_with_unresolved_effects_cannot_decide() {
    let coordinator = special_coordinator(Kind::Hang, 0, |turn| {
        Ok(Decision::new(Mode::Continue, turn.state.clone()))
    });
    let team = compile::<String, Value>(config(coordinator, vec![worker(Kind::Echo, "test.echo")]))
        .expect("valid");
    let engine = engine(Arc::new(MemoryStore::new()), &team);
    let handle = engine
        .start(&team, request("unresolved", "go".to_owned()))
        .await
        .expect("starts");
    let turn1 = handle.child::<Value>(&key("team.turn.1"));
    for _ in 0..100_000 {
        let view = handle.inspect().await.expect("inspects");
        if view
            .process(turn1.id())
            .is_some_and(|p| !p.effects.is_empty())
        {
            break;
        }
        tokio::task::yield_now().await;
    }
    turn1.kill().await.expect("killed");
    let ended = handle.join().await.expect("joins");
    let failure = ended.failure().expect("failed");
    assert_eq!(
        (failure.kind, failure.code()),
        (FailureKind::External, "team.coordinator.unresolved_effects")
    );
}

#[tokio::test]
async fn unaddressed_input_to_the_team_is_refused() {
    let coordinator = special_coordinator(Kind::Pause, 1, |turn| {
        Ok(Decision::complete(turn.state.clone(), turn.state.clone()))
    });
    let team =
        compile::<String, String>(config(coordinator, vec![worker(Kind::Echo, "test.echo")]))
            .expect("valid");
    let engine = engine(Arc::new(MemoryStore::new()), &team);
    let handle = engine
        .start(&team, request("steer", "go".to_owned()))
        .await
        .expect("starts");
    let turn1 = handle.child::<Value>(&key("team.turn.1"));
    let pause = open_wait(&turn1).await;
    let refused = handle
        .signal(SignalRequest {
            id: SignalId::new("note").expect("valid"),
            wait: None,
            payload: payload(json!("hello")),
        })
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), "engine.signal.rejected");
    turn1
        .signal(SignalRequest {
            id: SignalId::new("go").expect("valid"),
            wait: Some(pause),
            payload: payload(json!(true)),
        })
        .await
        .expect("admitted");
    assert_eq!(handle.output().await.expect("completes"), "go");
}

/// A round under `wait` costs the team two steps: the decision's starts go
/// out with the turn-ending wait, and the start results, the wait's
/// settlement and the next turn's start share one step.
#[tokio::test]
async fn a_wait_round_costs_the_team_two_steps() {
    const ROUNDS: usize = 3;
    const BATCH: usize = 4;
    let seen = Seen::default();
    let log = seen.clone();
    let coordinator = policy("rounds 1", move |turn| {
        log.record(turn);
        if turn.running().next().is_some() {
            return Ok(Decision::new(Mode::Wait, state(turn)));
        }
        let done = turn.tasks.len();
        if done == ROUNDS * BATCH {
            return Ok(Decision::complete(state(turn), payload(json!(done))));
        }
        let mut decision = Decision::new(Mode::Wait, state(turn));
        for index in done..done + BATCH {
            decision = decision.with_task(task(&format!("t{index}"), "test.echo", json!(index)));
        }
        Ok(decision)
    });
    let team = compile::<String, Value>(config(coordinator, vec![worker(Kind::Echo, "test.echo")]))
        .expect("valid");
    let memory = MemoryStore::keeping_history();
    let engine = engine(Arc::new(memory.clone()), &team);
    let handle = engine
        .start(&team, request("rounds", "go".to_owned()))
        .await
        .expect("starts");
    assert_eq!(
        handle.output().await.expect("completes"),
        json!(ROUNDS * BATCH)
    );
    let turns = seen.turns();
    assert_eq!(turns.len(), ROUNDS + 1, "each round's wait settled at once");
    for (round, turn) in turns.iter().enumerate() {
        assert_eq!(turn.tasks.len(), round * BATCH);
        assert!(turn.tasks.iter().all(|t| t.outcome.is_some()));
    }
    let view = handle.inspect().await.expect("inspects");
    // Turn 1 opens, two steps per round, the last decision completes.
    assert_eq!(view.root().usage.steps, (1 + 2 * ROUNDS + 1) as u64);
    let refusals = memory
        .records(handle.tree())
        .iter()
        .filter(|record| {
            String::from_utf8_lossy(&record.body).contains("engine.child.wait.invalid")
        })
        .count();
    assert_eq!(refusals, 0, "no wait was refused");
}

/// A refused start makes the kernel refuse the wait declared with it; the
/// team then applies the wait rule to the facts: an older task still
/// running is waited on (the documented edge case), so the next turn sees
/// it drained next to the refusal.
#[tokio::test]
async fn a_refused_start_under_wait_still_blocks_on_an_older_task() {
    let seen = Seen::default();
    let log = seen.clone();
    let coordinator = special_coordinator(Kind::Pause, 2, move |turn| {
        log.record(turn);
        match turn.number {
            1 => Ok(Decision::new(Mode::Continue, state(turn)).with_task(task(
                "ask",
                "test.ask",
                json!("ask?"),
            ))),
            2 => Ok(Decision::new(Mode::Wait, state(turn)).with_task(task(
                "bad",
                "test.privileged",
                json!(0),
            ))),
            3 => Ok(Decision::complete(state(turn), payload(json!("done")))),
            _ => Err(unexpected(turn)),
        }
    });
    let mut config = config(
        coordinator,
        vec![
            worker(Kind::Ask, "test.ask"),
            worker(Kind::Echo, "test.privileged"),
        ],
    );
    config.workers[1] = Binding::new(&config.workers[1].program)
        .with_capabilities(Capabilities::of([Name::new("admin").expect("valid")]));
    let team = compile::<String, Value>(config).expect("valid");
    let memory = MemoryStore::keeping_history();
    let engine = engine(Arc::new(memory.clone()), &team);
    let handle = engine
        .start(&team, request("refused-wait", "go".to_owned()))
        .await
        .expect("starts");
    let ask = handle.child::<Value>(&key("ask"));
    let question = open_wait(&ask).await;
    let turn2 = handle.child::<Value>(&key("team.turn.2"));
    let pause = open_wait(&turn2).await;
    turn2
        .signal(answer("go-2", pause, json!(true)))
        .await
        .expect("admitted");
    // Until the task is answered the team waits on it after the refusal.
    let refused = || {
        memory
            .records(handle.tree())
            .iter()
            .filter(|record| {
                String::from_utf8_lossy(&record.body).contains("engine.child.wait.invalid")
            })
            .count()
    };
    let mut blocked = false;
    for _ in 0..100_000 {
        let view = handle.inspect().await.expect("inspects");
        if refused() == 1 && view.root().status == Status::Waiting {
            blocked = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(blocked, "the team never waited after the refused wait");
    assert_eq!(seen.turns().len(), 2, "wait blocks on the older task");
    ask.signal(answer("answer-ask", question, json!("yes")))
        .await
        .expect("admitted");
    assert_eq!(handle.output().await.expect("completes"), json!("done"));
    let turns = seen.turns();
    assert_eq!(turns.len(), 3);
    let bad = turns[2].task("bad").expect("listed");
    assert_eq!(
        bad.rejection.as_ref().map(|f| f.code()),
        Some("engine.child.capability_escalation")
    );
    assert_eq!(
        turns[2].task("ask").and_then(|t| t.status()),
        Some(Status::Completed),
        "the next turn started once the older task drained"
    );
    assert_eq!(refused(), 1, "one refused wait in the log");
}
