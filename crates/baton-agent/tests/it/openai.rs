//! The OpenAI-compatible provider against a local HTTP/1.1 server (loopback
//! only) that speaks the Chat Completions wire format as publicly
//! documented: plain answers, tool calls, server-sent events, error statuses,
//! malformed bodies and timeouts.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use baton_agent::openai::{OpenAiConfig, OpenAiModel};
use baton_agent::{
    ChatModel, FinishReason, InteractionOutput, Message, ModelError, Request, Role, output,
};
use baton_run::{EventKind, MemoryStore, Status, Visibility};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// What the server answers to one request.
enum Reply {
    Json(u16, String),
    Sse(Vec<Value>),
    Hang,
}

/// A one-request-per-connection HTTP/1.1 server on 127.0.0.1 answering
/// with the scripted replies in order; every request body is reported.
async fn server(replies: Vec<Reply>) -> (String, mpsc::UnboundedReceiver<Value>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let address = listener.local_addr().expect("address");
    let (bodies, received) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        for reply in replies {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let body = read_request(&mut stream).await;
            let _ = bodies.send(serde_json::from_slice(&body).unwrap_or(Value::Null));
            respond(stream, reply).await;
        }
    });
    (format!("http://{address}/v1"), received)
}

async fn read_request(stream: &mut TcpStream) -> Vec<u8> {
    let mut data = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let n = stream.read(&mut buffer).await.expect("reads");
        assert!(n > 0, "the client closed before a whole request");
        data.extend_from_slice(&buffer[..n]);
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).to_lowercase();
            assert!(head.starts_with("post /v1/chat/completions "), "{head}");
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().expect("a length"))
                .unwrap_or(0);
            while data.len() < end + 4 + length {
                let n = stream.read(&mut buffer).await.expect("reads");
                data.extend_from_slice(&buffer[..n]);
            }
            return data[end + 4..end + 4 + length].to_vec();
        }
    }
}

async fn respond(mut stream: TcpStream, reply: Reply) {
    match reply {
        Reply::Json(status, body) => {
            let head = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
        }
        Reply::Sse(events) => {
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
                .await;
            for event in events {
                let _ = stream
                    .write_all(format!("data: {event}\n\n").as_bytes())
                    .await;
                let _ = stream.flush().await;
            }
            let _ = stream.write_all(b"data: [DONE]\n\n").await;
        }
        Reply::Hang => std::future::pending::<()>().await,
    }
    let _ = stream.shutdown().await;
}

fn model(base_url: &str) -> OpenAiModel {
    let mut config = OpenAiConfig::new(base_url, "test-model");
    config.api_key = Some("sk-test".into());
    config.timeout = Duration::from_millis(500);
    OpenAiModel::new(config).expect("a client")
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

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-2",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "test-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    })
}

fn usage_chunk() -> Value {
    json!({
        "id": "chatcmpl-2",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24},
    })
}

fn text_stream(pieces: &[&str]) -> Reply {
    let mut events = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    events.extend(pieces.iter().map(|p| chunk(json!({"content": p}), None)));
    events.push(chunk(json!({}), Some("stop")));
    events.push(usage_chunk());
    Reply::Sse(events)
}

#[tokio::test]
async fn a_plain_completion_becomes_a_response() {
    let (url, mut bodies) = server(vec![Reply::Json(
        200,
        completion(
            json!({"role": "assistant", "content": "Hello!", "refusal": null}),
            "stop",
        ),
    )])
    .await;
    let model = model(&url);
    let request = Request::of(vec![Message::system("Be kind."), Message::user("Hi")])
        .expect("valid")
        .with_options(baton_agent::Options {
            max_tokens: Some(64),
            temperature: Some(0.5),
            response_format: None,
        })
        .expect("valid");
    let response = model.call(request).await.expect("answers");
    assert_eq!(response.message().text(), "Hello!");
    assert_eq!(response.finish_reason(), FinishReason::Stop);
    assert_eq!(response.usage().input_tokens, 11);
    assert_eq!(response.usage().output_tokens, 3);
    let body = bodies.recv().await.expect("a request");
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["max_tokens"], 64);
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
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Weather {
    city: String,
    celsius: i32,
}

#[tokio::test]
async fn typed_output_sends_a_json_schema_response_format() {
    let (url, mut bodies) = server(vec![Reply::Json(
        200,
        completion(
            json!({"role": "assistant", "content": "{\"city\":\"Oslo\",\"celsius\":-3}"}),
            "stop",
        ),
    )])
    .await;
    let request = Request::of(vec![Message::user("Weather in Oslo?")]).expect("valid");
    let weather: Weather = output::output(&model(&url), &request)
        .await
        .expect("decodes");
    assert_eq!((weather.city.as_str(), weather.celsius), ("Oslo", -3));
    let body = bodies.recv().await.expect("a request");
    let format = &body["response_format"];
    assert_eq!(format["type"], "json_schema");
    assert_eq!(format["json_schema"]["name"], "Weather");
    assert_eq!(format["json_schema"]["strict"], true);
    assert_eq!(
        format["json_schema"]["schema"]["additionalProperties"],
        false
    );
}

#[tokio::test]
async fn a_tool_call_round_trip_runs_through_an_interaction() {
    let (url, mut bodies) = server(vec![
        Reply::Sse(vec![
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
            usage_chunk(),
        ]),
        text_stream(&["The sum ", "is 5."]),
    ])
    .await;
    let program = interaction(Arc::new(model(&url)), 4);
    let engine = engine(Arc::new(MemoryStore::new()), &program);
    let handle = engine
        .start(&program, start("openai-tools", ask("2 + 3?")))
        .await
        .expect("starts");
    let output: InteractionOutput = handle.output().await.expect("completes");
    assert_eq!(output.response.message().text(), "The sum is 5.");
    assert_eq!(output.model_calls, 2);

    let first = bodies.recv().await.expect("first request");
    assert_eq!(first["stream"], true);
    assert_eq!(first["stream_options"]["include_usage"], true);
    assert_eq!(first["tools"][0]["type"], "function");
    assert_eq!(first["tools"][0]["function"]["name"], "add");
    assert_eq!(
        first["tools"][0]["function"]["parameters"]["type"],
        "object"
    );
    assert_eq!(first["tool_choice"], "auto");
    let second = bodies.recv().await.expect("second request");
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
    let (url, _bodies) = server(vec![text_stream(&["Hel", "lo", ", ", "world"])]).await;
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
    while let Ok(event) = events.try_recv() {
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
    let tokens = baton_run::Name::new("tokens").expect("valid");
    assert_eq!(
        view.root().usage.meters.get(&tokens),
        Some(&4),
        "usage reached the meter"
    );
}

#[tokio::test]
async fn error_statuses_are_classified_with_their_retryability() {
    let error = |status: u16| {
        Reply::Json(
            status,
            json!({"error": {"message": format!("status {status}"), "type": "x", "code": null}})
                .to_string(),
        )
    };
    let (url, _bodies) = server(vec![error(429), error(500), error(400), error(401)]).await;
    let model = model(&url);
    let request = || Request::of(vec![Message::user("hi")]).expect("valid");
    let mut seen = Vec::new();
    for _ in 0..4 {
        let error = model.call(request()).await.expect_err("fails");
        assert_eq!(error.code(), "interaction.model.failed");
        seen.push((error.status(), error.is_retryable()));
        if let ModelError::Status { message, .. } = &error {
            assert!(message.starts_with("status "), "{message}");
        }
    }
    assert_eq!(
        seen,
        [
            (Some(429), true),
            (Some(500), true),
            (Some(400), false),
            (Some(401), false)
        ]
    );
}

#[tokio::test]
async fn a_429_fails_the_interaction_with_the_status_in_its_failure() {
    let (url, _bodies) = server(vec![Reply::Json(
        429,
        json!({"error": {"message": "slow down"}}).to_string(),
    )])
    .await;
    let program = interaction(Arc::new(model(&url)), 2);
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
    assert_eq!(failure.code(), "interaction.model.failed");
    assert!(
        failure.message.starts_with("http 429, retryable"),
        "{}",
        failure.message
    );
}

#[tokio::test]
async fn malformed_answers_are_classified_and_never_panic() {
    let (url, _bodies) = server(vec![
        Reply::Json(200, "{\"choices\": [".into()),
        Reply::Json(200, json!({"choices": []}).to_string()),
        Reply::Sse(vec![json!("not a chunk")]),
        Reply::Json(200, "x".repeat(100_000)),
    ])
    .await;
    let mut config = OpenAiConfig::new(&url, "test-model");
    config.max_response_bytes = 50_000;
    let model = OpenAiModel::new(config).expect("a client");
    let request = || Request::of(vec![Message::user("hi")]).expect("valid");
    let truncated = model.call(request()).await.expect_err("malformed");
    assert!(
        matches!(truncated, ModelError::Malformed(_)),
        "{truncated:?}"
    );
    assert!(!truncated.is_retryable());
    let empty = model.call(request()).await.expect_err("no choices");
    assert!(matches!(empty, ModelError::Malformed(_)), "{empty:?}");
    let bad_event = model
        .stream(request(), &|_| {})
        .await
        .expect_err("bad event");
    assert!(
        matches!(bad_event, ModelError::Malformed(_)),
        "{bad_event:?}"
    );
    let big = model.call(request()).await.expect_err("too large");
    assert_eq!(big, ModelError::TooLarge { limit: 50_000 });
}

#[tokio::test]
async fn a_silent_server_times_out_as_a_retryable_failure() {
    let (url, _bodies) = server(vec![Reply::Hang]).await;
    let error = model(&url)
        .call(Request::of(vec![Message::user("hi")]).expect("valid"))
        .await
        .expect_err("times out");
    assert!(matches!(error, ModelError::Timeout(_)), "{error:?}");
    assert!(error.is_retryable());
}

#[tokio::test]
async fn an_unreachable_server_is_a_transport_failure() {
    // Bind and drop a listener so the port is (very likely) closed.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds")
        .local_addr()
        .expect("address")
        .port();
    let error = model(&format!("http://127.0.0.1:{port}/v1"))
        .call(Request::of(vec![Message::user("hi")]).expect("valid"))
        .await
        .expect_err("unreachable");
    assert!(
        matches!(error, ModelError::Transport(_) | ModelError::Timeout(_)),
        "{error:?}"
    );
    assert!(error.is_retryable());
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
    let body = baton_agent::openai::request_body("m", &request, false);
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
