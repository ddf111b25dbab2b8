//! An OpenAI-compatible Chat Completions provider (feature `openai`).
//!
//! Speaks the Chat Completions wire format over HTTP: `POST
//! {base_url}/chat/completions` with messages, tools, tool choice,
//! temperature, `max_tokens` and a JSON-schema response format; plain
//! answers or server-sent events (`stream: true`, usage requested with
//! `stream_options.include_usage`). It is written from the protocol's public
//! documentation and tested against a local server speaking that format;
//! servers that claim the protocol (OpenAI, vLLM, llama.cpp server, Ollama)
//! are the target, but no live server was verified.
//!
//! Failures are classified [`ModelError`]s: an error status keeps the HTTP
//! status and whether it is retryable (408, 409, 429 and 5xx are); a
//! timeout or a failed connection is retryable; a malformed or oversized
//! answer is not.

use std::collections::BTreeMap;
use std::time::Duration;

use baton_run::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::chat::{
    FinishReason, Message, Part, Request, Response, ResponseFormat, Role, ToolCall, ToolChoice,
    Usage,
};
use crate::model::{ChatModel, Delta, DeltaFn, ModelError, ModelIdentity};

/// The base URL used when neither the configuration nor `OPENAI_BASE_URL` gives one.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// How to reach a Chat Completions server.
#[derive(Clone, PartialEq, Eq)]
pub struct OpenAiConfig {
    /// The API root, such as `https://api.openai.com/v1` or `http://127.0.0.1:8000/v1`.
    pub base_url: String,
    /// The bearer token, if the server needs one.
    pub api_key: Option<String>,
    /// The model name.
    pub model: String,
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
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl OpenAiConfig {
    /// A configuration with a 120 s call timeout, a 10 s connect timeout and
    /// a 4 MiB answer limit.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> OpenAiConfig {
        OpenAiConfig {
            base_url: base_url.into(),
            api_key: None,
            model: model.into(),
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

impl OpenAiModel {
    /// A client for a configuration.
    pub fn new(config: OpenAiConfig) -> Result<OpenAiModel, ModelError> {
        if config.model.trim().is_empty() {
            return Err(ModelError::Request("the model name is empty".into()));
        }
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|error| ModelError::Request(format!("http client: {error}")))?;
        Ok(OpenAiModel { config, client })
    }

    /// The configuration.
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    async fn send(&self, body: Value) -> Result<reqwest::Response, ModelError> {
        let url = format!(
            "{}/chat/completions",
            self.config.base_url.trim_end_matches('/')
        );
        let mut builder = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).map_err(|e| ModelError::Request(e.to_string()))?);
        if let Some(key) = &self.config.api_key {
            builder = builder.bearer_auth(key);
        }
        let response = builder.send().await.map_err(transport)?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            let body = read_limited(response, self.config.max_response_bytes.min(64 * 1024))
                .await
                .unwrap_or_default();
            return Err(status_error(status, &body));
        }
        Ok(response)
    }
}

fn transport(error: reqwest::Error) -> ModelError {
    if error.is_timeout() {
        ModelError::Timeout(error.to_string())
    } else {
        ModelError::Transport(error.to_string())
    }
}

fn status_error(status: u16, body: &[u8]) -> ModelError {
    let message = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(512).collect());
    ModelError::Status {
        status,
        retryable: matches!(status, 408 | 409 | 429 | 500..=599),
        message: message.chars().take(512).collect(),
    }
}

async fn read_limited(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, ModelError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport)? {
        if body.len() + chunk.len() > limit {
            return Err(ModelError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The wire request body.
pub fn request_body(model: &str, request: &Request, stream: bool) -> Value {
    let mut messages = Vec::new();
    for message in request.messages() {
        wire_messages(message, &mut messages);
    }
    let mut body = json!({ "model": model, "messages": messages });
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
            ToolChoice::Tool { name } => json!({"type": "function", "function": {"name": name}}),
        };
    }
    let options = request.options();
    if let Some(temperature) = options.temperature {
        body["temperature"] = json!(temperature);
    }
    if let Some(max_tokens) = options.max_tokens {
        body["max_tokens"] = json!(max_tokens);
    }
    if let Some(ResponseFormat::JsonSchema {
        name,
        schema,
        strict,
    }) = &options.response_format
    {
        body["response_format"] = json!({
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": strict},
        });
    }
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
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

#[derive(Deserialize, Serialize, Clone, Copy)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
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

fn usage(wire: Option<WireUsage>) -> Usage {
    wire.map(|u| Usage {
        input_tokens: u.prompt_tokens,
        output_tokens: u.completion_tokens,
    })
    .unwrap_or_default()
}

fn assemble(
    reasoning: Option<String>,
    content: Option<String>,
    refusal: Option<String>,
    calls: Vec<ToolCall>,
    finish: FinishReason,
    usage: Usage,
) -> Result<Response, ModelError> {
    let mut parts = Vec::new();
    if let Some(text) = reasoning.filter(|t| !t.is_empty()) {
        parts.push(Part::Reasoning { text });
    }
    if let Some(text) = content.filter(|t| !t.is_empty()) {
        parts.push(Part::Text { text });
    }
    if let Some(text) = refusal.filter(|t| !t.is_empty()) {
        parts.push(Part::Refusal { text });
    }
    parts.extend(calls.into_iter().map(|call| Part::ToolCall { call }));
    if parts.is_empty() {
        parts.push(Part::text(""));
    }
    let message = Message::new(Role::Assistant, parts)
        .map_err(|error| ModelError::Malformed(error.to_string()))?;
    Response::new(message, finish, usage).map_err(|error| ModelError::Malformed(error.to_string()))
}

/// Parses a plain (non-streamed) Chat Completions answer.
pub fn parse_completion(body: &[u8]) -> Result<Response, ModelError> {
    let wire: WireCompletion = serde_json::from_slice(body).map_err(|error| {
        ModelError::Malformed(format!("the answer is not a completion: {error}"))
    })?;
    let choice = wire
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| ModelError::Malformed("the answer has no choices".into()))?;
    let calls = choice
        .message
        .tool_calls
        .into_iter()
        .map(|call| ToolCall {
            id: call.id,
            name: call.function.name,
            arguments: call.function.arguments,
        })
        .collect();
    assemble(
        choice.message.reasoning_content,
        choice.message.content,
        choice.message.refusal,
        calls,
        finish_reason(choice.finish_reason.as_deref()),
        usage(wire.usage),
    )
}

/// Folds server-sent events into deltas and, at the end, a response.
#[derive(Default)]
struct StreamState {
    buffer: Vec<u8>,
    reasoning: String,
    content: String,
    refusal: String,
    calls: BTreeMap<u32, (String, String, String)>,
    finish: Option<String>,
    usage: Option<WireUsage>,
    done: bool,
    seen: bool,
}

impl StreamState {
    /// Takes more bytes; emits a delta for each piece of every complete event.
    fn feed(&mut self, bytes: &[u8], on_delta: DeltaFn<'_>) -> Result<(), ModelError> {
        self.buffer.extend_from_slice(bytes);
        while let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            let line = String::from_utf8(line)
                .map_err(|_| ModelError::Malformed("the event stream is not UTF-8".into()))?;
            self.line(line.trim_end_matches(['\r', '\n']), on_delta)?;
        }
        Ok(())
    }

    fn line(&mut self, line: &str, on_delta: DeltaFn<'_>) -> Result<(), ModelError> {
        let Some(data) = line.strip_prefix("data:") else {
            // Comments, `event:` and `id:` lines and blank separators carry nothing we use.
            return Ok(());
        };
        let data = data.trim_start();
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        if self.done {
            return Ok(());
        }
        let chunk: WireChunk = serde_json::from_str(data).map_err(|error| {
            ModelError::Malformed(format!("an event is not a completion chunk: {error}"))
        })?;
        self.seen = true;
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        for choice in chunk.choices {
            if let Some(reason) = choice.finish_reason {
                self.finish = Some(reason);
            }
            let delta = choice.delta;
            if let Some(text) = delta.reasoning_content.filter(|t| !t.is_empty()) {
                self.reasoning.push_str(&text);
                on_delta(Delta::Reasoning { text });
            }
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                self.content.push_str(&text);
                on_delta(Delta::Text { text });
            }
            if let Some(text) = delta.refusal {
                self.refusal.push_str(&text);
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
        Ok(())
    }

    fn finish(self) -> Result<Response, ModelError> {
        if !self.seen {
            return Err(ModelError::Malformed(
                "the event stream carried no chunk".into(),
            ));
        }
        let calls = self
            .calls
            .into_values()
            .map(|(id, name, arguments)| ToolCall {
                id,
                name,
                arguments,
            })
            .collect();
        assemble(
            Some(self.reasoning),
            Some(self.content),
            Some(self.refusal),
            calls,
            finish_reason(self.finish.as_deref()),
            usage(self.usage),
        )
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

    fn call(&self, request: Request) -> BoxFuture<'_, Result<Response, ModelError>> {
        Box::pin(async move {
            let response = self
                .send(request_body(&self.config.model, &request, false))
                .await?;
            let body = read_limited(response, self.config.max_response_bytes).await?;
            parse_completion(&body)
        })
    }

    fn stream<'a>(
        &'a self,
        request: Request,
        on_delta: DeltaFn<'a>,
    ) -> BoxFuture<'a, Result<Response, ModelError>> {
        Box::pin(async move {
            let mut response = self
                .send(request_body(&self.config.model, &request, true))
                .await?;
            let mut state = StreamState::default();
            let mut total = 0usize;
            while let Some(chunk) = response.chunk().await.map_err(transport)? {
                total += chunk.len();
                if total > self.config.max_response_bytes {
                    return Err(ModelError::TooLarge {
                        limit: self.config.max_response_bytes,
                    });
                }
                state.feed(&chunk, on_delta)?;
            }
            state.feed(b"\n", on_delta)?;
            state.finish()
        })
    }
}
