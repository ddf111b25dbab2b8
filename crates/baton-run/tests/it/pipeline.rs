//! A store that answers its writes later (SQLite's writer thread, a
//! PostgreSQL server) lets a tree's owner task stage its next round while a
//! commit is in flight. These tests hold the engine to what that must not
//! change: the engine and store conformance kits (the crash matrix among
//! them) on such a store, and no dispatch of a round staged ahead sent
//! before its own commit is durable, even when the commit before it fails.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use baton_run::dispatch::{DispatchCall, Dispatcher, ReplayPolicy};
use baton_run::log::{RecordBody, RecordKind};
use baton_run::program::{Boundary, Condition};
use baton_run::{
    BoxFuture, EffectId, Engine, EngineConfig, Event, EventKind, MemoryStore, OutputError, Payload,
    ProcessId, RuntimeError, Scope, Settlement, StartRequest, TreeId,
};
use baton_testkit::programs::{Kind, Plan, SCOPE, parent, program, start_id};
use baton_testkit::{Cut, FaultStore, engine_conformance, store_conformance};
use serde_json::{Value, json};

/// Checks each event, as it arrives, against the store and the events
/// before it: a record past the stored head, or a process drained before
/// its own end was told, is an event ahead of its commit.
#[derive(Default)]
struct Watch {
    ended: BTreeSet<ProcessId>,
    ahead: Vec<String>,
}

impl Watch {
    fn see(&mut self, store: &MemoryStore, event: &Event) {
        let stored = store.records(event.tree).len() as u64;
        let seq = match &event.kind {
            EventKind::StepAdopted { seq, .. }
            | EventKind::EffectPending { seq, .. }
            | EventKind::EffectSettled { seq, .. }
            | EventKind::ChildStarted { seq, .. } => Some(*seq),
            EventKind::Terminated { seq, .. } => {
                self.ended.insert(event.process);
                Some(*seq)
            }
            EventKind::Drained { .. } if !self.ended.contains(&event.process) => {
                self.ahead
                    .push(format!("{} drained before it ended", event.process));
                None
            }
            _ => None,
        };
        if let Some(seq) = seq
            && seq > stored
        {
            self.ahead
                .push(format!("{:?} at {seq} with {stored} stored", event.kind));
        }
    }
}

fn late(store: &MemoryStore) -> FaultStore {
    FaultStore::new(Arc::new(store.clone())).answering_late()
}

#[tokio::test]
async fn the_engine_conforms_on_a_store_that_answers_late() {
    engine_conformance(|| late(&MemoryStore::new())).await;
}

#[tokio::test]
async fn the_store_kit_and_its_crash_matrix_pass_on_a_store_that_answers_late() {
    store_conformance(|| late(&MemoryStore::new())).await;
}

/// Echoes each request, and notes for each call whether the effect's
/// pending record was in the store when the call came.
struct Oracle {
    store: MemoryStore,
    tree: TreeId,
    calls: Mutex<Vec<(String, bool)>>,
}

impl Oracle {
    fn durable(&self, effect: EffectId) -> bool {
        self.store.records(self.tree).iter().any(|record| {
            record.kind == RecordKind::EffectPending
                && matches!(record.decode(), Ok(RecordBody::EffectPending { effect: e, .. }) if e == effect)
        })
    }

    fn calls(&self) -> Vec<(String, bool)> {
        self.calls.lock().expect("not poisoned").clone()
    }
}

impl Dispatcher for Oracle {
    fn replay_policy(&self, _request: &Payload) -> ReplayPolicy {
        ReplayPolicy::Never
    }

    fn dispatch(&self, call: DispatchCall) -> BoxFuture<'static, Settlement> {
        let durable = self.durable(call.effect);
        let key: String = call.request.decode().expect("a key");
        self.calls
            .lock()
            .expect("not poisoned")
            .push((key, durable));
        Box::pin(std::future::ready(Settlement::ok(call.request)))
    }
}

/// A parent whose children each dispatch their key, on an engine over
/// `store` (answering late) that takes one step per commit, so each child's
/// step and dispatch is staged while the commit before it is in flight.
struct Ahead {
    store: MemoryStore,
    faulty: FaultStore,
    oracle: Arc<Oracle>,
    root: baton_run::Program<Vec<String>, Value>,
    config: EngineConfig,
    id: baton_run::StartId,
}

impl Ahead {
    fn new(key: &str) -> Ahead {
        let store = MemoryStore::keeping_history();
        let id = start_id(key);
        let oracle = Arc::new(Oracle {
            store: store.clone(),
            tree: ProcessId::root(&id),
            calls: Mutex::default(),
        });
        let child = program(Kind::Dispatch, Some(oracle.clone()));
        let root = parent(Plan::new(Boundary::Result, Condition::All), &child);
        let faulty = late(&store);
        let mut config = EngineConfig::new(Arc::new(faulty.clone()));
        config.programs.push(root.erase());
        config.max_steps_per_commit = 1;
        Ahead {
            store,
            faulty,
            oracle,
            root,
            config,
            id,
        }
    }
}

#[tokio::test]
async fn a_round_staged_while_a_commit_is_in_flight_is_dispatched_and_told_only_once_durable() {
    let Ahead {
        store,
        oracle,
        root,
        mut config,
        id,
        ..
    } = Ahead::new("ahead");
    // Snapshots are due every few commits: each covers the state its own
    // commit left, not the round staged after it.
    config.snapshot_every = 4;
    let engine = Engine::new(config).expect("the engine configuration is valid");
    // Each event is checked as it arrives (see `Watch`).
    let mut events = engine.events();
    let watch = Arc::new(Mutex::new(Watch::default()));
    let watcher = tokio::spawn({
        let (store, watch) = (store.clone(), watch.clone());
        async move {
            while let Ok(event) = events.recv().await {
                watch.lock().expect("not poisoned").see(&store, &event);
            }
        }
    });
    let keys: Vec<String> = ["a", "b", "c", "d", "e", "f"].map(String::from).into();
    let handle = engine
        .start(&root, StartRequest::new(id, keys.clone()))
        .await
        .expect("starts");
    let output = handle.output().await.expect("completes");
    handle.join().await.expect("drains");
    tokio::task::yield_now().await;
    watcher.abort();
    {
        let watch = watch.lock().expect("not poisoned");
        assert!(
            watch.ended.contains(&handle.tree()),
            "the root's end was told"
        );
        assert!(
            watch.ahead.is_empty(),
            "events ahead of their commit: {:?}",
            watch.ahead
        );
    }
    let ready: Vec<Value> = keys
        .iter()
        .map(|key| json!([key, "completed", [{"status": "succeeded", "output": key}]]))
        .collect();
    assert_eq!(output["ready"], Value::Array(ready));
    let scope = Scope::new(SCOPE).expect("valid");
    let verified = engine
        .verify(&scope, handle.tree())
        .await
        .expect("the log and its snapshot verify");
    assert!(
        verified.snapshot_matched.is_some(),
        "a snapshot was written and matches the log: {verified:?}"
    );
    let calls = oracle.calls();
    assert_eq!(calls.len(), keys.len(), "one call per child: {calls:?}");
    assert!(
        calls.iter().all(|(_, durable)| *durable),
        "every dispatch was sent after its pending record was durable: {calls:?}"
    );
}

#[tokio::test]
async fn when_the_commit_in_flight_fails_nothing_staged_behind_it_is_dispatched() {
    let Ahead {
        faulty,
        oracle,
        root,
        config,
        id,
        ..
    } = Ahead::new("behind");
    // The second commit that holds a pending dispatch is lost: the tree
    // stops with the next child's step and dispatch staged behind it.
    faulty.arm(RecordKind::EffectPending, Cut::Before, 2);
    let engine = Engine::new(config).expect("the engine configuration is valid");
    let keys: Vec<String> = ["a", "b", "c", "d"].map(String::from).into();
    let handle = engine
        .start(&root, StartRequest::new(id, keys))
        .await
        .expect("starts");
    let stopped = handle.output().await;
    assert!(
        matches!(
            stopped,
            Err(OutputError::Stopped(RuntimeError::Storage { .. }))
        ),
        "the tree stops on the lost commit: {stopped:?}"
    );
    assert!(faulty.crashed());
    let calls = oracle.calls();
    assert_eq!(
        calls,
        vec![("a".to_string(), true)],
        "only the dispatch whose commit was durable was sent"
    );
}

#[tokio::test]
async fn a_host_asking_for_the_tree_while_its_last_commit_is_written_finds_it_finished() {
    // Every host call on an awake tree asks its owner whether it still
    // holds the lease (a renewal). One that arrives while the commit that
    // gives the lease up is in flight must not renew after it, or the
    // owner would find the lease gone and stop its own finished tree.
    let Ahead {
        root, config, id, ..
    } = Ahead::new("asked");
    let engine = Arc::new(Engine::new(config).expect("the engine configuration is valid"));
    let keys: Vec<String> = (0..12).map(|n| format!("k{n:02}")).collect();
    let handle = engine
        .start(&root, StartRequest::new(id, keys))
        .await
        .expect("starts");
    let tree = handle.tree();
    let scope = Scope::new(SCOPE).expect("valid");
    // Hosts ask from tasks of their own, so some ask whenever the owner
    // task waits for the store.
    let done = Arc::new(AtomicBool::new(false));
    let askers: Vec<_> = (0..8)
        .map(|_| {
            let (engine, done, scope) = (engine.clone(), done.clone(), scope.clone());
            tokio::spawn(async move {
                let mut asked = 0u32;
                while !done.load(Ordering::SeqCst) {
                    engine.process::<Value>(&scope, tree).await?;
                    asked += 1;
                    // A finished tree answers without waiting.
                    tokio::task::yield_now().await;
                }
                Ok::<_, baton_run::TreeError>(asked)
            })
        })
        .collect();
    let output = handle.output().await;
    done.store(true, Ordering::SeqCst);
    let mut asked = Ok(0);
    for asker in askers {
        let answer = asker.await.expect("the host's task ran");
        asked = asked.and_then(|total| answer.map(|one| total + one));
    }
    assert!(output.is_ok(), "the tree completes: {output:?}");
    assert!(
        asked.as_ref().is_ok_and(|asked| *asked > 1),
        "the host kept asking and never found the tree stopped: {asked:?}"
    );
}
