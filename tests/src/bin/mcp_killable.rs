//! The host process of the MCP SIGKILL test (`tests/it/mcp_kill.rs`), and
//! the MCP server it runs.
//!
//! `mcp_killable serve` is an MCP server (rmcp's server side) over stdio
//! with one tool, `count`, without annotations: it appends the call's
//! idempotency key to the file `MCP_TEST_COUNTER` names, writes its process
//! id to `MCP_TEST_PID`, reports `received <key>` on stderr, and, when `MCP_TEST_HOLD` is `1`, holds the call
//! for up to 60 seconds before answering `count N` (N lines in the file).
//!
//! `mcp_killable run|recover <database> <dir> never|same` opens a SQLite
//! store and an interaction whose scripted model calls `k_count` once and
//! then answers with the tool's result; the tool's replay policy is the
//! third argument. `run` starts the tree with the server holding the call
//! (the test kills this process during the call); `recover` takes the tree
//! up with the server answering at once and prints `output <text>` when it
//! completes or `parked <unknown effects>` when it parks.

use std::error::Error;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use baton::agent::mcp::{
    McpServer, McpServerConfig, McpToolOptions, McpTransport, Secret, StdioTransport,
};
use baton::agent::{
    Interaction, InteractionConfig, InteractionInput, InteractionOutput, Message, Part, Request,
    Response, ScriptedModel, ToolCall,
};
use baton::run::dispatch::ReplayPolicy;
use baton::run::{
    Condition, Engine, EngineConfig, ProcessId, RecoverOptions, Scope, StartId, StartRequest,
    Status, TreeId,
};
use baton::store::sqlite::{Creation, SqliteConfig, SqliteStore};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::json;

const SCOPE: &str = "mcp-kill";

#[derive(Clone)]
struct Counter;

fn internal(error: impl ToString) -> ErrorData {
    ErrorData::internal_error(error.to_string(), None)
}

impl ServerHandler for Counter {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        serde_json::from_value(json!({"tools": [{
            "name": "count",
            "description": "Records the call and answers how many calls were recorded.",
            "inputSchema": {"type": "object", "properties": {}}
        }]}))
        .map_err(internal)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        const KEY: &str = "dev.baton/idempotency-key";
        // rmcp hands the request's `_meta` over in the context.
        let key = request
            .meta
            .as_ref()
            .and_then(|meta| meta.0.get(KEY))
            .or_else(|| context.meta.0.get(KEY))
            .and_then(|value| value.as_str())
            .unwrap_or("none")
            .to_owned();
        let path = std::env::var("MCP_TEST_COUNTER").map_err(internal)?;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(internal)?;
        writeln!(file, "{key}").map_err(internal)?;
        file.sync_all().map_err(internal)?;
        eprintln!("received {key}");
        if std::env::var("MCP_TEST_HOLD").as_deref() == Ok("1") {
            hold().await;
        }
        let lines = std::fs::read_to_string(&path)
            .map_err(internal)?
            .lines()
            .count();
        let result: CallToolResult = serde_json::from_value(json!({
            "content": [{"type": "text", "text": format!("count {lines}")}]
        }))
        .map_err(internal)?;
        Ok(result.into())
    }
}

/// Holds a call for the test to kill the host meanwhile; bounded, so an
/// orphaned server ends by itself.
#[expect(
    clippy::disallowed_methods,
    reason = "the test server holds a call the way a slow server would"
)]
async fn hold() {
    tokio::time::sleep(Duration::from_secs(60)).await;
}

async fn serve() -> Result<(), Box<dyn Error>> {
    if let Ok(path) = std::env::var("MCP_TEST_PID") {
        std::fs::write(path, std::process::id().to_string())?;
    }
    let service = Counter.serve(rmcp::transport::stdio()).await?;
    service.waiting().await?;
    Ok(())
}

fn tree() -> TreeId {
    ProcessId::root(&StartId::new(SCOPE, "conversation").expect("a valid start id"))
}

async fn host(
    mode: &str,
    database: PathBuf,
    dir: PathBuf,
    replay: ReplayPolicy,
) -> Result<(), Box<dyn Error>> {
    let store = SqliteStore::open_with(
        database,
        SqliteConfig {
            creation: Creation::ExistingOrNew,
            ..SqliteConfig::default()
        },
    )?;
    let mut transport =
        StdioTransport::new(std::env::current_exe()?.display().to_string(), ["serve"]);
    let secret = |path: PathBuf| Secret::new(path.display().to_string());
    transport
        .env
        .insert("MCP_TEST_COUNTER".into(), secret(dir.join("counter")));
    transport.env.insert(
        "MCP_TEST_PID".into(),
        secret(dir.join(format!("server-{mode}.pid"))),
    );
    // The value differs between the run and the recovery; only the name
    // enters the identity, so both are the same program.
    transport.env.insert(
        "MCP_TEST_HOLD".into(),
        Secret::new(if mode == "run" { "1" } else { "0" }),
    );
    let mut config = McpServerConfig::new("k", McpTransport::Stdio(transport));
    config.tools.insert(
        "count".into(),
        McpToolOptions {
            replay: Some(replay),
            ..McpToolOptions::default()
        },
    );
    let server = McpServer::connect(config).await?;
    let model = ScriptedModel::new("kill", |request: &Request| {
        let results: Vec<String> = request
            .messages()
            .iter()
            .flat_map(|message| message.parts())
            .filter_map(|part| match part {
                Part::ToolResult { result } => Some(result.output.clone()),
                _ => None,
            })
            .collect();
        if results.is_empty() {
            let call = ToolCall {
                id: "c1".into(),
                name: "k_count".into(),
                arguments: "{}".into(),
            };
            Ok(Response::calls(vec![call]).expect("a valid response"))
        } else {
            Ok(Response::text(results.join("|")))
        }
    });
    let mut interaction =
        InteractionConfig::new("kill.mcp", "Counts once.", Arc::new(model), 100, 4);
    interaction.tools = server.tools().await?;
    let program = Interaction::new(interaction)?.program();
    let engine = Engine::new(EngineConfig {
        programs: vec![program.erase()],
        ..EngineConfig::new(Arc::new(store))
    })?;
    let scope = Scope::new(SCOPE)?;
    if mode == "run" {
        let handle = engine
            .start(
                &program,
                StartRequest::new(
                    StartId::new(SCOPE, "conversation")?,
                    InteractionInput::new(vec![Message::user("count once")]),
                ),
            )
            .await?;
        let output: InteractionOutput = handle.output().await?;
        println!("output {}", output.response.message().text());
        return Ok(());
    }
    engine.recover(RecoverOptions::default()).await?;
    let view = engine.until(&scope, tree(), Condition::Quiescent).await?;
    let parked: usize = view
        .processes
        .iter()
        .filter(|p| p.status == Status::Parked)
        .map(|p| p.unknown_effects.len())
        .sum();
    if parked > 0 {
        println!("parked {parked}");
    } else {
        let handle = engine.process::<InteractionOutput>(&scope, tree()).await?;
        let output = handle.output().await?;
        println!("output {}", output.response.message().text());
    }
    std::io::stdout().flush()?;
    engine.close().await;
    server.close().await;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [serve_mode] if serve_mode == "serve" => serve().await,
        [mode, database, dir, replay] if mode == "run" || mode == "recover" => {
            let replay = match replay.as_str() {
                "never" => ReplayPolicy::Never,
                "same" => ReplayPolicy::SameIdentity,
                other => return Err(format!("unknown replay policy {other}").into()),
            };
            host(mode, PathBuf::from(database), PathBuf::from(dir), replay).await
        }
        _ => Err("usage: mcp_killable serve | run|recover <database> <dir> never|same".into()),
    }
}
