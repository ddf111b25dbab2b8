//! Paths of the kernel that only a misbehaving or over-budget program
//! reaches: the effect and signal budgets of a step, a dispatch needing a
//! capability its process lacks, a candidate state that does not restore,
//! and a host's replay of an unknown effect.

use std::sync::Arc;

use baton_run::dispatch::ReplayPolicy;
use baton_run::log::RecordKind;
use baton_run::program::{
    Definition, Descriptor, Execution, ExecutionState, ProgramConfig, Schema, Signal, StepError,
    Transition, configuration_digest, implementation_digest,
};
use baton_run::{
    Budget, Capabilities, MemoryStore, Name, Payload, Program, Quota, RecoverOptions, Scope,
    StartRequest, Status, Termination,
};
use baton_testkit::programs::{Kind, SCOPE, engine, program, request};
use baton_testkit::{Cut, FaultStore, ScriptedDispatcher};
use serde_json::{Value, json};

fn scope() -> Scope {
    Scope::new(SCOPE).expect("valid")
}

/// Runs a three-dispatch program under `budget` (with `dispatcher`) and
/// returns its termination.
async fn three_dispatches(budget: Budget, dispatcher: ScriptedDispatcher) -> Termination {
    let program = program(Kind::Dispatch, Some(Arc::new(dispatcher)));
    let engine = engine(Arc::new(MemoryStore::new()), &[&program]);
    let start = StartRequest {
        budget,
        ..request("three", json!(["a", "b", "c"]))
    };
    let handle = engine.start(&program, start).await.expect("starts");
    handle.await_result().await.expect("terminates")
}

fn code(termination: &Termination) -> &str {
    termination.failure().map(|f| f.code()).unwrap_or("none")
}

#[tokio::test]
async fn a_step_declaring_more_effects_than_its_budget_fails_with_engine_limit_effects() {
    let budget = Budget {
        effects: Quota::Finite(2),
        ..Budget::unlimited()
    };
    let termination = three_dispatches(budget, ScriptedDispatcher::echo(ReplayPolicy::Never)).await;
    assert_eq!(termination.status(), Status::Failed);
    assert_eq!(code(&termination), "engine.limit.effects");
}

#[tokio::test]
async fn a_step_whose_results_exceed_its_signal_budget_fails_with_engine_limit_signals() {
    let budget = Budget {
        signals: Quota::Finite(2),
        ..Budget::unlimited()
    };
    let termination = three_dispatches(budget, ScriptedDispatcher::echo(ReplayPolicy::Never)).await;
    assert_eq!(termination.status(), Status::Failed);
    assert_eq!(code(&termination), "engine.limit.signals");
}

#[tokio::test]
async fn a_dispatch_needing_a_capability_the_process_lacks_fails_it_with_capability_denied() {
    let required = Capabilities::of([Name::new("net.outbound").expect("valid")]);
    let dispatcher = ScriptedDispatcher::echo(ReplayPolicy::Never).requiring(required.clone());
    let termination = three_dispatches(Budget::unlimited(), dispatcher.clone()).await;
    assert_eq!(termination.status(), Status::Failed);
    assert_eq!(code(&termination), "engine.capability.denied");
    assert_eq!(dispatcher.total(), 0, "nothing was dispatched");

    // Granted the capability, the same program runs.
    let program = program(Kind::Dispatch, Some(Arc::new(dispatcher.clone())));
    let engine = engine(Arc::new(MemoryStore::new()), &[&program]);
    let start = StartRequest {
        capabilities: required,
        ..request("granted", json!(["a"]))
    };
    let handle = engine.start(&program, start).await.expect("starts");
    let termination = handle.await_result().await.expect("terminates");
    assert_eq!(termination.status(), Status::Completed);
    assert_eq!(dispatcher.total(), 1);
}

/// A program whose first step leaves a state its own `restore` refuses.
struct Unrestorable {
    descriptor: Descriptor,
}

struct UnrestorableRun {
    stepped: bool,
}

impl Definition for Unrestorable {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    fn start(&self, _input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(UnrestorableRun { stepped: false }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        match state.decode::<bool>()? {
            false => Ok(Box::new(UnrestorableRun { stepped: false })),
            true => Err(StepError::other("a stepped state is not restorable")),
        }
    }
}

impl Execution for UnrestorableRun {
    fn step(&mut self, _window: &[Signal]) -> Result<Transition, StepError> {
        self.stepped = true;
        Ok(Transition::Continue {
            consumed: 0,
            effects: Vec::new(),
        })
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.stepped)
    }
}

#[tokio::test]
async fn a_candidate_state_that_does_not_restore_fails_the_step_unadopted() {
    let descriptor = Descriptor::new(
        "test.unrestorable",
        "Steps into a state it cannot restore.",
        Schema::any(),
        Schema::any(),
    )
    .expect("valid");
    let program: Program<Value, Value> = Program::new(ProgramConfig {
        definition: Arc::new(Unrestorable { descriptor }),
        dispatcher: None,
        implementation: implementation_digest("limits", "1"),
        configuration: configuration_digest("unrestorable").expect("encodes"),
    });
    let store = MemoryStore::keeping_history();
    let engine = engine(Arc::new(store.clone()), &[&program]);
    let handle = engine
        .start(&program, request("unrestorable", json!(null)))
        .await
        .expect("the initial state restores");
    let termination = handle.await_result().await.expect("terminates");
    assert_eq!(code(&termination), "execution.snapshot.unrestorable");
    let adopted = store
        .records(handle.tree())
        .iter()
        .filter(|record| record.kind == RecordKind::StepAdopted)
        .count();
    assert_eq!(adopted, 0, "the step was not adopted");
}

#[tokio::test]
async fn a_host_replay_sends_an_unknown_effect_again_under_its_identity() {
    let dispatcher = ScriptedDispatcher::echo(ReplayPolicy::Never);
    let program = program(Kind::Dispatch, Some(Arc::new(dispatcher.clone())));
    let faulty = FaultStore::new(Arc::new(MemoryStore::new()));
    faulty.arm(RecordKind::EffectPending, Cut::After, 1);
    let first = engine(Arc::new(faulty.clone()), &[&program]);
    let handle = first
        .start(&program, request("replayed", json!(["once"])))
        .await
        .expect("starts");
    assert!(handle.await_result().await.is_err(), "the writer crashed");
    let tree = handle.tree();
    drop(handle);
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
    let handle = second
        .process::<Payload>(&scope(), tree)
        .await
        .expect("attached");
    let mut effect = None;
    for _ in 0..10_000 {
        let view = handle.inspect().await.expect("inspects");
        if let Some(unknown) = view.root().unknown_effects.first() {
            effect = Some(*unknown);
            break;
        }
        tokio::task::yield_now().await;
    }
    let effect = effect.expect("the pending Never effect became unknown");
    assert_eq!(dispatcher.total(), 0, "nothing was sent on its own");
    let refused = second
        .replay_unknown(&scope(), tree, baton_run::EffectId::new(tree, 9, 9))
        .await
        .expect_err("only an unknown effect is replayed");
    assert_eq!(refused.code(), "engine.effect.not_unknown");
    second
        .replay_unknown(&scope(), tree, effect)
        .await
        .expect("replays");
    let termination = handle.await_result().await.expect("terminates");
    assert_eq!(termination.status(), Status::Completed);
    assert_eq!(dispatcher.count(effect), 1, "sent once, under its own id");
}
