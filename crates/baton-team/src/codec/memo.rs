//! Restore by difference: the tasks of a few recently restored states.
//!
//! The kernel restores every candidate state, and consecutive states of a
//! team differ only in a few tasks and the turn: the settled tasks at the
//! front of the task list are byte for byte those of the state restored
//! before. Restore compares the new text with the texts kept here (a
//! memcmp, far cheaper than parsing), reuses what it read of the tasks
//! that lie wholly in the longest common prefix, and reads only the rest
//! (see `record::decode_after`).
//!
//! The memo is only a cache: the record restored, and whether a state is
//! accepted, never depend on what it holds. It is shared by every run of
//! one team (concurrent runs included), holds at most [`Memo::ENTRIES`]
//! states, and its lock is held only to copy or replace entries, never
//! while parsing or comparing.

use std::ops::Range;
use std::sync::Arc;

use baton_run::program::common_prefix;
use baton_run::{Payload, ProcessId};

use super::recent::Recent;

/// What restore read of one task: its payload, and spans of the state's
/// text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    /// The task's canonical JSON, made once and shared by every record
    /// restored with the task unchanged.
    pub payload: Payload,
    /// The task's JSON.
    pub span: Range<usize>,
    /// Its request's key.
    pub key: Range<usize>,
    /// Its request's worker.
    pub worker: Range<usize>,
    pub process: Option<ProcessId>,
    /// Whether a step may still change it (awaiting admission or running).
    pub live: bool,
}

/// A restored (accepted) state and what restore read of its tasks.
#[derive(Debug)]
pub(crate) struct Restored {
    pub source: Payload,
    /// Every task, in request order.
    pub tasks: Box<[Seen]>,
}

impl Restored {
    pub fn new(source: &Payload, tasks: Vec<Seen>) -> Restored {
        Restored {
            source: source.clone(),
            tasks: tasks.into_boxed_slice(),
        }
    }
}

/// The most recently restored states of one team, newest first.
#[derive(Debug, Default)]
pub(crate) struct Memo {
    recent: Recent<Restored>,
}

impl Memo {
    /// How many states are kept: enough for a few runs of the team at once.
    pub const ENTRIES: usize = 4;

    /// The kept state sharing the longest prefix with `text` (the newest
    /// on a tie), and the length of that prefix; none when no kept state
    /// shares a byte with it.
    pub fn nearest(&self, text: &str) -> Option<(Arc<Restored>, usize)> {
        let mut best: Option<(Arc<Restored>, usize)> = None;
        for entry in self.recent.entries() {
            let common = common_prefix(entry.source.as_bytes(), text.as_bytes());
            if common > best.as_ref().map_or(0, |(_, length)| *length) {
                best = Some((entry, common));
            }
        }
        best
    }

    /// Keeps `restored` as the newest entry, dropping the oldest beyond
    /// [`Memo::ENTRIES`]. A state without tasks has nothing to reuse and is
    /// not kept.
    pub fn insert(&self, restored: Restored) {
        if restored.tasks.is_empty() {
            return;
        }
        self.recent.keep(Arc::new(restored), Self::ENTRIES);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.recent.len()
    }
}
