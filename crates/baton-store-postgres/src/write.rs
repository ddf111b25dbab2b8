//! The writer: one task with one connection that group-commits every queued
//! write (acquires, appends of many trees, snapshots, renewals, releases) in
//! one transaction and answers each caller only after `COMMIT` returned.
//!
//! A group first locks the rows of every tree it touches, in tree-id order
//! (`SELECT … FOR UPDATE`), so writers in other processes serialize on each
//! tree and never deadlock on each other's groups; then applies each write
//! to an in-memory copy of those rows, inserting records, pieces and
//! snapshots as it goes; then writes the changed rows back in one statement
//! and sends one `NOTIFY baton_changes` per tree that was appended to or
//! released; then commits. If the group fails for a reason of its own
//! statements, each write is retried in a transaction of its own, so one bad
//! write cannot fail its neighbours. If the connection fails, every caller
//! of the group gets an `Unavailable` error and nothing is reported
//! committed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use baton_run::log::{Record, Snapshot};
use baton_run::store::{
    AcquireRequest, Acquired, Append, AppendOutcome, CUTS_PER_TREE, CreateTree, Created, LastCut,
    Lease, Piece, StoreError, TreeStatus, split_after,
};
use baton_run::{Digest, Timestamp, TreeId};
use deadpool_postgres::{GenericClient, Pool};
use tokio::sync::{mpsc, oneshot};

use crate::chunk::{self, CutTag, Cuts, DIGEST_LEN};
use crate::config::LeaseClock;
use crate::error::{self, connection_lost, must_retry, storage};
use crate::rows::{column, corrupt, digest, execute, int, query, query_opt, uint};
use crate::{CHANNEL, read};

pub(crate) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// A write, applied by the writer inside a group transaction.
pub(crate) enum Write {
    Acquire(AcquireRequest, Reply<Acquired>),
    Create(CreateTree, Reply<Created>),
    Append(Vec<Append>, Reply<Vec<AppendOutcome>>),
    Snapshot(TreeId, u64, Snapshot, Reply<AppendOutcome>),
    Renew(TreeId, u64, Timestamp, Reply<bool>),
    Release(TreeId, u64, Reply<()>),
    Prune(Timestamp, Reply<usize>),
}

/// What a write produced, sent only once its transaction committed.
// Short-lived and matched at once; boxing the granted load would only add
// an allocation to every acquisition.
#[allow(clippy::large_enum_variant)]
enum Written {
    Acquired(Acquired),
    /// A grant whose load is read once the group's writes are done (nothing
    /// later in the group can change a tree just granted: every other write
    /// to it holds an older token and is fenced).
    Granted(Lease, TreeId),
    Created(Created),
    Appended(Vec<AppendOutcome>),
    Snapshot(AppendOutcome),
    Renewed(bool),
    Released,
    Pruned(usize),
}

/// What the writer needs besides its connection.
pub(crate) struct Settings {
    pub(crate) compact: bool,
    pub(crate) max_batch: usize,
    pub(crate) clock: LeaseClock,
    /// Payload bytes committed so far (`PostgresStore::bytes_written`).
    pub(crate) written: Arc<AtomicU64>,
}

/// Why a group transaction failed.
enum Failure {
    /// Surely rolled back, and worth running again as it is (a
    /// serialization failure or deadlock).
    Retry(StoreError),
    /// The connection failed: whether the commit happened is unknown.
    Lost(StoreError),
    /// A statement or a stored row failed; the transaction rolled back.
    Statement(StoreError),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(error: tokio_postgres::Error) -> Failure {
        if must_retry(&error) {
            Failure::Retry(storage(error))
        } else if connection_lost(&error) {
            Failure::Lost(storage(error))
        } else {
            Failure::Statement(storage(error))
        }
    }
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Failure {
        Failure::Statement(error)
    }
}

/// How often a group that hit a serialization failure or deadlock runs
/// again before its callers get the error.
const RETRIES: usize = 8;

/// The writer task: drains the queue, applies each group in one
/// transaction, answers after the commit. Ends when the store is dropped.
pub(crate) async fn write_loop(
    pool: Pool,
    mut queue: mpsc::UnboundedReceiver<Write>,
    settings: Settings,
) {
    let mut cuts = chunk::cuts();
    while let Some(first) = queue.recv().await {
        let mut group = vec![first];
        while group.len() < settings.max_batch {
            match queue.try_recv() {
                Ok(next) => group.push(next),
                Err(_) => break,
            }
        }
        // A prune deletes whole trees: it runs in a transaction of its own,
        // in its place in the queue.
        let mut batch = Vec::new();
        for write in group {
            if matches!(write, Write::Prune(..)) {
                apply(&pool, std::mem::take(&mut batch), &settings, &mut cuts).await;
                apply(&pool, vec![write], &settings, &mut cuts).await;
            } else {
                batch.push(write);
            }
        }
        apply(&pool, batch, &settings, &mut cuts).await;
    }
}

/// The cuts a committed group leaves, to keep: by tree, what its bodies
/// were appended under and the cuts of its last long bodies (at most
/// [`CUTS_PER_TREE`], the most recent first).
type Kept = BTreeMap<TreeId, (CutTag, Vec<LastCut<[u8; DIGEST_LEN]>>)>;

/// Keeps the cuts of a group that committed, the oldest first, so the
/// memory's most recent is the group's.
fn keep(cuts: &mut Cuts, kept: Kept) {
    for (tree, (tag, group)) in kept {
        for cut in group.into_iter().rev() {
            cuts.keep(tree, tag, cut);
        }
    }
}

/// Before a transaction runs `writes`, whatever its outcome: forgets the
/// trees whose pieces it may delete (a snapshot's compaction, every tree
/// for a prune) or whose lease it gives up (their cuts can serve no later
/// append). A cut kept by an earlier transaction (an earlier part of a
/// queue split around a prune, or a write retried alone) thus never
/// outlives a compaction. Returns the cuts of the trees it snapshots: good
/// for cutting the snapshot's state (its compaction runs after the
/// snapshot is stored and keeps what the snapshot names), never kept.
fn forget_touched(cuts: &mut Cuts, writes: &[Write]) -> Kept {
    let mut taken = Kept::new();
    for write in writes {
        match write {
            Write::Snapshot(tree, ..) => {
                if let Some(cuts) = cuts.take(*tree) {
                    taken.insert(*tree, cuts);
                }
            }
            Write::Release(tree, ..) => cuts.forget(*tree),
            Write::Append(batch, _) => {
                for append in batch.iter().filter(|append| append.release) {
                    cuts.forget(append.tree);
                }
            }
            Write::Prune(..) => {
                cuts.clear();
                taken.clear();
            }
            Write::Acquire(..) | Write::Create(..) | Write::Renew(..) => {}
        }
    }
    taken
}

/// Applies a group, retrying it whole after a serialization failure and one
/// write at a time after a failure of its own statements.
async fn apply(pool: &Pool, group: Vec<Write>, settings: &Settings, cuts: &mut Cuts) {
    if group.is_empty() {
        return;
    }
    let taken = forget_touched(cuts, &group);
    let mut attempts = 0;
    let error = loop {
        match run_group(pool, &group, settings, (cuts, &taken)).await {
            Ok((written, bytes, kept)) => {
                settings.written.fetch_add(bytes, Ordering::AcqRel);
                keep(cuts, kept);
                for (write, done) in group.into_iter().zip(written) {
                    answer(write, Ok(done));
                }
                return;
            }
            Err(Failure::Retry(_)) if attempts < RETRIES => attempts += 1,
            Err(Failure::Statement(error)) if group.len() > 1 => {
                tracing::warn!(%error, size = group.len(), "postgres group commit failed; retrying one by one");
                for write in group {
                    alone(pool, write, settings, cuts).await;
                }
                return;
            }
            Err(Failure::Retry(error) | Failure::Lost(error) | Failure::Statement(error)) => {
                break error;
            }
        }
    };
    tracing::warn!(%error, size = group.len(), "postgres store write failed");
    for write in group {
        answer(write, Err(error.clone()));
    }
}

/// Applies one write in a transaction of its own.
async fn alone(pool: &Pool, write: Write, settings: &Settings, cuts: &mut Cuts) {
    let group = [write];
    let taken = forget_touched(cuts, &group);
    let mut attempts = 0;
    let result = loop {
        match run_group(pool, &group, settings, (cuts, &taken)).await {
            Err(Failure::Retry(_)) if attempts < RETRIES => attempts += 1,
            Ok((mut written, bytes, kept)) => {
                settings.written.fetch_add(bytes, Ordering::AcqRel);
                keep(cuts, kept);
                break written.pop().ok_or_else(mismatch);
            }
            Err(Failure::Retry(error) | Failure::Lost(error) | Failure::Statement(error)) => {
                break Err(error);
            }
        }
    };
    let [write] = group;
    answer(write, result);
}

/// Runs a group in one transaction, with the writer's cuts and those taken
/// for its snapshots; the results of its writes, the payload bytes it
/// stored and the cuts it leaves, once committed.
async fn run_group(
    pool: &Pool,
    group: &[Write],
    settings: &Settings,
    cuts: (&Cuts, &Kept),
) -> Result<(Vec<Written>, u64, Kept), Failure> {
    let mut client = pool
        .get()
        .await
        .map_err(|error| Failure::Lost(error::pool(error)))?;
    // Nothing has run if `BEGIN` fails: a connection found broken here
    // (the server restarted since it was pooled) is simply replaced.
    let tx = client.transaction().await.map_err(|error| {
        if connection_lost(&error) {
            Failure::Retry(storage(error))
        } else {
            Failure::from(error)
        }
    })?;
    let mut state = Group::lock(&tx, group, settings, cuts).await?;
    let mut written = Vec::with_capacity(group.len());
    for write in group {
        written.push(state.execute(&tx, write).await?);
    }
    state.insert_pending(&tx).await?;
    state.flush(&tx).await?;
    // The loads of the grants, asked for together: the client pipelines them.
    let loads = written.iter().map(|done| async {
        match done {
            Written::Granted(_, tree) => read::load(&tx, *tree, false).await.map(Some),
            _ => Ok(None),
        }
    });
    let loads = futures_util::future::try_join_all(loads).await?;
    for (done, load) in written.iter_mut().zip(loads) {
        if let (Written::Granted(lease, _), Some(load)) = (&*done, load) {
            *done = Written::Acquired(Acquired::Granted {
                lease: lease.clone(),
                load,
            });
        }
    }
    state.notify(&tx).await?;
    tx.commit().await?;
    Ok((written, state.bytes, state.kept))
}

/// A tree's row as the group sees it: read under its lock, changed in
/// memory by the group's writes, written back before the commit.
#[derive(Clone, Debug)]
struct TreeRow {
    key: i64,
    lease_token: Option<i64>,
    lease_owner: Option<String>,
    lease_until: Option<i64>,
    lease_ttl: Option<i64>,
    last_token: i64,
    head_seq: u64,
    head_hash: Digest,
    scope: Option<String>,
    status: Option<String>,
    updated: Option<i64>,
    /// The start facts an append of this group wrote (not read from the
    /// row: a write-back without them leaves the stored ones alone).
    start: Option<StartColumns>,
    /// Changed since it was read or last written back.
    dirty: bool,
}

/// The listing columns that are facts of a tree's start: the root's
/// program, the start time and the labels (a JSON object, NULL for none).
#[derive(Clone, Debug, Default)]
struct StartColumns {
    program_name: Option<String>,
    program_digest: Option<Vec<u8>>,
    created: Option<i64>,
    labels: Option<String>,
}

impl StartColumns {
    fn of(meta: &baton_run::store::TreeMeta) -> StartColumns {
        StartColumns {
            program_name: meta.program.as_ref().map(|p| p.name.as_str().to_owned()),
            program_digest: meta.program.as_ref().map(|p| p.digest.as_bytes().to_vec()),
            created: meta.created.map(|created| int(created.0)),
            labels: (!meta.labels.is_empty()).then(|| meta.labels.to_json()),
        }
    }
}

impl TreeRow {
    fn read(row: &tokio_postgres::Row) -> Result<TreeRow, StoreError> {
        Ok(TreeRow {
            key: column(row, 0)?,
            lease_token: column(row, 2)?,
            lease_owner: column(row, 3)?,
            lease_until: column(row, 4)?,
            lease_ttl: column(row, 5)?,
            last_token: column(row, 6)?,
            head_seq: uint(column(row, 7)?)?,
            head_hash: digest(&column::<Vec<u8>>(row, 8)?)?,
            scope: column(row, 9)?,
            status: column(row, 10)?,
            updated: column(row, 11)?,
            start: None,
            dirty: false,
        })
    }

    fn token_is(&self, token: u64) -> bool {
        self.lease_token == Some(int(token))
    }

    /// The holder and expiry of a lease still live at `now` (ms).
    fn live_lease(&self, now: i64) -> Result<Option<(String, Timestamp)>, StoreError> {
        match (self.lease_token, &self.lease_owner, self.lease_until) {
            (Some(_), Some(owner), Some(until)) if until > now => {
                Ok(Some((owner.clone(), Timestamp(uint(until)?))))
            }
            _ => Ok(None),
        }
    }

    /// Grants the lease to `owner` for `ttl` from `now` (ms) with a token
    /// drawn from the sequence (`minted`), strictly above every token this
    /// tree was granted even if the sequence was reset.
    fn grant(
        &mut self,
        minted: Option<i64>,
        owner: &str,
        now: i64,
        ttl: std::time::Duration,
    ) -> Result<Lease, StoreError> {
        let minted = minted.ok_or_else(|| corrupt("the token sequence returned too few tokens"))?;
        let token = minted.max(self.last_token.saturating_add(1));
        let ttl = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let until = now.saturating_add(ttl);
        self.last_token = token;
        self.lease_token = Some(token);
        self.lease_owner = Some(owner.to_owned());
        self.lease_until = Some(until);
        self.lease_ttl = Some(ttl);
        self.dirty = true;
        Ok(Lease {
            token: uint(token)?,
            owner: owner.to_owned(),
            until: Timestamp(uint(until)?),
        })
    }

    fn release(&mut self) {
        self.lease_token = None;
        self.lease_owner = None;
        self.lease_until = None;
        self.lease_ttl = None;
        self.dirty = true;
    }
}

/// The state of one group transaction.
struct Group<'a> {
    clock: LeaseClock,
    compact: bool,
    /// The locked rows; a row that does not read back fails only the
    /// writes that touch its tree.
    rows: BTreeMap<TreeId, Result<TreeRow, StoreError>>,
    /// The database's clock at the start of the transaction (`now()`), in
    /// ms since the epoch.
    now: i64,
    /// `NOTIFY` payloads, one per tree appended to or released.
    notices: BTreeSet<String>,
    /// Payload bytes stored.
    bytes: u64,
    /// Fencing tokens drawn from the sequence for the group's grants.
    tokens: Vec<i64>,
    /// Records and pieces of the group's appends, inserted together.
    pending: Pending<'a>,
    /// The trees' last cuts before the group, by the writer's memory.
    cuts: &'a Cuts,
    /// The cuts of the trees the group snapshots, taken from that memory:
    /// for the state of each tree's first snapshot in the group only (its
    /// compaction may delete what they name).
    taken: &'a Kept,
    /// The trees whose taken cuts a snapshot of this group has had.
    spent: BTreeSet<TreeId>,
    /// The last cuts of this group's long bodies, kept if it commits.
    kept: Kept,
}

/// The database's `now()` in milliseconds since the epoch.
const DB_NOW: &str = "(extract(epoch FROM now()) * 1000)::bigint";

impl<'a> Group<'a> {
    /// Creates the rows of trees being acquired and locks the rows of every
    /// tree the group touches, in tree-id order.
    async fn lock(
        tx: &impl GenericClient,
        group: &'a [Write],
        settings: &Settings,
        (cuts, taken): (&'a Cuts, &'a Kept),
    ) -> Result<Group<'a>, Failure> {
        let mut touched = BTreeSet::new();
        let mut acquired = BTreeSet::new();
        for write in group {
            match write {
                Write::Acquire(request, _) => {
                    touched.insert(request.tree.to_string());
                    acquired.insert(request.tree.to_string());
                }
                Write::Create(create, _) => {
                    touched.insert(create.tree.to_string());
                    acquired.insert(create.tree.to_string());
                }
                Write::Append(batch, _) => {
                    touched.extend(batch.iter().map(|append| append.tree.to_string()));
                }
                Write::Snapshot(tree, ..) | Write::Renew(tree, ..) | Write::Release(tree, ..) => {
                    touched.insert(tree.to_string());
                }
                Write::Prune(..) => {}
            }
        }
        if !acquired.is_empty() {
            let ids: Vec<&String> = acquired.iter().collect();
            let zero = &Digest::ZERO.as_bytes()[..];
            execute(
                tx,
                "INSERT INTO baton_trees (id, last_token, head_seq, head_hash)
                 SELECT id, 0, 0, $2 FROM unnest($1::text[]) AS t(id) ORDER BY id
                 ON CONFLICT (id) DO NOTHING",
                &[&ids, &zero],
            )
            .await?;
        }
        let ids: Vec<&String> = touched.iter().collect();
        let sql = format!(
            "SELECT key, id, lease_token, lease_owner, lease_until, lease_ttl, last_token,
                    head_seq, head_hash, scope, status, updated, {DB_NOW}
             FROM baton_trees WHERE id = ANY($1) ORDER BY id FOR UPDATE"
        );
        let locked = if ids.is_empty() {
            Vec::new()
        } else {
            query(tx, &sql, &[&ids]).await?
        };
        let now = match locked.first() {
            Some(row) => column(row, 12)?,
            None => query_opt(tx, &format!("SELECT {DB_NOW}"), &[])
                .await?
                .map(|row| column(&row, 0))
                .transpose()?
                .unwrap_or(0),
        };
        let grants = group
            .iter()
            .filter(|write| matches!(write, Write::Acquire(..) | Write::Create(..)))
            .count() as i64;
        let tokens = if grants == 0 {
            Vec::new()
        } else {
            query(
                tx,
                "SELECT nextval('baton_tokens') FROM generate_series(1, $1::bigint)",
                &[&grants],
            )
            .await?
            .iter()
            .map(|row| column(row, 0))
            .collect::<Result<Vec<i64>, _>>()?
        };
        // Handed out from the end: the smallest first, in the group's order.
        let mut tokens = tokens;
        tokens.sort_unstable_by(|a, b| b.cmp(a));
        let mut rows = BTreeMap::new();
        for row in &locked {
            let id: String = column(row, 1)?;
            // A row whose id does not parse is no tree any write names.
            if let Ok(tree) = id.parse::<TreeId>() {
                rows.insert(tree, TreeRow::read(row));
            }
        }
        Ok(Group {
            clock: settings.clock,
            compact: settings.compact,
            rows,
            now,
            notices: BTreeSet::new(),
            bytes: 0,
            tokens,
            pending: Pending::default(),
            cuts,
            taken,
            spent: BTreeSet::new(),
            kept: Kept::new(),
        })
    }

    /// Keeps the records of an append or a creation of `tree` under `token`
    /// to insert, cutting each long body after the tree's last cut under
    /// that token. The cut is kept for the tree's next append only if the
    /// lease goes on (`holds`).
    fn records(&mut self, tree: TreeId, key: i64, token: u64, holds: bool, records: &'a [Record]) {
        let tag = CutTag { token, row: key };
        // This group's cuts of the tree, then the ones committed before it,
        // the most recent first; another token's cuts serve nothing.
        let (group, committed): (&[LastCut<_>], &[LastCut<_>]) = match self.kept.get(&tree) {
            Some((kept, group)) if *kept == tag => (group, self.cuts.get(tree, tag)),
            Some(_) => (&[], &[]),
            None => (&[], self.cuts.get(tree, tag)),
        };
        let recent: Vec<&LastCut<_>> = group.iter().chain(committed).collect();
        let mut cuts = self.pending.records(key, records, &recent);
        if !holds {
            self.kept.remove(&tree);
            return;
        }
        match self.kept.remove(&tree) {
            Some((kept, group)) if kept == tag => cuts.extend(group),
            _ => {}
        }
        cuts.truncate(CUTS_PER_TREE);
        if cuts.is_empty() {
            return;
        }
        self.kept.insert(tree, (tag, cuts));
    }

    /// The row of `tree`, if the tree exists.
    fn row(&mut self, tree: TreeId) -> Result<Option<&mut TreeRow>, StoreError> {
        match self.rows.get_mut(&tree) {
            None => Ok(None),
            Some(Ok(row)) => Ok(Some(row)),
            Some(Err(error)) => Err(error.clone()),
        }
    }

    async fn execute(
        &mut self,
        tx: &impl GenericClient,
        write: &'a Write,
    ) -> Result<Written, Failure> {
        Ok(match write {
            Write::Acquire(request, _) => self.acquire(request)?,
            Write::Create(create, _) => Written::Created(self.create(create)?),
            Write::Append(batch, _) => {
                let mut outcomes = Vec::with_capacity(batch.len());
                for append in batch {
                    let outcome = self.append(tx, append).await?;
                    if append.release
                        && matches!(outcome, AppendOutcome::Committed | AppendOutcome::Duplicate)
                    {
                        self.release(append.tree, append.token)?;
                    }
                    outcomes.push(outcome);
                }
                Written::Appended(outcomes)
            }
            Write::Snapshot(tree, token, snapshot, _) => {
                Written::Snapshot(self.snapshot(tx, *tree, *token, snapshot).await?)
            }
            Write::Renew(tree, token, until, _) => {
                Written::Renewed(self.renew(*tree, *token, *until)?)
            }
            Write::Release(tree, token, _) => {
                self.release(*tree, *token)?;
                Written::Released
            }
            Write::Prune(older_than, _) => Written::Pruned(prune(tx, *older_than).await?),
        })
    }

    /// Grants the writer lease of a tree or reports the live lease of
    /// someone else; a grant's load is read at the end of the group.
    fn acquire(&mut self, request: &AcquireRequest) -> Result<Written, Failure> {
        let now = match self.clock {
            LeaseClock::Database => self.now,
            LeaseClock::Requests => int(request.now.0),
        };
        let minted = self.tokens.pop();
        let row = self
            .row(request.tree)?
            .ok_or_else(|| StoreError::unavailable("a tree row vanished while locked"))?;
        if !request.force
            && let Some((owner, until)) = row.live_lease(now)?
        {
            return Ok(Written::Acquired(Acquired::LeaseHeld { owner, until }));
        }
        let lease = row.grant(minted, &request.owner, now, request.ttl)?;
        Ok(Written::Granted(lease, request.tree))
    }

    /// A new tree's first commit: the grant, the records and the metadata,
    /// and the lease kept or given up again, in this group's transaction.
    fn create(&mut self, create: &'a CreateTree) -> Result<Created, Failure> {
        create.check()?;
        let now = match self.clock {
            LeaseClock::Database => self.now,
            LeaseClock::Requests => int(create.now.0),
        };
        let minted = self.tokens.pop();
        let row = self
            .row(create.tree)?
            .ok_or_else(|| StoreError::unavailable("a tree row vanished while locked"))?;
        // A snapshot or a compaction never lowers the head.
        if row.head_seq > 0 {
            return Ok(Created::Exists);
        }
        if let Some((owner, until)) = row.live_lease(now)? {
            return Ok(Created::LeaseHeld { owner, until });
        }
        let lease = row.grant(minted, &create.owner, now, create.ttl)?;
        if !create.hold {
            row.release();
        }
        if let Some(last) = create.records.last() {
            row.head_seq = last.seq;
            row.head_hash = last.hash;
        }
        let meta = &create.meta;
        row.scope = Some(meta.scope.as_str().to_owned());
        row.status = Some(meta.status.as_str().to_owned());
        row.updated = Some(int(meta.updated.0));
        row.start = Some(StartColumns::of(meta));
        row.dirty = true;
        let key = row.key;
        self.records(create.tree, key, lease.token, create.hold, &create.records);
        self.notices
            .insert(notice(create.tree, Some(meta.scope.as_str())));
        Ok(Created::Committed(lease))
    }

    /// One append: compare-and-swap on the expected head and the fencing
    /// token.
    async fn append(
        &mut self,
        tx: &impl GenericClient,
        append: &'a Append,
    ) -> Result<AppendOutcome, Failure> {
        let Some(row) = self.row(append.tree)? else {
            return Ok(AppendOutcome::Fenced);
        };
        if !row.token_is(append.token) {
            return Ok(AppendOutcome::Fenced);
        }
        let (key, head, head_hash) = (row.key, row.head_seq, row.head_hash);
        let new_head = match (append.records.first(), append.records.last()) {
            (Some(first), Some(last)) => {
                let Some(expected) = first.seq.checked_sub(1) else {
                    return Ok(AppendOutcome::Conflict { head });
                };
                if expected < head {
                    // An identical retry of an acknowledged append is a
                    // duplicate; anything else at a committed sequence
                    // conflicts.
                    self.insert_pending(tx).await?;
                    return Ok(if duplicate(tx, key, append).await? {
                        AppendOutcome::Duplicate
                    } else {
                        AppendOutcome::Conflict { head }
                    });
                }
                if expected > head || first.prev != head_hash {
                    return Ok(AppendOutcome::Conflict { head });
                }
                let holds = !append.release;
                self.records(append.tree, key, append.token, holds, &append.records);
                Some((last.seq, last.hash))
            }
            _ => None,
        };
        let row = self
            .row(append.tree)?
            .ok_or_else(|| StoreError::unavailable("a tree row vanished while locked"))?;
        if let Some((seq, hash)) = new_head {
            row.head_seq = seq;
            row.head_hash = hash;
        }
        row.scope = Some(append.meta.scope.as_str().to_owned());
        row.status = Some(append.meta.status.as_str().to_owned());
        row.updated = Some(int(append.meta.updated.0));
        row.start = Some(StartColumns::of(&append.meta));
        row.dirty = true;
        self.notices
            .insert(notice(append.tree, Some(append.meta.scope.as_str())));
        Ok(AppendOutcome::Committed)
    }

    /// Inserts the records and pieces the group's appends left pending, in
    /// one statement each.
    async fn insert_pending(&mut self, tx: &impl GenericClient) -> Result<(), Failure> {
        let pending = std::mem::take(&mut self.pending);
        self.bytes += pending.insert(tx).await?;
        Ok(())
    }

    /// Stores a snapshot and, when compacting, deletes the records it
    /// covers and the pieces nothing references any more.
    async fn snapshot(
        &mut self,
        tx: &impl GenericClient,
        tree: TreeId,
        token: u64,
        snapshot: &Snapshot,
    ) -> Result<AppendOutcome, Failure> {
        let Some(row) = self.row(tree)? else {
            return Ok(AppendOutcome::Fenced);
        };
        if !row.token_is(token) {
            return Ok(AppendOutcome::Fenced);
        }
        let (key, head, head_hash) = (row.key, row.head_seq, row.head_hash);
        // The cuts its state may reuse: this group's of the tree, then the
        // ones taken from the writer's memory before this transaction began
        // (for the tree's first snapshot in the group only: a second one
        // comes after the first's compaction, which may have deleted what
        // they name). Their pieces are stored until its compaction, which
        // keeps what the snapshot names; after it, only the snapshot's own
        // cut is kept.
        let tag = CutTag { token, row: key };
        let group = match self.kept.remove(&tree) {
            Some((kept, cuts)) if kept == tag => cuts,
            _ => Vec::new(),
        };
        let taken: &[LastCut<_>] = match self.taken.get(&tree) {
            Some((kept, cuts)) if *kept == tag && self.spent.insert(tree) => cuts,
            _ => &[],
        };
        let recent: Vec<&LastCut<_>> = group.iter().chain(taken).collect();
        // It reads and deletes records: those of this group go in first.
        self.insert_pending(tx).await?;
        let previous = query_opt(
            tx,
            "SELECT seq, head FROM baton_snapshots WHERE tree = $1",
            &[&key],
        )
        .await?;
        let previous = match previous {
            Some(row) => Some((
                uint(column(&row, 0)?)?,
                digest(&column::<Vec<u8>>(&row, 1)?)?,
            )),
            None => None,
        };
        // The hash of the record the snapshot covers, wherever it is still
        // known.
        let covered = if snapshot.seq == head {
            Some(head_hash)
        } else if let Some((_, hash)) = previous.filter(|(seq, _)| *seq == snapshot.seq) {
            Some(hash)
        } else {
            stored_hash(tx, key, snapshot.seq).await?
        };
        // The snapshot must name a point of this chain: not past the head,
        // not behind the current snapshot, and matching the record it
        // covers.
        let behind = previous.is_some_and(|(seq, _)| snapshot.seq < seq);
        if snapshot.seq > head || behind || covered != Some(snapshot.head) {
            return Ok(AppendOutcome::Conflict { head });
        }
        let mut pieces = Pieces::default();
        let (body, manifest, cut) = pieces.encode(&snapshot.state, &recent);
        self.bytes += pieces.store(tx, key).await?;
        let state_digest = chunk::state_digest(&snapshot.state);
        execute(
            tx,
            "INSERT INTO baton_snapshots (tree, seq, head, digest, body, chunks)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (tree) DO UPDATE SET seq = excluded.seq, head = excluded.head,
                 digest = excluded.digest, body = excluded.body, chunks = excluded.chunks",
            &[
                &key,
                &int(snapshot.seq),
                &&snapshot.head.as_bytes()[..],
                &&state_digest[..],
                &body,
                &manifest,
            ],
        )
        .await?;
        if self.compact {
            execute(
                tx,
                "DELETE FROM baton_records WHERE tree = $1 AND seq <= $2",
                &[&key, &int(snapshot.seq)],
            )
            .await?;
            // The pieces of this tree that no kept record and not the
            // snapshot references.
            execute(
                tx,
                "DELETE FROM baton_chunks c WHERE c.tree = $1 AND c.digest NOT IN (
                     SELECT substring(m.chunks FROM g * 32 + 1 FOR 32)
                     FROM (SELECT chunks FROM baton_records WHERE tree = $1 AND chunks IS NOT NULL
                           UNION ALL
                           SELECT chunks FROM baton_snapshots WHERE tree = $1 AND chunks IS NOT NULL) m,
                          generate_series(0, length(m.chunks) / 32 - 1) g)",
                &[&key],
            )
            .await?;
        }
        if let Some(cut) = cut {
            self.kept.insert(tree, (tag, vec![cut]));
        }
        Ok(AppendOutcome::Committed)
    }

    /// Extends a lease; `false` if the token is no longer current.
    fn renew(&mut self, tree: TreeId, token: u64, until: Timestamp) -> Result<bool, StoreError> {
        let (clock, now) = (self.clock, self.now);
        let Some(row) = self.row(tree)? else {
            return Ok(false);
        };
        if !row.token_is(token) {
            return Ok(false);
        }
        row.lease_until = Some(match clock {
            // A renewal counts the grant's time-to-live from the database's
            // clock, whatever the engine's clock says.
            LeaseClock::Database => {
                let ttl = row.lease_ttl.ok_or_else(|| {
                    corrupt(format!("tree {tree}: a lease without its time-to-live"))
                })?;
                now.saturating_add(ttl)
            }
            LeaseClock::Requests => int(until.0),
        });
        row.dirty = true;
        Ok(true)
    }

    /// Gives up a lease (no-op if the token is not current).
    fn release(&mut self, tree: TreeId, token: u64) -> Result<(), StoreError> {
        let Some(row) = self.row(tree)? else {
            return Ok(());
        };
        if row.token_is(token) {
            row.release();
            let scope = row.scope.clone();
            self.notices.insert(notice(tree, scope.as_deref()));
        }
        Ok(())
    }

    /// Writes every changed row back, in one statement.
    async fn flush(&mut self, tx: &impl GenericClient) -> Result<(), Failure> {
        let dirty: Vec<&mut TreeRow> = self
            .rows
            .values_mut()
            .filter_map(|row| row.as_mut().ok())
            .filter(|row| row.dirty)
            .collect();
        if dirty.is_empty() {
            return Ok(());
        }
        let mut columns = RowColumns::default();
        for row in dirty {
            columns.push(row);
            row.dirty = false;
        }
        let RowColumns {
            keys,
            scopes,
            statuses,
            updated,
            tokens,
            owners,
            untils,
            ttls,
            last_tokens,
            head_seqs,
            head_hashes,
            starts,
            program_names,
            program_digests,
            created,
            labels,
        } = &columns;
        execute(
            tx,
            "UPDATE baton_trees AS t SET scope = u.scope, status = u.status, updated = u.updated,
                 lease_token = u.lease_token, lease_owner = u.lease_owner,
                 lease_until = u.lease_until, lease_ttl = u.lease_ttl, last_token = u.last_token,
                 head_seq = u.head_seq, head_hash = u.head_hash,
                 program_name = CASE WHEN u.start THEN u.program_name ELSE t.program_name END,
                 program_digest = CASE WHEN u.start THEN u.program_digest ELSE t.program_digest END,
                 created = CASE WHEN u.start THEN u.created ELSE t.created END,
                 labels = CASE WHEN u.start THEN u.labels::jsonb ELSE t.labels END
             FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::bigint[],
                         $6::text[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[],
                         $11::bytea[], $12::bool[], $13::text[], $14::bytea[], $15::bigint[],
                         $16::text[])
                  AS u(key, scope, status, updated, lease_token, lease_owner, lease_until,
                       lease_ttl, last_token, head_seq, head_hash, start, program_name,
                       program_digest, created, labels)
             WHERE t.key = u.key",
            &[
                keys,
                scopes,
                statuses,
                updated,
                tokens,
                owners,
                untils,
                ttls,
                last_tokens,
                head_seqs,
                head_hashes,
                starts,
                program_names,
                program_digests,
                created,
                labels,
            ],
        )
        .await?;
        Ok(())
    }

    /// Queues the group's change notices; the server sends them when (and
    /// only if) the transaction commits.
    async fn notify(&self, tx: &impl GenericClient) -> Result<(), Failure> {
        if self.notices.is_empty() {
            return Ok(());
        }
        let payloads: Vec<&String> = self.notices.iter().collect();
        query(
            tx,
            &format!("SELECT pg_notify('{CHANNEL}', n) FROM unnest($1::text[]) AS n"),
            &[&payloads],
        )
        .await?;
        Ok(())
    }
}

/// The columns of the rows a flush writes back, one array each.
#[derive(Default)]
struct RowColumns {
    keys: Vec<i64>,
    scopes: Vec<Option<String>>,
    statuses: Vec<Option<String>>,
    updated: Vec<Option<i64>>,
    tokens: Vec<Option<i64>>,
    owners: Vec<Option<String>>,
    untils: Vec<Option<i64>>,
    ttls: Vec<Option<i64>>,
    last_tokens: Vec<i64>,
    head_seqs: Vec<i64>,
    head_hashes: Vec<Vec<u8>>,
    /// Whether the row's start columns below are to be written.
    starts: Vec<bool>,
    program_names: Vec<Option<String>>,
    program_digests: Vec<Option<Vec<u8>>>,
    created: Vec<Option<i64>>,
    labels: Vec<Option<String>>,
}

impl RowColumns {
    fn push(&mut self, row: &mut TreeRow) {
        self.keys.push(row.key);
        self.scopes.push(row.scope.clone());
        self.statuses.push(row.status.clone());
        self.updated.push(row.updated);
        self.tokens.push(row.lease_token);
        self.owners.push(row.lease_owner.clone());
        self.untils.push(row.lease_until);
        self.ttls.push(row.lease_ttl);
        self.last_tokens.push(row.last_token);
        self.head_seqs.push(int(row.head_seq));
        self.head_hashes.push(row.head_hash.as_bytes().to_vec());
        let start = row.start.take();
        self.starts.push(start.is_some());
        let start = start.unwrap_or_default();
        self.program_names.push(start.program_name);
        self.program_digests.push(start.program_digest);
        self.created.push(start.created);
        self.labels.push(start.labels);
    }
}

/// The records of a group's appends and the pieces of their large bodies
/// (each once per tree), as columns to insert in one statement each.
#[derive(Default)]
struct Pending<'a> {
    pieces: BTreeMap<(i64, [u8; DIGEST_LEN]), &'a [u8]>,
    trees: Vec<i64>,
    seqs: Vec<i64>,
    kinds: Vec<&'static str>,
    prevs: Vec<&'a [u8]>,
    hashes: Vec<&'a [u8]>,
    bodies: Vec<Option<&'a [u8]>>,
    manifests: Vec<Option<Vec<u8>>>,
    /// Bytes of inline bodies and manifests.
    bytes: u64,
}

impl<'a> Pending<'a> {
    /// Keeps `records` (of tree `key`) to insert, each long body cut after
    /// the long bodies before it in `records` and the tree's `recent` cuts
    /// (the most recent first): the pieces a cut shares with those are
    /// stored already and are neither digested nor sent again. Returns the
    /// cuts of the long bodies, the last first.
    fn records(
        &mut self,
        key: i64,
        records: &'a [Record],
        recent: &[&LastCut<[u8; DIGEST_LEN]>],
    ) -> Vec<LastCut<[u8; DIGEST_LEN]>> {
        let mut cuts: Vec<LastCut<[u8; DIGEST_LEN]>> = Vec::new();
        for record in records {
            let (body, manifest) = if record.body.len() <= chunk::INLINE_MAX {
                self.bytes += record.body.len() as u64;
                (Some(&record.body[..]), None)
            } else {
                let after: Vec<&LastCut<_>> =
                    cuts.iter().rev().chain(recent.iter().copied()).collect();
                let digests = digests(split_after(&record.body, &after), |digest, bytes| {
                    self.pieces.insert((key, digest), bytes);
                });
                let manifest = chunk::manifest(digests.iter().map(|(_, digest)| digest));
                cuts.extend(LastCut::new(Arc::clone(&record.body), digests));
                if cuts.len() > CUTS_PER_TREE {
                    cuts.remove(0);
                }
                self.bytes += manifest.len() as u64;
                (None, Some(manifest))
            };
            self.trees.push(key);
            self.seqs.push(int(record.seq));
            self.kinds.push(record.kind.as_str());
            self.prevs.push(&record.prev.as_bytes()[..]);
            self.hashes.push(&record.hash.as_bytes()[..]);
            self.bodies.push(body);
            self.manifests.push(manifest);
        }
        cuts.reverse();
        cuts
    }

    /// Inserts the pieces the trees do not have yet, then the records; the
    /// payload bytes stored (inline bodies, manifests and new pieces).
    async fn insert(self, tx: &impl GenericClient) -> Result<u64, Failure> {
        let mut stored = self.bytes;
        if !self.pieces.is_empty() {
            let trees: Vec<i64> = self.pieces.keys().map(|(key, _)| *key).collect();
            let digests: Vec<&[u8]> = self.pieces.keys().map(|(_, digest)| &digest[..]).collect();
            let bytes: Vec<&[u8]> = self.pieces.values().copied().collect();
            let inserted = query(
                tx,
                "INSERT INTO baton_chunks (tree, digest, bytes)
                 SELECT * FROM unnest($1::bigint[], $2::bytea[], $3::bytea[])
                 ON CONFLICT (tree, digest) DO NOTHING
                 RETURNING length(bytes)::bigint",
                &[&trees, &digests, &bytes],
            )
            .await?;
            for row in &inserted {
                stored += uint(column(row, 0)?)?;
            }
        }
        if !self.trees.is_empty() {
            execute(
                tx,
                "INSERT INTO baton_records (tree, seq, kind, prev, hash, body, chunks)
                 SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bytea[],
                                      $5::bytea[], $6::bytea[], $7::bytea[])",
                &[
                    &self.trees,
                    &self.seqs,
                    &self.kinds,
                    &self.prevs,
                    &self.hashes,
                    &self.bodies,
                    &self.manifests,
                ],
            )
            .await?;
        }
        Ok(stored)
    }
}

/// Each piece's length and digest, in order: a known piece's as its cut
/// stored it, a repeat's as its body's earlier piece, a fresh one's
/// computed and handed to `fresh` with its bytes (to be stored).
fn digests<'a>(
    pieces: Vec<Piece<'a, [u8; DIGEST_LEN]>>,
    mut fresh: impl FnMut([u8; DIGEST_LEN], &'a [u8]),
) -> Vec<(usize, [u8; DIGEST_LEN])> {
    let mut digests: Vec<(usize, [u8; DIGEST_LEN])> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        let digest = match piece {
            Piece::Known(_, digest) => digest,
            Piece::Again(_, index) => digests[index].1,
            Piece::Fresh(bytes) => {
                let digest = chunk::digest(bytes);
                fresh(digest, bytes);
                digest
            }
        };
        digests.push((piece.bytes().len(), digest));
    }
    digests
}

/// A body stored inline, or its manifest of pieces and its cut.
type Encoded<'a> = (
    Option<&'a [u8]>,
    Option<Vec<u8>>,
    Option<LastCut<[u8; DIGEST_LEN]>>,
);

/// The pieces of the bodies of one write, each once.
#[derive(Default)]
struct Pieces<'a> {
    pieces: BTreeMap<[u8; DIGEST_LEN], &'a [u8]>,
    /// Bytes of inline bodies and manifests.
    bytes: u64,
}

impl<'a> Pieces<'a> {
    /// How `bytes` is stored: inline, or as a manifest of pieces, the
    /// pieces `recent` cuts already hold taken as they are and the others
    /// kept to be stored with [`Pieces::store`]; with the new cut.
    fn encode(
        &mut self,
        bytes: &'a Arc<[u8]>,
        recent: &[&LastCut<[u8; DIGEST_LEN]>],
    ) -> Encoded<'a> {
        if bytes.len() <= chunk::INLINE_MAX {
            self.bytes += bytes.len() as u64;
            return (Some(bytes), None, None);
        }
        let digests = digests(split_after(bytes, recent), |digest, piece| {
            self.pieces.insert(digest, piece);
        });
        let manifest = chunk::manifest(digests.iter().map(|(_, digest)| digest));
        self.bytes += manifest.len() as u64;
        let cut = LastCut::new(Arc::clone(bytes), digests);
        (None, Some(manifest), cut)
    }

    /// Inserts the pieces tree `key` does not have yet; the payload bytes
    /// stored (inline bodies, manifests and the new pieces).
    async fn store(&self, tx: &impl GenericClient, key: i64) -> Result<u64, Failure> {
        if self.pieces.is_empty() {
            return Ok(self.bytes);
        }
        let digests: Vec<&[u8]> = self.pieces.keys().map(|digest| &digest[..]).collect();
        let bytes: Vec<&[u8]> = self.pieces.values().copied().collect();
        let inserted = query(
            tx,
            "INSERT INTO baton_chunks (tree, digest, bytes)
             SELECT $1, d, b FROM unnest($2::bytea[], $3::bytea[]) AS p(d, b)
             ON CONFLICT (tree, digest) DO NOTHING
             RETURNING length(bytes)::bigint",
            &[&key, &digests, &bytes],
        )
        .await?;
        let mut stored = self.bytes;
        for row in &inserted {
            stored += uint(column(row, 0)?)?;
        }
        Ok(stored)
    }
}

/// Whether every record of `append` is exactly the committed one at its
/// sequence.
async fn duplicate(tx: &impl GenericClient, key: i64, append: &Append) -> Result<bool, Failure> {
    let seqs: Vec<i64> = append
        .records
        .iter()
        .map(|record| int(record.seq))
        .collect();
    let rows = query(
        tx,
        "SELECT seq, hash FROM baton_records WHERE tree = $1 AND seq = ANY($2)",
        &[&key, &seqs],
    )
    .await?;
    let mut stored = BTreeMap::new();
    for row in &rows {
        stored.insert(column::<i64>(row, 0)?, column::<Vec<u8>>(row, 1)?);
    }
    Ok(append.records.iter().all(|record| {
        stored
            .get(&int(record.seq))
            .is_some_and(|hash| hash[..] == record.hash.as_bytes()[..])
    }))
}

async fn stored_hash(
    tx: &impl GenericClient,
    key: i64,
    seq: u64,
) -> Result<Option<Digest>, Failure> {
    let row = query_opt(
        tx,
        "SELECT hash FROM baton_records WHERE tree = $1 AND seq = $2",
        &[&key, &int(seq)],
    )
    .await?;
    Ok(match row {
        Some(row) => Some(digest(&column::<Vec<u8>>(&row, 0)?)?),
        None => None,
    })
}

/// Deletes `done` trees last updated before `older_than` (engine clock),
/// with their records, snapshots and pieces. Returns how many trees were
/// removed.
async fn prune(tx: &impl GenericClient, older_than: Timestamp) -> Result<usize, Failure> {
    let keys: Vec<i64> = query(
        tx,
        "DELETE FROM baton_trees WHERE status = $1 AND updated < $2 RETURNING key",
        &[&TreeStatus::Done.as_str(), &int(older_than.0)],
    )
    .await?
    .iter()
    .map(|row| column(row, 0))
    .collect::<Result<_, _>>()?;
    if keys.is_empty() {
        return Ok(0);
    }
    for sql in [
        "DELETE FROM baton_records WHERE tree = ANY($1)",
        "DELETE FROM baton_snapshots WHERE tree = ANY($1)",
        "DELETE FROM baton_chunks WHERE tree = ANY($1)",
        "DELETE FROM baton_inbox WHERE tree = ANY($1)",
    ] {
        execute(tx, sql, &[&keys]).await?;
    }
    Ok(keys.len())
}

/// The `NOTIFY` payload of a change to `tree`: its id, then its scope when
/// it has one, separated by a space (neither contains one).
pub(crate) fn notice(tree: TreeId, scope: Option<&str>) -> String {
    match scope {
        Some(scope) => format!("{tree} {scope}"),
        None => tree.to_string(),
    }
}

fn mismatch() -> StoreError {
    StoreError::unavailable("postgres store: a write produced the wrong kind of result")
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
    }
}
