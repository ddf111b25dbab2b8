//! `definition_conformance`: the contract every `Definition` must keep.

use baton_run::Payload;
use baton_run::program::{Definition, Execution, ExecutionState, Signal, Transition};

/// One scripted run: an input and the window handed to each successive step.
#[derive(Clone, Debug)]
pub struct ConformanceCase {
    /// What the case exercises (shown in failures).
    pub name: String,
    /// The input given to `start`.
    pub input: Payload,
    /// The window of each step, in order; the run stops at a terminal
    /// transition or when windows run out.
    pub windows: Vec<Vec<Signal>>,
}

impl ConformanceCase {
    /// A case with a name, an input and step windows.
    pub fn new(
        name: impl Into<String>,
        input: Payload,
        windows: Vec<Vec<Signal>>,
    ) -> ConformanceCase {
        ConformanceCase {
            name: name.into(),
            input,
            windows,
        }
    }
}

fn snapshot(case: &str, step: usize, execution: &dyn Execution) -> ExecutionState {
    execution
        .snapshot()
        .unwrap_or_else(|error| panic!("case {case:?} step {step}: snapshot failed: {error}"))
}

fn restore(
    case: &str,
    step: usize,
    definition: &dyn Definition,
    state: &ExecutionState,
) -> Box<dyn Execution> {
    definition.restore(state).unwrap_or_else(|error| {
        panic!("case {case:?} step {step}: restore of a snapshot failed: {error}")
    })
}

/// Checks a definition against the kernel's contract, panicking with a
/// precise message at the first violation:
///
/// - the descriptor is byte-stable across calls and after execution;
/// - two independent starts on the same input produce identical
///   transitions and states at every step (determinism);
/// - snapshot → restore → snapshot is the identity before every step;
/// - an execution restored from the snapshot before a step produces the
///   same transition and state as the original (restore fidelity);
/// - a transition never consumes more signals than its window delivered;
/// - a start on an input the descriptor rejects is not required to fail,
///   but every case input must pass the input schema.
///
/// Returns the number of steps checked across all cases.
pub fn definition_conformance(definition: &dyn Definition, cases: &[ConformanceCase]) -> usize {
    let descriptor = serde_json::to_vec(definition.descriptor()).expect("descriptor encodes");
    let mut checked = 0;
    for case in cases {
        let name = case.name.as_str();
        if let Err(failure) = definition.descriptor().check_input(&case.input) {
            panic!("case {name:?}: its input fails the descriptor's own input schema: {failure}");
        }
        let mut first = definition
            .start(&case.input)
            .unwrap_or_else(|error| panic!("case {name:?}: start failed: {error}"));
        let mut second = definition
            .start(&case.input)
            .unwrap_or_else(|error| panic!("case {name:?}: second start failed: {error}"));
        for (step, window) in case.windows.iter().enumerate() {
            let before = snapshot(name, step, first.as_ref());
            assert_eq!(
                before,
                snapshot(name, step, second.as_ref()),
                "case {name:?} step {step}: two starts on the same input diverged"
            );
            let mut restored = restore(name, step, definition, &before);
            assert_eq!(
                before,
                snapshot(name, step, restored.as_ref()),
                "case {name:?} step {step}: snapshot -> restore -> snapshot is not the identity"
            );
            let a = first.step(window);
            let b = second.step(window);
            let c = restored.step(window);
            assert_eq!(
                a, b,
                "case {name:?} step {step}: two starts stepped differently"
            );
            assert_eq!(
                a, c,
                "case {name:?} step {step}: a restored execution stepped differently"
            );
            checked += 1;
            let Ok(transition) = a else { break };
            assert!(
                transition.consumed() <= window.len(),
                "case {name:?} step {step}: consumed {} of a window of {}",
                transition.consumed(),
                window.len()
            );
            if matches!(
                transition,
                Transition::Complete { .. } | Transition::Fail { .. }
            ) {
                break;
            }
            let after = snapshot(name, step + 1, first.as_ref());
            assert_eq!(
                after,
                snapshot(name, step + 1, second.as_ref()),
                "case {name:?} step {step}: states diverged after stepping"
            );
            assert_eq!(
                after,
                snapshot(name, step + 1, restored.as_ref()),
                "case {name:?} step {step}: a restored execution reached a different state"
            );
        }
    }
    assert_eq!(
        descriptor,
        serde_json::to_vec(definition.descriptor()).expect("descriptor encodes"),
        "the descriptor changed during execution"
    );
    checked
}
