//! What every test here shares: the server from `BATON_TEST_POSTGRES`, a
//! fresh database per store (random name, dropped afterwards), and stores
//! opened on them.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use baton_store_postgres::{Creation, LeaseClock, PostgresConfig, PostgresStore};
use tokio_postgres::NoTls;
use tokio_postgres::config::Host;

/// The variable naming the server the tests run on.
pub const VARIABLE: &str = "BATON_TEST_POSTGRES";

/// The server when the variable is not set.
pub const DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The server's URL (a database on it that the tests may connect to, to
/// create and drop their own).
pub fn server_url() -> String {
    std::env::var(VARIABLE).unwrap_or_else(|_| DEFAULT.to_owned())
}

/// Runs `future` on a runtime of its own, on a thread of its own: usable
/// from plain functions called inside an async test (a store factory).
pub fn block<T: Send>(future: impl Future<Output = T> + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime")
                    .block_on(future)
            })
            .join()
            .expect("the helper thread")
    })
}

/// A connection to the database at `url`; the test fails, naming the
/// variable, when the server cannot be reached.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = match tokio_postgres::connect(url, NoTls).await {
        Ok(connected) => connected,
        Err(error) => panic!(
            "cannot reach the PostgreSQL server of the tests at {url}: {error}; \
             start one, or point {VARIABLE} at one (default {DEFAULT})"
        ),
    };
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// The server of one test: makes fresh databases and drops them all when
/// dropped (with `FORCE`, so connections still open do not keep them).
pub struct Server {
    url: String,
    made: Mutex<Vec<String>>,
}

impl Server {
    pub fn new() -> Server {
        let url = server_url();
        block(async {
            connect(&url).await;
        });
        Server {
            url,
            made: Mutex::new(Vec::new()),
        }
    }

    /// A new, empty database; its URL.
    pub fn database(&self) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let name = format!(
            "baton_test_{}_{}_{:08x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            random as u32
        );
        let url = self.url.clone();
        let created = name.clone();
        block(async move {
            connect(&url)
                .await
                .batch_execute(&format!("CREATE DATABASE {created}"))
                .await
                .expect("creates a test database");
        });
        self.made.lock().expect("not poisoned").push(name.clone());
        url_of(&self.url, &name)
    }

    /// A fresh database with a new store in it, configured by `edit`.
    pub fn store_with(&self, edit: impl FnOnce(&mut PostgresConfig)) -> PostgresStore {
        let mut config = PostgresConfig {
            creation: Creation::New,
            read_connections: 2,
            ..PostgresConfig::new(self.database())
        };
        edit(&mut config);
        PostgresStore::open_with(config).expect("opens a store in a fresh database")
    }

    /// A fresh database with a new store in it, leases on the database's
    /// clock.
    pub fn store(&self) -> PostgresStore {
        self.store_with(|_| {})
    }

    /// A fresh store whose leases are judged by the times in the requests.
    pub fn store_on_request_clock(&self) -> PostgresStore {
        self.store_with(|config| config.lease_clock = LeaseClock::Requests)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let made = std::mem::take(&mut *self.made.lock().unwrap_or_else(|e| e.into_inner()));
        if made.is_empty() {
            return;
        }
        let url = self.url.clone();
        block(async move {
            let client = connect(&url).await;
            for name in made {
                let _ = client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await;
            }
        });
    }
}

/// The URL of database `name` on the server of `base`.
pub fn url_of(base: &str, name: &str) -> String {
    let config = tokio_postgres::Config::from_str(base).expect("a valid server URL");
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        Some(Host::Unix(path)) => path.display().to_string().replace('/', "%2F"),
        None => "127.0.0.1".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres");
    let password = config
        .get_password()
        .map(|password| format!(":{}", String::from_utf8_lossy(password)))
        .unwrap_or_default();
    format!("postgres://{user}{password}@{host}:{port}/{name}")
}
