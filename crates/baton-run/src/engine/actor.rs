//! The owner task of one tree: the single writer of its log.
//!
//! Every round it takes in commands and dispatch completions, steps runnable
//! processes and advances effect frontiers, staging records (each applied to
//! the in-memory fold at once), then commits the staged records in one
//! append and only then acts on them: dispatches, replies, events. If the
//! append fails the tree stops, so in-memory state that ran ahead of the log
//! is never observed.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot, watch};
use tracing::Instrument;

use crate::budget::{Budget, Capabilities};
use crate::budget::{Dimension, Quota};
use crate::clock::Timestamp;
use crate::digest::Digest;
use crate::failure::{Cause, Failure, Termination};
use crate::ids::ChildKey;
use crate::ids::{EffectId, ProcessId, StartId, TreeId};
use crate::log::Delivery;
use crate::log::{Record, RecordBody};
use crate::payload::Payload;
use crate::program::{
    Boundary, Cancellation, ChildOutcome, ChildSignal, Condition, DeltaSink, DispatchCall, Effect,
    Execution, ExecutionState, Program, ReplayPolicy, Settlement, Signal, SignalBody, Transition,
};
use crate::store::{AcquireRequest, Acquired, Append, AppendOutcome, Lease, TreeLoad, TreeMeta};

use super::state::{Phase, ProcessState, TreeState, ending_failure, signal_digest};
use super::view::{Event, EventKind, TreeView};
use super::{
    ControlError, Door, EngineInner, Published, Publisher, RecoverError, RuntimeError, SignalError,
    SignalReceipt, SignalRequest, Sleep, StartError, TreeOutcome, TreeShared, fold, owner_is_gone,
    panic_failure,
};

/// A request from a handle to the tree's owner task.
pub(crate) enum Command {
    Signal {
        process: ProcessId,
        request: SignalRequest,
        reply: oneshot::Sender<Result<SignalReceipt, SignalError>>,
    },
    Cancel {
        process: ProcessId,
        reason: String,
        reply: oneshot::Sender<Result<(), ControlError>>,
    },
    Kill {
        process: ProcessId,
        reply: oneshot::Sender<Result<(), ControlError>>,
    },
    Resolve {
        effect: EffectId,
        settlement: Settlement,
        reply: oneshot::Sender<Result<(), ControlError>>,
    },
    Replay {
        effect: EffectId,
        reply: oneshot::Sender<Result<(), ControlError>>,
    },
    Inspect {
        reply: oneshot::Sender<Result<TreeView, ControlError>>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
}

struct Completion {
    effect: EffectId,
    attempt: u64,
    settlement: Settlement,
}

struct InFlight {
    process: ProcessId,
    attempt: u64,
    cancel: watch::Sender<bool>,
}

struct DispatchJob {
    process: ProcessId,
    effect: EffectId,
    request: Payload,
    reserve: crate::budget::Meters,
    attempt: u64,
    cancel: Cancellation,
}

/// Commits in a row a round may hold children waits back while other
/// processes keep progressing (each commit takes up to
/// `max_steps_per_commit` steps).
const HELD_COMMITS: u32 = 4;

thread_local! {
    /// A finished tree's staged-record buffer, for the next tree this
    /// thread starts: records are large, and a fresh buffer regrows (moving
    /// them) several times in a tree's first round.
    static SPARE_STAGED: std::cell::Cell<Vec<RecordBody>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The largest staged-record buffer kept for reuse (in records).
const SPARE_STAGED_MAX: usize = 256;

fn spare_staged() -> Vec<RecordBody> {
    SPARE_STAGED.with(std::cell::Cell::take)
}

fn keep_staged(mut staged: Vec<RecordBody>) {
    staged.clear();
    if staged.capacity() <= SPARE_STAGED_MAX {
        SPARE_STAGED.with(|spare| {
            let current = spare.take();
            spare.set(if current.capacity() >= staged.capacity() {
                current
            } else {
                staged
            });
        });
    }
}

/// Something to do once the staged records are durable.
enum After {
    Dispatch(DispatchJob),
    Reply(Box<dyn FnOnce() + Send>),
}

struct Actor {
    engine: Arc<EngineInner>,
    /// Held for the task's life so the engine's weak entry for this tree
    /// stays reachable by handles while the tree runs; its door is where
    /// the task hibernates.
    shared: Arc<TreeShared>,
    tree: TreeId,
    state: TreeState,
    programs: BTreeMap<ProcessId, Program>,
    executions: BTreeMap<ProcessId, Box<dyn Execution>>,
    token: u64,
    head_seq: u64,
    head: Digest,
    snapshots: SnapshotPace,
    /// Renew the lease first thing (set when woken from hibernation).
    renew: bool,
    /// The commit that ended the tree gave up the lease.
    released: bool,
    staged: Vec<RecordBody>,
    after: Vec<After>,
    in_flight: BTreeMap<EffectId, InFlight>,
    replay_allowed: BTreeSet<EffectId>,
    /// Processes not yet terminated: a cache of the fold kept by `stage`, so
    /// each round visits live processes only.
    live: BTreeSet<ProcessId>,
    /// Inspections wait for the round's commit so they show committed state only.
    inspects: Vec<oneshot::Sender<Result<TreeView, ControlError>>>,
    attempts: u64,
    /// Commits in a row that ended with children waits held back (see
    /// [`Actor::drive`]).
    held: u32,
    // Channel items are boxed: tokio allocates each channel's first block of
    // 32 slots up front, so small items keep an idle tree small.
    commands: mpsc::UnboundedReceiver<Box<Command>>,
    completions: mpsc::UnboundedReceiver<Box<Completion>>,
    completion_sender: mpsc::UnboundedSender<Box<Completion>>,
    outcome: Publisher,
}

enum Held {
    Store(crate::store::StoreError),
    Lease { owner: String, until: Timestamp },
}

async fn acquire(
    engine: &EngineInner,
    tree: TreeId,
    force: bool,
) -> Result<(Lease, TreeLoad), Held> {
    let mut force = force;
    loop {
        let request = AcquireRequest {
            tree,
            owner: engine.owner.clone(),
            now: engine.clock.now(),
            ttl: engine.lease_ttl,
            force,
        };
        match engine.store.acquire(request).await.map_err(Held::Store)? {
            Acquired::Granted { lease, load } => return Ok((lease, load)),
            Acquired::LeaseHeld { owner, .. } if !force && owner_is_gone(&owner) => {
                tracing::info!(%tree, %owner, "taking over the lease of a writer that is gone");
                force = true;
            }
            Acquired::LeaseHeld { owner, until } => return Err(Held::Lease { owner, until }),
        }
    }
}

fn catch<T>(
    code: &str,
    f: impl FnOnce() -> Result<T, crate::failure::StepError>,
) -> Result<T, Failure> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(error.0),
        Err(panic) => Err(panic_failure(code, panic)),
    }
}

fn restore(program: &Program, state: &ExecutionState) -> Result<Box<dyn Execution>, Failure> {
    catch("execution.restore.panicked", || {
        program.definition().restore(state)
    })
}

/// Starts a new tree (or takes up the stored one with the same id).
pub(super) async fn start(
    engine: &Arc<EngineInner>,
    program: Program,
    id: StartId,
    input: Payload,
    budget: Budget,
    capabilities: Capabilities,
    deadline: Option<Timestamp>,
) -> Result<Arc<TreeShared>, StartError> {
    let tree = ProcessId::root(&id);
    let (lease, load) = match acquire(engine, tree, false).await {
        Ok(granted) => granted,
        Err(Held::Store(error)) => return Err(error.into()),
        Err(Held::Lease { owner, until }) => return Err(StartError::LeaseHeld { owner, until }),
    };
    let release = |engine: &Arc<EngineInner>| {
        let (store, token) = (engine.store.clone(), lease.token);
        async move {
            let _ = store.release(tree, token).await;
        }
    };
    if load.exists() {
        let folded = match fold(tree, &load) {
            Ok(folded) => folded,
            Err(error) => {
                release(engine).await;
                return Err(error.into());
            }
        };
        let root = &folded.0.processes[&tree];
        if root.program.digest != program.reference().digest || root.input != input.digest() {
            release(engine).await;
            return Err(StartError::Conflict { id });
        }
        if folded.0.root_termination().is_some() {
            release(engine).await;
            return Ok(finished(engine, &folded.0));
        }
        return spawn(engine, folded, lease.token).map_err(StartError::from);
    }
    let started = catch("execution.start.panicked", || {
        program.definition().start(&input)
    })
    .and_then(|execution| {
        let state = catch("execution.snapshot.panicked", || execution.snapshot())?;
        let restored = restore(&program, &state).map_err(|failure| {
            Failure::contract(
                "execution.snapshot.unrestorable",
                format!("initial state does not restore: {failure}"),
            )
        })?;
        Ok((state, restored))
    });
    let started = started.and_then(|(state, execution)| {
        if state.0.len() as u64 > engine.limits.max_state_bytes {
            return Err(Failure::execution(
                "engine.limit.state",
                format!(
                    "initial state of {} bytes exceeds the tree's limit of {}",
                    state.0.len(),
                    engine.limits.max_state_bytes
                ),
            ));
        }
        Ok((state, execution))
    });
    let (state, execution) = match started {
        Ok(started) => started,
        Err(failure) => {
            release(engine).await;
            return Err(StartError::Program(failure));
        }
    };
    let body = RecordBody::TreeStarted {
        start: id.clone(),
        root: tree,
        program: program.reference().clone(),
        input,
        budget,
        capabilities,
        deadline,
        limits: engine.limits.clone(),
        state,
    };
    let tree_state = TreeState::started(&body)
        .map_err(|e| StartError::Program(Failure::execution("engine.start.invalid", e.0)))?;
    let record = Record::seal(1, Digest::ZERO, &body);
    let mut tree_state = tree_state;
    tree_state.history_bytes = record.body.len() as u64;
    let meta = TreeMeta {
        tree,
        scope: id.scope.clone(),
        status: tree_state.tree_status(),
        updated: engine.clock.now(),
    };
    let append = Append {
        tree,
        token: lease.token,
        records: vec![record.clone()],
        meta,
        release: false,
    };
    match engine.store.append(vec![append]).await {
        Ok(outcomes)
            if matches!(
                outcomes.first(),
                Some(AppendOutcome::Committed | AppendOutcome::Duplicate)
            ) => {}
        Ok(_) => {
            release(engine).await;
            return Err(StartError::LeaseHeld {
                owner: "another writer".into(),
                until: engine.clock.now(),
            });
        }
        Err(error) => return Err(error.into()),
    }
    let _ = engine.events.send(Event {
        tree,
        process: tree,
        path: Vec::new(),
        kind: EventKind::ProcessStarted { seq: 1 },
    });
    let (shared, mut actor) = prepare(
        engine,
        (tree_state, 1, record.hash),
        lease.token,
        BTreeMap::from([(tree, execution)]),
    )?;
    // The tree's first round runs here, on the caller's task: the steps it
    // can take at once and their commit, as its own task would run them
    // (a failed commit stops the tree, reported through its handles). A
    // tree that ends in its first round, like a pipeline of pure stages,
    // then needs no task of its own and no hand-off between threads; any
    // other continues in its task.
    let span = tracing::info_span!("tree", %tree);
    actor.drive();
    if !actor.staged.is_empty()
        && let Err(error) = actor.commit().instrument(span.clone()).await
    {
        actor.stop(error);
        return Ok(shared);
    }
    if actor.done() {
        actor.finish().instrument(span).await;
    } else {
        spawn_owner(engine, tree, actor.run());
    }
    Ok(shared)
}

/// Takes up a stored, unfinished tree as its writer.
pub(super) async fn resume(
    engine: &Arc<EngineInner>,
    tree: TreeId,
    force: bool,
) -> Result<Arc<TreeShared>, RecoverError> {
    let (lease, load) = match acquire(engine, tree, force).await {
        Ok(granted) => granted,
        Err(Held::Store(error)) => return Err(error.into()),
        Err(Held::Lease { owner, until }) => {
            return Err(RecoverError::LeaseHeld { tree, owner, until });
        }
    };
    let folded = match fold(tree, &load) {
        Ok(folded) => folded,
        Err(error) => {
            let _ = engine.store.release(tree, lease.token).await;
            return Err(error);
        }
    };
    spawn(engine, folded, lease.token)
}

/// A shared record of a tree that has already finished.
pub(super) fn finished(engine: &Arc<EngineInner>, state: &TreeState) -> Arc<TreeShared> {
    let root = &state.processes[&state.root];
    let outcome = Published::new(TreeOutcome {
        terminations: state
            .processes
            .iter()
            .filter_map(|(id, p)| p.termination.clone().map(|t| (*id, t)))
            .collect(),
        drained: state.processes.keys().copied().collect(),
        stopped: None,
        finished: true,
        abandoned: false,
    });
    let shared = Arc::new(TreeShared {
        tree: state.root,
        scope: state.start.scope.clone(),
        program: root.program.digest,
        input: root.input,
        door: Mutex::new(Door::Closed),
        outcome,
    });
    if let Ok(mut trees) = engine.trees.lock() {
        trees.insert(state.root, Arc::downgrade(&shared));
    }
    shared
}

fn spawn(
    engine: &Arc<EngineInner>,
    folded: (TreeState, u64, Digest),
    token: u64,
) -> Result<Arc<TreeShared>, RecoverError> {
    spawn_with(engine, folded, token, BTreeMap::new())
}

fn spawn_with(
    engine: &Arc<EngineInner>,
    folded: (TreeState, u64, Digest),
    token: u64,
    executions: BTreeMap<ProcessId, Box<dyn Execution>>,
) -> Result<Arc<TreeShared>, RecoverError> {
    let (shared, actor) = prepare(engine, folded, token, executions)?;
    spawn_owner(engine, shared.tree, actor.run());
    Ok(shared)
}

/// The shared record and the owner of a tree taken up at `head_seq`: the
/// tree is registered and its door is open (commands queue for the owner),
/// but nothing runs until the caller drives the owner or spawns its task.
fn prepare(
    engine: &Arc<EngineInner>,
    (state, head_seq, head): (TreeState, u64, Digest),
    token: u64,
    executions: BTreeMap<ProcessId, Box<dyn Execution>>,
) -> Result<(Arc<TreeShared>, Actor), RecoverError> {
    let tree = state.root;
    let programs = programs_of(engine, &state)?;
    let root = &state.processes[&tree];
    let outcome_receiver = Published::new(TreeOutcome::default());
    let outcome = Publisher::new(outcome_receiver.clone());
    let shared = Arc::new(TreeShared {
        tree,
        scope: state.start.scope.clone(),
        program: root.program.digest,
        input: root.input,
        door: Mutex::new(Door::Closed),
        outcome: outcome_receiver,
    });
    let owner = Owner {
        token,
        head_seq,
        head,
        snapshots: SnapshotPace::default(),
        outcome,
        renew: false,
    };
    let (sender, channels) = channels();
    let actor = Actor::new(
        engine, &shared, state, owner, programs, executions, channels,
    );
    {
        let mut door = shared.door.lock().map_err(|_| RecoverError::Corrupt {
            tree,
            message: "a tree's door lock was poisoned".into(),
        })?;
        *door = Door::Awake(sender);
    }
    if let Ok(mut trees) = engine.trees.lock() {
        trees.insert(tree, Arc::downgrade(&shared));
    }
    Ok((shared, actor))
}

/// The program of every live process, from the registry.
fn programs_of(
    engine: &EngineInner,
    state: &TreeState,
) -> Result<BTreeMap<ProcessId, Program>, RecoverError> {
    let mut programs = BTreeMap::new();
    for (id, process) in &state.processes {
        if process.termination.is_some() {
            continue;
        }
        let program = engine.program(&process.program.digest).ok_or_else(|| {
            RecoverError::ProgramUnavailable {
                tree: state.root,
                name: process.program.name.to_string(),
                digest: process.program.digest,
            }
        })?;
        programs.insert(*id, program);
    }
    Ok(programs)
}

/// What a hibernating tree keeps: its committed state and its place in the
/// log. Everything else is rebuilt when a command wakes it.
pub(crate) struct Sleeper {
    state: Dormant,
    owner: Owner,
}

/// What the owner task of a tree carries across its sleeps.
struct Owner {
    token: u64,
    head_seq: u64,
    head: Digest,
    snapshots: SnapshotPace,
    outcome: Publisher,
    /// Renew the lease before anything else (it was not renewed while asleep).
    renew: bool,
}

/// A sleeping tree's state, as [`Sleep`] asks: packed into its JSON (a
/// fraction of the memory of the unpacked maps), or left to the store.
enum Dormant {
    Live(TreeState),
    Packed(Box<[u8]>),
    Stored,
}

impl Dormant {
    fn of(state: TreeState, sleep: Sleep) -> Dormant {
        match sleep {
            Sleep::Unloaded => Dormant::Stored,
            Sleep::Awake | Sleep::Packed => match serde_json::to_vec(&state) {
                Ok(bytes) => Dormant::Packed(bytes.into_boxed_slice()),
                Err(_) => Dormant::Live(state),
            },
        }
    }
}

impl Owner {
    /// Tells the tree's handles it stopped without a result.
    fn close(self, error: RuntimeError) {
        self.outcome.modify(|o| {
            if o.stopped.is_none() {
                o.stopped = Some(error);
            }
        });
    }
}

impl Sleeper {
    /// Tells the tree's handles it stopped without a result.
    pub(super) fn close(self, error: RuntimeError) {
        self.owner.close(error);
    }

    /// The fencing token of the lease the sleeping tree holds.
    pub(super) fn token(&self) -> u64 {
        self.owner.token
    }
}

/// Log bytes written since the last snapshot, per byte of that snapshot,
/// before the next one is due.
const SNAPSHOT_LOG_RATIO: u64 = 4;

/// When the next snapshot is due.
#[derive(Clone, Copy, Debug, Default)]
struct SnapshotPace {
    records: u64,
    bytes: u64,
    last_size: u64,
}

/// Respawns the owner task of a hibernating tree; `None` (after telling
/// its handles) when its packed state does not read back.
pub(super) fn wake(
    engine: &Arc<EngineInner>,
    shared: &Arc<TreeShared>,
    sleeper: Sleeper,
) -> Option<mpsc::UnboundedSender<Box<Command>>> {
    let state = match sleeper.state {
        Dormant::Live(state) => state,
        Dormant::Packed(bytes) => match serde_json::from_slice(&bytes) {
            Ok(state) => state,
            Err(error) => {
                sleeper.owner.close(RuntimeError::Inconsistent {
                    tree: shared.tree,
                    message: format!("a sleeping tree's state did not read back: {error}"),
                });
                return None;
            }
        },
        Dormant::Stored => return Some(launch_reloading(engine, shared, sleeper.owner)),
    };
    // Every live program was registered when the tree went to sleep, and the
    // registry only grows.
    let programs = programs_of(engine, &state).unwrap_or_default();
    Some(launch_actor(
        engine,
        shared,
        state,
        sleeper.owner,
        programs,
        BTreeMap::new(),
    ))
}

/// The ends of a new owner task's channels.
struct Channels {
    commands: mpsc::UnboundedReceiver<Box<Command>>,
    completions: mpsc::UnboundedReceiver<Box<Completion>>,
    completion_sender: mpsc::UnboundedSender<Box<Completion>>,
}

fn channels() -> (mpsc::UnboundedSender<Box<Command>>, Channels) {
    let (commands_sender, commands) = mpsc::unbounded_channel();
    let (completion_sender, completions) = mpsc::unbounded_channel();
    (
        commands_sender,
        Channels {
            commands,
            completions,
            completion_sender,
        },
    )
}

fn launch_actor(
    engine: &Arc<EngineInner>,
    shared: &Arc<TreeShared>,
    state: TreeState,
    owner: Owner,
    programs: BTreeMap<ProcessId, Program>,
    executions: BTreeMap<ProcessId, Box<dyn Execution>>,
) -> mpsc::UnboundedSender<Box<Command>> {
    let tree = state.root;
    let (sender, channels) = channels();
    let actor = Actor::new(engine, shared, state, owner, programs, executions, channels);
    spawn_owner(engine, tree, actor.run());
    sender
}

/// Respawns the owner task of a tree whose state was left to the store: the
/// task loads and folds it first (commands wait in the channel meanwhile),
/// and stops the tree if the log is not exactly where this writer left it.
fn launch_reloading(
    engine: &Arc<EngineInner>,
    shared: &Arc<TreeShared>,
    owner: Owner,
) -> mpsc::UnboundedSender<Box<Command>> {
    let tree = shared.tree;
    let (sender, channels) = channels();
    let (engine_ref, shared) = (engine.clone(), shared.clone());
    spawn_owner(engine, tree, async move {
        let engine = engine_ref;
        match reload(&engine, tree, &owner).await {
            Ok(state) => {
                let programs = programs_of(&engine, &state).unwrap_or_default();
                let actor = Actor::new(
                    &engine,
                    &shared,
                    state,
                    owner,
                    programs,
                    BTreeMap::new(),
                    channels,
                );
                actor.run().await;
            }
            Err(error) => {
                owner.close(error);
                if let Ok(mut door) = shared.door.lock() {
                    *door = Door::Closed;
                }
            }
        }
    });
    sender
}

/// Loads and folds a sleeping tree, checking the log ends where it did.
async fn reload(
    engine: &EngineInner,
    tree: TreeId,
    owner: &Owner,
) -> Result<TreeState, RuntimeError> {
    let load = engine
        .store
        .load(tree)
        .await
        .map_err(|error| RuntimeError::Storage {
            tree,
            head_seq: owner.head_seq,
            error,
        })?;
    let (state, head_seq, head) =
        fold(tree, &load).map_err(|error| RuntimeError::Inconsistent {
            tree,
            message: format!("a sleeping tree did not reload: {error}"),
        })?;
    if (head_seq, head) != (owner.head_seq, owner.head) {
        return Err(RuntimeError::Conflict {
            tree,
            expected: owner.head_seq,
            found: head_seq,
        });
    }
    Ok(state)
}

/// Spawns a tree's owner task and keeps its abort handle.
fn spawn_owner(
    engine: &Arc<EngineInner>,
    tree: TreeId,
    task: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let span = tracing::info_span!("tree", %tree);
    let task = tokio::spawn(task.instrument(span));
    if let Ok(mut tasks) = engine.tasks.lock() {
        // Prune finished handles now and then, so starting many trees stays linear.
        if tasks.len() % 1024 == 1023 {
            tasks.retain(|task| !task.is_finished());
        }
        tasks.push(task.abort_handle());
    }
}

impl Actor {
    fn new(
        engine: &Arc<EngineInner>,
        shared: &Arc<TreeShared>,
        state: TreeState,
        owner: Owner,
        programs: BTreeMap<ProcessId, Program>,
        executions: BTreeMap<ProcessId, Box<dyn Execution>>,
        channels: Channels,
    ) -> Actor {
        let live = state
            .processes
            .iter()
            .filter(|(_, p)| p.termination.is_none())
            .map(|(id, _)| *id)
            .collect();
        Actor {
            engine: engine.clone(),
            shared: shared.clone(),
            tree: state.root,
            state,
            programs,
            executions,
            token: owner.token,
            head_seq: owner.head_seq,
            head: owner.head,
            snapshots: owner.snapshots,
            renew: owner.renew,
            released: false,
            staged: spare_staged(),
            after: Vec::new(),
            in_flight: BTreeMap::new(),
            live,
            replay_allowed: BTreeSet::new(),
            inspects: Vec::new(),
            attempts: 0,
            held: 0,
            commands: channels.commands,
            completions: channels.completions,
            completion_sender: channels.completion_sender,
            outcome: owner.outcome,
        }
    }

    async fn run(mut self) {
        if self.renew {
            self.renew = false;
            if !self.renew_lease().await {
                return;
            }
        }
        loop {
            while let Ok(command) = self.commands.try_recv() {
                if let Some(reply) = self.command(*command) {
                    self.close(reply).await;
                    return;
                }
            }
            while let Ok(completion) = self.completions.try_recv() {
                self.complete(*completion);
            }
            self.check_deadline();
            self.check_history();
            self.drive();
            if !self.staged.is_empty() {
                if let Err(error) = self.commit().await {
                    self.stop(error);
                    return;
                }
                continue;
            }
            self.flush_after();
            if self.done() {
                self.finish().await;
                return;
            }
            if self.idle() {
                match self.hibernate() {
                    None => return,
                    Some(awake) => self = awake,
                }
            }
            let deadline = self.live_deadline();
            let renew_at = self.engine.clock.now().plus(self.engine.lease_ttl / 3);
            let clock = self.engine.clock.clone();
            tokio::select! {
                biased;
                command = self.commands.recv() => {
                    if let Some(command) = command
                        && let Some(reply) = self.command(*command)
                    {
                        self.close(reply).await;
                        return;
                    }
                }
                Some(completion) = self.completions.recv() => self.complete(*completion),
                () = clock.sleep_until(deadline.unwrap_or(Timestamp(u64::MAX))), if deadline.is_some() => {}
                () = clock.sleep_until(renew_at) => {
                    if !self.renew_lease().await {
                        return;
                    }
                }
            }
        }
    }

    /// Extends the lease; `false` (after stopping the tree) when another
    /// writer holds it now.
    async fn renew_lease(&mut self) -> bool {
        let until = self.engine.clock.now().plus(self.engine.lease_ttl);
        match self.engine.store.renew(self.tree, self.token, until).await {
            Ok(true) => true,
            Ok(false) => {
                let error = RuntimeError::Fenced {
                    tree: self.tree,
                    head_seq: self.head_seq,
                };
                self.stop(error);
                false
            }
            Err(error) => {
                tracing::warn!(tree = %self.tree, %error, "lease renewal failed");
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
            && self.in_flight.is_empty()
            && self.replay_allowed.is_empty()
            && self.live_deadline().is_none()
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
        if !self.commands.is_empty() || !self.completions.is_empty() {
            return Some(self);
        }
        *door = Door::Asleep(Box::new(Sleeper {
            state: Dormant::of(self.state, self.engine.sleep),
            owner: Owner {
                token: self.token,
                head_seq: self.head_seq,
                head: self.head,
                snapshots: self.snapshots,
                outcome: self.outcome,
                renew: true,
            },
        }));
        None
    }

    fn done(&self) -> bool {
        self.state
            .processes
            .values()
            .all(|p| p.termination.is_some())
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
            self.outcome.modify(|o| o.stopped = Some(inconsistent));
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
            self.executions.remove(process);
            let abandoned: Vec<EffectId> = self
                .in_flight
                .iter()
                .filter(|(_, flight)| flight.process == *process)
                .map(|(effect, _)| *effect)
                .collect();
            for effect in abandoned {
                if let Some(flight) = self.in_flight.remove(&effect) {
                    let _ = flight.cancel.send(true);
                }
            }
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
            Command::Cancel {
                process,
                reason,
                reply,
            } => {
                let result = self.live(process).map(|_| ());
                if result.is_ok() && self.state.processes[&process].cancel.is_none() {
                    self.stage(RecordBody::CancelRequested {
                        process,
                        cause: Cause::HostCancellation,
                        reason,
                    });
                    for flight in self.in_flight.values().filter(|f| f.process == process) {
                        let _ = flight.cancel.send(true);
                    }
                }
                self.reply(reply, result);
            }
            Command::Kill { process, reply } => {
                let result = self.live(process).map(|_| ());
                if result.is_ok() {
                    self.kill_subtree(process);
                }
                self.reply(reply, result);
            }
            Command::Resolve {
                effect,
                settlement,
                reply,
            } => {
                let result = self.unknown(effect).map(|process| {
                    self.stage(RecordBody::EffectResolved {
                        process,
                        effect,
                        settlement,
                    });
                });
                self.reply(reply, result);
            }
            Command::Replay { effect, reply } => {
                let result = self.unknown(effect).map(|process| {
                    self.replay_allowed.insert(effect);
                    self.stage(RecordBody::EffectReplayed { process, effect });
                });
                self.reply(reply, result);
            }
            Command::Inspect { reply } => self.inspects.push(reply),
            Command::Close { reply } => return Some(reply),
        }
        None
    }

    fn live(&self, process: ProcessId) -> Result<&super::state::ProcessState, ControlError> {
        match self.state.processes.get(&process) {
            Some(p) if p.termination.is_none() => Ok(p),
            _ => Err(ControlError::Terminated { process }),
        }
    }

    /// The live process holding `effect` as an unknown effect.
    fn unknown(&self, effect: EffectId) -> Result<ProcessId, ControlError> {
        self.state
            .processes
            .iter()
            .filter(|(_, p)| p.termination.is_none())
            .find(|(_, p)| {
                p.batch.iter().any(|slot| {
                    slot.id == effect && matches!(&slot.phase, Phase::Settled(s) if s.is_unknown())
                })
            })
            .map(|(id, _)| *id)
            .ok_or(ControlError::NotUnknown {
                tree: self.tree,
                effect,
            })
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
        if !self.check_signal(process, &signal)? {
            return Ok(SignalReceipt::Duplicate);
        }
        self.stage(RecordBody::SignalsAdmitted {
            process,
            signals: vec![signal],
        });
        Ok(SignalReceipt::Admitted)
    }

    /// Checks a signal for a process before anything is written: `Ok(true)`
    /// to admit, `Ok(false)` for an identical signal admitted before.
    fn check_signal(&self, process: ProcessId, signal: &Signal) -> Result<bool, SignalError> {
        let Some(p) = self
            .state
            .processes
            .get(&process)
            .filter(|p| p.termination.is_none())
        else {
            return Err(SignalError::Terminated { process });
        };
        if let Some(digest) = p.receipts.get(&signal.id) {
            return if *digest == signal_digest(signal) {
                Ok(false)
            } else {
                Err(SignalError::Conflict {
                    id: signal.id.clone(),
                })
            };
        }
        let SignalBody::Input { payload } = &signal.body else {
            return Err(SignalError::Rejected(Failure::contract(
                "engine.signal.rejected",
                "only input signals can be delivered",
            )));
        };
        match signal.wait {
            Some(wait) => match p.waits.get(&wait) {
                Some(open) => open.answer_schema.validate(payload).map_err(|violation| {
                    SignalError::Rejected(Failure::contract(
                        "engine.signal.answer.invalid",
                        format!("answer to {wait} rejected: {violation}"),
                    ))
                })?,
                None if p.answered.contains(&wait) => return Err(SignalError::WaitClosed { wait }),
                None => return Err(SignalError::UnknownWait { process, wait }),
            },
            None => {
                self.programs[&process]
                    .descriptor()
                    .check_signal(payload)
                    .map_err(SignalError::Rejected)?;
            }
        }
        if !p.allows(&Dimension::Signals, 1) {
            return Err(SignalError::BudgetExhausted { process });
        }
        if p.mailbox.len() as u64 >= self.state.limits.max_pending_signals {
            return Err(SignalError::MailboxFull {
                process,
                limit: self.state.limits.max_pending_signals,
            });
        }
        Ok(true)
    }

    /// Kills a process and every live descendant at once.
    fn kill_subtree(&mut self, process: ProcessId) {
        let children: Vec<ProcessId> = self.state.processes[&process]
            .children
            .values()
            .copied()
            .collect();
        if self.state.processes[&process].termination.is_none() {
            self.end(process, Cause::Kill, "killed by the host");
        }
        for child in children {
            self.kill_subtree(child);
        }
    }

    fn end(&mut self, process: ProcessId, cause: Cause, reason: &str) {
        let unresolved = self.state.processes[&process].unresolved();
        let termination =
            Termination::ended(cause, ending_failure(cause, reason)).with_unresolved(unresolved);
        self.stage(RecordBody::Terminated {
            process,
            termination,
        });
    }

    fn fail(&mut self, process: ProcessId, failure: Failure) {
        let unresolved = self.state.processes[&process].unresolved();
        let termination = Termination::failed(failure).with_unresolved(unresolved);
        self.stage(RecordBody::Terminated {
            process,
            termination,
        });
    }

    fn check_deadline(&mut self) {
        if let Some(deadline) = self.live_deadline()
            && self.engine.clock.now() >= deadline
        {
            let live: Vec<ProcessId> = self
                .state
                .processes
                .iter()
                .filter(|(_, p)| p.termination.is_none())
                .map(|(id, _)| *id)
                .collect();
            for process in live {
                let cause = if process == self.state.root {
                    Cause::HostDeadline
                } else {
                    Cause::ParentDeadline
                };
                self.end(process, cause, "deadline passed");
            }
        }
    }

    /// Closes a tree whose log outgrew its history limit: every live
    /// process fails, so later writes stay possible and small.
    fn check_history(&mut self) {
        if self.state.history_bytes <= self.state.limits.max_history_bytes {
            return;
        }
        let live: Vec<ProcessId> = self
            .state
            .processes
            .iter()
            .filter(|(_, p)| p.termination.is_none())
            .map(|(id, _)| *id)
            .collect();
        for process in live {
            let failure = Failure::execution(
                "engine.limit.history",
                format!(
                    "the tree's log reached {} bytes, over its limit of {}; the tree is closed",
                    self.state.history_bytes, self.state.limits.max_history_bytes
                ),
            );
            self.fail(process, failure);
        }
    }

    fn complete(&mut self, completion: Completion) {
        let Some(flight) = self.in_flight.get(&completion.effect) else {
            return;
        };
        if flight.attempt != completion.attempt {
            return;
        }
        let process = flight.process;
        self.in_flight.remove(&completion.effect);
        if self
            .state
            .processes
            .get(&process)
            .is_none_or(|p| p.termination.is_some())
        {
            return;
        }
        self.stage(RecordBody::EffectSettled {
            process,
            effect: completion.effect,
            settlement: completion.settlement,
        });
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
        loop {
            if self.pass(&mut steps_left, true) {
                if steps_left > 0 {
                    continue;
                }
                if self.held < HELD_COMMITS && !self.staged.is_empty() {
                    self.held += 1;
                    return;
                }
            }
            self.held = 0;
            if !self.pass(&mut steps_left, false) {
                return;
            }
        }
    }

    /// Advances every live process once; whether any progressed.
    fn pass(&mut self, steps_left: &mut usize, hold_waits: bool) -> bool {
        let live: Vec<ProcessId> = self.live.iter().copied().collect();
        let mut progressed = false;
        for process in live {
            progressed |= self.advance(process, steps_left, hold_waits);
        }
        progressed
    }

    fn advance(&mut self, id: ProcessId, steps_left: &mut usize, hold_waits: bool) -> bool {
        let process = &self.state.processes[&id];
        if process.termination.is_some() {
            return false;
        }
        // A process whose parent has ended is canceled (completion cancels
        // remaining children; the parent's subtree drains after it).
        if process.cancel.is_none()
            && let Some(parent) = process.parent
            && self.state.processes[&parent].termination.is_some()
        {
            self.stage(RecordBody::CancelRequested {
                process: id,
                cause: Cause::ParentCancellation,
                reason: "the parent ended".into(),
            });
            return true;
        }
        if let Some(intent) = &process.cancel {
            if self.in_flight.values().any(|flight| flight.process == id) {
                for flight in self.in_flight.values().filter(|f| f.process == id) {
                    let _ = flight.cancel.send(true);
                }
                return false;
            }
            let (cause, reason) = (intent.cause, intent.reason.clone());
            self.end(id, cause, &reason);
            return true;
        }
        if let Some(slot) = process.frontier() {
            let (effect, phase) = (slot.id, slot.phase.clone());
            match (slot.effect.clone(), phase) {
                (Effect::Dispatch { request, reserve }, Phase::Planned) => {
                    self.prepare_dispatch(id, effect, request, reserve);
                    true
                }
                (Effect::Dispatch { request, reserve }, Phase::Pending)
                    if !self.in_flight.contains_key(&effect) =>
                {
                    self.recover_dispatch(id, effect, request, reserve);
                    true
                }
                (
                    Effect::StartChild {
                        key,
                        program,
                        input,
                        budget,
                        capabilities,
                    },
                    Phase::Planned,
                ) => {
                    self.start_child(id, effect, key, program, input, budget, capabilities);
                    true
                }
                (Effect::SignalChild { key, signal }, Phase::Planned) => {
                    self.control_child(id, effect, key, Ok(signal));
                    true
                }
                (Effect::CancelChild { key, reason }, Phase::Planned) => {
                    self.control_child(id, effect, key, Err(reason));
                    true
                }
                (
                    Effect::WaitChildren {
                        keys,
                        boundary,
                        condition,
                    },
                    Phase::Planned,
                ) if !hold_waits => self.wait_children(id, effect, &keys, boundary, condition),
                _ => false,
            }
        } else if process.runnable() && *steps_left > 0 {
            *steps_left -= 1;
            self.step(id);
            true
        } else {
            false
        }
    }

    fn prepare_dispatch(
        &mut self,
        id: ProcessId,
        effect: EffectId,
        request: Payload,
        reserve: crate::budget::Meters,
    ) {
        let process = &self.state.processes[&id];
        for (meter, amount) in &reserve {
            let dimension = Dimension::Meter(meter.clone());
            if !process.allows(&dimension, *amount) {
                let failure = Failure::execution(
                    "engine.limit.meter",
                    format!(
                        "reserving {amount} {meter} exceeds the remaining budget ({} spent of {})",
                        process.spent(&dimension),
                        process.budget.meter(meter)
                    ),
                );
                self.stage(RecordBody::EffectSettled {
                    process: id,
                    effect,
                    settlement: Settlement::failed(failure),
                });
                return;
            }
        }
        self.stage(RecordBody::EffectPending {
            process: id,
            effect,
        });
        self.launch_later(id, effect, request, reserve);
    }

    /// A dispatch found pending with nothing in flight (after recovery or a
    /// host replay): send it again only when that is safe.
    fn recover_dispatch(
        &mut self,
        id: ProcessId,
        effect: EffectId,
        request: Payload,
        reserve: crate::budget::Meters,
    ) {
        let policy = self.programs[&id]
            .dispatcher()
            .map(|dispatcher| {
                catch_unwind(AssertUnwindSafe(|| dispatcher.replay_policy(&request)))
                    .unwrap_or(ReplayPolicy::Never)
            })
            .unwrap_or(ReplayPolicy::Never);
        if self.replay_allowed.remove(&effect) || policy == ReplayPolicy::SameIdentity {
            self.launch_later(id, effect, request, reserve);
        } else {
            self.stage(RecordBody::EffectSettled {
                process: id,
                effect,
                settlement: Settlement::Unknown {
                    diagnostic: "the dispatch was pending when its writer stopped; its outcome is unknown and its replay policy forbids sending it again".into(),
                },
            });
        }
    }

    fn refuse(&mut self, process: ProcessId, effect: EffectId, failure: Failure) {
        self.stage(RecordBody::EffectSettled {
            process,
            effect,
            settlement: Settlement::failed(failure),
        });
    }

    /// Why a parent cannot grant `child` from its budget, if it cannot.
    fn grant_refusal(parent: &ProcessState, child: &Budget) -> Option<String> {
        let mut dimensions = vec![Dimension::Steps, Dimension::Effects, Dimension::Signals];
        dimensions.extend(parent.budget.meters.keys().cloned().map(Dimension::Meter));
        for dimension in dimensions {
            let (have, want) = (parent.budget.quota(&dimension), child.quota(&dimension));
            match (have, want) {
                (Quota::Unlimited, _) => {}
                (Quota::Finite(_), Quota::Unlimited) => {
                    return Some(format!(
                        "a finite parent cannot grant unlimited {dimension}"
                    ));
                }
                (Quota::Finite(max), Quota::Finite(amount)) => {
                    if !parent.allows(&dimension, amount) {
                        return Some(format!(
                            "granting {amount} {dimension} exceeds the parent's remaining {} of {max}",
                            max.saturating_sub(parent.spent(&dimension))
                        ));
                    }
                }
            }
        }
        None
    }

    #[allow(clippy::too_many_arguments)]
    fn start_child(
        &mut self,
        id: ProcessId,
        effect: EffectId,
        key: ChildKey,
        program: Digest,
        input: Payload,
        budget: Budget,
        capabilities: Capabilities,
    ) {
        let parent = &self.state.processes[&id];
        if let Some(existing) = parent.children.get(&key).copied() {
            let child = &self.state.processes[&existing];
            let same = child.program.digest == program
                && child.input == input.digest()
                && child.budget == budget
                && child.capabilities == capabilities;
            if same {
                let receipt = Payload::encode(&existing).expect("a process id encodes");
                self.stage(RecordBody::EffectSettled {
                    process: id,
                    effect,
                    settlement: Settlement::ok(receipt),
                });
            } else {
                let failure = Failure::contract(
                    "engine.child.identity_conflict",
                    format!(
                        "child key {key} was started before with a different program, input, budget or capabilities"
                    ),
                );
                self.refuse(id, effect, failure);
            }
            return;
        }
        let Some(child_program) = self.programs[&id]
            .children()
            .iter()
            .find(|p| p.reference().digest == program)
            .cloned()
        else {
            let failure = Failure::contract(
                "engine.child.program.undeclared",
                format!(
                    "{program} is not one of the declared children of {}",
                    parent.program.name
                ),
            );
            self.refuse(id, effect, failure);
            return;
        };
        if let Err(failure) = child_program.descriptor().check_input(&input) {
            self.refuse(
                id,
                effect,
                Failure::contract("engine.child.input.invalid", failure.message),
            );
            return;
        }
        let missing = capabilities.missing_from(&parent.capabilities);
        if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(|n| n.as_str()).collect();
            let failure = Failure::contract(
                "engine.child.capability_escalation",
                format!("the parent lacks capabilities {}", names.join(", ")),
            );
            self.refuse(id, effect, failure);
            return;
        }
        if let Some(reason) = Self::grant_refusal(parent, &budget) {
            self.refuse(
                id,
                effect,
                Failure::execution("engine.child.budget_exhausted", reason),
            );
            return;
        }
        let limits = &self.state.limits;
        let active = u64::from(parent.live_children);
        let limit = if parent.depth + 1 > limits.max_depth {
            Some(format!(
                "depth {} exceeds the limit of {}",
                parent.depth + 1,
                limits.max_depth
            ))
        } else if active >= u64::from(limits.max_active_children) {
            Some(format!(
                "{active} live children reach the limit of {}",
                limits.max_active_children
            ))
        } else if self.state.processes.len() as u64 >= limits.max_processes {
            Some(format!(
                "the tree reached its limit of {} processes",
                limits.max_processes
            ))
        } else {
            None
        };
        if let Some(reason) = limit {
            self.refuse(
                id,
                effect,
                Failure::execution("engine.child.tree_limit", reason),
            );
            return;
        }
        let started = catch("execution.start.panicked", || {
            child_program.definition().start(&input)
        })
        .and_then(|execution| {
            let state = catch("execution.snapshot.panicked", || execution.snapshot())?;
            let restored = restore(&child_program, &state)?;
            Ok((state, restored))
        });
        let (state, execution) = match started {
            Ok(started) => started,
            Err(failure) => {
                let failure = Failure::new(
                    failure.kind,
                    "engine.process.start.failed",
                    failure.to_string(),
                );
                self.refuse(id, effect, failure);
                return;
            }
        };
        if state.0.len() as u64 > limits.max_state_bytes {
            let failure = Failure::execution(
                "engine.child.tree_limit",
                format!(
                    "initial state of {} bytes exceeds the limit of {}",
                    state.0.len(),
                    limits.max_state_bytes
                ),
            );
            self.refuse(id, effect, failure);
            return;
        }
        let child = ProcessId::child(id, &key);
        self.stage(RecordBody::ChildStarted {
            parent: id,
            effect,
            child,
            key,
            name: child_program.descriptor().name().clone(),
            program: child_program.reference().digest,
            input,
            budget,
            capabilities,
            state,
        });
        self.executions.insert(child, execution);
        self.programs.insert(child, child_program);
    }

    /// Delivers a signal (`Ok`) or a cancellation (`Err(reason)`) to a child:
    /// one record carries the delivery and the receipt; a refusal settles
    /// the receipt alone and leaves the child unchanged.
    fn control_child(
        &mut self,
        id: ProcessId,
        effect: EffectId,
        key: ChildKey,
        control: Result<ChildSignal, String>,
    ) {
        let Some(child) = self.state.processes[&id].children.get(&key).copied() else {
            let failure = Failure::contract(
                "engine.child.control.not_owned",
                format!("{key} is not a child of this process"),
            );
            self.refuse(id, effect, failure);
            return;
        };
        let delivery = match control {
            Ok(signal) => {
                let signal = Signal {
                    id: signal.id,
                    wait: signal.wait,
                    body: SignalBody::Input {
                        payload: signal.payload,
                    },
                };
                match self.check_signal(child, &signal) {
                    Ok(true) => Delivery::Signal { signal },
                    Ok(false) => {
                        // The same signal was delivered before: receipted, not delivered twice.
                        self.stage(RecordBody::EffectSettled {
                            process: id,
                            effect,
                            settlement: Settlement::ok(Payload::null()),
                        });
                        return;
                    }
                    Err(error) => {
                        let kind = match &error {
                            SignalError::Rejected(failure) => failure.kind,
                            _ => crate::failure::FailureKind::Execution,
                        };
                        let failure =
                            Failure::new(kind, "engine.child.signal.rejected", error.to_string());
                        self.refuse(id, effect, failure);
                        return;
                    }
                }
            }
            Err(reason) => {
                let target = &self.state.processes[&child];
                if target.termination.is_some() {
                    let failure = Failure::execution(
                        "engine.child.cancel.rejected",
                        format!("{key} has already terminated"),
                    );
                    self.refuse(id, effect, failure);
                    return;
                }
                if target.cancel.is_some() {
                    self.stage(RecordBody::EffectSettled {
                        process: id,
                        effect,
                        settlement: Settlement::ok(Payload::null()),
                    });
                    return;
                }
                Delivery::Cancel { reason }
            }
        };
        self.stage(RecordBody::ControlDelivered {
            parent: id,
            effect,
            child,
            delivery,
        });
    }

    /// Whether a process and its whole subtree have terminated.
    fn drained(&self, id: ProcessId) -> bool {
        let process = &self.state.processes[&id];
        process.termination.is_some() && process.children.values().all(|child| self.drained(*child))
    }

    /// Unresolved effects anywhere in a subtree.
    fn subtree_unresolved(&self, id: ProcessId, into: &mut Vec<EffectId>) {
        let process = &self.state.processes[&id];
        match &process.termination {
            Some(termination) => into.extend_from_slice(termination.unresolved_effects()),
            None => into.extend(process.unresolved()),
        }
        for child in process.children.values() {
            self.subtree_unresolved(*child, into);
        }
    }

    /// Settles a children wait once its condition holds; returns whether it did.
    fn wait_children(
        &mut self,
        id: ProcessId,
        effect: EffectId,
        keys: &[ChildKey],
        boundary: Boundary,
        condition: Condition,
    ) -> bool {
        let parent = &self.state.processes[&id];
        let mut children = Vec::with_capacity(keys.len());
        for key in keys {
            match parent.children.get(key) {
                Some(child) => children.push((key, *child)),
                None => {
                    let failure = Failure::contract(
                        "engine.child.wait.invalid",
                        format!("{key} is not a child of this process"),
                    );
                    self.refuse(id, effect, failure);
                    return true;
                }
            }
        }
        let needed = match condition {
            Condition::All => keys.len(),
            Condition::Any => 1,
            Condition::Quorum(k) => k as usize,
        };
        if needed > keys.len() || (needed == 0 && condition != Condition::All) {
            let failure = Failure::contract(
                "engine.child.wait.invalid",
                format!("{condition:?} cannot be met by {} children", keys.len()),
            );
            self.refuse(id, effect, failure);
            return true;
        }
        let mut ready = Vec::new();
        for (key, child) in children {
            let process = &self.state.processes[&child];
            let Some(termination) = &process.termination else {
                continue;
            };
            let termination = match boundary {
                Boundary::Result => termination.clone(),
                Boundary::Drained if self.drained(child) => {
                    let mut unresolved = Vec::new();
                    self.subtree_unresolved(child, &mut unresolved);
                    termination.clone().with_unresolved(unresolved)
                }
                Boundary::Drained => continue,
            };
            ready.push(ChildOutcome {
                key: key.clone(),
                process: child,
                termination,
            });
        }
        if ready.len() < needed {
            return false;
        }
        let answer = Payload::encode(&ready).expect("child outcomes encode");
        self.stage_with(
            RecordBody::EffectSettled {
                process: id,
                effect,
                settlement: Settlement::ok(answer),
            },
            Some((effect, ready)),
        );
        true
    }

    fn launch_later(
        &mut self,
        process: ProcessId,
        effect: EffectId,
        request: Payload,
        reserve: crate::budget::Meters,
    ) {
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
        self.after.push(After::Dispatch(DispatchJob {
            process,
            effect,
            request,
            reserve,
            attempt: self.attempts,
            cancel,
        }));
    }

    fn step(&mut self, id: ProcessId) {
        let process = &self.state.processes[&id];
        if !process.allows(&Dimension::Steps, 1) {
            let failure = Failure::execution(
                "engine.limit.steps",
                format!("step budget of {} exhausted", process.budget.steps),
            );
            self.fail(id, failure);
            return;
        }
        let program = self.programs[&id].clone();
        let execution = match self.executions.remove(&id) {
            Some(execution) => execution,
            None => match restore(&program, &process.state) {
                Ok(execution) => execution,
                Err(failure) => {
                    self.fail(
                        id,
                        Failure::contract(
                            "engine.committed_execution_state.invalid",
                            format!("recorded state does not restore: {failure}"),
                        ),
                    );
                    return;
                }
            },
        };
        let step = process.steps;
        // The window is the mailbox itself, laid out as one slice (no copy
        // of the signals for each step).
        if let Some(process) = self.state.processes.get_mut(&id) {
            process.mailbox.make_contiguous();
        }
        let window = self.state.processes[&id].mailbox.as_slices().0;
        let span = tracing::debug_span!("step", process = %id, step);
        let _entered = span.enter();
        let mut execution = execution;
        let stepped = catch("execution.step.panicked", || execution.step(window));
        let transition =
            match stepped.and_then(|transition| self.prepare(id, &program, window, transition)) {
                Ok(transition) => transition,
                Err(failure) => {
                    self.fail(id, failure);
                    return;
                }
            };
        let adopted = catch("execution.snapshot.panicked", || execution.snapshot())
            .map_err(|failure| {
                Failure::new(failure.kind, "execution.snapshot.failed", failure.message)
            })
            .and_then(|state| {
                let restored = restore(&program, &state).map_err(|failure| {
                    Failure::contract(
                        "execution.snapshot.unrestorable",
                        format!("candidate state does not restore: {failure}"),
                    )
                })?;
                Ok((state, restored))
            });
        let (state, restored) = match adopted {
            Ok(adopted) => adopted,
            Err(failure) => {
                self.fail(id, failure);
                return;
            }
        };
        if state.0.len() as u64 > self.state.limits.max_state_bytes {
            let failure = Failure::execution(
                "engine.limit.state",
                format!(
                    "state of {} bytes exceeds the tree's limit of {}",
                    state.0.len(),
                    self.state.limits.max_state_bytes
                ),
            );
            self.fail(id, failure);
            return;
        }
        let keep = matches!(transition, Transition::Continue { .. });
        self.stage(RecordBody::StepAdopted {
            process: id,
            step,
            state,
            transition,
        });
        // A waiting process holds no execution in memory; it is restored
        // from its recorded state when woken.
        if keep {
            self.executions.insert(id, restored);
        }
    }

    /// Checks a transition before adoption: consumption, capabilities,
    /// dispatchers, budgets, waits and the output schema.
    fn prepare(
        &self,
        id: ProcessId,
        program: &Program,
        window: &[Signal],
        transition: Transition,
    ) -> Result<Transition, Failure> {
        let process = &self.state.processes[&id];
        let consumed = transition.consumed();
        if consumed > window.len() {
            return Err(Failure::contract(
                "execution.transition.invalid",
                format!(
                    "consumed {consumed} signals of a window of {}",
                    window.len()
                ),
            ));
        }
        match &transition {
            Transition::Continue { effects, .. } => {
                for effect in effects {
                    if let Effect::Dispatch { request, .. } = effect {
                        let Some(dispatcher) = program.dispatcher() else {
                            return Err(Failure::contract(
                                "execution.effect.invalid",
                                format!(
                                    "{} declared a dispatch but has no dispatcher",
                                    program.descriptor().name()
                                ),
                            ));
                        };
                        let required = catch_unwind(AssertUnwindSafe(|| {
                            dispatcher.required_capabilities(request)
                        }))
                        .map_err(|panic| panic_failure("engine.dispatch.panicked", panic))?;
                        let missing = required.missing_from(&process.capabilities);
                        if !missing.is_empty() {
                            let names: Vec<&str> = missing.iter().map(|n| n.as_str()).collect();
                            return Err(Failure::contract(
                                "engine.capability.denied",
                                format!(
                                    "dispatch requires capabilities the process lacks: {}",
                                    names.join(", ")
                                ),
                            ));
                        }
                    }
                }
                let count = effects.len() as u64;
                if !process.allows(&Dimension::Effects, count) {
                    return Err(Failure::execution(
                        "engine.limit.effects",
                        format!(
                            "{count} more effects exceed the effect budget of {}",
                            process.budget.effects
                        ),
                    ));
                }
                if !process.allows(&Dimension::Signals, count) {
                    return Err(Failure::execution(
                        "engine.limit.signals",
                        format!(
                            "{count} result signals exceed the signal budget of {}",
                            process.budget.signals
                        ),
                    ));
                }
            }
            Transition::Wait { wait, .. } => {
                let answered = window[consumed..]
                    .iter()
                    .any(|signal| signal.wait == Some(*wait));
                if !process.waits.contains_key(wait) && !answered {
                    return Err(Failure::contract(
                        "execution.transition.invalid",
                        format!(
                            "waits on {wait}, which is neither open nor answered in the unconsumed window"
                        ),
                    ));
                }
            }
            Transition::Complete { output, .. } => program.descriptor().check_output(output)?,
            Transition::Fail { .. } => {}
        }
        Ok(transition)
    }

    async fn commit(&mut self) -> Result<(), RuntimeError> {
        if let Some(error) = self.outcome.read().stopped.clone() {
            return Err(error);
        }
        let mut bodies = std::mem::take(&mut self.staged);
        let mut records = Vec::with_capacity(bodies.len());
        let mut written = 0u64;
        let (mut seq, mut prev) = (self.head_seq, self.head);
        for body in &bodies {
            seq += 1;
            let record = Record::seal(seq, prev, body);
            written += record.body.len() as u64;
            prev = record.hash;
            records.push(record);
        }
        let meta = TreeMeta {
            tree: self.tree,
            scope: self.state.start.scope.clone(),
            status: self.state.tree_status(),
            updated: self.engine.clock.now(),
        };
        self.snapshots.records += bodies.len() as u64;
        self.snapshots.bytes += written;
        // Snapshot after `snapshot_every` records, but never write more
        // snapshot bytes than a quarter of the log bytes since the last one:
        // a large tree then snapshots less often, its snapshots cost at most
        // a quarter of what its log costs, and a recovery folds a tail of at
        // most four times the snapshot's size.
        let snapshot_due = self.snapshots.records >= self.engine.snapshot_every
            && self.snapshots.bytes >= SNAPSHOT_LOG_RATIO * self.snapshots.last_size;
        // The commit that ends the tree gives up the lease with it, unless a
        // snapshot still has to be written under the lease.
        let release = self.done() && !snapshot_due;
        let append = Append {
            tree: self.tree,
            token: self.token,
            records,
            meta,
            release,
        };
        let outcome = self.engine.store.append(vec![append]).await;
        self.check_outcome(
            outcome.map(|outcomes| outcomes.first().copied().unwrap_or(AppendOutcome::Fenced)),
        )?;
        self.released = release;
        let first = self.head_seq + 1;
        self.head_seq = seq;
        self.head = prev;
        self.state.history_bytes += written;
        self.publish(first, &bodies);
        // Keep the buffer: records are large, and growing a fresh one
        // for every commit reallocates and moves them several times.
        if self.staged.is_empty() {
            bodies.clear();
            self.staged = bodies;
        }
        self.flush_after();
        if snapshot_due {
            self.snapshot().await?;
        }
        Ok(())
    }

    /// The child keys from the root down to a process.
    fn path(&self, mut process: ProcessId) -> Vec<ChildKey> {
        let mut path = Vec::new();
        while let Some(state) = self.state.processes.get(&process) {
            match (&state.key, state.parent) {
                (Some(key), Some(parent)) => {
                    path.push(key.clone());
                    process = parent;
                }
                _ => break,
            }
        }
        path.reverse();
        path
    }

    fn emit(&self, process: ProcessId, kind: EventKind) {
        // Nobody listens: skip computing the path.
        if self.engine.events.receiver_count() == 0 {
            return;
        }
        let _ = self.engine.events.send(Event {
            tree: self.tree,
            process,
            path: self.path(process),
            kind,
        });
    }

    /// Emits committed events and publishes new terminations and drains to handles.
    fn publish(&self, first: u64, bodies: &[RecordBody]) {
        let mut terminated = Vec::new();
        for (offset, body) in bodies.iter().enumerate() {
            let seq = first + offset as u64;
            let (process, kind) = EventKind::of(seq, body);
            let ended_by_step = matches!(
                body,
                RecordBody::StepAdopted {
                    transition: Transition::Complete { .. } | Transition::Fail { .. },
                    ..
                }
            );
            let ended = ended_by_step || matches!(body, RecordBody::Terminated { .. });
            self.emit(process, kind);
            if ended && let Some(termination) = &self.state.processes[&process].termination {
                if ended_by_step {
                    self.emit(
                        process,
                        EventKind::Terminated {
                            seq,
                            status: termination.status(),
                        },
                    );
                }
                terminated.push((process, termination.clone()));
            }
        }
        if terminated.is_empty() {
            return;
        }
        // Only a terminated process or one of its ancestors can have drained now.
        let mut candidates = std::collections::BTreeSet::new();
        for (process, _) in &terminated {
            let mut next = Some(*process);
            while let Some(id) = next {
                if !candidates.insert(id) {
                    break;
                }
                next = self.state.processes[&id].parent;
            }
        }
        let drained: Vec<ProcessId> = {
            let outcome = self.outcome.read();
            candidates
                .into_iter()
                .filter(|id| !outcome.drained.contains(id) && self.drained(*id))
                .collect()
        };
        for id in &drained {
            let status = self.state.processes[id].status;
            self.emit(*id, EventKind::Drained { status });
        }
        self.outcome.modify(|o| {
            o.terminations.extend(terminated);
            o.drained.extend(drained);
        });
    }

    async fn snapshot(&mut self) -> Result<(), RuntimeError> {
        let state: Arc<[u8]> = crate::canonical::with_scratch(|buffer| {
            serde_json::to_writer(&mut *buffer, &self.state).expect("tree state always encodes");
            Arc::from(buffer.as_slice())
        });
        let size = state.len() as u64;
        let snapshot = crate::log::Snapshot {
            seq: self.head_seq,
            head: self.head,
            state,
        };
        let outcome = self
            .engine
            .store
            .write_snapshot(self.tree, self.token, snapshot)
            .await;
        self.check_outcome(outcome)?;
        self.snapshots = SnapshotPace {
            records: 0,
            bytes: 0,
            last_size: size,
        };
        Ok(())
    }

    /// Maps a store's answer to a write into the tree's fate: durable, or a
    /// runtime stop (fenced, head moved, storage failed).
    fn check_outcome(
        &self,
        outcome: Result<AppendOutcome, crate::store::StoreError>,
    ) -> Result<(), RuntimeError> {
        match outcome {
            Ok(AppendOutcome::Committed | AppendOutcome::Duplicate) => Ok(()),
            Ok(AppendOutcome::Fenced) => Err(RuntimeError::Fenced {
                tree: self.tree,
                head_seq: self.head_seq,
            }),
            Ok(AppendOutcome::Conflict { head }) => Err(RuntimeError::Conflict {
                tree: self.tree,
                expected: self.head_seq,
                found: head,
            }),
            Err(error) => Err(RuntimeError::Storage {
                tree: self.tree,
                head_seq: self.head_seq,
                error,
            }),
        }
    }

    fn flush_after(&mut self) {
        for reply in std::mem::take(&mut self.inspects) {
            let _ = reply.send(Ok(TreeView::of(
                &self.state,
                self.head_seq,
                self.head,
                false,
            )));
        }
        for action in std::mem::take(&mut self.after) {
            match action {
                After::Reply(reply) => reply(),
                After::Dispatch(job) => self.launch(job),
            }
        }
    }

    fn launch(&self, job: DispatchJob) {
        let Some(dispatcher) = self
            .programs
            .get(&job.process)
            .and_then(|p| p.dispatcher())
            .cloned()
        else {
            return;
        };
        let events = self.engine.events.clone();
        let (tree, process, effect) = (self.tree, job.process, job.effect);
        let call = DispatchCall {
            effect,
            process,
            request: job.request,
            reserve: job.reserve,
            deltas: DeltaSink {
                emit: Arc::new(move |delta| {
                    let _ = events.send(Event {
                        tree,
                        process,
                        path: Vec::new(),
                        kind: EventKind::Delta { effect, delta },
                    });
                }),
            },
            cancel: job.cancel,
            clock: self.engine.clock.clone(),
        };
        let completions = self.completion_sender.clone();
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
                            diagnostic: panic_failure(
                                "engine.dispatch.panicked",
                                error.into_panic(),
                            )
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

    fn stop(&mut self, error: RuntimeError) {
        tracing::warn!(tree = %self.tree, %error, "tree writer stopped");
        let _ = self.engine.events.send(Event {
            tree: self.tree,
            process: self.tree,
            path: Vec::new(),
            kind: EventKind::Stopped {
                reason: error.to_string(),
            },
        });
        self.outcome.modify(|o| {
            if o.stopped.is_none() {
                o.stopped = Some(error);
            }
        });
        for flight in self.in_flight.values() {
            let _ = flight.cancel.send(true);
        }
        // Pending replies are dropped: their callers read the stop reason.
        self.after.clear();
        self.close_door();
    }

    async fn finish(&mut self) {
        if !self.released {
            let _ = self.engine.store.release(self.tree, self.token).await;
        }
        self.outcome.modify(|o| o.finished = true);
        self.close_door();
        keep_staged(std::mem::take(&mut self.staged));
    }

    fn close_door(&self) {
        if let Ok(mut door) = self.shared.door.lock() {
            *door = Door::Closed;
        }
    }

    async fn close(&mut self, reply: oneshot::Sender<()>) {
        let _ = self.engine.store.release(self.tree, self.token).await;
        self.stop(RuntimeError::Closed { tree: self.tree });
        let _ = reply.send(());
    }
}
