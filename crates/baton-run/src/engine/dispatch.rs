//! Dispatches in flight: the owner task's bookkeeping of the effects it has
//! sent to dispatchers, and the launch of one dispatch on its own task.
//!
//! A dispatch is launched only after its `effect_pending` record commits.
//! Each launch has an attempt number; a completion whose attempt is not the
//! one in flight (the effect was abandoned or sent again) is dropped.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use tokio::sync::{broadcast, mpsc, watch};
use tracing::Instrument;

use crate::budget::Meters;
use crate::clock::Clock;
use crate::ids::{EffectId, ProcessId, TreeId};
use crate::payload::Payload;
use crate::protocol::{Cancellation, DeltaSink, DispatchCall, Dispatcher, Live, Settlement};

use super::round::{Flights, panic_failure};
use super::view::{Event, EventKind};

/// A dispatcher's answer for one attempt of an effect.
pub(super) struct Completion {
    pub effect: EffectId,
    pub attempt: u64,
    pub settlement: Settlement,
}

struct InFlight {
    process: ProcessId,
    attempt: u64,
    cancel: watch::Sender<bool>,
}

/// A dispatch to launch once the records that justify it are durable.
pub(super) struct DispatchJob {
    pub process: ProcessId,
    pub effect: EffectId,
    pub request: Payload,
    pub reserve: Meters,
    /// Which attempt of the effect this is, as the dispatcher sees it.
    pub try_number: u32,
    attempt: u64,
    cancel: Cancellation,
}

/// The dispatches of one tree that are in flight, and the unknown effects
/// the host allowed to be sent again.
#[derive(Default)]
pub(super) struct Dispatches {
    in_flight: BTreeMap<EffectId, InFlight>,
    replay_allowed: BTreeSet<EffectId>,
    attempts: u64,
}

impl Flights for Dispatches {
    fn carries(&self, effect: EffectId) -> bool {
        self.in_flight.contains_key(&effect)
    }

    fn any_of(&self, process: ProcessId) -> bool {
        self.in_flight
            .values()
            .any(|flight| flight.process == process)
    }
}

impl Dispatches {
    /// Nothing in flight and no replay allowed but not yet sent.
    pub fn is_empty(&self) -> bool {
        self.in_flight.is_empty() && self.replay_allowed.is_empty()
    }

    /// Puts a dispatch in flight under a new attempt; the job is launched
    /// after the commit.
    pub fn begin(
        &mut self,
        process: ProcessId,
        effect: EffectId,
        (request, reserve): (Payload, Meters),
        try_number: u32,
    ) -> DispatchJob {
        self.attempts += 1;
        let (cancel_sender, cancel) = Cancellation::new();
        self.in_flight.insert(
            effect,
            InFlight {
                process,
                attempt: self.attempts,
                cancel: cancel_sender,
            },
        );
        DispatchJob {
            process,
            effect,
            request,
            reserve,
            try_number,
            attempt: self.attempts,
            cancel,
        }
    }

    /// Allows an unknown effect to be sent again (a host replay).
    pub fn allow_replay(&mut self, effect: EffectId) {
        self.replay_allowed.insert(effect);
    }

    /// Whether the host allowed `effect` to be sent again (once).
    pub fn take_replay(&mut self, effect: EffectId) -> bool {
        self.replay_allowed.remove(&effect)
    }

    /// Asks every dispatch of `process` in flight to stop.
    pub fn cancel_process(&self, process: ProcessId) {
        for flight in self.in_flight.values().filter(|f| f.process == process) {
            let _ = flight.cancel.send(true);
        }
    }

    /// Forgets the dispatches of a process that ended (asking them to
    /// stop): their completions will be dropped.
    pub fn abandon_process(&mut self, process: ProcessId) {
        self.in_flight.retain(|_, flight| {
            if flight.process == process {
                let _ = flight.cancel.send(true);
                false
            } else {
                true
            }
        });
    }

    /// Asks every dispatch in flight to stop.
    pub fn cancel_all(&self) {
        for flight in self.in_flight.values() {
            let _ = flight.cancel.send(true);
        }
    }

    /// Takes a completion's effect out of flight: its process, or `None`
    /// for a stale attempt or an abandoned effect.
    pub fn complete(&mut self, completion: &Completion) -> Option<ProcessId> {
        let flight = self.in_flight.get(&completion.effect)?;
        if flight.attempt != completion.attempt {
            return None;
        }
        let process = flight.process;
        self.in_flight.remove(&completion.effect);
        Some(process)
    }
}

/// Where a launched dispatch reports to.
pub(super) struct Launch {
    pub tree: TreeId,
    /// The process's path and program name, for its delta events.
    pub path: Vec<crate::ids::ChildKey>,
    pub program: Option<crate::ids::Name>,
    pub events: broadcast::Sender<Event>,
    pub clock: Arc<dyn Clock>,
    pub completions: mpsc::UnboundedSender<Box<Completion>>,
    /// The tree's progress board, for the dispatch's progress reports.
    pub progress: Arc<super::progress::Board>,
}

/// Launches one dispatch on a task of its own; its settlement (an
/// `Unknown` one if the dispatcher panics or its task is aborted) comes
/// back as a [`Completion`].
pub(super) fn launch(job: DispatchJob, dispatcher: Arc<dyn Dispatcher>, to: Launch) {
    let (tree, process, effect) = (to.tree, job.process, job.effect);
    let events = to.events;
    let (path, program) = (to.path, to.program);
    let (board, clock) = (to.progress, to.clock.clone());
    let call = DispatchCall {
        effect,
        process,
        request: job.request,
        reserve: job.reserve,
        attempt: job.try_number,
        deltas: DeltaSink {
            emit: Arc::new(move |live| {
                let kind = match live {
                    Live::Delta(delta) => EventKind::Delta { effect, delta },
                    Live::Progress(progress) => match board.note(process, progress, clock.now()) {
                        Some(progress) => EventKind::Progress { progress },
                        None => return,
                    },
                };
                let _ = events.send(Event {
                    tree,
                    process,
                    path: path.clone(),
                    program: program.clone(),
                    kind,
                });
            }),
        },
        cancel: job.cancel,
        clock: to.clock,
    };
    let completions = to.completions;
    let attempt = job.attempt;
    let future = catch_unwind(AssertUnwindSafe(|| dispatcher.dispatch(call)));
    let span = tracing::debug_span!("effect", %process, %effect, attempt);
    tokio::spawn(
        async move {
            let settlement = match future {
                Err(panic) => Settlement::Unknown {
                    diagnostic: panic_failure("engine.dispatch.panicked", panic).to_string(),
                },
                Ok(future) => match tokio::spawn(future).await {
                    Ok(settlement) => settlement,
                    Err(error) if error.is_panic() => Settlement::Unknown {
                        diagnostic: panic_failure("engine.dispatch.panicked", error.into_panic())
                            .to_string(),
                    },
                    Err(_) => Settlement::Unknown {
                        diagnostic: "engine.dispatch.canceled: the dispatch task was aborted"
                            .into(),
                    },
                },
            };
            let _ = completions.send(Box::new(Completion {
                effect,
                attempt,
                settlement,
            }));
        }
        .instrument(span),
    );
}
