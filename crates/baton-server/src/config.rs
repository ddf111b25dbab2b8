//! How a host is configured ([`ServeConfig`], validated once by
//! [`Server::bind`](crate::Server::bind)) and the errors of serving.

use std::fmt;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use baton::run::EngineConfig;
use futures_util::{Stream, StreamExt as _};

use crate::tokens::{TokenError, Tokens};

/// The largest request body accepted by default: answers, inputs and
/// resolutions are payloads, which the kernel caps at 8 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 8 * 1024 * 1024 + 64 * 1024;

/// The longest a request may wait for a tree condition (`?until=`) by default.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(60);

/// How a host is built: the engine it drives and how it serves. Start from
/// [`ServeConfig::new`] and change fields with struct update syntax.
pub struct ServeConfig {
    /// The engine to build: its store and its programs (the registry).
    pub engine: EngineConfig,
    /// Where the HTTP API listens; `None` runs the worker alone.
    pub listen: Option<SocketAddr>,
    /// API tokens and their scopes; every route but health needs one.
    pub tokens: Tokens,
    /// The most trees this host drives at once: a tree counts from the
    /// moment the host starts it, takes it over or moves it on (an answer,
    /// a cancellation, a resolution) until it is quiescent again.
    pub max_running: usize,
    /// How long a shutdown waits for dispatches in flight to settle.
    pub grace: Duration,
    /// How often the takeover loop looks for trees whose writer is gone;
    /// `None` means half the engine's lease time-to-live.
    pub scan: Option<Duration>,
    /// Something that wakes the takeover loop before its next scan, such
    /// as the change notices of a PostgreSQL store.
    pub wake: Option<WakeSource>,
    /// The largest request body accepted (413 above it).
    pub body_limit: usize,
    /// The longest a request may wait for a tree condition (`timeout_ms`
    /// is capped to it).
    pub max_wait: Duration,
}

impl fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeConfig")
            .field("listen", &self.listen)
            .field("tokens", &self.tokens)
            .field("max_running", &self.max_running)
            .field("grace", &self.grace)
            .field("scan", &self.scan)
            .field("wake", &self.wake.is_some())
            .field("body_limit", &self.body_limit)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

impl ServeConfig {
    /// Defaults over `engine`: no HTTP listener, no tokens, 64 trees at
    /// once, a 30 s grace, scans every half lease, no wake-up source, the
    /// [`DEFAULT_BODY_LIMIT`] and the [`DEFAULT_MAX_WAIT`].
    pub fn new(engine: EngineConfig) -> ServeConfig {
        ServeConfig {
            engine,
            listen: None,
            tokens: Tokens::new(),
            max_running: 64,
            grace: Duration::from_secs(30),
            scan: None,
            wake: None,
            body_limit: DEFAULT_BODY_LIMIT,
            max_wait: DEFAULT_MAX_WAIT,
        }
    }

    /// The scan interval in force.
    pub fn scan_interval(&self) -> Duration {
        self.scan.unwrap_or(self.engine.lease_ttl / 2)
    }

    /// Checks every setting that has a floor.
    pub(crate) fn validate(&self) -> Result<(), ServeError> {
        let invalid = |field: &'static str, message: &str| {
            Err(ServeError::Config {
                field,
                message: message.to_owned(),
            })
        };
        if self.max_running == 0 {
            return invalid("max_running", "must be at least 1");
        }
        if self.scan_interval().is_zero() {
            return invalid("scan", "must be positive");
        }
        if self.body_limit == 0 {
            return invalid("body_limit", "must be positive");
        }
        if self.max_wait.is_zero() {
            return invalid("max_wait", "must be positive");
        }
        if self.listen.is_some() && self.tokens.is_empty() {
            return invalid(
                "tokens",
                "an HTTP listener without tokens would refuse every request: add a token (`SCOPE TOKEN`)",
            );
        }
        Ok(())
    }
}

/// Wake-ups for the takeover loop: each item asks for a scan now (items
/// that arrive during a scan are folded into the next one).
pub struct WakeSource {
    stream: Pin<Box<dyn Stream<Item = ()> + Send>>,
}

impl WakeSource {
    /// Every item of `stream` is a wake-up, for instance the notices of
    /// `PostgresStore::listen` (`listener.into_stream()`); see also
    /// [`WakeSource::changes`].
    pub fn stream<S>(stream: S) -> WakeSource
    where
        S: Stream + Send + 'static,
    {
        WakeSource {
            stream: Box::pin(stream.map(|_| ())),
        }
    }

    /// The store's change notices ([`Store::changes`]): a commit that
    /// appended to a tree or gave up its lease, or notices that were missed,
    /// is a wake-up (inbox messages are not: the engine applies those).
    ///
    /// [`Store::changes`]: baton::run::store::Store::changes
    pub fn changes(changes: baton::run::store::Changes) -> WakeSource {
        use baton::run::store::Change;
        WakeSource::stream(futures_util::stream::unfold(
            changes,
            |mut changes| async move {
                loop {
                    match changes.next().await? {
                        Change::Inbox(_) => {}
                        _ => return Some(((), changes)),
                    }
                }
            },
        ))
    }

    /// Every `notify_one` / `notify_waiters` of `notify` is a wake-up.
    pub fn notify(notify: Arc<tokio::sync::Notify>) -> WakeSource {
        WakeSource::stream(futures_util::stream::unfold(notify, |notify| async move {
            notify.notified().await;
            Some(((), notify))
        }))
    }

    pub(crate) fn into_stream(self) -> Pin<Box<dyn Stream<Item = ()> + Send>> {
        self.stream
    }
}

/// Why a host could not be built or stopped serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// A setting is out of range.
    #[error("serve.config.invalid: {field} {message}")]
    Config {
        /// The field.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The tokens could not be loaded.
    #[error(transparent)]
    Tokens(#[from] TokenError),
    /// The engine's configuration was refused.
    #[error("serve.engine.invalid: {0}")]
    Engine(#[from] baton::run::ConfigError),
    /// The listener could not be bound.
    #[error("serve.listen.failed: cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The HTTP server failed while serving.
    #[error("serve.http.failed: {0}")]
    Http(std::io::Error),
    /// The console's CSRF key could not be drawn from the operating
    /// system's random source.
    #[error("serve.secret.failed: cannot draw the console's CSRF key: {0}")]
    Secret(getrandom::Error),
    /// The signal handlers could not be installed.
    #[error("serve.signal.failed: cannot install the SIGINT/SIGTERM handlers: {0}")]
    Signal(std::io::Error),
}

impl ServeError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ServeError::Config { .. } => "serve.config.invalid",
            ServeError::Tokens(error) => error.code(),
            ServeError::Engine(_) => "serve.engine.invalid",
            ServeError::Listen { .. } => "serve.listen.failed",
            ServeError::Http(_) => "serve.http.failed",
            ServeError::Signal(_) => "serve.signal.failed",
            ServeError::Secret(_) => "serve.secret.failed",
        }
    }
}
