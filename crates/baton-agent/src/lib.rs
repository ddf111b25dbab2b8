//! # baton-agent: the model-backed layer of Baton
//!
//! Owns what turns a chat model into Baton programs:
//!
//! - chat types ([`Message`], [`Part`], [`ToolCall`], [`ToolResult`],
//!   [`Request`], [`Response`], [`FinishReason`], [`Usage`]) that decode
//!   strictly and validate in their constructors;
//! - the [`ChatModel`] trait (`call`, and `stream` with a delta callback)
//!   with classified [`ModelError`]s;
//! - typed output ([`output::output`], [`output::decode`]): a schemars JSON
//!   Schema as the response format and a strict decode that never repairs
//!   JSON (`chat.output.invalid`, raw text kept);
//! - [`Interaction`]: a program whose model calls are `Dispatch` effects
//!   (replay policy `Never`, reserving `max_tokens` of the `tokens` meter),
//!   whose tools are declared child programs, with `max_model_calls`,
//!   steering at safe boundaries and an optional completion validator;
//! - [`Adapter`]: any interaction as a typed `Program<I, O>`, a
//!   three-stage workflow render → call → decode;
//! - [`ScriptedModel`]: a deterministic local model for tests and demos;
//! - with the `openai` feature, `openai::OpenAiModel`: an
//!   OpenAI-compatible Chat Completions provider over HTTP.
//!
//! Depend on it (or on the facade's `baton::agent`) to build model-backed
//! programs or to implement a new provider. It depends on `baton-run` and
//! `baton-workflow` only, and knows nothing of teams, coordination
//! programs or stores; the kernel in turn knows nothing of chat.
//!
//! Features: `openai` (off by default here, on by default in the `baton`
//! facade) adds the HTTP provider and its `reqwest` dependency.

mod adapter;
mod chat;
mod interaction;
mod model;
pub mod output;
mod scripted;

#[cfg(feature = "openai")]
pub mod openai;

pub use adapter::{Adapter, AdapterConfig, AdapterError};
pub use chat::{
    ChatError, FinishReason, MediaRef, Message, Options, Part, Request, Response, ResponseFormat,
    Role, ToolCall, ToolChoice, ToolResult, ToolSpec, Usage,
};
pub use interaction::{
    Config as InteractionConfig, ConfigError as InteractionConfigError, DEFAULT_MAX_RESPONSE_BYTES,
    Input as InteractionInput, Interaction, ModelCall, ModelDispatcher,
    Output as InteractionOutput, Steering, TOKENS, Tool, Validator,
};
pub use model::{ChatModel, Delta, DeltaFn, ModelError, ModelIdentity};
pub use output::OutputError;
pub use scripted::ScriptedModel;
