//! What the HTTP providers share: the client, the classification of every
//! way a call can fail, `Retry-After`, bounded bodies and server-sent events.
//!
//! The classification is the contract a retry policy reads (see
//! [`ModelError`]): an error *answer* (a status, an error object) is
//! definite, and so is a connection that was never made; a timeout or a
//! connection lost after the request was sent is uncertain.

use std::ops::ControlFlow;
use std::time::{Duration, UNIX_EPOCH};

use baton_run::{Clock, SystemClock};
use eventsource_stream::{Event, EventStream, EventStreamError};
use futures_util::StreamExt;
use reqwest::header::HeaderMap;
use serde_json::Value;

use crate::chat::{FinishReason, Message, Part, Response, Role, ToolCall, Usage};
use crate::model::ModelError;

/// Longest provider message kept in an error.
const MAX_MESSAGE: usize = 512;
/// Largest error body read.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// A client with a total and a connect timeout.
pub(crate) fn client(
    timeout: Duration,
    connect_timeout: Duration,
) -> Result<reqwest::Client, ModelError> {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(connect_timeout)
        .build()
        .map_err(|error| ModelError::Request(format!("http client: {error}")))
}

fn bounded(text: &str) -> String {
    text.chars().take(MAX_MESSAGE).collect()
}

/// A failure of sending a request: a connection never made is definite
/// (nothing was sent); a timeout or any other failure after connecting is
/// uncertain.
pub(crate) fn send_failure(error: &reqwest::Error) -> ModelError {
    if error.is_connect() {
        ModelError::Unavailable {
            status: None,
            message: bounded(&format!("no connection: {error}")),
            retry_after: None,
        }
    } else if error.is_timeout() {
        ModelError::Timeout(bounded(&error.to_string()))
    } else {
        ModelError::Interrupted(bounded(&error.to_string()))
    }
}

/// A failure while reading an answer: the request was sent.
pub(crate) fn read_failure(error: &reqwest::Error) -> ModelError {
    if error.is_timeout() {
        ModelError::Timeout(bounded(&error.to_string()))
    } else {
        ModelError::Interrupted(bounded(&format!("the answer was cut off: {error}")))
    }
}

/// An error object as both providers write it: `{"error": {"type",
/// "code", "message"}}` (Anthropic adds an outer `"type": "error"`).
pub(crate) struct ErrorObject {
    kind: String,
    code: String,
    message: String,
}

impl ErrorObject {
    /// Reads the error object of a body, if it has one.
    pub(crate) fn of(body: &Value) -> Option<ErrorObject> {
        let error = body.get("error")?;
        let text = |key: &str| {
            error
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Some(ErrorObject {
            kind: text("type"),
            code: text("code"),
            message: match error {
                Value::String(message) => message.clone(),
                _ => text("message"),
            },
        })
    }

    fn describes(&self, words: &[&str]) -> bool {
        words
            .iter()
            .any(|word| self.kind.contains(word) || self.code.contains(word))
    }

    /// Classifies an error object that arrived inside a stream (the answer
    /// had a success status): rate limits, refusals of the request, and
    /// everything else as the provider being unable to serve the call.
    pub(crate) fn classify(&self) -> ModelError {
        let message = bounded(if self.message.is_empty() {
            &self.kind
        } else {
            &self.message
        });
        if self.describes(&["insufficient_quota", "billing"]) {
            ModelError::Refused {
                status: None,
                message,
            }
        } else if self.describes(&["rate_limit", "requests", "tokens"]) {
            ModelError::RateLimited {
                status: None,
                message,
                retry_after: None,
            }
        } else if self.describes(&[
            "invalid_request",
            "authentication",
            "permission",
            "not_found",
            "request_too_large",
            "invalid_api_key",
        ]) {
            ModelError::Refused {
                status: None,
                message,
            }
        } else {
            ModelError::Unavailable {
                status: None,
                message,
                retry_after: None,
            }
        }
    }
}

/// Classifies an error status: 429 is a rate limit (unless the body says
/// the quota is spent, which no wait fixes), 408, 409 and 5xx (529
/// overloaded included) an unavailable provider, any other status a
/// refusal. The message comes from the body's error object when it has one.
pub(crate) fn status_failure(status: u16, headers: &HeaderMap, body: &[u8]) -> ModelError {
    let object = serde_json::from_slice::<Value>(body)
        .ok()
        .as_ref()
        .and_then(ErrorObject::of);
    let message = bounded(
        &object
            .as_ref()
            .map(|object| object.message.clone())
            .filter(|message| !message.is_empty())
            .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned()),
    );
    let spent = object
        .as_ref()
        .is_some_and(|object| object.describes(&["insufficient_quota", "billing"]));
    let retry_after = retry_after(headers);
    match status {
        429 if !spent => ModelError::RateLimited {
            status: Some(status),
            message,
            retry_after,
        },
        408 | 409 | 500..=599 => ModelError::Unavailable {
            status: Some(status),
            message,
            retry_after,
        },
        _ => ModelError::Refused {
            status: Some(status),
            message,
        },
    }
}

/// Reads the answer of an error status (bounded) and classifies it.
pub(crate) async fn error_answer(response: reqwest::Response) -> ModelError {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = read_limited(response, MAX_ERROR_BODY)
        .await
        .unwrap_or_default();
    status_failure(status, &headers, &body)
}

/// The delay a provider asked for: `retry-after-ms` (milliseconds, sent by
/// some OpenAI-compatible servers), else `retry-after` as seconds (whole or
/// decimal) or as an HTTP date, measured from the answer's `Date` header
/// (the server's own clock), or from the system clock when there is none.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::trim)
    };
    if let Some(millis) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && millis.is_finite()
        && millis >= 0.0
    {
        return Some(Duration::from_secs_f64(millis / 1000.0));
    }
    let value = header("retry-after")?;
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let now = header("date")
        .and_then(|date| httpdate::parse_http_date(date).ok())
        .unwrap_or_else(|| UNIX_EPOCH + Duration::from_millis(SystemClock.now().millis()));
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Reads a body of at most `limit` bytes.
pub(crate) async fn read_limited(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, ModelError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| read_failure(&e))? {
        if body.len() + chunk.len() > limit {
            return Err(ModelError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Feeds the server-sent events of an answer (at most `limit` bytes in
/// all) to `on_event` until it breaks or the stream ends. A stream that is
/// not valid event-stream text is malformed; a connection lost mid-answer
/// is interrupted.
pub(crate) async fn read_events(
    response: reqwest::Response,
    limit: usize,
    on_event: impl FnMut(&Event) -> Result<ControlFlow<()>, ModelError>,
) -> Result<(), ModelError> {
    let chunks = futures_util::stream::try_unfold(
        (response, 0usize),
        move |(mut response, total)| async move {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let total = total + chunk.len();
                    if total > limit {
                        return Err(ModelError::TooLarge { limit });
                    }
                    Ok(Some((chunk, (response, total))))
                }
                Ok(None) => Ok(None),
                Err(error) => Err(read_failure(&error)),
            }
        },
    );
    fold_events(chunks, on_event).await
}

/// Feeds the server-sent events parsed from `chunks` to `on_event` until it
/// breaks or the chunks end (the byte-level half of [`read_events`]).
pub(crate) async fn fold_events<B: AsRef<[u8]>>(
    chunks: impl futures_util::Stream<Item = Result<B, ModelError>>,
    mut on_event: impl FnMut(&Event) -> Result<ControlFlow<()>, ModelError>,
) -> Result<(), ModelError> {
    let mut events = std::pin::pin!(EventStream::new(chunks));
    while let Some(event) = events.next().await {
        let event = event.map_err(|error| match error {
            EventStreamError::Transport(error) => error,
            EventStreamError::Utf8(error) => {
                ModelError::Malformed(format!("the event stream is not UTF-8: {error}"))
            }
            EventStreamError::Parser(error) => ModelError::Malformed(bounded(&format!(
                "the event stream does not parse: {error}"
            ))),
        })?;
        if on_event(&event)?.is_break() {
            break;
        }
    }
    Ok(())
}

/// The pieces of an answer, assembled into a response.
#[derive(Default)]
pub(crate) struct Assembly {
    pub reasoning: String,
    pub content: String,
    pub refusal: String,
    pub calls: Vec<ToolCall>,
}

impl Assembly {
    pub(crate) fn response(
        self,
        finish: FinishReason,
        usage: Option<Usage>,
    ) -> Result<Response, ModelError> {
        let mut parts = Vec::new();
        if !self.reasoning.is_empty() {
            parts.push(Part::Reasoning {
                text: self.reasoning,
            });
        }
        if !self.content.is_empty() {
            parts.push(Part::Text { text: self.content });
        }
        if !self.refusal.is_empty() {
            parts.push(Part::Refusal { text: self.refusal });
        }
        parts.extend(self.calls.into_iter().map(|call| Part::ToolCall { call }));
        if parts.is_empty() {
            parts.push(Part::text(""));
        }
        let message = Message::new(Role::Assistant, parts)
            .map_err(|error| ModelError::Malformed(error.to_string()))?;
        Response::new(message, finish, usage)
            .map_err(|error| ModelError::Malformed(error.to_string()))
    }
}

/// The current time as the system clock has it, for callers outside a
/// dispatch (tests of `Retry-After` dates).
#[cfg(test)]
fn now() -> std::time::SystemTime {
    UNIX_EPOCH + Duration::from_millis(SystemClock.now().millis())
}

/// Drives [`fold_events`] over `bytes` cut into two chunks at `cut`, for the
/// fuzz tests of the providers' stream decoders: the chunks are always
/// ready, so one poll finishes it.
#[cfg(test)]
pub(crate) fn fold_bytes(
    bytes: &[u8],
    cut: usize,
    on_event: impl FnMut(&Event) -> Result<ControlFlow<()>, ModelError>,
) -> Result<(), ModelError> {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let cut = cut.min(bytes.len());
    let chunks = futures_util::stream::iter([
        Ok::<_, ModelError>(bytes[..cut].to_vec()),
        Ok(bytes[cut..].to_vec()),
    ]);
    let mut fold = std::pin::pin!(fold_events(chunks, on_event));
    match fold.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(result) => result,
        Poll::Pending => panic!("ready chunks left the event fold pending"),
    }
}

/// Whether `error` is one of the classified failures a decoder may report.
#[cfg(test)]
pub(crate) fn is_decoder_failure(error: &ModelError) -> bool {
    error.code().starts_with("chat.provider.")
}

#[cfg(test)]
mod tests {
    use reqwest::header::{HeaderName, HeaderValue};

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| {
                (
                    HeaderName::from_static(name),
                    HeaderValue::from_str(value).expect("a header value"),
                )
            })
            .collect()
    }

    #[test]
    fn retry_after_reads_seconds_milliseconds_and_http_dates() {
        assert_eq!(
            retry_after(&headers(&[("retry-after", "7")])),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after", "1.5")])),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after-ms", "250"), ("retry-after", "9")])),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            retry_after(&headers(&[
                ("retry-after", "Wed, 21 Oct 2015 07:28:30 GMT"),
                ("date", "Wed, 21 Oct 2015 07:28:00 GMT"),
            ])),
            Some(Duration::from_secs(30))
        );
        let later = httpdate::fmt_http_date(now() + Duration::from_secs(3600));
        let waited = retry_after(&headers(&[("retry-after", &later)])).expect("a date");
        assert!(waited > Duration::from_secs(3500) && waited <= Duration::from_secs(3600));
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")])), None);
        assert_eq!(retry_after(&headers(&[("retry-after", "-3")])), None);
        assert_eq!(retry_after(&headers(&[])), None);
    }

    #[test]
    fn statuses_and_error_objects_are_classified() {
        let none = HeaderMap::new();
        let body = |kind: &str, code: &str| {
            serde_json::json!({"error": {"type": kind, "code": code, "message": "m"}})
                .to_string()
                .into_bytes()
        };
        let code = |error: ModelError| error.code();
        assert_eq!(
            code(status_failure(429, &none, b"")),
            "chat.provider.rate_limited"
        );
        assert_eq!(
            code(status_failure(
                429,
                &none,
                &body("insufficient_quota", "insufficient_quota")
            )),
            "chat.provider.refused"
        );
        for status in [408, 409, 500, 502, 503, 529] {
            assert_eq!(
                code(status_failure(status, &none, b"")),
                "chat.provider.unavailable"
            );
        }
        for status in [400, 401, 403, 404, 422] {
            assert_eq!(
                code(status_failure(status, &none, b"")),
                "chat.provider.refused"
            );
        }
        let of = |kind: &str| {
            ErrorObject::of(&serde_json::json!({"error": {"type": kind, "message": "m"}}))
                .expect("an error object")
                .classify()
                .code()
        };
        assert_eq!(of("overloaded_error"), "chat.provider.unavailable");
        assert_eq!(of("server_error"), "chat.provider.unavailable");
        assert_eq!(of("rate_limit_error"), "chat.provider.rate_limited");
        assert_eq!(of("invalid_request_error"), "chat.provider.refused");
    }
}
