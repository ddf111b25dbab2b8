//! The owner task of one tree: the single writer of its log.
//!
//! Every round it takes in commands and dispatch completions, asks the
//! round's decisions (`round.rs`) what each live process does next, and
//! stages the records they return (each applied to the in-memory fold at
//! once); then it commits the staged records in one append and only then
//! acts on them: dispatches, replies, events. While a store writes a commit
//! off this task, the next round is staged, and sealed once that commit is
//! durable (`commit.rs`). If an append fails the tree stops, so in-memory
//! state that ran ahead of the log is never observed.
//!
//! This file holds the task, its mailbox and its commit loop; what a round
//! decides lives in `round.rs`, dispatches in flight in `dispatch.rs`, and
//! how a tree starts, sleeps and wakes in `lifecycle.rs`.

use std::collections::{BTreeMap, BTreeSet};

mod birth;
mod commit;
mod live;
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::clock::Timestamp;
use crate::ids::{EffectId, ProcessId, TreeId};
use crate::log::{Record, RecordBody};
use crate::protocol::{ChildOutcome, Execution, Program, Signal, SignalBody};
use crate::storage::Created;

use super::dispatch::{Completion, DispatchJob, Dispatches};
use super::error::{ControlError, RuntimeError, SignalError};
use super::lifecycle::{Owner, Sleeper};
pub(crate) use super::mailbox::{Channels, Command};
use super::round::{self, ChildrenWait, Next, Pass};
use super::shared::{Door, TreeShared};
use super::spans::ProcessSpans;
use super::spare::{keep_staged, spare_staged};
use super::state::TreeState;
use super::view::{Event, EventKind, TreeView};
use super::{EngineInner, SignalReceipt, SignalRequest, Sleep};
pub(in crate::engine) use birth::FirstRound;

/// Commits in a row a round may hold children waits back while other
/// processes keep progressing (each commit takes up to
/// `max_steps_per_commit` steps).
const HELD_COMMITS: u32 = 4;

/// Something to do once the staged records are durable.
enum After {
    Dispatch(DispatchJob),
    Reply(Box<dyn FnOnce() + Send>),
}

/// The owner of one tree while its task runs.
pub(super) struct Actor {
    engine: Arc<EngineInner>,
    /// Held for the task's life so the engine's weak entry for this tree
    /// stays reachable by handles while the tree runs; its door is where
    /// the task hibernates.
    shared: Arc<TreeShared>,
    tree: TreeId,
    state: TreeState,
    programs: BTreeMap<ProcessId, Program>,
    executions: BTreeMap<ProcessId, Box<dyn Execution>>,
    /// The lease, the log head, the snapshot pace and the published outcome.
    owner: Owner,
    /// The commit that ended the tree gave up the lease.
    released: bool,
    staged: Vec<RecordBody>,
    after: Vec<After>,
    dispatches: Dispatches,
    /// Processes not yet terminated: a cache of the fold kept by `stage`, so
    /// each round visits live processes only.
    live: BTreeSet<ProcessId>,
    /// Inspections wait for the round's commit so they show committed state only.
    inspects: Vec<oneshot::Sender<Result<TreeView, ControlError>>>,
    /// Commits in a row that ended with children waits held back (see
    /// [`Actor::drive`]).
    held: u32,
    /// When the lease is renewed next: a third of its time-to-live after
    /// the last grant or renewal, whatever traffic the tree has meanwhile.
    renew_at: Timestamp,
    /// When the lease runs out unless renewed.
    lease_until: Timestamp,
    /// Hosts asking whether this engine still writes the tree, answered
    /// after the next renewal.
    renewals: Vec<oneshot::Sender<Result<(), RuntimeError>>>,
    channels: Channels,
    /// The engine is shutting down: no new steps, only settlements of the
    /// dispatches in flight.
    draining: bool,
    /// Told once no dispatch is in flight any more while draining.
    drained: Option<oneshot::Sender<()>>,
    /// When the last commit was made (or the task started): the idle
    /// alarm counts from it.
    last_commit: Timestamp,
    /// The idle alarm rang since the last commit.
    idle_told: bool,
    spans: ProcessSpans,
    /// A new root whose start is not durable yet: its first commit creates
    /// the tree with the start record in front (see [`Store::create_tree`]).
    ///
    /// [`Store::create_tree`]: crate::storage::Store::create_tree
    unborn: Option<Record>,
    /// Why the first commit of an unborn tree created nothing.
    refused: Option<Created>,
    /// The first commit of an unborn tree failed in the store.
    unborn_failed: bool,
    /// The last commit, sent and not answered yet: the next round is
    /// staged while the store writes it (see `commit.rs`).
    flight: Option<commit::Flight>,
    /// A snapshot being written (see `commit.rs`).
    snapshotting: Option<commit::Snapshotting>,
}

impl Actor {
    pub fn new(
        engine: &Arc<EngineInner>,
        shared: &Arc<TreeShared>,
        state: TreeState,
        owner: Owner,
        programs: BTreeMap<ProcessId, Program>,
        executions: BTreeMap<ProcessId, Box<dyn Execution>>,
        channels: Channels,
    ) -> Actor {
        let live = state.live_ids().into_iter().collect();
        // The lease was just granted (or, for a woken tree, is renewed
        // first thing in `run`).
        let now = engine.clock.now();
        Actor {
            engine: engine.clone(),
            shared: shared.clone(),
            tree: state.root,
            state,
            programs,
            executions,
            owner,
            released: false,
            staged: spare_staged(),
            after: Vec::new(),
            dispatches: Dispatches::default(),
            live,
            inspects: Vec::new(),
            held: 0,
            renew_at: now.plus(engine.lease_ttl / 3),
            lease_until: now.plus(engine.lease_ttl),
            renewals: Vec::new(),
            channels,
            draining: false,
            drained: None,
            last_commit: now,
            idle_told: false,
            spans: ProcessSpans::default(),
            unborn: None,
            refused: None,
            unborn_failed: false,
            flight: None,
            snapshotting: None,
        }
    }

    pub async fn run(mut self) {
        if self.owner.renew {
            self.owner.renew = false;
            if !self.renew_lease().await {
                return;
            }
        }
        loop {
            while let Ok(command) = self.channels.commands.try_recv() {
                if let Some(reply) = self.command(*command) {
                    self.close(reply).await;
                    return;
                }
            }
            // The lease is renewed on its own schedule, so a tree busy with
            // events keeps its lease as well as an idle one, and at once when
            // a host asks whether this engine still writes the tree.
            // (A tree whose last commit gave up the lease is done: nothing to
            // renew.)
            if !self.released
                && (self.engine.clock.now() >= self.renew_at || !self.renewals.is_empty())
                && !self.renew_lease().await
            {
                return;
            }
            for reply in std::mem::take(&mut self.renewals) {
                let _ = reply.send(Ok(()));
            }
            while let Ok(completion) = self.channels.completions.try_recv() {
                self.complete(*completion);
            }
            if !self.draining {
                for body in round::deadline(&self.state, self.engine.clock.now()) {
                    self.stage(body);
                }
                for body in round::history(&self.state) {
                    self.stage(body);
                }
                self.drive();
            }
            // The round above was staged while the last commit was written;
            // it is sealed only once that commit is durable.
            if let Some(flight) = self.flight.take()
                && let Err(error) = self.land_flight(flight).await
            {
                self.stop(error);
                return;
            }
            if !self.staged.is_empty() {
                match self.send().await {
                    Ok(flight) => self.flight = flight,
                    Err(error) => {
                        self.stop(error);
                        return;
                    }
                }
                continue;
            }
            if let Err(error) = self.settle_snapshot().await {
                self.stop(error);
                return;
            }
            self.flush_after();
            if self.state.done() {
                self.finish().await;
                return;
            }
            if self.draining
                && self.dispatches.is_empty()
                && let Some(drained) = self.drained.take()
            {
                let _ = drained.send(());
            }
            if self.idle() {
                match self.hibernate() {
                    None => return,
                    Some(awake) => self = awake,
                }
            }
            // The tree's deadline, or the end of a backoff, whichever is
            // first (a draining tree acts on neither).
            let deadline = match (self.live_deadline(), self.next_backoff()) {
                _ if self.draining => None,
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let renew_at = self.renew_at;
            let idle_at = self.idle_alarm_at();
            let clock = self.engine.clock.clone();
            tokio::select! {
                biased;
                command = self.channels.commands.recv() => {
                    if let Some(command) = command
                        && let Some(reply) = self.command(*command)
                    {
                        self.close(reply).await;
                        return;
                    }
                }
                Some(completion) = self.channels.completions.recv() => self.complete(*completion),
                () = clock.sleep_until(deadline.unwrap_or(Timestamp(u64::MAX))), if deadline.is_some() => {}
                () = clock.sleep_until(renew_at) => {
                    if !self.renew_lease().await {
                        return;
                    }
                }
                () = clock.sleep_until(idle_at.unwrap_or(Timestamp(u64::MAX))), if idle_at.is_some() => {
                    self.ring_idle_alarm();
                }
            }
        }
    }

    /// Extends the lease; `false` (after stopping the tree) when another
    /// writer holds it now, or when it ran out while the store could not
    /// renew it. A failed renewal is reported as an event and tried again
    /// soon.
    async fn renew_lease(&mut self) -> bool {
        let ttl = self.engine.lease_ttl;
        let now = self.engine.clock.now();
        let until = now.plus(ttl);
        match self
            .engine
            .store
            .renew(self.tree, self.owner.token, until)
            .await
        {
            Ok(true) => {
                self.lease_until = until;
                self.renew_at = now.plus(ttl / 3);
                true
            }
            Ok(false) => {
                let error = RuntimeError::Fenced {
                    tree: self.tree,
                    head_seq: self.owner.head_seq,
                };
                self.stop(error);
                false
            }
            Err(error) => {
                tracing::warn!(tree = %self.tree, %error, "lease renewal failed");
                if now >= self.lease_until {
                    self.stop(RuntimeError::Storage {
                        tree: self.tree,
                        head_seq: self.owner.head_seq,
                        error,
                    });
                    return false;
                }
                let _ = self.engine.events.send(Event {
                    tree: self.tree,
                    process: self.tree,
                    path: Vec::new(),
                    program: None,
                    kind: EventKind::LeaseRenewalFailed {
                        reason: error.to_string(),
                        until: self.lease_until,
                    },
                });
                // Try again soon, and at the latest when the lease runs out.
                let retry = now.plus((ttl / 10).min(std::time::Duration::from_secs(1)));
                self.renew_at = if retry < self.lease_until {
                    retry
                } else {
                    self.lease_until
                };
                true
            }
        }
    }

    /// Nothing can happen in this tree without input from outside: nothing
    /// staged or in flight, no deadline to watch, no pending replies.
    fn idle(&self) -> bool {
        self.engine.sleep != Sleep::Awake
            && self.staged.is_empty()
            && self.after.is_empty()
            && self.inspects.is_empty()
            && self.dispatches.is_empty()
            && self.live_deadline().is_none()
            && self.next_backoff().is_none()
    }

    /// Leaves the tree's state at its door so the task can end, unless a
    /// command arrived meanwhile (then the actor is handed back).
    fn hibernate(self) -> Option<Self> {
        let shared = self.shared.clone();
        let Ok(mut door) = shared.door.lock() else {
            return Some(self);
        };
        // Commands are sent under the door's lock, so none can arrive once
        // this check passes.
        if !self.channels.commands.is_empty() || !self.channels.completions.is_empty() {
            return Some(self);
        }
        // The engine was dropped while this task ran on another thread: its
        // sleeping trees have been closed, or are being closed after this
        // lock, so this one closes now rather than sleep with nobody left
        // to close it (its handles would wait for ever). Its lease stays,
        // as after a crash.
        if self.engine.dropped() {
            *door = Door::Closed;
            self.owner.close(RuntimeError::Closed { tree: self.tree });
            return None;
        }
        *door = Door::Asleep(Box::new(Sleeper::new(
            self.state,
            self.engine.sleep,
            self.owner,
        )));
        None
    }

    fn live_deadline(&self) -> Option<Timestamp> {
        self.state
            .deadline
            .filter(|_| self.state.root_termination().is_none())
    }

    fn stage(&mut self, body: RecordBody) {
        self.stage_with(body, None);
    }

    /// Stages `body`, handing the fold the outcomes of the children wait it
    /// settles when they are at hand (see `TreeState::apply_with`).
    fn stage_with(&mut self, body: RecordBody, ready: Option<(EffectId, Vec<ChildOutcome>)>) {
        if let Err(error) = self.state.apply_with(&body, ready) {
            // The engine only stages records that follow from its state; a
            // failure here is a defect, reported by stopping the tree.
            tracing::error!(tree = %self.tree, %error, "engine staged an inconsistent record");
            let inconsistent = RuntimeError::Inconsistent {
                tree: self.tree,
                message: error.0,
            };
            self.owner
                .outcome
                .modify(|o| o.stopped = Some(inconsistent));
            return;
        }
        if let RecordBody::ChildStarted { child, .. } = &body {
            self.live.insert(*child);
        }
        if let RecordBody::Terminated { process, .. } | RecordBody::StepAdopted { process, .. } =
            &body
            && self.state.processes[process].termination.is_some()
        {
            self.live.remove(process);
            self.spans.end(*process);
            self.executions.remove(process);
            self.dispatches.abandon_process(*process);
        }
        self.staged.push(body);
    }

    fn reply<T: Send + 'static>(&mut self, sender: oneshot::Sender<T>, value: T) {
        self.after.push(After::Reply(Box::new(move || {
            let _ = sender.send(value);
        })));
    }

    /// Handles a command; returns the reply channel when it asks to close.
    fn command(&mut self, command: Command) -> Option<oneshot::Sender<()>> {
        match command {
            Command::Signal {
                process,
                request,
                reply,
            } => {
                let result = self.admit(process, request);
                self.reply(reply, result);
            }
            Command::Answer { request, reply } => {
                let result = match request
                    .wait
                    .and_then(|wait| round::waiter(&self.state, wait))
                {
                    Some(process) => self.admit(process, request),
                    None => Err(round::no_waiter(&self.state, &request)),
                };
                self.reply(reply, result);
            }
            Command::Cancel {
                process,
                reason,
                reply,
            } => {
                let result = round::cancel(&self.state, process, reason).map(|record| {
                    if let Some(record) = record {
                        self.stage(record);
                        self.dispatches.cancel_process(process);
                    }
                });
                self.reply(reply, result);
            }
            Command::Kill { process, reply } => {
                let result = round::live(&self.state, process).map(|_| ());
                if result.is_ok() {
                    let mut records = Vec::new();
                    round::kill(&self.state, process, &mut records);
                    for record in records {
                        self.stage(record);
                    }
                }
                self.reply(reply, result);
            }
            Command::Resolve {
                effect,
                settlement,
                reply,
            } => {
                let result = round::unknown(&self.state, effect).map(|process| {
                    self.stage(RecordBody::EffectResolved {
                        process,
                        effect,
                        settlement,
                    });
                });
                self.reply(reply, result);
            }
            Command::Replay { effect, reply } => {
                let result = round::unknown(&self.state, effect).map(|process| {
                    self.dispatches.allow_replay(effect);
                    self.stage(RecordBody::EffectReplayed { process, effect });
                });
                self.reply(reply, result);
            }
            Command::Inspect { reply } => self.inspects.push(reply),
            Command::Renew { reply } => self.renewals.push(reply),
            Command::Close { reply } => return Some(reply),
            Command::Drain { reply } => {
                self.draining = true;
                self.drained = Some(reply);
            }
        }
        None
    }

    fn admit(
        &mut self,
        process: ProcessId,
        request: SignalRequest,
    ) -> Result<SignalReceipt, SignalError> {
        let signal = Signal {
            id: request.id,
            wait: request.wait,
            body: SignalBody::Input {
                payload: request.payload,
            },
        };
        if !round::check_signal(&self.state, &self.programs, process, &signal)? {
            return Ok(SignalReceipt::Duplicate);
        }
        self.stage(RecordBody::SignalsAdmitted {
            process,
            signals: vec![signal],
        });
        Ok(SignalReceipt::Admitted)
    }

    fn complete(&mut self, completion: Completion) {
        let Some(process) = self.dispatches.complete(&completion) else {
            return;
        };
        if self
            .state
            .processes
            .get(&process)
            .is_none_or(|p| p.termination.is_some())
        {
            return;
        }
        let record = round::settle(
            &self.state,
            &self.programs[&process],
            process,
            completion.effect,
            completion.settlement,
            self.engine.clock.now(),
        );
        self.stage(record);
    }

    /// When the earliest backoff of a failed attempt ends, if any does.
    fn next_backoff(&self) -> Option<Timestamp> {
        self.live
            .iter()
            .filter_map(|id| self.state.processes[id].frontier())
            .filter_map(|slot| match slot.phase {
                super::state::Phase::Backoff { at } => Some(at),
                _ => None,
            })
            .min()
    }

    /// Runs every process that can progress, up to the steps of one commit.
    /// Children waits are held back while anything else in the tree can
    /// progress, so a wait settles with every child that became ready in
    /// the round rather than with the first: a parent of many quick
    /// children steps once per round, not per child. A round may span
    /// commits (a round of a hundred children outgrows one commit's steps),
    /// but at most [`HELD_COMMITS`] of them, so processes that keep
    /// stepping cannot hold a sibling's settled wait back for long.
    fn drive(&mut self) {
        let mut steps_left = self.engine.max_steps_per_commit;
        let now = self.engine.clock.now();
        loop {
            // A record the fold refused stopped the tree; nothing staged
            // after it could be committed.
            if self.owner.outcome.read().stopped.is_some() {
                return;
            }
            if self.pass(&mut steps_left, true, now) {
                if steps_left > 0 {
                    continue;
                }
                if self.held < HELD_COMMITS && !self.staged.is_empty() {
                    self.held += 1;
                    return;
                }
            }
            self.held = 0;
            if !self.pass(&mut steps_left, false, now) {
                return;
            }
        }
    }

    /// Advances every live process once; whether any progressed.
    fn pass(&mut self, steps_left: &mut usize, hold_waits: bool, now: Timestamp) -> bool {
        let live: Vec<ProcessId> = self.live.iter().copied().collect();
        let mut progressed = false;
        for process in live {
            let pass = Pass {
                hold_waits,
                may_step: *steps_left > 0,
                now,
            };
            progressed |= self.advance(process, steps_left, pass);
        }
        progressed
    }

    /// Stages what process `id` does next; whether it progressed.
    fn advance(&mut self, id: ProcessId, steps_left: &mut usize, pass: Pass) -> bool {
        match round::next(&self.state, id, &self.dispatches, pass) {
            Next::Idle => false,
            Next::Orphaned => {
                self.stage(RecordBody::CancelRequested {
                    process: id,
                    cause: crate::failure::Cause::ParentCancellation,
                    reason: "the parent ended".into(),
                });
                true
            }
            Next::Draining => {
                self.dispatches.cancel_process(id);
                false
            }
            Next::End { cause, reason } => {
                let record = round::end(&self.state.processes[&id], id, cause, &reason);
                self.stage(record);
                true
            }
            Next::Dispatch {
                effect,
                request,
                reserve,
                attempt,
            } => {
                // Each attempt's reservation is charged before it starts.
                match round::reserve(&self.state.processes[&id], &reserve) {
                    Ok(()) => {
                        self.stage(RecordBody::EffectPending {
                            process: id,
                            effect,
                        });
                        self.launch_later(id, effect, (request, reserve), attempt);
                    }
                    Err(failure) => self.stage(round::refuse(id, effect, failure)),
                }
                true
            }
            Next::Redispatch {
                effect,
                request,
                reserve,
                attempt,
            } => {
                let allowed = self.dispatches.take_replay(effect);
                if round::may_redispatch(&self.programs[&id], &request, allowed) {
                    self.launch_later(id, effect, (request, reserve), attempt);
                } else {
                    self.stage(RecordBody::EffectSettled {
                        process: id,
                        effect,
                        settlement: round::unknown_settlement(),
                    });
                }
                true
            }
            Next::StartChild { effect, start } => {
                let started =
                    round::start_child(&self.state, &self.programs[&id], id, effect, start);
                self.stage(started.record);
                if let Some((child, program, execution)) = started.child {
                    self.executions.insert(child, execution);
                    self.programs.insert(child, program);
                }
                true
            }
            Next::Control {
                effect,
                key,
                control,
            } => {
                let record =
                    round::control_child(&self.state, &self.programs, id, effect, &key, control);
                self.stage(record);
                true
            }
            Next::WaitChildren {
                effect,
                keys,
                boundary,
                condition,
            } => {
                let wait = ChildrenWait {
                    keys: &keys,
                    boundary,
                    condition,
                };
                match round::wait_children(&self.state, id, effect, wait) {
                    Some(settled) => {
                        self.stage_with(settled.record, settled.ready);
                        true
                    }
                    None => false,
                }
            }
            Next::Step => {
                *steps_left -= 1;
                // The window is the mailbox itself, laid out as one slice (no
                // copy of the signals for each step).
                if let Some(process) = self.state.processes.get_mut(&id) {
                    process.mailbox.make_contiguous();
                }
                let execution = self.executions.remove(&id);
                let span = self.spans.of(&self.state, id);
                let stepped =
                    span.in_scope(|| round::step(&self.state, id, &self.programs[&id], execution));
                self.stage(stepped.record);
                if let Some(execution) = stepped.keep {
                    self.executions.insert(id, execution);
                    self.step_progress(id);
                }
                true
            }
        }
    }

    fn launch_later(
        &mut self,
        process: ProcessId,
        effect: EffectId,
        call: (crate::payload::Payload, crate::budget::Meters),
        attempt: u32,
    ) {
        let mut job = self.dispatches.begin(process, effect, call, attempt);
        job.span = self.spans.of(&self.state, process);
        self.after.push(After::Dispatch(job));
    }

    /// Releases what waited for a commit when nothing more is committed:
    /// inspections see the state at the head.
    fn flush_after(&mut self) {
        let views = self.views(self.owner.head_seq, self.owner.head);
        let after = std::mem::take(&mut self.after);
        self.release(views, after);
    }

    fn stop(&mut self, error: RuntimeError) {
        tracing::warn!(tree = %self.tree, %error, "tree writer stopped");
        if let RuntimeError::Fenced { .. } = error {
            // The lease is another writer's now.
            self.engine.forget(self.tree, self.owner.token);
        }
        let _ = self.engine.events.send(Event {
            tree: self.tree,
            process: self.tree,
            path: Vec::new(),
            program: None,
            kind: EventKind::Stopped {
                reason: error.to_string(),
            },
        });
        for reply in std::mem::take(&mut self.renewals) {
            let _ = reply.send(Err(error.clone()));
        }
        self.owner.outcome.modify(|o| {
            if o.stopped.is_none() {
                o.stopped = Some(error);
            }
        });
        self.dispatches.cancel_all();
        // Pending replies are dropped: their callers read the stop reason.
        self.after.clear();
        self.close_door();
    }

    async fn finish(&mut self) {
        // The lease is given up after the last snapshot is written.
        if let Err(error) = self.settle_snapshot().await {
            self.stop(error);
            return;
        }
        if !self.released {
            let _ = self.engine.store.release(self.tree, self.owner.token).await;
        }
        self.engine.forget(self.tree, self.owner.token);
        self.owner.outcome.modify(|o| o.finished = true);
        self.close_door();
        keep_staged(std::mem::take(&mut self.staged));
    }

    fn close_door(&self) {
        if let Ok(mut door) = self.shared.door.lock() {
            *door = Door::Closed;
        }
    }

    async fn close(&mut self, reply: oneshot::Sender<()>) {
        // A commit already sent is finished first; what was staged after it
        // is dropped with the tree's task, as a stop drops it.
        if let Some(flight) = self.flight.take() {
            let _ = self.land_flight(flight).await;
        }
        let _ = self.settle_snapshot().await;
        let _ = self.engine.store.release(self.tree, self.owner.token).await;
        self.engine.forget(self.tree, self.owner.token);
        self.stop(RuntimeError::Closed { tree: self.tree });
        let _ = reply.send(());
    }
}
