//! Process trees: child starts, waits, controls, cancellation and drain,
//! budgets, capabilities, crash recovery across child publication and
//! controls, and random trees.

use crate::common;

use std::sync::Arc;

use crate::common::{Kind, open_wait, program, request};
use baton_run::log::RecordKind;
use baton_run::{
    Boundary, Budget, Capabilities, ChildKey, ChildSignal, Condition, Definition, Descriptor,
    Dimension, Effect, Engine, EngineConfig, Execution, ExecutionState, MemoryStore, Name, Payload,
    Program, ProgramConfig, RecoverOptions, ReplayPolicy, Schema, Scope, Settlement, Signal,
    SignalBody, SignalId, SignalRequest, Status, StepError, Transition, TreeLimits, TreeView,
    configuration_digest, implementation_digest,
};
use baton_testkit::{Cut, FaultStore, ScriptedDispatcher};
use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How a parent runs its children.
#[derive(Clone, Debug, Serialize)]
struct Plan {
    child_budget: Budget,
    child_capabilities: Capabilities,
    boundary: Boundary,
    condition: Condition,
    /// After the wait, cancel children not yet ready and wait for them to drain.
    cancel_rest: bool,
    /// Instead of waiting: signal the first child a note, then cancel it.
    note: bool,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct ParentState {
    keys: Vec<String>,
    phase: u32,
    started: Vec<(String, String)>,
    ready: Vec<(String, Status, Value)>,
    receipts: Vec<String>,
}

struct Parent {
    plan: Plan,
    child: Program,
    descriptor: Descriptor,
}

struct ParentRun {
    plan: Plan,
    child: baton_run::Digest,
    state: ParentState,
}

impl Definition for Parent {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }
    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(ParentRun {
            plan: self.plan.clone(),
            child: self.child.reference().digest,
            state: ParentState {
                keys: input.decode()?,
                ..ParentState::default()
            },
        }))
    }
    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(ParentRun {
            plan: self.plan.clone(),
            child: self.child.reference().digest,
            state: state.decode()?,
        }))
    }
    fn children(&self) -> Vec<Program> {
        vec![self.child.clone()]
    }
}

fn key(text: &str) -> ChildKey {
    ChildKey::new(text).expect("valid key")
}

impl ParentRun {
    fn observe(&mut self, window: &[Signal]) {
        for signal in window {
            match &signal.body {
                SignalBody::ChildStarted { key, failure, .. } => self.state.started.push((
                    key.to_string(),
                    failure
                        .as_ref()
                        .map_or("ok".to_owned(), |f| f.code().to_owned()),
                )),
                SignalBody::ChildrenReady { children, .. } => {
                    for child in children {
                        if self
                            .state
                            .ready
                            .iter()
                            .all(|(k, _, _)| k != child.key.as_str())
                        {
                            let output = child
                                .termination
                                .output()
                                .map_or(Value::Null, Payload::to_value);
                            self.state.ready.push((
                                child.key.to_string(),
                                child.termination.status(),
                                output,
                            ));
                        }
                    }
                }
                SignalBody::ControlReceipt { result, .. } => {
                    self.state.receipts.push(match result {
                        Settlement::Succeeded { .. } => "delivered".to_owned(),
                        Settlement::Failed { failure, .. } => failure.code().to_owned(),
                        Settlement::Unknown { .. } => "unknown".to_owned(),
                    })
                }
                _ => {}
            }
        }
    }

    fn started_keys(&self) -> Vec<ChildKey> {
        self.state
            .started
            .iter()
            .filter(|(_, code)| code == "ok")
            .map(|(k, _)| key(k))
            .collect()
    }

    fn output(&self) -> Result<Transition, StepError> {
        Ok(Transition::Complete {
            consumed: 0,
            output: Payload::encode(&json!({
                "started": self.state.started,
                "ready": self.state.ready,
                "receipts": self.state.receipts,
            }))?,
        })
    }
}

impl Execution for ParentRun {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        self.observe(window);
        let phase = self.state.phase;
        self.state.phase += 1;
        let consumed = window.len();
        let keys: Vec<ChildKey> = self.state.keys.iter().map(|k| key(k)).collect();
        let start = |k: &ChildKey| -> Result<Effect, StepError> {
            Ok(Effect::StartChild {
                key: k.clone(),
                program: self.child,
                input: Payload::encode(&k.as_str())?,
                budget: self.plan.child_budget.clone(),
                capabilities: self.plan.child_capabilities.clone(),
            })
        };
        match (phase, self.plan.note) {
            (0, false) => {
                let mut effects = keys.iter().map(start).collect::<Result<Vec<_>, _>>()?;
                effects.push(Effect::WaitChildren {
                    keys: keys.clone(),
                    boundary: self.plan.boundary,
                    condition: self.plan.condition,
                });
                Ok(Transition::Continue { consumed, effects })
            }
            (0, true) => Ok(Transition::Continue {
                consumed,
                effects: vec![
                    start(&keys[0])?,
                    Effect::SignalChild {
                        key: keys[0].clone(),
                        signal: ChildSignal {
                            id: SignalId::new("note-1").expect("valid"),
                            wait: None,
                            payload: Payload::encode(&json!({"note": "from the parent"}))?,
                        },
                    },
                ],
            }),
            (1, true) => Ok(Transition::Continue {
                consumed,
                effects: vec![
                    Effect::CancelChild {
                        key: keys[0].clone(),
                        reason: "done".into(),
                    },
                    Effect::WaitChildren {
                        keys: vec![keys[0].clone()],
                        boundary: Boundary::Drained,
                        condition: Condition::All,
                    },
                ],
            }),
            (1, false) if self.plan.cancel_rest => {
                let rest: Vec<ChildKey> = self
                    .started_keys()
                    .into_iter()
                    .filter(|k| self.state.ready.iter().all(|(r, _, _)| r != k.as_str()))
                    .collect();
                if rest.is_empty() {
                    return self.output().map(|t| with_consumed(t, consumed));
                }
                let mut effects: Vec<Effect> = rest
                    .iter()
                    .map(|k| Effect::CancelChild {
                        key: k.clone(),
                        reason: "a sibling won".into(),
                    })
                    .collect();
                effects.push(Effect::WaitChildren {
                    keys: rest,
                    boundary: Boundary::Drained,
                    condition: Condition::All,
                });
                Ok(Transition::Continue { consumed, effects })
            }
            _ => self.output().map(|t| with_consumed(t, consumed)),
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }
}

fn with_consumed(transition: Transition, consumed: usize) -> Transition {
    match transition {
        Transition::Complete { output, .. } => Transition::Complete { consumed, output },
        other => other,
    }
}

fn parent(plan: Plan, child: &Program<Value, Value>) -> Program<Vec<String>, Value> {
    let descriptor = Descriptor::new(
        "test.parent",
        "Runs children.",
        Schema::of::<Vec<String>>(),
        Schema::any(),
    )
    .expect("valid");
    let configuration = configuration_digest(&plan).expect("encodes");
    Program::new(ProgramConfig {
        definition: Arc::new(Parent {
            plan,
            child: child.erase(),
            descriptor,
        }),
        dispatcher: None,
        implementation: implementation_digest(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        configuration,
    })
}

fn plan(boundary: Boundary, condition: Condition) -> Plan {
    Plan {
        child_budget: Budget::unlimited()
            .with_steps(2)
            .with_effects(1)
            .with_signals(4),
        child_capabilities: Capabilities::none(),
        boundary,
        condition,
        cancel_rest: false,
        note: false,
    }
}

fn keys(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

fn engine_for(store: Arc<dyn baton_run::Store>, program: &Program<Vec<String>, Value>) -> Engine {
    Engine::new(EngineConfig::with_store(store).program(program))
}

fn start(
    key_text: &str,
    input: Vec<String>,
    budget: Budget,
) -> baton_run::StartRequest<Vec<String>> {
    let mut request = baton_run::StartRequest::new(common::id(key_text), input);
    request.budget = budget;
    request
}

#[tokio::test]
async fn three_children_complete_in_declaration_order_with_exact_budget_accounting() {
    let echo = program(Kind::Echo, None);
    let root = parent(plan(Boundary::Result, Condition::All), &echo);
    let engine = engine_for(Arc::new(MemoryStore::new()), &root);
    let budget = Budget::unlimited()
        .with_steps(10)
        .with_effects(10)
        .with_signals(20);
    let handle = engine
        .start(&root, start("all", keys(&["c", "a", "b"]), budget.clone()))
        .await
        .expect("starts");
    let output = handle.output().await.expect("completes");
    assert_eq!(
        output["ready"],
        json!([
            ["c", "completed", "c"],
            ["a", "completed", "a"],
            ["b", "completed", "b"]
        ])
    );
    handle.join().await.expect("joins");

    let view = handle.inspect().await.expect("inspects");
    let root_view = view.root();
    // Two steps; three starts and one wait; one reserved result signal per effect.
    assert_eq!(
        (
            root_view.usage.steps,
            root_view.usage.effects,
            root_view.usage.signals
        ),
        (2, 4, 4)
    );
    // Each child was granted 2 steps, 1 effect, 4 signals, debited for good.
    assert_eq!(
        (
            root_view.granted.steps,
            root_view.granted.effects,
            root_view.granted.signals
        ),
        (6, 3, 12)
    );
    assert_eq!(TreeView::remaining(root_view, &Dimension::Steps), Some(2));
    assert_eq!(root_view.children.len(), 3);
    for (name, id) in &root_view.children {
        let child = view.process(*id).expect("child view");
        assert_eq!(child.key.as_ref(), Some(name));
        assert_eq!(child.status, Status::Completed);
        assert_eq!(
            (child.usage.steps, child.usage.effects, child.usage.signals),
            (1, 0, 0)
        );
        assert_eq!(
            TreeView::remaining(child, &Dimension::Steps),
            Some(1),
            "unused budget is not returned"
        );
    }
}

#[tokio::test]
async fn any_wakes_on_the_first_child_and_the_rest_drain_canceled() {
    let ask = program(Kind::Ask, None);
    let mut any = plan(Boundary::Result, Condition::Any);
    any.cancel_rest = true;
    any.child_budget = Budget::unlimited().with_steps(5).with_signals(8);
    let root = parent(any, &ask);
    let engine = engine_for(Arc::new(MemoryStore::new()), &root);
    let handle = engine
        .start(
            &root,
            start("any", keys(&["x", "y", "z"]), Budget::unlimited()),
        )
        .await
        .expect("starts");
    let y = handle.child::<Value>(&key("y"));
    let wait = open_wait(&y).await;
    let answer = SignalRequest {
        id: SignalId::new("y-answer").expect("valid"),
        wait: Some(wait),
        payload: Payload::encode(&true).expect("encodes"),
    };
    y.signal(answer).await.expect("admitted");
    let termination = handle.join().await.expect("joins");
    let output = termination.output().expect("output").to_value();
    // y won; x and z were canceled and drained before the parent completed.
    assert_eq!(
        output["ready"],
        json!([
            ["y", "completed", true],
            ["x", "canceled", null],
            ["z", "canceled", null]
        ])
    );
    assert_eq!(output["receipts"], json!(["delivered", "delivered"]));
    for name in ["x", "z"] {
        let child = handle.child::<Value>(&key(name));
        let ended = child.join().await.expect("drained");
        assert_eq!(ended.status(), Status::Canceled);
    }
    let view = handle.inspect().await.expect("inspects");
    assert!(view.processes.iter().all(|p| p.status.is_terminal()));
}

#[tokio::test]
async fn an_any_wait_over_quick_children_settles_once_with_every_child_of_the_round() {
    let echo = program(Kind::Echo, None);
    let mut any = plan(Boundary::Result, Condition::Any);
    any.cancel_rest = true;
    let root = parent(any, &echo);
    let engine = engine_for(Arc::new(MemoryStore::new()), &root);
    let names = ["a", "b", "c", "d", "e", "f", "g", "h"];
    // Process ids order the engine's passes; several roots give several
    // orders of parent and children.
    for root_key in ["any-1", "any-2", "any-3", "any-4", "any-5", "any-6"] {
        let handle = engine
            .start(&root, start(root_key, keys(&names), Budget::unlimited()))
            .await
            .expect("starts");
        let output = handle.output().await.expect("completes");
        // Every child completed before the parent's wait was settled, so the
        // one wake-up carries all of them and nothing is left to cancel.
        let ready: Vec<Value> = names.iter().map(|n| json!([n, "completed", n])).collect();
        assert_eq!(output["ready"], Value::Array(ready), "{root_key}");
        assert_eq!(output["receipts"], json!([]), "{root_key}");
    }
}

#[tokio::test]
async fn a_round_of_children_larger_than_a_commit_still_settles_its_wait_once() {
    let echo = program(Kind::Echo, None);
    let mut any = plan(Boundary::Result, Condition::Any);
    any.cancel_rest = true;
    let root = parent(any, &echo);
    let mut config = EngineConfig::with_store(Arc::new(MemoryStore::new())).program(&root);
    // Twelve children step over several commits of three steps each.
    config.max_steps_per_commit = 3;
    let engine = Engine::new(config);
    let names: Vec<String> = (0..12).map(|n| format!("c{n:02}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let handle = engine
        .start(&root, start("wide", keys(&names), Budget::unlimited()))
        .await
        .expect("starts");
    let output = handle.output().await.expect("completes");
    let ready: Vec<Value> = names.iter().map(|n| json!([n, "completed", n])).collect();
    assert_eq!(output["ready"], Value::Array(ready));
    assert_eq!(output["receipts"], json!([]), "nothing was left to cancel");
}

#[tokio::test]
async fn completing_with_live_children_cancels_them_and_join_waits_for_their_drain() {
    let ask = program(Kind::Ask, None);
    // Quorum(1) at the result boundary, no cancel_rest: the parent completes
    // while two children still wait.
    let root = parent(plan(Boundary::Result, Condition::Quorum(1)), &ask);
    let engine = engine_for(Arc::new(MemoryStore::new()), &root);
    let handle = engine
        .start(
            &root,
            start("orphans", keys(&["p", "q", "r"]), Budget::unlimited()),
        )
        .await
        .expect("starts");
    let p = handle.child::<Value>(&key("p"));
    let wait = open_wait(&p).await;
    p.signal(SignalRequest {
        id: SignalId::new("p").expect("valid"),
        wait: Some(wait),
        payload: Payload::encode(&false).expect("encodes"),
    })
    .await
    .expect("admitted");
    assert_eq!(
        handle.await_result().await.expect("terminates").status(),
        Status::Completed
    );
    handle.join().await.expect("joins");
    for name in ["q", "r"] {
        let child = handle
            .child::<Value>(&key(name))
            .await_result()
            .await
            .expect("terminated");
        assert_eq!(child.status(), Status::Canceled);
        assert_eq!(child.cause(), baton_run::Cause::ParentCancellation);
    }
}

#[tokio::test]
async fn refused_starts_are_facts_for_the_parent() {
    let echo = program(Kind::Echo, None);
    let mut escalate = plan(Boundary::Result, Condition::All);
    escalate.child_capabilities = Capabilities::of([Name::new("net").expect("valid")]);
    let root = parent(escalate, &echo);
    let engine = engine_for(Arc::new(MemoryStore::new()), &root);
    let handle = engine
        .start(&root, start("caps", keys(&["k"]), Budget::unlimited()))
        .await
        .expect("starts");
    let output = handle
        .output()
        .await
        .expect("the parent continues and completes");
    assert_eq!(
        output["started"],
        json!([["k", "engine.child.capability_escalation"]])
    );

    // A finite parent cannot grant more than it has, nor an unlimited dimension.
    let root = parent(plan(Boundary::Result, Condition::All), &echo);
    let engine = engine_for(Arc::new(MemoryStore::new()), &root);
    // Two own steps plus one 2-step grant fit in 4; a second grant does not.
    let tight = Budget::unlimited()
        .with_steps(4)
        .with_effects(10)
        .with_signals(20);
    let handle = engine
        .start(&root, start("tight", keys(&["a", "b", "c"]), tight))
        .await
        .expect("starts");
    let output = handle.output().await.expect("completes");
    assert_eq!(
        output["started"],
        json!([
            ["a", "ok"],
            ["b", "engine.child.budget_exhausted"],
            ["c", "engine.child.budget_exhausted"]
        ])
    );
    let mut unlimited_child = plan(Boundary::Result, Condition::All);
    unlimited_child.child_budget = Budget::unlimited();
    let root = parent(unlimited_child, &echo);
    let engine = engine_for(Arc::new(MemoryStore::new()), &root);
    let finite = Budget::unlimited().with_steps(50);
    let handle = engine
        .start(&root, start("unbounded", keys(&["a"]), finite))
        .await
        .expect("starts");
    let output = handle.output().await.expect("completes");
    assert_eq!(
        output["started"],
        json!([["a", "engine.child.budget_exhausted"]])
    );

    // Tree limits: a second live child is over max_active_children = 1.
    let root = parent(
        plan(Boundary::Result, Condition::All),
        &program(Kind::Echo, None),
    );
    let mut config = EngineConfig::new(MemoryStore::new()).program(&root);
    config.limits = TreeLimits {
        max_active_children: 1,
        ..TreeLimits::default()
    };
    let engine = Engine::new(config);
    let handle = engine
        .start(
            &root,
            start("limits", keys(&["a", "b"]), Budget::unlimited()),
        )
        .await
        .expect("starts");
    let output = handle.output().await.expect("completes");
    assert_eq!(
        output["started"][1],
        json!(["b", "engine.child.tree_limit"])
    );
}

#[tokio::test]
async fn a_crash_before_the_child_start_record_starts_the_child_exactly_once() {
    let echo = program(Kind::Echo, None);
    let root = parent(plan(Boundary::Drained, Condition::All), &echo);
    let memory = MemoryStore::keeping_history();
    let faulty = FaultStore::new(Arc::new(memory.clone()));
    faulty.arm(RecordKind::ChildStarted, Cut::Before, 1);
    let first = engine_for(Arc::new(faulty.clone()), &root);
    let handle = first
        .start(
            &root,
            start("crash-start", keys(&["a", "b"]), Budget::unlimited()),
        )
        .await
        .expect("starts");
    assert!(handle.await_result().await.is_err());
    assert!(faulty.crashed());
    let tree = handle.tree();
    drop(first);
    let second = engine_for(faulty.inner(), &root);
    second
        .recover(RecoverOptions::default())
        .await
        .expect("recovers");
    let handle = second
        .process::<Value>(&Scope::new("acme").expect("valid"), tree)
        .await
        .expect("attached");
    let output = handle.output().await.expect("completes");
    assert_eq!(
        output["ready"],
        json!([["a", "completed", "a"], ["b", "completed", "b"]])
    );
    let starts = memory
        .records(tree)
        .iter()
        .filter(|r| r.kind == RecordKind::ChildStarted)
        .count();
    assert_eq!(starts, 2, "each child was published exactly once");
}

#[tokio::test]
async fn a_crash_after_a_signal_control_commit_delivers_it_exactly_once() {
    let ask = program(Kind::Ask, None);
    let mut note = plan(Boundary::Result, Condition::All);
    note.note = true;
    let root = parent(note, &ask);
    let memory = MemoryStore::keeping_history();
    let faulty = FaultStore::new(Arc::new(memory.clone()));
    faulty.arm(RecordKind::ControlDelivered, Cut::After, 1);
    let first = engine_for(Arc::new(faulty.clone()), &root);
    let handle = first
        .start(
            &root,
            start("crash-signal", keys(&["a"]), Budget::unlimited()),
        )
        .await
        .expect("starts");
    assert!(handle.await_result().await.is_err());
    let tree = handle.tree();
    drop(first);
    let second = engine_for(faulty.inner(), &root);
    second
        .recover(RecoverOptions::default())
        .await
        .expect("recovers");
    let handle = second
        .process::<Value>(&Scope::new("acme").expect("valid"), tree)
        .await
        .expect("attached");
    let output = handle.output().await.expect("completes");
    assert_eq!(
        output["receipts"],
        json!(["delivered", "delivered"]),
        "signal then cancel receipts"
    );
    let records = memory.records(tree);
    let deliveries: Vec<Value> = records
        .iter()
        .filter(|r| r.kind == RecordKind::ControlDelivered)
        .map(|r| {
            serde_json::from_slice::<Value>(&r.body).expect("json")["delivery"]["delivery"].clone()
        })
        .collect();
    assert_eq!(
        deliveries,
        [json!("signal"), json!("cancel")],
        "the signal was delivered once"
    );
    let child = handle
        .child::<Value>(&key("a"))
        .await_result()
        .await
        .expect("ended");
    assert_eq!(child.status(), Status::Canceled);
    let view = handle.inspect().await.expect("inspects");
    let child_view = view.process(ProcessIdOf::child(&view, "a")).expect("child");
    // One result signal for its wait effect, plus the parent's note.
    assert_eq!(child_view.usage.signals, 2);
}

struct ProcessIdOf;
impl ProcessIdOf {
    fn child(view: &TreeView, name: &str) -> baton_run::ProcessId {
        view.root().children[&key(name)]
    }
}

#[tokio::test]
async fn a_parked_child_shows_as_needs_attention_and_resolving_it_continues_the_tree() {
    let dispatcher = ScriptedDispatcher::echo(ReplayPolicy::Never);
    let worker = program(Kind::Dispatch, Some(Arc::new(dispatcher.clone())));
    let root = parent(
        Plan {
            child_budget: Budget::unlimited(),
            ..plan(Boundary::Drained, Condition::All)
        },
        &worker,
    );
    let memory = MemoryStore::keeping_history();
    let faulty = FaultStore::new(Arc::new(memory.clone()));
    faulty.arm(RecordKind::EffectPending, Cut::After, 1);
    let first = engine_for(Arc::new(faulty.clone()), &root);
    let handle = first
        .start(
            &root,
            baton_run::StartRequest::new(common::id("parked"), vec!["w".to_owned()]),
        )
        .await
        .expect("starts");
    assert!(handle.await_result().await.is_err());
    let tree = handle.tree();
    drop(first);
    let second = engine_for(faulty.inner(), &root);
    second
        .recover(RecoverOptions::default())
        .await
        .expect("recovers");
    let scope = Scope::new("acme").expect("valid");
    let mut view = second.inspect(&scope, tree, false).await.expect("inspects");
    for _ in 0..1000 {
        if view.status == baton_run::TreeStatus::NeedsAttention {
            break;
        }
        tokio::task::yield_now().await;
        view = second.inspect(&scope, tree, false).await.expect("inspects");
    }
    assert_eq!(view.status, baton_run::TreeStatus::NeedsAttention);
    let child = view.process(ProcessIdOf::child(&view, "w")).expect("child");
    assert_eq!(child.status, Status::Parked);
    let effect = child.unknown_effects[0];
    second
        .resolve_unknown(
            &scope,
            tree,
            effect,
            Settlement::ok(Payload::encode(&"by hand").expect("encodes")),
        )
        .await
        .expect("resolves");
    let handle = second
        .process::<Value>(&scope, tree)
        .await
        .expect("attached");
    let output = handle.output().await.expect("completes");
    assert_eq!(output["ready"][0][1], json!("completed"));
    assert_eq!(dispatcher.total(), 0, "never sent again");
}

#[tokio::test]
async fn killing_the_root_kills_the_subtree_and_events_carry_paths() {
    let ask = program(Kind::Ask, None);
    let root = parent(plan(Boundary::Result, Condition::All), &ask);
    let engine = engine_for(Arc::new(MemoryStore::new()), &root);
    let mut events = engine.events();
    let handle = engine
        .start(&root, start("kill", keys(&["a", "b"]), Budget::unlimited()))
        .await
        .expect("starts");
    open_wait(&handle.child::<Value>(&key("b"))).await;
    handle.kill().await.expect("killed");
    assert_eq!(handle.join().await.expect("joins").status(), Status::Killed);
    for name in ["a", "b"] {
        assert_eq!(
            handle
                .child::<Value>(&key(name))
                .await_result()
                .await
                .expect("ended")
                .status(),
            Status::Killed
        );
    }
    let mut child_paths = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let baton_run::EventKind::ChildStarted { .. } = event.kind {
            child_paths.push(event.path.iter().map(|k| k.to_string()).collect::<Vec<_>>());
        }
    }
    assert_eq!(child_paths, [vec!["a".to_owned()], vec!["b".to_owned()]]);
}

/// Invariants every finished tree keeps.
fn check_invariants(view: &TreeView) -> Result<(), TestCaseError> {
    for process in &view.processes {
        prop_assert!(
            process.status.is_terminal(),
            "{} is {:?}",
            process.id,
            process.status
        );
        for dimension in [Dimension::Steps, Dimension::Effects, Dimension::Signals] {
            let spent = process.usage.used(&dimension) + process.granted.used(&dimension);
            prop_assert!(
                process.budget.quota(&dimension).allows(spent, 0),
                "{} over budget in {dimension}",
                process.id
            );
            if process.budget.quota(&dimension).is_finite() {
                let debits: u64 = process
                    .children
                    .values()
                    .map(|child| {
                        match view
                            .process(*child)
                            .expect("child")
                            .budget
                            .quota(&dimension)
                        {
                            baton_run::Quota::Finite(n) => n,
                            baton_run::Quota::Unlimited => 0,
                        }
                    })
                    .sum();
                prop_assert_eq!(process.granted.used(&dimension), debits);
            }
        }
        for child in process.children.values() {
            let child = view.process(*child).expect("child");
            prop_assert_eq!(child.parent, Some(process.id));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]
    #[test]
    fn random_trees_keep_budget_and_drain_invariants(
        fanout in 1usize..5,
        child_steps in 0u64..3,
        parent_steps in prop_oneof![Just(None), (1u64..12).prop_map(Some)],
        any in any::<bool>(),
        cancel_rest in any::<bool>(),
        looping in any::<bool>(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let child = program(if looping { Kind::Loop } else { Kind::Echo }, None);
            let plan = Plan {
                child_budget: Budget::unlimited().with_steps(child_steps).with_effects(2).with_signals(2),
                child_capabilities: Capabilities::none(),
                boundary: Boundary::Drained,
                condition: if any { Condition::Any } else { Condition::All },
                cancel_rest,
                note: false,
            };
            let root = parent(plan, &child);
            let store = MemoryStore::keeping_history();
            let engine = engine_for(Arc::new(store.clone()), &root);
            let mut budget = Budget::unlimited().with_effects(40).with_signals(40);
            if let Some(steps) = parent_steps {
                budget = budget.with_steps(steps + child_steps * fanout as u64);
            }
            let names: Vec<String> = (0..fanout).map(|i| format!("c{i}")).collect();
            let handle = engine.start(&root, start("random", names, budget)).await.expect("starts");
            handle.join().await.expect("joins");
            let scope = Scope::new("acme").expect("valid");
            engine.verify(&scope, handle.tree()).await.expect("the log verifies");
            let view = engine.inspect(&scope, handle.tree(), false).await.expect("inspects");
            let starts = store.records(handle.tree()).iter().filter(|r| r.kind == RecordKind::ChildStarted).count();
            prop_assert!(starts <= fanout, "no child started twice");
            prop_assert_eq!(starts, view.processes.len() - 1);
            check_invariants(&view)
        })?;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_host_deadline_times_out_the_whole_subtree() {
    let clock = baton_run::ManualClock::new(baton_run::Timestamp(0));
    let ask = program(Kind::Ask, None);
    let root = parent(plan(Boundary::Result, Condition::All), &ask);
    let engine = Engine::new(
        EngineConfig::new(MemoryStore::new())
            .program(&root)
            .clock(clock.clone()),
    );
    let mut request = start("deadline", keys(&["a"]), Budget::unlimited());
    request.deadline = Some(baton_run::Timestamp(1_000));
    let handle = engine.start(&root, request).await.expect("starts");
    open_wait(&handle.child::<Value>(&key("a"))).await;
    clock.advance(std::time::Duration::from_millis(1_000));
    let root_end = handle.join().await.expect("joins");
    assert_eq!(
        (root_end.status(), root_end.cause()),
        (Status::TimedOut, baton_run::Cause::HostDeadline)
    );
    let child = handle
        .child::<Value>(&key("a"))
        .await_result()
        .await
        .expect("ended");
    assert_eq!(
        (child.status(), child.cause()),
        (Status::TimedOut, baton_run::Cause::ParentDeadline)
    );
}

#[tokio::test]
async fn tree_limits_fail_definitely_and_a_tree_over_its_history_is_closed() {
    // Pending signals: the second unconsumed note is refused, the process is unharmed.
    let ask = program(Kind::Ask, None);
    let mut config = EngineConfig::new(MemoryStore::new()).program(&ask);
    config.limits = TreeLimits {
        max_pending_signals: 2,
        ..TreeLimits::default()
    };
    let engine = Engine::new(config);
    let handle = engine
        .start(&ask, request("mailbox", "q"))
        .await
        .expect("starts");
    open_wait(&handle).await;
    let note = |id: &str| SignalRequest {
        id: SignalId::new(id).expect("valid"),
        wait: None,
        payload: Payload::encode(&json!({"note": id})).expect("encodes"),
    };
    handle.signal(note("n1")).await.expect("admitted");
    handle.signal(note("n2")).await.expect("admitted");
    let refused = handle.signal(note("n3")).await.expect_err("mailbox full");
    assert_eq!(refused.code(), "engine.limit.pending_signals");
    assert_eq!(
        handle.inspect().await.expect("inspects").root().status,
        Status::Waiting
    );

    // State bytes: an initial state over the limit refuses the start; a
    // state that grows over it fails the process.
    let mut config = EngineConfig::new(MemoryStore::new()).program(&ask);
    config.limits = TreeLimits {
        max_state_bytes: 100,
        ..TreeLimits::default()
    };
    let engine = Engine::new(config);
    let refused = engine
        .start(&ask, request("too-big", "x".repeat(300)))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), "engine.limit.state");
    // Fits at first (about 85 bytes); storing the wait id grows it past 100.
    let handle = engine
        .start(&ask, request("grows", "x".repeat(40)))
        .await
        .expect("starts");
    let ended = handle.await_result().await.expect("ends");
    assert_eq!(
        ended.failure().expect("failure").code(),
        "engine.limit.state"
    );

    // History: a tree whose log outgrows its limit is closed, not wedged.
    let mut config = EngineConfig::new(MemoryStore::new()).program(&ask);
    config.limits = TreeLimits {
        max_history_bytes: 3_000,
        ..TreeLimits::default()
    };
    let engine = Engine::new(config);
    let handle = engine
        .start(&ask, request("history", "q"))
        .await
        .expect("starts");
    open_wait(&handle).await;
    let mut refused = None;
    for index in 0..100 {
        match handle.signal(note(&format!("h{index}"))).await {
            Ok(_) => {}
            Err(error) => {
                refused = Some(error);
                break;
            }
        }
    }
    assert_eq!(
        refused.expect("eventually refused").code(),
        "engine.signal.terminated"
    );
    let ended = handle.await_result().await.expect("closed");
    assert_eq!(
        ended.failure().expect("failure").code(),
        "engine.limit.history"
    );
}
