//! The storage contract and the in-memory store.
//!
//! A [`Store`] persists logs and snapshots for many trees. Expected outcomes
//! (lost compare-and-swap, fenced writer, duplicate idempotent append, a
//! live lease held by someone else) are typed results; errors are storage
//! failures, and a storage failure stops that tree's writer.

mod changes;
mod inbox;
mod memory;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::digest::Digest;
use crate::ids::{Scope, TreeId};
use crate::labels::Labels;
use crate::log::{Record, Snapshot};
use crate::protocol::{BoxFuture, ProgramVersion};

pub use changes::{Change, ChangeHub, ChangeSender, Changes};
pub use inbox::{Message, MessageId, MessageIdError, PostOutcome, Posted, Settle, SettleOutcome};
pub use memory::MemoryStore;

/// Where a tree stands, as listed by a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TreeStatus {
    /// Some process is stepping or has work in flight.
    Running,
    /// Every live process waits for input.
    Waiting,
    /// Some process holds an unknown effect (parked).
    NeedsAttention,
    /// The root terminated.
    Done,
}

impl TreeStatus {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            TreeStatus::Running => "running",
            TreeStatus::Waiting => "waiting",
            TreeStatus::NeedsAttention => "needs_attention",
            TreeStatus::Done => "done",
        }
    }
}

impl fmt::Display for TreeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a store keeps about a tree beside its log, for listing.
///
/// A store writes what each [`Append`] carries; the engine sends the same
/// `program`, `labels` and `created` with every append of a tree (they are
/// facts of its start), and a new `status` and `updated`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeMeta {
    /// The tree (its root process).
    pub tree: TreeId,
    /// The tenant scope.
    pub scope: Scope,
    /// The status after the last append.
    pub status: TreeStatus,
    /// When the last append was made (engine clock).
    pub updated: Timestamp,
    /// The root's program and its exact version; `None` only for a tree a
    /// store migrated from a schema that did not keep it, until the tree's
    /// next append.
    #[serde(default)]
    pub program: Option<ProgramVersion>,
    /// The labels the tree was started with.
    #[serde(default)]
    pub labels: Labels,
    /// When the tree was started (engine clock); `None` for a tree started
    /// before the engine recorded it.
    #[serde(default)]
    pub created: Option<Timestamp>,
}

impl TreeMeta {
    /// Metadata with a status and a time only: no program, labels or
    /// creation time (for tests and tools that write trees by hand).
    pub fn new(tree: TreeId, scope: Scope, status: TreeStatus, updated: Timestamp) -> TreeMeta {
        TreeMeta {
            tree,
            scope,
            status,
            updated,
            program: None,
            labels: Labels::new(),
            created: None,
        }
    }
}

/// A writer's lease on a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Fencing token; strictly increases with every grant.
    pub token: u64,
    /// Who holds it.
    pub owner: String,
    /// When it expires unless renewed.
    pub until: Timestamp,
}

/// A request to become a tree's writer.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    /// The tree.
    pub tree: TreeId,
    /// The requesting writer (e.g. `host/pid/engine-n`).
    pub owner: String,
    /// The current time.
    pub now: Timestamp,
    /// How long the lease lasts unless renewed.
    pub ttl: Duration,
    /// Take over even a live lease held by someone else.
    pub force: bool,
}

/// The outcome of [`Store::acquire`].
// A short-lived answer that is matched at once; boxing the granted load
// would only add an allocation to every acquisition.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Acquired {
    /// The caller is now the writer; any previous writer is fenced.
    Granted {
        /// The new lease.
        lease: Lease,
        /// The tree's stored state.
        load: TreeLoad,
    },
    /// A live lease is held by someone else.
    LeaseHeld {
        /// Its holder.
        owner: String,
        /// When it expires.
        until: Timestamp,
    },
}

/// A tree as stored: the latest snapshot and the records after it (from
/// [`Store::load`]), or every record the store keeps (from
/// [`Store::history`]).
#[derive(Clone, Debug, Default)]
pub struct TreeLoad {
    /// Listing metadata, absent for a tree with no records.
    pub meta: Option<TreeMeta>,
    /// The latest snapshot.
    pub snapshot: Option<Snapshot>,
    /// Records after the snapshot (or from the first record).
    pub records: Vec<Record>,
    /// The head `(seq, hash)` the store recorded with the tree's last
    /// append, kept apart from the records so a log that lost its tail
    /// records is told from a shorter log; `None` when the store keeps no
    /// such head (the log's own head is then all there is).
    pub recorded_head: Option<(u64, Digest)>,
}

impl TreeLoad {
    /// Whether the tree has any committed record.
    pub fn exists(&self) -> bool {
        self.snapshot.is_some() || !self.records.is_empty()
    }

    /// The head `(seq, hash)` of the records (or snapshot) loaded.
    pub fn head(&self) -> (u64, Digest) {
        match (self.records.last(), &self.snapshot) {
            (Some(record), _) => (record.seq, record.hash),
            (None, Some(snapshot)) => (snapshot.seq, snapshot.head),
            (None, None) => (0, Digest::ZERO),
        }
    }
}

/// Records to append to one tree, compare-and-swap on the expected head
/// (`records[0].seq - 1`) and the writer's fencing token.
#[derive(Clone, Debug)]
pub struct Append {
    /// The tree.
    pub tree: TreeId,
    /// The writer's fencing token.
    pub token: u64,
    /// Consecutive records.
    pub records: Vec<Record>,
    /// Listing metadata after these records.
    pub meta: TreeMeta,
    /// Give up the lease in the same commit, once the records are durable
    /// (a writer's last append: it saves the separate release).
    pub release: bool,
}

/// A new tree's first commit, in one transaction (see [`Store::create_tree`]):
/// the writer lease is granted, the tree's first records are appended with
/// their listing metadata and, unless `hold` asks to keep it, the lease is
/// given up again in the same commit.
///
/// This is how a root that ends or waits within its first round costs one
/// durable commit: its start, its steps, its end and the lease's release.
#[derive(Clone, Debug)]
pub struct CreateTree {
    /// The tree (its root process).
    pub tree: TreeId,
    /// The writer the lease is granted to (e.g. `host/pid/engine-n`).
    pub owner: String,
    /// The current time.
    pub now: Timestamp,
    /// How long the lease lasts unless renewed.
    pub ttl: Duration,
    /// Consecutive records from sequence 1 (the first's `prev` is
    /// [`Digest::ZERO`]).
    pub records: Vec<Record>,
    /// Listing metadata after these records.
    pub meta: TreeMeta,
    /// Keep the lease: the writer goes on writing the tree. `false` gives it
    /// up in the same commit, as a last append's [`Append::release`] does.
    pub hold: bool,
}

impl CreateTree {
    /// Checks the shape a store relies on: at least one record, the first
    /// at sequence 1 after [`Digest::ZERO`], each the next of the one before.
    /// A request that fails is a caller's defect, refused before anything
    /// is written.
    pub fn check(&self) -> Result<(), StoreError> {
        let Some(first) = self.records.first() else {
            return Err(StoreError::refused(
                "create_tree: a new tree needs a record",
            ));
        };
        if first.seq != 1 || first.prev != Digest::ZERO {
            return Err(StoreError::refused(format!(
                "create_tree: the first record must be sequence 1 after the zero digest, not {}",
                first.seq
            )));
        }
        let chained = self
            .records
            .windows(2)
            .all(|pair| pair[1].seq == pair[0].seq + 1 && pair[1].prev == pair[0].hash);
        if !chained {
            return Err(StoreError::refused(
                "create_tree: the records must follow one another",
            ));
        }
        Ok(())
    }
}

/// The outcome of [`Store::create_tree`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Created {
    /// The records are durable. The lease's token is the newest granted on
    /// the tree; when `hold` was not asked the commit gave the lease up, and
    /// the token only fences older writers.
    Committed(Lease),
    /// The tree already has records: nothing was written. Take it up with
    /// [`Store::acquire`].
    Exists,
    /// The tree has no records but a live lease of someone else (a start
    /// under way elsewhere, or one that failed before its first commit):
    /// nothing was written.
    LeaseHeld {
        /// Its holder.
        owner: String,
        /// When it expires.
        until: Timestamp,
    },
}

/// The outcome of one [`Append`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendOutcome {
    /// The records are durable.
    Committed,
    /// Exactly these records were already committed (an idempotent retry).
    Duplicate,
    /// The head moved: the expected sequence is not the head.
    Conflict {
        /// The actual head sequence.
        head: u64,
    },
    /// The token is not the current lease's; another writer took over.
    Fenced,
}

/// A storage failure. The tree's writer stops; nothing is invented.
///
/// Each kind says whether retrying can help ([`StoreError::retryable`]),
/// and carries the error that caused it, if any, as its
/// [`source`](std::error::Error::source).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store cannot be reached right now: busy, locked, a connection
    /// dropped or refused. Retrying later may help.
    #[error("store unavailable: {message}")]
    Unavailable {
        /// What failed.
        message: String,
        /// The cause.
        #[source]
        source: Option<ErrorSource>,
    },
    /// The store refused the operation for good: the disk is full or
    /// read-only, the database belongs to something else, permissions.
    /// Retrying will not help until an operator acts.
    #[error("store refused the operation: {message}")]
    Refused {
        /// What failed.
        message: String,
        /// The cause.
        #[source]
        source: Option<ErrorSource>,
    },
    /// Stored data is corrupt. Retrying will not help.
    #[error("store data is corrupt: {message}")]
    Corrupt {
        /// What is wrong.
        message: String,
        /// The cause.
        #[source]
        source: Option<ErrorSource>,
    },
}

impl StoreError {
    /// A transient failure, without a cause.
    pub fn unavailable(message: impl Into<String>) -> StoreError {
        StoreError::Unavailable {
            message: message.into(),
            source: None,
        }
    }

    /// A lasting refusal, without a cause.
    pub fn refused(message: impl Into<String>) -> StoreError {
        StoreError::Refused {
            message: message.into(),
            source: None,
        }
    }

    /// Corrupt data, without a cause.
    pub fn corrupt(message: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            message: message.into(),
            source: None,
        }
    }

    /// The same error, caused by `source`.
    pub fn caused_by(self, source: impl std::error::Error + Send + Sync + 'static) -> StoreError {
        let cause = Some(ErrorSource(Arc::new(source)));
        match self {
            StoreError::Unavailable { message, .. } => StoreError::Unavailable {
                message,
                source: cause,
            },
            StoreError::Refused { message, .. } => StoreError::Refused {
                message,
                source: cause,
            },
            StoreError::Corrupt { message, .. } => StoreError::Corrupt {
                message,
                source: cause,
            },
        }
    }

    /// Whether retrying the operation later can help.
    pub fn retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }

    /// What failed, without the kind.
    pub fn message(&self) -> &str {
        match self {
            StoreError::Unavailable { message, .. }
            | StoreError::Refused { message, .. }
            | StoreError::Corrupt { message, .. } => message,
        }
    }
}

/// The error behind a [`StoreError`]: shared, so store errors stay cheap
/// to clone; compared by its message.
#[derive(Clone)]
pub struct ErrorSource(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl fmt::Debug for ErrorSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for ErrorSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl std::error::Error for ErrorSource {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for ErrorSource {
    fn eq(&self, other: &ErrorSource) -> bool {
        self.0.to_string() == other.0.to_string()
    }
}

impl Eq for ErrorSource {}

/// Which trees to list, and which page of them.
///
/// Trees are listed in tree-id order. A page holds at most `limit` rows
/// (readable or not) after the `after` cursor; [`Listing::next`] is the
/// cursor of the page that follows, so paging from `after: None` until
/// `next` is `None` visits every tree that existed throughout, each once,
/// even while trees are added.
#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    /// Only trees with this status.
    pub status: Option<TreeStatus>,
    /// Only trees in this scope.
    pub scope: Option<Scope>,
    /// Only trees carrying every one of these labels (an empty set selects
    /// every tree).
    pub labels: Labels,
    /// At most this many rows; `None` lists every match.
    pub limit: Option<std::num::NonZeroU32>,
    /// Only rows after this cursor (from an earlier [`Listing::next`]).
    pub after: Option<ListCursor>,
}

impl ListFilter {
    /// Whether a tree's metadata passes the status, scope and label
    /// filters (not the page bounds).
    pub fn matches(&self, meta: &TreeMeta) -> bool {
        self.status.is_none_or(|status| meta.status == status)
            && self.scope.as_ref().is_none_or(|scope| &meta.scope == scope)
            && meta.labels.contains_all(&self.labels)
    }
}

/// Where a listing's page ends: opaque to hosts, which pass it back as
/// [`ListFilter::after`] for the next page. Its text is safe to put in a
/// URL or on a command line.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListCursor(String);

/// A cursor text that no listing made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("store.cursor.invalid: {text:?} is not a listing cursor")]
pub struct CursorError {
    /// The refused text (at most 80 characters of it).
    pub text: String,
}

impl CursorError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        "store.cursor.invalid"
    }
}

impl ListCursor {
    /// The cursor after a stored tree row, by the row's id as stored (for
    /// store implementations).
    pub fn after_row(id: impl Into<String>) -> ListCursor {
        ListCursor(id.into())
    }

    /// The cursor after a tree.
    pub fn after_tree(tree: TreeId) -> ListCursor {
        ListCursor(tree.to_string())
    }

    /// The stored row id this cursor follows (for store implementations:
    /// a page after it starts at the first row whose id text is greater,
    /// compared byte by byte).
    pub fn row(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ListCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ListCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ListCursor({:?})", self.0)
    }
}

impl std::str::FromStr for ListCursor {
    type Err = CursorError;
    fn from_str(text: &str) -> Result<ListCursor, CursorError> {
        let ok =
            !text.is_empty() && text.len() <= 256 && text.bytes().all(|b| b.is_ascii_graphic());
        if ok {
            Ok(ListCursor(text.to_owned()))
        } else {
            Err(CursorError {
                text: text.chars().take(80).collect(),
            })
        }
    }
}

impl Serialize for ListCursor {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ListCursor {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<ListCursor, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// What [`Store::list`] found: the trees it could read, and the rows it
/// could not, each with its own error, so one damaged row never hides the
/// other trees.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Trees with committed records, sorted by tree id.
    pub trees: Vec<TreeMeta>,
    /// Rows that do not read back.
    pub unreadable: Vec<UnreadableRow>,
    /// The cursor of the next page, when the filter's `limit` cut this one
    /// short; `None` when no row follows.
    pub next: Option<ListCursor>,
}

impl Listing {
    /// Cuts a complete, id-ordered listing of `rows` down to the page
    /// `filter` asks for (for store implementations that list in memory).
    pub fn page(rows: Vec<Result<TreeMeta, UnreadableRow>>, filter: &ListFilter) -> Listing {
        let mut listing = Listing::default();
        let after = filter.after.as_ref().map(ListCursor::row);
        let limit = filter
            .limit
            .map_or(usize::MAX, |limit| limit.get() as usize);
        let mut taken = 0usize;
        let mut last: Option<String> = None;
        for row in rows {
            let id = match &row {
                Ok(meta) => meta.tree.to_string(),
                Err(unreadable) => unreadable.id.clone(),
            };
            if after.is_some_and(|after| id.as_str() <= after) {
                continue;
            }
            if taken == limit {
                listing.next = last.map(ListCursor::after_row);
                break;
            }
            taken += 1;
            last = Some(id);
            match row {
                Ok(meta) => listing.trees.push(meta),
                Err(unreadable) => listing.unreadable.push(unreadable),
            }
        }
        listing
    }
}

/// A stored row of a tree that does not read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnreadableRow {
    /// The tree, when its id reads back.
    pub tree: Option<TreeId>,
    /// The row's id as stored.
    pub id: String,
    /// What is wrong with it.
    pub error: StoreError,
}

/// Persists logs and snapshots for many trees.
pub trait Store: Send + Sync + 'static {
    /// Becomes the writer of `tree` (created empty if unknown) and returns
    /// its stored state, or reports the live lease of someone else.
    ///
    /// A live lease is never granted twice: a request by the lease's own
    /// owner without `force` is answered `LeaseHeld` like anyone else's (the
    /// owner decides whether to force), so a writer cannot fence itself by
    /// asking twice.
    fn acquire(&self, request: AcquireRequest) -> BoxFuture<'_, Result<Acquired, StoreError>>;

    /// Commits a new tree's first records in one transaction (see
    /// [`CreateTree`]): when the tree has no records and no live lease of
    /// someone else, the lease is granted to `create.owner` (its token newer
    /// than any granted before), the records and metadata are appended and,
    /// unless `create.hold`, the lease is released again, all or nothing.
    /// Durable when this returns [`Created::Committed`]; otherwise nothing
    /// was written.
    ///
    /// The default does the same with [`Store::acquire`], [`Store::append`]
    /// and [`Store::release`]: the same outcomes, but in up to three
    /// transactions (a crash between them leaves a lease on a tree without
    /// records, which expires). Stores override it to make it one.
    fn create_tree(&self, create: CreateTree) -> BoxFuture<'_, Result<Created, StoreError>> {
        Box::pin(async move {
            create.check()?;
            let request = AcquireRequest {
                tree: create.tree,
                owner: create.owner,
                now: create.now,
                ttl: create.ttl,
                force: false,
            };
            let (lease, load) = match self.acquire(request).await? {
                Acquired::Granted { lease, load } => (lease, load),
                Acquired::LeaseHeld { owner, until } => {
                    return Ok(Created::LeaseHeld { owner, until });
                }
            };
            if load.exists() {
                self.release(create.tree, lease.token).await?;
                return Ok(Created::Exists);
            }
            let append = Append {
                tree: create.tree,
                token: lease.token,
                records: create.records,
                meta: create.meta,
                release: !create.hold,
            };
            match self.append(vec![append]).await?.first() {
                Some(AppendOutcome::Committed | AppendOutcome::Duplicate) => {
                    Ok(Created::Committed(lease))
                }
                // Another writer took the lease over in between: the tree
                // is theirs now.
                _ => Ok(Created::Exists),
            }
        })
    }

    /// Reads a tree without taking a lease (empty if unknown).
    fn load(&self, tree: TreeId) -> BoxFuture<'_, Result<TreeLoad, StoreError>>;

    /// Reads every record the store keeps of a tree, for verification:
    /// from the first record when the store keeps the whole history, else
    /// from its latest snapshot (the records that snapshot covers are
    /// gone). The default reads what [`Store::load`] reads.
    fn history(&self, tree: TreeId) -> BoxFuture<'_, Result<TreeLoad, StoreError>> {
        self.load(tree)
    }

    /// Appends to one or more trees; each item is atomic on its own and
    /// answered in order. Durable when this returns.
    fn append(&self, batch: Vec<Append>) -> BoxFuture<'_, Result<Vec<AppendOutcome>, StoreError>>;

    /// Stores a snapshot; records it covers may be compacted.
    fn write_snapshot(
        &self,
        tree: TreeId,
        token: u64,
        snapshot: Snapshot,
    ) -> BoxFuture<'_, Result<AppendOutcome, StoreError>>;

    /// Extends a lease; `false` if the token is no longer current.
    fn renew(
        &self,
        tree: TreeId,
        token: u64,
        until: Timestamp,
    ) -> BoxFuture<'_, Result<bool, StoreError>>;

    /// Gives up a lease (no-op if the token is not current).
    fn release(&self, tree: TreeId, token: u64) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Lists trees with committed records that pass `filter`, sorted by
    /// tree id, one page at a time when `filter` sets a limit (see
    /// [`ListFilter`]); a row that does not read back is reported in
    /// [`Listing::unreadable`], not as an error of the whole listing, and
    /// counts towards the page.
    fn list(&self, filter: ListFilter) -> BoxFuture<'_, Result<Listing, StoreError>>;

    /// Subscribes to the store's change notices (see [`Changes`]): every
    /// commit that appends to a tree, releases its lease, or posts or
    /// settles a message of its inbox is noticed, also when another handle,
    /// process or machine made it. `None` (the default): this store sends
    /// no notices, and readers re-read on a timer.
    fn changes(&self) -> BoxFuture<'_, Result<Option<Changes>, StoreError>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Posts a message to its tree's inbox (see [`Message`]): durable and
    /// noticed when this returns, idempotent by the message's id.
    /// The default: [`PostOutcome::Unsupported`].
    fn post(&self, message: Message) -> BoxFuture<'_, Result<PostOutcome, StoreError>> {
        let _ = message;
        Box::pin(std::future::ready(Ok(PostOutcome::Unsupported)))
    }

    /// The messages not yet settled, of one tree or (`None`) of every tree,
    /// in the order they were posted. The default: none.
    fn pending(&self, tree: Option<TreeId>) -> BoxFuture<'_, Result<Vec<Message>, StoreError>> {
        let _ = tree;
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    /// Settles a message with its outcome, if `settle.token` is the newest
    /// lease granted on the tree (see [`Settle::token`]); the first outcome
    /// stands. The default:
    /// [`SettleOutcome::Unsupported`].
    fn settle(&self, settle: Settle) -> BoxFuture<'_, Result<SettleOutcome, StoreError>> {
        let _ = settle;
        Box::pin(std::future::ready(Ok(SettleOutcome::Unsupported)))
    }

    /// A posted message and its outcome, if any. The default: none.
    fn message(
        &self,
        tree: TreeId,
        id: MessageId,
    ) -> BoxFuture<'_, Result<Option<Posted>, StoreError>> {
        let _ = (tree, id);
        Box::pin(std::future::ready(Ok(None)))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::ids::StartId;

    fn meta(n: usize) -> TreeMeta {
        let id = StartId::new("acme", format!("t{n}")).expect("valid");
        TreeMeta::new(
            crate::ids::ProcessId::root(&id),
            Scope::new("acme").expect("valid"),
            TreeStatus::Running,
            Timestamp(0),
        )
    }

    fn unreadable(id: &str) -> UnreadableRow {
        UnreadableRow {
            tree: None,
            id: id.to_owned(),
            error: StoreError::corrupt("damaged"),
        }
    }

    /// Every row's id text, in the order a listing holds them.
    fn ids(listing: &Listing) -> Vec<String> {
        let mut ids: Vec<String> = listing
            .trees
            .iter()
            .map(|meta| meta.tree.to_string())
            .chain(listing.unreadable.iter().map(|row| row.id.clone()))
            .collect();
        ids.sort();
        ids
    }

    proptest! {
        /// Reading page after page, whatever the limit, yields every row
        /// once and in order, damaged rows included, and only the last
        /// page has no next cursor.
        #[test]
        fn pages_cover_every_row_once(count in 0usize..40, damaged in proptest::collection::vec(any::<bool>(), 40), limit in 1u32..12) {
            let mut rows: Vec<(String, Result<TreeMeta, UnreadableRow>)> = (0..count)
                .map(|n| {
                    let meta = meta(n);
                    let id = meta.tree.to_string();
                    if damaged[n] {
                        (id.clone(), Err(unreadable(&id)))
                    } else {
                        (id, Ok(meta))
                    }
                })
                .collect();
            rows.sort_by(|a, b| a.0.cmp(&b.0));
            let all: Vec<String> = rows.iter().map(|(id, _)| id.clone()).collect();
            let rows: Vec<Result<TreeMeta, UnreadableRow>> = rows.into_iter().map(|(_, row)| row).collect();
            let mut filter = ListFilter {
                limit: std::num::NonZeroU32::new(limit),
                ..ListFilter::default()
            };
            let mut listed = Vec::new();
            loop {
                let page = Listing::page(rows.clone(), &filter);
                let ids = ids(&page);
                prop_assert!(ids.len() <= limit as usize);
                listed.extend(ids);
                match page.next {
                    Some(next) => {
                        prop_assert_eq!(listed.len() % limit as usize, 0, "only the last page is short");
                        filter.after = Some(next.to_string().parse().expect("a cursor's text reads back"));
                    }
                    None => break,
                }
            }
            prop_assert_eq!(listed, all);
        }
    }

    #[test]
    fn cursor_texts_from_outside_are_checked() {
        assert!("p_00ff".parse::<ListCursor>().is_ok());
        for bad in ["", "a b", "tab\t", &"x".repeat(257)] {
            let error = bad.parse::<ListCursor>().expect_err(bad);
            assert_eq!(error.code(), "store.cursor.invalid");
        }
    }
}
