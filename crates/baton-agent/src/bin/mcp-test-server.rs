//! The MCP server the agent layer's tests drive, written with rmcp's
//! server side: `mcp-test-server stdio` serves over stdin and stdout;
//! `mcp-test-server http` serves streamable HTTP on 127.0.0.1 and prints
//! `listening <url>` as its first line.
//!
//! Its tools: `echo` and `add` (read-only), `fail` (an `isError` result),
//! `crash` (the process exits on receiving the call), `slow` (answers
//! after the milliseconds asked for), `delete_file` (destructive), and
//! `count` (appends the call's idempotency key to the file named by
//! `MCP_TEST_COUNTER`, and with `crash_first` exits on the first call).

use std::io::Write;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

#[derive(Clone)]
struct TestServer;

fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required})
}

fn tools() -> Value {
    json!({"tools": [
        {
            "name": "echo",
            "description": "Answers with its text.",
            "inputSchema": object(json!({"text": {"type": "string"}}), &["text"]),
            "annotations": {"readOnlyHint": true}
        },
        {
            "name": "add",
            "description": "Adds a and b.",
            "inputSchema": object(json!({"a": {"type": "integer"}, "b": {"type": "integer"}}), &["a", "b"]),
            "annotations": {"readOnlyHint": true}
        },
        {
            "name": "fail",
            "description": "Reports an error result with the reason.",
            "inputSchema": object(json!({"reason": {"type": "string"}}), &["reason"]),
            "annotations": {"readOnlyHint": true}
        },
        {
            "name": "crash",
            "description": "Exits the server process on receiving the call.",
            "inputSchema": object(json!({}), &[])
        },
        {
            "name": "slow",
            "description": "Answers after the given milliseconds.",
            "inputSchema": object(json!({"millis": {"type": "integer", "minimum": 0}}), &["millis"]),
            "annotations": {"readOnlyHint": true}
        },
        {
            "name": "delete_file",
            "description": "Deletes a file.",
            "inputSchema": object(json!({"path": {"type": "string"}}), &["path"]),
            "annotations": {"destructiveHint": true}
        },
        {
            "name": "count",
            "description": "Records the call in the counter file and answers how many calls it holds.",
            "inputSchema": object(json!({"crash_first": {"type": "boolean"}}), &[])
        }
    ]})
}

fn text(text: impl Into<String>, is_error: bool) -> CallToolResponse {
    let result: CallToolResult = serde_json::from_value(json!({
        "content": [{"type": "text", "text": text.into()}],
        "isError": is_error,
    }))
    .expect("a valid tool result");
    result.into()
}

fn argument<'a>(arguments: &'a serde_json::Map<String, Value>, name: &str) -> &'a Value {
    arguments.get(name).unwrap_or(&Value::Null)
}

fn idempotency_key(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> String {
    const KEY: &str = "dev.baton/idempotency-key";
    request
        .meta
        .as_ref()
        .and_then(|meta| meta.0.get(KEY).cloned())
        .or_else(|| context.meta.0.get(KEY).cloned())
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_else(|| "none".into())
}

/// Appends `key` to the counter file; returns how many lines it holds.
fn count(key: &str) -> Result<usize, ErrorData> {
    let path = std::env::var("MCP_TEST_COUNTER")
        .map_err(|_| ErrorData::invalid_request("MCP_TEST_COUNTER is not set", None))?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|error| ErrorData::internal_error(error.to_string(), None))?;
    writeln!(file, "{key}").map_err(|error| ErrorData::internal_error(error.to_string(), None))?;
    file.sync_all()
        .map_err(|error| ErrorData::internal_error(error.to_string(), None))?;
    let lines = std::fs::read_to_string(&path)
        .map_err(|error| ErrorData::internal_error(error.to_string(), None))?
        .lines()
        .count();
    Ok(lines)
}

/// Takes as long as a slow tool would.
#[expect(
    clippy::disallowed_methods,
    reason = "the test server's slow tool stands for a server that takes long"
)]
async fn slow(millis: u64) {
    tokio::time::sleep(Duration::from_millis(millis)).await;
}

impl ServerHandler for TestServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        serde_json::from_value(tools())
            .map_err(|error| ErrorData::internal_error(error.to_string(), None))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.clone().unwrap_or_default();
        match request.name.as_ref() {
            "echo" => Ok(text(
                argument(&arguments, "text").as_str().unwrap_or_default(),
                false,
            )),
            "add" => {
                let sum = argument(&arguments, "a").as_i64().unwrap_or(0)
                    + argument(&arguments, "b").as_i64().unwrap_or(0);
                let result: CallToolResult = serde_json::from_value(json!({
                    "content": [{"type": "text", "text": sum.to_string()}],
                    "structuredContent": {"sum": sum},
                }))
                .expect("a valid tool result");
                Ok(result.into())
            }
            "fail" => Ok(text(
                format!(
                    "failed: {}",
                    argument(&arguments, "reason").as_str().unwrap_or_default()
                ),
                true,
            )),
            "crash" => std::process::exit(3),
            "slow" => {
                let millis = argument(&arguments, "millis").as_u64().unwrap_or(0);
                slow(millis).await;
                Ok(text(format!("slept {millis}ms"), false))
            }
            "delete_file" => {
                let path = argument(&arguments, "path").as_str().unwrap_or_default();
                match std::fs::remove_file(path) {
                    Ok(()) => Ok(text(format!("deleted {path}"), false)),
                    Err(error) => Ok(text(format!("cannot delete {path}: {error}"), true)),
                }
            }
            "count" => {
                let lines = count(&idempotency_key(&request, &context))?;
                if lines == 1 && argument(&arguments, "crash_first").as_bool() == Some(true) {
                    std::process::exit(3);
                }
                Ok(text(format!("count {lines}"), false))
            }
            other => Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::args().nth(1).as_deref() {
        Some("stdio") => {
            let service = TestServer.serve(rmcp::transport::stdio()).await?;
            service.waiting().await?;
        }
        Some("http") => {
            use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
            use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
            let service: StreamableHttpService<TestServer, LocalSessionManager> =
                StreamableHttpService::new(
                    || Ok(TestServer),
                    Default::default(),
                    StreamableHttpServerConfig::default(),
                );
            let router = axum::Router::new().nest_service("/mcp", service);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            println!("listening http://{}/mcp", listener.local_addr()?);
            std::io::stdout().flush()?;
            axum::serve(listener, router).await?;
        }
        _ => {
            eprintln!("usage: mcp-test-server stdio|http");
            std::process::exit(2);
        }
    }
    Ok(())
}
