//! The session with one server: started lazily, started again after it
//! died, and the classification of a call's failures by whether the server
//! may have received it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use baton_run::dispatch::RetryHint;
use baton_run::{Digest, EffectId, FailureKind, Meters, Name, Payload};
use baton_workflow::{ActivityError, ActivityOutput};
use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, MetaObject, RequestMetaObject,
    ServerResult,
};
use rmcp::service::{Peer, PeerRequestOptions, RunningService, ServiceError, ServiceExt};
use serde_json::Value;
use tokio::sync::Mutex;

use super::{
    HttpTransport, IDEMPOTENCY_META_KEY, MCP_CALL_LOST, MCP_CALL_MALFORMED, MCP_CALL_REFUSED,
    MCP_CALL_TIMED_OUT, MCP_CALLS, MCP_SERVER_UNAVAILABLE, McpError, McpServerConfig, McpTransport,
};
use crate::tool::ToolReply;

type Service = RunningService<RoleClient, ()>;

/// What every tool of one server shares.
pub(crate) struct Shared {
    pub(crate) config: McpServerConfig,
    pub(crate) identity: Digest,
    session: Mutex<Option<Running>>,
    started: AtomicU64,
}

/// The running session and which start it was.
struct Running {
    service: Service,
    start: u64,
}

/// What a call holds of the session: its peer and which start it was.
pub(crate) struct Handle {
    peer: Peer<RoleClient>,
    start: u64,
}

/// How a call ended without a tool result.
enum Lost {
    /// The server cannot have received it.
    NeverSent(String),
    /// It may have.
    Uncertain(String),
}

impl Shared {
    pub(crate) fn new(config: McpServerConfig, identity: Digest) -> Shared {
        Shared {
            config,
            identity,
            session: Mutex::new(None),
            started: AtomicU64::new(0),
        }
    }

    pub(crate) fn started(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }

    fn unavailable(&self, reason: impl Into<String>) -> McpError {
        McpError::Unavailable {
            server: self.config.name.clone(),
            reason: reason.into(),
        }
    }

    /// The running session, started (again) when there is none or it died.
    pub(crate) async fn session(&self) -> Result<Handle, McpError> {
        let mut slot = self.session.lock().await;
        if let Some(running) = slot.as_ref()
            && !running.service.is_closed()
            && !running.service.peer().is_transport_closed()
        {
            return Ok(Handle {
                peer: running.service.peer().clone(),
                start: running.start,
            });
        }
        if let Some(running) = slot.take() {
            tracing::warn!(server = %self.config.name, "the mcp session ended; starting another");
            stop(running.service).await;
        }
        let service = tokio::time::timeout(self.config.connect_timeout, self.start())
            .await
            .map_err(|_| {
                self.unavailable(format!(
                    "no session within {}ms",
                    self.config.connect_timeout.as_millis()
                ))
            })??;
        let start = self.started.fetch_add(1, Ordering::SeqCst) + 1;
        let handle = Handle {
            peer: service.peer().clone(),
            start,
        };
        *slot = Some(Running { service, start });
        Ok(handle)
    }

    async fn start(&self) -> Result<Service, McpError> {
        match &self.config.transport {
            McpTransport::Stdio(stdio) => {
                let mut command = tokio::process::Command::new(&stdio.command);
                command.args(&stdio.args);
                for (name, value) in &stdio.env {
                    command.env(name, value.expose());
                }
                if let Some(cwd) = &stdio.cwd {
                    command.current_dir(cwd);
                }
                let (transport, _stderr) = rmcp::transport::TokioChildProcess::builder(command)
                    .stderr(std::process::Stdio::inherit())
                    .spawn()
                    .map_err(|error| {
                        self.unavailable(format!("cannot start {:?}: {error}", stdio.command))
                    })?;
                ().serve(transport)
                    .await
                    .map_err(|error| self.unavailable(error.to_string()))
            }
            McpTransport::Http(http) => {
                use rmcp::transport::StreamableHttpClientTransport;
                let config = self.http_config(http)?;
                // rmcp's HTTP client brings no TLS crypto provider of its
                // own: use ring (rustls already builds it) unless the
                // process installed one.
                let _ = rustls::crypto::ring::default_provider().install_default();
                ().serve(StreamableHttpClientTransport::from_config(config))
                    .await
                    .map_err(|error| self.unavailable(error.to_string()))
            }
        }
    }

    #[expect(
        clippy::disallowed_types,
        reason = "rmcp's HTTP settings take a HashMap; it is sent, never hashed or persisted"
    )]
    fn http_config(
        &self,
        http: &HttpTransport,
    ) -> Result<
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig,
        McpError,
    > {
        use std::collections::HashMap;

        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        let mut headers = HashMap::new();
        for (name, value) in &http.headers {
            let name = http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|error| self.unavailable(error.to_string()))?;
            let value = http::HeaderValue::from_str(value.expose())
                .map_err(|error| self.unavailable(error.to_string()))?;
            headers.insert(name, value);
        }
        let mut config = StreamableHttpClientTransportConfig::with_uri(http.url.as_str())
            .custom_headers(headers);
        if let Some(token) = &http.bearer {
            config = config.auth_header(token.expose());
        }
        Ok(config)
    }

    /// Lists the server's tools as JSON (decoded strictly by the caller).
    pub(crate) async fn list(&self) -> Result<Vec<Value>, McpError> {
        let session = self.session().await?;
        let listed = session
            .peer
            .list_all_tools()
            .await
            .map_err(|error| McpError::List {
                server: self.config.name.clone(),
                reason: error.to_string(),
            })?;
        listed
            .into_iter()
            .map(|tool| {
                serde_json::to_value(tool).map_err(|error| McpError::List {
                    server: self.config.name.clone(),
                    reason: error.to_string(),
                })
            })
            .collect()
    }

    /// Ends the session of `handle` if it is still the running one: its
    /// transport failed, so the next call starts another.
    async fn forget(&self, handle: &Handle) {
        let mut slot = self.session.lock().await;
        if slot
            .as_ref()
            .is_some_and(|running| running.start == handle.start)
            && let Some(running) = slot.take()
        {
            tracing::warn!(server = %self.config.name, "the mcp session's transport failed; the next call starts another");
            stop(running.service).await;
        }
    }

    pub(crate) async fn close(&self) {
        let running = self.session.lock().await.take();
        if let Some(running) = running {
            stop(running.service).await;
        }
    }

    /// Calls `tool` with `arguments` once: a tool result (an `isError`
    /// result included) is an output; everything else a classified failure.
    pub(crate) async fn call(
        &self,
        tool: &str,
        arguments: Payload,
        key: EffectId,
        timeout: Duration,
    ) -> Result<ActivityOutput, ActivityError> {
        let arguments = match arguments.to_value() {
            Value::Object(arguments) => arguments,
            other => {
                return Err(ActivityError::coded(
                    MCP_CALL_REFUSED,
                    format!("the arguments are not an object: {other}"),
                )
                .with_kind(FailureKind::Contract));
            }
        };
        let session = self.session().await.map_err(|error| {
            ActivityError::coded(MCP_SERVER_UNAVAILABLE, error.to_string())
                .with_retry(RetryHint::definite(None))
        })?;
        let mut meta = serde_json::Map::new();
        meta.insert(IDEMPOTENCY_META_KEY.into(), Value::String(key.to_string()));
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = Some(arguments);
        params.meta = Some(RequestMetaObject(MetaObject(meta)));
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        // A request the session would not queue (it has ended) was never
        // sent; once queued, only a failed write is known not to have
        // reached the server.
        let handle = session
            .peer
            .send_request_with_option(request, PeerRequestOptions::with_timeout(timeout))
            .await
            .map_err(|error| {
                ActivityError::coded(
                    MCP_SERVER_UNAVAILABLE,
                    format!("the call to {tool:?} was not sent: {error}"),
                )
                .with_retry(RetryHint::definite(None))
            });
        let handle = match handle {
            Ok(handle) => handle,
            Err(error) => {
                self.forget(&session).await;
                return Err(error);
            }
        };
        let answer = handle.await_response().await;
        if matches!(
            answer,
            Err(ServiceError::TransportClosed | ServiceError::TransportSend(_))
        ) {
            self.forget(&session).await;
        }
        match answer {
            Ok(ServerResult::CallToolResult(result)) => {
                let value = serde_json::to_value(&result).map_err(|error| {
                    ActivityError::coded(MCP_CALL_MALFORMED, error.to_string())
                })?;
                let reply = reply(&value).map_err(|why| {
                    ActivityError::coded(MCP_CALL_MALFORMED, why)
                })?;
                let output = Payload::encode(&reply).map_err(|error| {
                    ActivityError::coded(MCP_CALL_MALFORMED, error.to_string())
                })?;
                let mut usage = Meters::new();
                usage.insert(Name::new(MCP_CALLS).expect("a valid meter name"), 1);
                Ok(ActivityOutput { output, usage })
            }
            Ok(_) => Err(ActivityError::coded(
                MCP_CALL_MALFORMED,
                format!("the server answered tools/call of {tool:?} with something other than a tool result"),
            )),
            Err(ServiceError::McpError(error)) => Err(ActivityError::coded(
                MCP_CALL_REFUSED,
                format!("the server refused the call to {tool:?}: {} ({})", error.message, error.code.0),
            )),
            Err(ServiceError::Timeout { timeout }) => Err(ActivityError::coded(
                MCP_CALL_TIMED_OUT,
                format!(
                    "no answer from {tool:?} within {}ms; the call was canceled and may have taken effect",
                    timeout.as_millis()
                ),
            )
            .with_retry(RetryHint::uncertain())),
            Err(error) => Err(match lost(error) {
                Lost::NeverSent(why) => ActivityError::coded(
                    MCP_SERVER_UNAVAILABLE,
                    format!("the call to {tool:?} was not sent: {why}"),
                )
                .with_retry(RetryHint::definite(None)),
                Lost::Uncertain(why) => ActivityError::coded(
                    MCP_CALL_LOST,
                    format!("the session ended before {tool:?} answered ({why}); it may have taken effect"),
                )
                .with_retry(RetryHint::uncertain()),
            }),
        }
    }
}

/// Ends a session and waits for its loop to end, which closes its
/// transport (a child process is given its stdin's end and a few seconds
/// to exit before it is killed).
async fn stop(service: Service) {
    if let Err(error) = service.cancel().await {
        tracing::warn!(%error, "the mcp session's task did not end cleanly");
    }
}

/// Whether a call lost after it was queued can have reached the server:
/// only a failed write is known not to have; the rest (the session ended
/// while the call waited for its answer, or was canceled) is uncertain, the
/// safe side.
fn lost(error: ServiceError) -> Lost {
    match error {
        ServiceError::TransportSend(error) => Lost::NeverSent(error.to_string()),
        other => Lost::Uncertain(other.to_string()),
    }
}

/// The model-visible reply of a tool result: its text blocks joined by
/// newlines, other blocks described, the structured content as JSON text
/// when there is no text, and `isError` as the reply's error flag.
pub(crate) fn reply(result: &Value) -> Result<ToolReply, String> {
    let content = match result.get("content") {
        None => Vec::new(),
        Some(Value::Array(blocks)) => blocks.clone(),
        Some(other) => return Err(format!("content is not a list: {other}")),
    };
    let mut parts = Vec::with_capacity(content.len());
    for block in &content {
        parts.push(describe(block));
    }
    let structured = match result.get("structuredContent") {
        None | Some(Value::Null) => None,
        Some(value) => Some(Payload::from_value(value).map_err(|error| error.to_string())?),
    };
    let mut text = parts.join("\n");
    if text.is_empty()
        && let Some(structured) = &structured
    {
        text = structured.as_str().to_owned();
    }
    let is_error = match result.get("isError") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(flag)) => *flag,
        Some(other) => return Err(format!("isError is not a boolean: {other}")),
    };
    Ok(ToolReply {
        text,
        is_error,
        structured,
    })
}

/// One content block as the model reads it.
fn describe(block: &Value) -> String {
    let text = |key: &str| block.get(key).and_then(Value::as_str).unwrap_or_default();
    match text("type") {
        "text" => text("text").to_owned(),
        "image" | "audio" => format!(
            "[{} content of type {}, {} base64 characters]",
            text("type"),
            text("mimeType"),
            text("data").len()
        ),
        "resource_link" => format!("[resource {} ({})]", text("uri"), text("name")),
        "resource" => {
            let resource = block.get("resource").cloned().unwrap_or(Value::Null);
            match resource.get("text").and_then(Value::as_str) {
                Some(body) => body.to_owned(),
                None => format!(
                    "[resource {}]",
                    resource
                        .get("uri")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                ),
            }
        }
        other => format!("[{other} content]"),
    }
}
