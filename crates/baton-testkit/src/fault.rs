//! A store wrapper that crashes before or after a chosen commit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use baton_run::log::{RecordKind, Snapshot};
use baton_run::store::{
    AcquireRequest, Acquired, Append, AppendOutcome, Changes, ListFilter, Listing, Message,
    MessageId, PostOutcome, Posted, Settle, SettleOutcome, Store, StoreError, TreeLoad,
};
use baton_run::{BoxFuture, Timestamp, TreeId};

/// Where a crash cuts a commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Nothing of the commit reaches the store.
    Before,
    /// The commit reaches the store but its acknowledgement is lost.
    After,
}

#[derive(Debug)]
struct Fault {
    kind: RecordKind,
    cut: Cut,
    remaining: usize,
}

/// Wraps a store and, once armed, "crashes" at the n-th append containing a
/// record of a given kind: the append fails (before or after reaching the
/// inner store) and every later call fails too, so the engine above stops
/// that tree exactly as a process crash would. Recover by building a new
/// engine on [`FaultStore::inner`].
#[derive(Clone)]
pub struct FaultStore {
    inner: Arc<dyn Store>,
    fault: Arc<Mutex<Option<Fault>>>,
    crashed: Arc<AtomicBool>,
}

impl std::fmt::Debug for FaultStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultStore")
            .field("crashed", &self.crashed())
            .finish_non_exhaustive()
    }
}

impl FaultStore {
    /// Wraps `inner`, unarmed.
    pub fn new(inner: Arc<dyn Store>) -> FaultStore {
        FaultStore {
            inner,
            fault: Arc::default(),
            crashed: Arc::default(),
        }
    }

    /// Crashes at the `nth` (from 1) append that contains a `kind` record.
    pub fn arm(&self, kind: RecordKind, cut: Cut, nth: usize) {
        if let Ok(mut fault) = self.fault.lock() {
            *fault = Some(Fault {
                kind,
                cut,
                remaining: nth.max(1),
            });
        }
    }

    /// Whether the crash happened.
    pub fn crashed(&self) -> bool {
        self.crashed.load(Ordering::SeqCst)
    }

    /// The wrapped store, to recover on.
    pub fn inner(&self) -> Arc<dyn Store> {
        self.inner.clone()
    }

    fn dead(&self) -> Option<StoreError> {
        self.crashed()
            .then(|| StoreError::unavailable("fault store: crashed"))
    }

    fn trips(&self, batch: &[Append]) -> Option<Cut> {
        let mut fault = self.fault.lock().ok()?;
        let armed = fault.as_mut()?;
        let kind = armed.kind;
        if !batch
            .iter()
            .any(|append| append.records.iter().any(|r| r.kind == kind))
        {
            return None;
        }
        armed.remaining -= 1;
        if armed.remaining > 0 {
            return None;
        }
        let cut = armed.cut;
        *fault = None;
        Some(cut)
    }
}

fn failed<T: Send + 'static>(error: StoreError) -> BoxFuture<'static, Result<T, StoreError>> {
    Box::pin(std::future::ready(Err(error)))
}

impl Store for FaultStore {
    fn acquire(&self, request: AcquireRequest) -> BoxFuture<'_, Result<Acquired, StoreError>> {
        match self.dead() {
            Some(error) => failed(error),
            None => self.inner.acquire(request),
        }
    }

    fn load(&self, tree: TreeId) -> BoxFuture<'_, Result<TreeLoad, StoreError>> {
        match self.dead() {
            Some(error) => failed(error),
            None => self.inner.load(tree),
        }
    }

    fn history(&self, tree: TreeId) -> BoxFuture<'_, Result<TreeLoad, StoreError>> {
        match self.dead() {
            Some(error) => failed(error),
            None => self.inner.history(tree),
        }
    }

    fn append(&self, batch: Vec<Append>) -> BoxFuture<'_, Result<Vec<AppendOutcome>, StoreError>> {
        if let Some(error) = self.dead() {
            return failed(error);
        }
        match self.trips(&batch) {
            None => self.inner.append(batch),
            Some(Cut::Before) => {
                self.crashed.store(true, Ordering::SeqCst);
                failed(StoreError::unavailable(
                    "fault store: crashed before the commit",
                ))
            }
            Some(Cut::After) => Box::pin(async move {
                let _ = self.inner.append(batch).await?;
                self.crashed.store(true, Ordering::SeqCst);
                Err(StoreError::unavailable(
                    "fault store: crashed after the commit",
                ))
            }),
        }
    }

    fn write_snapshot(
        &self,
        tree: TreeId,
        token: u64,
        snapshot: Snapshot,
    ) -> BoxFuture<'_, Result<AppendOutcome, StoreError>> {
        match self.dead() {
            Some(error) => failed(error),
            None => self.inner.write_snapshot(tree, token, snapshot),
        }
    }

    fn renew(
        &self,
        tree: TreeId,
        token: u64,
        until: Timestamp,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        match self.dead() {
            Some(error) => failed(error),
            None => self.inner.renew(tree, token, until),
        }
    }

    fn release(&self, tree: TreeId, token: u64) -> BoxFuture<'_, Result<(), StoreError>> {
        match self.dead() {
            Some(error) => failed(error),
            None => self.inner.release(tree, token),
        }
    }

    fn list(&self, filter: ListFilter) -> BoxFuture<'_, Result<Listing, StoreError>> {
        match self.dead() {
            Some(error) => failed(error),
            None => self.inner.list(filter),
        }
    }

    fn changes(&self) -> BoxFuture<'_, Result<Option<Changes>, StoreError>> {
        match self.dead() {
            Some(error) => failed(error),
            None => self.inner.changes(),
        }
    }

    fn post(&self, message: Message) -> BoxFuture<'_, Result<PostOutcome, StoreError>> {
        match self.dead() {
            Some(error) => failed(error),
            None => self.inner.post(message),
        }
    }

    fn pending(&self, tree: Option<TreeId>) -> BoxFuture<'_, Result<Vec<Message>, StoreError>> {
        match self.dead() {
            Some(error) => failed(error),
            None => self.inner.pending(tree),
        }
    }

    fn settle(&self, settle: Settle) -> BoxFuture<'_, Result<SettleOutcome, StoreError>> {
        match self.dead() {
            Some(error) => failed(error),
            None => self.inner.settle(settle),
        }
    }

    fn message(
        &self,
        tree: TreeId,
        id: MessageId,
    ) -> BoxFuture<'_, Result<Option<Posted>, StoreError>> {
        match self.dead() {
            Some(error) => failed(error),
            None => self.inner.message(tree, id),
        }
    }
}
