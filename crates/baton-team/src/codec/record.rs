//! The recorded state's canonical JSON: written from canonical parts, and
//! read strictly, by difference from a recently restored state when one
//! shares a prefix with it.
//!
//! Reading is strict: unknown fields, explicit `null` members, written
//! `false` flags and empty lists are refused, so a snapshot round-trips
//! exactly. Restore checks every task as strictly as decoding it would, but
//! decodes in full only the tasks a step can change and those of the
//! applied decision (see `tasks`); a settled task is checked through a
//! borrowed view (see `view`). Once read, a record is checked against the
//! team's rules (`Record::check`); only an accepted state is kept in the
//! memo.

use std::ops::Range;

use baton_run::Payload;
use baton_run::program::PayloadWriter;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::memo::{Index, Repeated, Restored, Seen};
use super::tasks::Tasks;
use super::view::TaskView;
use super::{CodecError, span_in};
use crate::state::{Receipt, Record, StateError, TurnRecord, Vouched};
use crate::team::Shared;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordIn<'a> {
    #[serde(default, deserialize_with = "only_true")]
    completed: bool,
    #[serde(default, deserialize_with = "baton_run::program::deserialize_present")]
    initial: Option<Payload>,
    /// Present even when empty: a full decode rejects an empty list, and a
    /// decode by difference may have cut every task out of it.
    #[serde(
        default,
        borrow,
        deserialize_with = "baton_run::program::deserialize_present"
    )]
    tasks: Option<Vec<&'a RawValue>>,
    #[serde(default, deserialize_with = "non_empty")]
    controls: Option<Vec<Receipt>>,
    #[serde(default, deserialize_with = "baton_run::program::deserialize_present")]
    turn: Option<TurnRecord>,
}

/// A flag that is either absent or `true` (the encoding omits `false`).
pub(crate) fn only_true<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    if bool::deserialize(deserializer)? {
        Ok(true)
    } else {
        Err(serde::de::Error::custom(
            "a false flag is omitted, not written",
        ))
    }
}

/// A list that is either absent or non-empty (the encoding omits empty lists).
fn non_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<Vec<T>>, D::Error> {
    let items = Vec::<T>::deserialize(deserializer)?;
    if items.is_empty() {
        Err(serde::de::Error::custom(
            "an empty list is omitted, not written",
        ))
    } else {
        Ok(Some(items))
    }
}

/// Where `inner`, text borrowed from the state `outer`, lies in it.
fn span_of(outer: &str, inner: &str) -> Range<usize> {
    span_in(outer, inner).expect("text borrowed from the state lies within it")
}

/// The canonical JSON of `record`, assembled from canonical parts in key
/// order ([`TurnRecord`] declares its fields in key order): the tasks'
/// texts are copied, never scanned again.
pub(crate) fn encode(record: &Record) -> Result<Payload, CodecError> {
    let mut out = PayloadWriter::with_capacity(
        record.tasks.text_len()
            + record.initial.as_ref().map_or(0, Payload::len)
            + record.turn.as_ref().map_or(0, |turn| turn.state.len())
            + 256,
    );
    out.begin_object()?;
    if record.completed {
        out.key("completed")?;
        out.bool(true)?;
    }
    if !record.controls.is_empty() {
        let controls = Payload::encode(&record.controls)?;
        out.key("controls")?;
        out.value(&controls)?;
    }
    if let Some(initial) = &record.initial {
        out.key("initial")?;
        out.value(initial)?;
    }
    if !record.tasks.is_empty() {
        out.key("tasks")?;
        record.tasks.write_array(&mut out)?;
    }
    if let Some(turn) = &record.turn {
        let turn = Payload::encode(turn)?;
        out.key("turn")?;
        out.value(&turn)?;
    }
    out.end_object()?;
    Ok(out.finish()?)
}

/// Decodes a recorded state strictly and checks it against the
/// configuration, by difference from a recently restored state when one
/// shares a prefix with it (see [`Memo`](super::Memo)): the result, and
/// whether the state is accepted, are exactly those of [`decode_full`].
pub(crate) fn decode(state: &Payload, shared: &Shared) -> Result<Record, StateError> {
    let memo = shared.memo();
    if let Some((base, common)) = memo.nearest(state.as_str())
        && let Some(Ok((record, restored))) = decode_after(state, shared, &base, common)
    {
        if common < state.len() || common < base.source.len() {
            memo.insert(restored);
        }
        return Ok(record);
    }
    // A rejected state takes the full decode too, so its error is the
    // one the full decode reports.
    let (record, restored) = decode_full(state, shared)?;
    memo.insert(restored);
    Ok(record)
}

/// Decodes a recorded state in full; with it, what a later restore by
/// difference needs of it.
pub(crate) fn decode_full(
    state: &Payload,
    shared: &Shared,
) -> Result<(Record, Restored), StateError> {
    let text = state.as_str();
    let wire: RecordIn<'_> = serde_json::from_str(text).map_err(CodecError::from)?;
    if wire.tasks.as_ref().is_some_and(Vec::is_empty) {
        return Err(CodecError::EmptyTasks.into());
    }
    let rest = wire
        .tasks
        .iter()
        .flatten()
        .map(|fragment| span_of(text, fragment.get()))
        .collect::<Vec<_>>();
    let (record, seen) = assemble(state, wire, &[], &rest)?;
    record.check(shared)?;
    Ok((record, Restored::new(state, seen)))
}

/// Decodes `state` by difference from `base`, whose text agrees with it
/// on the first `common` bytes: the tasks of `base` that lie wholly in
/// that prefix are taken from it as they were read, only the rest of
/// the text is parsed, the keys and processes of the rest are checked
/// against the reused tasks' in `base`'s index, and every other
/// record-level check runs over all the tasks. `None` when nothing of
/// `base` can be reused.
///
/// Why this is exact: a JSON parse reads left to right, so up to byte
/// `common` it meets the same fields and the same first tasks, at the
/// same offsets, as it did in `base`, which was accepted; whether a
/// task is accepted, and how it is read, depends only on its bytes (the
/// configuration's part, its worker, is checked with the record). What
/// follows the last reused task must be `,` or `]`; the text with the
/// reused tasks cut out of the array then parses as the whole text
/// would past them. The reused tasks passed the per-task checks and
/// hold unique keys and processes, since `base` was accepted.
pub(crate) fn decode_after(
    state: &Payload,
    shared: &Shared,
    base: &Restored,
    common: usize,
) -> Option<Result<(Record, Restored), StateError>> {
    let text = state.as_str();
    let reused = base.tasks.partition_point(|task| task.span.end <= common);
    let first = base.tasks.first()?.span.start;
    let end = base.tasks.get(reused.checked_sub(1)?)?.span.end;
    // The rest of the array: after the separating comma, or its end.
    let resume = match text.as_bytes().get(end)? {
        b',' => end + 1,
        b']' => end,
        _ => return None,
    };
    let mut spliced = String::with_capacity(first + text.len() - resume);
    spliced.push_str(&text[..first]);
    spliced.push_str(&text[resume..]);
    let shift = resume - first;
    let parsed = match serde_json::from_str::<RecordIn<'_>>(&spliced) {
        Ok(wire) => {
            let rest = wire
                .tasks
                .iter()
                .flatten()
                .map(|fragment| {
                    let span = span_of(&spliced, fragment.get());
                    span.start + shift..span.end + shift
                })
                .collect::<Vec<_>>();
            vouched(state, shared, wire, (base, reused), &rest)
        }
        Err(error) => Err(CodecError::from(error).into()),
    };
    Some(parsed)
}

/// The record of `state` read by difference from the first `reused`
/// tasks of `base` and the spans of the others (`rest`), checked.
fn vouched(
    state: &Payload,
    shared: &Shared,
    wire: RecordIn<'_>,
    (base, reused): (&Restored, usize),
    rest: &[Range<usize>],
) -> Result<(Record, Restored), StateError> {
    let (record, seen) = assemble(state, wire, &base.tasks[..reused], rest)?;
    let index =
        Index::after(state.as_str(), base, reused, &seen).map_err(|repeated| match repeated {
            Repeated::Key(key) => StateError::RepeatedKey { key },
            Repeated::Process(process) => StateError::RepeatedProcess { process },
        })?;
    record.check_with(shared, Some(Vouched { leading: reused }))?;
    Ok((record, Restored::with_index(state, seen, index)))
}

/// Builds the record of `state` from its fields, the tasks read before
/// (`reused`, the first tasks) and the spans in `state` of the tasks
/// still to read (`rest`, the others), unchecked. The tasks of `wire`
/// are ignored: `rest` names them.
fn assemble(
    state: &Payload,
    wire: RecordIn<'_>,
    reused: &[Seen],
    rest: &[Range<usize>],
) -> Result<(Record, Vec<Seen>), StateError> {
    let text = state.as_str();
    let count = reused.len() + rest.len();
    // The applied decision's tasks are decoded to check their inputs
    // again (an oversized count is rejected by the checks).
    let decided = wire
        .turn
        .as_ref()
        .and_then(|turn| turn.decided)
        .map_or(0, |decided| decided.tasks as usize);
    let before = count.saturating_sub(decided);
    let mut seen = Vec::with_capacity(count);
    seen.extend_from_slice(reused);
    for span in rest {
        let (start, fragment) = (span.start, &text[span.clone()]);
        let view = TaskView::read(fragment)?;
        // A value of canonical text is canonical: this scans the one
        // task, once in its lifetime (the memo hands the payload on).
        let payload = Payload::parse_str(fragment).map_err(CodecError::from)?;
        let at = |inner: &str| {
            let span = span_of(fragment, inner);
            start + span.start..start + span.end
        };
        seen.push(Seen {
            payload,
            span: start..start + fragment.len(),
            key: at(view.request.key),
            worker: at(view.request.worker),
            process: view.process,
            live: view.is_live(),
        });
    }
    let record = Record {
        completed: wire.completed,
        initial: wire.initial,
        tasks: Tasks::restored(state, &seen, before)?,
        controls: wire.controls.unwrap_or_default(),
        turn: wire.turn,
    };
    Ok((record, seen))
}

#[cfg(test)]
mod tests {
    use baton_run::{ChildKey, Name, ProcessId, StartId};

    use super::*;
    use crate::state::{Decided, Fact};
    use crate::wire::{Control, Mode, Task, TaskRequest};

    /// Snapshots of a team are taken every step; their text must already be
    /// canonical so it becomes a payload without being re-encoded.
    #[test]
    fn a_record_is_written_canonical() {
        let key = ChildKey::new("t1").expect("key");
        let request = TaskRequest::new(
            key.clone(),
            Name::new("w.echo").expect("name"),
            Payload::parse_str(r#"{"z":1,"a":[true,"x"]}"#).expect("json"),
        );
        let mut record = Record::default();
        record.tasks.push(Task::pending(request)).expect("encodes");
        let process = ProcessId::root(&StartId::new("s", "k").expect("id"));
        record
            .tasks
            .record(0, Fact::Started(process))
            .expect("encodes");
        record.controls.push(Receipt {
            control: Control::cancel(key, "stop"),
            result: None,
        });
        record.turn = Some(TurnRecord {
            coordinator: Some(process),
            decided: Some(Decided {
                mode: Mode::Wait,
                tasks: 1,
            }),
            number: 2,
            outcome_arrived: true,
            stalled: None,
            state: Payload::parse_str(r#"{"b":2,"a":1}"#).expect("json"),
        });
        let text = encode(&record).expect("writes");
        assert_eq!(
            Payload::parse_str(text.as_str()).expect("valid").as_str(),
            text.as_str()
        );
    }
}
