//! Engine acceptance tests: the step protocol, the log, budgets,
//! termination, scopes, recovery and the crash matrix.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use crate::common::{Kind, engine, id, open_wait, program, request};
use baton_run::log::RecordKind;
use baton_run::{
    Cause, ControlError, Engine, EngineConfig, FailureKind, ManualClock, MemoryStore, Name,
    Payload, RecoverError, RecoverOptions, ReplayPolicy, RuntimeError, Scope, Settlement,
    SignalError, SignalId, SignalReceipt, SignalRequest, StartError, StartRequest, Status, Store,
    Timestamp, TreeStatus,
};
use baton_testkit::{Cut, FaultStore, ScriptedDispatcher};
use serde_json::{Value, json};

fn answer(id: &str, wait: baton_run::WaitId, value: bool) -> SignalRequest {
    SignalRequest {
        id: SignalId::new(id).expect("valid"),
        wait: Some(wait),
        payload: Payload::encode(&value).expect("encodes"),
    }
}

#[tokio::test]
async fn three_dispatches_complete_in_declaration_order_and_the_log_verifies() {
    let dispatcher = ScriptedDispatcher::echo(ReplayPolicy::Never);
    let program = program(Kind::Dispatch, Some(Arc::new(dispatcher.clone())));
    let store = MemoryStore::keeping_history();
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

    let scope = Scope::new("acme").expect("valid");
    let head = engine
        .verify(&scope, handle.tree())
        .await
        .expect("verifies");
    let records = store.records(handle.tree());
    assert_eq!(head, records.len() as u64);
    // Pending before settled for every dispatch, all committed before completion.
    let kinds: Vec<RecordKind> = records.iter().map(|r| r.kind).collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == RecordKind::EffectPending)
            .count(),
        3
    );
    assert_eq!(kinds.first(), Some(&RecordKind::TreeStarted));

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
            RecoverError::Corrupt { message, .. } => {
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
        .acquire(baton_run::AcquireRequest {
            tree,
            owner: "copier".into(),
            now: Timestamp(0),
            ttl: Duration::from_secs(1),
            force: true,
        })
        .await
        .expect("acquires")
    {
        baton_run::Acquired::Granted { lease, .. } => lease,
        other => panic!("unexpected {other:?}"),
    };
    let meta = from
        .list(Default::default())
        .await
        .expect("lists")
        .into_iter()
        .find(|m| m.tree == tree)
        .expect("meta");
    let outcome = to
        .append(vec![baton_run::Append {
            tree,
            token: lease.token,
            records: from.records(tree),
            meta,
            release: false,
        }])
        .await
        .expect("appends");
    assert_eq!(outcome, vec![baton_run::AppendOutcome::Committed]);
    Engine::new(EngineConfig::new(to.clone()))
}

#[tokio::test]
async fn host_signals_are_idempotent_by_id_and_validated_before_commit() {
    let program = program(Kind::Ask, None);
    let store = MemoryStore::keeping_history();
    let engine = engine(Arc::new(store.clone()), &[&program]);
    let handle = engine
        .start(&program, request("ask", "deploy?"))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    let before = store.records(handle.tree()).len();

    let note = |text: Value| SignalRequest {
        id: SignalId::new("note-1").expect("valid"),
        wait: None,
        payload: Payload::encode(&text).expect("encodes"),
    };
    // An unaddressed signal that fails the signal schema: contract error, nothing written.
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
    // A schema-violating answer: rejected, nothing written.
    let bad = SignalRequest {
        payload: Payload::encode(&"yes").expect("encodes"),
        ..answer("bad", wait, true)
    };
    assert_eq!(
        handle.signal(bad).await.expect_err("rejected").code(),
        "engine.signal.answer.invalid"
    );
    assert_eq!(store.records(handle.tree()).len(), before);

    // A valid note twice: admitted once, charged once; different content conflicts.
    assert_eq!(
        handle.signal(note(json!({"note": "hi"}))).await,
        Ok(SignalReceipt::Admitted)
    );
    let signals_after_first = handle
        .inspect()
        .await
        .expect("inspects")
        .root()
        .usage
        .signals;
    assert_eq!(
        handle.signal(note(json!({"note": "hi"}))).await,
        Ok(SignalReceipt::Duplicate)
    );
    assert_eq!(
        handle
            .inspect()
            .await
            .expect("inspects")
            .root()
            .usage
            .signals,
        signals_after_first
    );
    assert_eq!(store.records(handle.tree()).len(), before + 1);
    assert!(matches!(
        handle.signal(note(json!({"note": "different"}))).await,
        Err(SignalError::Conflict { .. })
    ));
    // The note did not release the wait.
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
async fn a_looping_program_stops_exactly_at_its_step_quota() {
    let program = program(Kind::Loop, None);
    let engine = engine(Arc::new(MemoryStore::new()), &[&program]);
    let mut start = request("loop", Value::Null);
    start.budget = common::budget_steps(100);
    let handle = engine.start(&program, start).await.expect("starts");
    let termination = handle.await_result().await.expect("terminates");
    assert_eq!(termination.status(), Status::Failed);
    assert_eq!(
        termination.failure().expect("failure").code(),
        "engine.limit.steps"
    );
    let view = handle.inspect().await.expect("inspects");
    assert_eq!(view.root().usage.steps, 100);
}

#[tokio::test]
async fn a_meter_reservation_over_budget_is_refused_before_any_io() {
    let dispatcher = ScriptedDispatcher::echo(ReplayPolicy::Never);
    let program = program(Kind::Metered, Some(Arc::new(dispatcher.clone())));
    let engine = engine(Arc::new(MemoryStore::new()), &[&program]);
    let mut start = request("metered", 500u64);
    start.budget =
        baton_run::Budget::unlimited().with_meter(Name::new("tokens").expect("valid"), 100);
    let handle = engine.start(&program, start).await.expect("starts");
    let output: Vec<Value> =
        serde_json::from_value(handle.output().await.expect("completes")).expect("list");
    assert_eq!(output[0]["status"], "failed");
    assert_eq!(output[0]["failure"]["code"], "engine.limit.meter");
    assert_eq!(dispatcher.total(), 0, "the dispatcher was never called");

    // Within budget: dispatched once, and the reservation stays charged as usage.
    let mut start = request("metered-ok", 80u64);
    start.budget =
        baton_run::Budget::unlimited().with_meter(Name::new("tokens").expect("valid"), 100);
    let handle = engine.start(&program, start).await.expect("starts");
    let output: Vec<Value> =
        serde_json::from_value(handle.output().await.expect("completes")).expect("list");
    assert_eq!(output[0]["status"], "succeeded");
    assert_eq!(dispatcher.total(), 1);
    let usage = handle
        .inspect()
        .await
        .expect("inspects")
        .root()
        .usage
        .clone();
    assert_eq!(
        usage.meters.get(&Name::new("tokens").expect("valid")),
        Some(&0),
        "echo reports no usage"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn cancel_racing_an_answer_wins_by_priority_and_a_committed_completion_stands() {
    let program = program(Kind::Ask, None);
    let engine = engine(Arc::new(MemoryStore::new()), &[&program]);
    let handle = engine
        .start(&program, request("race", "q"))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    let (answered, canceled) = tokio::join!(
        handle.signal(answer("a", wait, true)),
        handle.cancel("operator")
    );
    assert_eq!(answered, Ok(SignalReceipt::Admitted));
    assert_eq!(canceled, Ok(()));
    let termination = handle.await_result().await.expect("terminates");
    assert_eq!(termination.status(), Status::Canceled);
    assert_eq!(termination.cause(), Cause::HostCancellation);

    let handle = engine
        .start(&program, request("race-2", "q"))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    handle
        .signal(answer("a", wait, true))
        .await
        .expect("admitted");
    assert_eq!(
        handle.await_result().await.expect("terminates").status(),
        Status::Completed
    );
    assert!(matches!(
        handle.cancel("late").await,
        Err(ControlError::Terminated { .. })
    ));
    assert_eq!(
        handle.await_result().await.expect("terminates").status(),
        Status::Completed
    );
}

#[tokio::test]
async fn a_panicking_step_fails_with_kind_panic_and_other_trees_keep_running() {
    let panicking = program(Kind::Panic, None);
    let dispatching = program(
        Kind::Dispatch,
        Some(Arc::new(ScriptedDispatcher::echo(ReplayPolicy::Never))),
    );
    let engine = engine(Arc::new(MemoryStore::new()), &[&panicking, &dispatching]);
    let handle = engine
        .start(&panicking, request("boom", Value::Null))
        .await
        .expect("starts");
    let termination = handle.await_result().await.expect("terminates");
    assert_eq!(termination.status(), Status::Failed);
    assert_eq!(
        termination.failure().expect("failure").kind,
        FailureKind::Panic
    );
    let other = engine
        .start(&dispatching, request("fine", json!(["x"])))
        .await
        .expect("starts");
    assert_eq!(
        other.await_result().await.expect("terminates").status(),
        Status::Completed
    );
}

#[tokio::test]
async fn starting_the_same_id_is_idempotent_and_scopes_are_enforced() {
    let program = program(Kind::Ask, None);
    let other = program_other();
    let engine = engine(Arc::new(MemoryStore::new()), &[&program]);
    let first = engine
        .start(&program, request("job", "q"))
        .await
        .expect("starts");
    let second = engine
        .start(&program, request("job", "q"))
        .await
        .expect("starts again");
    assert_eq!(first.id(), second.id());
    let conflict = engine
        .start(&program, request("job", "other input"))
        .await
        .expect_err("conflict");
    assert_eq!(conflict.code(), "engine.start.conflict");
    let conflict = engine
        .start(&other, request("job", "q"))
        .await
        .expect_err("conflict");
    assert!(matches!(conflict, StartError::Conflict { .. }));

    let stranger = Scope::new("globex").expect("valid");
    let error = engine
        .process::<Payload>(&stranger, first.id())
        .await
        .expect_err("wrong scope");
    assert_eq!(error.code(), "engine.scope.mismatch");
    let error = engine
        .resolve_unknown(
            &stranger,
            first.id(),
            baton_run::EffectId::new(first.id(), 0, 0),
            Settlement::ok(Payload::null()),
        )
        .await
        .expect_err("wrong scope");
    assert_eq!(error.code(), "engine.scope.mismatch");
    assert_eq!(
        engine
            .inspect(&stranger, first.id(), false)
            .await
            .expect_err("wrong scope")
            .code(),
        "engine.scope.mismatch"
    );

    // Bad input is refused before anything is written.
    let error = engine
        .start(&program, request("typed", 42))
        .await
        .expect_err("schema");
    match error {
        StartError::Input(failure) => {
            assert_eq!(failure.kind, FailureKind::Contract);
            assert_eq!(failure.code(), "execution.input.invalid");
        }
        other => panic!("unexpected {other:?}"),
    }
    let scope = Scope::new("acme").expect("valid");
    let missing = baton_run::ProcessId::root(&id("typed"));
    assert_eq!(
        engine
            .inspect(&scope, missing, false)
            .await
            .expect_err("absent")
            .code(),
        "engine.tree.not_found"
    );
}

fn program_other() -> baton_run::Program<Value, Value> {
    program(Kind::Loop, None)
}

#[tokio::test]
async fn a_fresh_engine_recovers_a_tree_from_a_dropped_engine_unless_its_program_is_missing() {
    let program = program(Kind::Ask, None);
    let store = MemoryStore::keeping_history();
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

    // Without the program registered: classified error, stored tree untouched.
    let before: Vec<_> = store
        .records(tree)
        .iter()
        .map(|r| (r.seq, r.hash, r.body.to_vec()))
        .collect();
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
    let after: Vec<_> = store
        .records(tree)
        .iter()
        .map(|r| (r.seq, r.hash, r.body.to_vec()))
        .collect();
    assert_eq!(before, after);
    drop(bare);

    // With the registry: the dropped engine's lease is reclaimed and the tree finishes.
    let second = engine(Arc::new(store.clone()), &[&program]);
    let report = second
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    assert!(report[0].1.is_ok(), "{report:?}");
    let scope = Scope::new("acme").expect("valid");
    let handle = second
        .process::<Payload>(&scope, tree)
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
}

#[tokio::test(flavor = "current_thread")]
async fn a_host_deadline_times_the_tree_out_and_beats_a_racing_answer() {
    let clock = ManualClock::new(Timestamp(1_000));
    let program = program(Kind::Ask, None);
    let engine = Engine::new(
        EngineConfig::new(MemoryStore::new())
            .program(&program)
            .clock(clock.clone()),
    );
    let mut start = StartRequest::new(id("deadline"), "q".to_string());
    start.deadline = Some(Timestamp(5_000));
    let handle = engine
        .start(&program.retype::<String, Value>(), start)
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    clock.advance(Duration::from_millis(1_000));
    tokio::task::yield_now().await;
    assert_eq!(
        handle.inspect().await.expect("inspects").root().status,
        Status::Waiting
    );
    clock.advance(Duration::from_millis(4_000));
    let _ = handle.signal(answer("racing", wait, true)).await;
    let termination = handle.await_result().await.expect("terminates");
    assert_eq!(termination.status(), Status::TimedOut);
    assert_eq!(termination.cause(), Cause::HostDeadline);

    // A completion committed before the deadline stands.
    let mut start = StartRequest::new(id("deadline-2"), "q".to_string());
    start.deadline = Some(Timestamp(9_000));
    let handle = engine
        .start(&program.retype::<String, Value>(), start)
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    handle
        .signal(answer("in-time", wait, true))
        .await
        .expect("admitted");
    assert_eq!(
        handle.await_result().await.expect("terminates").status(),
        Status::Completed
    );
    clock.advance(Duration::from_millis(10_000));
    tokio::task::yield_now().await;
    assert_eq!(
        handle.await_result().await.expect("terminates").status(),
        Status::Completed
    );
}

/// Runs one dispatch under a fault, recovers on a fresh engine and returns
/// the dispatcher, the recovered engine and the tree.
async fn crash_once(
    policy: ReplayPolicy,
    kind: RecordKind,
    cut: Cut,
    key: &str,
) -> (ScriptedDispatcher, Engine, baton_run::TreeId, MemoryStore) {
    let dispatcher = ScriptedDispatcher::echo(policy);
    let program = program(Kind::Dispatch, Some(Arc::new(dispatcher.clone())));
    let memory = MemoryStore::keeping_history();
    let faulty = FaultStore::new(Arc::new(memory.clone()));
    faulty.arm(kind, cut, 1);
    let first = engine(Arc::new(faulty.clone()), &[&program]);
    let handle = first
        .start(&program, request(key, json!(["once"])))
        .await
        .expect("starts");
    let stopped = handle.await_result().await;
    assert!(faulty.crashed(), "the fault fired");
    assert!(
        matches!(stopped, Err(RuntimeError::Storage { .. })),
        "{stopped:?}"
    );
    let tree = handle.tree();
    drop(first);
    let second = engine(faulty.inner(), &[&program]);
    let report = second
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    assert!(
        report.iter().all(|(_, result)| result.is_ok()),
        "{report:?}"
    );
    (dispatcher, second, tree, memory)
}

async fn outcome(engine: &Engine, tree: baton_run::TreeId) -> baton_run::Termination {
    let scope = Scope::new("acme").expect("valid");
    let handle = engine
        .process::<Payload>(&scope, tree)
        .await
        .expect("attached");
    handle.await_result().await.expect("terminates")
}

#[tokio::test]
async fn crash_before_the_pending_commit_dispatches_exactly_once_after_recovery() {
    let (dispatcher, engine, tree, _) = crash_once(
        ReplayPolicy::Never,
        RecordKind::EffectPending,
        Cut::Before,
        "c1",
    )
    .await;
    assert_eq!(outcome(&engine, tree).await.status(), Status::Completed);
    assert_eq!(dispatcher.total(), 1);
}

#[tokio::test]
async fn crash_after_the_pending_commit_with_never_parks_and_resolves_without_redispatch() {
    let (dispatcher, engine, tree, _) = crash_once(
        ReplayPolicy::Never,
        RecordKind::EffectPending,
        Cut::After,
        "c2",
    )
    .await;
    let scope = Scope::new("acme").expect("valid");
    let view = wait_for(&engine, tree, |v| v.root().status == Status::Parked).await;
    assert_eq!(view.status, TreeStatus::NeedsAttention);
    let effect = view.root().unknown_effects[0];
    assert_eq!(dispatcher.total(), 0);
    engine
        .resolve_unknown(
            &scope,
            tree,
            effect,
            Settlement::ok(Payload::encode(&"resolved").expect("encodes")),
        )
        .await
        .expect("resolves");
    let termination = outcome(&engine, tree).await;
    assert_eq!(termination.status(), Status::Completed);
    let outputs: Vec<Value> = termination
        .output()
        .expect("output")
        .decode()
        .expect("decodes");
    assert_eq!(outputs[0]["output"], "resolved");
    assert_eq!(dispatcher.total(), 0, "a Never effect is not sent again");
}

#[tokio::test]
async fn crash_with_same_identity_redispatches_under_the_same_effect_id() {
    // Crash after dispatching but before the settlement is durable.
    let (dispatcher, engine, tree, _) = crash_once(
        ReplayPolicy::SameIdentity,
        RecordKind::EffectSettled,
        Cut::Before,
        "c3",
    )
    .await;
    assert_eq!(outcome(&engine, tree).await.status(), Status::Completed);
    let counts = dispatcher.counts();
    assert_eq!(counts.len(), 1, "one effect id");
    assert_eq!(
        counts.values().copied().collect::<Vec<_>>(),
        [2],
        "dispatched again under the same id"
    );

    let (dispatcher, engine, tree, _) = crash_once(
        ReplayPolicy::Never,
        RecordKind::EffectSettled,
        Cut::Before,
        "c3b",
    )
    .await;
    let view = wait_for(&engine, tree, |v| v.root().status == Status::Parked).await;
    assert_eq!(view.root().unknown_effects.len(), 1);
    assert_eq!(dispatcher.total(), 1, "dispatched once, then unknown");
}

#[tokio::test]
async fn crash_after_the_settled_commit_completes_without_redispatch() {
    let (dispatcher, engine, tree, _) = crash_once(
        ReplayPolicy::Never,
        RecordKind::EffectSettled,
        Cut::After,
        "c4",
    )
    .await;
    assert_eq!(outcome(&engine, tree).await.status(), Status::Completed);
    assert_eq!(dispatcher.total(), 1);
}

async fn wait_for(
    engine: &Engine,
    tree: baton_run::TreeId,
    done: impl Fn(&baton_run::TreeView) -> bool,
) -> baton_run::TreeView {
    let scope = Scope::new("acme").expect("valid");
    for _ in 0..10_000 {
        let view = engine.inspect(&scope, tree, false).await.expect("inspects");
        if done(&view) {
            return view;
        }
        tokio::task::yield_now().await;
    }
    panic!("condition never held");
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
