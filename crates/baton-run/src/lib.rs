//! # baton-run: the Baton run kernel
//!
//! Owns the vocabulary and the machinery every other Baton crate stands on:
//! canonical [`Payload`]s (built whole from parts with [`PayloadWriter`])
//! and blake3 [`Digest`]s, identifiers, [`Quota`] and
//! [`Budget`], [`Descriptor`]s with JSON Schemas, the [`Definition`] /
//! [`Execution`] step protocol, [`Effect`]s, [`Signal`]s and
//! [`Settlement`]s, [`Dispatcher`]s, typed [`Program`]s, the hash-chained
//! [`log`], the [`Store`] contract with [`MemoryStore`], and the [`Engine`]
//! that runs trees on tokio.
//!
//! Depend on it to write a program, a dispatcher or a store backend. Most
//! applications use the `baton` facade, which re-exports this crate as
//! `baton::run`.
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
pub mod log;
mod payload;
mod program;
mod store;

pub use budget::{Budget, Capabilities, Dimension, Meters, Quota, TreeLimits, Usage};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use descriptor::{Descriptor, DescriptorError, Schema, SchemaError, SchemaViolation};
pub use digest::{Digest, DigestParseError, Purpose};
pub use engine::{
    ControlError, EffectView, Engine, EngineConfig, Event, EventKind, OutputError, ProcessHandle,
    ProcessView, RecoverError, RecoverOptions, RuntimeError, SignalError, SignalReceipt,
    SignalRequest, Sleep, StartError, StartRequest, TreeCapture, TreeView, WaitView,
};
pub use failure::{Cause, Failure, FailureKind, Status, StepError, Termination};
pub use ids::{
    ChildKey, EffectId, IdError, Name, ProcessId, Scope, SignalId, StartId, StartKey, TreeId,
    WaitId,
};
pub use payload::{Payload, PayloadError, PayloadWriter, WriteError, deserialize_present};
pub use program::{
    Boundary, BoxFuture, Cancellation, ChildOutcome, ChildSignal, Condition, Definition, DeltaSink,
    DispatchCall, Dispatcher, Effect, Execution, ExecutionState, Program, ProgramConfig,
    ProgramRef, ReplayPolicy, Settlement, Signal, SignalBody, Transition, configuration_digest,
    implementation_digest,
};
pub use store::{
    AcquireRequest, Acquired, Append, AppendOutcome, Lease, ListFilter, MemoryStore, Store,
    StoreError, TreeLoad, TreeMeta, TreeStatus,
};
