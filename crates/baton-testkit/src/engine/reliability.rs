//! Leases, owners and receipts under pressure: a busy tree keeps its lease,
//! one engine never races itself for a tree, a fenced engine says so, a
//! closed engine leaves no lease behind, and a resent signal is a duplicate
//! even after it ended its process.

use std::sync::Arc;
use std::time::Duration;

use baton_run::dispatch::{Cancellation, DispatchCall, Dispatcher, ReplayPolicy};
use baton_run::log::RecordKind;
use baton_run::program::{
    Definition, Descriptor, Effect, Execution, ExecutionState, ProgramConfig, Schema, Signal,
    SignalBody, StepError, Transition, configuration_digest, implementation_digest,
};
use baton_run::store::{AcquireRequest, Acquired};
use baton_run::{
    BoxFuture, ChildKey, Clock, Engine, EngineConfig, ManualClock, Payload, Program,
    RecoverOptions, Settlement, SignalError, SignalId, SignalReceipt, SignalRequest, Sleep, Status,
    SystemClock, Timestamp, TreeError, WaitId,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::task::JoinSet;

use super::{Fresh, answer, scope, wait_for};
use crate::fault::{Cut, FaultStore};
use crate::programs::{Kind, engine, open_wait, program, request};

/// An unaddressed note, which the test programs accept as a signal.
fn note(index: usize) -> SignalRequest {
    SignalRequest {
        id: SignalId::new(format!("note-{index}")).expect("valid"),
        wait: None,
        payload: Payload::encode(&json!({ "note": format!("n{index}") })).expect("encodes"),
    }
}

pub(super) async fn a_busy_tree_keeps_its_lease_while_another_engine_tries_to_take_it(
    fresh: &Fresh<'_>,
) {
    let program = program(Kind::Ask, None);
    let store = fresh();
    let clock = ManualClock::new(Timestamp(1_000_000));
    let config = || EngineConfig {
        programs: vec![program.erase()],
        clock: Arc::new(clock.clone()),
        lease_ttl: Duration::from_secs(3),
        // The tree stays in memory between events, as a tree with work in
        // flight does, so only the renewal schedule keeps its lease.
        sleep: Sleep::Awake,
        ..EngineConfig::new(store.clone())
    };
    let first = Engine::new(config()).expect("the engine configuration is valid");
    let second = Engine::new(config()).expect("the engine configuration is valid");
    let handle = first
        .start(&program, request("busy", "keep going?"))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    // Sixty seconds of events, one every 100 ms, each well within a third
    // of the lease's time-to-live; the other engine tries to recover the
    // tree without force after each.
    for index in 0..600 {
        clock.advance(Duration::from_millis(100));
        assert_eq!(
            handle.signal(note(index)).await,
            Ok(SignalReceipt::Admitted),
            "event {index} (at {} ms) was refused",
            (index + 1) * 100
        );
        let report = second
            .recover(RecoverOptions::default())
            .await
            .expect("lists");
        for (tree, result) in report {
            if tree == handle.tree() {
                assert!(
                    matches!(result, Err(TreeError::LeaseHeld { .. })),
                    "the other engine took the busy tree at {} ms: {result:?}",
                    (index + 1) * 100
                );
            }
        }
    }
    assert_eq!(
        handle.signal(answer("done", wait, true)).await,
        Ok(SignalReceipt::Admitted)
    );
    let termination = handle.await_result().await.expect("not fenced");
    assert_eq!(termination.status(), Status::Completed);
}

pub(super) async fn twenty_identical_starts_at_once_make_one_tree_and_nineteen_handles_on_it(
    fresh: &Fresh<'_>,
) {
    let program = program(Kind::Ask, None);
    let engine = Arc::new(engine(fresh(), &[&program]));
    let mut starts = JoinSet::new();
    for _ in 0..20 {
        let (engine, program) = (engine.clone(), program.clone());
        starts.spawn(async move {
            let started = engine.start(&program, request("same", "once?")).await?;
            Ok::<_, baton_run::StartError>((started.is_new(), started.into_handle()))
        });
    }
    let mut outcomes = Vec::new();
    while let Some(joined) = starts.join_next().await {
        outcomes.push(
            joined
                .expect("the start task ran")
                .expect("every start succeeds"),
        );
    }
    assert_eq!(
        outcomes.iter().filter(|(new, _)| *new).count(),
        1,
        "one start made the tree"
    );
    assert!(
        outcomes
            .windows(2)
            .all(|pair| pair[0].1.id() == pair[1].1.id()),
        "every handle is on the same tree"
    );
    // Every handle reaches the one writer: the answer through one of them
    // ends the tree for all.
    let wait = open_wait(&outcomes[0].1).await;
    assert_eq!(
        outcomes[19].1.signal(answer("once", wait, true)).await,
        Ok(SignalReceipt::Admitted)
    );
    for (_, handle) in &outcomes {
        let termination = handle
            .await_result()
            .await
            .expect("no handle's writer stopped");
        assert_eq!(termination.status(), Status::Completed);
    }
}

/// A program that opens a wait, then makes one dispatch, and completes with
/// the answer to its wait once both are in.
struct WaitThenDispatch {
    descriptor: Descriptor,
}

#[derive(Serialize, Deserialize)]
struct WaitThenDispatchState {
    phase: u32,
    wait: Option<WaitId>,
}

struct WaitThenDispatchRun {
    state: WaitThenDispatchState,
}

impl Definition for WaitThenDispatch {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    fn start(&self, _input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(WaitThenDispatchRun {
            state: WaitThenDispatchState {
                phase: 0,
                wait: None,
            },
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(WaitThenDispatchRun {
            state: state.decode()?,
        }))
    }
}

impl Execution for WaitThenDispatchRun {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        self.state.phase += 1;
        for signal in window {
            if let SignalBody::WaitOpened { wait, .. } = &signal.body {
                self.state.wait = Some(*wait);
            }
        }
        let answer = window.iter().find_map(|signal| match &signal.body {
            SignalBody::Input { payload } if signal.wait.is_some() => Some(payload.clone()),
            _ => None,
        });
        match (self.state.phase, answer, self.state.wait) {
            (1, _, _) => Ok(Transition::Continue {
                consumed: window.len(),
                effects: vec![Effect::Wait {
                    key: ChildKey::new("approval").expect("valid"),
                    request: Payload::null(),
                    answer_schema: Schema::of::<bool>(),
                }],
            }),
            (2, _, _) => Ok(Transition::Continue {
                consumed: window.len(),
                effects: vec![Effect::dispatch(Payload::encode(&"call")?)],
            }),
            (_, Some(output), _) => Ok(Transition::Complete {
                consumed: window.len(),
                output,
            }),
            (_, None, Some(wait)) => Ok(Transition::Wait {
                consumed: window.len(),
                wait,
            }),
            (_, None, None) => Err(StepError::other("no wait was opened")),
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }
}

/// A dispatcher whose calls never settle on their own, replayed `Never`.
struct Hanging;

impl Dispatcher for Hanging {
    fn replay_policy(&self, _request: &Payload) -> ReplayPolicy {
        ReplayPolicy::Never
    }

    fn dispatch(&self, call: DispatchCall) -> BoxFuture<'static, Settlement> {
        let mut cancel: Cancellation = call.cancel;
        Box::pin(async move {
            cancel.canceled().await;
            Settlement::failed(baton_run::Failure::execution(
                "test.canceled",
                "the call was canceled",
            ))
        })
    }
}

fn wait_then_dispatch() -> Program<Value, Value> {
    let descriptor = Descriptor::new(
        "test.wait_then_dispatch",
        "Opens a wait, then makes one dispatch.",
        Schema::any(),
        Schema::any(),
    )
    .expect("valid");
    Program::new(ProgramConfig {
        definition: Arc::new(WaitThenDispatch { descriptor }),
        dispatcher: Some(Arc::new(Hanging)),
        implementation: implementation_digest(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        configuration: configuration_digest("wait then dispatch").expect("encodes"),
    })
}

pub(super) async fn a_take_up_a_resolution_and_an_answer_at_once_share_one_owner(
    fresh: &Fresh<'_>,
) {
    let program = wait_then_dispatch();
    let faulty = FaultStore::new(fresh());
    // Crash right after the dispatch's pending record is durable: a Never
    // effect in flight, so recovery parks it as unknown.
    faulty.arm(RecordKind::EffectPending, Cut::After, 1);
    let first = engine(Arc::new(faulty.clone()), &[&program]);
    let started = first
        .start(&program, request("shared", json!(null)))
        .await
        .expect("starts");
    let tree = started.tree();
    assert!(started.await_result().await.is_err(), "the writer crashed");
    drop(started);
    drop(first);

    let second = Arc::new(engine(faulty.inner(), &[&program]));
    let report = second
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    assert!(
        report.iter().all(|(_, result)| result.is_ok()),
        "{report:?}"
    );
    let view = wait_for(&second, tree, |v| v.root().status == Status::Parked).await;
    let effect = view.root().unknown_effects[0];
    let wait = view.root().open_waits[0].id;
    // A fresh engine with the tree in the store only: take it up, resolve
    // its unknown effect and answer its wait, all at once.
    drop(second);
    let third = Arc::new(engine(faulty.inner(), &[&program]));
    let mut calls = JoinSet::new();
    {
        let engine = third.clone();
        calls.spawn(async move {
            engine
                .process::<Payload>(&scope(), tree)
                .await
                .map(|_| "taken up".to_owned())
                .map_err(|error| error.to_string())
        });
    }
    {
        let engine = third.clone();
        calls.spawn(async move {
            engine
                .resolve_unknown(
                    &scope(),
                    tree,
                    effect,
                    Settlement::ok(Payload::encode(&"resolved").expect("encodes")),
                )
                .await
                .map(|()| "resolved".to_owned())
                .map_err(|error| error.to_string())
        });
    }
    {
        let engine = third.clone();
        calls.spawn(async move {
            let handle = engine
                .process::<Payload>(&scope(), tree)
                .await
                .map_err(|error| error.to_string())?;
            handle
                .signal(answer("approve", wait, true))
                .await
                .map(|receipt| format!("{receipt:?}"))
                .map_err(|error| error.to_string())
        });
    }
    while let Some(joined) = calls.join_next().await {
        let outcome = joined.expect("the call ran");
        assert!(outcome.is_ok(), "a concurrent call failed: {outcome:?}");
    }
    let handle = third
        .process::<Payload>(&scope(), tree)
        .await
        .expect("attached");
    let termination = handle.await_result().await.expect("terminates");
    assert_eq!(termination.status(), Status::Completed);
    assert_eq!(
        termination.output().expect("output").decode::<bool>(),
        Ok(true)
    );
}

pub(super) async fn a_fenced_engine_reports_the_fencing_when_asked_for_the_tree(fresh: &Fresh<'_>) {
    let program = program(Kind::Ask, None);
    let store = fresh();
    for sleep in [Sleep::Awake, Sleep::Unloaded] {
        let config = || EngineConfig {
            programs: vec![program.erase()],
            sleep,
            ..EngineConfig::new(store.clone())
        };
        let first = Engine::new(config()).expect("the engine configuration is valid");
        let key = format!("fenced-{sleep:?}");
        let handle = first
            .start(&program, request(&key, "who writes?"))
            .await
            .expect("starts");
        let tree = handle.tree();
        open_wait(&handle).await;
        let second = Engine::new(config()).expect("the engine configuration is valid");
        let report = second
            .recover(RecoverOptions {
                force: true,
                ..RecoverOptions::default()
            })
            .await
            .expect("lists");
        assert!(
            report
                .iter()
                .any(|(taken, result)| *taken == tree && result.is_ok()),
            "{report:?}"
        );
        let error = first
            .process::<Payload>(&scope(), tree)
            .await
            .expect_err("the fenced engine does not report the tree as its own");
        assert_eq!(
            error.code(),
            "engine.tree.incarnation_conflict",
            "{sleep:?}: {error}"
        );
        let report = first
            .recover(RecoverOptions::default())
            .await
            .expect("lists");
        assert!(
            report
                .iter()
                .any(|(taken, result)| *taken == tree && result.is_err()),
            "{sleep:?}: recover still claims the tree: {report:?}"
        );
        drop(handle);
        second.close().await;
        drop(first);
    }
}

pub(super) async fn after_close_another_owner_takes_every_tree_without_force_or_waiting(
    fresh: &Fresh<'_>,
) {
    let program = program(Kind::Ask, None);
    let store = fresh();
    let engine = engine(store.clone(), &[&program]);
    let kept = engine
        .start(&program, request("kept", "still held?"))
        .await
        .expect("starts");
    let dropped = engine
        .start(&program, request("dropped", "still held?"))
        .await
        .expect("starts");
    open_wait(&kept).await;
    open_wait(&dropped).await;
    let trees = [kept.tree(), dropped.tree()];
    // No handle holds the second tree any more: a sleeping tree is then
    // dropped from memory, but its lease is still this engine's.
    drop(dropped);
    engine.close().await;
    for tree in trees {
        let taken = store
            .acquire(AcquireRequest {
                tree,
                owner: "another-host/1/engine-0".into(),
                now: SystemClock.now(),
                ttl: Duration::from_secs(30),
                force: false,
            })
            .await
            .expect("acquires");
        assert!(
            matches!(taken, Acquired::Granted { .. }),
            "closing left the lease of {tree} held: {taken:?}"
        );
    }
}

pub(super) async fn a_resent_answer_is_a_duplicate_even_after_it_ended_the_process(
    fresh: &Fresh<'_>,
) {
    let program = program(Kind::Ask, None);
    let store = fresh();
    let engine = engine(store.clone(), &[&program]);
    let handle = engine
        .start(&program, request("answered", "ship it?"))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    assert_eq!(
        handle.signal(answer("the-answer", wait, true)).await,
        Ok(SignalReceipt::Admitted)
    );
    handle.join().await.expect("joins");
    // The acknowledgement was lost; the host sends the same signal again.
    assert_eq!(
        handle.signal(answer("the-answer", wait, true)).await,
        Ok(SignalReceipt::Duplicate),
        "a resend to the same engine"
    );
    assert!(
        matches!(
            handle.signal(answer("the-answer", wait, false)).await,
            Err(SignalError::Conflict { .. })
        ),
        "the same id with other content is refused"
    );
    let tree = handle.tree();
    drop(handle);
    drop(engine);
    let restarted = crate::programs::engine(store, &[&program]);
    let handle = restarted
        .process::<Payload>(&scope(), tree)
        .await
        .expect("attached");
    assert_eq!(
        handle.signal(answer("the-answer", wait, true)).await,
        Ok(SignalReceipt::Duplicate),
        "a resend after a restart"
    );
    assert!(matches!(
        handle.signal(answer("other-id", wait, true)).await,
        Err(SignalError::Terminated { .. })
    ));
}

pub(super) async fn a_host_signal_with_a_reserved_id_is_refused(fresh: &Fresh<'_>) {
    let program = program(Kind::Ask, None);
    let engine = engine(fresh(), &[&program]);
    let handle = engine
        .start(&program, request("reserved", "q"))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    let forged = SignalRequest {
        id: SignalId::for_effect(baton_run::EffectId::new(handle.id(), 0, 0)),
        wait: Some(wait),
        payload: Payload::encode(&true).expect("encodes"),
    };
    for _ in 0..2 {
        match handle.signal(forged.clone()).await {
            Err(SignalError::Rejected(failure)) => {
                assert_eq!(failure.code(), "engine.signal.reserved");
            }
            other => panic!("a reserved id was admitted: {other:?}"),
        }
    }
    assert!(
        handle.inspect().await.expect("inspects").root().open_waits[0].id == wait,
        "the wait is still open"
    );
}
