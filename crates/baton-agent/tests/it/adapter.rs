//! Conformance of the interaction and the adapter, the adapter end to end,
//! and typed output.

use std::sync::Arc;

use crate::common::*;
use baton_agent::output::{self, OutputError};
use baton_agent::{
    Adapter, AdapterConfig, FinishReason, InteractionInput, Message, Part, Request, Response,
    ResponseFormat, Role, ScriptedModel, Steering, Usage,
};
use baton_run::program::{ChildOutcome, Definition, Effect, Signal, SignalBody, Transition};
use baton_run::{
    Budget, EffectId, MemoryStore, Payload, ProcessId, Settlement, SignalId, StartId, Status,
    Termination,
};
use baton_testkit::{ConformanceCase, definition_conformance};
use baton_workflow::TransformError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Verdict {
    approve: bool,
    reason: String,
}

fn process() -> ProcessId {
    ProcessId::root(&StartId::new("acme", "conformance").expect("valid"))
}

fn settled(step: u64, response: &Response) -> Signal {
    let effect = EffectId::new(process(), step, 0);
    Signal {
        id: SignalId::for_effect(effect),
        wait: None,
        body: SignalBody::Settled {
            effect,
            settlement: Settlement::ok(Payload::encode(response).expect("encodes")),
        },
    }
}

fn steer(id: &str, text: &str) -> Signal {
    Signal {
        id: SignalId::new(id).expect("valid"),
        wait: None,
        body: SignalBody::Input {
            payload: Payload::encode(&Steering {
                messages: vec![text.into()],
            })
            .expect("encodes"),
        },
    }
}

fn started(step: u64, index: u32, key: &str) -> Signal {
    let effect = EffectId::new(process(), step, index);
    let key = baton_run::ChildKey::new(key).expect("valid");
    Signal {
        id: SignalId::for_effect(effect),
        wait: None,
        body: SignalBody::ChildStarted {
            effect,
            process: Some(ProcessId::child(process(), &key)),
            key,
            failure: None,
        },
    }
}

fn ready(step: u64, index: u32, key: &str, output: Payload) -> Signal {
    let effect = EffectId::new(process(), step, index);
    let key = baton_run::ChildKey::new(key).expect("valid");
    Signal {
        id: SignalId::for_effect(effect),
        wait: None,
        body: SignalBody::ChildrenReady {
            effect,
            children: vec![ChildOutcome {
                process: ProcessId::child(process(), &key),
                key,
                termination: Termination::completed(output),
            }],
        },
    }
}

fn payload<T: Serialize>(value: &T) -> Payload {
    Payload::encode(value).expect("encodes")
}

#[test]
fn the_interaction_keeps_the_definition_contract() {
    let program = interaction(
        Arc::new(ScriptedModel::new("unused", |_| Ok(Response::text("x")))),
        4,
    );
    let definition = program.definition();
    let tool_call = Response::calls(vec![call("c1", "add", r#"{"a":2,"b":3}"#)]).expect("valid");
    let checked = definition_conformance(
        definition.as_ref(),
        &[
            ConformanceCase::new(
                "plain answer",
                payload(&ask("hi")),
                vec![vec![], vec![settled(0, &Response::text("hello"))]],
            ),
            ConformanceCase::new(
                "tool round",
                payload(&ask("2 + 3")),
                vec![
                    vec![],
                    vec![settled(0, &tool_call)],
                    vec![
                        started(1, 0, "tool-1-0"),
                        ready(1, 1, "tool-1-0", payload(&5)),
                    ],
                    vec![settled(2, &Response::text("5"))],
                ],
            ),
            ConformanceCase::new(
                "steering during a call",
                payload(&ask("hi")),
                vec![
                    vec![],
                    vec![steer("s1", "shorter"), settled(0, &Response::text("long"))],
                    vec![settled(1, &Response::text("short"))],
                ],
            ),
            ConformanceCase::new(
                "unknown tool",
                payload(&ask("hi")),
                vec![
                    vec![],
                    vec![settled(
                        0,
                        &Response::calls(vec![call("c1", "nope", "{}")]).expect("valid"),
                    )],
                    vec![settled(1, &Response::text("ok"))],
                ],
            ),
        ],
    );
    assert!(checked >= 10, "{checked}");
}

fn verdict_adapter(model: ScriptedModel) -> Adapter<String, Verdict> {
    let interaction = interaction(Arc::new(model), 2);
    Adapter::new(AdapterConfig {
        name: "test.reviewer".into(),
        description: "Reviews a change and returns a verdict.".into(),
        build: "adapter tests 1".into(),
        interaction,
        budget: Budget::unlimited(),
        capabilities: baton_run::Capabilities::none(),
        build_input: Box::new(|change: &String| {
            Ok(InteractionInput::new(vec![Message::user(format!(
                "review: {change}"
            ))]))
        }),
        decode_output: Box::new(|output| {
            output::decode::<Verdict>(&output.response)
                .map_err(|error| TransformError::new(error.to_string()))
        }),
    })
    .expect("valid adapter")
}

#[test]
fn the_adapter_keeps_the_definition_contract() {
    let adapter = verdict_adapter(ScriptedModel::new("unused", |_| Ok(Response::text("x"))));
    let definition = adapter.workflow();
    let input = payload(&"fix the bug".to_owned());
    // Learn the interaction child's key from the first step.
    let mut execution = definition.start(&input).expect("starts");
    let Transition::Continue { effects, .. } = execution.step(&[]).expect("steps") else {
        panic!("the adapter starts its interaction first");
    };
    let Effect::StartChild { key, .. } = &effects[0] else {
        panic!("expected a child start, got {effects:?}");
    };
    let output = baton_agent::InteractionOutput {
        response: Response::text(r#"{"approve":true,"reason":"fine"}"#),
        model_calls: 1,
    };
    let checked = definition_conformance(
        definition,
        &[ConformanceCase::new(
            "render, call, decode",
            input,
            vec![
                vec![],
                vec![
                    started(0, 0, key.as_str()),
                    ready(0, 1, key.as_str(), payload(&output)),
                ],
            ],
        )],
    );
    assert_eq!(checked, 2);
}

#[tokio::test]
async fn the_adapter_runs_render_call_decode_as_a_typed_program() {
    let model = ScriptedModel::new("reviewer", |request| {
        assert_eq!(last(request).text(), "review: fix the bug");
        Ok(Response::text(
            r#"{"approve":true,"reason":"small and tested"}"#,
        ))
    });
    let program = verdict_adapter(model).program();
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let verdict = engine
        .start(&program, start("adapter", "fix the bug".to_owned()))
        .await
        .expect("starts")
        .output()
        .await
        .expect("completes");
    assert_eq!(
        verdict,
        Verdict {
            approve: true,
            reason: "small and tested".into()
        }
    );
}

#[tokio::test]
async fn an_adapter_never_repairs_malformed_model_output() {
    let model = ScriptedModel::new("sloppy", |_| {
        Ok(Response::text(r#"{"approve": true, "reason": "ok",}"#))
    });
    let program = verdict_adapter(model).program();
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let termination = engine
        .start(&program, start("sloppy", "x".to_owned()))
        .await
        .expect("starts")
        .await_result()
        .await
        .expect("terminates");
    assert_eq!(termination.status(), Status::Failed);
    let failure = termination.failure().expect("failure");
    assert_eq!(failure.code(), "workflow.transform.failed");
    assert!(
        failure.message.contains("chat.output.invalid"),
        "{}",
        failure.message
    );
}

#[tokio::test]
async fn typed_output_asks_for_the_schema_and_decodes_strictly() {
    let model = ScriptedModel::script(
        "typed",
        [
            Ok(Response::text(r#"{"approve":false,"reason":"risky"}"#)),
            Ok(Response::text(
                r#"{"approve":false,"reason":"risky","extra":1}"#,
            )),
            Ok(Response::text("")),
            Ok(Response::text("not json at all")),
        ],
    );
    let request = Request::of(vec![Message::user("review")]).expect("valid");
    let verdict: Verdict = output::output(&model, &request).await.expect("decodes");
    assert_eq!(verdict.reason, "risky");
    let sent = &model.requests()[0];
    let Some(ResponseFormat::JsonSchema {
        name,
        schema,
        strict,
    }) = &sent.options().response_format
    else {
        panic!("no schema format was sent");
    };
    assert_eq!(name, "Verdict");
    assert!(strict);
    assert_eq!(schema["additionalProperties"], serde_json::json!(false));
    assert!(
        request.options().response_format.is_none(),
        "the caller's request is unchanged"
    );

    let extra = output::output::<Verdict>(&model, &request)
        .await
        .expect_err("rejected");
    assert_eq!(extra.code(), "chat.output.invalid");
    let empty = output::output::<Verdict>(&model, &request)
        .await
        .expect_err("rejected");
    assert!(matches!(empty, OutputError::Invalid { .. }));
    let garbage = output::output::<Verdict>(&model, &request)
        .await
        .expect_err("rejected");
    match garbage {
        OutputError::Invalid { raw, .. } => assert_eq!(raw, "not json at all"),
        other => panic!("unexpected {other:?}"),
    }
    let mut options = request.options().clone();
    options.response_format = Some(ResponseFormat::Text);
    let formatted = request.clone().with_options(options).expect("valid");
    assert_eq!(
        output::output::<Verdict>(&model, &formatted)
            .await
            .expect_err("conflict"),
        OutputError::FormatConflict
    );
}

#[test]
fn typed_output_requires_stop_and_no_refusal() {
    let json = r#"{"approve":true,"reason":"ok"}"#;
    let cut = Response::new(
        Message::assistant(json),
        FinishReason::Length,
        Some(Usage::default()),
    )
    .expect("valid");
    assert_eq!(
        output::decode::<Verdict>(&cut).expect_err("cut").code(),
        "chat.output.invalid"
    );
    let refused = Response::new(
        Message::new(
            Role::Assistant,
            vec![Part::text(json), Part::Refusal { text: "no".into() }],
        )
        .expect("valid"),
        FinishReason::Stop,
        Some(Usage::default()),
    )
    .expect("valid");
    assert!(output::decode::<Verdict>(&refused).is_err());
    assert!(output::decode::<Verdict>(&Response::text(json)).is_ok());
}

#[test]
fn duplicate_keys_in_a_models_json_answer_are_refused_as_invalid_output() {
    let duplicated = Response::text(r#"{"approve":true,"reason":"fine","approve":false}"#);
    let refused = output::decode::<Verdict>(&duplicated).expect_err("refused");
    assert_eq!(refused.code(), "chat.output.invalid");
    match refused {
        OutputError::Invalid { reason, raw } => {
            assert!(reason.contains("duplicate"), "{reason}");
            assert!(raw.contains(r#""approve":false"#), "the raw text is kept");
        }
        other => panic!("unexpected {other:?}"),
    }
    let once = Response::text(r#"{"approve":true,"reason":"fine"}"#);
    assert!(output::decode::<Verdict>(&once).expect("decodes").approve);
}
