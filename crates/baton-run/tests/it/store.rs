//! The memory store's leases, fencing and compare-and-swap. Fencing of live
//! engines runs in the engine conformance kit (`engine.rs`).

use std::time::Duration;

use baton_run::log::{Record, RecordBody};
use baton_run::store::{
    AcquireRequest, Acquired, Append, AppendOutcome, Store, TreeMeta, TreeStatus,
};
use baton_run::{Cause, Digest, MemoryStore, ProcessId, Scope, Termination, Timestamp};
use baton_testkit::programs::start_id;

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
    TreeMeta::new(
        tree,
        Scope::new("acme").expect("valid"),
        TreeStatus::Running,
        Timestamp(0),
    )
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
    let tree = ProcessId::root(&start_id("lease"));
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
    let other = record(1, Digest::ZERO, ProcessId::root(&start_id("other")));
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
