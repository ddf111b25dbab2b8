//! The team definition stepped directly with scripted windows: the kernel's
//! definition conformance, strict restore, and decision validation against
//! a reference model (proptest).

use std::sync::Arc;

use crate::common::*;
use baton_run::program::{
    ChildOutcome, ChildSignal, Definition, Effect, ExecutionState, Schema, Signal, SignalBody,
    Transition,
};
use baton_run::{
    ChildKey, EffectId, Failure, Payload, ProcessId, Program, Quota, Settlement, SignalId, StartId,
    Termination,
};
use baton_team::{Binding, Config, Control, Decision, Mode, TaskRequest, compile};
use baton_testkit::{ConformanceCase, definition_conformance};
use proptest::prelude::*;
use serde_json::{Value, json};

fn root() -> ProcessId {
    ProcessId::root(&StartId::new("acme", "steps").expect("valid"))
}

fn child(key_text: &str) -> ProcessId {
    ProcessId::child(root(), &key(key_text))
}

fn signal(index: u32, body: SignalBody) -> Signal {
    Signal {
        id: SignalId::for_effect(EffectId::new(root(), 99, index)),
        wait: None,
        body,
    }
}

fn started(key_text: &str, refused: bool) -> Signal {
    signal(
        0,
        SignalBody::ChildStarted {
            effect: EffectId::new(root(), 0, 0),
            key: key(key_text),
            process: (!refused).then(|| child(key_text)),
            failure: refused.then(|| Failure::contract("engine.child.tree_limit", "refused")),
        },
    )
}

fn drained(key_text: &str, termination: Termination) -> ChildOutcome {
    ChildOutcome {
        key: key(key_text),
        process: child(key_text),
        termination,
    }
}

fn ready(children: Vec<ChildOutcome>) -> Signal {
    signal(
        1,
        SignalBody::ChildrenReady {
            effect: EffectId::new(root(), 0, 1),
            children,
        },
    )
}

fn decided(turn: u64, decision: &Decision) -> ChildOutcome {
    drained(
        &format!("team.turn.{turn}"),
        Termination::completed(Payload::encode(decision).expect("encodes")),
    )
}

/// The kernel's refusal of a wait naming a task whose start was refused.
fn wait_refused() -> Signal {
    signal(
        3,
        SignalBody::Settled {
            effect: EffectId::new(root(), 0, 3),
            settlement: Settlement::failed(Failure::contract(
                "engine.child.wait.invalid",
                "b is not a child of this process",
            )),
        },
    )
}

fn receipt(key_text: &str) -> Signal {
    signal(
        2,
        SignalBody::ControlReceipt {
            effect: EffectId::new(root(), 0, 2),
            key: key(key_text),
            result: Settlement::ok(Payload::null()),
        },
    )
}

fn worker_program(name: &str, input: Schema) -> Program {
    Program::new(baton_run::program::ProgramConfig {
        definition: Arc::new(Plain(
            baton_run::program::Descriptor::new(name, "A worker.", input, Schema::any())
                .expect("valid"),
        )),
        dispatcher: None,
        implementation: baton_run::program::implementation_digest("steps", "1"),
        configuration: baton_run::program::configuration_digest(&name).expect("encodes"),
    })
}

/// A descriptor-only worker (these tests never run workers).
struct Plain(baton_run::program::Descriptor);

impl Definition for Plain {
    fn descriptor(&self) -> &baton_run::program::Descriptor {
        &self.0
    }
    fn start(
        &self,
        _: &Payload,
    ) -> Result<Box<dyn baton_run::program::Execution>, baton_run::program::StepError> {
        Err(baton_run::program::StepError::other("not run"))
    }
    fn restore(
        &self,
        _: &ExecutionState,
    ) -> Result<Box<dyn baton_run::program::Execution>, baton_run::program::StepError> {
        Err(baton_run::program::StepError::other("not run"))
    }
}

/// A team over state `u32` and output `String` with workers `w.num`
/// (integer input) and `w.text` (string input).
/// Turn 1 decides `continue` with task `a`, which starts.
fn start_task_a(run: &mut dyn baton_run::program::Execution) {
    let first = Decision::new(Mode::Continue, payload(json!(7))).with_task(request_of(
        "a",
        "w.num",
        json!(1),
    ));
    run.step(&[
        started("team.turn.1", false),
        ready(vec![decided(1, &first)]),
    ])
    .expect("applies");
    run.step(&[started("a", false)]).expect("started");
}

/// The stepped team, for the fuzz tests.
pub(crate) fn team_for_fuzzing() -> Program<u32, String> {
    team()
}

fn team() -> Program<u32, String> {
    compile::<u32, String>(Config {
        name: "test.team".into(),
        description: "A stepped team.".into(),
        coordinator: Binding::new(&policy("steps 1", |turn| {
            Ok(Decision::new(Mode::Continue, turn.state.clone()))
        })),
        workers: vec![
            Binding::new(&worker_program("w.num", Schema::of::<i64>())),
            Binding::new(&worker_program("w.text", Schema::of::<String>())),
        ],
        max_turns: Quota::Unlimited,
        max_tasks: Quota::Finite(5),
        max_concurrent_tasks: 3,
        max_controls_per_turn: 2,
        stall_turns: baton_team::DEFAULT_STALL_TURNS,
    })
    .expect("valid")
}

fn request_of(key_text: &str, worker: &str, input: Value) -> TaskRequest {
    TaskRequest::new(key(key_text), name(worker), payload(input))
}

#[test]
fn the_team_definition_keeps_the_kernel_contract() {
    let team = team();
    let state = payload(json!(7));
    let first = Decision::new(Mode::Continue, state.clone())
        .with_task(request_of("a", "w.num", json!(1)))
        .with_task(request_of("b", "w.text", json!("x")));
    let second =
        Decision::new(Mode::Wait, state.clone()).with_control(Control::cancel(key("a"), "enough"));
    let last = Decision::complete(state.clone(), payload(json!("done")));
    let cases = vec![
        ConformanceCase::new(
            "complete on turn 1",
            state.clone(),
            vec![
                vec![],
                vec![
                    started("team.turn.1", false),
                    ready(vec![decided(1, &last)]),
                ],
            ],
        ),
        ConformanceCase::new(
            "tasks, an outcome during a turn, a control, wait, complete",
            state.clone(),
            vec![
                vec![],
                vec![
                    started("team.turn.1", false),
                    ready(vec![decided(1, &first)]),
                ],
                vec![started("a", false), started("b", true)],
                vec![
                    started("team.turn.2", false),
                    ready(vec![drained(
                        "a",
                        Termination::completed(payload(json!(2))),
                    )]),
                ],
                vec![ready(vec![decided(2, &second)])],
                vec![receipt("a")],
                vec![
                    started("team.turn.3", false),
                    ready(vec![decided(3, &last)]),
                ],
            ],
        ),
        ConformanceCase::new(
            "a refused coordinator",
            state,
            vec![vec![], vec![started("team.turn.1", true)]],
        ),
    ];
    assert_eq!(
        definition_conformance(team.definition().as_ref(), &cases),
        11
    );
}

#[test]
fn restore_rejects_states_no_run_produces() {
    let team = team();
    let definition = team.definition();
    let restore = |state: Value| definition.restore(&ExecutionState(payload(state)));
    assert!(restore(json!({"initial": 7})).is_ok());
    assert!(
        restore(json!({"initial": null})).is_err(),
        "the initial state fails u32"
    );
    assert!(restore(json!({"completed": true})).is_ok());
    for bad in [
        json!({}),
        json!({"completed": true, "initial": 7}),
        json!({"completed": false, "initial": 7}),
        json!({"initial": 7, "extra": 1}),
        json!({"initial": 7, "tasks": []}),
        json!({"turn": {"number": 0, "state": 7}}),
        json!({"turn": {"number": 1, "state": "seven"}}),
        json!({"turn": {"number": 1, "state": 7, "outcome_arrived": true}}),
        json!({"turn": {"number": 1, "state": 7, "decided": {"mode": "wait", "tasks": 0}, "coordinator": child("team.turn.1")}}),
        json!({"turn": {"number": 1, "state": 7}, "tasks": [{"request": {"key": "a", "worker": "w.num", "input": 1}}]}),
        json!({"turn": {"number": 1, "state": 7}, "tasks": [
            {"request": {"key": "a", "worker": "w.num", "input": 1}, "process": child("a")},
            {"request": {"key": "a", "worker": "w.num", "input": 1}, "process": child("b")}]}),
        json!({"turn": {"number": 1, "state": 7}, "tasks": [
            {"request": {"key": "a", "worker": "w.none", "input": 1}, "process": child("a")}]}),
        json!({"turn": {"number": 1, "state": 7}, "tasks": [
            {"request": {"key": "a", "worker": "w.num", "input": 1}, "rejection": {"kind": "contract", "code": "x.y", "message": "m"}, "process": child("a")}]}),
    ] {
        let text = bad.to_string();
        let error = restore(bad)
            .err()
            .unwrap_or_else(|| panic!("{text} restored"));
        assert!(
            ["team.state.invalid", "execution.payload.invalid"].contains(&error.failure().code()),
            "{text}: {error}"
        );
    }
    assert!(
        restore(json!({"turn": {"number": 2, "state": 7, "coordinator": child("team.turn.2")}, "tasks": [
            {"request": {"key": "a", "worker": "w.num", "input": 1}, "process": child("a")}]}))
        .is_ok()
    );
}

/// Turn 2 in progress with a drained task `a`, a refused task `b` and a
/// running task `c`, with `settled` in place of `a` when given.
fn turn_two_state(settled: Option<Value>) -> Value {
    let drained = json!({
        "request": {"key": "a", "worker": "w.num", "input": 1},
        "process": child("a"),
        "outcome": {"status": "completed", "cause": "completion", "output": 2},
    });
    json!({
        "turn": {"number": 2, "state": 7, "coordinator": child("team.turn.2")},
        "tasks": [
            settled.unwrap_or(drained),
            {"request": {"key": "b", "worker": "w.text", "input": "x"},
             "rejection": {"kind": "contract", "code": "engine.child.tree_limit", "message": "refused"}},
            {"request": {"key": "c", "worker": "w.num", "input": 3}, "process": child("c")},
        ],
    })
}

/// Settled tasks (refused, or drained with their outcome) are never
/// decoded after a restore, only checked; the check must be as strict as
/// decoding them.
#[test]
fn restore_checks_settled_tasks_as_strictly_as_decoding_them() {
    let team = team();
    let definition = team.definition();
    let restore = |state: Value| definition.restore(&ExecutionState(payload(state)));
    let request = json!({"key": "a", "worker": "w.num", "input": 1});
    let task =
        |outcome: Value| json!({"request": request, "process": child("a"), "outcome": outcome});
    let failure = json!({"kind": "external", "code": "w.failed", "message": "a \"quoted\"\nline"});
    for good in [
        task(json!({"status": "completed", "cause": "completion", "output": null})),
        task(
            json!({"status": "failed", "cause": "failure", "failure": failure,
                    "unresolved_effects": ["e_0123456789abcdef0123456789abcdef"]}),
        ),
        task(json!({"status": "canceled", "cause": "parent_cancellation", "failure": failure})),
        json!({"request": request, "rejection": failure}),
    ] {
        let text = good.to_string();
        let state = payload(turn_two_state(Some(good)));
        let run = definition
            .restore(&ExecutionState(state.clone()))
            .unwrap_or_else(|error| panic!("{text}: {error}"));
        assert_eq!(run.snapshot().expect("snapshots").0, state, "{text}");
    }
    for bad in [
        task(json!({"status": "failed", "cause": "completion", "output": 2})),
        task(json!({"status": "completed", "cause": "completion"})),
        task(
            json!({"status": "completed", "cause": "completion", "output": 2, "failure": failure}),
        ),
        task(json!({"status": "failed", "cause": "failure"})),
        task(
            json!({"status": "failed", "cause": "failure", "failure": {"kind": "external", "code": "W.Failed", "message": "m"}}),
        ),
        task(
            json!({"status": "failed", "cause": "failure", "failure": {"kind": "external", "code": "w.failed", "message": 5}}),
        ),
        task(
            json!({"status": "failed", "cause": "failure", "failure": {"kind": "external", "code": "w.failed", "message": "m", "extra": 1}}),
        ),
        task(
            json!({"status": "failed", "cause": "failure", "failure": failure, "unresolved_effects": ["e_12"]}),
        ),
        task(json!({"status": "completed", "cause": "completion", "output": 2, "extra": 1})),
        task(json!({"status": "running", "cause": "completion", "output": 2})),
        task(json!(null)),
        json!({"request": request, "process": null, "outcome": {"status": "completed", "cause": "completion", "output": 2}}),
        json!({"request": request, "outcome": {"status": "completed", "cause": "completion", "output": 2}}),
        json!({"request": request, "process": child("a"), "rejection": failure}),
        json!({"request": request, "rejection": {"kind": "contract", "code": "x.y"}}),
        json!({"request": request, "rejection": null}),
        json!({"request": request, "rejection": failure, "extra": []}),
        json!({"request": {"key": "a b", "worker": "w.num", "input": 1}, "rejection": failure}),
        json!({"request": {"key": "k".repeat(129), "worker": "w.num", "input": 1}, "rejection": failure}),
        json!({"request": {"key": "c", "worker": "w.num", "input": 1}, "rejection": failure}),
        json!({"request": {"key": "team.turn.1", "worker": "w.num", "input": 1}, "rejection": failure}),
        json!({"request": {"key": "a", "worker": "w.none", "input": 1}, "rejection": failure}),
        json!({"request": {"key": "a", "worker": "W.num", "input": 1}, "rejection": failure}),
        json!({"request": {"key": "a", "worker": "w.num"}, "rejection": failure}),
        json!({"request": {"key": "a", "worker": "w.num", "input": 1, "extra": 1}, "rejection": failure}),
        json!({"request": request, "process": "p_0123", "outcome": {"status": "completed", "cause": "completion", "output": 2}}),
        json!({"request": request, "process": child("c"), "outcome": {"status": "completed", "cause": "completion", "output": 2}}),
    ] {
        let text = bad.to_string();
        let error = restore(turn_two_state(Some(bad)))
            .err()
            .unwrap_or_else(|| panic!("{text} restored"));
        assert_eq!(
            error.failure().code(),
            "team.state.invalid",
            "{text}: {error}"
        );
    }
}

/// A restored team copies its settled tasks' text as it is and records a
/// fact about a running one: the next snapshot is exactly what the facts
/// say.
#[test]
fn a_restored_team_records_outcomes_beside_its_settled_tasks() {
    let team = team();
    let definition = team.definition();
    let mut run = definition
        .restore(&ExecutionState(payload(turn_two_state(None))))
        .expect("restores");
    let outcome = Termination::completed(payload(json!(5)));
    let transition = run
        .step(&[ready(vec![drained("c", outcome.clone())])])
        .expect("records the outcome");
    assert!(
        matches!(&transition, Transition::Continue { effects, .. }
            if matches!(effects.as_slice(), [Effect::WaitChildren { keys, .. }] if keys == &[key("team.turn.2")])),
        "{transition:?}"
    );
    let mut expected = turn_two_state(None);
    expected["turn"]["outcome_arrived"] = json!(true);
    expected["tasks"][2]["outcome"] = json_of(&outcome);
    let state = run.snapshot().expect("snapshots");
    assert_eq!(state.0, payload(expected));
    let restored = definition.restore(&state).expect("restores again");
    assert_eq!(restored.snapshot().expect("snapshots"), state);
    let Err(error) = run.step(&[ready(vec![drained("a", outcome)])]) else {
        panic!("a drained task drained again");
    };
    assert_eq!(error.failure().code(), "team.protocol.invalid");
}

#[test]
fn stepping_out_of_protocol_is_a_protocol_failure() {
    let team = team();
    let mut run = team.definition().start(&payload(json!(7))).expect("starts");
    run.step(&[]).expect("turn 1 opens");
    let Err(error) = run.step(&[started("elsewhere", false)]) else {
        panic!("an unexpected start result was accepted");
    };
    assert_eq!(error.failure().code(), "team.protocol.invalid");
}

/// One history before the decision under test.
#[derive(Clone, Copy, Debug)]
struct History {
    /// Tasks a and c drained in a `wait` before turn 2 (nothing runs).
    drained_before: bool,
    /// Task c's outcome arrives together with coordinator 2's outcome.
    arrived_during: bool,
}

/// Steps the team through turn 1 (tasks a: w.num started, b refused,
/// c: w.text started) into turn 2 and returns turn 2's result for `decision`.
fn run_turn_two(history: History, decision: &Decision) -> Result<Transition, Failure> {
    let team = team();
    let mut run = team.definition().start(&payload(json!(7))).expect("starts");
    run.step(&[]).expect("turn 1 opens");
    let mode = if history.drained_before {
        Mode::Wait
    } else {
        Mode::Continue
    };
    let first = Decision::new(mode, payload(json!(7)))
        .with_task(request_of("a", "w.num", json!(1)))
        .with_task(request_of("b", "w.num", json!(2)))
        .with_task(request_of("c", "w.text", json!("x")));
    run.step(&[
        started("team.turn.1", false),
        ready(vec![decided(1, &first)]),
    ])
    .expect("applies");
    // Under `wait`, the turn-ending wait was declared with the starts; b's
    // refused start makes the kernel refuse it.
    let mut results = vec![started("a", false), started("b", true), started("c", false)];
    if history.drained_before {
        results.push(wait_refused());
    }
    run.step(&results).expect("receipts");
    let done = || Termination::completed(payload(json!(0)));
    if history.drained_before {
        run.step(&[ready(vec![drained("a", done()), drained("c", done())])])
            .expect("waited");
    }
    let mut children = Vec::new();
    if history.arrived_during && !history.drained_before {
        children.push(drained("c", done()));
    }
    children.push(decided(2, decision));
    run.step(&[started("team.turn.2", false), ready(children)])
        .map_err(|error| error.failure().clone())
}

/// The reference model of the validation rules.
fn model_accepts(history: History, decision: &Decision) -> bool {
    let integer = |p: &Payload| p.to_value().is_i64();
    let string = |p: &Payload| p.to_value().is_string();
    if !(integer(&decision.state) && decision.state.to_value().as_i64().is_some_and(|n| n >= 0)) {
        return false;
    }
    if let Some(output) = &decision.output {
        return decision.mode.is_none()
            && decision.tasks.is_empty()
            && decision.controls.is_empty()
            && string(output);
    }
    let Some(mode) = decision.mode else {
        return false;
    };
    let running = if history.drained_before {
        0
    } else if history.arrived_during {
        1
    } else {
        2
    };
    let arrived = history.arrived_during && !history.drained_before;
    let new = decision.tasks.len();
    if 3 + new > 5 || running + new > 3 || decision.controls.len() > 2 {
        return false;
    }
    let mut keys: Vec<&str> = vec!["a", "b", "c"];
    for task in &decision.tasks {
        let key = task.key.as_str();
        if key.starts_with("team.turn.") || keys.contains(&key) {
            return false;
        }
        keys.push(key);
        let fits = match task.worker.as_str() {
            "w.num" => integer(&task.input),
            "w.text" => string(&task.input),
            _ => false,
        };
        if !fits {
            return false;
        }
    }
    if decision
        .controls
        .iter()
        .any(|control| !["a", "c"].contains(&control.task.as_str()))
    {
        return false;
    }
    !(mode == Mode::Wait && running == 0 && new == 0 && !arrived)
}

fn decisions() -> impl Strategy<Value = Decision> {
    let mode = prop_oneof![
        Just(None),
        Just(Some(Mode::Continue)),
        Just(Some(Mode::Wait))
    ];
    let state = prop_oneof![Just(json!(7)), Just(json!("seven")), Just(json!(-1))];
    let task = (
        prop::sample::select(vec!["a", "b", "d", "e", "team.turn.9"]),
        prop::sample::select(vec!["w.num", "w.text", "w.none"]),
        prop_oneof![Just(json!(1)), Just(json!("s"))],
    )
        .prop_map(|(k, w, input)| request_of(k, w, input));
    let control = (
        prop::sample::select(vec!["a", "b", "c", "z"]),
        any::<bool>(),
    )
        .prop_map(|(task, cancel)| {
            if cancel {
                Control::cancel(key(task), "stop")
            } else {
                Control::signal(
                    key(task),
                    ChildSignal {
                        id: SignalId::new("s-1").expect("valid"),
                        wait: None,
                        payload: payload(json!("hi")),
                    },
                )
            }
        });
    let output = prop_oneof![
        3 => Just(None),
        1 => Just(Some(json!("done"))),
        1 => Just(Some(json!(null))),
        1 => Just(Some(json!(5))),
    ];
    (
        mode,
        state,
        prop::collection::vec(task, 0..4),
        prop::collection::vec(control, 0..4),
        output,
    )
        .prop_map(|(mode, state, tasks, controls, output)| Decision {
            mode,
            state: payload(state),
            tasks,
            controls,
            output: output.map(payload),
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]
    #[test]
    fn decisions_are_accepted_exactly_as_the_model_accepts_them(
        decision in decisions(),
        drained_before in any::<bool>(),
        arrived_during in any::<bool>(),
    ) {
        let history = History { drained_before, arrived_during };
        let expected = model_accepts(history, &decision);
        match run_turn_two(history, &decision) {
            Err(failure) => {
                prop_assert!(!expected, "rejected a decision the model accepts: {failure}");
                prop_assert_eq!(failure.code(), "team.decision.invalid");
            }
            Ok(transition) => {
                prop_assert!(expected, "accepted a decision the model rejects: {transition:?}");
                match transition {
                    Transition::Complete { output, .. } => {
                        prop_assert_eq!(Some(output), decision.output.clone());
                    }
                    Transition::Continue { effects, .. } => {
                        let actions = decision.tasks.len() + decision.controls.len();
                        if actions > 0 {
                            // Under `wait` with no outcome this turn and
                            // something to run, the turn-ending wait goes
                            // out with the actions, over the running tasks
                            // (a, c unless drained or arrived) and the new.
                            let arrived = history.arrived_during && !history.drained_before;
                            let mut running: Vec<&str> = if history.drained_before {
                                vec![]
                            } else if arrived {
                                vec!["a"]
                            } else {
                                vec!["a", "c"]
                            };
                            running.extend(decision.tasks.iter().map(|task| task.key.as_str()));
                            let waits = decision.mode == Some(Mode::Wait) && !arrived && !running.is_empty();
                            prop_assert_eq!(effects.len(), actions + usize::from(waits));
                            if waits {
                                let expected: Vec<ChildKey> = running.iter().map(|k| key(k)).collect();
                                let wait = matches!(effects.last(), Some(Effect::WaitChildren { keys, .. }) if keys == &expected);
                                prop_assert!(wait, "{effects:?}");
                            }
                            for (effect, task) in effects.iter().zip(&decision.tasks) {
                                let is_start = matches!(effect, Effect::StartChild { key, .. } if key == &task.key);
                                prop_assert!(is_start, "{effect:?}");
                            }
                            for (effect, control) in effects[decision.tasks.len()..].iter().zip(&decision.controls) {
                                let target: &ChildKey = match effect {
                                    Effect::SignalChild { key, .. } | Effect::CancelChild { key, .. } => key,
                                    other => panic!("not a control: {other:?}"),
                                };
                                prop_assert_eq!(target, &control.task);
                            }
                        } else {
                            // No actions: a wait on running tasks or the next turn at once.
                            let ok = matches!(effects.as_slice(), [Effect::WaitChildren { .. }] | [Effect::StartChild { .. }, Effect::WaitChildren { .. }]);
                            prop_assert!(ok, "{effects:?}");
                        }
                    }
                    other => prop_assert!(false, "unexpected {other:?}"),
                }
            }
        }
    }
}

fn wait_keys(effect: &Effect) -> Vec<&str> {
    match effect {
        Effect::WaitChildren { keys, .. } => keys.iter().map(ChildKey::as_str).collect(),
        other => panic!("not a children wait: {other:?}"),
    }
}

fn effects_of(transition: &Transition) -> &[Effect] {
    match transition {
        Transition::Continue { effects, .. } => effects,
        other => panic!("not a continue: {other:?}"),
    }
}

/// Snapshots `run` and restores the snapshot, as the kernel does after
/// every step, so every intermediate state is held to restore's rules.
fn round_trip(
    definition: &dyn Definition,
    run: &dyn baton_run::program::Execution,
) -> Box<dyn baton_run::program::Execution> {
    let state = run.snapshot().expect("snapshots");
    let restored = definition.restore(&state).expect("restores");
    assert_eq!(restored.snapshot().expect("snapshots"), state);
    restored
}

/// A `wait` decision that starts work declares the turn-ending wait with
/// its starts, so the start results and the wait's settlement arrive in one
/// window: the round costs one team step less.
#[test]
fn a_wait_decision_declares_its_wait_with_its_starts() {
    let team = team();
    let definition = team.definition();
    let mut run = definition.start(&payload(json!(7))).expect("starts");
    run.step(&[]).expect("turn 1 opens");
    start_task_a(run.as_mut());
    let second = Decision::new(Mode::Wait, payload(json!(7)))
        .with_task(request_of("c", "w.num", json!(2)))
        .with_control(Control::cancel(key("a"), "enough"));
    let transition = run
        .step(&[
            started("team.turn.2", false),
            ready(vec![decided(2, &second)]),
        ])
        .expect("applies");
    let effects = effects_of(&transition);
    assert_eq!(effects.len(), 3, "{effects:?}");
    assert!(matches!(&effects[0], Effect::StartChild { key, .. } if key.as_str() == "c"));
    assert!(matches!(&effects[1], Effect::CancelChild { key, .. } if key.as_str() == "a"));
    assert_eq!(wait_keys(&effects[2]), ["a", "c"]);
    let mut run = round_trip(definition.as_ref(), run.as_ref());
    let a = Termination::ended(
        baton_run::Cause::ParentCancellation,
        Failure::contract("x.y", "stop"),
    );
    let transition = run
        .step(&[
            started("c", false),
            receipt("a"),
            ready(vec![drained("a", a)]),
        ])
        .expect("settles in one step");
    let effects = effects_of(&transition);
    assert!(
        matches!(&effects[0], Effect::StartChild { key, .. } if key.as_str() == "team.turn.3"),
        "the next turn starts in the same step: {effects:?}"
    );
    assert_eq!(wait_keys(&effects[1]), ["c", "team.turn.3"]);
    let turn: baton_team::Turn = match &effects[0] {
        Effect::StartChild { input, .. } => input.decode().expect("a turn"),
        _ => unreachable!(),
    };
    assert_eq!(turn.controls.len(), 1, "turn 3 shows the receipt");
    assert!(turn.task("a").is_some_and(|t| t.outcome.is_some()));
    assert!(turn.task("c").is_some_and(|t| t.is_running()));
    round_trip(definition.as_ref(), run.as_ref());
}

/// When a start is refused the kernel refuses the wait naming it; the mode
/// rule then applies to the recorded facts as it did before: an older task
/// still running is waited on, otherwise the next turn starts at once.
#[test]
fn a_refused_start_falls_back_to_the_wait_rule() {
    let team = team();
    let definition = team.definition();
    for older in [true, false] {
        let mut run = definition.start(&payload(json!(7))).expect("starts");
        run.step(&[]).expect("turn 1 opens");
        let mut number = 1;
        if older {
            start_task_a(run.as_mut());
            number = 2;
        }
        let decision = Decision::new(Mode::Wait, payload(json!(7))).with_task(request_of(
            "b",
            "w.num",
            json!(2),
        ));
        let transition = run
            .step(&[
                started(&format!("team.turn.{number}"), false),
                ready(vec![decided(number, &decision)]),
            ])
            .expect("applies");
        let expected: &[&str] = if older { &["a", "b"] } else { &["b"] };
        assert_eq!(wait_keys(&effects_of(&transition)[1]), expected);
        let mut run = round_trip(definition.as_ref(), run.as_ref());
        let transition = run
            .step(&[started("b", true), wait_refused()])
            .expect("falls back");
        let effects = effects_of(&transition);
        if older {
            assert_eq!(effects.len(), 1, "{effects:?}");
            assert_eq!(
                wait_keys(&effects[0]),
                ["a"],
                "wait blocks on the older task"
            );
            let mut run = round_trip(definition.as_ref(), run.as_ref());
            let transition = run
                .step(&[ready(vec![drained(
                    "a",
                    Termination::completed(payload(json!(2))),
                )])])
                .expect("waited");
            assert!(
                matches!(&effects_of(&transition)[0], Effect::StartChild { key, .. } if key.as_str() == "team.turn.3")
            );
        } else {
            assert!(
                matches!(&effects[0], Effect::StartChild { key, .. } if key.as_str() == "team.turn.2"),
                "nothing runs: the next turn starts at once: {effects:?}"
            );
            round_trip(definition.as_ref(), run.as_ref());
        }
    }
}

/// The window after a `wait` decision with actions must end with the wait's
/// settlement, refused only when a start was refused.
#[test]
fn the_declared_wait_must_settle_as_the_kernel_settles_it() {
    let team = team();
    let definition = team.definition();
    let applying = || {
        let mut run = definition.start(&payload(json!(7))).expect("starts");
        run.step(&[]).expect("turn 1 opens");
        let decision = Decision::new(Mode::Wait, payload(json!(7)))
            .with_task(request_of("a", "w.num", json!(1)))
            .with_task(request_of("b", "w.num", json!(2)));
        run.step(&[
            started("team.turn.1", false),
            ready(vec![decided(1, &decision)]),
        ])
        .expect("applies");
        run
    };
    let done = || Termination::completed(payload(json!(0)));
    for (window, what) in [
        (
            vec![started("a", false), started("b", false)],
            "no wait settlement",
        ),
        (
            vec![started("a", false), started("b", false), wait_refused()],
            "a refused wait without a refused start",
        ),
        (
            vec![
                started("a", false),
                started("b", true),
                ready(vec![drained("a", done())]),
            ],
            "a settled wait naming a refused start",
        ),
        (
            vec![started("a", false), started("b", false), ready(vec![])],
            "an empty settlement",
        ),
        (
            vec![
                started("a", false),
                started("b", false),
                ready(vec![drained("a", done())]),
                receipt("a"),
            ],
            "a signal after the settlement",
        ),
    ] {
        let Err(error) = applying().step(&window) else {
            panic!("{what} was accepted");
        };
        assert_eq!(error.failure().code(), "team.protocol.invalid", "{what}");
    }
    applying()
        .step(&[started("a", false), started("b", true), wait_refused()])
        .expect("a refused start refuses the wait");
}

/// A decided `wait` turn with actions declared its wait with them, so it
/// is recorded waiting on its own only after a refused start.
#[test]
fn restore_accepts_a_waiting_turn_only_as_the_wait_rule_produces_it() {
    let team = team();
    let definition = team.definition();
    let restore = |state: Value| definition.restore(&ExecutionState(payload(state)));
    let running = |k: &str| json!({"request": {"key": k, "worker": "w.num", "input": 1}, "process": child(k)});
    let refused = json!({"request": {"key": "b", "worker": "w.num", "input": 1},
        "rejection": {"kind": "contract", "code": "engine.child.tree_limit", "message": "refused"}});
    let waiting = |tasks: u32, list: Vec<Value>, controls: Option<Value>| {
        let mut state = json!({
            "turn": {"number": 2, "state": 7, "coordinator": child("team.turn.2"),
                     "decided": {"mode": "wait", "tasks": tasks}},
            "tasks": list,
        });
        if let Some(controls) = controls {
            state["controls"] = controls;
        }
        state
    };
    let receipts = json!([{
        "control": json_of(&Control::cancel(key("a"), "stop")),
        "result": json_of(&Settlement::ok(Payload::null())),
    }]);
    assert!(
        restore(waiting(0, vec![running("a")], None)).is_ok(),
        "no actions"
    );
    assert!(
        restore(waiting(1, vec![running("a"), refused.clone()], None)).is_ok(),
        "a refused start"
    );
    for (bad, what) in [
        (
            waiting(1, vec![running("a"), running("c")], None),
            "a started task",
        ),
        (waiting(0, vec![running("a")], Some(receipts)), "a control"),
    ] {
        let error = restore(bad)
            .err()
            .unwrap_or_else(|| panic!("{what} restored"));
        assert_eq!(error.failure().code(), "team.state.invalid", "{what}");
    }
}

/// A team restored at the last turn number its counter holds cannot open
/// another turn: it fails with `engine.counter.exhausted`, classified, not
/// with an overflow.
#[test]
fn the_turn_after_the_last_countable_turn_fails_with_the_counter_exhausted() {
    let team = team();
    let last = u64::MAX;
    let mut run = team
        .definition()
        .restore(&ExecutionState(payload(json!({
            "turn": {"number": last, "state": 7, "coordinator": child(&format!("team.turn.{last}"))},
        }))))
        .expect("a turn in progress restores");
    let decision = Decision::new(Mode::Continue, payload(json!(7)));
    let Err(error) = run.step(&[ready(vec![decided(last, &decision)])]) else {
        panic!("a turn past the counter was opened");
    };
    assert_eq!(error.failure().code(), "engine.counter.exhausted");
    assert_eq!(error.failure().kind, baton_run::FailureKind::Execution);
}

/// A refused start of the coordinator fails the team with the refusal's
/// own failure, code included.
#[test]
fn a_refused_coordinator_start_fails_the_team_with_the_refusal_s_code() {
    let team = team();
    let mut run = team.definition().start(&payload(json!(7))).expect("starts");
    run.step(&[]).expect("turn 1 opens");
    let Err(error) = run.step(&[started("team.turn.1", true)]) else {
        panic!("a refused coordinator start was accepted");
    };
    assert_eq!(error.failure().code(), "engine.child.tree_limit");
}

/// Every way a team configuration can be wrong is refused when the team is
/// compiled, each with its own code.
#[test]
fn a_wrong_team_configuration_is_refused_with_its_code() {
    let config = || Config {
        name: "test.team".into(),
        description: "A team.".into(),
        coordinator: Binding::new(&policy("config 1", |turn| {
            Ok(Decision::new(Mode::Continue, turn.state.clone()))
        })),
        workers: vec![Binding::new(&worker_program("w.num", Schema::of::<i64>()))],
        max_turns: Quota::Unlimited,
        max_tasks: Quota::Finite(5),
        max_concurrent_tasks: 3,
        max_controls_per_turn: 2,
        stall_turns: baton_team::DEFAULT_STALL_TURNS,
    };
    let code = |config: Config| {
        compile::<u32, String>(config)
            .map(|_| ())
            .expect_err("refused")
            .code()
    };
    assert!(compile::<u32, String>(config()).is_ok());
    assert_eq!(
        code(Config {
            workers: Vec::new(),
            ..config()
        }),
        "team.config.no_workers"
    );
    assert_eq!(
        code(Config {
            workers: vec![
                Binding::new(&worker_program("w.num", Schema::of::<i64>())),
                Binding::new(&worker_program("w.num", Schema::of::<String>())),
            ],
            ..config()
        }),
        "team.config.duplicate_worker"
    );
    assert_eq!(
        code(Config {
            coordinator: Binding::new(&worker_program("not.a.coordinator", Schema::of::<i64>())),
            ..config()
        }),
        "team.config.coordinator_contract"
    );
    assert_eq!(
        code(Config {
            max_turns: Quota::Finite(0),
            ..config()
        }),
        "team.config.max_turns"
    );
    assert_eq!(
        code(Config {
            max_concurrent_tasks: 0,
            ..config()
        }),
        "team.config.max_concurrent_tasks"
    );
    assert_eq!(
        code(Config {
            max_controls_per_turn: 0,
            stall_turns: baton_team::DEFAULT_STALL_TURNS,
            ..config()
        }),
        "team.config.max_controls_per_turn"
    );
    assert_eq!(
        code(Config {
            name: "Not A Name".into(),
            ..config()
        }),
        "team.config.descriptor"
    );
}

#[test]
fn a_policy_without_a_build_identity_is_refused_with_its_code() {
    let error = baton_team::Policy::new(baton_team::PolicyConfig {
        name: "test.policy".into(),
        description: "A policy.".into(),
        build: String::new(),
        settings: Payload::null(),
        decide: Arc::new(|turn: &baton_team::Turn| {
            Ok(Decision::new(Mode::Continue, turn.state.clone()))
        }),
    })
    .expect_err("an empty build is refused");
    assert_eq!(error.code(), "team.config.build");
}
