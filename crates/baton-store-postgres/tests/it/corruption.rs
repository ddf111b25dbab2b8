//! The corruption matrix, tampering through SQL: each kind of damage an
//! operator, a broken disk or a careless hand can do to the tables is found
//! by `verify` with its record number, and none makes another tree
//! unreadable; a damaged row fails its own tree only.

use std::sync::Arc;

use baton_run::store::{ListFilter, Store, TreeStatus};
use baton_run::{
    Engine, EngineConfig, Payload, RecoverOptions, Scope, SignalId, SignalReceipt, SignalRequest,
    TreeError, TreeId, Verification,
};
use baton_store_postgres::PostgresStore;
use baton_testkit::programs::{Kind, SCOPE, open_wait, program, request};
use serde_json::json;

use crate::support::{Server, connect, server_url, url_of};

fn scope() -> Scope {
    Scope::new(SCOPE).expect("valid")
}

fn engine(store: &PostgresStore) -> Engine {
    let ask = program(Kind::Ask, None);
    Engine::new(EngineConfig {
        programs: vec![ask.erase()],
        snapshot_every: 4,
        ..EngineConfig::new(Arc::new(store.clone()))
    })
    .expect("the engine configuration is valid")
}

fn url(store: &PostgresStore) -> String {
    url_of(
        &server_url(),
        store.target().rsplit('/').next().expect("a name"),
    )
}

/// A store keeping its whole history, with two waiting trees of a dozen
/// records each (each with a snapshot in the middle of its log) and a
/// third whose first record is large enough to be stored as pieces;
/// returns the trees and the first tree's snapshot sequence.
async fn three_trees(server: &Server) -> (PostgresStore, [TreeId; 3], u64) {
    let store = server.store_with(|config| config.compact = false);
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
    let large = engine
        .start(&ask, request("large", "z".repeat(40_000)))
        .await
        .expect("starts");
    open_wait(&large).await;
    trees.push(large.tree());
    engine.close().await;
    let load = store.load(trees[0]).await.expect("loads");
    let snapshot = load.snapshot.expect("a snapshot was written").seq;
    let head = store.records(trees[0]).await.expect("reads").len() as u64;
    assert!(
        snapshot > 1 && snapshot < head,
        "the snapshot ({snapshot}) lies inside the log (1 to {head})"
    );
    let trees = [trees[0], trees[1], trees[2]];
    (store, trees, snapshot)
}

const TABLES: [&str; 4] = [
    "baton_trees",
    "baton_records",
    "baton_snapshots",
    "baton_chunks",
];

/// Keeps a copy of every table, to put back between cases.
async fn keep_pristine(url: &str) {
    let client = connect(url).await;
    client
        .batch_execute("CREATE SCHEMA pristine")
        .await
        .expect("creates");
    for table in TABLES {
        client
            .batch_execute(&format!(
                "CREATE TABLE pristine.{table} AS SELECT * FROM {table}"
            ))
            .await
            .expect("copies");
    }
}

async fn restore(url: &str) {
    let client = connect(url).await;
    client
        .batch_execute(&format!("TRUNCATE {}", TABLES.join(", ")))
        .await
        .expect("truncates");
    for table in TABLES {
        client
            .batch_execute(&format!(
                "INSERT INTO {table} OVERRIDING SYSTEM VALUE SELECT * FROM pristine.{table}"
            ))
            .await
            .expect("restores");
    }
}

async fn sql(url: &str, statement: &str, tree: TreeId) -> u64 {
    connect(url)
        .await
        .execute(statement, &[&tree.to_string()])
        .await
        .unwrap_or_else(|error| panic!("{statement}: {error}"))
}

const KEY: &str = "(SELECT key FROM baton_trees WHERE id = $1)";

async fn verify(store: &PostgresStore, tree: TreeId) -> Result<Verification, TreeError> {
    engine(store).verify(&scope(), tree).await
}

/// `verify` refuses the damaged tree at `record`, and the bystander still
/// verifies in full.
async fn detected_at(
    store: &PostgresStore,
    damaged: TreeId,
    bystander: TreeId,
    record: u64,
    what: &str,
) {
    match verify(store, damaged).await {
        Err(TreeError::Corrupt {
            record: Some(found),
            message,
            ..
        }) => assert_eq!(found, record, "{what}: found at record {found}: {message}"),
        other => panic!("{what} was not detected: {other:?}"),
    }
    let checked = verify(store, bystander)
        .await
        .unwrap_or_else(|error| panic!("{what} made another tree unreadable: {error}"));
    assert_eq!(checked.first, 1, "{what}: the bystander is checked whole");
}

#[tokio::test]
async fn every_kind_of_damage_is_found_with_its_record_and_leaves_other_trees_readable() {
    let server = Server::new();
    let (store, [damaged, bystander, large], snapshot) = three_trees(&server).await;
    let url = url(&store);
    keep_pristine(&url).await;
    let checked = verify(&store, damaged)
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
        restore(&url).await;
        let flip = format!(
            "UPDATE baton_records SET body = set_byte(body, length(body) - 2,
                 get_byte(body, length(body) - 2) # 1)
             WHERE tree = {KEY} AND seq = {seq}"
        );
        assert_eq!(sql(&url, &flip, damaged).await, 1);
        detected_at(
            &store,
            damaged,
            bystander,
            seq,
            &format!("a flip in record {seq}"),
        )
        .await;
    }

    // A record truncated: its last bytes lost.
    restore(&url).await;
    let truncate = format!(
        "UPDATE baton_records SET body = substring(body FROM 1 FOR length(body) - 7)
         WHERE tree = {KEY} AND seq = {}",
        snapshot + 2
    );
    assert_eq!(sql(&url, &truncate, damaged).await, 1);
    detected_at(
        &store,
        damaged,
        bystander,
        snapshot + 2,
        "a truncated record",
    )
    .await;

    // The last record dropped: the log looks shorter, the row says otherwise.
    restore(&url).await;
    let drop_last = format!("DELETE FROM baton_records WHERE tree = {KEY} AND seq = {head}");
    assert_eq!(sql(&url, &drop_last, damaged).await, 1);
    detected_at(&store, damaged, bystander, head, "a dropped last record").await;

    // A record dropped from the middle.
    restore(&url).await;
    let middle = snapshot + 2;
    let drop_middle = format!("DELETE FROM baton_records WHERE tree = {KEY} AND seq = {middle}");
    assert_eq!(sql(&url, &drop_middle, damaged).await, 1);
    detected_at(
        &store,
        damaged,
        bystander,
        middle + 1,
        "a dropped middle record",
    )
    .await;

    // The snapshot's head flipped.
    restore(&url).await;
    let flip_snapshot = format!(
        "UPDATE baton_snapshots SET head = set_byte(head, 0, get_byte(head, 0) # 1)
         WHERE tree = {KEY}"
    );
    assert_eq!(sql(&url, &flip_snapshot, damaged).await, 1);
    detected_at(
        &store,
        damaged,
        bystander,
        snapshot,
        "a flipped snapshot head",
    )
    .await;

    // The tree row's head moved past the log.
    restore(&url).await;
    assert_eq!(
        sql(
            &url,
            "UPDATE baton_trees SET head_seq = head_seq + 1 WHERE id = $1",
            damaged
        )
        .await,
        1
    );
    detected_at(
        &store,
        damaged,
        bystander,
        head + 1,
        "a tree row ahead of its log",
    )
    .await;

    // A byte flipped in a piece of a large record.
    restore(&url).await;
    assert!(
        store.records(large).await.expect("reads")[0].body.len() > 4096,
        "the first record of the large tree is stored as pieces"
    );
    let flip_piece = format!(
        "UPDATE baton_chunks SET bytes = set_byte(bytes, 100, get_byte(bytes, 100) # 1)
         WHERE tree = {KEY} AND digest = (
             SELECT substring(chunks FROM 1 FOR 32) FROM baton_records
             WHERE tree = {KEY} AND seq = 1)"
    );
    assert_eq!(sql(&url, &flip_piece, large).await, 1);
    detected_at(
        &store,
        large,
        bystander,
        1,
        "a flip in a piece of a large record",
    )
    .await;

    // A piece lost: the record cannot be reassembled, and says so.
    restore(&url).await;
    let drop_piece = format!(
        "DELETE FROM baton_chunks WHERE tree = {KEY} AND digest = (
             SELECT substring(chunks FROM 1 FOR 32) FROM baton_records
             WHERE tree = {KEY} AND seq = 1)"
    );
    assert_eq!(sql(&url, &drop_piece, large).await, 1);
    match verify(&store, large).await {
        Err(error) => assert!(
            error.to_string().contains("missing chunk"),
            "a lost piece reported as {error}"
        ),
        Ok(checked) => panic!("a lost piece was not detected: {checked:?}"),
    }
    assert!(verify(&store, bystander).await.is_ok());

    // Everything put back: every log verifies again.
    restore(&url).await;
    for tree in [damaged, bystander, large] {
        assert!(verify(&store, tree).await.is_ok(), "{tree} after restoring");
    }
}

#[tokio::test]
async fn a_damaged_row_fails_its_own_tree_and_listing_and_recovery_carry_on() {
    let server = Server::new();
    let (store, [damaged, bystander, large], _) = three_trees(&server).await;
    let url = url(&store);
    sql(
        &url,
        "UPDATE baton_trees SET status = 'garbage' WHERE id = $1",
        damaged,
    )
    .await;
    let listing = store.list(ListFilter::default()).await.expect("lists");
    let mut expected = vec![bystander, large];
    expected.sort();
    assert_eq!(
        listing
            .trees
            .iter()
            .map(|meta| meta.tree)
            .collect::<Vec<_>>(),
        expected,
        "the readable trees are listed"
    );
    assert_eq!(listing.unreadable.len(), 1, "{listing:?}");
    assert_eq!(listing.unreadable[0].tree, Some(damaged));
    assert!(
        listing.unreadable[0].error.to_string().contains("garbage"),
        "{}",
        listing.unreadable[0].error
    );
    // A head hash of the wrong length fails that tree's writes only.
    sql(
        &url,
        "UPDATE baton_trees SET head_hash = '\\x00' WHERE id = $1",
        large,
    )
    .await;
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
    assert!(matches!(result(large), Some(Err(_))), "{report:?}");
    assert_eq!(result(bystander), Some(Ok(())), "{report:?}");
}

#[tokio::test]
async fn a_tree_moved_to_another_scope_in_its_row_is_refused_at_attach() {
    let server = Server::new();
    let (store, [moved, _, _], _) = three_trees(&server).await;
    let url = url(&store);
    sql(
        &url,
        "UPDATE baton_trees SET scope = 'intruder' WHERE id = $1",
        moved,
    )
    .await;
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
