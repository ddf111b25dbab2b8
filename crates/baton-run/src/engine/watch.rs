//! [`Watch`]: one tree's event stream. Committed facts come from the log,
//! so none is ever lost and a reader can start from any sequence number —
//! after a reconnect, or after the tree finished — interleaved with the
//! live non-durable events (deltas, a writer's trouble) of the engine that
//! runs the tree, marked as such.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::budget::Usage;
use crate::clock::Timestamp;
use crate::failure::{Failure, Status};
use crate::ids::{ChildKey, EffectId, Name, ProcessId, Scope, TreeId};
use crate::log::RecordBody;
use crate::payload::Payload;
use crate::protocol::{ProgramRole, Transition};

use crate::storage::{Change, Changes};

use super::EngineInner;
use super::error::TreeError;
use super::state::TreeState;
use super::state::replay;
use super::view::{Event, EventKind, LiveProgress};

/// How often a watch reads the store again for a tree no writer in this
/// engine runs (another process may be writing it), when the store sends
/// no change notices; with notices, it reads again on each notice.
const STORE_RECHECK: Duration = Duration::from_secs(1);

/// One event of a tree's stream ([`super::Engine::watch`]). Its JSON shape
/// is stable: `seq` (the log sequence of a committed fact, absent for a
/// non-durable event), `durable`, `tree`, `process`, `path` (child keys
/// from the root), `program` (the process's program name), `kind` and the
/// kind's `data`; `role` when the program is an agent or a tool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WatchEvent {
    /// The log sequence of a committed fact; `None` for a non-durable event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Whether the event is a committed fact (it will be seen again by any
    /// reader from the same sequence) or a live, non-durable one.
    pub durable: bool,
    /// The tree.
    pub tree: TreeId,
    /// The process it concerns, when one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessId>,
    /// The process's path of child keys from the root (empty for the root).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<ChildKey>,
    /// The process's program name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<Name>,
    /// What the process's program is to people watching (left out for a
    /// plain program): agents and tools are what an agent stream shows.
    #[serde(default, skip_serializing_if = "ProgramRole::is_program")]
    pub role: ProgramRole,
    /// What happened.
    #[serde(flatten)]
    pub kind: WatchKind,
}

/// What a [`WatchEvent`] reports (`kind`, with its fields under `data`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", content = "data", rename_all = "snake_case")]
#[non_exhaustive]
pub enum WatchKind {
    /// The tree's root started.
    ProcessStarted,
    /// A child process started; `parent` started it.
    ChildStarted {
        /// The parent.
        parent: ProcessId,
    },
    /// A step was adopted (a step that ends its process is reported as
    /// `terminated`).
    StepAdopted {
        /// The step's number.
        step: u64,
        /// `continue` or `wait`.
        transition: String,
    },
    /// A dispatch became pending (durably, before any I/O).
    EffectPending {
        /// The effect.
        effect: EffectId,
    },
    /// An attempt of a dispatch failed; it is tried again at `at`.
    EffectRetrying {
        /// The effect.
        effect: EffectId,
        /// The failed attempt's failure code.
        code: String,
        /// When the next attempt starts (engine clock, ms since the epoch).
        at: Timestamp,
    },
    /// An effect settled.
    EffectSettled {
        /// The effect.
        effect: EffectId,
        /// Whether its outcome is unknown (the process is parked).
        unknown: bool,
    },
    /// The host resolved or replayed an unknown effect.
    EffectResolved {
        /// The effect.
        effect: EffectId,
    },
    /// Signals were admitted.
    SignalsAdmitted {
        /// How many.
        count: usize,
    },
    /// Cancellation was requested.
    CancelRequested,
    /// A control (signal or cancel) reached the process from its parent.
    ControlDelivered {
        /// `signal` or `cancel`.
        control: String,
    },
    /// The process terminated (by its last step, or by the engine).
    Terminated {
        /// Its terminal status.
        status: Status,
        /// Its output, when it completed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<Payload>,
        /// Its failure, when it failed or was canceled.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failure: Option<Failure>,
        /// What the process itself used (each child reports its own).
        usage: Usage,
    },
    /// Non-durable: what the process is doing now.
    Progress {
        /// The progress and when it was reported.
        #[serde(flatten)]
        progress: LiveProgress,
    },
    /// Non-durable: the tree committed nothing since `since` while not
    /// waiting on a person (the engine's idle alarm; not a failure).
    Idle {
        /// The last commit (engine clock).
        since: Timestamp,
    },
    /// Non-durable: progress of a dispatch (e.g. model tokens).
    Delta {
        /// The effect.
        effect: EffectId,
        /// The delta.
        delta: Payload,
    },
    /// Non-durable: the tree's writer in this engine stopped without a
    /// result (storage failure or fencing); another writer may go on.
    Stopped {
        /// Why.
        reason: String,
    },
    /// Non-durable: the writer could not renew its lease this time.
    LeaseRenewalFailed {
        /// Why.
        reason: String,
        /// When the lease runs out unless renewed.
        until: Timestamp,
    },
    /// Non-durable: the reader fell behind and this many live events were
    /// dropped for it. Committed facts are never among the lost: they are
    /// read again from the log.
    Lagged {
        /// How many live events were dropped.
        lost: u64,
    },
    /// The store no longer keeps the records before `first_kept` (they
    /// were compacted into a snapshot); the stream goes on from there.
    Truncated {
        /// The first record still kept.
        first_kept: u64,
    },
}

impl WatchKind {
    /// The watch kind of an engine event, and the log sequence of a
    /// committed one; `None` for an event a watch does not carry (derived
    /// ones, such as a subtree having drained).
    fn of(kind: &EventKind) -> Option<(Option<u64>, WatchKind)> {
        Some(match kind {
            EventKind::ProcessStarted { seq } => (Some(*seq), WatchKind::ProcessStarted),
            // The step that ended its process is reported by its `Terminated`.
            EventKind::StepAdopted {
                transition: "complete" | "fail",
                ..
            } => return None,
            EventKind::StepAdopted {
                seq,
                step,
                transition,
            } => (
                Some(*seq),
                WatchKind::StepAdopted {
                    step: *step,
                    transition: (*transition).to_owned(),
                },
            ),
            EventKind::EffectPending { seq, effect } => {
                (Some(*seq), WatchKind::EffectPending { effect: *effect })
            }
            EventKind::EffectSettled {
                seq,
                effect,
                unknown,
            } => (
                Some(*seq),
                WatchKind::EffectSettled {
                    effect: *effect,
                    unknown: *unknown,
                },
            ),
            EventKind::EffectResolved { seq, effect } => {
                (Some(*seq), WatchKind::EffectResolved { effect: *effect })
            }
            EventKind::EffectRetrying {
                seq,
                effect,
                code,
                at,
            } => (
                Some(*seq),
                WatchKind::EffectRetrying {
                    effect: *effect,
                    code: code.clone(),
                    at: *at,
                },
            ),
            EventKind::SignalsAdmitted { seq, count } => {
                (Some(*seq), WatchKind::SignalsAdmitted { count: *count })
            }
            EventKind::CancelRequested { seq } => (Some(*seq), WatchKind::CancelRequested),
            EventKind::Terminated { seq, status, ended } => (
                Some(*seq),
                match ended {
                    Some(ended) => WatchKind::ended(&ended.termination, &ended.usage),
                    None => WatchKind::Terminated {
                        status: *status,
                        output: None,
                        failure: None,
                        usage: Usage::default(),
                    },
                },
            ),
            EventKind::Progress { progress } => (
                None,
                WatchKind::Progress {
                    progress: progress.clone(),
                },
            ),
            EventKind::Idle { since } => (None, WatchKind::Idle { since: *since }),
            EventKind::ChildStarted { seq, parent } => {
                (Some(*seq), WatchKind::ChildStarted { parent: *parent })
            }
            EventKind::ControlDelivered { seq, control } => (
                Some(*seq),
                WatchKind::ControlDelivered {
                    control: (*control).to_owned(),
                },
            ),
            EventKind::Delta { effect, delta } => (
                None,
                WatchKind::Delta {
                    effect: *effect,
                    delta: delta.clone(),
                },
            ),
            EventKind::Stopped { reason } => (
                None,
                WatchKind::Stopped {
                    reason: reason.clone(),
                },
            ),
            EventKind::LeaseRenewalFailed { reason, until } => (
                None,
                WatchKind::LeaseRenewalFailed {
                    reason: reason.clone(),
                    until: *until,
                },
            ),
            EventKind::Drained { .. } => return None,
        })
    }

    fn ended(termination: &crate::failure::Termination, usage: &Usage) -> WatchKind {
        WatchKind::Terminated {
            status: termination.status(),
            output: termination.output().cloned(),
            failure: termination.failure().cloned(),
            usage: usage.clone(),
        }
    }

    /// The `terminated` event of a record that ended `process`, read from
    /// the state the record left.
    fn ended_by(body: &RecordBody, state: &TreeState, process: ProcessId) -> Option<WatchKind> {
        let ends = matches!(
            body,
            RecordBody::Terminated { .. }
                | RecordBody::StepAdopted {
                    transition: Transition::Complete { .. } | Transition::Fail { .. },
                    ..
                }
        );
        let process = state.processes.get(&process).filter(|_| ends)?;
        let termination = process.termination.as_ref()?;
        Some(WatchKind::ended(termination, &process.usage))
    }
}

/// One tree's event stream from a sequence number on; see
/// [`super::Engine::watch`]. Ends after the last committed fact of a
/// finished tree.
pub struct Watch {
    engine: Arc<EngineInner>,
    tree: TreeId,
    scope: Scope,
    receiver: broadcast::Receiver<Event>,
    queue: VecDeque<WatchEvent>,
    /// The next committed sequence to yield.
    next_seq: u64,
    /// The tree has finished and every committed fact is queued.
    ended: bool,
    /// The store's change notices, when it sends them.
    changes: Option<Changes>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("tree", &self.tree)
            .field("next_seq", &self.next_seq)
            .finish()
    }
}

impl Watch {
    /// Opens a watch: subscribes to live events first, then reads the log,
    /// so nothing committed in between is missed.
    pub(super) async fn open(
        engine: Arc<EngineInner>,
        scope: &Scope,
        tree: TreeId,
        from: u64,
    ) -> Result<Watch, TreeError> {
        // Subscribed before the log is read, so no commit in between is missed.
        let changes = engine.store.changes().await.ok().flatten();
        let mut watch = Watch {
            receiver: engine.events.subscribe(),
            changes,
            engine,
            tree,
            scope: scope.clone(),
            queue: VecDeque::new(),
            next_seq: from.max(1),
            ended: false,
        };
        watch.catch_up().await?;
        Ok(watch)
    }

    /// The tree watched.
    pub fn tree(&self) -> TreeId {
        self.tree
    }

    /// The next event; waits for one. `None` once the tree has finished
    /// and its last committed fact was returned. An error reports a log
    /// that could not be read (the watch may be called again).
    pub async fn next(&mut self) -> Option<Result<WatchEvent, TreeError>> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                return Some(Ok(event));
            }
            if self.ended {
                return None;
            }
            // A tree this engine does not write may be written by another
            // process, whose commits reach no channel here: read the store
            // again on its notices, or now and then when it sends none.
            let written_here = self.engine.live(self.tree).is_some();
            let polling = self.changes.is_none();
            let clock = self.engine.clock.clone();
            let recheck = clock.now().plus(STORE_RECHECK);
            tokio::select! {
                received = self.receiver.recv() => match received {
                    Ok(event) if event.tree == self.tree => {
                        if let Err(error) = self.take(event).await {
                            return Some(Err(error));
                        }
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(lost)) => {
                        self.queue.push_back(self.live_event(None, WatchKind::Lagged { lost }));
                        if let Err(error) = self.catch_up().await {
                            return Some(Err(error));
                        }
                    }
                    // The engine is gone; what the store holds is all there is.
                    Err(broadcast::error::RecvError::Closed) => {
                        if let Err(error) = self.catch_up().await {
                            return Some(Err(error));
                        }
                        self.ended = true;
                    }
                },
                () = changed(&mut self.changes, self.tree), if !written_here => {
                    if let Err(error) = self.catch_up().await {
                        return Some(Err(error));
                    }
                }
                () = clock.sleep_until(recheck), if !written_here && polling => {
                    if let Err(error) = self.catch_up().await {
                        return Some(Err(error));
                    }
                }
            }
        }
    }

    /// Queues a live event of the tree: a committed fact in sequence, a
    /// non-durable one as it is; a gap (facts committed that this reader
    /// did not receive) is read from the log.
    async fn take(&mut self, event: Event) -> Result<(), TreeError> {
        let Some((seq, kind)) = WatchKind::of(&event.kind) else {
            if matches!(event.kind, EventKind::Drained { .. }) && event.process == self.tree {
                // The whole tree has terminated: what is committed is all.
                self.catch_up().await?;
            }
            return Ok(());
        };
        match seq {
            None => {
                let mut live = self.live_event(Some(event.process), kind);
                live.role = self.engine.role(event.program.as_ref());
                live.path = event.path;
                live.program = event.program;
                self.queue.push_back(live);
            }
            Some(seq) if seq < self.next_seq => {}
            Some(seq) if seq == self.next_seq => {
                self.queue.push_back(WatchEvent {
                    seq: Some(seq),
                    durable: true,
                    tree: self.tree,
                    process: Some(event.process),
                    path: event.path,
                    role: self.engine.role(event.program.as_ref()),
                    program: event.program,
                    kind,
                });
                self.next_seq = seq + 1;
            }
            Some(_) => self.catch_up().await?,
        }
        Ok(())
    }

    fn live_event(&self, process: Option<ProcessId>, kind: WatchKind) -> WatchEvent {
        WatchEvent {
            seq: None,
            durable: false,
            tree: self.tree,
            process,
            path: Vec::new(),
            program: None,
            role: ProgramRole::Program,
            kind,
        }
    }

    /// Reads the log and queues every committed fact from `next_seq` on.
    async fn catch_up(&mut self) -> Result<(), TreeError> {
        let history = self.engine.store.history(self.tree).await?;
        if !history.exists() {
            return Err(TreeError::NotFound { tree: self.tree });
        }
        let first_kept = history
            .records
            .first()
            .map(|record| record.seq)
            .or(history.snapshot.as_ref().map(|snapshot| snapshot.seq + 1));
        let truncated = first_kept.filter(|first_kept| *first_kept > self.next_seq);
        if let Some(first_kept) = truncated {
            self.next_seq = first_kept;
        }
        let (tree, next_seq) = (self.tree, self.next_seq);
        let engine = self.engine.clone();
        let mut found = Vec::new();
        let (state, head_seq, _) = replay(tree, &history, |record, state| {
            if record.seq < next_seq {
                return Ok(());
            }
            let body = record.decode().map_err(|error| TreeError::Corrupt {
                tree,
                record: Some(record.seq),
                message: error.to_string(),
            })?;
            let (process, kind) = EventKind::of(record.seq, &body);
            let kind = match WatchKind::ended_by(&body, state, process) {
                Some(ended) => Some(ended),
                None => WatchKind::of(&kind).map(|(_, kind)| kind),
            };
            if let Some(kind) = kind {
                let program = state
                    .processes
                    .get(&process)
                    .map(|p| p.program.name.clone());
                found.push(WatchEvent {
                    seq: Some(record.seq),
                    durable: true,
                    tree,
                    process: Some(process),
                    path: state.path(process),
                    role: engine.role(program.as_ref()),
                    program,
                    kind,
                });
            }
            Ok(())
        })?;
        if state.start.scope != self.scope {
            return Err(TreeError::Scope {
                tree,
                scope: self.scope.clone(),
            });
        }
        if let Some(first_kept) = truncated {
            self.queue
                .push_back(self.live_event(None, WatchKind::Truncated { first_kept }));
        }
        self.queue.extend(found);
        self.next_seq = self.next_seq.max(head_seq + 1);
        self.ended = state.done();
        Ok(())
    }
}

/// Waits for a store notice about `tree`, or one that notices were missed;
/// never returns without notices. When the store stops sending them, it
/// returns once (to read again now) and the watch falls back to its timer.
async fn changed(changes: &mut Option<Changes>, tree: TreeId) {
    loop {
        let Some(subscription) = changes.as_mut() else {
            return std::future::pending().await;
        };
        match subscription.next().await {
            Some(Change::Tree(changed)) if changed == tree => return,
            Some(Change::Missed) => return,
            Some(_) => {}
            None => {
                *changes = None;
                return;
            }
        }
    }
}
