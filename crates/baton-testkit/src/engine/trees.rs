//! Process trees: child starts, waits, controls, cancellation and drain,
//! budgets, capabilities and tree limits, crash recovery across child
//! publication and controls, parked children, kills and deadlines.

use std::sync::Arc;

use baton_run::dispatch::ReplayPolicy;
use baton_run::log::RecordKind;
use baton_run::program::{Boundary, Condition};
use baton_run::store::{Store, TreeStatus};
use baton_run::{
    Budget, Capabilities, Cause, ChildKey, Dimension, Engine, EngineConfig, EventKind, ManualClock,
    Name, Payload, ProcessId, Program, RecoverOptions, Settlement, SignalId, SignalRequest,
    StartRequest, Status, Timestamp, TreeLimits, TreeView, Visibility,
};
use serde_json::{Value, json};

use super::{Fresh, records, scope};
use crate::programs::{Kind, Plan, open_wait, parent, program, start_id};
use crate::{Cut, FaultStore, ScriptedDispatcher};

fn key(text: &str) -> ChildKey {
    ChildKey::new(text).expect("valid key")
}

fn keys(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

fn engine_for(store: Arc<dyn Store>, program: &Program<Vec<String>, Value>) -> Engine {
    Engine::new(EngineConfig {
        programs: vec![program.erase()],
        ..EngineConfig::new(store)
    })
    .expect("the engine configuration is valid")
}

fn start(key_text: &str, input: Vec<String>, budget: Budget) -> StartRequest<Vec<String>> {
    let mut request = StartRequest::new(start_id(key_text), input);
    request.budget = budget;
    request
}

/// The process id of the root's child `name`.
fn child_id(view: &TreeView, name: &str) -> ProcessId {
    view.root().children[&key(name)]
}

pub(super) async fn three_children_complete_in_declaration_order_with_exact_budget_accounting(
    fresh: &Fresh<'_>,
) {
    let echo = program(Kind::Echo, None);
    let root = parent(Plan::new(Boundary::Result, Condition::All), &echo);
    let engine = engine_for(fresh(), &root);
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

pub(super) async fn any_wakes_on_the_first_child_and_the_rest_drain_canceled(fresh: &Fresh<'_>) {
    let ask = program(Kind::Ask, None);
    let mut any = Plan::new(Boundary::Result, Condition::Any);
    any.cancel_rest = true;
    any.child_budget = Budget::unlimited().with_steps(5).with_signals(8);
    let root = parent(any, &ask);
    let engine = engine_for(fresh(), &root);
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

pub(super) async fn an_any_wait_over_quick_children_settles_once_with_every_child_of_the_round(
    fresh: &Fresh<'_>,
) {
    let echo = program(Kind::Echo, None);
    let mut any = Plan::new(Boundary::Result, Condition::Any);
    any.cancel_rest = true;
    let root = parent(any, &echo);
    let engine = engine_for(fresh(), &root);
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

pub(super) async fn a_round_of_children_larger_than_a_commit_still_settles_its_wait_once(
    fresh: &Fresh<'_>,
) {
    let echo = program(Kind::Echo, None);
    let mut any = Plan::new(Boundary::Result, Condition::Any);
    any.cancel_rest = true;
    let root = parent(any, &echo);
    let mut config = EngineConfig {
        programs: vec![root.erase()],
        ..EngineConfig::new(fresh())
    };
    // Twelve children step over several commits of three steps each.
    config.max_steps_per_commit = 3;
    let engine = Engine::new(config).expect("the engine configuration is valid");
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

pub(super) async fn completing_with_live_children_cancels_them_and_join_waits_for_their_drain(
    fresh: &Fresh<'_>,
) {
    let ask = program(Kind::Ask, None);
    // Quorum(1) at the result boundary, no cancel_rest: the parent completes
    // while two children still wait.
    let root = parent(Plan::new(Boundary::Result, Condition::Quorum(1)), &ask);
    let engine = engine_for(fresh(), &root);
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
        assert_eq!(child.cause(), Cause::ParentCancellation);
    }
}

pub(super) async fn refused_starts_are_facts_for_the_parent(fresh: &Fresh<'_>) {
    let echo = program(Kind::Echo, None);
    let mut escalate = Plan::new(Boundary::Result, Condition::All);
    escalate.child_capabilities = Capabilities::of([Name::new("net").expect("valid")]);
    let root = parent(escalate, &echo);
    let engine = engine_for(fresh(), &root);
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
    let root = parent(Plan::new(Boundary::Result, Condition::All), &echo);
    let engine = engine_for(fresh(), &root);
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
    let mut unlimited_child = Plan::new(Boundary::Result, Condition::All);
    unlimited_child.child_budget = Budget::unlimited();
    let root = parent(unlimited_child, &echo);
    let engine = engine_for(fresh(), &root);
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
        Plan::new(Boundary::Result, Condition::All),
        &program(Kind::Echo, None),
    );
    let mut config = EngineConfig {
        programs: vec![root.erase()],
        ..EngineConfig::new(fresh())
    };
    config.limits = TreeLimits {
        max_active_children: 1,
        ..TreeLimits::default()
    };
    let engine = Engine::new(config).expect("the engine configuration is valid");
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

/// Starts `root` as `name` over children `a` and `b` on a store that cuts
/// the first `kind` commit at `cut`, recovers with a second engine and
/// starts the same request again: the tree, the store beneath the fault,
/// and the second start's output.
async fn crash_and_recover(
    fresh: &Fresh<'_>,
    root: &Program<Vec<String>, Value>,
    (kind, cut): (RecordKind, Cut),
    name: &str,
) -> (ProcessId, Arc<dyn Store>, Value) {
    let store = fresh();
    let faulty = FaultStore::new(store.clone());
    faulty.arm(kind, cut, 1);
    let first = engine_for(Arc::new(faulty.clone()), root);
    let request = || start(name, keys(&["a", "b"]), Budget::unlimited());
    let tree = crate::start_into_crash(&first, root, request()).await;
    assert!(faulty.crashed(), "{name}: the {kind} commit was cut");
    drop(first);
    let second = engine_for(faulty.inner(), root);
    second
        .recover(RecoverOptions::default())
        .await
        .expect("recovers");
    let handle = second.start(root, request()).await.expect("starts again");
    assert_eq!(handle.tree(), tree);
    let output = handle.output().await.expect("completes");
    (tree, store, output)
}

pub(super) async fn a_crash_before_the_child_start_record_starts_the_child_exactly_once(
    fresh: &Fresh<'_>,
) {
    let echo = program(Kind::Echo, None);
    let root = parent(Plan::new(Boundary::Drained, Condition::All), &echo);
    let cut = (RecordKind::ChildStarted, Cut::Before);
    let (tree, store, output) = crash_and_recover(fresh, &root, cut, "crash-start").await;
    assert_eq!(
        output["ready"],
        json!([["a", "completed", "a"], ["b", "completed", "b"]])
    );
    let starts = records(&*store, tree)
        .await
        .iter()
        .filter(|r| r.kind == RecordKind::ChildStarted)
        .count();
    assert_eq!(starts, 2, "each child was published exactly once");
}

pub(super) async fn a_crash_around_a_children_waits_end_recovers_its_outcomes(fresh: &Fresh<'_>) {
    for (cut, name) in [
        (Cut::Before, "crash-ready-before"),
        (Cut::After, "crash-ready-after"),
    ] {
        let echo = program(Kind::Echo, None);
        let root = parent(Plan::new(Boundary::Result, Condition::All), &echo);
        let cut = (RecordKind::ChildrenReady, cut);
        let (tree, store, output) = crash_and_recover(fresh, &root, cut, name).await;
        assert_eq!(
            output["ready"],
            json!([["a", "completed", "a"], ["b", "completed", "b"]]),
            "{name}: the outcomes the tree holds"
        );
        let ends = records(&*store, tree)
            .await
            .iter()
            .filter(|r| r.kind == RecordKind::ChildrenReady)
            .count();
        assert_eq!(ends, 1, "{name}: the wait ended exactly once");
    }
}

pub(super) async fn a_crash_after_a_signal_control_commit_delivers_it_exactly_once(
    fresh: &Fresh<'_>,
) {
    let ask = program(Kind::Ask, None);
    let mut note = Plan::new(Boundary::Result, Condition::All);
    note.note = true;
    let root = parent(note, &ask);
    let store = fresh();
    let faulty = FaultStore::new(store.clone());
    faulty.arm(RecordKind::ControlDelivered, Cut::After, 1);
    let first = engine_for(Arc::new(faulty.clone()), &root);
    let request = || start("crash-signal", keys(&["a"]), Budget::unlimited());
    let tree = crate::start_into_crash(&first, &root, request()).await;
    drop(first);
    let second = engine_for(faulty.inner(), &root);
    second
        .recover(RecoverOptions::default())
        .await
        .expect("recovers");
    let handle = second.start(&root, request()).await.expect("starts again");
    assert_eq!(handle.tree(), tree);
    let output = handle.output().await.expect("completes");
    assert_eq!(
        output["receipts"],
        json!(["delivered", "delivered"]),
        "signal then cancel receipts"
    );
    let stored = records(&*store, tree).await;
    let deliveries: Vec<Value> = stored
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
    let child_view = view.process(child_id(&view, "a")).expect("child");
    // One result signal for its wait effect, plus the parent's note.
    assert_eq!(child_view.usage.signals, 2);
}

pub(super) async fn a_parked_child_shows_as_needs_attention_and_resolving_it_continues_the_tree(
    fresh: &Fresh<'_>,
) {
    let dispatcher = ScriptedDispatcher::echo(ReplayPolicy::Never);
    let worker = program(Kind::Dispatch, Some(Arc::new(dispatcher.clone())));
    let root = parent(
        Plan {
            child_budget: Budget::unlimited(),
            ..Plan::new(Boundary::Drained, Condition::All)
        },
        &worker,
    );
    let store = fresh();
    let faulty = FaultStore::new(store.clone());
    faulty.arm(RecordKind::EffectPending, Cut::After, 1);
    let first = engine_for(Arc::new(faulty.clone()), &root);
    let handle = first
        .start(
            &root,
            StartRequest::new(start_id("parked"), vec!["w".to_owned()]),
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
    let scope = scope();
    let mut view = second
        .inspect(&scope, tree, Visibility::Public)
        .await
        .expect("inspects");
    for _ in 0..1000 {
        if view.status == TreeStatus::NeedsAttention {
            break;
        }
        tokio::task::yield_now().await;
        view = second
            .inspect(&scope, tree, Visibility::Public)
            .await
            .expect("inspects");
    }
    assert_eq!(view.status, TreeStatus::NeedsAttention);
    let child = view.process(child_id(&view, "w")).expect("child");
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

pub(super) async fn killing_the_root_kills_the_subtree_and_events_carry_paths(fresh: &Fresh<'_>) {
    let ask = program(Kind::Ask, None);
    let root = parent(Plan::new(Boundary::Result, Condition::All), &ask);
    let engine = engine_for(fresh(), &root);
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
    while let Ok(Some(event)) = events.try_recv() {
        if let EventKind::ChildStarted { .. } = event.kind {
            child_paths.push(event.path.iter().map(|k| k.to_string()).collect::<Vec<_>>());
        }
    }
    assert_eq!(child_paths, [vec!["a".to_owned()], vec!["b".to_owned()]]);
}

pub(super) async fn a_host_deadline_times_out_the_whole_subtree(fresh: &Fresh<'_>) {
    let clock = ManualClock::new(Timestamp(0));
    let ask = program(Kind::Ask, None);
    let root = parent(Plan::new(Boundary::Result, Condition::All), &ask);
    let engine = Engine::new(EngineConfig {
        programs: vec![root.erase()],
        clock: Arc::new(clock.clone()),
        ..EngineConfig::new(fresh())
    })
    .expect("the engine configuration is valid");
    let mut request = start("deadline", keys(&["a"]), Budget::unlimited());
    request.deadline = Some(Timestamp(1_000));
    let handle = engine.start(&root, request).await.expect("starts");
    open_wait(&handle.child::<Value>(&key("a"))).await;
    clock.advance(std::time::Duration::from_millis(1_000));
    let root_end = handle.join().await.expect("joins");
    assert_eq!(
        (root_end.status(), root_end.cause()),
        (Status::TimedOut, Cause::HostDeadline)
    );
    let child = handle
        .child::<Value>(&key("a"))
        .await_result()
        .await
        .expect("ended");
    assert_eq!(
        (child.status(), child.cause()),
        (Status::TimedOut, Cause::ParentDeadline)
    );
}
