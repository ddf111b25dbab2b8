//! # baton-store-postgres: the shared durable Baton store
//!
//! Owns [`PostgresStore`], the implementation of the kernel's [`Store`]
//! contract on PostgreSQL: every tree's hash-chained log, its latest
//! snapshot, its writer lease and fencing token, in one database that many
//! engines on many machines share. The database is the one authority: what
//! an append acknowledges is committed there, and which engine may write a
//! tree is decided there, on its clock.
//!
//! Depend on it through the facade (`baton::store::postgres`, feature
//! `postgres`), or directly when writing tools around a store. It depends
//! only on `baton-run`; it knows nothing of programs, teams, workflows or
//! models: record bodies are opaque bytes to it, and it never decodes them.
//!
//! ## How it works
//!
//! - **One writer connection, group commit.** Every write (acquire, append,
//!   snapshot, renew, release, prune) is queued to one task that drains the
//!   queue and applies everything waiting (appends of many trees from many
//!   of the engine's tasks) in one transaction, then answers each caller
//!   with its own outcome after `COMMIT` returned. A group locks the rows of
//!   the trees it touches in tree-id order (`SELECT … FOR UPDATE`), so
//!   writers in other processes serialize per tree and never deadlock; if a
//!   group fails on a statement of its own, its writes are retried one per
//!   transaction, so one bad write cannot fail its neighbours.
//! - **Compare-and-swap and fencing** exactly as `MemoryStore` and
//!   `SqliteStore`, checked on the locked row in the same transaction as the
//!   insert: an append is `Fenced` unless its token is the current lease's,
//!   a `Duplicate` if its records are exactly the committed ones at those
//!   sequences, and a `Conflict` if it does not extend the head.
//! - **Leases on the database's clock** ([`LeaseClock::Database`], the
//!   default): whether a lease is live is decided by `now()` in the
//!   statement that asks, never by the engine's clock, so engines whose
//!   clocks disagree still never hold a live lease twice. Fencing tokens
//!   come from one sequence and strictly increase per tree. A live lease is
//!   never granted again without `force`, not even to its own owner.
//! - **A lost connection reports nothing committed that is not.** If the
//!   connection fails during a group (the server restarts, an operator
//!   runs `pg_terminate_backend`), every caller of the group gets
//!   [`StoreError::Unavailable`]; the engine stops those trees' writers,
//!   and recovering them reads what the database holds. The next call gets
//!   a fresh connection from the pool.
//! - **Reads** (`load`, `history`, `list`, [`PostgresStore::records`]) run
//!   on a pool of connections, each in a repeatable-read transaction, so
//!   they see one committed state; their queries are pipelined.
//! - **Content-addressed pieces.** A body or snapshot state longer than
//!   4 KiB is cut into content-defined pieces (about 2.5 KiB on average);
//!   each piece is stored once per tree under its blake3 digest and the row
//!   keeps a manifest of digests, so a step that edits a few bytes of a
//!   large state writes the pieces around the edit and a manifest. The
//!   writer remembers each recently written tree's last few cuts under the
//!   fencing token they were written with, so the next body appended under
//!   the same token finds the pieces it shares with any of them by
//!   comparison and sends only the others (nobody else can change a
//!   tree's pieces while its token is current). The writer forgets a tree
//!   before any transaction that releases it, and every tree before a
//!   prune; before one that snapshots it, it takes the tree's cuts out of
//!   its memory to cut the state of its first snapshot by, and keeps only the
//!   snapshot's own cut once that transaction (and its compaction)
//!   committed.
//! - **Snapshots and compaction.** [`PostgresConfig::compact`] (default on)
//!   deletes the records a snapshot covers and the pieces nothing
//!   references any more; the snapshot keeps the chain head it covers.
//! - **Change notices.** Every commit that appends to a tree or releases a
//!   lease sends `NOTIFY baton_changes` with the tree's id and scope (sent
//!   by the server only if the transaction commits);
//!   [`PostgresStore::listen`] subscribes to them through a dedicated
//!   connection that connects again when lost.
//! - **Schema** is versioned in the table `baton_schema`; migrations are
//!   owned here and run at open under an advisory lock. A store of a newer
//!   schema, or a database holding tables that are not a Baton store's, is
//!   refused with an [`OpenError`] before anything is written.
//!
//! [`admin`] creates and drops databases on a server, for provisioning
//! scripts, benchmarks and tests.
//!
//! Connections use no TLS: run engines and the database on a trusted
//! network, or connect through a local TLS proxy.
//!
//! No cargo features.

pub mod admin;
mod chunk;
mod config;
mod error;
mod inbox;
mod listen;
mod read;
mod rows;
mod schema;
mod write;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use baton_run::log::{Record, Snapshot};
use baton_run::store::{
    AcquireRequest, Acquired, Append, AppendOutcome, Changes, CreateTree, Created, ListFilter,
    Listing, Message, MessageId, PostOutcome, Posted, Settle, SettleOutcome, Store, StoreError,
    TreeLoad,
};
use baton_run::{BoxFuture, Timestamp, TreeId};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::IsolationLevel;
use tokio_postgres::NoTls;

pub use crate::config::{Creation, LeaseClock, PostgresConfig};
pub use crate::error::OpenError;
pub use crate::listen::{Listener, Notice};

use crate::config::Target;
use crate::error::{connection_lost, pool, storage};
use crate::listen::Hub;
use crate::write::{Reply, Settings, Write};

/// The schema version this build reads and writes.
pub const SCHEMA_VERSION: i64 = schema::CURRENT;

/// The channel every commit that appends to a tree or releases a lease
/// notifies (`NOTIFY baton_changes, '<tree> <scope>'`).
pub const CHANNEL: &str = "baton_changes";

/// A read, answered on a pooled connection.
enum Read {
    Load(TreeId, Reply<TreeLoad>),
    Whole(TreeId, Reply<TreeLoad>),
    Records(TreeId, Reply<Vec<Record>>),
    List(ListFilter, Reply<Listing>),
    Inbox(inbox::Op),
}

struct Inner {
    target: String,
    /// Payload bytes committed so far; see [`PostgresStore::bytes_written`].
    written: Arc<AtomicU64>,
    writes: Option<mpsc::UnboundedSender<Write>>,
    reads: Option<mpsc::UnboundedSender<Read>>,
    listens: Option<mpsc::UnboundedSender<oneshot::Sender<Result<Listener, StoreError>>>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the queues lets the writer commit what is queued and the
        // readers finish; then the store's thread closes its connections
        // and exits.
        self.writes.take();
        self.reads.take();
        self.listens.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The shared durable store: one PostgreSQL database, many engines.
/// Cloning shares the same connections; they close when the last clone is
/// dropped.
///
/// The store runs its connections on a thread of its own (with its own
/// tokio runtime), so it can be opened and used from any runtime, or from
/// none.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("target", &self.inner.target)
            .finish_non_exhaustive()
    }
}

/// Sends the request `make` builds to `queue` (`None` once the store is
/// closed) and awaits its answer; a closed queue or a dropped answer is
/// the store having stopped.
fn ask<T: Send + 'static, M>(
    queue: Option<&mpsc::UnboundedSender<M>>,
    make: impl FnOnce(Reply<T>) -> M,
) -> BoxFuture<'static, Result<T, StoreError>> {
    let (reply, answer) = oneshot::channel();
    let sent = queue.is_some_and(|queue| queue.send(make(reply)).is_ok());
    Box::pin(async move {
        if !sent {
            return Err(stopped());
        }
        answer.await.unwrap_or_else(|_| Err(stopped()))
    })
}

fn stopped() -> StoreError {
    StoreError::unavailable("postgres store: its connections have stopped")
}

impl PostgresStore {
    /// Opens the existing store in the database at `url` with the default
    /// configuration.
    pub fn open(url: impl Into<String>) -> Result<PostgresStore, OpenError> {
        PostgresStore::open_with(PostgresConfig::new(url))
    }

    /// Creates a new store in the (empty) database at `url`.
    pub fn create(url: impl Into<String>) -> Result<PostgresStore, OpenError> {
        PostgresStore::open_with(PostgresConfig {
            creation: Creation::New,
            ..PostgresConfig::new(url)
        })
    }

    /// Opens the store in the database at `url`, creating its tables when
    /// the database holds none.
    pub fn open_or_create(url: impl Into<String>) -> Result<PostgresStore, OpenError> {
        PostgresStore::open_with(PostgresConfig {
            creation: Creation::ExistingOrNew,
            ..PostgresConfig::new(url)
        })
    }

    /// Opens (or, as `config.creation` allows, creates) the store.
    ///
    /// Validates the configuration, connects, and checks the database
    /// before anything is written: it must be a Baton store of a schema this
    /// build understands (migrated if older), or, when creation is allowed,
    /// hold no tables at all. Blocks the calling thread until then (at most
    /// about the connect timeout when the server does not answer).
    pub fn open_with(config: PostgresConfig) -> Result<PostgresStore, OpenError> {
        let target = config.validate()?;
        let shown = target.shown.clone();
        let written = Arc::new(AtomicU64::new(0));
        let (writes, write_queue) = mpsc::unbounded_channel();
        let (reads, read_queue) = mpsc::unbounded_channel();
        let (listens, listen_queue) = mpsc::unbounded_channel();
        let (opened, outcome) = std::sync::mpsc::channel();
        let settings = Settings {
            compact: config.compact,
            max_batch: config.max_batch,
            clock: config.lease_clock,
            written: written.clone(),
        };
        let service = Service {
            target,
            creation: config.creation,
            read_connections: config.read_connections,
            settings,
        };
        let thread = std::thread::Builder::new()
            .name("baton-postgres".to_owned())
            .spawn(move || service.run(opened, write_queue, read_queue, listen_queue))
            .map_err(|error| OpenError::Thread(error.to_string()))?;
        match outcome.recv() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                let _ = thread.join();
                return Err(error);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(OpenError::Thread(
                    "the store's thread stopped while opening".to_owned(),
                ));
            }
        }
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                target: shown,
                written,
                writes: Some(writes),
                reads: Some(reads),
                listens: Some(listens),
                thread: Some(thread),
            }),
        })
    }

    /// The database, as `postgres://USER@HOST:PORT/DATABASE` (never with its
    /// password).
    pub fn target(&self) -> &str {
        &self.inner.target
    }

    /// Payload bytes this store handle has committed since it was opened
    /// (shared by its clones; counted as `SqliteStore::bytes_written` counts
    /// them).
    ///
    /// Counted, per record appended and per snapshot written: a body or
    /// snapshot state of at most 4 KiB, stored inline: its length; a longer
    /// one: the length of its manifest (32 bytes per piece) plus the length
    /// of every piece that was newly inserted for the tree. Not counted:
    /// keys, sequence numbers, hashes, the tree row, PostgreSQL's tuple,
    /// index, TOAST and WAL overhead, and duplicate appends. Bytes are
    /// counted only once their group transaction has committed, before any
    /// of its writers is answered.
    pub fn bytes_written(&self) -> u64 {
        self.inner.written.load(Ordering::Acquire)
    }

    fn write<T: Send + 'static>(
        &self,
        make: impl FnOnce(Reply<T>) -> Write,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        ask(self.inner.writes.as_ref(), make)
    }

    fn read<T: Send + 'static>(
        &self,
        make: impl FnOnce(Reply<T>) -> Read,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        ask(self.inner.reads.as_ref(), make)
    }

    /// Every stored record of `tree` in order: its whole history when
    /// compaction is off, otherwise the records after its snapshot. For
    /// audit tools and tests.
    pub fn records(&self, tree: TreeId) -> BoxFuture<'static, Result<Vec<Record>, StoreError>> {
        self.read(|reply| Read::Records(tree, reply))
    }

    /// Deletes trees whose status is `done` and whose last append is older
    /// than `older_than` (engine clock, as recorded in each append's
    /// metadata), with their records, snapshots and pieces. Returns how many
    /// trees were removed. Unfinished trees are never pruned.
    pub fn prune(&self, older_than: Timestamp) -> BoxFuture<'static, Result<usize, StoreError>> {
        self.write(|reply| Write::Prune(older_than, reply))
    }

    /// Subscribes to the change notices of every engine sharing this
    /// database: each commit that appends to a tree or releases a lease.
    ///
    /// The first call opens the store's listening connection (which
    /// connects again whenever it is lost, with a [`Notice::Missed`]); the
    /// returned future resolves once `LISTEN` took effect, so every commit
    /// after it is noticed. Fails with `Unavailable` if the listening
    /// connection cannot be opened.
    pub fn listen(&self) -> BoxFuture<'static, Result<Listener, StoreError>> {
        let (reply, answer) = oneshot::channel();
        let sent = self
            .inner
            .listens
            .as_ref()
            .is_some_and(|queue| queue.send(reply).is_ok());
        Box::pin(async move {
            if !sent {
                return Err(stopped());
            }
            answer.await.unwrap_or_else(|_| Err(stopped()))
        })
    }
}

/// What the store's thread runs: the schema check, then the writer, the
/// readers and the listener on its own runtime.
struct Service {
    target: Target,
    creation: Creation,
    read_connections: usize,
    settings: Settings,
}

type ListenQueue = mpsc::UnboundedReceiver<oneshot::Sender<Result<Listener, StoreError>>>;

impl Service {
    fn run(
        self,
        opened: std::sync::mpsc::Sender<Result<(), OpenError>>,
        write_queue: mpsc::UnboundedReceiver<Write>,
        read_queue: mpsc::UnboundedReceiver<Read>,
        listen_queue: ListenQueue,
    ) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                let _ = opened.send(Err(OpenError::Thread(error.to_string())));
                return;
            }
        };
        runtime.block_on(async move {
            let pools = match self.open().await {
                Ok(pools) => pools,
                Err(error) => {
                    let _ = opened.send(Err(error));
                    return;
                }
            };
            let _ = opened.send(Ok(()));
            let (writer_pool, reader_pool) = pools;
            let listener = self.target.named("listener");
            let writer = tokio::spawn(write::write_loop(writer_pool, write_queue, self.settings));
            let readers = tokio::spawn(read_loop(reader_pool, read_queue));
            let listens = tokio::spawn(listen_loop(listener, listen_queue));
            // The writer ends once every handle is dropped and its queue is
            // drained; the readers once their reads are answered.
            let _ = writer.await;
            let _ = readers.await;
            let _ = listens.await;
        });
    }

    /// Checks (and creates or migrates) the schema on a connection of its
    /// own, then makes the pools.
    async fn open(&self) -> Result<(Pool, Pool), OpenError> {
        let target = &self.target;
        let (mut client, connection) =
            target.named("open").connect(NoTls).await.map_err(|error| {
                OpenError::from_postgres(&target.shown, target.database(), error)
            })?;
        let driver = tokio::spawn(connection);
        let checked =
            schema::open(&mut client, self.creation, &target.shown, target.database()).await;
        drop(client);
        let _ = driver.await;
        checked?;
        let make = |role: &str, size: usize| {
            let manager = Manager::from_config(
                target.named(role),
                NoTls,
                ManagerConfig {
                    recycling_method: RecyclingMethod::Fast,
                },
            );
            Pool::builder(manager)
                .max_size(size)
                .build()
                .map_err(|error| OpenError::Thread(error.to_string()))
        };
        Ok((make("writer", 1)?, make("reader", self.read_connections)?))
    }
}

/// Answers each read on a task of its own (the pool bounds how many run at
/// once) until the store is dropped and every read is answered.
async fn read_loop(pool: Pool, mut queue: mpsc::UnboundedReceiver<Read>) {
    let mut running = tokio::task::JoinSet::new();
    while let Some(read) = queue.recv().await {
        let pool = pool.clone();
        running.spawn(async move {
            match read {
                Read::Load(tree, reply) => {
                    let _ = reply
                        .send(reading(&pool, |tx| Box::pin(read::load(tx, tree, false))).await);
                }
                Read::Whole(tree, reply) => {
                    let _ =
                        reply.send(reading(&pool, |tx| Box::pin(read::load(tx, tree, true))).await);
                }
                Read::Records(tree, reply) => {
                    let _ =
                        reply.send(reading(&pool, |tx| Box::pin(read::records(tx, tree))).await);
                }
                Read::Inbox(op) => inbox::run(&pool, op).await,
                Read::List(filter, reply) => {
                    let _ = reply.send(
                        reading(&pool, |tx| {
                            let filter = filter.clone();
                            Box::pin(async move { read::list(tx, &filter).await })
                        })
                        .await,
                    );
                }
            }
        });
        // Forget the reads already answered.
        while running.try_join_next().is_some() {}
    }
    while running.join_next().await.is_some() {}
}

/// A read in a repeatable-read, read-only transaction; run again once on a
/// fresh connection if the connection was lost (a read changes nothing).
async fn reading<T>(
    pool: &Pool,
    read: impl for<'a> Fn(
        &'a deadpool_postgres::Transaction<'a>,
    ) -> BoxFuture<'a, Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let mut last = None;
    for _ in 0..2 {
        let mut client = pool.get().await.map_err(pool_error)?;
        let tx = match client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
        {
            Ok(tx) => tx,
            Err(error) if connection_lost(&error) => {
                last = Some(storage(error));
                continue;
            }
            Err(error) => return Err(storage(error)),
        };
        let value = read(&tx).await;
        match value {
            Ok(value) => {
                tx.commit().await.map_err(storage)?;
                return Ok(value);
            }
            Err(error) if client_is_closed(&tx) && error.retryable() => {
                last = Some(error);
            }
            Err(error) => return Err(error),
        }
    }
    Err(last.unwrap_or_else(stopped))
}

fn client_is_closed(tx: &deadpool_postgres::Transaction<'_>) -> bool {
    tx.client().is_closed()
}

fn pool_error(error: deadpool_postgres::PoolError) -> StoreError {
    pool(error)
}

/// Answers `listen` calls; the hub starts the listening connection.
async fn listen_loop(settings: tokio_postgres::Config, mut queue: ListenQueue) {
    let mut hub = Hub::new();
    while let Some(reply) = queue.recv().await {
        hub.subscribe(&settings, reply);
    }
}

impl Store for PostgresStore {
    fn acquire(&self, request: AcquireRequest) -> BoxFuture<'_, Result<Acquired, StoreError>> {
        self.write(|reply| Write::Acquire(request, reply))
    }

    fn create_tree(&self, create: CreateTree) -> BoxFuture<'_, Result<Created, StoreError>> {
        self.write(|reply| Write::Create(create, reply))
    }

    fn load(&self, tree: TreeId) -> BoxFuture<'_, Result<TreeLoad, StoreError>> {
        self.read(|reply| Read::Load(tree, reply))
    }

    fn history(&self, tree: TreeId) -> BoxFuture<'_, Result<TreeLoad, StoreError>> {
        self.read(|reply| Read::Whole(tree, reply))
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

    fn changes(&self) -> BoxFuture<'_, Result<Option<Changes>, StoreError>> {
        let listening = self.listen();
        Box::pin(async move { Ok(Some(listening.await?.into_changes())) })
    }

    fn post(&self, message: Message) -> BoxFuture<'_, Result<PostOutcome, StoreError>> {
        self.read(|reply| Read::Inbox(inbox::Op::Post(message, reply)))
    }

    fn pending(&self, tree: Option<TreeId>) -> BoxFuture<'_, Result<Vec<Message>, StoreError>> {
        self.read(|reply| Read::Inbox(inbox::Op::Pending(tree, reply)))
    }

    fn settle(&self, settle: Settle) -> BoxFuture<'_, Result<SettleOutcome, StoreError>> {
        self.read(|reply| Read::Inbox(inbox::Op::Settle(settle, reply)))
    }

    fn message(
        &self,
        tree: TreeId,
        id: MessageId,
    ) -> BoxFuture<'_, Result<Option<Posted>, StoreError>> {
        self.read(|reply| Read::Inbox(inbox::Op::Message(tree, id, reply)))
    }
}
