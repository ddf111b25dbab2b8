//! The user-code seam: a definition's `start`, `step`, `snapshot` and
//! `restore` and a dispatcher's `required_capabilities` are called here
//! behind `catch_unwind`, and a candidate state is snapshotted and restored
//! before it is adopted.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::budget::Dimension;
use crate::failure::{Failure, FailureKind, StepError};
use crate::ids::ProcessId;
use crate::log::{RecordBody, StateChange};
use crate::payload::Payload;
use crate::protocol::{Effect, Execution, ExecutionState, Program, Signal, Transition};

use super::super::state::{ProcessState, TreeState};
use super::fail;

/// Runs user code, turning a panic into a failure with `code`.
pub(in crate::engine) fn catch<T>(
    code: &str,
    f: impl FnOnce() -> Result<T, StepError>,
) -> Result<T, Failure> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(error.0),
        Err(panic) => Err(panic_failure(code, panic)),
    }
}

/// The failure kind and code of a panic caught at a user-code seam.
pub(in crate::engine) fn panic_failure(
    code: &str,
    panic: Box<dyn std::any::Any + Send>,
) -> Failure {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-string payload".to_owned());
    Failure::new(FailureKind::Panic, code, message)
}

/// Restores an execution from a recorded state.
pub(in crate::engine) fn restore(
    program: &Program,
    state: &ExecutionState,
) -> Result<Box<dyn Execution>, Failure> {
    catch("execution.restore.panicked", || {
        program.definition().restore(state)
    })
}

/// Why a new process could not be initialized.
pub(in crate::engine) enum InitError {
    /// Its program's `start` or `snapshot` failed (or panicked).
    Program(Failure),
    /// Its initial state does not restore.
    Unrestorable(Failure),
    /// Its initial state is larger than the tree allows.
    TooLarge { bytes: u64, limit: u64 },
}

/// Starts a new process's execution: `start`, then the snapshot of its
/// initial state, restored before it is adopted (the restored instance is
/// the one kept), within the tree's state limit.
pub(in crate::engine) fn initialize(
    program: &Program,
    input: &Payload,
    max_state_bytes: u64,
) -> Result<(ExecutionState, Box<dyn Execution>), InitError> {
    let execution = catch("execution.start.panicked", || {
        program.definition().start(input)
    })
    .map_err(InitError::Program)?;
    let state = catch("execution.snapshot.panicked", || execution.snapshot())
        .map_err(InitError::Program)?;
    let restored = restore(program, &state).map_err(InitError::Unrestorable)?;
    let bytes = state.0.len() as u64;
    if bytes > max_state_bytes {
        return Err(InitError::TooLarge {
            bytes,
            limit: max_state_bytes,
        });
    }
    Ok((state, restored))
}

/// What a step stages: its adoption (or the failure ending the process),
/// and the restored execution to keep while the process continues.
pub(in crate::engine) struct Stepped {
    pub record: RecordBody,
    pub keep: Option<Box<dyn Execution>>,
}

/// Steps process `id` over its window (its mailbox, laid out as one slice
/// by the caller), checks the transition, and snapshots and restores the
/// candidate state before it is adopted. `execution` is the process's
/// in-memory execution, if it kept one since its last step; otherwise it
/// is restored from the recorded state.
pub(in crate::engine) fn step(
    tree: &TreeState,
    id: ProcessId,
    program: &Program,
    execution: Option<Box<dyn Execution>>,
) -> Stepped {
    let process = &tree.processes[&id];
    let failed = |failure| Stepped {
        record: fail(process, id, failure),
        keep: None,
    };
    if !process.allows(&Dimension::Steps, 1) {
        return failed(Failure::execution(
            "engine.limit.steps",
            format!("step budget of {} exhausted", process.budget.steps),
        ));
    }
    let mut execution = match execution {
        Some(execution) => execution,
        None => match restore(program, &process.state) {
            Ok(execution) => execution,
            Err(failure) => {
                return failed(Failure::contract(
                    "engine.committed_execution_state.invalid",
                    format!("recorded state does not restore: {failure}"),
                ));
            }
        },
    };
    let step = process.steps;
    let window = process.mailbox.as_slices().0;
    let span = tracing::debug_span!("step", process = %id, step);
    let _entered = span.enter();
    let stepped = catch("execution.step.panicked", || execution.step(window));
    let transition = match stepped
        .and_then(|transition| check_transition(process, program, window, transition))
    {
        Ok(transition) => transition,
        Err(failure) => return failed(failure),
    };
    let adopted = catch("execution.snapshot.panicked", || execution.snapshot())
        .map_err(|failure| Failure::new(failure.kind, "execution.snapshot.failed", failure.message))
        .and_then(|state| {
            let restored = restore(program, &state).map_err(|failure| {
                Failure::contract(
                    "execution.snapshot.unrestorable",
                    format!("candidate state does not restore: {failure}"),
                )
            })?;
            Ok((state, restored))
        });
    let (state, restored) = match adopted {
        Ok(adopted) => adopted,
        Err(failure) => return failed(failure),
    };
    if state.0.len() as u64 > tree.limits.max_state_bytes {
        return failed(Failure::execution(
            "engine.limit.state",
            format!(
                "state of {} bytes exceeds the tree's limit of {}",
                state.0.len(),
                tree.limits.max_state_bytes
            ),
        ));
    }
    // A waiting process holds no execution in memory; it is restored from
    // its recorded state when woken.
    let keep = matches!(transition, Transition::Continue { .. }).then_some(restored);
    // A large state is recorded as its change when that is small.
    let (state, state_change) = match StateChange::between(&process.state, &state) {
        Some(change) => (None, Some(change)),
        None => (Some(state), None),
    };
    Stepped {
        record: RecordBody::StepAdopted {
            process: id,
            step,
            state,
            state_change,
            transition,
        },
        keep,
    }
}

/// Checks a transition before adoption: consumption, capabilities,
/// dispatchers, budgets, waits and the output schema.
pub(in crate::engine) fn check_transition(
    process: &ProcessState,
    program: &Program,
    window: &[Signal],
    transition: Transition,
) -> Result<Transition, Failure> {
    let consumed = transition.consumed();
    if consumed > window.len() {
        return Err(Failure::contract(
            "execution.transition.invalid",
            format!(
                "consumed {consumed} signals of a window of {}",
                window.len()
            ),
        ));
    }
    match &transition {
        Transition::Continue { effects, .. } => {
            for effect in effects {
                if let Effect::Dispatch { retry, .. } = effect
                    && let Some(problem) = retry.problem()
                {
                    return Err(Failure::contract("execution.effect.invalid", problem));
                }
                if let Effect::Dispatch { request, .. } = effect {
                    let Some(dispatcher) = program.dispatcher() else {
                        return Err(Failure::contract(
                            "execution.effect.invalid",
                            format!(
                                "{} declared a dispatch but has no dispatcher",
                                program.descriptor().name()
                            ),
                        ));
                    };
                    let required = catch_unwind(AssertUnwindSafe(|| {
                        dispatcher.required_capabilities(request)
                    }))
                    .map_err(|panic| panic_failure("engine.dispatch.panicked", panic))?;
                    let missing = required.missing_from(&process.capabilities);
                    if !missing.is_empty() {
                        let names: Vec<&str> = missing.iter().map(|n| n.as_str()).collect();
                        return Err(Failure::contract(
                            "engine.capability.denied",
                            format!(
                                "dispatch requires capabilities the process lacks: {}",
                                names.join(", ")
                            ),
                        ));
                    }
                }
            }
            let count = effects.len() as u64;
            if !process.allows(&Dimension::Effects, count) {
                return Err(Failure::execution(
                    "engine.limit.effects",
                    format!(
                        "{count} more effects exceed the effect budget of {}",
                        process.budget.effects
                    ),
                ));
            }
            if !process.allows(&Dimension::Signals, count) {
                return Err(Failure::execution(
                    "engine.limit.signals",
                    format!(
                        "{count} result signals exceed the signal budget of {}",
                        process.budget.signals
                    ),
                ));
            }
        }
        Transition::Wait { wait, .. } => {
            let answered = window[consumed..]
                .iter()
                .any(|signal| signal.wait == Some(*wait));
            if !process.waits.contains_key(wait) && !answered {
                return Err(Failure::contract(
                    "execution.transition.invalid",
                    format!(
                        "waits on {wait}, which is neither open nor answered in the unconsumed window"
                    ),
                ));
            }
        }
        Transition::Complete { output, .. } => program.descriptor().check_output(output)?,
        Transition::Fail { .. } => {}
    }
    Ok(transition)
}
