//! Activities: a program whose one effect runs an async function.
//!
//! A step never does I/O, so outside work is a `Dispatch` effect carried
//! out by the program's dispatcher. An [`Activity`] packages that pattern
//! for one async function `I -> Result<O, ActivityError>`: its process
//! declares one dispatch whose request is the input, the dispatcher runs
//! the function (with the effect id as its idempotency key, under a
//! per-call timeout, a panic caught as a classified failure), and the
//! process completes with the function's output. An activity may first ask
//! a person for approval through an addressed wait.
//!
//! A workflow runs an activity with a [`call`](crate::call) stage; the
//! agent layer wraps one as a model-facing tool.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use baton_run::dispatch::{Cancellation, DeltaSink, DispatchCall, Dispatcher, ReplayPolicy};
use baton_run::dispatch::{RetryHint, RetryPolicy};
use baton_run::program::{
    Definition, Descriptor, Effect, Execution, ExecutionState, ProgramConfig, Schema, Signal,
    SignalBody, StepError, Transition, configuration_digest, implementation_digest,
};
use baton_run::{
    BoxFuture, Capabilities, ChildKey, Clock, Digest, EffectId, Failure, FailureKind, Meters, Name,
    Payload, ProcessId, Program, ProgramRole, Progress, Settlement, WaitId,
};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::workflow::ConfigError;

/// The per-call timeout an [`ActivityConfig::new`] starts with: 60 seconds.
pub const DEFAULT_ACTIVITY_TIMEOUT: Duration = Duration::from_secs(60);

/// Failure code of a function that returned an error without its own code.
pub const ACTIVITY_FAILED: &str = "workflow.activity.failed";
/// Failure code of a call that outlived its timeout (kind `external`).
pub const ACTIVITY_TIMED_OUT: &str = "workflow.activity.timed_out";
/// Failure code of a function that panicked (kind `panic`).
pub const ACTIVITY_PANICKED: &str = "workflow.activity.panicked";
/// Failure code of a request or resolution that is not a valid input or
/// output (kind `contract`).
pub const ACTIVITY_INVALID: &str = "workflow.activity.invalid";
/// Failure code of a call a person denied (kind `execution`); the message
/// is the person's reason.
pub const ACTIVITY_DENIED: &str = "workflow.activity.denied";

/// Why an activity's function did not produce an output: a classified
/// [`Failure`] (kind `external` and code `workflow.activity.failed` unless
/// the function chose others) and, for failures a later attempt may fix,
/// a [`RetryHint`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{failure}")]
pub struct ActivityError {
    failure: Failure,
    retry: Option<RetryHint>,
}

impl ActivityError {
    /// An external failure with code `workflow.activity.failed`.
    pub fn new(message: impl Into<String>) -> ActivityError {
        ActivityError::coded(ACTIVITY_FAILED, message)
    }

    /// An external failure with the function's own stable code (a lowercase
    /// dotted name; an invalid code becomes `engine.failure.invalid`).
    pub fn coded(code: &str, message: impl Into<String>) -> ActivityError {
        ActivityError {
            failure: Failure::external(code, message),
            retry: None,
        }
    }

    /// The same error with another failure kind.
    pub fn with_kind(mut self, kind: FailureKind) -> ActivityError {
        self.failure.kind = kind;
        self
    }

    /// The same error with advice about trying again.
    pub fn with_retry(mut self, retry: RetryHint) -> ActivityError {
        self.retry = Some(retry);
        self
    }

    /// The classified failure the call settles with.
    pub fn failure(&self) -> &Failure {
        &self.failure
    }

    /// The stable code.
    pub fn code(&self) -> &str {
        self.failure.code()
    }

    /// Advice about trying again, for failures a later attempt may fix.
    pub fn retry(&self) -> Option<RetryHint> {
        self.retry
    }
}

/// Whether a person must approve each call before it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    /// Calls run at once.
    #[default]
    NotRequired,
    /// Each call opens an addressed wait showing the activity and its
    /// input; a [`Verdict`] answers it.
    Required,
}

/// What an approval wait shows: which activity would run, with what input.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRequest {
    /// The activity's descriptor name.
    pub activity: Name,
    /// The input it would run with.
    pub input: Payload,
}

/// The answer to an approval wait. JSON: `{"decision": "approve"}` or
/// `{"decision": "deny", "reason": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "decision", rename_all = "snake_case", deny_unknown_fields)]
pub enum Verdict {
    /// Run the call.
    Approve,
    /// Do not run it; the call fails with `workflow.activity.denied` and
    /// this reason as its message.
    Deny {
        /// Why, for the caller (a model reads it as the tool's result).
        reason: String,
    },
}

/// What the function receives besides its input.
#[derive(Clone, Debug)]
pub struct ActivityContext {
    effect: EffectId,
    process: ProcessId,
    cancel: Cancellation,
    clock: Arc<dyn Clock>,
    deltas: DeltaSink,
}

impl ActivityContext {
    /// The call's idempotency key: its effect id, the same when a
    /// `SameIdentity` activity is sent again after a crash. Pass it to
    /// services that deduplicate (an `Idempotency-Key` header).
    pub fn idempotency_key(&self) -> EffectId {
        self.effect
    }

    /// The process the call belongs to.
    pub fn process(&self) -> ProcessId {
        self.process
    }

    /// Cooperative cancellation: set when the process is canceled. The
    /// call is never aborted for it; a long function should watch it.
    pub fn cancellation(&self) -> &Cancellation {
        &self.cancel
    }

    /// The engine's clock, the only source of time.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Where to report progress (engine events; never logged).
    pub fn deltas(&self) -> &DeltaSink {
        &self.deltas
    }

    /// Reports what the call is doing now (`"12 of 40 files"`): its
    /// process's latest progress and a non-durable event, never logged.
    pub fn progress(&self, progress: Progress) {
        self.deltas.progress(progress);
    }
}

/// How to build an activity. Validated once by [`Activity::new`].
#[derive(Clone, Debug)]
pub struct ActivityConfig {
    /// The descriptor name (lowercase dotted).
    pub name: String,
    /// What it does, for people.
    pub description: String,
    /// The identity of the function's code (change it when the function
    /// changes behaviour; a closure cannot be hashed).
    pub build: String,
    /// Whether a call pending at a crash may be sent again: `Never` (the
    /// default) leaves an unknown effect for the host to resolve;
    /// `SameIdentity` sends it again with the same idempotency key.
    pub replay: ReplayPolicy,
    /// The longest one call may run, measured on the engine's clock; a
    /// call past it is abandoned and fails with `workflow.activity.timed_out`.
    pub timeout: Duration,
    /// Whether a person must approve each call first.
    pub approval: Approval,
    /// Meter usage charged before each call (its worst case), such as one
    /// `api_calls`; refused before any I/O when the budget cannot cover it.
    pub reserve: Meters,
    /// Capabilities a process needs to run the function.
    pub requires: Capabilities,
    /// How a call that fails with a [`RetryHint`] is tried again by the
    /// kernel (durably, with backoff); none by default.
    pub retry: RetryPolicy,
}

impl ActivityConfig {
    /// A configuration with build `default`, replay policy `Never`, the
    /// default timeout, no approval, no reservation and no capabilities.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> ActivityConfig {
        ActivityConfig {
            name: name.into(),
            description: description.into(),
            build: "default".into(),
            replay: ReplayPolicy::Never,
            timeout: DEFAULT_ACTIVITY_TIMEOUT,
            approval: Approval::NotRequired,
            reserve: Meters::new(),
            requires: Capabilities::none(),
            retry: RetryPolicy::none(),
        }
    }
}

type RunFn = dyn Fn(Payload, ActivityContext) -> BoxFuture<'static, Result<Payload, ActivityError>>
    + Send
    + Sync;

struct Inner {
    descriptor: Descriptor,
    config: ActivityConfig,
    run: Arc<RunFn>,
    implementation: Digest,
    configuration: Digest,
}

/// A program whose one effect runs an async function (what Temporal calls
/// an activity). Input `I`, output `O`; cheap to clone.
pub struct Activity<I, O> {
    inner: Arc<Inner>,
    types: PhantomData<fn(I) -> O>,
}

impl<I, O> Clone for Activity<I, O> {
    fn clone(&self) -> Self {
        Activity {
            inner: self.inner.clone(),
            types: PhantomData,
        }
    }
}

impl<I, O> std::fmt::Debug for Activity<I, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Activity")
            .field("name", self.inner.descriptor.name())
            .field("replay", &self.inner.config.replay)
            .field("approval", &self.inner.config.approval)
            .finish_non_exhaustive()
    }
}

/// Every configuration field that shapes behaviour, for the configuration digest.
#[derive(Serialize)]
struct Digested<'a> {
    name: &'a str,
    description: &'a str,
    replay: ReplayPolicy,
    timeout_ms: u128,
    approval: Approval,
    reserve: &'a Meters,
    requires: &'a Capabilities,
    #[serde(skip_serializing_if = "RetryPolicy::is_none")]
    retry: RetryPolicy,
}

impl<I, O> Activity<I, O>
where
    I: DeserializeOwned + JsonSchema + Send + 'static,
    O: Serialize + JsonSchema + 'static,
{
    /// Validates a configuration and binds `function`: a valid descriptor
    /// name and description, a non-empty build identity and a positive
    /// timeout.
    pub fn new<F, Fut>(config: ActivityConfig, function: F) -> Result<Activity<I, O>, ConfigError>
    where
        F: Fn(I, ActivityContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, ActivityError>> + Send + 'static,
    {
        if config.build.trim().is_empty() {
            return Err(ConfigError::Build);
        }
        if config.timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout {
                activity: config.name.clone(),
            });
        }
        let descriptor = Descriptor::typed::<I, O>(&config.name, config.description.clone())?;
        let configuration = configuration_digest(&Digested {
            name: &config.name,
            description: &config.description,
            replay: config.replay,
            timeout_ms: config.timeout.as_millis(),
            approval: config.approval,
            reserve: &config.reserve,
            requires: &config.requires,
            retry: config.retry,
        })
        .map_err(|error| ConfigError::Encode {
            message: error.to_string(),
        })?;
        let implementation = implementation_digest(
            env!("CARGO_PKG_NAME"),
            &format!("{}+activity+{}", env!("CARGO_PKG_VERSION"), config.build),
        );
        let function = Arc::new(function);
        let run: Arc<RunFn> = Arc::new(move |input: Payload, context: ActivityContext| {
            let function = function.clone();
            Box::pin(async move {
                let input: I = input.decode().map_err(|error| {
                    ActivityError::coded(
                        ACTIVITY_INVALID,
                        format!("the request is not the activity's input: {error}"),
                    )
                    .with_kind(FailureKind::Contract)
                })?;
                let output = function(input, context).await?;
                Payload::encode(&output).map_err(|error| {
                    ActivityError::coded(
                        ACTIVITY_INVALID,
                        format!("the output does not encode: {error}"),
                    )
                    .with_kind(FailureKind::Contract)
                })
            })
        });
        Ok(Activity {
            inner: Arc::new(Inner {
                descriptor,
                config,
                run,
                implementation,
                configuration,
            }),
            types: PhantomData,
        })
    }
}

impl<I, O> Activity<I, O> {
    /// The typed program: its definition bound with the dispatcher that
    /// runs the function.
    pub fn program(&self) -> Program<I, O> {
        Program::new(ProgramConfig {
            definition: Arc::new(ActivityDefinition(self.inner.clone())),
            dispatcher: Some(Arc::new(ActivityDispatcher(self.inner.clone()))),
            implementation: self.inner.implementation,
            configuration: self.inner.configuration,
        })
    }

    /// The contract.
    pub fn descriptor(&self) -> &Descriptor {
        &self.inner.descriptor
    }

    /// The configuration it was built from.
    pub fn config(&self) -> &ActivityConfig {
        &self.inner.config
    }
}

struct ActivityDefinition(Arc<Inner>);

/// Where one activity process is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case", deny_unknown_fields)]
enum Phase {
    /// Nothing declared yet.
    Start,
    /// The approval wait is declared; its id has not arrived.
    Asking,
    /// Asleep on the approval wait.
    Waiting { wait: WaitId },
    /// The call is declared; its settlement has not arrived.
    Calling,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct State {
    input: Payload,
    phase: Phase,
}

struct Run {
    inner: Arc<Inner>,
    state: State,
}

impl Definition for ActivityDefinition {
    fn descriptor(&self) -> &Descriptor {
        &self.0.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(Run {
            inner: self.0.clone(),
            state: State {
                input: input.clone(),
                phase: Phase::Start,
            },
        }))
    }

    fn role(&self) -> ProgramRole {
        ProgramRole::Tool
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        let state: State = state.decode()?;
        let approval = self.0.config.approval == Approval::Required;
        if !approval && matches!(state.phase, Phase::Asking | Phase::Waiting { .. }) {
            return Err(StepError(Failure::contract(
                "execution.state.invalid",
                "an approval phase recorded for an activity that needs no approval",
            )));
        }
        Ok(Box::new(Run {
            inner: self.0.clone(),
            state,
        }))
    }
}

fn protocol(message: impl Into<String>) -> StepError {
    StepError(Failure::contract("workflow.protocol.violated", message))
}

impl Run {
    fn call(&mut self, consumed: usize) -> Transition {
        self.state.phase = Phase::Calling;
        Transition::Continue {
            consumed,
            effects: vec![Effect::Dispatch {
                request: self.state.input.clone(),
                reserve: self.inner.config.reserve.clone(),
                retry: self.inner.config.retry,
            }],
        }
    }

    fn settled(&self, consumed: usize, settlement: &Settlement) -> Transition {
        let failure = match settlement {
            Settlement::Succeeded { output, .. } => {
                match self.inner.descriptor.output_schema().validate(output) {
                    Ok(()) => {
                        return Transition::Complete {
                            consumed,
                            output: output.clone(),
                        };
                    }
                    Err(violation) => Failure::contract(
                        ACTIVITY_INVALID,
                        format!("the call's output breaks the output schema: {violation}"),
                    ),
                }
            }
            Settlement::Failed { failure, .. } => failure.clone(),
            Settlement::Unknown { diagnostic } => Failure::external(
                ACTIVITY_FAILED,
                format!("the call's outcome is unknown: {diagnostic}"),
            ),
        };
        Transition::Fail { consumed, failure }
    }
}

impl Execution for Run {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        let consumed = window.len();
        match (&self.state.phase, window) {
            (Phase::Start, []) => {
                if self.inner.config.approval == Approval::NotRequired {
                    return Ok(self.call(0));
                }
                self.state.phase = Phase::Asking;
                let request = ApprovalRequest {
                    activity: self.inner.descriptor.name().clone(),
                    input: self.state.input.clone(),
                };
                Ok(Transition::Continue {
                    consumed: 0,
                    effects: vec![Effect::Wait {
                        key: ChildKey::new("approval").expect("a valid static key"),
                        request: Payload::encode(&request)?,
                        answer_schema: Schema::of::<Verdict>(),
                    }],
                })
            }
            (Phase::Asking, [signal]) => match &signal.body {
                SignalBody::WaitOpened { wait, .. } => {
                    let wait = *wait;
                    self.state.phase = Phase::Waiting { wait };
                    Ok(Transition::Wait { consumed, wait })
                }
                other => Err(protocol(format!(
                    "expected the approval wait to open, got {other:?}"
                ))),
            },
            (Phase::Waiting { wait }, [signal]) if signal.wait == Some(*wait) => {
                let SignalBody::Input { payload } = &signal.body else {
                    return Err(protocol("an approval answer that is not input"));
                };
                match payload.decode::<Verdict>() {
                    Ok(Verdict::Approve) => Ok(self.call(consumed)),
                    Ok(Verdict::Deny { reason }) => Ok(Transition::Fail {
                        consumed,
                        failure: Failure::execution(ACTIVITY_DENIED, reason),
                    }),
                    Err(error) => Err(protocol(format!(
                        "an approval answer that is not a verdict: {error}"
                    ))),
                }
            }
            (Phase::Calling, [signal]) => match &signal.body {
                SignalBody::Settled { settlement, .. } => Ok(self.settled(consumed, settlement)),
                other => Err(protocol(format!(
                    "expected the call's settlement, got {other:?}"
                ))),
            },
            (phase, window) => Err(protocol(format!(
                "{} signals in phase {phase:?}",
                window.len()
            ))),
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }

    /// Waiting for its approval, or running its call (its function may
    /// report finer progress through its context).
    fn progress(&self) -> Option<Progress> {
        match self.state.phase {
            Phase::Start => None,
            Phase::Asking | Phase::Waiting { .. } => Some(Progress::phase("waiting for approval")),
            Phase::Calling => Some(Progress::phase("running")),
        }
    }
}

/// Runs the function of each call on a task of its own, so a panic is
/// caught as `workflow.activity.panicked`, and abandons it at the timeout.
struct ActivityDispatcher(Arc<Inner>);

impl Dispatcher for ActivityDispatcher {
    fn replay_policy(&self, _request: &Payload) -> ReplayPolicy {
        self.0.config.replay
    }

    fn required_capabilities(&self, _request: &Payload) -> Capabilities {
        self.0.config.requires.clone()
    }

    fn dispatch(&self, call: DispatchCall) -> BoxFuture<'static, Settlement> {
        let context = ActivityContext {
            effect: call.effect,
            process: call.process,
            cancel: call.cancel.clone(),
            clock: call.clock.clone(),
            deltas: call.deltas.clone(),
        };
        let running = (self.0.run)(call.request, context);
        let timeout = self.0.config.timeout;
        let clock = call.clock;
        Box::pin(async move {
            let deadline = clock.now().plus(timeout);
            let mut task = tokio::spawn(running);
            let joined = tokio::select! {
                joined = &mut task => joined,
                () = clock.sleep_until(deadline) => {
                    task.abort();
                    let failure = Failure::external(
                        ACTIVITY_TIMED_OUT,
                        format!(
                            "the call ran longer than {}ms and was abandoned; it may have taken effect",
                            timeout.as_millis()
                        ),
                    );
                    // Abandoned after it was started: it may have had its effect.
                    return Settlement::failed_retryable(failure, RetryHint::uncertain());
                }
            };
            match joined {
                Ok(Ok(output)) => Settlement::ok(output),
                Ok(Err(error)) => match error.retry {
                    Some(hint) => Settlement::failed_retryable(error.failure, hint),
                    None => Settlement::failed(error.failure),
                },
                Err(error) => {
                    let why = if error.is_panic() {
                        panic_message(error.into_panic())
                    } else {
                        "the call's task was stopped".to_owned()
                    };
                    Settlement::failed(Failure::new(
                        FailureKind::Panic,
                        ACTIVITY_PANICKED,
                        format!("the function panicked: {why}"),
                    ))
                }
            }
        })
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic".to_owned())
}
