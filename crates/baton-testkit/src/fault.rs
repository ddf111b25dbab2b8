//! A store wrapper that crashes before or after a chosen commit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use baton_run::log::{Record, RecordKind, Snapshot};
use baton_run::store::{
    AcquireRequest, Acquired, Append, AppendOutcome, Changes, CreateTree, Created, ListFilter,
    Listing, Message, MessageId, PostOutcome, Posted, Settle, SettleOutcome, Store, StoreError,
    TreeLoad,
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

/// Wraps a store and, once armed, "crashes" at the n-th commit (an append
/// or a new tree's first commit) containing a record of a given kind: the append fails (before or after reaching the
/// inner store) and every later call fails too, so the engine above stops
/// that tree exactly as a process crash would. Recover by building a new
/// engine on [`FaultStore::inner`].
///
/// [`FaultStore::answering_late`] makes it answer every write only after the
/// caller yielded to the runtime, as a store that writes on another thread
/// or server does, so the engine stages its next round while a commit is in
/// flight.
#[derive(Clone)]
pub struct FaultStore {
    inner: Arc<dyn Store>,
    fault: Arc<Mutex<Option<Fault>>>,
    crashed: Arc<AtomicBool>,
    late: bool,
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
            late: false,
        }
    }

    /// Answers every write (a new tree, an append, a snapshot) from another
    /// task, once the caller's task let the runtime run it: the first poll
    /// of a write is always pending, as on a store that writes on another
    /// thread. The inner store does the write when it would (a
    /// `MemoryStore` when called), so writes are stored in the order they
    /// were made, as one writer stores them, and a later call (a renewal)
    /// sees them before their answers.
    pub fn answering_late(mut self) -> FaultStore {
        self.late = true;
        self
    }

    fn later<'a, T: Send + 'a>(&self, write: BoxFuture<'a, T>) -> BoxFuture<'a, T> {
        if !self.late {
            return write;
        }
        Box::pin(async move {
            let answer = write.await;
            // Answered by another task, so the caller's task waits for the
            // runtime to run others (a yield alone is ready when polled
            // again, whether or not the caller let anything else run).
            let (told, answered) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                let _ = told.send(());
            });
            let _ = answered.await;
            answer
        })
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

    /// Whether a commit of `records` is the one the crash cuts, and how.
    fn trips<'r>(&self, mut records: impl Iterator<Item = &'r Record>) -> Option<Cut> {
        let mut fault = self.fault.lock().ok()?;
        let armed = fault.as_mut()?;
        let kind = armed.kind;
        if !records.any(|r| r.kind == kind) {
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

    /// Runs `commit` as `cut` says: as it is (`None`), not at all and
    /// crashed before it, or through to its end and crashed after it (the
    /// caller never hears that it committed).
    fn cut_commit<'a, T: Send + 'a>(
        &'a self,
        cut: Option<Cut>,
        commit: impl FnOnce() -> BoxFuture<'a, Result<T, StoreError>> + Send + 'a,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        match cut {
            None => commit(),
            Some(Cut::Before) => {
                self.crashed.store(true, Ordering::SeqCst);
                Box::pin(std::future::ready(Err(StoreError::unavailable(
                    "fault store: crashed before the commit",
                ))))
            }
            Some(Cut::After) => Box::pin(async move {
                let _ = commit().await?;
                self.crashed.store(true, Ordering::SeqCst);
                Err(StoreError::unavailable(
                    "fault store: crashed after the commit",
                ))
            }),
        }
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

    fn create_tree(&self, create: CreateTree) -> BoxFuture<'_, Result<Created, StoreError>> {
        if let Some(error) = self.dead() {
            return failed(error);
        }
        let cut = self.trips(create.records.iter());
        self.later(self.cut_commit(cut, move || self.inner.create_tree(create)))
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
        let cut = self.trips(batch.iter().flat_map(|append| &append.records));
        self.later(self.cut_commit(cut, move || self.inner.append(batch)))
    }

    fn write_snapshot(
        &self,
        tree: TreeId,
        token: u64,
        snapshot: Snapshot,
    ) -> BoxFuture<'_, Result<AppendOutcome, StoreError>> {
        match self.dead() {
            Some(error) => failed(error),
            None => self.later(self.inner.write_snapshot(tree, token, snapshot)),
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

/// Starts `request` on `engine`, whose store is a [`FaultStore`] armed to
/// crash, and returns the tree. A root that ends or waits within its first
/// round is created by one commit holding its whole first round, so a crash
/// that cuts that commit fails the start itself (with `engine.store.failed`);
/// a crash of a later commit stops the tree's writer with a storage error.
/// Either way the caller recovers on a fresh engine and starts the same
/// request again: nothing for a stored tree, the first start of one the
/// crash lost.
pub async fn start_into_crash<I, O>(
    engine: &baton_run::Engine,
    program: &baton_run::Program<I, O>,
    request: baton_run::StartRequest<I>,
) -> TreeId
where
    I: serde::Serialize,
{
    let tree = baton_run::ProcessId::root(&request.id);
    match engine.start(program, request).await {
        Ok(handle) => {
            let stopped = handle.await_result().await;
            assert!(
                matches!(stopped, Err(baton_run::RuntimeError::Storage { .. })),
                "the writer must stop on the crash, got {stopped:?}"
            );
        }
        Err(error) => assert_eq!(
            error.code(),
            "engine.store.failed",
            "the start failed otherwise than by the crash: {error}"
        ),
    }
    tree
}
