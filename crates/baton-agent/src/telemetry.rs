//! The `tracing` spans of model calls and tool calls, with the attributes
//! of the OpenTelemetry GenAI semantic conventions.
//!
//! A model call runs in an `info` span `chat` named `chat {model}` for
//! OpenTelemetry (`otel.name`, kind `client`) carrying
//! `gen_ai.operation.name` (`chat`), `gen_ai.provider.name` (`openai`,
//! `anthropic`, or the model's provider, such as `scripted`) and
//! `gen_ai.request.model`; when the response arrives it records
//! `gen_ai.response.model`, `gen_ai.usage.input_tokens`,
//! `gen_ai.usage.output_tokens` and `gen_ai.response.finish_reasons`, and a
//! failed call records its failure code as `error.type`. A tool function
//! runs in an `info` span `execute_tool` named `execute_tool {tool}` with
//! `gen_ai.operation.name` (`execute_tool`) and `gen_ai.tool.name`.
//!
//! The spans run inside the kernel's `effect` span of the dispatch that
//! carries the call, so an exporter shows them under their process. When
//! no subscriber wants them, creating them evaluates none of their fields.

use tracing::Span;
use tracing::field::Empty;

use crate::chat::{FinishReason, Response};
use crate::model::ModelIdentity;

/// The span of one model call by `identity`, its response fields empty.
pub(crate) fn chat_span(identity: &ModelIdentity) -> Span {
    tracing::info_span!(
        "chat",
        otel.name = %format_args!("chat {}", identity.model),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider_name(&identity.provider),
        gen_ai.request.model = %identity.model,
        gen_ai.response.model = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.response.finish_reasons = Empty,
        error.type = Empty,
    )
}

/// Records what a model call's response says on its span. The model that
/// answered is the one asked: providers' reported model versions are not
/// kept in a [`Response`].
pub(crate) fn record_response(span: &Span, identity: &ModelIdentity, response: &Response) {
    if span.is_disabled() {
        return;
    }
    span.record("gen_ai.response.model", identity.model.as_str());
    if let Some(usage) = response.usage() {
        span.record("gen_ai.usage.input_tokens", usage.input_tokens);
        span.record("gen_ai.usage.output_tokens", usage.output_tokens);
    }
    span.record(
        "gen_ai.response.finish_reasons",
        finish_reason(response.finish_reason()),
    );
}

/// Records a failed call's code as the span's `error.type`.
pub(crate) fn record_error(span: &Span, code: &str) {
    span.record("otel.status_code", "error");
    span.record("error.type", code);
}

/// The span of one call of the tool function `name`.
pub(crate) fn tool_span(name: &str) -> Span {
    tracing::info_span!(
        "execute_tool",
        otel.name = %format_args!("execute_tool {name}"),
        otel.status_code = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = name,
        error.type = Empty,
    )
}

/// The well-known `gen_ai.provider.name` of a [`ModelIdentity::provider`]:
/// the providers of this crate name themselves with their endpoint
/// (`openai-compatible https://…`, `anthropic https://…`); others are
/// their first word as given.
pub(crate) fn provider_name(provider: &str) -> &str {
    let first = provider.split_whitespace().next().unwrap_or(provider);
    match first {
        "openai-compatible" => "openai",
        other => other,
    }
}

/// The semantic conventions' name of a finish reason. The attribute is an
/// array in the conventions; a response has one reason, and `tracing`
/// fields are scalars, so it is that one name.
pub(crate) fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::ContentFilter => "content_filter",
        FinishReason::Refusal => "refusal",
        FinishReason::Other => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_names_follow_the_semantic_conventions() {
        assert_eq!(
            provider_name("openai-compatible https://api.openai.com/v1"),
            "openai"
        );
        assert_eq!(
            provider_name("anthropic https://api.anthropic.com"),
            "anthropic"
        );
        assert_eq!(provider_name("scripted"), "scripted");
        assert_eq!(provider_name(""), "");
    }
}
