//! Watching a run: an agent with a `count_files` tool that reports its
//! progress folder by folder, followed live through `Engine::watch` and printed as the agent
//! stream view (`agent_start`, `token`, tool calls, `agent_end`, one
//! `complete`), with what the agent was doing at each progress report.
//! See the guide `docs/guides/watching-a-run.md`.
//!
//! Run it with `cargo run -p baton-examples --example watching` (offline:
//! the model is a `ScriptedModel`).

use std::error::Error;
use std::sync::Arc;

use baton::agent::{
    AgentEvent, AgentStream, Interaction, InteractionConfig, InteractionInput, Message, Part,
    Request, Response, ScriptedModel, Tool, ToolCall, ToolConfig, ToolContext, ToolError,
};
use baton::run::{
    Engine, EngineConfig, MemoryStore, Progress, Scope, StartId, StartRequest, WatchKind,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The tool's arguments.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
struct CountArgs {
    /// The directory to count, relative to this crate.
    dir: String,
}

/// Counts the files under a directory of this crate, folder by folder,
/// reporting how far it got after each.
fn count_files() -> Result<Tool, Box<dyn Error>> {
    let tool = Tool::function(
        ToolConfig::new("count_files", "Counts the files under a directory."),
        |args: CountArgs, context: ToolContext| async move {
            let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(&args.dir);
            let (mut folders, mut files, mut seen) = (vec![root], 0u64, 0u64);
            while let Some(folder) = folders.pop() {
                let mut entries = tokio::fs::read_dir(&folder)
                    .await
                    .map_err(|error| ToolError::new(format!("{}: {error}", folder.display())))?;
                while let Some(entry) = entries
                    .next_entry()
                    .await
                    .map_err(|error| ToolError::new(error.to_string()))?
                {
                    match entry.file_type().await {
                        Ok(kind) if kind.is_dir() => folders.push(entry.path()),
                        Ok(_) => files += 1,
                        Err(error) => return Err(ToolError::new(error.to_string())),
                    }
                }
                seen += 1;
                context.progress(
                    Progress::phase("counting")
                        .with_tool("count_files")
                        .with_detail(format!("{seen} folders, {files} files so far")),
                );
            }
            Ok(format!(
                "{} holds {files} files in {seen} folders",
                args.dir
            ))
        },
    )?;
    Ok(tool)
}

/// Asks for the count, then answers with it.
fn model() -> ScriptedModel {
    ScriptedModel::new("counter", |request: &Request| {
        let result = request
            .messages()
            .iter()
            .flat_map(|message| message.parts())
            .find_map(|part| match part {
                Part::ToolResult { result } => Some(result.output.clone()),
                _ => None,
            });
        match result {
            None => Response::calls(vec![ToolCall {
                id: "call-1".into(),
                name: "count_files".into(),
                arguments: r#"{"dir":"."}"#.into(),
            }])
            .map_err(|error| baton::agent::ModelError::Request(error.to_string())),
            Some(result) => Ok(Response::text(format!("The count is in: {result}."))),
        }
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut config = InteractionConfig::new(
        "example.counter",
        "Counts files with a tool.",
        Arc::new(model()),
        100,
        4,
    );
    config.tools = vec![count_files()?];
    let program = Interaction::new(config)?.program();
    let engine = Engine::new(EngineConfig {
        programs: vec![program.erase()],
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })?;
    let input = InteractionInput::new(vec![Message::user("How many files does this crate have?")]);
    let handle = engine
        .start(
            &program,
            StartRequest::new(StartId::new("acme", "count-1")?, input),
        )
        .await?;

    let scope = Scope::new("acme")?;
    let mut watch = engine.watch(&scope, handle.tree(), 1).await?;
    let mut view = AgentStream::new();
    while let Some(event) = watch.next().await {
        let event = event?;
        if let WatchKind::Progress { progress } = &event.kind {
            let progress = &progress.progress;
            println!(
                "  … {}{}",
                progress.phase,
                progress
                    .detail
                    .as_ref()
                    .map_or(String::new(), |detail| format!(": {detail}"))
            );
        }
        for agent_event in view.push(&event) {
            if let AgentEvent::Token { text, .. } = &agent_event {
                println!("  token {text:?}");
            } else {
                println!("{}", serde_json::to_string(&agent_event)?);
            }
        }
    }
    engine.close().await;
    Ok(())
}
