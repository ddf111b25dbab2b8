//! The worker: the engine a host drives, the trees it holds, the takeover
//! loop and admission (at most `max_running` trees moving at once).
//!
//! A tree counts against `max_running` from the moment the host starts it,
//! takes it over or moves it on (an answer, a cancellation, a resolution)
//! until it is quiescent again (every live process waits for an answer or
//! is parked, or the tree ended): a waiting tree costs a few hundred bytes
//! and no permit, however long it waits. The host keeps a handle on every
//! tree it holds until the tree ends or its writer stops, so the takeover
//! loop never takes up a tree twice.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::run::store::{ListFilter, Store, StoreError, TreeStatus};
use baton::run::{Condition, Engine, Payload, ProcessHandle, Scope, TreeError, TreeId};
use futures_util::StreamExt as _;
use tokio::sync::{OwnedSemaphorePermit, RwLock, RwLockReadGuard, Semaphore, watch};
use tokio::task::JoinSet;

use crate::config::WakeSource;
use crate::console::auth::CsrfKey;
use crate::tokens::Tokens;

/// The host is shutting down (or never got an engine): no new work.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Draining;

/// What the HTTP API and the worker share.
pub(crate) struct Host {
    engine: RwLock<Option<Engine>>,
    pub(crate) store: Arc<dyn Store>,
    draining: watch::Sender<bool>,
    ready: watch::Sender<bool>,
    permits: Arc<Semaphore>,
    /// The trees this host holds a handle on (started, taken over or moved
    /// on here, not yet ended).
    held: Mutex<BTreeSet<TreeId>>,
    /// Trees the takeover loop reported as impossible to take up here (a
    /// program not in the registry): reported once, not every scan.
    skipped: Mutex<BTreeSet<TreeId>>,
    /// The tasks that hold trees' handles and permits.
    drivers: Mutex<JoinSet<()>>,
    pub(crate) tokens: Tokens,
    /// The key of the console's CSRF tokens, drawn when the host starts.
    pub(crate) csrf: CsrfKey,
    pub(crate) max_wait: Duration,
}

impl Host {
    pub(crate) fn new(
        engine: Engine,
        store: Arc<dyn Store>,
        tokens: Tokens,
        csrf: CsrfKey,
        max_running: usize,
        max_wait: Duration,
    ) -> Host {
        Host {
            engine: RwLock::new(Some(engine)),
            store,
            draining: watch::Sender::new(false),
            ready: watch::Sender::new(false),
            permits: Arc::new(Semaphore::new(max_running)),
            held: Mutex::new(BTreeSet::new()),
            skipped: Mutex::new(BTreeSet::new()),
            drivers: Mutex::new(JoinSet::new()),
            tokens,
            csrf,
            max_wait,
        }
    }

    /// The engine, unless the host is shutting down. Hold the guard only
    /// for one operation: a shutdown waits for every guard to go.
    pub(crate) async fn engine(&self) -> Result<RwLockReadGuard<'_, Engine>, Draining> {
        if self.is_draining() {
            return Err(Draining);
        }
        let guard = self.engine.read().await;
        RwLockReadGuard::try_map(guard, Option::as_ref).map_err(|_| Draining)
    }

    /// Whether a shutdown began.
    pub(crate) fn is_draining(&self) -> bool {
        *self.draining.borrow()
    }

    /// Resolves once a shutdown begins.
    pub(crate) async fn drained(&self) {
        let mut draining = self.draining.subscribe();
        // An error means the sender is gone, which only happens with the host.
        let _ = draining.wait_for(|draining| *draining).await;
    }

    /// Whether the initial recovery finished and no shutdown began.
    pub(crate) fn is_ready(&self) -> bool {
        *self.ready.borrow() && !self.is_draining()
    }

    /// Resolves once the initial recovery finished (never, if a shutdown
    /// came first).
    pub(crate) async fn ready(&self) {
        let mut ready = self.ready.subscribe();
        let became_ready = async move { ready.wait_for(|ready| *ready).await.is_ok() };
        let became_ready = tokio::select! {
            became_ready = became_ready => became_ready,
            () = self.drained() => false,
        };
        // A shutdown first (or a host gone): never ready.
        if !became_ready {
            std::future::pending::<()>().await;
        }
    }

    /// Begins a shutdown: readiness and new work are refused from now on.
    pub(crate) fn begin_shutdown(&self) {
        self.draining.send_replace(true);
    }

    /// A permit to move one tree, waiting at most `wait` (and not past the
    /// start of a shutdown); `None` when none came in time.
    pub(crate) async fn permit(&self, wait: Duration) -> Option<OwnedSemaphorePermit> {
        tokio::select! {
            permit = tokio::time::timeout(wait, self.permits.clone().acquire_owned()) => {
                permit.ok().and_then(Result::ok)
            }
            () = self.drained() => None,
        }
    }

    /// Keeps `handle`'s tree as one this host holds: `permit` (if any) is
    /// given back once the tree is quiescent, and the handle is kept until
    /// the tree ends or its writer stops.
    pub(crate) fn track(
        self: &Arc<Self>,
        handle: ProcessHandle,
        permit: Option<OwnedSemaphorePermit>,
    ) {
        let tree = handle.tree();
        let newly = self
            .held
            .lock()
            .map(|mut held| held.insert(tree))
            .unwrap_or(false);
        if permit.is_none() && !newly {
            return;
        }
        let host = self.clone();
        let task = async move {
            if let Some(permit) = permit {
                let _ = handle.until(Condition::Quiescent).await;
                drop(permit);
            }
            if newly {
                // Ends with the tree, or when its writer stops (fenced by
                // another engine, a failing store, the shutdown): then the
                // next scan looks at the tree afresh.
                let _ = handle.until(Condition::Terminal).await;
                if let Ok(mut held) = host.held.lock() {
                    held.remove(&tree);
                }
            }
        };
        if let Ok(mut drivers) = self.drivers.lock() {
            // Finished drivers are reaped here, so the set holds only the
            // trees still held.
            while drivers.try_join_next().is_some() {}
            drivers.spawn(task);
        }
    }

    /// One pass of the takeover loop: every unfinished tree this host does
    /// not hold is taken up (a permit each), unless another live engine
    /// holds it, which is skipped quietly. Returns how many were taken.
    pub(crate) async fn scan(self: &Arc<Self>) -> Result<usize, StoreError> {
        let listing = self.store.list(ListFilter::default()).await?;
        for row in &listing.unreadable {
            tracing::warn!(id = %row.id, error = %row.error, "a stored tree row does not read back");
        }
        let mut attaching = JoinSet::new();
        for meta in listing.trees {
            if meta.status == TreeStatus::Done || self.holds(meta.tree) || self.skips(meta.tree) {
                continue;
            }
            let Some(permit) = self.permit(Duration::MAX).await else {
                break;
            };
            let host = self.clone();
            attaching.spawn(async move { host.take_over(meta.scope, meta.tree, permit).await });
        }
        let mut taken = 0;
        while let Some(joined) = attaching.join_next().await {
            if joined.unwrap_or(false) {
                taken += 1;
            }
        }
        Ok(taken)
    }

    fn holds(&self, tree: TreeId) -> bool {
        self.held.lock().is_ok_and(|held| held.contains(&tree))
    }

    fn skips(&self, tree: TreeId) -> bool {
        self.skipped
            .lock()
            .is_ok_and(|skipped| skipped.contains(&tree))
    }

    /// Takes up one tree; `true` if this host now holds it.
    async fn take_over(
        self: Arc<Self>,
        scope: Scope,
        tree: TreeId,
        permit: OwnedSemaphorePermit,
    ) -> bool {
        let Ok(engine) = self.engine().await else {
            return false;
        };
        let taken = engine.process::<Payload>(&scope, tree).await;
        drop(engine);
        match taken {
            Ok(handle) => {
                tracing::info!(%tree, %scope, "took the tree up");
                self.track(handle, Some(permit));
                true
            }
            // Another engine is alive and holds it: its tree, not a failure.
            Err(TreeError::LeaseHeld { owner, .. }) => {
                tracing::debug!(%tree, %owner, "the tree is held by a live engine");
                false
            }
            Err(error @ TreeError::ProgramUnavailable { .. }) => {
                tracing::warn!(%tree, code = error.code(), %error, "the tree's program is not registered here; it is left to a host that has it");
                if let Ok(mut skipped) = self.skipped.lock() {
                    skipped.insert(tree);
                }
                false
            }
            Err(error) => {
                tracing::warn!(%tree, code = error.code(), %error, "the tree could not be taken up");
                false
            }
        }
    }

    /// The worker: the initial recovery, then a scan every `interval` or
    /// when `wake` says so, until a shutdown begins.
    pub(crate) async fn work(self: Arc<Self>, interval: Duration, wake: Option<WakeSource>) {
        match self.scan().await {
            Ok(taken) => tracing::info!(taken, "initial recovery finished"),
            Err(error) => {
                tracing::warn!(%error, "the initial recovery could not list the store; the next scan tries again")
            }
        }
        self.ready.send_replace(true);
        let mut wake = wake.map(WakeSource::into_stream);
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate; the initial recovery was that scan.
        ticks.tick().await;
        loop {
            let woken = async {
                match wake.as_mut() {
                    Some(stream) => stream.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = self.drained() => return,
                _ = ticks.tick() => {}
                woke = woken => {
                    if woke.is_none() {
                        // The source ended: scans keep their interval.
                        wake = None;
                    }
                }
            }
            if let Err(error) = self.scan().await {
                tracing::warn!(%error, "a takeover scan could not list the store");
            }
        }
    }

    /// Ends the host: waits for every engine guard to go, shuts the engine
    /// down with `grace`, and waits for the tasks that held trees.
    pub(crate) async fn finish(&self, grace: Duration) {
        self.begin_shutdown();
        let engine = self.engine.write().await.take();
        if let Some(engine) = engine {
            engine.shutdown(grace).await;
        }
        let mut drivers = self
            .drivers
            .lock()
            .map(|mut drivers| std::mem::take(&mut *drivers))
            .unwrap_or_default();
        // Every handle reports the engine closed now, so these end at once.
        while drivers.join_next().await.is_some() {}
    }
}
