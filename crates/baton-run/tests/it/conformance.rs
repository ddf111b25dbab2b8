//! The test programs pass the definition conformance suite, and the suite
//! catches a nondeterministic definition.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use baton_run::program::{
    Definition, Descriptor, Execution, ExecutionState, Schema, Signal, SignalBody, StepError,
    Transition,
};
use baton_run::{ChildKey, EffectId, Payload, ProcessId, Settlement, SignalId, WaitId};
use baton_testkit::programs::{Kind, program, start_id};
use baton_testkit::{ConformanceCase, definition_conformance};
use serde_json::json;

fn settled(effect: EffectId, value: &str) -> Signal {
    Signal {
        id: SignalId::for_effect(effect),
        wait: None,
        body: SignalBody::Settled {
            effect,
            settlement: Settlement::ok(Payload::encode(&value).expect("encodes")),
        },
    }
}

#[test]
fn test_programs_conform() {
    let root = ProcessId::root(&start_id("conformance"));
    let (a, b) = (EffectId::new(root, 0, 0), EffectId::new(root, 0, 1));
    let dispatch = program(Kind::Dispatch, None);
    let steps = definition_conformance(
        dispatch.definition().as_ref(),
        &[ConformanceCase::new(
            "two dispatches",
            Payload::encode(&json!(["x", "y"])).expect("encodes"),
            vec![vec![], vec![settled(a, "x"), settled(b, "y")]],
        )],
    );
    assert_eq!(steps, 2);

    let ask = program(Kind::Ask, None);
    let wait = WaitId::for_effect(a);
    let opened = Signal {
        id: SignalId::for_effect(a),
        wait: None,
        body: SignalBody::WaitOpened {
            effect: a,
            wait,
            key: ChildKey::new("approval").expect("valid"),
            request: Payload::encode(&"q").expect("encodes"),
        },
    };
    let answer = Signal {
        id: SignalId::new("answer").expect("valid"),
        wait: Some(wait),
        body: SignalBody::Input {
            payload: Payload::encode(&true).expect("encodes"),
        },
    };
    let steps = definition_conformance(
        ask.definition().as_ref(),
        &[
            ConformanceCase::new(
                "answered later",
                Payload::encode(&"q").expect("encodes"),
                vec![vec![], vec![opened.clone()], vec![answer.clone()]],
            ),
            ConformanceCase::new(
                "answered early",
                Payload::encode(&"q").expect("encodes"),
                vec![vec![], vec![opened, answer]],
            ),
        ],
    );
    assert_eq!(steps, 5);
}

/// A definition whose steps depend on a global counter: not deterministic.
struct Flaky(Descriptor);
struct FlakyRun;
static COUNTER: AtomicU64 = AtomicU64::new(0);

impl Definition for Flaky {
    fn descriptor(&self) -> &Descriptor {
        &self.0
    }
    fn start(&self, _: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(FlakyRun))
    }
    fn restore(&self, _: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(FlakyRun))
    }
}

impl Execution for FlakyRun {
    fn step(&mut self, _: &[Signal]) -> Result<Transition, StepError> {
        Ok(Transition::Complete {
            consumed: 0,
            output: Payload::encode(&COUNTER.fetch_add(1, Ordering::SeqCst)).expect("encodes"),
        })
    }
    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        Ok(ExecutionState(Payload::null()))
    }
}

#[test]
#[should_panic(expected = "two starts stepped differently")]
fn the_suite_catches_a_nondeterministic_definition() {
    let flaky = Flaky(
        Descriptor::new(
            "test.flaky",
            "Not deterministic.",
            Schema::any(),
            Schema::any(),
        )
        .expect("valid"),
    );
    let definition: Arc<dyn Definition> = Arc::new(flaky);
    definition_conformance(
        definition.as_ref(),
        &[ConformanceCase::new("once", Payload::null(), vec![vec![]])],
    );
}
