//! # baton-store-sqlite: the embedded durable Baton store
//!
//! Owns [`SqliteStore`], the default durable implementation of the kernel's
//! [`Store`] contract: every tree's hash-chained log, its latest snapshot,
//! its writer lease and fencing token, in one SQLite database file. The file
//! is the authority: what an append acknowledges survives `kill -9` and a
//! power cut.
//!
//! Depend on it through the facade (`baton::store::sqlite`, feature
//! `sqlite`, on by default), or directly when writing tools around a store.
//! It depends only on `baton-run`; it knows nothing of programs, teams,
//! workflows or models — record bodies are opaque bytes to it, and it never
//! decodes them.
//!
//! ## How it works
//!
//! - **Durability.** The database runs in WAL mode with
//!   `synchronous = FULL`: a commit returns only after its WAL frames are
//!   fsynced.
//! - **One writer connection, group commit.** Every write (acquire,
//!   append, snapshot, renew, release, prune) is queued in call order for
//!   the one writer connection; whoever holds it applies everything
//!   queued — appends of many trees from many engines' tasks — in one
//!   transaction with one fsync, then answers each caller with its own
//!   outcome through a oneshot channel. The more trees commit
//!   concurrently, the more commits share an fsync. If a group fails, its
//!   operations are retried one per transaction, so one bad operation
//!   cannot fail its neighbours.
//! - **Who commits** ([`CommitOn`]). A short run's one commit (a new
//!   tree that ended or waits after its first round) is committed by the
//!   task awaiting it, on its own thread (`tokio::task::block_in_place`,
//!   on a multi-thread runtime), when nothing else is queued or being
//!   committed: it costs its commit and no hand-off between threads. The
//!   writer thread commits everything else, and everything with
//!   [`CommitOn::WriterThread`].
//! - **Reads** (`load`, `list`, [`SqliteStore::records`]) run on a second
//!   thread with its own connection, each in a read transaction, so they
//!   see a consistent committed state and never wait for an fsync. A read
//!   issued after a write was acknowledged sees that write.
//! - **Compare-and-swap and fencing** exactly as `MemoryStore`: an append
//!   is `Fenced` unless its token is the current lease's, a `Duplicate` if
//!   its records are exactly the committed ones at those sequences, and a
//!   `Conflict` if it does not extend the head.
//! - **Content-addressed chunks.** A body or snapshot state longer than
//!   4 KiB is cut into content-defined pieces (about 2.5 KiB on average) by
//!   a rolling hash; each piece is stored once per tree under its blake3
//!   digest and the row keeps a manifest of piece ids. Unchanged parts of a
//!   large state are therefore stored once, whichever record or snapshot
//!   repeats them, and a step that edits a few bytes of a 250 KB state
//!   writes the one or two pieces around the edit plus a manifest. Pieces
//!   are scoped to their tree so compaction and pruning collect them by
//!   reading one tree only. Reassembly is a concatenation, so the bytes
//!   read are exactly the bytes hashed into the chain; `verify` checks it.
//!   The writer remembers each recently written tree's last few cuts, so
//!   the pieces a new body shares with any of them (a tree's bodies often
//!   take turns between kinds) are found by comparison rather than cut,
//!   digested and looked up again (a cache of this connection's commits
//!   only: forgotten on a rollback, a prune or another connection's
//!   commit, and on a compaction but for the snapshot's own cut).
//! - **Snapshots and compaction.** [`SqliteConfig::compact`] (default on)
//!   deletes the records a snapshot covers and the pieces nothing
//!   references any more; the snapshot keeps the chain head it covers, so
//!   the remaining log verifies from it. Snapshot states carry their own
//!   digest, checked on read. When to snapshot is the engine's choice
//!   (`EngineConfig::snapshot_every` and its byte rule).
//! - **Schema** is versioned with `PRAGMA user_version` and marked with an
//!   `application_id`; migrations are owned here. A file of a newer
//!   schema, a database of another application or a file that is not a
//!   database is refused with an [`OpenError`] before anything is written.
//! - **A write counter.** [`SqliteStore::bytes_written`] counts the payload
//!   bytes the store has committed since it was opened (bodies, new pieces,
//!   manifests and snapshot states), so benchmarks can show what
//!   deduplication saves without reading the file, and
//!   [`SqliteStore::transactions`] counts the write transactions committed
//!   (SQLite's commit hook), so tests can show what an operation costs.
//! - **Page size.** A commit writes each page it changed whole, and a
//!   short run changes one page in each of three B-trees (its row and its
//!   two index entries), so smaller pages write less per short run and
//!   larger ones read large states in fewer pages
//!   ([`SqliteConfig::page_size`], 4 KiB by default); a store keeps the
//!   size it was created with ([`SqliteStore::page_size`]).
//! - **A new tree in one commit.** `Store::create_tree` grants the lease,
//!   writes the tree's row once (metadata, head and lease together) and
//!   its records in the writer's group transaction, so a root that ends in
//!   its first round costs one commit, shared with whatever else the group
//!   holds. The records of a first commit that ends its tree (done, lease
//!   given up), when every body is inline and all of them are stored in
//!   four pages, are packed into the tree's row instead of being rows of their
//!   own (schema version 5): such a run writes no row of `records` and no
//!   entry of its key. Since schema version 6 they are stored compressed
//!   (LZ4, against a dictionary of the text records share) when that is
//!   shorter, a half to a third of their size, so more such rows share a
//!   page; since version 7 in a compact form (their hashes computed again
//!   when read, digests and ids as bytes), about a third of their size. A
//!   tree that goes on keeps a slim row, which each of its later commits
//!   writes again.
//!
//! No cargo features.

mod chunk;
mod cuts;
mod db;
mod inbox;
mod packed;
mod schema;
mod writer;

/// A packed log (the first records of a short run, kept in its tree's row:
/// `trees.log`) in its plain form, version byte first, compressed ones
/// decompressed and compact ones written out: for tools and tests that
/// read a store file directly. A compact log reads only with its tree's id.
#[doc(hidden)]
pub use packed::plain as plain_packed_log;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use baton_run::log::{Record, Snapshot};
use baton_run::store::{
    AcquireRequest, Acquired, Append, AppendOutcome, Changes, CreateTree, Created, ListFilter,
    Listing, Message, MessageId, PostOutcome, Posted, Settle, SettleOutcome, Store, StoreError,
    TreeLoad,
};
use baton_run::{BoxFuture, Timestamp, TreeId};
use rusqlite::{Connection, ErrorCode, OpenFlags};
use tokio::sync::oneshot;
use writer::Write;

/// The WAL bytes after which the writer checkpoints: SQLite's default of
/// 1000 pages, at 4 KiB a page.
const CHECKPOINT_BYTES: u32 = 1000 * 4096;

/// The schema version this build reads and writes.
pub const SCHEMA_VERSION: i64 = schema::CURRENT;

/// Whether opening a store may create it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Creation {
    /// Open an existing store only: a missing file, an empty one or a
    /// database without a Baton schema is refused. What read-only tools use.
    #[default]
    Existing,
    /// Create a new store: an existing file is refused.
    New,
    /// Open the store at the path, or create it when no file is there (an
    /// existing file must still be a Baton store). What commands that start
    /// work use.
    ExistingOrNew,
}

/// How a [`SqliteStore`] is opened.
#[derive(Clone, Debug)]
pub struct SqliteConfig {
    /// Whether opening may create the store.
    pub creation: Creation,
    /// Delete the records a snapshot covers (and the chunks only they
    /// referenced). Off keeps the whole history for audit.
    pub compact: bool,
    /// The most operations one group commit applies.
    pub max_batch: usize,
    /// Which thread commits a short run's one commit: the task awaiting it
    /// (by default), or the store's writer thread, which commits every
    /// other write either way.
    pub commit_on: CommitOn,
    /// How long a statement waits for a lock held by another process before
    /// it fails.
    pub busy_timeout: Duration,
    /// The database page size of a store this open creates. An existing
    /// store keeps the size it was created with (SQLite cannot change the
    /// page size of a database in WAL mode), whatever this says.
    pub page_size: PageSize,
}

impl Default for SqliteConfig {
    /// An existing store only, compaction on, up to 4096 operations per
    /// group commit, a short run's one commit committed by the task that
    /// awaits it, 5 s busy timeout, 4 KiB pages for a new store.
    fn default() -> SqliteConfig {
        SqliteConfig {
            creation: Creation::Existing,
            compact: true,
            max_batch: 4096,
            commit_on: CommitOn::default(),
            busy_timeout: Duration::from_secs(5),
            page_size: PageSize::default(),
        }
    }
}

/// Which thread commits a store's writes.
///
/// Writes are queued in call order and committed in groups, one
/// transaction and one fsync for everything queued, on the store's one
/// writer connection; what differs is whose thread runs a short run's
/// commit, and so how long the run waits for its answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CommitOn {
    /// A short run's one commit (a new tree that ended, or waits, after its
    /// first round: `Store::create_tree` with more than the start record,
    /// or giving the lease up) is committed by the task that awaits it, on
    /// its own thread (with `tokio::task::block_in_place`, which hands its
    /// worker's other tasks to another thread meanwhile), when nothing
    /// else is queued or being committed; it then commits whatever was
    /// queued behind it, up to two groups, and leaves the rest to the
    /// writer thread. Such a run costs its commit and no hand-off between
    /// threads: in the benchmark, a short run's time over the disk's
    /// commit floor was mostly the two hand-offs, to the writer thread and
    /// back. The writer thread commits everything else: a short run's
    /// commit queued behind other writes (under load the writer's group
    /// serves them all), every write of a tree that goes on (the engine
    /// works out its next round while they are written), leases, inbox
    /// writes, writes awaited outside a multi-thread tokio runtime (a
    /// current-thread runtime, another executor, where blocking in place
    /// is not allowed) and writes whose future is dropped unawaited.
    #[default]
    Caller,
    /// Always the store's writer thread: the awaiting task is woken when
    /// its group has committed. For hosts whose tasks must never block in
    /// place, for example ones that await a write inside `join!` or
    /// `select!` with other work that must go on during the commit, or
    /// that enter a multi-thread runtime's handle from inside a
    /// current-thread runtime (where tokio refuses to block in place).
    WriterThread,
}

/// The page size of a new store's database file: the unit SQLite writes.
///
/// Every commit writes each page it changed whole to the write-ahead log,
/// and a short run changes one page in each of three B-trees (the tree's
/// row, which holds its records, and its id and scope index entries), so
/// the page size, more than what a run records, sets its bytes on disk: a
/// `chain3` run of the benchmark writes about 8 KB with 1 KiB pages
/// against 19 KB with 4 KiB. Smaller pages make more pages per commit,
/// though, and cost latency: one root after another took 5-10% longer,
/// and with 64 concurrent hosts the 99th percentile of a run was 1.6 times
/// as long for the same median. The default is SQLite's own 4 KiB; choose
/// 1 KiB where bytes written cost more than latency (a disk billed or
/// throttled by throughput, flash wear). `docs/performance.md` has the
/// measured figures; the WAL is checkpointed after the same bytes (4 MB)
/// whatever the page size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum PageSize {
    /// 1 KiB: the least written per short commit.
    Kib1,
    /// 2 KiB.
    Kib2,
    /// 4 KiB: the default, and SQLite's own.
    #[default]
    Kib4,
    /// 8 KiB.
    Kib8,
    /// 16 KiB.
    Kib16,
    /// 32 KiB.
    Kib32,
    /// 64 KiB: SQLite's largest.
    Kib64,
}

impl PageSize {
    /// Every size, smallest first.
    pub const ALL: [PageSize; 7] = [
        PageSize::Kib1,
        PageSize::Kib2,
        PageSize::Kib4,
        PageSize::Kib8,
        PageSize::Kib16,
        PageSize::Kib32,
        PageSize::Kib64,
    ];

    /// The size of `bytes` bytes, if it is one (a power of two from 1024
    /// to 65536).
    pub fn from_bytes(bytes: u32) -> Option<PageSize> {
        PageSize::ALL.into_iter().find(|size| size.bytes() == bytes)
    }

    /// The size in bytes.
    pub fn bytes(self) -> u32 {
        match self {
            PageSize::Kib1 => 1 << 10,
            PageSize::Kib2 => 2 << 10,
            PageSize::Kib4 => 4 << 10,
            PageSize::Kib8 => 8 << 10,
            PageSize::Kib16 => 16 << 10,
            PageSize::Kib32 => 32 << 10,
            PageSize::Kib64 => 64 << 10,
        }
    }
}

/// Why a database could not be opened. The file is left as it was.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The path cannot hold a database (its parent is missing or is not a
    /// directory, or the path is a directory).
    #[error("cannot use {}: {reason}", path.display())]
    Path {
        /// The path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// No store is at the path (and the configuration does not create one).
    #[error(
        "no store at {}: create one with SqliteStore::create or SqliteStore::open_or_create",
        path.display()
    )]
    Missing {
        /// The path.
        path: PathBuf,
    },
    /// A file is at the path, and a new store was asked for.
    #[error(
        "{} already exists: open it with SqliteStore::open, or choose another path",
        path.display()
    )]
    Exists {
        /// The path.
        path: PathBuf,
    },
    /// The file is empty, or a database with nothing in it: not a Baton
    /// store (a store truncated to nothing reads so). It is left untouched.
    #[error(
        "{} is empty, not a Baton store (truncated?); restore it from a backup, or delete it to start afresh",
        path.display()
    )]
    Empty {
        /// The path.
        path: PathBuf,
    },
    /// The file is not a SQLite database, or is damaged.
    #[error("{} is not a SQLite database or is corrupt: {message}", path.display())]
    NotADatabase {
        /// The path.
        path: PathBuf,
        /// SQLite's diagnosis.
        message: String,
    },
    /// The file is a SQLite database of another application.
    #[error("{} is a SQLite database but not a Baton store", path.display())]
    Foreign {
        /// The path.
        path: PathBuf,
    },
    /// The file was written by a newer Baton with a schema this build does
    /// not know.
    #[error(
        "{} has store schema version {found}, newer than version {supported} of this build",
        path.display()
    )]
    NewerSchema {
        /// The path.
        path: PathBuf,
        /// The file's schema version.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// SQLite refused another way (permissions, locks, I/O).
    #[error("cannot open {}: {message}", path.display())]
    Sqlite {
        /// The path.
        path: PathBuf,
        /// SQLite's message.
        message: String,
    },
    /// A store thread could not be started.
    #[error("cannot start a store thread: {0}")]
    Thread(String),
}

impl From<OpenError> for StoreError {
    fn from(error: OpenError) -> StoreError {
        match error {
            OpenError::NotADatabase { .. } | OpenError::Empty { .. } => {
                StoreError::corrupt(error.to_string())
            }
            OpenError::Thread(_) => StoreError::unavailable(error.to_string()),
            _ => StoreError::refused(error.to_string()),
        }
    }
}

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// A read, answered by the reader thread.
enum Read {
    Load(TreeId, Reply<TreeLoad>),
    List(ListFilter, Reply<Listing>),
    History(TreeId, Reply<Vec<Record>>),
    Whole(TreeId, Reply<TreeLoad>),
    Pending(Option<TreeId>, Reply<Vec<Message>>),
    Message(TreeId, MessageId, Reply<Option<Posted>>),
}

struct Inner {
    path: PathBuf,
    /// The file's page size in bytes; see [`SqliteStore::page_size`].
    page_size: u32,
    /// Payload bytes committed so far; see [`SqliteStore::bytes_written`].
    written: Arc<AtomicU64>,
    /// Write transactions committed; see [`SqliteStore::transactions`].
    transactions: Arc<AtomicU64>,
    /// Change notices: subscribers and the watcher of other connections.
    notices: Arc<inbox::Notices>,
    /// The most bytes of a new tree's first records packed into its row
    /// (`packed::limit` of the file's page size).
    pack_max: usize,
    /// The write queue and the writer's connection.
    desk: Arc<writer::Desk>,
    reads: Option<mpsc::Sender<Read>>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the queues lets each thread finish what is queued, close
        // its connection (the last close checkpoints the WAL) and exit.
        // The watcher's read-only connection closes first, so the last
        // connection to close (which checkpoints the WAL) is a writable one.
        self.notices.stop();
        self.desk.close();
        self.reads.take();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// The embedded durable store: one SQLite file, WAL, durable group commits.
/// Cloning shares the same database threads; the threads stop when the
/// last clone is dropped.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

fn stopped() -> StoreError {
    StoreError::unavailable("sqlite store threads have stopped")
}

impl SqliteStore {
    /// Opens the existing store at `path` with the default configuration.
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore, OpenError> {
        SqliteStore::open_with(path, SqliteConfig::default())
    }

    /// Creates a new store at `path` (refusing an existing file).
    pub fn create(path: impl AsRef<Path>) -> Result<SqliteStore, OpenError> {
        let config = SqliteConfig {
            creation: Creation::New,
            ..SqliteConfig::default()
        };
        SqliteStore::open_with(path, config)
    }

    /// Opens the store at `path`, creating it when no file is there.
    pub fn open_or_create(path: impl AsRef<Path>) -> Result<SqliteStore, OpenError> {
        let config = SqliteConfig {
            creation: Creation::ExistingOrNew,
            ..SqliteConfig::default()
        };
        SqliteStore::open_with(path, config)
    }

    /// Opens (or, as `config.creation` allows, creates) the store at `path`.
    ///
    /// Nothing is written before the file is known to be a Baton store of a
    /// schema this build understands, or a file this call creates.
    pub fn open_with(
        path: impl AsRef<Path>,
        config: SqliteConfig,
    ) -> Result<SqliteStore, OpenError> {
        let path = path.as_ref().to_path_buf();
        check_path(&path)?;
        let existing = match std::fs::metadata(&path) {
            Ok(metadata) => Some(metadata.len()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => {
                return Err(OpenError::Path {
                    path,
                    reason: error.to_string(),
                });
            }
        };
        match (existing, config.creation) {
            (None, Creation::Existing) => return Err(OpenError::Missing { path }),
            (Some(_), Creation::New) => return Err(OpenError::Exists { path }),
            (Some(0), _) => return Err(OpenError::Empty { path }),
            (None, _) => create(&path, &config)?,
            _ => {}
        }
        let sqlite = |error: rusqlite::Error| open_error(&path, error);
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut writer = Connection::open_with_flags(&path, flags).map_err(sqlite)?;
        writer.busy_timeout(config.busy_timeout).map_err(sqlite)?;
        writer.set_prepared_statement_cache_capacity(STATEMENTS_KEPT);
        let found = schema::inspect(&writer).map_err(sqlite)?;
        match found {
            schema::Found::Foreign => return Err(OpenError::Foreign { path }),
            // A database with nothing in it is no store: a new store has
            // its schema before it appears at its path.
            schema::Found::Store(0) => return Err(OpenError::Empty { path }),
            schema::Found::Store(found) if found > schema::CURRENT => {
                return Err(OpenError::NewerSchema {
                    path,
                    found,
                    supported: schema::CURRENT,
                });
            }
            schema::Found::Store(found) => {
                let mode = schema::enable_wal(&writer).map_err(sqlite)?;
                if !mode.is_some_and(|mode| mode.eq_ignore_ascii_case("wal")) {
                    return Err(OpenError::Sqlite {
                        path,
                        message: "the database refused WAL mode".into(),
                    });
                }
                writer
                    .pragma_update(None, "synchronous", "FULL")
                    .map_err(sqlite)?;
                schema::migrate(&mut writer, found).map_err(sqlite)?;
            }
        }
        let page_size: u32 = writer
            .query_row("PRAGMA page_size", [], |row| row.get(0))
            .map_err(sqlite)?;
        // SQLite checkpoints after a number of WAL pages (1000 by default);
        // counted in bytes instead (SQLite's default at 4 KiB pages), so a
        // store of small pages does not checkpoint, and fsync its file,
        // more often.
        writer
            .pragma_update(
                None,
                "wal_autocheckpoint",
                CHECKPOINT_BYTES / page_size.max(512),
            )
            .map_err(sqlite)?;
        // Counted from here on: the migrations above are the opening's own.
        let transactions = Arc::new(AtomicU64::new(0));
        let commits = Arc::clone(&transactions);
        writer
            .commit_hook(Some(move || {
                commits.fetch_add(1, Ordering::AcqRel);
                // `false`: the commit goes ahead.
                false
            }))
            .map_err(sqlite)?;
        let mut reader = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(sqlite)?;
        reader.busy_timeout(config.busy_timeout).map_err(sqlite)?;
        reader.set_prepared_statement_cache_capacity(STATEMENTS_KEPT);
        reader
            .pragma_update(None, "query_only", true)
            .map_err(sqlite)?;

        let (reads, read_queue) = mpsc::channel();
        let spawn = |name: &str, run: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.to_owned())
                .spawn(run)
                .map_err(|error| OpenError::Thread(error.to_string()))
        };
        let written = Arc::new(AtomicU64::new(0));
        let notices = Arc::new(inbox::Notices::new());
        let core = writer::Core::new(
            writer,
            writer::Writer {
                compact: config.compact,
                counter: Arc::clone(&written),
                notices: Arc::clone(&notices),
            },
        );
        let (desk, rung) = writer::Desk::new(core, config.max_batch, config.commit_on);
        let desk = Arc::new(desk);
        let serving = Arc::clone(&desk);
        let write_thread = spawn("baton-sqlite-writer", Box::new(move || serving.run(&rung)))?;
        let read_thread = spawn(
            "baton-sqlite-reader",
            Box::new(move || read_loop(&mut reader, &read_queue)),
        )?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                page_size,
                written,
                transactions,
                notices,
                pack_max: packed::limit(page_size),
                desk,
                reads: Some(reads),
                threads: vec![write_thread, read_thread],
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The page size of the database file in bytes: the one it was created
    /// with ([`SqliteConfig::page_size`] of the open that created it).
    pub fn page_size(&self) -> u32 {
        self.inner.page_size
    }

    /// Payload bytes this store has committed since it was opened (shared by
    /// its clones; a reopened file starts again at zero).
    ///
    /// Counted, per record appended and per snapshot written:
    /// - a body or snapshot state of at most 4 KiB, stored inline: its length;
    /// - a longer one, stored as content-defined pieces: the length of its
    ///   manifest (the list of piece ids) plus the length of every piece
    ///   that was newly inserted; a piece already stored for the same tree
    ///   (by an earlier record or snapshot, or earlier in the same body) is
    ///   not counted again.
    ///
    /// Not counted: row keys, sequence numbers, hashes, digests, the tree
    /// row (status, head, lease), SQLite's page, index and B-tree overhead,
    /// WAL frames and checkpoints (ask the operating system for those), and
    /// duplicate appends, which store nothing. Bytes are counted only once
    /// their group transaction has committed, before any of its writers is
    /// answered, so a read of the counter after an acknowledged write
    /// includes it; a group that rolled back counts nothing.
    pub fn bytes_written(&self) -> u64 {
        self.inner.written.load(Ordering::Acquire)
    }

    /// Write transactions this store has committed since it was opened
    /// (shared by its clones), as SQLite's commit hook on the writer's
    /// connection counts them: one per group commit, however many
    /// operations of however many trees it holds. Reads are not counted.
    /// For tests and benchmarks of what an operation costs.
    pub fn transactions(&self) -> u64 {
        self.inner.transactions.load(Ordering::Acquire)
    }

    /// Groups of writes that a task awaiting one of them applied on its
    /// own thread ([`CommitOn::Caller`]) since the store was opened
    /// (shared by its clones); the writer thread applied the others. A
    /// group is one transaction when it commits. For tests and benchmarks
    /// of where commits run.
    pub fn caller_groups(&self) -> u64 {
        self.inner.desk.caller_groups()
    }

    fn write<T: Send + 'static>(
        &self,
        make: impl FnOnce(Reply<T>) -> Write,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let (reply, answer) = oneshot::channel();
        // Queued now, in call order; committed when awaited (or by the
        // writer thread if the future is dropped unawaited).
        let ticket = self.inner.desk.submit(make(reply));
        Box::pin(async move {
            let Some(ticket) = ticket else {
                return Err(stopped());
            };
            ticket.commit();
            answer.await.unwrap_or_else(|_| Err(stopped()))
        })
    }

    fn read<T: Send + 'static>(
        &self,
        make: impl FnOnce(Reply<T>) -> Read,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let (reply, answer) = oneshot::channel();
        let sent = self
            .inner
            .reads
            .as_ref()
            .is_some_and(|queue| queue.send(make(reply)).is_ok());
        Box::pin(async move {
            if !sent {
                return Err(stopped());
            }
            answer.await.unwrap_or_else(|_| Err(stopped()))
        })
    }

    /// Every stored record of `tree` in order: its whole history when
    /// compaction is off, otherwise the records after its snapshot. For
    /// audit tools and tests.
    pub fn records(&self, tree: TreeId) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.read(|reply| Read::History(tree, reply))
    }

    /// Deletes trees whose status is `done` and whose last append is older
    /// than `older_than` (engine clock), with their records, snapshots and
    /// chunks. Returns how many trees were removed. Unfinished trees are
    /// never pruned.
    pub fn prune(&self, older_than: Timestamp) -> BoxFuture<'static, Result<usize, StoreError>> {
        self.write(|reply| Write::Prune(older_than, reply))
    }
}

/// Makes a new store at `path`, all at once: the database is built beside
/// it under a temporary name (schema, identity, WAL mode) and then linked
/// into place, which fails if a file appeared there meanwhile (another
/// process made the store first: it is then opened as it is). A crash in
/// between leaves a stray temporary file, never a half-made store at
/// `path`, which a later open would have to refuse as empty.
fn create(path: &Path, config: &SqliteConfig) -> Result<(), OpenError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "store".to_owned());
    let temporary = path.with_file_name(format!(
        ".{name}.creating-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let sqlite = |error: rusqlite::Error| open_error(path, error);
    let built = (|| {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn = Connection::open_with_flags(&temporary, flags).map_err(sqlite)?;
        conn.busy_timeout(config.busy_timeout).map_err(sqlite)?;
        // Only an empty database takes a page size; set before any table.
        conn.execute_batch(&format!("PRAGMA page_size = {}", config.page_size.bytes()))
            .map_err(sqlite)?;
        schema::migrate(&mut conn, 0).map_err(sqlite)?;
        let mode = schema::enable_wal(&conn).map_err(sqlite)?;
        if !mode.is_some_and(|mode| mode.eq_ignore_ascii_case("wal")) {
            return Err(OpenError::Sqlite {
                path: path.to_path_buf(),
                message: "the database refused WAL mode".into(),
            });
        }
        // Closing the only connection checkpoints the WAL into the file.
        conn.close().map_err(|(_, error)| sqlite(error))?;
        match std::fs::hard_link(&temporary, path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(error) => Err(OpenError::Path {
                path: path.to_path_buf(),
                reason: format!("cannot put the new store in place: {error}"),
            }),
        }
    })();
    for leftover in ["", "-wal", "-shm"] {
        let mut file = temporary.clone().into_os_string();
        file.push(leftover);
        let _ = std::fs::remove_file(file);
    }
    built
}

/// Refuses paths that cannot hold a database, with a clear reason, before
/// SQLite is asked.
fn check_path(path: &Path) -> Result<(), OpenError> {
    let refuse = |reason: &str| OpenError::Path {
        path: path.to_path_buf(),
        reason: reason.to_owned(),
    };
    if path.is_dir() {
        return Err(refuse("it is a directory"));
    }
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    match std::fs::metadata(parent) {
        Ok(metadata) if metadata.is_dir() => Ok(()),
        Ok(_) => Err(refuse("its parent is not a directory")),
        Err(error) => Err(refuse(&format!(
            "its parent directory is unusable: {error}"
        ))),
    }
}

fn open_error(path: &Path, error: rusqlite::Error) -> OpenError {
    let path = path.to_path_buf();
    match error.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => OpenError::NotADatabase {
            path,
            message: error.to_string(),
        },
        Some(ErrorCode::CannotOpen) => OpenError::Path {
            path,
            reason: error.to_string(),
        },
        _ => OpenError::Sqlite {
            path,
            message: error.to_string(),
        },
    }
}

/// Prepared statements a connection keeps: more than the store's writes
/// and reads use between them (rusqlite keeps 16 by default, fewer than
/// that, so a mix of writes would prepare some of them again).
const STATEMENTS_KEPT: usize = 64;

/// The reader thread: each read in its own read transaction.
fn read_loop(conn: &mut Connection, queue: &mpsc::Receiver<Read>) {
    while let Ok(read) = queue.recv() {
        match read {
            Read::Load(tree, reply) => {
                let _ = reply.send(in_read(conn, |c| db::load(c, tree, false)));
            }
            Read::Whole(tree, reply) => {
                let _ = reply.send(in_read(conn, |c| db::load(c, tree, true)));
            }
            Read::List(filter, reply) => {
                let _ = reply.send(in_read(conn, |c| db::list(c, &filter)));
            }
            Read::History(tree, reply) => {
                let _ = reply.send(in_read(conn, |c| db::history(c, tree)));
            }
            Read::Pending(tree, reply) => {
                let _ = reply.send(in_read(conn, |c| inbox::pending(c, tree)));
            }
            Read::Message(tree, id, reply) => {
                let _ = reply.send(in_read(conn, |c| inbox::message(c, tree, &id)));
            }
        }
    }
}

fn in_read<T>(
    conn: &mut Connection,
    read: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let tx = conn.transaction().map_err(db::storage)?;
    let value = read(&tx)?;
    tx.finish().map_err(db::storage)?;
    Ok(value)
}

impl Store for SqliteStore {
    fn acquire(&self, request: AcquireRequest) -> BoxFuture<'_, Result<Acquired, StoreError>> {
        self.write(|reply| Write::Acquire(request, reply))
    }

    fn create_tree(&self, create: CreateTree) -> BoxFuture<'_, Result<Created, StoreError>> {
        match db::NewTree::new(create, self.inner.pack_max) {
            Ok(new) => self.write(|reply| Write::Create(new, reply)),
            Err(refused) => Box::pin(std::future::ready(Err(refused))),
        }
    }

    fn load(&self, tree: TreeId) -> BoxFuture<'_, Result<TreeLoad, StoreError>> {
        self.read(|reply| Read::Load(tree, reply))
    }

    fn append(&self, batch: Vec<Append>) -> BoxFuture<'_, Result<Vec<AppendOutcome>, StoreError>> {
        self.write(|reply| Write::Append(batch, reply))
    }

    fn write_snapshot(
        &self,
        tree: TreeId,
        token: u64,
        snapshot: Snapshot,
    ) -> BoxFuture<'_, Result<AppendOutcome, StoreError>> {
        self.write(|reply| Write::Snapshot(tree, token, snapshot, reply))
    }

    fn renew(
        &self,
        tree: TreeId,
        token: u64,
        until: Timestamp,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        self.write(|reply| Write::Renew(tree, token, until, reply))
    }

    fn release(&self, tree: TreeId, token: u64) -> BoxFuture<'_, Result<(), StoreError>> {
        self.write(|reply| Write::Release(tree, token, reply))
    }

    fn list(&self, filter: ListFilter) -> BoxFuture<'_, Result<Listing, StoreError>> {
        self.read(|reply| Read::List(filter, reply))
    }

    fn history(&self, tree: TreeId) -> BoxFuture<'_, Result<TreeLoad, StoreError>> {
        self.read(|reply| Read::Whole(tree, reply))
    }

    fn changes(&self) -> BoxFuture<'_, Result<Option<Changes>, StoreError>> {
        let changes = self.inner.notices.subscribe(&self.inner.path).map(Some);
        Box::pin(std::future::ready(changes))
    }

    fn post(&self, message: Message) -> BoxFuture<'_, Result<PostOutcome, StoreError>> {
        self.write(|reply| Write::Post(message, reply))
    }

    fn pending(&self, tree: Option<TreeId>) -> BoxFuture<'_, Result<Vec<Message>, StoreError>> {
        self.read(|reply| Read::Pending(tree, reply))
    }

    fn settle(&self, settle: Settle) -> BoxFuture<'_, Result<SettleOutcome, StoreError>> {
        self.write(|reply| Write::Settle(settle, reply))
    }

    fn message(
        &self,
        tree: TreeId,
        id: MessageId,
    ) -> BoxFuture<'_, Result<Option<Posted>, StoreError>> {
        self.read(|reply| Read::Message(tree, id, reply))
    }
}
