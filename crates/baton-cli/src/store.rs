//! The store a command opens: a SQLite file (`--store PATH`), or, in a
//! build with the `postgres` feature, a PostgreSQL database
//! (`--store postgres://USER@HOST:PORT/DATABASE`).

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use baton::run::TreeId;
use baton::run::log::Record;
use baton::run::store::{Store, StoreError};
#[cfg(feature = "postgres")]
use baton::store::postgres::PostgresStore;
use baton::store::sqlite::SqliteStore;

/// An opened store.
pub enum CliStore {
    /// A SQLite file.
    Sqlite(SqliteStore),
    /// A PostgreSQL database.
    #[cfg(feature = "postgres")]
    Postgres(PostgresStore),
}

/// Whether `--store` names a PostgreSQL database rather than a file.
fn is_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

impl CliStore {
    /// Opens the store at `location`; commands that only read never create
    /// one (`create` is false), the demo creates the file or the tables.
    pub fn open(location: &str, create: bool) -> Result<CliStore> {
        if is_url(location) {
            return open_postgres(location, create);
        }
        let path = Path::new(location);
        if !create && !path.exists() {
            bail!("no store at {location} (run `baton demo` first, or pass --store)");
        }
        let opened = if create {
            SqliteStore::open_or_create(path)
        } else {
            SqliteStore::open(path)
        };
        Ok(CliStore::Sqlite(opened.with_context(|| {
            format!("cannot open the store {location}")
        })?))
    }

    /// The store, as the engine sees it.
    pub fn shared(&self) -> Arc<dyn Store> {
        match self {
            CliStore::Sqlite(store) => Arc::new(store.clone()),
            #[cfg(feature = "postgres")]
            CliStore::Postgres(store) => Arc::new(store.clone()),
        }
    }

    /// Every stored record of `tree` (those after the snapshot when the
    /// store compacts).
    pub async fn records(&self, tree: TreeId) -> Result<Vec<Record>, StoreError> {
        match self {
            CliStore::Sqlite(store) => store.records(tree).await,
            #[cfg(feature = "postgres")]
            CliStore::Postgres(store) => store.records(tree).await,
        }
    }
}

#[cfg(feature = "postgres")]
fn open_postgres(url: &str, create: bool) -> Result<CliStore> {
    let opened = if create {
        PostgresStore::open_or_create(url)
    } else {
        PostgresStore::open(url)
    };
    // The error names the database without its password.
    Ok(CliStore::Postgres(opened.context("cannot open the store")?))
}

#[cfg(not(feature = "postgres"))]
fn open_postgres(_url: &str, _create: bool) -> Result<CliStore> {
    bail!(
        "this baton was built without PostgreSQL: build it with `cargo build --release -p baton-cli --features postgres` to use a postgres:// store"
    )
}
