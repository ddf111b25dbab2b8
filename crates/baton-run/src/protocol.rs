//! Programs: definitions, executions, transitions, effects, signals,
//! settlements, dispatchers, and the typed `Program` binding.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::budget::{Budget, Capabilities, Meters};
use crate::clock::Clock;
use crate::descriptor::{Descriptor, Schema};
use crate::digest::{Digest, Purpose};
use crate::failure::{Failure, StepError};
use crate::ids::{ChildKey, EffectId, Name, ProcessId, SignalId, WaitId};
pub use crate::observe::{ProgramRole, Progress};
use crate::payload::Payload;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The opaque private state of one execution. The kernel never parses it; it
/// stores it and hands it back to `Definition::restore`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ExecutionState(pub Payload);

impl ExecutionState {
    /// Encodes a typed state.
    pub fn encode<T: Serialize>(state: &T) -> Result<ExecutionState, StepError> {
        Ok(ExecutionState(Payload::encode(state)?))
    }

    /// Decodes a typed state; failure is `execution.state.invalid`.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, StepError> {
        self.0.decode().map_err(|error| {
            StepError(Failure::contract(
                "execution.state.invalid",
                error.to_string(),
            ))
        })
    }
}

/// Immutable behaviour: a descriptor, a way to start from an input and a way
/// to restore from a recorded state. Safe to call concurrently.
pub trait Definition: Send + Sync + 'static {
    /// The contract.
    fn descriptor(&self) -> &Descriptor;

    /// Starts a new execution from a validated input. No I/O.
    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError>;

    /// Rebuilds an execution from a state produced by `Execution::snapshot`.
    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError>;

    /// The exact child programs this definition may start.
    fn children(&self) -> Vec<Program> {
        Vec::new()
    }

    /// What the program is to people watching a run (never part of its
    /// identity): an agent's events are projected into an agent stream,
    /// a tool's into tool calls of the agent that started it.
    fn role(&self) -> ProgramRole {
        ProgramRole::Program
    }
}

/// The private state of one process. A step is pure: no I/O, no clock, no
/// randomness, no spawned work.
pub trait Execution: Send + 'static {
    /// Advances on the whole unconsumed mailbox suffix.
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError>;

    /// The state to record; must restore through the definition.
    fn snapshot(&self) -> Result<ExecutionState, StepError>;

    /// What the process is doing now, read by the engine after each
    /// committed step and published when it changed (a pure function of
    /// the execution's state; `None`, the default, publishes nothing).
    fn progress(&self) -> Option<Progress> {
        None
    }
}

crate::tagged::tag_first! {
tag = "transition", remote = "Transition", expecting = "a transition";
/// What a step decided. Each variant says how many leading signals of the
/// window it consumed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Carry out `effects` in order, then step again with their results.
    Continue {
        /// Signals consumed.
        consumed: usize,
        /// Effects in declaration order.
        effects: Vec<Effect>,
    },
    /// Sleep until a signal addressed to `wait` arrives.
    Wait {
        /// Signals consumed.
        consumed: usize,
        /// The wait to be woken by.
        wait: WaitId,
    },
    /// Complete with an output (validated against the output schema).
    Complete {
        /// Signals consumed.
        consumed: usize,
        /// The output.
        output: Payload,
    },
    /// Fail with a classified failure.
    Fail {
        /// Signals consumed.
        consumed: usize,
        /// The failure.
        failure: Failure,
    },
}
}

impl Transition {
    /// Signals consumed.
    pub fn consumed(&self) -> usize {
        match self {
            Transition::Continue { consumed, .. }
            | Transition::Wait { consumed, .. }
            | Transition::Complete { consumed, .. }
            | Transition::Fail { consumed, .. } => *consumed,
        }
    }
}

crate::tagged::tag_first! {
tag = "effect", remote = "Effect", expecting = "an effect";
/// An effect a step declares. Framework effects are carried out by the
/// kernel; `Dispatch` is opaque and goes to the program's dispatcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Opens an external wait, answered by the host with a signal addressed
    /// to the minted `WaitId`; the answer is validated against
    /// `answer_schema` before it is committed.
    Wait {
        /// A program-chosen key, for people and logs.
        key: ChildKey,
        /// What is being asked.
        request: Payload,
        /// Schema every answer must satisfy.
        answer_schema: Schema,
    },
    /// Sends `request` to the program's dispatcher. `reserve` is the worst
    /// case meter usage, charged before any I/O.
    Dispatch {
        /// The frozen request.
        request: Payload,
        /// Worst-case meter usage (of each attempt).
        #[serde(default, skip_serializing_if = "Meters::is_empty")]
        reserve: Meters,
        /// How failed attempts are tried again; none by default.
        #[serde(default, skip_serializing_if = "RetryPolicy::is_none")]
        retry: RetryPolicy,
    },
    /// Starts a child of one of the definition's declared programs. The
    /// budget is debited from the parent for good; the capabilities must be
    /// a subset of the parent's. The result arrives as
    /// [`SignalBody::ChildStarted`]; a refusal is a failed result, not a
    /// failure of the parent.
    StartChild {
        /// The child's key, unique under this parent.
        key: ChildKey,
        /// The exact program (`ProgramRef::digest` of a declared child).
        program: Digest,
        /// The child's input (validated against its input schema).
        input: Payload,
        /// The child's budget.
        budget: Budget,
        /// The child's capabilities.
        #[serde(default, skip_serializing_if = "Capabilities::is_empty")]
        capabilities: Capabilities,
        /// How `budget` is granted: exactly (the default, and what logs
        /// written before this field mean), or clipped to what the parent
        /// has left.
        #[serde(default, skip_serializing_if = "Grant::is_exact")]
        grant: Grant,
    },
    /// Delivers a signal to a child: its mailbox append and the parent's
    /// receipt commit together; a refusal leaves the child unchanged.
    SignalChild {
        /// The child.
        key: ChildKey,
        /// The signal (validated by the child's wait or signal schema).
        signal: ChildSignal,
    },
    /// Asks a child to cancel. The receipt confirms intent only; the child's
    /// drained outcome arrives later with status `Canceled`.
    CancelChild {
        /// The child.
        key: ChildKey,
        /// Why.
        reason: String,
    },
    /// Waits until children reach a boundary; settles with the children at
    /// the boundary, in the order of `keys`, as [`SignalBody::ChildrenReady`].
    WaitChildren {
        /// Children of this process, by key.
        keys: Vec<ChildKey>,
        /// Terminal result, or whole subtree drained.
        boundary: Boundary,
        /// How many must reach it.
        condition: Condition,
    },
}
}

/// How a child start grants its budget.
///
/// `Exact` grants the budget as written and refuses a start the parent
/// cannot afford (`engine.child.budget_exhausted`). `Clipped` grants, in
/// each dimension, the smaller of the request and what the parent has left:
/// an unlimited request under a finite parent gets the parent's remainder,
/// and a meter the parent limits but the request does not name is granted
/// zero, so a clipped child never takes what it did not ask for. A clipped
/// start is never refused for budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    /// This budget, or a refusal.
    #[default]
    Exact,
    /// This budget, clipped to what the parent has left.
    Clipped,
}

impl Grant {
    /// Whether this is the exact (default) grant.
    pub fn is_exact(&self) -> bool {
        matches!(self, Grant::Exact)
    }
}

/// Where a child must be for [`Effect::WaitChildren`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Boundary {
    /// The child itself has terminated.
    Result,
    /// The child and its whole subtree have terminated.
    Drained,
}

/// How many children must reach the boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// Every listed child.
    All,
    /// At least one. The engine settles the wait once nothing else in the
    /// tree can progress (or one commit's steps are spent), so the outcome
    /// carries every listed child ready by then, which may be more than one.
    Any,
    /// At least k (1 ≤ k ≤ number of keys).
    Quorum(u32),
}

/// A signal a parent sends a child.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChildSignal {
    /// Caller-stable identity; the same id and content again is a no-op.
    pub id: SignalId,
    /// The child's wait it answers, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<WaitId>,
    /// The content.
    pub payload: Payload,
}

/// A child at a wait's boundary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChildOutcome {
    /// Its key.
    pub key: ChildKey,
    /// Its process.
    pub process: ProcessId,
    /// How it ended; for a drained boundary, `unresolved_effects` lists
    /// effects left unresolved anywhere in its subtree.
    pub termination: crate::failure::Termination,
}

impl Effect {
    /// A dispatch with no meter reservation and no retries.
    pub fn dispatch(request: Payload) -> Effect {
        Effect::Dispatch {
            request,
            reserve: Meters::new(),
            retry: RetryPolicy::none(),
        }
    }

    /// The effect's kind name.
    pub fn kind(&self) -> &'static str {
        match self {
            Effect::Wait { .. } => "wait",
            Effect::Dispatch { .. } => "dispatch",
            Effect::StartChild { .. } => "start_child",
            Effect::SignalChild { .. } => "signal_child",
            Effect::CancelChild { .. } => "cancel_child",
            Effect::WaitChildren { .. } => "wait_children",
        }
    }
}

crate::tagged::tag_first! {
tag = "status", remote = "Settlement", expecting = "a settlement";
/// The recorded result of an effect, of a control or of a host resolution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// It succeeded with an output.
    Succeeded {
        /// The result.
        output: Payload,
        /// Actual meter usage.
        #[serde(default, skip_serializing_if = "Meters::is_empty")]
        usage: Meters,
    },
    /// It definitely failed.
    Failed {
        /// Why.
        failure: Failure,
        /// Actual meter usage.
        #[serde(default, skip_serializing_if = "Meters::is_empty")]
        usage: Meters,
        /// Whether another attempt may succeed, and how long the other side
        /// asked to wait: what a dispatch's [`RetryPolicy`] reads.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry: Option<RetryHint>,
    },
    /// Its outcome is not known (e.g. lost in a crash); the host must resolve it.
    Unknown {
        /// Bounded diagnostic text.
        diagnostic: String,
    },
}
}

impl Settlement {
    /// Success without meter usage.
    pub fn ok(output: Payload) -> Settlement {
        Settlement::Succeeded {
            output,
            usage: Meters::new(),
        }
    }

    /// Definite failure without meter usage.
    pub fn failed(failure: Failure) -> Settlement {
        Settlement::Failed {
            failure,
            usage: Meters::new(),
            retry: None,
        }
    }

    /// A failure that another attempt may fix, as `retry` says.
    pub fn failed_retryable(failure: Failure, retry: RetryHint) -> Settlement {
        Settlement::Failed {
            failure,
            usage: Meters::new(),
            retry: Some(retry),
        }
    }

    /// Whether the outcome is unknown.
    pub fn is_unknown(&self) -> bool {
        matches!(self, Settlement::Unknown { .. })
    }

    /// Reported meter usage.
    pub fn usage(&self) -> Option<&Meters> {
        match self {
            Settlement::Succeeded { usage, .. } | Settlement::Failed { usage, .. } => Some(usage),
            Settlement::Unknown { .. } => None,
        }
    }
}

/// A mailbox entry: input from the host or a parent, or an effect result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signal {
    /// Identity; engine-minted ids start with `engine:`.
    #[serde(deserialize_with = "SignalId::deserialize_stored")]
    pub id: SignalId,
    /// The wait this signal answers, if addressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<WaitId>,
    /// The content.
    pub body: SignalBody,
}

crate::tagged::tag_first! {
tag = "signal", remote = "SignalBody", expecting = "a signal body";
/// What a signal carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignalBody {
    /// Input from the host (an answer when addressed, steering when not).
    Input {
        /// The content.
        payload: Payload,
    },
    /// An external wait was opened; answer it by addressing `wait`.
    WaitOpened {
        /// The wait effect.
        effect: EffectId,
        /// The wait to answer.
        wait: WaitId,
        /// The wait's key.
        key: ChildKey,
        /// What is being asked.
        request: Payload,
    },
    /// A dispatch settled.
    Settled {
        /// The dispatch effect.
        effect: EffectId,
        /// Its settlement.
        settlement: Settlement,
    },
    /// A child start finished: the child's process, or why it was refused.
    ChildStarted {
        /// The start effect.
        effect: EffectId,
        /// The child's key.
        key: ChildKey,
        /// The started (or already existing, same spec) child.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        process: Option<ProcessId>,
        /// Why the start was refused.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failure: Option<Failure>,
    },
    /// Children reached a wait's boundary.
    ChildrenReady {
        /// The wait effect.
        effect: EffectId,
        /// Children at the boundary, in the wait's key order.
        children: Vec<ChildOutcome>,
    },
    /// A control (signal or cancel) was delivered or refused.
    ControlReceipt {
        /// The control effect.
        effect: EffectId,
        /// The child's key.
        key: ChildKey,
        /// `Succeeded` when delivered (a cancel: intent recorded), `Failed` when refused.
        result: Settlement,
    },
}
}

/// Whether an uncertain dispatch may be sent again after a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayPolicy {
    /// Never: a pending dispatch found on restore settles as unknown.
    Never,
    /// The dispatcher deduplicates by effect id, so re-dispatching under the
    /// same `EffectId` is safe.
    SameIdentity,
}

/// Cooperative cancellation handed to a dispatch.
#[derive(Clone, Debug)]
pub struct Cancellation(tokio::sync::watch::Receiver<bool>);

impl Cancellation {
    pub(crate) fn new() -> (tokio::sync::watch::Sender<bool>, Cancellation) {
        let (sender, receiver) = tokio::sync::watch::channel(false);
        (sender, Cancellation(receiver))
    }

    /// A token that is never canceled (for tests and direct calls).
    pub fn never() -> Cancellation {
        // With the sender gone the value stays `false` and `canceled` never resolves.
        let (_, receiver) = tokio::sync::watch::channel(false);
        Cancellation(receiver)
    }

    /// Whether cancellation was requested.
    pub fn is_canceled(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once cancellation is requested (never, if the engine drops the work).
    pub async fn canceled(&mut self) {
        if self.0.wait_for(|canceled| *canceled).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Something a dispatch reports while it runs: never in the log.
pub(crate) enum Live {
    /// A delta (e.g. model tokens).
    Delta(Payload),
    /// The dispatch's progress.
    Progress(Progress),
}

/// Sends non-durable progress (e.g. model tokens) to the engine's event
/// stream. Deltas never enter the log.
#[derive(Clone)]
pub struct DeltaSink {
    pub(crate) emit: Arc<dyn Fn(Live) + Send + Sync>,
}

impl DeltaSink {
    /// A sink that drops everything.
    pub fn discard() -> DeltaSink {
        DeltaSink {
            emit: Arc::new(|_| {}),
        }
    }

    /// Emits one delta.
    pub fn emit(&self, delta: Payload) {
        (self.emit)(Live::Delta(delta));
    }

    /// Reports the dispatch's progress: it becomes its process's latest
    /// progress (stamped with the engine's clock) and a non-durable event.
    pub fn progress(&self, progress: Progress) {
        (self.emit)(Live::Progress(progress));
    }
}

impl fmt::Debug for DeltaSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DeltaSink")
    }
}

/// One dispatch handed to a dispatcher.
#[derive(Debug)]
pub struct DispatchCall {
    /// The effect's stable identity (the same on a `SameIdentity` replay).
    pub effect: EffectId,
    /// The process that declared it.
    pub process: ProcessId,
    /// The frozen request.
    pub request: Payload,
    /// The meter reservation already charged.
    pub reserve: Meters,
    /// Which attempt this is: 1 for the first, more when a retry policy
    /// tries a failed one again (always under the same `effect`).
    pub attempt: u32,
    /// Progress sink.
    pub deltas: DeltaSink,
    /// Cancellation requested by the host or a parent.
    pub cancel: Cancellation,
    /// The engine's clock (the only source of time for dispatchers).
    pub clock: Arc<dyn Clock>,
}

/// Whether a failed attempt may have had its effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Certainty {
    /// It certainly did not (refused before doing anything: a 429, a 5xx,
    /// a connection refused before sending): another attempt is safe under
    /// any replay policy.
    Definite,
    /// It may have (a timeout after sending, a connection lost mid-answer):
    /// another attempt is safe only for a `SameIdentity` dispatcher.
    Uncertain,
}

/// A classified failure's advice about trying again: only failures that a
/// later attempt may fix carry one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryHint {
    /// Whether the failed attempt may have had its effect.
    pub certainty: Certainty,
    /// How long the other side asked to be left alone (`Retry-After`), if
    /// it said.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "after_ms",
        with = "optional_millis"
    )]
    pub after: Option<Duration>,
}

impl RetryHint {
    /// A definite failure, with the delay the other side asked for.
    pub fn definite(after: Option<Duration>) -> RetryHint {
        RetryHint {
            certainty: Certainty::Definite,
            after,
        }
    }

    /// An uncertain failure.
    pub fn uncertain() -> RetryHint {
        RetryHint {
            certainty: Certainty::Uncertain,
            after: None,
        }
    }
}

impl fmt::Display for RetryHint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.certainty {
            Certainty::Definite => f.write_str("retryable (definite)")?,
            Certainty::Uncertain => f.write_str("retryable if idempotent (uncertain)")?,
        }
        if let Some(after) = self.after {
            write!(f, ", retry after {}ms", after.as_millis())?;
        }
        Ok(())
    }
}

/// Durations as whole milliseconds on the wire.
mod optional_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<Duration>, out: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(duration) => {
                out.serialize_u64(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
            }
            None => out.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(input: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(input)?.map(Duration::from_millis))
    }
}

/// How the kernel tries a failed dispatch again: a durable policy carried
/// by the effect itself. An attempt that fails with a [`RetryHint`] is
/// tried again, under the same effect id, after a backoff: the delay
/// doubles from `initial_delay_ms` up to `max_delay_ms`, shortened by up to
/// half by a jitter derived from the effect id (so it is the same after a
/// recovery), and never shorter than the `Retry-After` the failure asked
/// for. A definite failure is retried under any replay policy; an
/// uncertain one only when the dispatcher replays `SameIdentity` (under
/// `Never`, while attempts are left, it settles unknown instead, for the
/// host to resolve; the last attempt's failure is the settlement). Each attempt and
/// each backoff is a fact in the log, a backoff is a durable timer, and
/// each attempt's meter reservation is charged before it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; 1 never tries again.
    pub attempts: u32,
    /// The backoff before the second attempt, in milliseconds.
    #[serde(default)]
    pub initial_delay_ms: u64,
    /// The longest computed backoff, in milliseconds.
    #[serde(default)]
    pub max_delay_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy::none()
    }
}

impl RetryPolicy {
    /// No retries: one attempt.
    pub const fn none() -> RetryPolicy {
        RetryPolicy {
            attempts: 1,
            initial_delay_ms: 0,
            max_delay_ms: 0,
        }
    }

    /// Up to `attempts` attempts with exponential backoff from `initial`,
    /// each delay at most `max`.
    pub fn exponential(attempts: u32, initial: Duration, max: Duration) -> RetryPolicy {
        let millis = |duration: Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        RetryPolicy {
            attempts,
            initial_delay_ms: millis(initial),
            max_delay_ms: millis(max),
        }
    }

    /// Whether this policy never tries again.
    pub fn is_none(&self) -> bool {
        self.attempts <= 1
    }

    /// Why the policy cannot be followed, if it cannot.
    pub fn problem(&self) -> Option<String> {
        if self.attempts == 0 {
            return Some("a retry policy needs at least one attempt".into());
        }
        if self.initial_delay_ms > self.max_delay_ms {
            return Some(format!(
                "a retry policy's initial delay ({} ms) exceeds its maximum ({} ms)",
                self.initial_delay_ms, self.max_delay_ms
            ));
        }
        None
    }
}

/// Executes opaque effects (model calls, timers, tools with side effects).
pub trait Dispatcher: Send + Sync + 'static {
    /// Whether a dispatch of `request` may be repeated under the same id.
    fn replay_policy(&self, request: &Payload) -> ReplayPolicy;

    /// Capabilities a process needs to dispatch `request`.
    fn required_capabilities(&self, _request: &Payload) -> Capabilities {
        Capabilities::none()
    }

    /// Carries out the call. A definite failure is `Settlement::Failed`;
    /// anything uncertain is `Settlement::Unknown`.
    fn dispatch(&self, call: DispatchCall) -> BoxFuture<'static, Settlement>;
}

/// The exact identity of a program: contract, implementation, configuration
/// and bound children, plus a digest over all of them. Resolved only by
/// exact match, never by name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramRef {
    /// Descriptor name (for people; never used to resolve).
    pub name: Name,
    /// Digest of the descriptor's contract.
    pub contract: Digest,
    /// Digest of the built code.
    pub implementation: Digest,
    /// Digest of every configuration field.
    pub configuration: Digest,
    /// Digests of bound child programs, in declaration order.
    pub children: Vec<Digest>,
    /// Digest over all the fields above.
    pub digest: Digest,
}

impl ProgramRef {
    fn compute(
        name: Name,
        contract: Digest,
        implementation: Digest,
        configuration: Digest,
        children: Vec<Digest>,
    ) -> ProgramRef {
        let mut parts: Vec<&[u8]> = vec![
            name.as_str().as_bytes(),
            contract.as_bytes(),
            implementation.as_bytes(),
            configuration.as_bytes(),
        ];
        parts.extend(children.iter().map(|child| child.as_bytes().as_slice()));
        let digest = Digest::of_parts(Purpose::Program, &parts);
        ProgramRef {
            name,
            contract,
            implementation,
            configuration,
            children,
            digest,
        }
    }

    /// Whether the stored digest matches the fields (a corrupt or forged ref does not).
    pub fn is_consistent(&self) -> bool {
        ProgramRef::compute(
            self.name.clone(),
            self.contract,
            self.implementation,
            self.configuration,
            self.children.clone(),
        )
        .digest
            == self.digest
    }
}

/// Which exact version of a program: its name and the digest of its whole
/// identity ([`ProgramRef::digest`]). What listings and views show.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramVersion {
    /// The descriptor name.
    pub name: Name,
    /// The exact version: the digest of the program's [`ProgramRef`].
    pub digest: Digest,
}

impl ProgramRef {
    /// The name and exact version of this program.
    pub fn version(&self) -> ProgramVersion {
        ProgramVersion {
            name: self.name.clone(),
            digest: self.digest,
        }
    }
}

/// Digest naming built code: a crate's name and version (use
/// `env!("CARGO_PKG_NAME")` and `env!("CARGO_PKG_VERSION")`) or a
/// caller-supplied build identity.
pub fn implementation_digest(name: &str, version: &str) -> Digest {
    Digest::of_parts(
        Purpose::Implementation,
        &[name.as_bytes(), version.as_bytes()],
    )
}

/// Digest of a configuration: the canonical JSON of every configuration field.
pub fn configuration_digest<T: Serialize + ?Sized>(
    configuration: &T,
) -> Result<Digest, crate::PayloadError> {
    Ok(Digest::of(
        Purpose::Configuration,
        Payload::encode(configuration)?.as_bytes(),
    ))
}

/// How to bind a definition into a program.
pub struct ProgramConfig {
    /// The behaviour.
    pub definition: Arc<dyn Definition>,
    /// The executor of its `Dispatch` effects, if it declares any.
    pub dispatcher: Option<Arc<dyn Dispatcher>>,
    /// Digest of the built code (see [`implementation_digest`]).
    pub implementation: Digest,
    /// Digest of every configuration field (see [`configuration_digest`]).
    pub configuration: Digest,
}

struct ProgramInner {
    definition: Arc<dyn Definition>,
    dispatcher: Option<Arc<dyn Dispatcher>>,
    children: Vec<Program>,
    reference: ProgramRef,
}

/// A definition bound to its dispatcher and identity, typed by its input
/// and output. Cheap to clone. `erase()` forgets the types.
pub struct Program<I = Payload, O = Payload> {
    inner: Arc<ProgramInner>,
    types: PhantomData<fn(I) -> O>,
}

impl<I, O> Clone for Program<I, O> {
    fn clone(&self) -> Self {
        Program {
            inner: self.inner.clone(),
            types: PhantomData,
        }
    }
}

impl<I, O> fmt::Debug for Program<I, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Program")
            .field("name", &self.inner.reference.name)
            .field("digest", &self.inner.reference.digest)
            .finish()
    }
}

impl<I, O> Program<I, O> {
    /// Binds a definition. The `ProgramRef` covers the contract, the
    /// implementation and configuration digests, and the bound children.
    pub fn new(config: ProgramConfig) -> Program<I, O> {
        let descriptor = config.definition.descriptor();
        let children = config.definition.children();
        let reference = ProgramRef::compute(
            descriptor.name().clone(),
            descriptor.digest(),
            config.implementation,
            config.configuration,
            children
                .iter()
                .map(|child| child.reference().digest)
                .collect(),
        );
        Program {
            inner: Arc::new(ProgramInner {
                definition: config.definition,
                dispatcher: config.dispatcher,
                children,
                reference,
            }),
            types: PhantomData,
        }
    }

    /// The exact identity.
    pub fn reference(&self) -> &ProgramRef {
        &self.inner.reference
    }

    /// The contract.
    pub fn descriptor(&self) -> &Descriptor {
        self.inner.definition.descriptor()
    }

    /// The behaviour.
    pub fn definition(&self) -> &Arc<dyn Definition> {
        &self.inner.definition
    }

    /// The dispatcher, if bound.
    pub fn dispatcher(&self) -> Option<&Arc<dyn Dispatcher>> {
        self.inner.dispatcher.as_ref()
    }

    /// The bound child programs.
    pub fn children(&self) -> &[Program] {
        &self.inner.children
    }

    /// Forgets the input and output types.
    pub fn erase(&self) -> Program {
        Program {
            inner: self.inner.clone(),
            types: PhantomData,
        }
    }

    /// Views the program with other input and output types. The schemas in
    /// the descriptor stay authoritative: a mismatched type only fails when
    /// encoding input or decoding output.
    pub fn retype<I2, O2>(&self) -> Program<I2, O2> {
        Program {
            inner: self.inner.clone(),
            types: PhantomData,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing(Descriptor);
    impl Definition for Nothing {
        fn descriptor(&self) -> &Descriptor {
            &self.0
        }
        fn start(&self, _: &Payload) -> Result<Box<dyn Execution>, StepError> {
            Err(StepError::other("unused"))
        }
        fn restore(&self, _: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
            Err(StepError::other("unused"))
        }
    }

    fn bind(name: &str, version: &str, config: u32) -> Program {
        Program::new(ProgramConfig {
            definition: Arc::new(Nothing(
                Descriptor::typed::<String, String>(name, "x").expect("valid"),
            )),
            dispatcher: None,
            implementation: implementation_digest("test", version),
            configuration: configuration_digest(&config).expect("encodes"),
        })
    }

    #[test]
    fn reference_tracks_every_input() {
        let base = bind("a.b", "1", 1).reference().digest;
        assert_eq!(base, bind("a.b", "1", 1).reference().digest);
        assert_ne!(base, bind("a.c", "1", 1).reference().digest);
        assert_ne!(base, bind("a.b", "2", 1).reference().digest);
        assert_ne!(base, bind("a.b", "1", 2).reference().digest);
        assert!(bind("a.b", "1", 1).reference().is_consistent());
    }
}
