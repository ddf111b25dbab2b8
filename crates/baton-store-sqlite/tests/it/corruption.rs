//! The corruption matrix on a SQLite file: each kind of damage an operator,
//! a broken disk or a careless hand can do to a store is found by `verify`
//! with its record number, and none makes another tree unreadable.

use std::path::Path;
use std::sync::Arc;

use baton_run::store::{ListFilter, Store, StoreError, TreeStatus};
use baton_run::{
    Engine, EngineConfig, Payload, RecoverOptions, Scope, SignalId, SignalReceipt, SignalRequest,
    TreeError, TreeId, Verification,
};
use baton_store_sqlite::{Creation, OpenError, SqliteConfig, SqliteStore};
use baton_testkit::programs::{Kind, SCOPE, open_wait, program, request};
use rusqlite::params;
use serde_json::json;

fn scope() -> Scope {
    Scope::new(SCOPE).expect("valid")
}

fn store_at(path: &Path) -> SqliteStore {
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

fn engine(store: &SqliteStore) -> Engine {
    let ask = program(Kind::Ask, None);
    let echo = program(Kind::Echo, None);
    Engine::new(EngineConfig {
        programs: vec![ask.erase(), echo.erase()],
        snapshot_every: 4,
        ..EngineConfig::new(Arc::new(store.clone()))
    })
    .expect("the engine configuration is valid")
}

/// A store with two waiting trees of a dozen records each, each with a
/// snapshot in the middle of its log; returns the trees and the first
/// tree's snapshot sequence.
async fn two_trees(path: &Path) -> (TreeId, TreeId, u64) {
    let store = store_at(path);
    let engine = engine(&store);
    let ask = program(Kind::Ask, None);
    let mut trees = Vec::new();
    for key in ["damaged", "bystander"] {
        let handle = engine
            .start(&ask, request(key, "shall we?"))
            .await
            .expect("starts");
        open_wait(&handle).await;
        for index in 0..10 {
            let note = SignalRequest {
                id: SignalId::new(format!("{key}-{index}")).expect("valid"),
                wait: None,
                payload: Payload::encode(&json!({ "note": format!("n{index}") })).expect("encodes"),
            };
            assert_eq!(handle.signal(note).await, Ok(SignalReceipt::Admitted));
        }
        trees.push(handle.tree());
    }
    engine.close().await;
    let load = store.load(trees[0]).await.expect("loads");
    let snapshot = load.snapshot.expect("a snapshot was written").seq;
    let head = store.records(trees[0]).await.expect("reads").len() as u64;
    assert!(
        snapshot > 1 && snapshot < head,
        "the snapshot ({snapshot}) lies inside the log (1 to {head})"
    );
    (trees[0], trees[1], snapshot)
}

/// Copies the log into the file, so the file alone holds every commit.
/// (The engine's aborted tasks may still hold the store for a moment, so
/// its closing checkpoint may not have run yet.)
fn checkpoint(path: &Path) {
    rusqlite::Connection::open(path)
        .and_then(|conn| {
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
                row.get::<_, i64>(0)
            })
        })
        .expect("checkpoints");
}

/// Keeps the store file at `path` as it is now; the returned closure puts
/// it back (dropping any log written since).
fn pristine(path: &Path) -> impl Fn() + '_ {
    checkpoint(path);
    let pristine = std::fs::read(path).expect("reads");
    move || {
        for leftover in ["-wal", "-shm"] {
            let mut name = path.as_os_str().to_owned();
            name.push(leftover);
            let _ = std::fs::remove_file(name);
        }
        std::fs::write(path, &pristine).expect("writes");
    }
}

fn key_of(conn: &rusqlite::Connection, tree: TreeId) -> i64 {
    conn.query_row(
        "SELECT key FROM trees WHERE id = ?1",
        [tree.to_string()],
        |r| r.get(0),
    )
    .expect("tree row")
}

fn head_of(conn: &rusqlite::Connection, tree: TreeId) -> u64 {
    let head: i64 = conn
        .query_row(
            "SELECT head_seq FROM trees WHERE id = ?1",
            [tree.to_string()],
            |r| r.get(0),
        )
        .expect("tree row");
    head as u64
}

/// Flips the last-but-one byte of an inline record body.
fn flip_record(conn: &rusqlite::Connection, tree: TreeId, seq: u64) {
    let key = key_of(conn, tree);
    let body: Vec<u8> = conn
        .query_row(
            "SELECT body FROM records WHERE tree = ?1 AND seq = ?2",
            params![key, seq as i64],
            |r| r.get(0),
        )
        .expect("an inline record");
    let mut edited = body;
    let at = edited.len() - 2;
    edited[at] ^= 0x01;
    conn.execute(
        "UPDATE records SET body = ?1 WHERE tree = ?2 AND seq = ?3",
        params![edited, key, seq as i64],
    )
    .expect("updates");
}

async fn verify(path: &Path, tree: TreeId) -> Result<Verification, TreeError> {
    let store = store_at(path);
    let engine = engine(&store);
    engine.verify(&scope(), tree).await
}

/// `verify` refuses the damaged tree at `record`, and the bystander still
/// verifies in full.
async fn detected_at(path: &Path, damaged: TreeId, bystander: TreeId, record: u64, what: &str) {
    match verify(path, damaged).await {
        Err(TreeError::Corrupt {
            record: Some(found),
            message,
            ..
        }) => assert_eq!(found, record, "{what}: found at record {found}: {message}"),
        other => panic!("{what} was not detected: {other:?}"),
    }
    let checked = verify(path, bystander)
        .await
        .unwrap_or_else(|error| panic!("{what} made another tree unreadable: {error}"));
    assert_eq!(checked.first, 1, "{what}: the bystander is checked whole");
}

#[tokio::test]
async fn every_kind_of_damage_is_found_with_its_record_and_leaves_other_trees_readable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let (damaged, bystander, snapshot) = two_trees(&path).await;
    let restore = pristine(&path);
    restore();
    let checked = verify(&path, damaged)
        .await
        .expect("the pristine log verifies");
    assert_eq!(checked.first, 1, "the whole log is kept and checked");
    assert_eq!(
        checked.snapshot_matched,
        Some(snapshot),
        "the snapshot is checked against the log it covers"
    );
    assert!(checked.head_recorded, "the recorded head is compared");
    let head = checked.head_seq;

    // A byte flipped in a record the snapshot covers, and in one after it.
    for seq in [snapshot - 1, snapshot + 1] {
        restore();
        flip_record(
            &rusqlite::Connection::open(&path).expect("opens"),
            damaged,
            seq,
        );
        detected_at(
            &path,
            damaged,
            bystander,
            seq,
            &format!("a flip in record {seq}"),
        )
        .await;
    }

    // The last record dropped: the log looks shorter, the row says otherwise.
    restore();
    {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        let key = key_of(&conn, damaged);
        conn.execute(
            "DELETE FROM records WHERE tree = ?1 AND seq = ?2",
            params![key, head as i64],
        )
        .expect("deletes");
    }
    detected_at(&path, damaged, bystander, head, "a dropped last record").await;

    // A record dropped from the middle.
    restore();
    let middle = snapshot + 2;
    {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        let key = key_of(&conn, damaged);
        conn.execute(
            "DELETE FROM records WHERE tree = ?1 AND seq = ?2",
            params![key, middle as i64],
        )
        .expect("deletes");
    }
    detected_at(
        &path,
        damaged,
        bystander,
        middle + 1,
        "a dropped middle record",
    )
    .await;

    // The snapshot's head flipped.
    restore();
    {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        let key = key_of(&conn, damaged);
        let mut head: Vec<u8> = conn
            .query_row("SELECT head FROM snapshots WHERE tree = ?1", [key], |r| {
                r.get(0)
            })
            .expect("snapshot row");
        head[0] ^= 0x01;
        conn.execute(
            "UPDATE snapshots SET head = ?1 WHERE tree = ?2",
            params![head, key],
        )
        .expect("updates");
    }
    detected_at(
        &path,
        damaged,
        bystander,
        snapshot,
        "a flipped snapshot head",
    )
    .await;

    // The tree row's head moved past the log.
    restore();
    {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        conn.execute(
            "UPDATE trees SET head_seq = head_seq + 1 WHERE id = ?1",
            [damaged.to_string()],
        )
        .expect("updates");
        assert_eq!(head_of(&conn, damaged), head + 1);
    }
    detected_at(
        &path,
        damaged,
        bystander,
        head + 1,
        "a tree row ahead of its log",
    )
    .await;
}

/// A tree that ends in its first commit (its records packed in its row).
async fn ended_tree(path: &Path, key: &str) -> TreeId {
    let store = store_at(path);
    let engine = engine(&store);
    let echo = program(Kind::Echo, None);
    let handle = engine
        .start(&echo, request(key, json!({ "echo": key })))
        .await
        .expect("starts");
    handle.join().await.expect("joins");
    engine.close().await;
    handle.tree()
}

/// A tree that ends in its first commit keeps its records packed in its
/// row: a flipped byte there is found at its record, and packed records
/// cut short fail that tree alone, as a classified store error.
#[tokio::test]
async fn damage_to_packed_first_records_is_found_and_leaves_other_trees_readable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let damaged = ended_tree(&path, "damaged").await;
    let bystander = ended_tree(&path, "bystander").await;
    let restore = pristine(&path);
    restore();
    let checked = verify(&path, damaged)
        .await
        .expect("the pristine log verifies");
    assert_eq!(checked.first, 1);

    // A byte flipped in the last packed record, written back in the plain
    // form (a version byte, the count, then each record, the last body
    // last).
    let packed = {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        let (log, rows): (Vec<u8>, i64) = conn
            .query_row(
                "SELECT log, (SELECT count(*) FROM records WHERE records.tree = trees.key)
                 FROM trees WHERE id = ?1",
                [damaged.to_string()],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .expect("the first records are packed in the row");
        assert_eq!(rows, 0, "no record is a row");
        assert_eq!(log[0], 3, "the records are stored compact");
        let log = baton_store_sqlite::plain_packed_log(&log, damaged).expect("a packed log");
        let count = u64::from(log[1]);
        assert!(count > 1 && count < 0x80, "{count}");
        assert_eq!(count, checked.head_seq);
        let mut edited = log;
        let at = edited.len() - 2;
        edited[at] ^= 0x01;
        conn.execute(
            "UPDATE trees SET log = ?1 WHERE id = ?2",
            params![edited, damaged.to_string()],
        )
        .expect("updates");
        count
    };
    detected_at(
        &path,
        damaged,
        bystander,
        packed,
        "a flip in a packed first record",
    )
    .await;

    // Every byte of the compact records flipped in turn: the tree no
    // longer verifies (the records do not decompress, or decompress to
    // others, which the log's check refuses), or, where the flip left the
    // records as they were (a bit the decoder does not read), verifies to
    // the same head; the bystander verifies throughout.
    restore();
    let head = verify(&path, damaged).await.expect("verifies").head;
    let stored: Vec<u8> = rusqlite::Connection::open(&path)
        .expect("opens")
        .query_row(
            "SELECT log FROM trees WHERE id = ?1",
            [damaged.to_string()],
            |r| r.get(0),
        )
        .expect("the packed log");
    for at in 1..stored.len() {
        let mut edited = stored.clone();
        edited[at] ^= 0x20;
        rusqlite::Connection::open(&path)
            .expect("opens")
            .execute(
                "UPDATE trees SET log = ?1 WHERE id = ?2",
                params![edited, damaged.to_string()],
            )
            .expect("updates");
        match verify(&path, damaged).await {
            Err(TreeError::Store(StoreError::Corrupt { message, .. })) => assert!(
                message.contains(&format!("the first records of tree {damaged}: ")),
                "byte {at}: {message}"
            ),
            Err(TreeError::Corrupt { .. }) => {}
            Ok(checked) => assert_eq!(
                (checked.head, checked.head_seq),
                (head, packed),
                "a flip of compressed byte {at} changed the records undetected"
            ),
            other => panic!("a flip of compressed byte {at} was not detected: {other:?}"),
        }
    }
    verify(&path, bystander)
        .await
        .expect("the bystander still verifies");

    // The packed records cut short: the tree no longer reads, the
    // bystander does.
    restore();
    let message = log_damaged_to(&path, damaged, "substr(log, 1, length(log) - 3)").await;
    assert!(
        message.contains(&format!("the first records of tree {damaged}: ")),
        "{message}"
    );
    let checked = verify(&path, bystander)
        .await
        .expect("the bystander still verifies");
    assert_eq!(checked.first, 1);

    // The packed records replaced by text (SQLite lets any column hold any
    // type): the tree's data is corrupt, not the store unavailable, and
    // the bystander still reads.
    restore();
    let message = log_damaged_to(&path, damaged, "'not a log'").await;
    assert!(
        message.contains("column log holds a value of type Text"),
        "{message}"
    );
    verify(&path, bystander)
        .await
        .expect("the bystander still verifies");
}

/// Sets the `log` of `tree`'s row to the SQL expression `value` and
/// returns the message of the `Corrupt` store error verifying it gives.
async fn log_damaged_to(path: &Path, tree: TreeId, value: &str) -> String {
    rusqlite::Connection::open(path)
        .expect("opens")
        .execute(
            &format!("UPDATE trees SET log = {value} WHERE id = ?1"),
            [tree.to_string()],
        )
        .expect("updates");
    match verify(path, tree).await {
        Err(TreeError::Store(StoreError::Corrupt { message, .. })) => message,
        other => panic!("a log set to {value} was not reported corrupt: {other:?}"),
    }
}

#[tokio::test]
async fn a_damaged_row_fails_its_own_tree_and_listing_and_recovery_carry_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let (damaged, bystander, _) = two_trees(&path).await;
    {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        conn.execute(
            "UPDATE trees SET status = 'garbage' WHERE id = ?1",
            [damaged.to_string()],
        )
        .expect("updates");
    }
    let store = store_at(&path);
    let listing = store.list(ListFilter::default()).await.expect("lists");
    assert_eq!(
        listing
            .trees
            .iter()
            .map(|meta| meta.tree)
            .collect::<Vec<_>>(),
        vec![bystander],
        "the readable tree is listed"
    );
    assert_eq!(listing.unreadable.len(), 1, "{listing:?}");
    assert_eq!(listing.unreadable[0].tree, Some(damaged));
    assert!(
        listing.unreadable[0].error.to_string().contains("garbage"),
        "{}",
        listing.unreadable[0].error
    );
    let engine = engine(&store);
    let report = engine
        .recover(RecoverOptions::default())
        .await
        .expect("recovery carries on");
    let result = |tree| {
        report
            .iter()
            .find(|(found, _)| *found == tree)
            .map(|(_, result)| result.clone())
    };
    assert!(
        matches!(result(damaged), Some(Err(TreeError::Store(_)))),
        "{report:?}"
    );
    assert_eq!(result(bystander), Some(Ok(())), "{report:?}");
}

#[tokio::test]
async fn a_tree_moved_to_another_scope_in_its_row_is_refused_at_attach() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let (moved, _, _) = two_trees(&path).await;
    {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        conn.execute(
            "UPDATE trees SET scope = 'intruder' WHERE id = ?1",
            [moved.to_string()],
        )
        .expect("updates");
    }
    let store = store_at(&path);
    let engine = engine(&store);
    let intruder = Scope::new("intruder").expect("valid");
    let report = engine
        .recover(RecoverOptions {
            scope: Some(intruder.clone()),
            ..RecoverOptions::default()
        })
        .await
        .expect("lists");
    assert_eq!(
        report.len(),
        1,
        "the moved row is listed under the new scope"
    );
    assert!(
        matches!(
            &report[0].1,
            Err(TreeError::Scope { .. } | TreeError::Corrupt { .. })
        ),
        "the tree was taken up in the wrong scope: {report:?}"
    );
    let error = engine
        .process::<Payload>(&intruder, moved)
        .await
        .expect_err("refused in the row's scope");
    assert!(
        matches!(error.code(), "engine.scope.mismatch" | "engine.log.corrupt"),
        "{error}"
    );
    let error = engine
        .process::<Payload>(&scope(), moved)
        .await
        .expect_err("refused in its own scope too: the row disagrees with the log");
    assert_eq!(error.code(), "engine.log.corrupt", "{error}");
    let listed = store
        .list(ListFilter {
            status: Some(TreeStatus::Waiting),
            scope: Some(scope()),
            ..ListFilter::default()
        })
        .await
        .expect("lists");
    assert!(listed.trees.iter().all(|meta| meta.tree != moved));
}

#[test]
fn a_store_truncated_to_nothing_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    drop(SqliteStore::create(&path).expect("creates"));
    std::fs::write(&path, b"").expect("truncates");
    for opened in [SqliteStore::open(&path), SqliteStore::open_or_create(&path)] {
        let error = opened.expect_err("an empty file is refused");
        assert!(matches!(error, OpenError::Empty { .. }), "{error:?}");
        assert!(error.to_string().contains("truncated"), "{error}");
    }
    assert_eq!(std::fs::read(&path).expect("reads"), b"", "left untouched");
    let error = SqliteStore::open(dir.path().join("missing.db")).expect_err("no file");
    assert!(matches!(error, OpenError::Missing { .. }), "{error:?}");
    assert!(
        !dir.path().join("missing.db").exists(),
        "opening never creates a store"
    );
    let error = SqliteStore::create(&path).expect_err("a file is there");
    assert!(matches!(error, OpenError::Exists { .. }), "{error:?}");
}

/// Fuzzing whole store files (see `baton_testkit::fuzz`): a real store's
/// file with bytes flipped, spans deleted or repeated anywhere, opened,
/// listed, loaded and verified. Each step succeeds or fails with a
/// classified error; none panics. Opening a file costs milliseconds, so
/// this runs a thousandth of the fuzz cases (at least 32).
#[test]
fn fuzz_store_files() {
    use proptest::prelude::*;

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (damaged, _, _) = runtime.block_on(two_trees(&path));
    let ended = runtime.block_on(ended_tree(&path, "ended"));
    checkpoint(&path);
    let pristine = std::fs::read(&path).expect("reads");
    let config = proptest::test_runner::Config {
        cases: (baton_testkit::fuzz::cases() / 1_000).max(32),
        ..baton_testkit::fuzz::config()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let files = baton_testkit::fuzz::bytes(vec![pristine]);
    let case = dir.path().join("case.db");
    runner
        .run(&files, |bytes| {
            for leftover in ["case.db-wal", "case.db-shm"] {
                let _ = std::fs::remove_file(dir.path().join(leftover));
            }
            std::fs::write(&case, &bytes).expect("writes");
            let Ok(store) = SqliteStore::open(&case) else {
                return Ok(());
            };
            runtime.block_on(async {
                let _ = store.list(ListFilter::default()).await;
                let engine = engine(&store);
                for tree in [damaged, ended] {
                    let _ = store.load(tree).await;
                    if let Err(error) = engine.verify(&scope(), tree).await {
                        prop_assert!(
                            matches!(
                                error.code(),
                                "engine.log.corrupt"
                                    | "engine.store.failed"
                                    | "engine.tree.not_found"
                                    | "engine.scope.mismatch"
                            ),
                            "{error}"
                        );
                    }
                }
                Ok(())
            })
        })
        .expect("no damaged file makes the store panic or misclassify");
}
