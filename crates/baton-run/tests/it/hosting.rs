//! What a host needs to run trees without polling: awaitable conditions on
//! a tree, a graceful shutdown that lets dispatches in flight settle, and a
//! per-tree event stream that a reader can start or resume anywhere.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use baton_run::dispatch::{DispatchCall, Dispatcher, ReplayPolicy};
use baton_run::store::{Store, TreeStatus};
use baton_run::{
    BoxFuture, Condition, Engine, EngineConfig, MemoryStore, Payload, RecoverOptions, Scope,
    Settlement, StartError, Status, TreeError, TreeId, WatchEvent, WatchKind,
};
use baton_testkit::programs::{Kind, SCOPE, engine, open_wait, program, request};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

/// A dispatcher whose calls complete only when the test lets them (one
/// permit per call), counting the calls it received.
#[derive(Clone)]
struct Gated {
    policy: ReplayPolicy,
    gate: Arc<Semaphore>,
    calls: Arc<AtomicU32>,
    released: Arc<AtomicBool>,
}

impl Gated {
    fn new(policy: ReplayPolicy) -> Gated {
        Gated {
            policy,
            gate: Arc::new(Semaphore::new(0)),
            calls: Arc::default(),
            released: Arc::default(),
        }
    }

    fn release(&self, calls: usize) {
        self.released.store(true, Ordering::SeqCst);
        self.gate.add_permits(calls);
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Dispatcher for Gated {
    fn replay_policy(&self, _request: &Payload) -> ReplayPolicy {
        self.policy
    }

    fn dispatch(&self, call: DispatchCall) -> BoxFuture<'static, Settlement> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let gate = self.gate.clone();
        Box::pin(async move {
            let _permit = gate.acquire().await.expect("the gate stays open");
            Settlement::ok(call.request)
        })
    }
}

fn scope() -> Scope {
    Scope::new(SCOPE).expect("valid")
}

/// Waits until the engine has begun shutting down (the flag is set on the
/// shutdown's first poll).
async fn shutting_down(engine: &Engine) {
    while !engine.is_shutting_down() {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_host_awaits_a_wait_then_the_end_without_polling() {
    let store = Arc::new(MemoryStore::new());
    let ask = program(Kind::Ask, None);
    let engine = engine(store, &[&ask]);
    let handle = engine
        .start(&ask, request("ask", "proceed?"))
        .await
        .expect("starts")
        .into_handle();

    let view = handle.until(Condition::WaitOpened).await.expect("awaits");
    assert_eq!(view.status, TreeStatus::Waiting);
    let wait = view.root().open_waits[0].id;
    // Quiescent holds too: only an answer can move the tree on.
    let quiet = engine
        .until(&scope(), handle.tree(), Condition::Quiescent)
        .await
        .expect("awaits");
    assert_eq!(quiet.head_seq, view.head_seq);

    engine
        .answer(
            &scope(),
            handle.tree(),
            wait,
            Payload::encode(&true).expect("encodes"),
        )
        .await
        .expect("answers");
    let done = handle.until(Condition::Terminal).await.expect("awaits");
    assert_eq!(done.status, TreeStatus::Done);
    assert_eq!(done.root().status, Status::Completed);
    // Every condition holds at once for a finished tree.
    for condition in [
        Condition::WaitOpened,
        Condition::Quiescent,
        Condition::Terminal,
    ] {
        let again = handle.until(condition).await.expect("awaits");
        assert_eq!(again.head_seq, done.head_seq);
    }
}

#[tokio::test]
async fn quiescence_waits_for_a_dispatch_in_flight_to_settle() {
    let store = Arc::new(MemoryStore::new());
    let gated = Gated::new(ReplayPolicy::Never);
    let work = program(Kind::Dispatch, Some(Arc::new(gated.clone())));
    let engine = engine(store, &[&work]);
    let handle = engine
        .start(&work, request("work", json!(["a"])))
        .await
        .expect("starts")
        .into_handle();
    let waiting = tokio::spawn({
        let handle = handle.clone();
        async move { handle.until(Condition::Quiescent).await }
    });
    while gated.calls() == 0 {
        tokio::task::yield_now().await;
    }
    gated.release(1);
    let view = waiting.await.expect("joins").expect("awaits");
    assert!(gated.released.load(Ordering::SeqCst));
    assert_eq!(view.status, TreeStatus::Done);
    assert_eq!(view.root().status, Status::Completed);
}

#[tokio::test]
async fn shutdown_lets_a_dispatch_in_flight_settle_then_gives_up_the_lease() {
    let store = Arc::new(MemoryStore::keeping_history());
    let gated = Gated::new(ReplayPolicy::Never);
    let work = program(Kind::Dispatch, Some(Arc::new(gated.clone())));
    let engine = Arc::new(engine(store.clone(), &[&work]));
    let tree = engine
        .start(&work, request("work", json!(["a"])))
        .await
        .expect("starts")
        .tree();
    while gated.calls() == 0 {
        tokio::task::yield_now().await;
    }
    let stopping = tokio::spawn({
        let engine = engine.clone();
        async move { engine.shutdown(Duration::from_secs(60)).await }
    });
    shutting_down(&engine).await;
    // No new work is admitted while the engine drains.
    let refused = engine
        .start(&work, request("late", json!(["b"])))
        .await
        .expect_err("a start during shutdown is refused");
    assert!(matches!(refused, StartError::ShuttingDown), "{refused:?}");
    assert_eq!(refused.code(), "engine.shutting_down");
    gated.release(1);
    stopping.await.expect("the shutdown ends");

    // The settlement is committed and the lease given up: another engine
    // takes the tree at once, without force, and finishes it without
    // dispatching again.
    let next = baton_testkit::programs::engine(store.clone(), &[&work]);
    let report = next
        .recover(RecoverOptions::default())
        .await
        .expect("recovers");
    assert!(
        report.iter().all(|(_, result)| result.is_ok()),
        "{report:?}"
    );
    let view = next
        .until(&scope(), tree, Condition::Terminal)
        .await
        .expect("awaits");
    assert_eq!(view.root().status, Status::Completed);
    assert!(view.root().unknown_effects.is_empty());
    assert_eq!(gated.calls(), 1, "the dispatch ran once");
}

#[tokio::test]
async fn a_dispatch_still_in_flight_after_the_grace_is_left_to_recovery() {
    let store = Arc::new(MemoryStore::keeping_history());
    let gated = Gated::new(ReplayPolicy::Never);
    let work = program(Kind::Dispatch, Some(Arc::new(gated.clone())));
    let engine = engine(store.clone(), &[&work]);
    let tree = engine
        .start(&work, request("work", json!(["a"])))
        .await
        .expect("starts")
        .tree();
    while gated.calls() == 0 {
        tokio::task::yield_now().await;
    }
    engine.shutdown(Duration::from_millis(50)).await;
    // The lease is free, and under `Never` the effect whose outcome nobody
    // saw is parked for a person, not sent again.
    let next = baton_testkit::programs::engine(store, &[&work]);
    next.recover(RecoverOptions::default())
        .await
        .expect("recovers");
    let view = next
        .until(&scope(), tree, Condition::Quiescent)
        .await
        .expect("awaits");
    assert_eq!(view.status, TreeStatus::NeedsAttention);
    assert_eq!(view.root().unknown_effects.len(), 1);
    assert_eq!(gated.calls(), 1);
}

#[tokio::test]
async fn an_engine_shutting_down_takes_up_no_stored_tree() {
    let store = Arc::new(MemoryStore::new());
    let ask = program(Kind::Ask, None);
    let first = engine(store.clone(), &[&ask]);
    let tree = first
        .start(&ask, request("ask", "proceed?"))
        .await
        .expect("starts")
        .tree();
    first.close().await;
    let second = engine(store, &[&ask]);
    second.shutdown(Duration::from_secs(1)).await;
    let refused = second
        .process::<Value>(&scope(), tree)
        .await
        .expect_err("no take-up during shutdown");
    assert!(
        matches!(refused, TreeError::ShuttingDown { .. }),
        "{refused:?}"
    );
}

/// The committed events of a watch, until it ends.
async fn committed(watch: &mut baton_run::Watch) -> Vec<WatchEvent> {
    let mut events = Vec::new();
    while let Some(event) = watch.next().await {
        let event = event.expect("the log reads");
        if event.durable {
            events.push(event);
        }
    }
    events
}

/// Runs a tree with two dispatches to the end; returns the engine, the
/// tree and its head.
async fn finished_tree(
    store: Arc<dyn Store>,
    config: impl FnOnce(&mut EngineConfig),
) -> (Engine, TreeId, u64) {
    let work = program(
        Kind::Dispatch,
        Some(Arc::new(baton_testkit::ScriptedDispatcher::echo(
            ReplayPolicy::Never,
        ))),
    );
    let mut engine_config = EngineConfig::new(store);
    engine_config.programs.push(work.erase());
    config(&mut engine_config);
    let engine = Engine::new(engine_config).expect("valid");
    let handle = engine
        .start(&work, request("work", json!(["a", "b"])))
        .await
        .expect("starts")
        .into_handle();
    let view = handle.until(Condition::Terminal).await.expect("ends");
    (engine, handle.tree(), view.head_seq)
}

fn seqs(events: &[WatchEvent]) -> Vec<u64> {
    events.iter().filter_map(|event| event.seq).collect()
}

#[tokio::test]
async fn a_reader_after_the_end_and_a_resumed_reader_see_each_committed_fact_once_in_order() {
    let store = Arc::new(MemoryStore::keeping_history());
    let (engine, tree, head) = finished_tree(store, |_| {}).await;

    let mut all = engine.watch(&scope(), tree, 0).await.expect("watches");
    let events = committed(&mut all).await;
    assert_eq!(seqs(&events), (1..=head).collect::<Vec<_>>());
    assert!(matches!(events[0].kind, WatchKind::ProcessStarted));
    assert_eq!(
        events[0]
            .program
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("test.dispatch")
    );
    // The step that completed the root is reported as its termination,
    // with the output and what the root used.
    match events.last().map(|event| &event.kind) {
        Some(WatchKind::Terminated {
            status,
            output: Some(_),
            failure: None,
            usage,
        }) => {
            assert_eq!(*status, Status::Completed);
            assert_eq!(usage.effects, 2, "{usage:?}");
        }
        other => panic!("the root's termination comes last: {other:?}"),
    }
    assert!(
        !events.iter().any(|event| matches!(&event.kind,
            WatchKind::StepAdopted { transition, .. } if transition == "complete")),
        "one event per record"
    );
    let pending = events
        .iter()
        .filter(|event| matches!(event.kind, WatchKind::EffectPending { .. }))
        .count();
    assert_eq!(pending, 2);

    // A reader that saw up to record 3 resumes from 4.
    let mut resumed = engine.watch(&scope(), tree, 4).await.expect("watches");
    let rest = committed(&mut resumed).await;
    assert_eq!(seqs(&rest), (4..=head).collect::<Vec<_>>());
    assert_eq!(rest[..], events[3..]);

    // The JSON shape: sequence, durability, names and the kind's data.
    let json = serde_json::to_value(&events[1]).expect("encodes");
    assert_eq!(json["seq"], 2);
    assert_eq!(json["durable"], true);
    assert!(json["kind"].is_string());
    assert!(json.get("data").is_some());
    let back: WatchEvent = serde_json::from_value(json).expect("decodes");
    assert_eq!(back, events[1]);
}

#[tokio::test]
async fn a_live_reader_sees_what_a_later_reader_sees() {
    let store = Arc::new(MemoryStore::keeping_history());
    let ask = program(Kind::Ask, None);
    let engine = engine(store, &[&ask]);
    let handle = engine
        .start(&ask, request("ask", "proceed?"))
        .await
        .expect("starts")
        .into_handle();
    let mut live = engine
        .watch(&scope(), handle.tree(), 1)
        .await
        .expect("watches");
    let wait = open_wait(&handle).await;
    let reading = tokio::spawn(async move { committed(&mut live).await });
    engine
        .answer(
            &scope(),
            handle.tree(),
            wait,
            Payload::encode(&true).expect("encodes"),
        )
        .await
        .expect("answers");
    let view = handle.until(Condition::Terminal).await.expect("ends");
    let seen_live = reading.await.expect("joins");
    let mut later = engine
        .watch(&scope(), handle.tree(), 0)
        .await
        .expect("watches");
    let seen_later = committed(&mut later).await;
    assert_eq!(seqs(&seen_live), (1..=view.head_seq).collect::<Vec<_>>());
    assert_eq!(seen_live, seen_later);
}

#[tokio::test]
async fn a_slow_reader_loses_no_committed_fact_and_is_told_it_lagged() {
    let store = Arc::new(MemoryStore::keeping_history());
    let gated = Gated::new(ReplayPolicy::Never);
    let work = program(Kind::Dispatch, Some(Arc::new(gated.clone())));
    let mut config = EngineConfig::new(store);
    config.programs.push(work.erase());
    config.event_capacity = 2;
    let engine = Engine::new(config).expect("valid");
    let items: Vec<Value> = (0..20).map(|n| json!(n)).collect();
    let handle = engine
        .start(&work, request("many", Value::Array(items)))
        .await
        .expect("starts")
        .into_handle();
    // The reader subscribes while the tree runs, then reads nothing while
    // twenty settlements commit.
    let mut slow = engine
        .watch(&scope(), handle.tree(), 0)
        .await
        .expect("watches");
    gated.release(20);
    let view = handle.until(Condition::Terminal).await.expect("ends");
    let mut all = Vec::new();
    while let Some(event) = slow.next().await {
        all.push(event.expect("the log reads"));
    }
    let lagged = all
        .iter()
        .any(|event| matches!(event.kind, WatchKind::Lagged { .. }) && !event.durable);
    assert!(lagged, "the reader is told it fell behind");
    let durable: Vec<WatchEvent> = all.into_iter().filter(|event| event.durable).collect();
    assert_eq!(seqs(&durable), (1..=view.head_seq).collect::<Vec<_>>());
    let settled: BTreeMap<_, _> = durable
        .iter()
        .filter_map(|event| match &event.kind {
            WatchKind::EffectSettled { effect, .. } => Some((*effect, ())),
            _ => None,
        })
        .collect();
    assert_eq!(settled.len(), 20);
}

#[tokio::test]
async fn a_watch_of_another_scope_or_an_unknown_tree_is_refused() {
    let store = Arc::new(MemoryStore::new());
    let (engine, tree, _) = finished_tree(store, |_| {}).await;
    let other = Scope::new("globex").expect("valid");
    let refused = engine
        .watch(&other, tree, 0)
        .await
        .expect_err("another scope");
    assert_eq!(refused.code(), "engine.scope.mismatch");
    let unknown = TreeId::root(&baton_testkit::programs::start_id("nobody"));
    let refused = engine
        .watch(&scope(), unknown, 0)
        .await
        .expect_err("unknown");
    assert_eq!(refused.code(), "engine.tree.not_found");
}

/// The next live event of the watch that `pick` picks, skipping others;
/// fails the test after 30 s.
async fn next_live<T>(watch: &mut baton_run::Watch, pick: impl Fn(&WatchKind) -> Option<T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let event = watch.next().await.expect("still running").expect("reads");
            if let Some(found) = pick(&event.kind) {
                assert!(!event.durable, "{event:?}");
                return found;
            }
        }
    })
    .await
    .expect("the event arrives")
}

#[tokio::test]
async fn the_idle_alarm_rings_once_per_quiet_spell_and_is_not_a_failure() {
    let clock = Arc::new(baton_run::ManualClock::new(baton_run::Timestamp(1_000_000)));
    let gated = Gated::new(ReplayPolicy::Never);
    let work = program(Kind::Dispatch, Some(Arc::new(gated.clone())));
    let engine = Engine::new(EngineConfig {
        programs: vec![work.erase()],
        clock: clock.clone(),
        lease_ttl: Duration::from_secs(3600),
        idle_alarm: Some(Duration::from_secs(10)),
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })
    .expect("valid");
    let handle = engine
        .start(&work, request("idle", json!(["a"])))
        .await
        .expect("starts")
        .into_handle();
    let mut watch = engine
        .watch(&scope(), handle.tree(), 1)
        .await
        .expect("watches");
    while gated.calls() == 0 {
        tokio::task::yield_now().await;
    }
    // The dispatch hangs; nothing is committed for longer than the alarm.
    clock.advance(Duration::from_secs(11));
    let since = next_live(&mut watch, |kind| match kind {
        WatchKind::Idle { since } => Some(*since),
        _ => None,
    })
    .await;
    assert_eq!(since, baton_run::Timestamp(1_000_000), "the last commit");
    // Quiet on: no second alarm until something is committed.
    clock.advance(Duration::from_secs(60));
    gated.release(1);
    let mut events = Vec::new();
    while let Some(event) = watch.next().await {
        events.push(event.expect("reads").kind);
    }
    assert!(
        !events
            .iter()
            .any(|kind| matches!(kind, WatchKind::Idle { .. })),
        "{events:?}"
    );
    let ended = handle.await_result().await.expect("ends");
    assert_eq!(ended.status(), Status::Completed, "the alarm is no failure");
}

#[tokio::test]
async fn a_tree_waiting_on_a_person_never_rings_the_idle_alarm() {
    let clock = Arc::new(baton_run::ManualClock::new(baton_run::Timestamp(1_000_000)));
    let ask = program(Kind::Ask, None);
    let engine = Engine::new(EngineConfig {
        programs: vec![ask.erase()],
        clock: clock.clone(),
        lease_ttl: Duration::from_secs(3600),
        idle_alarm: Some(Duration::from_secs(10)),
        sleep: baton_run::Sleep::Awake,
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })
    .expect("valid");
    let handle = engine
        .start(&ask, request("asks", json!("q")))
        .await
        .expect("starts")
        .into_handle();
    let wait = open_wait(&handle).await;
    let mut events = engine.events();
    clock.advance(Duration::from_secs(3600 * 24));
    // The answer wakes the tree; by then an alarm would have been sent.
    engine
        .answer(
            &scope(),
            handle.tree(),
            wait,
            Payload::encode(&json!(true)).expect("encodes"),
        )
        .await
        .expect("answers");
    handle.await_result().await.expect("ends");
    while let Ok(Some(event)) = events.try_recv() {
        assert!(
            !matches!(event.kind, baton_run::EventKind::Idle { .. }),
            "{event:?}"
        );
    }
}

#[test]
fn a_zero_idle_alarm_is_refused() {
    let refused = Engine::new(EngineConfig {
        idle_alarm: Some(Duration::ZERO),
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })
    .err()
    .expect("refused");
    assert_eq!(refused.code(), "engine.config.invalid");
    assert!(refused.to_string().contains("idle_alarm"), "{refused}");
}
