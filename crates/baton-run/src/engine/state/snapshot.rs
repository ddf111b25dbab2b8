//! A tree's snapshot text: exactly what serde writes of [`TreeState`], with
//! the members every process has written directly.
//!
//! A large tree's snapshot is mostly its processes (a team of a thousand
//! tasks holds a thousand finished workers), and serde's way through the
//! kernel's serializer costs a few hundred instructions a member: each
//! key's escape check and copy, each id's hex text and each number passing
//! through the generic serializer. Here each process's keys are literal
//! text, its ids and counts are written in place, and only the members a
//! finished process rarely has (a mailbox, open waits, a batch, a
//! cancellation, its termination) and the small structs (budget,
//! capabilities, usage with meters) go through the serializer. Debug
//! builds check every snapshot against serde's text.

use std::sync::Arc;

use super::{ProcessState, TreeState};
use crate::budget::Usage;
use crate::canonical::{Compact, append, number, quoted, to_compact_by, write_str};

type Error = serde_json::Error;

/// The snapshot of `tree`: `serde_json::to_vec(tree)`.
pub(crate) fn encode(tree: &TreeState) -> Arc<[u8]> {
    to_compact_by(tree, |out| write_tree(out, tree)).expect("tree state always encodes")
}

fn write_tree(compact: &mut Compact<'_>, tree: &TreeState) -> Result<(), Error> {
    // Every member by name: a member added to the state is a compile error
    // here until it is written.
    let TreeState {
        start,
        root,
        deadline,
        limits,
        created,
        labels,
        history_bytes,
        processes,
    } = tree;
    compact.out.push_str("{\"start\":");
    compact.value(start)?;
    compact.out.push_str(",\"root\":");
    quoted(compact.out, root.text().as_str());
    if let Some(deadline) = deadline {
        compact.out.push_str(",\"deadline\":");
        compact.value(deadline)?;
    }
    compact.out.push_str(",\"limits\":");
    compact.value(limits)?;
    if let Some(created) = created {
        compact.out.push_str(",\"created\":");
        compact.value(created)?;
    }
    if !labels.is_empty() {
        compact.out.push_str(",\"labels\":");
        compact.value(labels)?;
    }
    compact.out.push_str(",\"history_bytes\":");
    number(compact.out, *history_bytes);
    compact.out.push_str(",\"processes\":{");
    for (at, (id, process)) in processes.iter().enumerate() {
        if at > 0 {
            compact.out.push(',');
        }
        quoted(compact.out, id.text().as_str());
        compact.out.push(':');
        write_process(compact, process)?;
    }
    compact.out.push_str("}}");
    Ok(())
}

fn write_process(compact: &mut Compact<'_>, process: &ProcessState) -> Result<(), Error> {
    let ProcessState {
        parent,
        key,
        depth,
        children,
        granted,
        live_children,
        program,
        input,
        budget,
        capabilities,
        usage,
        status,
        steps,
        state,
        mailbox,
        consumed,
        receipts,
        batch,
        waiting,
        waits,
        answered,
        cancel,
        termination,
    } = process;
    let out = &mut *compact.out;
    out.push('{');
    if let Some(parent) = parent {
        out.push_str("\"parent\":");
        quoted(out, parent.text().as_str());
        out.push(',');
    }
    if let Some(key) = key {
        out.push_str("\"key\":");
        write_str(out, key.as_str());
        out.push(',');
    }
    out.push_str("\"depth\":");
    number(out, u64::from(*depth));
    if !children.is_empty() {
        out.push_str(",\"children\":{");
        for (at, (key, child)) in children.iter().enumerate() {
            if at > 0 {
                out.push(',');
            }
            write_str(out, key.as_str());
            out.push(':');
            quoted(out, child.text().as_str());
        }
        out.push('}');
    }
    out.push_str(",\"granted\":");
    write_usage(compact, granted)?;
    let out = &mut *compact.out;
    out.push_str(",\"live_children\":");
    number(out, u64::from(*live_children));
    out.push_str(",\"program\":{\"name\":");
    write_str(out, program.name.as_str());
    out.push_str(",\"digest\":");
    quoted(out, program.digest.text().as_str());
    out.push_str("},\"input\":");
    quoted(out, input.digest().text().as_str());
    out.push_str(",\"budget\":");
    compact.value(budget)?;
    compact.out.push_str(",\"capabilities\":");
    compact.value(capabilities)?;
    compact.out.push_str(",\"usage\":");
    write_usage(compact, usage)?;
    compact.out.push_str(",\"status\":");
    compact.value(status)?;
    let out = &mut *compact.out;
    out.push_str(",\"steps\":");
    number(out, *steps);
    out.push_str(",\"state\":");
    append(out, state.0.as_str());
    if !mailbox.is_empty() {
        compact.out.push_str(",\"mailbox\":");
        compact.value(mailbox)?;
    }
    compact.out.push_str(",\"consumed\":");
    number(compact.out, *consumed);
    if !receipts.is_empty() {
        compact.out.push_str(",\"receipts\":");
        compact.value(receipts)?;
    }
    if !batch.is_empty() {
        compact.out.push_str(",\"batch\":");
        compact.value(batch)?;
    }
    if let Some(waiting) = waiting {
        compact.out.push_str(",\"waiting\":");
        quoted(compact.out, waiting.text().as_str());
    }
    if !waits.is_empty() {
        compact.out.push_str(",\"waits\":");
        compact.value(waits)?;
    }
    if !answered.is_empty() {
        compact.out.push_str(",\"answered\":");
        compact.value(answered)?;
    }
    if let Some(cancel) = cancel {
        compact.out.push_str(",\"cancel\":");
        compact.value(cancel)?;
    }
    if let Some(termination) = termination {
        compact.out.push_str(",\"termination\":");
        compact.value(termination)?;
    }
    compact.out.push('}');
    Ok(())
}

/// A [`Usage`]: its counts in place, its meters (rare) by the serializer.
fn write_usage(compact: &mut Compact<'_>, usage: &Usage) -> Result<(), Error> {
    let Usage {
        steps,
        effects,
        signals,
        meters,
    } = usage;
    if !meters.is_empty() {
        return compact.value(usage);
    }
    let out = &mut *compact.out;
    out.push_str("{\"steps\":");
    number(out, *steps);
    out.push_str(",\"effects\":");
    number(out, *effects);
    out.push_str(",\"signals\":");
    number(out, *signals);
    out.push('}');
    Ok(())
}

/// Text that needs no escaping (an id's or a digest's), quoted.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::{Budget, Capabilities, TreeLimits};
    use crate::clock::Timestamp;
    use crate::descriptor::Schema;
    use crate::engine::state::{CancelIntent, OpenWait, Phase, ProgramId, Slot};
    use crate::failure::{Cause, Status, Termination};
    use crate::ids::{ChildKey, EffectId, Name, ProcessId, SignalId, StartId, WaitId};
    use crate::labels::{LabelKey, Labels};
    use crate::log::RecordBody;
    use crate::payload::Payload;
    use crate::protocol::{Effect, ExecutionState, Signal, SignalBody};

    fn digest(bytes: &[u8]) -> crate::digest::Digest {
        crate::digest::Digest::of(crate::digest::Purpose::Payload, bytes)
    }

    fn json(text: &str) -> Payload {
        Payload::parse_str(text).expect("json")
    }

    /// A tree whose root has every optional member a process can have
    /// (children, meters, a mailbox, receipts, a batch, an open and an
    /// answered wait, a cancellation, a termination), text that needs
    /// escaping (a label, a reason, payloads), and a tree with a deadline,
    /// a creation time and labels.
    fn full_tree() -> TreeState {
        let start = StartId::new("acme", "snapshot").expect("valid");
        let mut labels = Labels::new();
        labels
            .insert(LabelKey::new("team").expect("valid"), "core \"ops\"")
            .expect("valid");
        let root = ProcessId::root(&start);
        let body = RecordBody::TreeStarted {
            root,
            start,
            program: Box::new(crate::protocol::ProgramRef {
                name: Name::new("test.root").expect("valid"),
                contract: digest(b"contract"),
                implementation: digest(b"implementation"),
                configuration: digest(b"configuration"),
                children: vec![digest(b"child")],
                digest: digest(b"root"),
            }),
            input: json(r#"{"q":"\u0001 and \"quotes\""}"#),
            budget: Budget::unlimited().with_steps(9),
            capabilities: Capabilities::of([Name::new("net.http").expect("valid")]),
            deadline: Some(Timestamp(5_000)),
            limits: TreeLimits::default(),
            created: Some(Timestamp(1_000)),
            labels,
            state: ExecutionState(json(r#"{"stage":"a\nb"}"#)),
        };
        let mut tree = TreeState::started(&body).expect("a start folds");
        let key = ChildKey::new("worker-1").expect("valid");
        let child = ProcessId::child(root, &key);
        let effect = EffectId::new(root, 0, 0);
        let wait = WaitId::for_effect(effect);
        let meter = Name::new("tokens_in").expect("valid");
        let mut process = ProcessState::new(
            ProgramId {
                name: Name::new("test.child").expect("valid"),
                digest: digest(b"child"),
            },
            &json("[1,2]"),
            &Budget::unlimited().with_meter(meter.clone(), 50),
            &Capabilities::none(),
            &ExecutionState(json("null")),
        );
        process.parent = Some(root);
        process.key = Some(key.clone());
        process.depth = 1;
        process.usage.meters.insert(meter.clone(), 7);
        process.granted.steps = 3;
        process.status = Status::Canceled;
        process.mailbox.push_back(Signal {
            id: SignalId::new("host-1").expect("valid"),
            wait: Some(wait),
            body: SignalBody::Input {
                payload: json(r#"{"answer":"yes"}"#),
            },
        });
        process.receipts.insert(
            SignalId::new("host-0").expect("valid"),
            process.input.digest(),
        );
        process.batch.push(Slot {
            id: effect,
            effect: Effect::Wait {
                key: ChildKey::new("ask").expect("valid"),
                request: json(r#"{"ask":1}"#),
                answer_schema: Schema::any(),
            },
            phase: Phase::Planned,
            failed_attempts: 2,
        });
        process.waiting = Some(wait);
        process.waits.insert(
            wait,
            Box::new(OpenWait {
                effect,
                key: ChildKey::new("ask").expect("valid"),
                request: json(r#"{"ask":1}"#),
                answer_schema: Schema::any(),
            }),
        );
        process
            .answered
            .insert(WaitId::for_effect(EffectId::new(root, 1, 0)));
        process.cancel = Some(CancelIntent {
            cause: Cause::HostCancellation,
            reason: "stop \"now\"".into(),
        });
        process.termination = Some(Termination::completed(json("{\"b\":1,\"a\":[]}")));
        let parent = tree.processes.get_mut(&root).expect("the root");
        parent.children.insert(key, child);
        parent.live_children = 1;
        tree.processes.insert(child, Box::new(process));
        tree.history_bytes = 12_345;
        tree
    }

    #[test]
    fn a_snapshot_is_serdes_text_and_reads_back() {
        for tree in [full_tree(), {
            let mut bare = full_tree();
            bare.processes.retain(|id, _| *id == bare.root);
            bare
        }] {
            let expected = serde_json::to_vec(&tree).expect("encodes");
            let text = encode(&tree);
            assert_eq!(
                std::str::from_utf8(&text).expect("utf-8"),
                std::str::from_utf8(&expected).expect("utf-8")
            );
            let read: TreeState = serde_json::from_slice(&text).expect("reads back");
            assert_eq!(serde_json::to_vec(&read).expect("encodes"), expected);
        }
    }
}
