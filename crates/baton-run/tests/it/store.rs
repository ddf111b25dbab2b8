//! The memory store's leases, fencing and compare-and-swap, and fencing of
//! a live engine by a forced takeover.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use crate::common::{Kind, id, open_wait, program, request};
use baton_run::log::{Record, RecordBody};
use baton_run::{
    AcquireRequest, Acquired, Append, AppendOutcome, Cause, Digest, Engine, EngineConfig,
    MemoryStore, Payload, ProcessId, RecoverOptions, RuntimeError, Scope, SignalError, SignalId,
    SignalRequest, Sleep, Store, Termination, Timestamp, TreeMeta, TreeStatus,
};

fn acquire(tree: ProcessId, owner: &str, now: u64, force: bool) -> AcquireRequest {
    AcquireRequest {
        tree,
        owner: owner.into(),
        now: Timestamp(now),
        ttl: Duration::from_millis(1_000),
        force,
    }
}

fn meta(tree: ProcessId) -> TreeMeta {
    TreeMeta {
        tree,
        scope: Scope::new("acme").expect("valid"),
        status: TreeStatus::Running,
        updated: Timestamp(0),
    }
}

fn record(seq: u64, prev: Digest, tree: ProcessId) -> Record {
    let body = RecordBody::Terminated {
        process: tree,
        termination: Termination::ended(
            Cause::Kill,
            baton_run::Failure::execution("test.record", format!("record {seq}")),
        ),
    };
    Record::seal(seq, prev, &body)
}

#[tokio::test]
async fn leases_fence_old_writers_and_appends_compare_and_swap() {
    let store = MemoryStore::new();
    let tree = ProcessId::root(&id("lease"));
    let Acquired::Granted { lease: a, .. } = store
        .acquire(acquire(tree, "a", 0, false))
        .await
        .expect("ok")
    else {
        panic!("first writer is granted");
    };
    match store
        .acquire(acquire(tree, "b", 500, false))
        .await
        .expect("ok")
    {
        Acquired::LeaseHeld { owner, until } => {
            assert_eq!(owner, "a");
            assert_eq!(until, Timestamp(1_000));
        }
        other => panic!("unexpected {other:?}"),
    }
    let first = record(1, Digest::ZERO, tree);
    let append = |token, records: Vec<Record>| Append {
        tree,
        token,
        records,
        meta: meta(tree),
        release: false,
    };
    assert_eq!(
        store
            .append(vec![append(a.token, vec![first.clone()])])
            .await
            .expect("ok"),
        [AppendOutcome::Committed]
    );
    // Idempotent retry of an acknowledged append.
    assert_eq!(
        store
            .append(vec![append(a.token, vec![first.clone()])])
            .await
            .expect("ok"),
        [AppendOutcome::Duplicate]
    );
    // A different record at a committed sequence, or a gap, is a conflict.
    let other = record(1, Digest::ZERO, ProcessId::root(&id("other")));
    assert_eq!(
        store
            .append(vec![append(a.token, vec![other])])
            .await
            .expect("ok"),
        [AppendOutcome::Conflict { head: 1 }]
    );
    let gap = record(3, first.hash, tree);
    assert_eq!(
        store
            .append(vec![append(a.token, vec![gap])])
            .await
            .expect("ok"),
        [AppendOutcome::Conflict { head: 1 }]
    );

    // A forced takeover fences the old writer.
    let Acquired::Granted { lease: b, load } = store
        .acquire(acquire(tree, "b", 500, true))
        .await
        .expect("ok")
    else {
        panic!("forced takeover is granted");
    };
    assert!(b.token > a.token);
    assert_eq!(load.records.len(), 1);
    let second = record(2, first.hash, tree);
    assert_eq!(
        store
            .append(vec![append(a.token, vec![second.clone()])])
            .await
            .expect("ok"),
        [AppendOutcome::Fenced]
    );
    assert_eq!(
        store
            .append(vec![append(b.token, vec![second])])
            .await
            .expect("ok"),
        [AppendOutcome::Committed]
    );

    // An expired lease lets a new writer in without force.
    let Acquired::Granted { lease: c, .. } = store
        .acquire(acquire(tree, "c", 2_000, false))
        .await
        .expect("ok")
    else {
        panic!("expired lease is taken over");
    };
    assert!(c.token > b.token);
    assert!(
        !store
            .renew(tree, b.token, Timestamp(9_000))
            .await
            .expect("ok")
    );
}

#[tokio::test]
async fn a_forced_takeover_stops_the_old_engine_without_writing() {
    let ask = program(Kind::Ask, None);
    let store = MemoryStore::keeping_history();
    let old = common::engine(Arc::new(store.clone()), &[&ask]);
    let handle = old
        .start(&ask, request("fenced", "q"))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;

    let new = common::engine(Arc::new(store.clone()), &[&ask]);
    // The old engine is alive, so its lease is respected unless forced.
    let report = new.recover(RecoverOptions::default()).await.expect("lists");
    assert_eq!(
        report[0].1.as_ref().expect_err("held").code(),
        "engine.lease.held"
    );
    let report = new
        .recover(RecoverOptions {
            force: true,
            scope: None,
        })
        .await
        .expect("lists");
    assert!(report[0].1.is_ok());
    let before = store.records(handle.tree()).len();

    let answer = SignalRequest {
        id: SignalId::new("to-old").expect("valid"),
        wait: Some(wait),
        payload: Payload::encode(&true).expect("encodes"),
    };
    let error = handle
        .signal(answer)
        .await
        .expect_err("the old writer is fenced");
    assert!(
        matches!(error, SignalError::Stopped(RuntimeError::Fenced { .. })),
        "{error:?}"
    );
    assert_eq!(
        store.records(handle.tree()).len(),
        before,
        "the fenced writer wrote nothing"
    );
    assert!(matches!(
        handle.await_result().await,
        Err(RuntimeError::Fenced { .. })
    ));
}

#[tokio::test]
async fn a_sleeping_tree_whose_log_moved_wakes_stopped_in_every_sleep_mode() {
    for (index, sleep) in [Sleep::Packed, Sleep::Unloaded].into_iter().enumerate() {
        let ask = program(Kind::Ask, None);
        let store = MemoryStore::keeping_history();
        let mut config = EngineConfig::with_store(Arc::new(store.clone())).program(&ask);
        config.sleep = sleep;
        let old = Engine::new(config);
        let handle = old
            .start(&ask, request(&format!("moved-{index}"), "q"))
            .await
            .expect("starts");
        let wait = open_wait(&handle).await;

        // Another engine takes the tree over and answers it to the end.
        let new = common::engine(Arc::new(store.clone()), &[&ask]);
        let report = new
            .recover(RecoverOptions {
                force: true,
                scope: None,
            })
            .await
            .expect("lists");
        assert!(report[0].1.is_ok(), "{sleep:?}");
        let scope = Scope::new("acme").expect("valid");
        let taken = new
            .process::<serde_json::Value>(&scope, handle.tree())
            .await
            .expect("taken over");
        let answer = |id: &str| SignalRequest {
            id: SignalId::new(id).expect("valid"),
            wait: Some(wait),
            payload: Payload::encode(&true).expect("encodes"),
        };
        taken.signal(answer("to-new")).await.expect("admitted");
        taken.join().await.expect("completes");
        let before = store.records(handle.tree()).len();

        // The sleeping old writer wakes to a log that moved: it stops
        // without writing, whether it kept its state or reloads it.
        let error = handle
            .signal(answer("to-old"))
            .await
            .expect_err("the old writer is stopped");
        assert!(
            matches!(
                error,
                SignalError::Stopped(RuntimeError::Fenced { .. } | RuntimeError::Conflict { .. })
            ),
            "{sleep:?}: {error:?}"
        );
        assert_eq!(store.records(handle.tree()).len(), before, "{sleep:?}");
    }
}

#[tokio::test]
async fn closing_an_engine_releases_every_sleeping_tree_and_tells_its_handles() {
    let ask = program(Kind::Ask, None);
    let store = MemoryStore::keeping_history();
    let engine = common::engine(Arc::new(store.clone()), &[&ask]);
    let mut handles = Vec::new();
    for index in 0..8 {
        let handle = engine
            .start(&ask, request(&format!("sleeper-{index}"), "q"))
            .await
            .expect("starts");
        open_wait(&handle).await;
        handles.push(handle);
    }
    let before: Vec<usize> = handles
        .iter()
        .map(|h| store.records(h.tree()).len())
        .collect();
    engine.close().await;
    for handle in &handles {
        assert!(matches!(
            handle.await_result().await,
            Err(RuntimeError::Closed { .. })
        ));
    }
    let after: Vec<usize> = handles
        .iter()
        .map(|h| store.records(h.tree()).len())
        .collect();
    assert_eq!(before, after, "closing wrote nothing");
    // Every lease was given up: a new engine takes every tree without force.
    let next = common::engine(Arc::new(store.clone()), &[&ask]);
    let report = next
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    assert_eq!(report.len(), 8);
    assert!(
        report.iter().all(|(_, result)| result.is_ok()),
        "{report:?}"
    );
}
