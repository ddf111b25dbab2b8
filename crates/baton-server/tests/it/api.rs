//! The HTTP API over loopback: the pause scenario end to end, every error
//! status, tenant isolation, admission and the shutdown's 503.

use std::sync::Arc;
use std::time::Duration;

use baton::run::{Engine, EngineConfig, MemoryStore, Payload, StartId, StartRequest};
use baton_server::{ServeConfig, Server};
use reqwest::Method;

use crate::support::{Running, TOKEN_A, TOKEN_B, config, open_wait, parse_sse, programs};

const PAUSE: &str = r#"{"program":"demo.pause","id":"p1","input":"release 1.4"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pause_scenario_runs_to_done_through_the_api() {
    let server = Running::memory().await;

    let started = server
        .post(
            "/v1/trees?until=wait_opened&timeout_ms=20000",
            TOKEN_A,
            PAUSE,
        )
        .await;
    assert_eq!(started.status, 201, "{}", started.text);
    assert_eq!(started.json["new"], true);
    assert_eq!(started.json["reached"], true);
    let tree = started.json["tree"].as_str().unwrap().to_owned();
    let view = &started.json["view"];
    assert_eq!(view["status"], "waiting", "{view}");
    let wait = open_wait(view);
    // A reader follows the tree's events live while it is answered.
    let live = {
        let base = server.base.clone();
        let client = server.client.clone();
        let tree = tree.clone();
        tokio::spawn(async move {
            let response = client
                .get(format!("{base}/v1/trees/{tree}/events"))
                .bearer_auth(TOKEN_A)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), 200);
            response.text().await.unwrap()
        })
    };

    // The same start again is the same tree.
    let again = server.post("/v1/trees", TOKEN_A, PAUSE).await;
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json["new"], false);
    assert_eq!(again.json["tree"], tree.as_str());

    let answered = server
        .post(
            &format!("/v1/trees/{tree}/waits/{wait}?until=terminal&timeout_ms=20000"),
            TOKEN_A,
            r#""ship it""#,
        )
        .await;
    assert_eq!(answered.status, 200, "{}", answered.text);
    assert_eq!(answered.json["receipt"], "admitted");
    assert_eq!(answered.json["reached"], true);
    assert_eq!(answered.json["view"]["status"], "done");
    let root = &answered.json["view"]["processes"][0];
    assert!(
        root["termination"]
            .to_string()
            .contains("release 1.4: done as instructed (ship it)"),
        "{root}"
    );

    // The same answer again is a duplicate, not a second answer.
    let duplicate = server
        .post(
            &format!("/v1/trees/{tree}/waits/{wait}"),
            TOKEN_A,
            r#""ship it""#,
        )
        .await;
    assert_eq!(duplicate.status, 200, "{}", duplicate.text);
    assert_eq!(duplicate.json["receipt"], "duplicate");

    let inspected = server.get(&format!("/v1/trees/{tree}"), TOKEN_A).await;
    assert_eq!(inspected.status, 200);
    assert_eq!(inspected.json["status"], "done");
    assert_eq!(inspected.json["tree"], tree.as_str());
    assert_eq!(inspected.json["scope"], "a");

    let log = server.get(&format!("/v1/trees/{tree}/log"), TOKEN_A).await;
    assert_eq!(log.status, 200, "{}", log.text);
    let records = log.json["records"].as_array().unwrap();
    assert_eq!(records[0]["seq"], 1);
    assert_eq!(records[0]["kind"], "tree_started");
    assert_eq!(
        records.last().unwrap()["seq"],
        inspected.json["head_seq"],
        "the log ends at the view's head"
    );

    // The event stream: every committed fact once, in order, with its log
    // sequence as the SSE id; a reader after the end sees what the live
    // reader saw, and one resuming with Last-Event-ID sees the rest.
    let head = inspected.json["head_seq"].as_u64().unwrap();
    let committed = |text: &str| -> Vec<u64> {
        parse_sse(text)
            .iter()
            .filter(|event| event.data["durable"] == true)
            .map(|event| event.id.expect("a committed event has an id"))
            .collect()
    };
    let live = live.await.unwrap();
    assert_eq!(committed(&live), (1..=head).collect::<Vec<_>>(), "{live}");
    let (status, after) = server.events(&tree, TOKEN_A, None).await;
    assert_eq!(status, 200);
    assert_eq!(committed(&after), committed(&live));
    let events = parse_sse(&after);
    assert_eq!(events[0].event, "process_started");
    assert_eq!(events[0].data["program"], "demo.pause");
    assert!(
        events
            .iter()
            .any(|event| event.event == "signals_admitted" && !event.data["path"].is_null()),
        "the answer reached the gate below the root: {after}"
    );
    let (_, resumed) = server.events(&tree, TOKEN_A, Some(3)).await;
    assert_eq!(committed(&resumed), (4..=head).collect::<Vec<_>>());
    let bad = server
        .client
        .get(format!("{}/v1/trees/{tree}/events", server.base))
        .bearer_auth(TOKEN_A)
        .header("last-event-id", "not a number")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 400);

    // The agent stream view: the pause demo runs no model agent, so its view
    // is its one terminal event, with the fact that ended the tree as its
    // id; a reader who saw that fact gets nothing more.
    let agents = |seen: Option<u64>| {
        let mut request = server
            .client
            .get(format!(
                "{}/v1/trees/{tree}/events?view=agents",
                server.base
            ))
            .bearer_auth(TOKEN_A);
        if let Some(seen) = seen {
            request = request.header("last-event-id", seen.to_string());
        }
        async move { request.send().await.unwrap().text().await.unwrap() }
    };
    let view = parse_sse(&agents(None).await);
    assert_eq!(view.len(), 1, "{view:?}");
    assert_eq!(view[0].event, "complete");
    assert_eq!(view[0].id, Some(head));
    assert!(view[0].data["output"].is_string(), "{view:?}");
    assert!(parse_sse(&agents(Some(head)).await).is_empty());
    let unknown_view = server
        .client
        .get(format!(
            "{}/v1/trees/{tree}/events?view=tokens",
            server.base
        ))
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert_eq!(unknown_view.status().as_u16(), 400);

    let done = server.get("/v1/trees?status=done", TOKEN_A).await;
    assert_eq!(done.status, 200);
    assert_eq!(done.json["trees"][0]["tree"], tree.as_str());
    assert_eq!(done.json["trees"][0]["status"], "done");
    let waiting = server.get("/v1/trees?status=waiting", TOKEN_A).await;
    assert_eq!(waiting.json["trees"].as_array().unwrap().len(), 0);
    // Scope B lists nothing of scope A.
    let other = server.get("/v1/trees", TOKEN_B).await;
    assert_eq!(other.json["trees"].as_array().unwrap().len(), 0);

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancellation_through_the_api_ends_the_tree_canceled() {
    let server = Running::memory().await;
    let started = server
        .post(
            "/v1/trees?until=wait_opened&timeout_ms=20000",
            TOKEN_A,
            PAUSE,
        )
        .await;
    let tree = started.json["tree"].as_str().unwrap().to_owned();
    let canceled = server
        .post(
            &format!("/v1/trees/{tree}/cancel?until=terminal&timeout_ms=20000"),
            TOKEN_A,
            r#"{"reason":"not today"}"#,
        )
        .await;
    assert_eq!(canceled.status, 200, "{}", canceled.text);
    assert_eq!(canceled.json["reached"], true);
    assert_eq!(canceled.json["view"]["status"], "done");
    assert_eq!(canceled.json["view"]["processes"][0]["status"], "canceled");
    // A second cancellation finds the tree ended.
    server
        .post(
            &format!("/v1/trees/{tree}/cancel"),
            TOKEN_A,
            r#"{"reason":"again"}"#,
        )
        .await
        .assert_problem(409, "engine.control.terminated");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_left_by_a_crashed_engine_is_taken_up_at_start_and_resolved_through_the_api() {
    let store = Arc::new(MemoryStore::new());
    // An engine starts a slow `Never` call and crashes (is dropped) while
    // it is in flight: its lease stays, as after a crash.
    {
        let engine = Engine::new(EngineConfig {
            programs: programs(),
            ..EngineConfig::new(store.clone())
        })
        .unwrap();
        let slow = programs()[1].clone();
        // Subscribed before the start: its first round runs in the call.
        let mut events = engine.events();
        let started = engine
            .start(
                &slow,
                StartRequest::new(
                    StartId::new("a", "slow-1").unwrap(),
                    Payload::encode(&60_000u64).unwrap(),
                ),
            )
            .await
            .unwrap();
        // The call is pending (durably) once its event is out.
        loop {
            let event = events.recv().await.unwrap();
            if event.tree == started.tree()
                && matches!(event.kind, baton::run::EventKind::EffectPending { .. })
            {
                break;
            }
        }
    }
    let server = Running::start(config(store)).await;
    let tree = baton::run::ProcessId::root(&StartId::new("a", "slow-1").unwrap()).to_string();
    let parked = server
        .get(
            &format!("/v1/trees/{tree}?until=quiescent&timeout_ms=20000"),
            TOKEN_A,
        )
        .await;
    assert_eq!(parked.status, 200, "{}", parked.text);
    assert_eq!(parked.until.as_deref(), Some("reached"));
    assert_eq!(parked.json["status"], "needs_attention", "{}", parked.text);
    let effect = parked.json["processes"][0]["unknown_effects"][0]
        .as_str()
        .unwrap()
        .to_owned();

    // Resolving an effect that is not unknown is refused; a malformed id too.
    let zero = format!("e_{}", "0".repeat(32));
    server
        .post(
            &format!("/v1/trees/{tree}/effects/{zero}/resolve"),
            TOKEN_A,
            r#"{"output":1}"#,
        )
        .await
        .assert_problem(404, "engine.effect.not_unknown");
    server
        .post(
            &format!("/v1/trees/{tree}/effects/e_zz/resolve"),
            TOKEN_A,
            r#"{"output":1}"#,
        )
        .await
        .assert_problem(400, "serve.request.malformed");

    let resolved = server
        .post(
            &format!("/v1/trees/{tree}/effects/{effect}/resolve?until=terminal&timeout_ms=20000"),
            TOKEN_A,
            r#"{"output":60000}"#,
        )
        .await;
    assert_eq!(resolved.status, 200, "{}", resolved.text);
    assert_eq!(resolved.json["view"]["status"], "done");
    assert_eq!(resolved.json["view"]["processes"][0]["status"], "completed");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_a_problem_document_with_its_status() {
    let server = Running::start(ServeConfig {
        body_limit: 64 * 1024,
        ..config(Arc::new(MemoryStore::new()))
    })
    .await;
    let started = server
        .post(
            "/v1/trees?until=wait_opened&timeout_ms=20000",
            TOKEN_A,
            PAUSE,
        )
        .await;
    let tree = started.json["tree"].as_str().unwrap().to_owned();
    let wait = open_wait(&started.json["view"]);

    // 400: malformed bodies, ids and options.
    server
        .post("/v1/trees", TOKEN_A, "{not json")
        .await
        .assert_problem(400, "serve.request.malformed");
    server
        .post("/v1/trees", TOKEN_A, r#"{"program":"demo.pause"}"#)
        .await
        .assert_problem(400, "serve.request.malformed");
    // An empty body says so, and what the route takes.
    let empty = server
        .post(&format!("/v1/trees/{tree}/cancel"), TOKEN_A, "")
        .await;
    empty.assert_problem(400, "serve.request.malformed");
    assert_eq!(
        empty.json["detail"],
        "the request body is empty: this route takes a JSON object (GET /openapi.json describes it)"
    );
    let empty = server
        .post(&format!("/v1/trees/{tree}/waits/{wait}"), TOKEN_A, " \n")
        .await;
    empty.assert_problem(400, "serve.request.malformed");
    assert!(
        empty.json["detail"]
            .as_str()
            .unwrap()
            .starts_with("the answer is empty: the request body is the answer, as JSON"),
        "{}",
        empty.text
    );
    server
        .get("/v1/trees/not-a-tree", TOKEN_A)
        .await
        .assert_problem(400, "serve.request.malformed");
    server
        .get(&format!("/v1/trees/{tree}?until=forever"), TOKEN_A)
        .await
        .assert_problem(400, "serve.request.malformed");
    server
        .get("/v1/trees?status=sleeping", TOKEN_A)
        .await
        .assert_problem(400, "serve.request.malformed");
    server
        .post(
            "/v1/trees",
            TOKEN_A,
            r#"{"program":"demo.pause","id":"l","input":"x","labels":{"team":"a\u0007"}}"#,
        )
        .await
        .assert_problem(400, "engine.label.value");

    // 401: no token, an unknown token, another scheme.
    server
        .call(Method::GET, "/v1/trees", None, None)
        .await
        .assert_problem(401, "serve.auth.missing");
    server
        .get("/v1/trees", "not-a-token-this-host-knows")
        .await
        .assert_problem(401, "serve.auth.invalid");

    // 404: an unknown tree, an unknown program, an unknown wait.
    let missing = baton::run::ProcessId::root(&StartId::new("a", "missing").unwrap());
    server
        .get(&format!("/v1/trees/{missing}"), TOKEN_A)
        .await
        .assert_problem(404, "engine.tree.not_found");
    server
        .post(
            "/v1/trees",
            TOKEN_A,
            r#"{"program":"no.such","id":"x","input":1}"#,
        )
        .await
        .assert_problem(404, "engine.program.unknown");
    let other_wait = format!("w_{}", "0".repeat(32));
    server
        .post(
            &format!("/v1/trees/{tree}/waits/{other_wait}"),
            TOKEN_A,
            r#""x""#,
        )
        .await
        .assert_problem(404, "engine.signal.unknown_wait");

    // 409: the same start key with another input.
    server
        .post(
            "/v1/trees",
            TOKEN_A,
            r#"{"program":"demo.pause","id":"p1","input":"release 2.0"}"#,
        )
        .await
        .assert_problem(409, "engine.start.conflict");

    // 413: a body over the limit.
    let large = format!("\"{}\"", "x".repeat(100 * 1024));
    server
        .post(&format!("/v1/trees/{tree}/waits/{wait}"), TOKEN_A, &large)
        .await
        .assert_problem(413, "serve.request.too_large");

    // 422: an answer the wait's schema refuses, an input the program's refuses.
    let refused = server
        .post(&format!("/v1/trees/{tree}/waits/{wait}"), TOKEN_A, "42")
        .await;
    assert_eq!(refused.status, 422, "{}", refused.text);
    assert!(
        refused.json["code"].as_str().unwrap().contains('.'),
        "{}",
        refused.text
    );
    server
        .post(
            "/v1/trees",
            TOKEN_A,
            r#"{"program":"demo.pause","id":"n","input":7}"#,
        )
        .await
        .assert_problem(422, "execution.input.invalid");

    // The refused answer changed nothing: the right one still completes it.
    let answered = server
        .post(
            &format!("/v1/trees/{tree}/waits/{wait}?until=terminal&timeout_ms=20000"),
            TOKEN_A,
            r#""ship it""#,
        )
        .await;
    assert_eq!(answered.json["view"]["status"], "done", "{}", answered.text);
    // 409: another answer to an answered wait.
    let conflict = server
        .post(
            &format!("/v1/trees/{tree}/waits/{wait}"),
            TOKEN_A,
            r#""other""#,
        )
        .await;
    assert_eq!(conflict.status, 409, "{}", conflict.text);

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_sees_only_its_scope_on_every_tree_route() {
    let server = Running::memory().await;
    let started = server
        .post(
            "/v1/trees?until=wait_opened&timeout_ms=20000",
            TOKEN_A,
            PAUSE,
        )
        .await;
    let tree = started.json["tree"].as_str().unwrap().to_owned();
    let wait = open_wait(&started.json["view"]);
    let effect = format!("e_{}", "0".repeat(32));
    let routes: Vec<(Method, String, Option<&str>)> = vec![
        (Method::GET, format!("/v1/trees/{tree}"), None),
        (
            Method::GET,
            format!("/v1/trees/{tree}?until=terminal&timeout_ms=100"),
            None,
        ),
        (Method::GET, format!("/v1/trees/{tree}/log"), None),
        (Method::GET, format!("/v1/trees/{tree}/events"), None),
        (
            Method::POST,
            format!("/v1/trees/{tree}/waits/{wait}"),
            Some(r#""ship it""#),
        ),
        (
            Method::POST,
            format!("/v1/trees/{tree}/cancel"),
            Some(r#"{"reason":"x"}"#),
        ),
        (
            Method::POST,
            format!("/v1/trees/{tree}/effects/{effect}/resolve"),
            Some(r#"{"output":1}"#),
        ),
    ];
    let missing = baton::run::ProcessId::root(&StartId::new("b", "missing").unwrap());
    for (method, path, body) in &routes {
        let other = server
            .call(method.clone(), path, Some(TOKEN_B), *body)
            .await;
        other.assert_problem(404, "engine.tree.not_found");
        // Exactly what a missing tree reads as, but for the id.
        let absent = server
            .call(
                method.clone(),
                &path.replace(&tree, &missing.to_string()),
                Some(TOKEN_B),
                *body,
            )
            .await;
        absent.assert_problem(404, "engine.tree.not_found");
        assert_eq!(
            other.json["detail"].as_str().unwrap().replace(&tree, "ID"),
            absent.json["detail"]
                .as_str()
                .unwrap()
                .replace(&missing.to_string(), "ID"),
            "{path}"
        );
        server
            .call(method.clone(), path, None, *body)
            .await
            .assert_problem(401, "serve.auth.missing");
    }
    // Scope B moved nothing: the tree still waits for its answer.
    let view = server.get(&format!("/v1/trees/{tree}"), TOKEN_A).await;
    assert_eq!(view.json["status"], "waiting", "{}", view.text);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_always_served_and_a_full_host_refuses_new_work_for_a_while() {
    let server = Running::start(ServeConfig {
        max_running: 1,
        ..config(Arc::new(MemoryStore::new()))
    })
    .await;
    let health = server.call(Method::GET, "/healthz", None, None).await;
    assert_eq!(health.status, 200);
    // One slow tree holds the one permit until it is quiescent (done).
    let slow = server
        .post(
            "/v1/trees",
            TOKEN_A,
            r#"{"program":"test.slow","id":"s1","input":3000}"#,
        )
        .await;
    assert_eq!(slow.status, 201, "{}", slow.text);
    server
        .post(
            "/v1/trees?timeout_ms=200",
            TOKEN_A,
            r#"{"program":"test.slow","id":"s2","input":1}"#,
        )
        .await
        .assert_problem(503, "serve.capacity.exhausted");
    // Once the first is done, the permit is free again.
    let first = slow.json["tree"].as_str().unwrap();
    let done = server
        .get(
            &format!("/v1/trees/{first}?until=terminal&timeout_ms=20000"),
            TOKEN_A,
        )
        .await;
    assert_eq!(done.json["status"], "done");
    let second = server
        .post(
            "/v1/trees?until=terminal&timeout_ms=20000",
            TOKEN_A,
            r#"{"program":"test.slow","id":"s2","input":1}"#,
        )
        .await;
    assert_eq!(second.status, 201, "{}", second.text);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_refuses_new_work_lets_the_dispatch_in_flight_settle_and_releases_the_lease() {
    let store = Arc::new(MemoryStore::new());
    let server = Running::start(config(store.clone())).await;
    server.shutdown.ready().await;
    assert_eq!(
        server.call(Method::GET, "/readyz", None, None).await.status,
        200
    );
    let slow = server
        .post(
            "/v1/trees",
            TOKEN_A,
            r#"{"program":"test.slow","id":"s","input":2000}"#,
        )
        .await;
    assert_eq!(slow.status, 201, "{}", slow.text);
    let tree = slow.json["tree"].as_str().unwrap().to_owned();

    server.shutdown.shutdown();
    server
        .post("/v1/trees", TOKEN_A, PAUSE)
        .await
        .assert_problem(503, "serve.shutting_down");
    server
        .call(Method::GET, "/readyz", None, None)
        .await
        .assert_problem(503, "serve.shutting_down");
    assert_eq!(
        server
            .call(Method::GET, "/healthz", None, None)
            .await
            .status,
        200
    );
    server.task.await.unwrap().unwrap();

    // The call settled within the grace and nothing holds the tree: a new
    // engine takes it up and finds no unknown effect.
    let engine = Engine::new(EngineConfig {
        programs: programs(),
        ..EngineConfig::new(store)
    })
    .unwrap();
    let scope = baton::run::Scope::new("a").unwrap();
    let view = engine
        .inspect(
            &scope,
            tree.parse().unwrap(),
            baton::run::Visibility::Public,
        )
        .await
        .unwrap();
    assert!(
        view.processes.iter().all(|p| p.unknown_effects.is_empty()),
        "{view:?}"
    );
    let handle: baton::run::ProcessHandle =
        engine.process(&scope, tree.parse().unwrap()).await.unwrap();
    assert_eq!(
        handle.output().await.unwrap(),
        Payload::encode(&2000u64).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_without_tokens_is_refused_at_bind() {
    let error = Server::bind(ServeConfig {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        ..ServeConfig::new(EngineConfig::new(Arc::new(MemoryStore::new())))
    })
    .await
    .unwrap_err();
    assert_eq!(error.code(), "serve.config.invalid");
    let error = Server::bind(ServeConfig {
        max_running: 0,
        ..ServeConfig::new(EngineConfig::new(Arc::new(MemoryStore::new())))
    })
    .await
    .unwrap_err();
    assert_eq!(error.code(), "serve.config.invalid");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_up_makes_the_takeover_loop_take_a_dead_engines_tree_before_its_next_scan() {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use baton::run::dispatch::ReplayPolicy;
    use baton::workflow::{Activity, ActivityConfig, ActivityContext};
    use baton_server::WakeSource;

    // A call that may be sent again: the first one never returns (its
    // engine dies with it), the next returns at once; each reports its
    // effect id when it starts.
    let (sent, mut dispatched) = tokio::sync::mpsc::unbounded_channel();
    let calls = Arc::new(AtomicUsize::new(0));
    let replayable = Activity::<u64, u64>::new(
        ActivityConfig {
            replay: ReplayPolicy::SameIdentity,
            build: "baton-server tests replayable 1".into(),
            ..ActivityConfig::new("test.replayable", "Hang the first time, then return.")
        },
        move |ms: u64, context: ActivityContext| {
            let (sent, calls) = (sent.clone(), calls.clone());
            async move {
                let _ = sent.send(context.idempotency_key());
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    std::future::pending::<()>().await;
                }
                Ok(ms)
            }
        },
    )
    .unwrap()
    .program()
    .erase();

    let store = Arc::new(MemoryStore::new());
    let first = Engine::new(EngineConfig {
        programs: vec![replayable.clone()],
        ..EngineConfig::new(store.clone())
    })
    .unwrap();
    let started = first
        .start(
            &replayable,
            StartRequest::new(
                StartId::new("a", "replayable").unwrap(),
                Payload::encode(&7u64).unwrap(),
            ),
        )
        .await
        .unwrap();
    let tree = started.tree();
    let effect = dispatched.recv().await.unwrap();

    let wake = Arc::new(tokio::sync::Notify::new());
    let mut config = ServeConfig {
        scan: Some(Duration::from_secs(3600)),
        wake: Some(WakeSource::notify(wake.clone())),
        ..config(store)
    };
    config.engine.programs.push(replayable);
    let server = Running::start(config).await;
    // The initial recovery left the tree alone: its engine is alive.
    server.shutdown.ready().await;
    let listed = server.get("/v1/trees?status=running", TOKEN_A).await;
    assert_eq!(listed.json["trees"][0]["tree"], tree.to_string());

    // The engine dies; the wake-up (not the hourly scan) takes the tree over.
    drop(started);
    drop(first);
    wake.notify_one();
    let replayed = tokio::time::timeout(Duration::from_secs(30), dispatched.recv())
        .await
        .expect("the woken takeover loop sent the call again")
        .unwrap();
    assert_eq!(replayed, effect);
    let done = server
        .get(
            &format!("/v1/trees/{tree}?until=terminal&timeout_ms=20000"),
            TOKEN_A,
        )
        .await;
    assert_eq!(
        done.json["processes"][0]["status"], "completed",
        "{}",
        done.text
    );
    server.stop().await;
}

#[test]
fn the_server_and_its_futures_can_move_between_threads() {
    fn send<T: Send>(_: &T) {}
    fn send_sync<T: Send + Sync>() {}
    send_sync::<baton_server::ServerHandle>();
    send_sync::<baton_server::Tokens>();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _guard = runtime.enter();
    let config = ServeConfig::new(EngineConfig::new(Arc::new(MemoryStore::new())));
    let bind = Server::bind(config);
    send(&bind);
    let serve = baton_server::serve(
        ServeConfig::new(EngineConfig::new(Arc::new(MemoryStore::new()))),
        std::future::pending(),
    );
    send(&serve);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_store_is_a_503_with_the_store_code() {
    use baton::run::log::RecordKind;
    use baton_testkit::{Cut, FaultStore};

    let fault = Arc::new(FaultStore::new(Arc::new(MemoryStore::new())));
    fault.arm(RecordKind::TreeStarted, Cut::Before, 1);
    let server = Running::start(config(fault.clone())).await;
    server
        .post("/v1/trees", TOKEN_A, PAUSE)
        .await
        .assert_problem(503, "engine.store.failed");
    assert!(fault.crashed());
    // Every later call fails too, as after a crash: listing included.
    server
        .get("/v1/trees", TOKEN_A)
        .await
        .assert_problem(503, "engine.store.failed");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trees_carry_labels_and_lists_filter_by_them_and_page() {
    let server = Running::memory().await;
    for (id, team) in [("l1", "billing"), ("l2", "billing"), ("l3", "search")] {
        let body = format!(
            r#"{{"program":"demo.pause","id":"{id}","input":"release {id}","labels":{{"team":"{team}","env":"prod"}}}}"#
        );
        let started = server.post("/v1/trees", TOKEN_A, &body).await;
        assert_eq!(started.status, 201, "{}", started.text);
    }
    let billing = server
        .get("/v1/trees?label=team=billing,env=prod", TOKEN_A)
        .await;
    assert_eq!(billing.status, 200, "{}", billing.text);
    let trees = billing.json["trees"].as_array().unwrap();
    assert_eq!(trees.len(), 2, "{}", billing.text);
    assert!(trees.iter().all(|tree| tree["labels"]["team"] == "billing"));
    assert_eq!(trees[0]["program"], "demo.pause");
    assert!(trees[0]["version"].as_str().unwrap().starts_with("b3:"));
    assert!(trees[0]["created_ms"].is_u64());

    // Pages of one: every tree once, then no `next`.
    let mut seen = Vec::new();
    let mut path = "/v1/trees?limit=1".to_owned();
    loop {
        let page = server.get(&path, TOKEN_A).await;
        assert_eq!(page.status, 200, "{}", page.text);
        let trees = page.json["trees"].as_array().unwrap();
        assert!(trees.len() <= 1);
        seen.extend(
            trees
                .iter()
                .map(|tree| tree["tree"].as_str().unwrap().to_owned()),
        );
        match page.json["next"].as_str() {
            Some(next) => path = format!("/v1/trees?limit=1&after={next}"),
            None => break,
        }
    }
    let mut unique = seen.clone();
    unique.dedup();
    assert_eq!((seen.len(), unique.len()), (3, 3), "{seen:?}");

    server
        .post(
            "/v1/trees",
            TOKEN_A,
            r#"{"program":"demo.pause","id":"bad","input":"x","labels":{"Bad Key":"v"}}"#,
        )
        .await
        .assert_problem(400, "engine.label.key");
    server
        .get("/v1/trees?label=novalue", TOKEN_A)
        .await
        .assert_problem(400, "engine.label.pair");
    server
        .get("/v1/trees?after=not%20a%20cursor", TOKEN_A)
        .await
        .assert_problem(400, "store.cursor.invalid");
    server
        .get("/v1/trees?limit=0", TOKEN_A)
        .await
        .assert_problem(400, "serve.request.malformed");
    server.stop().await;
}
