//! Why a store could not be opened, and how a PostgreSQL failure becomes a
//! classified [`StoreError`].

use baton_run::store::StoreError;
use tokio_postgres::error::SqlState;

/// Why a store could not be opened. Nothing in the database was changed.
///
/// Each error converts into a [`StoreError`] of the right kind: a server
/// that cannot be reached is `Unavailable` (retrying later may help); a bad
/// URL or setting, refused credentials, a missing database, another
/// application's tables or a newer schema are `Refused` (an operator must
/// act first).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// A setting of the [`PostgresConfig`](crate::PostgresConfig) is out of range.
    #[error("invalid postgres store configuration: {field} {reason}")]
    Config {
        /// The setting, as named in `PostgresConfig`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The URL does not read as connection settings.
    #[error(
        "cannot read the PostgreSQL URL: {message}; write it as postgres://USER@HOST:PORT/DATABASE"
    )]
    Url {
        /// What is wrong with it.
        message: String,
    },
    /// No server answered at the address (refused, timed out, unknown host).
    #[error(
        "cannot reach PostgreSQL at {target}: {message}; check that the server runs and that the URL's host and port are right"
    )]
    Unreachable {
        /// The database, without its password.
        target: String,
        /// What the connection attempt reported.
        message: String,
    },
    /// The server refused the credentials.
    #[error(
        "PostgreSQL at {target} refused the login: {message}; check the user and password in the URL and the server's pg_hba.conf"
    )]
    Login {
        /// The database, without its password.
        target: String,
        /// The server's message.
        message: String,
    },
    /// The server has no database of that name.
    #[error(
        "PostgreSQL has no database {database:?} ({target}); create it (`createdb {database}`) or fix the URL"
    )]
    NoDatabase {
        /// The database, without its password.
        target: String,
        /// The database's name.
        database: String,
    },
    /// The database holds no Baton store (and the configuration does not
    /// create one).
    #[error(
        "no Baton store in {target}: create one with PostgresStore::create or PostgresStore::open_or_create"
    )]
    Missing {
        /// The database, without its password.
        target: String,
    },
    /// A new store was asked for, and the database already holds one.
    #[error(
        "{target} already holds a Baton store: open it with PostgresStore::open, or use another database"
    )]
    Exists {
        /// The database, without its password.
        target: String,
    },
    /// The database holds tables that are not a Baton store's. They are
    /// left untouched.
    #[error(
        "{target} holds tables of another application ({tables}), not a Baton store; give Baton a database of its own"
    )]
    Foreign {
        /// The database, without its password.
        target: String,
        /// Some of the tables found.
        tables: String,
    },
    /// The store was written by a newer Baton with a schema this build does
    /// not know. It is left untouched.
    #[error(
        "{target} has store schema version {found}, newer than version {supported} of this build; upgrade Baton to open it"
    )]
    NewerSchema {
        /// The database, without its password.
        target: String,
        /// The stored schema version.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The server failed another way while the store was checked or
    /// created (permissions, resources, a dropped connection).
    #[error("PostgreSQL failed while opening the store in {target}: {error}")]
    Database {
        /// The database, without its password.
        target: String,
        /// The classified failure.
        error: StoreError,
    },
    /// The store's thread could not be started.
    #[error("cannot start the postgres store's thread: {0}")]
    Thread(String),
}

impl OpenError {
    /// Classifies a failure to connect or to run the opening statements.
    pub(crate) fn from_postgres(
        target: &str,
        database: &str,
        error: tokio_postgres::Error,
    ) -> Self {
        let target = target.to_owned();
        match error.code() {
            Some(code) if *code == SqlState::INVALID_CATALOG_NAME => OpenError::NoDatabase {
                target,
                database: database.to_owned(),
            },
            Some(code) if code.code().starts_with("28") => OpenError::Login {
                target,
                message: server_message(&error),
            },
            Some(_) => OpenError::Database {
                target,
                error: storage(error),
            },
            None if error.is_closed() || std::error::Error::source(&error).is_some() => {
                OpenError::Unreachable {
                    target,
                    message: chain(&error),
                }
            }
            None => OpenError::Database {
                target,
                error: storage(error),
            },
        }
    }
}

impl From<OpenError> for StoreError {
    fn from(error: OpenError) -> StoreError {
        match error {
            OpenError::Database { error, .. } => error,
            OpenError::Unreachable { .. } | OpenError::Thread(_) => {
                StoreError::unavailable(error.to_string())
            }
            _ => StoreError::refused(error.to_string()),
        }
    }
}

/// The server's own message of a database error, or the whole chain.
fn server_message(error: &tokio_postgres::Error) -> String {
    error
        .as_db_error()
        .map(|db| db.message().to_owned())
        .unwrap_or_else(|| chain(error))
}

/// An error and its causes, joined.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

/// What to do after a failure whose commit is in doubt or never happened.
const LOST: &str = "nothing of this call is reported committed; the tree's writer stops, and `Engine::recover` takes it up again from what the database holds once it is reachable";

/// Maps a PostgreSQL failure to a storage error, keeping it as the cause.
///
/// - `Unavailable` (retrying later may help): a lost or refused connection,
///   the server shutting down or terminating the connection
///   (`pg_terminate_backend`), too many connections, a canceled statement,
///   a serialization failure or deadlock, a lock not available, exhausted
///   resources;
/// - `Refused` (an operator must act): refused credentials, a missing
///   database, table or column (the store's tables were dropped or
///   altered), missing privileges, a read-only server, a full disk, data the
///   server will not take;
/// - `Corrupt`: the server reports damaged data or indexes.
pub(crate) fn storage(error: tokio_postgres::Error) -> StoreError {
    let Some(code) = error.code().cloned() else {
        let kind = if link_failed(&error) {
            StoreError::unavailable(format!(
                "postgres: the connection failed ({}); {LOST}",
                chain(&error)
            ))
        } else {
            // The client refused to run the statement (a value it cannot
            // encode, say): nothing was sent, and sending again would not help.
            StoreError::refused(format!(
                "postgres: the statement could not be run ({}); nothing was written",
                chain(&error)
            ))
        };
        return kind.caused_by(error);
    };
    let state = code.code();
    let message = server_message(&error);
    let kind = if state == "XX001" || state == "XX002" {
        StoreError::corrupt(format!(
            "postgres reports damaged data ({state}): {message}; restore the database from a backup"
        ))
    } else if state.starts_with("08")
        || state.starts_with("57P")
        || matches!(
            state,
            "57014" | "40001" | "40P01" | "55P03" | "53000" | "53200" | "53300" | "53400"
        )
    {
        StoreError::unavailable(format!("postgres ({state}): {message}; {LOST}"))
    } else if state.starts_with("28") || state == "3D000" {
        StoreError::refused(format!(
            "postgres refused the login ({state}): {message}; fix the URL's user, password or database"
        ))
    } else if matches!(state, "42P01" | "42703" | "42883" | "42P07") {
        StoreError::refused(format!(
            "postgres ({state}): {message}; the store's tables were dropped or altered: reopen the store (PostgresStore::open checks them) or restore the database"
        ))
    } else if state == "42501" || state == "25006" || state == "53100" {
        StoreError::refused(format!(
            "postgres refused the write ({state}): {message}; grant the store's user write access, or free disk space, then retry"
        ))
    } else if state.starts_with("22") || state.starts_with("23") || state.starts_with("54") {
        StoreError::refused(format!("postgres refused the data ({state}): {message}"))
    } else {
        StoreError::unavailable(format!("postgres ({state}): {message}; {LOST}"))
    };
    kind.caused_by(error)
}

/// Whether a failed transaction was surely rolled back by the server and
/// may simply run again: a serialization failure or a deadlock.
pub(crate) fn must_retry(error: &tokio_postgres::Error) -> bool {
    error.code().is_some_and(|code| {
        *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED
    })
}

/// Whether the connection is gone: a failure of the link rather than of
/// the statement, after which the commit of a transaction is unknown.
pub(crate) fn connection_lost(error: &tokio_postgres::Error) -> bool {
    match error.code() {
        None => link_failed(error),
        Some(code) => {
            let state = code.code();
            state.starts_with("08") || state.starts_with("57P")
        }
    }
}

/// Whether an error without a SQLSTATE is a failure of the link (closed,
/// refused, an I/O error, a malformed message) rather than the client's
/// refusal to encode a statement.
fn link_failed(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if cause.is::<std::io::Error>() {
            return true;
        }
        source = cause.source();
    }
    // Without a cause (an unexpected message, a closed connection seen
    // before `is_closed` is set) the link is the likelier culprit.
    !chain(error).contains("serializing")
}

/// Maps a pool failure (no connection could be had) to a storage error.
pub(crate) fn pool(error: deadpool_postgres::PoolError) -> StoreError {
    match error {
        deadpool_postgres::PoolError::Backend(error) => storage(error),
        deadpool_postgres::PoolError::Closed => StoreError::unavailable(
            "postgres store: its connections are closed (the store is shutting down)",
        ),
        other => StoreError::unavailable(format!(
            "postgres store: no connection could be had ({other}); {LOST}"
        )),
    }
}
