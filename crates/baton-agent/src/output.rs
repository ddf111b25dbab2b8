//! Typed output: ask a model for JSON matching a Rust type and decode it strictly.

use baton_run::program::Schema;
use baton_run::{Failure, Payload};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;

use crate::chat::{FinishReason, Part, Request, Response, ResponseFormat};
use crate::model::{ChatModel, ModelError};

/// Why a typed output could not be had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// The request already asks for a response format.
    #[error("chat.output.format_conflict: the request already sets a response format")]
    FormatConflict,
    /// The model call failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The answer is not a complete, valid value of the type
    /// (`chat.output.invalid`). The raw text is kept for diagnostics; the
    /// JSON is never repaired.
    #[error("chat.output.invalid: {reason}")]
    Invalid {
        /// What is wrong.
        reason: String,
        /// The answer's text as the model wrote it.
        raw: String,
    },
}

impl OutputError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            OutputError::FormatConflict => "chat.output.format_conflict",
            OutputError::Model(error) => error.code(),
            OutputError::Invalid { .. } => "chat.output.invalid",
        }
    }

    /// The classified failure (`contract` for an invalid output).
    pub fn failure(&self) -> Failure {
        match self {
            OutputError::Model(error) => error.failure(),
            other => Failure::contract(other.code(), other.to_string()),
        }
    }
}

/// The response format asking for `T`: its schemars JSON Schema, strict.
/// A provider sends what its strict mode accepts (the OpenAI-compatible one
/// transforms the schema into the strict subset, or falls back to
/// non-strict when the type cannot be expressed) and maps its answer back.
pub fn format_for<T: JsonSchema>() -> ResponseFormat {
    format_for_schema(&T::schema_name(), &Schema::of::<T>())
}

/// The strict response format asking for a value of `schema`, named `name`
/// (characters outside `[A-Za-z0-9_-]` become `_`, at most 64 kept).
pub fn format_for_schema(name: &str, schema: &Schema) -> ResponseFormat {
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    ResponseFormat::JsonSchema {
        name: if name.is_empty() {
            "output".into()
        } else {
            name
        },
        schema: schema.json().to_value(),
        strict: true,
    }
}

/// Decodes a response as a `T`: the finish reason must be `stop`, the
/// message must hold no refusal and only text or reasoning parts, the text
/// must be non-empty, strict JSON (a duplicate key is refused, never
/// resolved to the last one), valid against `T`'s schema and decode
/// strictly. The text is read as a [`Payload`], never through a
/// `serde_json::Value`.
pub fn decode<T: DeserializeOwned + JsonSchema>(response: &Response) -> Result<T, OutputError> {
    let raw = response.message().text();
    let invalid = |reason: String| OutputError::Invalid {
        reason,
        raw: raw.clone(),
    };
    if let Some(refusal) = response.message().refusal() {
        return Err(invalid(format!("the model refused: {refusal}")));
    }
    if response.finish_reason() != FinishReason::Stop {
        return Err(invalid(format!(
            "finish reason is {:?}, not stop",
            response.finish_reason()
        )));
    }
    if response
        .message()
        .parts()
        .iter()
        .any(|part| !matches!(part, Part::Text { .. } | Part::Reasoning { .. }))
    {
        return Err(invalid("the answer holds parts other than text".into()));
    }
    if raw.trim().is_empty() {
        return Err(invalid("the answer has no text".into()));
    }
    let payload = Payload::parse_str(raw.trim())
        .map_err(|error| invalid(format!("the text is not strict JSON: {error}")))?;
    Schema::of::<T>().validate(&payload).map_err(|violation| {
        invalid(format!(
            "the JSON breaks the schema at {:?}: {}",
            violation.path, violation.message
        ))
    })?;
    payload
        .decode()
        .map_err(|error| invalid(format!("the JSON does not decode: {error}")))
}

/// Asks `model` for a `T`: adds `T`'s JSON Schema as the response format
/// (refusing a request that already has one; the caller's request is not
/// changed) and decodes the answer with [`decode`].
pub async fn output<T: DeserializeOwned + JsonSchema>(
    model: &dyn ChatModel,
    request: &Request,
) -> Result<T, OutputError> {
    if request.options().response_format.is_some() {
        return Err(OutputError::FormatConflict);
    }
    let mut options = request.options().clone();
    options.response_format = Some(format_for::<T>());
    let request = request
        .clone()
        .with_options(options)
        .map_err(|error| ModelError::Request(error.to_string()))?;
    let response = model.call(request).await?;
    decode(&response)
}
