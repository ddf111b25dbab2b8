//! A record body's text: exactly what serde writes of [`RecordBody`], with
//! the kinds a run writes most written directly.
//!
//! A short run's records are mostly its tree's start, steps, child starts
//! and settled children waits, and serde's way through the kernel's
//! serializer costs a few hundred instructions a member (each key's escape
//! check and copy, each id's hex text, each number through the generic
//! serializer). Here those kinds' keys are literal text and their ids,
//! numbers and payloads are written in place, as are child starts' and
//! children waits' effects, unlimited budgets and a start's program (its
//! text kept per thread); the rarer members (a state change, a failure, a
//! budget with limits, tree limits, labels, the other effects) and every
//! other kind go through the serializer. Debug builds check every body
//! against serde's text.

use std::sync::Arc;

use super::RecordBody;
use crate::budget::Budget;
use crate::canonical::{Compact, append, number, quoted, to_compact_by, write_str};
use crate::ids::{EffectId, ProcessId};
use crate::protocol::{Boundary, Condition, Effect, Transition};

type Error = serde_json::Error;

/// The body's text: `serde_json::to_vec(body)`.
pub(super) fn encode(body: &RecordBody) -> Arc<[u8]> {
    to_compact_by(body, |compact| write_body(compact, body)).expect("record bodies always encode")
}

fn write_body(compact: &mut Compact<'_>, body: &RecordBody) -> Result<(), Error> {
    match body {
        RecordBody::StepAdopted {
            process,
            step,
            state,
            state_change,
            transition,
        } => {
            compact
                .out
                .push_str("{\"kind\":\"step_adopted\",\"process\":");
            quoted(compact.out, process.text().as_str());
            compact.out.push_str(",\"step\":");
            number(compact.out, *step);
            if let Some(state) = state {
                compact.out.push_str(",\"state\":");
                append(compact.out, state.0.as_str());
            }
            if let Some(change) = state_change {
                compact.out.push_str(",\"state_change\":");
                compact.value(change)?;
            }
            compact.out.push_str(",\"transition\":");
            write_transition(compact, transition)?;
        }
        RecordBody::ChildStarted {
            parent,
            effect,
            child,
            key,
            name,
            program,
            input,
            budget,
            capabilities,
            state,
        } => {
            compact
                .out
                .push_str("{\"kind\":\"child_started\",\"parent\":");
            quoted(compact.out, parent.text().as_str());
            compact.out.push_str(",\"effect\":");
            quoted(compact.out, effect.text().as_str());
            compact.out.push_str(",\"child\":");
            quoted(compact.out, child.text().as_str());
            if let Some(key) = key {
                compact.out.push_str(",\"key\":");
                write_str(compact.out, key.as_str());
            }
            compact.out.push_str(",\"name\":");
            write_str(compact.out, name.as_str());
            if let Some(program) = program {
                compact.out.push_str(",\"program\":");
                quoted(compact.out, program.text().as_str());
            }
            if let Some(input) = input {
                compact.out.push_str(",\"input\":");
                append(compact.out, input.as_str());
            }
            if let Some(budget) = budget {
                compact.out.push_str(",\"budget\":");
                compact.value(budget)?;
            }
            if let Some(capabilities) = capabilities {
                compact.out.push_str(",\"capabilities\":");
                compact.value(capabilities)?;
            }
            if let Some(state) = state {
                compact.out.push_str(",\"state\":");
                append(compact.out, state.0.as_str());
            }
        }
        RecordBody::TreeStarted {
            start,
            root,
            program,
            input,
            budget,
            capabilities,
            deadline,
            limits,
            created,
            labels,
            state,
        } => {
            let Some(program) = super::program_json(program) else {
                return compact.value(body);
            };
            compact
                .out
                .push_str("{\"kind\":\"tree_started\",\"start\":{\"scope\":");
            write_str(compact.out, start.scope.as_str());
            compact.out.push_str(",\"key\":");
            write_str(compact.out, start.key.as_str());
            compact.out.push_str("},\"root\":");
            quoted(compact.out, root.text().as_str());
            compact.out.push_str(",\"program\":");
            append(compact.out, &program);
            compact.out.push_str(",\"input\":");
            append(compact.out, input.as_str());
            compact.out.push_str(",\"budget\":");
            write_budget(compact, budget)?;
            compact.out.push_str(",\"capabilities\":");
            if capabilities.is_empty() {
                compact.out.push_str("[]");
            } else {
                compact.value(capabilities)?;
            }
            if let Some(deadline) = deadline {
                compact.out.push_str(",\"deadline\":");
                number(compact.out, deadline.0);
            }
            if !super::is_default_limits(limits) {
                compact.out.push_str(",\"limits\":");
                compact.value(limits)?;
            }
            if let Some(created) = created {
                compact.out.push_str(",\"created\":");
                number(compact.out, created.0);
            }
            if !labels.is_empty() {
                compact.out.push_str(",\"labels\":");
                compact.value(labels)?;
            }
            compact.out.push_str(",\"state\":");
            append(compact.out, state.0.as_str());
        }
        RecordBody::ChildrenReady { process, effect } => {
            process_effect(compact.out, "children_ready", *process, *effect);
        }
        RecordBody::EffectPending { process, effect } => {
            process_effect(compact.out, "effect_pending", *process, *effect);
        }
        RecordBody::EffectSettled {
            process,
            effect,
            settlement,
        } => {
            process_effect(compact.out, "effect_settled", *process, *effect);
            compact.out.push_str(",\"settlement\":");
            compact.value(settlement)?;
        }
        _ => return compact.value(body),
    }
    compact.out.push('}');
    Ok(())
}

/// The opening of a `kind` record whose first members are a process and
/// one of its effects.
fn process_effect(out: &mut String, kind: &str, process: ProcessId, effect: EffectId) {
    out.push_str("{\"kind\":\"");
    out.push_str(kind);
    out.push_str("\",\"process\":");
    quoted(out, process.text().as_str());
    out.push_str(",\"effect\":");
    quoted(out, effect.text().as_str());
}

fn write_transition(compact: &mut Compact<'_>, transition: &Transition) -> Result<(), Error> {
    match transition {
        Transition::Continue { consumed, effects } => {
            transition_head(compact.out, "continue", *consumed);
            compact.out.push_str(",\"effects\":[");
            for (at, effect) in effects.iter().enumerate() {
                if at > 0 {
                    compact.out.push(',');
                }
                write_effect(compact, effect)?;
            }
            compact.out.push_str("]}");
        }
        Transition::Complete { consumed, output } => {
            transition_head(compact.out, "complete", *consumed);
            compact.out.push_str(",\"output\":");
            append(compact.out, output.as_str());
            compact.out.push('}');
        }
        Transition::Wait { consumed, wait } => {
            transition_head(compact.out, "wait", *consumed);
            compact.out.push_str(",\"wait\":");
            quoted(compact.out, wait.text().as_str());
            compact.out.push('}');
        }
        Transition::Fail { .. } => compact.value(transition)?,
    }
    Ok(())
}

/// The opening of a transition: its tag and the signals it consumed.
fn transition_head(out: &mut String, transition: &str, consumed: usize) {
    out.push_str("{\"transition\":\"");
    out.push_str(transition);
    out.push_str("\",\"consumed\":");
    number(out, consumed as u64);
}

fn write_effect(compact: &mut Compact<'_>, effect: &Effect) -> Result<(), Error> {
    let Effect::StartChild {
        key,
        program,
        input,
        budget,
        capabilities,
        grant,
    } = effect
    else {
        return write_other_effect(compact, effect);
    };
    compact.out.push_str("{\"effect\":\"start_child\",\"key\":");
    write_str(compact.out, key.as_str());
    compact.out.push_str(",\"program\":");
    quoted(compact.out, program.text().as_str());
    compact.out.push_str(",\"input\":");
    append(compact.out, input.as_str());
    compact.out.push_str(",\"budget\":");
    write_budget(compact, budget)?;
    if !capabilities.is_empty() {
        compact.out.push_str(",\"capabilities\":");
        compact.value(capabilities)?;
    }
    if !grant.is_exact() {
        compact.out.push_str(",\"grant\":");
        compact.value(grant)?;
    }
    compact.out.push('}');
    Ok(())
}

/// A children wait directly; the other effects through the serializer.
fn write_other_effect(compact: &mut Compact<'_>, effect: &Effect) -> Result<(), Error> {
    let Effect::WaitChildren {
        keys,
        boundary,
        condition,
    } = effect
    else {
        return compact.value(effect);
    };
    compact
        .out
        .push_str("{\"effect\":\"wait_children\",\"keys\":[");
    for (at, key) in keys.iter().enumerate() {
        if at > 0 {
            compact.out.push(',');
        }
        write_str(compact.out, key.as_str());
    }
    compact.out.push_str("],\"boundary\":");
    compact.out.push_str(match boundary {
        Boundary::Result => "\"result\"",
        Boundary::Drained => "\"drained\"",
    });
    compact.out.push_str(",\"condition\":");
    match condition {
        Condition::All => compact.out.push_str("\"all\""),
        Condition::Any => compact.out.push_str("\"any\""),
        Condition::Quorum(_) => compact.value(condition)?,
    }
    compact.out.push('}');
    Ok(())
}

/// An unlimited budget (every member left out) directly; others through
/// the serializer.
fn write_budget(compact: &mut Compact<'_>, budget: &Budget) -> Result<(), Error> {
    if *budget == Budget::unlimited() {
        compact.out.push_str("{}");
        Ok(())
    } else {
        compact.value(budget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::{Capabilities, TreeLimits};
    use crate::clock::Timestamp;
    use crate::digest::{Digest, Purpose};
    use crate::failure::Failure;
    use crate::ids::{ChildKey, EffectId, Name, ProcessId, StartId, WaitId};
    use crate::labels::Labels;
    use crate::log::StateChange;
    use crate::payload::Payload;
    use crate::protocol::{ExecutionState, Grant, Settlement};

    /// Every kind written directly, with each optional member present and
    /// absent, strings that need escaping, and every transition.
    fn bodies() -> Vec<RecordBody> {
        let process = ProcessId::root(&StartId::new("s", "k").expect("id"));
        let effect = EffectId::new(process, 3, 1);
        let key = ChildKey::new("fan.0").expect("key");
        let child = ProcessId::child(process, &key);
        let payload = |text: &str| Payload::parse_str(text).expect("json");
        let state = |text: &str| ExecutionState(payload(text));
        let program = Digest::of(Purpose::Program, b"child");
        let start = |capabilities: Capabilities, grant: Grant, budget: Budget| Effect::StartChild {
            key: key.clone(),
            program,
            input: payload(r#"{"q":"a \"quoted\"\nline"}"#),
            budget,
            capabilities,
            grant,
        };
        let wait = |keys: Vec<ChildKey>, boundary, condition| Effect::WaitChildren {
            keys,
            boundary,
            condition,
        };
        let other = ChildKey::new("team.turn-3:x").expect("key");
        let effects = vec![
            start(
                Capabilities::none(),
                Grant::Exact,
                Budget::unlimited().with_steps(4),
            ),
            start(
                Capabilities::of([Name::new("net").expect("name")]),
                Grant::Clipped,
                Budget::unlimited(),
            ),
            wait(vec![key.clone()], Boundary::Result, Condition::Quorum(1)),
            wait(
                vec![key.clone(), other.clone()],
                Boundary::Drained,
                Condition::All,
            ),
            wait(Vec::new(), Boundary::Result, Condition::Any),
            Effect::CancelChild {
                key: other,
                reason: "done".into(),
            },
        ];
        let transitions = [
            Transition::Continue {
                consumed: 2,
                effects,
            },
            Transition::Continue {
                consumed: 0,
                effects: Vec::new(),
            },
            Transition::Complete {
                consumed: 1,
                output: payload("[1,null,\"\\u0001\"]"),
            },
            Transition::Wait {
                consumed: 0,
                wait: WaitId::for_effect(effect),
            },
            Transition::Fail {
                consumed: 7,
                failure: Failure::execution("test.fail", "it \"failed\""),
            },
        ];
        let after = state(r#"{"a":2,"b":"xxxxxxxx"}"#);
        let change: StateChange =
            serde_json::from_str(r#"{"front":5,"back":14,"text":"2,\"c\":\"\\n\""}"#)
                .expect("a change");
        let mut bodies: Vec<RecordBody> = transitions
            .into_iter()
            .enumerate()
            .map(|(at, transition)| RecordBody::StepAdopted {
                process,
                step: u64::MAX - at as u64,
                state: (at % 2 == 0).then(|| after.clone()),
                state_change: (at % 2 == 1).then(|| change.clone()),
                transition,
            })
            .collect();
        let started = |recorded: bool| RecordBody::ChildStarted {
            parent: process,
            effect,
            child,
            key: recorded.then(|| key.clone()),
            name: Name::new("bench.branch").expect("name"),
            program: recorded.then_some(program),
            input: recorded.then(|| payload("21")),
            budget: recorded.then(Budget::unlimited),
            capabilities: recorded.then(Capabilities::none),
            state: recorded.then(|| state(r#"{"stage":0}"#)),
        };
        bodies.extend([
            started(true),
            started(false),
            RecordBody::ChildrenReady { process, effect },
            RecordBody::EffectPending { process, effect },
            RecordBody::EffectSettled {
                process,
                effect,
                settlement: Settlement::ok(payload(r#"{"ok":true}"#)),
            },
            RecordBody::EffectReplayed { process, effect },
        ]);
        // Tree starts: every optional member absent (an unlimited budget, no
        // capabilities), then every one present (labels with text to escape).
        let tree = |bare: bool| {
            let start = StartId::new("acme/alice", "s-1.x:2").expect("id");
            RecordBody::TreeStarted {
                root: ProcessId::root(&start),
                start,
                program: Box::new(crate::protocol::ProgramRef {
                    name: Name::new("bench.chain").expect("name"),
                    contract: Digest::of(Purpose::Program, b"contract"),
                    implementation: Digest::ZERO,
                    configuration: Digest::of(Purpose::Program, b"configuration"),
                    children: if bare {
                        Vec::new()
                    } else {
                        vec![program, program]
                    },
                    digest: program,
                }),
                input: payload(r#"{"q":"a \"quoted\"\nline"}"#),
                budget: if bare {
                    Budget::unlimited()
                } else {
                    Budget::unlimited().with_steps(9)
                },
                capabilities: if bare {
                    Capabilities::none()
                } else {
                    Capabilities::of([Name::new("net").expect("name")])
                },
                deadline: (!bare).then_some(Timestamp(u64::MAX)),
                limits: if bare {
                    TreeLimits::default()
                } else {
                    TreeLimits {
                        max_depth: 3,
                        ..TreeLimits::default()
                    }
                },
                created: (!bare).then_some(Timestamp(1_764_000_000_000)),
                labels: if bare {
                    Labels::new()
                } else {
                    Labels::from_pairs([("team", "a \"b\""), ("env", "prod")]).expect("labels")
                },
                state: state(r#"{"stage":0}"#),
            }
        };
        bodies.extend([tree(true), tree(false)]);
        bodies
    }

    #[test]
    fn a_record_body_is_serdes_text_and_reads_back() {
        for body in bodies() {
            let expected = serde_json::to_vec(&body).expect("encodes");
            let text = encode(&body);
            assert_eq!(
                std::str::from_utf8(&text).expect("utf-8"),
                std::str::from_utf8(&expected).expect("utf-8")
            );
            let read: RecordBody = serde_json::from_slice(&text).expect("reads back");
            assert_eq!(read, body);
        }
    }
}
