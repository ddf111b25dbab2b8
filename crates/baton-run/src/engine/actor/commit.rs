//! A commit of the owner task: the staged records sealed and written, and
//! what the commit releases once it is durable.
//!
//! A commit is *sealed* and sent at once. Everything it releases (dispatch
//! launches, replies, events, what outcome handles read, inspections) is
//! prepared from the state it leaves and released only when the store says
//! it is durable: then it *lands*.
//!
//! A store that writes off the owner's task (SQLite's writer thread, a
//! database server) answers later: the commit is then *in flight* while the
//! task goes on with its next round, staging the next commit's records
//! against the in-memory fold. Those records are sealed only after the
//! commit in flight landed, so a tree has at most one commit in flight and
//! its log is written in order on every store. If the commit in flight
//! fails, the tree stops and what was staged behind it is dropped: nothing
//! of it was released, so this is what a crash during the write would have
//! left. Only what a round does to dispatches already in flight (cancelling
//! those of a process it cancels or ends) happens before the commit is
//! durable; a stop or a crash cancels them all the same.

use std::future::poll_fn;
use std::task::Poll;

use tokio::sync::oneshot;

use crate::clock::Timestamp;
use crate::digest::Digest;
use crate::log::{Record, RecordBody};
use crate::protocol::BoxFuture;
use crate::storage::{Append, AppendOutcome, StoreError, TreeStatus};

use super::super::error::{ControlError, RuntimeError};
use super::super::lifecycle::SnapshotPace;
use super::super::view::{TreeView, Visibility};
use super::live::News;
use super::{Actor, After};

/// Log bytes written since the last snapshot, per byte of that snapshot,
/// before the next one is due.
const SNAPSHOT_LOG_RATIO: u64 = 4;

/// Where an inspection waiting for a commit is answered.
type Inspect = oneshot::Sender<Result<TreeView, ControlError>>;

/// A snapshot write the store has not answered yet.
pub(super) type Snapshotting = BoxFuture<'static, Result<AppendOutcome, StoreError>>;

/// A commit the store has not answered yet.
pub(super) struct Flight {
    write: BoxFuture<'static, Result<Vec<AppendOutcome>, StoreError>>,
    landing: Landing,
}

/// What a commit does once durable.
struct Landing {
    /// The head it leaves.
    seq: u64,
    head: Digest,
    /// Its records' bodies (the buffer is kept for the next commit).
    bodies: Vec<RecordBody>,
    /// It gave up the lease.
    release: bool,
    now: Timestamp,
    news: News,
    after: Vec<After>,
    views: Vec<(Inspect, TreeView)>,
    /// The state it leaves, encoded, when a snapshot is due after it.
    snapshot: Option<std::sync::Arc<[u8]>>,
}

impl Actor {
    /// Commits the staged records and lands them.
    pub(super) async fn commit(&mut self) -> Result<(), RuntimeError> {
        match self.send().await? {
            Some(flight) => self.land_flight(flight).await,
            None => Ok(()),
        }
    }

    /// Waits for the commit in flight, if any, and lands it.
    pub(super) async fn land_flight(&mut self, flight: Flight) -> Result<(), RuntimeError> {
        let Flight { write, landing } = flight;
        let outcome = write.await;
        self.land(landing, outcome).await
    }

    /// Seals the staged records and sends them to the store. The commit
    /// lands before this returns when the store answers at once (or the
    /// tree is new); otherwise it is handed back in flight.
    pub(super) async fn send(&mut self) -> Result<Option<Flight>, RuntimeError> {
        if let Some(error) = self.owner.outcome.read().stopped.clone() {
            return Err(error);
        }
        let bodies = std::mem::take(&mut self.staged);
        let mut records = Vec::with_capacity(bodies.len());
        let (mut written, mut folded) = (0u64, 0u64);
        let (mut seq, mut prev) = (self.owner.head_seq, self.owner.head);
        for body in &bodies {
            seq += 1;
            let record = Record::seal(seq, prev, body);
            written += record.body.len() as u64;
            folded += record.body.len() as u64 + body.folded_state_bytes();
            prev = record.hash;
            records.push(record);
        }
        let first = self.owner.head_seq + 1;
        // A tree that goes on keeps its inputs' digests, not the inputs.
        if !self.state.done() {
            self.state.settle_inputs();
            if let Ok(mut input) = self.shared.input.lock() {
                input.settle();
            }
        }
        // One pass over the processes gives the listing status and what
        // hosts awaiting a condition read once the commit is published.
        let (status, reached) = self.state.summary(seq);
        let now = self.engine.clock.now();
        let meta = self.state.meta_with(now, status);
        let pace = &mut self.owner.snapshots;
        pace.records += bodies.len() as u64;
        pace.bytes += folded;
        // Snapshot after `snapshot_every` records, but never write more
        // snapshot bytes than a quarter of the log bytes since the last one:
        // a large tree then snapshots less often, its snapshots cost at most
        // a quarter of what its log costs, and a recovery folds a tail of at
        // most four times the snapshot's size. A step recorded as a change
        // counts as the whole state the fold builds from it, so a large
        // state's small changes do not put off the snapshot a recovery
        // would fold them onto.
        let snapshot_due = pace.records >= self.engine.snapshot_every
            && pace.bytes >= SNAPSHOT_LOG_RATIO * pace.last_size;
        // The commit that ends the tree gives up the lease with it, unless a
        // snapshot still has to be written under the lease.
        let release = self.state.done() && !snapshot_due;
        self.state.history_bytes += written;
        // Everything the commit releases is read off the state it leaves,
        // before the next round moves the fold on.
        let mut landing = Landing {
            seq,
            head: prev,
            news: self.news(first, &bodies, reached),
            bodies,
            release,
            now,
            after: std::mem::take(&mut self.after),
            views: self.views(seq, prev),
            snapshot: None,
        };
        // Encoded after the write is under way, before the next round.
        let snapshot =
            |actor: &Actor| snapshot_due.then(|| super::super::state::snapshot(&actor.state));
        let mut records = Some(records);
        if let Some(start) = self.unborn.take() {
            // A root that ended or waits after its first round is created
            // with all of it in one commit. One that keeps running (effects
            // or children in flight) is created with its start alone, and
            // its first round commits as any later one: nothing is
            // dispatched before the tree is durable either way, but the
            // start of a tree that acts is never cut together with its acts.
            let whole = matches!(status, TreeStatus::Done | TreeStatus::Waiting);
            let first = if whole {
                records.take().unwrap_or_default()
            } else {
                Vec::new()
            };
            self.create(start, first, meta.clone(), release && whole)
                .await?;
            self.emit(self.tree, super::EventKind::ProcessStarted { seq: 1 });
        }
        let Some(records) = records else {
            landing.snapshot = snapshot(self);
            self.land(landing, Ok(vec![AppendOutcome::Committed]))
                .await?;
            return Ok(None);
        };
        let append = Append {
            tree: self.tree,
            token: self.owner.token,
            records,
            meta,
            release,
        };
        let store = self.engine.store.clone();
        let mut write: BoxFuture<'static, _> =
            Box::pin(async move { store.append(vec![append]).await });
        // Poll once: a store that answers at once (in memory) lands here;
        // one that writes elsewhere has the write under way now.
        let first_poll = poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx))).await;
        landing.snapshot = snapshot(self);
        let outcome = match first_poll {
            Poll::Ready(outcome) => outcome,
            // The commit that gives up the lease is the tree's last: it
            // lands before anything else is asked of the lease (a renewal
            // behind it would find the lease gone).
            Poll::Pending if landing.release => write.await,
            Poll::Pending => return Ok(Some(Flight { write, landing })),
        };
        self.land(landing, outcome).await?;
        Ok(None)
    }

    /// The commit is durable (or failed): move the head, release what it
    /// holds, and write the snapshot it made due.
    async fn land(
        &mut self,
        landing: Landing,
        outcome: Result<Vec<AppendOutcome>, StoreError>,
    ) -> Result<(), RuntimeError> {
        self.check_outcome(
            outcome.map(|outcomes| outcomes.first().copied().unwrap_or(AppendOutcome::Fenced)),
        )?;
        self.settle_snapshot().await?;
        let Landing {
            seq,
            head,
            mut bodies,
            release,
            now,
            news,
            after,
            views,
            snapshot,
        } = landing;
        self.released = release;
        (self.last_commit, self.idle_told) = (now, false);
        self.owner.head_seq = seq;
        self.owner.head = head;
        self.deliver(news);
        // Keep the buffer: records are large, and growing a fresh one
        // for every commit reallocates and moves them several times.
        if self.staged.is_empty() {
            bodies.clear();
            self.staged = bodies;
        }
        self.release(views, after);
        if let Some(state) = snapshot {
            self.snapshot(state).await?;
        }
        Ok(())
    }

    /// Answers inspections with their views, and replies and launches
    /// what waited for a commit.
    pub(super) fn release(&mut self, views: Vec<(Inspect, TreeView)>, after: Vec<After>) {
        for (reply, view) in views {
            let _ = reply.send(Ok(view));
        }
        for action in after {
            match action {
                After::Reply(reply) => reply(),
                After::Dispatch(job) => self.launch(job),
            }
        }
    }

    /// What inspections waiting for this commit will see: the state it
    /// leaves, at its head.
    pub(super) fn views(&mut self, seq: u64, head: Digest) -> Vec<(Inspect, TreeView)> {
        std::mem::take(&mut self.inspects)
            .into_iter()
            .map(|reply| {
                let mut view = TreeView::of(&self.state, seq, head, Visibility::Public);
                self.shared.progress.overlay(&mut view);
                (reply, view)
            })
            .collect()
    }

    /// Starts writing a snapshot of the state at the head: it is written
    /// while the tree goes on, and settled before the next commit lands
    /// (or the tree ends, closes or sleeps), so a tree has at most one in
    /// flight. A snapshot may land after later appends: a store takes a
    /// snapshot of any point of its chain.
    async fn snapshot(&mut self, state: std::sync::Arc<[u8]>) -> Result<(), RuntimeError> {
        self.owner.snapshots = SnapshotPace {
            records: 0,
            bytes: 0,
            last_size: state.len() as u64,
        };
        let snapshot = crate::log::Snapshot {
            seq: self.owner.head_seq,
            head: self.owner.head,
            state,
        };
        let (store, tree, token) = (self.engine.store.clone(), self.tree, self.owner.token);
        let mut write: BoxFuture<'static, _> =
            Box::pin(async move { store.write_snapshot(tree, token, snapshot).await });
        match poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx))).await {
            Poll::Ready(outcome) => self.check_outcome(outcome),
            Poll::Pending => {
                self.snapshotting = Some(write);
                Ok(())
            }
        }
    }

    /// Waits for the snapshot in flight, if any.
    pub(super) async fn settle_snapshot(&mut self) -> Result<(), RuntimeError> {
        match self.snapshotting.take() {
            Some(write) => {
                let outcome = write.await;
                self.check_outcome(outcome)
            }
            None => Ok(()),
        }
    }

    /// Maps a store's answer to a write into the tree's fate: durable, or a
    /// runtime stop (fenced, head moved, storage failed).
    fn check_outcome(
        &self,
        outcome: Result<AppendOutcome, StoreError>,
    ) -> Result<(), RuntimeError> {
        let (tree, head_seq) = (self.tree, self.owner.head_seq);
        match outcome {
            Ok(AppendOutcome::Committed | AppendOutcome::Duplicate) => Ok(()),
            Ok(AppendOutcome::Fenced) => Err(RuntimeError::Fenced { tree, head_seq }),
            Ok(AppendOutcome::Conflict { head }) => Err(RuntimeError::Conflict {
                tree,
                expected: head_seq,
                found: head,
            }),
            Err(error) => Err(RuntimeError::Storage {
                tree,
                head_seq,
                error,
            }),
        }
    }
}
