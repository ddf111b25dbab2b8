//! One agent's turn in a swarm, as a program: one model call over the
//! shared conversation with a `transfer_to_<agent>` tool per other agent;
//! the answer is either the agent's reply or exactly one handoff.

use std::collections::BTreeMap;
use std::sync::Arc;

use baton_agent::{
    DEFAULT_MAX_RESPONSE_BYTES, FinishReason, Message, ModelCall, ModelDispatcher, ModelIdentity,
    Options, Request, Response, TOKENS, ToolChoice, ToolSpec,
};
use baton_run::program::{
    Definition, Descriptor, Effect, Execution, ExecutionState, ProgramConfig, Signal, SignalBody,
    StepError, Transition, configuration_digest, implementation_digest,
};
use baton_run::{Failure, Name, Payload, Program, Settlement};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::HANDOFF_INVALID;
use crate::{AgentId, ConfigError};

/// What one swarm turn is given: the shared conversation so far.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SwarmInput {
    /// The conversation (at least one message, no system message: each
    /// agent puts its own first).
    pub conversation: Vec<Message>,
}

/// What one swarm turn produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SwarmReply {
    /// The agent's message (with its handoff call, if it handed off).
    pub message: Message,
    /// The handoff it asked for, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<HandoffCall>,
}

/// A handoff an agent asked for with its transfer tool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HandoffCall {
    /// The agent that takes the conversation over.
    pub to: AgentId,
    /// The transfer tool called.
    pub tool: String,
    /// The tool call's id (its result is added to the conversation).
    pub call_id: String,
    /// What the agent told the next one, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The frozen configuration of one agent's turns.
pub(crate) struct TurnSpec {
    pub agent: AgentId,
    pub name: String,
    pub description: String,
    pub system: String,
    pub model: crate::ModelConfig,
    /// The transfer tools, with the agent each one hands to.
    pub tools: Vec<(ToolSpec, AgentId)>,
}

#[derive(Serialize)]
struct Digested<'a> {
    agent: &'a AgentId,
    system: &'a str,
    model: ModelIdentity,
    max_tokens: u32,
    tools: Vec<(&'a ToolSpec, &'a AgentId)>,
}

struct Inner {
    descriptor: Descriptor,
    system: String,
    max_tokens: u32,
    specs: Vec<ToolSpec>,
    targets: BTreeMap<String, AgentId>,
}

/// The turn program's definition.
#[derive(Clone)]
pub(crate) struct SwarmTurn {
    inner: Arc<Inner>,
}

impl SwarmTurn {
    /// Binds one agent's turn program with its model dispatcher.
    pub fn program(spec: TurnSpec) -> Result<Program<SwarmInput, SwarmReply>, ConfigError> {
        let descriptor =
            Descriptor::typed::<SwarmInput, SwarmReply>(&spec.name, spec.description.clone())?;
        let configuration = configuration_digest(&Digested {
            agent: &spec.agent,
            system: &spec.system,
            model: spec.model.model.identity(),
            max_tokens: spec.model.max_tokens,
            tools: spec.tools.iter().map(|(tool, to)| (tool, to)).collect(),
        })?;
        let definition = SwarmTurn {
            inner: Arc::new(Inner {
                descriptor,
                system: spec.system,
                max_tokens: spec.model.max_tokens,
                specs: spec.tools.iter().map(|(tool, _)| tool.clone()).collect(),
                targets: spec
                    .tools
                    .into_iter()
                    .map(|(tool, to)| (tool.name, to))
                    .collect(),
            }),
        };
        Ok(Program::new(ProgramConfig {
            definition: Arc::new(definition),
            dispatcher: Some(Arc::new(ModelDispatcher::new(
                spec.model.model.clone(),
                DEFAULT_MAX_RESPONSE_BYTES,
            ))),
            implementation: implementation_digest(
                env!("CARGO_PKG_NAME"),
                env!("CARGO_PKG_VERSION"),
            ),
            configuration,
        }))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct State {
    conversation: Vec<Message>,
    calling: bool,
}

struct Run {
    inner: Arc<Inner>,
    state: State,
}

impl Definition for SwarmTurn {
    fn descriptor(&self) -> &Descriptor {
        &self.inner.descriptor
    }

    fn role(&self) -> baton_run::ProgramRole {
        baton_run::ProgramRole::Agent
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        let input: SwarmInput = input.decode()?;
        Ok(Box::new(Run {
            inner: self.inner.clone(),
            state: State {
                conversation: input.conversation,
                calling: false,
            },
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(Run {
            inner: self.inner.clone(),
            state: state.decode()?,
        }))
    }
}

fn invalid(message: impl Into<String>) -> Failure {
    Failure::contract(HANDOFF_INVALID, message)
}

impl Run {
    /// The one model call of the turn.
    fn call(&mut self) -> Result<Transition, StepError> {
        let mut messages = vec![Message::system(self.inner.system.clone())];
        messages.extend(self.state.conversation.iter().cloned());
        let request = Request::new(
            messages,
            self.inner.specs.clone(),
            ToolChoice::Auto,
            Options {
                max_tokens: Some(self.inner.max_tokens),
                ..Options::default()
            },
        )
        .map_err(|error| StepError(Failure::contract(error.code(), error.to_string())))?;
        self.state.calling = true;
        let call = ModelCall {
            sequence: 1,
            request,
            steering: Vec::new(),
        };
        Ok(Transition::Continue {
            consumed: 0,
            effects: vec![Effect::Dispatch {
                request: Payload::encode(&call)?,
                reserve: BTreeMap::from([(
                    Name::new(TOKENS).expect("the tokens meter name is valid"),
                    u64::from(self.inner.max_tokens),
                )]),
                retry: baton_run::dispatch::RetryPolicy::none(),
            }],
        })
    }

    /// The reply a response makes: the answer, or exactly one handoff.
    fn reply(&self, response: Response) -> Result<SwarmReply, Failure> {
        let calls = response.message().calls();
        let Some(call) = calls.first() else {
            return Ok(SwarmReply {
                message: response.message().clone(),
                handoff: None,
            });
        };
        if response.finish_reason() != FinishReason::ToolCalls {
            return Err(invalid(format!(
                "the model stopped with {:?} in the middle of a tool call",
                response.finish_reason()
            )));
        }
        if calls.len() != 1 {
            return Err(invalid(format!(
                "the model made {} tool calls; a swarm agent hands off with exactly one transfer call",
                calls.len()
            )));
        }
        let to = self.inner.targets.get(&call.name).ok_or_else(|| {
            invalid(format!(
                "the model called {:?}, which is not a transfer tool of this agent",
                call.name
            ))
        })?;
        let arguments: serde_json::Value = serde_json::from_str(&call.arguments)
            .map_err(|error| invalid(format!("the transfer arguments are not JSON: {error}")))?;
        let message = match arguments.get("message") {
            None => None,
            Some(serde_json::Value::String(text)) => Some(text.clone()),
            Some(_) => return Err(invalid("the transfer message is not a string")),
        };
        if !arguments.is_object() {
            return Err(invalid("the transfer arguments are not an object"));
        }
        Ok(SwarmReply {
            message: response.message().clone(),
            handoff: Some(HandoffCall {
                to: to.clone(),
                tool: call.name.clone(),
                call_id: call.id.clone(),
                message,
            }),
        })
    }
}

impl Execution for Run {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        if !self.state.calling {
            if let Some(signal) = window.first() {
                return Err(StepError(Failure::contract(
                    "strategy.swarm.protocol",
                    format!("unexpected signal {} before the model call", signal.id),
                )));
            }
            return self.call();
        }
        let [signal] = window else {
            return Err(StepError(Failure::contract(
                "strategy.swarm.protocol",
                format!(
                    "expected the model call's settlement, got {} signals",
                    window.len()
                ),
            )));
        };
        let consumed = 1;
        let settlement = match &signal.body {
            SignalBody::Settled { settlement, .. } => settlement,
            other => {
                return Err(StepError(Failure::contract(
                    "strategy.swarm.protocol",
                    format!("expected the model call's settlement, got {other:?}"),
                )));
            }
        };
        let output = match settlement {
            Settlement::Succeeded { output, .. } => output,
            Settlement::Failed { failure, .. } => {
                return Ok(Transition::Fail {
                    consumed,
                    failure: failure.clone(),
                });
            }
            Settlement::Unknown { diagnostic } => {
                return Ok(Transition::Fail {
                    consumed,
                    failure: Failure::external(
                        "interaction.model.failed",
                        format!("the model call's outcome is unknown: {diagnostic}"),
                    ),
                });
            }
        };
        let response: Response = output.decode().map_err(|error| {
            StepError(Failure::contract(
                "interaction.model.response_invalid",
                error.to_string(),
            ))
        })?;
        match self.reply(response) {
            Ok(reply) => Ok(Transition::Complete {
                consumed,
                output: Payload::encode(&reply)?,
            }),
            Err(failure) => Ok(Transition::Fail { consumed, failure }),
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }
}
