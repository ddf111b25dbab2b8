//! The team definition and its execution: turns, decision validation,
//! applying decisions, and the mode rule.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use baton_run::program::{
    Boundary, ChildOutcome, Condition, Definition, Descriptor, Effect, Execution, ExecutionState,
    Grant, SchemaViolation, Signal, SignalBody, StepError, Transition,
};
use baton_run::{
    ChildKey, Failure, FailureKind, Name, Payload, PayloadError, Program, Quota, Settlement,
    Status, Termination,
};

use crate::codec::{self, CodecError, Memo};
use crate::state::{Decided, Fact, Phase, Receipt, Record, Stall, TurnRecord};
use crate::wire::{ControlAction, Decision, Mode, Task};
use crate::{
    Binding, COORDINATOR_UNRESOLVED, COUNTER_EXHAUSTED, Config, DECISION_INVALID, LIMIT_TURNS,
    PROTOCOL_INVALID, RESERVED_PREFIX, STALLED, STATE_INVALID,
};

/// The frozen configuration every execution of one team shares.
pub(crate) struct Shared {
    descriptor: Descriptor,
    coordinator: Binding,
    workers: Vec<Binding>,
    by_name: BTreeMap<Box<str>, usize>,
    /// The canonical JSON of the workers' descriptors, encoded once.
    workers_json: Payload,
    pub max_turns: Quota,
    pub max_tasks: Quota,
    pub max_concurrent: u32,
    pub max_controls: u32,
    pub stall_turns: Quota,
    /// Recently restored states, to restore the next by difference.
    memo: Memo,
}

impl Shared {
    pub fn memo(&self) -> &Memo {
        &self.memo
    }

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
    pub fn new(descriptor: Descriptor, config: Config) -> Result<Team, PayloadError> {
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
        let workers_json = Payload::encode(&descriptors)?;
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
                stall_turns: config.stall_turns,
                memo: Memo::default(),
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
        let record = codec::record::decode(&state.0, &self.shared)
            .map_err(|error| contract(STATE_INVALID, format!("team: invalid state: {error}")))?;
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

fn encoding(error: CodecError) -> StepError {
    StepError::other(format!("team: encoding failed: {error}"))
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
        codec::record::encode(&self.record)
            .map(ExecutionState)
            .map_err(encoding)
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
        let input = codec::turn::write(
            &self.record.controls,
            number,
            &state,
            &self.record.tasks,
            &self.shared.workers_json,
        )
        .map_err(encoding)?;
        self.record.turn = Some(TurnRecord {
            number,
            state,
            coordinator: None,
            outcome_arrived: false,
            decided: None,
            stalled: None,
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
                grant: Grant::Exact,
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
            .filter(|index| self.record.tasks.facts(*index).process == Some(child.process));
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
            .tasks
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
        let stalled = self.stall_guard(&decision, output.digest())?;
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
                grant: Grant::Exact,
            });
            self.record
                .tasks
                .push(Task::pending(request))
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
        turn.stalled = stalled;
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
        for index in self.record.first_pending()..self.record.tasks.len() {
            let key = self.record.tasks.facts(index).key;
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
                    self.record.tasks.record(index, fact).map_err(encoding)?;
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
                    return self.next_turn(false);
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
        self.next_turn(true)
    }

    /// A `wait` turn's wait settled: record the outcomes, start the next turn.
    fn on_waited(&mut self, window: &[Signal]) -> Result<Next, StepError> {
        match window {
            [signal] => match &signal.body {
                SignalBody::ChildrenReady { children, .. } if !children.is_empty() => {
                    for child in children {
                        self.record_outcome(child)?;
                    }
                    // Outcomes arrived: progress, whatever the turn decided.
                    self.next_turn(false)
                }
                other => Err(protocol(format!("expected drained tasks, got {other:?}"))),
            },
            _ => Err(protocol(format!(
                "expected one wait result, got {} signals",
                window.len()
            ))),
        }
    }

    /// Opens the next turn with the decided state, carrying the run of
    /// turns without progress into it when `carry_stall` (no task outcome
    /// arrived since the decision).
    fn next_turn(&mut self, carry_stall: bool) -> Result<Next, StepError> {
        let turn = self.turn();
        let number = turn.number.checked_add(1).ok_or_else(|| {
            StepError::classified(
                FailureKind::Execution,
                COUNTER_EXHAUSTED,
                "team: the turn counter is exhausted",
            )
        })?;
        let (state, stalled) = (turn.state.clone(), turn.stalled.filter(|_| carry_stall));
        let next = self.open_turn(number, state)?;
        self.turn_mut().stalled = stalled;
        Ok(next)
    }

    /// The stall guard: whether this turn made no progress (no new task,
    /// no control, the state unchanged, no task outcome during the turn)
    /// and decided what the turn before it decided; the run of such turns
    /// it continues, or the team's failure once the run reaches
    /// `stall_turns`.
    fn stall_guard(
        &self,
        decision: &Decision,
        digest: baton_run::Digest,
    ) -> Result<Option<Stall>, StepError> {
        let turn = self.turn();
        let idle = decision.output.is_none()
            && decision.tasks.is_empty()
            && decision.controls.is_empty()
            && decision.state == turn.state
            && !turn.outcome_arrived;
        if !idle {
            return Ok(None);
        }
        let count = match turn.stalled {
            Some(run) if run.decision == digest => run.count.saturating_add(1),
            _ => 1,
        };
        if matches!(self.shared.stall_turns, Quota::Finite(limit) if u64::from(count) >= limit) {
            let first = turn.number + 1 - u64::from(count);
            return Err(StepError::classified(
                FailureKind::Execution,
                STALLED,
                format!(
                    "team: stalled: turns {first} to {} made no progress (no new task, no control, no change of state, no task outcome), each deciding the same ({digest}); the limit is {} such turns",
                    turn.number, self.shared.stall_turns
                ),
            ));
        }
        Ok(Some(Stall {
            count,
            decision: digest,
        }))
    }
}

/// Why a decision is invalid: the team fails with `team.decision.invalid`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecisionError {
    /// The next state fails the team's state schema.
    #[error("state: {0}")]
    State(SchemaViolation),
    /// A decision with an output also has a mode.
    #[error("a decision with an output has no mode")]
    OutputWithMode,
    /// A decision with an output also has tasks or controls.
    #[error("a decision with an output has no tasks or controls")]
    OutputWithActions,
    /// The output fails the team's output schema.
    #[error("output: {0}")]
    Output(SchemaViolation),
    /// A decision with neither an output nor a mode.
    #[error("a decision without an output needs a mode")]
    NoMode,
    /// The new tasks would exceed `max_tasks`.
    #[error("{existing} tasks and {new} new exceed the limit of {limit} tasks")]
    TooManyTasks {
        /// Tasks requested so far, refused starts included.
        existing: u64,
        /// Tasks this decision requests.
        new: u64,
        /// `max_tasks`.
        limit: Quota,
    },
    /// The new tasks would exceed `max_concurrent_tasks`.
    #[error("{running} running tasks and {new} new exceed the limit of {limit} concurrent tasks")]
    TooManyConcurrent {
        /// Tasks running now.
        running: u64,
        /// Tasks this decision requests.
        new: u64,
        /// `max_concurrent_tasks`.
        limit: u32,
    },
    /// More controls than `max_controls_per_turn`.
    #[error("{count} controls exceed the limit of {limit} per turn")]
    TooManyControls {
        /// Controls in the decision.
        count: usize,
        /// `max_controls_per_turn`.
        limit: u32,
    },
    /// A task key with the coordinator's reserved prefix.
    #[error("task key {key} uses the reserved prefix {RESERVED_PREFIX}")]
    ReservedKey {
        /// The key.
        key: ChildKey,
    },
    /// A task key the team already used.
    #[error("task key {key} is already used; follow-up work needs a new key")]
    KeyUsed {
        /// The key.
        key: ChildKey,
    },
    /// Two requests of the decision share a key.
    #[error("task key {key} is repeated in the decision")]
    KeyRepeated {
        /// The key.
        key: ChildKey,
    },
    /// A request names a worker the team does not have.
    #[error("task {key} names unknown worker {worker}")]
    UnknownWorker {
        /// The task's key.
        key: ChildKey,
        /// The worker's name.
        worker: Name,
    },
    /// A request's input fails its worker's input schema.
    #[error("task {key} input: {violation}")]
    TaskInput {
        /// The task's key.
        key: ChildKey,
        /// Why the worker's schema refuses it.
        violation: SchemaViolation,
    },
    /// A control targets a task that was not admitted.
    #[error("control of {task} targets no admitted task")]
    ControlTarget {
        /// The targeted key.
        task: ChildKey,
    },
    /// `wait` with nothing to wait for.
    #[error("wait with nothing running, no new tasks and no outcome this turn")]
    NothingToWaitFor,
}

/// Checks a whole decision against the facts before it; the first broken
/// rule is the error.
pub(crate) fn validate(
    shared: &Shared,
    record: &Record,
    decision: &Decision,
) -> Result<(), DecisionError> {
    shared
        .check_state(&decision.state)
        .map_err(DecisionError::State)?;
    if let Some(output) = &decision.output {
        if decision.mode.is_some() {
            return Err(DecisionError::OutputWithMode);
        }
        if !decision.tasks.is_empty() || !decision.controls.is_empty() {
            return Err(DecisionError::OutputWithActions);
        }
        return shared
            .descriptor
            .output_schema()
            .validate(output)
            .map_err(DecisionError::Output);
    }
    let Some(mode) = decision.mode else {
        return Err(DecisionError::NoMode);
    };
    let existing = record.tasks.len() as u64;
    let new = decision.tasks.len() as u64;
    if !shared.max_tasks.allows(existing, new) {
        return Err(DecisionError::TooManyTasks {
            existing,
            new,
            limit: shared.max_tasks,
        });
    }
    let running = record.running() as u64;
    if running + new > u64::from(shared.max_concurrent) {
        return Err(DecisionError::TooManyConcurrent {
            running,
            new,
            limit: shared.max_concurrent,
        });
    }
    if decision.controls.len() > shared.max_controls as usize {
        return Err(DecisionError::TooManyControls {
            count: decision.controls.len(),
            limit: shared.max_controls,
        });
    }
    // A pass over the tasks for the new keys and one for the control
    // targets (none when there are none), not a search per request or
    // control.
    let new_keys = decision
        .tasks
        .iter()
        .map(|task| task.key.as_str())
        .collect();
    let used = record.keys_among(&new_keys, record.tasks.len(), false);
    let targets = decision
        .controls
        .iter()
        .map(|control| control.task.as_str())
        .collect::<BTreeSet<_>>();
    let admitted = record.keys_among(&targets, record.tasks.len(), true);
    for (index, request) in decision.tasks.iter().enumerate() {
        let key = &request.key;
        if key.as_str().starts_with(RESERVED_PREFIX) {
            return Err(DecisionError::ReservedKey { key: key.clone() });
        }
        if used.contains(key.as_str()) {
            return Err(DecisionError::KeyUsed { key: key.clone() });
        }
        if decision.tasks[..index]
            .iter()
            .any(|other| &other.key == key)
        {
            return Err(DecisionError::KeyRepeated { key: key.clone() });
        }
        let Some(worker) = shared.worker(&request.worker) else {
            return Err(DecisionError::UnknownWorker {
                key: key.clone(),
                worker: request.worker.clone(),
            });
        };
        worker
            .program
            .descriptor()
            .input_schema()
            .validate(&request.input)
            .map_err(|violation| DecisionError::TaskInput {
                key: key.clone(),
                violation,
            })?;
    }
    for control in &decision.controls {
        if !admitted.contains(control.task.as_str()) {
            return Err(DecisionError::ControlTarget {
                task: control.task.clone(),
            });
        }
    }
    let outcome_arrived = record
        .turn
        .as_ref()
        .is_some_and(|turn| turn.outcome_arrived);
    if mode == Mode::Wait && running == 0 && new == 0 && !outcome_arrived {
        return Err(DecisionError::NothingToWaitFor);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Restore by difference against the full decode, over states a team
    //! produces and corrupted ones.

    use baton_run::program::{ProgramConfig, Schema};
    use baton_run::{ChildKey, EffectId, Failure, ProcessId, Settlement, SignalId, StartId};
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;
    use crate::codec::record::{decode_after, decode_full};
    use crate::state::StateError;
    use crate::wire::TaskRequest;
    use crate::{Decision, Policy, PolicyConfig};
    use baton_run::program::common_prefix;

    struct Plain(Descriptor);

    impl Definition for Plain {
        fn descriptor(&self) -> &Descriptor {
            &self.0
        }
        fn start(&self, _: &Payload) -> Result<Box<dyn Execution>, StepError> {
            Err(StepError::other("not run"))
        }
        fn restore(&self, _: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
            Err(StepError::other("not run"))
        }
    }

    fn team() -> Team {
        let worker: Program = Program::new(ProgramConfig {
            definition: Arc::new(Plain(
                Descriptor::new("w.num", "A worker.", Schema::of::<i64>(), Schema::any())
                    .expect("valid"),
            )),
            dispatcher: None,
            implementation: baton_run::program::implementation_digest("memo", "1"),
            configuration: baton_run::program::configuration_digest(&"w.num").expect("encodes"),
        });
        let coordinator = Policy::new(PolicyConfig {
            name: "test.coordinator".into(),
            description: "Unused.".into(),
            build: "memo 1".into(),
            settings: Payload::null(),
            decide: Arc::new(|turn| Ok(Decision::new(Mode::Continue, turn.state.clone()))),
        })
        .expect("valid")
        .program()
        .erase();
        let descriptor = Descriptor::new(
            "test.team",
            "A team.",
            Schema::of::<u32>(),
            Schema::of::<String>(),
        )
        .expect("valid");
        Team::new(
            descriptor,
            Config {
                name: "test.team".into(),
                description: "A team.".into(),
                coordinator: Binding::new(&coordinator),
                workers: vec![Binding::new(&worker)],
                max_turns: Quota::Unlimited,
                max_tasks: Quota::Unlimited,
                max_concurrent_tasks: 64,
                max_controls_per_turn: 4,
                stall_turns: Quota::Unlimited,
            },
        )
        .expect("builds")
    }

    fn root() -> ProcessId {
        ProcessId::root(&StartId::new("acme", "memo").expect("valid"))
    }

    fn key(text: &str) -> ChildKey {
        ChildKey::new(text).expect("valid")
    }

    fn signal(body: SignalBody) -> Signal {
        Signal {
            id: SignalId::for_effect(EffectId::new(root(), 99, 0)),
            wait: None,
            body,
        }
    }

    fn started(key_text: &str, refused: bool) -> Signal {
        signal(SignalBody::ChildStarted {
            effect: EffectId::new(root(), 0, 0),
            key: key(key_text),
            process: (!refused).then(|| ProcessId::child(root(), &key(key_text))),
            failure: refused.then(|| Failure::contract("engine.child.tree_limit", "refused")),
        })
    }

    fn ready(children: Vec<ChildOutcome>) -> Signal {
        signal(SignalBody::ChildrenReady {
            effect: EffectId::new(root(), 0, 1),
            children,
        })
    }

    fn drained(key_text: &str, termination: Termination) -> ChildOutcome {
        ChildOutcome {
            key: key(key_text),
            process: ProcessId::child(root(), &key(key_text)),
            termination,
        }
    }

    /// One turn of a scripted history: how many tasks the decision starts
    /// (and which of them are refused), its mode, and a mask choosing which
    /// of the watched tasks drain whenever a wait settles.
    #[derive(Clone, Debug)]
    struct Round {
        refused: Vec<bool>,
        wait: bool,
        drains: u64,
    }

    fn rounds() -> impl Strategy<Value = Vec<Round>> {
        prop::collection::vec(
            (
                prop::collection::vec(prop::bool::weighted(0.2), 0..4),
                any::<bool>(),
                any::<u64>(),
            )
                .prop_map(|(refused, wait, drains)| Round {
                    refused,
                    wait,
                    drains,
                }),
            1..7,
        )
    }

    /// The tasks of `keys` chosen by `mask` (at least one when `some`).
    fn chosen(keys: &[ChildKey], mask: u64, some: bool) -> Vec<ChildOutcome> {
        let mut out: Vec<ChildOutcome> = keys
            .iter()
            .enumerate()
            .filter(|(index, _)| mask >> (index % 64) & 1 == 1)
            .map(|(_, key)| {
                let output = if key.as_str().len() % 2 == 0 {
                    Termination::completed(Payload::parse_str("1").expect("json"))
                } else {
                    Termination::failed(Failure::external("w.failed", "it \"failed\""))
                };
                drained(key.as_str(), output)
            })
            .collect();
        if some && out.is_empty() {
            out.push(drained(
                keys[0].as_str(),
                Termination::completed(Payload::null()),
            ));
        }
        out
    }

    /// Runs a scripted history, restoring after every step as the kernel
    /// does, and returns every state it produced.
    fn history(team: &Team, script: &[Round]) -> Vec<Payload> {
        let mut run = team
            .start(&Payload::parse_str("7").expect("json"))
            .expect("starts");
        let mut states = Vec::new();
        let mut next = 0usize;
        let mut effects = match run.step(&[]).expect("opens") {
            Transition::Continue { effects, .. } => effects,
            other => panic!("{other:?}"),
        };
        let mut turn = 1u64;
        let mut round = 0usize;
        loop {
            let state = run.snapshot().expect("snapshots");
            states.push(state.0.clone());
            run = team.restore(&state).expect("a produced state restores");
            let window = match effects.as_slice() {
                [
                    Effect::StartChild { key: opened, .. },
                    Effect::WaitChildren { keys, .. },
                ] if opened.as_str().starts_with(RESERVED_PREFIX) => {
                    let Some(script) = script.get(round) else {
                        return states;
                    };
                    round += 1;
                    let tasks = keys[..keys.len() - 1].to_vec();
                    let mut children = chosen(&tasks, script.drains, false);
                    let running = tasks.len() - children.len();
                    let mut decision = Decision::new(
                        if script.wait
                            && (running > 0 || !script.refused.is_empty() || !children.is_empty())
                        {
                            Mode::Wait
                        } else {
                            Mode::Continue
                        },
                        Payload::parse_str("7").expect("json"),
                    );
                    for _ in &script.refused {
                        decision = decision.with_task(TaskRequest::new(
                            key(&format!("t{next}")),
                            Name::new("w.num").expect("valid"),
                            Payload::parse_str(&next.to_string()).expect("json"),
                        ));
                        next += 1;
                    }
                    children.push(drained(
                        opened.as_str(),
                        Termination::completed(Payload::encode(&decision).expect("encodes")),
                    ));
                    turn += 1;
                    vec![started(opened.as_str(), false), ready(children)]
                }
                [Effect::WaitChildren { keys, .. }] => {
                    vec![ready(chosen(
                        keys,
                        script[round - 1].drains.rotate_left(7),
                        true,
                    ))]
                }
                _ => {
                    let refused = &script[round - 1].refused;
                    let mut window = Vec::new();
                    let mut any = false;
                    for (effect, refused) in effects.iter().zip(refused) {
                        let Effect::StartChild { key, .. } = effect else {
                            panic!("{effect:?}");
                        };
                        any |= *refused;
                        window.push(started(key.as_str(), *refused));
                    }
                    if let Some(Effect::WaitChildren { keys, .. }) = effects.last() {
                        window.push(if any {
                            signal(SignalBody::Settled {
                                effect: EffectId::new(root(), 0, 2),
                                settlement: Settlement::failed(Failure::contract(
                                    WAIT_INVALID,
                                    "refused",
                                )),
                            })
                        } else {
                            ready(chosen(keys, script[round - 1].drains.rotate_left(13), true))
                        });
                    }
                    window
                }
            };
            effects = match run.step(&window).expect("steps") {
                Transition::Continue { effects, .. } => effects,
                other => panic!("{other:?}"),
            };
            assert!(turn < 100);
        }
    }

    /// Corrupts a state's task list or turn so that it may no longer be a
    /// state a run produces.
    fn corrupt(state: &Payload, how: u8, at: usize) -> Option<Payload> {
        let mut value = state.to_value();
        let tasks = value.get_mut("tasks").and_then(Value::as_array_mut)?;
        let count = tasks.len();
        let index = at % count;
        let other = tasks[(index + 1) % count].clone();
        let task = &mut tasks[index];
        match how % 12 {
            0 => task["request"]["key"] = other["request"]["key"].clone(),
            1 => task["request"]["key"] = json!("team.turn.9"),
            2 => task["request"]["key"] = json!("bad key"),
            3 => task["request"]["worker"] = json!("w.none"),
            4 => task["outcome"] = json!({"status": "completed", "cause": "completion"}),
            5 => {
                task.as_object_mut()?.remove("process");
            }
            6 => task["process"] = other.get("process")?.clone(),
            7 => task["extra"] = json!(1),
            8 => {
                tasks.remove(index);
            }
            9 => tasks.insert(index, other),
            10 => tasks.swap(index, (index + 1) % count),
            _ => task["request"]["input"] = json!("text"),
        }
        Payload::from_value(&value).ok()
    }

    /// Restores `state` both ways from `base` and holds them equal.
    fn same(shared: &Shared, base: &Payload, state: &Payload) -> Result<bool, TestCaseError> {
        let (_, base) = decode_full(base, shared).expect("the base restores");
        let common = common_prefix(base.source.as_bytes(), state.as_bytes());
        let full = decode_full(state, shared);
        let Some(by_difference) = decode_after(state, shared, &base, common) else {
            return Ok(false);
        };
        match (&by_difference, &full) {
            (Ok((a, kept_a)), Ok((b, kept_b))) => {
                prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
                // The same tasks read and the same index of their keys
                // and processes, merged or sorted.
                prop_assert_eq!(kept_a, kept_b);
            }
            (Err(_), Err(_)) => {}
            _ => prop_assert!(
                false,
                "{state}: by difference {:?}, full {:?}",
                by_difference.as_ref().map(|_| ()),
                full.as_ref().map(|_| ())
            ),
        }
        Ok(true)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]
        /// A state is restored by difference exactly as a full decode
        /// restores it (the same record, or both rejected), from the state
        /// before it and from itself, for produced and corrupted states.
        #[test]
        fn restore_by_difference_is_the_full_decode(
            script in rounds(),
            corruptions in prop::collection::vec((any::<u8>(), any::<usize>(), any::<usize>()), 8),
        ) {
            let team = team();
            let shared = &team.shared;
            let states = history(&team, &script);
            for pair in states.windows(2) {
                same(shared, &pair[0], &pair[1])?;
            }
            for (how, at, which) in corruptions {
                let state = &states[which % states.len()];
                if let Some(bad) = corrupt(state, how, at) {
                    same(shared, state, &bad)?;
                    let previous = &states[(which % states.len()).saturating_sub(1)];
                    same(shared, previous, &bad)?;
                }
            }
        }
    }

    /// Six rounds of a few tasks each.
    fn scripts() -> Vec<Vec<Round>> {
        (0..4u64)
            .map(|seed| {
                (0..6)
                    .map(|n| Round {
                        refused: vec![(seed + n) % 5 == 0; 1 + ((seed + n) % 3) as usize],
                        wait: (seed + n) % 2 == 0,
                        drains: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ n,
                    })
                    .collect()
            })
            .collect()
    }

    /// Once settled tasks lead the list, a state restores by difference
    /// from the one before it, and so does a corrupted one.
    #[test]
    fn consecutive_states_restore_by_difference() {
        let team = team();
        let states = history(&team, &scripts()[1]);
        let applied = states
            .windows(2)
            .filter(|pair| same(&team.shared, &pair[0], &pair[1]).expect("the same record"))
            .count();
        assert!(
            applied * 2 > states.len(),
            "{applied} of {} states restored by difference",
            states.len()
        );
    }

    /// Concurrent runs of one team restore through the shared memo; each
    /// gets the record a full decode gives, and the memo stays bounded.
    #[test]
    fn concurrent_runs_restore_correctly_through_one_memo() {
        let team = Arc::new(team());
        let histories: Vec<Vec<Payload>> = scripts().iter().map(|s| history(&team, s)).collect();
        let barrier = Arc::new(std::sync::Barrier::new(histories.len()));
        std::thread::scope(|scope| {
            for states in &histories {
                let (team, barrier) = (team.clone(), barrier.clone());
                scope.spawn(move || {
                    barrier.wait();
                    for _ in 0..20 {
                        for state in states {
                            let restored = team
                                .restore(&ExecutionState(state.clone()))
                                .expect("restores");
                            assert_eq!(&restored.snapshot().expect("snapshots").0, state);
                            let memo =
                                codec::record::decode(state, &team.shared).expect("restores");
                            let (full, _) = decode_full(state, &team.shared).expect("restores");
                            assert_eq!(format!("{memo:?}"), format!("{full:?}"));
                        }
                    }
                });
            }
        });
        assert!(team.shared.memo().len() <= Memo::ENTRIES);
    }

    /// A state that does not decode is a typed codec error inside the team
    /// and, outside it, the `team.state.invalid` failure restore always
    /// reported, worded as the decoder's report.
    #[test]
    fn a_malformed_state_is_a_codec_error_reported_as_an_invalid_state() {
        let team = team();
        let refused = r#"{"code":"x.y","kind":"contract","message":"m"}"#;
        // Which codec error a case is.
        type Expected = fn(&CodecError) -> bool;
        let cases: [(String, Expected, &str); 4] = [
            (
                r#"{"extra":1,"initial":7}"#.to_owned(),
                |error| matches!(error, CodecError::Json(_)),
                "team: invalid state: unknown field `extra`",
            ),
            (
                r#"{"initial":7,"tasks":[]}"#.to_owned(),
                |error| matches!(error, CodecError::EmptyTasks),
                "team: invalid state: tasks: an empty list is omitted, not written",
            ),
            (
                format!(
                    r#"{{"tasks":[{{"rejection":{refused},"request":{{"input":1,"key":"a b","worker":"w.num"}}}}],"turn":{{"number":1,"state":7}}}}"#
                ),
                |error| matches!(error, CodecError::ChildKey { .. }),
                r#"team: invalid state: invalid child key "a b""#,
            ),
            (
                format!(
                    r#"{{"tasks":[{{"process":"p_0123456789abcdef0123456789abcdef","rejection":{refused},"request":{{"input":1,"key":"a","worker":"w.num"}}}}],"turn":{{"number":1,"state":7}}}}"#
                ),
                |error| matches!(error, CodecError::RefusedWithFacts { .. }),
                "team: invalid state: task a: a refused start has neither a process nor an outcome",
            ),
        ];
        for (text, expected, message) in cases {
            let state = Payload::parse_str(&text).expect("json");
            match decode_full(&state, &team.shared) {
                Err(StateError::Codec(error)) => assert!(expected(&error), "{text}: {error:?}"),
                other => panic!("{text}: {:?}", other.map(|_| ())),
            }
            let Err(StepError(failure)) = team.restore(&ExecutionState(state)) else {
                panic!("{text} restored");
            };
            assert_eq!(failure.kind, FailureKind::Contract, "{text}");
            assert_eq!(failure.code(), STATE_INVALID, "{text}");
            assert!(
                failure.message.starts_with(message),
                "{text}: {}",
                failure.message
            );
        }
    }
}
