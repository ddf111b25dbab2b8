//! The store's writes: queued in call order and applied in group
//! transactions, one group at a time, by whoever holds the writer's
//! connection.
//!
//! A write goes into one queue when it is called. Whoever holds the
//! connection drains the queue a group at a time (up to
//! `SqliteConfig::max_batch` writes, one transaction and one fsync) and
//! answers each write after its group committed. With
//! [`CommitOn::Caller`] the task that awaits a short run's one commit
//! ([`Write::in_place`]), when it is alone in the queue and nobody holds
//! the connection, takes the connection and commits on its own thread
//! under `tokio::task::block_in_place`: the run then costs its commit and
//! no hand-off between threads (the writer thread woken, then the task
//! woken back). A task that finds the connection taken waits for its
//! answer: the holder serves what is queued before it lets go, and looks
//! at the queue again after letting go, so no write is left behind. The
//! writer thread serves everything else when rung: other writes, writes
//! queued behind others, writes awaited outside a multi-thread tokio
//! runtime (where blocking in place is not allowed), writes whose future
//! was dropped unawaited, and what remains after a caller has led
//! [`CALLER_GROUPS`] groups.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError, mpsc};

use baton_run::log::Snapshot;
use baton_run::store::{
    AcquireRequest, Acquired, Append, AppendOutcome, Change, Created, Message, PostOutcome, Settle,
    SettleOutcome, StoreError,
};
use baton_run::{Timestamp, TreeId};
use rusqlite::Connection;

use crate::{CommitOn, Reply, cuts, db, inbox, stopped};

/// The most groups a caller commits for others once it leads: then the
/// writer thread takes over what is still queued, so a task under load
/// goes back to its own work.
pub(crate) const CALLER_GROUPS: usize = 2;

/// A write, queued in call order and applied inside a group transaction.
pub(crate) enum Write {
    Acquire(AcquireRequest, Reply<Acquired>),
    Create(db::NewTree, Reply<Created>),
    Append(Vec<Append>, Reply<Vec<AppendOutcome>>),
    Snapshot(TreeId, u64, Snapshot, Reply<AppendOutcome>),
    Renew(TreeId, u64, Timestamp, Reply<bool>),
    Release(TreeId, u64, Reply<()>),
    Prune(Timestamp, Reply<usize>),
    Post(Message, Reply<PostOutcome>),
    Settle(Settle, Reply<SettleOutcome>),
}

impl Write {
    /// Whether its caller may commit it in place ([`CommitOn::Caller`]):
    /// only a new tree's first commit that holds a whole short run (the
    /// root ended, or waits, after its first round), the one commit of a
    /// run whose host then has nothing else to do. Every other write goes
    /// to the writer thread: the engine overlaps a running tree's appends
    /// and snapshots with its next round; and measured on two cores, in a
    /// long tree whose start and last append were committed in place, the
    /// commits between them (on the writer thread) took up to twice as
    /// long and `team1000` on SQLite was 10-15% slower, so commits in
    /// place are kept to short runs.
    fn in_place(&self) -> bool {
        match self {
            Write::Create(new, _) => new.short_run(),
            Write::Acquire(..)
            | Write::Append(..)
            | Write::Snapshot(..)
            | Write::Renew(..)
            | Write::Release(..)
            | Write::Prune(..)
            | Write::Post(..)
            | Write::Settle(..) => false,
        }
    }
}

/// What a write produced, sent only once its transaction committed.
// Short-lived and matched at once; boxing the granted load would only add
// an allocation to every acquisition.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Written {
    Acquired(Acquired),
    Created(Created),
    Appended(Vec<AppendOutcome>),
    Snapshot(AppendOutcome),
    Renewed(bool),
    Released,
    Pruned(usize),
    Posted(PostOutcome),
    Settled(SettleOutcome),
}

/// The writer's connection and what it keeps beside it.
pub(crate) struct Core {
    /// Taken (closed) by the writer thread when the store closes.
    conn: Option<Connection>,
    cuts: cuts::Cuts,
    writer: Writer,
}

impl Core {
    pub(crate) fn new(conn: Connection, writer: Writer) -> Core {
        Core {
            conn: Some(conn),
            cuts: cuts::Cuts::default(),
            writer,
        }
    }
}

/// What the writer keeps besides its connection.
pub(crate) struct Writer {
    pub(crate) compact: bool,
    /// Payload bytes committed; see [`crate::SqliteStore::bytes_written`].
    pub(crate) counter: Arc<AtomicU64>,
    pub(crate) notices: Arc<inbox::Notices>,
}

/// The queued writes.
struct Queue {
    writes: VecDeque<Write>,
    /// The store is closing: nothing more is queued.
    closed: bool,
}

/// What rings the writer thread.
pub(crate) enum Bell {
    /// Writes are queued for it.
    Work,
    /// The store is closing: serve what is queued, close the connection.
    Close,
}

/// The queue and the connection that serves it; see the module's notes.
pub(crate) struct Desk {
    core: Mutex<Core>,
    queue: Mutex<Queue>,
    /// Rings the writer thread (a channel, whose receiver spins briefly
    /// before it sleeps: a commit that follows closely on the last is
    /// picked up without a wake-up).
    bell: mpsc::Sender<Bell>,
    max_batch: usize,
    commit_on: CommitOn,
    /// Groups applied on an awaiting task's thread; see
    /// [`crate::SqliteStore::caller_groups`].
    caller_groups: AtomicU64,
}

/// A lock whose holder panicked still guards consistent data here: a
/// group's transaction rolls back as its guard unwinds, and the queue is
/// changed only by whole pushes and pops.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The connection, if nobody else holds it.
fn try_lock<T>(mutex: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

impl Desk {
    /// The desk, and the receiving end of its bell for the writer thread
    /// ([`Desk::run`]).
    pub(crate) fn new(
        core: Core,
        max_batch: usize,
        commit_on: CommitOn,
    ) -> (Desk, mpsc::Receiver<Bell>) {
        let (bell, rung) = mpsc::channel();
        let desk = Desk {
            core: Mutex::new(core),
            queue: Mutex::new(Queue {
                writes: VecDeque::new(),
                closed: false,
            }),
            bell,
            max_batch: max_batch.max(1),
            commit_on,
            caller_groups: AtomicU64::new(0),
        };
        (desk, rung)
    }

    /// Groups applied on an awaiting task's thread so far.
    pub(crate) fn caller_groups(&self) -> u64 {
        self.caller_groups.load(Ordering::Acquire)
    }

    /// Queues a write: its ticket, or `None` once the store is closing.
    pub(crate) fn submit(self: &Arc<Desk>, write: Write) -> Option<Ticket> {
        let in_place = self.commit_on == CommitOn::Caller && write.in_place();
        let mut queue = lock(&self.queue);
        if queue.closed {
            return None;
        }
        queue.writes.push_back(write);
        Some(Ticket {
            desk: Some(Arc::clone(self)),
            in_place,
        })
    }

    /// Sees that what is queued gets committed: here, on this thread, when
    /// the write may be committed in place, this task may block in place,
    /// nobody holds the connection and no other write is queued; otherwise
    /// by whoever holds the connection, or by the writer thread.
    fn commit(&self, in_place: bool) {
        if !(in_place && may_block_in_place()) {
            return self.ring();
        }
        let queued = lock(&self.queue).writes.len();
        match queued {
            // Served already.
            0 => {}
            // Alone: commit it here, unless a holder is at work (it
            // serves the queue before it lets go).
            1 => {
                if let Some(core) = try_lock(&self.core) {
                    tokio::task::block_in_place(|| self.lead(core, Some(CALLER_GROUPS)));
                }
            }
            // Others are writing too: their group is the writer thread's.
            _ => self.ring(),
        }
    }

    /// Wakes the writer thread.
    pub(crate) fn ring(&self) {
        // Fails only once the thread is gone, with nothing left queued.
        let _ = self.bell.send(Bell::Work);
    }

    /// Stops taking writes; the writer thread serves what is queued, closes
    /// the connection and returns.
    pub(crate) fn close(&self) {
        lock(&self.queue).closed = true;
        let _ = self.bell.send(Bell::Close);
    }

    /// The writer thread: serves the queue when rung, until the store
    /// closes; then closes the connection.
    pub(crate) fn run(&self, rung: &mpsc::Receiver<Bell>) {
        loop {
            let mut closing = !matches!(rung.recv(), Ok(Bell::Work));
            // Rings that came meanwhile are served by this turn.
            while let Ok(bell) = rung.try_recv() {
                closing |= matches!(bell, Bell::Close);
            }
            if closing {
                // Nothing is queued after the close: everything left is
                // served under this one hold, and then the connection is
                // closed (the last close of a writable connection
                // checkpoints the WAL), before the store's drop returns.
                let mut core = lock(&self.core);
                self.serve(&mut core, None);
                core.conn.take();
                return;
            }
            self.lead(lock(&self.core), None);
        }
    }

    /// Applies queued writes a group at a time while any are queued, at
    /// most `groups` of them: `false` if it stopped with writes queued.
    fn serve(&self, core: &mut Core, groups: Option<usize>) -> bool {
        let mut served = 0usize;
        loop {
            let group: Vec<Write> = {
                let mut queue = lock(&self.queue);
                if queue.writes.is_empty() {
                    return true;
                }
                if groups.is_some_and(|groups| served >= groups) {
                    return false;
                }
                let take = queue.writes.len().min(self.max_batch);
                queue.writes.drain(..take).collect()
            };
            let Core { conn, cuts, writer } = core;
            match conn {
                Some(conn) => apply(conn, group, writer, cuts),
                None => group
                    .into_iter()
                    .for_each(|write| answer(write, Err(stopped()))),
            }
            served += 1;
            if groups.is_some() {
                self.caller_groups.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Serves the queue (at most `groups` groups, then the writer thread
    /// is rung for the rest) and looks at it again after letting the
    /// connection go: a write queued by a task that found the connection
    /// taken is served by this holder or by the next.
    fn lead<'d>(&'d self, mut core: MutexGuard<'d, Core>, groups: Option<usize>) {
        loop {
            let emptied = self.serve(&mut core, groups);
            drop(core);
            if !emptied {
                return self.ring();
            }
            if lock(&self.queue).writes.is_empty() {
                return;
            }
            core = match try_lock(&self.core) {
                Some(core) => core,
                // The new holder serves it.
                None => return,
            };
        }
    }
}

/// Whether this thread runs a task of a multi-thread tokio runtime, where
/// `block_in_place` hands the worker's other tasks to another thread (on a
/// current-thread runtime, or outside a runtime, it is not allowed).
fn may_block_in_place() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|runtime| runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// A queued write's claim on a commit, held by its future: awaited, the
/// future commits (or leaves it to the holder); dropped unawaited, it rings
/// the writer thread, so a write once queued is always applied.
pub(crate) struct Ticket {
    desk: Option<Arc<Desk>>,
    /// The caller may commit it ([`Write::in_place`]).
    in_place: bool,
}

impl Ticket {
    /// Sees the write committed (see [`Desk::commit`]).
    pub(crate) fn commit(mut self) {
        if let Some(desk) = self.desk.take() {
            desk.commit(self.in_place);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(desk) = self.desk.take() {
            desk.ring();
        }
    }
}

fn apply(conn: &mut Connection, group: Vec<Write>, writer: &Writer, cuts: &mut cuts::Cuts) {
    let (compact, counter) = (writer.compact, &writer.counter);
    // Payload bytes of this group, added to the counter only if it commits;
    // the cuts it leaves are kept only if it commits.
    let mut bytes = 0u64;
    let result = (|| {
        let tx = Group::begin(conn).map_err(db::storage)?;
        cuts.begin();
        let mut writing = cuts::Writing {
            bytes: 0,
            cuts: &mut *cuts,
        };
        let mut written = Vec::with_capacity(group.len());
        for write in &group {
            written.push(execute(tx.conn, write, compact, &mut writing)?);
        }
        let stored = writing.bytes;
        tx.commit().map_err(db::storage)?;
        bytes = stored;
        Ok::<_, StoreError>(written)
    })();
    if result.is_err() {
        cuts.clear();
    }
    match result {
        Ok(written) => {
            counter.fetch_add(bytes, Ordering::AcqRel);
            for (write, done) in group.iter().zip(&written) {
                for change in noticed(write, done) {
                    writer.notices.hub.notify(change);
                }
            }
            for (write, done) in group.into_iter().zip(written) {
                answer(write, Ok(done));
            }
        }
        Err(error) if group.len() == 1 => {
            tracing::warn!(%error, "sqlite store write failed");
            for write in group {
                answer(write, Err(error.clone()));
            }
        }
        Err(error) => {
            tracing::warn!(%error, size = group.len(), "sqlite group commit failed; retrying one by one");
            for write in group {
                apply(conn, vec![write], writer, cuts);
            }
        }
    }
}

/// The writer's group transaction. Its `BEGIN IMMEDIATE`, `COMMIT` and
/// `ROLLBACK` are statements the connection keeps prepared: rusqlite's
/// `Transaction` parses them anew for every group. Dropped uncommitted, it
/// rolls back.
struct Group<'c> {
    conn: &'c Connection,
}

impl<'c> Group<'c> {
    fn begin(conn: &'c Connection) -> rusqlite::Result<Group<'c>> {
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(Group { conn })
    }

    fn commit(self) -> rusqlite::Result<()> {
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        Ok(())
    }
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        // Still open after a failed write or a failed commit (SQLite may
        // have rolled a failed commit back already, and then stays out of
        // a transaction): a rollback's own failure leaves nothing to do.
        if !self.conn.is_autocommit() {
            let rollback = self
                .conn
                .prepare_cached("ROLLBACK")
                .and_then(|mut rollback| rollback.execute([]));
            if let Err(error) = rollback {
                tracing::warn!(%error, "sqlite store could not roll a failed group back");
            }
        }
    }
}

fn execute(
    conn: &Connection,
    write: &Write,
    compact: bool,
    bytes: &mut cuts::Writing<'_>,
) -> Result<Written, StoreError> {
    Ok(match write {
        Write::Acquire(request, _) => Written::Acquired(db::acquire(conn, request)?),
        Write::Create(create, _) => Written::Created(db::create_tree(conn, create, bytes)?),
        Write::Append(batch, _) => Written::Appended(
            batch
                .iter()
                .map(|append| {
                    let outcome = db::append(conn, append, bytes)?;
                    if append.release
                        && matches!(outcome, AppendOutcome::Committed | AppendOutcome::Duplicate)
                    {
                        db::release(conn, append.tree, append.token)?;
                    }
                    Ok(outcome)
                })
                .collect::<Result<_, StoreError>>()?,
        ),
        Write::Snapshot(tree, token, snapshot, _) => Written::Snapshot(db::write_snapshot(
            conn, *tree, *token, snapshot, compact, bytes,
        )?),
        Write::Renew(tree, token, until, _) => {
            Written::Renewed(db::renew(conn, *tree, *token, *until)?)
        }
        Write::Release(tree, token, _) => {
            db::release(conn, *tree, *token)?;
            Written::Released
        }
        Write::Prune(older_than, _) => {
            // Pruned trees' keys and chunk ids may be used again.
            bytes.cuts.clear();
            Written::Pruned(db::prune(conn, *older_than)?)
        }
        Write::Post(message, _) => Written::Posted(inbox::post(conn, message)?),
        Write::Settle(settle, _) => Written::Settled(inbox::settle(conn, settle)?),
    })
}

/// The notices a committed write gives this store's subscribers.
fn noticed(write: &Write, done: &Written) -> Vec<Change> {
    match (write, done) {
        (Write::Append(batch, _), Written::Appended(outcomes)) => batch
            .iter()
            .zip(outcomes)
            .filter(|(_, outcome)| **outcome == AppendOutcome::Committed)
            .map(|(append, _)| Change::Tree(append.tree))
            .collect(),
        (Write::Create(new, _), Written::Created(Created::Committed(_))) => {
            vec![Change::Tree(new.tree())]
        }
        (Write::Release(tree, ..), Written::Released) => vec![Change::Tree(*tree)],
        (Write::Post(message, _), Written::Posted(PostOutcome::Posted)) => {
            vec![Change::Inbox(message.tree)]
        }
        (Write::Settle(settle, _), Written::Settled(SettleOutcome::Settled)) => {
            vec![Change::Inbox(settle.tree)]
        }
        _ => Vec::new(),
    }
}

fn mismatch() -> StoreError {
    StoreError::unavailable("sqlite store: a write produced the wrong kind of result")
}

fn answer(write: Write, result: Result<Written, StoreError>) {
    // A caller that stopped waiting is not an error of the store.
    match write {
        Write::Acquire(_, reply) => {
            let _ = reply.send(result.and_then(|w| match w {
                Written::Acquired(value) => Ok(value),
                _ => Err(mismatch()),
            }));
        }
        Write::Create(_, reply) => {
            let _ = reply.send(result.and_then(|w| match w {
                Written::Created(value) => Ok(value),
                _ => Err(mismatch()),
            }));
        }
        Write::Append(_, reply) => {
            let _ = reply.send(result.and_then(|w| match w {
                Written::Appended(value) => Ok(value),
                _ => Err(mismatch()),
            }));
        }
        Write::Snapshot(_, _, _, reply) => {
            let _ = reply.send(result.and_then(|w| match w {
                Written::Snapshot(value) => Ok(value),
                _ => Err(mismatch()),
            }));
        }
        Write::Renew(_, _, _, reply) => {
            let _ = reply.send(result.and_then(|w| match w {
                Written::Renewed(value) => Ok(value),
                _ => Err(mismatch()),
            }));
        }
        Write::Release(_, _, reply) => {
            let _ = reply.send(result.and_then(|w| match w {
                Written::Released => Ok(()),
                _ => Err(mismatch()),
            }));
        }
        Write::Prune(_, reply) => {
            let _ = reply.send(result.and_then(|w| match w {
                Written::Pruned(value) => Ok(value),
                _ => Err(mismatch()),
            }));
        }
        Write::Post(_, reply) => {
            let _ = reply.send(result.and_then(|w| match w {
                Written::Posted(value) => Ok(value),
                _ => Err(mismatch()),
            }));
        }
        Write::Settle(_, reply) => {
            let _ = reply.send(result.and_then(|w| match w {
                Written::Settled(value) => Ok(value),
                _ => Err(mismatch()),
            }));
        }
    }
}
