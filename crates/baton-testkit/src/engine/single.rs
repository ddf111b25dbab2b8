//! The step protocol on one engine: dispatches, signals, budgets,
//! cancellation, panics, start idempotence and scopes, deadlines, events and
//! tree limits.

use std::sync::Arc;
use std::time::Duration;

use baton_run::dispatch::ReplayPolicy;
use baton_run::log::{RecordKind, Snapshot};
use baton_run::store::{
    AcquireRequest, Acquired, Append, AppendOutcome, Changes, ListFilter, Listing, Message,
    MessageId, PostOutcome, Posted, Settle, SettleOutcome, Store, StoreError, TreeLoad,
};
use baton_run::{
    BoxFuture, Budget, Cause, ControlError, Engine, EngineConfig, EventKind, FailureKind,
    ManualClock, Name, Payload, ProcessId, Settlement, SignalError, SignalId, SignalReceipt,
    SignalRequest, StartError, StartRequest, Status, Timestamp, TreeId, TreeLimits, Visibility,
};
use serde_json::{Value, json};

use super::{Fresh, answer, records, scope};
use crate::ScriptedDispatcher;
use crate::programs::{Kind, engine, open_wait, program, request, start_id};

pub(super) async fn three_dispatches_complete_in_declaration_order_and_the_log_verifies(
    fresh: &Fresh<'_>,
) {
    let dispatcher = ScriptedDispatcher::echo(ReplayPolicy::Never);
    let program = program(Kind::Dispatch, Some(Arc::new(dispatcher.clone())));
    let store = fresh();
    let engine = engine(store.clone(), &[&program]);
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

    let head = engine
        .verify(&scope(), handle.tree())
        .await
        .expect("verifies")
        .head_seq;
    let load = store.load(handle.tree()).await.expect("loads");
    assert!(
        load.snapshot.is_none(),
        "a tree this short writes no snapshot"
    );
    let records = load.records;
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
}

pub(super) async fn host_signals_are_idempotent_by_id_and_validated_before_commit(
    fresh: &Fresh<'_>,
) {
    let program = program(Kind::Ask, None);
    let store = fresh();
    let engine = engine(store.clone(), &[&program]);
    let handle = engine
        .start(&program, request("ask", "deploy?"))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    let before = records(&*store, handle.tree()).await.len();

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
    assert_eq!(records(&*store, handle.tree()).await.len(), before);

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
    assert_eq!(records(&*store, handle.tree()).await.len(), before + 1);
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

pub(super) async fn a_looping_program_stops_exactly_at_its_step_quota(fresh: &Fresh<'_>) {
    let program = program(Kind::Loop, None);
    let engine = engine(fresh(), &[&program]);
    let mut start = request("loop", Value::Null);
    start.budget = Budget::unlimited().with_steps(100);
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

pub(super) async fn a_meter_reservation_over_budget_is_refused_before_any_io(fresh: &Fresh<'_>) {
    let dispatcher = ScriptedDispatcher::echo(ReplayPolicy::Never);
    let program = program(Kind::Metered, Some(Arc::new(dispatcher.clone())));
    let engine = engine(fresh(), &[&program]);
    let tokens = || Name::new("tokens").expect("valid");
    let mut start = request("metered", 500u64);
    start.budget = Budget::unlimited().with_meter(tokens(), 100);
    let handle = engine.start(&program, start).await.expect("starts");
    let output: Vec<Value> =
        serde_json::from_value(handle.output().await.expect("completes")).expect("list");
    assert_eq!(output[0]["status"], "failed");
    assert_eq!(output[0]["failure"]["code"], "engine.limit.meter");
    assert_eq!(dispatcher.total(), 0, "the dispatcher was never called");

    // Within budget: dispatched once, and the reservation stays charged as usage.
    let mut start = request("metered-ok", 80u64);
    start.budget = Budget::unlimited().with_meter(tokens(), 100);
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
        usage.meters.get(&tokens()),
        Some(&0),
        "echo reports no usage"
    );
}

pub(super) async fn cancel_racing_an_answer_wins_by_priority_and_a_committed_completion_stands(
    fresh: &Fresh<'_>,
) {
    let program = program(Kind::Ask, None);
    let engine = engine(fresh(), &[&program]);
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

pub(super) async fn a_panicking_step_fails_with_kind_panic_and_other_trees_keep_running(
    fresh: &Fresh<'_>,
) {
    let panicking = program(Kind::Panic, None);
    let dispatching = program(
        Kind::Dispatch,
        Some(Arc::new(ScriptedDispatcher::echo(ReplayPolicy::Never))),
    );
    let engine = engine(fresh(), &[&panicking, &dispatching]);
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

pub(super) async fn starting_the_same_id_is_idempotent_and_scopes_are_enforced(fresh: &Fresh<'_>) {
    let program = program(Kind::Ask, None);
    let other = crate::programs::program(Kind::Loop, None);
    let unregistered = crate::programs::program(Kind::Echo, None);
    let store = fresh();
    let engine = engine(store.clone(), &[&program, &other]);
    let first = engine
        .start(&program, request("job", "q"))
        .await
        .expect("starts");
    let second = engine
        .start(&program, request("job", "q"))
        .await
        .expect("starts again");
    assert_eq!(first.id(), second.id());
    assert!(first.is_new(), "the first start makes the tree");
    assert!(!second.is_new(), "the second start finds it");
    let refused = engine
        .start(&unregistered, request("job-2", "q"))
        .await
        .expect_err("an unregistered program is refused");
    assert_eq!(refused.code(), "engine.program.unregistered");
    let conflict = engine
        .start(&program, request("job", "other input"))
        .await
        .expect_err("conflict");
    assert_eq!(conflict.code(), "engine.start.conflict");
    assert!(
        conflict
            .to_string()
            .contains(r#"start id "job" in scope "acme""#),
        "the message names the start id as the caller gave it: {conflict}"
    );
    let conflict = engine
        .start(&other, request("job", "q"))
        .await
        .expect_err("conflict");
    assert!(matches!(conflict, StartError::Conflict { .. }));

    // A tree that ends in its first round is told by its input as well:
    // by this engine, and by a fresh one that reads it from the store.
    let echo = crate::programs::program(Kind::Echo, None);
    let input = json!({"text": "x".repeat(5000), "n": 1});
    let echoes = crate::programs::engine(store.clone(), &[&echo]);
    let done = echoes
        .start(&echo, request("echo", &input))
        .await
        .expect("starts");
    assert!(done.is_new());
    let output = done.await_result().await.expect("terminates");
    assert_eq!(output.status(), Status::Completed);
    for engine in [echoes, crate::programs::engine(store, &[&echo])] {
        let again = engine
            .start(&echo, request("echo", &input))
            .await
            .expect("the same start");
        assert!(!again.is_new(), "the same start finds the finished tree");
        assert_eq!(again.id(), done.id());
        let mut changed = input.clone();
        changed["n"] = json!(2);
        let conflict = engine
            .start(&echo, request("echo", &changed))
            .await
            .expect_err("another input");
        assert_eq!(conflict.code(), "engine.start.conflict");
    }

    let stranger = baton_run::Scope::new("globex").expect("valid");
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
            .inspect(&stranger, first.id(), Visibility::Public)
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
    let missing = ProcessId::root(&start_id("typed"));
    assert_eq!(
        engine
            .inspect(&scope(), missing, Visibility::Public)
            .await
            .expect_err("absent")
            .code(),
        "engine.tree.not_found"
    );
}

pub(super) async fn a_host_deadline_times_the_tree_out_and_beats_a_racing_answer(
    fresh: &Fresh<'_>,
) {
    let clock = ManualClock::new(Timestamp(1_000));
    let program = program(Kind::Ask, None);
    let engine = Engine::new(EngineConfig {
        programs: vec![program.erase()],
        clock: Arc::new(clock.clone()),
        ..EngineConfig::new(fresh())
    })
    .expect("the engine configuration is valid");
    let mut start = StartRequest::new(start_id("deadline"), "q".to_string());
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
    let mut start = StartRequest::new(start_id("deadline-2"), "q".to_string());
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

pub(super) async fn events_report_committed_facts_in_order(fresh: &Fresh<'_>) {
    let dispatcher = ScriptedDispatcher::echo(ReplayPolicy::Never);
    let program = program(Kind::Dispatch, Some(Arc::new(dispatcher)));
    let engine = engine(fresh(), &[&program]);
    let mut events = engine.events();
    let handle = engine
        .start(&program, request("events", json!(["a"])))
        .await
        .expect("starts");
    assert_eq!(
        handle.await_result().await.expect("terminates").status(),
        Status::Completed
    );
    let mut seen = Vec::new();
    while let Ok(Some(event)) = events.try_recv() {
        assert_eq!(event.tree, handle.tree());
        seen.push(match event.kind {
            EventKind::ProcessStarted { .. } => "started".to_owned(),
            EventKind::StepAdopted { transition, .. } => format!("step:{transition}"),
            EventKind::EffectPending { .. } => "pending".to_owned(),
            EventKind::EffectSettled { .. } => "settled".to_owned(),
            EventKind::Terminated { status, .. } => format!("terminated:{status}"),
            EventKind::Drained { status } => format!("drained:{status}"),
            other => format!("{other:?}"),
        });
    }
    assert_eq!(
        seen,
        [
            "started",
            "step:continue",
            "pending",
            "settled",
            "step:complete",
            "terminated:completed",
            "drained:completed"
        ]
    );
}

pub(super) async fn tree_limits_fail_definitely_and_a_tree_over_its_history_is_closed(
    fresh: &Fresh<'_>,
) {
    // Pending signals: the second unconsumed note is refused, the process is unharmed.
    let ask = program(Kind::Ask, None);
    let mut config = EngineConfig {
        programs: vec![ask.erase()],
        ..EngineConfig::new(fresh())
    };
    config.limits = TreeLimits {
        max_pending_signals: 2,
        ..TreeLimits::default()
    };
    let engine = Engine::new(config).expect("the engine configuration is valid");
    let handle = engine
        .start(&ask, request("mailbox", "q"))
        .await
        .expect("starts");
    open_wait(&handle).await;
    let note = |id: &str| SignalRequest {
        id: SignalId::new(id).expect("valid"),
        wait: None,
        payload: Payload::encode(&json!({"note": id})).expect("encodes"),
    };
    handle.signal(note("n1")).await.expect("admitted");
    handle.signal(note("n2")).await.expect("admitted");
    let refused = handle.signal(note("n3")).await.expect_err("mailbox full");
    assert_eq!(refused.code(), "engine.limit.pending_signals");
    assert_eq!(
        handle.inspect().await.expect("inspects").root().status,
        Status::Waiting
    );

    // State bytes: an initial state over the limit refuses the start; a
    // state that grows over it fails the process.
    let mut config = EngineConfig {
        programs: vec![ask.erase()],
        ..EngineConfig::new(fresh())
    };
    config.limits = TreeLimits {
        max_state_bytes: 100,
        ..TreeLimits::default()
    };
    let engine = Engine::new(config).expect("the engine configuration is valid");
    let refused = engine
        .start(&ask, request("too-big", "x".repeat(300)))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), "engine.limit.state");
    // Fits at first (about 85 bytes); storing the wait id grows it past 100.
    let handle = engine
        .start(&ask, request("grows", "x".repeat(40)))
        .await
        .expect("starts");
    let ended = handle.await_result().await.expect("ends");
    assert_eq!(
        ended.failure().expect("failure").code(),
        "engine.limit.state"
    );

    // History: a tree whose log outgrows its limit is closed, not wedged.
    let mut config = EngineConfig {
        programs: vec![ask.erase()],
        ..EngineConfig::new(fresh())
    };
    config.limits = TreeLimits {
        max_history_bytes: 3_000,
        ..TreeLimits::default()
    };
    let engine = Engine::new(config).expect("the engine configuration is valid");
    let handle = engine
        .start(&ask, request("history", "q"))
        .await
        .expect("starts");
    open_wait(&handle).await;
    let mut refused = None;
    for index in 0..100 {
        match handle.signal(note(&format!("h{index}"))).await {
            Ok(_) => {}
            Err(error) => {
                refused = Some(error);
                break;
            }
        }
    }
    assert_eq!(
        refused.expect("eventually refused").code(),
        "engine.signal.terminated"
    );
    let ended = handle.await_result().await.expect("closed");
    assert_eq!(
        ended.failure().expect("failure").code(),
        "engine.limit.history"
    );
}

/// A store whose lease on a tree is taken over by another writer (`usurper`)
/// just before the first append of that tree reaches it, as a second engine
/// racing a start would.
struct Usurped {
    inner: Arc<dyn Store>,
}

impl Store for Usurped {
    fn acquire(&self, request: AcquireRequest) -> BoxFuture<'_, Result<Acquired, StoreError>> {
        self.inner.acquire(request)
    }

    fn load(&self, tree: TreeId) -> BoxFuture<'_, Result<TreeLoad, StoreError>> {
        self.inner.load(tree)
    }

    fn history(&self, tree: TreeId) -> BoxFuture<'_, Result<TreeLoad, StoreError>> {
        self.inner.history(tree)
    }

    fn append(&self, batch: Vec<Append>) -> BoxFuture<'_, Result<Vec<AppendOutcome>, StoreError>> {
        Box::pin(async move {
            for append in batch
                .iter()
                .filter(|a| a.records.first().is_some_and(|r| r.seq == 1))
            {
                let takeover = AcquireRequest {
                    tree: append.tree,
                    owner: "usurper".into(),
                    now: Timestamp(0),
                    ttl: Duration::from_secs(3600),
                    force: true,
                };
                self.inner.acquire(takeover).await?;
            }
            self.inner.append(batch).await
        })
    }

    fn write_snapshot(
        &self,
        tree: TreeId,
        token: u64,
        snapshot: Snapshot,
    ) -> BoxFuture<'_, Result<AppendOutcome, StoreError>> {
        self.inner.write_snapshot(tree, token, snapshot)
    }

    fn renew(
        &self,
        tree: TreeId,
        token: u64,
        until: Timestamp,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        self.inner.renew(tree, token, until)
    }

    fn release(&self, tree: TreeId, token: u64) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.release(tree, token)
    }

    fn list(&self, filter: ListFilter) -> BoxFuture<'_, Result<Listing, StoreError>> {
        self.inner.list(filter)
    }

    fn changes(&self) -> BoxFuture<'_, Result<Option<Changes>, StoreError>> {
        self.inner.changes()
    }

    fn post(&self, message: Message) -> BoxFuture<'_, Result<PostOutcome, StoreError>> {
        self.inner.post(message)
    }

    fn pending(&self, tree: Option<TreeId>) -> BoxFuture<'_, Result<Vec<Message>, StoreError>> {
        self.inner.pending(tree)
    }

    fn settle(&self, settle: Settle) -> BoxFuture<'_, Result<SettleOutcome, StoreError>> {
        self.inner.settle(settle)
    }

    fn message(
        &self,
        tree: TreeId,
        id: MessageId,
    ) -> BoxFuture<'_, Result<Option<Posted>, StoreError>> {
        self.inner.message(tree, id)
    }
}

pub(super) async fn a_start_whose_lease_is_taken_over_before_its_first_record_is_fenced_and_writes_nothing(
    fresh: &Fresh<'_>,
) {
    let program = program(Kind::Echo, None);
    let store = fresh();
    let usurped: Arc<dyn Store> = Arc::new(Usurped {
        inner: store.clone(),
    });
    let engine = engine(usurped, &[&program]);
    let error = engine
        .start(&program, request("raced", "q"))
        .await
        .expect_err("the start lost its lease");
    let tree = ProcessId::root(&start_id("raced"));
    // Where the usurper's lease is still live (a store on the database's
    // clock), the start is told who holds it; where it ran out, the start
    // takes the lease and is fenced at its first append.
    match &error {
        StartError::Fenced { tree: fenced } => {
            assert_eq!(*fenced, tree);
            assert_eq!(error.code(), "engine.tree.incarnation_conflict");
        }
        StartError::LeaseHeld { owner, .. } => assert_eq!(owner, "usurper"),
        other => panic!("the start must lose the tree to the usurper, got {other:?}"),
    }
    let load = store.load(tree).await.expect("loads");
    assert!(!load.exists(), "a fenced start writes nothing");
}
