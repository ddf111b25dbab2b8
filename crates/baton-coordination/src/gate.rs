//! `InputGate`: one answer from outside, addressed to the gate's own wait.

use std::sync::Arc;

use baton_run::program::{
    Definition, Descriptor, Effect, Execution, ExecutionState, ProgramConfig, Schema, Signal,
    SignalBody, StepError, Transition, configuration_digest, implementation_digest,
};
use baton_run::{ChildKey, Failure, Payload, Program, SignalId, WaitId};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// The key of the gate's external wait.
pub const WAIT_KEY: &str = "coordination.input";

/// What an [`InputGate`] completes with: the whole answering signal, so a
/// coordinator keeps the answer's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    /// The answering signal's id (caller-stable).
    pub id: SignalId,
    /// The wait it answered.
    pub wait: WaitId,
    /// The answer, which passed the gate's answer schema.
    pub payload: Payload,
}

/// How to build an [`InputGate`].
#[derive(Clone, Debug)]
pub struct GateConfig {
    /// The gate's descriptor name (lowercase dotted).
    pub name: String,
    /// What it asks, for people.
    pub description: String,
    /// Schema of the request (the gate's input), shown to whoever answers.
    pub request_schema: Schema,
    /// Schema every answer must satisfy; the kernel checks it before an
    /// answer is committed.
    pub answer_schema: Schema,
}

/// A one-shot gate for human or external input. On start it opens one
/// external wait carrying the request and the answer schema; it completes
/// only with an input signal addressed to that wait, and its output is the
/// whole signal ([`Answer`]). For another answer, start another gate.
///
/// Unaddressed input is rejected by its signal schema (the default
/// `false`); a wrongly addressed or invalid answer is refused by the kernel
/// before anything is committed; cancellation while waiting ends the gate
/// `Canceled` with no output.
#[derive(Clone)]
pub struct InputGate {
    inner: Arc<GateInner>,
}

struct GateInner {
    descriptor: Descriptor,
    answer_schema: Schema,
    configuration: baton_run::Digest,
}

impl std::fmt::Debug for InputGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InputGate")
            .field("name", self.inner.descriptor.name())
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct Digested<'a> {
    name: &'a str,
    description: &'a str,
    request_schema: &'a Schema,
    answer_schema: &'a Schema,
}

impl InputGate {
    /// Validates a configuration: a valid descriptor, and an answer schema
    /// that accepts something (a `false` schema could never be answered).
    pub fn new(config: GateConfig) -> Result<InputGate, ConfigError> {
        if config.answer_schema.rejects_all() {
            return Err(ConfigError::AnswerSchemaRejectsAll);
        }
        let configuration = configuration_digest(&Digested {
            name: &config.name,
            description: &config.description,
            request_schema: &config.request_schema,
            answer_schema: &config.answer_schema,
        })
        .map_err(|error| ConfigError::Encode {
            message: error.to_string(),
        })?;
        let descriptor = Descriptor::new(
            &config.name,
            config.description,
            config.request_schema,
            Schema::of::<Answer>(),
        )?;
        Ok(InputGate {
            inner: Arc::new(GateInner {
                descriptor,
                answer_schema: config.answer_schema,
                configuration,
            }),
        })
    }

    /// A gate whose request and answer schemas schemars derives from `R` and `A`.
    pub fn typed<R: JsonSchema, A: JsonSchema>(
        name: &str,
        description: &str,
    ) -> Result<InputGate, ConfigError> {
        InputGate::new(GateConfig {
            name: name.to_owned(),
            description: description.to_owned(),
            request_schema: Schema::of::<R>(),
            answer_schema: Schema::of::<A>(),
        })
    }

    /// Binds the gate as a program taking requests of type `R`.
    pub fn program<R>(&self) -> Program<R, Answer> {
        Program::new(ProgramConfig {
            definition: Arc::new(self.clone()),
            dispatcher: None,
            implementation: implementation_digest(
                env!("CARGO_PKG_NAME"),
                env!("CARGO_PKG_VERSION"),
            ),
            configuration: self.inner.configuration,
        })
    }
}

/// The gate's recorded state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case", deny_unknown_fields)]
enum GateState {
    /// Started; the wait is not declared yet.
    Ready { request: Payload },
    /// The wait is declared; its opening has not arrived.
    Opening { request: Payload },
    /// The wait is open; sleeping until an answer addressed to it.
    Waiting { wait: WaitId },
}

struct GateRun {
    answer_schema: Schema,
    state: GateState,
}

impl Definition for InputGate {
    fn descriptor(&self) -> &Descriptor {
        &self.inner.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(GateRun {
            answer_schema: self.inner.answer_schema.clone(),
            state: GateState::Ready {
                request: input.clone(),
            },
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(GateRun {
            answer_schema: self.inner.answer_schema.clone(),
            state: state.decode()?,
        }))
    }
}

fn protocol(message: impl Into<String>) -> StepError {
    StepError(Failure::contract(
        "coordination.input_gate.protocol_violated",
        message,
    ))
}

/// The answer in `signal`, if it is an input addressed to `wait`.
fn answer(signal: &Signal, wait: WaitId) -> Result<Answer, StepError> {
    match (&signal.body, signal.wait) {
        (SignalBody::Input { payload }, Some(addressed)) if addressed == wait => Ok(Answer {
            id: signal.id.clone(),
            wait,
            payload: payload.clone(),
        }),
        _ => Err(protocol(format!(
            "signal {} is not an answer addressed to {wait}",
            signal.id
        ))),
    }
}

impl GateRun {
    fn complete(&self, consumed: usize, answer: Answer) -> Result<Transition, StepError> {
        // The kernel checked the answer before committing it; checking again
        // keeps a forged or corrupt mailbox from completing the gate.
        self.answer_schema
            .validate(&answer.payload)
            .map_err(|violation| protocol(format!("answer rejected: {violation}")))?;
        Ok(Transition::Complete {
            consumed,
            output: Payload::encode(&answer)?,
        })
    }
}

impl Execution for GateRun {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        match &self.state {
            GateState::Ready { request } => {
                if let Some(signal) = window.first() {
                    return Err(protocol(format!(
                        "signal {} arrived before the wait was declared",
                        signal.id
                    )));
                }
                let effect = Effect::Wait {
                    key: ChildKey::new(WAIT_KEY)?,
                    request: request.clone(),
                    answer_schema: self.answer_schema.clone(),
                };
                self.state = GateState::Opening {
                    request: request.clone(),
                };
                Ok(Transition::Continue {
                    consumed: 0,
                    effects: vec![effect],
                })
            }
            GateState::Opening { request } => {
                let Some(SignalBody::WaitOpened {
                    wait,
                    request: opened,
                    ..
                }) = window.first().map(|signal| &signal.body)
                else {
                    return Err(protocol("the first signal does not open the gate's wait"));
                };
                if opened != request {
                    return Err(protocol("the opened wait carries another request"));
                }
                let wait = *wait;
                self.state = GateState::Waiting { wait };
                // An answer admitted right after the wait opened arrives in the same window.
                match window.get(1) {
                    Some(signal) => self.complete(2, answer(signal, wait)?),
                    None => Ok(Transition::Wait { consumed: 1, wait }),
                }
            }
            GateState::Waiting { wait } => {
                let wait = *wait;
                let Some(signal) = window.first() else {
                    return Err(protocol("stepped without an answer"));
                };
                self.complete(1, answer(signal, wait)?)
            }
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }
}
