//! Engine scenarios of `baton-run`'s own tests, run on a temp-file
//! `SqliteStore`, so behaviour cannot drift between backends; plus tamper
//! detection by editing the database file directly.

// The very test programs of the kernel's engine tests, so the same
// behaviour is checked on the SQLite store.
#[path = "../../../baton-run/tests/it/common.rs"]
#[allow(dead_code)]
mod common;

use std::path::Path;
use std::sync::Arc;

use baton_run::log::RecordKind;
use baton_run::{
    Engine, EngineConfig, FailureKind, Payload, RecoverError, RecoverOptions, ReplayPolicy,
    RuntimeError, Scope, SignalError, SignalId, SignalReceipt, SignalRequest, Status, Store,
    TreeId, TreeStatus,
};
use baton_store_sqlite::{SqliteConfig, SqliteStore};
use baton_testkit::ScriptedDispatcher;
use common::{Kind, engine, open_wait, program, request};
use serde_json::{Value, json};

fn keeping_history(path: &Path) -> SqliteStore {
    SqliteStore::open_with(
        path,
        SqliteConfig {
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
    Scope::new("acme").expect("valid")
}

/// Where a record's bytes live in the file: inline, or its first chunk.
fn stored_bytes(conn: &rusqlite::Connection, tree: TreeId, seq: u64) -> (String, i64, Vec<u8>) {
    let key: i64 = conn
        .query_row(
            "SELECT key FROM trees WHERE id = ?1",
            [tree.to_string()],
            |r| r.get(0),
        )
        .expect("tree row");
    let (body, chunks): (Option<Vec<u8>>, Option<Vec<u8>>) = conn
        .query_row(
            "SELECT body, chunks FROM records WHERE tree = ?1 AND seq = ?2",
            [key, seq as i64],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("record row");
    match (body, chunks) {
        (Some(body), None) => ("records".into(), key, body),
        (None, Some(manifest)) => {
            // The first chunk id (a LEB128 varint).
            let mut id = 0i64;
            for (index, byte) in manifest.iter().enumerate() {
                id |= i64::from(byte & 0x7f) << (7 * index);
                if byte & 0x80 == 0 {
                    break;
                }
            }
            let bytes: Vec<u8> = conn
                .query_row("SELECT bytes FROM chunks WHERE id = ?1", [id], |r| r.get(0))
                .expect("chunk row");
            ("chunks".into(), id, bytes)
        }
        other => panic!("unexpected row {other:?}"),
    }
}

fn write_back(
    conn: &rusqlite::Connection,
    tree: TreeId,
    seq: u64,
    table: &str,
    id: i64,
    bytes: &[u8],
) {
    let changed = if table == "records" {
        conn.execute(
            "UPDATE records SET body = ?1 WHERE tree = ?2 AND seq = ?3",
            rusqlite::params![bytes, id, seq as i64],
        )
    } else {
        let _ = tree;
        conn.execute(
            "UPDATE chunks SET bytes = ?1 WHERE id = ?2",
            rusqlite::params![bytes, id],
        )
    }
    .expect("updates");
    assert_eq!(changed, 1);
}

/// Flips one byte of record `seq` in the file, checks that `verify` fails at
/// exactly that record, and restores the byte.
async fn tamper_is_detected(path: &Path, tree: TreeId, seq: u64) {
    let conn = rusqlite::Connection::open(path).expect("opens");
    let (table, id, original) = stored_bytes(&conn, tree, seq);
    let mut edited = original.clone();
    let at = edited.len() - 2;
    edited[at] ^= 0x01;
    write_back(&conn, tree, seq, &table, id, &edited);
    let verifier = Engine::new(EngineConfig::new(keeping_history(path)));
    match verifier.verify(&scope(), tree).await {
        Err(RecoverError::Corrupt { message, .. }) => assert!(
            message.contains(&format!("record {seq}:")),
            "an edit of record {seq} ({table}) reported as {message}"
        ),
        other => panic!("an edit of record {seq} ({table}) was not detected: {other:?}"),
    }
    drop(verifier);
    write_back(&conn, tree, seq, &table, id, &original);
}

#[tokio::test]
async fn three_dispatches_complete_in_declaration_order_and_the_log_verifies() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("store.db");
    let dispatcher = ScriptedDispatcher::echo(ReplayPolicy::Never);
    let program = program(Kind::Dispatch, Some(Arc::new(dispatcher.clone())));
    let store = keeping_history(&path);
    let engine = engine(Arc::new(store.clone()), &[&program]);
    let handle = engine
        .start(&program, request("three", json!(["a", "b", "c"])))
        .await
        .expect("starts");
    let termination = handle.await_result().await.expect("terminates");
    assert_eq!(termination.status(), Status::Completed);
    let outputs: Vec<Value> = termination
        .output()
        .expect("output")
        .decode()
        .expect("decodes");
    let texts: Vec<&str> = outputs
        .iter()
        .map(|o| o["output"].as_str().expect("text"))
        .collect();
    assert_eq!(texts, ["a", "b", "c"]);
    assert_eq!(dispatcher.total(), 3);
    handle.join().await.expect("joins");

    // A second tree whose first record is large enough to be chunked.
    let big = "z".repeat(40_000);
    let large = engine
        .start(&program, request("large", json!([big])))
        .await
        .expect("starts");
    large.await_result().await.expect("terminates");
    large.join().await.expect("joins");

    let head = engine
        .verify(&scope(), handle.tree())
        .await
        .expect("verifies");
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
        tamper_is_detected(&path, handle.tree(), record.seq).await;
    }
    tamper_is_detected(&path, large.tree(), 1).await;
    // Everything restored: both logs verify again.
    let verifier = Engine::new(EngineConfig::new(keeping_history(&path)));
    assert_eq!(verifier.verify(&scope(), handle.tree()).await, Ok(head));
    assert!(verifier.verify(&scope(), large.tree()).await.is_ok());
}

#[tokio::test]
async fn host_signals_are_idempotent_by_id_and_validated_before_commit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = program(Kind::Ask, None);
    let store = keeping_history(&dir.path().join("store.db"));
    let engine = engine(Arc::new(store.clone()), &[&program]);
    let handle = engine
        .start(&program, request("ask", "deploy?"))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    let count = || {
        let store = store.clone();
        let tree = handle.tree();
        async move { store.records(tree).await.expect("reads").len() }
    };
    let before = count().await;

    let note = |text: Value| SignalRequest {
        id: SignalId::new("note-1").expect("valid"),
        wait: None,
        payload: Payload::encode(&text).expect("encodes"),
    };
    let error = handle
        .signal(note(json!({"bogus": 1})))
        .await
        .expect_err("rejected");
    match &error {
        SignalError::Rejected(failure) => {
            assert_eq!(failure.kind, FailureKind::Contract);
            assert_eq!(failure.code(), "engine.signal.rejected");
        }
        other => panic!("unexpected {other:?}"),
    }
    let bad = SignalRequest {
        payload: Payload::encode(&"yes").expect("encodes"),
        ..answer("bad", wait, true)
    };
    assert_eq!(
        handle.signal(bad).await.expect_err("rejected").code(),
        "engine.signal.answer.invalid"
    );
    assert_eq!(count().await, before);

    assert_eq!(
        handle.signal(note(json!({"note": "hi"}))).await,
        Ok(SignalReceipt::Admitted)
    );
    let signals = |view: baton_run::TreeView| view.root().usage.signals;
    let after_first = signals(handle.inspect().await.expect("inspects"));
    assert_eq!(
        handle.signal(note(json!({"note": "hi"}))).await,
        Ok(SignalReceipt::Duplicate)
    );
    assert_eq!(
        signals(handle.inspect().await.expect("inspects")),
        after_first
    );
    assert_eq!(count().await, before + 1);
    assert!(matches!(
        handle.signal(note(json!({"note": "different"}))).await,
        Err(SignalError::Conflict { .. })
    ));
    assert_eq!(
        handle.inspect().await.expect("inspects").root().status,
        Status::Waiting
    );
    assert_eq!(
        handle.signal(answer("a1", wait, true)).await,
        Ok(SignalReceipt::Admitted)
    );
    assert_eq!(handle.output().await.expect("completes"), json!(true));
    assert!(matches!(
        handle.signal(answer("a2", wait, false)).await,
        Err(SignalError::Terminated { .. })
    ));
}

#[tokio::test]
async fn a_fresh_engine_on_a_reopened_file_recovers_a_tree_from_a_dropped_engine() {
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
    let bare = Engine::new(EngineConfig::new(store.clone()));
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
        .list(baton_run::ListFilter {
            status: Some(TreeStatus::Done),
            scope: None,
        })
        .await
        .expect("lists");
    assert_eq!(listed.len(), 1);
    assert!(second.verify(&scope(), tree).await.is_ok());
}
