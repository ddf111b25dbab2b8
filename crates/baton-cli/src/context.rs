//! What every command runs with: the registry, the global flags, the
//! signals, and the engine a command opens and shuts down.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use baton::run::store::Store;
use baton::run::{Engine, EngineConfig, Scope};
use clap::Args;

use crate::error::{CliError, Stop};
use crate::interrupt::Interrupt;
use crate::registry::Registry;
use crate::store::CliStore;

/// The flags every subcommand takes (they may come before or after it).
#[derive(Clone, Debug, Args)]
pub struct Global {
    /// The store: a SQLite file, or (built with the `postgres` feature) a
    /// postgres://USER@HOST:PORT/DATABASE URL.
    #[arg(long, global = true, default_value = "baton.db")]
    pub store: String,
    /// The tenant scope of the trees you operate on (default: the
    /// registry's default scope).
    #[arg(long, global = true)]
    pub scope: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

/// How long a command that drives a tree waits, and how it stops.
#[derive(Clone, Copy, Debug, Args)]
pub struct WaitArgs {
    /// Stop waiting after this long (`90s`, `5m`); the tree continues on
    /// the next `recover` or in a worker. Default: wait until it settles.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    /// When the command stops early (a signal, --timeout), how long
    /// in-flight dispatches may take to settle before the engine releases
    /// its leases.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub grace: Duration,
}

impl Default for WaitArgs {
    fn default() -> WaitArgs {
        WaitArgs {
            timeout: None,
            grace: Duration::from_secs(10),
        }
    }
}

/// The flags of a command that commits something and then drives the tree.
#[derive(Clone, Copy, Debug, Default, Args)]
pub struct DriveArgs {
    /// Commit and return at once, without driving the tree: it is left to
    /// the next `recover` or a worker.
    #[arg(long)]
    pub detach: bool,
    /// How long the command waits for the tree, and how it stops.
    #[command(flatten)]
    pub wait: WaitArgs,
}

/// Everything a command runs with. Built by [`crate::execute`].
pub struct Context {
    registry: Registry,
    global: Global,
    scope: Scope,
    interface: clap::Command,
    bin: String,
    interrupt: Interrupt,
}

impl Context {
    pub(crate) fn new(
        registry: Registry,
        global: Global,
        interface: clap::Command,
        interrupt: Interrupt,
    ) -> Result<Context, CliError> {
        let scope = match &global.scope {
            Some(text) => Scope::new(text)
                .map_err(|error| CliError::argument(format!("invalid --scope: {error}")))?,
            None => registry.default_scope().clone(),
        };
        let bin = bin_name(&interface);
        Ok(Context {
            registry,
            global,
            scope,
            interface,
            bin,
            interrupt,
        })
    }

    /// The programs, limits and hooks.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The scope of `--scope`, or the registry's default.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Whether `--json` was given.
    pub fn json(&self) -> bool {
        self.global.json
    }

    /// The name this command line was invoked as, for the commands its
    /// messages suggest.
    pub fn bin(&self) -> &str {
        &self.bin
    }

    /// The whole command-line interface (for completions).
    pub fn interface(&self) -> &clap::Command {
        &self.interface
    }

    /// Opens the store of `--store`, which must exist: a command that
    /// only reads or changes existing trees never creates one.
    pub fn open_store(&self) -> Result<CliStore, CliError> {
        self.open(false)
    }

    /// Opens the store of `--store`, creating it (the SQLite file, or the
    /// tables of an empty PostgreSQL database) when there is none: for a
    /// command that starts a new tree.
    pub fn open_or_create_store(&self) -> Result<CliStore, CliError> {
        self.open(true)
    }

    fn open(&self, create: bool) -> Result<CliStore, CliError> {
        let missing = format!(
            "pass --store, or create one with `{} start PROGRAM JSON`",
            self.bin
        );
        CliStore::open(&self.global.store, create, &missing)
    }

    /// An engine over `store` with the registry's programs and limits.
    pub fn engine(&self, store: Arc<dyn Store>) -> Result<Engine, CliError> {
        Engine::new(EngineConfig {
            programs: self.registry.programs().to_vec(),
            limits: self.registry.limits().clone(),
            ..EngineConfig::new(store)
        })
        .map_err(|error| CliError::engine(error.code(), error, None))
    }

    /// Claims SIGINT and SIGTERM for this command and resolves at the
    /// first one, for a command that ends cleanly on a signal.
    pub(crate) async fn interrupted(&self) -> Stop {
        self.interrupt.claim();
        self.interrupt.received().await
    }

    /// Takes `tree` (of `scope`) up when `engine` does not run it yet and
    /// waits until it has settled: every live process waits for an answer
    /// or is parked, or the root ended. Returns the tree as it then is.
    pub async fn settle(
        &self,
        engine: &Engine,
        scope: &Scope,
        tree: baton::run::TreeId,
    ) -> Result<baton::run::TreeView, CliError> {
        crate::drive::settle(engine, scope, tree, &self.bin).await
    }

    /// Runs `work` on `engine`, stopping early for a signal or `timeout`;
    /// then shuts the engine down, letting in-flight dispatches settle for
    /// up to `grace` (at once when nothing is in flight). `what` names what
    /// the command waits for, in the message of an early stop.
    ///
    /// From the call on, SIGINT and SIGTERM are this command's: the first
    /// stops the wait instead of ending the process.
    pub async fn drive<T>(
        &self,
        engine: Engine,
        wait: WaitArgs,
        what: impl Into<String>,
        work: impl AsyncFnOnce(&Engine) -> Result<T, CliError>,
    ) -> Result<T, CliError> {
        self.interrupt.claim();
        let result = {
            let run = work(&engine);
            tokio::select! {
                result = bounded(run, wait.timeout) => result,
                stop = self.interrupt.received() => Err(stop),
            }
        };
        crate::drive::shutdown(engine, wait.grace).await;
        match result {
            Ok(result) => result,
            Err(stop) => Err(CliError::Stopped {
                stop,
                what: what.into(),
                grace: wait.grace,
                bin: self.bin.clone(),
            }),
        }
    }
}

/// `future`, or a [`Stop::Timeout`] once `timeout` passed.
async fn bounded<T>(future: impl Future<Output = T>, timeout: Option<Duration>) -> Result<T, Stop> {
    match timeout {
        Some(limit) => tokio::time::timeout(limit, future)
            .await
            .map_err(|_| Stop::Timeout(limit)),
        None => Ok(future.await),
    }
}

/// The name the user typed (the file name of the program), or the
/// interface's name.
fn bin_name(interface: &clap::Command) -> String {
    std::env::args_os()
        .next()
        .and_then(|arg| {
            std::path::Path::new(&arg)
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| interface.get_name().to_owned())
}
