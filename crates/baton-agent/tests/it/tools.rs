//! Tools made from async functions, inside interactions: object parameters,
//! the default budget under a finite caller, the concurrency limit,
//! approval, panics, and a tool call lost in a crash under each replay
//! policy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use baton_agent::{
    Interaction, InteractionConfig, InteractionConfigError, InteractionOutput, Request, Response,
    ScriptedModel, TOKENS, Tool, ToolCall, ToolConfig, ToolConfigError, ToolContext, ToolError,
};
use baton_run::dispatch::ReplayPolicy;
use baton_run::log::RecordKind;
use baton_run::{
    Budget, MemoryStore, Name, Payload, ProcessView, RecoverOptions, Settlement, SignalId,
    SignalRequest, Status, TreeView, Visibility,
};
use baton_testkit::{Cut, FaultStore};
use baton_workflow::{Approval, ApprovalRequest, Verdict};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::*;

/// A model that asks for `calls` on a fresh conversation and, once it has
/// tool results, answers with their outputs joined by `|`.
fn caller(calls: Vec<ToolCall>) -> ScriptedModel {
    ScriptedModel::new("caller", move |request: &Request| {
        let results = tool_results(request);
        if results.is_empty() {
            Ok(Response::calls(calls.clone()).expect("valid"))
        } else {
            Ok(Response::text(results.join("|")))
        }
    })
}

fn with_tools(model: ScriptedModel, tools: Vec<Tool>) -> InteractionConfig {
    let mut config = InteractionConfig::new("test.tools", "Calls tools.", Arc::new(model), 100, 4);
    config.tools = tools;
    config
}

fn echo(id: &str, text: &str) -> ToolCall {
    call(id, "echo", &format!(r#"{{"text":"{text}"}}"#))
}

#[test]
fn a_tool_whose_arguments_are_not_an_object_is_refused_at_construction() {
    let refused = Tool::function(
        ToolConfig::new("shout", "Shouts."),
        |text: String, _context: ToolContext| async move { Ok(text.to_uppercase()) },
    )
    .expect_err("a string input is not an object schema");
    assert!(
        matches!(refused, ToolConfigError::Parameters { .. }),
        "{refused:?}"
    );
    let program = baton_workflow::Workflow::new(baton_workflow::Config {
        name: "test.shout".into(),
        description: "Shouts.".into(),
        build: "tools tests 1".into(),
        stages: vec![baton_workflow::transform("shout", |text: String| {
            Ok(text.to_uppercase())
        })],
    })
    .expect("valid")
    .program::<String, String>();
    let error = Interaction::new(with_tools(
        caller(Vec::new()),
        vec![Tool::new("shout", "Shouts.", &program)],
    ))
    .expect_err("refused");
    assert!(
        matches!(error, InteractionConfigError::ToolParameters { .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_default_tool_runs_under_the_guides_finite_budget() {
    // The guide's worker and interaction budget, with a token limit as the
    // guide recommends for real providers.
    let budget = Budget::unlimited()
        .with_steps(64)
        .with_effects(32)
        .with_signals(64)
        .with_meter(Name::new(TOKENS).expect("valid"), 50_000);
    let model = caller(vec![echo("c1", "one"), echo("c2", "two")]);
    let program = Interaction::new(with_tools(model, vec![echo_tool()]))
        .expect("valid")
        .program();
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let mut request = start("default-budget", ask("echo"));
    request.budget = budget;
    let handle = engine.start(&program, request).await.expect("starts");
    let output: InteractionOutput = handle.output().await.expect("completes");
    assert_eq!(
        output.response.message().text(),
        "one|two",
        "both tool calls ran"
    );
    let view = engine
        .inspect(&scope(), handle.tree(), Visibility::Public)
        .await
        .expect("inspects");
    let tool = child(&view, "tool-1-0");
    assert_eq!(tool.budget.steps, baton_run::Quota::Finite(8));
    assert_eq!(
        tool.budget.meter(&Name::new(TOKENS).expect("valid")),
        baton_run::Quota::Finite(0),
        "a meter the tool did not ask for is not granted"
    );
}

#[tokio::test]
async fn a_tool_clipped_to_what_the_caller_has_left_runs_and_the_grant_is_debited_for_good() {
    let model = caller(vec![echo("c1", "one")]);
    let program = Interaction::new(with_tools(model, vec![echo_tool()]))
        .expect("valid")
        .program();
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let mut request = start("small-budget", ask("echo"));
    // Two steps go to the model call and the tool's start; six are left.
    request.budget = Budget::unlimited().with_steps(8);
    let handle = engine.start(&program, request).await.expect("starts");
    let termination = handle.await_result().await.expect("terminates");
    handle.join().await.expect("joins");
    let view = engine
        .inspect(&scope(), handle.tree(), Visibility::Public)
        .await
        .expect("inspects");
    let tool = child(&view, "tool-1-0");
    assert_eq!(
        tool.budget.steps,
        baton_run::Quota::Finite(6),
        "clipped, not refused"
    );
    assert_eq!(tool.status, Status::Completed, "the tool ran");
    // The grant leaves the caller nothing for its next step: clipping never
    // refuses a tool, and a caller must keep room for itself.
    assert_eq!(
        termination
            .failure()
            .map(|f| f.code().to_owned())
            .as_deref(),
        Some("engine.limit.steps")
    );
}

/// Counts how many calls of a tool run at once.
#[derive(Default)]
struct Overlap {
    running: AtomicUsize,
    most: AtomicUsize,
    calls: AtomicUsize,
}

#[tokio::test]
async fn at_most_max_concurrent_tool_calls_run_at_once() {
    let overlap = Arc::new(Overlap::default());
    let counted = overlap.clone();
    let tool = Tool::function(
        ToolConfig::new("echo", "Echoes text slowly."),
        move |args: EchoArgs, _context: ToolContext| {
            let overlap = counted.clone();
            async move {
                let now = overlap.running.fetch_add(1, Ordering::SeqCst) + 1;
                overlap.most.fetch_max(now, Ordering::SeqCst);
                overlap.calls.fetch_add(1, Ordering::SeqCst);
                // Stay running long enough for every call that may start
                // to start.
                for _ in 0..200 {
                    tokio::task::yield_now().await;
                }
                overlap.running.fetch_sub(1, Ordering::SeqCst);
                Ok(args.text)
            }
        },
    )
    .expect("valid");
    let calls = (0..5)
        .map(|i| echo(&format!("c{i}"), &i.to_string()))
        .collect();
    let mut config = with_tools(caller(calls), vec![tool]);
    config.max_concurrent_tool_calls = 2;
    let program = Interaction::new(config).expect("valid").program();
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("concurrency", ask("five")))
        .await
        .expect("starts");
    let output: InteractionOutput = handle.output().await.expect("completes");
    assert_eq!(
        output.response.message().text(),
        "0|1|2|3|4",
        "results in call order"
    );
    assert_eq!(overlap.calls.load(Ordering::SeqCst), 5);
    assert_eq!(
        overlap.most.load(Ordering::SeqCst),
        2,
        "never more than two running, and two did run together"
    );
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
}

#[tokio::test]
async fn an_approval_gated_tool_runs_only_after_approval_and_a_denial_reaches_the_model() {
    let written = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = written.clone();
    let mut config = ToolConfig::new("write", "Writes a file.");
    config.approval = Approval::Required;
    let tool = Tool::function(config, move |args: WriteArgs, _context: ToolContext| {
        let log = log.clone();
        async move {
            log.lock().expect("not poisoned").push(args.path.clone());
            Ok(format!("wrote {}", args.path))
        }
    })
    .expect("valid");
    let model = caller(vec![
        call("c1", "write", r#"{"path":"a.txt"}"#),
        call("c2", "write", r#"{"path":"b.txt"}"#),
    ]);
    let recorder = model.clone();
    let program = Interaction::new(with_tools(model, vec![tool]))
        .expect("valid")
        .program();
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("approval", ask("write two files")))
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
    assert!(
        written.lock().expect("not poisoned").is_empty(),
        "nothing runs before approval"
    );
    let private = engine
        .inspect(&scope(), handle.tree(), Visibility::Private)
        .await
        .expect("inspects");
    for (key, verdict) in [
        ("tool-1-0", Verdict::Approve),
        (
            "tool-1-1",
            Verdict::Deny {
                reason: "b.txt is not ours to touch".into(),
            },
        ),
    ] {
        let wait = &child(&private, key).open_waits[0];
        let shown: ApprovalRequest = wait
            .request
            .as_ref()
            .expect("private")
            .decode()
            .expect("an approval request");
        assert_eq!(shown.activity.as_str(), "tool.write");
        assert!(shown.input.as_str().contains(".txt"), "{}", shown.input);
        handle
            .child::<String>(&baton_run::ChildKey::new(key).expect("valid"))
            .signal(SignalRequest {
                id: SignalId::new(format!("verdict-{key}")).expect("valid"),
                wait: Some(wait.id),
                payload: Payload::encode(&verdict).expect("encodes"),
            })
            .await
            .expect("admitted");
    }
    let output: InteractionOutput = handle.output().await.expect("completes");
    assert_eq!(*written.lock().expect("not poisoned"), ["a.txt"]);
    let text = output.response.message().text();
    assert!(text.starts_with("wrote a.txt|"), "{text}");
    assert!(
        text.contains("a person denied the call") && text.contains("b.txt is not ours to touch"),
        "{text}"
    );
    assert_eq!(view.processes.len(), 3);
    let second = &recorder.requests()[1];
    let results: Vec<bool> = second
        .messages()
        .last()
        .expect("messages")
        .parts()
        .iter()
        .filter_map(|part| match part {
            baton_agent::Part::ToolResult { result } => Some(result.is_error),
            _ => None,
        })
        .collect();
    assert_eq!(results, [false, true], "the denial is an error result");
}

#[tokio::test]
async fn a_panicking_tool_becomes_an_error_result_the_model_reads() {
    let tool = Tool::function(
        ToolConfig::new("echo", "Panics."),
        |args: EchoArgs, _context: ToolContext| async move { explode(args) },
    )
    .expect("valid");
    let program = Interaction::new(with_tools(caller(vec![echo("c1", "x")]), vec![tool]))
        .expect("valid")
        .program();
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let output: InteractionOutput = engine
        .start(&program, start("panics", ask("x")))
        .await
        .expect("starts")
        .output()
        .await
        .expect("completes");
    let text = output.response.message().text();
    assert!(
        text.contains("workflow.activity.panicked") && text.contains("the tool broke"),
        "{text}"
    );
}

fn explode(args: EchoArgs) -> Result<String, ToolError> {
    if !args.text.is_empty() {
        panic!("the tool broke");
    }
    Ok(args.text)
}

/// A tool function recording the idempotency key of every call.
fn recording(replay: ReplayPolicy, keys: &Arc<Mutex<Vec<String>>>) -> Tool {
    let keys = keys.clone();
    let mut config = ToolConfig::new("echo", "Echoes, recording each call.");
    config.replay = replay;
    Tool::function(config, move |args: EchoArgs, context: ToolContext| {
        let keys = keys.clone();
        async move {
            keys.lock()
                .expect("not poisoned")
                .push(context.idempotency_key().to_string());
            Ok(args.text)
        }
    })
    .expect("valid")
}

#[tokio::test]
async fn a_never_tool_call_lost_in_a_crash_is_an_unknown_effect_the_host_resolves() {
    let keys = Arc::new(Mutex::new(Vec::new()));
    let program = Interaction::new(with_tools(
        caller(vec![echo("c1", "x")]),
        vec![recording(ReplayPolicy::Never, &keys)],
    ))
    .expect("valid")
    .program();
    let faulty = FaultStore::new(Arc::new(MemoryStore::keeping_history()));
    // The first pending dispatch is the model call, the second the tool's.
    faulty.arm(RecordKind::EffectPending, Cut::After, 2);
    let first = engine(Arc::new(faulty.clone()), &program);
    let handle = first
        .start(&program, start("never-crash", ask("x")))
        .await
        .expect("starts");
    assert!(handle.await_result().await.is_err(), "the writer stopped");
    assert!(faulty.crashed());
    let tree = handle.tree();
    drop(first);

    let second = engine(faulty.inner(), &program);
    second
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    let view = wait_for(&second, tree, |view| {
        view.processes.iter().any(|p| p.status == Status::Parked)
    })
    .await;
    let parked = view
        .processes
        .iter()
        .find(|p| p.status == Status::Parked)
        .expect("the tool parked");
    assert!(keys.lock().expect("not poisoned").is_empty(), "never sent");
    second
        .resolve_unknown(
            &scope(),
            tree,
            parked.unknown_effects[0],
            Settlement::ok(Payload::encode(&"resolved by the host").expect("encodes")),
        )
        .await
        .expect("resolves");
    let output: InteractionOutput = second
        .process::<InteractionOutput>(&scope(), tree)
        .await
        .expect("attached")
        .output()
        .await
        .expect("completes");
    assert_eq!(output.response.message().text(), "resolved by the host");
    assert!(keys.lock().expect("not poisoned").is_empty());
}

#[tokio::test]
async fn a_same_identity_tool_call_lost_in_a_crash_is_sent_again_with_the_same_key() {
    let keys = Arc::new(Mutex::new(Vec::new()));
    let program = Interaction::new(with_tools(
        caller(vec![echo("c1", "x")]),
        vec![recording(ReplayPolicy::SameIdentity, &keys)],
    ))
    .expect("valid")
    .program();
    let faulty = FaultStore::new(Arc::new(MemoryStore::keeping_history()));
    // The tool ran; the commit of its settlement (the second) is lost.
    faulty.arm(RecordKind::EffectSettled, Cut::Before, 2);
    let first = engine(Arc::new(faulty.clone()), &program);
    let handle = first
        .start(&program, start("same-crash", ask("x")))
        .await
        .expect("starts");
    assert!(handle.await_result().await.is_err(), "the writer stopped");
    let tree = handle.tree();
    drop(first);
    assert_eq!(keys.lock().expect("not poisoned").len(), 1, "the call ran");

    let second = engine(faulty.inner(), &program);
    second
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    let output: InteractionOutput = second
        .process::<InteractionOutput>(&scope(), tree)
        .await
        .expect("attached")
        .output()
        .await
        .expect("completes");
    assert_eq!(output.response.message().text(), "x");
    let keys = keys.lock().expect("not poisoned").clone();
    assert_eq!(keys.len(), 2, "sent again after the crash");
    assert_eq!(keys[0], keys[1], "with the same idempotency key");
}

fn child<'a>(view: &'a TreeView, key: &str) -> &'a ProcessView {
    view.processes
        .iter()
        .find(|p| p.key.as_ref().is_some_and(|k| k.as_str() == key))
        .unwrap_or_else(|| panic!("no child {key}"))
}
