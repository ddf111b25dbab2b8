//! `Deadline` and its [`Timer`] dispatcher: wait until an absolute instant.

use std::sync::Arc;

use baton_run::dispatch::{DispatchCall, Dispatcher, ReplayPolicy};
use baton_run::program::{
    Definition, Descriptor, Effect, Execution, ExecutionState, ProgramConfig, Schema, Signal,
    SignalBody, StepError, Transition, configuration_digest, implementation_digest,
};
use baton_run::{BoxFuture, Failure, Payload, Program, Settlement, Timestamp};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The code of a timer that stopped before its instant (its process was
/// canceled) or reported that the instant was not reached.
pub const INTERRUPTED: &str = "coordination.deadline.interrupted";

/// The timer request a [`Deadline`] dispatches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TimerRequest {
    /// The absolute instant to wait for (never zero).
    pub deadline: Timestamp,
}

/// What the [`Timer`] settles with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TimerResult {
    /// The instant it waited for.
    pub deadline: Timestamp,
    /// Whether the clock reached it.
    pub reached: bool,
}

/// The timer dispatcher. Stateless: it reads time only through the
/// engine's injectable clock (`DispatchCall::clock`), sleeps until the
/// instant (again if it woke early), and settles `{deadline, reached:
/// true}`; a canceled dispatch settles failed with external
/// `coordination.deadline.interrupted`. A valid request replays with
/// [`ReplayPolicy::SameIdentity`], so after a crash the same effect waits
/// for the original instant and fires once.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timer;

fn request_of(payload: &Payload) -> Option<TimerRequest> {
    payload
        .decode::<TimerRequest>()
        .ok()
        .filter(|request| request.deadline.millis() > 0)
}

impl Dispatcher for Timer {
    fn replay_policy(&self, request: &Payload) -> ReplayPolicy {
        match request_of(request) {
            Some(_) => ReplayPolicy::SameIdentity,
            None => ReplayPolicy::Never,
        }
    }

    fn dispatch(&self, call: DispatchCall) -> BoxFuture<'static, Settlement> {
        Box::pin(async move {
            let Some(TimerRequest { deadline }) = request_of(&call.request) else {
                return Settlement::failed(Failure::contract(
                    "coordination.deadline.request_invalid",
                    "a timer request is {\"deadline\": <milliseconds since the epoch, not zero>}",
                ));
            };
            let mut cancel = call.cancel;
            loop {
                if call.clock.now() >= deadline {
                    return match Payload::encode(&TimerResult {
                        deadline,
                        reached: true,
                    }) {
                        Ok(output) => Settlement::ok(output),
                        Err(error) => Settlement::failed(Failure::execution(
                            "coordination.deadline.encode_failed",
                            error.to_string(),
                        )),
                    };
                }
                tokio::select! {
                    biased;
                    () = cancel.canceled() => {
                        return Settlement::failed(Failure::external(
                            INTERRUPTED,
                            format!("the timer for {deadline} was canceled before it was reached (reached = false)"),
                        ));
                    }
                    () = call.clock.sleep_until(deadline) => {}
                }
            }
        })
    }
}

/// A program that completes at an absolute instant: its input and output
/// are the instant (milliseconds since the epoch, never zero). Its step
/// never reads the clock: it dispatches one [`TimerRequest`] to its bound
/// [`Timer`], so an instant already past completes as soon as the timer
/// runs.
#[derive(Clone)]
pub struct Deadline {
    descriptor: Arc<Descriptor>,
}

impl std::fmt::Debug for Deadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deadline")
    }
}

impl Deadline {
    /// The descriptor name of the deadline program.
    pub const NAME: &'static str = "coordination.deadline";

    /// The deadline definition.
    pub fn new() -> Deadline {
        let input =
            Schema::parse(r#"{"type":"integer","minimum":1}"#).expect("a constant schema compiles");
        let descriptor = Descriptor::new(
            Deadline::NAME,
            "Completes when the engine's clock reaches an absolute instant.",
            input,
            Schema::of::<Timestamp>(),
        )
        .expect("a constant descriptor is valid");
        Deadline {
            descriptor: Arc::new(descriptor),
        }
    }

    /// The deadline program with its [`Timer`] bound. It has no
    /// configuration: its identity is its contract and this crate's version.
    pub fn program() -> Program<Timestamp, Timestamp> {
        Program::new(ProgramConfig {
            definition: Arc::new(Deadline::new()),
            dispatcher: Some(Arc::new(Timer)),
            implementation: implementation_digest(
                env!("CARGO_PKG_NAME"),
                env!("CARGO_PKG_VERSION"),
            ),
            configuration: configuration_digest(&()).expect("unit encodes"),
        })
    }
}

impl Default for Deadline {
    fn default() -> Deadline {
        Deadline::new()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct State {
    deadline: Timestamp,
    armed: bool,
}

struct Run {
    state: State,
}

fn protocol(message: impl Into<String>) -> StepError {
    StepError(Failure::contract(
        "coordination.deadline.protocol_violated",
        message,
    ))
}

impl Definition for Deadline {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        let deadline: Timestamp = input.decode()?;
        if deadline.millis() == 0 {
            return Err(StepError::classified(
                baton_run::FailureKind::Contract,
                "coordination.deadline.zero",
                "a deadline of zero is not an instant",
            ));
        }
        Ok(Box::new(Run {
            state: State {
                deadline,
                armed: false,
            },
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        let state: State = state.decode()?;
        if state.deadline.millis() == 0 {
            return Err(StepError(Failure::contract(
                "execution.state.invalid",
                "a recorded deadline of zero",
            )));
        }
        Ok(Box::new(Run { state }))
    }
}

impl Execution for Run {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        let deadline = self.state.deadline;
        if !self.state.armed {
            if !window.is_empty() {
                return Err(protocol("signals arrived before the timer was armed"));
            }
            self.state.armed = true;
            return Ok(Transition::Continue {
                consumed: 0,
                effects: vec![Effect::dispatch(Payload::encode(&TimerRequest {
                    deadline,
                })?)],
            });
        }
        let [signal] = window else {
            return Err(protocol(format!(
                "expected exactly the timer's settlement, got {} signals",
                window.len()
            )));
        };
        let SignalBody::Settled { settlement, .. } = &signal.body else {
            return Err(protocol("the signal is not the timer's settlement"));
        };
        match settlement {
            Settlement::Succeeded { output, .. } => {
                let result: TimerResult = output
                    .decode()
                    .map_err(|error| protocol(format!("the timer result: {error}")))?;
                if result.deadline != deadline {
                    return Err(protocol(format!(
                        "the timer settled {} for deadline {deadline}",
                        result.deadline
                    )));
                }
                if !result.reached {
                    return Ok(Transition::Fail {
                        consumed: 1,
                        failure: Failure::external(
                            INTERRUPTED,
                            "the timer reports reached = false",
                        ),
                    });
                }
                Ok(Transition::Complete {
                    consumed: 1,
                    output: Payload::encode(&deadline)?,
                })
            }
            Settlement::Failed { failure, .. } => Ok(Transition::Fail {
                consumed: 1,
                failure: failure.clone(),
            }),
            Settlement::Unknown { .. } => Err(protocol("the timer's outcome is unknown")),
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }
}
