//! # baton-server: a worker host for a program registry, with an HTTP API
//!
//! Owns `baton serve`: a long-running host that builds one engine over a
//! store and a registry of programs ([`ServeConfig`]), recovers the
//! unfinished trees of the store when it starts, takes over every tree
//! whose writer is gone (a scan every half lease, or earlier when a
//! [`WakeSource`] such as PostgreSQL's change notices says so), drives at
//! most `max_running` trees at once, and shuts down gracefully: it stops
//! admitting work, lets in-flight steps commit and in-flight dispatches
//! settle within a grace period, and releases its leases.
//!
//! With `listen` set it serves the HTTP API (axum): `POST /v1/trees`,
//! `GET /v1/trees`, `GET /v1/trees/{id}`, `GET /v1/trees/{id}/log`,
//! `POST /v1/trees/{id}/waits/{wait_id}`, `POST /v1/trees/{id}/cancel`,
//! `POST /v1/trees/{id}/effects/{effect_id}/resolve`, health and readiness,
//! and its OpenAPI document at `GET /openapi.json`. Every route but health,
//! readiness and the document needs a bearer token ([`Tokens`], kept only
//! as hashes), and a token sees only its scope: a tree of another scope is
//! a 404, exactly as a missing tree. Errors are problem documents
//! ([`api::problem::Problem`]) carrying Baton's stable failure code.
//!
//! The same router serves a web console at `/`: server-rendered pages
//! (maud templates compiled into the crate, with an embedded stylesheet
//! and one small script) to see a scope's trees and a tree's processes,
//! budgets, usage and log as they change, and to answer waits through
//! forms generated from their answer schemas, cancel, resolve unknown
//! effects and verify a log. It signs in with an API token kept in an
//! `HttpOnly`, `SameSite=Strict` cookie, which the API and the event stream
//! accept too, and checks a CSRF token on every form post.
//!
//! Who should depend on it: the `baton` command line (its `serve`
//! subcommand) and applications that host their own registry. It depends
//! on the `baton` facade only among workspace crates, as an application
//! would; it knows nothing of any program, store backend or model
//! provider beyond what the facade offers. No cargo features.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use baton::run::{EngineConfig, MemoryStore};
//! use baton_server::{ServeConfig, Server, Tokens, shutdown_signal};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let mut tokens = Tokens::new();
//! tokens.extend_from_env("BATON_TOKENS")?;
//! let config = ServeConfig {
//!     listen: Some("127.0.0.1:8080".parse()?),
//!     tokens,
//!     ..ServeConfig::new(EngineConfig::new(Arc::new(MemoryStore::new())))
//! };
//! let server = Server::bind(config).await?;
//! println!("listening on {:?}", server.local_addr());
//! server.run(shutdown_signal()?).await?;
//! # Ok(())
//! # }
//! ```

pub mod api;
mod config;
mod console;
mod host;
mod tokens;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use baton::run::Engine;
use tokio::net::TcpListener;

pub use config::{DEFAULT_BODY_LIMIT, DEFAULT_MAX_WAIT, ServeConfig, ServeError, WakeSource};
pub use tokens::{MIN_TOKEN_BYTES, TokenError, Tokens};

use host::Host;

/// A host bound and ready to run: its engine built and its listener (if
/// any) bound, so a caller (a test) can learn the address before it runs.
pub struct Server {
    host: Arc<Host>,
    listener: Option<TcpListener>,
    body_limit: usize,
    scan: Duration,
    grace: Duration,
    wake: Option<config::WakeSource>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.local_addr())
            .field("scan", &self.scan)
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Validates `config`, builds the engine and binds the listener.
    pub async fn bind(config: ServeConfig) -> Result<Server, ServeError> {
        config.validate()?;
        let scan = config.scan_interval();
        let store = config.engine.store.clone();
        let engine = Engine::new(config.engine)?;
        let listener = match config.listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| ServeError::Listen { addr, source })?,
            ),
            None => None,
        };
        let csrf = console::auth::CsrfKey::random().map_err(ServeError::Secret)?;
        let host = Arc::new(Host::new(
            engine,
            store,
            config.tokens,
            csrf,
            config.max_running,
            config.max_wait,
        ));
        Ok(Server {
            host,
            listener,
            body_limit: config.body_limit,
            scan,
            grace: config.grace,
            wake: config.wake,
        })
    }

    /// The address the HTTP API listens on, if it listens.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener
            .as_ref()
            .and_then(|listener| listener.local_addr().ok())
    }

    /// A handle to learn when the host is ready and to begin its shutdown
    /// from anywhere, as the shutdown future given to [`Server::run`] does.
    pub fn handle(&self) -> ServerHandle {
        ServerHandle {
            host: self.host.clone(),
        }
    }

    /// Runs the host until `shutdown` resolves (or a [`ServerHandle`]
    /// says so): serves the API, recovers and takes over trees; then stops
    /// admitting work (503), shuts the engine down with the grace period
    /// (in-flight dispatches settle, leases are released), stops serving
    /// and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), ServeError> {
        let Server {
            host,
            listener,
            body_limit,
            scan,
            grace,
            wake,
        } = self;
        let worker = tokio::spawn(host.clone().work(scan, wake));
        let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
        let http = listener.map(|listener| {
            let router = api::router(host.clone(), body_limit);
            tokio::spawn(
                axum::serve(listener, router)
                    .with_graceful_shutdown(async move {
                        let _ = http_stopped.await;
                    })
                    .into_future(),
            )
        });
        tokio::select! {
            () = shutdown => {}
            () = host.drained() => {}
        }
        tracing::info!(
            ?grace,
            "shutting down: no new work; in-flight dispatches get the grace period"
        );
        host.begin_shutdown();
        // The worker ends at its next await once the shutdown began.
        let _ = worker.await;
        host.finish(grace).await;
        let _ = stop_http.send(());
        if let Some(http) = http {
            match http.await {
                Ok(served) => served.map_err(ServeError::Http)?,
                Err(joined) => {
                    return Err(ServeError::Http(std::io::Error::other(joined.to_string())));
                }
            }
        }
        tracing::info!("shut down");
        Ok(())
    }
}

/// Watches a running host's readiness and begins its shutdown (see
/// [`Server::handle`]).
#[derive(Clone)]
pub struct ServerHandle {
    host: Arc<Host>,
}

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandle").finish_non_exhaustive()
    }
}

impl ServerHandle {
    /// Resolves once the initial recovery finished (when `GET /readyz`
    /// starts answering 200); never, if a shutdown comes first.
    pub async fn ready(&self) {
        self.host.ready().await;
    }

    /// Begins the shutdown: from this call on, new work and readiness are
    /// refused (503); the host then drains and stops.
    pub fn shutdown(&self) {
        self.host.begin_shutdown();
    }
}

/// Validates `config`, binds, and runs the host until `shutdown` resolves
/// (see [`Server::run`]).
pub async fn serve(
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    Server::bind(config).await?.run(shutdown).await
}

/// A future that resolves at the first SIGINT or SIGTERM (Ctrl-C on other
/// platforms). The handlers are installed by this call, so a signal that
/// arrives before the future is first polled is not lost.
pub fn shutdown_signal() -> Result<impl Future<Output = ()> + Send + 'static, ServeError> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt()).map_err(ServeError::Signal)?;
        let mut terminate = signal(SignalKind::terminate()).map_err(ServeError::Signal)?;
        Ok(async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}
