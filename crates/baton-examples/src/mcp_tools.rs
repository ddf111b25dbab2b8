//! An interaction whose tools come from a Model Context Protocol server:
//! the reference server `@modelcontextprotocol/server-everything`, started
//! over stdio, offers `echo` and `get-sum`; a scripted model adds two
//! numbers with one and echoes the sum with the other; every call is a
//! logged, budgeted effect (one `mcp_calls` each).
//!
//! The server's launcher is `BATON_MCP_SERVER` if set, else where `.ci/run`
//! installs it: `$HOME/.cache/baton-mcp/node_modules/.bin/mcp-server-everything`
//! (`npm install --prefix "$HOME/.cache/baton-mcp" @modelcontextprotocol/server-everything@2026.8.31`).
//! `cargo run -p baton-examples --example mcp_tools` runs it.

use std::collections::BTreeSet;
use std::error::Error;
use std::sync::Arc;

use baton::agent::mcp::{MCP_CALLS, McpServer, McpServerConfig, McpTransport, StdioTransport};
use baton::agent::{
    Interaction, InteractionConfig, InteractionInput, InteractionOutput, Message, Part, Request,
    Response, ScriptedModel, ToolCall,
};
use baton::run::{
    Budget, Engine, EngineConfig, MemoryStore, Name, StartId, StartRequest, Visibility,
};

/// The reference server's launcher: `BATON_MCP_SERVER` (or the tests'
/// `BATON_TEST_MCP_EVERYTHING`), else the path `.ci/run` installs it at.
pub fn everything_launcher() -> Result<String, Box<dyn Error>> {
    for variable in ["BATON_MCP_SERVER", "BATON_TEST_MCP_EVERYTHING"] {
        if let Ok(path) = std::env::var(variable)
            && !path.trim().is_empty()
        {
            return Ok(path);
        }
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let path = format!("{home}/.cache/baton-mcp/node_modules/.bin/mcp-server-everything");
    if !std::path::Path::new(&path).exists() {
        return Err(format!(
            "no MCP server at {path}: install the reference server with `npm install --prefix \
             \"$HOME/.cache/baton-mcp\" @modelcontextprotocol/server-everything@2026.8.31`, or \
             set BATON_MCP_SERVER to a server's launcher"
        )
        .into());
    }
    Ok(path)
}

/// The scripted model: asks for the sum, then echoes it, then answers.
fn model() -> ScriptedModel {
    ScriptedModel::new("mcp-example", |request: &Request| {
        let results: Vec<String> = request
            .messages()
            .iter()
            .flat_map(|message| message.parts())
            .filter_map(|part| match part {
                Part::ToolResult { result } => Some(result.output.clone()),
                _ => None,
            })
            .collect();
        let call = |name: &str, arguments: String| ToolCall {
            id: format!("call-{}", results.len() + 1),
            name: name.into(),
            arguments,
        };
        let response = match results.as_slice() {
            [] => Response::calls(vec![call("ev_get-sum", r#"{"a":20,"b":22}"#.into())]),
            [sum] => {
                // The server answers in words ("The sum of 20 and 22 is
                // 42."): the last number is the sum.
                let sum = sum
                    .rsplit(|c: char| !c.is_ascii_digit())
                    .find(|number| !number.is_empty())
                    .unwrap_or_default();
                Response::calls(vec![call(
                    "ev_echo",
                    serde_json::json!({ "message": format!("the sum is {sum}") }).to_string(),
                )])
            }
            [.., echoed] => Ok(Response::text(format!("The server said: {echoed}"))),
        };
        Ok(response.expect("a valid response"))
    })
}

/// Runs the example; returns the lines its binary prints.
pub async fn run() -> Result<Vec<String>, Box<dyn Error>> {
    let mut config = McpServerConfig::new(
        "ev",
        McpTransport::Stdio(StdioTransport::new(everything_launcher()?, ["stdio"])),
    );
    config.allow = Some(BTreeSet::from(["echo".into(), "get-sum".into()]));
    let server = McpServer::connect(config).await?;
    let tools = server.tools().await?;
    let mut lines = vec![format!(
        "tools: {}",
        tools
            .iter()
            .map(|tool| tool.name())
            .collect::<Vec<_>>()
            .join(", ")
    )];

    let mut interaction = InteractionConfig::new(
        "example.mcp",
        "Uses an MCP server's tools.",
        Arc::new(model()),
        200,
        4,
    );
    interaction.tools = tools;
    let program = Interaction::new(interaction)?.program();
    let engine = Engine::new(EngineConfig {
        programs: vec![program.erase()],
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })?;
    let calls = Name::new(MCP_CALLS)?;
    let mut request = StartRequest::new(
        StartId::new("example", "mcp")?,
        InteractionInput::new(vec![Message::user("What is 20 + 22? Say it through echo.")]),
    );
    request.budget = Budget::unlimited().with_meter(calls.clone(), 5);
    let handle = engine.start(&program, request).await?;
    let output: InteractionOutput = handle.output().await?;
    handle.join().await?;
    lines.push(format!("answer: {}", output.response.message().text()));
    let view = engine
        .inspect(handle.scope(), handle.tree(), Visibility::Public)
        .await?;
    let usage = view.usage();
    lines.push(format!(
        "charged: {} mcp_calls of 5",
        usage.total.meters.get(&calls).copied().unwrap_or(0)
    ));
    engine.close().await;
    server.close().await;
    Ok(lines)
}
