//! Projections of committed state: inspection views, captures and events.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::budget::{Budget, Usage};
use crate::clock::Timestamp;
use crate::digest::Digest;
use crate::failure::{Status, Termination};
use crate::ids::{ChildKey, EffectId, Name, ProcessId, Scope, TreeId, WaitId};
use crate::labels::Labels;
use crate::log::RecordBody;
use crate::payload::Payload;
use crate::protocol::{Effect, ProgramVersion, Settlement, Transition};
use crate::storage::TreeStatus;

use super::state::{Phase, ProcessState, TreeState};

/// Which payloads a view shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Visibility {
    /// Statuses, budgets, effects and waits, without their requests (which
    /// may carry private data such as prompts or credentials).
    #[default]
    Public,
    /// Everything, effect and wait requests included.
    Private,
}

/// A tree as seen by an operator: statuses, budgets, effects and waits,
/// without private payloads unless asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeView {
    /// The tree (its root process).
    pub tree: TreeId,
    /// Its scope.
    pub scope: Scope,
    /// Its listing status.
    pub status: TreeStatus,
    /// The root's program and the exact version the tree runs (it keeps
    /// the version it started with).
    pub program: ProgramVersion,
    /// The labels it was started with.
    #[serde(default)]
    pub labels: Labels,
    /// When it was started (engine clock), when its start recorded it.
    #[serde(default)]
    pub created: Option<Timestamp>,
    /// The committed head sequence.
    pub head_seq: u64,
    /// The committed head hash.
    pub head: Digest,
    /// Every process, root first.
    pub processes: Vec<ProcessView>,
}

/// One process in a [`TreeView`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessView {
    /// The process.
    pub id: ProcessId,
    /// Its key under its parent (none for the root).
    pub key: Option<ChildKey>,
    /// Its parent (none for the root).
    pub parent: Option<ProcessId>,
    /// Its depth (the root is 0).
    pub depth: u32,
    /// Its children by key.
    pub children: BTreeMap<ChildKey, ProcessId>,
    /// Budget granted to its children (debited for good).
    pub granted: Usage,
    /// Its program's descriptor name.
    pub program: Name,
    /// Its status (`Parked` shows as needs_attention).
    pub status: Status,
    /// Its budget.
    pub budget: Budget,
    /// What it used.
    pub usage: Usage,
    /// Effects of the current transition that are not settled.
    pub effects: Vec<EffectView>,
    /// Effects whose outcome is unknown (the host must resolve them).
    pub unknown_effects: Vec<EffectId>,
    /// External waits open for an answer.
    pub open_waits: Vec<WaitView>,
    /// The wait it sleeps on, if waiting.
    pub waiting_on: Option<WaitId>,
    /// Unconsumed mailbox entries.
    pub mailbox: usize,
    /// How it ended, once terminal.
    pub termination: Option<Termination>,
    /// What it is doing now, as last reported ([`crate::Progress`]): only
    /// in the view of a tree this engine runs (progress is never logged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<LiveProgress>,
}

/// A process's latest progress, stamped when the engine received it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LiveProgress {
    /// The progress.
    #[serde(flatten)]
    pub progress: crate::protocol::Progress,
    /// When it was reported (engine clock).
    pub at: Timestamp,
}

/// How a process ended and what it used, carried by a
/// [`EventKind::Terminated`] event when someone listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    /// Its termination (status, output or failure).
    pub termination: Termination,
    /// What the process itself used (its children's use is theirs).
    pub usage: Usage,
}

/// An effect in a [`ProcessView`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectView {
    /// The effect.
    pub id: EffectId,
    /// `dispatch` or `wait`.
    pub kind: String,
    /// `planned`, `pending`, `backoff`, `unknown` or `settled`.
    pub phase: String,
    /// Attempts of a dispatch that failed and were (or are to be) tried
    /// again under its retry policy.
    #[serde(default)]
    pub failed_attempts: u32,
    /// When a backing-off dispatch is tried again (engine clock).
    #[serde(default)]
    pub retry_at: Option<crate::clock::Timestamp>,
    /// The request, only when private payloads were asked for.
    pub request: Option<Payload>,
}

/// An open wait in a [`ProcessView`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitView {
    /// Answer by addressing a signal to this id.
    pub id: WaitId,
    /// The wait's key.
    pub key: ChildKey,
    /// The request, only when private payloads were asked for.
    pub request: Option<Payload>,
    /// The schema answers must satisfy.
    pub answer_schema: Payload,
}

impl TreeView {
    pub(crate) fn of(
        state: &TreeState,
        head_seq: u64,
        head: Digest,
        visibility: Visibility,
    ) -> TreeView {
        let private = visibility == Visibility::Private;
        let mut processes: Vec<ProcessView> = state
            .processes
            .iter()
            .map(|(id, process)| ProcessView::of(*id, process, private))
            .collect();
        processes.sort_by_key(|view| (view.depth, view.id));
        TreeView {
            tree: state.root,
            scope: state.start.scope.clone(),
            status: state.tree_status(),
            program: ProgramVersion {
                name: state.processes[&state.root].program.name.clone(),
                digest: state.processes[&state.root].program.digest,
            },
            labels: state.labels.clone(),
            created: state.created,
            head_seq,
            head,
            processes,
        }
    }

    /// The root's view.
    pub fn root(&self) -> &ProcessView {
        &self.processes[0]
    }

    /// A process's view.
    pub fn process(&self, id: ProcessId) -> Option<&ProcessView> {
        self.processes.iter().find(|view| view.id == id)
    }

    /// The budget a process has left in one dimension (`None`: unlimited).
    pub fn remaining(view: &ProcessView, dimension: &crate::budget::Dimension) -> Option<u64> {
        view.budget.quota(dimension).remaining(
            view.usage
                .used(dimension)
                .saturating_add(view.granted.used(dimension)),
        )
    }
}

impl ProcessView {
    fn of(id: ProcessId, process: &ProcessState, private: bool) -> ProcessView {
        let effects = process
            .batch
            .iter()
            .filter(|slot| !matches!(&slot.phase, Phase::Settled(s) if !s.is_unknown()))
            .map(|slot| EffectView {
                id: slot.id,
                kind: slot.effect.kind().to_owned(),
                phase: match &slot.phase {
                    Phase::Planned => "planned",
                    Phase::Pending => "pending",
                    Phase::Backoff { .. } => "backoff",
                    Phase::Settled(Settlement::Unknown { .. }) => "unknown",
                    Phase::Settled(_) => "settled",
                }
                .to_owned(),
                failed_attempts: slot.failed_attempts,
                retry_at: match &slot.phase {
                    Phase::Backoff { at } => Some(*at),
                    _ => None,
                },
                request: match (&slot.effect, private) {
                    (Effect::Dispatch { request, .. } | Effect::Wait { request, .. }, true) => {
                        Some(request.clone())
                    }
                    _ => None,
                },
            })
            .collect();
        let unknown_effects = process
            .batch
            .iter()
            .filter(|slot| matches!(&slot.phase, Phase::Settled(s) if s.is_unknown()))
            .map(|slot| slot.id)
            .collect();
        ProcessView {
            id,
            key: process.key.clone(),
            parent: process.parent,
            depth: process.depth,
            children: process.children.clone(),
            granted: process.granted.clone(),
            program: process.program.name.clone(),
            status: process.status,
            budget: process.budget.clone(),
            usage: process.usage.clone(),
            effects,
            unknown_effects,
            open_waits: process
                .waits
                .iter()
                .map(|(wait, open)| WaitView {
                    id: *wait,
                    key: open.key.clone(),
                    request: private.then(|| open.request.clone()),
                    answer_schema: open.answer_schema.json().clone(),
                })
                .collect(),
            waiting_on: process.waiting,
            mailbox: process.mailbox.len(),
            termination: process.termination.clone(),
            progress: None,
        }
    }
}

/// The full committed state of a tree, for export and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeCapture {
    /// The committed head sequence.
    pub head_seq: u64,
    /// The committed head hash.
    pub head: Digest,
    /// The whole tree state as canonical JSON.
    pub state: Payload,
}

/// Something that happened in a tree: a committed fact, or non-durable
/// progress (deltas never enter the log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The tree.
    pub tree: TreeId,
    /// The process it concerns.
    pub process: ProcessId,
    /// The process's path of child keys from the root (empty for the root).
    pub path: Vec<ChildKey>,
    /// The process's program, when the event concerns one.
    pub program: Option<crate::ids::Name>,
    /// What happened.
    pub kind: EventKind,
}

/// What an [`Event`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventKind {
    /// A root process started (committed at `seq`).
    ProcessStarted {
        /// Log sequence.
        seq: u64,
    },
    /// A step was adopted.
    StepAdopted {
        /// Log sequence.
        seq: u64,
        /// The step's number.
        step: u64,
        /// `continue`, `wait`, `complete` or `fail`.
        transition: &'static str,
    },
    /// A dispatch became pending (durably, before I/O).
    EffectPending {
        /// Log sequence.
        seq: u64,
        /// The effect.
        effect: EffectId,
    },
    /// An effect settled.
    EffectSettled {
        /// Log sequence.
        seq: u64,
        /// The effect.
        effect: EffectId,
        /// Whether the outcome is unknown.
        unknown: bool,
    },
    /// The host resolved or replayed an unknown effect.
    EffectResolved {
        /// Log sequence.
        seq: u64,
        /// The effect.
        effect: EffectId,
    },
    /// An attempt of a dispatch failed; it is tried again at `at`.
    EffectRetrying {
        /// Log sequence.
        seq: u64,
        /// The effect.
        effect: EffectId,
        /// The failed attempt's failure code.
        code: String,
        /// When the next attempt starts (engine clock).
        at: crate::clock::Timestamp,
    },
    /// Signals were admitted.
    SignalsAdmitted {
        /// Log sequence.
        seq: u64,
        /// How many.
        count: usize,
    },
    /// Cancellation was requested.
    CancelRequested {
        /// Log sequence.
        seq: u64,
    },
    /// The process terminated.
    Terminated {
        /// Log sequence.
        seq: u64,
        /// Its terminal status.
        status: Status,
        /// How it ended and what it used (filled in by the engine when
        /// someone listens).
        ended: Option<std::sync::Arc<Ended>>,
    },
    /// A child was published with its parent's receipt; the event concerns the child.
    ChildStarted {
        /// Log sequence.
        seq: u64,
        /// The parent.
        parent: ProcessId,
    },
    /// A control (signal or cancel) reached the process from its parent.
    ControlDelivered {
        /// Log sequence.
        seq: u64,
        /// `signal` or `cancel`.
        control: &'static str,
    },
    /// The process and its whole subtree have terminated.
    Drained {
        /// The process's terminal status.
        status: Status,
    },
    /// Non-durable progress from a dispatch (e.g. model tokens).
    Delta {
        /// The effect.
        effect: EffectId,
        /// The delta.
        delta: Payload,
    },
    /// Non-durable: what a process is doing now (a step's or a
    /// dispatch's [`crate::Progress`]).
    Progress {
        /// The progress, stamped.
        progress: LiveProgress,
    },
    /// Non-durable: nothing was committed since `since` while the tree was
    /// not waiting on a person (the engine's idle alarm; not a failure).
    Idle {
        /// The last commit (engine clock).
        since: Timestamp,
    },
    /// The tree's writer stopped without a result (storage failure or fencing).
    Stopped {
        /// Why.
        reason: String,
    },
    /// The writer could not renew its lease this time; it tries again
    /// soon, and stops once the lease has run out unrenewed.
    LeaseRenewalFailed {
        /// Why.
        reason: String,
        /// When the lease runs out unless renewed.
        until: crate::clock::Timestamp,
    },
}

impl EventKind {
    pub(crate) fn of(seq: u64, body: &RecordBody) -> (ProcessId, EventKind) {
        match body {
            RecordBody::TreeStarted { root, .. } => (*root, EventKind::ProcessStarted { seq }),
            RecordBody::StepAdopted {
                process,
                step,
                transition,
                ..
            } => (
                *process,
                EventKind::StepAdopted {
                    seq,
                    step: *step,
                    transition: match transition {
                        Transition::Continue { .. } => "continue",
                        Transition::Wait { .. } => "wait",
                        Transition::Complete { .. } => "complete",
                        Transition::Fail { .. } => "fail",
                    },
                },
            ),
            RecordBody::EffectPending { process, effect } => (
                *process,
                EventKind::EffectPending {
                    seq,
                    effect: *effect,
                },
            ),
            RecordBody::EffectRetrying {
                process,
                effect,
                failure,
                at,
                ..
            } => (
                *process,
                EventKind::EffectRetrying {
                    seq,
                    effect: *effect,
                    code: failure.code().to_owned(),
                    at: *at,
                },
            ),
            RecordBody::EffectSettled {
                process,
                effect,
                settlement,
            } => (
                *process,
                EventKind::EffectSettled {
                    seq,
                    effect: *effect,
                    unknown: settlement.is_unknown(),
                },
            ),
            // Watchers see a wait settled either way it is recorded.
            RecordBody::ChildrenReady { process, effect } => (
                *process,
                EventKind::EffectSettled {
                    seq,
                    effect: *effect,
                    unknown: false,
                },
            ),
            RecordBody::EffectResolved {
                process, effect, ..
            }
            | RecordBody::EffectReplayed { process, effect } => (
                *process,
                EventKind::EffectResolved {
                    seq,
                    effect: *effect,
                },
            ),
            RecordBody::SignalsAdmitted { process, signals } => (
                *process,
                EventKind::SignalsAdmitted {
                    seq,
                    count: signals.len(),
                },
            ),
            RecordBody::CancelRequested { process, .. } => {
                (*process, EventKind::CancelRequested { seq })
            }
            RecordBody::ChildStarted { parent, child, .. } => (
                *child,
                EventKind::ChildStarted {
                    seq,
                    parent: *parent,
                },
            ),
            RecordBody::ControlDelivered {
                child, delivery, ..
            } => (
                *child,
                EventKind::ControlDelivered {
                    seq,
                    control: match delivery {
                        crate::log::Delivery::Signal { .. } => "signal",
                        crate::log::Delivery::Cancel { .. } => "cancel",
                    },
                },
            ),
            RecordBody::Terminated {
                process,
                termination,
            } => (
                *process,
                EventKind::Terminated {
                    seq,
                    status: termination.status(),
                    ended: None,
                },
            ),
        }
    }
}
