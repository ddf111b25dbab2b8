//! An OpenAI-compatible Chat Completions provider (feature `openai`).
//!
//! Speaks the Chat Completions wire format over HTTP: `POST
//! {base_url}/chat/completions` with messages, tools, tool choice,
//! temperature, the token limit (`max_completion_tokens` by default,
//! `max_tokens` for servers that only know that; see [`TokenLimit`]) and a
//! JSON-schema response format; plain answers or server-sent events
//! (`stream: true`, usage requested with `stream_options.include_usage`),
//! parsed by `eventsource-stream`. It is written from the protocol's public
//! documentation and tested against a local server speaking that format;
//! servers that claim the protocol (OpenAI, vLLM, llama.cpp server, Ollama)
//! are the target, but no live server was verified.
//!
//! A strict response format is sent transformed into the strict subset
//! ([`StrictSchema`]) and the answer is mapped back before Baton decodes
//! it; a schema the subset cannot express is sent with `strict: false` and
//! a warning in the trace.
//!
//! Failures are classified [`ModelError`]s: error statuses and error
//! objects inside a stream by what they mean (rate limited, unavailable,
//! refused), with `Retry-After`; a connection never made is definite; a
//! timeout or an answer cut off after sending (a stream that ends before a
//! finish reason) is uncertain; a malformed or oversized answer is neither.
//! A missing usage report leaves the response's usage unknown.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::Duration;

use baton_run::{BoxFuture, Payload};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::chat::{
    FinishReason, Message, Part, Request, Response, ResponseFormat, Role, ToolCall, ToolChoice,
    Usage,
};
use crate::cost::{Price, PriceTable};
use crate::http::{self, Assembly, ErrorObject};
use crate::model::{ChatModel, Delta, DeltaFn, ModelError, ModelIdentity};
use crate::strict::StrictSchema;

/// The base URL used when neither the configuration nor `OPENAI_BASE_URL` gives one.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// Which request field carries the token limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TokenLimit {
    /// `max_completion_tokens`: what OpenAI's current models, reasoning
    /// models included, require.
    #[default]
    MaxCompletionTokens,
    /// `max_tokens`: the older field, for servers that know only that.
    MaxTokens,
}

/// How a request is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// One JSON answer.
    Whole,
    /// Server-sent events with usage included.
    Stream,
}

/// How to reach a Chat Completions server.
#[derive(Clone, PartialEq, Eq)]
pub struct OpenAiConfig {
    /// The API root, such as `https://api.openai.com/v1` or `http://127.0.0.1:8000/v1`.
    pub base_url: String,
    /// The bearer token, if the server needs one.
    pub api_key: Option<String>,
    /// The model name.
    pub model: String,
    /// Which field carries the token limit.
    pub token_limit: TokenLimit,
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

impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("token_limit", &self.token_limit)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl OpenAiConfig {
    /// A configuration sending `max_completion_tokens`, with no prices, a
    /// 120 s call timeout, a 10 s connect timeout and a 4 MiB answer limit.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> OpenAiConfig {
        OpenAiConfig {
            base_url: base_url.into(),
            api_key: None,
            model: model.into(),
            token_limit: TokenLimit::MaxCompletionTokens,
            prices: PriceTable::new(),
            timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            max_response_bytes: 4 * 1024 * 1024,
        }
    }

    /// Reads the conventional variables: `OPENAI_BASE_URL` (default
    /// [`DEFAULT_BASE_URL`]), `OPENAI_API_KEY` (optional) and
    /// `OPENAI_MODEL` (required).
    pub fn from_env() -> Result<OpenAiConfig, ModelError> {
        OpenAiConfig::from_vars(|name| std::env::var(name).ok())
    }

    /// Like [`OpenAiConfig::from_env`], reading the variables through `var`
    /// (empty values count as absent).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<OpenAiConfig, ModelError> {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let model = var("OPENAI_MODEL")
            .ok_or_else(|| ModelError::Request("OPENAI_MODEL is not set".into()))?;
        let mut config = OpenAiConfig::new(
            var("OPENAI_BASE_URL").unwrap_or_else(|| DEFAULT_BASE_URL.into()),
            model,
        );
        config.api_key = var("OPENAI_API_KEY");
        Ok(config)
    }
}

/// A Chat Completions client.
#[derive(Clone, Debug)]
pub struct OpenAiModel {
    config: OpenAiConfig,
    client: reqwest::Client,
}

/// A request body and, for a strict response format, the schema to map the
/// answer back with.
struct Wire {
    body: Value,
    strict: Option<StrictSchema>,
}

impl OpenAiModel {
    /// A client for a configuration.
    pub fn new(config: OpenAiConfig) -> Result<OpenAiModel, ModelError> {
        if config.model.trim().is_empty() {
            return Err(ModelError::Request("the model name is empty".into()));
        }
        let client = http::client(config.timeout, config.connect_timeout)?;
        Ok(OpenAiModel { config, client })
    }

    /// The configuration.
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// The wire request body for `request`.
    pub fn request_body(&self, request: &Request, delivery: Delivery) -> Value {
        self.wire(request, delivery).body
    }

    fn wire(&self, request: &Request, delivery: Delivery) -> Wire {
        let mut messages = Vec::new();
        for message in request.messages() {
            wire_messages(message, &mut messages);
        }
        let mut body = json!({ "model": self.config.model, "messages": messages });
        if !request.tools().is_empty() {
            body["tools"] = request
                .tools()
                .iter()
                .map(|tool| {
                    json!({
                        "type": "function",
                        "function": {
                            "name": tool.name,
                            "description": tool.description,
                            "parameters": tool.parameters,
                        }
                    })
                })
                .collect();
            body["tool_choice"] = match request.tool_choice() {
                ToolChoice::Auto => json!("auto"),
                ToolChoice::None => json!("none"),
                ToolChoice::Required => json!("required"),
                ToolChoice::Tool { name } => {
                    json!({"type": "function", "function": {"name": name}})
                }
            };
        }
        let options = request.options();
        if let Some(temperature) = options.temperature {
            body["temperature"] = json!(temperature);
        }
        if let Some(max_tokens) = options.max_tokens {
            let field = match self.config.token_limit {
                TokenLimit::MaxCompletionTokens => "max_completion_tokens",
                TokenLimit::MaxTokens => "max_tokens",
            };
            body[field] = json!(max_tokens);
        }
        let mut strict = None;
        if let Some(ResponseFormat::JsonSchema {
            name,
            schema,
            strict: wanted,
        }) = &options.response_format
        {
            let (schema, sent_strict) = if *wanted {
                match StrictSchema::new(schema) {
                    Ok(transformed) => {
                        let sent = transformed.schema().clone();
                        strict = Some(transformed);
                        (sent, true)
                    }
                    Err(error) => {
                        tracing::warn!(
                            format = %name,
                            %error,
                            "strict mode cannot express the response format; sending it with strict false"
                        );
                        (schema.clone(), false)
                    }
                }
            } else {
                (schema.clone(), false)
            };
            body["response_format"] = json!({
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": sent_strict},
            });
        }
        if delivery == Delivery::Stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        Wire { body, strict }
    }

    async fn send(&self, body: &Value) -> Result<reqwest::Response, ModelError> {
        let url = format!(
            "{}/chat/completions",
            self.config.base_url.trim_end_matches('/')
        );
        let mut builder = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).map_err(|e| ModelError::Request(e.to_string()))?);
        if let Some(key) = &self.config.api_key {
            builder = builder.bearer_auth(key);
        }
        let response = builder.send().await.map_err(|e| http::send_failure(&e))?;
        if !response.status().is_success() {
            return Err(http::error_answer(response).await);
        }
        Ok(response)
    }
}

/// Maps a strict-mode answer back to the original schema (see
/// [`StrictSchema::restore`]). Only a complete answer whose text is strict
/// JSON is mapped; anything else is left for Baton's decode to judge, so a
/// duplicate key is refused there rather than resolved here.
fn restore(response: Response, strict: Option<&StrictSchema>) -> Response {
    let Some(strict) = strict else {
        return response;
    };
    if response.finish_reason() != FinishReason::Stop {
        return response;
    }
    let text = response.message().text();
    let Ok(answer) = Payload::parse_str(text.trim()) else {
        return response;
    };
    match Payload::from_value(&strict.restore(answer.to_value())) {
        Ok(restored) => response.with_text(restored.as_str().to_owned()),
        Err(_) => response,
    }
}

fn wire_messages(message: &Message, out: &mut Vec<Value>) {
    match message.role() {
        Role::System => out.push(json!({"role": "system", "content": message.text()})),
        Role::User => {
            let plain = message
                .parts()
                .iter()
                .all(|p| matches!(p, Part::Text { .. }));
            if plain {
                out.push(json!({"role": "user", "content": message.text()}));
            } else {
                let content: Vec<Value> = message
                    .parts()
                    .iter()
                    .filter_map(|part| match part {
                        Part::Text { text } => Some(json!({"type": "text", "text": text})),
                        Part::Media { media } => {
                            Some(json!({"type": "image_url", "image_url": {"url": media.url}}))
                        }
                        _ => None,
                    })
                    .collect();
                out.push(json!({"role": "user", "content": content}));
            }
        }
        Role::Assistant => {
            let text = message.text();
            let mut wire = json!({
                "role": "assistant",
                "content": if text.is_empty() { Value::Null } else { Value::String(text) },
            });
            let calls: Vec<Value> = message
                .calls()
                .into_iter()
                .map(|call| {
                    json!({
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    })
                })
                .collect();
            if !calls.is_empty() {
                wire["tool_calls"] = Value::Array(calls);
            }
            if let Some(refusal) = message.refusal() {
                wire["refusal"] = json!(refusal);
            }
            out.push(wire);
        }
        Role::Tool => {
            for part in message.parts() {
                if let Part::ToolResult { result } = part {
                    out.push(json!({
                        "role": "tool",
                        "tool_call_id": result.id,
                        "content": result.output,
                    }));
                }
            }
        }
    }
}

// Wire answers are read leniently (servers add fields); what they become is strict.

#[derive(Deserialize)]
struct WireCompletion {
    #[serde(default)]
    choices: Vec<WireChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChoice {
    message: WireMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct WireMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Vec<WireToolCall>,
}

#[derive(Deserialize)]
struct WireToolCall {
    id: String,
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    #[serde(default)]
    arguments: String,
}

#[derive(Deserialize, Clone, Copy)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<WirePromptDetails>,
    #[serde(default)]
    completion_tokens_details: Option<WireCompletionDetails>,
}

#[derive(Deserialize, Clone, Copy)]
struct WirePromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize, Clone, Copy)]
struct WireCompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct WireChunk {
    #[serde(default)]
    choices: Vec<WireChunkChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChunkChoice {
    #[serde(default)]
    delta: WireDelta,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct WireDelta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Vec<WireToolCallDelta>,
}

#[derive(Deserialize)]
struct WireToolCallDelta {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<WireFunctionDelta>,
}

#[derive(Deserialize)]
struct WireFunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

fn finish_reason(reason: Option<&str>) -> FinishReason {
    match reason {
        Some("stop") => FinishReason::Stop,
        Some("length") => FinishReason::Length,
        Some("tool_calls" | "function_call") => FinishReason::ToolCalls,
        Some("content_filter") => FinishReason::ContentFilter,
        Some("refusal") => FinishReason::Refusal,
        _ => FinishReason::Other,
    }
}

fn usage(wire: WireUsage) -> Usage {
    Usage {
        input_tokens: wire.prompt_tokens,
        output_tokens: wire.completion_tokens,
        cached_input_tokens: wire
            .prompt_tokens_details
            .and_then(|details| details.cached_tokens)
            .unwrap_or(0),
        reasoning_tokens: wire
            .completion_tokens_details
            .and_then(|details| details.reasoning_tokens)
            .unwrap_or(0),
    }
}

/// Parses a plain (non-streamed) Chat Completions answer. A body that is an
/// error object is classified as one; an answer without a usage report has
/// its usage unknown.
pub fn parse_completion(body: &[u8]) -> Result<Response, ModelError> {
    if let Some(error) = serde_json::from_slice::<Value>(body)
        .ok()
        .as_ref()
        .and_then(ErrorObject::of)
    {
        return Err(error.classify());
    }
    let wire: WireCompletion = serde_json::from_slice(body).map_err(|error| {
        ModelError::Malformed(format!("the answer is not a completion: {error}"))
    })?;
    let choice = wire
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| ModelError::Malformed("the answer has no choices".into()))?;
    let finish = choice
        .finish_reason
        .as_deref()
        .ok_or_else(|| ModelError::Malformed("the answer has no finish reason".into()))?;
    Assembly {
        reasoning: choice.message.reasoning_content.unwrap_or_default(),
        content: choice.message.content.unwrap_or_default(),
        refusal: choice.message.refusal.unwrap_or_default(),
        calls: choice
            .message
            .tool_calls
            .into_iter()
            .map(|call| ToolCall {
                id: call.id,
                name: call.function.name,
                arguments: call.function.arguments,
            })
            .collect(),
    }
    .response(finish_reason(Some(finish)), wire.usage.map(usage))
}

/// Folds server-sent events into deltas and, at the end, a response.
#[derive(Default)]
struct StreamState {
    answer: Assembly,
    calls: BTreeMap<u32, (String, String, String)>,
    finish: Option<String>,
    usage: Option<WireUsage>,
    done: bool,
}

impl StreamState {
    /// Takes one event: `[DONE]` ends the stream, an error object fails
    /// the call, a chunk adds to the answer and reports its deltas.
    fn event(&mut self, data: &str, on_delta: DeltaFn<'_>) -> Result<ControlFlow<()>, ModelError> {
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(ControlFlow::Break(()));
        }
        if data.is_empty() {
            return Ok(ControlFlow::Continue(()));
        }
        let value: Value = serde_json::from_str(data)
            .map_err(|error| ModelError::Malformed(format!("an event is not JSON: {error}")))?;
        if let Some(error) = ErrorObject::of(&value) {
            return Err(error.classify());
        }
        let chunk: WireChunk = serde_json::from_value(value).map_err(|error| {
            ModelError::Malformed(format!("an event is not a completion chunk: {error}"))
        })?;
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        for choice in chunk.choices {
            if let Some(reason) = choice.finish_reason {
                self.finish = Some(reason);
            }
            let delta = choice.delta;
            if let Some(text) = delta.reasoning_content.filter(|t| !t.is_empty()) {
                self.answer.reasoning.push_str(&text);
                on_delta(Delta::Reasoning { text });
            }
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                self.answer.content.push_str(&text);
                on_delta(Delta::Text { text });
            }
            if let Some(text) = delta.refusal {
                self.answer.refusal.push_str(&text);
            }
            for call in delta.tool_calls {
                let entry = self.calls.entry(call.index).or_default();
                if let Some(id) = &call.id {
                    entry.0.push_str(id);
                }
                let (name, arguments) = call
                    .function
                    .map(|f| (f.name, f.arguments.unwrap_or_default()))
                    .unwrap_or_default();
                if let Some(name) = &name {
                    entry.1.push_str(name);
                }
                entry.2.push_str(&arguments);
                on_delta(Delta::ToolCall {
                    index: call.index,
                    id: call.id,
                    name,
                    arguments,
                });
            }
        }
        Ok(ControlFlow::Continue(()))
    }

    /// The response, once the stream ended: without a finish reason the
    /// answer is incomplete, so the call fails (uncertain when the stream
    /// was cut, malformed when the server said it was done).
    fn finish(mut self) -> Result<Response, ModelError> {
        let Some(finish) = self.finish else {
            return Err(if self.done {
                ModelError::Malformed("the stream ended with [DONE] but no finish reason".into())
            } else {
                ModelError::Interrupted("the stream ended before a finish reason".into())
            });
        };
        self.answer.calls = self
            .calls
            .into_values()
            .map(|(id, name, arguments)| ToolCall {
                id,
                name,
                arguments,
            })
            .collect();
        self.answer
            .response(finish_reason(Some(&finish)), self.usage.map(usage))
    }
}

impl ChatModel for OpenAiModel {
    fn identity(&self) -> ModelIdentity {
        ModelIdentity {
            provider: format!(
                "openai-compatible {}",
                self.config.base_url.trim_end_matches('/')
            ),
            model: self.config.model.clone(),
        }
    }

    fn price(&self) -> Option<Price> {
        self.config.prices.get(&self.config.model).copied()
    }

    fn call(&self, request: Request) -> BoxFuture<'_, Result<Response, ModelError>> {
        Box::pin(async move {
            let wire = self.wire(&request, Delivery::Whole);
            let response = self.send(&wire.body).await?;
            let body = http::read_limited(response, self.config.max_response_bytes).await?;
            Ok(restore(parse_completion(&body)?, wire.strict.as_ref()))
        })
    }

    fn stream<'a>(
        &'a self,
        request: Request,
        on_delta: DeltaFn<'a>,
    ) -> BoxFuture<'a, Result<Response, ModelError>> {
        Box::pin(async move {
            let wire = self.wire(&request, Delivery::Stream);
            let response = self.send(&wire.body).await?;
            let mut state = StreamState::default();
            http::read_events(response, self.config.max_response_bytes, |event| {
                state.event(&event.data, on_delta)
            })
            .await?;
            Ok(restore(state.finish()?, wire.strict.as_ref()))
        })
    }
}

#[cfg(test)]
mod fuzz {
    //! Fuzzing of what a server sends: whole answers and event streams,
    //! random or mutated from valid ones, are decoded or refused with a
    //! classified failure, never a panic.

    use baton_testkit::fuzz;
    use proptest::prelude::*;

    use super::*;

    fn answers() -> Vec<Vec<u8>> {
        vec![
            br#"{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi","tool_calls":[{"id":"t","type":"function","function":{"name":"add","arguments":"{\"a\":1}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":11,"completion_tokens":3,"total_tokens":14,"completion_tokens_details":{"reasoning_tokens":1}}}"#.to_vec(),
            br#"{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded"}}"#.to_vec(),
        ]
    }

    fn streams() -> Vec<Vec<u8>> {
        vec![
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"he\"},\"finish_reason\":null}]}\n\n: comment\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"t\",\"function\":{\"name\":\"add\",\"arguments\":\"{\\\"a\\\"\"}}]},\"finish_reason\":null}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1,\"total_tokens\":3}}\n\ndata: [DONE]\n\n".to_vec(),
            b"data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n".to_vec(),
        ]
    }

    proptest! {
        #![proptest_config(fuzz::config())]

        /// A whole answer's body: a response, or a classified failure.
        #[test]
        fn fuzz_openai_answers(body in fuzz::bytes(answers())) {
            if let Err(error) = parse_completion(&body) {
                prop_assert!(http::is_decoder_failure(&error), "{error:?}");
            }
        }

        /// A streamed answer's bytes, cut anywhere into two chunks: a
        /// response, or a classified failure.
        #[test]
        fn fuzz_openai_streams(body in fuzz::bytes(streams()), cut in 0usize..600) {
            let mut state = StreamState::default();
            let folded = http::fold_bytes(&body, cut, |event| state.event(&event.data, &|_| {}));
            if let Err(error) = folded.and_then(|()| state.finish()) {
                prop_assert!(http::is_decoder_failure(&error), "{error:?}");
            }
        }
    }
}
