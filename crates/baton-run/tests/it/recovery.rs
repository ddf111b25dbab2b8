//! Snapshots on the memory store: a store keeping its history still loads
//! from its latest snapshot, and snapshot pacing bounds the tail a recovery
//! folds. Recovery from a snapshot on any store runs in the engine
//! conformance kit (`engine.rs`).

use std::sync::Arc;

use baton_run::log::RecordBody;
use baton_run::store::Store;
use baton_run::{EngineConfig, MemoryStore, Payload, Scope, SignalId, SignalRequest};
use baton_testkit::programs::{Kind, engine, open_wait, program, request};
use serde_json::json;

#[tokio::test]
async fn a_store_keeping_history_still_loads_from_its_latest_snapshot() {
    let ask = program(Kind::Ask, None);
    let store = MemoryStore::keeping_history();
    let mut config = EngineConfig {
        programs: vec![ask.erase()],
        ..EngineConfig::new(Arc::new(store.clone()))
    };
    config.snapshot_every = 1;
    let first = baton_run::Engine::new(config).expect("the engine configuration is valid");
    let handle = first
        .start(&ask, request("history", "q"))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    let tree = handle.tree();
    let scope = Scope::new("acme").expect("valid");
    let load = store.load(tree).await.expect("loads");
    let snapshot = load.snapshot.expect("a snapshot was written");
    assert!(load.records.iter().all(|r| r.seq > snapshot.seq));
    assert_eq!(
        store.records(tree).first().map(|r| r.seq),
        Some(1),
        "the history is kept"
    );
    drop(first);
    let second = engine(Arc::new(store.clone()), &[&ask]);
    let handle = second
        .process::<serde_json::Value>(&scope, tree)
        .await
        .expect("recovers from the snapshot");
    let answer = SignalRequest {
        id: SignalId::new("answer").expect("valid"),
        wait: Some(wait),
        payload: Payload::encode(&true).expect("encodes"),
    };
    handle.signal(answer).await.expect("admitted");
    assert_eq!(handle.output().await.expect("completes"), json!(true));
}

#[tokio::test]
async fn snapshots_are_paced_by_log_bytes_and_bound_the_tail_a_recovery_folds() {
    // A small state, recorded whole at every step.
    paced(2_000, false).await;
}

#[tokio::test]
async fn a_large_state_recorded_as_changes_is_snapshotted_as_often_as_its_folding_costs() {
    // A large state whose steps are recorded as changes of a few bytes: the
    // fold builds the whole state from each, so they are paced as that.
    paced(8_000, true).await;
}

/// Trees of looping processes whose state holds `padding` bytes, ending
/// after every number of steps in a range: the work a recovery would fold
/// after the latest snapshot stays within four times its size.
async fn paced(padding: usize, changes: bool) {
    let looping = program(Kind::Loop, None);
    let store = MemoryStore::keeping_history();
    let mut config = EngineConfig {
        programs: vec![looping.erase()],
        ..EngineConfig::new(Arc::new(store.clone()))
    };
    // Every commit may snapshot by count; only the byte pacing holds back.
    config.snapshot_every = 1;
    config.max_steps_per_commit = 1;
    let engine = baton_run::Engine::new(config).expect("the engine configuration is valid");
    for steps in 20..60 {
        let mut start = request(
            &format!("paced-{padding}-{steps}"),
            json!({ "padding": "x".repeat(padding) }),
        );
        start.budget = baton_run::Budget::unlimited().with_steps(steps);
        let handle = engine.start(&looping, start).await.expect("starts");
        let ended = handle.await_result().await.expect("ends");
        assert_eq!(
            ended.failure().map(|f| f.code()),
            Some("engine.limit.steps")
        );
        let load = store.load(handle.tree()).await.expect("loads");
        let snapshot = load.snapshot.expect("a snapshot was written");
        let records = store.records(handle.tree());
        // What folding a record costs: its body, and the whole state a
        // change builds.
        let cost = |record: &baton_run::log::Record| {
            let body = record.decode().expect("decodes");
            record.body.len() + body.folded_state_bytes() as usize
        };
        let recorded_as_changes = records
            .iter()
            .filter(|r| {
                matches!(
                    r.decode(),
                    Ok(RecordBody::StepAdopted {
                        state_change: Some(_),
                        ..
                    })
                )
            })
            .count();
        assert_eq!(recorded_as_changes > 0, changes, "after {steps} steps");
        let tail: usize = load.records.iter().map(cost).sum();
        let largest = records.iter().map(cost).max().unwrap_or(0);
        // The tail since the latest snapshot stays within four times its
        // size (and the commit that crossed the line).
        assert!(
            tail <= 4 * snapshot.state.len() + largest,
            "after {steps} steps: a tail costing {tail} bytes after a snapshot of {} bytes",
            snapshot.state.len()
        );
    }
}
