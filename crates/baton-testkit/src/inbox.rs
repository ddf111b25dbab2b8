//! The inbox and change-notice cases of `store_conformance`, and
//! [`answer_across_engines`], the forwarding scenario a backend runs over
//! two handles of one database.

use std::sync::Arc;
use std::time::Duration;

use baton_run::store::{
    AcquireRequest, Acquired, Append, Change, Changes, Message, MessageId, PostOutcome, Settle,
    SettleOutcome, Store, TreeMeta, TreeStatus,
};
use baton_run::{
    Engine, EngineConfig, Payload, ProcessId, RecoverOptions, Scope, SignalError, SignalReceipt,
    Timestamp, TreeError, TreeId,
};
use serde_json::json;

use crate::programs::{Kind, SCOPE, open_wait, program, request, start_id};

/// How long a test waits for an outcome before it fails.
const PATIENCE: Duration = Duration::from_secs(30);

fn message(tree: TreeId, id: &str, body: serde_json::Value) -> Message {
    Message {
        tree,
        id: MessageId::new(id).expect("valid"),
        body: Payload::from_value(&body).expect("encodes"),
        posted: Timestamp(5),
    }
}

fn outcome(value: serde_json::Value) -> Payload {
    Payload::from_value(&value).expect("encodes")
}

/// Makes `tree` exist (one committed record) under a lease of `owner`;
/// returns the lease token.
async fn committed_tree(store: &dyn Store, tree: TreeId, owner: &str) -> u64 {
    let token = grant(store, tree, owner, false).await;
    let record = crate::store::first_record(tree);
    let append = Append {
        tree,
        token,
        records: vec![record],
        meta: TreeMeta::new(
            tree,
            Scope::new(SCOPE).expect("valid"),
            TreeStatus::Waiting,
            Timestamp(1),
        ),
        release: false,
    };
    let outcomes = store.append(vec![append]).await.expect("appends");
    assert_eq!(outcomes, vec![baton_run::store::AppendOutcome::Committed]);
    token
}

async fn grant(store: &dyn Store, tree: TreeId, owner: &str, force: bool) -> u64 {
    let request = AcquireRequest {
        tree,
        owner: owner.into(),
        now: Timestamp(1),
        ttl: Duration::from_secs(3600),
        force,
    };
    match store.acquire(request).await.expect("acquires") {
        Acquired::Granted { lease, .. } => lease.token,
        Acquired::LeaseHeld { owner, .. } => panic!("inbox: the lease is held by {owner}"),
    }
}

/// Posting is idempotent by id, a settlement is fenced by the newest lease
/// token and the first outcome stands, pending messages list in post order
/// without settled ones, and a tree without records takes no message.
pub(crate) async fn inbox(store: Arc<dyn Store>) {
    let store = &*store;
    let tree = ProcessId::root(&start_id("inbox"));
    let unknown = ProcessId::root(&start_id("inbox-unknown"));
    assert_eq!(
        store
            .post(message(unknown, "m1", json!(1)))
            .await
            .expect("posts"),
        PostOutcome::UnknownTree,
        "inbox: a tree without records takes no message"
    );
    let old = committed_tree(store, tree, "holder-1").await;
    let first = message(tree, "m1", json!({"answer": 1}));
    let second = message(tree, "m2", json!({"answer": 2}));
    let post = |message: Message| store.post(message);
    assert_eq!(
        post(first.clone()).await.expect("posts"),
        PostOutcome::Posted
    );
    assert_eq!(
        post(second.clone()).await.expect("posts"),
        PostOutcome::Posted
    );
    assert_eq!(
        post(first.clone()).await.expect("posts"),
        PostOutcome::Duplicate,
        "inbox: the same message posted again is a duplicate"
    );
    assert_eq!(
        post(message(tree, "m1", json!({"answer": 9})))
            .await
            .expect("posts"),
        PostOutcome::Conflict,
        "inbox: another body under a posted id is a conflict"
    );
    let pending = store.pending(Some(tree)).await.expect("lists");
    assert_eq!(
        pending,
        vec![first.clone(), second.clone()],
        "inbox: pending in post order"
    );
    assert_eq!(store.pending(None).await.expect("lists"), pending);
    assert!(
        store
            .pending(Some(unknown))
            .await
            .expect("lists")
            .is_empty()
    );
    // A takeover fences the old holder: its settlement writes nothing.
    let new = grant(store, tree, "holder-2", true).await;
    let settle = |id: &str, token: u64, value: serde_json::Value| Settle {
        tree,
        id: MessageId::new(id).expect("valid"),
        token,
        outcome: outcome(value),
    };
    assert_eq!(
        store
            .settle(settle("m1", old, json!("stale")))
            .await
            .expect("settles"),
        SettleOutcome::Fenced,
        "inbox: a stale holder cannot settle"
    );
    let read = |id: &str| store.message(tree, MessageId::new(id).expect("valid"));
    let unsettled = read("m1").await.expect("reads").expect("posted");
    assert_eq!(
        (unsettled.message, unsettled.outcome),
        (first.clone(), None)
    );
    assert_eq!(
        store
            .settle(settle("m1", new, json!("done")))
            .await
            .expect("settles"),
        SettleOutcome::Settled
    );
    assert_eq!(
        store
            .settle(settle("m1", new, json!("again")))
            .await
            .expect("settles"),
        SettleOutcome::AlreadySettled,
        "inbox: the first outcome stands"
    );
    assert_eq!(
        store
            .settle(settle("m9", new, json!("x")))
            .await
            .expect("settles"),
        SettleOutcome::Unknown
    );
    let settled = read("m1").await.expect("reads").expect("posted");
    assert_eq!(settled.outcome, Some(outcome(json!("done"))));
    assert_eq!(
        store.pending(Some(tree)).await.expect("lists"),
        vec![second],
        "inbox: a settled message is no longer pending"
    );
    assert!(read("m9").await.expect("reads").is_none());
    // The holder whose last append gave the lease up still settles.
    store.release(tree, new).await.expect("releases");
    assert_eq!(
        store
            .settle(settle("m2", new, json!("late")))
            .await
            .expect("settles"),
        SettleOutcome::Settled,
        "inbox: the newest grant settles after its release"
    );
}

/// A store that sends notices tells a subscriber of an append, a post and
/// a settlement of the tree.
pub(crate) async fn notices(store: Arc<dyn Store>) {
    let Some(mut changes) = store.changes().await.expect("subscribes") else {
        return;
    };
    let tree = ProcessId::root(&start_id("notices"));
    let token = committed_tree(&*store, tree, "holder").await;
    noticed(&mut changes, Change::Tree(tree), "an append").await;
    store
        .post(message(tree, "m1", json!(1)))
        .await
        .expect("posts");
    noticed(&mut changes, Change::Inbox(tree), "a post").await;
    let settle = Settle {
        tree,
        id: MessageId::new("m1").expect("valid"),
        token,
        outcome: outcome(json!(2)),
    };
    store.settle(settle).await.expect("settles");
    noticed(&mut changes, Change::Inbox(tree), "a settlement").await;
}

/// Waits (up to [`PATIENCE`]) for `expected`; `Missed` counts as a notice
/// of anything.
pub(crate) async fn noticed(changes: &mut Changes, expected: Change, what: &str) {
    let wait = async {
        loop {
            match changes.next().await {
                Some(change) if change == expected || change == Change::Missed => return,
                Some(_) => {}
                None => panic!("notices: the store stopped sending notices"),
            }
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .unwrap_or_else(|_| panic!("notices: {what} was not noticed within {PATIENCE:?}"));
}

fn config(
    store: Arc<dyn Store>,
    programs: &[&baton_run::Program<serde_json::Value, serde_json::Value>],
) -> EngineConfig {
    let mut config = EngineConfig {
        // Only notices (or the inbox's own bounded re-read) can move the
        // holder: its lease outlives the test.
        lease_ttl: Duration::from_secs(3600),
        ..EngineConfig::new(store)
    };
    for program in programs {
        config.programs.push(program.erase());
    }
    config
}

/// Two engines, one on `holder` and one on `other` (two handles of one
/// database, or the same handle): the holder runs a tree that waits for an
/// answer; the other engine's answer reaches it through the tree's inbox and
/// the tree completes with it, within 30 s. The same answer again is a
/// `Duplicate`, another one a refusal; a wrong scope and an unknown tree are
/// refused before anything is posted. Then a holder that never applies
/// (a lease held by an engine of another host) makes the answer time out
/// with `engine.forward.timeout`, and the engine that takes the tree over
/// applies the queued answer.
pub async fn answer_across_engines(holder: Arc<dyn Store>, other: Arc<dyn Store>) {
    let ask = program(Kind::Ask, None);
    let a = Engine::new(config(holder.clone(), &[&ask])).expect("valid");
    let b = Engine::new(config(other.clone(), &[&ask])).expect("valid");
    let scope = Scope::new(SCOPE).expect("valid");
    let handle = a
        .start(&ask, request("forwarded", "proceed?"))
        .await
        .expect("starts")
        .into_handle();
    let wait = open_wait(&handle).await;
    let tree = handle.tree();
    let receipt = b
        .answer(
            &scope,
            tree,
            wait,
            Payload::from_value(&json!(true)).expect("encodes"),
        )
        .await
        .expect("the holder applies the answer");
    assert_eq!(receipt, SignalReceipt::Admitted);
    let ended = tokio::time::timeout(PATIENCE, handle.await_result())
        .await
        .expect("the tree ends within 30 s")
        .expect("ends");
    assert_eq!(
        ended.output(),
        Some(&Payload::from_value(&json!(true)).expect("encodes")),
        "{ended:?}"
    );
    let again = b
        .answer(
            &scope,
            tree,
            wait,
            Payload::from_value(&json!(true)).expect("encodes"),
        )
        .await;
    assert_eq!(again, Ok(SignalReceipt::Duplicate));
    // Bad input is refused by the poster, as a local call refuses it.
    let wrong = Scope::new("other").expect("valid");
    let error = b
        .answer(
            &wrong,
            tree,
            wait,
            Payload::from_value(&json!(true)).expect("encodes"),
        )
        .await
        .expect_err("another scope");
    assert_eq!(error.code(), "engine.scope.mismatch");
    let unknown = ProcessId::root(&start_id("never-started"));
    let error = b
        .answer(
            &scope,
            unknown,
            wait,
            Payload::from_value(&json!(true)).expect("encodes"),
        )
        .await
        .expect_err("unknown tree");
    assert_eq!(error.code(), "engine.tree.not_found");
    a.close().await;
    b.close().await;
    queued_until_takeover(holder, other, &ask, &scope).await;
}

/// A holder that never applies: the answer times out, stays queued, and
/// the engine that takes the tree over applies it.
async fn queued_until_takeover(
    holder: Arc<dyn Store>,
    other: Arc<dyn Store>,
    ask: &baton_run::Program<serde_json::Value, serde_json::Value>,
    scope: &Scope,
) {
    let a = Engine::new(config(holder.clone(), &[ask])).expect("valid");
    let handle = a
        .start(ask, request("queued", "proceed?"))
        .await
        .expect("starts")
        .into_handle();
    let wait = open_wait(&handle).await;
    let tree = handle.tree();
    drop(handle);
    a.close().await;
    // A live engine of another host holds it now, and never applies.
    let elsewhere = AcquireRequest {
        tree,
        owner: "elsewhere/1/engine-0".into(),
        now: Timestamp(u64::MAX / 2),
        ttl: Duration::from_secs(3600),
        force: true,
    };
    assert!(matches!(
        holder.acquire(elsewhere).await.expect("acquires"),
        Acquired::Granted { .. }
    ));
    let b = Engine::new(EngineConfig {
        forward_timeout: Duration::from_millis(300),
        ..config(other.clone(), &[ask])
    })
    .expect("valid");
    let error = b
        .answer(
            scope,
            tree,
            wait,
            Payload::from_value(&json!(false)).expect("encodes"),
        )
        .await
        .expect_err("nobody applies it");
    assert!(
        matches!(&error, SignalError::Tree(TreeError::ForwardTimeout { tree: t, .. }) if *t == tree),
        "{error:?}"
    );
    assert_eq!(error.code(), "engine.forward.timeout");
    assert!(error.to_string().contains("queued"), "{error}");
    assert_eq!(other.pending(Some(tree)).await.expect("lists").len(), 1);
    let mut changes = other.changes().await.expect("subscribes");
    // Taking the tree over applies what is queued.
    let c = Engine::new(config(holder.clone(), &[ask])).expect("valid");
    let report = c
        .recover(RecoverOptions {
            force: true,
            ..RecoverOptions::default()
        })
        .await
        .expect("recovers");
    assert!(report.iter().all(|(_, taken)| taken.is_ok()), "{report:?}");
    let taken: baton_run::ProcessHandle = c.process(scope, tree).await.expect("held here");
    let ended = tokio::time::timeout(PATIENCE, taken.await_result())
        .await
        .expect("the queued answer is applied within 30 s")
        .expect("ends");
    assert_eq!(
        ended.output(),
        Some(&Payload::from_value(&json!(false)).expect("encodes")),
        "{ended:?}"
    );
    // The holder settles the message once the answer committed.
    while !other.pending(Some(tree)).await.expect("lists").is_empty() {
        let changes = changes.as_mut().expect("the store sends notices");
        noticed(changes, Change::Inbox(tree), "the settlement").await;
    }
    drop(taken);
    c.close().await;
    b.close().await;
}
