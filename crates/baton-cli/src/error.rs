//! What a command reports when it fails: one [`CliError`] with a stable
//! code, printed as one line that names the next command to run.

use std::process::ExitCode;
use std::time::Duration;

use baton::run::store::StoreError;
use baton::run::{ControlError, RuntimeError, SignalError, StartError, Timestamp, TreeError};

use crate::registry::RegistryError;
use crate::time;

/// Why a command stopped waiting before its tree settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stop {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM.
    Terminate,
    /// `--timeout` passed.
    Timeout(Duration),
}

impl Stop {
    /// The process exit status for this stop: 128 plus the signal number,
    /// as shells report a process a signal ended; 1 for a timeout.
    pub fn exit_status(self) -> u8 {
        match self {
            Stop::Interrupt => 130,
            Stop::Terminate => 143,
            Stop::Timeout(_) => 1,
        }
    }
}

/// A failed command. Its [`Display`](std::fmt::Display) is the one line
/// printed after `error: `; [`CliError::code`] is stable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// A command-line value is malformed (an id, a JSON document, a scope).
    #[error("{message}")]
    Argument {
        /// What is wrong, naming the value.
        message: String,
    },
    /// No store exists where `--store` points.
    #[error("no store at {location} ({hint})")]
    NoStore {
        /// The location given.
        location: String,
        /// How to get one.
        hint: String,
    },
    /// The store exists but cannot be opened.
    #[error("cannot open the store {location}: {message}")]
    StoreUnusable {
        /// The location given.
        location: String,
        /// Why.
        message: String,
    },
    /// The engine refused or failed an operation; the message carries the
    /// engine's failure code and, when there is one, the next command.
    #[error("{message}")]
    Engine {
        /// The engine's stable failure code.
        code: String,
        /// The message, with the next command to run.
        message: String,
    },
    /// The command stopped waiting (a signal or `--timeout`); the engine
    /// let in-flight work settle for up to its grace period and released
    /// its leases.
    #[error("{}", stopped(*stop, what, *grace, bin))]
    Stopped {
        /// Why.
        stop: Stop,
        /// What was being waited for (`tree p_…`, `the recovery`).
        what: String,
        /// The grace period in-flight dispatches had.
        grace: Duration,
        /// The command line's name, for the next command.
        bin: String,
    },
    /// The registry the host built was refused.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A failure of the host's own code (the `baton` binary's demos).
    #[error("{message}")]
    Host {
        /// The host's stable code.
        code: &'static str,
        /// What failed.
        message: String,
    },
}

fn stopped(stop: Stop, what: &str, grace: Duration, bin: &str) -> String {
    let why = match stop {
        Stop::Interrupt => "interrupted (SIGINT)".to_owned(),
        Stop::Terminate => "terminated (SIGTERM)".to_owned(),
        Stop::Timeout(after) => {
            format!("stopped waiting after --timeout {}", time::duration(after))
        }
    };
    format!(
        "{why} before {what} settled: in-flight work had up to {} to settle and the leases were released; \
         it continues on the next `{bin} recover` or in a worker",
        time::duration(grace)
    )
}

impl CliError {
    /// Stable code.
    pub fn code(&self) -> &str {
        match self {
            CliError::Argument { .. } => "cli.argument.invalid",
            CliError::NoStore { .. } => "cli.store.missing",
            CliError::StoreUnusable { .. } => "cli.store.unusable",
            CliError::Engine { code, .. } => code,
            CliError::Stopped {
                stop: Stop::Timeout(_),
                ..
            } => "cli.timeout",
            CliError::Stopped { .. } => "cli.interrupted",
            CliError::Registry(error) => error.code(),
            CliError::Host { code, .. } => code,
        }
    }

    /// The process exit status: 1, or 128 plus the signal that stopped
    /// the command.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Stopped { stop, .. } => ExitCode::from(stop.exit_status()),
            _ => ExitCode::FAILURE,
        }
    }

    /// A malformed command-line value.
    pub fn argument(message: impl Into<String>) -> CliError {
        CliError::Argument {
            message: message.into(),
        }
    }

    /// A failure of the host's own code, with its stable code.
    pub fn host(code: &'static str, message: impl Into<String>) -> CliError {
        CliError::Host {
            code,
            message: message.into(),
        }
    }

    /// An engine error, its message followed by the next command (`hint`).
    pub(crate) fn engine(
        code: &str,
        message: impl std::fmt::Display,
        hint: Option<String>,
    ) -> CliError {
        let message = match hint {
            Some(hint) => format!("{message}; {hint}"),
            None => message.to_string(),
        };
        CliError::Engine {
            code: code.to_owned(),
            message,
        }
    }
}

/// An engine error that becomes a [`CliError`] naming the next command.
pub(crate) trait Explain: std::fmt::Display {
    /// The stable code.
    fn code(&self) -> &str;
    /// The next command to run, if there is an obvious one.
    fn hint(&self, bin: &str) -> Option<String>;
    /// As a command's error.
    fn explain(&self, bin: &str) -> CliError {
        CliError::engine(self.code(), self, self.hint(bin))
    }
}

/// When a held lease expires and how to take the tree anyway.
fn lease_hint(bin: &str, until: Timestamp) -> String {
    format!(
        "the lease expires {}; if that process is gone, wait until then, or take the tree now with `{bin} recover --force`",
        time::when(until)
    )
}

impl Explain for TreeError {
    fn code(&self) -> &str {
        TreeError::code(self)
    }

    fn hint(&self, bin: &str) -> Option<String> {
        match self {
            TreeError::NotFound { .. } => Some(format!("list the trees with `{bin} ps`")),
            TreeError::Scope { .. } => Some(format!(
                "`{bin} ps` shows each tree's scope; pass it with --scope"
            )),
            TreeError::ProgramUnavailable { .. } => Some(format!(
                "register that program (that exact version) in this command line's Registry; `{bin} programs` lists what it has"
            )),
            TreeError::LeaseHeld { until, .. } => Some(lease_hint(bin, *until)),
            TreeError::Stopped(error) => error.hint(bin),
            TreeError::Corrupt { tree, .. } => Some(format!(
                "`{bin} log {tree} --verify` shows what was checked"
            )),
            _ => None,
        }
    }
}

impl Explain for RuntimeError {
    fn code(&self) -> &str {
        RuntimeError::code(self)
    }

    fn hint(&self, bin: &str) -> Option<String> {
        Some(format!(
            "everything committed is in the log; `{bin} recover` takes the tree up again"
        ))
    }
}

impl Explain for StartError {
    fn code(&self) -> &str {
        StartError::code(self)
    }

    fn hint(&self, bin: &str) -> Option<String> {
        match self {
            StartError::UnknownProgram { .. } | StartError::Unregistered { .. } => {
                Some(format!("`{bin} programs` lists the programs this command line can start"))
            }
            StartError::Input(_) => Some(format!(
                "nothing was written; `{bin} programs --json` shows each program's input_schema"
            )),
            StartError::Conflict { .. } => Some(
                "choose another --id, or start with the same program and input to get that tree back"
                    .to_owned(),
            ),
            StartError::LeaseHeld { until, .. } => Some(lease_hint(bin, *until)),
            StartError::Tree(error) => error.hint(bin),
            _ => None,
        }
    }
}

impl Explain for SignalError {
    fn code(&self) -> &str {
        SignalError::code(self)
    }

    fn hint(&self, bin: &str) -> Option<String> {
        match self {
            SignalError::Tree(error) => error.hint(bin),
            SignalError::Stopped(error) => error.hint(bin),
            _ => None,
        }
    }
}

impl Explain for ControlError {
    fn code(&self) -> &str {
        ControlError::code(self)
    }

    fn hint(&self, bin: &str) -> Option<String> {
        match self {
            ControlError::Tree(error) => error.hint(bin),
            ControlError::Stopped(error) => error.hint(bin),
            _ => None,
        }
    }
}

impl Explain for StoreError {
    fn code(&self) -> &str {
        "engine.store.failed"
    }

    fn hint(&self, _bin: &str) -> Option<String> {
        self.retryable()
            .then(|| "the store may be briefly unavailable: run the command again".to_owned())
    }
}
