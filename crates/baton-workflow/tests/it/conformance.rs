//! Every workflow shape passes the kernel's definition conformance suite.

use crate::common::{Op, child};
use baton_run::program::{ChildOutcome, Definition, Signal, SignalBody};
use baton_run::{
    ChildKey, EffectId, Failure, Payload, ProcessId, Settlement, SignalId, StartId, Termination,
};
use baton_testkit::{ConformanceCase, definition_conformance};
use baton_workflow::{
    Child, Config, Stage, Workflow, call, fork, loop_until, map, switch, transform,
};
use serde::Serialize;

fn workflow(stages: Vec<Stage>) -> Workflow {
    Workflow::new(Config {
        name: "test.workflow".into(),
        description: "A workflow under conformance.".into(),
        build: "conformance 1".into(),
        stages,
    })
    .expect("valid workflow")
}

fn root() -> ProcessId {
    ProcessId::root(&StartId::new("acme", "conformance").expect("valid"))
}

fn effect(step: u64, index: u32) -> EffectId {
    EffectId::new(root(), step, index)
}

fn result(step: u64, index: u32, body: SignalBody) -> Signal {
    Signal {
        id: SignalId::for_effect(effect(step, index)),
        wait: None,
        body,
    }
}

fn key(text: &str) -> ChildKey {
    ChildKey::new(text).expect("valid")
}

fn started(step: u64, index: u32, child: &str) -> Signal {
    result(
        step,
        index,
        SignalBody::ChildStarted {
            effect: effect(step, index),
            key: key(child),
            process: Some(ProcessId::child(root(), &key(child))),
            failure: None,
        },
    )
}

fn refused(step: u64, index: u32, child: &str) -> Signal {
    result(
        step,
        index,
        SignalBody::ChildStarted {
            effect: effect(step, index),
            key: key(child),
            process: None,
            failure: Some(Failure::contract(
                "engine.child.capability_escalation",
                "the parent lacks capabilities net",
            )),
        },
    )
}

fn wait_refused(step: u64, index: u32) -> Signal {
    result(
        step,
        index,
        SignalBody::Settled {
            effect: effect(step, index),
            settlement: Settlement::failed(Failure::contract(
                "engine.child.wait.invalid",
                "not a child",
            )),
        },
    )
}

fn ready(step: u64, index: u32, children: &[(&str, Termination)]) -> Signal {
    result(
        step,
        index,
        SignalBody::ChildrenReady {
            effect: effect(step, index),
            children: children
                .iter()
                .map(|(child, termination)| ChildOutcome {
                    key: key(child),
                    process: ProcessId::child(root(), &key(child)),
                    termination: termination.clone(),
                })
                .collect(),
        },
    )
}

fn done<T: Serialize>(value: T) -> Termination {
    Termination::completed(Payload::encode(&value).expect("encodes"))
}

fn input<T: Serialize>(value: T) -> Payload {
    Payload::encode(&value).expect("encodes")
}

fn case(name: &str, input: Payload, windows: Vec<Vec<Signal>>) -> ConformanceCase {
    ConformanceCase::new(name, input, windows)
}

#[test]
fn transforms_conform() {
    let chain = workflow(vec![
        transform("parse", |text: String| {
            text.parse::<u64>()
                .map_err(|error| error.to_string().into())
        }),
        transform("double", |n: u64| Ok(n * 2)),
    ]);
    let steps = definition_conformance(
        &chain,
        &[
            case("chain", input("21"), vec![vec![]]),
            case("refused", input("x"), vec![vec![]]),
            case("stray signal", input("1"), vec![vec![wait_refused(0, 0)]]),
        ],
    );
    assert_eq!(steps, 3);
}

#[test]
fn calls_and_switches_conform() {
    let add = child(Op::Add(1));
    let fail = child(Op::Fail);
    let single = workflow(vec![call("work", Child::new(&add))]);
    definition_conformance(
        &single,
        &[
            case(
                "completes",
                input(1),
                vec![
                    vec![],
                    vec![started(0, 0, "work"), ready(0, 1, &[("work", done(2))])],
                ],
            ),
            case(
                "child fails",
                input(1),
                vec![
                    vec![],
                    vec![
                        started(0, 0, "work"),
                        ready(
                            0,
                            1,
                            &[("work", Termination::failed(Failure::external("x.y", "no")))],
                        ),
                    ],
                ],
            ),
            case(
                "start refused",
                input(1),
                vec![vec![], vec![refused(0, 0, "work"), wait_refused(0, 1)]],
            ),
            case(
                "output invalid",
                input(1),
                vec![
                    vec![],
                    vec![
                        started(0, 0, "work"),
                        ready(0, 1, &[("work", done("text"))]),
                    ],
                ],
            ),
        ],
    );
    let routed = workflow(vec![switch(
        "route",
        |n: u64| Ok(if n < 10 { "small" } else { "other" }),
        vec![("small", Child::new(&add)), ("large", Child::new(&fail))],
    )]);
    definition_conformance(
        &routed,
        &[
            case(
                "small",
                input(1),
                vec![
                    vec![],
                    vec![
                        started(0, 0, "route.small"),
                        ready(0, 1, &[("route.small", done(2))]),
                    ],
                ],
            ),
            case("unknown case", input(50), vec![vec![]]),
        ],
    );
}

#[test]
fn forks_and_maps_conform() {
    let add = child(Op::Add(1));
    let fan = workflow(vec![fork::<u64, u64, u64, _>(
        "fan",
        vec![Child::new(&add), Child::new(&add), Child::new(&add)],
        2,
        |outputs: Vec<u64>| Ok(outputs.iter().sum()),
    )]);
    definition_conformance(
        &fan,
        &[
            case(
                "two windows",
                input(1),
                vec![
                    vec![],
                    vec![
                        started(0, 0, "fan.0"),
                        started(0, 1, "fan.1"),
                        ready(0, 2, &[("fan.0", done(2)), ("fan.1", done(2))]),
                    ],
                    vec![started(1, 0, "fan.2"), ready(1, 1, &[("fan.2", done(2))])],
                ],
            ),
            case(
                "a refused start waits for the started branch",
                input(1),
                vec![
                    vec![],
                    vec![
                        refused(0, 0, "fan.0"),
                        started(0, 1, "fan.1"),
                        wait_refused(0, 2),
                    ],
                    vec![ready(1, 0, &[("fan.1", done(2))])],
                ],
            ),
        ],
    );
    let each = workflow(vec![map::<u64, u64>("each", Child::new(&add), 2, 3)]);
    definition_conformance(
        &each,
        &[
            case("empty", input(Vec::<u64>::new()), vec![vec![]]),
            case("too many", input(vec![1, 2, 3, 4]), vec![vec![]]),
            case(
                "one window",
                input(vec![5, 6]),
                vec![
                    vec![],
                    vec![
                        started(0, 0, "each.0"),
                        started(0, 1, "each.1"),
                        ready(0, 2, &[("each.0", done(6)), ("each.1", done(7))]),
                    ],
                ],
            ),
        ],
    );
}

#[test]
fn loops_conform() {
    let add = child(Op::Add(1));
    let repeat = workflow(vec![loop_until("grow", Child::new(&add), 2, |n: &u64| {
        Ok(*n > 100)
    })]);
    definition_conformance(
        &repeat,
        &[case(
            "never satisfied",
            input(1),
            vec![
                vec![],
                vec![started(0, 0, "grow.1"), ready(0, 1, &[("grow.1", done(2))])],
                vec![started(1, 0, "grow.2"), ready(1, 1, &[("grow.2", done(3))])],
            ],
        )],
    );
}

#[test]
fn a_recorded_state_for_another_stage_shape_is_refused() {
    let add = child(Op::Add(1));
    let single = workflow(vec![call("work", Child::new(&add))]);
    let mut execution = single.start(&input(1)).expect("starts");
    execution.step(&[]).expect("steps");
    let state = execution.snapshot().expect("snapshots");
    let chain = workflow(vec![transform("work", |n: u64| Ok(n))]);
    let refused = chain.restore(&state).err().expect("refused");
    assert_eq!(refused.failure().code(), "execution.state.invalid");
}
