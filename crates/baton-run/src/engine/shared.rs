//! What a tree's handles and its owner task share: the published outcome
//! (terminations, drains, a stop) with a way to wait for it to change, and
//! the door through which commands reach the owner task, or wake it when
//! the tree hibernates.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::digest::Digest;
use crate::failure::Termination;
use crate::ids::{ProcessId, Scope, TreeId};

use super::EngineInner;
use super::actor::Command;
use super::error::RuntimeError;
use super::lifecycle::{self, Sleeper};

/// What the host sees of a tree while its owner task runs.
#[derive(Clone, Debug, Default)]
pub(crate) struct TreeOutcome {
    /// Terminations committed so far, by process.
    pub(super) terminations: BTreeMap<ProcessId, Termination>,
    /// Processes whose whole subtree has terminated.
    pub(super) drained: BTreeSet<ProcessId>,
    pub(super) stopped: Option<RuntimeError>,
    pub(super) finished: bool,
    /// The writer is gone (the engine dropped its task).
    pub(super) abandoned: bool,
    /// Where the committed state stands, for hosts awaiting a condition.
    pub(super) reached: Reached,
}

/// Where a tree's committed state stands: what [`super::Condition`]s read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Reached {
    /// The committed head.
    pub(super) head_seq: u64,
    /// No live process is running: each waits for an answer or is parked.
    pub(super) quiescent: bool,
    /// Some live process has a wait open for an answer.
    pub(super) wait_open: bool,
}

/// A tree's published outcome and a way to wait for it to change: one lock
/// and one notifier per tree (a `watch` channel carries eight notifiers,
/// which a waiting tree would pay for in memory and every publish in time).
#[derive(Default)]
pub(crate) struct Published {
    outcome: Mutex<TreeOutcome>,
    changed: tokio::sync::Notify,
}

impl Published {
    /// A cell with `outcome` already in it.
    pub(crate) fn new(outcome: TreeOutcome) -> Arc<Published> {
        Arc::new(Published {
            outcome: Mutex::new(outcome),
            changed: tokio::sync::Notify::new(),
        })
    }

    /// Reads the outcome (a poisoned lock still holds the last outcome).
    pub(crate) fn read(&self) -> std::sync::MutexGuard<'_, TreeOutcome> {
        self.outcome
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits until `select` picks something from the outcome; `None` once
    /// the writer is gone without the outcome ever being picked.
    pub(super) async fn wait_for<T>(
        &self,
        select: impl Fn(&TreeOutcome) -> Option<T>,
    ) -> Option<T> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let outcome = self.read();
                if let Some(picked) = select(&outcome) {
                    return Some(picked);
                }
                if outcome.abandoned {
                    return None;
                }
            }
            changed.await;
        }
    }
}

/// The one writer of a tree's [`Published`] outcome. Dropping it without a
/// final outcome tells the waiters that none will come.
pub(crate) struct Publisher(Arc<Published>);

impl Publisher {
    pub(crate) fn new(published: Arc<Published>) -> Publisher {
        Publisher(published)
    }

    /// Changes the outcome and wakes every waiter.
    pub(crate) fn modify(&self, change: impl FnOnce(&mut TreeOutcome)) {
        change(&mut self.0.read());
        self.0.changed.notify_waiters();
    }

    pub(crate) fn read(&self) -> std::sync::MutexGuard<'_, TreeOutcome> {
        self.0.read()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.modify(|outcome| outcome.abandoned = true);
    }
}

pub(crate) struct TreeShared {
    pub(super) tree: TreeId,
    pub(super) scope: Scope,
    pub(super) program: Digest,
    /// Its root's input digest, or the input until the tree's first
    /// round is committed with the tree going on (see `InputDigest`).
    pub(super) input: Mutex<super::state::InputDigest>,
    /// How commands reach the tree's owner task.
    pub(super) door: Mutex<Door>,
    pub(super) outcome: Arc<Published>,
    /// The latest progress of its live processes (never logged).
    pub(super) progress: Arc<super::progress::Board>,
}

impl TreeShared {
    /// A sleeping tree's state, taken from its door (which then stays
    /// closed); `None`, with the door untouched, for a tree not asleep.
    pub(super) fn take_sleeper(&self) -> Option<Box<Sleeper>> {
        let mut door = self.door.lock().ok()?;
        match std::mem::replace(&mut *door, Door::Closed) {
            Door::Asleep(sleeper) => Some(sleeper),
            other => {
                *door = other;
                None
            }
        }
    }
}

impl TreeShared {
    /// The fencing token of a sleeping tree's lease; `None` for a tree not
    /// asleep.
    pub(super) fn sleeping_token(&self) -> Option<u64> {
        match &*self.door.lock().ok()? {
            Door::Asleep(sleeper) => Some(sleeper.token()),
            _ => None,
        }
    }
}

/// The way into a tree's owner task. An idle tree hibernates: its task ends
/// and its state waits here until a command wakes it.
pub(crate) enum Door {
    /// The owner task runs and reads this channel.
    Awake(mpsc::UnboundedSender<Box<Command>>),
    /// The tree waits for input with no task; a command respawns it.
    Asleep(Box<Sleeper>),
    /// No owner task will run again (finished, stopped or closed).
    Closed,
}

impl EngineInner {
    /// Delivers a command to a tree, waking it if it hibernates; hands the
    /// command back when no owner task will run again.
    pub(super) fn send(
        self: &Arc<Self>,
        shared: &Arc<TreeShared>,
        command: Box<Command>,
    ) -> Result<(), Box<Command>> {
        let Ok(mut door) = shared.door.lock() else {
            return Err(command);
        };
        if let Door::Asleep(_) = &*door {
            let Door::Asleep(sleeper) = std::mem::replace(&mut *door, Door::Closed) else {
                unreachable!("matched asleep just above")
            };
            if let Some(sender) = lifecycle::wake(self, shared, *sleeper) {
                *door = Door::Awake(sender);
            }
        }
        match &*door {
            Door::Awake(sender) => sender.send(command).map_err(|error| error.0),
            _ => Err(command),
        }
    }
}
