//! Recovery from a compacted snapshot plus the records after it, and the
//! committed event stream.

use crate::common;

use std::sync::Arc;

use crate::common::{Kind, open_wait, program, request};
use baton_run::{
    EngineConfig, EventKind, MemoryStore, Payload, RecoverOptions, ReplayPolicy, Scope, SignalId,
    SignalReceipt, SignalRequest, Status, Store,
};
use baton_testkit::ScriptedDispatcher;
use serde_json::json;

#[tokio::test]
async fn a_tree_recovers_from_a_snapshot_after_its_records_were_compacted() {
    let ask = program(Kind::Ask, None);
    let store = MemoryStore::new();
    let mut config = EngineConfig::new(store.clone()).program(&ask);
    config.snapshot_every = 2;
    let first = baton_run::Engine::new(config);
    let handle = first
        .start(&ask, request("snap", "q"))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    for index in 0..5 {
        let note = SignalRequest {
            id: SignalId::new(format!("note-{index}")).expect("valid"),
            wait: None,
            payload: Payload::encode(&json!({ "note": format!("n{index}") })).expect("encodes"),
        };
        assert_eq!(handle.signal(note).await, Ok(SignalReceipt::Admitted));
    }
    let tree = handle.tree();
    let scope = Scope::new("acme").expect("valid");
    let head = first.verify(&scope, tree).await.expect("verifies");
    assert!(
        store.records(tree).len() < head as usize,
        "records covered by a snapshot were compacted"
    );
    drop(first);

    let second = common::engine(Arc::new(store.clone()), &[&ask]);
    second
        .recover(RecoverOptions::default())
        .await
        .expect("recovers");
    let handle = second
        .process::<serde_json::Value>(&scope, tree)
        .await
        .expect("attached");
    assert_eq!(
        handle.inspect().await.expect("inspects").root().mailbox,
        5,
        "notes survived"
    );
    let answer = SignalRequest {
        id: SignalId::new("answer").expect("valid"),
        wait: Some(wait),
        payload: Payload::encode(&false).expect("encodes"),
    };
    assert_eq!(handle.signal(answer).await, Ok(SignalReceipt::Admitted));
    assert_eq!(handle.output().await.expect("completes"), json!(false));
}

#[tokio::test]
async fn events_report_committed_facts_in_order() {
    let dispatcher = ScriptedDispatcher::echo(ReplayPolicy::Never);
    let program = program(Kind::Dispatch, Some(Arc::new(dispatcher)));
    let engine = common::engine(Arc::new(MemoryStore::new()), &[&program]);
    let mut events = engine.events();
    let handle = engine
        .start(&program, request("events", json!(["a"])))
        .await
        .expect("starts");
    assert_eq!(
        handle.await_result().await.expect("terminates").status(),
        Status::Completed
    );
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        assert_eq!(event.tree, handle.tree());
        seen.push(match event.kind {
            EventKind::ProcessStarted { .. } => "started".to_owned(),
            EventKind::StepAdopted { transition, .. } => format!("step:{transition}"),
            EventKind::EffectPending { .. } => "pending".to_owned(),
            EventKind::EffectSettled { .. } => "settled".to_owned(),
            EventKind::Terminated { status, .. } => format!("terminated:{status}"),
            EventKind::Drained { status } => format!("drained:{status}"),
            other => format!("{other:?}"),
        });
    }
    assert_eq!(
        seen,
        [
            "started",
            "step:continue",
            "pending",
            "settled",
            "step:complete",
            "terminated:completed",
            "drained:completed"
        ]
    );
}

#[tokio::test]
async fn a_store_keeping_history_still_loads_from_its_latest_snapshot() {
    let ask = program(Kind::Ask, None);
    let store = MemoryStore::keeping_history();
    let mut config = EngineConfig::new(store.clone()).program(&ask);
    config.snapshot_every = 1;
    let first = baton_run::Engine::new(config);
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
    let second = common::engine(Arc::new(store.clone()), &[&ask]);
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
    let looping = program(Kind::Loop, None);
    let store = MemoryStore::keeping_history();
    let mut config = EngineConfig::new(store.clone()).program(&looping);
    // Every commit may snapshot by count; only the byte pacing holds back.
    config.snapshot_every = 1;
    config.max_steps_per_commit = 1;
    let engine = baton_run::Engine::new(config);
    // Trees ending after every number of steps in a range: the tail a
    // recovery would fold is checked at each of those points.
    for steps in 20..60 {
        let mut start = request(
            &format!("paced-{steps}"),
            json!({ "padding": "x".repeat(2_000) }),
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
        let tail: usize = load.records.iter().map(|r| r.body.len()).sum();
        let largest = records.iter().map(|r| r.body.len()).max().unwrap_or(0);
        // The tail since the latest snapshot stays within four times its
        // size (and the commit that crossed the line).
        assert!(
            tail <= 4 * snapshot.state.len() + largest,
            "after {steps} steps: tail {tail} bytes after a snapshot of {} bytes",
            snapshot.state.len()
        );
    }
}
