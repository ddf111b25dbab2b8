//! The team's recorded state and the rules it keeps.
//!
//! The phase is never stored: it follows from the facts, checked in this
//! order: completed; ready (no turn yet); in a turn (no decision yet; the
//! coordinator's process is missing until its start result arrives);
//! applying (a decision's start result or control receipt is missing);
//! waiting (a decided `wait` turn with every result in). Restore rejects
//! every combination of facts no run can produce ([`Record::check`]).
//!
//! How the record is kept, written and read (each task as its canonical
//! JSON, settled tasks never decoded, restore by difference) is the
//! `codec`'s; this module reads the facts it keeps.

use std::collections::BTreeSet;

use baton_run::program::SchemaViolation;
use baton_run::{ChildKey, Failure, Payload, ProcessId, Quota, Settlement, Termination};
use serde::{Deserialize, Serialize};

use crate::codec::{CodecError, Tasks};
use crate::team::Shared;
use crate::wire::{Control, Mode};

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
        deserialize_with = "baton_run::program::deserialize_present"
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

/// A run of turns that made no progress, each deciding what the one before
/// it decided: how many, and the digest of that decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Stall {
    pub count: u32,
    pub decision: baton_run::Digest,
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
        deserialize_with = "baton_run::program::deserialize_present"
    )]
    pub coordinator: Option<ProcessId>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "baton_run::program::deserialize_present"
    )]
    pub decided: Option<Decided>,
    pub number: u64,
    /// Whether a task outcome arrived while the coordinator ran.
    #[serde(
        default,
        skip_serializing_if = "std::ops::Not::not",
        deserialize_with = "crate::codec::record::only_true"
    )]
    pub outcome_arrived: bool,
    /// The run of turns without progress this turn continues, if any (the
    /// stall guard): carried into the next turn by the decision.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "baton_run::program::deserialize_present"
    )]
    pub stalled: Option<Stall>,
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
    /// The tasks, in request order, as the codec keeps them.
    pub tasks: Tasks,
    pub controls: Vec<Receipt>,
    pub turn: Option<TurnRecord>,
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

/// Why a recorded state does not restore: it does not decode, or it holds
/// a combination of facts no run produces. Restore reports it as
/// `team.state.invalid`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StateError {
    /// The text is not a recorded state (see [`CodecError`]).
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// A completed state holds something besides its marker.
    #[error("a completed state holds nothing else")]
    CompletedHoldsMore,
    /// A state before turn 1 lacks the team's input.
    #[error("a state before turn 1 needs the initial state")]
    NoInitialState,
    /// A state before turn 1 holds tasks or controls.
    #[error("a state before turn 1 has no tasks or controls")]
    WorkBeforeTurn,
    /// The team's input fails the team's state schema.
    #[error("initial state: {0}")]
    InitialState(SchemaViolation),
    /// The team's input is kept after turn 1 started.
    #[error("the initial state is kept only before turn 1")]
    InitialAfterTurn,
    /// Turn 0.
    #[error("turn numbers start at 1")]
    TurnZero,
    /// A run of turns without progress that is empty or longer than the
    /// turns so far.
    #[error("a run of {count} turns without progress cannot end at turn {number}")]
    StallRun {
        /// The run's length.
        count: u32,
        /// The turn.
        number: u64,
    },
    /// A turn beyond `max_turns`.
    #[error("turn {number} is beyond the limit of {limit} turns")]
    TurnBeyondLimit {
        /// The turn's number.
        number: u64,
        /// `max_turns`.
        limit: Quota,
    },
    /// The working state fails the team's state schema.
    #[error("working state: {0}")]
    WorkingState(SchemaViolation),
    /// A turn says an outcome arrived, but no task has one.
    #[error("an outcome arrived but none is recorded")]
    OutcomeNotRecorded,
    /// A decided turn without its coordinator's process.
    #[error("a decided turn needs its coordinator's process")]
    DecidedWithoutCoordinator,
    /// A waiting turn that the mode rule would not have left waiting.
    #[error("a waiting turn must follow the wait rule")]
    WaitRule,
    /// A waiting turn whose decision had actions but no refused start (its
    /// wait went out with its actions).
    #[error("a waiting turn whose decision has actions needs a refused start")]
    WaitWithActions,
    /// More tasks than `max_tasks`.
    #[error("{count} tasks exceed the limit of {limit}")]
    TooManyTasks {
        /// How many tasks are recorded.
        count: usize,
        /// `max_tasks`.
        limit: Quota,
    },
    /// The decision counts more tasks than the record holds.
    #[error("the decision declares more tasks than are recorded")]
    DecidedTasksMissing,
    /// A task key with the coordinator's reserved prefix.
    #[error("task key {key} uses the reserved prefix")]
    ReservedKey {
        /// The key.
        key: String,
    },
    /// A task names a worker the team does not have.
    #[error("task {key} names an unknown worker")]
    UnknownWorker {
        /// The task's key.
        key: String,
    },
    /// A task awaiting admission before the applied decision's tasks.
    #[error("task {key} awaits admission outside its decision")]
    PendingOutsideDecision {
        /// The task's key.
        key: String,
    },
    /// A task with a start result after one still awaiting admission.
    #[error("task {key} started after one awaiting admission")]
    StartedAfterPending {
        /// The task's key.
        key: String,
    },
    /// A task of the applied decision whose input its worker refuses.
    #[error("task {key}: {}", .failure.message)]
    TaskInput {
        /// The task's key.
        key: String,
        /// The worker's refusal.
        failure: Failure,
    },
    /// Two tasks share a key.
    #[error("task key {key} is repeated")]
    RepeatedKey {
        /// The key.
        key: String,
    },
    /// Two tasks share a process.
    #[error("process {process} is repeated")]
    RepeatedProcess {
        /// The process.
        process: ProcessId,
    },
    /// More active tasks than `max_concurrent_tasks`.
    #[error("{active} active tasks exceed the limit of {limit}")]
    TooManyActive {
        /// Tasks running or awaiting admission.
        active: usize,
        /// `max_concurrent_tasks`.
        limit: u32,
    },
    /// More controls than `max_controls_per_turn`.
    #[error("{count} controls exceed the limit of {limit}")]
    TooManyControls {
        /// How many controls are recorded.
        count: usize,
        /// `max_controls_per_turn`.
        limit: u32,
    },
    /// A control whose task was not admitted before its decision.
    #[error("control of {key} targets no task admitted before its decision")]
    ControlTarget {
        /// The targeted key.
        key: ChildKey,
    },
    /// A control without a receipt outside applying.
    #[error("control of {key} is unapplied outside applying")]
    UnappliedControl {
        /// The targeted key.
        key: ChildKey,
    },
    /// A receipt recorded before the start results or receipts before it.
    #[error("control of {key} has a result recorded before earlier work")]
    ReceiptBeforeEarlierWork {
        /// The targeted key.
        key: ChildKey,
    },
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

/// What a restore by difference has checked of a record before
/// [`Record::check_with`]: its first `leading` tasks are, byte for byte,
/// tasks of a state of this team that was accepted, and no two of its
/// tasks share a key or a process.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Vouched {
    /// How many leading tasks come from the accepted state.
    pub leading: usize,
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
            .is_some_and(|last| self.tasks.facts(last).is_pending())
    }

    /// The facts of every task, in request order.
    pub fn all(&self) -> impl Iterator<Item = Facts<'_>> {
        (0..self.tasks.len()).map(|index| self.tasks.facts(index))
    }

    /// Tasks admitted whose drained outcome has not been observed.
    pub fn running(&self) -> usize {
        self.tasks
            .decoded()
            .filter(|(_, task)| task.is_running())
            .count()
    }

    /// Keys of the running tasks, in request order.
    pub fn running_keys(&self) -> Vec<ChildKey> {
        self.tasks
            .decoded()
            .filter(|(_, task)| task.is_running())
            .map(|(_, task)| task.key().clone())
            .collect()
    }

    /// Keys of the tasks running or awaiting admission, in request order:
    /// what a wait declared with a decision's starts names (today's running
    /// tasks, then the new ones).
    pub fn active_keys(&self) -> Vec<ChildKey> {
        self.tasks
            .decoded()
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
            .tasks
            .decoded()
            .any(|(_, task)| task.is_running() || task.is_pending())
    }

    /// The index of the running task under `key`.
    pub fn running_index(&self, key: &ChildKey) -> Option<usize> {
        self.tasks
            .decoded()
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
        self.tasks
            .decoded()
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
            let task = self.tasks.facts(index);
            if (!admitted || task.process.is_some())
                && let Some(key) = wanted.get(task.key)
            {
                found.insert(*key);
            }
        }
        found
    }

    /// Every rule a recorded state must keep; the first broken rule is the
    /// error.
    pub fn check(&self, shared: &Shared) -> Result<(), StateError> {
        self.check_with(shared, None)
    }

    /// [`Record::check`], less what `vouched` holds for already. A record
    /// it accepts is one `check` accepts; a record it rejects, `check`
    /// rejects too, though with its own first error.
    pub(crate) fn check_with(
        &self,
        shared: &Shared,
        vouched: Option<Vouched>,
    ) -> Result<(), StateError> {
        if self.completed {
            if self.initial.is_some()
                || !self.tasks.is_empty()
                || !self.controls.is_empty()
                || self.turn.is_some()
            {
                return Err(StateError::CompletedHoldsMore);
            }
            return Ok(());
        }
        let Some(turn) = &self.turn else {
            let Some(initial) = &self.initial else {
                return Err(StateError::NoInitialState);
            };
            if !self.tasks.is_empty() || !self.controls.is_empty() {
                return Err(StateError::WorkBeforeTurn);
            }
            return shared
                .check_state(initial)
                .map_err(StateError::InitialState);
        };
        if self.initial.is_some() {
            return Err(StateError::InitialAfterTurn);
        }
        if turn.number == 0 {
            return Err(StateError::TurnZero);
        }
        if let Some(run) = turn.stalled
            && (run.count == 0 || u64::from(run.count) > turn.number)
        {
            return Err(StateError::StallRun {
                count: run.count,
                number: turn.number,
            });
        }
        if !shared.max_turns.allows(0, turn.number) {
            return Err(StateError::TurnBeyondLimit {
                number: turn.number,
                limit: shared.max_turns,
            });
        }
        shared
            .check_state(&turn.state)
            .map_err(StateError::WorkingState)?;
        if turn.outcome_arrived && !self.all().any(|task| task.drained) {
            return Err(StateError::OutcomeNotRecorded);
        }
        self.check_tasks(shared, turn, vouched)?;
        self.check_controls(shared, turn)?;
        match (turn.decided, self.phase()) {
            (None, _) => Ok(()),
            (Some(_), _) if turn.coordinator.is_none() => {
                Err(StateError::DecidedWithoutCoordinator)
            }
            (Some(decided), Phase::Waiting) => {
                if decided.mode != Mode::Wait || turn.outcome_arrived || self.running() == 0 {
                    return Err(StateError::WaitRule);
                }
                // A decision with actions declared its wait with them, so
                // its turn waits on its own only when that wait was refused
                // for a refused start.
                let actions = decided.tasks > 0 || !self.controls.is_empty();
                let start = self.tasks.len() - decided.tasks as usize;
                if actions
                    && !(start..self.tasks.len()).any(|index| self.tasks.facts(index).refused)
                {
                    return Err(StateError::WaitWithActions);
                }
                Ok(())
            }
            (Some(_), _) => Ok(()),
        }
    }

    fn check_tasks(
        &self,
        shared: &Shared,
        turn: &TurnRecord,
        vouched: Option<Vouched>,
    ) -> Result<(), StateError> {
        if !shared.max_tasks.allows(0, self.tasks.len() as u64) {
            return Err(StateError::TooManyTasks {
                count: self.tasks.len(),
                limit: shared.max_tasks,
            });
        }
        let decided = turn.decided.map_or(0, |d| d.tasks as usize);
        if decided > self.tasks.len() {
            return Err(StateError::DecidedTasksMissing);
        }
        let before = self.tasks.len() - decided;
        let leading = vouched.map_or(0, |vouched| vouched.leading);
        let unique = vouched.is_some();
        let mut keys = Vec::with_capacity(if unique { 0 } else { self.tasks.len() });
        let mut processes = Vec::with_capacity(if unique { 0 } else { self.tasks.len() });
        let mut pending_seen = false;
        let mut active = 0usize;
        for index in 0..self.tasks.len() {
            let task = self.tasks.facts(index);
            let key = task.key;
            // A vouched task was checked alone in an accepted state of
            // this team; the applied decision's are checked again below.
            let worker = if index >= leading || index >= before {
                if key.starts_with(crate::RESERVED_PREFIX) {
                    return Err(StateError::ReservedKey { key: key.into() });
                }
                let Some(worker) = shared.worker_named(task.worker) else {
                    return Err(StateError::UnknownWorker { key: key.into() });
                };
                Some(worker)
            } else {
                None
            };
            if !unique {
                keys.push(key);
                processes.extend(task.process);
            }
            if task.is_pending() {
                if index < before {
                    return Err(StateError::PendingOutsideDecision { key: key.into() });
                }
                pending_seen = true;
                active += 1;
            } else if pending_seen {
                return Err(StateError::StartedAfterPending { key: key.into() });
            }
            if task.is_running() {
                active += 1;
            }
            if index >= before
                && let Some(worker) = worker
            {
                let task = self
                    .tasks
                    .decoded_at(index)
                    .expect("the applied decision's tasks are decoded");
                // The applied decision is checked again against the tasks before it.
                worker
                    .program
                    .descriptor()
                    .check_input(&task.request.input)
                    .map_err(|failure| StateError::TaskInput {
                        key: key.into(),
                        failure,
                    })?;
            }
        }
        if let Some(key) = repeated_key(keys) {
            return Err(StateError::RepeatedKey { key: key.into() });
        }
        processes.sort_unstable_by_key(|process| u128::from_be_bytes(*process.as_bytes()));
        if let Some(pair) = processes.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(StateError::RepeatedProcess { process: pair[0] });
        }
        if active > shared.max_concurrent as usize {
            return Err(StateError::TooManyActive {
                active,
                limit: shared.max_concurrent,
            });
        }
        Ok(())
    }

    fn check_controls(&self, shared: &Shared, turn: &TurnRecord) -> Result<(), StateError> {
        if self.controls.len() > shared.max_controls as usize {
            return Err(StateError::TooManyControls {
                count: self.controls.len(),
                limit: shared.max_controls,
            });
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
                return Err(StateError::ControlTarget { key: key.clone() });
            }
            match &receipt.result {
                None => {
                    if turn.decided.is_none() {
                        return Err(StateError::UnappliedControl { key: key.clone() });
                    }
                    pending_seen = true;
                }
                Some(_) if pending_seen || tasks_pending => {
                    return Err(StateError::ReceiptBeforeEarlierWork { key: key.clone() });
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}
