//! # baton-coordination: an input gate, first-success racing and deadlines
//!
//! Owns three coordination programs built on the kernel's step protocol:
//!
//! - [`InputGate`]: one-shot human or external input. It opens one
//!   external wait carrying its request and answer schema and completes
//!   only with an input signal addressed to that wait; its output is the
//!   whole signal ([`Answer`]: id, wait id, payload).
//! - [`FirstSuccess`]: starts up to `max_candidates` child programs at
//!   once, waits for `Any` of them at boundary `Result`, applies a pure
//!   `accept` to the outcomes in request order, and completes with
//!   [`Race`] `{winner?, starts, outcomes}`; the losers still running are
//!   canceled.
//! - [`Deadline`] and its [`Timer`] dispatcher: an absolute instant as
//!   input; the step never reads the clock, the timer reads the engine's
//!   injectable clock and replays with `SameIdentity`, so after a crash the
//!   same effect fires once at the original instant.
//!
//! Racing an input gate against a deadline inside `FirstSuccess` gives
//! "input with timeout" (see `input_with_timeout` in the `baton-examples` crate).
//!
//! Depend on it (or on the `baton` facade's `baton::coordination`) to wait
//! for people or for time inside a tree. It depends only on `baton-run`
//! and knows nothing of teams, workflows, models or stores. Failure codes
//! are `coordination.<program>.<suffix>` (see `docs/coordination.md`).
//!
//! No cargo features.

mod deadline;
mod first_success;
mod gate;

pub use deadline::{Deadline, INTERRUPTED, Timer, TimerRequest, TimerResult};
pub use first_success::{
    Accept, Candidate, CandidateError, FirstSuccess, FirstSuccessConfig, Outcome, Race, Start,
};
pub use gate::{Answer, GateConfig, InputGate, WAIT_KEY};

/// Why a coordination program could not be built. Nothing is bound.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The name or description is not a valid descriptor.
    #[error("invalid descriptor: {0}")]
    Descriptor(#[from] baton_run::program::DescriptorError),
    /// An input gate's answer schema is `false`, so it could never be answered.
    #[error("the answer schema rejects every answer")]
    AnswerSchemaRejectsAll,
    /// `max_candidates` is zero.
    #[error("max_candidates must be at least 1")]
    ZeroMaxCandidates,
    /// No candidate program is declared.
    #[error("a first-success race needs at least one candidate program")]
    NoCandidatePrograms,
    /// The build identity is empty.
    #[error("the build identity must not be empty")]
    Build,
    /// The configuration could not be encoded.
    #[error("the configuration does not encode: {message}")]
    Encode {
        /// What the encoder reported.
        message: String,
    },
}
