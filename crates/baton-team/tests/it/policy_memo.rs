//! A policy decodes each turn through a memo of recently decoded tasks:
//! whatever the memo holds, every step sees exactly the turn (or fails with
//! exactly the error) that `Payload::decode::<Turn>()` gives, including
//! when several teams' turns interleave through one policy.

use std::cell::RefCell;
use std::sync::{Arc, Barrier};

use baton_run::program::{Definition, Descriptor, Schema, StepError, Transition};
use baton_run::{
    ChildKey, Failure, FailureKind, Meters, Name, Payload, ProcessId, Settlement, StartId,
    Termination,
};
use baton_team::{
    Control, ControlReceipt, Decision, Mode, Policy, PolicyConfig, Task, TaskRequest, Turn,
};
use proptest::prelude::*;
use serde_json::{Value, json};

thread_local! {
    /// The turn the last step on this thread decided on.
    static SEEN: RefCell<Option<Turn>> = const { RefCell::new(None) };
}

/// A policy that records the turn it is given and answers with its number.
pub(crate) fn policy() -> Policy {
    Policy::new(PolicyConfig {
        name: "test.recorder".into(),
        description: "Records the turn.".into(),
        build: "policy-memo-test 1".into(),
        settings: Payload::null(),
        decide: Arc::new(|turn: &Turn| {
            SEEN.with(|seen| *seen.borrow_mut() = Some(turn.clone()));
            Ok(Decision::new(
                Mode::Wait,
                Payload::encode(&turn.number).expect("a number encodes"),
            ))
        }),
    })
    .expect("valid policy")
}

/// Steps `policy` on `turn` and checks the step against the full decode.
pub(crate) fn check(policy: &Policy, turn: &Payload) -> Result<(), TestCaseError> {
    SEEN.with(|seen| seen.borrow_mut().take());
    let stepped = policy
        .start(turn)
        .and_then(|mut execution| execution.step(&[]));
    match turn.decode::<Turn>() {
        Ok(expected) => {
            let Ok(Transition::Complete { output, .. }) = stepped else {
                return Err(TestCaseError::fail(format!(
                    "{turn}: expected a decision, got {stepped:?}"
                )));
            };
            let decision = Decision::new(
                Mode::Wait,
                Payload::encode(&expected.number).expect("test data is valid"),
            );
            prop_assert_eq!(
                output,
                Payload::encode(&decision).expect("test data is valid")
            );
            let seen = SEEN.with(|seen| seen.borrow_mut().take());
            prop_assert_eq!(seen.as_ref(), Some(&expected), "{}", turn);
        }
        Err(error) => {
            let Err(StepError(failure)) = stepped else {
                return Err(TestCaseError::fail(format!(
                    "{turn}: expected {error}, got {stepped:?}"
                )));
            };
            prop_assert_eq!(failure.kind, FailureKind::Contract);
            prop_assert_eq!(failure.code.as_str(), "execution.input.invalid");
            prop_assert_eq!(failure.message, error.to_string());
            prop_assert!(SEEN.with(|seen| seen.borrow().is_none()));
        }
    }
    Ok(())
}

fn workers() -> Vec<Descriptor> {
    vec![
        Descriptor::new(
            "test.double",
            "Doubles.".to_owned(),
            Schema::of::<u64>(),
            Schema::of::<u64>(),
        )
        .expect("test data is valid"),
    ]
}

/// What happens to a task in one turn after it was requested.
#[derive(Clone, Copy, Debug)]
enum Fate {
    Refused,
    Runs,
    Completes,
    Fails,
}

/// A team's history: per turn, how many tasks it requests, which running
/// tasks drain and how, the controls answered, and the state.
#[derive(Clone, Debug)]
struct Step {
    requests: Vec<(Fate, u8)>,
    drains: Vec<(usize, bool)>,
    controls: u8,
    state: u8,
}

fn step() -> impl Strategy<Value = Step> {
    let fate = prop_oneof![
        Just(Fate::Refused),
        Just(Fate::Runs),
        Just(Fate::Completes),
        Just(Fate::Fails),
    ];
    (
        prop::collection::vec((fate, any::<u8>()), 0..6),
        prop::collection::vec((any::<usize>(), any::<bool>()), 0..4),
        0..3u8,
        any::<u8>(),
    )
        .prop_map(|(requests, drains, controls, state)| Step {
            requests,
            drains,
            controls,
            state,
        })
}

fn root(team: &str) -> ProcessId {
    ProcessId::root(&StartId::new("acme", team).expect("test data is valid"))
}

fn outcome(completes: bool, index: usize) -> Termination {
    if completes {
        Termination::completed(
            Payload::encode(&json!({ "sum": index })).expect("test data is valid"),
        )
    } else {
        Termination::failed(Failure::execution(
            "test.failed",
            format!("task {index} \"failed\""),
        ))
    }
}

/// The turns a team would write for `steps`.
fn history(team: &str, steps: &[Step]) -> Vec<Turn> {
    let mut tasks: Vec<Task> = Vec::new();
    let mut turns = Vec::new();
    for (number, step) in steps.iter().enumerate() {
        for (index, completes) in &step.drains {
            let running: Vec<usize> = (0..tasks.len())
                .filter(|i| tasks[*i].is_running())
                .collect();
            if let Some(&at) = running.get(index % running.len().max(1)) {
                tasks[at].outcome = Some(outcome(*completes, at));
            }
        }
        let mut controls = Vec::new();
        for control in 0..step.controls {
            let key = ChildKey::new(format!("{team}-{control}")).expect("test data is valid");
            let result = if control % 2 == 0 {
                Settlement::Succeeded {
                    output: Payload::null(),
                    usage: Meters::default(),
                }
            } else {
                Settlement::Failed {
                    failure: Failure::contract("team.control.refused", "ended"),
                    usage: Meters::default(),
                    retry: None,
                }
            };
            controls.push(ControlReceipt {
                control: Control::cancel(key, "enough"),
                result,
            });
        }
        turns.push(Turn {
            number: number as u64 + 1,
            state: Payload::encode(&json!({ "team": team, "seen": step.state }))
                .expect("test data is valid"),
            workers: workers(),
            tasks: tasks.clone(),
            controls,
        });
        for (fate, input) in &step.requests {
            let key = ChildKey::new(format!("{team}-{}", tasks.len())).expect("test data is valid");
            let mut task = Task::pending(TaskRequest::new(
                key.clone(),
                Name::new("test.double").expect("test data is valid"),
                Payload::encode(&json!([input, "x\u{e9}\n"])).expect("test data is valid"),
            ));
            match fate {
                Fate::Refused => {
                    task.rejection = Some(Failure::contract("engine.child.tree_limit", "full"))
                }
                Fate::Runs => task.process = Some(ProcessId::child(root(team), &key)),
                Fate::Completes | Fate::Fails => {
                    task.process = Some(ProcessId::child(root(team), &key));
                    task.outcome = Some(outcome(matches!(fate, Fate::Completes), tasks.len()));
                }
            }
            tasks.push(task);
        }
    }
    turns
}

/// Ways to corrupt a valid turn that still leave canonical JSON (anything
/// else never reaches a policy: a payload is always canonical).
#[derive(Clone, Debug)]
enum Corruption {
    None,
    UnknownField {
        task: usize,
        top: bool,
    },
    NullMember {
        task: usize,
        member: u8,
    },
    BadKey {
        task: usize,
        key: u8,
    },
    Missing {
        task: usize,
        member: u8,
    },
    Inconsistent {
        task: usize,
    },
    WrongType {
        task: usize,
    },
    /// Not a corruption: the state holds a copy of the turn's first tasks
    /// under the key `tasks`, met before the turn's own list.
    Decoy {
        copied: usize,
    },
}

fn corruption() -> impl Strategy<Value = Corruption> {
    let task = any::<usize>();
    prop_oneof![
        6 => Just(Corruption::None),
        1 => (task, any::<bool>()).prop_map(|(task, top)| Corruption::UnknownField { task, top }),
        1 => (task, 0..4u8).prop_map(|(task, member)| Corruption::NullMember { task, member }),
        1 => (task, 0..3u8).prop_map(|(task, key)| Corruption::BadKey { task, key }),
        1 => (task, 0..5u8).prop_map(|(task, member)| Corruption::Missing { task, member }),
        1 => task.prop_map(|task| Corruption::Inconsistent { task }),
        1 => task.prop_map(|task| Corruption::WrongType { task }),
        2 => any::<usize>().prop_map(|copied| Corruption::Decoy { copied }),
    ]
}

/// The task at `index` (modulo the count), if the turn has tasks.
fn task_at(turn: &mut Value, index: usize) -> Option<&mut serde_json::Map<String, Value>> {
    let tasks = turn["tasks"].as_array_mut()?;
    let count = tasks.len();
    if count == 0 {
        return None;
    }
    tasks[index % count].as_object_mut()
}

fn corrupt(turn: &Turn, corruption: &Corruption) -> Payload {
    let mut value = serde_json::to_value(turn).expect("test data is valid");
    match *corruption {
        Corruption::None => {}
        Corruption::UnknownField { task, top } => match task_at(&mut value, task) {
            Some(task) if !top => {
                task.insert("extra".into(), json!(1));
            }
            _ => {
                value["extra"] = json!(1);
            }
        },
        Corruption::NullMember { task, member } => {
            if member == 3 {
                value["controls"] = Value::Null;
            } else if let Some(task) = task_at(&mut value, task) {
                let member = ["process", "outcome", "rejection"][usize::from(member)];
                task.insert(member.into(), Value::Null);
            }
        }
        Corruption::BadKey { task, key } => {
            if let Some(task) = task_at(&mut value, task) {
                let key = ["", "has space", "x".repeat(200).as_str()][usize::from(key)].to_owned();
                task["request"]["key"] = json!(key);
            }
        }
        Corruption::Missing { task, member } => {
            if member == 4 {
                value
                    .as_object_mut()
                    .expect("test data is valid")
                    .remove("workers");
            } else if let Some(task) = task_at(&mut value, task) {
                match member {
                    0 => task.remove("request"),
                    1 => task["request"]
                        .as_object_mut()
                        .expect("test data is valid")
                        .remove("worker"),
                    2 => task["request"]
                        .as_object_mut()
                        .expect("test data is valid")
                        .remove("input"),
                    _ => task.remove("process"),
                };
            }
        }
        Corruption::Inconsistent { task } => {
            if let Some(task) = task_at(&mut value, task) {
                task.insert(
                    "rejection".into(),
                    json!({"kind": "contract", "code": "x.y", "message": "no"}),
                );
                task.insert("process".into(), json!(format!("p_{}", "0".repeat(32))));
            }
        }
        Corruption::Decoy { copied } => {
            let tasks = value["tasks"].as_array().cloned().unwrap_or_default();
            let copied = copied % (tasks.len() + 1);
            value["state"] = json!({ "tasks": tasks[..copied] });
        }
        Corruption::WrongType { task } => {
            if let Some(task) = task_at(&mut value, task) {
                task.insert("process".into(), json!(7));
            } else {
                value["number"] = json!(-1);
            }
        }
    }
    Payload::from_value(&value).expect("test data is valid")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Two teams' turns interleave through one policy, some corrupted:
    /// every step sees the full decode's turn or fails with its error.
    #[test]
    fn the_memo_never_changes_what_a_step_sees(
        first in prop::collection::vec((step(), corruption()), 1..12),
        second in prop::collection::vec((step(), corruption()), 1..12),
        order in prop::collection::vec(any::<bool>(), 24),
    ) {
        let policy = policy();
        let steps = |history: &[(Step, Corruption)]| -> Vec<Step> {
            history.iter().map(|(step, _)| step.clone()).collect()
        };
        let a: Vec<Payload> = history("a", &steps(&first))
            .iter()
            .zip(&first)
            .map(|(turn, (_, corruption))| corrupt(turn, corruption))
            .collect();
        let b: Vec<Payload> = history("b", &steps(&second))
            .iter()
            .zip(&second)
            .map(|(turn, (_, corruption))| corrupt(turn, corruption))
            .collect();
        let (mut a, mut b) = (a.iter(), b.iter());
        for take_a in order.iter().cycle().take(a.len() + b.len()) {
            let next = if *take_a { a.next().or_else(|| b.next()) } else { b.next().or_else(|| a.next()) };
            if let Some(turn) = next {
                check(&policy, turn)?;
                // The same turn again (a retried coordinator) sees the same.
                check(&policy, turn)?;
            }
        }
    }
}

/// Many teams through one policy at once, each on its own thread: every
/// step sees the full decode's turn.
#[test]
fn concurrent_teams_see_the_full_decode() {
    let policy = policy();
    let threads = 6;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|thread| {
            let policy = policy.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let steps: Vec<Step> = (0..20)
                    .map(|turn| Step {
                        requests: vec![(Fate::Runs, turn); 1 + (turn as usize + thread) % 5],
                        drains: vec![(thread, turn % 3 != 0), (turn as usize, true)],
                        controls: turn % 3,
                        state: turn,
                    })
                    .collect();
                // Several threads share a team name, so their turns share
                // task texts at the same positions until they diverge.
                let team = format!("team{}", thread % 3);
                let turns = history(&team, &steps);
                barrier.wait();
                for turn in &turns {
                    let payload = Payload::encode(turn).expect("test data is valid");
                    check(&policy, &payload).expect("test data is valid");
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().expect("no thread panicked");
    }
}
