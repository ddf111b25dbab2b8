//! The model-backed interaction: a program whose model calls are dispatch
//! effects and whose tools are child programs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use baton_run::dispatch::RetryPolicy;
use baton_run::program::{
    Boundary, Condition, Definition, Descriptor, DescriptorError, Effect, Execution,
    ExecutionState, Grant, ProgramConfig, Schema, Signal, SignalBody, StepError, Transition,
    configuration_digest, implementation_digest,
};
use baton_run::{
    Budget, Capabilities, ChildKey, Failure, Payload, Program, ProgramRole, Progress, Settlement,
    SignalId, Status, Termination,
};
use baton_workflow::ACTIVITY_DENIED;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::chat::{
    ChatError, FinishReason, Message, Options, Request, Response, ToolCall, ToolChoice, ToolResult,
    ToolSpec, check_conversation, valid_tool_name,
};
use crate::cost::{Price, input_bound, reservation};
use crate::dispatcher::ModelDispatcher;
use crate::model::{ChatModel, ModelIdentity};
use crate::tool::{Tool, object_schema};

/// How many tool calls of one model answer run at once unless configured.
pub const DEFAULT_MAX_CONCURRENT_TOOL_CALLS: u32 = 4;

/// Largest encoded response the dispatcher accepts by default: 1 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// An interaction's input: the conversation so far and option overrides.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The conversation (at least one message; system messages first).
    #[schemars(length(min = 1))]
    pub messages: Vec<Message>,
    /// Options overriding the configured ones field by field.
    #[serde(default)]
    pub options: Options,
}

impl Input {
    /// An input of messages, with no option overrides.
    pub fn new(messages: Vec<Message>) -> Input {
        Input {
            messages,
            options: Options::default(),
        }
    }
}

/// An interaction's output: the final model response and how many model
/// calls it took.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Output {
    /// The final answer.
    pub response: Response,
    /// Model calls made, including the final one.
    pub model_calls: u32,
}

/// An unaddressed signal that steers a running interaction: user messages
/// added to the conversation at the next safe boundary (before the next
/// model request), never to a request already in flight.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Steering {
    /// User message texts, in order (at least one).
    #[schemars(length(min = 1))]
    pub messages: Vec<String>,
}

/// The frozen request of one model call: what the dispatcher sends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelCall {
    /// Which call of the interaction this is (from 1).
    pub sequence: u32,
    /// The request.
    pub request: Request,
    /// Ids of the steering signals first applied in this call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steering: Vec<SignalId>,
}

/// A pure check of a final answer: `Err(feedback)` sends the feedback as a
/// user message and calls the model again (counting toward the limit).
pub type Validator = Arc<dyn Fn(&Response) -> Result<(), String> + Send + Sync>;

/// How to build an interaction. Validated once by [`Interaction::new`].
#[derive(Clone)]
pub struct Config {
    /// Descriptor name (lowercase dotted).
    pub name: String,
    /// What it does, for people.
    pub description: String,
    /// Identity of the code behind the validator closure (change it when
    /// the validator changes behaviour).
    pub build: String,
    /// The model.
    pub model: Arc<dyn ChatModel>,
    /// A system prompt placed before the input's messages.
    pub system: Option<String>,
    /// Default options; `max_tokens` is required (it is each call's meter reservation).
    pub options: Options,
    /// The most model calls (at least 1); one more is `interaction.limit.model_calls`.
    pub max_model_calls: u32,
    /// Tools, by unique name.
    pub tools: Vec<Tool>,
    /// How many tool calls of one model answer run at once (at least 1):
    /// the calls start in order, each next one as an earlier one ends.
    pub max_concurrent_tool_calls: u32,
    /// Whether the model must call tools.
    pub tool_choice: ToolChoice,
    /// An optional check of final answers.
    pub validator: Option<Validator>,
    /// Largest encoded response accepted (see [`DEFAULT_MAX_RESPONSE_BYTES`]).
    pub max_response_bytes: usize,
    /// How the kernel tries a model call again after a failure the
    /// provider classified as retryable (a 429 or a 5xx, honouring
    /// `Retry-After`; a timeout or a lost stream parks as unknown, since a
    /// model call is never sent again on its own): [`default_model_retry`].
    pub model_retry: RetryPolicy,
}

/// The retry policy of model calls unless configured: four attempts in
/// all, backing off from one second to at most a minute.
pub fn default_model_retry() -> RetryPolicy {
    RetryPolicy::exponential(4, Duration::from_secs(1), Duration::from_secs(60))
}

impl Config {
    /// A configuration with no system prompt, no tools, no validator, the
    /// default response limit and [`DEFAULT_MAX_CONCURRENT_TOOL_CALLS`].
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        model: Arc<dyn ChatModel>,
        max_tokens: u32,
        max_model_calls: u32,
    ) -> Config {
        Config {
            name: name.into(),
            description: description.into(),
            build: "default".into(),
            model,
            system: None,
            options: Options {
                max_tokens: Some(max_tokens),
                ..Options::default()
            },
            max_model_calls,
            tools: Vec::new(),
            max_concurrent_tool_calls: DEFAULT_MAX_CONCURRENT_TOOL_CALLS,
            tool_choice: ToolChoice::Auto,
            validator: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            model_retry: default_model_retry(),
        }
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("name", &self.name)
            .field("model", &self.model.identity())
            .field("max_model_calls", &self.max_model_calls)
            .finish_non_exhaustive()
    }
}

/// Why an interaction could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Name or description invalid.
    #[error("invalid interaction descriptor: {0}")]
    Descriptor(#[from] DescriptorError),
    /// `max_model_calls` is zero.
    #[error("max_model_calls must be at least 1")]
    MaxModelCalls,
    /// `options.max_tokens` is missing or zero.
    #[error("options.max_tokens must be set and positive")]
    MaxTokens,
    /// A tool is misnamed or named twice, or the tool choice names no tool.
    #[error("invalid tools: {0}")]
    Tools(String),
    /// A tool's parameters (its program's input schema) are not an object
    /// schema, which providers require.
    #[error("tool {name:?}: the parameters must be an object schema, not {found}")]
    ToolParameters {
        /// The tool.
        name: String,
        /// What its schema is instead.
        found: String,
    },
    /// `max_concurrent_tool_calls` is zero.
    #[error("max_concurrent_tool_calls must be at least 1")]
    MaxConcurrentToolCalls,
    /// The build identity is empty.
    #[error("the build identity must not be empty")]
    Build,
    /// The configuration does not encode.
    #[error("the configuration does not encode: {0}")]
    Encode(String),
}

struct Inner {
    descriptor: Descriptor,
    config: Config,
    tools: BTreeMap<String, Tool>,
    specs: Vec<ToolSpec>,
    price: Option<Price>,
    implementation: baton_run::Digest,
    configuration: baton_run::Digest,
}

/// A model-backed interaction: input `{messages, options}`, output the
/// final response. Each model call is a `Dispatch` effect (replay policy
/// `Never`, reserving its worst case of the `tokens_in`, `tokens_out`,
/// `tokens` and, with a priced model, `cost_micros` meters); tools run as
/// child programs, at most `max_concurrent_tool_calls` at once; steering
/// signals apply at safe boundaries only.
#[derive(Clone)]
pub struct Interaction {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Interaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interaction")
            .field("name", self.inner.descriptor.name())
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct Digested<'a> {
    name: &'a str,
    description: &'a str,
    build: &'a str,
    model: ModelIdentity,
    system: &'a Option<String>,
    options: &'a Options,
    max_model_calls: u32,
    max_concurrent_tool_calls: u32,
    price: Option<Price>,
    tool_choice: &'a ToolChoice,
    tools: Vec<DigestedTool<'a>>,
    validator: bool,
    max_response_bytes: usize,
    model_retry: RetryPolicy,
}

#[derive(Serialize)]
struct DigestedTool<'a> {
    name: &'a str,
    description: &'a str,
    program: baton_run::Digest,
    budget: &'a Budget,
    capabilities: &'a Capabilities,
}

impl Interaction {
    /// Validates a configuration.
    pub fn new(config: Config) -> Result<Interaction, ConfigError> {
        if config.max_model_calls == 0 {
            return Err(ConfigError::MaxModelCalls);
        }
        if config.options.max_tokens.is_none_or(|t| t == 0) {
            return Err(ConfigError::MaxTokens);
        }
        if config.build.trim().is_empty() {
            return Err(ConfigError::Build);
        }
        if config.max_concurrent_tool_calls == 0 {
            return Err(ConfigError::MaxConcurrentToolCalls);
        }
        let mut tools = BTreeMap::new();
        for tool in &config.tools {
            if !valid_tool_name(&tool.name) {
                return Err(ConfigError::Tools(format!(
                    "invalid tool name {:?}",
                    tool.name
                )));
            }
            let parameters = tool.program.descriptor().input_schema().json().to_value();
            if let Err(found) = object_schema(&parameters) {
                return Err(ConfigError::ToolParameters {
                    name: tool.name.clone(),
                    found,
                });
            }
            if tools.insert(tool.name.clone(), tool.clone()).is_some() {
                return Err(ConfigError::Tools(format!(
                    "tool {:?} is declared twice",
                    tool.name
                )));
            }
        }
        if let ToolChoice::Tool { name } = &config.tool_choice
            && !tools.contains_key(name)
        {
            return Err(ConfigError::Tools(format!(
                "tool choice names undeclared tool {name:?}"
            )));
        }
        let descriptor =
            Descriptor::typed::<Input, Output>(&config.name, config.description.clone())?
                .with_signal_schema(Schema::of::<Steering>());
        let price = config.model.price();
        let digested = Digested {
            name: &config.name,
            description: &config.description,
            build: &config.build,
            model: config.model.identity(),
            system: &config.system,
            options: &config.options,
            max_model_calls: config.max_model_calls,
            max_concurrent_tool_calls: config.max_concurrent_tool_calls,
            price,
            tool_choice: &config.tool_choice,
            tools: config
                .tools
                .iter()
                .map(|tool| DigestedTool {
                    name: &tool.name,
                    description: &tool.description,
                    program: tool.program.reference().digest,
                    budget: &tool.budget,
                    capabilities: &tool.capabilities,
                })
                .collect(),
            validator: config.validator.is_some(),
            max_response_bytes: config.max_response_bytes,
            model_retry: config.model_retry,
        };
        let configuration =
            configuration_digest(&digested).map_err(|e| ConfigError::Encode(e.to_string()))?;
        let implementation = implementation_digest(
            env!("CARGO_PKG_NAME"),
            &format!("{}+{}", env!("CARGO_PKG_VERSION"), config.build),
        );
        let specs = config.tools.iter().map(Tool::spec).collect();
        Ok(Interaction {
            inner: Arc::new(Inner {
                descriptor,
                config,
                tools,
                specs,
                price,
                implementation,
                configuration,
            }),
        })
    }

    /// Binds the interaction with its model dispatcher.
    pub fn program(&self) -> Program<Input, Output> {
        Program::new(ProgramConfig {
            definition: Arc::new(self.clone()),
            dispatcher: Some(Arc::new(ModelDispatcher::new(
                self.inner.config.model.clone(),
                self.inner.config.max_response_bytes,
            ))),
            implementation: self.inner.implementation,
            configuration: self.inner.configuration,
        })
    }
}

impl Definition for Interaction {
    fn descriptor(&self) -> &Descriptor {
        &self.inner.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        let input: Input = input.decode().map_err(|error| {
            StepError(Failure::contract("chat.request.invalid", error.to_string()))
        })?;
        let mut messages = Vec::new();
        if let Some(system) = &self.inner.config.system {
            messages.push(Message::system(system.clone()));
        }
        messages.extend(input.messages);
        check_conversation(&messages)
            .map_err(|reason| StepError(Failure::contract("chat.request.invalid", reason)))?;
        let options = self.inner.config.options.merged(&input.options);
        if options.max_tokens.is_none_or(|t| t == 0) {
            return Err(StepError(Failure::contract(
                "chat.request.invalid",
                "max_tokens must be positive",
            )));
        }
        Ok(Box::new(Run {
            inner: self.inner.clone(),
            state: State {
                messages,
                options,
                calls: 0,
                steering: Vec::new(),
                phase: Phase::Idle,
            },
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        let state: State = state.decode()?;
        if state.calls > self.inner.config.max_model_calls
            || (state.phase != Phase::Idle && state.calls == 0)
        {
            return Err(StepError(Failure::contract(
                "execution.state.invalid",
                "model call count does not fit the configuration",
            )));
        }
        Ok(Box::new(Run {
            inner: self.inner.clone(),
            state,
        }))
    }

    fn role(&self) -> ProgramRole {
        ProgramRole::Agent
    }

    fn children(&self) -> Vec<Program> {
        let mut children: Vec<Program> = Vec::new();
        for tool in &self.inner.config.tools {
            let digest = tool.program.reference().digest;
            if children.iter().all(|p| p.reference().digest != digest) {
                children.push(tool.program.clone());
            }
        }
        children
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Steer {
    id: SignalId,
    messages: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct State {
    messages: Vec<Message>,
    options: Options,
    calls: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    steering: Vec<Steer>,
    phase: Phase,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case", deny_unknown_fields)]
enum Phase {
    /// No model call yet.
    Idle,
    /// A model call is in flight.
    Calling,
    /// A tool batch runs.
    Tools { slots: Vec<Slot> },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Slot {
    call: ToolCall,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<ChildKey>,
    status: SlotStatus,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
enum SlotStatus {
    /// Checked, waiting for a free place (`max_concurrent_tool_calls`).
    Queued { arguments: Payload },
    /// Its start is declared.
    Starting,
    /// Started; its result has not arrived.
    Running,
    /// Its result, as the model will read it.
    Done { result: ToolResult },
}

struct Run {
    inner: Arc<Inner>,
    state: State,
}

fn protocol(message: impl Into<String>) -> StepError {
    StepError(Failure::contract("interaction.protocol.invalid", message))
}

fn error_result(call: &ToolCall, output: String) -> ToolResult {
    ToolResult {
        id: call.id.clone(),
        name: call.name.clone(),
        output,
        is_error: true,
    }
}

/// What the model sees of a tool child's termination.
fn tool_result(call: &ToolCall, termination: &Termination) -> ToolResult {
    match (termination.status(), termination.output()) {
        (Status::Completed, Some(output)) => ToolResult {
            id: call.id.clone(),
            name: call.name.clone(),
            output: match output.to_value() {
                serde_json::Value::String(text) => text,
                _ => output.as_str().to_owned(),
            },
            is_error: false,
        },
        (Status::Failed, _)
            if termination
                .failure()
                .is_some_and(|failure| failure.code() == ACTIVITY_DENIED) =>
        {
            let reason = termination
                .failure()
                .map(|failure| failure.message.as_str())
                .unwrap_or_default();
            error_result(
                call,
                format!(
                    "a person denied the call to tool {}; it did not run. Their reason: {reason}",
                    call.name
                ),
            )
        }
        (status, _) => {
            let why = termination
                .failure()
                .map(|failure| format!(": {} ({})", failure.message, failure.code))
                .unwrap_or_default();
            error_result(
                call,
                format!("tool {} ended {}{why}", call.name, status.view_name()),
            )
        }
    }
}

impl Run {
    /// Applies queued steering and issues the next model call.
    fn call_model(&mut self, consumed: usize) -> Result<Transition, StepError> {
        let max = self.inner.config.max_model_calls;
        if self.state.calls >= max {
            return Ok(Transition::Fail {
                consumed,
                failure: Failure::execution(
                    "interaction.limit.model_calls",
                    format!("the interaction may make at most {max} model calls"),
                ),
            });
        }
        let mut applied = Vec::new();
        for steer in std::mem::take(&mut self.state.steering) {
            self.state
                .messages
                .extend(steer.messages.into_iter().map(Message::user));
            applied.push(steer.id);
        }
        let request = match Request::new(
            self.state.messages.clone(),
            self.inner.specs.clone(),
            self.inner.config.tool_choice.clone(),
            self.state.options.clone(),
        ) {
            Ok(request) => request,
            Err(error) => {
                return Ok(Transition::Fail {
                    consumed,
                    failure: Failure::contract(error.code(), error.to_string()),
                });
            }
        };
        self.state.calls += 1;
        self.state.phase = Phase::Calling;
        let max_tokens = u64::from(self.state.options.max_tokens.unwrap_or(1));
        let call = ModelCall {
            sequence: self.state.calls,
            request,
            steering: applied,
        };
        let request = Payload::encode(&call)?;
        let input = input_bound(&call.request, request.len());
        Ok(Transition::Continue {
            consumed,
            effects: vec![Effect::Dispatch {
                request,
                reserve: reservation(input, max_tokens, self.inner.price.as_ref()),
                retry: self.inner.config.model_retry,
            }],
        })
    }

    fn append(&mut self, message: Result<Message, ChatError>) -> Result<(), StepError> {
        let message = message.map_err(|e| StepError(Failure::contract(e.code(), e.to_string())))?;
        self.state.messages.push(message);
        Ok(())
    }

    /// Handles a settled model call.
    fn answered(
        &mut self,
        consumed: usize,
        settlement: &Settlement,
    ) -> Result<Transition, StepError> {
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
                        "interaction.model.unknown",
                        format!("the model call's outcome is unknown: {diagnostic}"),
                    ),
                });
            }
        };
        let response: Response = match output.decode() {
            Ok(response) => response,
            Err(error) => {
                return Ok(Transition::Fail {
                    consumed,
                    failure: Failure::contract(
                        "interaction.model.response_invalid",
                        format!("the recorded model answer is not a response: {error}"),
                    ),
                });
            }
        };
        let calls: Vec<ToolCall> = response.message().calls().into_iter().cloned().collect();
        let finish = response.finish_reason();
        if calls.is_empty() && finish == FinishReason::ToolCalls {
            return Ok(Transition::Fail {
                consumed,
                failure: Failure::contract(
                    "interaction.model.response_invalid",
                    "finish reason tool_calls without any tool call",
                ),
            });
        }
        if !calls.is_empty() {
            return match finish {
                FinishReason::ToolCalls => {
                    self.state.messages.push(response.message().clone());
                    self.start_tools(consumed, calls)
                }
                FinishReason::Length => {
                    // Calls cut by the token limit are never run: the model
                    // sees why and is asked again.
                    self.state.messages.push(response.message().clone());
                    let results = calls
                        .iter()
                        .map(|call| {
                            error_result(
                                call,
                                "the call was cut off by the token limit and did not run; emit the complete call again".into(),
                            )
                        })
                        .collect();
                    self.append(Message::tool_results(results))?;
                    self.call_model(consumed)
                }
                other => Ok(Transition::Fail {
                    consumed,
                    failure: Failure::execution(
                        "interaction.model.tool_calls_not_completed",
                        format!("the model stopped with {other:?} in the middle of tool calls"),
                    ),
                }),
            };
        }
        self.state.messages.push(response.message().clone());
        if !self.state.steering.is_empty() {
            return self.call_model(consumed);
        }
        if let Some(validator) = &self.inner.config.validator
            && let Err(feedback) = validator(&response)
        {
            self.state.messages.push(Message::user(feedback));
            return self.call_model(consumed);
        }
        Ok(Transition::Complete {
            consumed,
            output: Payload::encode(&Output {
                response,
                model_calls: self.state.calls,
            })?,
        })
    }

    /// Checks each call and starts a child for every valid one.
    fn start_tools(
        &mut self,
        consumed: usize,
        calls: Vec<ToolCall>,
    ) -> Result<Transition, StepError> {
        let sequence = self.state.calls;
        let mut slots = Vec::new();
        for (index, call) in calls.into_iter().enumerate() {
            let Some(tool) = self.inner.tools.get(&call.name) else {
                let output = format!(
                    "unknown tool {:?}; available tools: {}",
                    call.name,
                    self.inner
                        .tools
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                slots.push(Slot {
                    status: SlotStatus::Done {
                        result: error_result(&call, output),
                    },
                    call,
                    key: None,
                });
                continue;
            };
            let arguments = Payload::parse_str(&call.arguments)
                .map_err(|error| format!("the arguments are not JSON: {error}"))
                .and_then(|arguments| {
                    tool.program
                        .descriptor()
                        .input_schema()
                        .validate(&arguments)
                        .map(|()| arguments)
                        .map_err(|violation| {
                            format!(
                                "the arguments break the tool's input schema at {:?}: {}",
                                violation.path, violation.message
                            )
                        })
                });
            let arguments = match arguments {
                Ok(arguments) => arguments,
                Err(reason) => {
                    slots.push(Slot {
                        status: SlotStatus::Done {
                            result: error_result(&call, format!("invalid arguments: {reason}")),
                        },
                        call,
                        key: None,
                    });
                    continue;
                }
            };
            let key = ChildKey::new(format!("tool-{sequence}-{index}"))
                .expect("tool keys are valid child keys");
            slots.push(Slot {
                call,
                key: Some(key),
                status: SlotStatus::Queued { arguments },
            });
        }
        self.state.phase = Phase::Tools { slots };
        self.advance_tools(consumed)
    }

    /// Starts queued calls in order while fewer than
    /// `max_concurrent_tool_calls` run, then waits for the running ones:
    /// for any of them while calls are still queued (so the next one starts
    /// as soon as a place frees), for all of them otherwise. With nothing
    /// running, the batch is finished.
    fn advance_tools(&mut self, consumed: usize) -> Result<Transition, StepError> {
        let limit = self.inner.config.max_concurrent_tool_calls as usize;
        let Phase::Tools { slots } = &mut self.state.phase else {
            return Err(protocol("no tool batch to advance"));
        };
        let mut running = slots
            .iter()
            .filter(|slot| matches!(slot.status, SlotStatus::Starting | SlotStatus::Running))
            .count();
        let mut effects = Vec::new();
        for slot in slots.iter_mut() {
            if running >= limit {
                break;
            }
            let SlotStatus::Queued { arguments } = &slot.status else {
                continue;
            };
            let (Some(key), Some(tool)) = (&slot.key, self.inner.tools.get(&slot.call.name)) else {
                return Err(protocol(format!(
                    "queued call {} has no tool",
                    slot.call.id
                )));
            };
            effects.push(Effect::StartChild {
                key: key.clone(),
                program: tool.program.reference().digest,
                input: arguments.clone(),
                budget: tool.budget.clone(),
                capabilities: tool.capabilities.clone(),
                grant: Grant::Clipped,
            });
            slot.status = SlotStatus::Starting;
            running += 1;
        }
        let keys: Vec<ChildKey> = slots
            .iter()
            .filter(|slot| matches!(slot.status, SlotStatus::Starting | SlotStatus::Running))
            .filter_map(|slot| slot.key.clone())
            .collect();
        if keys.is_empty() {
            return self.finish_tools(consumed);
        }
        let queued = slots
            .iter()
            .any(|slot| matches!(slot.status, SlotStatus::Queued { .. }));
        effects.push(Effect::WaitChildren {
            keys,
            boundary: Boundary::Result,
            condition: if queued {
                Condition::Any
            } else {
                Condition::All
            },
        });
        Ok(Transition::Continue { consumed, effects })
    }

    /// Folds tool signals into the batch; continues once every call has a result.
    fn tools(&mut self, consumed: usize, results: &[&Signal]) -> Result<Transition, StepError> {
        let Phase::Tools { slots } = &mut self.state.phase else {
            return Err(protocol("tool results outside a tool batch"));
        };
        let find = |slots: &mut Vec<Slot>, key: &ChildKey| -> Result<usize, StepError> {
            slots
                .iter()
                .position(|slot| slot.key.as_ref() == Some(key))
                .ok_or_else(|| protocol(format!("a result for unknown tool child {key}")))
        };
        for signal in results {
            match &signal.body {
                SignalBody::ChildStarted {
                    key,
                    process,
                    failure,
                    ..
                } => {
                    let index = find(slots, key)?;
                    let slot = &mut slots[index];
                    if slot.status != SlotStatus::Starting {
                        return Err(protocol(format!("a second start result for {key}")));
                    }
                    slot.status = match (process, failure) {
                        (_, Some(failure)) => SlotStatus::Done {
                            result: error_result(
                                &slot.call,
                                format!(
                                    "tool {} could not start: {} ({})",
                                    slot.call.name, failure.message, failure.code
                                ),
                            ),
                        },
                        (Some(_), None) => SlotStatus::Running,
                        (None, None) => {
                            return Err(protocol(format!("start result for {key} names nothing")));
                        }
                    };
                }
                SignalBody::ChildrenReady { children, .. } => {
                    for outcome in children {
                        let index = find(slots, &outcome.key)?;
                        let slot = &mut slots[index];
                        if slot.status != SlotStatus::Running {
                            return Err(protocol(format!(
                                "an outcome for {} which is not running",
                                outcome.key
                            )));
                        }
                        slot.status = SlotStatus::Done {
                            result: tool_result(&slot.call, &outcome.termination),
                        };
                    }
                }
                // A children wait is refused when a start before it was
                // refused; the running children are waited for again below.
                SignalBody::Settled {
                    settlement: Settlement::Failed { .. },
                    ..
                } => {}
                other => {
                    return Err(protocol(format!(
                        "unexpected signal during a tool batch: {other:?}"
                    )));
                }
            }
        }
        if slots.iter().any(|slot| slot.status == SlotStatus::Starting) {
            return Err(protocol("a tool start has no result"));
        }
        self.advance_tools(consumed)
    }

    /// Appends every result in call order and calls the model again.
    fn finish_tools(&mut self, consumed: usize) -> Result<Transition, StepError> {
        let Phase::Tools { slots } = std::mem::replace(&mut self.state.phase, Phase::Calling)
        else {
            return Err(protocol("no tool batch to finish"));
        };
        let results = slots
            .into_iter()
            .map(|slot| match slot.status {
                SlotStatus::Done { result } => Ok(result),
                _ => Err(protocol("a tool call has no result")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.append(Message::tool_results(results))?;
        self.call_model(consumed)
    }
}

impl Execution for Run {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        let consumed = window.len();
        let mut results = Vec::new();
        for signal in window {
            match (&signal.body, &signal.wait) {
                (SignalBody::Input { payload }, None) => {
                    let steering: Steering = payload.decode().map_err(|error| {
                        StepError(Failure::contract(
                            "interaction.steering.invalid",
                            error.to_string(),
                        ))
                    })?;
                    if steering.messages.is_empty() {
                        return Err(StepError(Failure::contract(
                            "interaction.steering.invalid",
                            "steering needs at least one message",
                        )));
                    }
                    self.state.steering.push(Steer {
                        id: signal.id.clone(),
                        messages: steering.messages,
                    });
                }
                _ => results.push(signal),
            }
        }
        match &self.state.phase {
            Phase::Idle => {
                if !results.is_empty() {
                    return Err(protocol("signals arrived before the first model call"));
                }
                self.call_model(consumed)
            }
            Phase::Calling => match results.as_slice() {
                [signal] => match &signal.body {
                    SignalBody::Settled { settlement, .. } => {
                        let settlement = settlement.clone();
                        self.answered(consumed, &settlement)
                    }
                    other => Err(protocol(format!(
                        "expected the model call's settlement, got {other:?}"
                    ))),
                },
                _ => Err(protocol(format!(
                    "expected one settlement of the model call, got {} signals",
                    results.len()
                ))),
            },
            Phase::Tools { .. } => self.tools(consumed, &results),
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }

    /// `calling the model` (iteration: the model call's number) or
    /// `running tools` (the first tool still running, and how many are
    /// done).
    fn progress(&self) -> Option<Progress> {
        let iteration = u64::from(self.state.calls);
        match &self.state.phase {
            Phase::Idle => None,
            Phase::Calling => Some(Progress::phase("calling the model").with_iteration(iteration)),
            Phase::Tools { slots } => {
                let done = slots
                    .iter()
                    .filter(|slot| matches!(slot.status, SlotStatus::Done { .. }))
                    .count();
                let mut progress = Progress::phase("running tools")
                    .with_iteration(iteration)
                    .with_detail(format!("{done} of {} done", slots.len()));
                if let Some(slot) = slots
                    .iter()
                    .find(|slot| !matches!(slot.status, SlotStatus::Done { .. }))
                {
                    progress = progress.with_tool(slot.call.name.clone());
                }
                Some(progress)
            }
        }
    }
}
