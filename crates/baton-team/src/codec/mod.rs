//! The team's text: how its recorded state, its turns and its tasks are
//! written and read, and the two caches that make reading them cheap.
//!
//! Everything here is about JSON, not about the team's rules. The rules a
//! recorded state must keep live in `state` and the rules of a decision in
//! `team`; this module reads the facts those rules are checked over and
//! writes the facts they produce, and restore calls the state's rules once
//! a state is read.
//!
//! - `tasks`: the task list as a team keeps it between steps, each task's
//!   canonical JSON beside what steps need of it, and the in-place writing
//!   of a recorded fact into that JSON.
//! - `record`: the recorded state's canonical JSON, written from canonical
//!   parts and read strictly, by difference from a recently restored state
//!   when one shares a prefix with it.
//! - `turn`: the coordinator's `Turn`, written from canonical parts.
//! - `forms`: the strict JSON forms `Task` and `Control` decode through.
//! - `view`: a borrowed view that checks a settled task without building it.
//! - `memo` and `turn_memo` (with their storage, `recent`): the restore
//!   memo and the policy's turn memo. Each is only a cache: what is read,
//!   and whether it is accepted, never depends on what it holds, and
//!   deleting either would change the cost of a step, never its result.
//!
//! Every failure is a [`CodecError`]. A caller that surfaces one as a
//! failure of the team keeps its message as it is (its `Display`), so the
//! messages users see are those of the underlying encoder, decoder or rule.

mod forms;
pub(crate) mod memo;
mod recent;
pub(crate) mod record;
mod tasks;
pub(crate) mod turn;
mod turn_memo;
mod view;

use std::ops::Range;

use baton_run::program::WriteError;
use baton_run::{ChildKey, PayloadError};

pub(crate) use forms::{ControlWire, TaskWire};
pub(crate) use memo::Memo;
pub(crate) use tasks::Tasks;
pub(crate) use turn_memo::TurnMemo;

/// Where `inner`, a slice of `outer`, lies in it (serde_json hands out
/// borrowed strings and raw values as slices of the text it reads); none
/// when it does not lie within it.
pub(crate) fn span_in(outer: &str, inner: &str) -> Option<Range<usize>> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    (start <= outer.len() && inner.len() <= outer.len() - start)
        .then_some(start..start + inner.len())
}

/// Why the team's text could not be written or read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CodecError {
    /// The text is not JSON of the expected shape (serde's report, which
    /// names the field and the position).
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A payload could not be encoded, parsed or finished (for example, it
    /// exceeds the size limit).
    #[error(transparent)]
    Payload(#[from] PayloadError),
    /// The canonical writer refused a part; canonical parts written in key
    /// order never meet this.
    #[error("cannot write the canonical JSON: {0}")]
    Write(#[from] WriteError),
    /// A task's key is not a valid child key.
    #[error("invalid child key {key:?}")]
    ChildKey {
        /// The key as written.
        key: String,
    },
    /// A task whose start was refused also has a process or an outcome.
    #[error("task {key}: a refused start has neither a process nor an outcome")]
    RefusedWithFacts {
        /// The task's key.
        key: String,
    },
    /// A task has an outcome but no process.
    #[error("task {key}: an outcome needs the task's process")]
    OutcomeWithoutProcess {
        /// The task's key.
        key: String,
    },
    /// A task's outcome is not a termination the kernel produces (its
    /// status, cause, output and failure do not fit together).
    #[error("{reason}")]
    Outcome {
        /// The kernel's rule that is broken.
        reason: String,
    },
    /// A control carries neither or both of a signal and a cancel reason.
    #[error("control of task {task}: exactly one of signal and cancel_reason")]
    ControlAction {
        /// The task the control targets.
        task: ChildKey,
    },
    /// A recorded state writes an empty task list (the encoding omits it).
    #[error("tasks: an empty list is omitted, not written")]
    EmptyTasks,
    /// A fact about a task that its recorded state cannot take: a start
    /// result for a task that is not awaiting admission, or an outcome for
    /// one that is not running. Its member would already be in the task's
    /// text.
    #[error("task {key}: a fact that does not follow its state")]
    FactOutOfOrder {
        /// The task's key.
        key: ChildKey,
    },
}
