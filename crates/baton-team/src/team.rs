//! The team definition and its execution: turns, decision validation,
//! applying decisions, and the mode rule.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use baton_run::{
    Boundary, ChildKey, ChildOutcome, Condition, Definition, Descriptor, Effect, Execution,
    ExecutionState, Failure, FailureKind, Name, Payload, Program, Quota, SchemaViolation,
    Settlement, Signal, SignalBody, Status, StepError, Termination, Transition,
};
use serde_json::value::RawValue;

use crate::state::{Decided, Fact, ObjectWriter, Phase, Receipt, Record, TurnRecord};
use crate::wire::{ControlAction, Decision, Mode, Task};
use crate::{
    Binding, COORDINATOR_UNRESOLVED, COUNTER_EXHAUSTED, Config, DECISION_INVALID, LIMIT_TURNS,
    PROTOCOL_INVALID, RESERVED_PREFIX, STATE_INVALID,
};

/// The frozen configuration every execution of one team shares.
pub(crate) struct Shared {
    descriptor: Descriptor,
    coordinator: Binding,
    workers: Vec<Binding>,
    by_name: BTreeMap<Box<str>, usize>,
    /// The canonical JSON of the workers' descriptors, encoded once.
    workers_json: Box<RawValue>,
    pub max_turns: Quota,
    pub max_tasks: Quota,
    pub max_concurrent: u32,
    pub max_controls: u32,
}

impl Shared {
    pub fn worker(&self, name: &Name) -> Option<&Binding> {
        self.worker_named(name.as_str())
    }

    /// The worker named `name` (so `name` is a valid name).
    pub fn worker_named(&self, name: &str) -> Option<&Binding> {
        self.by_name.get(name).map(|index| &self.workers[*index])
    }

    pub fn check_state(&self, state: &Payload) -> Result<(), SchemaViolation> {
        self.descriptor.input_schema().validate(state)
    }
}

/// The team [`Definition`].
pub(crate) struct Team {
    shared: Arc<Shared>,
}

impl Team {
    pub fn new(descriptor: Descriptor, config: Config) -> Result<Team, serde_json::Error> {
        let by_name = config
            .workers
            .iter()
            .enumerate()
            .map(|(index, worker)| (worker.program.descriptor().name().as_str().into(), index))
            .collect();
        let descriptors: Vec<&Descriptor> = config
            .workers
            .iter()
            .map(|worker| worker.program.descriptor())
            .collect();
        let workers_json = Payload::encode(&descriptors)
            .map_err(<serde_json::Error as serde::ser::Error>::custom)?
            .as_raw()
            .to_owned();
        Ok(Team {
            shared: Arc::new(Shared {
                descriptor,
                coordinator: config.coordinator,
                workers: config.workers,
                by_name,
                workers_json,
                max_turns: config.max_turns,
                max_tasks: config.max_tasks,
                max_concurrent: config.max_concurrent_tasks,
                max_controls: config.max_controls_per_turn,
            }),
        })
    }
}

impl Definition for Team {
    fn descriptor(&self) -> &Descriptor {
        &self.shared.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(TeamRun {
            shared: self.shared.clone(),
            record: Record::ready(input.clone()),
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        let record = Record::decode(&state.0, &self.shared).map_err(|message| {
            contract(STATE_INVALID, format!("team: invalid state: {message}"))
        })?;
        Ok(Box::new(TeamRun {
            shared: self.shared.clone(),
            record,
        }))
    }

    fn children(&self) -> Vec<Program> {
        std::iter::once(&self.shared.coordinator)
            .chain(&self.shared.workers)
            .map(|binding| binding.program.clone())
            .collect()
    }
}

fn contract(code: &str, message: impl Into<String>) -> StepError {
    StepError::classified(FailureKind::Contract, code, message)
}

fn protocol(message: impl std::fmt::Display) -> StepError {
    contract(
        PROTOCOL_INVALID,
        format!("team: invalid protocol: {message}"),
    )
}

fn invalid(message: impl std::fmt::Display) -> StepError {
    contract(
        DECISION_INVALID,
        format!("team: invalid decision: {message}"),
    )
}

fn encoding(message: String) -> StepError {
    StepError::other(format!("team: encoding failed: {message}"))
}

/// The kernel's code for a children wait it refuses (here: one naming a
/// task whose start was refused).
const WAIT_INVALID: &str = "engine.child.wait.invalid";

/// The key of turn `number`'s coordinator.
fn turn_key(number: u64) -> ChildKey {
    ChildKey::new(format!("{RESERVED_PREFIX}{number}"))
        .expect("a reserved prefix and a number form a valid key")
}

/// What a step leads to.
enum Next {
    Continue(Vec<Effect>),
    Complete(Payload),
}

/// One running team.
struct TeamRun {
    shared: Arc<Shared>,
    record: Record,
}

impl Execution for TeamRun {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        let consumed = window.len();
        let next = match self.record.phase() {
            Phase::Completed => return Err(protocol("a completed team was stepped")),
            Phase::Ready => {
                if let Some(signal) = window.first() {
                    return Err(protocol(format!(
                        "unexpected signal {} before turn 1",
                        signal.id
                    )));
                }
                let state = self
                    .record
                    .initial
                    .take()
                    .expect("a ready state holds its initial state");
                self.open_turn(1, state)?
            }
            Phase::InTurn => self.on_turn(window)?,
            Phase::Applying => self.on_applied(window)?,
            Phase::Waiting => self.on_waited(window)?,
        };
        Ok(match next {
            Next::Continue(effects) => Transition::Continue { consumed, effects },
            Next::Complete(output) => Transition::Complete { consumed, output },
        })
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        self.record.encode().map(ExecutionState).map_err(encoding)
    }
}

impl TeamRun {
    fn turn(&self) -> &TurnRecord {
        self.record.turn.as_ref().expect("the phase has a turn")
    }

    fn turn_mut(&mut self) -> &mut TurnRecord {
        self.record.turn.as_mut().expect("the phase has a turn")
    }

    /// Starts turn `number` with `state`: the coordinator, then the turn's
    /// one wait over the running tasks and the coordinator.
    fn open_turn(&mut self, number: u64, state: Payload) -> Result<Next, StepError> {
        if !self.shared.max_turns.allows(0, number) {
            return Err(StepError::classified(
                FailureKind::Execution,
                LIMIT_TURNS,
                format!(
                    "team: turn {number} exceeds the limit of {} turns",
                    self.shared.max_turns
                ),
            ));
        }
        let controls =
            Payload::encode(&self.record.controls).map_err(|error| encoding(error.to_string()))?;
        // Fields in key order, every part canonical: the text is canonical
        // as written, and each task's text is copied as it is.
        let workers: &RawValue = &self.shared.workers_json;
        let mut text = ObjectWriter::with_capacity(
            controls.len() + state.len() + self.record.tasks_len() + workers.get().len() + 64,
        );
        text.field("controls").push_str(controls.as_str());
        text.field("number").push_str(&number.to_string());
        text.field("state").push_str(state.as_str());
        self.record.write_tasks(text.field("tasks"));
        text.field("workers").push_str(workers.get());
        let input =
            Payload::parse_str(&text.finish()).map_err(|error| encoding(error.to_string()))?;
        self.record.turn = Some(TurnRecord {
            number,
            state,
            coordinator: None,
            outcome_arrived: false,
            decided: None,
        });
        let key = turn_key(number);
        let coordinator = &self.shared.coordinator;
        Ok(Next::Continue(vec![
            Effect::StartChild {
                key,
                program: coordinator.program.reference().digest,
                input,
                budget: coordinator.budget.clone(),
                capabilities: coordinator.capabilities.clone(),
            },
            self.turn_wait(number),
        ]))
    }

    /// The wait of a running turn: every running task, then the coordinator.
    fn turn_wait(&self, number: u64) -> Effect {
        let mut keys = self.record.running_keys();
        keys.push(turn_key(number));
        Effect::WaitChildren {
            keys,
            boundary: Boundary::Drained,
            condition: Condition::Any,
        }
    }

    /// Records a running task's drained outcome.
    fn record_outcome(&mut self, child: &ChildOutcome) -> Result<(), StepError> {
        let running = self
            .record
            .running_index(&child.key)
            .filter(|index| self.record.facts(*index).process == Some(child.process));
        let Some(index) = running else {
            return Err(protocol(match self.record.position(child.key.as_str()) {
                None => format!("an outcome for unknown child {}", child.key),
                Some(_) => format!(
                    "an outcome for task {} that is not running as {}",
                    child.key, child.process
                ),
            }));
        };
        self.record
            .record(index, Fact::Drained(child.termination.clone()))
            .map_err(encoding)
    }

    /// A turn's wait settled: the coordinator's start result (on the first
    /// wake-up), then the children at the boundary.
    fn on_turn(&mut self, window: &[Signal]) -> Result<Next, StepError> {
        let number = self.turn().number;
        let key = turn_key(number);
        let mut signals = window.iter();
        if self.turn().coordinator.is_none() {
            match signals.next().map(|signal| &signal.body) {
                Some(SignalBody::ChildStarted {
                    key: started,
                    process,
                    failure,
                    ..
                }) if *started == key => match (process, failure) {
                    (_, Some(failure)) => return Err(StepError(failure.clone())),
                    (Some(process), None) => self.turn_mut().coordinator = Some(*process),
                    (None, None) => return Err(protocol("a start result without a process")),
                },
                other => {
                    return Err(protocol(format!(
                        "expected the start result of {key}, got {other:?}"
                    )));
                }
            }
        }
        let children = match signals.next().map(|signal| &signal.body) {
            Some(SignalBody::ChildrenReady { children, .. }) => children,
            other => {
                return Err(protocol(format!(
                    "expected the turn's wait to settle, got {other:?}"
                )));
            }
        };
        if let Some(extra) = signals.next() {
            return Err(protocol(format!("unexpected signal {}", extra.id)));
        }
        let coordinator = self.turn().coordinator;
        let mut outcome = None;
        for child in children {
            if outcome.is_some() {
                return Err(protocol("the coordinator's outcome must come last"));
            }
            if child.key == key {
                if Some(child.process) != coordinator {
                    return Err(protocol("the coordinator's outcome names another process"));
                }
                outcome = Some(&child.termination);
            } else {
                self.record_outcome(child)?;
                self.turn_mut().outcome_arrived = true;
            }
        }
        match outcome {
            None => Ok(Next::Continue(vec![self.turn_wait(number)])),
            Some(termination) => self.decide(termination),
        }
    }

    /// The coordinator drained: authorize, validate and apply its decision.
    fn decide(&mut self, termination: &Termination) -> Result<Next, StepError> {
        if !termination.unresolved_effects().is_empty() {
            return Err(StepError::classified(
                FailureKind::External,
                COORDINATOR_UNRESOLVED,
                format!(
                    "team: the coordinator of turn {} left {} unresolved effects in its subtree",
                    self.turn().number,
                    termination.unresolved_effects().len()
                ),
            ));
        }
        let Some(output) = termination
            .output()
            .filter(|_| termination.status() == Status::Completed)
        else {
            let failure = termination.failure().cloned().unwrap_or_else(|| {
                Failure::execution(
                    "execution.step.failed",
                    format!("the coordinator ended {}", termination.status()),
                )
            });
            return Err(StepError(failure));
        };
        let decision: Decision = output.decode().map_err(invalid)?;
        validate(&self.shared, &self.record, &decision).map_err(invalid)?;
        if let Some(output) = decision.output {
            self.record = Record::completed();
            return Ok(Next::Complete(output));
        }
        let mode = decision
            .mode
            .expect("validated: a decision without output has a mode");
        let mut effects = Vec::with_capacity(decision.tasks.len() + decision.controls.len());
        let new_tasks = decision.tasks.len() as u32;
        for request in decision.tasks {
            let worker = self
                .shared
                .worker(&request.worker)
                .expect("validated: the worker is configured");
            effects.push(Effect::StartChild {
                key: request.key.clone(),
                program: worker.program.reference().digest,
                input: request.input.clone(),
                budget: worker.budget.clone(),
                capabilities: worker.capabilities.clone(),
            });
            self.record
                .push_task(Task::pending(request))
                .map_err(encoding)?;
        }
        self.record.controls = Vec::with_capacity(decision.controls.len());
        for control in decision.controls {
            effects.push(match &control.action {
                ControlAction::Signal(signal) => Effect::SignalChild {
                    key: control.task.clone(),
                    signal: signal.clone(),
                },
                ControlAction::Cancel(reason) => Effect::CancelChild {
                    key: control.task.clone(),
                    reason: reason.clone(),
                },
            });
            self.record.controls.push(Receipt {
                control,
                result: None,
            });
        }
        let turn = self.turn_mut();
        turn.state = decision.state;
        turn.decided = Some(Decided {
            mode,
            tasks: new_tasks,
        });
        if effects.is_empty() {
            return self.after_applied();
        }
        if self.record.waits_with_actions() {
            effects.push(Effect::WaitChildren {
                keys: self.record.active_keys(),
                boundary: Boundary::Drained,
                condition: Condition::Any,
            });
        }
        Ok(Next::Continue(effects))
    }

    /// The start results, then the control receipts, of the decision, then
    /// the settlement of the turn-ending wait when it was declared with
    /// them (see [`Record::waits_with_actions`]).
    fn on_applied(&mut self, window: &[Signal]) -> Result<Next, StepError> {
        let waited = self.record.waits_with_actions();
        let mut refused = false;
        let mut signals = window.iter();
        for index in self.record.first_pending()..self.record.task_count() {
            let key = self.record.facts(index).key;
            match signals.next().map(|signal| &signal.body) {
                Some(SignalBody::ChildStarted {
                    key: started,
                    process,
                    failure,
                    ..
                }) if started.as_str() == key => {
                    let fact = match (process, failure) {
                        (_, Some(failure)) => {
                            refused = true;
                            Fact::Refused(failure.clone())
                        }
                        (Some(process), None) => Fact::Started(*process),
                        (None, None) => return Err(protocol("a start result without a process")),
                    };
                    self.record.record(index, fact).map_err(encoding)?;
                }
                other => {
                    return Err(protocol(format!(
                        "expected the start result of task {key}, got {other:?}"
                    )));
                }
            }
        }
        for receipt in self
            .record
            .controls
            .iter_mut()
            .filter(|r| r.result.is_none())
        {
            match signals.next().map(|signal| &signal.body) {
                Some(SignalBody::ControlReceipt { key, result, .. })
                    if *key == receipt.control.task && !result.is_unknown() =>
                {
                    receipt.result = Some(result.clone());
                }
                other => {
                    return Err(protocol(format!(
                        "expected the receipt of the control of {}, got {other:?}",
                        receipt.control.task
                    )));
                }
            }
        }
        if waited {
            match signals.next().map(|signal| &signal.body) {
                Some(SignalBody::ChildrenReady { children, .. })
                    if !children.is_empty() && !refused =>
                {
                    if let Some(extra) = signals.next() {
                        return Err(protocol(format!("unexpected signal {}", extra.id)));
                    }
                    for child in children {
                        self.record_outcome(child)?;
                    }
                    return self.next_turn();
                }
                // A wait naming a task whose start was refused is refused
                // as a whole; the mode rule then applies to the recorded
                // facts, as if the wait had never been declared.
                Some(SignalBody::Settled {
                    settlement: Settlement::Failed { failure, .. },
                    ..
                }) if refused && failure.code() == WAIT_INVALID => {}
                other => {
                    return Err(protocol(format!(
                        "expected the turn-ending wait to settle{}, got {other:?}",
                        if refused {
                            " refused after a refused start"
                        } else {
                            ""
                        }
                    )));
                }
            }
        }
        if let Some(extra) = signals.next() {
            return Err(protocol(format!("unexpected signal {}", extra.id)));
        }
        self.after_applied()
    }

    /// The mode rule over the recorded facts, once every start result and
    /// receipt is in: for a decision without actions, and for one whose
    /// turn-ending wait was refused because a start was refused.
    fn after_applied(&mut self) -> Result<Next, StepError> {
        let turn = self.turn();
        let decided = turn.decided.expect("applied turns are decided");
        if decided.mode == Mode::Wait && !turn.outcome_arrived && self.record.running() > 0 {
            return Ok(Next::Continue(vec![Effect::WaitChildren {
                keys: self.record.running_keys(),
                boundary: Boundary::Drained,
                condition: Condition::Any,
            }]));
        }
        self.next_turn()
    }

    /// A `wait` turn's wait settled: record the outcomes, start the next turn.
    fn on_waited(&mut self, window: &[Signal]) -> Result<Next, StepError> {
        match window {
            [signal] => match &signal.body {
                SignalBody::ChildrenReady { children, .. } if !children.is_empty() => {
                    for child in children {
                        self.record_outcome(child)?;
                    }
                    self.next_turn()
                }
                other => Err(protocol(format!("expected drained tasks, got {other:?}"))),
            },
            _ => Err(protocol(format!(
                "expected one wait result, got {} signals",
                window.len()
            ))),
        }
    }

    fn next_turn(&mut self) -> Result<Next, StepError> {
        let turn = self.turn();
        let number = turn.number.checked_add(1).ok_or_else(|| {
            StepError::classified(
                FailureKind::Execution,
                COUNTER_EXHAUSTED,
                "team: the turn counter is exhausted",
            )
        })?;
        let state = turn.state.clone();
        self.open_turn(number, state)
    }
}

/// Checks a whole decision against the facts before it; the first broken
/// rule is the error.
pub(crate) fn validate(
    shared: &Shared,
    record: &Record,
    decision: &Decision,
) -> Result<(), String> {
    shared
        .check_state(&decision.state)
        .map_err(|violation| format!("state: {violation}"))?;
    if let Some(output) = &decision.output {
        if decision.mode.is_some() {
            return Err("a decision with an output has no mode".into());
        }
        if !decision.tasks.is_empty() || !decision.controls.is_empty() {
            return Err("a decision with an output has no tasks or controls".into());
        }
        return shared
            .descriptor
            .output_schema()
            .validate(output)
            .map_err(|violation| format!("output: {violation}"));
    }
    let Some(mode) = decision.mode else {
        return Err("a decision without an output needs a mode".into());
    };
    let existing = record.task_count() as u64;
    let new = decision.tasks.len() as u64;
    if !shared.max_tasks.allows(existing, new) {
        return Err(format!(
            "{existing} tasks and {new} new exceed the limit of {} tasks",
            shared.max_tasks
        ));
    }
    let running = record.running() as u64;
    if running + new > u64::from(shared.max_concurrent) {
        return Err(format!(
            "{running} running tasks and {new} new exceed the limit of {} concurrent tasks",
            shared.max_concurrent
        ));
    }
    if decision.controls.len() > shared.max_controls as usize {
        return Err(format!(
            "{} controls exceed the limit of {} per turn",
            decision.controls.len(),
            shared.max_controls
        ));
    }
    // A pass over the tasks for the new keys and one for the control
    // targets (none when there are none), not a search per request or
    // control.
    let new_keys = decision
        .tasks
        .iter()
        .map(|task| task.key.as_str())
        .collect();
    let used = record.keys_among(&new_keys, record.task_count(), false);
    let targets = decision
        .controls
        .iter()
        .map(|control| control.task.as_str())
        .collect::<BTreeSet<_>>();
    let admitted = record.keys_among(&targets, record.task_count(), true);
    for (index, request) in decision.tasks.iter().enumerate() {
        let key = &request.key;
        if key.as_str().starts_with(RESERVED_PREFIX) {
            return Err(format!(
                "task key {key} uses the reserved prefix {RESERVED_PREFIX}"
            ));
        }
        if used.contains(key.as_str()) {
            return Err(format!(
                "task key {key} is already used; follow-up work needs a new key"
            ));
        }
        if decision.tasks[..index]
            .iter()
            .any(|other| &other.key == key)
        {
            return Err(format!("task key {key} is repeated in the decision"));
        }
        let Some(worker) = shared.worker(&request.worker) else {
            return Err(format!(
                "task {key} names unknown worker {}",
                request.worker
            ));
        };
        worker
            .program
            .descriptor()
            .input_schema()
            .validate(&request.input)
            .map_err(|violation| format!("task {key} input: {violation}"))?;
    }
    for control in &decision.controls {
        if !admitted.contains(control.task.as_str()) {
            return Err(format!(
                "control of {} targets no admitted task",
                control.task
            ));
        }
    }
    let outcome_arrived = record
        .turn
        .as_ref()
        .is_some_and(|turn| turn.outcome_arrived);
    if mode == Mode::Wait && running == 0 && new == 0 && !outcome_arrived {
        return Err("wait with nothing running, no new tasks and no outcome this turn".into());
    }
    Ok(())
}
