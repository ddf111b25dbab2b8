//! A team's `Decision` in OpenAI's strict mode: today's untyped `Decision`
//! schema breaks the published rules (and has no strict form, so the
//! provider falls back to non-strict), while the decision schema of a team
//! with typed state, output and workers keeps them all, and a strict answer
//! from a server on 127.0.0.1 decodes as a `Decision`.

use std::sync::Arc;

use baton::agent::openai::{OpenAiConfig, OpenAiModel};
use baton::agent::strict::StrictSchema;
use baton::agent::{ChatModel, Message, Request, output};
use baton::run::program::Schema;
use baton::team::{Binding, Decision, Mode};
use baton_testkit::strict::check_openai_strict;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn researcher() -> Binding {
    let notes = std::env::temp_dir().join("baton-strict-decision-notes");
    let researcher = baton_examples::research_team::researcher(
        Arc::new(baton_examples::research_team::researcher_model()),
        "http://127.0.0.1:9/search".into(),
        notes,
    )
    .expect("builds");
    Binding::new(&researcher.program())
}

fn typed() -> Value {
    baton::team::decision_schema(
        &Schema::of::<String>(),
        &Schema::of::<String>(),
        &[researcher()],
    )
    .json()
    .to_value()
}

#[test]
fn todays_decision_schema_breaks_the_strict_rules_and_has_no_strict_form() {
    let raw = Schema::of::<Decision>().json().to_value();
    let broken: Vec<&str> = check_openai_strict(&raw)
        .iter()
        .map(|violation| violation.rule.id)
        .collect();
    for rule in [
        "all-required",
        "supported-types",
        "supported-keywords",
        "ref-alone",
    ] {
        assert!(broken.contains(&rule), "{rule} not reported: {broken:?}");
    }
    let error = StrictSchema::new(&raw).expect_err("untyped members cannot be strict");
    assert!(
        error.reason.contains("untyped member"),
        "the first untyped member is named: {error}"
    );
}

#[test]
fn a_typed_teams_decision_schema_keeps_every_strict_rule_once_transformed() {
    let strict = StrictSchema::new(&typed()).expect("a typed team's decision is expressible");
    let violations = check_openai_strict(strict.schema());
    assert!(
        violations.is_empty(),
        "{violations:#?}\n{:#}",
        strict.schema()
    );
}

/// Answers one Chat Completions request with `content`; reports the body.
async fn answer_once(content: String) -> (String, tokio::task::JoinHandle<Value>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let url = format!("http://{}/v1", listener.local_addr().expect("address"));
    let served = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("a connection");
        let mut data = Vec::new();
        let mut buffer = [0u8; 8192];
        let (end, length) = loop {
            let n = stream.read(&mut buffer).await.expect("reads");
            data.extend_from_slice(&buffer[..n]);
            if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&data[..end]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map(|v| v.trim().parse().expect("a length"))
                    .unwrap_or(0);
                break (end, length);
            }
        };
        while data.len() < end + 4 + length {
            let n = stream.read(&mut buffer).await.expect("reads");
            data.extend_from_slice(&buffer[..n]);
        }
        let body = json!({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
        })
        .to_string();
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(reply.as_bytes()).await.expect("writes");
        serde_json::from_slice(&data[end + 4..end + 4 + length]).expect("a JSON body")
    });
    (url, served)
}

#[tokio::test]
async fn a_strict_answer_for_a_typed_team_decodes_as_a_decision() {
    // What strict mode makes a model write: every member, absent ones as null.
    let answer = json!({
        "mode": "wait",
        "state": "the question",
        "tasks": [{"key": "research", "worker": "research.researcher", "input": "the question"}],
        "controls": null,
        "output": null,
    });
    let (url, served) = answer_once(answer.to_string()).await;
    let model = OpenAiModel::new(OpenAiConfig::new(url, "test-model")).expect("a client");
    let schema =
        Schema::new(baton::run::Payload::from_value(&typed()).expect("encodes")).expect("compiles");
    let mut request = Request::of(vec![Message::user("turn 1")]).expect("valid");
    let mut options = request.options().clone();
    options.response_format = Some(output::format_for_schema("Decision", &schema));
    request = request.with_options(options).expect("valid");
    let response = model.call(request).await.expect("answers");
    let decision: Decision = output::decode(&response).expect("decodes as a Decision");
    assert_eq!(decision.mode, Some(Mode::Wait));
    assert_eq!(decision.tasks.len(), 1);
    assert!(
        decision.output.is_none(),
        "a null output read back as absent"
    );
    let body = served.await.expect("served");
    let format = &body["response_format"]["json_schema"];
    assert_eq!(format["strict"], true);
    let violations = check_openai_strict(&format["schema"]);
    assert!(violations.is_empty(), "{violations:#?}");
}
