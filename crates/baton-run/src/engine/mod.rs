//! The engine: runs trees on tokio, one owner task per tree.
//!
//! This module is the engine's public face: [`Engine`], its configuration,
//! the requests a host makes and their receipts. The rooms behind it:
//!
//! - `error.rs`: the error enums of each operation family;
//! - `handle.rs`: [`ProcessHandle`], what a host holds on a process;
//! - `shared.rs`: what a tree's handles and its owner task share (the
//!   published outcome, the door commands go through);
//! - `lease.rs`: owner names, liveness of other owners, lease acquisition;
//! - `lifecycle.rs`: how a tree starts, is taken up, sleeps and wakes;
//! - `actor.rs`: the owner task of a tree (mailbox, rounds, commit loop);
//! - `round.rs`: what a round decides, as plain functions over the fold;
//! - `dispatch.rs`: dispatches in flight and their launch;
//! - `state.rs`: the fold (`TreeState::apply`) and `fold` of a stored tree;
//! - `view.rs`: projections of committed state and the event stream.

mod actor;
mod dispatch;
mod error;
mod handle;
mod lease;
mod lifecycle;
mod round;
mod shared;
mod state;
mod view;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{broadcast, oneshot};

use crate::budget::{Budget, Capabilities, TreeLimits};
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::digest::Digest;
use crate::failure::Failure;
use crate::ids::{EffectId, ProcessId, Scope, SignalId, StartId, TreeId, WaitId};
use crate::payload::Payload;
use crate::program::{Program, Settlement};
use crate::store::{ListFilter, Store, StoreError, TreeLoad, TreeStatus};

pub use error::{ControlError, OutputError, RecoverError, RuntimeError, SignalError, StartError};
pub use handle::ProcessHandle;
pub use view::{EffectView, Event, EventKind, ProcessView, TreeCapture, TreeView, WaitView};

use actor::Command;
use lifecycle::{StartKey, StartOutcome};
use shared::TreeShared;
use state::{TreeState, fold};

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
        lease::retire(&self.owner);
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

impl Engine {
    /// Builds an engine. Call from within a tokio runtime.
    pub fn new(config: EngineConfig) -> Engine {
        let mut registry = Registry {
            programs: BTreeMap::new(),
        };
        for program in &config.programs {
            registry.add(program);
        }
        let owner = lease::new_owner();
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
        let key = StartKey {
            tree: ProcessId::root(&request.id),
            program: program.reference().digest,
            input: input.digest(),
        };
        let shared = match self.inner.live(key.tree) {
            Some(shared) if key.matches(&shared) => shared,
            Some(_) => return Err(StartError::Conflict { id: request.id }),
            None => {
                let request = StartRequest {
                    id: request.id,
                    input,
                    budget: request.budget,
                    capabilities: request.capabilities,
                    deadline: request.deadline,
                };
                match lifecycle::start(&self.inner, program.erase(), key, request).await? {
                    StartOutcome::New(shared) | StartOutcome::Existing(shared) => shared,
                }
            }
        };
        Ok(ProcessHandle::new(self.inner.clone(), shared, key.tree))
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
        load: &TreeLoad,
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
            return Ok(lifecycle::finished(self, &state));
        }
        lifecycle::resume(self, tree, force).await
    }
}
