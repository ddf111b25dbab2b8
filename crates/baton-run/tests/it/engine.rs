//! The engine's behaviour on the memory store: the whole engine conformance
//! kit of `baton-testkit` (the step protocol, the log, budgets, termination,
//! scopes, recovery, the crash matrix, leases and process trees), plus what
//! only the memory store can show: tampering by rewriting a stored record.

use std::sync::Arc;
use std::time::Duration;

use baton_run::dispatch::ReplayPolicy;
use baton_run::store::Store;
use baton_run::{Engine, EngineConfig, MemoryStore, Payload, Scope, Status, Timestamp, TreeError};
use baton_testkit::programs::{Kind, SCOPE, engine, program, request};
use baton_testkit::{ScriptedDispatcher, engine_conformance};
use serde_json::json;

#[tokio::test]
async fn the_engine_conforms_on_the_memory_store() {
    engine_conformance(MemoryStore::new).await;
}

#[tokio::test]
async fn rewriting_any_stored_record_is_detected_at_that_record() {
    let dispatcher = ScriptedDispatcher::echo(ReplayPolicy::Never);
    let program = program(Kind::Dispatch, Some(Arc::new(dispatcher)));
    let store = MemoryStore::keeping_history();
    let engine = engine(Arc::new(store.clone()), &[&program]);
    let handle = engine
        .start(&program, request("three", json!(["a", "b", "c"])))
        .await
        .expect("starts");
    let termination = handle.join().await.expect("joins");
    assert_eq!(termination.status(), Status::Completed);
    let scope = Scope::new(SCOPE).expect("valid");
    let records = store.records(handle.tree());
    assert!(records.len() > 3, "a dispatch tree writes several records");

    for record in &records {
        let copy = MemoryStore::keeping_history();
        let verifier = engine_on_copy(&store, &copy, handle.tree()).await;
        assert!(copy.tamper(handle.tree(), record.seq, |bytes| {
            let last = bytes.len() - 2;
            bytes[last] ^= 0x01;
        }));
        let error = verifier
            .verify(&scope, handle.tree())
            .await
            .expect_err("tampering is detected");
        match error {
            TreeError::Corrupt { message, .. } => {
                assert!(
                    message.contains(&format!("record {}", record.seq)),
                    "{message}"
                );
            }
            other => panic!("unexpected error {other:?}"),
        }
    }
}

/// Copies a tree's records into another memory store and returns an engine on it.
async fn engine_on_copy(from: &MemoryStore, to: &MemoryStore, tree: baton_run::TreeId) -> Engine {
    let lease = match to
        .acquire(baton_run::store::AcquireRequest {
            tree,
            owner: "copier".into(),
            now: Timestamp(0),
            ttl: Duration::from_secs(1),
            force: true,
        })
        .await
        .expect("acquires")
    {
        baton_run::store::Acquired::Granted { lease, .. } => lease,
        other => panic!("unexpected {other:?}"),
    };
    let meta = from
        .list(Default::default())
        .await
        .expect("lists")
        .trees
        .into_iter()
        .find(|m| m.tree == tree)
        .expect("meta");
    let outcome = to
        .append(vec![baton_run::store::Append {
            tree,
            token: lease.token,
            records: from.records(tree),
            meta,
            release: false,
        }])
        .await
        .expect("appends");
    assert_eq!(outcome, vec![baton_run::store::AppendOutcome::Committed]);
    Engine::new(EngineConfig::new(Arc::new(to.clone()))).expect("the engine configuration is valid")
}

#[test]
fn public_handles_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Engine>();
    assert_send_sync::<baton_run::ProcessHandle>();
    assert_send_sync::<baton_run::Program>();
    assert_send_sync::<MemoryStore>();
    assert_send_sync::<Payload>();
}

#[tokio::test]
async fn a_dropped_record_or_a_moved_listing_is_found_by_verify_and_refused_at_attach() {
    let dispatcher = ScriptedDispatcher::echo(ReplayPolicy::Never);
    let program = program(Kind::Dispatch, Some(Arc::new(dispatcher)));
    let scope = Scope::new(SCOPE).expect("valid");
    let finished = |store: MemoryStore| {
        let program = program.clone();
        async move {
            let engine = engine(Arc::new(store), &[&program]);
            let handle = engine
                .start(&program, request("three", json!(["a", "b", "c"])))
                .await
                .expect("starts");
            handle.join().await.expect("joins");
            handle.tree()
        }
    };
    let corrupt_at = |error: TreeError| match error {
        TreeError::Corrupt { record, .. } => record,
        other => panic!("not a corruption: {other:?}"),
    };

    // The last record lost: the store's recorded head says the log is short.
    let store = MemoryStore::keeping_history();
    let tree = finished(store.clone()).await;
    let head = store.records(tree).len() as u64;
    assert!(store.drop_record(tree, head));
    let verifier = engine(Arc::new(store.clone()), &[&program]);
    let error = verifier.verify(&scope, tree).await.expect_err("detected");
    assert_eq!(corrupt_at(error), Some(head));

    // A record lost from the middle: the chain breaks at the next one.
    let store = MemoryStore::keeping_history();
    let tree = finished(store.clone()).await;
    assert!(store.drop_record(tree, 2));
    let verifier = engine(Arc::new(store.clone()), &[&program]);
    let error = verifier.verify(&scope, tree).await.expect_err("detected");
    assert_eq!(corrupt_at(error), Some(3));

    // The listing moved to another scope: the first record disagrees.
    let store = MemoryStore::keeping_history();
    let tree = finished(store.clone()).await;
    assert!(store.tamper_meta(tree, |meta| {
        meta.scope = Scope::new("intruder").expect("valid");
    }));
    let verifier = engine(Arc::new(store.clone()), &[&program]);
    let error = verifier
        .process::<Payload>(&scope, tree)
        .await
        .expect_err("refused at attach");
    assert_eq!(error.code(), "engine.log.corrupt", "{error}");
    let error = verifier.verify(&scope, tree).await.expect_err("detected");
    assert_eq!(corrupt_at(error), Some(1));
}

/// Dropping an engine while its trees' tasks are going to sleep on other
/// threads: every handle learns the engine is gone. (A task that
/// hibernated just after the drop had closed the sleeping trees used to
/// leave its tree asleep with nobody to close it, and its handle waited
/// for ever: about one drop in fifty on two threads, with one tree.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_an_engine_while_its_trees_fall_asleep_closes_every_handle() {
    let program = program(Kind::Ask, None);
    for round in 0..100 {
        let engine = Arc::new(engine(Arc::new(MemoryStore::new()), &[&program]));
        let mut starts = tokio::task::JoinSet::new();
        for n in 0..20 {
            let (engine, program) = (Arc::clone(&engine), program.clone());
            starts.spawn(async move {
                engine
                    .start(&program, request(&format!("sleepy-{round}-{n}"), "q"))
                    .await
                    .expect("starts")
            });
        }
        let handles = starts.join_all().await;
        // Some trees are asleep, others are on their way to sleep.
        drop(engine);
        for handle in handles {
            // A guard against a hang, far above the milliseconds it takes.
            let result = tokio::time::timeout(Duration::from_secs(30), handle.await_result())
                .await
                .expect("the handle learns the engine is gone");
            assert!(
                matches!(result, Err(baton_run::RuntimeError::Closed { .. })),
                "{result:?}"
            );
        }
    }
}
