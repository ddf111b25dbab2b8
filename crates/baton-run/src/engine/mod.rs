//! The engine: runs trees on tokio, one owner task per tree.

mod actor;
mod state;
mod view;

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::budget::{Budget, Capabilities, TreeLimits};
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::digest::Digest;
use crate::failure::{Failure, FailureKind, Termination};
use crate::ids::{ChildKey, EffectId, ProcessId, Scope, SignalId, StartId, TreeId, WaitId};
use crate::log::VerifyError;
use crate::payload::{Payload, PayloadError};
use crate::program::{Program, Settlement};
use crate::store::{ListFilter, Store, StoreError, TreeStatus};

pub use view::{EffectView, Event, EventKind, ProcessView, TreeCapture, TreeView, WaitView};

use actor::Command;
use state::TreeState;

/// How an engine is built.
pub struct EngineConfig {
    /// Where logs and snapshots live.
    pub store: Arc<dyn Store>,
    /// The programs this engine may run or recover (exact `ProgramRef` →
    /// `Program`; bound children are registered with their parents).
    pub programs: Vec<Program>,
    /// The source of time for deadlines, leases and timers.
    pub clock: Arc<dyn Clock>,
    /// Lease time-to-live for tree writers.
    pub lease_ttl: Duration,
    /// The most steps a tree takes before committing (group commit bound;
    /// 256 by default, so a round of a hundred quick children commits once).
    pub max_steps_per_commit: usize,
    /// Write a snapshot after this many records.
    pub snapshot_every: u64,
    /// Events buffered per subscriber before slow subscribers lag.
    pub event_capacity: usize,
    /// Limits given to every tree this engine starts (recorded with the tree).
    pub limits: TreeLimits,
    /// What an idle tree (nothing staged or in flight, no deadline) keeps
    /// in memory while it waits for a command.
    pub sleep: Sleep,
}

/// What an idle tree keeps in memory while it waits (for input, an answer,
/// a resolution). A tree waiting for a person may wait for days; a host may
/// hold many thousands of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sleep {
    /// Its owner task keeps running, with everything in memory.
    Awake,
    /// Its owner task ends; its state stays in memory, packed as JSON, and
    /// is unpacked when a command wakes it.
    Packed,
    /// Its owner task ends and its state leaves memory: only the lease and
    /// what its handles share stay. A command reloads it from the store
    /// (one load and fold), after checking that nobody wrote to it meanwhile.
    #[default]
    Unloaded,
}

impl EngineConfig {
    /// Defaults: system clock, 30 s leases, 64 steps per commit, a snapshot
    /// every 512 records, 4096 buffered events.
    pub fn new(store: impl Store) -> EngineConfig {
        EngineConfig::with_store(Arc::new(store))
    }

    /// Defaults over a shared store.
    pub fn with_store(store: Arc<dyn Store>) -> EngineConfig {
        EngineConfig {
            store,
            programs: Vec::new(),
            clock: Arc::new(SystemClock),
            lease_ttl: Duration::from_secs(30),
            max_steps_per_commit: 256,
            snapshot_every: 512,
            event_capacity: 4096,
            limits: TreeLimits::default(),
            sleep: Sleep::default(),
        }
    }

    /// Registers a program (and its bound children).
    pub fn program<I, O>(mut self, program: &Program<I, O>) -> EngineConfig {
        self.programs.push(program.erase());
        self
    }

    /// Uses another clock.
    pub fn clock(mut self, clock: impl Clock) -> EngineConfig {
        self.clock = Arc::new(clock);
        self
    }
}

/// How to start a root.
#[derive(Clone, Debug)]
pub struct StartRequest<I> {
    /// The root's identity: starting the same id again returns the same process.
    pub id: StartId,
    /// The input (validated against the program's input schema).
    pub input: I,
    /// The root's budget.
    pub budget: Budget,
    /// The root's capabilities.
    pub capabilities: Capabilities,
    /// A host deadline: the tree ends `TimedOut` when the clock passes it.
    pub deadline: Option<Timestamp>,
}

impl<I> StartRequest<I> {
    /// A request with an unlimited budget, no capabilities and no deadline.
    pub fn new(id: StartId, input: I) -> StartRequest<I> {
        StartRequest {
            id,
            input,
            budget: Budget::unlimited(),
            capabilities: Capabilities::none(),
            deadline: None,
        }
    }
}

/// A host signal to deliver: addressed (answers a wait) or unaddressed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignalRequest {
    /// Caller-stable identity; resending the same id and content is a no-op.
    pub id: SignalId,
    /// The wait it answers, if any.
    pub wait: Option<WaitId>,
    /// The content.
    pub payload: Payload,
}

/// What happened to a delivered signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalReceipt {
    /// Committed to the mailbox and charged.
    Admitted,
    /// The same id with the same content was admitted before; nothing changed.
    Duplicate,
}

/// Options for [`Engine::recover`].
#[derive(Clone, Debug, Default)]
pub struct RecoverOptions {
    /// Take over trees even when another writer holds a live lease.
    pub force: bool,
    /// Only trees of this scope.
    pub scope: Option<Scope>,
}

/// A tree's writer stopped without a result: the store failed or another
/// writer fenced it. The log holds everything committed; recover elsewhere.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The store failed; nothing after the last acknowledged commit is known.
    #[error("tree {tree} stopped: storage failed after record {head_seq}: {error}")]
    Storage {
        /// The tree.
        tree: TreeId,
        /// The last acknowledged sequence.
        head_seq: u64,
        /// The storage error.
        error: StoreError,
    },
    /// Another writer took the tree over.
    #[error("tree {tree} stopped: another writer fenced this engine after record {head_seq}")]
    Fenced {
        /// The tree.
        tree: TreeId,
        /// The last acknowledged sequence.
        head_seq: u64,
    },
    /// The log head moved underneath this writer.
    #[error("tree {tree} stopped: the log head moved (expected {expected}, found {found})")]
    Conflict {
        /// The tree.
        tree: TreeId,
        /// The sequence this writer expected.
        expected: u64,
        /// The store's head.
        found: u64,
    },
    /// The engine was closed or dropped.
    #[error("tree {tree} stopped: the engine was closed")]
    Closed {
        /// The tree.
        tree: TreeId,
    },
    /// Stored state could not be folded (engine defect or corrupt store).
    #[error("tree {tree} stopped: {message}")]
    Inconsistent {
        /// The tree.
        tree: TreeId,
        /// What did not apply.
        message: String,
    },
}

impl RuntimeError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            RuntimeError::Storage { .. } => "engine.tree.committer_failed",
            RuntimeError::Fenced { .. } => "engine.tree.incarnation_conflict",
            RuntimeError::Conflict { .. } => "engine.tree.committer_conflict",
            RuntimeError::Closed { .. } => "engine.closed",
            RuntimeError::Inconsistent { .. } => "engine.tree.inconsistent",
        }
    }
}

/// Why a start was refused. Nothing is written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The input does not encode or fails the input schema (`contract`).
    #[error("start refused: {0}")]
    Input(Failure),
    /// The program's `start`, `snapshot` or `restore` failed.
    #[error("start refused: {0}")]
    Program(Failure),
    /// The start id names a tree with another program or input.
    #[error(
        "start refused (engine.start.conflict): {id:?} already names a tree with a different program or input"
    )]
    Conflict {
        /// The start id.
        id: StartId,
    },
    /// Another writer holds the tree's lease.
    #[error("start refused (engine.lease.held): tree is held by {owner} until {until}")]
    LeaseHeld {
        /// The holder.
        owner: String,
        /// Expiry.
        until: Timestamp,
    },
    /// The stored tree could not be read.
    #[error("start refused: {0}")]
    Recover(#[from] RecoverError),
    /// The store failed.
    #[error("start refused: {0}")]
    Store(#[from] StoreError),
}

impl StartError {
    /// Stable code.
    pub fn code(&self) -> &str {
        match self {
            StartError::Input(failure) | StartError::Program(failure) => failure.code(),
            StartError::Conflict { .. } => "engine.start.conflict",
            StartError::LeaseHeld { .. } => "engine.lease.held",
            StartError::Recover(error) => error.code(),
            StartError::Store(_) => "engine.store.failed",
        }
    }
}

/// Why a stored tree could not be taken up. The stored tree is left untouched.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecoverError {
    /// No tree with that id is stored.
    #[error("engine.tree.not_found: no tree {tree}")]
    NotFound {
        /// The tree.
        tree: TreeId,
    },
    /// The caller's scope is not the tree's.
    #[error("engine.scope.mismatch: tree {tree} is not in scope {scope}")]
    Scope {
        /// The tree.
        tree: TreeId,
        /// The caller's scope.
        scope: Scope,
    },
    /// A stored program is not in this engine's registry.
    #[error(
        "engine.program.unavailable: tree {tree} needs program {name} ({digest}), which is not registered"
    )]
    ProgramUnavailable {
        /// The tree.
        tree: TreeId,
        /// The program's name.
        name: String,
        /// Its exact ref digest.
        digest: Digest,
    },
    /// The log does not verify or does not fold.
    #[error("engine.log.corrupt: tree {tree}: {message}")]
    Corrupt {
        /// The tree.
        tree: TreeId,
        /// What is wrong.
        message: String,
    },
    /// Another writer holds a live lease.
    #[error("engine.lease.held: tree {tree} is held by {owner} until {until}")]
    LeaseHeld {
        /// The tree.
        tree: TreeId,
        /// The holder.
        owner: String,
        /// Expiry.
        until: Timestamp,
    },
    /// The store failed.
    #[error("engine.store.failed: {0}")]
    Store(#[from] StoreError),
}

impl RecoverError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            RecoverError::NotFound { .. } => "engine.tree.not_found",
            RecoverError::Scope { .. } => "engine.scope.mismatch",
            RecoverError::ProgramUnavailable { .. } => "engine.program.unavailable",
            RecoverError::Corrupt { .. } => "engine.log.corrupt",
            RecoverError::LeaseHeld { .. } => "engine.lease.held",
            RecoverError::Store(_) => "engine.store.failed",
        }
    }
}

/// Why a host signal was refused. Nothing is written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignalError {
    /// The process has terminated.
    #[error("engine.signal.terminated: process {process} has terminated")]
    Terminated {
        /// The process.
        process: ProcessId,
    },
    /// No wait with that id was ever opened by the process.
    #[error("engine.signal.unknown_wait: process {process} has no wait {wait}")]
    UnknownWait {
        /// The process.
        process: ProcessId,
        /// The wait.
        wait: WaitId,
    },
    /// The wait was already answered.
    #[error("engine.signal.wait_closed: wait {wait} was already answered")]
    WaitClosed {
        /// The wait.
        wait: WaitId,
    },
    /// The payload fails the answer or signal schema (`contract`).
    #[error("{0}")]
    Rejected(Failure),
    /// The id was used before with different content.
    #[error("engine.signal.conflict: signal {id} was admitted before with different content")]
    Conflict {
        /// The signal id.
        id: SignalId,
    },
    /// The process's signal budget is spent; the process is unharmed.
    #[error("engine.limit.signals: process {process} has no signal budget left")]
    BudgetExhausted {
        /// The process.
        process: ProcessId,
    },
    /// The mailbox holds as many unconsumed signals as the tree allows.
    #[error(
        "engine.limit.pending_signals: process {process} already holds {limit} unconsumed signals"
    )]
    MailboxFull {
        /// The process.
        process: ProcessId,
        /// The limit.
        limit: u64,
    },
    /// The tree's writer stopped.
    #[error(transparent)]
    Stopped(#[from] RuntimeError),
}

impl SignalError {
    /// Stable code.
    pub fn code(&self) -> &str {
        match self {
            SignalError::Terminated { .. } => "engine.signal.terminated",
            SignalError::UnknownWait { .. } => "engine.signal.unknown_wait",
            SignalError::WaitClosed { .. } => "engine.signal.wait_closed",
            SignalError::Rejected(failure) => failure.code(),
            SignalError::Conflict { .. } => "engine.signal.conflict",
            SignalError::BudgetExhausted { .. } => "engine.limit.signals",
            SignalError::MailboxFull { .. } => "engine.limit.pending_signals",
            SignalError::Stopped(error) => error.code(),
        }
    }
}

/// Why a control (cancel, kill, resolve, replay) was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// The process has terminated.
    #[error("engine.control.terminated: process {process} has terminated")]
    Terminated {
        /// The process.
        process: ProcessId,
    },
    /// The effect is not an unknown effect of a live process of the tree.
    #[error("engine.effect.not_unknown: effect {effect} is not an unknown effect of tree {tree}")]
    NotUnknown {
        /// The tree.
        tree: TreeId,
        /// The effect.
        effect: EffectId,
    },
    /// The resolution is itself unknown, or replay is not allowed.
    #[error("engine.effect.resolution.invalid: {0}")]
    Invalid(String),
    /// The tree could not be found or taken up.
    #[error(transparent)]
    Recover(#[from] RecoverError),
    /// The tree's writer stopped.
    #[error(transparent)]
    Stopped(#[from] RuntimeError),
}

impl ControlError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ControlError::Terminated { .. } => "engine.control.terminated",
            ControlError::NotUnknown { .. } => "engine.effect.not_unknown",
            ControlError::Invalid(_) => "engine.effect.resolution.invalid",
            ControlError::Recover(error) => error.code(),
            ControlError::Stopped(error) => error.code(),
        }
    }
}

/// Why a typed output could not be had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// The process did not complete.
    #[error("process did not complete: {0}")]
    NotCompleted(Termination),
    /// The output does not decode into the requested type.
    #[error(transparent)]
    Decode(#[from] PayloadError),
    /// The tree's writer stopped.
    #[error(transparent)]
    Stopped(#[from] RuntimeError),
}

/// What the host sees of a tree while its owner task runs.
#[derive(Clone, Debug, Default)]
pub(crate) struct TreeOutcome {
    /// Terminations committed so far, by process.
    terminations: BTreeMap<ProcessId, Termination>,
    /// Processes whose whole subtree has terminated.
    drained: std::collections::BTreeSet<ProcessId>,
    stopped: Option<RuntimeError>,
    finished: bool,
    /// The writer is gone (the engine dropped its task).
    abandoned: bool,
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
    async fn wait_for<T>(&self, select: impl Fn(&TreeOutcome) -> Option<T>) -> Option<T> {
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
    tree: TreeId,
    scope: Scope,
    program: Digest,
    input: Digest,
    /// How commands reach the tree's owner task.
    door: Mutex<Door>,
    outcome: Arc<Published>,
}

impl TreeShared {
    /// A sleeping tree's state, taken from its door (which then stays
    /// closed); `None`, with the door untouched, for a tree not asleep.
    fn take_sleeper(&self) -> Option<Box<actor::Sleeper>> {
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

/// The way into a tree's owner task. An idle tree hibernates: its task ends
/// and its state waits here until a command wakes it.
pub(crate) enum Door {
    /// The owner task runs and reads this channel.
    Awake(mpsc::UnboundedSender<Box<Command>>),
    /// The tree waits for input with no task; a command respawns it.
    Asleep(Box<actor::Sleeper>),
    /// No owner task will run again (finished, stopped or closed).
    Closed,
}

impl EngineInner {
    /// Delivers a command to a tree, waking it if it hibernates; hands the
    /// command back when no owner task will run again.
    fn send(
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
            if let Some(sender) = actor::wake(self, shared, *sleeper) {
                *door = Door::Awake(sender);
            }
        }
        match &*door {
            Door::Awake(sender) => sender.send(command).map_err(|error| error.0),
            _ => Err(command),
        }
    }
}

struct Registry {
    programs: BTreeMap<Digest, Program>,
}

impl Registry {
    fn add(&mut self, program: &Program) {
        if self
            .programs
            .insert(program.reference().digest, program.clone())
            .is_none()
        {
            for child in program.children() {
                self.add(child);
            }
        }
    }
}

pub(crate) struct EngineInner {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    registry: RwLock<Registry>,
    owner: String,
    lease_ttl: Duration,
    max_steps_per_commit: usize,
    snapshot_every: u64,
    limits: TreeLimits,
    sleep: Sleep,
    trees: Mutex<BTreeMap<TreeId, Weak<TreeShared>>>,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    events: broadcast::Sender<Event>,
}

static ENGINE_COUNTER: AtomicU64 = AtomicU64::new(0);
static LIVE_OWNERS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty() && !name.contains('/'))
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Whether a lease owner is provably gone: an engine of this process that
/// no longer exists, or a process of this host that no longer runs.
fn owner_is_gone(owner: &str) -> bool {
    let mut parts = owner.split('/');
    let (Some(host), Some(pid), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    if host != host_name() {
        return false;
    }
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    if pid == std::process::id() {
        let live = LIVE_OWNERS
            .lock()
            .map(|owners| owners.iter().any(|o| o == owner))
            .unwrap_or(true);
        return !live;
    }
    let proc_root = std::path::Path::new("/proc");
    proc_root.join("self").exists() && !proc_root.join(pid.to_string()).exists()
}

/// Runs trees of programs: the only constructor of processes.
///
/// Dropping the engine aborts its tree tasks without releasing leases, as a
/// crash would; [`Engine::close`] shuts down cleanly.
pub struct Engine {
    inner: Arc<EngineInner>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.inner.abort_all();
    }
}

impl EngineInner {
    fn abort_all(&self) {
        if let Ok(mut tasks) = self.tasks.lock() {
            for task in tasks.drain(..) {
                task.abort();
            }
        }
        // Hibernating trees have no task to abort: close their doors so
        // their handles learn the engine is gone. Leases stay, as after a crash.
        let trees: Vec<Arc<TreeShared>> = self
            .trees
            .lock()
            .map(|trees| trees.values().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        for shared in trees {
            if let Some(sleeper) = shared.take_sleeper() {
                sleeper.close(RuntimeError::Closed { tree: shared.tree });
            }
        }
        if let Ok(mut owners) = LIVE_OWNERS.lock() {
            owners.retain(|owner| owner != &self.owner);
        }
    }

    fn program(&self, digest: &Digest) -> Option<Program> {
        self.registry
            .read()
            .ok()
            .and_then(|r| r.programs.get(digest).cloned())
    }

    fn live(&self, tree: TreeId) -> Option<Arc<TreeShared>> {
        let mut trees = self.trees.lock().ok()?;
        match trees.get(&tree).and_then(Weak::upgrade) {
            Some(shared) => Some(shared),
            None => {
                trees.remove(&tree);
                None
            }
        }
    }
}

/// Folds a stored tree: verifies the chain from the snapshot head, decodes
/// the snapshot and applies the records after it.
pub(crate) fn fold(
    tree: TreeId,
    load: &crate::store::TreeLoad,
) -> Result<(TreeState, u64, Digest), RecoverError> {
    let corrupt = |message: String| RecoverError::Corrupt { tree, message };
    let (start_seq, start_head, mut state) = match &load.snapshot {
        Some(snapshot) => {
            let state: TreeState = serde_json::from_slice(&snapshot.state).map_err(|error| {
                corrupt(format!(
                    "snapshot at {} does not decode: {error}",
                    snapshot.seq
                ))
            })?;
            (snapshot.seq, snapshot.head, Some(state))
        }
        None => (0, Digest::ZERO, None),
    };
    let (mut head_seq, mut head) = (start_seq, start_head);
    for record in &load.records {
        // Each record is checked against the chain and decoded once.
        let body = crate::log::check(head_seq, head, record)
            .map_err(|error: VerifyError| corrupt(error.to_string()))?;
        (head_seq, head) = (record.seq, record.hash);
        let folded = match &mut state {
            None => state.insert(TreeState::started(&body).map_err(|e| corrupt(e.to_string()))?),
            Some(state) => {
                state
                    .apply(&body)
                    .map_err(|error| corrupt(format!("record {}: {error}", record.seq)))?;
                state
            }
        };
        folded.history_bytes += record.body.len() as u64;
    }
    let state = state.ok_or(RecoverError::NotFound { tree })?;
    if state.root != tree {
        return Err(corrupt(format!("log names root {}", state.root)));
    }
    Ok((state, head_seq, head))
}

impl Engine {
    /// Builds an engine. Call from within a tokio runtime.
    pub fn new(config: EngineConfig) -> Engine {
        let mut registry = Registry {
            programs: BTreeMap::new(),
        };
        for program in &config.programs {
            registry.add(program);
        }
        let owner = format!(
            "{}/{}/engine-{}",
            host_name(),
            std::process::id(),
            ENGINE_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        if let Ok(mut owners) = LIVE_OWNERS.lock() {
            owners.push(owner.clone());
        }
        let (events, _) = broadcast::channel(config.event_capacity.max(1));
        Engine {
            inner: Arc::new(EngineInner {
                store: config.store,
                clock: config.clock,
                registry: RwLock::new(registry),
                owner,
                lease_ttl: config.lease_ttl,
                max_steps_per_commit: config.max_steps_per_commit.max(1),
                snapshot_every: config.snapshot_every.max(1),
                limits: config.limits,
                sleep: config.sleep,
                trees: Mutex::new(BTreeMap::new()),
                tasks: Mutex::new(Vec::new()),
                events,
            }),
        }
    }

    /// This engine's lease owner name (`host/pid/engine-n`).
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// Subscribes to committed facts and non-durable deltas.
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.inner.events.subscribe()
    }

    /// Starts a root, or returns the existing process when the same start id
    /// was started with the same program and input. The start is durable
    /// when this returns.
    pub async fn start<I: Serialize, O>(
        &self,
        program: &Program<I, O>,
        request: StartRequest<I>,
    ) -> Result<ProcessHandle<O>, StartError> {
        let input = Payload::encode(&request.input).map_err(|error| {
            StartError::Input(Failure::contract(
                "execution.input.invalid",
                error.to_string(),
            ))
        })?;
        program
            .descriptor()
            .check_input(&input)
            .map_err(StartError::Input)?;
        if let Ok(mut registry) = self.inner.registry.write() {
            registry.add(&program.erase());
        }
        let tree = ProcessId::root(&request.id);
        let digest = program.reference().digest;
        let same = |shared: &TreeShared| shared.program == digest && shared.input == input.digest();
        if let Some(shared) = self.inner.live(tree) {
            return if same(&shared) {
                Ok(ProcessHandle::new(self.inner.clone(), shared, tree))
            } else {
                Err(StartError::Conflict { id: request.id })
            };
        }
        let shared = actor::start(
            &self.inner,
            program.erase(),
            request.id.clone(),
            input.clone(),
            request.budget,
            request.capabilities,
            request.deadline,
        )
        .await?;
        if !same(&shared) {
            return Err(StartError::Conflict { id: request.id });
        }
        Ok(ProcessHandle::new(self.inner.clone(), shared, tree))
    }

    /// A handle on a root process by id, checking the caller's scope. A tree
    /// not running in this engine is taken up from the store.
    pub async fn process<O>(
        &self,
        scope: &Scope,
        id: ProcessId,
    ) -> Result<ProcessHandle<O>, RecoverError> {
        let shared = self.inner.attach(id, Some(scope), false).await?;
        Ok(ProcessHandle::new(self.inner.clone(), shared, id))
    }

    /// Reopens every unfinished tree in the store and continues it. Trees
    /// that cannot be taken up are reported and left untouched.
    pub async fn recover(
        &self,
        options: RecoverOptions,
    ) -> Result<Vec<(TreeId, Result<(), RecoverError>)>, StoreError> {
        let filter = ListFilter {
            status: None,
            scope: options.scope.clone(),
        };
        // Trees are taken up concurrently, so their lease acquisitions share
        // the store's group commits instead of waiting for one fsync each.
        let mut attaching = tokio::task::JoinSet::new();
        for meta in self.inner.store.list(filter).await? {
            if meta.status == TreeStatus::Done {
                continue;
            }
            let inner = self.inner.clone();
            let force = options.force;
            attaching.spawn(async move {
                (
                    meta.tree,
                    inner.attach(meta.tree, None, force).await.map(|_| ()),
                )
            });
        }
        let mut report = Vec::new();
        while let Some(joined) = attaching.join_next().await {
            match joined {
                Ok(entry) => report.push(entry),
                Err(error) => {
                    return Err(StoreError::Unavailable(format!(
                        "a recovery task failed: {error}"
                    )));
                }
            }
        }
        report.sort_by_key(|(tree, _)| *tree);
        Ok(report)
    }

    /// Settles an unknown effect anywhere in a tree with the host's
    /// settlement (never unknown).
    pub async fn resolve_unknown(
        &self,
        scope: &Scope,
        tree: TreeId,
        effect: EffectId,
        settlement: Settlement,
    ) -> Result<(), ControlError> {
        if settlement.is_unknown() {
            return Err(ControlError::Invalid(
                "a resolution must be succeeded or failed".into(),
            ));
        }
        let handle: ProcessHandle = self.process(scope, tree).await?;
        handle
            .control(|reply| Command::Resolve {
                effect,
                settlement,
                reply,
            })
            .await
    }

    /// Dispatches an unknown effect of a tree again under its identity (the
    /// host asserts it is safe).
    pub async fn replay_unknown(
        &self,
        scope: &Scope,
        tree: TreeId,
        effect: EffectId,
    ) -> Result<(), ControlError> {
        let handle: ProcessHandle = self.process(scope, tree).await?;
        handle
            .control(|reply| Command::Replay { effect, reply })
            .await
    }

    /// The full committed state of a stored tree.
    pub async fn capture(&self, scope: &Scope, tree: TreeId) -> Result<TreeCapture, RecoverError> {
        let load = self.inner.store.load(tree).await?;
        let (state, head_seq, head) = self.inner.checked_fold(tree, &load, Some(scope))?;
        Ok(TreeCapture {
            head_seq,
            head,
            state: Payload::encode(&state).map_err(|error| RecoverError::Corrupt {
                tree,
                message: error.to_string(),
            })?,
        })
    }

    /// A view of a stored tree (committed state), without private payloads
    /// unless `private`.
    pub async fn inspect(
        &self,
        scope: &Scope,
        tree: TreeId,
        private: bool,
    ) -> Result<TreeView, RecoverError> {
        let load = self.inner.store.load(tree).await?;
        let (state, head_seq, head) = self.inner.checked_fold(tree, &load, Some(scope))?;
        Ok(TreeView::of(&state, head_seq, head, private))
    }

    /// Verifies a stored tree's hash chain from its snapshot head; returns
    /// the head sequence.
    pub async fn verify(&self, scope: &Scope, tree: TreeId) -> Result<u64, RecoverError> {
        let load = self.inner.store.load(tree).await?;
        self.inner
            .checked_fold(tree, &load, Some(scope))
            .map(|(_, seq, _)| seq)
    }

    /// Stops every tree task and releases their leases.
    pub async fn close(self) {
        let trees: Vec<Arc<TreeShared>> = self
            .inner
            .trees
            .lock()
            .map(|trees| trees.values().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        // Trees close concurrently, so their lease releases share commits.
        let mut closing = tokio::task::JoinSet::new();
        for shared in trees {
            let inner = self.inner.clone();
            let asleep = shared.take_sleeper();
            closing.spawn(async move {
                match asleep {
                    // A sleeping tree closes where it sleeps: its lease is
                    // given up without waking (or reloading) it.
                    Some(sleeper) => {
                        let _ = inner.store.release(shared.tree, sleeper.token()).await;
                        sleeper.close(RuntimeError::Closed { tree: shared.tree });
                    }
                    None => {
                        let (reply, done) = oneshot::channel();
                        if inner
                            .send(&shared, Box::new(Command::Close { reply }))
                            .is_ok()
                        {
                            let _ = done.await;
                        }
                    }
                }
            });
        }
        while closing.join_next().await.is_some() {}
    }
}

impl EngineInner {
    fn checked_fold(
        &self,
        tree: TreeId,
        load: &crate::store::TreeLoad,
        scope: Option<&Scope>,
    ) -> Result<(TreeState, u64, Digest), RecoverError> {
        if !load.exists() {
            return Err(RecoverError::NotFound { tree });
        }
        let folded = fold(tree, load)?;
        if let Some(scope) = scope
            && &folded.0.start.scope != scope
        {
            return Err(RecoverError::Scope {
                tree,
                scope: scope.clone(),
            });
        }
        Ok(folded)
    }

    /// Takes up a stored tree (or returns the live one).
    async fn attach(
        self: &Arc<Self>,
        tree: TreeId,
        scope: Option<&Scope>,
        force: bool,
    ) -> Result<Arc<TreeShared>, RecoverError> {
        if let Some(shared) = self.live(tree) {
            if let Some(scope) = scope
                && &shared.scope != scope
            {
                return Err(RecoverError::Scope {
                    tree,
                    scope: scope.clone(),
                });
            }
            return Ok(shared);
        }
        // Read without a lease first: a tree that cannot be taken up stays untouched.
        let load = self.store.load(tree).await?;
        let (state, _, _) = self.checked_fold(tree, &load, scope)?;
        for process in state.processes.values().filter(|p| p.termination.is_none()) {
            if self.program(&process.program.digest).is_none() {
                return Err(RecoverError::ProgramUnavailable {
                    tree,
                    name: process.program.name.to_string(),
                    digest: process.program.digest,
                });
            }
        }
        if state.root_termination().is_some() {
            return Ok(actor::finished(self, &state));
        }
        actor::resume(self, tree, force).await
    }
}

/// A handle on a root process.
pub struct ProcessHandle<O = Payload> {
    engine: Arc<EngineInner>,
    shared: Arc<TreeShared>,
    process: ProcessId,
    types: PhantomData<fn() -> O>,
}

impl<O> Clone for ProcessHandle<O> {
    fn clone(&self) -> Self {
        ProcessHandle {
            engine: self.engine.clone(),
            shared: self.shared.clone(),
            process: self.process,
            types: PhantomData,
        }
    }
}

impl<O> std::fmt::Debug for ProcessHandle<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessHandle")
            .field("process", &self.process)
            .finish()
    }
}

impl<O> ProcessHandle<O> {
    fn new(
        engine: Arc<EngineInner>,
        shared: Arc<TreeShared>,
        process: ProcessId,
    ) -> ProcessHandle<O> {
        ProcessHandle {
            engine,
            shared,
            process,
            types: PhantomData,
        }
    }

    /// The process id.
    pub fn id(&self) -> ProcessId {
        self.process
    }

    /// The tree it belongs to.
    pub fn tree(&self) -> TreeId {
        self.shared.tree
    }

    /// Its scope.
    pub fn scope(&self) -> &Scope {
        &self.shared.scope
    }

    fn closed(&self) -> RuntimeError {
        RuntimeError::Closed {
            tree: self.shared.tree,
        }
    }

    /// Waits for the termination.
    pub async fn await_result(&self) -> Result<Termination, RuntimeError> {
        let process = self.process;
        let result = self
            .shared
            .outcome
            .wait_for(|o| {
                (o.terminations.contains_key(&process) || o.stopped.is_some() || o.finished)
                    .then(|| (o.terminations.get(&process).cloned(), o.stopped.clone()))
            })
            .await;
        match result {
            Some((Some(termination), _)) => Ok(termination),
            Some((None, Some(error))) => Err(error),
            _ => Err(self.closed()),
        }
    }

    /// Waits until this process and its whole subtree have terminated (for
    /// the root: until the tree's task has released the tree).
    pub async fn join(&self) -> Result<Termination, RuntimeError> {
        let termination = self.await_result().await?;
        let (process, root) = (self.process, self.process == self.shared.tree);
        let joined =
            self.shared
                .outcome
                .wait_for(|o| {
                    (o.finished || (!root && o.drained.contains(&process)) || o.stopped.is_some())
                        .then(|| {
                            (
                                o.finished || o.drained.contains(&process),
                                o.stopped.clone(),
                            )
                        })
                })
                .await;
        match joined {
            Some((true, _)) => Ok(termination),
            Some((false, Some(error))) => Err(error),
            _ => Err(self.closed()),
        }
    }

    /// A handle on this process's child under `key` (which may not exist yet).
    pub fn child<O2>(&self, key: &ChildKey) -> ProcessHandle<O2> {
        ProcessHandle::new(
            self.engine.clone(),
            self.shared.clone(),
            ProcessId::child(self.process, key),
        )
    }

    /// Waits for completion and decodes the output.
    pub async fn output(&self) -> Result<O, OutputError>
    where
        O: DeserializeOwned,
    {
        let termination = self.await_result().await?;
        match termination.output() {
            Some(output) => Ok(output.decode()?),
            None => Err(OutputError::NotCompleted(termination)),
        }
    }

    async fn request<T, E: From<RuntimeError>>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, E>>) -> Command,
        terminated: impl FnOnce() -> E,
    ) -> Result<T, E> {
        let (reply, answer) = oneshot::channel();
        let sent = self
            .engine
            .send(&self.shared, Box::new(make(reply)))
            .is_ok();
        if sent && let Ok(result) = answer.await {
            return result;
        }
        // No owner task took the command (or it ended before answering):
        // say why from what the tree published.
        let outcome = self.shared.outcome.read();
        Err(match &outcome.stopped {
            Some(error) => error.clone().into(),
            None if outcome.finished || outcome.terminations.contains_key(&self.process) => {
                terminated()
            }
            None => self.closed().into(),
        })
    }

    async fn control(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<(), ControlError>>) -> Command,
    ) -> Result<(), ControlError> {
        let process = self.process;
        self.request(make, || ControlError::Terminated { process })
            .await
    }

    /// Delivers a host signal. It is acknowledged only after its record
    /// commits; the same id with the same content is an idempotent no-op.
    pub async fn signal(&self, request: SignalRequest) -> Result<SignalReceipt, SignalError> {
        let process = self.process;
        self.request(
            |reply| Command::Signal {
                process,
                request,
                reply,
            },
            || SignalError::Terminated { process },
        )
        .await
    }

    /// Requests cancellation (intent is durable when this returns; the
    /// process ends `Canceled` once in-flight work settles).
    pub async fn cancel(&self, reason: impl Into<String>) -> Result<(), ControlError> {
        let process = self.process;
        let reason = reason.into();
        self.control(|reply| Command::Cancel {
            process,
            reason,
            reply,
        })
        .await
    }

    /// Kills the process at once; in-flight effects are left unresolved.
    pub async fn kill(&self) -> Result<(), ControlError> {
        let process = self.process;
        self.control(|reply| Command::Kill { process, reply }).await
    }

    /// The committed state as a view.
    pub async fn inspect(&self) -> Result<TreeView, ControlError> {
        let process = self.process;
        let view = self
            .request(
                |reply| Command::Inspect { reply },
                || ControlError::Terminated { process },
            )
            .await;
        match view {
            Err(ControlError::Terminated { .. }) => {
                let load = self
                    .engine
                    .store
                    .load(self.shared.tree)
                    .await
                    .map_err(RecoverError::from)?;
                let (state, seq, head) = self.engine.checked_fold(self.shared.tree, &load, None)?;
                Ok(TreeView::of(&state, seq, head, false))
            }
            other => other,
        }
    }
}

/// The failure kind and code of a panic caught at a user-code seam.
pub(crate) fn panic_failure(code: &str, panic: Box<dyn std::any::Any + Send>) -> Failure {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-string payload".to_owned());
    Failure::new(FailureKind::Panic, code, message)
}
