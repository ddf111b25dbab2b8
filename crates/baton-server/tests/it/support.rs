//! A server in this process on 127.0.0.1:0 and a real HTTP client.

use std::sync::Arc;
use std::time::Duration;

use baton::run::store::Store;
use baton::run::{EngineConfig, MemoryStore, Program, Scope};
use baton::workflow::{Activity, ActivityConfig, ActivityContext};
use baton_server::{ServeConfig, ServeError, Server, ServerHandle, Tokens};
use reqwest::Method;
use serde_json::Value;

/// Scope A's token.
pub const TOKEN_A: &str = "token-of-scope-a-0123456789";
/// Scope B's token.
pub const TOKEN_B: &str = "token-of-scope-b-0123456789";

/// An activity that waits `input` milliseconds and returns it; replay
/// policy `Never`, so a call lost in a crash is an unknown effect.
pub fn slow() -> Program {
    Activity::<u64, u64>::new(
        ActivityConfig {
            build: "baton-server tests slow 1".into(),
            timeout: Duration::from_secs(600),
            ..ActivityConfig::new("test.slow", "Wait the given milliseconds.")
        },
        |ms: u64, context: ActivityContext| async move {
            let clock = context.clock();
            clock
                .sleep_until(clock.now().plus(Duration::from_millis(ms)))
                .await;
            Ok(ms)
        },
    )
    .unwrap()
    .program()
    .erase()
}

/// The programs the API tests drive: the pause scenario and `test.slow`.
pub fn programs() -> Vec<Program> {
    vec![baton_examples::pause::team().unwrap().erase(), slow()]
}

/// Tokens for scopes `a` and `b`.
pub fn tokens() -> Tokens {
    let mut tokens = Tokens::new();
    tokens.insert(Scope::new("a").unwrap(), TOKEN_A).unwrap();
    tokens.insert(Scope::new("b").unwrap(), TOKEN_B).unwrap();
    tokens
}

/// The configuration the API tests use over `store`.
pub fn config(store: Arc<dyn Store>) -> ServeConfig {
    ServeConfig {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        tokens: tokens(),
        grace: Duration::from_secs(10),
        ..ServeConfig::new(EngineConfig {
            programs: programs(),
            ..EngineConfig::new(store)
        })
    }
}

/// A running server and a client for it.
pub struct Running {
    pub base: String,
    pub client: reqwest::Client,
    pub shutdown: ServerHandle,
    pub task: tokio::task::JoinHandle<Result<(), ServeError>>,
}

impl Running {
    /// Binds and runs `config`.
    pub async fn start(config: ServeConfig) -> Running {
        let server = Server::bind(config).await.unwrap();
        let addr = server.local_addr().unwrap();
        let shutdown = server.handle();
        let task = tokio::spawn(server.run(std::future::pending()));
        Running {
            base: format!("http://{addr}"),
            client: reqwest::Client::new(),
            shutdown,
            task,
        }
    }

    /// A server over a fresh memory store.
    pub async fn memory() -> Running {
        Running::start(config(Arc::new(MemoryStore::new()))).await
    }

    /// Sends a request; the body is sent as is (JSON text), the answer
    /// read as JSON (`Value::Null` when empty or not JSON).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> Reply {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        Reply {
            status,
            content_type: headers
                .get("content-type")
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
            until: headers
                .get("baton-until")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned),
            json: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
        }
    }

    /// `GET` with a token.
    pub async fn get(&self, path: &str, token: &str) -> Reply {
        self.call(Method::GET, path, Some(token), None).await
    }

    /// `POST` with a token and a JSON body.
    pub async fn post(&self, path: &str, token: &str, body: &str) -> Reply {
        self.call(Method::POST, path, Some(token), Some(body)).await
    }

    /// Shuts the server down and waits for it.
    pub async fn stop(self) {
        self.shutdown.shutdown();
        self.task.await.unwrap().unwrap();
    }
}

/// What came back.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub until: Option<String>,
    pub json: Value,
    pub text: String,
}

impl Reply {
    /// Asserts a problem document with `status` and `code`.
    #[track_caller]
    pub fn assert_problem(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "{}", self.text);
        assert_eq!(
            self.content_type, "application/problem+json",
            "{}",
            self.text
        );
        assert_eq!(self.json["code"], code, "{}", self.text);
        assert_eq!(self.json["status"], status, "{}", self.text);
        assert_eq!(self.json["type"], format!("urn:baton:problem:{code}"));
        assert!(self.json["title"].is_string() && self.json["detail"].is_string());
    }
}

/// The first open wait of a tree view.
pub fn open_wait(view: &Value) -> String {
    view["processes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|process| process["open_waits"].as_array().unwrap().iter())
        .map(|wait| wait["id"].as_str().unwrap().to_owned())
        .next()
        .unwrap_or_else(|| panic!("no open wait in {view}"))
}

/// One server-sent event: its id, name and JSON data.
#[derive(Debug)]
pub struct Sse {
    pub id: Option<u64>,
    pub event: String,
    pub data: Value,
}

/// The events of a `text/event-stream` body (comments and keep-alives
/// skipped).
pub fn parse_sse(text: &str) -> Vec<Sse> {
    text.split("\n\n")
        .filter_map(|block| {
            let (mut id, mut event, mut data) = (None, String::new(), String::new());
            for line in block.lines() {
                if let Some(value) = line.strip_prefix("id:") {
                    id = value.trim().parse().ok();
                } else if let Some(value) = line.strip_prefix("event:") {
                    event = value.trim().to_owned();
                } else if let Some(value) = line.strip_prefix("data:") {
                    data.push_str(value.strip_prefix(' ').unwrap_or(value));
                }
            }
            (!data.is_empty()).then(|| Sse {
                id,
                event,
                data: serde_json::from_str(&data).unwrap_or(Value::Null),
            })
        })
        .collect()
}

impl Running {
    /// The whole event stream of a tree (it ends once the tree has
    /// finished), with an optional `Last-Event-ID`.
    pub async fn events(&self, tree: &str, token: &str, last_seen: Option<u64>) -> (u16, String) {
        let mut request = self
            .client
            .get(format!("{}/v1/trees/{tree}/events", self.base))
            .bearer_auth(token);
        if let Some(seen) = last_seen {
            request = request.header("last-event-id", seen.to_string());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let text = response.text().await.unwrap();
        if status == 200 {
            assert_eq!(content_type, "text/event-stream", "{text}");
        }
        (status, text)
    }
}
