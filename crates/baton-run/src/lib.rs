//! # baton-run: the Baton run kernel
//!
//! Owns the vocabulary and the machinery every other Baton crate stands on:
//! canonical [`Payload`]s (built whole from parts with
//! [`PayloadWriter`](program::PayloadWriter))
//! and blake3 [`Digest`]s, identifiers, [`Quota`] and
//! [`Budget`], [`Descriptor`](program::Descriptor)s with JSON Schemas, the
//! [`Definition`](program::Definition) / [`Execution`](program::Execution)
//! step protocol, [`Effect`](program::Effect)s, [`Signal`](program::Signal)s
//! and [`Settlement`]s, [`Dispatcher`](dispatch::Dispatcher)s, typed
//! [`Program`]s, the hash-chained [`log`], the [`Store`](store::Store)
//! contract with [`MemoryStore`], and the [`Engine`]
//! that runs trees on tokio.
//!
//! Depend on it to write a program, a dispatcher or a store backend. Most
//! applications use the `baton` facade, which re-exports this crate as
//! `baton::run`.
//!
//! ## Where things are
//!
//! - The crate root holds what a host uses to run work: the [`Engine`] and
//!   its configuration, requests and handles, views and events, errors,
//!   ids, payloads, budgets, failures, clocks, [`Program`] and
//!   [`MemoryStore`].
//! - [`program`]: what a program's author implements and returns: the
//!   [`Definition`](program::Definition) / [`Execution`](program::Execution)
//!   step protocol, transitions, effects, signals, descriptors and schemas.
//! - [`dispatch`]: the seam for effects that reach the outside world, for
//!   implementors of a [`Dispatcher`](dispatch::Dispatcher).
//! - [`store`]: the storage contract, for implementors of a
//!   [`Store`](store::Store) backend (and hosts that list trees).
//! - [`log`]: the records of a tree's hash-chained log.
//!
//! The kernel deliberately knows nothing of chat, models, teams, workflows,
//! SQL or HTTP: those are programs, dispatchers and stores built on it.
//!
//! Invariants it keeps: a step is pure and its candidate state is restored
//! before it is adopted; every fact is committed to the log before it is
//! acted on (a dispatch's pending record before I/O, its settlement before
//! the process sees it); budgets are charged before work and only shrink;
//! on recovery a pending dispatch whose replay policy is `Never` settles as
//! unknown and parks its process rather than being sent again.
//!
//! No cargo features.

mod budget;
mod canonical;
mod clock;
mod descriptor;
mod digest;
mod engine;
mod failure;
mod ids;
mod labels;
pub mod log;
mod observe;
mod payload;
mod pieces;
mod protocol;
mod rows;
mod storage;
mod tagged;
#[cfg(test)]
mod test_json;

pub use budget::{Budget, Capabilities, Dimension, Meters, Quota, TreeLimits, Usage};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use digest::{Digest, DigestParseError};
pub use engine::{
    Condition, ConfigError, ControlError, EffectView, Ended, Engine, EngineConfig, Event,
    EventKind, Events, EventsError, IdentityPart, LiveProgress, OutputError, ProcessHandle,
    ProcessView, RecoverOptions, RuntimeError, SignalError, SignalReceipt, SignalRequest, Sleep,
    StartError, StartRequest, Started, TreeCapture, TreeError, TreeView, Verification,
    VersionMismatch, Visibility, WaitView, Watch, WatchEvent, WatchKind,
};
pub use engine::{ProcessUsage, ProgramUsage, UsageReport};
pub use failure::{Cause, Failure, FailureKind, Status, Termination};
pub use ids::{
    ChildKey, EffectId, IdError, Name, ProcessId, Scope, SignalId, StartId, StartKey, TreeId,
    WaitId,
};
pub use labels::{
    LabelError, LabelKey, Labels, MAX_LABEL_KEY_BYTES, MAX_LABEL_VALUE_BYTES, MAX_LABELS,
};
pub use payload::{Payload, PayloadError};
pub use protocol::{
    BoxFuture, Program, ProgramRef, ProgramRole, ProgramVersion, Progress, Settlement,
};
pub use storage::MemoryStore;

/// What a program's author implements and returns: the step protocol
/// ([`Definition`](crate::program::Definition),
/// [`Execution`](crate::program::Execution),
/// [`Transition`](crate::program::Transition)), effects and signals,
/// descriptors and schemas, and the helpers that build payloads and
/// program identities.
pub mod program {
    pub use crate::descriptor::{
        Descriptor, DescriptorError, Schema, SchemaError, SchemaViolation,
    };
    pub use crate::digest::Purpose;
    pub use crate::failure::StepError;
    pub use crate::payload::{PayloadWriter, WriteError, common_prefix, deserialize_present};
    pub use crate::protocol::{
        Boundary, ChildOutcome, ChildSignal, Condition, Definition, Effect, Execution,
        ExecutionState, Grant, ProgramConfig, Signal, SignalBody, Transition, configuration_digest,
        implementation_digest,
    };
}

/// The seam for effects that reach the outside world: a program's
/// [`Dispatcher`](crate::dispatch::Dispatcher) carries out its `Dispatch`
/// effects, told by its [`ReplayPolicy`](crate::dispatch::ReplayPolicy)
/// whether an effect may be sent again after a crash; a failure it
/// classifies with a [`RetryHint`](crate::dispatch::RetryHint) is tried
/// again as the effect's [`RetryPolicy`](crate::dispatch::RetryPolicy) says.
pub mod dispatch {
    pub use crate::protocol::{
        Cancellation, Certainty, DeltaSink, DispatchCall, Dispatcher, ReplayPolicy, RetryHint,
        RetryPolicy,
    };
}

/// The storage contract: a [`Store`](crate::store::Store) persists many
/// trees' logs and
/// snapshots under leases with fencing tokens. Implement it for a new
/// backend and check it with `baton-testkit`'s conformance kits; hosts
/// use [`Store::list`](crate::store::Store::list) to list trees.
pub mod store {
    pub use crate::pieces::{CUTS_PER_TREE, LastCut, LastCuts, Piece, split_after, split_pieces};
    pub use crate::rows::{StoredMeta, stored_digest, stored_kind, stored_status, stored_uint};
    pub use crate::storage::{
        AcquireRequest, Acquired, Append, AppendOutcome, Change, ChangeHub, ChangeSender, Changes,
        CreateTree, Created, CursorError, ErrorSource, Lease, ListCursor, ListFilter, Listing,
        Message, MessageId, MessageIdError, PostOutcome, Posted, Settle, SettleOutcome, Store,
        StoreError, TreeLoad, TreeMeta, TreeStatus, UnreadableRow,
    };
}
