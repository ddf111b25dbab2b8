//! # baton-agent: the model-backed layer of Baton
//!
//! Owns what turns a chat model into Baton programs:
//!
//! - chat types ([`Message`], [`Part`], [`ToolCall`], [`ToolResult`],
//!   [`Request`], [`Response`], [`FinishReason`], [`Usage`]) that decode
//!   strictly and validate in their constructors;
//! - the [`ChatModel`] trait (`call`, and `stream` with a delta callback,
//!   and the model's [`Price`]) with [`ModelError`]s classified for retry
//!   policies: definite or uncertain, with `Retry-After`, stable codes
//!   `chat.provider.*`;
//! - typed output ([`output::output`], [`output::decode`]): a schemars JSON
//!   Schema as the response format and a strict decode from the answer's
//!   text that never repairs JSON and refuses duplicate keys
//!   (`chat.output.invalid`, raw text kept); [`strict`] turns a schema into
//!   the subset strict providers accept and maps answers back;
//! - [`Interaction`]: a program whose model calls are `Dispatch` effects
//!   (replay policy `Never`, reserving the worst case of the `tokens_in`,
//!   `tokens_out`, `tokens` and, for a priced model, `cost_micros` meters,
//!   charged what the provider reports), whose tools run as child programs
//!   (at most `max_concurrent_tool_calls` at once), with `max_model_calls`,
//!   steering at safe boundaries and an optional completion validator;
//! - [`Tool`]: a program the model calls by name, or an async function
//!   ([`Tool::function`]) run as a `baton-workflow` activity with a replay
//!   policy, an idempotency key, a timeout, optional approval and a small
//!   default budget clipped to what the caller has left;
//! - [`Adapter`]: any interaction as a typed `Program<I, O>`, a
//!   three-stage workflow render → call → decode;
//! - [`ScriptedModel`]: a deterministic local model for tests and demos;
//! - [`AgentStream`]: the agent stream view, a tree's watch events
//!   projected into `agent_start`, `token`, tool calls, handoffs,
//!   `agent_end` and one terminal `complete` or `error`;
//! - with the `openai` feature, `openai::OpenAiModel`: an
//!   OpenAI-compatible Chat Completions provider over HTTP; with the
//!   `anthropic` feature, `anthropic::AnthropicModel`: an Anthropic
//!   Messages API provider.
//!
//! Depend on it (or on the facade's `baton::agent`) to build model-backed
//! programs or to implement a new provider. It depends on `baton-run` and
//! `baton-workflow` only, and knows nothing of teams, coordination
//! programs or stores; the kernel in turn knows nothing of chat.
//!
//! Features (off by default here, on by default in the `baton` facade):
//! `openai` and `anthropic` add the HTTP providers and their `reqwest`,
//! `eventsource-stream`, `futures-util` and `httpdate` dependencies.

mod adapter;
mod chat;
mod cost;
mod dispatcher;
mod interaction;
mod model;
pub mod output;
mod scripted;
mod stream;
pub mod strict;
mod tool;

#[cfg(feature = "anthropic")]
pub mod anthropic;
#[cfg(any(feature = "openai", feature = "anthropic"))]
mod http;
#[cfg(feature = "openai")]
pub mod openai;

pub use adapter::{Adapter, AdapterConfig, AdapterError};
pub use chat::{
    ChatError, FinishReason, MediaRef, Message, Options, Part, Request, Response, ResponseFormat,
    Role, ToolCall, ToolChoice, ToolResult, ToolSpec, Usage,
};
pub use cost::{
    COST_MICROS, MEDIA_TOKENS, Price, PriceTable, TOKENS, TOKENS_IN, TOKENS_OUT, TOOLS_TOKENS,
    input_bound,
};
pub use dispatcher::ModelDispatcher;
pub use interaction::{
    Config as InteractionConfig, ConfigError as InteractionConfigError,
    DEFAULT_MAX_CONCURRENT_TOOL_CALLS, DEFAULT_MAX_RESPONSE_BYTES, Input as InteractionInput,
    Interaction, ModelCall, Output as InteractionOutput, Steering, Validator, default_model_retry,
};
pub use model::{ChatModel, Delta, DeltaFn, ModelError, ModelIdentity};
pub use output::OutputError;
pub use scripted::ScriptedModel;
pub use stream::{AgentEvent, AgentRef, AgentStream};
pub use tool::{DEFAULT_TOOL_BUDGET, Tool, ToolConfig, ToolConfigError, ToolContext, ToolError};
