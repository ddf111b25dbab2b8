//! The agent stream view and progress of an interaction: a live reader sees
//! the answer's tokens, the tool calls and one completion; a reader after
//! the end sees the same committed view; the agent's usage is the tree's;
//! progress is published while the agent works and shown by `inspect`.

use std::sync::Arc;

use baton_agent::{
    AgentEvent, AgentStream, Interaction, InteractionConfig, InteractionInput, InteractionOutput,
    Request, Response, ScriptedModel, Tool, ToolConfig, ToolContext,
};
use baton_run::{
    Engine, MemoryStore, Program, Progress, TreeId, Visibility, WatchEvent, WatchKind,
};
use baton_workflow::Approval;

use crate::common::*;

/// Asks for two echoes on a fresh conversation, then answers with what
/// they said.
fn echoing_model() -> ScriptedModel {
    ScriptedModel::new("echoer", |request: &Request| {
        let results = tool_results(request);
        if results.is_empty() {
            Ok(Response::calls(vec![
                call("c1", "echo", r#"{"text":"one"}"#),
                call("c2", "echo", r#"{"text":"two"}"#),
            ])
            .expect("valid"))
        } else {
            Ok(Response::text(format!(
                "the tools said {}",
                results.join(" and ")
            )))
        }
    })
}

fn echoer(tool: Tool) -> Program<InteractionInput, InteractionOutput> {
    let mut config = InteractionConfig::new(
        "test.echoer",
        "Calls tools and answers.",
        Arc::new(echoing_model()),
        100,
        4,
    );
    config.tools = vec![tool];
    Interaction::new(config).expect("valid").program()
}

/// Every event of a tree's watch from its first record, and their agent
/// stream view.
async fn read(engine: &Engine, tree: TreeId) -> (Vec<WatchEvent>, Vec<AgentEvent>) {
    let mut watch = engine.watch(&scope(), tree, 1).await.expect("watches");
    let mut stream = AgentStream::new();
    let (mut watched, mut agent) = (Vec::new(), Vec::new());
    while let Some(event) = watch.next().await {
        let event = event.expect("reads the log");
        agent.extend(stream.push(&event));
        watched.push(event);
    }
    (watched, agent)
}

#[tokio::test]
async fn a_live_reader_sees_tokens_tool_calls_usage_and_one_completion() {
    let program = echoer(echo_tool());
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("live", ask("echo twice")))
        .await
        .expect("starts");
    let (watched, events) = read(&engine, handle.tree()).await;
    let output: InteractionOutput = handle.output().await.expect("completes");
    let answer = output.response.message().text();
    assert_eq!(answer, "the tools said one and two");

    // Tokens concatenate to the final text.
    let tokens: String = events
        .iter()
        .filter_map(|event| match event {
            AgentEvent::Token { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(tokens, answer);

    // The agent starts first; its two tool calls start and end inside it.
    let AgentEvent::AgentStart { agent } = &events[0] else {
        panic!("the agent starts first: {events:#?}");
    };
    assert_eq!(agent.process, handle.tree());
    assert_eq!(agent.name.as_ref().map(|n| n.as_str()), Some("test.echoer"));
    let calls: Vec<(bool, String)> = events
        .iter()
        .filter_map(|event| match event {
            AgentEvent::ToolCallStart { tool, .. } => {
                Some((true, tool.clone().expect("named").as_str().to_owned()))
            }
            AgentEvent::ToolCallEnd { tool, output, .. } => {
                assert!(output.is_some(), "an echo has an output");
                Some((false, tool.clone().expect("named").as_str().to_owned()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(calls.iter().filter(|(start, _)| *start).count(), 2);
    assert_eq!(calls.iter().filter(|(start, _)| !*start).count(), 2);
    assert!(
        calls.iter().all(|(_, tool)| tool.ends_with("echo")),
        "{calls:?}"
    );

    // The agent's usage (its tool calls included) is the whole tree's.
    let total = engine
        .inspect(&scope(), handle.tree(), Visibility::Public)
        .await
        .expect("inspects")
        .usage()
        .total;
    let ended_usage = events.iter().find_map(|event| match event {
        AgentEvent::AgentEnd { usage, .. } => Some(usage.clone()),
        _ => None,
    });
    assert_eq!(ended_usage, Some(total));

    // Exactly one terminal event, last, with the output.
    assert_eq!(events.iter().filter(|e| e.is_terminal()).count(), 1);
    let Some(AgentEvent::Complete {
        output: Some(completed),
    }) = events.last()
    else {
        panic!("completes last: {events:#?}");
    };
    let completed: InteractionOutput = completed.decode().expect("an interaction output");
    assert_eq!(completed.response.message().text(), answer);

    // Progress went by live: the tools, then the second call (the first
    // call's report was published in the first round, before this reader
    // could subscribe; both tools' results arrived in one step).
    let progress: Vec<Progress> = watched
        .iter()
        .filter_map(|event| match &event.kind {
            WatchKind::Progress { progress } if event.process == Some(handle.tree()) => {
                assert!(!event.durable, "progress is never durable");
                Some(progress.progress.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        progress,
        [
            Progress::phase("running tools")
                .with_iteration(1)
                .with_tool("echo")
                .with_detail("0 of 2 done"),
            Progress::phase("calling the model").with_iteration(2),
        ],
    );
}

#[tokio::test]
async fn a_reader_after_the_end_sees_the_same_view_without_the_live_tokens() {
    let program = echoer(echo_tool());
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("twice", ask("echo twice")))
        .await
        .expect("starts");
    let (_, live) = read(&engine, handle.tree()).await;
    let (_, later) = read(&engine, handle.tree()).await;
    let committed: Vec<AgentEvent> = live
        .into_iter()
        .filter(|event| !matches!(event, AgentEvent::Token { .. }))
        .collect();
    assert_eq!(later, committed);
    assert!(
        later.len() >= 6,
        "start, two calls each way, end, complete: {later:#?}"
    );
}

#[tokio::test]
async fn inspect_shows_what_a_waiting_agent_and_its_tool_are_doing_now() {
    let mut config = ToolConfig::new("echo", "Echoes text, once a person approves.");
    config.approval = Approval::Required;
    let tool = Tool::function(config, |args: EchoArgs, _context: ToolContext| async move {
        Ok(args.text)
    })
    .expect("valid");
    let program = echoer(tool);
    let store = Arc::new(MemoryStore::new());
    let engine = engine(store.clone(), &program);
    let handle = engine
        .start(&program, start("waiting", ask("echo twice")))
        .await
        .expect("starts");
    let view = wait_for(&engine, handle.tree(), |view| {
        view.processes
            .iter()
            .filter(|p| !p.open_waits.is_empty())
            .count()
            == 2
    })
    .await;
    let root = view.root().progress.clone().expect("the agent reports");
    assert_eq!(root.progress.phase, "running tools");
    assert_eq!(root.progress.tool.as_deref(), Some("echo"));
    assert_eq!(root.progress.detail.as_deref(), Some("0 of 2 done"));
    for process in view.processes.iter().filter(|p| p.parent.is_some()) {
        let progress = process.progress.clone().expect("each tool reports");
        assert_eq!(progress.progress.phase, "waiting for approval");
    }
    // Another engine reading the same store shows none: progress is never
    // logged, only kept by the engine that runs the tree.
    let other = super::common::engine(store, &program);
    let stored = other
        .inspect(&scope(), handle.tree(), Visibility::Public)
        .await
        .expect("inspects");
    assert_eq!(stored.processes.len(), view.processes.len());
    assert!(stored.processes.iter().all(|p| p.progress.is_none()));
}
