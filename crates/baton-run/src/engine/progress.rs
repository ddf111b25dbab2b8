//! Progress: what a running process is doing now. A step reports it through
//! [`crate::program::Execution::progress`], a dispatch through
//! [`crate::dispatch::DeltaSink::progress`]; the engine stamps it with its
//! clock, keeps the latest per process on the tree's board (shown by views
//! of a tree this engine runs) and publishes it as a non-durable event.
//! Nothing of it enters the log.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::clock::Timestamp;
use crate::ids::ProcessId;
use crate::protocol::Progress;

use super::view::{LiveProgress, TreeView};

/// The latest progress of each live process of one tree.
#[derive(Debug, Default)]
pub(crate) struct Board(Mutex<BTreeMap<ProcessId, LiveProgress>>);

impl Board {
    /// A new, empty board to share.
    pub(crate) fn shared() -> Arc<Board> {
        Arc::new(Board::default())
    }

    /// Keeps `progress` as the process's latest, stamped `now`; the stamped
    /// progress when it differs from the one kept (`None`: nothing new).
    pub(crate) fn note(
        &self,
        process: ProcessId,
        progress: Progress,
        now: Timestamp,
    ) -> Option<LiveProgress> {
        let mut board = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if board
            .get(&process)
            .is_some_and(|kept| kept.progress == progress)
        {
            return None;
        }
        let stamped = LiveProgress { progress, at: now };
        board.insert(process, stamped.clone());
        Some(stamped)
    }

    /// Forgets a process that ended (its last progress no longer says what
    /// it does).
    pub(crate) fn forget(&self, process: ProcessId) {
        let mut board = self.0.lock().unwrap_or_else(|p| p.into_inner());
        board.remove(&process);
    }

    /// Shows each process's latest progress in `view`.
    pub(crate) fn overlay(&self, view: &mut TreeView) {
        let board = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if board.is_empty() {
            return;
        }
        for process in &mut view.processes {
            process.progress = board.get(&process.id).cloned();
        }
    }
}
