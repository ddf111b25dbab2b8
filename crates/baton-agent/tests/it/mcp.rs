//! MCP servers' tools as Baton tools, against two real servers: the test
//! server written with rmcp's server side (`mcp-test-server`, as a stdio
//! child process and over streamable HTTP on loopback) and the reference
//! server `@modelcontextprotocol/server-everything` over stdio.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use baton_agent::mcp::{
    HttpTransport, MCP_CALLS, McpError, McpServer, McpServerConfig, McpToolOptions, McpTransport,
    Secret, StdioTransport,
};
use baton_agent::{
    Interaction, InteractionConfig, InteractionOutput, Part, Request, Response, ScriptedModel,
    Tool, ToolCall, ToolReply,
};
use baton_run::dispatch::{ReplayPolicy, RetryPolicy};
use baton_run::{
    Budget, MemoryStore, Name, Payload, Settlement, SignalId, SignalRequest, Status, Visibility,
};
use baton_workflow::Verdict;
use tokio::io::AsyncBufReadExt;

use crate::common::*;

const TEST_SERVER: &str = env!("CARGO_BIN_EXE_mcp-test-server");

/// The reference server's launcher: `BATON_TEST_MCP_EVERYTHING`, or where
/// `.ci/run` installs it.
fn everything_command() -> String {
    if let Ok(path) = std::env::var("BATON_TEST_MCP_EVERYTHING") {
        return path;
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let path = format!("{home}/.cache/baton-mcp/node_modules/.bin/mcp-server-everything");
    assert!(
        Path::new(&path).exists(),
        "the reference MCP server is not installed at {path}: set BATON_TEST_MCP_EVERYTHING to its \
         launcher, or install it with `npm install --prefix \"$HOME/.cache/baton-mcp\" \
         @modelcontextprotocol/server-everything@2026.8.31` (.ci/run does this)"
    );
    path
}

/// A scratch directory of one test.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("baton-mcp-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// The test server over stdio, counting into `counter`.
fn stdio_server(name: &str, counter: &Path) -> McpServerConfig {
    let mut transport = StdioTransport::new(TEST_SERVER, ["stdio"]);
    transport.env.insert(
        "MCP_TEST_COUNTER".into(),
        Secret::new(counter.display().to_string()),
    );
    McpServerConfig::new(name, McpTransport::Stdio(transport))
}

fn everything_server() -> McpServerConfig {
    let mut config = McpServerConfig::new(
        "ev",
        McpTransport::Stdio(StdioTransport::new(everything_command(), ["stdio"])),
    );
    config.connect_timeout = Duration::from_secs(20);
    config
}

/// The test server over streamable HTTP as a child process, and its url.
async fn http_server() -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(TEST_SERVER)
        .arg("http")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the test server starts");
    let stdout = child.stdout.take().expect("piped");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("the server announces itself in time")
        .expect("reads")
        .expect("a line");
    let url = line
        .strip_prefix("listening ")
        .expect("a listening line")
        .to_owned();
    (child, url)
}

fn named<'a>(tools: &'a [Tool], name: &str) -> &'a Tool {
    tools
        .iter()
        .find(|tool| tool.name() == name)
        .unwrap_or_else(|| panic!("no tool {name}"))
}

/// A model that makes the calls of `turns` in order, one model answer per
/// turn, and then answers with every tool result it read, joined by `|`.
fn caller(turns: Vec<Vec<ToolCall>>) -> ScriptedModel {
    ScriptedModel::new("mcp-caller", move |request: &Request| {
        let answered = request
            .messages()
            .iter()
            .filter(|message| {
                message
                    .parts()
                    .iter()
                    .any(|part| matches!(part, Part::ToolResult { .. }))
            })
            .count();
        if let Some(calls) = turns.get(answered) {
            return Ok(Response::calls(calls.clone()).expect("valid"));
        }
        Ok(Response::text(results(request).join("|")))
    })
}

/// Every tool result of a request: `!` before an error's text.
fn results(request: &Request) -> Vec<String> {
    request
        .messages()
        .iter()
        .flat_map(|message| message.parts())
        .filter_map(|part| match part {
            Part::ToolResult { result } if result.is_error => Some(format!("!{}", result.output)),
            Part::ToolResult { result } => Some(result.output.clone()),
            _ => None,
        })
        .collect()
}

fn program(
    model: ScriptedModel,
    tools: Vec<Tool>,
) -> baton_run::Program<baton_agent::InteractionInput, InteractionOutput> {
    let mut config = InteractionConfig::new("test.mcp", "Uses MCP tools.", Arc::new(model), 100, 6);
    config.tools = tools;
    Interaction::new(config).expect("valid").program()
}

#[tokio::test]
async fn the_test_servers_tools_are_listed_prefixed_allow_listed_and_renamed() {
    let dir = scratch("listing");
    let server = McpServer::connect(stdio_server("t", &dir.join("counter")))
        .await
        .expect("connects");
    let tools = server.tools().await.expect("lists");
    let names: BTreeSet<&str> = tools.iter().map(Tool::name).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "t_add",
            "t_count",
            "t_crash",
            "t_delete_file",
            "t_echo",
            "t_fail",
            "t_slow"
        ])
    );
    let echo = named(&tools, "t_echo");
    let parameters = echo.program().descriptor().input_schema().json().to_value();
    assert_eq!(parameters["type"], "object");
    assert_eq!(parameters["required"][0], "text");
    assert_eq!(echo.program().descriptor().name().as_str(), "mcp.t_echo");
    assert_eq!(server.sessions_started(), 1);
    server.close().await;

    let mut config = stdio_server("t", &dir.join("counter"));
    config.allow = Some(BTreeSet::from(["echo".into(), "add".into()]));
    config.tools.insert(
        "add".into(),
        McpToolOptions {
            name: Some("plus".into()),
            ..McpToolOptions::default()
        },
    );
    let tools = McpServer::connect(config)
        .await
        .expect("connects")
        .tools()
        .await
        .expect("lists");
    let names: BTreeSet<&str> = tools.iter().map(Tool::name).collect();
    assert_eq!(names, BTreeSet::from(["plus", "t_echo"]));

    let mut config = stdio_server("t", &dir.join("counter"));
    config.allow = Some(BTreeSet::from(["nope".into()]));
    let refused = McpServer::connect(config)
        .await
        .expect("connects")
        .tools()
        .await
        .expect_err("an allow-listed tool the server lacks");
    assert!(matches!(refused, McpError::Tool { .. }), "{refused:?}");
    assert_eq!(refused.code(), "mcp.tool.invalid");
}

#[test]
fn connection_settings_enter_the_identity_and_secrets_do_not() {
    let identity = |env: &str, arg: &str| {
        let mut transport = StdioTransport::new("server", [arg]);
        transport.env.insert("TOKEN".into(), Secret::new(env));
        McpServer::new(McpServerConfig::new("s", McpTransport::Stdio(transport)))
            .expect("valid")
            .identity()
    };
    assert_eq!(identity("secret-1", "a"), identity("secret-2", "a"));
    assert_ne!(identity("secret-1", "a"), identity("secret-1", "b"));
    let http = |token: &str, url: &str| {
        let mut transport = HttpTransport::new(url);
        transport.bearer = Some(Secret::new(token));
        transport
            .headers
            .insert("x-api-key".into(), Secret::new(token));
        McpServer::new(McpServerConfig::new("s", McpTransport::Http(transport)))
            .expect("valid")
            .identity()
    };
    assert_eq!(
        http("one", "http://127.0.0.1:1/mcp"),
        http("two", "http://127.0.0.1:1/mcp")
    );
    assert_ne!(
        http("one", "http://127.0.0.1:1/mcp"),
        http("one", "http://127.0.0.1:2/mcp")
    );
    let mut versioned = McpServerConfig::new(
        "s",
        McpTransport::Stdio(StdioTransport::new("server", ["a"])),
    );
    let before = McpServer::new(versioned.clone()).expect("valid").identity();
    versioned.version = "2".into();
    assert_ne!(before, McpServer::new(versioned).expect("valid").identity());
    let debug = format!("{:?}", Secret::new("hunter2"));
    assert!(!debug.contains("hunter2"), "{debug}");
    let invalid = McpServer::new(McpServerConfig::new(
        "bad name",
        McpTransport::Stdio(StdioTransport::new("server", ["a"])),
    ))
    .expect_err("refused");
    assert_eq!(invalid.code(), "mcp.config.invalid");
}

#[tokio::test]
async fn a_call_succeeds_and_an_is_error_result_reaches_the_model_as_an_error_not_a_failure() {
    let dir = scratch("calls");
    let server = McpServer::connect(stdio_server("t", &dir.join("counter")))
        .await
        .expect("connects");
    let model = caller(vec![vec![
        call("c1", "t_echo", r#"{"text":"hello"}"#),
        call("c2", "t_fail", r#"{"reason":"no disk"}"#),
        call("c3", "t_add", r#"{"a":2,"b":3}"#),
    ]]);
    let program = program(model, server.tools().await.expect("lists"));
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("mcp-calls", ask("go")))
        .await
        .expect("starts");
    let output: InteractionOutput = handle.output().await.expect("completes");
    assert_eq!(output.response.message().text(), "hello|!failed: no disk|5");
    let view = engine
        .inspect(&scope(), handle.tree(), Visibility::Public)
        .await
        .expect("inspects");
    let fail = view
        .processes
        .iter()
        .find(|p| p.program.as_str() == "mcp.t_fail")
        .expect("the fail call ran");
    assert_eq!(
        fail.status,
        Status::Completed,
        "an isError result is no failure"
    );
    let add = view
        .processes
        .iter()
        .find(|p| p.program.as_str() == "mcp.t_add")
        .expect("the add call ran");
    let reply: ToolReply = add
        .termination
        .as_ref()
        .and_then(|t| t.output())
        .expect("an output")
        .decode()
        .expect("a reply");
    assert_eq!(
        reply.structured.map(|s| s.to_value()),
        Some(serde_json::json!({"sum": 5})),
        "structured content is kept"
    );
    server.close().await;
}

#[tokio::test]
async fn a_server_crashing_mid_call_parks_a_never_call_and_the_next_call_restarts_it() {
    let dir = scratch("crash");
    let server = McpServer::connect(stdio_server("t", &dir.join("counter")))
        .await
        .expect("connects");
    let model = caller(vec![
        vec![call("c1", "t_crash", "{}")],
        vec![call("c2", "t_echo", r#"{"text":"back"}"#)],
    ]);
    let program = program(model, server.tools().await.expect("lists"));
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("mcp-crash", ask("go")))
        .await
        .expect("starts");
    let view = wait_for(&engine, handle.tree(), |view| {
        view.processes.iter().any(|p| p.status == Status::Parked)
    })
    .await;
    let parked = view
        .processes
        .iter()
        .find(|p| p.status == Status::Parked)
        .expect("parked");
    assert_eq!(parked.program.as_str(), "mcp.t_crash");
    assert_eq!(
        parked.unknown_effects.len(),
        1,
        "the uncertain call is an unknown effect"
    );
    assert_eq!(server.sessions_started(), 1, "nothing was sent again");
    let resolution = ToolReply {
        text: "the server crashed; nothing to report".into(),
        is_error: true,
        structured: None,
    };
    engine
        .resolve_unknown(
            &scope(),
            handle.tree(),
            parked.unknown_effects[0],
            Settlement::ok(Payload::encode(&resolution).expect("encodes")),
        )
        .await
        .expect("resolves");
    let output: InteractionOutput = handle.output().await.expect("completes");
    assert_eq!(
        output.response.message().text(),
        "!the server crashed; nothing to report|back"
    );
    assert_eq!(server.sessions_started(), 2, "the server was started again");
    server.close().await;
}

#[tokio::test]
async fn a_same_identity_call_lost_in_a_server_crash_is_sent_again_with_the_same_key() {
    let dir = scratch("replay");
    let counter = dir.join("counter");
    let mut config = stdio_server("t", &counter);
    config.tools.insert(
        "count".into(),
        McpToolOptions {
            replay: Some(ReplayPolicy::SameIdentity),
            ..McpToolOptions::default()
        },
    );
    let server = McpServer::connect(config).await.expect("connects");
    let model = caller(vec![vec![call("c1", "t_count", r#"{"crash_first":true}"#)]]);
    let program = program(model, server.tools().await.expect("lists"));
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let output: InteractionOutput = engine
        .start(&program, start("mcp-replay", ask("go")))
        .await
        .expect("starts")
        .output()
        .await
        .expect("completes");
    assert_eq!(output.response.message().text(), "count 2");
    let keys: Vec<String> = std::fs::read_to_string(&counter)
        .expect("the counter file")
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        keys.len(),
        2,
        "received twice: before the crash and once after"
    );
    assert_eq!(keys[0], keys[1], "with the same idempotency key");
    assert_ne!(keys[0], "none", "the key was sent");
    assert_eq!(server.sessions_started(), 2);
    server.close().await;
}

#[tokio::test]
async fn a_call_past_its_timeout_fails_and_the_model_reads_why() {
    let dir = scratch("timeout");
    let mut config = stdio_server("t", &dir.join("counter"));
    config.tools.insert(
        "slow".into(),
        McpToolOptions {
            timeout: Some(Duration::from_millis(300)),
            retry: Some(RetryPolicy::none()),
            ..McpToolOptions::default()
        },
    );
    let server = McpServer::connect(config).await.expect("connects");
    let model = caller(vec![vec![call("c1", "t_slow", r#"{"millis":30000}"#)]]);
    let program = program(model, server.tools().await.expect("lists"));
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let output: InteractionOutput = engine
        .start(&program, start("mcp-timeout", ask("go")))
        .await
        .expect("starts")
        .output()
        .await
        .expect("completes");
    let text = output.response.message().text();
    assert!(
        text.starts_with('!') && text.contains("mcp.call.timed_out"),
        "{text}"
    );
    server.close().await;
}

#[tokio::test]
async fn a_destructive_tool_runs_only_after_approval() {
    let dir = scratch("approval");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "precious").expect("writes");
    let server = McpServer::connect(stdio_server("t", &dir.join("counter")))
        .await
        .expect("connects");
    let arguments = serde_json::json!({"path": victim.display().to_string()}).to_string();
    let model = caller(vec![vec![call("c1", "t_delete_file", &arguments)]]);
    let program = program(model, server.tools().await.expect("lists"));
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("mcp-approval", ask("go")))
        .await
        .expect("starts");
    let view = wait_for(&engine, handle.tree(), |view| {
        view.processes.iter().any(|p| !p.open_waits.is_empty())
    })
    .await;
    assert!(victim.exists(), "nothing runs before approval");
    let waiting = view
        .processes
        .iter()
        .find(|p| !p.open_waits.is_empty())
        .expect("a wait");
    handle
        .child::<ToolReply>(waiting.key.as_ref().expect("a child"))
        .signal(SignalRequest {
            id: SignalId::new("approve-delete").expect("valid"),
            wait: Some(waiting.open_waits[0].id),
            payload: Payload::encode(&Verdict::Approve).expect("encodes"),
        })
        .await
        .expect("admitted");
    let output: InteractionOutput = handle.output().await.expect("completes");
    assert!(output.response.message().text().starts_with("deleted"));
    assert!(!victim.exists(), "the approved call ran");
    server.close().await;
}

#[tokio::test]
async fn the_test_server_over_streamable_http_lists_and_answers() {
    let (mut child, url) = http_server().await;
    let mut transport = HttpTransport::new(url);
    transport.bearer = Some(Secret::new("token-not-logged"));
    let server = McpServer::connect(McpServerConfig::new("h", McpTransport::Http(transport)))
        .await
        .expect("connects");
    let tools = server.tools().await.expect("lists");
    assert!(tools.iter().any(|tool| tool.name() == "h_echo"));
    let model = caller(vec![vec![
        call("c1", "h_echo", r#"{"text":"over http"}"#),
        call("c2", "h_fail", r#"{"reason":"nope"}"#),
    ]]);
    let program = program(model, tools);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let output: InteractionOutput = engine
        .start(&program, start("mcp-http", ask("go")))
        .await
        .expect("starts")
        .output()
        .await
        .expect("completes");
    assert_eq!(output.response.message().text(), "over http|!failed: nope");
    child.kill().await.expect("stops");
}

#[tokio::test]
async fn the_reference_server_everything_answers_over_stdio() {
    let server = McpServer::connect(everything_server())
        .await
        .expect("connects");
    let tools = server
        .tools()
        .await
        .expect("every listed tool becomes a Baton tool");
    assert!(
        tools.iter().any(|tool| tool.name() == "ev_echo"),
        "{:?}",
        tools.iter().map(Tool::name).collect::<Vec<_>>()
    );
    assert!(tools.iter().any(|tool| tool.name() == "ev_get-sum"));
    let model = caller(vec![vec![
        call("c1", "ev_echo", r#"{"message":"hi"}"#),
        call("c2", "ev_get-sum", r#"{"a":20,"b":22}"#),
    ]]);
    let program = program(model, tools);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let output: InteractionOutput = engine
        .start(&program, start("mcp-everything", ask("go")))
        .await
        .expect("starts")
        .output()
        .await
        .expect("completes");
    let text = output.response.message().text();
    assert!(
        text.starts_with("Echo: hi|") && text.contains("42"),
        "{text}"
    );
    server.close().await;
}

#[tokio::test]
async fn one_conversation_uses_two_servers_and_each_call_is_charged() {
    let dir = scratch("two");
    let ours = McpServer::connect(stdio_server("t", &dir.join("counter")))
        .await
        .expect("connects");
    let mut reference = everything_server();
    reference.allow = Some(BTreeSet::from(["echo".into()]));
    let reference = McpServer::connect(reference).await.expect("connects");
    let mut tools = ours.tools().await.expect("lists");
    tools.extend(reference.tools().await.expect("lists"));
    let model = caller(vec![
        vec![call("c1", "t_add", r#"{"a":1,"b":2}"#)],
        vec![call("c2", "ev_echo", r#"{"message":"three"}"#)],
        vec![call("c3", "t_echo", r#"{"text":"over budget"}"#)],
    ]);
    let program = program(model, tools);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let mut request = start("mcp-two", ask("go"));
    let calls = Name::new(MCP_CALLS).expect("valid");
    request.budget = Budget::unlimited().with_meter(calls.clone(), 2);
    let handle = engine.start(&program, request).await.expect("starts");
    let output: InteractionOutput = handle.output().await.expect("completes");
    let text = output.response.message().text();
    let parts: Vec<&str> = text.split('|').collect();
    assert_eq!(parts[..2], ["3", "Echo: three"], "{text}");
    assert!(
        parts[2].starts_with('!') && parts[2].contains("engine.limit.meter"),
        "a third call is over the budget of two: {text}"
    );
    let view = engine
        .inspect(&scope(), handle.tree(), Visibility::Public)
        .await
        .expect("inspects");
    let usage = view.usage();
    let charged = |program: &str| {
        usage
            .programs
            .get(&Name::new(program).expect("valid"))
            .map(|used| used.usage.meters.get(&calls).copied().unwrap_or(0))
    };
    assert_eq!(charged("mcp.t_add"), Some(1));
    assert_eq!(charged("mcp.ev_echo"), Some(1));
    assert_eq!(usage.total.meters.get(&calls).copied(), Some(2));
    ours.close().await;
    reference.close().await;
}

#[tokio::test]
async fn a_call_that_cannot_be_sent_fails_definitely_and_never_parks() {
    let dir = scratch("unavailable");
    // The server runs through a link the test removes once the tools are
    // listed, so no session can start again.
    let link = dir.join("server");
    std::os::unix::fs::symlink(TEST_SERVER, &link).expect("links");
    let mut transport = StdioTransport::new(link.display().to_string(), ["stdio"]);
    transport.env.insert(
        "MCP_TEST_COUNTER".into(),
        Secret::new(dir.join("counter").display().to_string()),
    );
    let mut config = McpServerConfig::new("t", McpTransport::Stdio(transport));
    config.retry =
        RetryPolicy::exponential(2, Duration::from_millis(10), Duration::from_millis(10));
    let server = McpServer::connect(config).await.expect("connects");
    let tools = server.tools().await.expect("lists");
    server.close().await;
    std::fs::remove_file(&link).expect("unlinks");
    let model = caller(vec![vec![call("c1", "t_count", "{}")]]);
    let program = program(model, tools);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("mcp-unavailable", ask("go")))
        .await
        .expect("starts");
    let output: InteractionOutput = handle.output().await.expect("completes");
    let text = output.response.message().text();
    assert!(
        text.starts_with('!') && text.contains("mcp.server.unavailable"),
        "{text}"
    );
    let view = engine
        .inspect(&scope(), handle.tree(), Visibility::Public)
        .await
        .expect("inspects");
    let count = view
        .processes
        .iter()
        .find(|p| p.program.as_str() == "mcp.t_count")
        .expect("the call's process");
    assert_eq!(
        count.status,
        Status::Failed,
        "a definite failure is no unknown effect"
    );
    assert!(
        !dir.join("counter").exists(),
        "the server never saw the call"
    );
}
