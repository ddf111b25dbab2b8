//! How a [`PostgresStore`](crate::PostgresStore) is configured, validated
//! once when it opens.

use std::str::FromStr;
use std::time::Duration;

use crate::error::OpenError;

/// Whether opening a store may create its tables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Creation {
    /// Open an existing store only: a database without Baton's tables is
    /// refused. What read-only tools use.
    #[default]
    Existing,
    /// Create the store's tables: a database that already holds them is
    /// refused.
    New,
    /// Open the store in the database, or create its tables when the
    /// database holds none (a database with tables must still be a Baton
    /// store). What engines that start work use.
    ExistingOrNew,
}

/// Which clock decides whether a lease is live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LeaseClock {
    /// The database server's clock (`now()` in the statement that grants,
    /// checks or renews a lease). Engines on several machines then agree on
    /// every lease whatever their own clocks say: an engine whose clock runs
    /// fast cannot take a lease the database says is live. A lease's
    /// `until` is on the database's clock, in milliseconds since the epoch,
    /// and a renewal extends it by the time-to-live of its grant, counted
    /// from the database's `now()`.
    #[default]
    Database,
    /// The times the engine sends (`AcquireRequest::now`, the `until` of a
    /// renewal), exactly as `SqliteStore` and `MemoryStore` judge them. For
    /// one engine, and for the store conformance kit, whose cases move time
    /// by hand; never for engines on several machines, whose clocks disagree.
    Requests,
}

/// How a [`PostgresStore`](crate::PostgresStore) is opened. Start from
/// [`PostgresConfig::new`] and change fields with struct update syntax;
/// [`PostgresStore::open_with`](crate::PostgresStore::open_with) validates
/// the whole configuration before it connects.
#[derive(Clone, Debug)]
pub struct PostgresConfig {
    /// Where the database is: a URL (`postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`)
    /// or libpq's `key=value` form. TLS is not supported: connect over a
    /// trusted network, a Unix socket or a local TLS proxy.
    pub url: String,
    /// Whether opening may create the store's tables.
    pub creation: Creation,
    /// Delete the records a snapshot covers (and the pieces only they
    /// referenced). Off keeps the whole history for audit.
    pub compact: bool,
    /// The most operations one group commit applies in one transaction.
    pub max_batch: usize,
    /// Connections kept for reads (`load`, `history`, `list`), besides the
    /// writer's one connection and, once asked for, the listener's.
    pub read_connections: usize,
    /// How long connecting may take before the server counts as
    /// unreachable (used unless the URL sets `connect_timeout`).
    pub connect_timeout: Duration,
    /// Which clock judges leases.
    pub lease_clock: LeaseClock,
}

impl PostgresConfig {
    /// Defaults for the database at `url`: an existing store only,
    /// compaction on, up to 1024 operations per group commit, four read
    /// connections, a 5 s connect timeout, leases on the database's clock.
    pub fn new(url: impl Into<String>) -> PostgresConfig {
        PostgresConfig {
            url: url.into(),
            creation: Creation::Existing,
            compact: true,
            max_batch: 1024,
            read_connections: 4,
            connect_timeout: Duration::from_secs(5),
            lease_clock: LeaseClock::Database,
        }
    }

    /// Checks every setting and reads the URL; the connection settings
    /// every connection of the store uses.
    pub(crate) fn validate(&self) -> Result<Target, OpenError> {
        let invalid = |field: &'static str, reason: &str| OpenError::Config {
            field,
            reason: reason.to_owned(),
        };
        if self.max_batch == 0 {
            return Err(invalid("max_batch", "must be greater than zero"));
        }
        if self.read_connections == 0 {
            return Err(invalid("read_connections", "must be greater than zero"));
        }
        if self.connect_timeout.is_zero() {
            return Err(invalid("connect_timeout", "must be greater than zero"));
        }
        let mut settings =
            tokio_postgres::Config::from_str(&self.url).map_err(|error| OpenError::Url {
                message: error.to_string(),
            })?;
        if settings.get_hosts().is_empty() {
            return Err(OpenError::Url {
                message: "it names no host".to_owned(),
            });
        }
        if settings.get_dbname().is_none() {
            return Err(OpenError::Url {
                message: "it names no database".to_owned(),
            });
        }
        if settings.get_connect_timeout().is_none() {
            settings.connect_timeout(self.connect_timeout);
        }
        if settings.get_application_name().is_none() {
            settings.application_name("baton");
        }
        settings.keepalives(true);
        Ok(Target::new(settings))
    }
}

/// The database a store talks to: the connection settings and how to name
/// it in messages (never with its password).
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) settings: tokio_postgres::Config,
    pub(crate) shown: String,
}

impl Target {
    fn new(settings: tokio_postgres::Config) -> Target {
        let host = match settings.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
            None => "?".to_owned(),
        };
        let port = settings.get_ports().first().copied().unwrap_or(5432);
        let user = settings.get_user().unwrap_or("?");
        let database = settings.get_dbname().unwrap_or("?");
        let shown = format!("postgres://{user}@{host}:{port}/{database}");
        Target { settings, shown }
    }

    /// The database's name.
    pub(crate) fn database(&self) -> &str {
        self.settings.get_dbname().unwrap_or("?")
    }

    /// The same settings with another application name, so that an
    /// operator (or a test) can tell the store's connections apart in
    /// `pg_stat_activity`.
    pub(crate) fn named(&self, role: &str) -> tokio_postgres::Config {
        let mut settings = self.settings.clone();
        let base = settings
            .get_application_name()
            .unwrap_or("baton")
            .to_owned();
        settings.application_name(format!("{base}:{role}"));
        settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_settings_are_refused_by_name_before_connecting() {
        let config = |edit: fn(&mut PostgresConfig)| {
            let mut config = PostgresConfig::new("postgres://postgres@127.0.0.1:5432/db");
            edit(&mut config);
            config.validate().map(|target| target.shown)
        };
        assert_eq!(
            config(|_| {}).expect("valid"),
            "postgres://postgres@127.0.0.1:5432/db"
        );
        for (edit, field) in [
            (
                (|c| c.max_batch = 0) as fn(&mut PostgresConfig),
                "max_batch",
            ),
            (|c| c.read_connections = 0, "read_connections"),
            (|c| c.connect_timeout = Duration::ZERO, "connect_timeout"),
        ] {
            match config(edit) {
                Err(OpenError::Config { field: found, .. }) => assert_eq!(found, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        for url in [
            "postgres://postgres@127.0.0.1:notaport/db",
            "mysql://root@localhost/db",
            "postgres://postgres@127.0.0.1:5432",
        ] {
            let mut config = PostgresConfig::new(url);
            config.creation = Creation::ExistingOrNew;
            match config.validate() {
                Err(error @ OpenError::Url { .. }) => {
                    assert!(
                        error.to_string().contains("postgres://USER@HOST"),
                        "{error}"
                    );
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_password_never_shows_in_the_target() {
        let target = PostgresConfig::new("postgres://alice:secret@db.example:6543/work")
            .validate()
            .expect("valid");
        assert_eq!(target.shown, "postgres://alice@db.example:6543/work");
    }
}
