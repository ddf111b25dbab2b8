//! The store a command opens: a SQLite file (`--store PATH`), or, in a
//! build with the `postgres` feature, a PostgreSQL database
//! (`--store postgres://USER@HOST:PORT/DATABASE`).

use std::path::Path;
use std::sync::Arc;

use baton::run::TreeId;
use baton::run::log::Record;
use baton::run::store::{Store, StoreError};
#[cfg(feature = "postgres")]
use baton::store::postgres::PostgresStore;
use baton::store::sqlite::SqliteStore;

use crate::error::CliError;

/// An opened store.
#[non_exhaustive]
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
    /// one (`create` is false), `start` creates the file or the tables.
    /// `missing` says how to get a store when there is none.
    pub(crate) fn open(location: &str, create: bool, missing: &str) -> Result<CliStore, CliError> {
        if is_url(location) {
            return open_postgres(location, create);
        }
        let path = Path::new(location);
        if !create && !path.exists() {
            return Err(CliError::NoStore {
                location: location.to_owned(),
                hint: missing.to_owned(),
            });
        }
        let opened = if create {
            SqliteStore::open_or_create(path)
        } else {
            SqliteStore::open(path)
        };
        opened
            .map(CliStore::Sqlite)
            .map_err(|error| CliError::StoreUnusable {
                location: location.to_owned(),
                message: error.to_string(),
            })
    }

    /// The store, as the engine sees it.
    pub fn shared(&self) -> Arc<dyn Store> {
        match self {
            CliStore::Sqlite(store) => Arc::new(store.clone()),
            #[cfg(feature = "postgres")]
            CliStore::Postgres(store) => Arc::new(store.clone()),
        }
    }

    /// What wakes a worker host's takeover loop early: the store's change
    /// notices (`Store::changes`; on PostgreSQL, `LISTEN`). A SQLite file
    /// is left to the loop's schedule: its notices of other processes'
    /// commits come from a timer of their own, and a scan on each would
    /// list the store many times a second while any engine writes.
    pub(crate) async fn wake(&self) -> Option<baton_server::WakeSource> {
        match self {
            CliStore::Sqlite(_) => None,
            #[cfg(feature = "postgres")]
            CliStore::Postgres(store) => match Store::changes(store).await {
                Ok(changes) => changes.map(baton_server::WakeSource::changes),
                Err(error) => {
                    eprintln!(
                        "warning: no change notices from the database ({error}); takeovers wait for the next scan"
                    );
                    None
                }
            },
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
fn open_postgres(url: &str, create: bool) -> Result<CliStore, CliError> {
    let opened = if create {
        PostgresStore::open_or_create(url)
    } else {
        PostgresStore::open(url)
    };
    // The error names the database without its password.
    opened
        .map(CliStore::Postgres)
        .map_err(|error| CliError::StoreUnusable {
            location: "(the PostgreSQL database)".to_owned(),
            message: error.to_string(),
        })
}

#[cfg(not(feature = "postgres"))]
fn open_postgres(_url: &str, _create: bool) -> Result<CliStore, CliError> {
    Err(CliError::argument(
        "this command line was built without PostgreSQL: build it with the `postgres` feature of baton-cli (for `baton`: `cargo build --release -p baton-cli --features postgres`) to use a postgres:// store",
    ))
}
