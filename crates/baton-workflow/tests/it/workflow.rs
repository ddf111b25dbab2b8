//! Workflow acceptance: stages run under the engine.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common;

use crate::common::{Op, answer, child, drain, engine, key, peak_children, request};
use baton_run::{Capabilities, FailureKind, Name, Payload, StartError, Status, Termination};
use baton_workflow::{
    Child, Config, LoopResult, Stage, TransformError, Workflow, call, fork, loop_until, map,
    switch, transform,
};

fn workflow(stages: Vec<Stage>) -> Workflow {
    Workflow::new(Config {
        name: "test.workflow".into(),
        description: "A workflow under test.".into(),
        build: "workflow-tests 1".into(),
        stages,
    })
    .expect("valid workflow")
}

fn failure(termination: &Termination) -> (FailureKind, String, String) {
    let failure = termination.failure().expect("a failure");
    (
        failure.kind,
        failure.code().to_owned(),
        failure.message.clone(),
    )
}

#[tokio::test]
async fn a_three_stage_transform_chain_completes_in_one_step() {
    let program = workflow(vec![
        transform("review", |task: String| Ok(format!("reviewed: {task}"))),
        transform("measure", |text: String| Ok(text.len() as u64)),
        transform("double", |n: u64| Ok(n * 2)),
    ])
    .program::<String, u64>();
    let engine = engine(&program);
    let handle = engine
        .start(&program, request("chain", "tests".to_owned()))
        .await
        .expect("starts");
    assert_eq!(handle.output().await.expect("completes"), 30);
    let view = handle.inspect().await.expect("inspects");
    assert_eq!(view.root().usage.steps, 1, "pure stages share one step");
    assert_eq!(view.processes.len(), 1);
}

/// At most ten: a schema with a bound, so a value can be well-typed and
/// still break it.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Small(#[schemars(range(max = 10))] u64);

/// A transform that counts its runs.
fn counted(runs: &Arc<AtomicUsize>) -> Stage {
    let runs = runs.clone();
    transform("double", move |small: Small| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok(small.0 * 2)
    })
}

/// A transform checks neither the workflow's input nor a value the previous
/// transform's output check has passed (the schemas are equal), so those two
/// checks are what keeps a stage from running on a value outside its schema.
#[tokio::test]
async fn a_value_outside_a_stage_schema_never_reaches_its_transform() {
    // The input, checked by the kernel before the first transform runs.
    let runs = Arc::new(AtomicUsize::new(0));
    let program = workflow(vec![counted(&runs)]).program::<Small, u64>();
    let first = engine(&program);
    let refused = first.start(&program, request("big-input", Small(50))).await;
    let Err(StartError::Input(refusal)) = refused else {
        panic!("an input over the bound starts: {refused:?}");
    };
    assert_eq!(refusal.code(), "execution.input.invalid");
    let handle = first
        .start(&program, request("small-input", Small(5)))
        .await
        .expect("starts");
    assert_eq!(handle.output().await.expect("completes"), 10);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "only the valid input ran");

    // A transform's output, checked before the next transform runs.
    let runs = Arc::new(AtomicUsize::new(0));
    let program = workflow(vec![
        transform("shrink", |n: u64| Ok(Small(n))),
        counted(&runs),
    ])
    .program::<u64, u64>();
    let second = engine(&program);
    let handle = second
        .start(&program, request("big-output", 50u64))
        .await
        .expect("starts");
    let ended = handle.await_result().await.expect("ends");
    assert_eq!(ended.status(), Status::Failed);
    let (kind, code, message) = failure(&ended);
    assert_eq!(
        (kind, code.as_str()),
        (FailureKind::Contract, "workflow.transform.output_invalid")
    );
    assert!(message.contains("stage shrink"), "{message}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the next stage never ran");
    let handle = second
        .start(&program, request("small-output", 7u64))
        .await
        .expect("starts");
    assert_eq!(handle.output().await.expect("completes"), 14);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_transform_error_is_a_classified_failure_of_its_stage() {
    let program = workflow(vec![
        transform("parse", |text: String| {
            text.parse::<u64>()
                .map_err(|error| TransformError::new(format!("not a number: {error}")))
        }),
        transform("double", |n: u64| Ok(n * 2)),
    ])
    .program::<String, u64>();
    let engine = engine(&program);
    let handle = engine
        .start(&program, request("bad", "seven".to_owned()))
        .await
        .expect("starts");
    let ended = handle.await_result().await.expect("ends");
    assert_eq!(ended.status(), Status::Failed);
    let (kind, code, message) = failure(&ended);
    assert_eq!(
        (kind, code.as_str()),
        (FailureKind::Execution, "workflow.transform.failed")
    );
    assert!(message.contains("stage parse"), "{message}");
}

#[tokio::test]
async fn a_call_runs_its_child_and_transforms_see_its_output() {
    let add = child(Op::Add(5));
    let program = workflow(vec![
        transform("start", |n: u64| Ok(n + 1)),
        call("add", Child::new(&add)),
        transform("show", |n: u64| Ok(format!("got {n}"))),
    ])
    .program::<u64, String>();
    let engine = engine(&program);
    let handle = engine
        .start(&program, request("call", 1))
        .await
        .expect("starts");
    assert_eq!(handle.output().await.expect("completes"), "got 7");
    let child_end = handle
        .child::<u64>(&key("add"))
        .await_result()
        .await
        .expect("child ended");
    assert_eq!(child_end.status(), Status::Completed);
}

#[tokio::test]
async fn a_failed_call_is_an_external_child_failure() {
    let fail = child(Op::Fail);
    let program = workflow(vec![call("work", Child::new(&fail))]).program::<u64, u64>();
    let engine = engine(&program);
    let handle = engine
        .start(&program, request("fails", 1))
        .await
        .expect("starts");
    let ended = handle.await_result().await.expect("ends");
    let (kind, code, message) = failure(&ended);
    assert_eq!(
        (kind, code.as_str()),
        (FailureKind::External, "workflow.call.child_failed")
    );
    assert!(message.contains("test.child.failed"), "{message}");
}

#[tokio::test]
async fn a_refused_call_start_keeps_the_kernel_kind() {
    let add = child(Op::Add(1));
    let net = Capabilities::of([Name::new("net").expect("valid")]);
    let program =
        workflow(vec![call("work", Child::new(&add).with_capabilities(net))]).program::<u64, u64>();
    let engine = engine(&program);
    let handle = engine
        .start(&program, request("refused", 1))
        .await
        .expect("starts");
    let ended = handle.await_result().await.expect("ends");
    let (kind, code, message) = failure(&ended);
    assert_eq!(
        (kind, code.as_str()),
        (FailureKind::Contract, "workflow.call.start_failed")
    );
    assert!(
        message.contains("engine.child.capability_escalation"),
        "{message}"
    );
}

fn route(n: u64) -> Result<&'static str, TransformError> {
    match n {
        0..=9 => Ok("small"),
        10..=99 => Ok("large"),
        _ => Ok("huge"),
    }
}

#[tokio::test]
async fn a_switch_runs_the_selected_case_and_rejects_unknown_ones() {
    let small = child(Op::Add(1));
    let large = child(Op::Add(100));
    let program = workflow(vec![switch(
        "route",
        route,
        vec![("small", Child::new(&small)), ("large", Child::new(&large))],
    )])
    .program::<u64, u64>();
    let engine = engine(&program);
    let handle = engine
        .start(&program, request("small", 3))
        .await
        .expect("starts");
    assert_eq!(handle.output().await.expect("completes"), 4);
    assert_eq!(
        handle
            .child::<u64>(&key("route.small"))
            .await_result()
            .await
            .expect("ran")
            .status(),
        Status::Completed
    );
    let handle = engine
        .start(&program, request("large", 30))
        .await
        .expect("starts");
    assert_eq!(handle.output().await.expect("completes"), 130);

    let handle = engine
        .start(&program, request("huge", 300))
        .await
        .expect("starts");
    let ended = handle.await_result().await.expect("ends");
    let (kind, code, _) = failure(&ended);
    assert_eq!(
        (kind, code.as_str()),
        (FailureKind::Contract, "workflow.switch.case_unknown")
    );
    let view = handle.inspect().await.expect("inspects");
    assert_eq!(view.processes.len(), 1, "no case ran");
}

#[tokio::test]
async fn a_fork_with_window_two_over_five_branches_never_has_more_than_two_children_alive() {
    let ask = child(Op::Ask);
    let branches = (0..5).map(|_| Child::new(&ask)).collect();
    let program = workflow(vec![fork::<u64, u64, u64, _>(
        "fan",
        branches,
        2,
        |outputs: Vec<u64>| Ok(outputs.iter().sum()),
    )])
    .program::<u64, u64>();
    let engine = engine(&program);
    let mut events = engine.events();
    let handle = engine
        .start(&program, request("fork", 0))
        .await
        .expect("starts");
    for window in [&[0, 1][..], &[2, 3], &[4]] {
        for index in window {
            common::open_wait(&handle.child::<u64>(&key(&format!("fan.{index}")))).await;
        }
        // Every branch of this window waits; no later branch has started.
        let view = handle.inspect().await.expect("inspects");
        let last = *window.last().expect("non-empty") as usize;
        assert_eq!(view.root().children.len(), last + 1);
        for index in window {
            answer(&handle, &format!("fan.{index}"), 10 * index).await;
        }
    }
    assert_eq!(handle.output().await.expect("completes"), 100);
    let (peak, started) = peak_children(&drain(&mut events), handle.id());
    assert_eq!(started, 5);
    assert_eq!(peak, 2, "at most one window of children alive at once");
}

#[tokio::test]
async fn the_lowest_index_failure_wins_when_branches_three_and_one_fail() {
    let add = child(Op::Add(1));
    let ask = child(Op::Ask);
    let fail = child(Op::Fail);
    let branches = vec![
        Child::new(&add),
        Child::new(&ask),
        Child::new(&add),
        Child::new(&fail),
        Child::new(&add),
    ];
    let program = workflow(vec![fork::<u64, u64, Vec<u64>, _>("fan", branches, 5, Ok)])
        .program::<u64, Vec<u64>>();
    let engine = engine(&program);
    let handle = engine
        .start(&program, request("lowest", 1))
        .await
        .expect("starts");
    // Branch 3 has already failed; the stage still waits for branch 1, which fails later.
    let three = handle
        .child::<u64>(&key("fan.3"))
        .await_result()
        .await
        .expect("ended");
    assert_eq!(three.status(), Status::Failed);
    assert_eq!(
        handle.inspect().await.expect("inspects").root().status,
        Status::Waiting
    );
    answer(&handle, "fan.1", -1).await;
    let ended = handle.await_result().await.expect("ends");
    let (kind, code, message) = failure(&ended);
    assert_eq!(
        (kind, code.as_str()),
        (FailureKind::External, "workflow.fork.branch_failed")
    );
    assert!(message.contains("branch 1 (fan.1)"), "{message}");
    assert!(message.contains("test.child.refused"), "{message}");
}

#[tokio::test]
async fn a_window_whose_starts_all_fail_fails_at_once_and_a_partial_one_waits_first() {
    let add = child(Op::Add(1));
    let ask = child(Op::Ask);
    let net = Capabilities::of([Name::new("net").expect("valid")]);
    let refused = || Child::new(&add).with_capabilities(net.clone());

    let all_refused = workflow(vec![fork::<u64, u64, Vec<u64>, _>(
        "fan",
        vec![refused(), refused(), Child::new(&add)],
        2,
        Ok,
    )])
    .program::<u64, Vec<u64>>();
    let engine = engine(&all_refused);
    let handle = engine
        .start(&all_refused, request("all-refused", 1))
        .await
        .expect("starts");
    let ended = handle.await_result().await.expect("ends");
    let (kind, code, message) = failure(&ended);
    assert_eq!(
        (kind, code.as_str()),
        (FailureKind::Contract, "workflow.fork.branch_start_failed")
    );
    assert!(message.contains("branch 0"), "{message}");
    assert_eq!(handle.inspect().await.expect("inspects").processes.len(), 1);

    let partial = workflow(vec![fork::<u64, u64, Vec<u64>, _>(
        "fan",
        vec![refused(), Child::new(&ask)],
        2,
        Ok,
    )])
    .program::<u64, Vec<u64>>();
    let engine = common::engine(&partial);
    let handle = engine
        .start(&partial, request("partial", 1))
        .await
        .expect("starts");
    // The started branch is waited for before the stage fails.
    answer(&handle, "fan.1", 7).await;
    let ended = handle.await_result().await.expect("ends");
    let (_, code, message) = failure(&ended);
    assert_eq!(code, "workflow.fork.branch_start_failed");
    assert!(message.contains("branch 0"), "{message}");
    let one = handle
        .child::<u64>(&key("fan.1"))
        .await_result()
        .await
        .expect("ended");
    assert_eq!(one.status(), Status::Completed);
}

#[tokio::test]
async fn a_map_keeps_item_order_and_over_zero_items_starts_no_child() {
    let add = child(Op::Add(10));
    let program = workflow(vec![map::<u64, u64>("each", Child::new(&add), 2, 4)])
        .program::<Vec<u64>, Vec<u64>>();
    let engine = engine(&program);
    let mut events = engine.events();
    let handle = engine
        .start(&program, request("empty", Vec::new()))
        .await
        .expect("starts");
    assert_eq!(handle.output().await.expect("completes"), Vec::<u64>::new());
    assert_eq!(handle.inspect().await.expect("inspects").processes.len(), 1);
    assert_eq!(peak_children(&drain(&mut events), handle.id()), (0, 0));

    let handle = engine
        .start(&program, request("three", vec![3, 1, 2]))
        .await
        .expect("starts");
    assert_eq!(handle.output().await.expect("completes"), vec![13, 11, 12]);
    let (peak, started) = peak_children(&drain(&mut events), handle.id());
    assert_eq!(started, 3);
    assert!(peak <= 2);

    let handle = engine
        .start(&program, request("too-many", vec![1, 2, 3, 4, 5]))
        .await
        .expect("starts");
    let ended = handle.await_result().await.expect("ends");
    let (kind, code, _) = failure(&ended);
    assert_eq!(
        (kind, code.as_str()),
        (FailureKind::Contract, "workflow.map.max_items_exceeded")
    );
    assert_eq!(handle.inspect().await.expect("inspects").processes.len(), 1);
}

#[tokio::test]
async fn a_failing_map_item_names_the_item() {
    let ask = child(Op::Ask);
    let program = workflow(vec![map::<u64, u64>("each", Child::new(&ask), 3, 10)])
        .program::<Vec<u64>, Vec<u64>>();
    let engine = engine(&program);
    let handle = engine
        .start(&program, request("item-fails", vec![1, 2, 3]))
        .await
        .expect("starts");
    answer(&handle, "each.2", -1).await;
    answer(&handle, "each.0", 1).await;
    answer(&handle, "each.1", 1).await;
    let ended = handle.await_result().await.expect("ends");
    let (kind, code, message) = failure(&ended);
    assert_eq!(
        (kind, code.as_str()),
        (FailureKind::External, "workflow.map.item_failed")
    );
    assert!(message.contains("item 2 (each.2)"), "{message}");
}

#[tokio::test]
async fn a_loop_stops_when_satisfied_and_one_that_never_is_ends_at_max_iterations() {
    let add = child(Op::Add(1));
    let satisfied = workflow(vec![loop_until(
        "count",
        Child::new(&add),
        10,
        |n: &u64| Ok(*n >= 3),
    )])
    .program::<u64, LoopResult<u64>>();
    let engine = engine(&satisfied);
    let handle = engine
        .start(&satisfied, request("satisfied", 0))
        .await
        .expect("starts");
    assert_eq!(
        handle.output().await.expect("completes"),
        LoopResult {
            value: 3,
            iterations: 3,
            satisfied: true
        }
    );

    let never = workflow(vec![loop_until("count", Child::new(&add), 4, |n: &u64| {
        Ok(*n > 1_000)
    })])
    .program::<u64, LoopResult<u64>>();
    let engine = common::engine(&never);
    let handle = engine
        .start(&never, request("never", 0))
        .await
        .expect("starts");
    assert_eq!(
        handle.output().await.expect("completes"),
        LoopResult {
            value: 4,
            iterations: 4,
            satisfied: false
        }
    );
    let view = handle.inspect().await.expect("inspects");
    let keys: Vec<String> = view
        .root()
        .children
        .keys()
        .map(ToString::to_string)
        .collect();
    assert_eq!(keys, ["count.1", "count.2", "count.3", "count.4"]);
}

#[tokio::test]
async fn a_loop_predicate_error_fails_the_stage() {
    let add = child(Op::Add(1));
    let program = workflow(vec![loop_until("count", Child::new(&add), 3, |_: &u64| {
        Err("cannot judge".into())
    })])
    .program::<u64, LoopResult<u64>>();
    let engine = engine(&program);
    let handle = engine
        .start(&program, request("predicate", 0))
        .await
        .expect("starts");
    let (kind, code, _) = failure(&handle.await_result().await.expect("ends"));
    assert_eq!(
        (kind, code.as_str()),
        (FailureKind::Execution, "workflow.loop.predicate_failed")
    );
}

#[tokio::test]
async fn a_mixed_pipeline_runs_every_kind_in_order() {
    let add = child(Op::Add(1));
    let double = workflow(vec![transform("double", |n: u64| Ok(n * 2))]).program::<u64, u64>();
    let program = workflow(vec![
        transform("split", |n: u64| Ok(vec![n, n + 1])),
        map::<u64, u64>("each", Child::new(&double), 1, 8),
        transform("sum", |items: Vec<u64>| Ok(items.iter().sum::<u64>())),
        fork::<u64, u64, u64, _>(
            "both",
            vec![Child::new(&add), Child::new(&double)],
            2,
            |outputs: Vec<u64>| Ok(outputs[0] * 1000 + outputs[1]),
        ),
        loop_until("grow", Child::new(&add), 2, |_: &u64| Ok(false)),
    ])
    .program::<u64, LoopResult<u64>>();
    let engine = engine(&program);
    let handle = engine
        .start(&program, request("mixed", 1))
        .await
        .expect("starts");
    // [1, 2] -> [2, 4] -> 6 -> (7, 12) -> 7012 -> +2 after two unsatisfied runs.
    let output = handle.output().await.expect("completes");
    assert_eq!(
        output,
        LoopResult {
            value: 7014,
            iterations: 2,
            satisfied: false
        }
    );
    let output_payload = Payload::encode(&output).expect("encodes");
    assert!(program.descriptor().check_output(&output_payload).is_ok());
}
