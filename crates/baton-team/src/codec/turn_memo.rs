//! Turn decoding by difference: the tasks of a few recently decoded turns.
//!
//! A policy decodes a [`Turn`] every turn, and consecutive turns of a team
//! repeat most of their tasks byte for byte: settled tasks never change,
//! and the team writes each task's canonical text the same way every turn.
//! Decoding parses the turn's text once into borrowed pieces (each task
//! kept as its raw text), takes the decoded [`Task`] of every task whose
//! text equals the text of the task at the same position in a kept turn (a
//! memcmp, far cheaper than decoding), and decodes only the others, each
//! with the very decoder `Payload::decode::<Turn>()` applies to it.
//!
//! The memo is only a cache: the turn decoded, and whether a turn is
//! accepted, never depend on what it holds. Decoding a task's text on its
//! own yields exactly what decoding it inside the turn yields (nothing in
//! a task's decoding depends on its context: serde_json skips raw payload
//! values without a depth limit, and a task's typed nesting is shallow),
//! and whenever the pieces fail to decode, the whole turn is decoded
//! exactly as `Payload::decode::<Turn>()` does, which reports the error.
//! The memo is shared by every run of one policy (concurrent runs
//! included), holds at most [`TurnMemo::ENTRIES`] turns, and its lock is
//! held only to copy or insert an entry, never while parsing or comparing.

use std::sync::Arc;

use baton_run::Payload;
use baton_run::program::Descriptor;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::CodecError;
use super::recent::Recent;
use crate::{ControlReceipt, Task, Turn};

/// One decoded task and the exact text it was decoded from.
#[derive(Debug)]
struct Known {
    text: Box<str>,
    task: Task,
}

/// The tasks of one decoded turn, in request order.
type Entry = Arc<[Arc<Known>]>;

/// A turn read with its tasks left as raw text. Its fields, their decoders
/// and its strictness are those of [`Turn`], so it accepts a text exactly
/// when [`Turn`] accepts it up to the tasks' contents.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Pieces<'a> {
    number: u64,
    state: Payload,
    workers: Vec<Descriptor>,
    #[serde(borrow)]
    tasks: Vec<&'a RawValue>,
    controls: Vec<ControlReceipt>,
}

/// The most recently decoded turns of one policy, newest first.
#[derive(Debug, Default)]
pub(crate) struct TurnMemo {
    recent: Recent<[Arc<Known>]>,
}

impl TurnMemo {
    /// How many turns are kept: enough for a few teams run by one policy at
    /// once.
    pub const ENTRIES: usize = 4;

    /// Decodes `turn` exactly as `turn.decode::<Turn>()` does: the same
    /// turn, or the same error (as [`CodecError::Payload`]).
    pub fn decode(&self, turn: &Payload) -> Result<Turn, CodecError> {
        match self.decode_text(turn.as_str()) {
            Some((decoded, _)) => Ok(decoded),
            None => Ok(turn.decode()?),
        }
    }

    /// The turn `text` holds and how many of its tasks came from the memo;
    /// none when the text does not decode into pieces (the caller decodes
    /// it whole, which reports why).
    fn decode_text(&self, text: &str) -> Option<(Turn, usize)> {
        let pieces: Pieces<'_> = serde_json::from_str(text).ok()?;
        let recent = self.recent.entries();
        let mut reused = 0;
        let mut known = Vec::with_capacity(pieces.tasks.len());
        for (index, raw) in pieces.tasks.iter().enumerate() {
            let raw = raw.get();
            let found = recent
                .iter()
                .filter_map(|entry| entry.get(index))
                .find(|candidate| *candidate.text == *raw);
            match found {
                Some(candidate) => {
                    reused += 1;
                    known.push(candidate.clone());
                }
                None => known.push(Arc::new(Known {
                    text: raw.into(),
                    task: serde_json::from_str(raw).ok()?,
                })),
            }
        }
        let turn = Turn {
            number: pieces.number,
            state: pieces.state,
            workers: pieces.workers,
            tasks: known.iter().map(|known| known.task.clone()).collect(),
            controls: pieces.controls,
        };
        self.insert(known, &recent);
        Some((turn, reused))
    }

    /// Keeps `tasks` as the newest entry, dropping the oldest beyond
    /// [`TurnMemo::ENTRIES`]. A turn without tasks has nothing to reuse, and
    /// one whose tasks are all those of the entry `recent` held newest
    /// (the same turn decoded again) adds nothing: neither is kept.
    fn insert(&self, tasks: Vec<Arc<Known>>, recent: &[Entry]) {
        if tasks.is_empty() {
            return;
        }
        let same = |entry: &Entry| {
            entry.len() == tasks.len() && entry.iter().zip(&tasks).all(|(a, b)| Arc::ptr_eq(a, b))
        };
        if recent.first().is_some_and(same) {
            return;
        }
        self.recent.keep(tasks.into(), Self::ENTRIES);
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
        let decoded = memo.decode_text(text);
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
