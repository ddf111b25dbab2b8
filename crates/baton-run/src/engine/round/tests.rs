//! The round's decisions over hand-built trees, without tokio: each test
//! builds a fold by applying records, asks a decision, and checks the
//! records it returns.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use crate::budget::{Budget, Capabilities, Quota, TreeLimits};
use crate::clock::Timestamp;
use crate::descriptor::{Descriptor, Schema};
use crate::engine::state::snapshot;
use crate::failure::StepError;
use crate::ids::{ChildKey, EffectId, Name, ProcessId, SignalId, StartId};
use crate::protocol::{
    Definition, Execution, ExecutionState, Grant, ProgramConfig, Transition, configuration_digest,
    implementation_digest,
};

/// A definition whose every step returns the transition it was built with.
struct Scripted {
    descriptor: Descriptor,
    transition: Transition,
    children: Vec<Program>,
}

struct ScriptedRun {
    transition: Transition,
}

impl Definition for Scripted {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    fn start(&self, _input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(ScriptedRun {
            transition: self.transition.clone(),
        }))
    }

    fn restore(&self, _state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        self.start(&Payload::null())
    }

    fn children(&self) -> Vec<Program> {
        self.children.clone()
    }
}

impl Execution for ScriptedRun {
    fn step(&mut self, _window: &[Signal]) -> Result<Transition, StepError> {
        Ok(self.transition.clone())
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        Ok(ExecutionState(Payload::null()))
    }
}

/// A scripted program (also the engine's own tests').
pub(in crate::engine) fn program(
    name: &str,
    transition: Transition,
    children: Vec<Program>,
) -> Program {
    let descriptor = Descriptor::new(
        name,
        "a scripted test program",
        Schema::any(),
        Schema::any(),
    )
    .expect("valid descriptor");
    Program::new(ProgramConfig {
        definition: Arc::new(Scripted {
            descriptor,
            transition,
            children,
        }),
        dispatcher: None,
        implementation: implementation_digest("round-tests", "1"),
        configuration: configuration_digest(name).expect("encodes"),
    })
}

fn complete() -> Transition {
    Transition::Complete {
        consumed: 0,
        output: Payload::null(),
    }
}

/// A tree whose root runs `root` with `budget`, as its start record makes it.
fn tree(root: &Program, budget: Budget) -> TreeState {
    let start = StartId::new("acme", "round").expect("valid");
    let body = RecordBody::TreeStarted {
        root: ProcessId::root(&start),
        start,
        program: Box::new(root.reference().clone()),
        input: Payload::null(),
        budget,
        capabilities: Capabilities::none(),
        deadline: Some(Timestamp(1_000)),
        limits: TreeLimits::default(),
        created: None,
        labels: crate::labels::Labels::new(),
        state: ExecutionState(Payload::null()),
    };
    TreeState::started(&body).expect("a start record folds")
}

/// Adopts a step of `id` declaring `effects`, as the engine would stage it.
fn declare(tree: &mut TreeState, id: ProcessId, effects: Vec<Effect>) -> Vec<EffectId> {
    let step = tree.processes[&id].steps;
    let ids = (0..effects.len())
        .map(|index| EffectId::new(id, step, index as u32))
        .collect();
    let body = RecordBody::StepAdopted {
        process: id,
        step,
        state: Some(ExecutionState(Payload::null())),
        state_change: None,
        transition: Transition::Continue {
            consumed: 0,
            effects,
        },
    };
    tree.apply(&body).expect("the step applies");
    ids
}

struct NoFlights;

impl Flights for NoFlights {
    fn carries(&self, _effect: EffectId) -> bool {
        false
    }

    fn any_of(&self, _process: ProcessId) -> bool {
        false
    }
}

const FREE: Pass = Pass {
    hold_waits: false,
    may_step: true,
    now: Timestamp(0),
};

fn settled_code(record: &RecordBody) -> Option<&str> {
    match record {
        RecordBody::EffectSettled {
            settlement: Settlement::Failed { failure, .. },
            ..
        } => Some(failure.code()),
        _ => None,
    }
}

/// An exact start of `child` under `key` with `input`, unlimited and
/// without capabilities.
fn exact_start(child: &Program, key: &str, input: Payload) -> Effect {
    Effect::StartChild {
        key: ChildKey::new(key).expect("valid"),
        program: child.reference().digest,
        input,
        budget: Budget::unlimited(),
        capabilities: Capabilities::none(),
        grant: Grant::Exact,
    }
}

/// What the round stages for the child start at the frontier of `id`.
fn staged_start(tree: &TreeState, root: &Program, id: ProcessId) -> children::ChildStarted {
    let Next::StartChild { effect, start } = next(tree, id, &NoFlights, FREE) else {
        panic!("the frontier is a child start");
    };
    start_child(tree, root, id, effect, start)
}

#[test]
fn a_runnable_root_steps_only_when_the_commit_has_room_and_its_completion_is_adopted() {
    let root = program("test.root", complete(), Vec::new());
    let tree = tree(&root, Budget::unlimited());
    let id = tree.root;
    assert!(matches!(next(&tree, id, &NoFlights, FREE), Next::Step));
    assert!(matches!(
        next(
            &tree,
            id,
            &NoFlights,
            Pass {
                may_step: false,
                ..FREE
            }
        ),
        Next::Idle
    ));
    let stepped = step(&tree, id, &root, None);
    assert!(
        stepped.keep.is_none(),
        "a completed process keeps no execution"
    );
    assert!(matches!(
        stepped.record,
        RecordBody::StepAdopted {
            transition: Transition::Complete { .. },
            ..
        }
    ));
}

/// A step's record holds its state whole or as a change, exactly one: a
/// record with both or neither is inconsistent, and folding it changes
/// nothing.
#[test]
fn a_step_record_with_both_or_neither_state_forms_is_inconsistent() {
    let root = program("test.root", complete(), Vec::new());
    let before = tree(&root, Budget::unlimited());
    let id = before.root;
    let whole = ExecutionState(Payload::encode(&"x".repeat(5_000)).expect("encodes"));
    let edited =
        ExecutionState(Payload::encode(&format!("{}y", "x".repeat(4_999))).expect("encodes"));
    let mut started = before.clone();
    started.processes.get_mut(&id).expect("the root").state = whole.clone();
    let change = crate::log::StateChange::between(&whole, &edited).expect("a small change");
    for (state, state_change) in [(None, None), (Some(edited.clone()), Some(change.clone()))] {
        let body = RecordBody::StepAdopted {
            process: id,
            step: 0,
            state,
            state_change,
            transition: complete(),
        };
        let mut folded = started.clone();
        let error = folded.apply(&body).expect_err("inconsistent");
        assert!(error.0.contains("whole or as a change"), "{}", error.0);
        assert_eq!(folded.processes[&id].steps, 0, "nothing was folded");
    }
    let body = RecordBody::StepAdopted {
        process: id,
        step: 0,
        state: None,
        state_change: Some(change),
        transition: complete(),
    };
    let mut folded = started.clone();
    folded.apply(&body).expect("a change folds");
    assert_eq!(folded.processes[&id].state, edited);
}

#[test]
fn a_step_over_its_budget_fails_the_process_with_engine_limit_steps() {
    let root = program("test.root", complete(), Vec::new());
    let budget = Budget {
        steps: Quota::Finite(0),
        ..Budget::unlimited()
    };
    let tree = tree(&root, budget);
    let stepped = step(&tree, tree.root, &root, None);
    let RecordBody::Terminated { termination, .. } = &stepped.record else {
        panic!("expected a termination, got {:?}", stepped.record);
    };
    assert_eq!(
        termination.failure().map(|f| f.code()),
        Some("engine.limit.steps")
    );
}

#[test]
fn a_finite_parent_cannot_grant_an_unlimited_or_larger_budget() {
    let root = program("test.root", complete(), Vec::new());
    let budget = Budget {
        steps: Quota::Finite(10),
        ..Budget::unlimited()
    };
    let tree = tree(&root, budget);
    let parent = &tree.processes[&tree.root];
    let unlimited = grant_refusal(parent, &Budget::unlimited());
    assert!(unlimited.is_some_and(|reason| reason.contains("unlimited steps")));
    let larger = Budget {
        steps: Quota::Finite(11),
        ..Budget::unlimited()
    };
    assert!(grant_refusal(parent, &larger).is_some());
    let fitting = Budget {
        steps: Quota::Finite(10),
        ..Budget::unlimited()
    };
    assert_eq!(grant_refusal(parent, &fitting), None);
}

#[test]
fn a_clipped_grant_takes_at_most_what_the_parent_has_left_and_nothing_it_did_not_ask_for() {
    let root = program("test.root", complete(), Vec::new());
    let tokens = crate::ids::Name::new("tokens").expect("valid");
    let cost = crate::ids::Name::new("cost_micros").expect("valid");
    let calls = crate::ids::Name::new("calls").expect("valid");
    let budget = Budget::unlimited()
        .with_steps(10)
        .with_effects(5)
        .with_meter(tokens.clone(), 100)
        .with_meter(cost.clone(), 50);
    let mut tree = tree(&root, budget);
    let id = tree.root;
    // One declared effect charges one effect and one signal.
    declare(&mut tree, id, vec![Effect::dispatch(Payload::null())]);
    let parent = &tree.processes[&id];
    let request = Budget {
        steps: Quota::Finite(4),
        effects: Quota::Unlimited,
        signals: Quota::Finite(3),
        meters: BTreeMap::from([
            (tokens.clone(), Quota::Unlimited),
            (calls.clone(), Quota::Finite(7)),
        ]),
    };
    let granted = super::children::clip(parent, &request);
    assert_eq!(
        granted.steps,
        Quota::Finite(4),
        "less than the parent has left"
    );
    assert_eq!(
        granted.effects,
        Quota::Finite(4),
        "an unlimited request gets the remainder"
    );
    assert_eq!(
        granted.signals,
        Quota::Finite(3),
        "an unlimited parent grants the request"
    );
    assert_eq!(granted.meter(&tokens), Quota::Finite(100));
    assert_eq!(
        granted.meter(&cost),
        Quota::Finite(0),
        "a meter not asked for is not granted"
    );
    assert_eq!(granted.meter(&calls), Quota::Finite(7));
    assert_eq!(
        grant_refusal(parent, &granted),
        None,
        "a clipped grant is affordable"
    );
}

#[test]
fn a_clipped_start_starts_under_a_small_parent_and_starting_it_again_is_the_same_child() {
    let child = program("test.child", complete(), Vec::new());
    let root = program("test.root", complete(), vec![child.clone()]);
    let mut tree = tree(&root, Budget::unlimited().with_steps(6));
    let id = tree.root;
    let key = ChildKey::new("tool").expect("valid");
    let start_of = |grant: Grant| Effect::StartChild {
        key: key.clone(),
        program: child.reference().digest,
        input: Payload::null(),
        budget: Budget::unlimited().with_steps(8),
        capabilities: Capabilities::none(),
        grant,
    };
    declare(&mut tree, id, vec![start_of(Grant::Exact)]);
    let Next::StartChild { effect, start } = next(&tree, id, &NoFlights, FREE) else {
        panic!("the frontier is the child start");
    };
    let refused = start_child(&tree, &root, id, effect, start);
    assert_eq!(
        settled_code(&refused.record),
        Some("engine.child.budget_exhausted"),
        "an exact grant over the parent's budget is refused"
    );
    tree.apply(&refused.record).expect("the refusal applies");
    declare(&mut tree, id, vec![start_of(Grant::Clipped)]);
    let Next::StartChild { effect, start } = next(&tree, id, &NoFlights, FREE) else {
        panic!("the frontier is the clipped start");
    };
    let started = start_child(&tree, &root, id, effect, start);
    let RecordBody::ChildStarted { budget, .. } = &started.record else {
        panic!("expected a started child, got {:?}", started.record);
    };
    assert_eq!(
        budget.as_ref().map(|budget| budget.steps),
        Some(Quota::Finite(4)),
        "clipped to what the parent had left after its two steps, and recorded"
    );
    tree.apply(&started.record).expect("the start applies");
    let started_child = tree.processes[&id].children[&key];
    assert_eq!(
        tree.processes[&started_child].budget.steps,
        Quota::Finite(4),
        "the child folds the clipped grant, not the one asked for"
    );
    assert!(
        !tree.processes[&id].allows(&crate::budget::Dimension::Steps, 1),
        "the grant is debited from the parent"
    );
    declare(
        &mut tree,
        id,
        vec![start_of(Grant::Clipped), start_of(Grant::Exact)],
    );
    let Next::StartChild { effect, start } = next(&tree, id, &NoFlights, FREE) else {
        panic!("the frontier is the repeated clipped start");
    };
    let again = start_child(&tree, &root, id, effect, start);
    assert!(again.child.is_none());
    assert!(
        matches!(
            &again.record,
            RecordBody::EffectSettled {
                settlement: Settlement::Succeeded { .. },
                ..
            }
        ),
        "the same clipped start is the existing child: {:?}",
        again.record
    );
    tree.apply(&again.record).expect("the receipt applies");
    let Next::StartChild { effect, start } = next(&tree, id, &NoFlights, FREE) else {
        panic!("the frontier is the repeated exact start");
    };
    let conflict = start_child(&tree, &root, id, effect, start);
    assert_eq!(
        settled_code(&conflict.record),
        Some("engine.child.identity_conflict"),
        "an exact start must match the granted budget exactly"
    );
    tree.apply(&conflict.record).expect("the refusal applies");
    // The tree's snapshot (a child, its grant, settlements, budgets) and
    // the records are written by the kernel's own writer, as serde_json
    // writes them.
    assert_eq!(
        crate::canonical::compact_only(&tree).expect("written without serde_json"),
        serde_json::to_vec(&tree).expect("encodes")
    );
    for record in [
        &refused.record,
        &started.record,
        &again.record,
        &conflict.record,
    ] {
        assert_eq!(
            crate::canonical::compact_only(record).expect("written without serde_json"),
            serde_json::to_vec(record).expect("encodes")
        );
    }
}

#[test]
fn a_child_start_is_refused_for_an_undeclared_program_and_started_for_a_declared_one() {
    let child = program("test.child", complete(), Vec::new());
    let stranger = program("test.stranger", complete(), Vec::new());
    let root = program("test.root", complete(), vec![child.clone()]);
    let mut tree = tree(&root, Budget::unlimited());
    let id = tree.root;
    let start_of = |program: &Program, key: &str| Effect::StartChild {
        key: ChildKey::new(key).expect("valid"),
        program: program.reference().digest,
        input: Payload::null(),
        budget: Budget::unlimited(),
        capabilities: Capabilities::none(),
        grant: Grant::Exact,
    };
    let effects = declare(
        &mut tree,
        id,
        vec![start_of(&stranger, "a"), start_of(&child, "b")],
    );
    let Next::StartChild { effect, start } = next(&tree, id, &NoFlights, FREE) else {
        panic!("the frontier is a child start");
    };
    assert_eq!(effect, effects[0]);
    let refused = start_child(&tree, &root, id, effect, start);
    assert!(refused.child.is_none());
    assert_eq!(
        settled_code(&refused.record),
        Some("engine.child.program.undeclared")
    );
    tree.apply(&refused.record).expect("the refusal applies");
    let Next::StartChild { effect, start } = next(&tree, id, &NoFlights, FREE) else {
        panic!("the frontier is the second child start");
    };
    let started = start_child(&tree, &root, id, effect, start);
    let Some((child_id, _, _)) = &started.child else {
        panic!("expected a started child, got {:?}", started.record);
    };
    assert_eq!(
        *child_id,
        ProcessId::child(id, &ChildKey::new("b").expect("valid"))
    );
    assert!(matches!(started.record, RecordBody::ChildStarted { .. }));
}

#[test]
fn a_started_child_takes_what_its_parents_start_effect_declared() {
    let child = program("test.child", complete(), Vec::new());
    let root = program("test.root", complete(), vec![child.clone()]);
    let mut tree = tree(&root, Budget::unlimited());
    let id = tree.root;
    let input = Payload::parse_str(r#"{"turn":["first task","second task"]}"#).expect("json");
    let key = ChildKey::new("coordinator").expect("valid");
    declare(
        &mut tree,
        id,
        vec![exact_start(&child, key.as_str(), input.clone())],
    );
    let started = staged_start(&tree, &root, id);
    let RecordBody::ChildStarted {
        key: written_key,
        program: written_program,
        input: written_input,
        budget: written_budget,
        capabilities: written_capabilities,
        ..
    } = &started.record
    else {
        panic!("expected a started child, got {:?}", started.record);
    };
    assert_eq!(
        (
            written_key,
            written_program,
            written_input,
            written_budget,
            written_capabilities
        ),
        (&None, &None, &None, &None, &None),
        "the start effect already holds them"
    );
    let text = crate::canonical::to_text(&started.record).expect("encodes");
    for repeated in ["task", "coordinator", "b3:", "budget", "capabilities"] {
        assert!(
            !text.contains(repeated),
            "{repeated} is written once, in the parent's step: {text}"
        );
    }
    let child_id = ProcessId::child(id, &key);
    let mut folded = tree.clone();
    folded.apply(&started.record).expect("the start applies");
    let folded_child = &folded.processes[&child_id];
    assert_eq!(folded_child.input.digest(), input.digest());
    assert_eq!(folded_child.key.as_ref(), Some(&key));
    assert_eq!(folded_child.program.digest, child.reference().digest);
    assert_eq!(folded_child.budget, Budget::unlimited());
    assert_eq!(folded_child.capabilities, Capabilities::none());
    assert_eq!(folded.processes[&id].children.get(&key), Some(&child_id));

    // Logs written before the record named these by the effect carry
    // them: the declared ones fold the same, others are a corruption.
    let carrying = |edit: &dyn Fn(&mut RecordBody)| {
        let mut record = started.record.clone();
        edit(&mut record);
        record
    };
    let declared = carrying(&|record| {
        if let RecordBody::ChildStarted {
            key: k,
            program,
            input: i,
            budget,
            capabilities,
            ..
        } = record
        {
            *k = Some(key.clone());
            *program = Some(child.reference().digest);
            *i = Some(input.clone());
            *budget = Some(Budget::unlimited());
            *capabilities = Some(Capabilities::none());
        }
    });
    let older_text = crate::canonical::to_text(&declared).expect("encodes");
    assert!(
        older_text.contains(r#""key":"coordinator""#) && older_text.contains(r#""budget":{}"#),
        "{older_text}"
    );
    let read: RecordBody = serde_json::from_str(&older_text).expect("an older record reads");
    assert_eq!(read, declared, "an older record reads as written");
    let mut older = tree.clone();
    older
        .apply(&read)
        .expect("an older record carrying the declared start applies");
    assert_eq!(
        snapshot::encode(&older),
        snapshot::encode(&folded),
        "an older record folds to the same tree"
    );
    let other_key = ChildKey::new("other").expect("valid");
    type Edit<'e> = &'e dyn Fn(&mut RecordBody);
    let edits: [(&str, Edit<'_>); 4] = [
        ("key", &|record| {
            if let RecordBody::ChildStarted { key, .. } = record {
                *key = Some(other_key.clone());
            }
        }),
        ("program", &|record| {
            if let RecordBody::ChildStarted { program, .. } = record {
                *program = Some(root.reference().digest);
            }
        }),
        ("input", &|record| {
            if let RecordBody::ChildStarted { input, .. } = record {
                *input = Some(Payload::null());
            }
        }),
        ("capabilities", &|record| {
            if let RecordBody::ChildStarted { capabilities, .. } = record {
                *capabilities = Some(Capabilities::of([Name::new("net").expect("valid")]));
            }
        }),
    ];
    for (what, edit) in edits {
        let mut edited = tree.clone();
        let error = edited
            .apply(&carrying(edit))
            .expect_err("a start the effect did not declare is refused");
        assert!(error.0.contains(what), "{what}: {error}");
        assert_eq!(
            snapshot::encode(&edited),
            snapshot::encode(&tree),
            "{what}: the refused record changed nothing"
        );
    }
}

#[test]
fn a_started_child_whose_initial_state_is_its_input_is_recorded_without_it() {
    // The scripted program's initial state is `null`: the input of one
    // child, not of the other.
    let child = program("test.child", complete(), Vec::new());
    let root = program("test.root", complete(), vec![child.clone()]);
    let mut tree = tree(&root, Budget::unlimited());
    let id = tree.root;
    let other = Payload::parse_str("[1,2]").expect("json");
    declare(
        &mut tree,
        id,
        vec![
            exact_start(&child, "same", Payload::null()),
            exact_start(&child, "other", other),
        ],
    );
    let mut records = Vec::new();
    for _ in 0..2 {
        let started = staged_start(&tree, &root, id);
        tree.apply(&started.record).expect("the start applies");
        records.push(started.record);
    }
    let states: Vec<_> = records
        .iter()
        .map(|record| match record {
            RecordBody::ChildStarted { state, .. } => state.clone(),
            other => panic!("expected a started child, got {other:?}"),
        })
        .collect();
    assert_eq!(
        states,
        vec![None, Some(ExecutionState(Payload::null()))],
        "only a state other than the input is written"
    );
    for key in ["same", "other"] {
        let child = ProcessId::child(id, &ChildKey::new(key).expect("valid"));
        assert_eq!(
            tree.processes[&child].state,
            ExecutionState(Payload::null()),
            "{key} folds to the state its program started with"
        );
    }
}

#[test]
fn a_children_wait_settles_only_once_its_condition_holds() {
    let child = program("test.child", complete(), Vec::new());
    let root = program("test.root", complete(), vec![child.clone()]);
    let mut tree = tree(&root, Budget::unlimited());
    let id = tree.root;
    let key = ChildKey::new("c").expect("valid");
    let effects = declare(
        &mut tree,
        id,
        vec![
            Effect::StartChild {
                key: key.clone(),
                program: child.reference().digest,
                input: Payload::null(),
                budget: Budget::unlimited(),
                capabilities: Capabilities::none(),
                grant: Grant::Exact,
            },
            Effect::WaitChildren {
                keys: vec![key.clone()],
                boundary: Boundary::Result,
                condition: Condition::All,
            },
        ],
    );
    let Next::StartChild { effect, start } = next(&tree, id, &NoFlights, FREE) else {
        panic!("the frontier is the child start");
    };
    let started = start_child(&tree, &root, id, effect, start);
    tree.apply(&started.record).expect("the start applies");
    assert!(
        matches!(
            next(
                &tree,
                id,
                &NoFlights,
                Pass {
                    hold_waits: true,
                    ..FREE
                }
            ),
            Next::Idle
        ),
        "a held round leaves the wait alone"
    );
    let wait = ChildrenWait {
        keys: std::slice::from_ref(&key),
        boundary: Boundary::Result,
        condition: Condition::All,
    };
    assert!(wait_children(&tree, id, effects[1], wait).is_none());
    let child_id = ProcessId::child(id, &key);
    let ended = end(&tree.processes[&child_id], child_id, Cause::Kill, "test");
    tree.apply(&ended).expect("the child's end applies");
    let wait = ChildrenWait {
        keys: std::slice::from_ref(&key),
        boundary: Boundary::Result,
        condition: Condition::All,
    };
    let settled = wait_children(&tree, id, effects[1], wait).expect("the wait settles");
    let (_, ready) = settled.ready.expect("the outcomes are handed to the fold");
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0].key, key);
    let impossible = ChildrenWait {
        keys: std::slice::from_ref(&key),
        boundary: Boundary::Result,
        condition: Condition::Quorum(2),
    };
    let refused = wait_children(&tree, id, effects[1], impossible).expect("refused at once");
    assert_eq!(
        settled_code(&refused.record),
        Some("engine.child.wait.invalid")
    );
}

/// The root of a tree whose batch starts `keys` and then waits for all of
/// them, with `then` after the wait; the children started and ended.
fn ended_children_wait(keys: &[&str], then: Vec<Effect>) -> (TreeState, Vec<EffectId>) {
    let child = program("test.child", complete(), Vec::new());
    let root = program("test.root", complete(), vec![child.clone()]);
    let mut tree = tree(&root, Budget::unlimited());
    let id = tree.root;
    let mut batch: Vec<Effect> = keys
        .iter()
        .map(|key| exact_start(&child, key, Payload::null()))
        .collect();
    batch.push(Effect::WaitChildren {
        keys: keys
            .iter()
            .map(|key| ChildKey::new(*key).expect("valid"))
            .collect(),
        boundary: Boundary::Result,
        condition: Condition::All,
    });
    batch.extend(then);
    let effects = declare(&mut tree, id, batch);
    for key in keys {
        let started = staged_start(&tree, &root, id);
        tree.apply(&started.record).expect("the start applies");
        let child_id = ProcessId::child(id, &ChildKey::new(*key).expect("valid"));
        let ended = end(&tree.processes[&child_id], child_id, Cause::Kill, "test");
        tree.apply(&ended).expect("the child's end applies");
    }
    (tree, effects)
}

fn all_of(keys: &[ChildKey]) -> ChildrenWait<'_> {
    ChildrenWait {
        keys,
        boundary: Boundary::Result,
        condition: Condition::All,
    }
}

#[test]
fn a_wait_that_ends_its_batch_names_its_children_instead_of_writing_their_outcomes() {
    let (tree, effects) = ended_children_wait(&["a", "b"], Vec::new());
    let id = tree.root;
    let wait = effects[2];
    let keys = [
        ChildKey::new("a").expect("valid"),
        ChildKey::new("b").expect("valid"),
    ];
    let settled = wait_children(&tree, id, wait, all_of(&keys)).expect("the wait settles");
    assert_eq!(
        settled.record,
        RecordBody::ChildrenReady {
            process: id,
            effect: wait
        }
    );
    let (_, outcomes) = settled
        .ready
        .clone()
        .expect("the outcomes are handed to the fold");
    assert_eq!(outcomes.len(), 2);
    let text = crate::canonical::to_text(&settled.record).expect("encodes");
    assert!(!text.contains("termination"), "{text}");

    // Live, with the outcomes handed over; recovering, from the tree; and
    // from the form older logs hold: the same tree, the outcomes delivered.
    let mut live = tree.clone();
    live.apply_with(&settled.record, settled.ready)
        .expect("the wait's end applies");
    let mut recovered = tree.clone();
    recovered
        .apply(&settled.record)
        .expect("it folds from the log alone");
    let mut older = tree.clone();
    older
        .apply(&settle_ok(
            id,
            wait,
            Payload::encode(&outcomes).expect("encodes"),
        ))
        .expect("the older form applies");
    for folded in [&recovered, &older] {
        assert_eq!(snapshot::encode(folded), snapshot::encode(&live));
    }
    let root = &live.processes[&id];
    assert!(root.batch.is_empty(), "the batch ended");
    assert!(root.mailbox.iter().any(|signal| matches!(
        &signal.body,
        SignalBody::ChildrenReady { effect, children } if *effect == wait && *children == outcomes
    )));

    // Before the children end the wait is not met: the record is refused
    // and the tree left as it was.
    let (mut early, _) = ended_children_wait(&["a", "b"], Vec::new());
    let b = ProcessId::child(id, &keys[1]);
    early.processes.get_mut(&b).expect("b").termination = None;
    let before = snapshot::encode(&early);
    let error = early.apply(&settled.record).expect_err("not met yet");
    assert!(error.0.contains("not met"), "{error}");
    assert_eq!(snapshot::encode(&early), before);
}

#[test]
fn a_wait_followed_by_another_effect_writes_its_outcomes_and_cannot_be_named_ready() {
    let child = program("test.child", complete(), Vec::new());
    let then = vec![exact_start(&child, "later", Payload::null())];
    let (tree, effects) = ended_children_wait(&["a"], then);
    let id = tree.root;
    let keys = [ChildKey::new("a").expect("valid")];
    let settled = wait_children(&tree, id, effects[1], all_of(&keys)).expect("settles");
    assert!(
        matches!(&settled.record, RecordBody::EffectSettled {
            settlement: Settlement::Succeeded { output, .. }, ..
        } if output.as_str().contains("termination")),
        "{:?}",
        settled.record
    );
    let mut named = tree.clone();
    let before = snapshot::encode(&named);
    let error = named
        .apply(&RecordBody::ChildrenReady {
            process: id,
            effect: effects[1],
        })
        .expect_err("a wait that does not end its batch is not named ready");
    assert!(error.0.contains("ending its batch"), "{error}");
    assert_eq!(snapshot::encode(&named), before);
}

#[test]
fn a_kill_ends_the_process_and_every_live_descendant_parents_first() {
    let child = program("test.child", complete(), Vec::new());
    let root = program("test.root", complete(), vec![child.clone()]);
    let mut tree = tree(&root, Budget::unlimited());
    let id = tree.root;
    declare(
        &mut tree,
        id,
        vec![exact_start(&child, "c", Payload::null())],
    );
    let started = staged_start(&tree, &root, id);
    tree.apply(&started.record).expect("the start applies");
    let mut records = Vec::new();
    kill(&tree, id, &mut records);
    let ended: Vec<ProcessId> = records
        .iter()
        .map(|record| match record {
            RecordBody::Terminated { process, .. } => *process,
            other => panic!("a kill stages terminations only, got {other:?}"),
        })
        .collect();
    let child_id = ProcessId::child(id, &ChildKey::new("c").expect("valid"));
    assert_eq!(ended, vec![id, child_id]);
}

#[test]
fn a_deadline_ends_every_live_process_only_once_passed() {
    let root = program("test.root", complete(), Vec::new());
    let tree = tree(&root, Budget::unlimited());
    assert!(deadline(&tree, Timestamp(999)).is_empty());
    let records = deadline(&tree, Timestamp(1_000));
    assert_eq!(records.len(), 1);
    let RecordBody::Terminated { termination, .. } = &records[0] else {
        panic!("expected a termination");
    };
    assert_eq!(termination.status(), crate::failure::Status::TimedOut);
}

#[test]
fn a_host_signal_is_checked_before_anything_is_written() {
    let root = program("test.root", complete(), Vec::new());
    let tree = tree(&root, Budget::unlimited());
    let programs = BTreeMap::from([(tree.root, root.clone())]);
    let unaddressed = Signal {
        id: SignalId::new("s-1").expect("valid"),
        wait: None,
        body: SignalBody::Input {
            payload: Payload::null(),
        },
    };
    // The descriptor's signal schema rejects unaddressed input by default.
    let refused = check_signal(&tree, &programs, tree.root, &unaddressed);
    assert!(matches!(refused, Err(SignalError::Rejected(_))));
    let stranger = ProcessId::child(tree.root, &ChildKey::new("x").expect("valid"));
    assert!(matches!(
        check_signal(&tree, &programs, stranger, &unaddressed),
        Err(SignalError::Terminated { .. })
    ));
}

#[test]
fn only_an_unknown_effect_can_be_resolved() {
    let root = program("test.root", complete(), Vec::new());
    let tree = tree(&root, Budget::unlimited());
    let effect = EffectId::new(tree.root, 0, 0);
    assert!(matches!(
        unknown(&tree, effect),
        Err(ControlError::NotUnknown { .. })
    ));
}
