//! `migrated_store_conformance`: what a store must keep when it opens a
//! database an older build wrote.
//!
//! A backend's test builds a database at its older schema with that
//! schema's DDL, writes [`waiting_tree`]'s rows into it as that schema kept
//! them (the tree's row with its scope, status, time and head, and its
//! records), opens it with the current build (which migrates it), and calls
//! [`migrated_store_conformance`] in one line.

use std::sync::Arc;

use baton_run::log::Record;
use baton_run::store::{ListFilter, Store, TreeMeta, TreeStatus};
use baton_run::{Labels, MemoryStore, Payload, Scope, Status, TreeId, Visibility};
use serde_json::json;

use crate::programs::{Kind, SCOPE, engine, program, request};

/// A tree as a store keeps it: its listing row and its records.
#[derive(Clone, Debug)]
pub struct StoredTree {
    /// The tree.
    pub tree: TreeId,
    /// Its listing row, as a store of any schema kept it (scope, status,
    /// the last append's time).
    pub meta: TreeMeta,
    /// Its records, from the first.
    pub records: Vec<Record>,
}

/// A [`Kind::Ask`] tree waiting for its answer, as an engine wrote it.
pub async fn waiting_tree() -> StoredTree {
    let store = MemoryStore::keeping_history();
    let ask = program(Kind::Ask, None);
    let engine = engine(Arc::new(store.clone()), &[&ask]);
    let handle = engine
        .start(&ask, request("migrated", json!("proceed?")))
        .await
        .expect("the tree starts");
    let tree = handle.tree();
    crate::programs::open_wait(&handle).await;
    engine.close().await;
    let load = store.history(tree).await.expect("loads");
    StoredTree {
        tree,
        meta: load.meta.expect("the tree is listed"),
        records: load.records,
    }
}

/// Checks a store opened on a database of an older schema holding `old`
/// (from [`waiting_tree`]): the tree loads byte for byte and lists (with no
/// program, labels or start time, which that schema did not keep), label
/// filters and pages work over it, an engine verifies, inspects and
/// finishes it, and then the listing shows its program's exact version.
/// Panics with a precise message at the first violation.
pub async fn migrated_store_conformance(store: Arc<dyn Store>, old: &StoredTree) {
    let case = "migrated store";
    let load = store
        .load(old.tree)
        .await
        .unwrap_or_else(|error| panic!("{case}: load failed: {error}"));
    let hashes = |records: &[Record]| records.iter().map(|r| (r.seq, r.hash)).collect::<Vec<_>>();
    assert_eq!(
        hashes(&load.records),
        hashes(&old.records),
        "{case}: the records load back"
    );
    for (loaded, stored) in load.records.iter().zip(&old.records) {
        assert_eq!(
            loaded.body, stored.body,
            "{case}: record {} byte for byte",
            stored.seq
        );
    }
    let listing = store
        .list(ListFilter::default())
        .await
        .unwrap_or_else(|error| panic!("{case}: list failed: {error}"));
    assert!(
        listing.unreadable.is_empty(),
        "{case}: {:?}",
        listing.unreadable
    );
    assert_eq!(listing.trees.len(), 1, "{case}: the one tree lists");
    let meta = &listing.trees[0];
    assert_eq!(
        (meta.tree, &meta.scope, meta.status, meta.updated),
        (old.tree, &old.meta.scope, old.meta.status, old.meta.updated),
        "{case}: the listing row reads back"
    );
    assert_eq!(
        (&meta.program, &meta.labels, meta.created),
        (&None, &Labels::new(), None),
        "{case}: what the older schema did not keep is absent, not invented"
    );
    let selected = store
        .list(ListFilter {
            labels: Labels::from_pairs([("team", "billing")]).expect("valid"),
            ..ListFilter::default()
        })
        .await
        .unwrap_or_else(|error| panic!("{case}: list failed: {error}"));
    assert!(
        selected.trees.is_empty(),
        "{case}: an unlabeled tree matches no label"
    );
    let page = store
        .list(ListFilter {
            limit: std::num::NonZeroU32::new(1),
            ..ListFilter::default()
        })
        .await
        .unwrap_or_else(|error| panic!("{case}: list failed: {error}"));
    assert_eq!(page.trees.len(), 1, "{case}: a page of one");
    assert_eq!(page.next, None, "{case}: no page follows the last tree");

    let ask = program(Kind::Ask, None);
    let engine = engine(store.clone(), &[&ask]);
    let scope = Scope::new(SCOPE).expect("valid");
    engine
        .verify(&scope, old.tree)
        .await
        .unwrap_or_else(|error| panic!("{case}: the migrated tree does not verify: {error}"));
    let view = engine
        .inspect(&scope, old.tree, Visibility::Public)
        .await
        .unwrap_or_else(|error| panic!("{case}: inspect failed: {error}"));
    assert_eq!(
        view.program,
        ask.reference().version(),
        "{case}: inspect shows the program's version"
    );
    let wait = view
        .processes
        .first()
        .and_then(|process| process.open_waits.first())
        .map(|wait| wait.id)
        .unwrap_or_else(|| panic!("{case}: the migrated tree waits for its answer"));
    engine
        .answer(
            &scope,
            old.tree,
            wait,
            Payload::encode(&json!(true)).expect("encodes"),
        )
        .await
        .unwrap_or_else(|error| panic!("{case}: answer failed: {error}"));
    let handle: baton_run::ProcessHandle = engine
        .process(&scope, old.tree)
        .await
        .unwrap_or_else(|error| panic!("{case}: the tree is not taken up: {error}"));
    let termination = handle
        .await_result()
        .await
        .unwrap_or_else(|error| panic!("{case}: the tree stopped: {error}"));
    assert_eq!(
        termination.status(),
        Status::Completed,
        "{case}: it completes"
    );
    engine.close().await;
    let listing = store
        .list(ListFilter::default())
        .await
        .unwrap_or_else(|error| panic!("{case}: list failed: {error}"));
    let meta = listing
        .trees
        .first()
        .unwrap_or_else(|| panic!("{case}: the tree still lists"));
    assert_eq!(meta.status, TreeStatus::Done, "{case}: it lists as done");
    assert_eq!(
        meta.program,
        Some(ask.reference().version()),
        "{case}: its next append recorded its program's version"
    );
}
