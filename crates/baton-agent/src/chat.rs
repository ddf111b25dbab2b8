//! Chat types: messages, parts, tool calls, requests and responses.
//!
//! Every type decodes strictly (unknown fields are rejected) and validates
//! its invariants both in its constructor and when it is decoded, so a value
//! of these types is always well formed.

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Why a chat value is not well formed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChatError {
    /// A message holds a part its role does not allow, or no part at all.
    #[error("invalid {role} message: {reason}")]
    Message {
        /// The message's role.
        role: Role,
        /// What is wrong.
        reason: String,
    },
    /// A request breaks a request rule.
    #[error("invalid request: {0}")]
    Request(String),
    /// A response breaks a response rule.
    #[error("invalid response: {0}")]
    Response(String),
}

impl ChatError {
    /// The stable failure code of this error: `chat.message.invalid`,
    /// `chat.request.invalid` or `chat.response.invalid`.
    pub fn code(&self) -> &'static str {
        match self {
            ChatError::Message { .. } => "chat.message.invalid",
            ChatError::Request(_) => "chat.request.invalid",
            ChatError::Response(_) => "chat.response.invalid",
        }
    }
}

/// Who speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Instructions; only text, and only at the start of a conversation.
    System,
    /// The user: text and media.
    User,
    /// The model: text, reasoning, tool calls and refusals.
    Assistant,
    /// Tool results answering the assistant's tool calls.
    Tool,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        })
    }
}

/// A reference to media the provider fetches or decodes (a URL or a `data:` URL).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MediaRef {
    /// Where the media is.
    pub url: String,
    /// Its media type, such as `image/png`.
    pub media_type: String,
}

/// A tool invocation requested by the model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// The provider's id of the call; the result answers it.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments as the model wrote them: JSON text, not yet trusted.
    pub arguments: String,
}

/// The result of one tool call, as the model will see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolResult {
    /// The id of the call it answers.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// What the model reads: the tool's output (JSON text unless the output
    /// was a plain string) or an error description.
    pub output: String,
    /// Whether the call failed (unknown tool, invalid arguments, tool failure).
    pub is_error: bool,
}

/// One piece of a message. Which kinds a message may hold depends on its role.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Part {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// A media reference (user messages only).
    Media {
        /// The media.
        media: MediaRef,
    },
    /// The model's reasoning, when a provider exposes it (assistant only).
    Reasoning {
        /// The reasoning text.
        text: String,
    },
    /// A tool call (assistant only).
    ToolCall {
        /// The call.
        call: ToolCall,
    },
    /// A tool result (tool messages only).
    ToolResult {
        /// The result.
        result: ToolResult,
    },
    /// The model refused (assistant only).
    Refusal {
        /// The refusal text.
        text: String,
    },
}

impl Part {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Part {
        Part::Text { text: text.into() }
    }

    fn kind(&self) -> &'static str {
        match self {
            Part::Text { .. } => "text",
            Part::Media { .. } => "media",
            Part::Reasoning { .. } => "reasoning",
            Part::ToolCall { .. } => "tool_call",
            Part::ToolResult { .. } => "tool_result",
            Part::Refusal { .. } => "refusal",
        }
    }

    fn allowed(&self, role: Role) -> bool {
        match role {
            Role::System => matches!(self, Part::Text { .. }),
            Role::User => matches!(self, Part::Text { .. } | Part::Media { .. }),
            Role::Assistant => matches!(
                self,
                Part::Text { .. }
                    | Part::Reasoning { .. }
                    | Part::ToolCall { .. }
                    | Part::Refusal { .. }
            ),
            Role::Tool => matches!(self, Part::ToolResult { .. }),
        }
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawMessage {
    role: Role,
    parts: Vec<Part>,
}

/// One message of a conversation: a role and at least one part the role allows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(try_from = "RawMessage", deny_unknown_fields)]
pub struct Message {
    role: Role,
    parts: Vec<Part>,
}

impl TryFrom<RawMessage> for Message {
    type Error = ChatError;
    fn try_from(raw: RawMessage) -> Result<Message, ChatError> {
        Message::new(raw.role, raw.parts)
    }
}

impl Message {
    /// A message; refuses an empty one and parts the role does not allow.
    pub fn new(role: Role, parts: Vec<Part>) -> Result<Message, ChatError> {
        if parts.is_empty() {
            return Err(ChatError::Message {
                role,
                reason: "a message needs at least one part".into(),
            });
        }
        if let Some(part) = parts.iter().find(|part| !part.allowed(role)) {
            return Err(ChatError::Message {
                role,
                reason: format!("a {role} message cannot hold a {} part", part.kind()),
            });
        }
        Ok(Message { role, parts })
    }

    /// A system message of one text part.
    pub fn system(text: impl Into<String>) -> Message {
        Message {
            role: Role::System,
            parts: vec![Part::text(text)],
        }
    }

    /// A user message of one text part.
    pub fn user(text: impl Into<String>) -> Message {
        Message {
            role: Role::User,
            parts: vec![Part::text(text)],
        }
    }

    /// An assistant message of one text part.
    pub fn assistant(text: impl Into<String>) -> Message {
        Message {
            role: Role::Assistant,
            parts: vec![Part::text(text)],
        }
    }

    /// An assistant message asking for tool calls (with optional text before them).
    pub fn tool_calls(text: Option<String>, calls: Vec<ToolCall>) -> Result<Message, ChatError> {
        let parts = text
            .into_iter()
            .map(Part::text)
            .chain(calls.into_iter().map(|call| Part::ToolCall { call }))
            .collect();
        Message::new(Role::Assistant, parts)
    }

    /// A tool message carrying results.
    pub fn tool_results(results: Vec<ToolResult>) -> Result<Message, ChatError> {
        Message::new(
            Role::Tool,
            results
                .into_iter()
                .map(|result| Part::ToolResult { result })
                .collect(),
        )
    }

    /// The role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The parts.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The text parts joined (reasoning and refusals excluded).
    pub fn text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|part| match part {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The tool calls, in order.
    pub fn calls(&self) -> Vec<&ToolCall> {
        self.parts
            .iter()
            .filter_map(|part| match part {
                Part::ToolCall { call } => Some(call),
                _ => None,
            })
            .collect()
    }

    /// The refusal text, if the message holds one.
    pub fn refusal(&self) -> Option<&str> {
        self.parts.iter().find_map(|part| match part {
            Part::Refusal { text } => Some(text.as_str()),
            _ => None,
        })
    }
}

/// A tool the model may call: its name, what it does, and the JSON Schema of its arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// The name the model calls it by (`[A-Za-z0-9_-]`, 1 to 64 characters).
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: serde_json::Value,
}

/// Whether and which tools the model must call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No tool calls.
    None,
    /// At least one tool call.
    Required,
    /// This tool.
    Tool {
        /// The tool's name.
        name: String,
    },
}

/// How the model should shape its answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    /// Free text.
    Text,
    /// JSON matching a schema.
    JsonSchema {
        /// A name for the schema (`[A-Za-z0-9_-]`).
        name: String,
        /// The JSON Schema.
        schema: serde_json::Value,
        /// Ask the provider to enforce the schema exactly.
        strict: bool,
    },
}

/// Sampling and shaping options of one request. Absent fields use the provider's defaults.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Options {
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// The most tokens the model may generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// The answer's format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
}

impl Options {
    /// These options with every field `over` sets taken from `over`.
    pub fn merged(&self, over: &Options) -> Options {
        Options {
            temperature: over.temperature.or(self.temperature),
            max_tokens: over.max_tokens.or(self.max_tokens),
            response_format: over
                .response_format
                .clone()
                .or_else(|| self.response_format.clone()),
        }
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    messages: Vec<Message>,
    #[serde(default)]
    tools: Vec<ToolSpec>,
    #[serde(default)]
    tool_choice: ToolChoice,
    #[serde(default)]
    options: Options,
}

/// One model request: at least one message (system messages only first),
/// tools with unique names, a tool choice naming a declared tool, options.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(try_from = "RawRequest", deny_unknown_fields)]
pub struct Request {
    messages: Vec<Message>,
    tools: Vec<ToolSpec>,
    tool_choice: ToolChoice,
    options: Options,
}

impl TryFrom<RawRequest> for Request {
    type Error = ChatError;
    fn try_from(raw: RawRequest) -> Result<Request, ChatError> {
        Request::new(raw.messages, raw.tools, raw.tool_choice, raw.options)
    }
}

/// Whether a tool name is what providers accept.
pub(crate) fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Request {
    /// A validated request.
    pub fn new(
        messages: Vec<Message>,
        tools: Vec<ToolSpec>,
        tool_choice: ToolChoice,
        options: Options,
    ) -> Result<Request, ChatError> {
        check_conversation(&messages).map_err(ChatError::Request)?;
        let mut names = BTreeSet::new();
        for tool in &tools {
            if !valid_tool_name(&tool.name) {
                return Err(ChatError::Request(format!(
                    "invalid tool name {:?}",
                    tool.name
                )));
            }
            if !names.insert(tool.name.as_str()) {
                return Err(ChatError::Request(format!(
                    "tool {:?} is declared twice",
                    tool.name
                )));
            }
        }
        if let ToolChoice::Tool { name } = &tool_choice
            && !names.contains(name.as_str())
        {
            return Err(ChatError::Request(format!(
                "tool choice names undeclared tool {name:?}"
            )));
        }
        if options.max_tokens == Some(0) {
            return Err(ChatError::Request("max_tokens must be positive".into()));
        }
        if let Some(t) = options.temperature
            && !(0.0..=2.0).contains(&t)
        {
            return Err(ChatError::Request(format!(
                "temperature {t} is outside 0..=2"
            )));
        }
        Ok(Request {
            messages,
            tools,
            tool_choice,
            options,
        })
    }

    /// A request of messages only, with default options.
    pub fn of(messages: Vec<Message>) -> Result<Request, ChatError> {
        Request::new(messages, Vec::new(), ToolChoice::Auto, Options::default())
    }

    /// The messages.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// The tools.
    pub fn tools(&self) -> &[ToolSpec] {
        &self.tools
    }

    /// The tool choice.
    pub fn tool_choice(&self) -> &ToolChoice {
        &self.tool_choice
    }

    /// The options.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The same request with other options (validated again).
    pub fn with_options(self, options: Options) -> Result<Request, ChatError> {
        Request::new(self.messages, self.tools, self.tool_choice, options)
    }
}

/// Checks a conversation: non-empty, system messages only as a prefix.
pub(crate) fn check_conversation(messages: &[Message]) -> Result<(), String> {
    if messages.is_empty() {
        return Err("a request needs at least one message".into());
    }
    let prefix = messages
        .iter()
        .take_while(|m| m.role == Role::System)
        .count();
    if messages[prefix..].iter().any(|m| m.role == Role::System) {
        return Err("system messages must come first".into());
    }
    if prefix == messages.len() {
        return Err("a request needs a message after its system messages".into());
    }
    Ok(())
}

/// Why the model stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A natural end.
    Stop,
    /// The token limit cut the answer.
    Length,
    /// The model asks for tool calls.
    ToolCalls,
    /// A content filter cut the answer.
    ContentFilter,
    /// The model refused.
    Refusal,
    /// Anything else the provider reported.
    Other,
}

/// Tokens a call used, as the provider reported them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// Prompt tokens, cached ones included.
    pub input_tokens: u64,
    /// Generated tokens, reasoning included.
    pub output_tokens: u64,
    /// Of the prompt tokens, those read from the provider's prompt cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_input_tokens: u64,
    /// Of the generated tokens, those spent reasoning.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reasoning_tokens: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawResponse {
    message: Message,
    finish_reason: FinishReason,
    #[serde(default)]
    usage: Option<Usage>,
}

/// A model's answer: an assistant message, why it stopped, and the tokens
/// it used when the provider reported them (absent: usage unknown).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(try_from = "RawResponse", deny_unknown_fields)]
pub struct Response {
    message: Message,
    finish_reason: FinishReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

impl TryFrom<RawResponse> for Response {
    type Error = ChatError;
    fn try_from(raw: RawResponse) -> Result<Response, ChatError> {
        Response::new(raw.message, raw.finish_reason, raw.usage)
    }
}

impl Response {
    /// A validated response: the message must be the assistant's. `usage`
    /// is `None` when the provider did not report it.
    pub fn new(
        message: Message,
        finish_reason: FinishReason,
        usage: Option<Usage>,
    ) -> Result<Response, ChatError> {
        if message.role != Role::Assistant {
            return Err(ChatError::Response(format!(
                "the message is the {}'s, not the assistant's",
                message.role
            )));
        }
        Ok(Response {
            message,
            finish_reason,
            usage,
        })
    }

    /// A plain text answer that stopped naturally, reporting zero usage.
    pub fn text(text: impl Into<String>) -> Response {
        Response {
            message: Message::assistant(text),
            finish_reason: FinishReason::Stop,
            usage: Some(Usage::default()),
        }
    }

    /// An answer asking for tool calls, reporting zero usage.
    pub fn calls(calls: Vec<ToolCall>) -> Result<Response, ChatError> {
        Response::new(
            Message::tool_calls(None, calls)?,
            FinishReason::ToolCalls,
            Some(Usage::default()),
        )
    }

    /// The same response with reported usage.
    pub fn with_usage(mut self, usage: Usage) -> Response {
        self.usage = Some(usage);
        self
    }

    /// The same response with its usage unknown (not reported).
    pub fn without_usage(mut self) -> Response {
        self.usage = None;
        self
    }

    /// The same response with another text (for a provider that maps its
    /// wire answer back, such as strict-mode nulls to absent members); the
    /// text parts are replaced by one part holding `text`.
    #[cfg(feature = "openai")]
    pub(crate) fn with_text(mut self, text: String) -> Response {
        let mut parts: Vec<Part> = self
            .message
            .parts
            .into_iter()
            .filter(|part| !matches!(part, Part::Text { .. }))
            .collect();
        let at = parts
            .iter()
            .position(|part| !matches!(part, Part::Reasoning { .. }))
            .unwrap_or(parts.len());
        parts.insert(at, Part::Text { text });
        self.message = Message {
            role: self.message.role,
            parts,
        };
        self
    }

    /// The assistant message.
    pub fn message(&self) -> &Message {
        &self.message
    }

    /// Why the model stopped.
    pub fn finish_reason(&self) -> FinishReason {
        self.finish_reason
    }

    /// Tokens used, or `None` when the provider did not report them (a
    /// call is then charged its whole reservation).
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_allow_only_their_parts() {
        assert!(Message::new(Role::User, vec![]).is_err());
        assert!(Message::new(Role::User, vec![Part::Refusal { text: "no".into() }]).is_err());
        assert!(Message::new(Role::System, vec![Part::text("x")]).is_ok());
        let decoded: Result<Message, _> =
            serde_json::from_str(r#"{"role":"tool","parts":[{"type":"text","text":"x"}]}"#);
        assert!(decoded.is_err());
        let unknown: Result<Message, _> = serde_json::from_str(
            r#"{"role":"user","parts":[{"type":"text","text":"x"}],"extra":1}"#,
        );
        assert!(unknown.is_err());
    }

    #[test]
    fn requests_need_messages_and_system_first() {
        assert!(Request::of(vec![]).is_err());
        assert!(Request::of(vec![Message::user("a"), Message::system("b")]).is_err());
        assert!(Request::of(vec![Message::system("b")]).is_err());
        assert!(Request::of(vec![Message::system("b"), Message::user("a")]).is_ok());
        let text = r#"{"messages":[],"tools":[],"tool_choice":{"mode":"auto"},"options":{}}"#;
        assert!(serde_json::from_str::<Request>(text).is_err());
    }

    #[test]
    fn a_response_round_trips() {
        let response = Response::text("hi").with_usage(Usage {
            input_tokens: 3,
            output_tokens: 1,
            ..Usage::default()
        });
        let text = serde_json::to_string(&response).expect("encodes");
        assert_eq!(
            serde_json::from_str::<Response>(&text).expect("decodes"),
            response
        );
    }
}
