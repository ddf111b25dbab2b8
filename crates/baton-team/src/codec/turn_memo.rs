//! Turn decoding by difference: the tasks of a few recently decoded turns.
//!
//! A policy decodes a [`Turn`] every turn, and consecutive turns of a team
//! repeat most of their tasks byte for byte: settled tasks never change,
//! and the team writes each task's canonical text the same way every turn.
//! Decoding first compares the text of the turn's task list with that of
//! each kept turn (a memcmp, far cheaper than parsing) and takes, unread,
//! the decoded [`Task`]s of the kept turn's tasks that lie wholly in the
//! longest common prefix. It then parses the rest of the text once into
//! borrowed pieces (each task kept as its raw text), takes the decoded task
//! of every remaining task whose text equals the text of the task at the
//! same position in a kept turn, and decodes only the others, each with
//! the very decoder `Payload::decode::<Turn>()` applies to it.
//!
//! The memo is only a cache: the turn decoded, and whether a turn is
//! accepted, never depend on what it holds. Decoding a task's text on its
//! own yields exactly what decoding it inside the turn yields (nothing in
//! a task's decoding depends on its context: serde_json skips raw payload
//! values without a depth limit, and a task's typed nesting is shallow).
//! The tasks taken unread are cut out of the text, and the rest parsed,
//! only where that parse shows the cut to open the turn's own task list
//! (see [`read_spliced`]). Whenever the pieces fail to decode, the whole
//! turn is decoded exactly as `Payload::decode::<Turn>()` does, which
//! reports the error. The memo is shared by every run of one policy
//! (concurrent runs included), holds at most [`TurnMemo::ENTRIES`] turns,
//! and its lock is held only to copy or insert an entry, never while
//! parsing or comparing.

use std::ops::Range;
use std::sync::Arc;

use baton_run::Payload;
use baton_run::program::{Descriptor, common_prefix};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::recent::Recent;
use super::{CodecError, span_in};
use crate::{ControlReceipt, Task, Turn};

/// A decoded turn: its text, and its tasks in request order, each with
/// where it lies in that text (the task decoded from `text[spans[i]]` is
/// `tasks[i]`, shared with every kept turn that holds the same text).
#[derive(Debug)]
struct Entry {
    source: Source,
    tasks: Box<[Arc<Task>]>,
    spans: Box<[Range<usize>]>,
}

impl Entry {
    /// The task at `index`, if its text is `raw`.
    fn task_if(&self, index: usize, raw: &str) -> Option<&Arc<Task>> {
        let span = self.spans.get(index)?;
        (self.source.as_str().get(span.clone())? == raw).then(|| &self.tasks[index])
    }
}

/// The text of a decoded turn, kept without a copy where it is a payload.
#[derive(Debug)]
enum Source {
    Payload(Payload),
    /// Text that is not a payload: tests feed the memo malformed and
    /// non-canonical turns.
    #[cfg(test)]
    Text(Box<str>),
}

impl Source {
    fn as_str(&self) -> &str {
        match self {
            Source::Payload(payload) => payload.as_str(),
            #[cfg(test)]
            Source::Text(text) => text,
        }
    }
}

/// A turn read with its tasks left as raw text: as a list of each task's
/// text, or (`Pieces<&RawValue>`) as the list's whole text, so where it
/// lies is known. Its fields, their decoders and its strictness are those
/// of [`Turn`], so it accepts a text exactly when [`Turn`] accepts it up to
/// the tasks' contents.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Pieces<Tasks> {
    number: u64,
    state: Payload,
    workers: Vec<Descriptor>,
    tasks: Tasks,
    controls: Vec<ControlReceipt>,
}

/// Each task's text.
type Listed<'a> = Pieces<Vec<&'a RawValue>>;

/// What canonical text writes just before a turn's first task.
const TASKS_OPEN: &str = r#""tasks":["#;

/// The first tasks of a kept turn, found unchanged at the head of a turn's
/// task list.
#[derive(Debug)]
struct Skip {
    /// The kept turn (its index among the entries read).
    entry: usize,
    /// How many of its first tasks are taken.
    count: usize,
    /// Where the turn's task list would begin: just after the first
    /// `"tasks":[` of its text.
    at: usize,
    /// Where the text resumes after them (past their last comma, or at the
    /// list's `]`).
    resume: usize,
}

/// The kept turn whose first tasks open the task list of `text` over the
/// most tasks, and where they lie; none when no kept task does, or when
/// what follows them is not a separator the cut can keep.
fn skip_prefix(text: &str, recent: &[Arc<Entry>]) -> Option<Skip> {
    let at = text.find(TASKS_OPEN)? + TASKS_OPEN.len();
    let list = &text.as_bytes()[at..];
    // The kept turn sharing the most leading tasks (the newest on a tie).
    let mut best: Option<(usize, usize)> = None;
    for (index, entry) in recent.iter().enumerate() {
        let Some(first) = entry.spans.first() else {
            continue;
        };
        let kept = &entry.source.as_str().as_bytes()[first.start..];
        let common = common_prefix(kept, list);
        let count = entry
            .spans
            .partition_point(|span| span.end - first.start <= common);
        if count > best.map_or(0, |(_, most)| most) {
            best = Some((index, count));
        }
    }
    let (entry, count) = best?;
    let spans = &recent[entry].spans;
    let end = at + (spans[count - 1].end - spans[0].start);
    let bytes = text.as_bytes();
    let resume = match bytes.get(end)? {
        // After a comma the text must go on with a value, as the cut text
        // does after its `[`: a `]` or whitespace there would make a cut
        // text of a malformed one.
        b',' => match bytes.get(end + 1)? {
            b']' | b' ' | b'\t' | b'\n' | b'\r' => return None,
            _ => end + 1,
        },
        b']' => end,
        _ => return None,
    };
    Some(Skip {
        entry,
        count,
        at,
        resume,
    })
}

/// Parses `spliced`, a turn's text with the tasks of a [`Skip`] cut out of
/// its list, into pieces; none unless its task list begins exactly at the
/// cut (`at`).
///
/// Why a success is exact: up to `at` the spliced text is the turn's
/// text, and a JSON parse reads left to right, so where the parse of the
/// spliced text finds the top-level task list there, the parse of the turn
/// finds it there too, just after its `[`. From there the turn holds the
/// cut tasks' texts, each a whole JSON object that decoded before, with
/// their separators, and then either the list's `]` (where the spliced
/// text's list is empty) or a comma and a value (where the spliced text's
/// list begins with that value). So the turn parses exactly as the
/// spliced text does, with the cut tasks first in its list.
///
/// The text is parsed once where the cut leaves tasks: the first of them
/// then begins at `at` exactly when the list begins at the cut (canonical
/// text puts a list's first element just after its `[`). Only where it
/// leaves none is the list itself located, by a parse that keeps it whole.
fn read_spliced(spliced: &str, at: usize) -> Option<Listed<'_>> {
    let listed: Listed<'_> = serde_json::from_str(spliced).ok()?;
    if let Some(first) = listed.tasks.first() {
        return (span_in(spliced, first.get())?.start == at).then_some(listed);
    }
    let whole: Pieces<&RawValue> = serde_json::from_str(spliced).ok()?;
    let list = span_in(spliced, whole.tasks.get())?;
    if list.start + 1 != at {
        return None;
    }
    Some(Pieces {
        number: whole.number,
        state: whole.state,
        workers: whole.workers,
        tasks: serde_json::from_str(whole.tasks.get()).ok()?,
        controls: whole.controls,
    })
}

/// The most recently decoded turns of one policy, newest first.
#[derive(Debug, Default)]
pub(crate) struct TurnMemo {
    recent: Recent<Entry>,
}

impl TurnMemo {
    /// How many turns are kept: enough for a few teams run by one policy at
    /// once.
    pub const ENTRIES: usize = 4;

    /// Decodes `turn` exactly as `turn.decode::<Turn>()` does: the same
    /// turn, or the same error (as [`CodecError::Payload`]).
    pub fn decode(&self, turn: &Payload) -> Result<Turn, CodecError> {
        match self.decode_text(Source::Payload(turn.clone())) {
            Some((decoded, _)) => Ok(decoded),
            None => Ok(turn.decode()?),
        }
    }

    /// The turn `source` holds and how many of its tasks came from the
    /// memo; none when the text does not decode into pieces (the caller
    /// decodes it whole, which reports why).
    fn decode_text(&self, source: Source) -> Option<(Turn, usize)> {
        let text = source.as_str();
        let recent = self.recent.entries();
        let mut known = Vec::new();
        let mut spans = Vec::new();
        // The text the pieces were read from, and how far past their place
        // in it each lies in `text`.
        let (mut parsed, mut shift) = (text, 0);
        let spliced: String;
        let mut pieces = None;
        if let Some(skip) = skip_prefix(text, &recent) {
            spliced = [&text[..skip.at], &text[skip.resume..]].concat();
            if let Some(read) = read_spliced(&spliced, skip.at) {
                let entry = &recent[skip.entry];
                let first = entry.spans[0].start;
                known.extend_from_slice(&entry.tasks[..skip.count]);
                spans.extend(
                    entry.spans[..skip.count]
                        .iter()
                        .map(|span| skip.at + (span.start - first)..skip.at + (span.end - first)),
                );
                (parsed, shift) = (&spliced, skip.resume - skip.at);
                pieces = Some(read);
            }
        }
        let pieces = match pieces {
            Some(pieces) => pieces,
            None => serde_json::from_str::<Listed<'_>>(text).ok()?,
        };
        let head = known.len();
        let mut reused = head;
        known.reserve(pieces.tasks.len());
        spans.reserve(pieces.tasks.len());
        for (offset, raw) in pieces.tasks.iter().enumerate() {
            let raw = raw.get();
            let span = span_in(parsed, raw)?;
            spans.push(span.start + shift..span.end + shift);
            let found = recent
                .iter()
                .find_map(|entry| entry.task_if(head + offset, raw));
            match found {
                Some(task) => {
                    reused += 1;
                    known.push(task.clone());
                }
                None => known.push(Arc::new(serde_json::from_str(raw).ok()?)),
            }
        }
        let turn = Turn {
            number: pieces.number,
            state: pieces.state,
            workers: pieces.workers,
            tasks: known.iter().map(|task| Task::clone(task)).collect(),
            controls: pieces.controls,
        };
        self.insert(
            Entry {
                source,
                tasks: known.into(),
                spans: spans.into(),
            },
            &recent,
        );
        Some((turn, reused))
    }

    /// Keeps `entry` as the newest, dropping the oldest beyond
    /// [`TurnMemo::ENTRIES`]. A turn without tasks has nothing to reuse, and
    /// one whose tasks are all those of the entry `recent` held newest
    /// (the same turn decoded again) adds nothing: neither is kept.
    fn insert(&self, entry: Entry, recent: &[Arc<Entry>]) {
        if entry.tasks.is_empty() {
            return;
        }
        let same = |kept: &Arc<Entry>| {
            kept.tasks.len() == entry.tasks.len()
                && kept
                    .tasks
                    .iter()
                    .zip(&entry.tasks)
                    .all(|(a, b)| Arc::ptr_eq(a, b))
        };
        if recent.first().is_some_and(same) {
            return;
        }
        self.recent.keep(Arc::new(entry), Self::ENTRIES);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use baton_run::{ChildKey, Name, ProcessId, StartId, Termination};

    use crate::TaskRequest;

    fn task(index: usize, settled: bool) -> Task {
        let key = ChildKey::new(format!("t{index}")).expect("valid key");
        let request = TaskRequest::new(
            key.clone(),
            Name::new("bench.double").expect("valid name"),
            Payload::encode(&index).expect("encodes"),
        );
        let root = ProcessId::root(&StartId::new("acme", "memo").expect("valid"));
        let mut task = Task::pending(request);
        task.process = Some(ProcessId::child(root, &key));
        if settled {
            task.outcome = Some(Termination::completed(
                Payload::encode(&(index * 2)).expect("encodes"),
            ));
        }
        task
    }

    /// The turn a team writes after `settled` of `requested` tasks drained.
    fn turn(number: u64, requested: usize, settled: usize) -> String {
        let turn = Turn {
            number,
            state: Payload::encode(&number).expect("encodes"),
            workers: Vec::new(),
            tasks: (0..requested).map(|i| task(i, i < settled)).collect(),
            controls: Vec::new(),
        };
        Payload::encode(&turn).expect("encodes").as_str().to_owned()
    }

    /// The full decode's turn, if it accepts `text`.
    fn full(text: &str) -> Option<Turn> {
        serde_json::from_str::<Turn>(text).ok()
    }

    /// The memo path either yields the full decode's turn or leaves the
    /// text to the full decode.
    fn check(memo: &TurnMemo, text: &str) -> Option<usize> {
        let decoded = memo.decode_text(Source::Text(text.into()));
        if let Some((turn, _)) = &decoded {
            assert_eq!(Some(turn), full(text).as_ref(), "{text}");
        }
        decoded.map(|(_, reused)| reused)
    }

    #[test]
    fn settled_tasks_are_reused_and_changed_ones_decoded() {
        let memo = TurnMemo::default();
        assert_eq!(check(&memo, &turn(1, 0, 0)), Some(0));
        assert_eq!(check(&memo, &turn(2, 10, 0)), Some(0));
        assert_eq!(check(&memo, &turn(3, 20, 10)), Some(0));
        // Tasks 0..10 settled last turn and are unchanged; 10..20 settled
        // since; 20..30 are new.
        assert_eq!(check(&memo, &turn(4, 30, 20)), Some(10));
        assert_eq!(check(&memo, &turn(4, 30, 20)), Some(30));
        // The next turn repeats them all (taken unread: they open its
        // list) and ends its list with them.
        assert_eq!(check(&memo, &turn(5, 30, 20)), Some(30));
        assert_eq!(check(&memo, &turn(6, 30, 30)), Some(20));
        assert_eq!(check(&memo, &turn(7, 40, 35)), Some(30));
    }

    /// A task list inside the state is met before the turn's own and may
    /// repeat a kept turn's tasks byte for byte; the turn decoded is the
    /// full decode's all the same.
    #[test]
    fn a_task_list_in_the_state_is_not_the_turns() {
        let memo = TurnMemo::default();
        let kept = turn(2, 6, 6);
        assert_eq!(check(&memo, &kept), Some(0));
        let list = |text: &str| {
            let value: serde_json::Value = serde_json::from_str(text).expect("valid");
            value["tasks"].clone()
        };
        let decoy = |number: u64, requested: usize, copied: usize| {
            let mut value: serde_json::Value =
                serde_json::from_str(&turn(number, requested, requested)).expect("valid");
            let tasks = list(&kept).as_array().expect("a list")[..copied].to_vec();
            value["state"] = serde_json::json!({ "tasks": tasks });
            Payload::from_value(&value)
                .expect("valid")
                .as_str()
                .to_owned()
        };
        for (number, requested, copied) in [(3, 0, 6), (3, 6, 6), (4, 2, 6), (5, 8, 3), (6, 0, 0)] {
            let text = decoy(number, requested, copied);
            assert!(text.find(TASKS_OPEN) < text.rfind(TASKS_OPEN), "{text}");
            assert!(check(&memo, &text).is_some(), "{text}");
        }
    }

    #[test]
    fn texts_the_full_decode_refuses_are_left_to_it() {
        let memo = TurnMemo::default();
        let good = turn(3, 4, 2);
        assert!(check(&memo, &good).is_some());
        let process = r#""process":"p_"#;
        let corrupt = [
            good[..good.len() - 1].to_owned(),
            good[..good.len() / 2].to_owned(),
            format!("{good} x"),
            good.replacen(r#""number":3"#, r#""number":3,"number":3"#, 1),
            good.replacen(r#""request":"#, r#""extra":1,"request":"#, 1),
            good.replacen(process, &format!(r#""process":null,"x":{process}"#), 1),
            good.replacen(r#""key":"t1""#, r#""key":"t1","key":"t1""#, 1),
            good.replacen(r#""key":"t1""#, r#""key":"""#, 1),
            good.replacen(r#""worker":"bench.double""#, r#""worker":"Bench""#, 1),
            good.replacen(r#""number":3"#, r#""number":-3"#, 1),
            good.replacen(r#""controls":[]"#, r#""controls":null"#, 1),
            good.replacen(r#""tasks":["#, r#""tasks":[null,"#, 1),
            good.replacen(r#""tasks":["#, r#""tasks":[1,"#, 1),
            // A list the kept turn's tasks open, ended by a stray comma.
            good.replacen(r#"}],"workers""#, r#"},],"workers""#, 1),
            good.replacen(r#"}],"workers""#, r#"}, ],"workers""#, 1),
            good.replacen(r#"}],"workers""#, r#"},,],"workers""#, 1),
            good.replacen(r#"}],"workers""#, r#"}],"workers":[],"workers""#, 1),
            good.replacen(r#"}],"workers""#, r#"}"#, 1),
            good.replacen(
                r#"{"process""#,
                r#"{"process":"p_00000000000000000000000000000000","process""#,
                1,
            ),
        ];
        for text in corrupt {
            assert_ne!(text, good);
            assert!(full(&text).is_none(), "{text}");
            assert_eq!(check(&memo, &text), None, "{text}");
        }
        // Whitespace and key order are not canonical but decode all the same.
        let spaced = good.replace(',', " ,\n ");
        assert_eq!(check(&memo, &spaced), Some(0));
    }

    #[test]
    fn the_memo_keeps_at_most_its_entries() {
        let memo = TurnMemo::default();
        for number in 1..=3 * TurnMemo::ENTRIES as u64 {
            check(&memo, &turn(number, number as usize, 0));
            check(&memo, &turn(number, number as usize, 0));
            assert!(memo.recent.len() <= TurnMemo::ENTRIES);
        }
        assert_eq!(memo.recent.len(), TurnMemo::ENTRIES);
    }
}
