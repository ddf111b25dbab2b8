//! The stores the workloads run on: [`StoreKind`] names one, and a
//! [`BenchStore`] is the fresh store of one run (a `MemoryStore` keeping its
//! history, or a `SqliteStore` in a temporary directory of its own).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};
use baton::run::store::{ListFilter, Store};
use baton::run::{EngineConfig, MemoryStore, Program};
use baton::store::sqlite::SqliteStore;

/// A store the workloads run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// `MemoryStore::keeping_history()`.
    Memory,
    /// A `SqliteStore` in a fresh temporary directory, durable commits on.
    Sqlite,
}

impl StoreKind {
    /// Both stores, in the order they run.
    pub const ALL: [StoreKind; 2] = [StoreKind::Memory, StoreKind::Sqlite];

    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Sqlite => "sqlite",
        }
    }

    pub fn parse(name: &str) -> Option<StoreKind> {
        StoreKind::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// A directory of its own under the system's temporary directory, removed
/// with everything in it when dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
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
        self.0.join("bench.db")
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
}

/// A store for one run: a fresh `MemoryStore` keeping its history, or a
/// `SqliteStore` in a fresh temporary directory that goes away with it.
pub struct BenchStore {
    pub kind: StoreKind,
    backend: Backend,
    /// The SQLite file's directory. Declared after the store, so the store
    /// handle is closed before the directory is removed.
    dir: Option<TempDir>,
}

impl BenchStore {
    /// A new, empty store of `kind`.
    pub fn fresh(kind: StoreKind) -> Result<BenchStore> {
        Ok(match kind {
            StoreKind::Memory => BenchStore {
                kind,
                backend: Backend::Memory(MemoryStore::keeping_history()),
                dir: None,
            },
            StoreKind::Sqlite => {
                let dir = TempDir::new()?;
                let store = SqliteStore::create(dir.database())?;
                BenchStore {
                    kind,
                    backend: Backend::Sqlite(store),
                    dir: Some(dir),
                }
            }
        })
    }

    /// Opens an existing SQLite file (whose directory someone else owns).
    pub fn open_sqlite(path: &Path) -> Result<BenchStore> {
        Ok(BenchStore {
            kind: StoreKind::Sqlite,
            backend: Backend::Sqlite(SqliteStore::open(path)?),
            dir: None,
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
        }
    }

    /// The memory store, to read its records.
    pub fn memory(&self) -> Option<&MemoryStore> {
        match &self.backend {
            Backend::Memory(store) => Some(store),
            Backend::Sqlite(_) => None,
        }
    }

    /// Payload bytes written to the store so far: on memory, the bodies of
    /// every stored record; on SQLite, `SqliteStore::bytes_written`.
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
        }
    }

    /// Closes this handle and hands over the SQLite file's directory, so the
    /// file can be reopened (by another process) before it is removed.
    pub fn close(self) -> Option<TempDir> {
        let BenchStore { backend, dir, .. } = self;
        drop(backend);
        dir
    }
}
