//! The strict JSON forms of [`Task`] and [`Control`]: what they decode
//! through (serde's `try_from`) and, for a control, encode through.
//!
//! A task's members must fit together (a refused start has neither a
//! process nor an outcome, and an outcome needs the process), and a control
//! carries exactly one of a signal and a cancel reason. The same task rules
//! are checked on borrowed text by `view`, through [`check_task`].

use baton_run::program::ChildSignal;
use baton_run::{ChildKey, Failure, ProcessId, Termination};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::CodecError;
use crate::wire::{Control, ControlAction, Task, TaskRequest};

/// The JSON form of a [`Task`], checked for consistency when decoded.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Task")]
pub(crate) struct TaskWire {
    /// What was requested.
    request: TaskRequest,
    /// The task's process, once admitted.
    #[serde(default, deserialize_with = "baton_run::program::deserialize_present")]
    process: Option<ProcessId>,
    /// How it ended (with the effects left unresolved in its subtree), once it drained.
    #[serde(default, deserialize_with = "baton_run::program::deserialize_present")]
    outcome: Option<Termination>,
    /// Why its start was refused.
    #[serde(default, deserialize_with = "baton_run::program::deserialize_present")]
    rejection: Option<Failure>,
}

/// The rules a task's members keep, whichever way it is read: a refused
/// start has neither a process nor an outcome, and an outcome needs the
/// task's process.
pub(super) fn check_task(
    key: &str,
    process: bool,
    outcome: bool,
    rejection: bool,
) -> Result<(), CodecError> {
    if rejection && (process || outcome) {
        return Err(CodecError::RefusedWithFacts { key: key.into() });
    }
    if outcome && !process {
        return Err(CodecError::OutcomeWithoutProcess { key: key.into() });
    }
    Ok(())
}

impl TryFrom<TaskWire> for Task {
    type Error = CodecError;

    fn try_from(wire: TaskWire) -> Result<Task, CodecError> {
        check_task(
            wire.request.key.as_str(),
            wire.process.is_some(),
            wire.outcome.is_some(),
            wire.rejection.is_some(),
        )?;
        Ok(Task {
            request: wire.request,
            process: wire.process,
            outcome: wire.outcome,
            rejection: wire.rejection,
        })
    }
}

/// The JSON form of a [`Control`]: `{"task", "signal"}` or
/// `{"task", "cancel_reason"}`.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ControlWire {
    task: ChildKey,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "baton_run::program::deserialize_present"
    )]
    signal: Option<ChildSignal>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "baton_run::program::deserialize_present"
    )]
    cancel_reason: Option<String>,
}

impl From<Control> for ControlWire {
    fn from(control: Control) -> ControlWire {
        let (signal, cancel_reason) = match control.action {
            ControlAction::Signal(signal) => (Some(signal), None),
            ControlAction::Cancel(reason) => (None, Some(reason)),
        };
        ControlWire {
            task: control.task,
            signal,
            cancel_reason,
        }
    }
}

impl TryFrom<ControlWire> for Control {
    type Error = CodecError;

    fn try_from(wire: ControlWire) -> Result<Control, CodecError> {
        let action = match (wire.signal, wire.cancel_reason) {
            (Some(signal), None) => ControlAction::Signal(signal),
            (None, Some(reason)) => ControlAction::Cancel(reason),
            _ => return Err(CodecError::ControlAction { task: wire.task }),
        };
        Ok(Control {
            task: wire.task,
            action,
        })
    }
}
