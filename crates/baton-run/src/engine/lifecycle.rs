//! A tree's life in an engine: started, taken up from the store, put to
//! sleep when idle and woken by a command, and finished.
//!
//! Every path that makes a tree's owner ends in [`prepare`]: the tree is
//! registered with the engine and its door opened, and the owner is driven
//! on the caller's task (a new root's first round) or spawned.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tracing::Instrument;

use crate::digest::Digest;
use crate::failure::Failure;
use crate::ids::{ProcessId, TreeId};
use crate::log::{Record, RecordBody};
use crate::payload::Payload;
use crate::protocol::{Execution, Program};
use crate::storage::{Append, AppendOutcome};

use super::actor::{Actor, Channels, Command, FirstRound};
use super::error::{RuntimeError, StartError, TreeError};
use super::lease::{Held, acquire};
use super::round::{InitError, initialize};
use super::shared::{Door, Published, Publisher, TreeOutcome, TreeShared};
use super::state::{InputDigest, ProcessState, TreeState, fold};
use super::view::{Event, EventKind};
use super::{EngineInner, Sleep, StartRequest};

/// What makes two starts of one id the same start: the tree they name,
/// and the program and input they start it with.
#[derive(Clone, Debug)]
pub(super) struct StartKey {
    pub tree: TreeId,
    pub program: Digest,
    pub input: InputDigest,
}

impl StartKey {
    /// Whether a live tree was started by this start.
    pub fn matches(&self, shared: &TreeShared) -> bool {
        shared.program == self.program
            && shared.input.lock().is_ok_and(|input| *input == self.input)
    }

    /// Whether a stored tree's root was started by this start.
    fn matches_root(&self, root: &ProcessState) -> bool {
        root.program.digest == self.program && root.input == self.input
    }
}

/// How a start that did not fail ended.
pub(super) enum StartOutcome {
    /// A new tree: its first record is durable.
    New(Arc<TreeShared>),
    /// The same start was made before; this is its tree (running here or
    /// taken up from the store, or finished).
    Existing(Arc<TreeShared>),
}

/// Starts a new tree, or takes up the stored one the same start made.
///
/// A new tree is built in memory and its first round runs before anything
/// is written; its first commit then creates it in the store with its
/// start, its first round's records and, if it ended, the release of its
/// lease, all in one transaction ([`Store::create_tree`]). When the store
/// already holds the tree (or someone's lease on it), nothing was written,
/// and the start takes the stored tree up instead ([`take_up`]).
///
/// [`Store::create_tree`]: crate::storage::Store::create_tree
pub(super) async fn start(
    engine: &Arc<EngineInner>,
    program: Program,
    key: StartKey,
    request: StartRequest<Payload>,
) -> Result<StartOutcome, StartError> {
    let tree = key.tree;
    // A program that refuses its input is told by the path that reads the
    // store first: the id may name a stored tree started with another input.
    let Ok((state, execution)) =
        initialize(&program, &request.input, engine.limits.max_state_bytes)
    else {
        return take_up(engine, program, key, request).await;
    };
    let now = engine.clock.now();
    let body = RecordBody::TreeStarted {
        start: request.id.clone(),
        root: tree,
        program: Box::new(program.reference().clone()),
        input: request.input.clone(),
        budget: request.budget.clone(),
        capabilities: request.capabilities.clone(),
        deadline: request.deadline,
        limits: engine.limits.clone(),
        created: Some(now),
        labels: request.labels.clone(),
        state,
    };
    let mut tree_state = TreeState::started(&body)
        .map_err(|e| StartError::Program(Failure::execution("engine.start.invalid", e.0)))?;
    let record = Record::seal(1, Digest::ZERO, &body);
    tree_state.history_bytes = record.body.len() as u64;
    let (shared, actor) = prepare(
        engine,
        (tree_state, 1, record.hash),
        0,
        BTreeMap::from([(tree, execution)]),
        Register::Later,
    )?;
    let span = tracing::info_span!("tree", %tree);
    match actor.unborn(record).first_round(span.clone()).await {
        FirstRound::Ended => register(engine, &shared),
        FirstRound::Continues(actor) => {
            register(engine, &shared);
            // The inbox task listens from now on and reads this tree's inbox
            // once, for a message posted before it listened.
            engine.nudge_inbox(Some(tree));
            spawn_in(engine, span, actor.run());
        }
        FirstRound::NotCreated(found) => {
            tracing::debug!(%tree, ?found, "the store holds the tree: taking it up");
            return take_up(engine, program, key, request).await;
        }
        FirstRound::Failed(error) => return Err(error.into()),
    }
    Ok(StartOutcome::New(shared))
}

/// Starts a tree the way that reads the store first: becomes its writer,
/// and takes up the stored tree the same start made, or (when none is
/// stored) commits its start before its first round.
async fn take_up(
    engine: &Arc<EngineInner>,
    program: Program,
    key: StartKey,
    request: StartRequest<Payload>,
) -> Result<StartOutcome, StartError> {
    let tree = key.tree;
    let (lease, load) = match acquire(engine, tree, false).await {
        Ok(granted) => granted,
        Err(Held::Store(error)) => return Err(error.into()),
        Err(Held::Lease { owner, until }) => return Err(StartError::LeaseHeld { owner, until }),
    };
    let release = || {
        let (engine, token) = (engine.clone(), lease.token);
        async move {
            let _ = engine.store.release(tree, token).await;
            engine.forget(tree, token);
        }
    };
    if load.exists() {
        let folded = match fold(tree, &load) {
            Ok(folded) => folded,
            Err(error) => {
                release().await;
                return Err(error.into());
            }
        };
        if !key.matches_root(&folded.0.processes[&tree]) {
            release().await;
            return Err(StartError::Conflict { id: request.id });
        }
        if folded.0.root_termination().is_some() {
            release().await;
            return Ok(StartOutcome::Existing(finished(engine, &folded.0)));
        }
        return spawn(engine, folded, lease.token, BTreeMap::new())
            .map(StartOutcome::Existing)
            .map_err(StartError::from);
    }
    let (state, execution) =
        match initialize(&program, &request.input, engine.limits.max_state_bytes) {
            Ok(initialized) => initialized,
            Err(error) => {
                release().await;
                return Err(StartError::Program(match error {
                    InitError::Program(failure) => failure,
                    InitError::Unrestorable(failure) => Failure::contract(
                        "execution.snapshot.unrestorable",
                        format!("initial state does not restore: {failure}"),
                    ),
                    InitError::TooLarge { bytes, limit } => Failure::execution(
                        "engine.limit.state",
                        format!(
                            "initial state of {bytes} bytes exceeds the tree's limit of {limit}"
                        ),
                    ),
                }));
            }
        };
    let now = engine.clock.now();
    let body = RecordBody::TreeStarted {
        start: request.id,
        root: tree,
        program: Box::new(program.reference().clone()),
        input: request.input,
        budget: request.budget,
        capabilities: request.capabilities,
        deadline: request.deadline,
        limits: engine.limits.clone(),
        created: Some(now),
        labels: request.labels,
        state,
    };
    let mut tree_state = TreeState::started(&body)
        .map_err(|e| StartError::Program(Failure::execution("engine.start.invalid", e.0)))?;
    let record = Record::seal(1, Digest::ZERO, &body);
    tree_state.history_bytes = record.body.len() as u64;
    let append = Append {
        tree,
        token: lease.token,
        records: vec![record.clone()],
        meta: tree_state.meta(now),
        release: false,
    };
    match engine.store.append(vec![append]).await {
        Ok(outcomes)
            if matches!(
                outcomes.first(),
                Some(AppendOutcome::Committed | AppendOutcome::Duplicate)
            ) => {}
        // The compare-and-swap was lost: another writer took the lease over
        // between the grant and this append (a store checks the token before
        // the head, so a lost head is a lost lease too). This start wrote
        // nothing, and the tree is the other writer's.
        Ok(_) => {
            engine.forget(tree, lease.token);
            return Err(StartError::Fenced { tree });
        }
        Err(error) => return Err(error.into()),
    }
    if engine.events.receiver_count() > 0 {
        let _ = engine.events.send(Event {
            tree,
            process: tree,
            path: Vec::new(),
            program: tree_state
                .processes
                .get(&tree)
                .map(|p| p.program.name.clone()),
            kind: EventKind::ProcessStarted { seq: 1 },
        });
    }
    let (shared, actor) = prepare(
        engine,
        (tree_state, 1, record.hash),
        lease.token,
        BTreeMap::from([(tree, execution)]),
        Register::Now,
    )?;
    // The tree's first round runs here, on the caller's task: the steps it
    // can take at once and their commit, as its own task would run them
    // (a failed commit stops the tree, reported through its handles). A
    // tree that ends in its first round, like a pipeline of pure stages,
    // then needs no task of its own and no hand-off between threads; any
    // other continues in its task.
    // One `tree` span covers the first round and the task that goes on.
    let span = tracing::info_span!("tree", %tree);
    if let FirstRound::Continues(actor) = actor.first_round(span.clone()).await {
        spawn_in(engine, span, actor.run());
    }
    Ok(StartOutcome::New(shared))
}

/// Takes up a stored, unfinished tree as its writer.
pub(super) async fn resume(
    engine: &Arc<EngineInner>,
    tree: TreeId,
    force: bool,
) -> Result<Arc<TreeShared>, TreeError> {
    let (lease, load) = match acquire(engine, tree, force).await {
        Ok(granted) => granted,
        Err(Held::Store(error)) => return Err(error.into()),
        Err(Held::Lease { owner, until }) => {
            return Err(TreeError::LeaseHeld { tree, owner, until });
        }
    };
    let folded = match fold(tree, &load) {
        Ok(folded) => folded,
        Err(error) => {
            let _ = engine.store.release(tree, lease.token).await;
            engine.forget(tree, lease.token);
            return Err(error);
        }
    };
    let shared = spawn(engine, folded, lease.token, BTreeMap::new())?;
    // Messages posted while the tree changed hands are applied now.
    engine.nudge_inbox(Some(tree));
    Ok(shared)
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
        reached: state.reached(0),
    });
    let shared = Arc::new(TreeShared {
        tree: state.root,
        scope: state.start.scope.clone(),
        program: root.program.digest,
        input: Mutex::new(root.input.clone()),
        door: Mutex::new(Door::Closed),
        outcome,
        progress: super::progress::Board::shared(),
    });
    register(engine, &shared);
    shared
}

fn spawn(
    engine: &Arc<EngineInner>,
    folded: (TreeState, u64, Digest),
    token: u64,
    executions: BTreeMap<ProcessId, Box<dyn Execution>>,
) -> Result<Arc<TreeShared>, TreeError> {
    let (shared, actor) = prepare(engine, folded, token, executions, Register::Now)?;
    spawn_owner(engine, shared.tree, actor.run());
    Ok(shared)
}

/// When [`prepare`] makes a tree known to the engine's callers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Register {
    /// At once: the tree is in the store.
    Now,
    /// Once its first commit created it (the caller calls [`register`]).
    Later,
}

/// The shared record and the owner of a tree taken up at `head_seq`: the
/// tree is registered (or, for a new tree not yet in the store, left to the
/// caller to register) and its door is open (commands queue for the
/// owner), but nothing runs until the caller drives the owner or spawns its
/// task.
fn prepare(
    engine: &Arc<EngineInner>,
    (state, head_seq, head): (TreeState, u64, Digest),
    token: u64,
    executions: BTreeMap<ProcessId, Box<dyn Execution>>,
    when: Register,
) -> Result<(Arc<TreeShared>, Actor), TreeError> {
    let tree = state.root;
    let programs = programs_of(engine, &state)?;
    let root = &state.processes[&tree];
    let outcome_receiver = Published::new(TreeOutcome {
        reached: state.reached(head_seq),
        ..TreeOutcome::default()
    });
    let outcome = Publisher::new(outcome_receiver.clone());
    let shared = Arc::new(TreeShared {
        tree,
        scope: state.start.scope.clone(),
        program: root.program.digest,
        input: Mutex::new(root.input.clone()),
        door: Mutex::new(Door::Closed),
        outcome: outcome_receiver,
        progress: super::progress::Board::shared(),
    });
    let owner = Owner {
        token,
        head_seq,
        head,
        snapshots: SnapshotPace::default(),
        outcome,
        renew: false,
    };
    // The engine now holds a tree: its inbox task listens from here on (a
    // new tree's start says so once the tree goes on after its first round;
    // one that ended there needs no inbox, and an engine that runs only
    // such trees listens to nothing).
    if when == Register::Now {
        engine.nudge_inbox(None);
    }
    let (sender, channels) = Channels::new();
    let actor = Actor::new(
        engine, &shared, state, owner, programs, executions, channels,
    );
    {
        let mut door = shared.door.lock().map_err(|_| TreeError::Corrupt {
            tree,
            record: None,
            message: "a tree's door lock was poisoned".into(),
        })?;
        *door = Door::Awake(sender);
    }
    if when == Register::Now {
        register(engine, &shared);
    }
    Ok((shared, actor))
}

/// Makes a tree known to the engine's callers: a start or an attach of its
/// id finds it live.
fn register(engine: &EngineInner, shared: &Arc<TreeShared>) {
    if let Ok(mut trees) = engine.trees.lock() {
        trees.insert(shared.tree, Arc::downgrade(shared));
    }
}

/// The program of every live process, from the registry.
fn programs_of(
    engine: &EngineInner,
    state: &TreeState,
) -> Result<BTreeMap<ProcessId, Program>, TreeError> {
    let mut programs = BTreeMap::new();
    for (id, process) in &state.processes {
        if process.termination.is_some() {
            continue;
        }
        let program = engine.program(&process.program.digest).ok_or_else(|| {
            super::version::unavailable(
                &engine.registry,
                state.root,
                &process.program.name,
                process.program.digest,
                None,
            )
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

/// What the owner task of a tree carries across its sleeps: its lease, its
/// place in the log, and the writer of what its handles see.
pub(super) struct Owner {
    pub token: u64,
    pub head_seq: u64,
    pub head: Digest,
    pub snapshots: SnapshotPace,
    pub outcome: Publisher,
    /// Renew the lease before anything else (it was not renewed while asleep).
    pub renew: bool,
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
    pub fn close(self, error: RuntimeError) {
        self.outcome.modify(|o| {
            if o.stopped.is_none() {
                o.stopped = Some(error);
            }
        });
    }
}

impl Sleeper {
    /// A sleeping tree: its state as the engine's [`Sleep`] asks, and its
    /// owner, which renews the lease first thing when woken.
    pub(super) fn new(state: TreeState, sleep: Sleep, mut owner: Owner) -> Sleeper {
        owner.renew = true;
        Sleeper {
            state: Dormant::of(state, sleep),
            owner,
        }
    }

    /// Tells the tree's handles it stopped without a result.
    pub(super) fn close(self, error: RuntimeError) {
        self.owner.close(error);
    }

    /// The fencing token of the lease the sleeping tree holds.
    pub(super) fn token(&self) -> u64 {
        self.owner.token
    }

    /// The last sequence this writer committed.
    pub(super) fn head_seq(&self) -> u64 {
        self.owner.head_seq
    }
}

/// When the next snapshot is due: log records and bytes written since the
/// last one, and that snapshot's size.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SnapshotPace {
    pub records: u64,
    pub bytes: u64,
    pub last_size: u64,
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
    let tree = state.root;
    // The engine now holds a tree: its inbox task listens from here on.
    engine.nudge_inbox(None);
    let (sender, channels) = Channels::new();
    let actor = Actor::new(
        engine,
        shared,
        state,
        sleeper.owner,
        programs,
        BTreeMap::new(),
        channels,
    );
    spawn_owner(engine, tree, actor.run());
    Some(sender)
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
    // The engine now holds a tree: its inbox task listens from here on.
    engine.nudge_inbox(None);
    let (sender, channels) = Channels::new();
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
    spawn_in(engine, tracing::info_span!("tree", %tree), task);
}

/// Spawns a tree's owner task in its `tree` span and keeps its abort handle.
fn spawn_in(
    engine: &Arc<EngineInner>,
    span: tracing::Span,
    task: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let task = tokio::spawn(task.instrument(span));
    if let Ok(mut tasks) = engine.tasks.lock() {
        // Prune finished handles now and then, so starting many trees stays linear.
        if tasks.len() % 1024 == 1023 {
            tasks.retain(|task| !task.is_finished());
        }
        tasks.push(task.abort_handle());
    }
}
