//! What only a file-backed store can show: refusing bad files without
//! touching them, surviving a reopen, pruning, and storing unchanged parts
//! of large states once.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use baton_run::log::{Record, RecordBody, Snapshot};
use baton_run::program::{ExecutionState, Transition};
use baton_run::store::{
    AcquireRequest, Acquired, Append, AppendOutcome, CreateTree, Created, ListFilter, Store,
    TreeMeta, TreeStatus,
};
use baton_run::{Digest, EffectId, Payload, ProcessId, Scope, StartId, Timestamp, TreeId};
use baton_store_sqlite::{
    Creation, OpenError, PageSize, SCHEMA_VERSION, SqliteConfig, SqliteStore,
};
use baton_testkit::noise;

pub(super) fn tree(key: &str) -> TreeId {
    ProcessId::root(&StartId::new("acme", key).expect("valid"))
}

async fn lease(store: &SqliteStore, tree: TreeId) -> u64 {
    match store
        .acquire(AcquireRequest {
            tree,
            owner: "test".into(),
            now: Timestamp(0),
            ttl: Duration::from_secs(60),
            force: true,
        })
        .await
        .expect("acquires")
    {
        Acquired::Granted { lease, .. } => lease.token,
        other => panic!("unexpected {other:?}"),
    }
}

pub(super) fn meta(tree: TreeId, status: TreeStatus, updated: u64) -> TreeMeta {
    TreeMeta::new(
        tree,
        Scope::new("acme").expect("valid"),
        status,
        Timestamp(updated),
    )
}

/// Appends `record` to tree `t` (still running, updated at the record's
/// sequence number) under `token` and checks it committed.
async fn append_one(store: &SqliteStore, t: TreeId, token: u64, record: Record) {
    let item = Append {
        tree: t,
        token,
        meta: meta(t, TreeStatus::Running, record.seq),
        records: vec![record],
        release: false,
    };
    assert_eq!(
        store.append(vec![item]).await,
        Ok(vec![AppendOutcome::Committed])
    );
}

/// A step record carrying `state` as the process's execution state.
pub(super) fn step(tree: TreeId, seq: u64, prev: Digest, state: &str) -> Record {
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

fn settled(tree: TreeId, seq: u64, prev: Digest) -> Record {
    let body = RecordBody::EffectPending {
        process: tree,
        effect: EffectId::new(tree, seq, 0),
    };
    Record::seal(seq, prev, &body)
}

fn bytes_of(path: &Path) -> Vec<u8> {
    std::fs::read(path).expect("reads")
}

#[test]
fn a_file_that_is_not_a_database_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("garbage.db");
    let garbage: Vec<u8> = (0..16_384u32)
        .map(|i| (i.wrapping_mul(7919) >> 3) as u8)
        .collect();
    std::fs::write(&path, &garbage).expect("writes");
    let error = SqliteStore::open(&path).expect_err("refused");
    assert!(matches!(error, OpenError::NotADatabase { .. }), "{error:?}");
    assert!(
        error.to_string().contains("is not a SQLite database"),
        "{error}"
    );
    assert_eq!(bytes_of(&path), garbage, "the file is untouched");
    assert!(!dir.path().join("garbage.db-wal").exists());
}

#[tokio::test]
async fn a_store_with_a_damaged_header_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let store = SqliteStore::create(&path).expect("creates");
    let t = tree("damaged");
    let token = lease(&store, t).await;
    let record = settled(t, 1, Digest::ZERO);
    let item = Append {
        tree: t,
        token,
        records: vec![record],
        meta: meta(t, TreeStatus::Running, 1),
        release: false,
    };
    assert_eq!(
        store.append(vec![item]).await,
        Ok(vec![AppendOutcome::Committed])
    );
    drop(store);
    let mut bytes = bytes_of(&path);
    bytes[0..16].copy_from_slice(b"not sqlite hdr!\0");
    std::fs::write(&path, &bytes).expect("writes");
    let error = SqliteStore::open(&path).expect_err("refused");
    assert!(matches!(error, OpenError::NotADatabase { .. }), "{error:?}");
    assert_eq!(bytes_of(&path), bytes, "the file is untouched");
}

#[tokio::test]
async fn a_newer_schema_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("future.db");
    drop(SqliteStore::create(&path).expect("creates"));
    {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .expect("sets");
        conn.pragma_update(None, "journal_mode", "DELETE")
            .expect("sets");
    }
    let before = bytes_of(&path);
    let error = SqliteStore::open(&path).expect_err("refused");
    match &error {
        OpenError::NewerSchema {
            found, supported, ..
        } => assert_eq!((*found, *supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION)),
        other => panic!("unexpected {other:?}"),
    }
    assert!(error.to_string().contains("newer than version"), "{error}");
    assert_eq!(bytes_of(&path), before, "the file is untouched");
}

#[test]
fn another_applications_database_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("other.db");
    {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        conn.execute_batch("CREATE TABLE notes (text TEXT); INSERT INTO notes VALUES ('hi');")
            .expect("creates");
    }
    let before = bytes_of(&path);
    let error = SqliteStore::open(&path).expect_err("refused");
    assert!(matches!(error, OpenError::Foreign { .. }), "{error:?}");
    assert_eq!(bytes_of(&path), before, "the file is untouched");
}

#[test]
fn a_path_whose_parent_is_a_regular_file_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("plain");
    std::fs::write(&file, b"plain text").expect("writes");
    let error = SqliteStore::create(file.join("store.db")).expect_err("refused");
    match &error {
        OpenError::Path { reason, .. } => assert!(reason.contains("not a directory"), "{reason}"),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(bytes_of(&file), b"plain text");
    let error = SqliteStore::open(dir.path()).expect_err("a directory is refused");
    assert!(matches!(error, OpenError::Path { .. }), "{error:?}");
}

#[tokio::test]
async fn commits_survive_a_reopen_and_tokens_keep_increasing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let t = tree("reopen");
    let store = SqliteStore::create(&path).expect("creates");
    let token = lease(&store, t).await;
    let records = vec![settled(t, 1, Digest::ZERO)];
    let item = Append {
        tree: t,
        token,
        records: records.clone(),
        meta: meta(t, TreeStatus::Waiting, 5),
        release: false,
    };
    assert_eq!(
        store.append(vec![item]).await,
        Ok(vec![AppendOutcome::Committed])
    );
    drop(store);
    let store = SqliteStore::open(&path).expect("reopens");
    let load = store.load(t).await.expect("loads");
    assert_eq!(load.records, records);
    assert_eq!(load.meta, Some(meta(t, TreeStatus::Waiting, 5)));
    assert!(lease(&store, t).await > token, "tokens never repeat");
}

/// The page size SQLite reports for the file at `path`, read apart from
/// the store.
fn file_page_size(path: &Path) -> u32 {
    let conn = rusqlite::Connection::open(path).expect("opens the file");
    conn.query_row("PRAGMA page_size", [], |row| row.get(0))
        .expect("reads the page size")
}

#[test]
fn page_sizes_are_the_powers_of_two_sqlite_takes() {
    for size in PageSize::ALL {
        assert_eq!(PageSize::from_bytes(size.bytes()), Some(size));
    }
    let bytes: Vec<u32> = PageSize::ALL.iter().map(|size| size.bytes()).collect();
    assert_eq!(bytes, [1024, 2048, 4096, 8192, 16384, 32768, 65536]);
    for wrong in [0, 512, 1000, 3072, 131_072] {
        assert_eq!(PageSize::from_bytes(wrong), None, "{wrong}");
    }
    assert_eq!(SqliteConfig::default().page_size, PageSize::Kib4);
}

#[tokio::test]
async fn a_new_store_takes_the_configured_page_size_and_an_existing_one_keeps_its_own() {
    let dir = tempfile::tempdir().expect("temp dir");
    let t = tree("pages");
    // A body longer than a 1 KiB page and than the inline limit, so it
    // spills to overflow pages and pieces whatever the page size.
    let state = noise(20_000, 7);
    let records = vec![step(t, 1, Digest::ZERO, &state)];
    let mut stores = Vec::new();
    for (name, size, bytes) in [
        ("default.db", None, 4096),
        ("small.db", Some(PageSize::Kib1), 1024),
    ] {
        let path = dir.path().join(name);
        let config = SqliteConfig {
            creation: Creation::New,
            page_size: size.unwrap_or_default(),
            ..SqliteConfig::default()
        };
        let store = SqliteStore::open_with(&path, config).expect("creates");
        assert_eq!(store.page_size(), bytes, "{name}");
        let token = lease(&store, t).await;
        append_one(&store, t, token, records[0].clone()).await;
        drop(store);
        assert_eq!(file_page_size(&path), bytes, "{name}");
        stores.push((path, bytes));
    }
    // Opened again asking for another size, each keeps the size it was
    // made with and reads back what it holds.
    for (path, bytes) in stores {
        let config = SqliteConfig {
            page_size: PageSize::Kib8,
            ..SqliteConfig::default()
        };
        let store = SqliteStore::open_with(&path, config).expect("reopens");
        assert_eq!(store.page_size(), bytes);
        assert_eq!(store.load(t).await.expect("loads").records, records);
        drop(store);
        assert_eq!(file_page_size(&path), bytes);
    }
}

/// The write-ahead log is checkpointed after the same bytes whatever the
/// page size: a store of 1 KiB pages lets its log grow to about 4 MB, not
/// to SQLite's 1000 pages (1 MB at that size), and no further.
#[tokio::test]
async fn small_pages_checkpoint_after_the_same_log_bytes_as_large_ones() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("small.db");
    let config = SqliteConfig {
        creation: Creation::New,
        page_size: PageSize::Kib1,
        ..SqliteConfig::default()
    };
    let store = SqliteStore::open_with(&path, config).expect("creates");
    let t = tree("log");
    let token = lease(&store, t).await;
    let mut prev = Digest::ZERO;
    // About 6 MB of new pieces, one commit each.
    for seq in 1..=750u64 {
        let record = step(t, seq, prev, &noise(8_000, seq));
        prev = record.hash;
        append_one(&store, t, token, record).await;
    }
    let mut wal = path.clone().into_os_string();
    wal.push("-wal");
    let log = std::fs::metadata(&wal).expect("the log is there").len();
    assert!(
        (2_000_000..6_000_000).contains(&log),
        "{log} bytes of log after about 6 MB written"
    );
}

#[tokio::test]
async fn prune_removes_only_done_trees_older_than_the_retention_point() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::create(dir.path().join("store.db")).expect("creates");
    let big = "x".repeat(50_000);
    for (key, status, updated) in [
        ("old-done", TreeStatus::Done, 10),
        ("new-done", TreeStatus::Done, 1_000),
        ("old-waiting", TreeStatus::Waiting, 10),
    ] {
        let t = tree(key);
        let token = lease(&store, t).await;
        let item = Append {
            tree: t,
            token,
            records: vec![step(t, 1, Digest::ZERO, &format!("{key}{big}"))],
            meta: meta(t, status, updated),
            release: false,
        };
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
    assert!(
        store
            .load(tree("old-waiting"))
            .await
            .expect("loads")
            .exists()
    );
    assert_eq!(store.prune(Timestamp(500)).await, Ok(0));
    let path = store.path().to_path_buf();
    drop(store);
    let conn = rusqlite::Connection::open(path).expect("opens");
    let orphans: i64 = conn
        .query_row(
            "SELECT count(*) FROM chunks WHERE tree NOT IN (SELECT key FROM trees)",
            [],
            |r| r.get(0),
        )
        .expect("counts");
    assert_eq!(orphans, 0, "a pruned tree's chunks are gone");
}

#[tokio::test]
async fn a_large_state_that_changes_a_little_is_stored_once_by_digest() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open_with(
        dir.path().join("store.db"),
        SqliteConfig {
            creation: Creation::New,
            compact: false,
            ..SqliteConfig::default()
        },
    )
    .expect("opens");
    let t = tree("large");
    let token = lease(&store, t).await;
    let mut state = noise(250_000, 99).into_bytes();
    let (mut prev, mut records) = (Digest::ZERO, Vec::new());
    let steps = 20u64;
    for seq in 1..=steps {
        // A few bytes change per step, at a different place each time.
        let at = (seq as usize * 12_345) % state.len();
        state[at] = b"0123456789abcdef"[seq as usize % 16];
        let record = step(t, seq, prev, std::str::from_utf8(&state).expect("hex"));
        prev = record.hash;
        append_one(&store, t, token, record.clone()).await;
        records.push(record);
    }
    let loaded = store.load(t).await.expect("loads");
    assert_eq!(loaded.records, records, "byte-exact reassembly");
    assert_eq!(
        baton_run::log::verify(0, Digest::ZERO, &loaded.records),
        Ok((steps, prev))
    );
    // A snapshot of the same state shares its pieces too.
    let snapshot = Snapshot {
        seq: steps,
        head: prev,
        state: Arc::from(records.last().expect("records").body.to_vec()),
    };
    assert_eq!(
        store.write_snapshot(t, token, snapshot).await,
        Ok(AppendOutcome::Committed)
    );
    let path = store.path().to_path_buf();
    drop(store);
    let conn = rusqlite::Connection::open(path).expect("opens");
    let chunk_bytes: i64 = conn
        .query_row("SELECT sum(length(bytes)) FROM chunks", [], |r| r.get(0))
        .expect("sums");
    let logical = records.iter().map(|r| r.body.len()).sum::<usize>() as i64;
    // One full copy plus a few KiB per step, not a copy per step.
    let per_step = (chunk_bytes - 250_000) / steps as i64;
    assert!(
        per_step < 10_000,
        "{chunk_bytes} chunk bytes for {logical} logical bytes: {per_step} per step"
    );
}

#[tokio::test]
async fn bytes_written_counts_appended_bodies_and_only_new_pieces_of_a_large_state() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::create(dir.path().join("store.db")).expect("creates");
    assert_eq!(
        store.bytes_written(),
        0,
        "a fresh handle has written nothing"
    );
    let t = tree("counted");
    let token = lease(&store, t).await;
    let commit = |record: Record, updated: u64| {
        let item = Append {
            tree: t,
            token,
            records: vec![record],
            meta: meta(t, TreeStatus::Running, updated),
            release: false,
        };
        let store = store.clone();
        async move {
            assert_eq!(
                store.append(vec![item]).await,
                Ok(vec![AppendOutcome::Committed])
            );
            store.bytes_written()
        }
    };

    // A small record is stored inline: the counter grows by its body.
    let small = settled(t, 1, Digest::ZERO);
    let before = store.bytes_written();
    let after = commit(small.clone(), 1).await;
    assert_eq!(after - before, small.body.len() as u64);

    // A large state is stored once ...
    let mut state = noise(250_000, 7).into_bytes();
    let first = step(t, 2, small.hash, std::str::from_utf8(&state).expect("hex"));
    let size = first.body.len() as u64;
    let before = after;
    let after = commit(first.clone(), 2).await;
    assert!(
        after - before >= size,
        "a new large state counts in full: {} < {size}",
        after - before
    );

    // ... and a step that changes one field of it adds only the pieces
    // around the change and a manifest.
    state[125_000] = if state[125_000] == b'0' { b'1' } else { b'0' };
    let second = step(t, 3, first.hash, std::str::from_utf8(&state).expect("hex"));
    let before = after;
    let after = commit(second.clone(), 3).await;
    let grown = after - before;
    assert!(grown > 0, "the changed step wrote something");
    assert!(
        grown < size / 10,
        "{grown} bytes counted for a one-byte change of a {size}-byte state"
    );

    // A snapshot of the same state shares the stored pieces.
    let snapshot = Snapshot {
        seq: 3,
        head: second.hash,
        state: Arc::from(second.body.to_vec()),
    };
    let before = after;
    assert_eq!(
        store.write_snapshot(t, token, snapshot).await,
        Ok(AppendOutcome::Committed)
    );
    let grown = store.bytes_written() - before;
    assert!(
        grown > 0 && grown < size / 10,
        "{grown} bytes for a snapshot"
    );
}

/// A body that holds the same long text twice (a start's input and the
/// initial state made from it) stores and counts that text's pieces once,
/// and reads back byte for byte, on this handle and after a reopen.
#[tokio::test]
async fn a_body_holding_a_text_twice_stores_its_pieces_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let store = SqliteStore::create(&path).expect("creates");
    let t = tree("twice");
    let token = lease(&store, t).await;
    let text = noise(120_000, 17);
    let record = step(t, 1, Digest::ZERO, &format!("{text} and again {text}"));
    let size = record.body.len() as u64;
    let before = store.bytes_written();
    append_one(&store, t, token, record.clone()).await;
    let counted = store.bytes_written() - before;
    assert!(
        counted < size * 6 / 10,
        "{counted} bytes counted for a {size}-byte body holding one text twice"
    );
    assert!(
        counted > size / 2,
        "the text counts once: {counted} of {size}"
    );
    assert_eq!(
        store.load(t).await.expect("loads").records,
        vec![record.clone()]
    );
    drop(store);
    let conn = rusqlite::Connection::open(&path).expect("opens");
    let (pieces, distinct): (i64, i64) = conn
        .query_row(
            "SELECT count(*), count(DISTINCT digest) FROM chunks",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("counts");
    assert_eq!(pieces, distinct, "no piece stored twice");
    let reopened = SqliteStore::open(&path).expect("opens again");
    assert_eq!(reopened.load(t).await.expect("loads").records, vec![record]);
}

/// Schema version 1, as builds before listings kept programs, labels and
/// start times created it.
const SCHEMA_1: &str = "
    CREATE TABLE trees (
        key         INTEGER PRIMARY KEY,
        id          TEXT NOT NULL UNIQUE,
        scope       TEXT,
        status      TEXT,
        updated     INTEGER,
        lease_token INTEGER,
        lease_owner TEXT,
        lease_until INTEGER,
        last_token  INTEGER NOT NULL,
        head_seq    INTEGER NOT NULL,
        head_hash   BLOB NOT NULL
    );
    CREATE INDEX trees_by_status ON trees (status, scope, id);
    CREATE INDEX trees_by_scope ON trees (scope, status, id);
    CREATE TABLE records (
        tree   INTEGER NOT NULL,
        seq    INTEGER NOT NULL,
        kind   TEXT NOT NULL,
        prev   BLOB NOT NULL,
        hash   BLOB NOT NULL,
        body   BLOB,
        chunks BLOB,
        PRIMARY KEY (tree, seq)
    );
    CREATE TABLE snapshots (
        tree   INTEGER PRIMARY KEY,
        seq    INTEGER NOT NULL,
        head   BLOB NOT NULL,
        digest BLOB NOT NULL,
        body   BLOB,
        chunks BLOB
    );
    CREATE TABLE chunks (
        id     INTEGER PRIMARY KEY,
        tree   INTEGER NOT NULL,
        digest BLOB NOT NULL,
        bytes  BLOB NOT NULL,
        UNIQUE (tree, digest)
    );
    PRAGMA application_id = 1111577678;
    PRAGMA user_version = 1;
";

#[tokio::test]
async fn a_file_of_schema_version_1_is_migrated_and_its_trees_read_list_and_go_on() {
    let old = baton_testkit::waiting_tree().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("version1.db");
    {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        conn.execute_batch(SCHEMA_1).expect("the version 1 schema");
        let last = old.records.last().expect("the tree has records");
        conn.execute(
            "INSERT INTO trees (id, scope, status, updated, last_token, head_seq, head_hash)
             VALUES (?1, ?2, ?3, ?4, 1, ?5, ?6)",
            rusqlite::params![
                old.tree.to_string(),
                old.meta.scope.as_str(),
                old.meta.status.as_str(),
                old.meta.updated.0 as i64,
                last.seq as i64,
                &last.hash.as_bytes()[..],
            ],
        )
        .expect("the tree's row");
        let key = conn.last_insert_rowid();
        for record in &old.records {
            assert!(
                record.body.len() <= 4096,
                "version 1 kept small bodies inline"
            );
            conn.execute(
                "INSERT INTO records (tree, seq, kind, prev, hash, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                rusqlite::params![
                    key,
                    record.seq as i64,
                    record.kind.as_str(),
                    &record.prev.as_bytes()[..],
                    &record.hash.as_bytes()[..],
                    &record.body[..],
                ],
            )
            .expect("a record");
        }
    }
    let store = SqliteStore::open(&path).expect("a version 1 file opens");
    baton_testkit::migrated_store_conformance(Arc::new(store), &old).await;
    let conn = rusqlite::Connection::open(&path).expect("opens");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .expect("reads");
    assert_eq!(
        version, SCHEMA_VERSION,
        "the file was migrated to the current version"
    );
}

/// The writer finds the pieces a new body shares with the tree's last one
/// by comparison; whatever it reuses, every body reads back byte for byte:
/// through shifts, edits and a longer end, after a compaction deleted the
/// pieces only covered records held, and after another handle committed
/// to the file in between.
#[tokio::test]
async fn large_bodies_read_back_exactly_whichever_pieces_their_cuts_reuse() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let store = SqliteStore::create(&path).expect("creates");
    let other = SqliteStore::open(&path).expect("opens");
    let t = tree("reused");
    let token = lease(&store, t).await;
    let mut state = noise(120_000, 11).into_bytes();
    let mut head = Digest::ZERO;
    let mut written = Vec::new();
    for seq in 1..=8u64 {
        match seq {
            1 => {}
            2 => state.splice(100..100, *b"shifted").for_each(drop),
            3 => state[60_000] = b'x',
            4 => state.extend_from_slice(b"longer end"),
            _ => state.splice(30_000..30_003, *b"abcdef").for_each(drop),
        }
        let record = step(t, seq, head, std::str::from_utf8(&state).expect("ascii"));
        head = record.hash;
        append_one(&store, t, token, record.clone()).await;
        written.push(record);
        if seq == 4 {
            // Compaction deletes the pieces only the covered records held.
            let snapshot = Snapshot {
                seq,
                head,
                state: Arc::from(b"{}".to_vec()),
            };
            assert_eq!(
                store.write_snapshot(t, token, snapshot).await,
                Ok(AppendOutcome::Committed)
            );
        }
        if seq == 6 {
            // Another handle's commit: the writer forgets what it cut.
            let u = tree("elsewhere");
            lease(&other, u).await;
        }
    }
    let load = store.load(t).await.expect("loads");
    assert_eq!(load.snapshot.map(|s| s.seq), Some(4));
    assert_eq!(
        load.records,
        written[4..].to_vec(),
        "bodies read back exactly"
    );
    let reopened = SqliteStore::open(&path).expect("opens again");
    let load = reopened.load(t).await.expect("loads");
    assert_eq!(load.records, written[4..].to_vec());
}

/// Creates tree `key` with three short records in a first commit that ends
/// it (so the store packs them) and returns them.
async fn ended_tree(store: &SqliteStore, key: &str) -> (TreeId, Vec<Record>) {
    let t = tree(key);
    let mut log = vec![step(t, 1, Digest::ZERO, "one")];
    for seq in 2..=3 {
        let prev = log.last().expect("a record").hash;
        log.push(settled(t, seq, prev));
    }
    let created = store
        .create_tree(CreateTree {
            tree: t,
            owner: "test".into(),
            now: Timestamp(0),
            ttl: Duration::from_secs(60),
            records: log.clone(),
            meta: meta(t, TreeStatus::Done, 3),
            hold: false,
        })
        .await
        .expect("creates the tree");
    assert!(matches!(created, Created::Committed(_)), "{created:?}");
    (t, log)
}

/// Whether tree `t`'s row holds packed first records, and how many rows of
/// `records` it has.
fn where_records_are(path: &Path, t: TreeId) -> (bool, i64) {
    let conn = rusqlite::Connection::open(path).expect("opens");
    conn.query_row(
        "SELECT log IS NOT NULL, (SELECT count(*) FROM records WHERE records.tree = trees.key)
         FROM trees WHERE id = ?1",
        [t.to_string()],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .expect("the tree's row")
}

/// Schema version 5 kept packed first records plain; version 6 stores them
/// compressed and version 7 compact when that is shorter. A version 5 file
/// opens, is migrated, and its plain packed logs read as before beside new
/// compact ones.
#[tokio::test]
async fn plain_packed_logs_of_schema_version_5_read_beside_compact_ones() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let store = SqliteStore::create(&path).expect("creates");
    let (old, old_log) = ended_tree(&store, "version-5").await;
    drop(store);
    {
        // The file as a version 5 build left it: the same records, plain.
        let conn = rusqlite::Connection::open(&path).expect("opens");
        let stored: Vec<u8> = conn
            .query_row(
                "SELECT log FROM trees WHERE id = ?1",
                [old.to_string()],
                |r| r.get(0),
            )
            .expect("packed");
        assert_eq!(stored[0], 3, "stored compact");
        let plain = baton_store_sqlite::plain_packed_log(&stored, old).expect("a packed log");
        assert_eq!(plain[0], 1);
        assert!(plain.len() > stored.len(), "the compact form gained");
        conn.execute(
            "UPDATE trees SET log = ?1 WHERE id = ?2",
            rusqlite::params![plain, old.to_string()],
        )
        .expect("updates");
        conn.pragma_update(None, "user_version", 5)
            .expect("version 5");
    }
    let store = SqliteStore::open(&path).expect("a version 5 file opens");
    assert_eq!(store.records(old).await.expect("reads"), old_log);
    assert_eq!(store.load(old).await.expect("loads").records, old_log);
    let (new, new_log) = ended_tree(&store, "version-7").await;
    assert_eq!(store.records(new).await.expect("reads"), new_log);
    let conn = rusqlite::Connection::open(&path).expect("opens");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .expect("reads");
    assert_eq!(version, SCHEMA_VERSION);
    let versions: Vec<u8> = conn
        .prepare("SELECT substr(log, 1, 1) FROM trees ORDER BY key")
        .expect("prepares")
        .query_map([], |row| row.get::<_, Vec<u8>>(0))
        .expect("queries")
        .map(|row| row.expect("a row")[0])
        .collect();
    assert_eq!(
        versions,
        [1, 3],
        "the old log stays plain, the new one compact"
    );
}

/// The short first commit of a tree it ends is kept in the tree's row,
/// not as rows of `records` (one page fewer in two B-trees per short run);
/// should the tree be written again (taken up by force), through later
/// appends, retries of packed records, snapshots over part of them with
/// compaction, and a reopen, the store reads the same log as if every
/// record were a row.
#[tokio::test]
async fn a_short_first_commit_that_ends_its_tree_is_packed_and_reads_as_the_same_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let store = SqliteStore::create(&path).expect("creates");
    let (t, mut log) = ended_tree(&store, "packed").await;
    assert_eq!(where_records_are(&path, t), (true, 0), "packed in the row");
    assert_eq!(store.records(t).await.expect("reads"), log);
    assert_eq!(store.load(t).await.expect("loads").records, log);
    assert_eq!(
        store.bytes_written(),
        log.iter().map(|r| r.body.len() as u64).sum::<u64>()
    );

    // Taken up by force. A retry of packed records is a duplicate; other
    // bytes there conflict.
    let token = lease(&store, t).await;
    let again = |records: Vec<Record>| Append {
        tree: t,
        token,
        meta: meta(t, TreeStatus::Running, 3),
        records,
        release: false,
    };
    assert_eq!(
        store.append(vec![again(log[1..].to_vec())]).await,
        Ok(vec![AppendOutcome::Duplicate])
    );
    assert_eq!(
        store
            .append(vec![again(vec![settled(t, 2, Digest::ZERO)])])
            .await,
        Ok(vec![AppendOutcome::Conflict { head: 3 }])
    );

    // Later records are rows of `records`.
    for seq in 4..=5 {
        let prev = log.last().expect("a record").hash;
        let record = settled(t, seq, prev);
        append_one(&store, t, token, record.clone()).await;
        log.push(record);
    }
    assert_eq!(where_records_are(&path, t), (true, 2));
    assert_eq!(store.records(t).await.expect("reads"), log);

    // A snapshot inside the packed records: the covered ones go, the rest
    // become rows, and the log reads on from the snapshot.
    let snapshot = Snapshot {
        seq: 2,
        head: log[1].hash,
        state: Arc::from(&b"{\"state\":2}"[..]),
    };
    assert_eq!(
        store.write_snapshot(t, token, snapshot.clone()).await,
        Ok(AppendOutcome::Committed)
    );
    assert_eq!(where_records_are(&path, t), (false, 3));
    assert_eq!(store.records(t).await.expect("reads"), log[2..].to_vec());
    let load = store.load(t).await.expect("loads");
    assert_eq!(load.snapshot, Some(snapshot));
    assert_eq!(load.records, log[2..].to_vec());
    // The moved records still answer a retry.
    assert_eq!(
        store.append(vec![again(log[2..4].to_vec())]).await,
        Ok(vec![AppendOutcome::Duplicate])
    );

    // A second tree whose snapshot covers all its packed records, read
    // again after a reopen.
    let u = tree("covered");
    let first = step(u, 1, Digest::ZERO, "one");
    let second = settled(u, 2, first.hash);
    store
        .create_tree(CreateTree {
            tree: u,
            owner: "test".into(),
            now: Timestamp(0),
            ttl: Duration::from_secs(60),
            records: vec![first.clone(), second.clone()],
            meta: meta(u, TreeStatus::Done, 2),
            hold: false,
        })
        .await
        .expect("creates the tree");
    assert_eq!(where_records_are(&path, u), (true, 0));
    let other = lease(&store, u).await;
    // A snapshot of a record before the head, found among packed ones.
    let at_first = Snapshot {
        seq: 1,
        head: first.hash,
        state: Arc::from(&b"{}"[..]),
    };
    let wrong = Snapshot {
        head: second.hash,
        ..at_first.clone()
    };
    assert_eq!(
        store.write_snapshot(u, other, wrong).await,
        Ok(AppendOutcome::Conflict { head: 2 })
    );
    assert_eq!(
        store.write_snapshot(u, other, at_first).await,
        Ok(AppendOutcome::Committed)
    );
    assert_eq!(where_records_are(&path, u), (false, 1));
    let whole = Snapshot {
        seq: 2,
        head: second.hash,
        state: Arc::from(&b"{}"[..]),
    };
    assert_eq!(
        store.write_snapshot(u, other, whole).await,
        Ok(AppendOutcome::Committed)
    );
    assert_eq!(where_records_are(&path, u), (false, 0));
    drop(store);
    let store = SqliteStore::open(&path).expect("reopens");
    assert_eq!(store.records(t).await.expect("reads"), log[2..].to_vec());
    assert_eq!(store.records(u).await.expect("reads"), Vec::<Record>::new());
    assert_eq!(
        store
            .load(u)
            .await
            .expect("loads")
            .recorded_head
            .map(|(seq, _)| seq),
        Some(2)
    );
}

/// A first commit too long to pack (more than four pages stored, or more
/// than eight plain), with a body stored in pieces, or after which the
/// tree goes on (its lease kept, or not done) is stored as rows, as
/// before: a tree that goes on keeps a slim row. One a little shorter,
/// ending its tree, is packed, and so is a long one that compresses into
/// four pages.
#[tokio::test]
async fn a_long_first_commit_or_one_of_a_tree_that_goes_on_is_stored_as_rows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let store = SqliteStore::create(&path).expect("creates");
    let short = || vec!["x".to_owned()];
    // Five inline bodies of about 3.5 KB that do not compress: over the
    // 16 KiB of four pages; four of them are under it.
    let long = || (0..5).map(|n| noise(3_500, n + 1)).collect::<Vec<_>>();
    // The same length that compresses well, and over twice as much.
    let repeated = |count: usize| {
        (0..count)
            .map(|n| format!("{n}{}", "x".repeat(3_500)))
            .collect::<Vec<_>>()
    };
    let cases = [
        ("long", long(), TreeStatus::Done, false, false),
        (
            "pieces",
            vec![noise(40_000, 7)],
            TreeStatus::Done,
            false,
            false,
        ),
        ("held", short(), TreeStatus::Done, true, false),
        ("waiting", short(), TreeStatus::Waiting, false, false),
        ("running", short(), TreeStatus::Running, true, false),
        ("parked", short(), TreeStatus::NeedsAttention, false, false),
        ("ends", short(), TreeStatus::Done, false, true),
        (
            "longer",
            long()[..4].to_vec(),
            TreeStatus::Done,
            false,
            true,
        ),
        ("compresses", repeated(5), TreeStatus::Done, false, true),
        ("too-long", repeated(10), TreeStatus::Done, false, false),
    ];
    for (key, states, status, hold, packed) in cases {
        let t = tree(key);
        let mut records: Vec<Record> = Vec::new();
        for state in &states {
            let prev = records.last().map_or(Digest::ZERO, |record| record.hash);
            records.push(step(t, records.len() as u64 + 1, prev, state));
        }
        store
            .create_tree(CreateTree {
                tree: t,
                owner: "test".into(),
                now: Timestamp(0),
                ttl: Duration::from_secs(60),
                records: records.clone(),
                meta: meta(t, status, 1),
                hold,
            })
            .await
            .expect("creates the tree");
        let rows = if packed { 0 } else { records.len() as i64 };
        assert_eq!(where_records_are(&path, t), (packed, rows), "{key}");
        assert_eq!(store.records(t).await.expect("reads"), records, "{key}");
    }
}

/// Without compaction a snapshot inside the packed records leaves them
/// packed: a load reads the records after it, the history all of them.
#[tokio::test]
async fn a_load_after_a_snapshot_skips_the_packed_records_it_covers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let store = SqliteStore::open_with(
        &path,
        SqliteConfig {
            creation: Creation::New,
            compact: false,
            ..SqliteConfig::default()
        },
    )
    .expect("creates");
    let (t, log) = ended_tree(&store, "kept").await;
    let token = lease(&store, t).await;
    let snapshot = Snapshot {
        seq: 2,
        head: log[1].hash,
        state: Arc::from(&b"{}"[..]),
    };
    assert_eq!(
        store.write_snapshot(t, token, snapshot.clone()).await,
        Ok(AppendOutcome::Committed)
    );
    assert_eq!(where_records_are(&path, t), (true, 0), "nothing compacted");
    let load = store.load(t).await.expect("loads");
    assert_eq!(load.snapshot, Some(snapshot));
    assert_eq!(load.records, log[2..].to_vec());
    assert_eq!(store.history(t).await.expect("reads").records, log);
    assert_eq!(store.records(t).await.expect("reads"), log);
}

/// Which writes the awaiting task commits itself (`CommitOn::Caller`, the
/// default): a new tree's first commit that holds a whole short run (it
/// ended the tree, or the tree waits after it); nothing else, not a lease,
/// a start alone, an append (last or not) or a snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_short_runs_first_commit_is_committed_by_the_awaiting_task() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::create(dir.path().join("store.db")).expect("creates");
    let create = |t: TreeId, records: Vec<Record>, status: TreeStatus, hold: bool| CreateTree {
        tree: t,
        owner: "host".into(),
        now: Timestamp(0),
        ttl: Duration::from_secs(60),
        meta: meta(t, status, records.len() as u64),
        records,
        hold,
    };

    // Nothing else is being written: the caller commits a short run.
    let ended = tree("ended");
    let first = step(ended, 1, Digest::ZERO, "start");
    let second = step(ended, 2, first.hash, "end");
    let created = store
        .create_tree(create(ended, vec![first, second], TreeStatus::Done, false))
        .await;
    assert!(matches!(created, Ok(Created::Committed(_))), "{created:?}");
    assert_eq!(store.caller_groups(), 1, "a run that ended, in place");
    let waits = tree("waits");
    let first = step(waits, 1, Digest::ZERO, "start");
    let second = step(waits, 2, first.hash, "asks");
    let created = store
        .create_tree(create(
            waits,
            vec![first, second],
            TreeStatus::Waiting,
            true,
        ))
        .await;
    assert!(matches!(created, Ok(Created::Committed(_))), "{created:?}");
    assert_eq!(store.caller_groups(), 2, "a run that waits, in place");

    // A root that acts is created with its start alone and goes on: its
    // commits, like a lease's, are the writer thread's.
    let long = tree("long");
    let start = step(long, 1, Digest::ZERO, "start");
    let head = start.hash;
    let created = store
        .create_tree(create(long, vec![start], TreeStatus::Running, true))
        .await;
    let token = match created {
        Ok(Created::Committed(lease)) => lease.token,
        other => panic!("{other:?}"),
    };
    let next = step(long, 2, head, "two");
    let head = next.hash;
    append_one(&store, long, token, next).await;
    let snapshot = Snapshot {
        seq: 2,
        head,
        state: Arc::from(&b"{}"[..]),
    };
    assert_eq!(
        store.write_snapshot(long, token, snapshot).await,
        Ok(AppendOutcome::Committed)
    );
    let last = Append {
        tree: long,
        token,
        records: vec![settled(long, 3, head)],
        meta: meta(long, TreeStatus::Done, 3),
        release: true,
    };
    assert_eq!(
        store.append(vec![last]).await,
        Ok(vec![AppendOutcome::Committed])
    );
    lease(&store, tree("leased")).await;
    assert_eq!(
        store.caller_groups(),
        2,
        "the writer thread wrote the start alone, the appends, the snapshot and the lease"
    );
}
