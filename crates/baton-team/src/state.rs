//! The team's recorded state and its strict restore.
//!
//! The phase is never stored: it follows from the facts, checked in this
//! order: completed; ready (no turn yet); in a turn (no decision yet; the
//! coordinator's process is missing until its start result arrives);
//! applying (a decision's start result or control receipt is missing);
//! waiting (a decided `wait` turn with every result in). Restore rejects
//! every combination of facts no run can produce.

use std::collections::BTreeSet;

use baton_run::{Payload, ProcessId, Settlement};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use crate::team::Shared;
use crate::wire::{Control, Mode, Task, present, present_value};

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
        deserialize_with = "present_value"
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
        deserialize_with = "present_value"
    )]
    pub coordinator: Option<ProcessId>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present_value"
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

/// The whole recorded state, in memory. Task bodies are kept with their
/// encoded JSON (`fragments`), so snapshots and turns reuse the encoding of
/// tasks that did not change.
#[derive(Clone, Debug, Default)]
pub(crate) struct Record {
    pub completed: bool,
    /// The team's input, only before turn 1.
    pub initial: Option<Payload>,
    pub tasks: Vec<Task>,
    pub fragments: Vec<Box<RawValue>>,
    pub controls: Vec<Receipt>,
    pub turn: Option<TurnRecord>,
}

/// The encoding of a [`Record`]: fields in key order and every part
/// canonical, so the text is canonical as written and becomes a payload
/// without being re-encoded.
#[derive(Serialize)]
struct RecordOut<'a> {
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    completed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    controls: Option<Payload>,
    #[serde(skip_serializing_if = "Option::is_none")]
    initial: Option<&'a Payload>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tasks: &'a [Box<RawValue>],
    /// [`TurnRecord`] declares its fields in key order.
    #[serde(skip_serializing_if = "Option::is_none")]
    turn: Option<&'a TurnRecord>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordIn<'a> {
    #[serde(default, deserialize_with = "only_true")]
    completed: bool,
    #[serde(default, deserialize_with = "present")]
    initial: Option<Payload>,
    #[serde(default, borrow, deserialize_with = "non_empty")]
    tasks: Option<Vec<&'a RawValue>>,
    #[serde(default, deserialize_with = "non_empty")]
    controls: Option<Vec<Receipt>>,
    #[serde(default, deserialize_with = "present_value")]
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
    pub fn phase(&self) -> Phase {
        if self.completed {
            return Phase::Completed;
        }
        let Some(turn) = &self.turn else {
            return Phase::Ready;
        };
        if turn.decided.is_none() {
            Phase::InTurn
        } else if self.tasks.last().is_some_and(Task::is_pending)
            || self.controls.last().is_some_and(|r| r.result.is_none())
        {
            Phase::Applying
        } else {
            Phase::Waiting
        }
    }

    /// Tasks admitted whose drained outcome has not been observed.
    pub fn running(&self) -> usize {
        self.tasks.iter().filter(|task| task.is_running()).count()
    }

    /// Encodes one task's body.
    pub fn encode_task(task: &Task) -> Result<Box<RawValue>, String> {
        Payload::encode(task)
            .map(|task| task.as_raw().to_owned())
            .map_err(|error| error.to_string())
    }

    /// Appends a task with its encoding.
    pub fn push_task(&mut self, task: Task) -> Result<(), String> {
        self.fragments.push(Self::encode_task(&task)?);
        self.tasks.push(task);
        Ok(())
    }

    /// Re-encodes task `index` after a fact about it was recorded.
    pub fn refresh(&mut self, index: usize) -> Result<(), String> {
        self.fragments[index] = Self::encode_task(&self.tasks[index])?;
        Ok(())
    }

    /// The canonical JSON of the record.
    pub fn encode(&self) -> Result<Payload, String> {
        Payload::parse_str(&self.text()?).map_err(|error| error.to_string())
    }

    /// The record's JSON, canonical as written (see [`RecordOut`]).
    fn text(&self) -> Result<String, String> {
        let controls = (!self.controls.is_empty())
            .then(|| Payload::encode(&self.controls))
            .transpose()
            .map_err(|error| error.to_string())?;
        serde_json::to_string(&RecordOut {
            completed: self.completed,
            controls,
            initial: self.initial.as_ref(),
            tasks: &self.fragments,
            turn: self.turn.as_ref(),
        })
        .map_err(|error| error.to_string())
    }

    /// Decodes a recorded state strictly and checks it against the
    /// configuration.
    pub fn decode(state: &Payload, shared: &Shared) -> Result<Record, String> {
        let wire: RecordIn<'_> =
            serde_json::from_str(state.as_str()).map_err(|error| error.to_string())?;
        let raw = wire.tasks.unwrap_or_default();
        let mut tasks = Vec::with_capacity(raw.len());
        let mut fragments = Vec::with_capacity(raw.len());
        for fragment in raw {
            tasks.push(
                serde_json::from_str::<Task>(fragment.get()).map_err(|error| error.to_string())?,
            );
            fragments.push(fragment.to_owned());
        }
        let record = Record {
            completed: wire.completed,
            initial: wire.initial,
            tasks,
            fragments,
            controls: wire.controls.unwrap_or_default(),
            turn: wire.turn,
        };
        record.check(shared)?;
        Ok(record)
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
        if turn.outcome_arrived && !self.tasks.iter().any(|task| task.outcome.is_some()) {
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
                    Err("a waiting turn must follow the wait rule".into())
                } else {
                    Ok(())
                }
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
        let mut keys = BTreeSet::new();
        let mut processes = BTreeSet::new();
        let mut pending_seen = false;
        let mut active = 0usize;
        for (index, task) in self.tasks.iter().enumerate() {
            let key = task.key();
            if !keys.insert(key.as_str()) {
                return Err(format!("task key {key} is repeated"));
            }
            if key.as_str().starts_with(crate::RESERVED_PREFIX) {
                return Err(format!("task key {key} uses the reserved prefix"));
            }
            let Some(worker) = shared.worker(&task.request.worker) else {
                return Err(format!("task {key} names an unknown worker"));
            };
            if let Some(process) = task.process
                && !processes.insert(process)
            {
                return Err(format!("process {process} is repeated"));
            }
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
                // The applied decision is checked again against the tasks before it.
                worker
                    .program
                    .descriptor()
                    .check_input(&task.request.input)
                    .map_err(|failure| format!("task {key}: {}", failure.message))?;
            }
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
        let before = &self.tasks[..self.tasks.len() - decided];
        let tasks_pending = self.tasks.last().is_some_and(Task::is_pending);
        let mut pending_seen = false;
        for receipt in &self.controls {
            let key = &receipt.control.task;
            let admitted = before
                .iter()
                .any(|task| task.key() == key && task.process.is_some());
            if !admitted {
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
        record.tasks[0].process = Some(process);
        record.refresh(0).expect("encodes");
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
}
