//! The OpenAI-compatible provider against a local HTTP/1.1 server (loopback
//! only) that speaks the Chat Completions wire format as publicly
//! documented: plain answers, tool calls, server-sent events, strict typed
//! output, error statuses and error objects, truncated streams, usage and
//! cost, malformed bodies and timeouts.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use crate::strict::{Everything, Kind, check};
use crate::wire::{Reply, Seen, data, server};
use baton_agent::openai::{Delivery, OpenAiConfig, OpenAiModel, TokenLimit};
use baton_agent::{
    COST_MICROS, ChatModel, FinishReason, Interaction, InteractionConfig, InteractionOutput,
    Message, ModelError, Price, Request, Role, TOKENS, TOKENS_IN, TOKENS_OUT, Usage, output,
};
use baton_run::dispatch::{Certainty, RetryPolicy};
use baton_run::log::{RecordBody, RecordKind};
use baton_run::{
    Budget, Engine, EngineConfig, EventKind, ManualClock, MemoryStore, Name, Status, Timestamp,
    Visibility,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc::UnboundedReceiver;

fn model(base_url: &str) -> OpenAiModel {
    OpenAiModel::new(config(base_url)).expect("a client")
}

fn config(base_url: &str) -> OpenAiConfig {
    let mut config = OpenAiConfig::new(format!("{base_url}/v1"), "test-model");
    config.api_key = Some("sk-test".into());
    config.timeout = Duration::from_millis(500);
    config
}

async fn next(seen: &mut UnboundedReceiver<Seen>) -> Value {
    let seen = seen.recv().await.expect("a request");
    assert!(
        seen.head.starts_with("post /v1/chat/completions "),
        "{}",
        seen.head
    );
    seen.body
}

fn completion(message: Value, finish: &str) -> String {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "test-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": null}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
    })
    .to_string()
}

fn text_completion(text: &str) -> Reply {
    Reply::json(
        200,
        completion(json!({"role": "assistant", "content": text}), "stop"),
    )
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    data(
        &json!({
            "id": "chatcmpl-2",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "test-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        })
        .to_string(),
    )
}

fn usage_chunk(usage: Value) -> String {
    data(
        &json!({
            "id": "chatcmpl-2",
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": usage,
        })
        .to_string(),
    )
}

fn plain_usage() -> Value {
    json!({"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24})
}

fn done() -> String {
    data("[DONE]")
}

fn text_stream(pieces: &[&str]) -> Reply {
    let mut frames = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    frames.extend(pieces.iter().map(|p| chunk(json!({"content": p}), None)));
    frames.push(chunk(json!({}), Some("stop")));
    frames.push(usage_chunk(plain_usage()));
    frames.push(done());
    Reply::Events(frames)
}

fn hi() -> Request {
    Request::of(vec![Message::user("hi")]).expect("valid")
}

#[tokio::test]
async fn a_plain_completion_becomes_a_response_and_the_limit_is_sent_as_max_completion_tokens() {
    let (url, mut seen) = server(vec![text_completion("Hello!"), text_completion("Again")]).await;
    let model = model(&url);
    let request = Request::of(vec![Message::system("Be kind."), Message::user("Hi")])
        .expect("valid")
        .with_options(baton_agent::Options {
            max_tokens: Some(64),
            temperature: Some(0.5),
            response_format: None,
        })
        .expect("valid");
    let response = model.call(request.clone()).await.expect("answers");
    assert_eq!(response.message().text(), "Hello!");
    assert_eq!(response.finish_reason(), FinishReason::Stop);
    let usage = response.usage().expect("reported");
    assert_eq!((usage.input_tokens, usage.output_tokens), (11, 3));
    let body = next(&mut seen).await;
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["max_completion_tokens"], 64);
    assert!(body.get("max_tokens").is_none(), "{body}");
    assert_eq!(body["temperature"], 0.5);
    assert_eq!(
        body["messages"][0],
        json!({"role": "system", "content": "Be kind."})
    );
    assert_eq!(
        body["messages"][1],
        json!({"role": "user", "content": "Hi"})
    );
    assert!(body.get("stream").is_none());

    let mut older = config(&url);
    older.token_limit = TokenLimit::MaxTokens;
    OpenAiModel::new(older)
        .expect("a client")
        .call(request)
        .await
        .expect("answers");
    let body = next(&mut seen).await;
    assert_eq!(body["max_tokens"], 64);
    assert!(body.get("max_completion_tokens").is_none(), "{body}");
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Weather {
    city: String,
    celsius: i32,
}

#[tokio::test]
async fn duplicate_keys_in_a_typed_answer_are_refused_as_invalid_output() {
    let (url, _seen) = server(vec![text_completion(
        r#"{"city":"Oslo","celsius":-3,"city":"Bergen"}"#,
    )])
    .await;
    let error = output::output::<Weather>(&model(&url), &hi())
        .await
        .expect_err("refused");
    assert_eq!(error.code(), "chat.output.invalid");
    assert!(error.to_string().contains("duplicate"), "{error}");
}

#[tokio::test]
async fn a_strict_typed_answer_is_sent_in_the_strict_subset_and_decodes_with_absent_members() {
    let answer = json!({
        "name": "root",
        "count": 3,
        "kind": {"type": "folder", "items": 2},
        "nested": {"label": "n", "weight": null},
        "children": [{"name": "leaf", "count": 0, "kind": {"type": "file"}, "nested": null, "children": [], "note": null}],
        "note": null
    });
    let (url, mut seen) = server(vec![text_completion(&answer.to_string())]).await;
    let decoded: Everything = output::output(&model(&url), &hi()).await.expect("decodes");
    assert_eq!((decoded.name.as_str(), decoded.count), ("root", 3));
    assert!(matches!(decoded.kind, Kind::Folder { items: 2 }));
    let nested = decoded.nested.as_ref().expect("present");
    assert_eq!((nested.label.as_str(), nested.weight), ("n", None));
    assert_eq!(decoded.children[0].name, "leaf");
    assert!(decoded.note.is_none() && decoded.children[0].nested.is_none());
    let body = next(&mut seen).await;
    let format = &body["response_format"]["json_schema"];
    assert_eq!(format["strict"], true);
    check(&format["schema"]);
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Loose {
    name: String,
    extra: Value,
}

#[tokio::test]
async fn a_type_strict_mode_cannot_express_is_sent_with_strict_false() {
    let (url, mut seen) = server(vec![text_completion(r#"{"name":"a","extra":[1]}"#)]).await;
    let loose: Loose = output::output(&model(&url), &hi()).await.expect("decodes");
    assert_eq!(loose.extra, json!([1]));
    let body = next(&mut seen).await;
    assert_eq!(body["response_format"]["json_schema"]["strict"], false);
}

#[tokio::test]
async fn a_tool_call_round_trip_runs_through_an_interaction_with_object_parameters() {
    let (url, mut seen) = server(vec![
        Reply::Events(vec![
            chunk(
                json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": "call_abc", "type": "function", "function": {"name": "add", "arguments": ""}}]}),
                None,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":2,"}}]}),
                None,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"b\":3}"}}]}),
                None,
            ),
            chunk(json!({}), Some("tool_calls")),
            usage_chunk(plain_usage()),
            done(),
        ]),
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
    config.tools = vec![add_tool(), echo_tool()];
    let program = Interaction::new(config).expect("valid").program();
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("openai-tools", ask("2 + 3?")))
        .await
        .expect("starts");
    let output: InteractionOutput = handle.output().await.expect("completes");
    assert_eq!(output.response.message().text(), "The sum is 5.");
    assert_eq!(output.model_calls, 2);

    let first = next(&mut seen).await;
    assert_eq!(first["stream"], true);
    assert_eq!(first["stream_options"]["include_usage"], true);
    let tools = first["tools"].as_array().expect("tools");
    assert_eq!(tools.len(), 2);
    for tool in tools {
        assert_eq!(tool["type"], "function");
        assert_eq!(
            tool["function"]["parameters"]["type"], "object",
            "every tool's parameters are an object schema: {tool}"
        );
    }
    assert_eq!(first["tool_choice"], "auto");
    let second = next(&mut seen).await;
    let messages = second["messages"].as_array().expect("messages");
    let assistant = &messages[messages.len() - 2];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant["content"], Value::Null);
    assert_eq!(assistant["tool_calls"][0]["id"], "call_abc");
    assert_eq!(
        assistant["tool_calls"][0]["function"]["arguments"],
        "{\"a\":2,\"b\":3}"
    );
    assert_eq!(
        messages[messages.len() - 1],
        json!({"role": "tool", "tool_call_id": "call_abc", "content": "5"})
    );
}

#[tokio::test]
async fn streamed_deltas_arrive_as_engine_events_in_order() {
    let (url, _seen) = server(vec![text_stream(&["Hel", "lo", ", ", "world"])]).await;
    let program = interaction(Arc::new(model(&url)), 2);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let mut events = engine.events();
    let handle = engine
        .start(&program, start("openai-stream", ask("greet")))
        .await
        .expect("starts");
    let output: InteractionOutput = handle.output().await.expect("completes");
    handle.join().await.expect("joins");
    assert_eq!(output.response.message().text(), "Hello, world");
    let mut texts = Vec::new();
    while let Ok(Some(event)) = events.try_recv() {
        if let EventKind::Delta { delta, .. } = event.kind {
            assert_eq!(event.process, handle.id());
            if let baton_agent::Delta::Text { text } = delta.decode().expect("a delta") {
                texts.push(text);
            }
        }
    }
    assert_eq!(texts, ["Hel", "lo", ", ", "world"]);
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
    assert_eq!(meter(TOKENS_IN), Some(20));
    assert_eq!(meter(TOKENS_OUT), Some(4));
    assert_eq!(meter(TOKENS), Some(24));
}

#[tokio::test]
async fn multi_line_data_fields_and_comments_are_read_as_one_event() {
    let split = format!(
        ": a comment the parser skips\ndata: {}\ndata: {}\n\n",
        r#"{"choices":[{"index":0,"delta":{"content":"two "},"#, r#""finish_reason":null}]}"#
    );
    let (url, _seen) = server(vec![Reply::Events(vec![
        split,
        chunk(json!({"content": "lines"}), None),
        chunk(json!({}), Some("stop")),
        usage_chunk(plain_usage()),
        done(),
    ])])
    .await;
    let response = model(&url).stream(hi(), &|_| {}).await.expect("answers");
    assert_eq!(response.message().text(), "two lines");
}

#[tokio::test]
async fn an_error_object_in_a_stream_is_a_classified_failure() {
    let (url, _seen) = server(vec![
        Reply::Events(vec![
            chunk(json!({"content": "partial"}), None),
            data(r#"{"error":{"message":"The server had an error","type":"server_error","code":null}}"#),
        ]),
        Reply::Events(vec![data(
            r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
        )]),
    ])
    .await;
    let model = model(&url);
    let server_error = model.stream(hi(), &|_| {}).await.expect_err("fails");
    assert_eq!(server_error.code(), "chat.provider.unavailable");
    assert_eq!(
        server_error.retry().map(|hint| hint.certainty),
        Some(Certainty::Definite)
    );
    let limited = model.stream(hi(), &|_| {}).await.expect_err("fails");
    assert_eq!(limited.code(), "chat.provider.rate_limited");
}

#[tokio::test]
async fn a_stream_cut_before_its_finish_reason_is_an_uncertain_failure_never_a_partial_answer() {
    let (url, _seen) = server(vec![
        Reply::Events(vec![chunk(json!({"content": "half an ans"}), None)]),
        Reply::Events(vec![chunk(json!({"content": "no finish"}), None), done()]),
        Reply::Reset(vec![chunk(json!({"content": "cut"}), None)]),
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
    let reset = model.stream(hi(), &|_| {}).await.expect_err("fails");
    assert_eq!(reset.code(), "chat.provider.interrupted", "{reset:?}");
}

#[tokio::test]
async fn a_stream_without_usage_leaves_usage_unknown_and_is_charged_its_reservation() {
    let (url, _seen) = server(vec![Reply::Events(vec![
        chunk(json!({"content": "no usage"}), None),
        chunk(json!({}), Some("stop")),
        done(),
    ])])
    .await;
    let program = interaction(Arc::new(model(&url)), 2);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("openai-unmetered", ask("hi")))
        .await
        .expect("starts");
    let output: InteractionOutput = handle.output().await.expect("completes");
    assert_eq!(output.response.usage(), None);
    let view = engine
        .inspect(&scope(), handle.tree(), Visibility::Public)
        .await
        .expect("inspects");
    let out = Name::new(TOKENS_OUT).expect("valid");
    assert_eq!(
        view.root().usage.meters.get(&out),
        Some(&100),
        "the reservation (max_tokens), never a silent 0"
    );
}

#[tokio::test]
async fn error_statuses_are_classified_with_retry_advice_and_retry_after() {
    let error = |status: u16, headers: Vec<(&'static str, String)>| Reply::Json {
        status,
        headers,
        body: json!({"error": {"message": format!("status {status}"), "type": "x", "code": null}})
            .to_string(),
    };
    let (url, _seen) = server(vec![
        error(429, vec![("retry-after", "3".into())]),
        error(
            503,
            vec![
                ("retry-after", "Wed, 21 Oct 2015 07:28:30 GMT".into()),
                ("date", "Wed, 21 Oct 2015 07:28:00 GMT".into()),
            ],
        ),
        error(400, Vec::new()),
        error(401, Vec::new()),
    ])
    .await;
    let model = model(&url);
    let rate_limited = model.call(hi()).await.expect_err("fails");
    assert_eq!(rate_limited.code(), "chat.provider.rate_limited");
    assert_eq!(rate_limited.status(), Some(429));
    let hint = rate_limited.retry().expect("retryable");
    assert_eq!(hint.certainty, Certainty::Definite);
    assert_eq!(hint.after, Some(Duration::from_secs(3)));
    let unavailable = model.call(hi()).await.expect_err("fails");
    assert_eq!(unavailable.code(), "chat.provider.unavailable");
    assert_eq!(
        unavailable.retry().and_then(|hint| hint.after),
        Some(Duration::from_secs(30))
    );
    for status in [400, 401] {
        let refused = model.call(hi()).await.expect_err("fails");
        assert_eq!(refused.code(), "chat.provider.refused");
        assert_eq!(refused.status(), Some(status));
        assert_eq!(refused.retry(), None);
        assert!(refused.to_string().contains(&format!("status {status}")));
    }
}

#[tokio::test]
async fn a_429_fails_the_interaction_with_its_code_and_advice() {
    let (url, _seen) = server(vec![Reply::Json {
        status: 429,
        headers: vec![("retry-after", "20".into())],
        body: json!({"error": {"message": "slow down"}}).to_string(),
    }])
    .await;
    // Without retries the first failure is the interaction's.
    let program = interaction_with(Arc::new(model(&url)), 2, RetryPolicy::none());
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let termination = engine
        .start(&program, start("openai-429", ask("hi")))
        .await
        .expect("starts")
        .await_result()
        .await
        .expect("terminates");
    assert_eq!(termination.status(), Status::Failed);
    let failure = termination.failure().expect("failure");
    assert_eq!(failure.code(), "chat.provider.rate_limited");
    assert!(
        failure.message.contains("http 429") && failure.message.contains("retry after 20000ms"),
        "{}",
        failure.message
    );
}

/// The records of `kind` in the tree's log so far.
fn logged(store: &MemoryStore, tree: baton_run::TreeId, kind: RecordKind) -> Vec<RecordBody> {
    store
        .records(tree)
        .iter()
        .filter(|record| record.kind == kind)
        .map(|record| record.decode().expect("decodes"))
        .collect()
}

async fn until_logged(
    store: &MemoryStore,
    tree: baton_run::TreeId,
    kind: RecordKind,
    count: usize,
) {
    for _ in 0..1_000_000 {
        if logged(store, tree, kind).len() >= count {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("{count} {kind} records never appeared");
}

#[tokio::test]
async fn a_rate_limited_call_is_tried_again_after_the_retry_after_header_and_completes() {
    let rate_limited = |after: &str| Reply::Json {
        status: 429,
        headers: vec![("retry-after", after.into())],
        body: json!({"error": {"message": "slow down"}}).to_string(),
    };
    let (url, mut seen) = server(vec![
        rate_limited("7"),
        rate_limited("3"),
        text_stream(&["hel", "lo"]),
    ])
    .await;
    // The default model retry: 4 attempts, backoff from 1 s.
    let program = interaction(Arc::new(model(&url)), 2);
    let store = MemoryStore::keeping_history();
    let clock = ManualClock::new(Timestamp(1_000_000));
    let engine = Engine::new(EngineConfig {
        programs: vec![program.erase()],
        clock: Arc::new(clock.clone()),
        ..EngineConfig::new(Arc::new(store.clone()))
    })
    .expect("valid");
    let tree = engine
        .start(&program, start("openai-retry", ask("hi")))
        .await
        .expect("starts")
        .tree();
    next(&mut seen).await;
    until_logged(&store, tree, RecordKind::EffectRetrying, 1).await;
    let at = |body: &RecordBody| match body {
        RecordBody::EffectRetrying { at, .. } => *at,
        other => panic!("not a retry: {other:?}"),
    };
    // Retry-After said 7 s, more than the policy's first backoff of 1 s.
    let first = at(&logged(&store, tree, RecordKind::EffectRetrying)[0]);
    assert_eq!(first, Timestamp(1_000_000 + 7_000));
    clock.advance(Duration::from_millis(6_999));
    for _ in 0..1_000 {
        tokio::task::yield_now().await;
    }
    assert!(
        seen.try_recv().is_err() && logged(&store, tree, RecordKind::EffectPending).len() == 1,
        "nothing is sent before the backoff ends"
    );
    clock.advance(Duration::from_millis(1));
    next(&mut seen).await;
    until_logged(&store, tree, RecordKind::EffectRetrying, 2).await;
    let second = at(&logged(&store, tree, RecordKind::EffectRetrying)[1]);
    assert_eq!(
        second,
        Timestamp(1_000_000 + 7_000 + 3_000),
        "the header wins again"
    );
    // While it backs off, inspect shows the failed attempts and when the
    // next one starts.
    let view = engine
        .inspect(&scope(), tree, Visibility::Public)
        .await
        .expect("inspects");
    let effect = view
        .processes
        .iter()
        .flat_map(|p| p.effects.iter())
        .next()
        .expect("the model call");
    assert_eq!(effect.failed_attempts, 2);
    assert_eq!(effect.retry_at, Some(second));
    clock.advance(Duration::from_millis(3_000));
    next(&mut seen).await;
    let termination = engine
        .process::<InteractionOutput>(&scope(), tree)
        .await
        .expect("attached")
        .await_result()
        .await
        .expect("terminates");
    assert_eq!(termination.status(), Status::Completed);
    assert_eq!(
        logged(&store, tree, RecordKind::EffectPending).len(),
        3,
        "three attempts, each logged before it was sent"
    );
}

#[tokio::test]
async fn malformed_answers_are_classified_and_never_panic() {
    let (url, _seen) = server(vec![
        Reply::json(200, "{\"choices\": ["),
        Reply::json(200, json!({"choices": []}).to_string()),
        Reply::Events(vec![data("\"not a chunk\"")]),
        Reply::json(200, "x".repeat(100_000)),
    ])
    .await;
    let mut config = config(&url);
    config.max_response_bytes = 50_000;
    let model = OpenAiModel::new(config).expect("a client");
    let truncated = model.call(hi()).await.expect_err("malformed");
    assert!(
        matches!(truncated, ModelError::Malformed(_)),
        "{truncated:?}"
    );
    assert_eq!(truncated.retry(), None);
    let empty = model.call(hi()).await.expect_err("no choices");
    assert!(matches!(empty, ModelError::Malformed(_)), "{empty:?}");
    let bad_event = model.stream(hi(), &|_| {}).await.expect_err("bad event");
    assert!(
        matches!(bad_event, ModelError::Malformed(_)),
        "{bad_event:?}"
    );
    let big = model.call(hi()).await.expect_err("too large");
    assert_eq!(big, ModelError::TooLarge { limit: 50_000 });
}

#[tokio::test]
async fn a_silent_server_times_out_as_an_uncertain_failure() {
    let (url, _seen) = server(vec![Reply::Hang]).await;
    let error = model(&url).call(hi()).await.expect_err("times out");
    assert!(matches!(error, ModelError::Timeout(_)), "{error:?}");
    assert_eq!(
        error.retry().map(|hint| hint.certainty),
        Some(Certainty::Uncertain)
    );
}

#[tokio::test]
async fn an_unreachable_server_is_a_definite_unavailable_failure() {
    // Bind and drop a listener so the port is (very likely) closed.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds")
        .local_addr()
        .expect("address")
        .port();
    let error = model(&format!("http://127.0.0.1:{port}"))
        .call(hi())
        .await
        .expect_err("unreachable");
    assert_eq!(error.code(), "chat.provider.unavailable", "{error:?}");
    assert_eq!(
        error.retry().map(|hint| hint.certainty),
        Some(Certainty::Definite),
        "nothing was sent"
    );
}

fn priced(base_url: &str, price: Price) -> OpenAiModel {
    let mut config = config(base_url);
    config.prices.insert("test-model".into(), price);
    OpenAiModel::new(config).expect("a client")
}

const PRICE: Price = Price {
    input: 2_500_000,
    cached_input: Some(1_250_000),
    output: 10_000_000,
    reasoning: Some(12_000_000),
};

#[tokio::test]
async fn a_cost_budget_below_one_calls_maximum_refuses_before_any_io() {
    let (url, mut seen) = server(vec![text_completion("never sent")]).await;
    let program = interaction(Arc::new(priced(&url, PRICE)), 2);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let mut request = start("openai-poor", ask("hi"));
    // 100 output tokens alone may cost 100 × 12 = 1200 micros.
    request.budget = Budget::unlimited().with_meter(Name::new(COST_MICROS).expect("valid"), 1_000);
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
    let usage = json!({
        "prompt_tokens": 1_000,
        "completion_tokens": 300,
        "total_tokens": 1_300,
        "prompt_tokens_details": {"cached_tokens": 400},
        "completion_tokens_details": {"reasoning_tokens": 100},
    });
    let small = json!({"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8});
    let stream = |text: &str, usage: &Value| {
        Reply::Events(vec![
            chunk(json!({"content": text}), None),
            chunk(json!({}), Some("stop")),
            usage_chunk(usage.clone()),
            done(),
        ])
    };
    let (url, _seen) = server(vec![stream("one", &usage), stream("two", &small)]).await;
    let model = Arc::new(priced(&url, PRICE));
    let mut config = InteractionConfig::new("test.priced", "Priced.", model, 400, 2);
    config.validator = Some(Arc::new(|response: &baton_agent::Response| {
        if response.message().text() == "one" {
            Err("again".into())
        } else {
            Ok(())
        }
    }));
    config.build = "validator asks once more".into();
    let program = Interaction::new(config).expect("valid").program();
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    // A long prompt: its input bound covers the 1000 input tokens reported.
    let mut request = start("openai-cost", ask(&"x".repeat(2_000)));
    request.budget =
        Budget::unlimited().with_meter(Name::new(COST_MICROS).expect("valid"), 1_000_000);
    let handle = engine.start(&program, request).await.expect("starts");
    handle.output().await.expect("completes");
    let view = engine
        .inspect(&scope(), handle.tree(), Visibility::Public)
        .await
        .expect("inspects");
    let first = Usage {
        input_tokens: 1_000,
        output_tokens: 300,
        cached_input_tokens: 400,
        reasoning_tokens: 100,
    };
    let second = Usage {
        input_tokens: 7,
        output_tokens: 1,
        ..Usage::default()
    };
    // ⌈(600 × 2.5M + 400 × 1.25M + 200 × 10M + 100 × 12M) ÷ 10⁶⌉ = 5200, and
    // ⌈(7 × 2.5M + 1 × 10M) ÷ 10⁶⌉ = ⌈27.5⌉ = 28.
    assert_eq!(PRICE.cost_micros(&first), 5_200);
    assert_eq!(PRICE.cost_micros(&second), 28);
    assert_eq!(
        view.root()
            .usage
            .meters
            .get(&Name::new(COST_MICROS).expect("valid")),
        Some(&5_228)
    );
}

#[test]
fn the_wire_request_maps_every_role() {
    let request = Request::of(vec![
        Message::system("s"),
        Message::new(
            Role::User,
            vec![
                baton_agent::Part::text("look"),
                baton_agent::Part::Media {
                    media: baton_agent::MediaRef {
                        url: "https://example.invalid/cat.png".into(),
                        media_type: "image/png".into(),
                    },
                },
            ],
        )
        .expect("valid"),
        Message::tool_calls(Some("calling".into()), vec![call("c1", "add", "{}")]).expect("valid"),
        Message::tool_results(vec![baton_agent::ToolResult {
            id: "c1".into(),
            name: "add".into(),
            output: "oops".into(),
            is_error: true,
        }])
        .expect("valid"),
    ])
    .expect("valid");
    let body = model("http://127.0.0.1:9").request_body(&request, Delivery::Whole);
    assert_eq!(body["messages"][1]["content"][1]["type"], "image_url");
    assert_eq!(body["messages"][2]["content"], "calling");
    assert_eq!(body["messages"][2]["tool_calls"][0]["type"], "function");
    assert_eq!(body["messages"][3]["role"], "tool");
    assert_eq!(body["messages"][3]["tool_call_id"], "c1");
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
    let config = OpenAiConfig::from_vars(vars(&[
        ("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"),
        ("OPENAI_API_KEY", "sk-secret"),
        ("OPENAI_MODEL", "llama"),
    ]))
    .expect("configured");
    assert_eq!(config.base_url, "http://127.0.0.1:8000/v1");
    assert_eq!(config.api_key.as_deref(), Some("sk-secret"));
    assert_eq!(config.model, "llama");
    assert!(
        !format!("{config:?}").contains("sk-secret"),
        "the key is redacted"
    );
    let defaults =
        OpenAiConfig::from_vars(vars(&[("OPENAI_MODEL", "gpt"), ("OPENAI_API_KEY", "")]))
            .expect("configured");
    assert_eq!(defaults.base_url, baton_agent::openai::DEFAULT_BASE_URL);
    assert_eq!(defaults.api_key, None);
    let missing = OpenAiConfig::from_vars(vars(&[])).expect_err("no model");
    assert_eq!(missing.code(), "interaction.host.failed");
}
