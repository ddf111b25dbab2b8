//! Who commits a write ([`CommitOn`]): a short run's one commit by the
//! task awaiting it on a multi-thread runtime, everything else by the
//! writer thread; and what holds either way: writes apply in call order,
//! queued writes share a group commit, and a write whose future is dropped
//! unawaited is still applied.

use std::time::Duration;

use baton_run::store::{
    AcquireRequest, Acquired, CreateTree, Created, Store, StoreError, TreeStatus,
};
use baton_run::{Digest, Timestamp, TreeId};
use baton_store_sqlite::{CommitOn, Creation, SqliteConfig, SqliteStore};

use super::sqlite::{meta, step, tree};

/// A short run's one commit: a new tree whose first round ended it.
async fn short_run(store: &SqliteStore, key: &str) {
    let t = tree(key);
    let created = store
        .create_tree(CreateTree {
            tree: t,
            owner: "host".into(),
            now: Timestamp(0),
            ttl: Duration::from_secs(60),
            records: vec![step(t, 1, Digest::ZERO, "done")],
            meta: meta(t, TreeStatus::Done, 1),
            hold: false,
        })
        .await;
    assert!(matches!(created, Ok(Created::Committed(_))), "{created:?}");
}

fn store(dir: &tempfile::TempDir, commit_on: CommitOn) -> SqliteStore {
    SqliteStore::open_with(
        dir.path().join("store.db"),
        SqliteConfig {
            creation: Creation::New,
            commit_on,
            ..SqliteConfig::default()
        },
    )
    .expect("creates")
}

/// A write: `owner` asks for `tree`'s lease, without taking it by force.
fn acquire<'s>(
    store: &'s SqliteStore,
    tree: TreeId,
    owner: &str,
) -> baton_run::BoxFuture<'s, Result<Acquired, StoreError>> {
    store.acquire(AcquireRequest {
        tree,
        owner: owner.into(),
        now: Timestamp(0),
        ttl: Duration::from_secs(60),
        force: false,
    })
}

fn granted(acquired: Result<Acquired, StoreError>) -> bool {
    matches!(acquired, Ok(Acquired::Granted { .. }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_multi_thread_runtime_a_lone_short_run_commits_on_the_awaiting_task() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store(&dir, CommitOn::Caller);
    let before = (store.transactions(), store.caller_groups());
    short_run(&store, "lone").await;
    assert_eq!(
        (store.transactions(), store.caller_groups()),
        (before.0 + 1, before.1 + 1),
        "one transaction, committed by the task that awaited it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asked_to_the_writer_thread_no_write_commits_on_a_task() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store(&dir, CommitOn::WriterThread);
    for n in 0..5 {
        short_run(&store, &format!("t{n}")).await;
    }
    assert_eq!(store.caller_groups(), 0);
    assert!(store.transactions() >= 5);
}

#[tokio::test]
async fn on_a_current_thread_runtime_writes_go_to_the_writer_thread() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store(&dir, CommitOn::Caller);
    for n in 0..5 {
        short_run(&store, &format!("t{n}")).await;
    }
    assert_eq!(
        store.caller_groups(),
        0,
        "blocking in place is not allowed here"
    );
}

/// Writes queued before any of them is awaited are applied in call order,
/// in one group commit.
async fn queued_writes_share_one_commit_in_call_order(commit_on: CommitOn) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store(&dir, commit_on);
    let contested = tree("contested");
    let before = store.transactions();
    let writes: Vec<_> = (0..20)
        .map(|n| acquire(&store, contested, &format!("owner-{n}")))
        .collect();
    // Awaited last first: the order of awaiting does not reorder them.
    let mut answers = Vec::new();
    for write in writes.into_iter().rev() {
        answers.push(write.await);
    }
    answers.reverse();
    assert!(granted(answers.remove(0)), "the first call gets the lease");
    for answer in answers {
        assert!(
            matches!(&answer, Ok(Acquired::LeaseHeld { owner, .. }) if owner == "owner-0"),
            "each later call finds the first's lease: {answer:?}"
        );
    }
    assert_eq!(store.transactions() - before, 1, "one group commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_writes_share_one_commit_in_call_order_when_a_task_commits() {
    queued_writes_share_one_commit_in_call_order(CommitOn::Caller).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_writes_share_one_commit_in_call_order_on_the_writer_thread() {
    queued_writes_share_one_commit_in_call_order(CommitOn::WriterThread).await;
}

#[tokio::test(flavor = "current_thread")]
async fn queued_writes_share_one_commit_in_call_order_on_a_current_thread_runtime() {
    queued_writes_share_one_commit_in_call_order(CommitOn::Caller).await;
}

/// A write whose future is dropped before it is awaited is applied all
/// the same (by the writer thread), before any write called after it.
async fn a_write_dropped_unawaited_is_still_applied(commit_on: CommitOn) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store(&dir, commit_on);
    let dropped = tree("dropped");
    drop(acquire(&store, dropped, "forgotten"));
    assert!(granted(acquire(&store, tree("other"), "a").await));
    let answer = acquire(&store, dropped, "late").await;
    assert!(
        matches!(&answer, Ok(Acquired::LeaseHeld { owner, .. }) if owner == "forgotten"),
        "the dropped write holds the lease: {answer:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_dropped_unawaited_is_still_applied_when_tasks_commit() {
    a_write_dropped_unawaited_is_still_applied(CommitOn::Caller).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_dropped_unawaited_is_still_applied_on_the_writer_thread() {
    a_write_dropped_unawaited_is_still_applied(CommitOn::WriterThread).await;
}

/// Only a dropped write is queued and the store is closed: closing
/// applies what is queued before it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_store_applies_a_write_dropped_unawaited() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store(&dir, CommitOn::Caller);
    let dropped = tree("alone");
    drop(acquire(&store, dropped, "forgotten"));
    drop(store);
    let store = SqliteStore::open(dir.path().join("store.db")).expect("reopens");
    let answer = acquire(&store, dropped, "late").await;
    assert!(
        matches!(&answer, Ok(Acquired::LeaseHeld { owner, .. }) if owner == "forgotten"),
        "the dropped write was applied: {answer:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_writing_at_once_are_each_answered_with_their_own_outcome() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store(&dir, CommitOn::Caller);
    let before = store.transactions();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..64 {
        let store = store.clone();
        tasks.spawn(async move {
            // Every task asks for its own tree and then for the shared one.
            let own = granted(acquire(&store, tree(&format!("own-{n}")), &n.to_string()).await);
            let shared = acquire(&store, tree("shared"), &n.to_string()).await;
            (own, shared)
        });
    }
    let mut holders = 0;
    while let Some(joined) = tasks.join_next().await {
        let (own, shared) = joined.expect("joins");
        assert!(own, "each task's own tree is granted to it");
        match shared {
            Ok(Acquired::Granted { .. }) => holders += 1,
            Ok(Acquired::LeaseHeld { .. }) => {}
            Err(error) => panic!("a write failed: {error}"),
        }
    }
    assert_eq!(holders, 1, "the shared tree is granted exactly once");
    let spent = store.transactions() - before;
    assert!(
        (1..=128).contains(&spent),
        "{spent} transactions for 128 writes"
    );
}
