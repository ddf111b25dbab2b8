//! What the owner task tells the world besides its commits: engine events
//! (committed facts, progress, the idle alarm), the outcome handles wait
//! on, and the dispatches it launches.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::clock::Timestamp;
use crate::ids::ProcessId;
use crate::log::RecordBody;
use crate::protocol::Transition;

use super::super::dispatch::{DispatchJob, Launch, launch};
use super::super::view::{Ended, Event, EventKind};
use super::{Actor, After};

/// What a durable commit tells: see [`Actor::news`].
pub(super) struct News {
    events: Vec<Event>,
    terminated: Vec<(ProcessId, crate::failure::Termination)>,
    drained: Vec<ProcessId>,
    reached: super::super::shared::Reached,
}

impl Actor {
    pub(super) fn emit(&self, process: ProcessId, kind: EventKind) {
        if let Some(event) = self.event(process, kind) {
            let _ = self.engine.events.send(event);
        }
    }

    /// The event of `process`, `None` when nobody listens (its path is
    /// then not computed).
    fn event(&self, process: ProcessId, kind: EventKind) -> Option<Event> {
        if self.engine.events.receiver_count() == 0 {
            return None;
        }
        Some(Event {
            tree: self.tree,
            process,
            path: self.state.path(process),
            program: self
                .state
                .processes
                .get(&process)
                .map(|p| p.program.name.clone()),
            kind,
        })
    }

    /// What a commit of `bodies` (the first at `first`) tells once it is
    /// durable: its events, and the terminations and drains handles read.
    /// Read off the state the commit leaves, before the next round moves
    /// it on.
    pub(super) fn news(
        &self,
        first: u64,
        bodies: &[RecordBody],
        reached: super::super::shared::Reached,
    ) -> News {
        let mut news = News {
            events: Vec::new(),
            terminated: Vec::new(),
            drained: Vec::new(),
            reached,
        };
        // Events are built only for someone listening.
        let listening = self.engine.events.receiver_count() > 0;
        for (offset, body) in bodies.iter().enumerate() {
            let seq = first + offset as u64;
            let ended = match body {
                RecordBody::StepAdopted {
                    process,
                    transition: Transition::Complete { .. } | Transition::Fail { .. },
                    ..
                }
                | RecordBody::Terminated { process, .. } => Some(*process),
                _ => None,
            };
            if listening && !matches!(body, RecordBody::Terminated { .. }) {
                let (process, kind) = EventKind::of(seq, body);
                news.events.extend(self.event(process, kind));
            }
            if let Some(process) = ended
                && let Some(termination) = &self.state.processes[&process].termination
            {
                news.events.extend(self.ended(seq, process));
                news.terminated.push((process, termination.clone()));
            }
        }
        if news.terminated.is_empty() {
            return news;
        }
        // Only a terminated process or one of its ancestors can have drained now.
        let mut candidates = BTreeSet::new();
        for (process, _) in &news.terminated {
            let mut next = Some(*process);
            while let Some(id) = next {
                if !candidates.insert(id) {
                    break;
                }
                next = self.state.processes[&id].parent;
            }
        }
        news.drained = {
            let outcome = self.owner.outcome.read();
            candidates
                .into_iter()
                .filter(|id| !outcome.drained.contains(id) && self.state.drained(*id))
                .collect()
        };
        for id in &news.drained {
            let status = self.state.processes[id].status;
            news.events
                .extend(self.event(*id, EventKind::Drained { status }));
        }
        news
    }

    /// Emits a durable commit's events and publishes its terminations and
    /// drains to handles.
    pub(super) fn deliver(&self, news: News) {
        for event in news.events {
            let _ = self.engine.events.send(event);
        }
        for (process, _) in &news.terminated {
            self.shared.progress.forget(*process);
        }
        self.owner.outcome.modify(|o| {
            o.terminations.extend(news.terminated);
            o.drained.extend(news.drained);
            o.reached = news.reached;
        });
    }

    /// The `Terminated` event of a process that ended at `seq`, with how it
    /// ended and what it used (built only when someone listens).
    fn ended(&self, seq: u64, process: ProcessId) -> Option<Event> {
        if self.engine.events.receiver_count() == 0 {
            return None;
        }
        let state = &self.state.processes[&process];
        let termination = state.termination.as_ref()?;
        self.event(
            process,
            EventKind::Terminated {
                seq,
                status: termination.status(),
                ended: Some(Arc::new(Ended {
                    termination: termination.clone(),
                    usage: state.usage.clone(),
                })),
            },
        )
    }

    /// Reads a stepped process's progress and, when it changed, keeps it
    /// on the board and publishes it once the step is committed.
    pub(super) fn step_progress(&mut self, process: ProcessId) {
        // Program code: a panic here reports no progress, nothing more.
        let Some(progress) = self.executions.get(&process).and_then(|execution| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| execution.progress()))
                .ok()
                .flatten()
        }) else {
            return;
        };
        let now = self.engine.clock.now();
        let Some(stamped) = self.shared.progress.note(process, progress, now) else {
            return;
        };
        if self.engine.events.receiver_count() == 0 {
            return;
        }
        let event = Event {
            tree: self.tree,
            process,
            path: self.state.path(process),
            program: self
                .state
                .processes
                .get(&process)
                .map(|p| p.program.name.clone()),
            kind: EventKind::Progress { progress: stamped },
        };
        let events = self.engine.events.clone();
        self.after.push(After::Reply(Box::new(move || {
            let _ = events.send(event);
        })));
    }

    /// When the idle alarm rings next: `alarm` after the last commit, while
    /// the tree is not waiting on a person and has not been told yet.
    pub(super) fn idle_alarm_at(&self) -> Option<Timestamp> {
        let alarm = self.engine.idle_alarm?;
        if self.idle_told || self.owner.outcome.read().reached.wait_open {
            return None;
        }
        Some(self.last_commit.plus(alarm))
    }

    /// The idle alarm rang: tell whoever listens, once per quiet spell.
    pub(super) fn ring_idle_alarm(&mut self) {
        self.idle_told = true;
        tracing::warn!(tree = %self.tree, since = %self.last_commit, "no commit within the idle alarm");
        self.emit(
            self.tree,
            EventKind::Idle {
                since: self.last_commit,
            },
        );
    }

    pub(super) fn launch(&self, job: DispatchJob) {
        let Some(dispatcher) = self
            .programs
            .get(&job.process)
            .and_then(|p| p.dispatcher())
            .cloned()
        else {
            return;
        };
        // Deltas name their process's place only when someone listens.
        let (path, program) = if self.engine.events.receiver_count() == 0 {
            (Vec::new(), None)
        } else {
            (
                self.state.path(job.process),
                self.state
                    .processes
                    .get(&job.process)
                    .map(|p| p.program.name.clone()),
            )
        };
        let to = Launch {
            tree: self.tree,
            path,
            program,
            events: self.engine.events.clone(),
            clock: self.engine.clock.clone(),
            completions: self.channels.completion_sender.clone(),
            progress: self.shared.progress.clone(),
        };
        launch(job, dispatcher, to);
    }
}
