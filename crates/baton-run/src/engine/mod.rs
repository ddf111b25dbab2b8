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
//! - `commands.rs`: answers, signals, cancellations and resolutions by
//!   tree id, and `inbox.rs` how they reach a tree another engine holds;
//! - `actor.rs`: the owner task of a tree (rounds, commit loop), and
//!   `mailbox.rs` the commands it takes in;
//! - `round.rs`: what a round decides, as plain functions over the fold;
//! - `dispatch.rs`: dispatches in flight and their launch;
//! - `state.rs`: the fold (`TreeState::apply`) and `fold` of a stored tree;
//! - `version.rs`: which part of a stored program's identity differs
//!   from the registered versions of its name;
//! - `view.rs`: projections of committed state and the event stream.

mod actor;
mod commands;
mod config;
mod dispatch;
mod error;
mod handle;
mod inbox;
mod lease;
mod lifecycle;
mod mailbox;
mod progress;
mod round;
mod shared;
mod spans;
mod spare;
mod state;
#[cfg(test)]
mod tests;
mod usage;
mod version;
mod view;
mod watch;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{broadcast, oneshot};

use crate::budget::{Budget, Capabilities, TreeLimits};
use crate::clock::{Clock, Timestamp};
use crate::digest::Digest;
use crate::failure::Failure;
use crate::ids::{Name, ProcessId, Scope, SignalId, StartId, TreeId, WaitId};
use crate::labels::Labels;
use crate::payload::Payload;
use crate::protocol::Program;
use crate::storage::{ListFilter, Store, StoreError, TreeLoad, TreeStatus};

pub use config::{ConfigError, EngineConfig, Sleep};
pub use error::{ControlError, OutputError, RuntimeError, SignalError, StartError, TreeError};
pub use handle::{Condition, ProcessHandle, Started};
pub use usage::{ProcessUsage, ProgramUsage, UsageReport};
pub use version::{IdentityPart, VersionMismatch};
pub use view::{
    EffectView, Ended, Event, EventKind, LiveProgress, ProcessView, TreeCapture, TreeView,
    Visibility, WaitView,
};
pub use watch::{Watch, WatchEvent, WatchKind};

use config::Registry;

use actor::Command;
use lifecycle::{StartKey, StartOutcome};
use shared::TreeShared;
use state::{TreeState, fold};

/// A subscription to an engine's live events ([`Engine::events`]).
#[derive(Debug)]
pub struct Events {
    receiver: broadcast::Receiver<Event>,
}

/// Why [`Events::recv`] returned no event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventsError {
    /// The reader fell behind and this many events were dropped for it;
    /// the next call returns the oldest event still kept.
    #[error("engine.events.lagged: {0} events were dropped for a slow reader")]
    Lagged(u64),
    /// The engine is gone: no event will come.
    #[error("engine.events.closed: the engine is gone")]
    Closed,
}

impl EventsError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            EventsError::Lagged(_) => "engine.events.lagged",
            EventsError::Closed => "engine.events.closed",
        }
    }
}

impl Events {
    /// The next event; waits for one.
    pub async fn recv(&mut self) -> Result<Event, EventsError> {
        self.receiver.recv().await.map_err(|error| match error {
            broadcast::error::RecvError::Lagged(lost) => EventsError::Lagged(lost),
            broadcast::error::RecvError::Closed => EventsError::Closed,
        })
    }

    /// The next event if one is already waiting; `Ok(None)` if none is.
    pub fn try_recv(&mut self) -> Result<Option<Event>, EventsError> {
        match self.receiver.try_recv() {
            Ok(event) => Ok(Some(event)),
            Err(broadcast::error::TryRecvError::Empty) => Ok(None),
            Err(broadcast::error::TryRecvError::Lagged(lost)) => Err(EventsError::Lagged(lost)),
            Err(broadcast::error::TryRecvError::Closed) => Err(EventsError::Closed),
        }
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
    /// Labels to list and filter the tree by, recorded with its start.
    /// They are not part of the start's identity: starting the same id
    /// again with the same program and input but other labels returns the
    /// existing tree, which keeps the labels of its first start.
    pub labels: Labels,
}

impl<I> StartRequest<I> {
    /// A request with an unlimited budget, no capabilities, no deadline and
    /// no labels.
    pub fn new(id: StartId, input: I) -> StartRequest<I> {
        StartRequest {
            id,
            input,
            budget: Budget::unlimited(),
            capabilities: Capabilities::none(),
            deadline: None,
            labels: Labels::new(),
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

/// A tree locked for a start or a take-up in one engine; dropping it lets
/// the next waiting call in.
struct TreeGuard<'a> {
    engine: &'a EngineInner,
    tree: TreeId,
    done: Arc<tokio::sync::Notify>,
}

impl Drop for TreeGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut guards) = self.engine.guards.lock() {
            guards.remove(&self.tree);
        }
        self.done.notify_waiters();
    }
}

/// What [`Engine::verify`] checked of a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verification {
    /// The tree.
    pub tree: TreeId,
    /// The first record checked: 1 when the store keeps the whole log.
    pub first: u64,
    /// The last record checked, the log's head.
    pub head_seq: u64,
    /// The head's hash.
    pub head: Digest,
    /// The snapshot the check started from, when the store no longer keeps
    /// the records before it (its state is then taken as written).
    pub from_snapshot: Option<u64>,
    /// The snapshot found to match the log: its head is the chain's hash at
    /// that record and its state the fold of the records up to it.
    pub snapshot_matched: Option<u64>,
    /// Whether the store recorded a head with the tree's last append, and
    /// it was found to be the log's.
    pub head_recorded: bool,
}

/// Options for [`Engine::recover`].
#[derive(Clone, Debug, Default)]
pub struct RecoverOptions {
    /// Take over trees even when another writer holds a live lease.
    pub force: bool,
    /// Only trees of this scope.
    pub scope: Option<Scope>,
}

pub(crate) struct EngineInner {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    registry: Registry,
    owner: String,
    lease_ttl: Duration,
    max_steps_per_commit: usize,
    snapshot_every: u64,
    limits: TreeLimits,
    sleep: Sleep,
    idle_alarm: Option<Duration>,
    trees: Mutex<BTreeMap<TreeId, Weak<TreeShared>>>,
    /// The trees being started or taken up right now, each with the signal
    /// its guard gives when it is done, so concurrent calls on one tree in
    /// this engine share one owner instead of racing each other to the
    /// store.
    guards: Mutex<BTreeMap<TreeId, Arc<tokio::sync::Notify>>>,
    /// The lease tokens this engine holds, by tree, including those of
    /// trees no longer in memory, so `close` can release every one.
    leases: Mutex<BTreeMap<TreeId, u64>>,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    events: broadcast::Sender<Event>,
    /// Set by [`Engine::shutdown`]: no new start and no take-up.
    closing: std::sync::atomic::AtomicBool,
    /// Set when the engine is dropped, before its tasks are aborted and
    /// its sleeping trees closed: a tree task still running on another
    /// thread then closes its tree instead of leaving it asleep where no
    /// one would close it (see `Actor::hibernate`).
    dropped: std::sync::atomic::AtomicBool,
    /// How long a forwarded command waits for the holder.
    forward_timeout: Duration,
    /// Nudges for the inbox task, once it runs (see `inbox.rs`).
    inbox: Mutex<Option<tokio::sync::mpsc::UnboundedSender<TreeId>>>,
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
        // First: a task that hibernates after this sees it under its door's
        // lock, and one that hibernated before is closed below.
        self.dropped
            .store(true, std::sync::atomic::Ordering::SeqCst);
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
        self.registry.get(digest).cloned()
    }

    /// Locks `tree` for a start or a take-up in this engine, waiting while
    /// another call holds it.
    async fn guard(&self, tree: TreeId) -> TreeGuard<'_> {
        let lock = || {
            self.guards
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        loop {
            let done = {
                let mut guards = lock();
                match guards.get(&tree) {
                    Some(done) => done.clone(),
                    None => {
                        let done = Arc::new(tokio::sync::Notify::new());
                        guards.insert(tree, done.clone());
                        return TreeGuard {
                            engine: self,
                            tree,
                            done,
                        };
                    }
                }
            };
            let released = done.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            // The holder may have let go before the wait was registered:
            // look again before sleeping.
            let held = lock()
                .get(&tree)
                .is_some_and(|current| Arc::ptr_eq(current, &done));
            if held {
                released.await;
            }
        }
    }

    /// Notes a lease this engine now holds.
    pub(super) fn hold(&self, tree: TreeId, token: u64) {
        if let Ok(mut leases) = self.leases.lock() {
            leases.insert(tree, token);
        }
    }

    /// Forgets a lease this engine gave up or lost (if `token` is the one held).
    pub(super) fn forget(&self, tree: TreeId, token: u64) {
        if let Ok(mut leases) = self.leases.lock()
            && leases.get(&tree) == Some(&token)
        {
            leases.remove(&tree);
        }
    }

    /// Drops a tree whose writer stopped from the live trees, so the next
    /// call takes it up from the store.
    fn forget_live(&self, tree: TreeId, shared: &Arc<TreeShared>) {
        if let Ok(mut trees) = self.trees.lock()
            && trees
                .get(&tree)
                .is_some_and(|weak| std::ptr::eq(weak.as_ptr(), Arc::as_ptr(shared)))
        {
            trees.remove(&tree);
        }
    }

    /// Whether the engine was dropped (see `abort_all`).
    fn dropped(&self) -> bool {
        self.dropped.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether [`Engine::shutdown`] has begun.
    fn closing(&self) -> bool {
        self.closing.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The role of the newest registered program of this name (a program
    /// this engine does not run is a plain one).
    fn role(&self, program: Option<&Name>) -> crate::protocol::ProgramRole {
        program
            .and_then(|name| self.registry.newest(name))
            .map(|program| program.definition().role())
            .unwrap_or_default()
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
    /// Builds an engine from a validated configuration. Call from within a
    /// tokio runtime.
    pub fn new(config: EngineConfig) -> Result<Engine, ConfigError> {
        config.validate()?;
        let mut registry = Registry::default();
        for program in &config.programs {
            registry.add(program);
        }
        let owner = lease::new_owner();
        let (events, _) = broadcast::channel(config.event_capacity);
        Ok(Engine {
            inner: Arc::new(EngineInner {
                store: config.store,
                clock: config.clock,
                registry,
                owner,
                lease_ttl: config.lease_ttl,
                max_steps_per_commit: config.max_steps_per_commit,
                snapshot_every: config.snapshot_every,
                limits: config.limits,
                sleep: config.sleep,
                idle_alarm: config.idle_alarm,
                trees: Mutex::new(BTreeMap::new()),
                guards: Mutex::new(BTreeMap::new()),
                leases: Mutex::new(BTreeMap::new()),
                tasks: Mutex::new(Vec::new()),
                events,
                closing: std::sync::atomic::AtomicBool::new(false),
                dropped: std::sync::atomic::AtomicBool::new(false),
                forward_timeout: config.forward_timeout,
                inbox: Mutex::new(None),
            }),
        })
    }

    /// This engine's lease owner name (`host/pid/engine-n`).
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// Subscribes to this engine's live events: committed facts as they
    /// commit and non-durable deltas, of every tree it runs. A reader that
    /// falls more than `EngineConfig::event_capacity` events behind loses
    /// the oldest and is told how many (see [`Events::recv`]).
    pub fn events(&self) -> Events {
        Events {
            receiver: self.inner.events.subscribe(),
        }
    }

    /// Starts a root of a registered program, or returns the existing
    /// process when the same start id was started with the same program and
    /// input. The start is durable when this returns.
    pub async fn start<I: Serialize, O>(
        &self,
        program: &Program<I, O>,
        request: StartRequest<I>,
    ) -> Result<Started<O>, StartError> {
        let reference = program.reference();
        let Some(registered) = self.inner.program(&reference.digest) else {
            return Err(StartError::Unregistered {
                name: reference.name.to_string(),
                digest: reference.digest,
            });
        };
        let input = Payload::encode(&request.input).map_err(|error| {
            StartError::Input(Failure::contract(
                "execution.input.invalid",
                error.to_string(),
            ))
        })?;
        let request = StartRequest {
            id: request.id,
            input,
            budget: request.budget,
            capabilities: request.capabilities,
            deadline: request.deadline,
            labels: request.labels,
        };
        self.start_program(registered, request).await
    }

    /// Starts a root of the program registered last under `name` (its
    /// newest version), with a JSON input; see [`Engine::start`].
    pub async fn start_named(
        &self,
        name: &Name,
        request: StartRequest<Payload>,
    ) -> Result<Started, StartError> {
        let Some(program) = self.inner.registry.newest(name).cloned() else {
            return Err(StartError::UnknownProgram {
                name: name.to_string(),
            });
        };
        self.start_program(program, request).await
    }

    /// The registered programs, each name's versions oldest first.
    pub fn programs(&self) -> Vec<Program> {
        self.inner.registry.all()
    }

    async fn start_program<O>(
        &self,
        program: Program,
        request: StartRequest<Payload>,
    ) -> Result<Started<O>, StartError> {
        program
            .descriptor()
            .check_input(&request.input)
            .map_err(StartError::Input)?;
        let key = StartKey {
            tree: ProcessId::root(&request.id),
            program: program.reference().digest,
            input: state::InputDigest::of(&request.input),
        };
        let tree = key.tree;
        let handle = |shared| ProcessHandle::new(self.inner.clone(), shared, tree);
        if self.inner.closing() {
            return Err(StartError::ShuttingDown);
        }
        let _guard = self.inner.guard(key.tree).await;
        if let Some(shared) = self.inner.running(key.tree).await? {
            return if key.matches(&shared) {
                Ok(Started::Existing(handle(shared)))
            } else {
                Err(StartError::Conflict { id: request.id })
            };
        }
        Ok(
            match lifecycle::start(&self.inner, program, key, request).await? {
                StartOutcome::New(shared) => Started::New(handle(shared)),
                StartOutcome::Existing(shared) => Started::Existing(handle(shared)),
            },
        )
    }

    /// A handle on a root process by id, checking the caller's scope. A tree
    /// not running in this engine is taken up from the store.
    pub async fn process<O>(
        &self,
        scope: &Scope,
        id: ProcessId,
    ) -> Result<ProcessHandle<O>, TreeError> {
        let shared = self.inner.attach(id, Some(scope), false).await?;
        Ok(ProcessHandle::new(self.inner.clone(), shared, id))
    }

    /// Reopens every unfinished tree in the store and continues it. Trees
    /// that cannot be taken up are reported and left untouched.
    pub async fn recover(
        &self,
        options: RecoverOptions,
    ) -> Result<Vec<(TreeId, Result<(), TreeError>)>, StoreError> {
        let filter = ListFilter {
            scope: options.scope.clone(),
            ..ListFilter::default()
        };
        // Trees are taken up concurrently, so their lease acquisitions share
        // the store's group commits instead of waiting for one fsync each.
        let listing = self.inner.store.list(filter).await?;
        let mut attaching = tokio::task::JoinSet::new();
        for meta in listing.trees {
            if meta.status == TreeStatus::Done {
                continue;
            }
            let inner = self.inner.clone();
            let (force, scope) = (options.force, options.scope.clone());
            attaching.spawn(async move {
                let attached = inner.attach(meta.tree, scope.as_ref(), force).await;
                (meta.tree, attached.map(|_| ()))
            });
        }
        let mut report = Vec::new();
        // A row that does not read back fails its tree alone.
        for row in listing.unreadable {
            match row.tree {
                Some(tree) => report.push((tree, Err(TreeError::Store(row.error)))),
                None => {
                    tracing::warn!(id = %row.id, error = %row.error, "a stored tree row does not read back")
                }
            }
        }
        while let Some(joined) = attaching.join_next().await {
            match joined {
                Ok(entry) => report.push(entry),
                Err(error) => {
                    return Err(StoreError::unavailable(format!(
                        "a recovery task failed: {error}"
                    )));
                }
            }
        }
        report.sort_by_key(|(tree, _)| *tree);
        Ok(report)
    }

    /// The full committed state of a stored tree.
    pub async fn capture(&self, scope: &Scope, tree: TreeId) -> Result<TreeCapture, TreeError> {
        let load = self.inner.store.load(tree).await?;
        let (state, head_seq, head) = self.inner.checked_fold(tree, &load, Some(scope))?;
        Ok(TreeCapture {
            head_seq,
            head,
            state: Payload::encode(&state).map_err(|error| TreeError::Corrupt {
                tree,
                record: None,
                message: error.to_string(),
            })?,
        })
    }

    /// A view of a stored tree (committed state), showing what
    /// `visibility` allows.
    pub async fn inspect(
        &self,
        scope: &Scope,
        tree: TreeId,
        visibility: Visibility,
    ) -> Result<TreeView, TreeError> {
        let load = self.inner.store.load(tree).await?;
        let (state, head_seq, head) = self.inner.checked_fold(tree, &load, Some(scope))?;
        let mut view = TreeView::of(&state, head_seq, head, visibility);
        if let Some(live) = self.inner.live(tree) {
            live.progress.overlay(&mut view);
        }
        Ok(view)
    }

    /// Verifies everything the store keeps of a tree: the hash chain of
    /// every kept record (from the first when the store keeps the whole
    /// log, else from its latest snapshot), the snapshot against the log it
    /// covers, every record's decoding and fold, and the store's record of
    /// the tree (its head and scope) against the log. Says exactly what it
    /// checked.
    pub async fn verify(&self, scope: &Scope, tree: TreeId) -> Result<Verification, TreeError> {
        let history = self.inner.store.history(tree).await?;
        if !history.exists() {
            return Err(TreeError::NotFound { tree });
        }
        let (state, head_seq, head, checked) = state::verify_history(tree, &history)?;
        if &state.start.scope != scope {
            return Err(TreeError::Scope {
                tree,
                scope: scope.clone(),
            });
        }
        Ok(Verification {
            tree,
            first: checked.first,
            head_seq,
            head,
            from_snapshot: checked.from_snapshot,
            snapshot_matched: checked.snapshot_matched,
            head_recorded: checked.head_recorded,
        })
    }

    /// Watches a tree: every committed fact from log sequence `from` on
    /// (`0` or `1` for all), read from the store, so a reader can start
    /// after the tree finished or resume after a reconnect and still see
    /// each fact exactly once and in order; interleaved with the live,
    /// non-durable events (deltas) of the tree while this engine runs it. A
    /// slow reader may lose live events, never committed ones, and is told
    /// when it lost any. The stream ends after the last fact of a finished
    /// tree. Watching takes no lease and changes nothing.
    pub async fn watch(&self, scope: &Scope, tree: TreeId, from: u64) -> Result<Watch, TreeError> {
        Watch::open(self.inner.clone(), scope, tree, from).await
    }

    /// Waits until a tree's committed state meets `condition` (see
    /// [`ProcessHandle::until`]), taking the tree up as
    /// [`Engine::process`] does.
    pub async fn until(
        &self,
        scope: &Scope,
        tree: TreeId,
        condition: Condition,
    ) -> Result<TreeView, ControlError> {
        let handle: ProcessHandle = self.process(scope, tree).await?;
        handle.until(condition).await
    }

    /// Shuts down gracefully: takes no new start and takes up no tree,
    /// stops every tree from taking new steps (steps already taken still
    /// commit, and dispatches whose intent is committed are still sent),
    /// waits up to `grace` for the dispatches in flight to settle and their
    /// settlements to commit, then closes as [`Engine::close`] does. A
    /// dispatch still in flight after `grace` is left as a crash would
    /// leave it: its effect is pending in the log, and recovery decides by
    /// its replay policy.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner
            .closing
            .store(true, std::sync::atomic::Ordering::Release);
        let trees: Vec<Arc<TreeShared>> = self
            .inner
            .trees
            .lock()
            .map(|trees| trees.values().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        let mut draining = tokio::task::JoinSet::new();
        for shared in trees {
            // A sleeping tree has nothing in flight; `close` gives it up.
            if shared.sleeping_token().is_some() {
                continue;
            }
            let (reply, drained) = oneshot::channel();
            if self
                .inner
                .send(&shared, Box::new(Command::Drain { reply }))
                .is_ok()
            {
                draining.spawn(async move {
                    let _ = drained.await;
                });
            }
        }
        let all_drained = async { while draining.join_next().await.is_some() {} };
        let clock = self.inner.clock.clone();
        tokio::select! {
            () = all_drained => {}
            () = clock.sleep_until(clock.now().plus(grace)) => {
                tracing::warn!(?grace, "dispatches still in flight after the shutdown grace; their effects stay pending for recovery");
            }
        }
        self.release_all().await;
    }

    /// Whether [`Engine::shutdown`] has begun: the engine takes no new start
    /// and takes up no tree.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.closing()
    }

    /// Stops every tree task and releases every lease this engine holds,
    /// those of sleeping trees no handle holds any more included, so
    /// another engine can take every tree at once, without force.
    pub async fn close(self) {
        self.release_all().await;
    }

    async fn release_all(&self) {
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
                        let token = sleeper.token();
                        let _ = inner.store.release(shared.tree, token).await;
                        inner.forget(shared.tree, token);
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
        // What is left: leases of trees no longer in memory (sleeping trees
        // nobody held, writers stopped by a failing store).
        let held: Vec<(TreeId, u64)> = self
            .inner
            .leases
            .lock()
            .map(|mut leases| std::mem::take(&mut *leases).into_iter().collect())
            .unwrap_or_default();
        for (tree, token) in held {
            let inner = self.inner.clone();
            closing.spawn(async move {
                let _ = inner.store.release(tree, token).await;
            });
        }
        while closing.join_next().await.is_some() {}
    }
}

impl EngineInner {
    /// The tree as this engine runs it (or ran it to the end), if it does;
    /// a tree whose writer stopped (fenced, or its store failed) is dropped
    /// and reported once with the reason, so the next call takes it up from
    /// the store afresh. A sleeping tree's lease is renewed first: another
    /// engine may have taken the tree while it slept.
    async fn running(self: &Arc<Self>, tree: TreeId) -> Result<Option<Arc<TreeShared>>, TreeError> {
        let Some(shared) = self.live(tree) else {
            return Ok(None);
        };
        let finished = shared.outcome.read().finished;
        if finished {
            return Ok(Some(shared));
        }
        if let Some(token) = shared.sleeping_token() {
            let until = self.clock.now().plus(self.lease_ttl);
            if !self.store.renew(tree, token, until).await? {
                if let Some(sleeper) = shared.take_sleeper() {
                    let head_seq = sleeper.head_seq();
                    sleeper.close(RuntimeError::Fenced { tree, head_seq });
                }
                self.forget(tree, token);
            }
        } else {
            // An awake writer renews at once and says whether it still
            // holds the tree (a writer that stopped already says so below).
            let (reply, renewed) = oneshot::channel();
            if self
                .send(&shared, Box::new(Command::Renew { reply }))
                .is_ok()
            {
                let _ = renewed.await;
            }
        }
        let stopped = shared.outcome.read().stopped.clone();
        match stopped {
            Some(error) => {
                self.forget_live(tree, &shared);
                Err(TreeError::Stopped(error))
            }
            None => Ok(Some(shared)),
        }
    }

    /// What the store says of a signal resent to a tree no writer runs any
    /// more: a duplicate or a conflict of an admitted one, else the process
    /// has terminated. The signal goes to `process`, or (`None`) to the
    /// process that opened the wait it answers.
    async fn stored_receipt(
        &self,
        tree: TreeId,
        process: Option<ProcessId>,
        request: SignalRequest,
    ) -> Result<SignalReceipt, SignalError> {
        let terminated = SignalError::Terminated {
            process: process.unwrap_or(tree),
        };
        let Ok(load) = self.store.load(tree).await else {
            return Err(terminated);
        };
        let Ok((state, _, _)) = self.checked_fold(tree, &load, None) else {
            return Err(terminated);
        };
        let signal = crate::protocol::Signal {
            id: request.id,
            wait: request.wait,
            body: crate::protocol::SignalBody::Input {
                payload: request.payload,
            },
        };
        // An answer routed by its wait belongs to the process that opened it.
        let process = match process {
            Some(process) => process,
            None => match signal.wait.and_then(|wait| round::waiter(&state, wait)) {
                Some(process) => process,
                None => return Err(terminated),
            },
        };
        match round::receipt(&state, process, &signal) {
            Some(Ok(_)) => Ok(SignalReceipt::Duplicate),
            Some(Err(error)) => Err(error),
            None => Err(terminated),
        }
    }

    fn checked_fold(
        &self,
        tree: TreeId,
        load: &TreeLoad,
        scope: Option<&Scope>,
    ) -> Result<(TreeState, u64, Digest), TreeError> {
        if !load.exists() {
            return Err(TreeError::NotFound { tree });
        }
        let folded = fold(tree, load)?;
        if let Some(scope) = scope
            && &folded.0.start.scope != scope
        {
            return Err(TreeError::Scope {
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
    ) -> Result<Arc<TreeShared>, TreeError> {
        let _guard = self.guard(tree).await;
        if let Some(shared) = self.running(tree).await? {
            if let Some(scope) = scope
                && &shared.scope != scope
            {
                return Err(TreeError::Scope {
                    tree,
                    scope: scope.clone(),
                });
            }
            return Ok(shared);
        }
        if self.closing() {
            return Err(TreeError::ShuttingDown { tree });
        }
        // Read without a lease first: a tree that cannot be taken up stays untouched.
        let load = self.store.load(tree).await?;
        let (state, _, _) = self.checked_fold(tree, &load, scope)?;
        if let Some((process, name, digest)) =
            version::first_unavailable(&state, |digest| self.program(digest).is_some())
        {
            // The root's full identity is in its start record, which the
            // load holds unless a snapshot compacted it away; a store that
            // keeps the whole history still has it.
            let stored = match (process == tree, version::root_reference(&load)) {
                (false, _) => None,
                (true, Some(reference)) => Some(reference),
                (true, None) => self
                    .store
                    .history(tree)
                    .await
                    .ok()
                    .and_then(|history| version::root_reference(&history)),
            };
            return Err(version::unavailable(
                &self.registry,
                tree,
                &name,
                digest,
                stored.as_ref(),
            ));
        }
        if state.root_termination().is_some() {
            return Ok(lifecycle::finished(self, &state));
        }
        lifecycle::resume(self, tree, force).await
    }
}
