//! The model contract: one call, or a stream of deltas ending in a response.

use baton_run::{BoxFuture, Failure, FailureKind};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::chat::{Request, Response};

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

/// Why a model call did not produce a response. Provider errors keep their
/// HTTP status and whether trying again may help.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The provider answered with an error status.
    #[error("provider answered http {status}{}: {message}", if *retryable { " (retryable)" } else { "" })]
    Status {
        /// The HTTP status.
        status: u16,
        /// Whether the same request may succeed later (429, 408, 409, 5xx).
        retryable: bool,
        /// The provider's message, bounded.
        message: String,
    },
    /// No answer within the configured time.
    #[error("provider timed out: {0}")]
    Timeout(String),
    /// The connection failed before an answer arrived.
    #[error("provider unreachable: {0}")]
    Transport(String),
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

impl ModelError {
    /// Whether sending the same request again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            ModelError::Status { retryable, .. } => *retryable,
            ModelError::Timeout(_) | ModelError::Transport(_) => true,
            ModelError::Malformed(_) | ModelError::TooLarge { .. } | ModelError::Request(_) => {
                false
            }
        }
    }

    /// The HTTP status, for provider error answers.
    pub fn status(&self) -> Option<u16> {
        match self {
            ModelError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The stable code: `interaction.host.failed` for a request refused
    /// before sending, `interaction.model.failed` for everything the
    /// provider side caused.
    pub fn code(&self) -> &'static str {
        match self {
            ModelError::Request(_) => "interaction.host.failed",
            _ => "interaction.model.failed",
        }
    }

    /// The classified failure: kind `contract` for a refused request,
    /// `external` otherwise. The message starts with the status and
    /// retryability for people; programs use [`ModelError`] itself.
    pub fn failure(&self) -> Failure {
        let kind = match self {
            ModelError::Request(_) => FailureKind::Contract,
            _ => FailureKind::External,
        };
        let retry = if self.is_retryable() {
            "retryable"
        } else {
            "not retryable"
        };
        let message = match self.status() {
            Some(status) => format!("http {status}, {retry}: {self}"),
            None => format!("{retry}: {self}"),
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
