//! The stores the workloads run on: [`StoreKind`] names one, and a
//! [`BenchStore`] is the fresh store of one run (a `MemoryStore` keeping its
//! history, a `SqliteStore` in a temporary directory of its own, or a
//! `PostgresStore` in a database of its own on the server `--store
//! postgres=URL` names, dropped afterwards).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};
use baton::run::store::{ListFilter, Store};
use baton::run::{EngineConfig, MemoryStore, Program};
use baton::store::postgres::{PostgresConfig, PostgresStore, admin};
use baton::store::sqlite::{CommitOn, Creation, PageSize, SqliteConfig, SqliteStore};

/// A store the workloads run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// `MemoryStore::keeping_history()`.
    Memory,
    /// A `SqliteStore` in a fresh temporary directory, durable commits on.
    Sqlite,
    /// A `PostgresStore` in a fresh database on the server of
    /// [`postgres_server`]; only when asked for.
    Postgres,
}

/// The PostgreSQL server when `--store postgres` names none.
pub const POSTGRES_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/postgres";

static POSTGRES_SERVER: OnceLock<String> = OnceLock::new();

/// Sets the server `postgres` runs on (once, from the command line).
pub fn set_postgres_server(url: &str) {
    let _ = POSTGRES_SERVER.set(url.to_owned());
}

static SQLITE_PAGE_SIZE: OnceLock<PageSize> = OnceLock::new();

/// Sets the page size of new SQLite stores (once, from the command line).
pub fn set_sqlite_page_size(size: PageSize) {
    let _ = SQLITE_PAGE_SIZE.set(size);
}

/// The page size of new SQLite stores and of the commit floor's database:
/// `--page-size`, or a new store's default.
pub fn sqlite_page_size() -> PageSize {
    SQLITE_PAGE_SIZE.get().copied().unwrap_or_default()
}

static SQLITE_COMMIT_ON: OnceLock<CommitOn> = OnceLock::new();

/// Sets who commits new SQLite stores' writes (once, from the command line).
pub fn set_sqlite_commit_on(commit_on: CommitOn) {
    let _ = SQLITE_COMMIT_ON.set(commit_on);
}

/// Who commits new SQLite stores' writes: `--commit-on`, or the default.
pub fn sqlite_commit_on() -> CommitOn {
    SQLITE_COMMIT_ON.get().copied().unwrap_or_default()
}

/// The server `postgres` runs on: a database there that the bench may
/// connect to, to create and drop a database of its own per run.
pub fn postgres_server() -> &'static str {
    POSTGRES_SERVER
        .get()
        .map_or(POSTGRES_DEFAULT, String::as_str)
}

impl StoreKind {
    /// The stores that run when none is named, in that order (PostgreSQL
    /// needs a server, so it runs only when named).
    pub const ALL: [StoreKind; 2] = [StoreKind::Memory, StoreKind::Sqlite];

    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Sqlite => "sqlite",
            StoreKind::Postgres => "postgres",
        }
    }

    /// A store as named on the command line: `memory`, `sqlite`,
    /// `postgres` or `postgres=URL` (with the server's URL).
    pub fn parse(name: &str) -> Option<(StoreKind, Option<String>)> {
        if let Some(url) = name.strip_prefix("postgres=") {
            return (!url.is_empty()).then(|| (StoreKind::Postgres, Some(url.to_owned())));
        }
        [StoreKind::Memory, StoreKind::Sqlite, StoreKind::Postgres]
            .into_iter()
            .find(|s| s.name() == name)
            .map(|kind| (kind, None))
    }

    /// The store as a worker process is told it.
    pub fn spec(self) -> String {
        match self {
            StoreKind::Postgres => format!("postgres={}", postgres_server()),
            other => other.name().to_owned(),
        }
    }
}

/// Which durable store a `--resume-phase2` locator names: PostgreSQL
/// connection settings, or else a SQLite file's path.
pub fn kind_of(locator: &str) -> StoreKind {
    if locator.starts_with("postgres") || locator.contains("dbname=") {
        StoreKind::Postgres
    } else {
        StoreKind::Sqlite
    }
}

/// A database of its own on the PostgreSQL server, dropped with everything
/// in it when dropped.
#[derive(Debug)]
pub struct Database {
    name: String,
    url: String,
}

impl Database {
    /// A new, empty database on the server of [`postgres_server`].
    pub fn new() -> Result<Database> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "baton_bench_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let server = postgres_server();
        admin::drop_database(server, &name)?;
        let url = admin::create_database(server, &name)
            .with_context(|| format!("cannot create a bench database on {server}"))?;
        Ok(Database { name, url })
    }

    /// Its connection settings.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let _ = admin::drop_database(postgres_server(), &self.name);
    }
}

/// What a closed bench store hands over, so another process can open it
/// before it is removed.
#[derive(Debug)]
pub enum Handover {
    /// The SQLite file's directory.
    Sqlite(TempDir),
    /// The PostgreSQL database.
    Postgres(Database),
}

impl Handover {
    /// Where the store is: the SQLite file's path, or the database's
    /// connection settings.
    pub fn locator(&self) -> String {
        match self {
            Handover::Sqlite(dir) => dir.database().display().to_string(),
            Handover::Postgres(database) => database.url().to_owned(),
        }
    }
}

/// A directory of its own under the system's temporary directory, removed
/// with everything in it when dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new, empty directory under the system's temporary directory.
    pub fn new() -> Result<TempDir> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "baton-bench-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(TempDir(path))
    }

    /// The bench's SQLite file in this directory.
    pub fn database(&self) -> PathBuf {
        self.file("bench.db")
    }

    /// The file `name` in this directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The store behind a [`BenchStore`].
enum Backend {
    Memory(MemoryStore),
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
}

/// A store for one run: a fresh `MemoryStore` keeping its history, or a
/// `SqliteStore` in a fresh temporary directory that goes away with it.
pub struct BenchStore {
    pub kind: StoreKind,
    backend: Backend,
    /// The SQLite file's directory or the PostgreSQL database. Declared
    /// after the store, so the store handle is closed before it is removed.
    place: Option<Handover>,
}

impl BenchStore {
    /// A new, empty store of `kind`.
    pub fn fresh(kind: StoreKind) -> Result<BenchStore> {
        Ok(match kind {
            StoreKind::Memory => BenchStore {
                kind,
                backend: Backend::Memory(MemoryStore::keeping_history()),
                place: None,
            },
            StoreKind::Sqlite => {
                let dir = TempDir::new()?;
                let store = SqliteStore::open_with(
                    dir.database(),
                    SqliteConfig {
                        creation: Creation::New,
                        page_size: sqlite_page_size(),
                        commit_on: sqlite_commit_on(),
                        ..SqliteConfig::default()
                    },
                )?;
                BenchStore {
                    kind,
                    backend: Backend::Sqlite(store),
                    place: Some(Handover::Sqlite(dir)),
                }
            }
            StoreKind::Postgres => {
                let database = Database::new()?;
                let store = PostgresStore::create(database.url())?;
                BenchStore {
                    kind,
                    backend: Backend::Postgres(store),
                    place: Some(Handover::Postgres(database)),
                }
            }
        })
    }

    /// Opens an existing store (whose file or database someone else owns)
    /// at `locator`: PostgreSQL connection settings, or a SQLite file's path.
    pub fn open(locator: &str) -> Result<BenchStore> {
        if kind_of(locator) == StoreKind::Postgres {
            return Ok(BenchStore {
                kind: StoreKind::Postgres,
                backend: Backend::Postgres(PostgresStore::open_with(PostgresConfig::new(locator))?),
                place: None,
            });
        }
        Ok(BenchStore {
            kind: StoreKind::Sqlite,
            backend: Backend::Sqlite(SqliteStore::open(Path::new(locator))?),
            place: None,
        })
    }

    /// An engine configuration with the defaults over this store, running
    /// `program`.
    pub fn config(&self, program: Program) -> EngineConfig {
        EngineConfig {
            programs: vec![program],
            ..EngineConfig::new(self.store())
        }
    }

    /// The store, as the engine sees it.
    pub fn store(&self) -> Arc<dyn Store> {
        match &self.backend {
            Backend::Memory(store) => Arc::new(store.clone()),
            Backend::Sqlite(store) => Arc::new(store.clone()),
            Backend::Postgres(store) => Arc::new(store.clone()),
        }
    }

    /// The memory store, to read its records.
    pub fn memory(&self) -> Option<&MemoryStore> {
        match &self.backend {
            Backend::Memory(store) => Some(store),
            Backend::Sqlite(_) | Backend::Postgres(_) => None,
        }
    }

    /// Payload bytes written to the store so far: on memory, the bodies of
    /// every stored record; on SQLite and PostgreSQL, the store's
    /// `bytes_written` (counted the same way).
    pub async fn bytes_written(&self) -> Result<u64> {
        match &self.backend {
            Backend::Memory(store) => {
                let trees = store.list(ListFilter::default()).await?.trees;
                Ok(trees
                    .iter()
                    .flat_map(|meta| store.records(meta.tree))
                    .map(|record| record.body.len() as u64)
                    .sum())
            }
            Backend::Sqlite(store) => Ok(store.bytes_written()),
            Backend::Postgres(store) => Ok(store.bytes_written()),
        }
    }

    /// Closes this handle and hands over the SQLite file's directory or the
    /// PostgreSQL database, so the store can be reopened (by another
    /// process) before it is removed.
    pub fn close(self) -> Option<Handover> {
        let BenchStore { backend, place, .. } = self;
        drop(backend);
        place
    }
}
