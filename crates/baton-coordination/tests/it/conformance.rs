//! Every coordination definition passes the kernel's definition conformance suite.

use crate::common::{gate, race, yes_or_timeout};
use baton_coordination::{Candidate, Deadline, INTERRUPTED, TimerResult, WAIT_KEY};
use baton_run::program::{ChildOutcome, Definition, Signal, SignalBody};
use baton_run::{
    ChildKey, EffectId, Failure, Payload, ProcessId, Settlement, SignalId, StartId, Termination,
    Timestamp, WaitId,
};
use baton_testkit::{ConformanceCase, definition_conformance};
use serde::Serialize;

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

fn payload<T: Serialize>(value: T) -> Payload {
    Payload::encode(&value).expect("encodes")
}

fn opened(request: &str) -> Signal {
    result(
        0,
        0,
        SignalBody::WaitOpened {
            effect: effect(0, 0),
            wait: WaitId::for_effect(effect(0, 0)),
            key: ChildKey::new(WAIT_KEY).expect("valid"),
            request: payload(request),
        },
    )
}

fn answer(id: &str, wait: WaitId, text: &str) -> Signal {
    Signal {
        id: SignalId::new(id).expect("valid"),
        wait: Some(wait),
        body: SignalBody::Input {
            payload: payload(text),
        },
    }
}

#[test]
fn the_input_gate_conforms() {
    let program = gate();
    let wait = WaitId::for_effect(effect(0, 0));
    let other = WaitId::for_effect(effect(5, 0));
    let steps = definition_conformance(
        program.definition().as_ref(),
        &[
            ConformanceCase::new(
                "answered",
                payload("ship it?"),
                vec![
                    vec![],
                    vec![opened("ship it?")],
                    vec![answer("a", wait, "yes")],
                ],
            ),
            ConformanceCase::new(
                "early answer in the opening window",
                payload("ship it?"),
                vec![vec![], vec![opened("ship it?"), answer("a", wait, "yes")]],
            ),
            ConformanceCase::new(
                "wrongly addressed",
                payload("ship it?"),
                vec![
                    vec![],
                    vec![opened("ship it?")],
                    vec![answer("a", other, "yes")],
                ],
            ),
            ConformanceCase::new(
                "an opening for another request",
                payload("ship it?"),
                vec![vec![], vec![opened("something else")]],
            ),
        ],
    );
    assert_eq!(steps, 10);
}

fn started(index: u32, key: &str, failure: Option<Failure>) -> Signal {
    let key = ChildKey::new(key).expect("valid");
    result(
        0,
        index,
        SignalBody::ChildStarted {
            effect: effect(0, index),
            process: failure.is_none().then(|| ProcessId::child(root(), &key)),
            key,
            failure,
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
                .map(|(key, termination)| {
                    let key = ChildKey::new(key).expect("valid");
                    ChildOutcome {
                        process: ProcessId::child(root(), &key),
                        key,
                        termination: termination.clone(),
                    }
                })
                .collect(),
        },
    )
}

fn said(text: &str) -> Termination {
    Termination::completed(payload(serde_json::json!({
        "id": "x",
        "wait": WaitId::for_effect(effect(9, 9)),
        "payload": text,
    })))
}

#[test]
fn first_success_conforms() {
    let race = race(3, yes_or_timeout());
    let candidates: Vec<Candidate> = ["a", "b", "c"]
        .iter()
        .map(|k| Candidate::new(k, &gate(), &"q".to_owned()).expect("valid"))
        .collect();
    let refusal = Failure::contract("engine.child.capability_escalation", "no");
    let wait_refused = result(
        0,
        3,
        SignalBody::Settled {
            effect: effect(0, 3),
            settlement: Settlement::failed(Failure::contract("engine.child.wait.invalid", "x")),
        },
    );
    definition_conformance(
        &race,
        &[
            ConformanceCase::new(
                "rejected then accepted",
                payload(&candidates),
                vec![
                    vec![],
                    vec![
                        started(0, "a", None),
                        started(1, "b", None),
                        started(2, "c", None),
                        ready(0, 3, &[("a", said("no"))]),
                    ],
                    vec![ready(1, 0, &[("b", said("yes"))])],
                ],
            ),
            ConformanceCase::new(
                "a refused start and no winner",
                payload(&candidates),
                vec![
                    vec![],
                    vec![
                        started(0, "a", Some(refusal.clone())),
                        started(1, "b", Some(refusal.clone())),
                        started(2, "c", None),
                        wait_refused,
                    ],
                    vec![ready(1, 0, &[("c", Termination::failed(refusal))])],
                ],
            ),
        ],
    );
}

fn settled(settlement: Settlement) -> Signal {
    result(
        0,
        0,
        SignalBody::Settled {
            effect: effect(0, 0),
            settlement,
        },
    )
}

#[test]
fn the_deadline_conforms() {
    let reached = |deadline: u64, reached: bool| {
        settled(Settlement::ok(payload(TimerResult {
            deadline: Timestamp(deadline),
            reached,
        })))
    };
    let steps = definition_conformance(
        &Deadline::new(),
        &[
            ConformanceCase::new(
                "reached",
                payload(5_000),
                vec![vec![], vec![reached(5_000, true)]],
            ),
            ConformanceCase::new(
                "not reached",
                payload(5_000),
                vec![vec![], vec![reached(5_000, false)]],
            ),
            ConformanceCase::new(
                "another deadline",
                payload(5_000),
                vec![vec![], vec![reached(4_000, true)]],
            ),
            ConformanceCase::new(
                "interrupted",
                payload(5_000),
                vec![
                    vec![],
                    vec![settled(Settlement::failed(Failure::external(
                        INTERRUPTED,
                        "canceled",
                    )))],
                ],
            ),
        ],
    );
    assert_eq!(steps, 8);
}

#[test]
fn definitions_step_to_the_expected_transitions() {
    use baton_run::program::Transition;
    let deadline = Deadline::new();
    let mut run = deadline.start(&payload(5_000)).expect("starts");
    assert!(matches!(run.step(&[]), Ok(Transition::Continue { .. })));
    let interrupted = run
        .step(&[settled(Settlement::ok(payload(TimerResult {
            deadline: Timestamp(5_000),
            reached: false,
        })))])
        .expect("steps");
    match interrupted {
        Transition::Fail { failure, .. } => assert_eq!(failure.code(), INTERRUPTED),
        other => panic!("expected a failure, got {other:?}"),
    }

    let program = gate();
    let mut run = program
        .definition()
        .start(&payload("ship it?"))
        .expect("starts");
    run.step(&[]).expect("declares the wait");
    let wait = WaitId::for_effect(effect(0, 0));
    let early = run
        .step(&[opened("ship it?"), answer("early", wait, "yes")])
        .expect("steps");
    match early {
        Transition::Complete { consumed, output } => {
            assert_eq!(consumed, 2);
            assert_eq!(output.to_value()["id"], "early");
        }
        other => panic!("expected completion, got {other:?}"),
    }
}
