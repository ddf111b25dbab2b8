//! The decisions about children: starting one, signaling or canceling
//! one, and settling a wait for some of them.

use std::collections::BTreeMap;

use crate::budget::{Budget, Capabilities, Dimension, Quota};
use crate::digest::Digest;
use crate::failure::{Failure, FailureKind};
use crate::ids::{ChildKey, EffectId, ProcessId};
use crate::log::{Delivery, RecordBody};
use crate::payload::Payload;
use crate::protocol::{
    Boundary, ChildOutcome, ChildSignal, Condition, Execution, Grant, Program, Signal, SignalBody,
};

use super::super::error::SignalError;
use super::super::state::{ProcessState, TreeState};
use super::{InitError, check_signal, initialize, refuse, settle_ok};

/// A child start as its parent declared it.
pub(in crate::engine) struct ChildStart {
    pub key: ChildKey,
    pub program: Digest,
    pub input: Payload,
    pub budget: Budget,
    pub capabilities: Capabilities,
    pub grant: Grant,
}

/// What a child start stages: the record (a refusal or receipt settling the
/// parent's effect, or the child's start), and for a new child its program
/// and restored execution.
pub(in crate::engine) struct ChildStarted {
    pub record: RecordBody,
    pub child: Option<(ProcessId, Program, Box<dyn Execution>)>,
}

impl ChildStarted {
    fn settled(record: RecordBody) -> ChildStarted {
        ChildStarted {
            record,
            child: None,
        }
    }
}

/// Why a parent cannot grant `child` from its budget, if it cannot.
pub(in crate::engine) fn grant_refusal(parent: &ProcessState, child: &Budget) -> Option<String> {
    let mut dimensions = vec![Dimension::Steps, Dimension::Effects, Dimension::Signals];
    dimensions.extend(parent.budget.meters.keys().cloned().map(Dimension::Meter));
    for dimension in dimensions {
        let (have, want) = (parent.budget.quota(&dimension), child.quota(&dimension));
        match (have, want) {
            (Quota::Unlimited, _) => {}
            (Quota::Finite(_), Quota::Unlimited) => {
                return Some(format!(
                    "a finite parent cannot grant unlimited {dimension}"
                ));
            }
            (Quota::Finite(max), Quota::Finite(amount)) => {
                if !parent.allows(&dimension, amount) {
                    return Some(format!(
                        "granting {amount} {dimension} exceeds the parent's remaining {} of {max}",
                        max.saturating_sub(parent.spent(&dimension))
                    ));
                }
            }
        }
    }
    None
}

/// The budget a clipped grant gives: in each dimension the smaller of the
/// request and what the parent has left (an unlimited request under a
/// finite parent gets the remainder), and zero of a meter the parent limits
/// but the request does not name, so that a clipped child never takes from
/// its parent what it did not ask for.
pub(super) fn clip(parent: &ProcessState, request: &Budget) -> Budget {
    let clipped = |dimension: &Dimension, want: Quota| match parent
        .budget
        .quota(dimension)
        .remaining(parent.spent(dimension))
    {
        None => want,
        Some(left) => match want {
            Quota::Unlimited => Quota::Finite(left),
            Quota::Finite(amount) => Quota::Finite(amount.min(left)),
        },
    };
    let mut meters = BTreeMap::new();
    for (name, want) in &request.meters {
        meters.insert(
            name.clone(),
            clipped(&Dimension::Meter(name.clone()), *want),
        );
    }
    for (name, quota) in &parent.budget.meters {
        if quota.is_finite() && !request.meters.contains_key(name) {
            meters.insert(name.clone(), Quota::Finite(0));
        }
    }
    Budget {
        steps: clipped(&Dimension::Steps, request.steps),
        effects: clipped(&Dimension::Effects, request.effects),
        signals: clipped(&Dimension::Signals, request.signals),
        meters,
    }
}

/// Whether `granted` is no larger than `request` in any dimension: what a
/// clipped grant of `request` may have given.
fn within(granted: &Budget, request: &Budget) -> bool {
    let mut dimensions = vec![Dimension::Steps, Dimension::Effects, Dimension::Signals];
    dimensions.extend(granted.meters.keys().cloned().map(Dimension::Meter));
    dimensions.extend(request.meters.keys().cloned().map(Dimension::Meter));
    dimensions.iter().all(
        |dimension| match (granted.quota(dimension), request.quota(dimension)) {
            (_, Quota::Unlimited) => true,
            (Quota::Unlimited, Quota::Finite(_)) => false,
            (Quota::Finite(have), Quota::Finite(want)) => have <= want,
        },
    )
}

/// Why the tree's limits refuse another child of `parent`, if they do.
fn tree_limit(tree: &TreeState, parent: &ProcessState) -> Option<String> {
    let limits = &tree.limits;
    let active = u64::from(parent.live_children);
    if parent.depth + 1 > limits.max_depth {
        Some(format!(
            "depth {} exceeds the limit of {}",
            parent.depth + 1,
            limits.max_depth
        ))
    } else if active >= u64::from(limits.max_active_children) {
        Some(format!(
            "{active} live children reach the limit of {}",
            limits.max_active_children
        ))
    } else if tree.processes.len() as u64 >= limits.max_processes {
        Some(format!(
            "the tree reached its limit of {} processes",
            limits.max_processes
        ))
    } else {
        None
    }
}

/// Starts a child declared by `parent` (running `parent_program`), or
/// settles the start: a receipt for a child started before with the same
/// identity, a refusal for anything the parent may not do.
pub(in crate::engine) fn start_child(
    tree: &TreeState,
    parent_program: &Program,
    parent_id: ProcessId,
    effect: EffectId,
    start: ChildStart,
) -> ChildStarted {
    let parent = &tree.processes[&parent_id];
    let refused = |failure| ChildStarted::settled(refuse(parent_id, effect, failure));
    let ChildStart {
        key,
        program,
        input,
        budget,
        capabilities,
        grant,
    } = start;
    if let Some(existing) = parent.children.get(&key).copied() {
        let child = &tree.processes[&existing];
        // A clipped grant depends on what the parent had left when the
        // child started, so the same start asked again matches any budget
        // the request could have been clipped to.
        let same_budget = match grant {
            Grant::Exact => child.budget == budget,
            Grant::Clipped => within(&child.budget, &budget),
        };
        let same = child.program.digest == program
            && child.input.is_of(&input)
            && same_budget
            && child.capabilities == capabilities;
        return if same {
            let receipt = existing.payload();
            ChildStarted::settled(settle_ok(parent_id, effect, receipt))
        } else {
            refused(Failure::contract(
                "engine.child.identity_conflict",
                format!(
                    "child key {key} was started before with a different program, input, budget or capabilities"
                ),
            ))
        };
    }
    let Some(child_program) = parent_program
        .children()
        .iter()
        .find(|p| p.reference().digest == program)
        .cloned()
    else {
        return refused(Failure::contract(
            "engine.child.program.undeclared",
            format!(
                "{program} is not one of the declared children of {}",
                parent.program.name
            ),
        ));
    };
    if let Err(failure) = child_program.descriptor().check_input(&input) {
        return refused(Failure::contract(
            "engine.child.input.invalid",
            failure.message,
        ));
    }
    let missing = capabilities.missing_from(&parent.capabilities);
    if !missing.is_empty() {
        let names: Vec<&str> = missing.iter().map(|n| n.as_str()).collect();
        return refused(Failure::contract(
            "engine.child.capability_escalation",
            format!("the parent lacks capabilities {}", names.join(", ")),
        ));
    }
    let granted = match grant {
        Grant::Exact => None,
        Grant::Clipped => Some(clip(parent, &budget)).filter(|clipped| *clipped != budget),
    };
    let budget = granted.as_ref().unwrap_or(&budget);
    if let Some(reason) = grant_refusal(parent, budget) {
        return refused(Failure::execution("engine.child.budget_exhausted", reason));
    }
    if let Some(reason) = tree_limit(tree, parent) {
        return refused(Failure::execution("engine.child.tree_limit", reason));
    }
    let (state, execution) = match initialize(&child_program, &input, tree.limits.max_state_bytes) {
        Ok(initialized) => initialized,
        Err(InitError::Program(failure) | InitError::Unrestorable(failure)) => {
            return refused(Failure::new(
                failure.kind,
                "engine.process.start.failed",
                failure.to_string(),
            ));
        }
        Err(InitError::TooLarge { bytes, limit }) => {
            return refused(Failure::execution(
                "engine.child.tree_limit",
                format!("initial state of {bytes} bytes exceeds the limit of {limit}"),
            ));
        }
    };
    let child = ProcessId::child(parent_id, &key);
    // The parent's start effect carries the key, program, input and
    // capabilities, and the budget unless a clipped grant gave less (see
    // `RecordBody::ChildStarted`).
    let record = RecordBody::ChildStarted {
        parent: parent_id,
        effect,
        child,
        key: None,
        name: child_program.descriptor().name().clone(),
        program: None,
        input: None,
        budget: granted,
        capabilities: None,
        state: (state.0 != input).then_some(state),
    };
    ChildStarted {
        record,
        child: Some((child, child_program, execution)),
    }
}

/// Delivers a signal (`Ok`) or a cancellation (`Err(reason)`) to a child:
/// one record carries the delivery and the receipt; a refusal settles the
/// receipt alone and leaves the child unchanged.
pub(in crate::engine) fn control_child(
    tree: &TreeState,
    programs: &BTreeMap<ProcessId, Program>,
    parent: ProcessId,
    effect: EffectId,
    key: &ChildKey,
    control: Result<ChildSignal, String>,
) -> RecordBody {
    let Some(child) = tree.processes[&parent].children.get(key).copied() else {
        return refuse(
            parent,
            effect,
            Failure::contract(
                "engine.child.control.not_owned",
                format!("{key} is not a child of this process"),
            ),
        );
    };
    let delivery = match control {
        Ok(signal) => {
            let signal = Signal {
                id: signal.id,
                wait: signal.wait,
                body: SignalBody::Input {
                    payload: signal.payload,
                },
            };
            match check_signal(tree, programs, child, &signal) {
                Ok(true) => Delivery::Signal { signal },
                // The same signal was delivered before: receipted, not delivered twice.
                Ok(false) => return settle_ok(parent, effect, Payload::null()),
                Err(error) => {
                    let kind = match &error {
                        SignalError::Rejected(failure) => failure.kind,
                        _ => FailureKind::Execution,
                    };
                    let failure =
                        Failure::new(kind, "engine.child.signal.rejected", error.to_string());
                    return refuse(parent, effect, failure);
                }
            }
        }
        Err(reason) => {
            let target = &tree.processes[&child];
            if target.termination.is_some() {
                return refuse(
                    parent,
                    effect,
                    Failure::execution(
                        "engine.child.cancel.rejected",
                        format!("{key} has already terminated"),
                    ),
                );
            }
            if target.cancel.is_some() {
                return settle_ok(parent, effect, Payload::null());
            }
            Delivery::Cancel { reason }
        }
    };
    RecordBody::ControlDelivered {
        parent,
        effect,
        child,
        delivery,
    }
}

/// What settling a children wait stages: the settlement, and the outcomes
/// it encodes, handed to the fold so it need not decode them back.
pub(in crate::engine) struct WaitSettled {
    pub record: RecordBody,
    pub ready: Option<(EffectId, Vec<ChildOutcome>)>,
}

/// A children wait as its process declared it.
pub(in crate::engine) struct ChildrenWait<'a> {
    pub keys: &'a [ChildKey],
    pub boundary: Boundary,
    pub condition: Condition,
}

/// Settles a children wait once its condition holds (`None` while it does
/// not), or refuses one that names a stranger or cannot be met.
pub(in crate::engine) fn wait_children(
    tree: &TreeState,
    id: ProcessId,
    effect: EffectId,
    wait: ChildrenWait<'_>,
) -> Option<WaitSettled> {
    let refused = |message: String| {
        Some(WaitSettled {
            record: refuse(
                id,
                effect,
                Failure::contract("engine.child.wait.invalid", message),
            ),
            ready: None,
        })
    };
    let parent = &tree.processes[&id];
    let mut children = Vec::with_capacity(wait.keys.len());
    for key in wait.keys {
        match parent.children.get(key) {
            Some(child) => children.push((key, *child)),
            None => return refused(format!("{key} is not a child of this process")),
        }
    }
    let needed = match wait.condition {
        Condition::All => wait.keys.len(),
        Condition::Any => 1,
        Condition::Quorum(k) => k as usize,
    };
    if needed > wait.keys.len() || (needed == 0 && wait.condition != Condition::All) {
        return refused(format!(
            "{:?} cannot be met by {} children",
            wait.condition,
            wait.keys.len()
        ));
    }
    let mut ready = Vec::new();
    for (key, child) in children {
        let process = &tree.processes[&child];
        let Some(termination) = &process.termination else {
            continue;
        };
        let termination = match wait.boundary {
            Boundary::Result => termination.clone(),
            Boundary::Drained if tree.drained(child) => {
                let mut unresolved = Vec::new();
                tree.subtree_unresolved(child, &mut unresolved);
                termination.clone().with_unresolved(unresolved)
            }
            Boundary::Drained => continue,
        };
        ready.push(ChildOutcome {
            key: key.clone(),
            process: child,
            termination,
        });
    }
    if ready.len() < needed {
        return None;
    }
    // A wait that ends its batch names its children's outcomes instead of
    // writing them: the log already holds their terminations (see
    // `RecordBody::ChildrenReady`). The engine settles a wait only at its
    // process's frontier, so every effect before it is settled.
    let record = if parent.batch.last().is_some_and(|slot| slot.id == effect) {
        RecordBody::ChildrenReady {
            process: id,
            effect,
        }
    } else {
        settle_ok(
            id,
            effect,
            Payload::encode(&ready).expect("child outcomes encode"),
        )
    };
    Some(WaitSettled {
        record,
        ready: Some((effect, ready)),
    })
}
