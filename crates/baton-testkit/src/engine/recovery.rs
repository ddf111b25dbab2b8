//! Recovery by a fresh engine, the crash matrix of one dispatch, recovery
//! from a snapshot, and leases between engines: forced takeovers, sleeping
//! writers whose log moved, and closing.

use std::sync::Arc;

use baton_run::dispatch::ReplayPolicy;
use baton_run::log::{RecordBody, RecordKind};
use baton_run::store::{ListFilter, TreeStatus};
use baton_run::{
    Engine, EngineConfig, Payload, RecoverOptions, RuntimeError, Settlement, SignalError, SignalId,
    SignalReceipt, SignalRequest, Sleep, Status, TreeId,
};
use serde_json::{Value, json};

use super::{Fresh, answer, outcome, records, scope, wait_for};
use crate::programs::{Kind, engine, open_wait, program, request};
use crate::{Cut, FaultStore, ScriptedDispatcher};

pub(super) async fn a_fresh_engine_recovers_a_tree_from_a_dropped_engine_unless_its_program_is_missing(
    fresh: &Fresh<'_>,
) {
    let program = program(Kind::Ask, None);
    let store = fresh();
    let first = engine(store.clone(), &[&program]);
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
    let stored = || async {
        records(&*store, tree)
            .await
            .iter()
            .map(|r| (r.seq, r.hash, r.body.to_vec()))
            .collect::<Vec<_>>()
    };
    let before = stored().await;
    let bare =
        Engine::new(EngineConfig::new(store.clone())).expect("the engine configuration is valid");
    let report = bare
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    assert_eq!(report.len(), 1);
    assert_eq!(
        report[0].1.as_ref().expect_err("missing").code(),
        "engine.program.unavailable"
    );
    assert_eq!(before, stored().await);
    drop(bare);

    // With the registry: the dropped engine's lease is reclaimed and the tree finishes.
    let second = engine(store.clone(), &[&program]);
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
        .list(ListFilter {
            status: Some(TreeStatus::Done),
            scope: None,
            ..ListFilter::default()
        })
        .await
        .expect("lists");
    assert_eq!(listed.trees.len(), 1);
    assert!(second.verify(&scope(), tree).await.is_ok());
}

/// Runs one dispatch under a fault on a fresh store, recovers on a fresh
/// engine and returns the dispatcher, the recovered engine and the tree.
async fn crash_once(
    fresh: &Fresh<'_>,
    policy: ReplayPolicy,
    kind: RecordKind,
    cut: Cut,
    key: &str,
) -> (ScriptedDispatcher, Engine, TreeId) {
    let dispatcher = ScriptedDispatcher::echo(policy);
    let program = program(Kind::Dispatch, Some(Arc::new(dispatcher.clone())));
    let faulty = FaultStore::new(fresh());
    faulty.arm(kind, cut, 1);
    let first = engine(Arc::new(faulty.clone()), &[&program]);
    let tree = crate::start_into_crash(&first, &program, request(key, json!(["once"]))).await;
    assert!(faulty.crashed(), "the fault fired");
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
    // The caller starts again: nothing for a stored tree, the first start
    // of one the crash lost.
    second
        .start(&program, request(key, json!(["once"])))
        .await
        .expect("starts again");
    (dispatcher, second, tree)
}

pub(super) async fn crash_before_the_pending_commit_dispatches_exactly_once_after_recovery(
    fresh: &Fresh<'_>,
) {
    let (dispatcher, engine, tree) = crash_once(
        fresh,
        ReplayPolicy::Never,
        RecordKind::EffectPending,
        Cut::Before,
        "c1",
    )
    .await;
    assert_eq!(outcome(&engine, tree).await.status(), Status::Completed);
    assert_eq!(dispatcher.total(), 1);
}

pub(super) async fn crash_after_the_pending_commit_with_never_parks_and_resolves_without_redispatch(
    fresh: &Fresh<'_>,
) {
    let (dispatcher, engine, tree) = crash_once(
        fresh,
        ReplayPolicy::Never,
        RecordKind::EffectPending,
        Cut::After,
        "c2",
    )
    .await;
    let view = wait_for(&engine, tree, |v| v.root().status == Status::Parked).await;
    assert_eq!(view.status, TreeStatus::NeedsAttention);
    let effect = view.root().unknown_effects[0];
    assert_eq!(dispatcher.total(), 0);
    engine
        .resolve_unknown(
            &scope(),
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

pub(super) async fn crash_with_same_identity_redispatches_under_the_same_effect_id(
    fresh: &Fresh<'_>,
) {
    // Crash after dispatching but before the settlement is durable.
    let (dispatcher, engine, tree) = crash_once(
        fresh,
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

    let (dispatcher, engine, tree) = crash_once(
        fresh,
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

pub(super) async fn crash_after_the_settled_commit_completes_without_redispatch(fresh: &Fresh<'_>) {
    let (dispatcher, engine, tree) = crash_once(
        fresh,
        ReplayPolicy::Never,
        RecordKind::EffectSettled,
        Cut::After,
        "c4",
    )
    .await;
    assert_eq!(outcome(&engine, tree).await.status(), Status::Completed);
    assert_eq!(dispatcher.total(), 1);
}

pub(super) async fn a_tree_recovers_from_its_latest_snapshot_and_the_records_after_it(
    fresh: &Fresh<'_>,
) {
    let ask = program(Kind::Ask, None);
    let store = fresh();
    let mut config = EngineConfig {
        programs: vec![ask.erase()],
        ..EngineConfig::new(store.clone())
    };
    config.snapshot_every = 2;
    let first = Engine::new(config).expect("the engine configuration is valid");
    let handle = first
        .start(&ask, request("snap", "q"))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    for index in 0..5 {
        let note = SignalRequest {
            id: SignalId::new(format!("note-{index}")).expect("valid"),
            wait: None,
            payload: Payload::encode(&json!({ "note": format!("n{index}") })).expect("encodes"),
        };
        assert_eq!(handle.signal(note).await, Ok(SignalReceipt::Admitted));
    }
    let tree = handle.tree();
    let head = first
        .verify(&scope(), tree)
        .await
        .expect("verifies")
        .head_seq;
    let load = store.load(tree).await.expect("loads");
    assert!(load.snapshot.is_some(), "a snapshot was written");
    assert!(
        load.records.len() < head as usize,
        "records covered by a snapshot are not loaded again"
    );
    drop(first);

    let (_engine, handle) = recovered(store.clone(), &ask, tree).await;
    assert_eq!(
        handle.inspect().await.expect("inspects").root().mailbox,
        5,
        "notes survived"
    );
    assert_eq!(
        handle.signal(answer("answer", wait, false)).await,
        Ok(SignalReceipt::Admitted)
    );
    assert_eq!(handle.output().await.expect("completes"), json!(false));
}

/// A step that changes a small part of a large state is recorded as that
/// change; a fresh engine rebuilds the whole state from the start's state
/// and the changes, steps on from it, and verifies the log.
pub(super) async fn a_large_state_recorded_as_its_changes_is_rebuilt_by_recovery(
    fresh: &Fresh<'_>,
) {
    let ask = program(Kind::Ask, None);
    let store = fresh();
    let first = engine(store.clone(), &[&ask]);
    let question = "a long question ".repeat(2_000);
    let handle = first
        .start(&ask, request("large", &question))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    let tree = handle.tree();
    // The Ask program's state once it waits (its second step, after the one
    // that opened the wait), as its `State` writes it.
    let waiting = json!({"input": question, "kind": "Ask", "phase": 2, "wait": wait});
    let root_state = |capture: baton_run::TreeCapture| {
        capture.state.to_value()["processes"][tree.to_string()]["state"].clone()
    };
    let changes: Vec<_> = records(&*store, tree)
        .await
        .iter()
        .filter_map(|record| match record.decode().expect("decodes") {
            RecordBody::StepAdopted {
                state,
                state_change,
                ..
            } => Some((state, state_change)),
            _ => None,
        })
        .collect();
    assert!(!changes.is_empty(), "the process stepped");
    for (state, change) in &changes {
        assert!(
            state.is_none(),
            "a step's record does not hold the large state whole"
        );
        let change = change.as_ref().expect("the step's record holds its change");
        assert!(change.text.len() < 200, "the change is small: {change:?}");
    }
    drop(first);

    let (second, handle) = recovered(store.clone(), &ask, tree).await;
    let recovered = root_state(second.capture(&scope(), tree).await.expect("captures"));
    // Compared without printing 32 KB of question when they differ.
    let (same, recovered_len) = (recovered == waiting, recovered.to_string().len());
    assert!(
        same,
        "the recovered state is the whole state the step made: {recovered_len} bytes, {:?}, {:?}",
        recovered.get("phase"),
        recovered.get("wait")
    );
    assert_eq!(
        handle.signal(answer("answer", wait, true)).await,
        Ok(SignalReceipt::Admitted)
    );
    assert_eq!(handle.output().await.expect("completes"), json!(true));
    let report = second.verify(&scope(), tree).await.expect("verifies");
    assert_eq!(
        report.head_seq,
        records(&*store, tree).await.last().expect("records").seq,
        "the whole log folds"
    );
}

pub(super) async fn a_forced_takeover_stops_the_old_engine_without_writing(fresh: &Fresh<'_>) {
    let ask = program(Kind::Ask, None);
    let store = fresh();
    let old = engine(store.clone(), &[&ask]);
    let handle = old
        .start(&ask, request("fenced", "q"))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;

    let new = engine(store.clone(), &[&ask]);
    // The old engine is alive, so its lease is respected unless forced.
    let report = new.recover(RecoverOptions::default()).await.expect("lists");
    assert_eq!(
        report[0].1.as_ref().expect_err("held").code(),
        "engine.lease.held"
    );
    let report = new
        .recover(RecoverOptions {
            force: true,
            scope: None,
        })
        .await
        .expect("lists");
    assert!(report[0].1.is_ok());
    let before = records(&*store, handle.tree()).await.len();

    let error = handle
        .signal(answer("to-old", wait, true))
        .await
        .expect_err("the old writer is fenced");
    assert!(
        matches!(error, SignalError::Stopped(RuntimeError::Fenced { .. })),
        "{error:?}"
    );
    assert_eq!(
        records(&*store, handle.tree()).await.len(),
        before,
        "the fenced writer wrote nothing"
    );
    assert!(matches!(
        handle.await_result().await,
        Err(RuntimeError::Fenced { .. })
    ));
}

pub(super) async fn a_sleeping_tree_whose_log_moved_wakes_stopped_in_every_sleep_mode(
    fresh: &Fresh<'_>,
) {
    for (index, sleep) in [Sleep::Packed, Sleep::Unloaded].into_iter().enumerate() {
        let ask = program(Kind::Ask, None);
        let store = fresh();
        let mut config = EngineConfig {
            programs: vec![ask.erase()],
            ..EngineConfig::new(store.clone())
        };
        config.sleep = sleep;
        let old = Engine::new(config).expect("the engine configuration is valid");
        let handle = old
            .start(&ask, request(&format!("moved-{index}"), "q"))
            .await
            .expect("starts");
        let wait = open_wait(&handle).await;

        // Another engine takes the tree over and answers it to the end.
        let new = engine(store.clone(), &[&ask]);
        let report = new
            .recover(RecoverOptions {
                force: true,
                scope: None,
            })
            .await
            .expect("lists");
        assert!(report[0].1.is_ok(), "{sleep:?}");
        let taken = new
            .process::<Value>(&scope(), handle.tree())
            .await
            .expect("taken over");
        taken
            .signal(answer("to-new", wait, true))
            .await
            .expect("admitted");
        taken.join().await.expect("completes");
        let before = records(&*store, handle.tree()).await.len();

        // The sleeping old writer wakes to a log that moved: it stops
        // without writing, whether it kept its state or reloads it.
        let error = handle
            .signal(answer("to-old", wait, true))
            .await
            .expect_err("the old writer is stopped");
        assert!(
            matches!(
                error,
                SignalError::Stopped(RuntimeError::Fenced { .. } | RuntimeError::Conflict { .. })
            ),
            "{sleep:?}: {error:?}"
        );
        assert_eq!(
            records(&*store, handle.tree()).await.len(),
            before,
            "{sleep:?}"
        );
    }
}

pub(super) async fn closing_an_engine_releases_every_sleeping_tree_and_tells_its_handles(
    fresh: &Fresh<'_>,
) {
    let ask = program(Kind::Ask, None);
    let store = fresh();
    let engine_a = engine(store.clone(), &[&ask]);
    let mut handles = Vec::new();
    for index in 0..8 {
        let handle = engine_a
            .start(&ask, request(&format!("sleeper-{index}"), "q"))
            .await
            .expect("starts");
        open_wait(&handle).await;
        handles.push(handle);
    }
    let mut before = Vec::new();
    for handle in &handles {
        before.push(records(&*store, handle.tree()).await.len());
    }
    engine_a.close().await;
    for handle in &handles {
        assert!(matches!(
            handle.await_result().await,
            Err(RuntimeError::Closed { .. })
        ));
    }
    let mut after = Vec::new();
    for handle in &handles {
        after.push(records(&*store, handle.tree()).await.len());
    }
    assert_eq!(before, after, "closing wrote nothing");
    // Every lease was given up: a new engine takes every tree without force.
    let next = engine(store.clone(), &[&ask]);
    let report = next
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    assert_eq!(report.len(), 8);
    assert!(
        report.iter().all(|(_, result)| result.is_ok()),
        "{report:?}"
    );
}

/// A fresh engine over `store` running `program`, after its recovery, with
/// the handle of `tree`'s root.
async fn recovered(
    store: Arc<dyn baton_run::store::Store>,
    program: &baton_run::Program<Value, Value>,
    tree: TreeId,
) -> (Engine, baton_run::ProcessHandle<Value>) {
    let engine = engine(store, &[program]);
    engine
        .recover(RecoverOptions::default())
        .await
        .expect("recovers");
    let handle = engine
        .process::<Value>(&scope(), tree)
        .await
        .expect("attached");
    (engine, handle)
}
