//! The team's recorded state and its strict restore.
//!
//! The phase is never stored: it follows from the facts, checked in this
//! order: completed; ready (no turn yet); in a turn (no decision yet; the
//! coordinator's process is missing until its start result arrives);
//! applying (a decision's start result or control receipt is missing);
//! waiting (a decided `wait` turn with every result in). Restore rejects
//! every combination of facts no run can produce.
//!
//! Every task is kept as a [`Payload`] of its canonical JSON, which
//! snapshots and turns copy as it is (through a [`PayloadWriter`], which
//! never scans it again): made once from its span of the restored state
//! and handed on by the memo while the task is unchanged, then its new
//! encoding once a fact about it is recorded. Restore checks every task strictly,
//! but decodes in full only the tasks a step can change (those awaiting
//! admission or running) and those of the applied decision (whose inputs it
//! checks again); a settled task (refused, or drained with its outcome
//! recorded) is checked through a borrowed view (see `view`) and never
//! decoded, so a step costs the team one pass over the recorded text plus
//! work in proportion to the tasks that can change.

use std::collections::BTreeSet;
use std::ops::Range;

use baton_run::{
    ChildKey, Failure, Payload, PayloadWriter, ProcessId, Settlement, Termination, WriteError,
};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use crate::memo::{Restored, Seen};
use crate::team::Shared;
use crate::view::TaskView;
use crate::wire::{Control, Mode, Task};

/// One control of the current or previous decision and, once it arrived,
/// its receipt. Serialized with its result it is exactly a
/// [`ControlReceipt`](crate::ControlReceipt).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Receipt {
    pub control: Control,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "baton_run::deserialize_present"
    )]
    pub result: Option<Settlement>,
}

/// The decision of the current turn, once the coordinator's outcome
/// arrived; its state replaced the turn's, its tasks are the last `tasks`
/// of the task list and its controls are the receipts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Decided {
    pub mode: Mode,
    pub tasks: u32,
}

/// The current turn. Its fields are declared in key order, so its JSON is
/// canonical as serde writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TurnRecord {
    /// The coordinator's process, once its start result arrived.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "baton_run::deserialize_present"
    )]
    pub coordinator: Option<ProcessId>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "baton_run::deserialize_present"
    )]
    pub decided: Option<Decided>,
    pub number: u64,
    /// Whether a task outcome arrived while the coordinator ran.
    #[serde(
        default,
        skip_serializing_if = "std::ops::Not::not",
        deserialize_with = "only_true"
    )]
    pub outcome_arrived: bool,
    /// The working state: the turn's input until the decision, then the
    /// decision's state.
    pub state: Payload,
}

/// The whole recorded state, in memory.
#[derive(Clone, Debug, Default)]
pub(crate) struct Record {
    pub completed: bool,
    /// The team's input, only before turn 1.
    pub initial: Option<Payload>,
    /// The state this record was restored from: the keys and workers of
    /// settled tasks are spans of it.
    source: Option<Payload>,
    /// The tasks, in request order.
    tasks: Vec<Entry>,
    /// Indices of the decoded tasks, in request order: every task a step can
    /// change is among them.
    decoded: Vec<usize>,
    pub controls: Vec<Receipt>,
    pub turn: Option<TurnRecord>,
}

/// One task: its canonical JSON and what steps need of it.
#[derive(Clone, Debug)]
struct Entry {
    /// The task's canonical JSON: made from its span of the restored state
    /// (the task did not change since), or written since (a new task, or a
    /// fact about it was recorded).
    text: Payload,
    body: Body,
}

#[derive(Clone, Debug)]
enum Body {
    /// The whole task: one a step can change (awaiting admission or
    /// running), one of the applied decision, or one added or changed since
    /// the restore.
    Decoded(Box<Task>),
    /// A restored, settled task (refused, or drained with its outcome
    /// recorded), which no step changes: only what the checks need, its key
    /// and worker as spans of the restored state.
    Settled {
        key: Range<usize>,
        worker: Range<usize>,
        process: Option<ProcessId>,
    },
}

/// A fact the kernel reports about a task.
#[derive(Debug)]
pub(crate) enum Fact {
    /// Admitted as this process.
    Started(ProcessId),
    /// Its start was refused.
    Refused(Failure),
    /// It drained (its outcome).
    Drained(Termination),
}

/// The canonical JSON of `value`.
fn encoded<T: Serialize>(value: &T) -> Result<String, String> {
    Payload::encode(value)
        .map(|payload| payload.as_str().to_owned())
        .map_err(|error| error.to_string())
}

/// A writer's refusal, which canonical parts in key order never meet.
fn refused(error: WriteError) -> String {
    format!("cannot write the canonical JSON: {error}")
}

/// What steps and checks need of one task, without its payloads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Facts<'a> {
    pub key: &'a str,
    pub worker: &'a str,
    pub process: Option<ProcessId>,
    pub refused: bool,
    pub drained: bool,
}

impl Facts<'_> {
    /// Whether it awaits admission (no kernel fact yet).
    pub fn is_pending(&self) -> bool {
        self.process.is_none() && !self.refused
    }

    /// Whether it was admitted and its drained outcome has not been observed.
    pub fn is_running(&self) -> bool {
        self.process.is_some() && !self.drained
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordIn<'a> {
    #[serde(default, deserialize_with = "only_true")]
    completed: bool,
    #[serde(default, deserialize_with = "baton_run::deserialize_present")]
    initial: Option<Payload>,
    /// Present even when empty: a full decode rejects an empty list, and a
    /// decode by difference may have cut every task out of it.
    #[serde(default, borrow, deserialize_with = "baton_run::deserialize_present")]
    tasks: Option<Vec<&'a RawValue>>,
    #[serde(default, deserialize_with = "non_empty")]
    controls: Option<Vec<Receipt>>,
    #[serde(default, deserialize_with = "baton_run::deserialize_present")]
    turn: Option<TurnRecord>,
}

/// A flag that is either absent or `true` (the encoding omits `false`).
fn only_true<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
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

/// A key that occurs more than once. The keys are sorted by a hash first
/// and by their text only when hashes tie, so equal keys end up adjacent
/// at the cost of comparing integers (any hash would do; a poor one only
/// costs more text comparisons).
fn repeated_key(keys: Vec<&str>) -> Option<&str> {
    fn fnv1a(text: &str) -> u64 {
        text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }
    let mut hashed: Vec<(u64, &str)> = keys.into_iter().map(|key| (fnv1a(key), key)).collect();
    hashed.sort_unstable();
    hashed
        .windows(2)
        .find(|pair| pair[0] == pair[1])
        .map(|pair| pair[0].1)
}

/// Where `inner`, a slice of `outer`, lies in it (serde_json hands out
/// borrowed strings and raw values as slices of the text it reads).
fn span_in(outer: &str, inner: &str) -> Range<usize> {
    let start = (inner.as_ptr() as usize).wrapping_sub(outer.as_ptr() as usize);
    assert!(
        start <= outer.len() && inner.len() <= outer.len() - start,
        "text borrowed from the state lies within it"
    );
    start..start + inner.len()
}

/// The phase, derived from the facts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Completed,
    Ready,
    InTurn,
    Applying,
    Waiting,
}

impl Record {
    /// A completed record: it holds nothing else.
    pub fn completed() -> Record {
        Record {
            completed: true,
            ..Record::default()
        }
    }

    /// A record before turn 1.
    pub fn ready(initial: Payload) -> Record {
        Record {
            initial: Some(initial),
            ..Record::default()
        }
    }

    pub fn phase(&self) -> Phase {
        if self.completed {
            return Phase::Completed;
        }
        let Some(turn) = &self.turn else {
            return Phase::Ready;
        };
        if turn.decided.is_none() {
            Phase::InTurn
        } else if self.last_is_pending() || self.controls.last().is_some_and(|r| r.result.is_none())
        {
            Phase::Applying
        } else {
            Phase::Waiting
        }
    }

    fn last_is_pending(&self) -> bool {
        self.tasks
            .len()
            .checked_sub(1)
            .is_some_and(|last| self.facts(last).is_pending())
    }

    /// How many tasks were ever requested, refused starts included.
    pub fn task_count(&self) -> usize {
        self.tasks.len()
    }

    /// The facts of task `index`.
    pub fn facts(&self, index: usize) -> Facts<'_> {
        match &self.tasks[index].body {
            Body::Decoded(task) => Facts {
                key: task.key().as_str(),
                worker: task.request.worker.as_str(),
                process: task.process,
                refused: task.rejection.is_some(),
                drained: task.outcome.is_some(),
            },
            Body::Settled {
                key,
                worker,
                process,
            } => {
                let source = self.source();
                Facts {
                    key: &source[key.clone()],
                    worker: &source[worker.clone()],
                    process: *process,
                    refused: process.is_none(),
                    drained: process.is_some(),
                }
            }
        }
    }

    /// The facts of every task, in request order.
    pub fn all(&self) -> impl Iterator<Item = Facts<'_>> {
        (0..self.tasks.len()).map(|index| self.facts(index))
    }

    fn source(&self) -> &str {
        self.source
            .as_ref()
            .expect("restored tasks point into the state they were restored from")
            .as_str()
    }

    /// Tasks admitted whose drained outcome has not been observed.
    pub fn running(&self) -> usize {
        self.decoded_tasks()
            .filter(|(_, task)| task.is_running())
            .count()
    }

    /// Keys of the running tasks, in request order.
    pub fn running_keys(&self) -> Vec<ChildKey> {
        self.decoded_tasks()
            .filter(|(_, task)| task.is_running())
            .map(|(_, task)| task.key().clone())
            .collect()
    }

    /// Keys of the tasks running or awaiting admission, in request order:
    /// what a wait declared with a decision's starts names (today's running
    /// tasks, then the new ones).
    pub fn active_keys(&self) -> Vec<ChildKey> {
        self.decoded_tasks()
            .filter(|(_, task)| task.is_running() || task.is_pending())
            .map(|(_, task)| task.key().clone())
            .collect()
    }

    /// Whether the applied decision declared the turn-ending wait together
    /// with its starts and controls; meaningful while applying, and worked
    /// out from the recorded facts alone.
    ///
    /// A `wait` decision whose turn saw no outcome ends its turn with a
    /// `WaitChildren` (drained, any) over the running tasks. When something
    /// will run (a task runs, or the decision starts one), that wait is
    /// declared in the same transition as the starts and controls: the
    /// kernel settles one transition's effects as one batch, so the start
    /// results, the receipts and the wait's settlement arrive in one window
    /// and a round costs the team one step less. The wait names the running
    /// tasks and the new ones, in request order, which is the wait the team
    /// would have declared once every start succeeded.
    ///
    /// The team cannot know whether a start will be refused (capabilities,
    /// budgets and tree limits are the kernel's), and the kernel refuses a
    /// wait naming a child that never started (`engine.child.wait.invalid`).
    /// We declare the wait anyway and fall back: when a start was refused,
    /// the refused wait is accepted and the mode rule applies to the
    /// recorded facts exactly as it did when the wait followed the start
    /// results (a wait over the tasks still running when no outcome
    /// arrived, else the next turn at once). That path costs the same
    /// steps as before plus one refused effect in the log, and the
    /// coordinator sees the same turns and facts; declaring the wait only
    /// when it cannot be refused would mean declaring it only for decisions
    /// without tasks, which forgoes the saving on every round that starts
    /// work.
    pub fn waits_with_actions(&self) -> bool {
        self.turn.as_ref().is_some_and(|turn| {
            turn.decided
                .is_some_and(|decided| decided.mode == Mode::Wait)
                && !turn.outcome_arrived
        }) && self
            .decoded_tasks()
            .any(|(_, task)| task.is_running() || task.is_pending())
    }

    /// The decoded tasks (every one a step can change) with their indices.
    fn decoded_tasks(&self) -> impl Iterator<Item = (usize, &Task)> {
        self.decoded
            .iter()
            .map(|&index| match &self.tasks[index].body {
                Body::Decoded(task) => (index, &**task),
                Body::Settled { .. } => unreachable!("the decoded list holds decoded tasks"),
            })
    }

    /// The index of the running task under `key`.
    pub fn running_index(&self, key: &ChildKey) -> Option<usize> {
        self.decoded_tasks()
            .find(|(_, task)| task.is_running() && task.key() == key)
            .map(|(index, _)| index)
    }

    /// The index of the task under `key`, running or not.
    pub fn position(&self, key: &str) -> Option<usize> {
        self.all().position(|task| task.key == key)
    }

    /// The index of the first task awaiting admission (all of them are at
    /// the end), or the number of tasks.
    pub fn first_pending(&self) -> usize {
        self.decoded_tasks()
            .find(|(_, task)| task.is_pending())
            .map_or(self.tasks.len(), |(index, _)| index)
    }

    /// Those of `wanted` that are keys of tasks before `end`; with
    /// `admitted`, only of tasks admitted.
    pub fn keys_among<'k>(
        &self,
        wanted: &BTreeSet<&'k str>,
        end: usize,
        admitted: bool,
    ) -> BTreeSet<&'k str> {
        let mut found = BTreeSet::new();
        if wanted.is_empty() {
            return found;
        }
        for index in 0..end {
            let task = self.facts(index);
            if (!admitted || task.process.is_some())
                && let Some(key) = wanted.get(task.key)
            {
                found.insert(*key);
            }
        }
        found
    }

    /// Appends a task with its encoding.
    pub fn push_task(&mut self, task: Task) -> Result<(), String> {
        let text = Payload::encode(&task).map_err(|error| error.to_string())?;
        self.decoded.push(self.tasks.len());
        self.tasks.push(Entry {
            text,
            body: Body::Decoded(Box::new(task)),
        });
        Ok(())
    }

    /// Records a fact about task `index`: a start result of a task awaiting
    /// admission, or the outcome of a running one.
    pub fn record(&mut self, index: usize, fact: Fact) -> Result<(), String> {
        let entry = &mut self.tasks[index];
        let Body::Decoded(task) = &mut entry.body else {
            unreachable!("only tasks awaiting admission or running change, and they are decoded");
        };
        let expected = match fact {
            Fact::Started(_) | Fact::Refused(_) => task.is_pending(),
            Fact::Drained(_) => task.is_running(),
        };
        if !expected {
            return Err(format!(
                "task {}: a fact that does not follow its state",
                task.key()
            ));
        }
        // The task gains its members in the reverse of their key order
        // (`request`, then `process` or `rejection`, then `outcome`), so the
        // new member comes first: its canonical text is the member, then
        // the members the task had. The new text is checked by the
        // canonical scanner (one task, once per fact).
        let (name, value) = match &fact {
            Fact::Started(process) => ("process", format!("\"{process}\"")),
            Fact::Refused(failure) => ("rejection", encoded(failure)?),
            Fact::Drained(termination) => ("outcome", encoded(termination)?),
        };
        let old = entry.text.as_str();
        let members = old
            .strip_prefix('{')
            .expect("a task's text is a JSON object with its request");
        let mut text = String::with_capacity(name.len() + value.len() + old.len() + 4);
        text.push_str("{\"");
        text.push_str(name);
        text.push_str("\":");
        text.push_str(&value);
        text.push(',');
        text.push_str(members);
        entry.text = Payload::parse_str(&text).map_err(|error| error.to_string())?;
        match fact {
            Fact::Started(process) => task.process = Some(process),
            Fact::Refused(failure) => task.rejection = Some(failure),
            Fact::Drained(termination) => task.outcome = Some(termination),
        }
        Ok(())
    }

    /// Writes the canonical JSON array of the tasks, copying each task's
    /// text as it is.
    pub fn write_task_array(&self, out: &mut PayloadWriter) -> Result<(), String> {
        out.begin_array().map_err(refused)?;
        for entry in &self.tasks {
            out.value(&entry.text).map_err(refused)?;
        }
        out.end_array().map_err(refused)
    }

    /// Writes the canonical JSON array of the tasks as text.
    #[cfg(test)]
    pub fn write_tasks(&self, out: &mut String) {
        let mut writer = PayloadWriter::new();
        self.write_task_array(&mut writer).expect("writes");
        out.push_str(writer.finish().expect("finishes").as_str());
    }

    /// The length of the tasks' texts, to size the buffers they are
    /// written to.
    pub fn tasks_len(&self) -> usize {
        self.tasks
            .iter()
            .map(|entry| entry.text.len() + 1)
            .sum::<usize>()
            + 2
    }

    /// The canonical JSON of the record, assembled from canonical parts in
    /// key order ([`TurnRecord`] declares its fields in key order): the
    /// tasks' texts are copied, never scanned again.
    pub fn encode(&self) -> Result<Payload, String> {
        let mut out = PayloadWriter::with_capacity(
            self.tasks_len()
                + self.initial.as_ref().map_or(0, Payload::len)
                + self.turn.as_ref().map_or(0, |turn| turn.state.len())
                + 256,
        );
        out.begin_object().map_err(refused)?;
        if self.completed {
            out.key("completed").map_err(refused)?;
            out.bool(true).map_err(refused)?;
        }
        if !self.controls.is_empty() {
            let controls = Payload::encode(&self.controls).map_err(|error| error.to_string())?;
            out.key("controls").map_err(refused)?;
            out.value(&controls).map_err(refused)?;
        }
        if let Some(initial) = &self.initial {
            out.key("initial").map_err(refused)?;
            out.value(initial).map_err(refused)?;
        }
        if !self.tasks.is_empty() {
            out.key("tasks").map_err(refused)?;
            self.write_task_array(&mut out)?;
        }
        if let Some(turn) = &self.turn {
            let turn = Payload::encode(turn).map_err(|error| error.to_string())?;
            out.key("turn").map_err(refused)?;
            out.value(&turn).map_err(refused)?;
        }
        out.end_object().map_err(refused)?;
        out.finish().map_err(|error| error.to_string())
    }

    /// The record's canonical JSON as text.
    #[cfg(test)]
    fn text(&self) -> Result<String, String> {
        self.encode().map(|payload| payload.as_str().to_owned())
    }

    /// Decodes a recorded state strictly and checks it against the
    /// configuration, by difference from a recently restored state when one
    /// shares a prefix with it (see [`Memo`]): the result, and whether the
    /// state is accepted, are exactly those of [`Record::decode_full`].
    pub fn decode(state: &Payload, shared: &Shared) -> Result<Record, String> {
        let memo = shared.memo();
        if let Some((base, common)) = memo.nearest(state.as_str())
            && let Some(Ok((record, seen))) = Record::decode_after(state, shared, &base, common)
        {
            if common < state.len() || common < base.source.len() {
                memo.insert(Restored::new(state, seen));
            }
            return Ok(record);
        }
        // A rejected state takes the full decode too, so its error is the
        // one the full decode reports.
        let (record, seen) = Record::decode_full(state, shared)?;
        memo.insert(Restored::new(state, seen));
        Ok(record)
    }

    /// Decodes a recorded state in full; with it, what a later restore by
    /// difference needs of each task.
    pub fn decode_full(state: &Payload, shared: &Shared) -> Result<(Record, Vec<Seen>), String> {
        let text = state.as_str();
        let wire: RecordIn<'_> = serde_json::from_str(text).map_err(|error| error.to_string())?;
        if wire.tasks.as_ref().is_some_and(Vec::is_empty) {
            return Err("tasks: an empty list is omitted, not written".into());
        }
        let rest = wire
            .tasks
            .iter()
            .flatten()
            .map(|fragment| span_in(text, fragment.get()))
            .collect::<Vec<_>>();
        Record::assemble(state, shared, wire, &[], &rest)
    }

    /// Decodes `state` by difference from `base`, whose text agrees with it
    /// on the first `common` bytes: the tasks of `base` that lie wholly in
    /// that prefix are taken from it as they were read, only the rest of
    /// the text is parsed, and every record-level check runs over all the
    /// tasks. `None` when nothing of `base` can be reused.
    ///
    /// Why this is exact: a JSON parse reads left to right, so up to byte
    /// `common` it meets the same fields and the same first tasks, at the
    /// same offsets, as it did in `base`, which was accepted; whether a
    /// task is accepted, and how it is read, depends only on its bytes (the
    /// configuration's part, its worker, is checked with the record). What
    /// follows the last reused task must be `,` or `]`; the text with the
    /// reused tasks cut out of the array then parses as the whole text
    /// would past them.
    pub fn decode_after(
        state: &Payload,
        shared: &Shared,
        base: &Restored,
        common: usize,
    ) -> Option<Result<(Record, Vec<Seen>), String>> {
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
        let parsed = serde_json::from_str::<RecordIn<'_>>(&spliced)
            .map_err(|error| error.to_string())
            .and_then(|wire| {
                let rest = wire
                    .tasks
                    .iter()
                    .flatten()
                    .map(|fragment| {
                        let span = span_in(&spliced, fragment.get());
                        span.start + shift..span.end + shift
                    })
                    .collect::<Vec<_>>();
                Record::assemble(state, shared, wire, &base.tasks[..reused], &rest)
            });
        Some(parsed)
    }

    /// Builds and checks the record of `state` from its fields, the tasks
    /// read before (`reused`, the first tasks) and the spans in `state` of
    /// the tasks still to read (`rest`, the others). The tasks of `wire`
    /// are ignored: `rest` names them.
    fn assemble(
        state: &Payload,
        shared: &Shared,
        wire: RecordIn<'_>,
        reused: &[Seen],
        rest: &[Range<usize>],
    ) -> Result<(Record, Vec<Seen>), String> {
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
            let payload = Payload::parse_str(fragment).map_err(|error| error.to_string())?;
            let at = |inner: &str| {
                let span = span_in(fragment, inner);
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
        let mut tasks = Vec::with_capacity(count);
        let mut decoded = Vec::new();
        for (index, task) in seen.iter().enumerate() {
            let body = if task.live || index >= before {
                decoded.push(index);
                Body::Decoded(Box::new(
                    serde_json::from_str(&text[task.span.clone()])
                        .map_err(|error| error.to_string())?,
                ))
            } else {
                Body::Settled {
                    key: task.key.clone(),
                    worker: task.worker.clone(),
                    process: task.process,
                }
            };
            tasks.push(Entry {
                text: task.payload.clone(),
                body,
            });
        }
        let record = Record {
            completed: wire.completed,
            initial: wire.initial,
            source: Some(state.clone()),
            tasks,
            decoded,
            controls: wire.controls.unwrap_or_default(),
            turn: wire.turn,
        };
        record.check(shared)?;
        Ok((record, seen))
    }

    /// Every rule a recorded state must keep.
    fn check(&self, shared: &Shared) -> Result<(), String> {
        if self.completed {
            if self.initial.is_some()
                || !self.tasks.is_empty()
                || !self.controls.is_empty()
                || self.turn.is_some()
            {
                return Err("a completed state holds nothing else".into());
            }
            return Ok(());
        }
        let Some(turn) = &self.turn else {
            let Some(initial) = &self.initial else {
                return Err("a state before turn 1 needs the initial state".into());
            };
            if !self.tasks.is_empty() || !self.controls.is_empty() {
                return Err("a state before turn 1 has no tasks or controls".into());
            }
            return shared
                .check_state(initial)
                .map_err(|violation| format!("initial state: {violation}"));
        };
        if self.initial.is_some() {
            return Err("the initial state is kept only before turn 1".into());
        }
        if turn.number == 0 {
            return Err("turn numbers start at 1".into());
        }
        if !shared.max_turns.allows(0, turn.number) {
            return Err(format!(
                "turn {} is beyond the limit of {} turns",
                turn.number, shared.max_turns
            ));
        }
        shared
            .check_state(&turn.state)
            .map_err(|violation| format!("working state: {violation}"))?;
        if turn.outcome_arrived && !self.all().any(|task| task.drained) {
            return Err("an outcome arrived but none is recorded".into());
        }
        self.check_tasks(shared, turn)?;
        self.check_controls(shared, turn)?;
        match (turn.decided, self.phase()) {
            (None, _) => Ok(()),
            (Some(_), _) if turn.coordinator.is_none() => {
                Err("a decided turn needs its coordinator's process".into())
            }
            (Some(decided), Phase::Waiting) => {
                if decided.mode != Mode::Wait || turn.outcome_arrived || self.running() == 0 {
                    return Err("a waiting turn must follow the wait rule".into());
                }
                // A decision with actions declared its wait with them, so
                // its turn waits on its own only when that wait was refused
                // for a refused start.
                let actions = decided.tasks > 0 || !self.controls.is_empty();
                let start = self.tasks.len() - decided.tasks as usize;
                if actions && !(start..self.tasks.len()).any(|index| self.facts(index).refused) {
                    return Err(
                        "a waiting turn whose decision has actions needs a refused start".into(),
                    );
                }
                Ok(())
            }
            (Some(_), _) => Ok(()),
        }
    }

    fn check_tasks(&self, shared: &Shared, turn: &TurnRecord) -> Result<(), String> {
        if !shared.max_tasks.allows(0, self.tasks.len() as u64) {
            return Err(format!(
                "{} tasks exceed the limit of {}",
                self.tasks.len(),
                shared.max_tasks
            ));
        }
        let decided = turn.decided.map_or(0, |d| d.tasks as usize);
        if decided > self.tasks.len() {
            return Err("the decision declares more tasks than are recorded".into());
        }
        let before = self.tasks.len() - decided;
        let mut keys = Vec::with_capacity(self.tasks.len());
        let mut processes = Vec::with_capacity(self.tasks.len());
        let mut pending_seen = false;
        let mut active = 0usize;
        for index in 0..self.tasks.len() {
            let task = self.facts(index);
            let key = task.key;
            if key.starts_with(crate::RESERVED_PREFIX) {
                return Err(format!("task key {key} uses the reserved prefix"));
            }
            let Some(worker) = shared.worker_named(task.worker) else {
                return Err(format!("task {key} names an unknown worker"));
            };
            keys.push(key);
            processes.extend(task.process);
            if task.is_pending() {
                if index < before {
                    return Err(format!("task {key} awaits admission outside its decision"));
                }
                pending_seen = true;
                active += 1;
            } else if pending_seen {
                return Err(format!("task {key} started after one awaiting admission"));
            }
            if task.is_running() {
                active += 1;
            }
            if index >= before {
                let Body::Decoded(task) = &self.tasks[index].body else {
                    unreachable!("the applied decision's tasks are decoded");
                };
                // The applied decision is checked again against the tasks before it.
                worker
                    .program
                    .descriptor()
                    .check_input(&task.request.input)
                    .map_err(|failure| format!("task {key}: {}", failure.message))?;
            }
        }
        if let Some(key) = repeated_key(keys) {
            return Err(format!("task key {key} is repeated"));
        }
        processes.sort_unstable_by_key(|process| u128::from_be_bytes(*process.as_bytes()));
        if let Some(pair) = processes.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(format!("process {} is repeated", pair[0]));
        }
        if active > shared.max_concurrent as usize {
            return Err(format!(
                "{active} active tasks exceed the limit of {}",
                shared.max_concurrent
            ));
        }
        Ok(())
    }

    fn check_controls(&self, shared: &Shared, turn: &TurnRecord) -> Result<(), String> {
        if self.controls.len() > shared.max_controls as usize {
            return Err(format!(
                "{} controls exceed the limit of {}",
                self.controls.len(),
                shared.max_controls
            ));
        }
        let decided = turn.decided.map_or(0, |d| d.tasks as usize);
        let before = self.tasks.len() - decided;
        let targets = self
            .controls
            .iter()
            .map(|receipt| receipt.control.task.as_str())
            .collect();
        let admitted = self.keys_among(&targets, before, true);
        let tasks_pending = self.last_is_pending();
        let mut pending_seen = false;
        for receipt in &self.controls {
            let key = &receipt.control.task;
            if !admitted.contains(key.as_str()) {
                return Err(format!(
                    "control of {key} targets no task admitted before its decision"
                ));
            }
            match &receipt.result {
                None => {
                    if turn.decided.is_none() {
                        return Err(format!("control of {key} is unapplied outside applying"));
                    }
                    pending_seen = true;
                }
                Some(_) if pending_seen || tasks_pending => {
                    return Err(format!(
                        "control of {key} has a result recorded before earlier work"
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use baton_run::{ChildKey, Name, ProcessId, StartId};

    use super::*;
    use crate::wire::{Control, TaskRequest};

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
        record.push_task(Task::pending(request)).expect("encodes");
        let process = ProcessId::root(&StartId::new("s", "k").expect("id"));
        record.record(0, Fact::Started(process)).expect("encodes");
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
            state: Payload::parse_str(r#"{"b":2,"a":1}"#).expect("json"),
        });
        let text = record.text().expect("writes");
        assert_eq!(Payload::parse_str(&text).expect("valid").as_str(), text);
    }

    /// A recorded fact is written into the task's text in place; the text
    /// must be exactly the task's canonical encoding.
    #[test]
    fn a_recorded_fact_writes_the_tasks_canonical_text() {
        let request = |key: &str| {
            TaskRequest::new(
                ChildKey::new(key).expect("key"),
                Name::new("w.echo").expect("name"),
                Payload::parse_str(r#"{"z":{"y":1,"b":[2]},"a":"x\"y"}"#).expect("json"),
            )
        };
        let process = |key: &str| ProcessId::root(&StartId::new("s", key).expect("id"));
        let failure = Failure::external("w.failed", "a \"quoted\"\nline");
        let outcomes =
            [
                Termination::completed(Payload::parse_str(r#"{"b":null,"a":1}"#).expect("json")),
                Termination::failed(failure.clone())
                    .with_unresolved(vec![baton_run::EffectId::new(process("e"), 1, 2)]),
            ];
        let mut record = Record::default();
        let mut expected = Vec::new();
        for (index, outcome) in outcomes.iter().enumerate() {
            let key = format!("t{index}");
            let mut task = Task::pending(request(&key));
            record.push_task(task.clone()).expect("encodes");
            task.process = Some(process(&key));
            record
                .record(2 * index, Fact::Started(process(&key)))
                .expect("records");
            task.outcome = Some(outcome.clone());
            record
                .record(2 * index, Fact::Drained(outcome.clone()))
                .expect("records");
            expected.push(task);
            let mut refused = Task::pending(request(&format!("r{index}")));
            record.push_task(refused.clone()).expect("encodes");
            refused.rejection = Some(failure.clone());
            record
                .record(2 * index + 1, Fact::Refused(failure.clone()))
                .expect("records");
            expected.push(refused);
        }
        let mut text = String::new();
        record.write_tasks(&mut text);
        assert_eq!(text, Payload::encode(&expected).expect("encodes").as_str());
        assert!(
            record.record(0, Fact::Started(process("x"))).is_err(),
            "a drained task does not start again"
        );
    }
}
