//! What only a shared database shows: writers on separate handles (as on
//! separate machines) racing for one tree, group commits across trees,
//! change notices, tokens across a reopen, pruning, and large states stored
//! once by digest.

use std::sync::Arc;
use std::time::Duration;

use baton_run::log::{Record, RecordBody, Snapshot};
use baton_run::program::{ExecutionState, Transition};
use baton_run::store::{
    AcquireRequest, Acquired, Append, AppendOutcome, CreateTree, ListFilter, Store, TreeMeta,
    TreeStatus,
};
use baton_run::{Digest, EffectId, Payload, ProcessId, Scope, StartId, Timestamp, TreeId};
use baton_store_postgres::{Notice, PostgresConfig, PostgresStore};
use baton_testkit::noise;

use crate::support::{Server, connect, server_url, url_of};

fn tree(key: &str) -> TreeId {
    ProcessId::root(&StartId::new("acme", key).expect("valid"))
}

fn url(store: &PostgresStore) -> String {
    url_of(
        &server_url(),
        store.target().rsplit('/').next().expect("a name"),
    )
}

fn handle_on(url: &str) -> PostgresStore {
    PostgresStore::open_with(PostgresConfig {
        read_connections: 2,
        ..PostgresConfig::new(url)
    })
    .expect("opens")
}

fn acquire(tree: TreeId, owner: &str) -> AcquireRequest {
    AcquireRequest {
        tree,
        owner: owner.into(),
        now: Timestamp(0),
        ttl: Duration::from_secs(60),
        force: false,
    }
}

async fn lease(store: &PostgresStore, tree: TreeId) -> u64 {
    match store
        .acquire(AcquireRequest {
            force: true,
            ..acquire(tree, "test")
        })
        .await
        .expect("acquires")
    {
        Acquired::Granted { lease, .. } => lease.token,
        other => panic!("unexpected {other:?}"),
    }
}

fn meta(tree: TreeId, status: TreeStatus, updated: u64) -> TreeMeta {
    TreeMeta::new(
        tree,
        Scope::new("acme").expect("valid"),
        status,
        Timestamp(updated),
    )
}

fn step(tree: TreeId, seq: u64, prev: Digest, state: &str) -> Record {
    let body = RecordBody::StepAdopted {
        process: tree,
        step: seq,
        state: Some(ExecutionState(Payload::encode(state).expect("encodes"))),
        state_change: None,
        transition: Transition::Continue {
            consumed: 0,
            effects: Vec::new(),
        },
    };
    Record::seal(seq, prev, &body)
}

fn pending(tree: TreeId, seq: u64, prev: Digest) -> Record {
    let body = RecordBody::EffectPending {
        process: tree,
        effect: EffectId::new(tree, seq, 0),
    };
    Record::seal(seq, prev, &body)
}

fn append(tree: TreeId, token: u64, records: Vec<Record>) -> Append {
    Append {
        tree,
        token,
        records,
        meta: meta(tree, TreeStatus::Running, 1),
        release: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_on_separate_handles_race_and_exactly_one_wins() {
    let server = Server::new();
    let first = server.store();
    let url = url(&first);
    let handles: Vec<PostgresStore> = (0..4).map(|_| handle_on(&url)).collect();
    let t = tree("raced");
    let mut tasks = Vec::new();
    for (n, store) in handles.iter().enumerate() {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            store.acquire(acquire(t, &format!("machine-{n}"))).await
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.expect("runs").expect("acquires") {
            Acquired::Granted { lease, .. } => winners.push(lease),
            Acquired::LeaseHeld { .. } => {}
        }
    }
    assert_eq!(winners.len(), 1, "exactly one machine gets the lease");
    let token = winners[0].token;
    let mut tasks = Vec::new();
    for (n, store) in handles.iter().enumerate() {
        let store = store.clone();
        let body = RecordBody::EffectPending {
            process: t,
            effect: EffectId::new(t, 1, n as u32),
        };
        let record = Record::seal(1, Digest::ZERO, &body);
        tasks.push(tokio::spawn(async move {
            (
                record.clone(),
                store.append(vec![append(t, token, vec![record])]).await,
            )
        }));
    }
    let mut committed = Vec::new();
    for task in tasks {
        let (record, outcome) = task.await.expect("runs");
        match outcome.expect("appends")[..] {
            [AppendOutcome::Committed] => committed.push(record),
            [AppendOutcome::Conflict { head: 1 }] => {}
            ref other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(committed.len(), 1, "exactly one append at seq 1 wins");
    assert_eq!(first.load(t).await.expect("loads").records, committed);
}

#[tokio::test]
async fn a_batch_of_appends_to_many_trees_commits_in_one_transaction_each_answered_in_order() {
    let server = Server::new();
    let store = server.store();
    let trees: Vec<TreeId> = (0..5).map(|n| tree(&format!("group-{n}"))).collect();
    let mut tokens = Vec::new();
    for t in &trees {
        tokens.push(lease(&store, *t).await);
    }
    let mut batch: Vec<Append> = trees
        .iter()
        .zip(&tokens)
        .map(|(t, token)| append(*t, *token, vec![pending(*t, 1, Digest::ZERO)]))
        .collect();
    // One stale token among them is fenced alone.
    batch[2].token += 1_000;
    let outcomes = store.append(batch).await.expect("appends");
    assert_eq!(
        outcomes,
        [
            AppendOutcome::Committed,
            AppendOutcome::Committed,
            AppendOutcome::Fenced,
            AppendOutcome::Committed,
            AppendOutcome::Committed
        ]
    );
    // The committed ones share one transaction id.
    let client = connect(&url(&store)).await;
    let transactions: i64 = client
        .query_one("SELECT count(DISTINCT xmin::text) FROM baton_records", &[])
        .await
        .expect("counts")
        .get(0);
    assert_eq!(transactions, 1, "one group commit");
    for (index, t) in trees.iter().enumerate() {
        let expected = if index == 2 { 0 } else { 1 };
        assert_eq!(store.load(*t).await.expect("loads").records.len(), expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_of_any_handle_are_noticed_and_a_lost_listener_says_so_and_goes_on() {
    let server = Server::new();
    let store = server.store();
    let url = url(&store);
    let mut listener = store.listen().await.expect("listens");
    let other = handle_on(&url);
    let t = tree("noticed");
    let token = lease(&other, t).await;
    assert_eq!(
        other
            .append(vec![append(t, token, vec![pending(t, 1, Digest::ZERO)])])
            .await,
        Ok(vec![AppendOutcome::Committed])
    );
    let scope = Some(Scope::new("acme").expect("valid"));
    assert_eq!(
        listener.next().await,
        Some(Notice::Changed {
            tree: t,
            scope: scope.clone()
        }),
        "an append on another handle is noticed"
    );
    // A fenced append commits nothing and notices nothing; a release does.
    assert_eq!(
        other
            .append(vec![append(
                t,
                token + 7,
                vec![pending(t, 2, Digest::ZERO)]
            )])
            .await,
        Ok(vec![AppendOutcome::Fenced])
    );
    other.release(t, token).await.expect("releases");
    assert_eq!(
        listener.next().await,
        Some(Notice::Changed {
            tree: t,
            scope: scope.clone()
        }),
        "the release"
    );

    // The listening connection is killed: the listener says notices may
    // have been missed, then carries on.
    let admin = connect(&url).await;
    loop {
        let killed = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'baton:listener'",
                &[],
            )
            .await
            .expect("kills");
        if !killed.is_empty() {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(listener.next().await, Some(Notice::Missed));
    let u = tree("after");
    let token = lease(&other, u).await;
    assert_eq!(
        other
            .append(vec![append(u, token, vec![pending(u, 1, Digest::ZERO)])])
            .await,
        Ok(vec![AppendOutcome::Committed])
    );
    assert_eq!(
        listener.next().await,
        Some(Notice::Changed { tree: u, scope }),
        "noticed after reconnecting"
    );
    drop(other);
    drop(store);
    assert_eq!(listener.next().await, None, "the store is gone");
}

#[tokio::test]
async fn commits_survive_a_reopen_and_tokens_keep_increasing() {
    let server = Server::new();
    let store = server.store();
    let url = url(&store);
    let t = tree("reopen");
    let token = lease(&store, t).await;
    let records = vec![pending(t, 1, Digest::ZERO)];
    let mut item = append(t, token, records.clone());
    item.meta = meta(t, TreeStatus::Waiting, 5);
    assert_eq!(
        store.append(vec![item]).await,
        Ok(vec![AppendOutcome::Committed])
    );
    drop(store);
    let store = handle_on(&url);
    let load = store.load(t).await.expect("loads");
    assert_eq!(load.records, records);
    assert_eq!(load.meta, Some(meta(t, TreeStatus::Waiting, 5)));
    assert!(lease(&store, t).await > token, "tokens never repeat");
}

#[tokio::test]
async fn prune_removes_only_done_trees_older_than_the_retention_point() {
    let server = Server::new();
    let store = server.store();
    let big = "x".repeat(50_000);
    for (key, status, updated) in [
        ("old-done", TreeStatus::Done, 10),
        ("new-done", TreeStatus::Done, 1_000),
        ("old-waiting", TreeStatus::Waiting, 10),
    ] {
        let t = tree(key);
        let token = lease(&store, t).await;
        let mut item = append(
            t,
            token,
            vec![step(t, 1, Digest::ZERO, &format!("{key}{big}"))],
        );
        item.meta = meta(t, status, updated);
        assert_eq!(
            store.append(vec![item]).await,
            Ok(vec![AppendOutcome::Committed])
        );
    }
    assert_eq!(store.prune(Timestamp(500)).await, Ok(1));
    let listed: Vec<TreeId> = store
        .list(ListFilter::default())
        .await
        .expect("lists")
        .trees
        .into_iter()
        .map(|m| m.tree)
        .collect();
    let mut expected = vec![tree("new-done"), tree("old-waiting")];
    expected.sort();
    assert_eq!(listed, expected);
    assert!(!store.load(tree("old-done")).await.expect("loads").exists());
    assert_eq!(store.prune(Timestamp(500)).await, Ok(0));
    let orphans: i64 = connect(&url(&store))
        .await
        .query_one(
            "SELECT count(*) FROM baton_chunks WHERE tree NOT IN (SELECT key FROM baton_trees)",
            &[],
        )
        .await
        .expect("counts")
        .get(0);
    assert_eq!(orphans, 0, "a pruned tree's pieces are gone");
}

#[tokio::test]
async fn a_large_state_that_changes_a_little_is_stored_once_by_digest_and_counted_so() {
    let server = Server::new();
    let store = server.store_with(|config| config.compact = false);
    let t = tree("large");
    let token = lease(&store, t).await;
    let mut state = noise(250_000, 99).into_bytes();
    let (mut prev, mut records) = (Digest::ZERO, Vec::new());
    let steps = 20u64;
    let mut growth = Vec::new();
    for seq in 1..=steps {
        let at = (seq as usize * 12_345) % state.len();
        state[at] = b"0123456789abcdef"[seq as usize % 16];
        let record = step(t, seq, prev, std::str::from_utf8(&state).expect("hex"));
        prev = record.hash;
        growth.push(stored(&store, t, token, &record).await);
        records.push(record);
    }
    let size = records[0].body.len() as u64;
    assert!(growth[0] >= size, "a new large state counts in full");
    assert!(
        growth[1..]
            .iter()
            .all(|grown| *grown > 0 && *grown < size / 10),
        "{growth:?} bytes counted per step of a {size}-byte state"
    );
    let loaded = store.load(t).await.expect("loads");
    assert_eq!(loaded.records, records, "byte-exact reassembly");
    assert_eq!(
        baton_run::log::verify(0, Digest::ZERO, &loaded.records),
        Ok((steps, prev))
    );
    let snapshot = Snapshot {
        seq: steps,
        head: prev,
        state: Arc::from(records.last().expect("records").body.to_vec()),
    };
    let before = store.bytes_written();
    assert_eq!(
        store.write_snapshot(t, token, snapshot).await,
        Ok(AppendOutcome::Committed)
    );
    let grown = store.bytes_written() - before;
    assert!(
        grown > 0 && grown < size / 10,
        "{grown} bytes for a snapshot"
    );
    let stored: i64 = connect(&url(&store))
        .await
        .query_one("SELECT sum(length(bytes))::bigint FROM baton_chunks", &[])
        .await
        .expect("sums")
        .get(0);
    let per_step = (stored - 250_000) / steps as i64;
    assert!(
        per_step < 10_000,
        "{stored} piece bytes: {per_step} per step"
    );
}

/// A body that holds the same long text twice (a start's input and the
/// initial state made from it) stores and counts that text's pieces once,
/// and reads back byte for byte.
#[tokio::test]
async fn a_body_holding_a_text_twice_stores_its_pieces_once() {
    let server = Server::new();
    let store = server.store();
    let t = tree("twice");
    let token = lease(&store, t).await;
    let text = noise(120_000, 17);
    let record = step(t, 1, Digest::ZERO, &format!("{text} and again {text}"));
    let size = record.body.len() as u64;
    let counted = stored(&store, t, token, &record).await;
    assert!(
        counted > size / 2 && counted < size * 6 / 10,
        "{counted} bytes counted for a {size}-byte body holding one text twice"
    );
    assert_eq!(store.load(t).await.expect("loads").records, vec![record]);
}

/// Appends `record` to `tree` under `token`, checks it committed and
/// returns the payload bytes the store counted for it.
async fn stored(store: &PostgresStore, tree: TreeId, token: u64, record: &Record) -> u64 {
    let before = store.bytes_written();
    assert_eq!(
        store
            .append(vec![append(tree, token, vec![record.clone()])])
            .await,
        Ok(vec![AppendOutcome::Committed])
    );
    store.bytes_written() - before
}

/// A 250 KB state of seeded noise with `edits` single bytes changed.
fn edited(seed: u64, edits: &[usize]) -> String {
    let mut state = noise(250_000, seed).into_bytes();
    let len = state.len();
    for &at in edits {
        state[at % len] = b"0123456789abcdef"[at % 16];
    }
    String::from_utf8(state).expect("hex")
}

/// A snapshot at record `at` with a small state of its own, so compaction
/// deletes every piece the records held.
fn small_snapshot(at: &Record) -> Snapshot {
    Snapshot {
        seq: at.seq,
        head: at.hash,
        state: Arc::from(&b"{\"small\":true}"[..]),
    }
}

/// Commits [`small_snapshot`] of `tree` at `at`.
async fn compact_at(store: &PostgresStore, tree: TreeId, token: u64, at: &Record) {
    assert_eq!(
        store.write_snapshot(tree, token, small_snapshot(at)).await,
        Ok(AppendOutcome::Committed)
    );
}

/// The writer remembers a tree's last cut so the next large body sends
/// only its new pieces; these are the cases where the pieces it remembers
/// are gone, and the next body must be cut and sent afresh to read back.
#[tokio::test]
async fn a_remembered_cut_is_reused_only_under_its_token_and_never_after_a_compaction() {
    let server = Server::new();
    let ours = server.store();
    let theirs = handle_on(&url(&ours));
    let t = tree("cuts");
    let token = lease(&ours, t).await;
    let (mut seq, mut prev) = (0u64, Digest::ZERO);
    let mut next = |state: &str| {
        seq += 1;
        let record = step(t, seq, prev, state);
        prev = record.hash;
        record
    };
    let first = next(&edited(5, &[]));
    let size = first.body.len() as u64;
    let second = next(&edited(5, &[1_000]));
    assert_eq!(
        ours.append(vec![append(t, token, vec![first, second.clone()])])
            .await,
        Ok(vec![AppendOutcome::Committed])
    );

    // Our own compaction deletes every piece: the next body, though it
    // shares all but one piece with the last, is sent whole again.
    compact_at(&ours, t, token, &second).await;
    let third = next(&edited(5, &[1_000, 90_000]));
    assert!(
        stored(&ours, t, token, &third).await >= size,
        "after a compaction every piece is stored again"
    );
    assert_eq!(ours.load(t).await.expect("loads").records, [third]);

    // A step under the same token after it reuses the remembered pieces.
    let fourth = next(&edited(5, &[1_000, 90_000, 180_000]));
    assert!(stored(&ours, t, token, &fourth).await < size / 10);

    // Another handle takes the tree over, goes on and compacts: the pieces
    // our writer remembers are gone, and our token is no longer current.
    let taken = lease(&theirs, t).await;
    let fifth = next(&edited(6, &[]));
    assert_eq!(
        theirs
            .append(vec![append(t, taken, vec![fifth.clone()])])
            .await,
        Ok(vec![AppendOutcome::Committed])
    );
    compact_at(&theirs, t, taken, &fifth).await;
    let sixth = next(&edited(5, &[1_000, 90_000, 180_000, 200_000]));
    assert_eq!(
        ours.append(vec![append(t, token, vec![sixth.clone()])])
            .await,
        Ok(vec![AppendOutcome::Fenced])
    );
    // Under a new token the body that shares pieces with the remembered
    // cut is cut and sent afresh, and reads back.
    let again = lease(&ours, t).await;
    assert!(stored(&ours, t, again, &sixth).await >= size);
    let loaded = ours.load(t).await.expect("loads");
    assert_eq!(loaded.records, std::slice::from_ref(&sixth));
    assert_eq!(
        baton_run::log::verify(fifth.seq, fifth.hash, &loaded.records),
        Ok((sixth.seq, sixth.hash))
    );

    // A step, a compaction and the next step queued together (so they
    // share a group commit): the last is cut afresh all the same.
    let seventh = next(&edited(5, &[1_000, 90_000, 180_000, 200_000, 7]));
    let eighth = next(&edited(5, &[1_000, 90_000, 180_000, 200_000, 7, 8]));
    let queued = (
        ours.append(vec![append(t, again, vec![seventh.clone()])]),
        ours.write_snapshot(t, again, small_snapshot(&seventh)),
        ours.append(vec![append(t, again, vec![eighth.clone()])]),
    );
    assert_eq!(queued.0.await, Ok(vec![AppendOutcome::Committed]));
    assert_eq!(queued.1.await, Ok(AppendOutcome::Committed));
    assert_eq!(queued.2.await, Ok(vec![AppendOutcome::Committed]));
    assert_eq!(ours.load(t).await.expect("loads").records, [eighth]);
}

/// A group that fails on one write's own statements is applied again one
/// write per transaction; a cut kept by the first of them must not outlive
/// the compaction of a later one.
#[tokio::test]
async fn a_cut_kept_while_a_failed_group_is_retried_write_by_write_never_outlives_its_compaction() {
    let server = Server::new();
    let store = server.store();
    let t = tree("split");
    let token = lease(&store, t).await;
    let first = step(t, 1, Digest::ZERO, &edited(9, &[]));
    let size = first.body.len() as u64;
    let second = step(t, 2, first.hash, &edited(9, &[500]));
    assert_eq!(
        store
            .append(vec![append(t, token, vec![first.clone()])])
            .await,
        Ok(vec![AppendOutcome::Committed])
    );
    // Queued together, so they share a group, which the refused creation
    // fails: the append and the compaction then commit one by one.
    let refused = CreateTree {
        tree: tree("refused"),
        owner: "test".into(),
        now: Timestamp(0),
        ttl: Duration::from_secs(60),
        records: Vec::new(),
        meta: meta(tree("refused"), TreeStatus::Running, 1),
        hold: true,
    };
    let queued = (
        store.append(vec![append(t, token, vec![second.clone()])]),
        store.write_snapshot(t, token, small_snapshot(&second)),
        store.create_tree(refused),
    );
    assert_eq!(queued.0.await, Ok(vec![AppendOutcome::Committed]));
    assert_eq!(queued.1.await, Ok(AppendOutcome::Committed));
    assert!(
        queued.2.await.is_err(),
        "a creation without records is refused"
    );
    // The pieces the second body had are gone with it; the third, which
    // shares them, is stored whole again and reads back.
    let third = step(t, 3, second.hash, &edited(9, &[500, 100_000]));
    assert!(stored(&store, t, token, &third).await >= size);
    assert_eq!(store.load(t).await.expect("loads").records, [third]);
}

#[test]
fn the_public_handles_are_send_and_sync() {
    fn shared<T: Send + Sync + 'static>() {}
    shared::<PostgresStore>();
    shared::<baton_store_postgres::Listener>();
    shared::<baton_store_postgres::OpenError>();
}
