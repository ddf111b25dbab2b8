//! `team1000` (W3): a team whose scripted coordinator requests rounds of
//! worker tasks and waits for each round to drain.

use std::sync::Arc;

use anyhow::{Result, bail};
use baton::run::{ChildKey, Engine, Failure, Name, Payload, Quota, TreeLimits};
use baton::team::{
    Binding, Config as TeamConfig, Decision, Mode, Policy, PolicyConfig, TaskRequest, Turn, compile,
};
use baton::workflow::{Config as WorkflowConfig, Workflow, transform};

use super::{build_name, request};
use crate::measure::{Phase, Sample};
use crate::store::{BenchStore, StoreKind};

/// Rounds of a `team1000` run.
pub const TEAM_ROUNDS: u64 = 10;

/// Worker tasks per `team1000` round.
pub const TEAM_BATCH: u64 = 100;

/// The `team1000` coordinator: while tasks run, `wait`; when none runs,
/// request the next round of `batch` (each task's input is its index);
/// after `rounds` rounds, complete with the sum of the outputs.
fn team_decide(turn: &Turn, rounds: u64, batch: u64) -> Result<Decision, Failure> {
    let bad = |message: String| Failure::execution("bench.team.unexpected", message);
    let state = turn.state.clone();
    if turn.running().next().is_some() {
        return Ok(Decision::new(Mode::Wait, state));
    }
    let done = turn.tasks.len() as u64;
    if done < rounds * batch {
        let worker = Name::new("bench.double").map_err(|e| bad(e.to_string()))?;
        let mut decision = Decision::new(Mode::Wait, state);
        for index in done..done + batch {
            decision = decision.with_task(TaskRequest::new(
                ChildKey::new(format!("t{index}")).map_err(|e| bad(e.to_string()))?,
                worker.clone(),
                Payload::encode(&index).map_err(|e| bad(e.to_string()))?,
            ));
        }
        return Ok(decision);
    }
    let mut sum = 0u64;
    for task in &turn.tasks {
        let output = task
            .output()
            .ok_or_else(|| bad(format!("task {} did not complete", task.key())))?;
        sum += output.decode::<u64>().map_err(|e| bad(e.to_string()))?;
    }
    let output = Payload::encode(&sum).map_err(|e| bad(e.to_string()))?;
    Ok(Decision::complete(turn.state.clone(), output))
}

/// `team1000`: a team runs `rounds` rounds of `batch` worker tasks.
pub async fn team_run(run: usize, kind: StoreKind, rounds: u64, batch: u64) -> Result<Sample> {
    let coordinator = Policy::new(PolicyConfig {
        name: "bench.coordinator".into(),
        description: "Requests rounds of tasks and waits for them.".into(),
        build: build_name(),
        // The rounds and the batch size decide what the coordinator
        // requests, so they are its settings and part of its identity.
        settings: Payload::encode(&std::collections::BTreeMap::from([
            ("batch", batch),
            ("rounds", rounds),
        ]))?,
        decide: Arc::new(move |turn: &Turn| team_decide(turn, rounds, batch)),
    })?
    .program();
    let worker = Workflow::new(WorkflowConfig {
        name: "bench.double".into(),
        description: "Doubles its index.".into(),
        build: build_name(),
        stages: vec![transform("double", |index: u64| Ok(index * 2))],
    })?
    .program::<u64, u64>();
    let team = compile::<u64, u64>(TeamConfig {
        name: "bench.team".into(),
        description: "Runs rounds of worker tasks, a round at a time.".into(),
        coordinator: Binding::new(&coordinator),
        workers: vec![Binding::new(&worker)],
        max_turns: Quota::Unlimited,
        max_tasks: Quota::Unlimited,
        max_concurrent_tasks: u32::try_from(batch)?,
        max_controls_per_turn: 1,
        stall_turns: baton::team::DEFAULT_STALL_TURNS,
    })?;
    let store = BenchStore::fresh(kind)?;
    let mut config = store.config(team.erase());
    config.limits = TreeLimits {
        // A round of tasks and the coordinator at once.
        max_active_children: u32::try_from(batch)? + 8,
        ..TreeLimits::default()
    };
    let engine = Engine::new(config)?;
    let start = request(format!("team-{run}"), 0u64)?;

    let phase = Phase::on(&store).await?;
    let handle = engine.start(&team, start).await?;
    let termination = handle.join().await?;
    let measured = phase.end(&store).await?;

    let tasks = rounds * batch;
    let expected = tasks * (tasks - 1);
    let output: Option<u64> = termination.output().and_then(|o| o.decode().ok());
    if output != Some(expected) {
        bail!("the team ended {termination}, not with {expected}");
    }
    // Reading the finished tree back is what recovery, a takeover and
    // `baton log --verify` do with a long log: load it, verify its chain and
    // fold every record.
    let reading = crate::probe::now();
    let view = handle.inspect().await?;
    let inspect_ms = crate::probe::now().duration_since(reading).as_secs_f64() * 1e3;
    let turns = view
        .root()
        .children
        .keys()
        .filter(|key| key.as_str().starts_with(baton::team::RESERVED_PREFIX))
        .count() as u64;
    engine.close().await;
    Ok(Sample {
        turns: Some(turns),
        inspect_ms: Some(inspect_ms),
        ..measured.per(tasks, 1e6)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::check;

    #[tokio::test(flavor = "multi_thread")]
    async fn team_runs_small_on_both_stores() {
        for kind in StoreKind::ALL {
            let team = team_run(0, kind, 2, 10).await.unwrap();
            check(&team, kind, "team");
            // One turn per round at least (when the round has drained by the
            // next turn), plus the turn that outputs the sum.
            assert!(team.turns.is_some_and(|turns| turns > 2), "{team:?}");
            assert!(team.inspect_ms.is_some_and(|ms| ms > 0.0), "{team:?}");
        }
    }
}
