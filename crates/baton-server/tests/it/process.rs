//! `serve` as real processes (the `serve-fixture` binary) on one SQLite
//! file: one killed while it holds trees, one interrupted while a call is
//! in flight.

use std::collections::BTreeSet;
use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use baton::run::store::{AcquireRequest, Acquired, Store};
use baton::run::{Clock as _, Engine, EngineConfig, Scope, SystemClock, TreeId, Visibility};
use baton::store::sqlite::SqliteStore;
use tokio::sync::mpsc;

use crate::support::{Reply, TOKEN_A};

/// The longest any one expected line may take.
const PATIENCE: Duration = Duration::from_secs(60);

/// A `serve-fixture` process and the lines it prints.
struct Fixture {
    child: std::process::Child,
    lines: mpsc::UnboundedReceiver<String>,
    base: String,
    client: reqwest::Client,
}

impl Fixture {
    async fn spawn(db: &Path, effects: &Path, lease_ms: u64, grace_ms: u64) -> Fixture {
        let mut child = Command::new(env!("CARGO_BIN_EXE_serve-fixture"))
            .arg(db)
            .arg(effects)
            .arg(lease_ms.to_string())
            .arg(grace_ms.to_string())
            .env("BATON_TOKENS", format!("a {TOKEN_A}\n"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut fixture = Fixture {
            child,
            lines,
            base: String::new(),
            client: reqwest::Client::new(),
        };
        let listening = fixture.line(|line| line.starts_with("listening ")).await;
        fixture.base = format!("http://{}", &listening["listening ".len()..]);
        fixture
    }

    /// The next line that `wanted` accepts (earlier lines are dropped).
    async fn line(&mut self, wanted: impl Fn(&str) -> bool) -> String {
        loop {
            let line = tokio::time::timeout(PATIENCE, self.lines.recv())
                .await
                .expect("the fixture printed the expected line in time")
                .expect("the fixture's output ended before the expected line");
            if wanted(&line) {
                return line;
            }
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<&str>) -> Reply {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TOKEN_A);
        if let Some(body) = body {
            request = request.body(body.to_owned());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        Reply {
            status,
            content_type: String::new(),
            until: None,
            json: serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
            text,
        }
    }

    async fn start(&self, program: &str, id: &str, ms: u64) -> TreeId {
        let body = format!(r#"{{"program":"{program}","id":"{id}","input":{ms}}}"#);
        let reply = self
            .call(reqwest::Method::POST, "/v1/trees", Some(&body))
            .await;
        assert_eq!(reply.status, 201, "{}", reply.text);
        reply.json["tree"].as_str().unwrap().parse().unwrap()
    }

    /// Sends `signal` (a `kill` signal name) to the process.
    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit (reaping it).
    async fn exit(mut self) -> (std::process::ExitStatus, Vec<String>) {
        let status = tokio::task::spawn_blocking(move || {
            let status = self.child.wait().unwrap();
            (status, self.lines)
        })
        .await
        .unwrap();
        let (status, mut lines) = status;
        let mut rest = Vec::new();
        while let Some(line) = lines.recv().await {
            rest.push(line);
        }
        (status, rest)
    }
}

fn dispatched(line: &str, program: &str) -> Option<String> {
    line.strip_prefix(&format!("dispatched {program} "))
        .map(str::to_owned)
}

fn effects_file(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn paths() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    let effects = dir.path().join("effects.txt");
    (dir, db, effects)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_hosts_trees_are_finished_or_parked_by_the_other_and_no_never_call_runs_twice() {
    let (_dir, db, effects) = paths();
    let mut a = Fixture::spawn(&db, &effects, 2000, 5000).await;
    let mut b = Fixture::spawn(&db, &effects, 2000, 5000).await;

    let mut never_trees = Vec::new();
    let mut same_trees = Vec::new();
    for n in 0..3 {
        never_trees.push(
            a.start("fixture.never", &format!("never-{n}"), 600_000)
                .await,
        );
        same_trees.push(a.start("fixture.same", &format!("same-{n}"), 1500).await);
    }
    // Every call is in flight in A.
    let (mut never_effects, mut same_effects) = (BTreeSet::new(), BTreeSet::new());
    while never_effects.len() < 3 || same_effects.len() < 3 {
        let line = a.line(|line| line.starts_with("dispatched ")).await;
        if let Some(effect) = dispatched(&line, "fixture.never") {
            never_effects.insert(effect);
        } else if let Some(effect) = dispatched(&line, "fixture.same") {
            same_effects.insert(effect);
        }
    }
    a.child.kill().unwrap();
    let (status, _) = a.exit().await;
    assert!(!status.success());

    // B's takeover loop takes A's trees up on its own: it sends the calls
    // that may be sent again, under the same identity.
    let mut replayed = BTreeSet::new();
    while replayed.len() < 3 {
        let line = b.line(|line| line.starts_with("dispatched ")).await;
        assert!(
            dispatched(&line, "fixture.never").is_none(),
            "a Never call was sent again: {line}"
        );
        if let Some(effect) = dispatched(&line, "fixture.same") {
            replayed.insert(effect);
        }
    }
    assert_eq!(replayed, same_effects);

    for tree in &same_trees {
        let view = b
            .call(
                reqwest::Method::GET,
                &format!("/v1/trees/{tree}?until=terminal&timeout_ms=30000"),
                None,
            )
            .await;
        assert_eq!(view.json["status"], "done", "{}", view.text);
        assert_eq!(view.json["processes"][0]["status"], "completed");
    }
    let mut unknown = BTreeSet::new();
    for tree in &never_trees {
        let view = b
            .call(
                reqwest::Method::GET,
                &format!("/v1/trees/{tree}?until=quiescent&timeout_ms=30000"),
                None,
            )
            .await;
        assert_eq!(view.json["status"], "needs_attention", "{}", view.text);
        for effect in view.json["processes"][0]["unknown_effects"]
            .as_array()
            .unwrap()
        {
            unknown.insert(effect.as_str().unwrap().to_owned());
        }
    }
    assert_eq!(unknown, never_effects, "each call lost with A is parked");

    // The side effect of each Never call happened exactly once.
    let lines = effects_file(&effects);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(
        lines.iter().cloned().collect::<BTreeSet<_>>(),
        never_effects
    );

    b.signal("TERM");
    let (status, rest) = b.exit().await;
    assert!(status.success(), "{rest:?}");
    assert!(rest.iter().any(|line| line == "stopped"), "{rest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_lets_the_call_in_flight_settle_then_exits_with_no_unknown_effect_and_no_held_lease()
{
    let (_dir, db, effects) = paths();
    let mut host = Fixture::spawn(&db, &effects, 30_000, 20_000).await;
    let tree = host.start("fixture.never", "interrupted", 2000).await;
    let line = host.line(|line| line.starts_with("dispatched ")).await;
    let effect = dispatched(&line, "fixture.never").unwrap();

    host.signal("INT");
    let (status, rest) = host.exit().await;
    assert!(status.success(), "{rest:?}");
    assert!(rest.iter().any(|line| line == "stopped"), "{rest:?}");
    assert_eq!(effects_file(&effects), vec![effect]);

    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db).unwrap());
    let engine = Engine::new(EngineConfig::new(store.clone())).unwrap();
    let view = engine
        .inspect(&Scope::new("a").unwrap(), tree, Visibility::Public)
        .await
        .unwrap();
    for process in &view.processes {
        assert!(process.unknown_effects.is_empty(), "{view:?}");
        assert!(
            process
                .effects
                .iter()
                .all(|effect| effect.phase == "settled"),
            "{view:?}"
        );
    }
    // Nobody holds the tree: another owner gets it without force.
    let acquired = store
        .acquire(AcquireRequest {
            tree,
            owner: "elsewhere/1/engine-1".into(),
            now: SystemClock.now(),
            ttl: Duration::from_secs(5),
            force: false,
        })
        .await
        .unwrap();
    assert!(matches!(acquired, Acquired::Granted { .. }), "{acquired:?}");
}
