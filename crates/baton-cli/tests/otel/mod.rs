//! Span export over OTLP/HTTP (feature `otel`): a receiver on loopback
//! decodes what is exported with the collector's protobuf types, and the
//! tests check the span tree and the GenAI attributes of real runs, in
//! this process through `baton_cli::telemetry`, and in the `baton` binary
//! (a demo, and `serve` taking a crashed tree over) through the standard
//! variables, flushed before the process exits.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use baton_cli::telemetry::{DEFAULT_FILTER, Telemetry, TelemetryConfig};
use baton_examples::research_team::{Models, run_with, stub_search};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message as _;
use tracing_subscriber::layer::SubscriberExt as _;

/// One exported span, flattened: its ids, name, attributes and the
/// resource's `service.name`.
#[derive(Clone, Debug)]
struct Exported {
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    name: String,
    attributes: BTreeMap<String, String>,
    service: String,
}

impl Exported {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// An OTLP/HTTP receiver on 127.0.0.1 (`POST /v1/traces`, protobuf), on a
/// runtime of its own so it answers while the test thread blocks.
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<Exported>>>,
    _runtime: tokio::runtime::Runtime,
}

impl Receiver {
    fn start() -> Receiver {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(receive))
            .with_state(spans.clone());
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("a port");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        runtime.spawn(async move { axum::serve(listener, app).await });
        Receiver {
            url,
            spans,
            _runtime: runtime,
        }
    }

    fn spans(&self) -> Vec<Exported> {
        self.spans.lock().expect("not poisoned").clone()
    }
}

async fn receive(State(spans): State<Arc<Mutex<Vec<Exported>>>>, body: Bytes) -> impl IntoResponse {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, Vec::new()).into_response();
    };
    let mut received = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .map(|resource| attributes(&resource.attributes))
            .unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for scope_spans in resource_spans.scope_spans {
            for span in scope_spans.spans {
                received.push(Exported {
                    trace: span.trace_id,
                    id: span.span_id,
                    parent: span.parent_span_id,
                    name: span.name,
                    attributes: attributes(&span.attributes),
                    service: service.clone(),
                });
            }
        }
    }
    spans.lock().expect("not poisoned").extend(received);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
        .into_response()
}

fn attributes(pairs: &[KeyValue]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|pair| (pair.key.clone(), text(pair.value.as_ref())))
        .collect()
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|value| value.value.as_ref()) {
        Some(any_value::Value::StringValue(text)) => text.clone(),
        Some(any_value::Value::IntValue(number)) => number.to_string(),
        Some(any_value::Value::BoolValue(flag)) => flag.to_string(),
        Some(any_value::Value::DoubleValue(number)) => number.to_string(),
        other => format!("{other:?}"),
    }
}

/// The exported spans by id.
struct Forest {
    spans: Vec<Exported>,
}

impl Forest {
    fn parent(&self, span: &Exported) -> Option<&Exported> {
        self.spans.iter().find(|s| s.id == span.parent)
    }

    /// The names from `span` up to its root.
    fn ancestry(&self, span: &Exported) -> Vec<String> {
        let mut names = vec![span.name.clone()];
        let mut next = self.parent(span);
        while let Some(parent) = next {
            names.push(parent.name.clone());
            next = self.parent(parent);
        }
        names
    }

    fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Exported> {
        self.spans.iter().filter(move |s| s.name == name)
    }
}

#[test]
fn a_model_run_exports_its_span_tree_with_gen_ai_attributes() {
    let receiver = Receiver::start();
    let telemetry = Telemetry::new(TelemetryConfig {
        service_name: "baton-otel-test".into(),
        filter: DEFAULT_FILTER.into(),
        endpoint: Some(format!("{}/v1/traces", receiver.url)),
    })
    .expect("the exporter builds");
    let notes = tempfile::tempdir().expect("temp dir");
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    let lines = tracing::subscriber::with_default(subscriber, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let lines = runtime.block_on(async {
            let search = stub_search().await.expect("the stub search serves");
            run_with(&Models::scripted(), search, notes.path().to_owned())
                .await
                .expect("the research team runs")
        });
        // Ending the runtime ends the trees' tasks, so their spans close.
        drop(runtime);
        lines
    });
    assert!(lines[1].starts_with("answer: Durable agents"), "{lines:?}");
    telemetry.shutdown().expect("the spans are flushed");

    let forest = Forest {
        spans: receiver.spans(),
    };
    assert!(forest.spans.iter().all(|s| s.service == "baton-otel-test"));
    let trace = &forest.named("tree").next().expect("a tree span").trace;
    let strays: Vec<_> = forest
        .spans
        .iter()
        .filter(|s| &s.trace != trace)
        .map(|s| (s.name.as_str(), s.parent.is_empty(), &s.attributes))
        .collect();
    assert!(strays.is_empty(), "one trace: {strays:#?}");

    // tree → process (the team) → … ; every step and effect under a process.
    let team = forest
        .named("process")
        .find(|s| s.attribute("program") == Some("research.team"))
        .expect("the team's process span");
    assert_eq!(forest.parent(team).map(|p| p.name.as_str()), Some("tree"));
    for name in ["step", "effect"] {
        let spans: Vec<_> = forest.named(name).collect();
        assert!(!spans.is_empty(), "{name} spans");
        for span in spans {
            assert_eq!(
                forest.parent(span).map(|p| p.name.as_str()),
                Some("process"),
                "{name} span {:?}",
                span.attributes
            );
        }
    }

    // The researcher's first call asks for a search: its chat span carries
    // the GenAI attributes, under its effect, its process, …, the tree.
    let chat = forest
        .named("chat research-researcher")
        .find(|s| s.attribute("gen_ai.response.finish_reasons") == Some("tool_calls"))
        .expect("the researcher's tool-calling model call");
    for (key, value) in [
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.provider.name", "scripted"),
        ("gen_ai.request.model", "research-researcher"),
        ("gen_ai.response.model", "research-researcher"),
        ("gen_ai.usage.output_tokens", "40"),
    ] {
        assert_eq!(
            chat.attribute(key),
            Some(value),
            "{key}: {:?}",
            chat.attributes
        );
    }
    let input: u64 = chat
        .attribute("gen_ai.usage.input_tokens")
        .and_then(|n| n.parse().ok())
        .expect("input tokens");
    assert!(input > 0);
    let ancestry = forest.ancestry(chat);
    assert_eq!(ancestry[1..3], ["effect", "process"], "{ancestry:?}");
    assert_eq!(ancestry.last().map(String::as_str), Some("tree"));

    // Each tool call: `execute_tool {name}` under its effect, under the
    // tool's process, under the interaction's process.
    for tool in ["search", "write_note"] {
        let name = format!("execute_tool {tool}");
        let span = forest
            .named(&name)
            .next()
            .unwrap_or_else(|| panic!("an execute_tool {tool} span"));
        assert_eq!(
            span.attribute("gen_ai.operation.name"),
            Some("execute_tool")
        );
        assert_eq!(span.attribute("gen_ai.tool.name"), Some(tool));
        let effect = forest.parent(span).expect("its effect");
        let process = forest.parent(effect).expect("its process");
        assert_eq!(
            (effect.name.as_str(), process.name.as_str()),
            ("effect", "process")
        );
        assert_eq!(
            process.attribute("program"),
            Some(format!("tool.{tool}").as_str())
        );
        assert_eq!(
            forest.ancestry(span).last().map(String::as_str),
            Some("tree")
        );
    }
}

#[test]
fn the_binary_exports_to_the_standard_endpoint_and_flushes_on_exit() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let output = Command::new(env!("CARGO_BIN_EXE_baton"))
        .current_dir(dir.path())
        .args(["demo", "router"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url)
        .env("OTEL_SERVICE_NAME", "baton-demo")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_SDK_DISABLED")
        .env_remove(baton_cli::telemetry::FILTER_VARIABLE)
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The process has exited: whatever it exported has arrived.
    let forest = Forest {
        spans: receiver.spans(),
    };
    assert!(!forest.spans.is_empty(), "spans were exported before exit");
    assert!(forest.spans.iter().all(|s| s.service == "baton-demo"));
    let chat = forest
        .spans
        .iter()
        .find(|s| s.attribute("gen_ai.operation.name") == Some("chat"))
        .expect("the router's model call");
    assert_eq!(chat.attribute("gen_ai.provider.name"), Some("scripted"));
    assert!(chat.attribute("gen_ai.request.model").is_some());
    assert!(chat.attribute("gen_ai.usage.input_tokens").is_some());
    assert!(chat.attribute("gen_ai.response.finish_reasons").is_some());
    let ancestry = forest.ancestry(chat);
    assert_eq!(ancestry[1..3], ["effect", "process"], "{ancestry:?}");
    assert_eq!(ancestry.last().map(String::as_str), Some("tree"));
}

#[test]
fn serve_exports_the_trees_it_runs_and_flushes_when_it_stops() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("tokens.txt"), "demo 0123456789abcdef0123\n")
        .expect("writes the tokens file");
    let mut serving = Command::new(env!("CARGO_BIN_EXE_baton"))
        .current_dir(dir.path())
        .args(["serve", "--listen", "127.0.0.1:0", "--tokens", "tokens.txt"])
        .args(["--grace", "5s"])
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            format!("{}/v1/traces", receiver.url),
        )
        .env("OTEL_SERVICE_NAME", "baton-serve")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve starts");
    let mut lines = BufReader::new(serving.stderr.take().expect("stderr"))
        .lines()
        .map_while(Result::ok);
    let mut base = None;
    for line in lines.by_ref() {
        if let Some(rest) = line.strip_prefix("serving the HTTP API on ") {
            base = rest.split_whitespace().next().map(str::to_owned);
        }
        if line.starts_with("ready:") {
            break;
        }
    }
    let base = base.expect("serve printed its address");
    // Start the pause demo and answer its wait over HTTP: the tree finishes
    // in the host.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let client = reqwest::Client::new();
    let post = |path: String, body: &'static str| -> serde_json::Value {
        runtime.block_on(async {
            let response = client
                .post(format!("{base}{path}"))
                .bearer_auth("0123456789abcdef0123")
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .expect("the host answers");
            assert!(response.status().is_success(), "{}", response.status());
            let text = response.text().await.expect("a body");
            serde_json::from_str(&text).expect("json")
        })
    };
    let started = post(
        "/v1/trees?until=wait_opened&timeout_ms=20000".into(),
        r#"{"program":"demo.pause","id":"traced","input":"release 3.0"}"#,
    );
    let tree = started["tree"].as_str().expect("tree").to_owned();
    let wait = started["view"]["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find_map(|process| process["open_waits"][0]["id"].as_str())
        .expect("an open wait")
        .to_owned();
    let answered = post(
        format!("/v1/trees/{tree}/waits/{wait}?until=terminal&timeout_ms=20000"),
        r#""ship it""#,
    );
    assert_eq!(answered["view"]["status"], "done");
    let status = Command::new("kill")
        .args(["-INT", &serving.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let exited = serving.wait().expect("serve exits");
    assert!(exited.success(), "{exited:?}");

    // Everything the host traced arrived before it exited.
    let forest = Forest {
        spans: receiver.spans(),
    };
    assert!(forest.spans.iter().all(|s| s.service == "baton-serve"));
    let roots: Vec<_> = forest
        .named("tree")
        .filter(|s| s.attribute("tree") == Some(tree.as_str()))
        .collect();
    assert!(!roots.is_empty(), "the tree's spans");
    let root_process = forest
        .named("process")
        .find(|s| s.attribute("program") == Some("demo.pause"))
        .expect("the root process's span");
    assert_eq!(
        forest.parent(root_process).map(|p| p.name.as_str()),
        Some("tree")
    );
    assert!(
        forest
            .named("step")
            .any(|s| forest.parent(s).map(|p| &p.id) == Some(&root_process.id)),
        "the root's steps under its process"
    );
}
