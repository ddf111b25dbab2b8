//! An Anthropic Messages API provider (feature `anthropic`).
//!
//! Speaks the Messages wire format over HTTP: `POST {base_url}/v1/messages`
//! with the `x-api-key` and `anthropic-version` headers, the system prompt,
//! messages (tool results as `tool_result` blocks of a user turn, turns of
//! one role merged), tools with their `input_schema`, the tool choice, the
//! temperature and `max_tokens`; plain answers or server-sent events
//! (`message_start`, `content_block_*`, `message_delta`, `message_stop`,
//! `ping`, `error`), parsed by `eventsource-stream`. It is written from the
//! API's public documentation and tested against a local server speaking
//! that format; no live server was verified.
//!
//! Typed output asks the model to answer through a tool: a response format
//! adds the tool [`OUTPUT_TOOL`] whose input schema is the format's schema
//! (a non-object schema is wrapped as the member `value`), makes the model
//! use a tool, and turns the tool's input back into the answer's text with
//! finish reason `stop`. Baton's own decode then checks it strictly.
//!
//! Failures are classified exactly as the OpenAI-compatible provider's
//! (see [`ModelError`]): 429 and `rate_limit_error` are rate limits; 408,
//! 409, 5xx, 529, `overloaded_error` and `api_error` an unavailable
//! provider; other statuses and `invalid_request_error` refusals; a stream
//! that ends before its stop reason is interrupted. Usage counts cache
//! reads and writes as input tokens, cache reads also as cached input.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::Duration;

use baton_run::BoxFuture;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::chat::{
    FinishReason, Message, Part, Request, Response, ResponseFormat, Role, ToolCall, ToolChoice,
    Usage,
};
use crate::cost::{Price, PriceTable};
use crate::http::{self, Assembly, ErrorObject};
use crate::model::{ChatModel, Delta, DeltaFn, ModelError, ModelIdentity};

/// The base URL used when neither the configuration nor `ANTHROPIC_BASE_URL` gives one.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The `anthropic-version` header sent unless configured otherwise.
pub const DEFAULT_VERSION: &str = "2023-06-01";
/// The tool a response format is answered through; a request may not
/// declare a tool of this name.
pub const OUTPUT_TOOL: &str = "baton_output";

/// How to reach a Messages API server.
#[derive(Clone, PartialEq, Eq)]
pub struct AnthropicConfig {
    /// The API root, such as `https://api.anthropic.com` (the path
    /// `/v1/messages` is added).
    pub base_url: String,
    /// The API key, sent as `x-api-key`.
    pub api_key: Option<String>,
    /// The model name.
    pub model: String,
    /// The `anthropic-version` header.
    pub version: String,
    /// Prices by model name; the entry of `model`, if any, is what each
    /// call reserves and is charged on the `cost_micros` meter.
    pub prices: PriceTable,
    /// The longest a whole call (connection, answer, stream) may take.
    pub timeout: Duration,
    /// The longest establishing a connection may take.
    pub connect_timeout: Duration,
    /// The largest answer body accepted, in bytes.
    pub max_response_bytes: usize,
}

impl std::fmt::Debug for AnthropicConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("version", &self.version)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl AnthropicConfig {
    /// A configuration with the default version, no prices, a 120 s call
    /// timeout, a 10 s connect timeout and a 4 MiB answer limit.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> AnthropicConfig {
        AnthropicConfig {
            base_url: base_url.into(),
            api_key: None,
            model: model.into(),
            version: DEFAULT_VERSION.into(),
            prices: PriceTable::new(),
            timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            max_response_bytes: 4 * 1024 * 1024,
        }
    }

    /// Reads the conventional variables: `ANTHROPIC_BASE_URL` (default
    /// [`DEFAULT_BASE_URL`]), `ANTHROPIC_API_KEY` (optional) and
    /// `ANTHROPIC_MODEL` (required).
    pub fn from_env() -> Result<AnthropicConfig, ModelError> {
        AnthropicConfig::from_vars(|name| std::env::var(name).ok())
    }

    /// Like [`AnthropicConfig::from_env`], reading the variables through
    /// `var` (empty values count as absent).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<AnthropicConfig, ModelError> {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let model = var("ANTHROPIC_MODEL")
            .ok_or_else(|| ModelError::Request("ANTHROPIC_MODEL is not set".into()))?;
        let mut config = AnthropicConfig::new(
            var("ANTHROPIC_BASE_URL").unwrap_or_else(|| DEFAULT_BASE_URL.into()),
            model,
        );
        config.api_key = var("ANTHROPIC_API_KEY");
        Ok(config)
    }
}

/// How a request is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// One JSON answer.
    Whole,
    /// Server-sent events.
    Stream,
}

/// How a response format was asked for: through the output tool, its
/// input wrapped as `{"value": ...}` or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    None,
    Object,
    Wrapped,
}

struct Wire {
    body: Value,
    output: Output,
}

/// A Messages API client.
#[derive(Clone, Debug)]
pub struct AnthropicModel {
    config: AnthropicConfig,
    client: reqwest::Client,
}

impl AnthropicModel {
    /// A client for a configuration.
    pub fn new(config: AnthropicConfig) -> Result<AnthropicModel, ModelError> {
        if config.model.trim().is_empty() {
            return Err(ModelError::Request("the model name is empty".into()));
        }
        let client = http::client(config.timeout, config.connect_timeout)?;
        Ok(AnthropicModel { config, client })
    }

    /// The configuration.
    pub fn config(&self) -> &AnthropicConfig {
        &self.config
    }

    /// The wire request body for `request`; refused when the request has no
    /// `max_tokens` (the API requires it), a temperature above 1, or a tool
    /// named [`OUTPUT_TOOL`] beside a response format.
    pub fn request_body(&self, request: &Request, delivery: Delivery) -> Result<Value, ModelError> {
        Ok(self.wire(request, delivery)?.body)
    }

    fn wire(&self, request: &Request, delivery: Delivery) -> Result<Wire, ModelError> {
        let options = request.options();
        let max_tokens = options
            .max_tokens
            .ok_or_else(|| ModelError::Request("the Messages API needs max_tokens".into()))?;
        let mut body = json!({
            "model": self.config.model,
            "max_tokens": max_tokens,
            "messages": wire_messages(request.messages()),
        });
        let system: Vec<String> = request
            .messages()
            .iter()
            .filter(|m| m.role() == Role::System)
            .map(Message::text)
            .collect();
        if !system.is_empty() {
            body["system"] = json!(system.join("\n\n"));
        }
        if let Some(temperature) = options.temperature {
            if temperature > 1.0 {
                return Err(ModelError::Request(format!(
                    "the Messages API takes a temperature of at most 1, not {temperature}"
                )));
            }
            body["temperature"] = json!(temperature);
        }
        let mut tools: Vec<Value> = request
            .tools()
            .iter()
            .map(|tool| {
                json!({
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.parameters,
                })
            })
            .collect();
        let mut choice = match request.tool_choice() {
            ToolChoice::Auto => json!({"type": "auto"}),
            ToolChoice::None => json!({"type": "none"}),
            ToolChoice::Required => json!({"type": "any"}),
            ToolChoice::Tool { name } => json!({"type": "tool", "name": name}),
        };
        let mut output = Output::None;
        if let Some(ResponseFormat::JsonSchema { name, schema, .. }) = &options.response_format {
            if request.tools().iter().any(|tool| tool.name == OUTPUT_TOOL) {
                return Err(ModelError::Request(format!(
                    "a tool named {OUTPUT_TOOL} cannot be declared beside a response format"
                )));
            }
            let (input_schema, shape) = output_schema(schema);
            output = shape;
            tools.push(json!({
                "name": OUTPUT_TOOL,
                "description": format!(
                    "Give your final answer ({name}) as this tool's input, which must match its schema exactly."
                ),
                "input_schema": input_schema,
            }));
            choice = match request.tool_choice() {
                // Other tools stay usable; the answer is one of the tool uses.
                ToolChoice::Auto | ToolChoice::Required if !request.tools().is_empty() => {
                    json!({"type": "any"})
                }
                ToolChoice::Tool { name } => json!({"type": "tool", "name": name}),
                _ => json!({"type": "tool", "name": OUTPUT_TOOL}),
            };
        }
        if !tools.is_empty() {
            body["tools"] = Value::Array(tools);
            body["tool_choice"] = choice;
        }
        if delivery == Delivery::Stream {
            body["stream"] = json!(true);
        }
        Ok(Wire { body, output })
    }

    async fn send(&self, body: &Value) -> Result<reqwest::Response, ModelError> {
        let url = format!("{}/v1/messages", self.config.base_url.trim_end_matches('/'));
        let mut builder = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .header("anthropic-version", &self.config.version)
            .body(serde_json::to_vec(body).map_err(|e| ModelError::Request(e.to_string()))?);
        if let Some(key) = &self.config.api_key {
            builder = builder.header("x-api-key", key);
        }
        let response = builder.send().await.map_err(|e| http::send_failure(&e))?;
        if !response.status().is_success() {
            return Err(http::error_answer(response).await);
        }
        Ok(response)
    }
}

/// The output tool's input schema: the format's schema when it is an
/// object schema, else the schema wrapped as the required member `value`
/// (its `$defs` moved to the wrapper, so local references still resolve).
fn output_schema(schema: &Value) -> (Value, Output) {
    if schema.get("type").and_then(Value::as_str) == Some("object") {
        return (schema.clone(), Output::Object);
    }
    let mut inner = schema.clone();
    let defs = inner.as_object_mut().and_then(|map| map.remove("$defs"));
    let mut wrapper = Map::new();
    if let Some(defs) = defs {
        wrapper.insert("$defs".into(), defs);
    }
    wrapper.insert("type".into(), json!("object"));
    wrapper.insert("properties".into(), json!({ "value": inner }));
    wrapper.insert("required".into(), json!(["value"]));
    wrapper.insert("additionalProperties".into(), json!(false));
    (Value::Object(wrapper), Output::Wrapped)
}

/// The messages of a request as Messages API turns: system messages are
/// the `system` field; tool results are `tool_result` blocks of a user
/// turn; consecutive turns of one role are merged (the API alternates).
fn wire_messages(messages: &[Message]) -> Vec<Value> {
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in messages {
        let (role, blocks): (&'static str, Vec<Value>) = match message.role() {
            Role::System => continue,
            Role::User => (
                "user",
                message
                    .parts()
                    .iter()
                    .filter_map(|part| match part {
                        Part::Text { text } if !text.is_empty() => {
                            Some(json!({"type": "text", "text": text}))
                        }
                        Part::Media { media } => Some(json!({
                            "type": "image",
                            "source": {"type": "url", "url": media.url},
                        })),
                        _ => None,
                    })
                    .collect(),
            ),
            Role::Assistant => (
                "assistant",
                message
                    .parts()
                    .iter()
                    .filter_map(|part| match part {
                        Part::Text { text } if !text.is_empty() => {
                            Some(json!({"type": "text", "text": text}))
                        }
                        Part::ToolCall { call } => Some(json!({
                            "type": "tool_use",
                            "id": call.id,
                            "name": call.name,
                            // The API takes the input as an object; arguments
                            // that are not one are sent as an empty input.
                            "input": serde_json::from_str::<Value>(&call.arguments)
                                .ok()
                                .filter(Value::is_object)
                                .unwrap_or_else(|| json!({})),
                        })),
                        // Reasoning needs the provider's signature to be sent
                        // back, and a refusal is not an API block: both stay out.
                        _ => None,
                    })
                    .collect(),
            ),
            Role::Tool => (
                "user",
                message
                    .parts()
                    .iter()
                    .filter_map(|part| match part {
                        Part::ToolResult { result } => Some(json!({
                            "type": "tool_result",
                            "tool_use_id": result.id,
                            "content": result.output,
                            "is_error": result.is_error,
                        })),
                        _ => None,
                    })
                    .collect(),
            ),
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last, content)) if *last == role => content.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect()
}

// Wire answers are read leniently (the API adds fields); what they become is strict.

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Vec<WireBlock>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize, Clone, Copy, Default)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

/// A content block of a whole answer; a tool's input is kept as the text
/// the API wrote, so a duplicate key in it is refused by Baton's decode
/// rather than resolved here.
#[derive(Deserialize)]
struct WireBlock {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    thinking: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    input: Option<Box<serde_json::value::RawValue>>,
}

fn usage(wire: WireUsage) -> Option<Usage> {
    let read = wire.cache_read_input_tokens.unwrap_or(0);
    let input = wire.input_tokens? + wire.cache_creation_input_tokens.unwrap_or(0) + read;
    Some(Usage {
        input_tokens: input,
        output_tokens: wire.output_tokens.unwrap_or(0),
        cached_input_tokens: read,
        reasoning_tokens: 0,
    })
}

fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "end_turn" | "stop_sequence" => FinishReason::Stop,
        "max_tokens" | "model_context_window_exceeded" => FinishReason::Length,
        "tool_use" => FinishReason::ToolCalls,
        "refusal" => FinishReason::Refusal,
        _ => FinishReason::Other,
    }
}

/// One content block of an answer.
enum Block {
    Text(String),
    Thinking(String),
    ToolUse {
        id: String,
        name: String,
        input: String,
    },
    Other,
}

impl Block {
    fn of_wire(block: WireBlock) -> Block {
        match block.kind.as_str() {
            "text" => Block::Text(block.text.unwrap_or_default()),
            "thinking" => Block::Thinking(block.thinking.unwrap_or_default()),
            "tool_use" => Block::ToolUse {
                id: block.id.unwrap_or_default(),
                name: block.name.unwrap_or_default(),
                input: block
                    .input
                    .map(|input| input.get().to_owned())
                    .unwrap_or_default(),
            },
            _ => Block::Other,
        }
    }

    /// A block as a stream starts it (a tool's input arrives in pieces).
    fn of(block: &Value) -> Block {
        let text = |key: &str| {
            block
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        match block.get("type").and_then(Value::as_str) {
            Some("text") => Block::Text(text("text")),
            Some("thinking") => Block::Thinking(text("thinking")),
            Some("tool_use") => Block::ToolUse {
                id: text("id"),
                name: text("name"),
                input: String::new(),
            },
            _ => Block::Other,
        }
    }
}

/// The output tool's input when the format's schema was wrapped.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wrapped<'a> {
    #[serde(borrow)]
    value: &'a serde_json::value::RawValue,
}

/// Assembles the blocks of an answer; the output tool's input becomes the
/// answer's text with finish reason `stop`.
fn assemble(
    blocks: Vec<Block>,
    stop: &str,
    usage: Option<Usage>,
    output: Output,
) -> Result<Response, ModelError> {
    let mut answer = Assembly::default();
    let mut finish = finish_reason(stop);
    for block in blocks {
        match block {
            Block::Text(text) => answer.content.push_str(&text),
            Block::Thinking(text) => answer.reasoning.push_str(&text),
            Block::ToolUse { name, input, .. } if name == OUTPUT_TOOL && output != Output::None => {
                let input = if input.is_empty() { "{}".into() } else { input };
                let text = match output {
                    // The member's own text, so nothing in it is resolved here.
                    Output::Wrapped => serde_json::from_str::<Wrapped<'_>>(&input)
                        .map_or_else(|_| input.clone(), |wrapped| wrapped.value.get().to_owned()),
                    _ => input,
                };
                // The answer is the tool's input alone.
                return Assembly {
                    reasoning: answer.reasoning,
                    content: text,
                    ..Assembly::default()
                }
                .response(FinishReason::Stop, usage);
            }
            Block::ToolUse { id, name, input } => answer.calls.push(ToolCall {
                id,
                name,
                arguments: if input.is_empty() { "{}".into() } else { input },
            }),
            Block::Other => {}
        }
    }
    if finish == FinishReason::ToolCalls && answer.calls.is_empty() {
        finish = FinishReason::Other;
    }
    answer.response(finish, usage)
}

/// Parses a plain (non-streamed) Messages answer.
fn parse_message(body: &[u8], output: Output) -> Result<Response, ModelError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|error| ModelError::Malformed(format!("the answer is not JSON: {error}")))?;
    if let Some(error) = ErrorObject::of(&value) {
        return Err(error.classify());
    }
    let wire: WireMessage = serde_json::from_slice(body)
        .map_err(|error| ModelError::Malformed(format!("the answer is not a message: {error}")))?;
    let stop = wire
        .stop_reason
        .ok_or_else(|| ModelError::Malformed("the answer has no stop reason".into()))?;
    let blocks = wire.content.into_iter().map(Block::of_wire).collect();
    assemble(blocks, &stop, wire.usage.and_then(usage), output)
}

/// Folds the events of a streamed answer.
struct StreamState {
    output: Output,
    blocks: BTreeMap<u64, Block>,
    started: Option<WireUsage>,
    output_tokens: Option<u64>,
    stop: Option<String>,
    done: bool,
}

impl StreamState {
    fn event(&mut self, data: &str, on_delta: DeltaFn<'_>) -> Result<ControlFlow<()>, ModelError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(ControlFlow::Continue(()));
        }
        let value: Value = serde_json::from_str(data)
            .map_err(|error| ModelError::Malformed(format!("an event is not JSON: {error}")))?;
        if let Some(error) = ErrorObject::of(&value) {
            return Err(error.classify());
        }
        let index = value.get("index").and_then(Value::as_u64).unwrap_or(0);
        match value.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                self.started = value
                    .pointer("/message/usage")
                    .and_then(|usage| serde_json::from_value(usage.clone()).ok());
            }
            Some("content_block_start") => {
                let block = value.get("content_block").map_or(Block::Other, Block::of);
                if let Block::ToolUse { id, name, .. } = &block
                    && !self.is_output(name)
                {
                    on_delta(Delta::ToolCall {
                        index: u32::try_from(index).unwrap_or(u32::MAX),
                        id: Some(id.clone()),
                        name: Some(name.clone()),
                        arguments: String::new(),
                    });
                }
                self.blocks.insert(index, block);
            }
            Some("content_block_delta") => {
                let delta = value.get("delta").cloned().unwrap_or_default();
                let text = |key: &str| {
                    delta
                        .get(key)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned()
                };
                let output = self.output != Output::None;
                match (
                    self.blocks.get_mut(&index),
                    delta.get("type").and_then(Value::as_str),
                ) {
                    (Some(Block::Text(content)), Some("text_delta")) => {
                        let piece = text("text");
                        content.push_str(&piece);
                        on_delta(Delta::Text { text: piece });
                    }
                    (Some(Block::Thinking(content)), Some("thinking_delta")) => {
                        let piece = text("thinking");
                        content.push_str(&piece);
                        on_delta(Delta::Reasoning { text: piece });
                    }
                    (Some(Block::ToolUse { name, input, .. }), Some("input_json_delta")) => {
                        let piece = text("partial_json");
                        input.push_str(&piece);
                        if output && name == OUTPUT_TOOL {
                            on_delta(Delta::Text { text: piece });
                        } else {
                            on_delta(Delta::ToolCall {
                                index: u32::try_from(index).unwrap_or(u32::MAX),
                                id: None,
                                name: None,
                                arguments: piece,
                            });
                        }
                    }
                    // Signatures and unknown deltas carry nothing Baton keeps.
                    _ => {}
                }
            }
            Some("message_delta") => {
                if let Some(stop) = value.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop = Some(stop.to_owned());
                }
                if let Some(tokens) = value
                    .pointer("/usage/output_tokens")
                    .and_then(Value::as_u64)
                {
                    self.output_tokens = Some(tokens);
                }
            }
            Some("message_stop") => {
                self.done = true;
                return Ok(ControlFlow::Break(()));
            }
            // `ping`, `content_block_stop` and events added later.
            _ => {}
        }
        Ok(ControlFlow::Continue(()))
    }

    fn is_output(&self, name: &str) -> bool {
        self.output != Output::None && name == OUTPUT_TOOL
    }

    fn finish(self) -> Result<Response, ModelError> {
        let Some(stop) = self.stop else {
            return Err(if self.done {
                ModelError::Malformed("the stream stopped without a stop reason".into())
            } else {
                ModelError::Interrupted("the stream ended before its stop reason".into())
            });
        };
        let usage = self.started.and_then(|started| {
            usage(WireUsage {
                output_tokens: self.output_tokens.or(started.output_tokens),
                ..started
            })
        });
        assemble(
            self.blocks.into_values().collect(),
            &stop,
            usage,
            self.output,
        )
    }
}

impl ChatModel for AnthropicModel {
    fn identity(&self) -> ModelIdentity {
        ModelIdentity {
            provider: format!("anthropic {}", self.config.base_url.trim_end_matches('/')),
            model: self.config.model.clone(),
        }
    }

    fn price(&self) -> Option<Price> {
        self.config.prices.get(&self.config.model).copied()
    }

    fn call(&self, request: Request) -> BoxFuture<'_, Result<Response, ModelError>> {
        Box::pin(async move {
            let wire = self.wire(&request, Delivery::Whole)?;
            let response = self.send(&wire.body).await?;
            let body = http::read_limited(response, self.config.max_response_bytes).await?;
            parse_message(&body, wire.output)
        })
    }

    fn stream<'a>(
        &'a self,
        request: Request,
        on_delta: DeltaFn<'a>,
    ) -> BoxFuture<'a, Result<Response, ModelError>> {
        Box::pin(async move {
            let wire = self.wire(&request, Delivery::Stream)?;
            let response = self.send(&wire.body).await?;
            let mut state = StreamState {
                output: wire.output,
                blocks: BTreeMap::new(),
                started: None,
                output_tokens: None,
                stop: None,
                done: false,
            };
            http::read_events(response, self.config.max_response_bytes, |event| {
                state.event(&event.data, on_delta)
            })
            .await?;
            state.finish()
        })
    }
}

#[cfg(test)]
mod fuzz {
    //! Fuzzing of what a server sends: whole messages and event streams,
    //! random or mutated from valid ones, are decoded or refused with a
    //! classified failure, never a panic.

    use baton_testkit::fuzz;
    use proptest::prelude::*;

    use super::*;

    fn messages() -> Vec<Vec<u8>> {
        vec![
            br#"{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"hi"},{"type":"tool_use","id":"t","name":"add","input":{"a":1}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":11,"output_tokens":3,"cache_read_input_tokens":2}}"#.to_vec(),
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#.to_vec(),
        ]
    }

    fn streams() -> Vec<Vec<u8>> {
        vec![
            b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\nevent: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"add\",\"input\":{}}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\\\":1}\"}}\n\nevent: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":7}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_vec(),
            b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n".to_vec(),
        ]
    }

    fn state() -> StreamState {
        StreamState {
            output: Output::None,
            blocks: BTreeMap::new(),
            started: None,
            output_tokens: None,
            stop: None,
            done: false,
        }
    }

    proptest! {
        #![proptest_config(fuzz::config())]

        /// A whole message's body: a response, or a classified failure.
        #[test]
        fn fuzz_anthropic_messages(body in fuzz::bytes(messages())) {
            if let Err(error) = parse_message(&body, Output::None) {
                prop_assert!(http::is_decoder_failure(&error), "{error:?}");
            }
        }

        /// A streamed message's bytes, cut anywhere into two chunks: a
        /// response, or a classified failure.
        #[test]
        fn fuzz_anthropic_streams(body in fuzz::bytes(streams()), cut in 0usize..1500) {
            let mut state = state();
            let folded = http::fold_bytes(&body, cut, |event| state.event(&event.data, &|_| {}));
            if let Err(error) = folded.and_then(|()| state.finish()) {
                prop_assert!(http::is_decoder_failure(&error), "{error:?}");
            }
        }
    }
}
