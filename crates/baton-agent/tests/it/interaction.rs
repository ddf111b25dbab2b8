//! Interaction acceptance tests on scripted models: tools, limits, budgets,
//! steering, crash recovery, deltas and bad input.

use std::sync::Arc;

use crate::common::*;
use baton_agent::{
    FinishReason, InteractionConfig, InteractionOutput, Message, Part, Response, Role,
    ScriptedModel, Steering, ToolResult, Usage,
};
use baton_run::dispatch::RetryPolicy;
use baton_run::log::RecordKind;
use baton_run::{
    Budget, EventKind, FailureKind, MemoryStore, Name, Payload, RecoverOptions, Settlement,
    SignalId, SignalReceipt, SignalRequest, StartError, Status, Visibility,
};
use baton_testkit::{Cut, FaultStore};

fn results(message: &Message) -> Vec<&ToolResult> {
    message
        .parts()
        .iter()
        .filter_map(|part| match part {
            Part::ToolResult { result } => Some(result),
            _ => None,
        })
        .collect()
}

/// A model that calls `add` once, then reports the tool's answer.
fn adder() -> ScriptedModel {
    ScriptedModel::new("adder", |request| {
        let last = last(request);
        if last.role() == Role::Tool {
            let result = results(last)[0];
            return Ok(Response::text(format!(
                "the sum is {} (error: {})",
                result.output, result.is_error
            )));
        }
        Ok(Response::calls(vec![call("c1", "add", r#"{"a":2,"b":3}"#)]).expect("valid"))
    })
}

#[tokio::test]
async fn two_round_tool_use_completes_with_the_tools_answer() {
    let model = adder();
    let program = interaction(Arc::new(model.clone()), 4);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("two-round", ask("what is 2 + 3?")))
        .await
        .expect("starts");
    let output: InteractionOutput = handle.output().await.expect("completes");
    assert_eq!(
        output.response.message().text(),
        "the sum is 5 (error: false)"
    );
    assert_eq!(output.model_calls, 2);
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].messages()[0].role(), Role::System);
    assert_eq!(requests[0].tools()[0].name, "add");
    // The second request carries the assistant's call and the tool's result.
    let second = requests[1].messages();
    assert_eq!(second[second.len() - 2].calls()[0].id, "c1");
    assert_eq!(results(&second[second.len() - 1])[0].id, "c1");
    let view = engine
        .inspect(&scope(), handle.tree(), Visibility::Public)
        .await
        .expect("inspects");
    assert_eq!(view.processes.len(), 2, "the tool ran as a child");
    assert_eq!(
        view.processes[1].key.as_ref().map(|k| k.as_str()),
        Some("tool-1-0")
    );
}

#[tokio::test]
async fn an_unknown_tool_becomes_an_error_result_the_model_sees() {
    let model = ScriptedModel::new("unknown", |request| {
        let last = last(request);
        if last.role() == Role::Tool {
            let result = results(last)[0];
            assert!(result.is_error);
            assert!(
                result.output.contains("unknown tool \"nope\""),
                "{}",
                result.output
            );
            return Ok(Response::text("sorry, no such tool"));
        }
        Ok(Response::calls(vec![call("c1", "nope", "{}")]).expect("valid"))
    });
    let program = interaction(Arc::new(model.clone()), 4);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("unknown-tool", ask("use a tool")))
        .await
        .expect("starts");
    let output: InteractionOutput = handle.output().await.expect("completes");
    assert_eq!(output.response.message().text(), "sorry, no such tool");
    let view = engine
        .inspect(&scope(), handle.tree(), Visibility::Public)
        .await
        .expect("inspects");
    assert_eq!(view.processes.len(), 1, "no child ran for an unknown tool");
}

#[tokio::test]
async fn invalid_tool_arguments_are_checked_against_the_tools_schema() {
    let model = ScriptedModel::new("bad-args", |request| {
        let last = last(request);
        if last.role() == Role::Tool {
            let outputs: Vec<String> = results(last)
                .iter()
                .map(|r| format!("{}:{}", r.is_error, r.output))
                .collect();
            return Ok(Response::text(outputs.join("|")));
        }
        Ok(Response::calls(vec![
            call("c1", "add", "{not json"),
            call("c2", "add", r#"{"a":"two","b":3}"#),
            call("c3", "add", r#"{"a":1,"b":3}"#),
        ])
        .expect("valid"))
    });
    let program = interaction(Arc::new(model), 4);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("bad-args", ask("add")))
        .await
        .expect("starts");
    let output: InteractionOutput = handle.output().await.expect("completes");
    let text = output.response.message().text();
    let parts: Vec<&str> = text.split('|').collect();
    assert!(
        parts[0].starts_with("true:invalid arguments: the arguments are not JSON"),
        "{text}"
    );
    assert!(
        parts[1].starts_with("true:invalid arguments: the arguments break the tool's input schema"),
        "{text}"
    );
    assert_eq!(parts[2], "false:4");
}

#[tokio::test]
async fn max_model_calls_stops_with_its_code() {
    let model = ScriptedModel::new("looper", |_| {
        Ok(Response::calls(vec![call("c", "add", r#"{"a":1,"b":1}"#)]).expect("valid"))
    });
    let program = interaction(Arc::new(model.clone()), 3);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("limit", ask("loop")))
        .await
        .expect("starts");
    let termination = handle.await_result().await.expect("terminates");
    assert_eq!(termination.status(), Status::Failed);
    let failure = termination.failure().expect("failure");
    assert_eq!(failure.code(), "interaction.limit.model_calls");
    assert_eq!(failure.kind, FailureKind::Execution);
    assert_eq!(model.calls(), 3);
}

#[tokio::test]
async fn a_token_budget_below_max_tokens_refuses_the_call_before_the_model_runs() {
    let model = adder();
    let program = interaction(Arc::new(model.clone()), 4);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let mut request = start("tokens", ask("2 + 3"));
    request.budget = Budget::unlimited().with_meter(Name::new("tokens").expect("valid"), 50);
    let handle = engine.start(&program, request).await.expect("starts");
    let termination = handle.await_result().await.expect("terminates");
    assert_eq!(termination.status(), Status::Failed);
    assert_eq!(
        termination.failure().expect("failure").code(),
        "engine.limit.meter"
    );
    assert_eq!(model.calls(), 0, "the model was never invoked");
}

#[tokio::test]
async fn input_and_output_tokens_are_charged_to_their_meters_and_their_sum() {
    let model = ScriptedModel::new("counted", |_| {
        Ok(Response::text("ok").with_usage(Usage {
            input_tokens: 40,
            output_tokens: 7,
            ..Usage::default()
        }))
    });
    let program = interaction(Arc::new(model), 4);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let mut request = start("charged", ask("hi"));
    request.budget = Budget::unlimited().with_meter(Name::new("tokens").expect("valid"), 10_000);
    let handle = engine.start(&program, request).await.expect("starts");
    handle.join().await.expect("joins");
    let view = engine
        .inspect(&scope(), handle.tree(), Visibility::Public)
        .await
        .expect("inspects");
    let meter = |name: &str| {
        view.root()
            .usage
            .meters
            .get(&Name::new(name).expect("valid"))
            .copied()
    };
    assert_eq!(meter(baton_agent::TOKENS_IN), Some(40));
    assert_eq!(meter(baton_agent::TOKENS_OUT), Some(7));
    assert_eq!(meter(baton_agent::TOKENS), Some(47));
    assert_eq!(
        meter(baton_agent::COST_MICROS),
        None,
        "an unpriced model has no cost"
    );
}

#[tokio::test]
async fn a_response_without_usage_is_charged_its_whole_reservation() {
    let model = ScriptedModel::new("silent", |_| Ok(Response::text("ok").without_usage()));
    let program = interaction(Arc::new(model), 4);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("unmetered", ask("hi")))
        .await
        .expect("starts");
    let output = handle.output().await.expect("completes");
    assert_eq!(
        output.response.usage(),
        None,
        "the usage is visibly unknown"
    );
    let view = engine
        .inspect(&scope(), handle.tree(), Visibility::Public)
        .await
        .expect("inspects");
    let meter = |name: &str| {
        view.root()
            .usage
            .meters
            .get(&Name::new(name).expect("valid"))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(meter(baton_agent::TOKENS_OUT), 100, "max_tokens, not 0");
    assert!(meter(baton_agent::TOKENS_IN) > 0, "the input bound, not 0");
    assert_eq!(
        meter(baton_agent::TOKENS),
        meter(baton_agent::TOKENS_IN) + meter(baton_agent::TOKENS_OUT)
    );
}

#[tokio::test]
async fn steering_sent_during_a_call_reaches_the_next_call_only() {
    let (model, mut requests, release) = GatedModel::new(|request| {
        if request
            .messages()
            .iter()
            .any(|m| m.text() == "focus on tests")
        {
            Response::text("steered answer")
        } else {
            Response::text("first answer")
        }
    });
    let program = interaction(Arc::new(model), 4);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("steer", ask("review the change")))
        .await
        .expect("starts");
    let first = next_request(&mut requests).await;
    // The first call is in flight: steer now.
    let receipt = handle
        .signal(SignalRequest {
            id: SignalId::new("steer-1").expect("valid"),
            wait: None,
            payload: Payload::encode(&Steering {
                messages: vec!["focus on tests".into()],
            })
            .expect("encodes"),
        })
        .await
        .expect("admitted");
    assert_eq!(receipt, SignalReceipt::Admitted);
    release.add_permits(1);
    let second = next_request(&mut requests).await;
    release.add_permits(1);
    let output: InteractionOutput = handle.output().await.expect("completes");
    assert!(
        first
            .messages()
            .iter()
            .all(|m| m.text() != "focus on tests"),
        "the in-flight call was not changed"
    );
    let texts: Vec<String> = second.messages().iter().map(Message::text).collect();
    assert_eq!(
        &texts[texts.len() - 2..],
        ["first answer", "focus on tests"],
        "the answer in flight is kept and the steering follows it"
    );
    assert_eq!(output.response.message().text(), "steered answer");
    assert_eq!(output.model_calls, 2);
}

#[tokio::test]
async fn steering_must_match_the_signal_schema() {
    let (model, mut requests, release) = GatedModel::new(|_| Response::text("done"));
    let program = interaction(Arc::new(model), 4);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("steer-bad", ask("hi")))
        .await
        .expect("starts");
    next_request(&mut requests).await;
    let refused = handle
        .signal(SignalRequest {
            id: SignalId::new("bad").expect("valid"),
            wait: None,
            payload: Payload::encode(&serde_json::json!({"messages": []})).expect("encodes"),
        })
        .await
        .expect_err("rejected");
    assert_eq!(refused.code(), "engine.signal.rejected");
    release.add_permits(1);
    assert_eq!(
        handle.await_result().await.expect("terminates").status(),
        Status::Completed
    );
}

#[tokio::test]
async fn a_completion_validator_sends_feedback_for_another_call() {
    let model = ScriptedModel::script(
        "validated",
        [Ok(Response::text("draft")), Ok(Response::text("final"))],
    );
    let mut config = InteractionConfig::new(
        "test.validated",
        "Answers until the validator accepts.",
        Arc::new(model.clone()),
        100,
        3,
    );
    config.validator = Some(Arc::new(|response: &Response| {
        if response.message().text() == "final" {
            Ok(())
        } else {
            Err("not final yet".to_owned())
        }
    }));
    let program = baton_agent::Interaction::new(config)
        .expect("valid")
        .program();
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let output: InteractionOutput = engine
        .start(&program, start("validated", ask("go")))
        .await
        .expect("starts")
        .output()
        .await
        .expect("completes");
    assert_eq!(output.response.message().text(), "final");
    assert_eq!(last(&model.requests()[1]).text(), "not final yet");
}

#[tokio::test]
async fn a_length_cut_tool_call_is_asked_again_without_running() {
    let model = ScriptedModel::new("cut", |request| {
        let last = last(request);
        if last.role() == Role::Tool {
            let result = results(last)[0];
            return Ok(Response::text(format!(
                "{}:{}",
                result.is_error, result.output
            )));
        }
        let message =
            Message::tool_calls(None, vec![call("c1", "add", r#"{"a":1"#)]).expect("valid");
        Ok(Response::new(message, FinishReason::Length, Some(Usage::default())).expect("valid"))
    });
    let program = interaction(Arc::new(model), 4);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("length", ask("add")))
        .await
        .expect("starts");
    let output: InteractionOutput = handle.output().await.expect("completes");
    assert!(
        output
            .response
            .message()
            .text()
            .starts_with("true:the call was cut off by the token limit"),
        "{}",
        output.response.message().text()
    );
    let view = engine
        .inspect(&scope(), handle.tree(), Visibility::Public)
        .await
        .expect("inspects");
    assert_eq!(view.processes.len(), 1, "the cut call never ran");
}

#[tokio::test]
async fn a_crash_after_the_pending_commit_leaves_an_unknown_call_that_resolves() {
    let model = adder();
    let program = interaction(Arc::new(model.clone()), 4);
    let memory = MemoryStore::keeping_history();
    let faulty = FaultStore::new(Arc::new(memory.clone()));
    faulty.arm(RecordKind::EffectPending, Cut::After, 1);
    let first = engine(Arc::new(faulty.clone()), &program);
    let handle = first
        .start(&program, start("crash", ask("2 + 3")))
        .await
        .expect("starts");
    assert!(handle.await_result().await.is_err(), "the writer stopped");
    assert!(faulty.crashed());
    let tree = handle.tree();
    drop(first);

    let second = engine(faulty.inner(), &program);
    let report = second
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    assert!(report.iter().all(|(_, r)| r.is_ok()), "{report:?}");
    let view = wait_for(&second, tree, |v| v.root().status == Status::Parked).await;
    let effect = view.root().unknown_effects[0];
    assert_eq!(model.calls(), 0, "the uncertain call was never sent again");
    second
        .resolve_unknown(
            &scope(),
            tree,
            effect,
            Settlement::ok(Payload::encode(&Response::text("recorded answer")).expect("encodes")),
        )
        .await
        .expect("resolves");
    let handle = second
        .process::<InteractionOutput>(&scope(), tree)
        .await
        .expect("attached");
    let output = handle.output().await.expect("completes");
    assert_eq!(output.response.message().text(), "recorded answer");
    assert_eq!(model.calls(), 0);
}

#[tokio::test]
async fn a_malformed_resolution_fails_with_a_classified_code() {
    let model = adder();
    let program = interaction(Arc::new(model.clone()), 4);
    let faulty = FaultStore::new(Arc::new(MemoryStore::new()));
    faulty.arm(RecordKind::EffectPending, Cut::After, 1);
    let first = engine(Arc::new(faulty.clone()), &program);
    let handle = first
        .start(&program, start("crash-bad", ask("2 + 3")))
        .await
        .expect("starts");
    assert!(handle.await_result().await.is_err());
    let tree = handle.tree();
    drop(first);
    let second = engine(faulty.inner(), &program);
    second
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    let view = wait_for(&second, tree, |v| v.root().status == Status::Parked).await;
    second
        .resolve_unknown(
            &scope(),
            tree,
            view.root().unknown_effects[0],
            Settlement::ok(Payload::encode(&"not a response").expect("encodes")),
        )
        .await
        .expect("resolves");
    let termination = second
        .process::<InteractionOutput>(&scope(), tree)
        .await
        .expect("attached")
        .await_result()
        .await
        .expect("terminates");
    assert_eq!(
        termination.failure().expect("failure").code(),
        "interaction.model.response_invalid"
    );
}

#[tokio::test]
async fn streamed_deltas_arrive_as_engine_events_in_order() {
    let model = ScriptedModel::new("talker", |_| Ok(Response::text("one two three")));
    let program = interaction(Arc::new(model), 4);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let mut events = engine.events();
    let handle = engine
        .start(&program, start("deltas", ask("count")))
        .await
        .expect("starts");
    handle.join().await.expect("joins");
    let mut texts = Vec::new();
    while let Ok(Some(event)) = events.try_recv() {
        if let EventKind::Delta { delta, .. } = event.kind {
            let delta: baton_agent::Delta = delta.decode().expect("a delta");
            if let baton_agent::Delta::Text { text } = delta {
                texts.push(text);
            }
        }
    }
    assert_eq!(texts, ["one ", "two ", "three"]);
}

#[tokio::test]
async fn oversized_responses_fail_as_model_failures() {
    let model = ScriptedModel::new("verbose", |_| Ok(Response::text("x".repeat(10_000))));
    let mut config = InteractionConfig::new(
        "test.small",
        "Accepts only small answers.",
        Arc::new(model),
        100,
        2,
    );
    config.max_response_bytes = 1024;
    let program = baton_agent::Interaction::new(config)
        .expect("valid")
        .program();
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let termination = engine
        .start(&program, start("big", ask("talk")))
        .await
        .expect("starts")
        .await_result()
        .await
        .expect("terminates");
    let failure = termination.failure().expect("failure");
    assert_eq!(failure.code(), "chat.provider.too_large");
    assert_eq!(failure.kind, FailureKind::External);
    assert!(
        failure.message.contains("not retryable"),
        "{}",
        failure.message
    );
}

#[tokio::test]
async fn model_errors_fail_with_their_classification() {
    let model = ScriptedModel::script(
        "down",
        [Err(baton_agent::ModelError::Unavailable {
            status: Some(503),
            message: "overloaded".into(),
            retry_after: Some(std::time::Duration::from_secs(2)),
        })],
    );
    // Without retries the first failure is the interaction's.
    let program = interaction_with(Arc::new(model), 2, RetryPolicy::none());
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let termination = engine
        .start(&program, start("down", ask("hi")))
        .await
        .expect("starts")
        .await_result()
        .await
        .expect("terminates");
    let failure = termination.failure().expect("failure");
    assert_eq!(failure.code(), "chat.provider.unavailable");
    assert_eq!(failure.kind, FailureKind::External);
    assert!(
        failure.message.contains("http 503") && failure.message.contains("retry after 2000ms"),
        "{}",
        failure.message
    );
}

#[tokio::test]
async fn empty_messages_are_refused_at_start() {
    let model = adder();
    let program = interaction(Arc::new(model), 2);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let refused = engine
        .start(
            &program,
            start("empty", baton_agent::InteractionInput::new(vec![])),
        )
        .await
        .expect_err("refused");
    assert!(matches!(refused, StartError::Input(_)), "{refused:?}");
    let system_only = engine
        .start(
            &program,
            start(
                "system-only",
                baton_agent::InteractionInput::new(vec![Message::system("x")]),
            ),
        )
        .await
        .expect_err("refused");
    assert_eq!(system_only.code(), "chat.request.invalid");
}

#[test]
fn the_configuration_digest_covers_the_model_settings() {
    let digest = |model: &str, temperature: Option<f64>, system: &str| {
        let mut config = InteractionConfig::new(
            "test.digest",
            "Digest test.",
            Arc::new(ScriptedModel::new(model, |_| Ok(Response::text("x")))),
            100,
            2,
        );
        config.options.temperature = temperature;
        config.system = Some(system.into());
        baton_agent::Interaction::new(config)
            .expect("valid")
            .program()
            .reference()
            .digest
    };
    let base = digest("m1", Some(0.2), "be brief");
    assert_eq!(base, digest("m1", Some(0.2), "be brief"));
    assert_ne!(base, digest("m2", Some(0.2), "be brief"));
    assert_ne!(base, digest("m1", Some(0.3), "be brief"));
    assert_ne!(base, digest("m1", Some(0.2), "be verbose"));
}

#[test]
fn invalid_configurations_are_refused() {
    let model = Arc::new(ScriptedModel::new("m", |_| Ok(Response::text("x"))));
    let config = InteractionConfig::new("test.zero", "Zero calls.", model.clone(), 100, 0);
    assert!(baton_agent::Interaction::new(config).is_err());
    let mut config = InteractionConfig::new("test.tools", "Twice.", model, 100, 1);
    config.tools = vec![add_tool(), add_tool()];
    assert!(baton_agent::Interaction::new(config).is_err());
}

#[test]
fn public_types_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<baton_agent::Interaction>();
    assert_send_sync::<ScriptedModel>();
    assert_send_sync::<baton_agent::ModelDispatcher>();
    assert_send_sync::<baton_agent::Adapter<String, String>>();
}
