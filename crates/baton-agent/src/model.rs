//! The model contract: one call, or a stream of deltas ending in a response.

use std::time::Duration;

use baton_run::dispatch::RetryHint;
use baton_run::{BoxFuture, Failure, FailureKind};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::chat::{Request, Response};
use crate::cost::Price;

/// Which model answers: the provider and the model name. Part of an
/// interaction's configuration digest, so another model is another program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelIdentity {
    /// The provider, such as `openai` or `scripted`.
    pub provider: String,
    /// The model's name at that provider.
    pub model: String,
}

/// A piece of a streamed answer. Deltas are progress for people and
/// dashboards; the final [`Response`] is what counts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Delta {
    /// More answer text.
    Text {
        /// The text.
        text: String,
    },
    /// More reasoning text.
    Reasoning {
        /// The text.
        text: String,
    },
    /// Part of a tool call (fields arrive piecemeal; `index` groups them).
    ToolCall {
        /// Which call of the answer.
        index: u32,
        /// The call's id, when this piece carries it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// The tool's name, when this piece carries it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// More argument text.
        arguments: String,
    },
}

/// Where a streaming model sends its deltas.
pub type DeltaFn<'a> = &'a (dyn Fn(Delta) + Send + Sync);

/// Why a model call did not produce a response, classified so that a
/// caller (and, later, the kernel's retry policy) can tell a definite error
/// answer from an uncertain one without reading any message text.
///
/// | variant | code | [`ModelError::retry`] |
/// | --- | --- | --- |
/// | `RateLimited` | `chat.provider.rate_limited` | definite, with `Retry-After` |
/// | `Unavailable` | `chat.provider.unavailable` | definite, with `Retry-After` |
/// | `Refused` | `chat.provider.refused` | none |
/// | `Timeout` | `chat.provider.timeout` | uncertain |
/// | `Interrupted` | `chat.provider.interrupted` | uncertain |
/// | `Malformed` | `chat.provider.malformed` | none |
/// | `TooLarge` | `chat.provider.too_large` | none |
/// | `Request` | `interaction.host.failed` | none |
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The provider answered that the caller sends too much: HTTP 429, or a
    /// rate-limit error object. Nothing was done; trying again later helps.
    #[error("rate limited{}: {message}", http(*status))]
    RateLimited {
        /// The HTTP status, when the answer had one of its own.
        status: Option<u16>,
        /// The provider's message, bounded.
        message: String,
        /// The provider's `Retry-After` (seconds or an HTTP date), if given.
        retry_after: Option<Duration>,
    },
    /// The provider could not serve the call: HTTP 408, 409 or 5xx (529
    /// overloaded included), a server or overload error object, or no
    /// connection could be made, so nothing was sent.
    #[error("provider unavailable{}: {message}", http(*status))]
    Unavailable {
        /// The HTTP status, when the provider answered.
        status: Option<u16>,
        /// The provider's message or the connection error, bounded.
        message: String,
        /// The provider's `Retry-After` (seconds or an HTTP date), if given.
        retry_after: Option<Duration>,
    },
    /// The provider refused the request (any other 4xx, or an
    /// invalid-request error object); sending it again cannot help.
    #[error("provider refused the request{}: {message}", http(*status))]
    Refused {
        /// The HTTP status, when the answer had one of its own.
        status: Option<u16>,
        /// The provider's message, bounded.
        message: String,
    },
    /// No whole answer within the configured time after the request was
    /// sent: the provider may have done the work.
    #[error("provider timed out: {0}")]
    Timeout(String),
    /// The connection was lost after the request was sent, or the stream
    /// ended before the answer was complete (no finish reason): the
    /// provider may have done the work.
    #[error("provider answer interrupted: {0}")]
    Interrupted(String),
    /// The answer did not parse or broke the wire protocol.
    #[error("provider answer is malformed: {0}")]
    Malformed(String),
    /// The answer exceeded the configured size.
    #[error("provider answer exceeds {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The request cannot be sent to this model (a host-side problem).
    #[error("request refused before sending: {0}")]
    Request(String),
}

fn http(status: Option<u16>) -> String {
    status.map(|s| format!(" (http {s})")).unwrap_or_default()
}

impl ModelError {
    /// Advice about trying again: `Definite` for an error answer or a
    /// connection never made (with the provider's `Retry-After`),
    /// `Uncertain` for a timeout or an answer cut off after sending, none
    /// for failures another attempt cannot fix.
    pub fn retry(&self) -> Option<RetryHint> {
        match self {
            ModelError::RateLimited { retry_after, .. }
            | ModelError::Unavailable { retry_after, .. } => {
                Some(RetryHint::definite(*retry_after))
            }
            ModelError::Timeout(_) | ModelError::Interrupted(_) => Some(RetryHint::uncertain()),
            ModelError::Refused { .. }
            | ModelError::Malformed(_)
            | ModelError::TooLarge { .. }
            | ModelError::Request(_) => None,
        }
    }

    /// The HTTP status, for provider error answers that had one.
    pub fn status(&self) -> Option<u16> {
        match self {
            ModelError::RateLimited { status, .. }
            | ModelError::Unavailable { status, .. }
            | ModelError::Refused { status, .. } => *status,
            _ => None,
        }
    }

    /// The stable code (see the table on [`ModelError`]).
    pub fn code(&self) -> &'static str {
        match self {
            ModelError::RateLimited { .. } => "chat.provider.rate_limited",
            ModelError::Unavailable { .. } => "chat.provider.unavailable",
            ModelError::Refused { .. } => "chat.provider.refused",
            ModelError::Timeout(_) => "chat.provider.timeout",
            ModelError::Interrupted(_) => "chat.provider.interrupted",
            ModelError::Malformed(_) => "chat.provider.malformed",
            ModelError::TooLarge { .. } => "chat.provider.too_large",
            ModelError::Request(_) => "interaction.host.failed",
        }
    }

    /// The classified failure a model call settles with: kind `contract`
    /// for a request refused before sending, `external` otherwise, and the
    /// code of [`ModelError::code`]. The message ends with the retry advice
    /// for people; programs read the code.
    pub fn failure(&self) -> Failure {
        let kind = match self {
            ModelError::Request(_) => FailureKind::Contract,
            _ => FailureKind::External,
        };
        let message = match self.retry() {
            Some(hint) => format!("{self}; {hint}"),
            None => format!("{self}; not retryable"),
        };
        Failure::new(kind, self.code(), message)
    }
}

/// A chat model: a provider client, a scripted model, anything that answers
/// a [`Request`] with a [`Response`].
///
/// `stream` reports progress through a callback and resolves to the same
/// complete response `call` would give; its default calls `call` and emits
/// the answer's text as one delta. The callback design keeps the trait
/// object-safe and free of stream crates; callers that want a channel wrap
/// the callback around a sender.
pub trait ChatModel: Send + Sync + 'static {
    /// Which provider and model answer.
    fn identity(&self) -> ModelIdentity;

    /// What the model's tokens cost, when its configuration names a price:
    /// every call then reserves and is charged the `cost_micros` meter.
    /// Part of an interaction's configuration digest.
    fn price(&self) -> Option<Price> {
        None
    }

    /// Answers a request.
    fn call(&self, request: Request) -> BoxFuture<'_, Result<Response, ModelError>>;

    /// Answers a request, reporting deltas as they arrive.
    fn stream<'a>(
        &'a self,
        request: Request,
        on_delta: DeltaFn<'a>,
    ) -> BoxFuture<'a, Result<Response, ModelError>> {
        Box::pin(async move {
            let response = self.call(request).await?;
            let text = response.message().text();
            if !text.is_empty() {
                on_delta(Delta::Text { text });
            }
            Ok(response)
        })
    }
}
