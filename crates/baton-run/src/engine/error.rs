//! The errors of the engine's operation families, each with stable codes.
//!
//! One narrow enum per family: starting a root ([`StartError`]), reading or
//! taking up a stored tree ([`TreeError`]), delivering a host signal
//! ([`SignalError`]), controlling a process ([`ControlError`]), reading a
//! typed output ([`OutputError`]), and a tree's writer stopping without a
//! result ([`RuntimeError`]).

use crate::clock::Timestamp;
use crate::digest::Digest;
use crate::failure::{Failure, Termination};
use crate::ids::{EffectId, ProcessId, Scope, SignalId, StartId, TreeId, WaitId};
use crate::payload::PayloadError;
use crate::storage::StoreError;

use super::version::VersionMismatch;

/// A tree's writer stopped without a result: the store failed or another
/// writer fenced it. The log holds everything committed; recover elsewhere.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The store failed; nothing after the last acknowledged commit is known.
    #[error("tree {tree} stopped: storage failed after record {head_seq}: {error}")]
    Storage {
        /// The tree.
        tree: TreeId,
        /// The last acknowledged sequence.
        head_seq: u64,
        /// The storage error.
        error: StoreError,
    },
    /// Another writer took the tree over.
    #[error("tree {tree} stopped: another writer fenced this engine after record {head_seq}")]
    Fenced {
        /// The tree.
        tree: TreeId,
        /// The last acknowledged sequence.
        head_seq: u64,
    },
    /// The log head moved underneath this writer.
    #[error("tree {tree} stopped: the log head moved (expected {expected}, found {found})")]
    Conflict {
        /// The tree.
        tree: TreeId,
        /// The sequence this writer expected.
        expected: u64,
        /// The store's head.
        found: u64,
    },
    /// The engine was closed or dropped.
    #[error("tree {tree} stopped: the engine was closed")]
    Closed {
        /// The tree.
        tree: TreeId,
    },
    /// Stored state could not be folded (engine defect or corrupt store).
    #[error("tree {tree} stopped: {message}")]
    Inconsistent {
        /// The tree.
        tree: TreeId,
        /// What did not apply.
        message: String,
    },
}

impl RuntimeError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            RuntimeError::Storage { .. } => "engine.tree.committer_failed",
            RuntimeError::Fenced { .. } => "engine.tree.incarnation_conflict",
            RuntimeError::Conflict { .. } => "engine.tree.committer_conflict",
            RuntimeError::Closed { .. } => "engine.closed",
            RuntimeError::Inconsistent { .. } => "engine.tree.inconsistent",
        }
    }
}

/// Why a start was refused. Nothing is written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The input does not encode or fails the input schema (`contract`).
    #[error("start refused: {0}")]
    Input(Failure),
    /// The program's `start`, `snapshot` or `restore` failed.
    #[error("start refused: {0}")]
    Program(Failure),
    /// The start id names a tree with another program or input.
    #[error(
        "start refused (engine.start.conflict): start id {key:?} in scope {scope:?} already names a tree with a different program or input",
        key = id.key.as_str(),
        scope = id.scope.as_str()
    )]
    Conflict {
        /// The start id.
        id: StartId,
    },
    /// Another writer holds the tree's lease.
    #[error("start refused (engine.lease.held): tree is held by {owner} until {until}")]
    LeaseHeld {
        /// The holder.
        owner: String,
        /// Expiry.
        until: Timestamp,
    },
    /// Another writer took the tree's lease over between this start's
    /// lease grant and its first record: nothing was written, and the tree
    /// is the other writer's.
    #[error(
        "start refused (engine.tree.incarnation_conflict): another writer took tree {tree} over before the start was written"
    )]
    Fenced {
        /// The tree.
        tree: TreeId,
    },
    /// The program is not registered with this engine.
    #[error(
        "start refused (engine.program.unregistered): program {name} ({digest}) is not registered; add it to EngineConfig::programs"
    )]
    Unregistered {
        /// The program's name.
        name: String,
        /// Its exact ref digest.
        digest: Digest,
    },
    /// No program of that name is registered with this engine.
    #[error(
        "start refused (engine.program.unknown): no program named {name} is registered; add it to EngineConfig::programs"
    )]
    UnknownProgram {
        /// The name asked for.
        name: String,
    },
    /// The engine is shutting down and takes no new work.
    #[error(
        "start refused (engine.shutting_down): the engine is shutting down; start the tree on another engine or after a restart"
    )]
    ShuttingDown,
    /// The stored tree could not be read.
    #[error("start refused: {0}")]
    Tree(#[from] TreeError),
    /// The store failed.
    #[error("start refused: {0}")]
    Store(#[from] StoreError),
}

impl StartError {
    /// Stable code.
    pub fn code(&self) -> &str {
        match self {
            StartError::Input(failure) | StartError::Program(failure) => failure.code(),
            StartError::Conflict { .. } => "engine.start.conflict",
            StartError::LeaseHeld { .. } => "engine.lease.held",
            StartError::Fenced { .. } => "engine.tree.incarnation_conflict",
            StartError::Unregistered { .. } => "engine.program.unregistered",
            StartError::UnknownProgram { .. } => "engine.program.unknown",
            StartError::ShuttingDown => "engine.shutting_down",
            StartError::Tree(error) => error.code(),
            StartError::Store(_) => "engine.store.failed",
        }
    }
}

/// Why a stored tree could not be read or taken up (by [`Engine::process`],
/// [`Engine::recover`], [`Engine::inspect`], [`Engine::capture`] and
/// [`Engine::verify`]). The stored tree is left untouched.
///
/// [`Engine::process`]: super::Engine::process
/// [`Engine::recover`]: super::Engine::recover
/// [`Engine::inspect`]: super::Engine::inspect
/// [`Engine::capture`]: super::Engine::capture
/// [`Engine::verify`]: super::Engine::verify
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TreeError {
    /// No tree with that id is stored.
    #[error("engine.tree.not_found: no tree {tree}")]
    NotFound {
        /// The tree.
        tree: TreeId,
    },
    /// The caller's scope is not the tree's.
    #[error("engine.scope.mismatch: tree {tree} is not in scope {scope}")]
    Scope {
        /// The tree.
        tree: TreeId,
        /// The caller's scope.
        scope: Scope,
    },
    /// A stored program is not in this engine's registry: the tree keeps
    /// the exact version it started with. `mismatch` says which part of the
    /// identity differs from the registered versions of the name, and what
    /// to register.
    #[error(
        "engine.program.unavailable: tree {tree} needs program {name} ({digest}), which is not registered: {mismatch}"
    )]
    ProgramUnavailable {
        /// The tree.
        tree: TreeId,
        /// The program's name.
        name: String,
        /// Its exact ref digest.
        digest: Digest,
        /// How it differs from the registered versions of its name (boxed:
        /// it is large, and errors are passed around often).
        mismatch: Box<VersionMismatch>,
    },
    /// The log does not verify or does not fold, or the store's record of
    /// the tree disagrees with its log.
    #[error("engine.log.corrupt: tree {tree}: {message}")]
    Corrupt {
        /// The tree.
        tree: TreeId,
        /// The record where the damage shows, when one does.
        record: Option<u64>,
        /// What is wrong.
        message: String,
    },
    /// Another writer holds a live lease.
    #[error("engine.lease.held: tree {tree} is held by {owner} until {until}")]
    LeaseHeld {
        /// The tree.
        tree: TreeId,
        /// The holder.
        owner: String,
        /// Expiry.
        until: Timestamp,
    },
    /// Another live engine holds the tree, and it did not apply the command
    /// posted to the tree's inbox within
    /// [`EngineConfig::forward_timeout`](super::EngineConfig::forward_timeout).
    /// The command stays queued and the holder (or whichever engine takes
    /// the tree up next) applies it.
    #[error(
        "engine.forward.timeout: tree {tree} is held by {owner}, which has not applied the command within {waited:?}; the command is queued in the tree's inbox and will be applied by the holder (repeating an answer is safe: answers are idempotent by wait id)"
    )]
    ForwardTimeout {
        /// The tree.
        tree: TreeId,
        /// The holder when the command was posted.
        owner: String,
        /// How long the caller waited.
        waited: std::time::Duration,
    },
    /// The engine holding the tree refused the forwarded command with an
    /// error this engine has no variant for.
    #[error(
        "engine.forward.failed: tree {tree}: the holding engine refused the command: {code}: {message}"
    )]
    ForwardFailed {
        /// The tree.
        tree: TreeId,
        /// The holder's failure code.
        code: String,
        /// The holder's message.
        message: String,
    },
    /// The engine is shutting down and takes up no more trees.
    #[error(
        "engine.shutting_down: the engine is shutting down and takes up no tree; tree {tree} continues on the next engine that recovers it"
    )]
    ShuttingDown {
        /// The tree.
        tree: TreeId,
    },
    /// This engine's writer of the tree stopped (another writer fenced it,
    /// or its store failed); the next call takes the tree up afresh.
    #[error(transparent)]
    Stopped(RuntimeError),
    /// The store failed.
    #[error("engine.store.failed: {0}")]
    Store(#[from] StoreError),
}

impl TreeError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            TreeError::NotFound { .. } => "engine.tree.not_found",
            TreeError::Scope { .. } => "engine.scope.mismatch",
            TreeError::ProgramUnavailable { .. } => "engine.program.unavailable",
            TreeError::Corrupt { .. } => "engine.log.corrupt",
            TreeError::LeaseHeld { .. } => "engine.lease.held",
            TreeError::ForwardTimeout { .. } => "engine.forward.timeout",
            TreeError::ForwardFailed { .. } => "engine.forward.failed",
            TreeError::ShuttingDown { .. } => "engine.shutting_down",
            TreeError::Stopped(error) => error.code(),
            TreeError::Store(_) => "engine.store.failed",
        }
    }
}

/// Why a host signal was refused. Nothing is written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignalError {
    /// The process has terminated.
    #[error("engine.signal.terminated: process {process} has terminated")]
    Terminated {
        /// The process.
        process: ProcessId,
    },
    /// No wait with that id was ever opened by the process.
    #[error("engine.signal.unknown_wait: process {process} has no wait {wait}")]
    UnknownWait {
        /// The process.
        process: ProcessId,
        /// The wait.
        wait: WaitId,
    },
    /// The wait was already answered.
    #[error("engine.signal.wait_closed: wait {wait} was already answered")]
    WaitClosed {
        /// The wait.
        wait: WaitId,
    },
    /// The payload fails the answer or signal schema (`contract`).
    #[error("{0}")]
    Rejected(Failure),
    /// The id was used before with different content.
    #[error("engine.signal.conflict: signal {id} was admitted before with different content")]
    Conflict {
        /// The signal id.
        id: SignalId,
    },
    /// The process's signal budget is spent; the process is unharmed.
    #[error("engine.limit.signals: process {process} has no signal budget left")]
    BudgetExhausted {
        /// The process.
        process: ProcessId,
    },
    /// The mailbox holds as many unconsumed signals as the tree allows.
    #[error(
        "engine.limit.pending_signals: process {process} already holds {limit} unconsumed signals"
    )]
    MailboxFull {
        /// The process.
        process: ProcessId,
        /// The limit.
        limit: u64,
    },
    /// The tree's writer stopped.
    #[error(transparent)]
    Stopped(#[from] RuntimeError),
    /// The tree could not be found or taken up.
    #[error(transparent)]
    Tree(TreeError),
}

impl SignalError {
    /// A tree that could not be taken up, as a signal's refusal.
    pub(super) fn from_tree(error: TreeError) -> SignalError {
        match error {
            TreeError::Stopped(error) => SignalError::Stopped(error),
            other => SignalError::Tree(other),
        }
    }

    /// Stable code.
    pub fn code(&self) -> &str {
        match self {
            SignalError::Terminated { .. } => "engine.signal.terminated",
            SignalError::UnknownWait { .. } => "engine.signal.unknown_wait",
            SignalError::WaitClosed { .. } => "engine.signal.wait_closed",
            SignalError::Rejected(failure) => failure.code(),
            SignalError::Conflict { .. } => "engine.signal.conflict",
            SignalError::BudgetExhausted { .. } => "engine.limit.signals",
            SignalError::MailboxFull { .. } => "engine.limit.pending_signals",
            SignalError::Stopped(error) => error.code(),
            SignalError::Tree(error) => error.code(),
        }
    }
}

/// Why a control (cancel, kill, resolve, replay) was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// The process has terminated.
    #[error("engine.control.terminated: process {process} has terminated")]
    Terminated {
        /// The process.
        process: ProcessId,
    },
    /// The effect is not an unknown effect of a live process of the tree.
    #[error("engine.effect.not_unknown: effect {effect} is not an unknown effect of tree {tree}")]
    NotUnknown {
        /// The tree.
        tree: TreeId,
        /// The effect.
        effect: EffectId,
    },
    /// The resolution is itself unknown, or replay is not allowed.
    #[error("engine.effect.resolution.invalid: {0}")]
    Invalid(String),
    /// The tree could not be found or taken up.
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// The tree's writer stopped.
    #[error(transparent)]
    Stopped(#[from] RuntimeError),
}

impl ControlError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ControlError::Terminated { .. } => "engine.control.terminated",
            ControlError::NotUnknown { .. } => "engine.effect.not_unknown",
            ControlError::Invalid(_) => "engine.effect.resolution.invalid",
            ControlError::Tree(error) => error.code(),
            ControlError::Stopped(error) => error.code(),
        }
    }
}

/// Why a typed output could not be had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// The process did not complete.
    #[error("process did not complete: {0}")]
    NotCompleted(Termination),
    /// The output does not decode into the requested type.
    #[error(transparent)]
    Decode(#[from] PayloadError),
    /// The tree's writer stopped.
    #[error(transparent)]
    Stopped(#[from] RuntimeError),
}
