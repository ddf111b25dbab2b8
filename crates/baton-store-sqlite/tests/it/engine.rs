//! The engine's behaviour on a temp-file `SqliteStore`: the whole engine
//! conformance kit of `baton-testkit`, so behaviour cannot drift between
//! backends; plus what only a file can show: tamper detection by editing
//! the database file directly, and recovery by a fresh engine on a reopened
//! file.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use baton_run::dispatch::ReplayPolicy;
use baton_run::log::RecordKind;
use baton_run::store::{Store, TreeStatus};
use baton_run::{
    Engine, EngineConfig, Payload, RecoverOptions, RuntimeError, Scope, SignalId, SignalReceipt,
    SignalRequest, Status, TreeError, TreeId,
};
use baton_store_sqlite::{Creation, SqliteConfig, SqliteStore};
use baton_testkit::programs::{Kind, SCOPE, engine, open_wait, program, request};
use baton_testkit::{ScriptedDispatcher, engine_conformance};
use serde_json::json;

/// On a current-thread runtime (the kit pauses time), so the store's writer
/// thread commits; the tests below on a multi-thread runtime have the
/// engine's tasks commit.
#[tokio::test]
async fn the_engine_conforms_on_the_sqlite_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let next = AtomicUsize::new(0);
    let fresh = || {
        let path = dir
            .path()
            .join(format!("store-{}.db", next.fetch_add(1, Ordering::Relaxed)));
        SqliteStore::create(path).expect("creates")
    };
    engine_conformance(fresh).await;
}

fn keeping_history(path: &Path) -> SqliteStore {
    SqliteStore::open_with(
        path,
        SqliteConfig {
            creation: Creation::ExistingOrNew,
            compact: false,
            ..SqliteConfig::default()
        },
    )
    .expect("opens")
}

fn answer(id: &str, wait: baton_run::WaitId, value: bool) -> SignalRequest {
    SignalRequest {
        id: SignalId::new(id).expect("valid"),
        wait: Some(wait),
        payload: Payload::encode(&value).expect("encodes"),
    }
}

fn scope() -> Scope {
    Scope::new(SCOPE).expect("valid")
}

/// Where a record's bytes live in the file.
#[derive(Clone, Debug)]
enum Place {
    /// Inline in its row of `records`.
    Records { key: i64 },
    /// Its first piece, a row of `chunks`.
    Chunk { id: i64 },
    /// Among the first records packed in the tree's row (`trees.log`); the
    /// bytes are the whole packed log and `body` the record's body in it.
    Packed {
        key: i64,
        body: std::ops::Range<usize>,
    },
}

/// Reads a LEB128 varint at `at`, moving past it.
fn varint(bytes: &[u8], at: &mut usize) -> u64 {
    let mut value = 0u64;
    for shift in (0..).step_by(7) {
        let byte = bytes[*at];
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
    }
    value
}

/// The span of record `seq`'s body in a packed log: a version byte, the
/// count, then per record its kind's name, its 32-byte hash and its body,
/// each name and body after its length.
fn packed_body(log: &[u8], seq: u64) -> Option<std::ops::Range<usize>> {
    let mut at = 1;
    let count = varint(log, &mut at);
    for current in 1..=count {
        let kind = varint(log, &mut at) as usize;
        at += kind + 32;
        let len = varint(log, &mut at) as usize;
        if current == seq {
            return Some(at..at + len);
        }
        at += len;
    }
    None
}

/// Where record `seq` of `tree` lives in the file, and the bytes there.
fn stored_bytes(conn: &rusqlite::Connection, tree: TreeId, seq: u64) -> (Place, Vec<u8>) {
    let (key, log): (i64, Option<Vec<u8>>) = conn
        .query_row(
            "SELECT key, log FROM trees WHERE id = ?1",
            [tree.to_string()],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("tree row");
    // Edited in the plain form: a compressed log is written back plain.
    if let Some(log) = log
        && let log = baton_store_sqlite::plain_packed_log(&log, tree).expect("a packed log")
        && let Some(body) = packed_body(&log, seq)
    {
        return (Place::Packed { key, body }, log);
    }
    let (body, chunks): (Option<Vec<u8>>, Option<Vec<u8>>) = conn
        .query_row(
            "SELECT body, chunks FROM records WHERE tree = ?1 AND seq = ?2",
            [key, seq as i64],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("record row");
    match (body, chunks) {
        (Some(body), None) => (Place::Records { key }, body),
        (None, Some(manifest)) => {
            let id = varint(&manifest, &mut 0) as i64;
            let bytes: Vec<u8> = conn
                .query_row("SELECT bytes FROM chunks WHERE id = ?1", [id], |r| r.get(0))
                .expect("chunk row");
            (Place::Chunk { id }, bytes)
        }
        other => panic!("unexpected row {other:?}"),
    }
}

fn write_back(conn: &rusqlite::Connection, seq: u64, place: &Place, bytes: &[u8]) {
    let changed = match place {
        Place::Records { key } => conn.execute(
            "UPDATE records SET body = ?1 WHERE tree = ?2 AND seq = ?3",
            rusqlite::params![bytes, key, seq as i64],
        ),
        Place::Chunk { id } => conn.execute(
            "UPDATE chunks SET bytes = ?1 WHERE id = ?2",
            rusqlite::params![bytes, id],
        ),
        Place::Packed { key, .. } => conn.execute(
            "UPDATE trees SET log = ?1 WHERE key = ?2",
            rusqlite::params![bytes, key],
        ),
    }
    .expect("updates");
    assert_eq!(changed, 1);
}

/// Flips one byte of record `seq`'s body in the file, checks that `verify`
/// fails at exactly that record, and restores the byte. Returns where the
/// record was stored.
async fn tamper_is_detected(path: &Path, tree: TreeId, seq: u64) -> Place {
    let conn = rusqlite::Connection::open(path).expect("opens");
    let (place, original) = stored_bytes(&conn, tree, seq);
    let mut edited = original.clone();
    let at = match &place {
        Place::Packed { body, .. } => body.end - 2,
        _ => edited.len() - 2,
    };
    edited[at] ^= 0x01;
    write_back(&conn, seq, &place, &edited);
    let verifier = Engine::new(EngineConfig::new(Arc::new(keeping_history(path))))
        .expect("the engine configuration is valid");
    match verifier.verify(&scope(), tree).await {
        Err(TreeError::Corrupt { message, .. }) => assert!(
            message.contains(&format!("record {seq}:")),
            "an edit of record {seq} ({place:?}) reported as {message}"
        ),
        other => panic!("an edit of record {seq} ({place:?}) was not detected: {other:?}"),
    }
    drop(verifier);
    write_back(&conn, seq, &place, &original);
    place
}

#[tokio::test]
async fn editing_any_stored_record_in_the_file_is_detected_at_that_record() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let dispatcher = ScriptedDispatcher::echo(ReplayPolicy::Never);
    let program = program(Kind::Dispatch, Some(Arc::new(dispatcher)));
    let echo = baton_testkit::programs::program(Kind::Echo, None);
    let store = keeping_history(&path);
    let engine = engine(Arc::new(store.clone()), &[&program, &echo]);
    let handle = engine
        .start(&program, request("three", json!(["a", "b", "c"])))
        .await
        .expect("starts");
    let termination = handle.join().await.expect("joins");
    assert_eq!(termination.status(), Status::Completed);

    // A second tree whose first record is large enough to be chunked.
    let big = "z".repeat(40_000);
    let large = engine
        .start(&program, request("large", json!([big])))
        .await
        .expect("starts");
    large.await_result().await.expect("terminates");
    large.join().await.expect("joins");

    // A third that ends in its first commit, which the store packs into
    // the tree's row.
    let short = engine
        .start(&echo, request("short", json!({"echo": "me"})))
        .await
        .expect("starts");
    assert_eq!(
        short.join().await.expect("joins").status(),
        Status::Completed
    );
    let short_records = store.records(short.tree()).await.expect("reads");
    assert!(short_records.len() > 1, "{short_records:?}");

    let head = engine
        .verify(&scope(), handle.tree())
        .await
        .expect("verifies")
        .head_seq;
    let records = store.records(handle.tree()).await.expect("reads");
    assert_eq!(head, records.len() as u64);
    let kinds: Vec<RecordKind> = records.iter().map(|r| r.kind).collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == RecordKind::EffectPending)
            .count(),
        3
    );
    assert_eq!(kinds.first(), Some(&RecordKind::TreeStarted));
    engine.close().await;
    drop(store);

    for record in &records {
        let place = tamper_is_detected(&path, handle.tree(), record.seq).await;
        assert!(matches!(place, Place::Records { .. }), "{place:?}");
    }
    assert!(matches!(
        tamper_is_detected(&path, large.tree(), 1).await,
        Place::Chunk { .. }
    ));
    for record in &short_records {
        let place = tamper_is_detected(&path, short.tree(), record.seq).await;
        assert!(matches!(place, Place::Packed { .. }), "{place:?}");
    }
    // Everything restored: both logs verify again.
    let verifier = Engine::new(EngineConfig::new(Arc::new(keeping_history(&path))))
        .expect("the engine configuration is valid");
    assert_eq!(
        verifier
            .verify(&scope(), handle.tree())
            .await
            .map(|checked| checked.head_seq),
        Ok(head)
    );
    assert!(verifier.verify(&scope(), large.tree()).await.is_ok());
    assert!(verifier.verify(&scope(), short.tree()).await.is_ok());
}

#[tokio::test]
async fn a_fresh_engine_on_a_reopened_file_recovers_a_tree_from_a_dropped_engine() {
    recovers_a_tree_from_a_dropped_engine().await;
}

/// The same where the engines' tasks commit their own writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_engine_recovers_a_tree_from_a_dropped_engine_whose_tasks_committed() {
    recovers_a_tree_from_a_dropped_engine().await;
}

async fn recovers_a_tree_from_a_dropped_engine() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let program = program(Kind::Ask, None);
    let store = keeping_history(&path);
    let first = engine(Arc::new(store.clone()), &[&program]);
    let handle = first
        .start(&program, request("survivor", "q"))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    let tree = handle.tree();
    drop(first);
    assert!(matches!(
        handle.await_result().await,
        Err(RuntimeError::Closed { .. })
    ));
    drop(handle);
    drop(store);

    // Without the program registered: classified error, stored tree untouched.
    let store = keeping_history(&path);
    let before = store.records(tree).await.expect("reads");
    let bare = Engine::new(EngineConfig::new(Arc::new(store.clone())))
        .expect("the engine configuration is valid");
    let report = bare
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    assert_eq!(report.len(), 1);
    assert_eq!(
        report[0].1.as_ref().expect_err("missing").code(),
        "engine.program.unavailable"
    );
    assert_eq!(store.records(tree).await.expect("reads"), before);
    drop(bare);

    // With the registry: the dropped engine's lease is reclaimed (its owner
    // is provably gone) and the tree finishes.
    let second = engine(Arc::new(store.clone()), &[&program]);
    let report = second
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    assert!(report[0].1.is_ok(), "{report:?}");
    let handle = second
        .process::<Payload>(&scope(), tree)
        .await
        .expect("attached");
    assert_eq!(
        handle.signal(answer("late", wait, true)).await,
        Ok(SignalReceipt::Admitted)
    );
    assert_eq!(
        handle.await_result().await.expect("terminates").status(),
        Status::Completed
    );
    let listed = store
        .list(baton_run::store::ListFilter {
            status: Some(TreeStatus::Done),
            scope: None,
            ..baton_run::store::ListFilter::default()
        })
        .await
        .expect("lists");
    assert_eq!(listed.trees.len(), 1);
    assert!(second.verify(&scope(), tree).await.is_ok());
}

/// Every committed event of a watch, in order, until it ends.
async fn watched(watch: &mut baton_run::Watch) -> Vec<baton_run::WatchEvent> {
    let mut events = Vec::new();
    while let Some(event) = watch.next().await {
        let event = event.expect("the log reads");
        if event.durable {
            events.push(event);
        }
    }
    events
}

#[tokio::test]
async fn a_reader_on_another_connection_follows_a_tree_another_engine_writes_to_its_end() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("watched.db");
    let ask = program(Kind::Ask, None);
    let writer = engine(Arc::new(keeping_history(&path)), &[&ask]);
    let handle = writer
        .start(&ask, request("ask", "proceed?"))
        .await
        .expect("starts")
        .into_handle();
    let wait = open_wait(&handle).await;
    // The reader has its own store and engine on the same file, as another
    // process would: no live event of the writer reaches it.
    let reader = engine(Arc::new(keeping_history(&path)), &[&ask]);
    let mut live = reader
        .watch(&scope(), handle.tree(), 0)
        .await
        .expect("watches");
    let following = tokio::spawn(async move { watched(&mut live).await });
    writer
        .answer(
            &scope(),
            handle.tree(),
            wait,
            Payload::encode(&true).expect("encodes"),
        )
        .await
        .expect("answers");
    let done = handle
        .until(baton_run::Condition::Terminal)
        .await
        .expect("ends");
    let seen = following.await.expect("joins");
    let seqs: Vec<u64> = seen.iter().filter_map(|event| event.seq).collect();
    assert_eq!(seqs, (1..=done.head_seq).collect::<Vec<_>>());
    writer.close().await;

    // A reader after the end, on a reopened file, sees the same facts.
    let later = engine(Arc::new(keeping_history(&path)), &[&ask]);
    let mut after = later
        .watch(&scope(), handle.tree(), 0)
        .await
        .expect("watches");
    assert_eq!(watched(&mut after).await, seen);
}

/// What a start costs in SQLite write transactions (counted by the store's
/// commit hook): a root that ends in its first round, or waits after it,
/// is one transaction; a root that acts (dispatches) is created with its
/// start and then commits its first round.
#[tokio::test]
async fn a_root_that_ends_or_waits_in_its_first_round_costs_one_transaction() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::create(dir.path().join("store.db")).expect("creates");
    first_rounds_cost_one_transaction(&store).await;
    assert_eq!(store.caller_groups(), 0, "the writer thread committed");
}

/// The same where the engine's tasks commit their own writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_that_ends_or_waits_in_its_first_round_costs_one_transaction_on_its_task() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::create(dir.path().join("store.db")).expect("creates");
    first_rounds_cost_one_transaction(&store).await;
    assert!(store.caller_groups() > 0, "the engine's tasks committed");
}

async fn first_rounds_cost_one_transaction(store: &SqliteStore) {
    let echo = program(Kind::Echo, None);
    let ask = program(Kind::Ask, None);
    let engine = Arc::new(engine(Arc::new(store.clone()), &[&echo, &ask]));

    let before = store.transactions();
    let handle = engine
        .start(&echo, request("echo", json!("hi")))
        .await
        .expect("starts");
    let after = store.transactions();
    assert_eq!(
        after - before,
        1,
        "a root that ends at once is one transaction"
    );
    assert_eq!(handle.output().await.expect("completes"), json!("hi"));
    let stored = store.load(handle.tree()).await.expect("loads");
    assert_eq!(
        stored.meta.map(|meta| meta.status),
        Some(TreeStatus::Done),
        "and it is stored done"
    );
    assert_eq!(store.transactions(), after, "nothing more to write");

    let before = store.transactions();
    let waiting = engine
        .start(&ask, request("ask", json!("ship?")))
        .await
        .expect("starts");
    // Counted before the host looks at the tree: asked about a tree that
    // already sleeps, the engine renews its lease first (a write of the
    // host's asking, not of the start).
    assert_eq!(
        store.transactions() - before,
        1,
        "a root that waits after its first round is one transaction"
    );
    open_wait(&waiting).await;
    let stored = store.load(waiting.tree()).await.expect("loads");
    assert_eq!(
        stored.meta.map(|meta| meta.status),
        Some(TreeStatus::Waiting)
    );

    // Ten roots started at once share group commits: never more
    // transactions than roots.
    let before = store.transactions();
    let mut starts = tokio::task::JoinSet::new();
    for n in 0..10 {
        let (engine, echo) = (engine.clone(), echo.clone());
        starts.spawn(async move {
            engine
                .start(&echo, request(&format!("many-{n}"), json!(n)))
                .await
                .map(|handle| handle.tree())
        });
    }
    while let Some(started) = starts.join_next().await {
        started.expect("joins").expect("starts");
    }
    let spent = store.transactions() - before;
    assert!(
        (1..=10).contains(&spent),
        "{spent} transactions for ten roots"
    );
}
