//! The Baton command line over your own programs.
//!
//! A host crate hands a [`Registry`] of its programs to [`main`] and gets
//! the whole command line: `start`, `programs`, `ps`, `inspect`,
//! `log --verify`, `watch`, `answer`, `cancel`, `resolve`, `recover` and
//! `completions`, on an embedded SQLite store (or, with the `postgres`
//! feature, a PostgreSQL database):
//!
//! ```no_run
//! use std::process::ExitCode;
//!
//! # fn my_program() -> baton::run::Program { unimplemented!() }
//! fn main() -> ExitCode {
//!     let registry = match baton_cli::Registry::builder()
//!         .program(&my_program())
//!         .default_scope("acme")
//!         .build()
//!     {
//!         Ok(registry) => registry,
//!         Err(error) => {
//!             eprintln!("error: {error}");
//!             return ExitCode::FAILURE;
//!         }
//!     };
//!     baton_cli::main(registry)
//! }
//! ```
//!
//! Commands that drive a tree (`start`, `answer`, `cancel`, `resolve`,
//! `recover`) wait until the engine reports the tree settled (every live
//! process waits for an answer or is parked, or the root ended), never by
//! polling. `--timeout` bounds the wait and `--detach` returns as soon as
//! the command's change is committed; SIGINT or SIGTERM stops the wait.
//! However a driving command stops, it shuts its engine down with a bounded
//! grace for in-flight dispatches and releases its leases, so the tree
//! continues on the next `recover` or in a worker.
//!
//! A host that adds subcommands of its own (the `baton` binary adds `demo`)
//! flattens [`Command`] into its own subcommand enum, and calls [`execute`]
//! with its parser's [`clap::Command`] and a body that hands the shared
//! subcommands to [`run`].
//!
//! Who depends on it: binaries that operate trees of their programs. It
//! depends on the `baton` facade only (with the default `demo` feature off,
//! nothing of the demos is compiled in); it knows nothing of any program.
//!
//! Features: `demo` (default) builds the `baton` binary with the demo
//! programs; `postgres` opens `postgres://` stores.

/// Prints a line on stdout, as `println!` does, without panicking when the
/// reader went away (`baton ps | head`).
macro_rules! emitln {
    ($($arg:tt)*) => {
        $crate::emit(&format!("{}\n", format_args!($($arg)*)))
    };
}

mod command;
mod context;
mod drive;
mod error;
mod follow;
mod interrupt;
mod registry;
mod render;
mod serve;
mod store;
mod time;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

pub use command::{Command, StatusFilter, run};
pub use context::{Context, DriveArgs, Global, WaitArgs};
pub use error::{CliError, Stop};
pub use follow::WatchView;
pub use registry::{
    DEFAULT_SCOPE, HostHooks, LostEffect, Registry, RegistryBuilder, RegistryError, Resolution,
};
pub use serve::ServeArgs;
pub use store::CliStore;

/// Writes `text` on stdout; a closed pipe or a full disk is not the
/// command's failure, so write errors are ignored rather than panicking.
pub(crate) fn emit(text: &str) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

/// The command line of [`main`]: the global flags and a [`Command`].
#[derive(Debug, Parser)]
#[command(
    name = "baton",
    version,
    about = "Operate durable Baton trees of your programs."
)]
pub struct Cli {
    /// The flags every subcommand takes.
    #[command(flatten)]
    pub global: Global,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// Runs the whole command line over `registry`: parses the arguments,
/// carries the subcommand out, prints an error as one line on stderr, and
/// returns the exit status (0; 1 for an error; 2 for bad arguments; 130 or
/// 143 when SIGINT or SIGTERM stopped it).
pub fn main(registry: Registry) -> ExitCode {
    let cli = Cli::parse();
    execute(registry, cli.global, Cli::command(), async |context| {
        run(context, cli.command).await
    })
}

/// Sends the engine's `tracing` events to stderr, filtered by `RUST_LOG`
/// (for example `RUST_LOG=baton_run=debug`); warnings only when it is
/// unset or invalid, so ordinary output stays clean. A host that installed
/// its own subscriber keeps it.
fn install_log() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Runs `body` with a [`Context`] on a fresh runtime, with SIGINT and
/// SIGTERM handled, and turns its result into an exit status, printing a
/// failure as one line on stderr. `interface` is the host's whole parser
/// (`Cli::command()`), which `completions` describes.
pub fn execute(
    registry: Registry,
    global: Global,
    interface: clap::Command,
    body: impl AsyncFnOnce(&Context) -> Result<(), CliError>,
) -> ExitCode {
    install_log();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let interrupt = interrupt::Interrupt::listen();
        let context = Context::new(registry, global, interface, interrupt)?;
        body(&context).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            error.exit_code()
        }
    }
}
