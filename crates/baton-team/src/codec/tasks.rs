//! The task list as a team keeps it between steps.
//!
//! Every task is kept as a [`Payload`] of its canonical JSON, which
//! snapshots and turns copy as it is (through a [`PayloadWriter`], which
//! never scans it again): made once from its span of the restored state
//! and handed on by the memo while the task is unchanged, then its new
//! encoding once a fact about it is recorded. Beside its JSON the list
//! keeps what steps need of a task: the whole task for every one a step can
//! change (awaiting admission or running) and for those of the applied
//! decision (whose inputs restore checks again); for a settled task
//! (refused, or drained with its outcome recorded), checked through a
//! borrowed view and never decoded, only its key and worker, as spans of
//! the restored state, and its process. So a step costs the team one pass
//! over the recorded text plus work in proportion to the tasks that can
//! change.

use baton_run::program::PayloadWriter;
use baton_run::{Payload, ProcessId};
use std::ops::Range;

use super::CodecError;
use super::memo::Seen;
use crate::state::{Fact, Facts};
use crate::wire::Task;

/// The tasks of a record, in request order.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tasks {
    /// The state these tasks were restored from: the keys and workers of
    /// settled tasks are spans of it.
    source: Option<Payload>,
    /// The tasks, in request order.
    entries: Vec<Entry>,
    /// Indices of the decoded tasks, in request order: every task a step can
    /// change is among them.
    decoded: Vec<usize>,
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

impl Tasks {
    /// The tasks restore read from `state` (`seen`, every task in request
    /// order): those from index `before` on (the applied decision's) and
    /// every one a step can change are decoded in full, the others kept as
    /// spans of `state`.
    pub(super) fn restored(
        state: &Payload,
        seen: &[Seen],
        before: usize,
    ) -> Result<Tasks, CodecError> {
        let text = state.as_str();
        let mut entries = Vec::with_capacity(seen.len());
        let mut decoded = Vec::new();
        for (index, task) in seen.iter().enumerate() {
            let body = if task.live || index >= before {
                decoded.push(index);
                Body::Decoded(Box::new(serde_json::from_str(&text[task.span.clone()])?))
            } else {
                Body::Settled {
                    key: task.key.clone(),
                    worker: task.worker.clone(),
                    process: task.process,
                }
            };
            entries.push(Entry {
                text: task.payload.clone(),
                body,
            });
        }
        Ok(Tasks {
            source: Some(state.clone()),
            entries,
            decoded,
        })
    }

    /// How many tasks were ever requested, refused starts included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no task was ever requested.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The facts of task `index`.
    pub fn facts(&self, index: usize) -> Facts<'_> {
        match &self.entries[index].body {
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

    fn source(&self) -> &str {
        self.source
            .as_ref()
            .expect("restored tasks point into the state they were restored from")
            .as_str()
    }

    /// The decoded tasks (every one a step can change) with their indices.
    pub fn decoded(&self) -> impl Iterator<Item = (usize, &Task)> {
        self.decoded
            .iter()
            .map(|&index| match &self.entries[index].body {
                Body::Decoded(task) => (index, &**task),
                Body::Settled { .. } => unreachable!("the decoded list holds decoded tasks"),
            })
    }

    /// Task `index`, when it is decoded (every task a step can change, and
    /// every task of the applied decision, is).
    pub fn decoded_at(&self, index: usize) -> Option<&Task> {
        match &self.entries[index].body {
            Body::Decoded(task) => Some(task),
            Body::Settled { .. } => None,
        }
    }

    /// Appends a task with its encoding.
    pub fn push(&mut self, task: Task) -> Result<(), CodecError> {
        let text = Payload::encode(&task)?;
        self.decoded.push(self.entries.len());
        self.entries.push(Entry {
            text,
            body: Body::Decoded(Box::new(task)),
        });
        Ok(())
    }

    /// Records a fact about task `index`: a start result of a task awaiting
    /// admission, or the outcome of a running one.
    pub fn record(&mut self, index: usize, fact: Fact) -> Result<(), CodecError> {
        let entry = &mut self.entries[index];
        let Body::Decoded(task) = &mut entry.body else {
            unreachable!("only tasks awaiting admission or running change, and they are decoded");
        };
        let expected = match fact {
            Fact::Started(_) | Fact::Refused(_) => task.is_pending(),
            Fact::Drained(_) => task.is_running(),
        };
        if !expected {
            return Err(CodecError::FactOutOfOrder {
                key: task.key().clone(),
            });
        }
        // The task gains its members in the reverse of their key order
        // (`request`, then `process` or `rejection`, then `outcome`), so the
        // new member comes first: its canonical text is the member, then
        // the members the task had, copied.
        let (name, value) = match &fact {
            Fact::Started(process) => ("process", Payload::encode(process)?),
            Fact::Refused(failure) => ("rejection", Payload::encode(failure)?),
            Fact::Drained(termination) => ("outcome", Payload::encode(termination)?),
        };
        entry.text = entry.text.with_first_member(name, &value)?;
        match fact {
            Fact::Started(process) => task.process = Some(process),
            Fact::Refused(failure) => task.rejection = Some(failure),
            Fact::Drained(termination) => task.outcome = Some(termination),
        }
        Ok(())
    }

    /// Writes the canonical JSON array of the tasks, copying each task's
    /// text as it is.
    pub fn write_array(&self, out: &mut PayloadWriter) -> Result<(), CodecError> {
        out.begin_array()?;
        for entry in &self.entries {
            out.value(&entry.text)?;
        }
        Ok(out.end_array()?)
    }

    /// Writes the canonical JSON array of the tasks as text.
    #[cfg(test)]
    pub fn write_text(&self, out: &mut String) {
        let mut writer = PayloadWriter::new();
        self.write_array(&mut writer).expect("writes");
        out.push_str(writer.finish().expect("finishes").as_str());
    }

    /// The length of the tasks' texts, to size the buffers they are
    /// written to.
    pub fn text_len(&self) -> usize {
        self.entries
            .iter()
            .map(|entry| entry.text.len() + 1)
            .sum::<usize>()
            + 2
    }
}

#[cfg(test)]
mod tests {
    use baton_run::{ChildKey, Failure, Name, StartId, Termination};

    use super::*;
    use crate::wire::TaskRequest;

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
        let mut tasks = Tasks::default();
        let mut expected = Vec::new();
        for (index, outcome) in outcomes.iter().enumerate() {
            let key = format!("t{index}");
            let mut task = Task::pending(request(&key));
            tasks.push(task.clone()).expect("encodes");
            task.process = Some(process(&key));
            tasks
                .record(2 * index, Fact::Started(process(&key)))
                .expect("records");
            task.outcome = Some(outcome.clone());
            tasks
                .record(2 * index, Fact::Drained(outcome.clone()))
                .expect("records");
            expected.push(task);
            let mut refused = Task::pending(request(&format!("r{index}")));
            tasks.push(refused.clone()).expect("encodes");
            refused.rejection = Some(failure.clone());
            tasks
                .record(2 * index + 1, Fact::Refused(failure.clone()))
                .expect("records");
            expected.push(refused);
        }
        let mut text = String::new();
        tasks.write_text(&mut text);
        assert_eq!(text, Payload::encode(&expected).expect("encodes").as_str());
        assert!(
            matches!(
                tasks.record(0, Fact::Started(process("x"))),
                Err(CodecError::FactOutOfOrder { .. })
            ),
            "a drained task does not start again"
        );
    }
}
