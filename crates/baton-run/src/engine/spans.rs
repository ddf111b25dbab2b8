//! The `tracing` spans of a tree's processes while its owner task runs.
//!
//! The owner task runs in an `info` span `tree`. Each process gets a `debug`
//! span `process` (its id and program name) under its parent's span, the
//! root's under the tree's; its steps (`step`) and its dispatches (`effect`)
//! are children of it, and so is whatever a dispatcher traces while it
//! works (a model call, a tool). A process span is created the first time
//! the process steps or dispatches in this task and closes when the process
//! ends or the task does (the tree finished, stopped or went to sleep; a
//! woken tree opens new spans). Exporters see the tree's structure as
//! parent links: tree → process → child process → step and effect.
//!
//! The spans cost nothing when no subscriber wants `debug` spans: a
//! disabled span is never stored, and creating one evaluates none of its
//! fields.

use std::collections::BTreeMap;

use tracing::Span;

use crate::ids::ProcessId;

use super::state::TreeState;

/// The open process spans of one tree's owner task.
#[derive(Default)]
pub(super) struct ProcessSpans {
    open: BTreeMap<ProcessId, Span>,
}

impl ProcessSpans {
    /// The span of process `id`, opened (with its ancestors') if it is not
    /// open yet; a disabled span when tracing does not want it.
    pub fn of(&mut self, state: &TreeState, id: ProcessId) -> Span {
        if !tracing::level_enabled!(tracing::Level::DEBUG) {
            return Span::none();
        }
        if let Some(span) = self.open.get(&id) {
            return span.clone();
        }
        let Some(process) = state.processes.get(&id) else {
            return Span::none();
        };
        let program = &process.program.name;
        // An ended parent's span is not opened again: its child (being
        // cancelled) hangs off the tree's span instead.
        let parent = process.parent.filter(|parent| {
            state
                .processes
                .get(parent)
                .is_some_and(|p| p.termination.is_none())
        });
        let span = match parent {
            // The root's span is a child of the tree's, the current span
            // while the owner task runs.
            None => tracing::debug_span!("process", process = %id, %program),
            Some(parent) => {
                let parent = self.of(state, parent);
                tracing::debug_span!(parent: within(&parent), "process", process = %id, %program)
            }
        };
        if !span.is_disabled() {
            self.open.insert(id, span.clone());
        }
        span
    }

    /// Closes the span of a process that ended (its children's spans keep
    /// it open until they close).
    pub fn end(&mut self, id: ProcessId) {
        self.open.remove(&id);
    }
}

/// The parent for a span under `span`: it, or the current span when it is
/// disabled, so a disabled level in between never cuts a trace in two.
pub(super) fn within(span: &Span) -> Option<tracing::Id> {
    span.id().or_else(|| Span::current().id())
}
