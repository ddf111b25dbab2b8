//! The Anthropic Messages provider against a local HTTP/1.1 server
//! (loopback only) speaking the Messages wire format as publicly
//! documented: the same scenarios as the OpenAI-compatible provider's, in
//! this API's own shapes.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use crate::strict::{Everything, Kind};
use crate::wire::{Reply, Seen, event, server};
use baton_agent::anthropic::{AnthropicConfig, AnthropicModel, Delivery, OUTPUT_TOOL};
use baton_agent::{
    COST_MICROS, ChatModel, FinishReason, Interaction, InteractionConfig, InteractionOutput,
    Message, ModelError, Price, Request, TOKENS, TOKENS_IN, TOKENS_OUT, output,
};
use baton_run::dispatch::Certainty;
use baton_run::{Budget, MemoryStore, Name, Visibility};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

fn config(base_url: &str) -> AnthropicConfig {
    let mut config = AnthropicConfig::new(base_url, "claude-test");
    config.api_key = Some("sk-ant-test".into());
    config.timeout = Duration::from_millis(500);
    config
}

fn model(base_url: &str) -> AnthropicModel {
    AnthropicModel::new(config(base_url)).expect("a client")
}

async fn next(seen: &mut UnboundedReceiver<Seen>) -> (String, Value) {
    let seen = seen.recv().await.expect("a request");
    assert!(seen.head.starts_with("post /v1/messages "), "{}", seen.head);
    (seen.head, seen.body)
}

fn message(content: Value, stop: &str) -> String {
    json!({
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": {"input_tokens": 11, "output_tokens": 3, "cache_read_input_tokens": 4, "cache_creation_input_tokens": 2},
    })
    .to_string()
}

fn text_message(text: &str) -> Reply {
    Reply::json(
        200,
        message(json!([{"type": "text", "text": text}]), "end_turn"),
    )
}

fn started(input_tokens: u64) -> String {
    event(
        "message_start",
        &json!({"type": "message_start", "message": {
            "id": "msg_2", "type": "message", "role": "assistant", "model": "claude-test",
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1}
        }}),
    )
}

fn block_start(index: u64, block: Value) -> String {
    event(
        "content_block_start",
        &json!({"type": "content_block_start", "index": index, "content_block": block}),
    )
}

fn delta(index: u64, delta: Value) -> String {
    event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": index, "delta": delta}),
    )
}

fn block_stop(index: u64) -> String {
    event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": index}),
    )
}

fn stopped(reason: &str, output_tokens: u64) -> Vec<String> {
    vec![
        event(
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null}, "usage": {"output_tokens": output_tokens}}),
        ),
        event("message_stop", &json!({"type": "message_stop"})),
    ]
}

fn text_stream(pieces: &[&str]) -> Reply {
    let mut frames = vec![
        started(20),
        block_start(0, json!({"type": "text", "text": ""})),
        event("ping", &json!({"type": "ping"})),
    ];
    frames.extend(
        pieces
            .iter()
            .map(|p| delta(0, json!({"type": "text_delta", "text": p}))),
    );
    frames.push(block_stop(0));
    frames.extend(stopped("end_turn", 4));
    Reply::Events(frames)
}

fn hi() -> Request {
    Request::of(vec![Message::user("hi")])
        .expect("valid")
        .with_options(baton_agent::Options {
            max_tokens: Some(64),
            ..baton_agent::Options::default()
        })
        .expect("valid")
}

#[tokio::test]
async fn a_plain_message_becomes_a_response_and_the_request_carries_max_tokens_and_headers() {
    let (url, mut seen) = server(vec![text_message("Hello!")]).await;
    let request = Request::of(vec![Message::system("Be kind."), Message::user("Hi")])
        .expect("valid")
        .with_options(baton_agent::Options {
            max_tokens: Some(64),
            temperature: Some(0.5),
            response_format: None,
        })
        .expect("valid");
    let response = model(&url).call(request).await.expect("answers");
    assert_eq!(response.message().text(), "Hello!");
    assert_eq!(response.finish_reason(), FinishReason::Stop);
    let usage = response.usage().expect("reported");
    assert_eq!(
        (
            usage.input_tokens,
            usage.cached_input_tokens,
            usage.output_tokens
        ),
        (17, 4, 3),
        "cache reads and writes count as input"
    );
    let (head, body) = next(&mut seen).await;
    assert!(head.contains("x-api-key: sk-ant-test"), "{head}");
    assert!(head.contains("anthropic-version: 2023-06-01"), "{head}");
    assert_eq!(body["model"], "claude-test");
    assert_eq!(body["max_tokens"], 64);
    assert_eq!(body["temperature"], 0.5);
    assert_eq!(body["system"], "Be kind.");
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "Hi"}]}])
    );
    assert!(body.get("stream").is_none());
}

#[tokio::test]
async fn a_tool_round_trip_streams_through_an_interaction_with_object_input_schemas() {
    let (url, mut seen) =
        server(vec![
        Reply::Events(
            [
                vec![
                    started(30),
                    block_start(0, json!({"type": "text", "text": ""})),
                    delta(0, json!({"type": "text_delta", "text": "Adding."})),
                    block_stop(0),
                    block_start(
                        1,
                        json!({"type": "tool_use", "id": "toolu_1", "name": "add", "input": {}}),
                    ),
                    delta(1, json!({"type": "input_json_delta", "partial_json": "{\"a\":2,"})),
                    delta(1, json!({"type": "input_json_delta", "partial_json": "\"b\":3}"})),
                    block_stop(1),
                ],
                stopped("tool_use", 9),
            ]
            .concat(),
        ),
        text_stream(&["The sum ", "is 5."]),
    ])
        .await;
    let mut config = InteractionConfig::new(
        "test.assistant",
        "Answers with the help of tools.",
        Arc::new(model(&url)),
        100,
        4,
    );
    config.system = Some("You add numbers.".into());
    config.tools = vec![add_tool(), echo_tool()];
    config.max_concurrent_tool_calls = 2;
    let program = Interaction::new(config).expect("valid").program();
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("anthropic-tools", ask("2 + 3?")))
        .await
        .expect("starts");
    let output: InteractionOutput = handle.output().await.expect("completes");
    assert_eq!(output.response.message().text(), "The sum is 5.");

    let (_, first) = next(&mut seen).await;
    assert_eq!(first["stream"], true);
    assert_eq!(first["system"], "You add numbers.");
    assert_eq!(first["tool_choice"], json!({"type": "auto"}));
    let tools = first["tools"].as_array().expect("tools");
    assert_eq!(tools.len(), 2);
    for tool in tools {
        assert_eq!(
            tool["input_schema"]["type"], "object",
            "every tool's input schema is an object schema: {tool}"
        );
    }
    let (_, second) = next(&mut seen).await;
    let messages = second["messages"].as_array().expect("messages");
    assert_eq!(
        messages[1],
        json!({"role": "assistant", "content": [
            {"type": "text", "text": "Adding."},
            {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}}
        ]})
    );
    assert_eq!(
        messages[2],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "5", "is_error": false}
        ]})
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
    };
    assert_eq!(meter(TOKENS_IN), Some(50));
    assert_eq!(meter(TOKENS_OUT), Some(13));
    assert_eq!(meter(TOKENS), Some(63));
}

#[tokio::test]
async fn typed_output_is_answered_through_the_output_tool_and_decodes() {
    let answer = json!({
        "name": "root", "count": 3, "kind": {"type": "folder", "items": 2},
        "nested": {"label": "n", "weight": 7}, "children": []
    });
    let (url, mut seen) = server(vec![
        Reply::json(
            200,
            message(
                json!([{"type": "tool_use", "id": "toolu_9", "name": OUTPUT_TOOL, "input": answer}]),
                "tool_use",
            ),
        ),
        Reply::Events(
            [
                vec![
                    started(5),
                    block_start(
                        0,
                        json!({"type": "tool_use", "id": "toolu_8", "name": OUTPUT_TOOL, "input": {}}),
                    ),
                    delta(0, json!({"type": "input_json_delta", "partial_json": "{\"value\":[\"a\","})),
                    delta(0, json!({"type": "input_json_delta", "partial_json": "\"b\"]}"})),
                    block_stop(0),
                ],
                stopped("tool_use", 6),
            ]
            .concat(),
        ),
    ])
    .await;
    let model = model(&url);
    let decoded: Everything = output::output(&model, &hi()).await.expect("decodes");
    assert_eq!((decoded.name.as_str(), decoded.count), ("root", 3));
    assert!(matches!(decoded.kind, Kind::Folder { items: 2 }));
    let (_, body) = next(&mut seen).await;
    assert_eq!(
        body["tool_choice"],
        json!({"type": "tool", "name": OUTPUT_TOOL})
    );
    let tool = &body["tools"][0];
    assert_eq!(tool["name"], OUTPUT_TOOL);
    assert_eq!(tool["input_schema"]["type"], "object");

    // A list is not an object: it is asked for as the member `value`.
    let mut request = hi();
    let mut options = request.options().clone();
    options.response_format = Some(output::format_for::<Vec<String>>());
    request = request.with_options(options).expect("valid");
    let response = model.stream(request, &|_| {}).await.expect("answers");
    assert_eq!(response.finish_reason(), FinishReason::Stop);
    assert_eq!(
        output::decode::<Vec<String>>(&response).expect("decodes"),
        ["a", "b"]
    );
    let (_, body) = next(&mut seen).await;
    assert_eq!(
        body["tools"][0]["input_schema"]["required"],
        json!(["value"])
    );
}

#[tokio::test]
async fn duplicate_keys_in_a_typed_answer_are_refused_as_invalid_output() {
    let body = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[{"type":"tool_use","id":"toolu_1","name":"baton_output","input":{"name":"a","name":"b"}}],"stop_reason":"tool_use","usage":{"input_tokens":1,"output_tokens":1}}"#;
    let (url, _seen) = server(vec![Reply::json(200, body)]).await;
    let error = output::output::<Everything>(&model(&url), &hi())
        .await
        .expect_err("refused");
    assert_eq!(error.code(), "chat.output.invalid");
    assert!(error.to_string().contains("duplicate"), "{error}");
}

#[tokio::test]
async fn an_error_event_in_a_stream_is_a_classified_failure() {
    let (url, _seen) = server(vec![
        Reply::Events(vec![
            started(5),
            block_start(0, json!({"type": "text", "text": ""})),
            delta(0, json!({"type": "text_delta", "text": "partial"})),
            event(
                "error",
                &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            ),
        ]),
        Reply::Events(vec![event(
            "error",
            &json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}),
        )]),
    ])
    .await;
    let model = model(&url);
    let overloaded = model.stream(hi(), &|_| {}).await.expect_err("fails");
    assert_eq!(overloaded.code(), "chat.provider.unavailable");
    assert_eq!(
        overloaded.retry().map(|hint| hint.certainty),
        Some(Certainty::Definite)
    );
    let limited = model.stream(hi(), &|_| {}).await.expect_err("fails");
    assert_eq!(limited.code(), "chat.provider.rate_limited");
}

#[tokio::test]
async fn a_stream_cut_before_its_stop_reason_is_an_uncertain_failure() {
    let (url, _seen) = server(vec![
        Reply::Events(vec![
            started(5),
            block_start(0, json!({"type": "text", "text": ""})),
            delta(0, json!({"type": "text_delta", "text": "half an ans"})),
        ]),
        Reply::Events(vec![
            started(5),
            event("message_stop", &json!({"type": "message_stop"})),
        ]),
    ])
    .await;
    let model = model(&url);
    let truncated = model.stream(hi(), &|_| {}).await.expect_err("fails");
    assert_eq!(truncated.code(), "chat.provider.interrupted");
    assert_eq!(
        truncated.retry().map(|hint| hint.certainty),
        Some(Certainty::Uncertain)
    );
    let unfinished = model.stream(hi(), &|_| {}).await.expect_err("fails");
    assert_eq!(unfinished.code(), "chat.provider.malformed");
}

#[tokio::test]
async fn error_statuses_are_classified_in_the_apis_error_shape() {
    let error = |status: u16, kind: &str, headers: Vec<(&'static str, String)>| Reply::Json {
        status,
        headers,
        body:
            json!({"type": "error", "error": {"type": kind, "message": format!("{kind} {status}")}})
                .to_string(),
    };
    let (url, _seen) = server(vec![
        error(429, "rate_limit_error", vec![("retry-after", "12".into())]),
        error(529, "overloaded_error", Vec::new()),
        error(400, "invalid_request_error", Vec::new()),
    ])
    .await;
    let model = model(&url);
    let limited = model.call(hi()).await.expect_err("fails");
    assert_eq!(limited.code(), "chat.provider.rate_limited");
    assert_eq!(
        limited.retry().and_then(|hint| hint.after),
        Some(Duration::from_secs(12))
    );
    let overloaded = model.call(hi()).await.expect_err("fails");
    assert_eq!(overloaded.code(), "chat.provider.unavailable");
    assert_eq!(overloaded.status(), Some(529));
    let refused = model.call(hi()).await.expect_err("fails");
    assert_eq!(refused.code(), "chat.provider.refused");
    assert!(
        refused.to_string().contains("invalid_request_error 400"),
        "{refused}"
    );
    assert_eq!(refused.retry(), None);
}

#[tokio::test]
async fn an_answer_without_usage_leaves_usage_unknown() {
    let body = json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
        "content": [{"type": "text", "text": "no usage"}], "stop_reason": "end_turn"
    });
    let (url, _seen) = server(vec![Reply::json(200, body.to_string())]).await;
    let response = model(&url).call(hi()).await.expect("answers");
    assert_eq!(response.usage(), None);
}

const PRICE: Price = Price {
    input: 3_000_000,
    cached_input: Some(300_000),
    output: 15_000_000,
    reasoning: None,
};

fn priced(base_url: &str) -> AnthropicModel {
    let mut config = config(base_url);
    config.prices.insert("claude-test".into(), PRICE);
    AnthropicModel::new(config).expect("a client")
}

#[tokio::test]
async fn a_cost_budget_below_one_calls_maximum_refuses_before_any_io() {
    let (url, mut seen) = server(vec![text_message("never sent")]).await;
    let program = interaction(Arc::new(priced(&url)), 2);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let mut request = start("anthropic-poor", ask("hi"));
    // 100 output tokens alone may cost 100 × 15 = 1500 micros.
    request.budget = Budget::unlimited().with_meter(Name::new(COST_MICROS).expect("valid"), 1_400);
    let termination = engine
        .start(&program, request)
        .await
        .expect("starts")
        .await_result()
        .await
        .expect("terminates");
    assert_eq!(
        termination.failure().expect("failure").code(),
        "engine.limit.meter"
    );
    assert!(seen.try_recv().is_err(), "the server never saw a request");
}

#[tokio::test]
async fn the_charged_cost_equals_the_priced_usage_exactly() {
    let frames = [
        vec![
            event(
                "message_start",
                &json!({"type": "message_start", "message": {
                    "id": "msg_3", "type": "message", "role": "assistant", "model": "claude-test",
                    "content": [], "stop_reason": null,
                    "usage": {"input_tokens": 11, "output_tokens": 1, "cache_read_input_tokens": 4, "cache_creation_input_tokens": 2}
                }}),
            ),
            block_start(0, json!({"type": "text", "text": ""})),
            delta(0, json!({"type": "text_delta", "text": "Hello!"})),
            block_stop(0),
        ],
        stopped("end_turn", 3),
    ]
    .concat();
    let (url, _seen) = server(vec![Reply::Events(frames)]).await;
    let program = interaction(Arc::new(priced(&url)), 2);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let mut request = start("anthropic-cost", ask("hi"));
    request.budget =
        Budget::unlimited().with_meter(Name::new(COST_MICROS).expect("valid"), 1_000_000);
    let handle = engine.start(&program, request).await.expect("starts");
    handle.output().await.expect("completes");
    let view = engine
        .inspect(&scope(), handle.tree(), Visibility::Public)
        .await
        .expect("inspects");
    // Input 11 + 2 written + 4 read = 17, 4 of them cached; output 3:
    // ⌈(13 × 3M + 4 × 0.3M + 3 × 15M) ÷ 10⁶⌉ = ⌈39 + 1.2 + 45⌉ = 86.
    assert_eq!(
        view.root()
            .usage
            .meters
            .get(&Name::new(COST_MICROS).expect("valid")),
        Some(&86)
    );
}

#[test]
fn requests_the_api_cannot_take_are_refused_before_sending() {
    let model = model("http://127.0.0.1:9");
    let no_limit = Request::of(vec![Message::user("hi")]).expect("valid");
    let refused = model
        .request_body(&no_limit, Delivery::Whole)
        .expect_err("max_tokens is required");
    assert!(matches!(refused, ModelError::Request(_)), "{refused:?}");
    let hot = hi()
        .with_options(baton_agent::Options {
            max_tokens: Some(8),
            temperature: Some(1.5),
            response_format: None,
        })
        .expect("valid");
    assert!(model.request_body(&hot, Delivery::Whole).is_err());
}

#[test]
fn configuration_comes_from_the_conventional_variables() {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        }
    };
    let config = AnthropicConfig::from_vars(vars(&[
        ("ANTHROPIC_API_KEY", "sk-ant-secret"),
        ("ANTHROPIC_MODEL", "claude"),
    ]))
    .expect("configured");
    assert_eq!(config.base_url, baton_agent::anthropic::DEFAULT_BASE_URL);
    assert_eq!(config.api_key.as_deref(), Some("sk-ant-secret"));
    assert!(!format!("{config:?}").contains("sk-ant-secret"));
    let missing = AnthropicConfig::from_vars(vars(&[])).expect_err("no model");
    assert_eq!(missing.code(), "interaction.host.failed");
}
