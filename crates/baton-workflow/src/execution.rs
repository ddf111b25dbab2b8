//! One workflow process: its recorded state and its pure step.

use std::sync::Arc;

use baton_run::program::{
    Boundary, Condition, Effect, Execution, ExecutionState, Grant, Schema, Signal, SignalBody,
    StepError, Transition,
};
use baton_run::{
    ChildKey, Failure, FailureKind, Payload, ProcessId, Progress, Settlement, Status, Termination,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::stage::{Body, Child, LoopResult, Problem, Stage, StageKind};
use crate::workflow::Inner;

mod codec;

/// Everything a workflow process remembers between steps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct State {
    // Fields in key order: the canonical state then needs no rearranging.
    /// The children of the current stage, while it has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    batch: Option<Batch>,
    /// The stage that runs next or is running.
    stage: usize,
    /// The current stage's input (for a loop: the body's latest value; past
    /// the last stage: the workflow's output).
    value: Payload,
}

/// The children of one stage: finished windows and the current one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch {
    /// Outputs of the finished windows of a fork or map, in index order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    done: Vec<Payload>,
    /// The running loop iteration (from 1); zero for other stages.
    #[serde(default, skip_serializing_if = "is_zero")]
    iteration: u32,
    /// The current window's children, in index order.
    slots: Vec<Slot>,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// One child of the current window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Slot {
    /// Branch or item index (zero for single children).
    index: u32,
    /// The child's key.
    key: ChildKey,
    /// Where it is.
    status: SlotStatus,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "status",
    rename_all = "snake_case",
    deny_unknown_fields,
    try_from = "SlotStatusWire"
)]
enum SlotStatus {
    /// Its start is declared; the result has not arrived.
    Starting,
    /// Started; its result has not arrived.
    Running { process: ProcessId },
    /// Completed with a checked output.
    Completed { output: Payload },
    /// Its start was refused or it did not complete with a valid output;
    /// the failure is already classified for the stage.
    Failed { failure: Failure },
}

/// The JSON form of a [`SlotStatus`] read as one flat object: decoding an
/// internally tagged enum directly buffers every field first, and states
/// are decoded at every step. Accepts exactly what the tagged form does.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SlotStatusWire {
    status: SlotPhase,
    // A member is absent or holds a value (`null` is a present output, and
    // no process or failure).
    #[serde(default, deserialize_with = "baton_run::program::deserialize_present")]
    process: Option<ProcessId>,
    #[serde(default, deserialize_with = "baton_run::program::deserialize_present")]
    output: Option<Payload>,
    #[serde(default, deserialize_with = "baton_run::program::deserialize_present")]
    failure: Option<Failure>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum SlotPhase {
    Starting,
    Running,
    Completed,
    Failed,
}

impl TryFrom<SlotStatusWire> for SlotStatus {
    type Error = String;

    fn try_from(wire: SlotStatusWire) -> Result<SlotStatus, String> {
        let fields = (wire.process, wire.output, wire.failure);
        match (wire.status, fields) {
            (SlotPhase::Starting, (None, None, None)) => Ok(SlotStatus::Starting),
            (SlotPhase::Running, (Some(process), None, None)) => {
                Ok(SlotStatus::Running { process })
            }
            (SlotPhase::Completed, (None, Some(output), None)) => {
                Ok(SlotStatus::Completed { output })
            }
            (SlotPhase::Failed, (None, None, Some(failure))) => Ok(SlotStatus::Failed { failure }),
            (SlotPhase::Starting, _) => Err("a starting slot has no other fields".into()),
            (SlotPhase::Running, _) => Err("a running slot has exactly its process".into()),
            (SlotPhase::Completed, _) => Err("a completed slot has exactly its output".into()),
            (SlotPhase::Failed, _) => Err("a failed slot has exactly its failure".into()),
        }
    }
}

impl State {
    /// The state's text: written directly for the shapes a running
    /// workflow records ([`codec`]), by serde otherwise; the same text
    /// either way.
    pub(crate) fn snapshot(&self) -> Result<ExecutionState, StepError> {
        if let Some(text) = codec::encode(self)
            && let Ok(payload) = Payload::parse_string(text)
        {
            return Ok(ExecutionState(payload));
        }
        ExecutionState::encode(self)
    }

    /// The state a recorded text holds: read directly when it is one
    /// [`State::snapshot`] writes directly, by serde otherwise (whose
    /// verdict and error stand).
    pub(crate) fn restore(state: &ExecutionState) -> Result<State, StepError> {
        match codec::decode(state.0.as_str()) {
            Some(decoded) => Ok(decoded),
            None => state.decode(),
        }
    }

    pub(crate) fn start(input: &Payload) -> State {
        State {
            stage: 0,
            value: input.clone(),
            batch: None,
        }
    }

    /// Checks a restored state against the stages it must belong to.
    pub(crate) fn check(&self, stages: &[Stage]) -> Result<(), StepError> {
        let invalid =
            |message: String| StepError(Failure::contract("execution.state.invalid", message));
        if self.stage > stages.len() {
            return Err(invalid(format!(
                "stage {} of a workflow with {} stages",
                self.stage,
                stages.len()
            )));
        }
        let Some(batch) = &self.batch else {
            return Ok(());
        };
        let Some(stage) = stages.get(self.stage) else {
            return Err(invalid("children recorded past the last stage".into()));
        };
        let slots = batch.slots.len();
        let fits = slots > 0
            && match &stage.body {
                Body::Transform { .. } => false,
                Body::Call { .. } | Body::Switch { .. } => {
                    slots == 1 && batch.done.is_empty() && batch.iteration == 0
                }
                Body::Fork {
                    branches,
                    window_size,
                    ..
                } => {
                    slots <= *window_size as usize
                        && batch.done.len() + slots <= branches.len()
                        && batch.iteration == 0
                }
                Body::Map {
                    window_size,
                    max_items,
                    ..
                } => {
                    slots <= *window_size as usize
                        && batch.done.len() + slots <= *max_items as usize
                        && batch.iteration == 0
                }
                Body::Loop { max_iterations, .. } => {
                    slots == 1
                        && batch.done.is_empty()
                        && (1..=*max_iterations).contains(&batch.iteration)
                }
            };
        if fits {
            Ok(())
        } else {
            Err(invalid(format!(
                "recorded children do not fit {} stage {:?}",
                stage.kind(),
                stage.id
            )))
        }
    }
}

/// A running workflow process.
pub(crate) struct Run {
    inner: Arc<Inner>,
    state: State,
}

/// What finishing a window leads to.
enum Next {
    /// More children: continue with these effects.
    Effects(Vec<Effect>),
    /// The stage failed.
    Fail(Failure),
    /// The stage is done; run the following stages.
    Advance,
}

/// The suffix of a child failure code.
#[derive(Clone, Copy)]
enum Suffix {
    StartFailed,
    ChildFailed,
    NotCompleted,
    OutputMissing,
    OutputInvalid,
}

/// `workflow.<kind>.<suffix>`; fan-out stages prefix the suffix with
/// `branch_` or `item_`, which replaces the `child_` of a single child.
fn code(kind: StageKind, suffix: Suffix) -> String {
    let plain = match suffix {
        Suffix::StartFailed => "start_failed",
        Suffix::ChildFailed => "child_failed",
        Suffix::NotCompleted => "child_not_completed",
        Suffix::OutputMissing => "output_missing",
        Suffix::OutputInvalid => "output_invalid",
    };
    let prefix = match kind {
        StageKind::Fork => Some("branch"),
        StageKind::Map => Some("item"),
        _ => None,
    };
    let suffix = match (prefix, suffix) {
        (None, _) => plain.to_owned(),
        (Some(prefix), Suffix::ChildFailed) => format!("{prefix}_failed"),
        (Some(prefix), Suffix::NotCompleted) => format!("{prefix}_not_completed"),
        (Some(prefix), _) => format!("{prefix}_{plain}"),
    };
    format!("workflow.{kind}.{suffix}")
}

fn protocol(message: impl Into<String>) -> StepError {
    StepError(Failure::contract("workflow.protocol.violated", message))
}

/// Names a child in messages: `branch 2 (fan.2)`, `item 0 (each.0)`, `child review`.
fn describe(stage: &Stage, slot: &Slot) -> String {
    match stage.kind() {
        StageKind::Fork => format!("branch {} ({})", slot.index, slot.key),
        StageKind::Map => format!("item {} ({})", slot.index, slot.key),
        _ => format!("child {}", slot.key),
    }
}

/// The schema a stage's child outputs must satisfy.
fn child_output_schema<'a>(stage: &'a Stage, key: &ChildKey) -> Option<&'a Schema> {
    match &stage.body {
        Body::Transform { .. } => None,
        Body::Call { child } => Some(child.program.descriptor().output_schema()),
        Body::Switch { cases, .. } => cases
            .iter()
            .find(|(case, _)| key.as_str() == format!("{}.{case}", stage.id))
            .map(|(_, child)| child.program.descriptor().output_schema()),
        Body::Fork { branch_output, .. } => Some(branch_output),
        Body::Map { item_output, .. } => Some(item_output),
        Body::Loop { value, .. } => Some(value),
    }
}

/// The key of a stage's child by its index or iteration: the stage's id,
/// a dot, and the number.
fn indexed_key(stage: &Stage, index: u64) -> Result<ChildKey, baton_run::IdError> {
    let mut buffer = itoa::Buffer::new();
    let number = buffer.format(index);
    let mut key = String::with_capacity(stage.id.len() + 1 + number.len());
    key.push_str(&stage.id);
    key.push('.');
    key.push_str(number);
    ChildKey::new(key)
}

/// Classifies a child's termination for its stage.
fn classify(stage: &Stage, slot: &Slot, termination: &Termination) -> SlotStatus {
    let kind = stage.kind();
    // Named only in a failure's message.
    let who = || describe(stage, slot);
    let failed = |failure: Failure| SlotStatus::Failed { failure };
    match termination.status() {
        Status::Completed => {
            let Some(output) = termination.output() else {
                return failed(Failure::contract(
                    &code(kind, Suffix::OutputMissing),
                    format!("stage {}: {} completed without an output", stage.id, who()),
                ));
            };
            let checked = child_output_schema(stage, &slot.key)
                .map_or(Ok(()), |schema| schema.validate(output));
            match checked {
                Ok(()) => SlotStatus::Completed {
                    output: output.clone(),
                },
                Err(violation) => failed(Failure::contract(
                    &code(kind, Suffix::OutputInvalid),
                    format!("stage {}: {} output rejected: {violation}", stage.id, who()),
                )),
            }
        }
        Status::Failed => {
            let cause = termination
                .failure()
                .map_or_else(|| "no failure recorded".to_owned(), ToString::to_string);
            failed(Failure::external(
                &code(kind, Suffix::ChildFailed),
                format!("stage {}: {} failed: {cause}", stage.id, who()),
            ))
        }
        status => failed(Failure::external(
            &code(kind, Suffix::NotCompleted),
            format!(
                "stage {}: {} ended {status} ({})",
                stage.id,
                who(),
                termination.cause()
            ),
        )),
    }
}

/// Folds the results of a window's effects into its slots. Returns whether
/// a children wait was refused, which happens when one of the starts before
/// it was refused.
fn absorb(stage: &Stage, batch: &mut Batch, window: &[Signal]) -> Result<bool, StepError> {
    let mut refused = false;
    for signal in window {
        match &signal.body {
            SignalBody::ChildStarted {
                key,
                process,
                failure,
                ..
            } => {
                let slot = batch
                    .slots
                    .iter_mut()
                    .find(|slot| &slot.key == key && slot.status == SlotStatus::Starting)
                    .ok_or_else(|| protocol(format!("unexpected start result for {key}")))?;
                slot.status = match (process, failure) {
                    (_, Some(failure)) => SlotStatus::Failed {
                        failure: Failure::new(
                            failure.kind,
                            &code(stage.kind(), Suffix::StartFailed),
                            format!(
                                "stage {}: {} was not started: {failure}",
                                stage.id,
                                describe(stage, slot)
                            ),
                        ),
                    },
                    (Some(process), None) => SlotStatus::Running { process: *process },
                    (None, None) => {
                        return Err(protocol(format!("start result for {key} names no process")));
                    }
                };
            }
            SignalBody::ChildrenReady { children, .. } => {
                for outcome in children {
                    let slot = batch
                        .slots
                        .iter_mut()
                        .find(|slot| {
                            slot.key == outcome.key
                                && matches!(slot.status, SlotStatus::Running { .. })
                        })
                        .ok_or_else(|| {
                            protocol(format!("unexpected outcome for {}", outcome.key))
                        })?;
                    slot.status = classify(stage, slot, &outcome.termination);
                }
            }
            SignalBody::Settled {
                settlement: Settlement::Failed { .. },
                ..
            } => refused = true,
            other => {
                return Err(protocol(format!(
                    "stage {}: unexpected signal {other:?}",
                    stage.id
                )));
            }
        }
    }
    if batch
        .slots
        .iter()
        .any(|slot| slot.status == SlotStatus::Starting)
    {
        return Err(protocol(format!(
            "stage {}: a child start has no result",
            stage.id
        )));
    }
    Ok(refused)
}

fn running(batch: &Batch) -> Vec<ChildKey> {
    batch
        .slots
        .iter()
        .filter(|slot| matches!(slot.status, SlotStatus::Running { .. }))
        .map(|slot| slot.key.clone())
        .collect()
}

fn wait_all(keys: Vec<ChildKey>) -> Effect {
    Effect::WaitChildren {
        keys,
        boundary: Boundary::Result,
        condition: Condition::All,
    }
}

fn items(stage: &Stage, value: &Payload) -> Result<Vec<Value>, Failure> {
    match value.to_value() {
        Value::Array(items) => Ok(items),
        _ => Err(Failure::contract(
            "workflow.map.input_invalid",
            format!("stage {}: the input is not a list", stage.id),
        )),
    }
}

impl Run {
    pub(crate) fn new(inner: Arc<Inner>, state: State) -> Run {
        Run { inner, state }
    }

    /// Declares a window of children: their starts, then one wait for all
    /// of them. When a start is refused the wait is refused too, and the
    /// next step waits again for the children that did start.
    fn launch(
        &mut self,
        children: Vec<(u32, ChildKey, &Child, Payload)>,
        done: Vec<Payload>,
        iteration: u32,
    ) -> Vec<Effect> {
        let mut effects = Vec::with_capacity(children.len() + 1);
        let mut slots = Vec::with_capacity(children.len());
        for (index, key, child, input) in children {
            effects.push(Effect::StartChild {
                key: key.clone(),
                program: child.program.reference().digest,
                input,
                budget: child.budget.clone(),
                capabilities: child.capabilities.clone(),
                grant: Grant::Exact,
            });
            slots.push(Slot {
                index,
                key,
                status: SlotStatus::Starting,
            });
        }
        effects.push(wait_all(
            slots.iter().map(|slot| slot.key.clone()).collect(),
        ));
        self.state.batch = Some(Batch {
            done,
            slots,
            iteration,
        });
        effects
    }

    /// Starts the window of a fork or map beginning at `from`.
    fn launch_window(
        &mut self,
        stage: &Stage,
        from: usize,
        done: Vec<Payload>,
    ) -> Result<Vec<Effect>, StepError> {
        let mut children = Vec::new();
        match &stage.body {
            Body::Fork {
                branches,
                window_size,
                ..
            } => {
                for (index, child) in branches
                    .iter()
                    .enumerate()
                    .skip(from)
                    .take(*window_size as usize)
                {
                    let key = indexed_key(stage, index as u64)?;
                    children.push((index as u32, key, child, self.state.value.clone()));
                }
            }
            Body::Map {
                item, window_size, ..
            } => {
                let items = items(stage, &self.state.value).map_err(StepError)?;
                for (index, input) in items
                    .iter()
                    .enumerate()
                    .skip(from)
                    .take(*window_size as usize)
                {
                    let key = indexed_key(stage, index as u64)?;
                    children.push((index as u32, key, item, Payload::from_value(input)?));
                }
            }
            _ => return Err(protocol("only forks and maps have windows")),
        }
        Ok(self.launch(children, done, 0))
    }

    /// Handles a window whose children all have results.
    fn finish(&mut self, stage: &Stage, batch: Batch) -> Result<Next, StepError> {
        if let Some(failure) = batch.slots.iter().find_map(|slot| match &slot.status {
            SlotStatus::Failed { failure } => Some(failure.clone()),
            _ => None,
        }) {
            return Ok(Next::Fail(failure));
        }
        let mut outputs = Vec::with_capacity(batch.slots.len());
        for slot in batch.slots {
            match slot.status {
                SlotStatus::Completed { output } => outputs.push(output),
                _ => return Err(protocol("a finished window holds an unfinished child")),
            }
        }
        let mut done = batch.done;
        match &stage.body {
            Body::Call { .. } | Body::Switch { .. } => {
                self.state.value = outputs.remove(0);
                self.state.stage += 1;
                Ok(Next::Advance)
            }
            Body::Fork {
                branches,
                reduce,
                output,
                ..
            } => {
                done.extend(outputs);
                if done.len() < branches.len() {
                    let from = done.len();
                    return Ok(Next::Effects(self.launch_window(stage, from, done)?));
                }
                let reduced = match reduce(&done) {
                    Ok(reduced) => reduced,
                    Err(problem) => return Ok(Next::Fail(pure_failure(stage, "reduce", problem))),
                };
                if let Err(violation) = output.validate(&reduced) {
                    return Ok(Next::Fail(Failure::contract(
                        "workflow.fork.output_invalid",
                        format!("stage {}: reduced output rejected: {violation}", stage.id),
                    )));
                }
                self.state.value = reduced;
                self.state.stage += 1;
                Ok(Next::Advance)
            }
            Body::Map { .. } => {
                done.extend(outputs);
                let total = items(stage, &self.state.value).map_err(StepError)?.len();
                if done.len() < total {
                    let from = done.len();
                    return Ok(Next::Effects(self.launch_window(stage, from, done)?));
                }
                self.state.value = Payload::encode(&done)?;
                self.state.stage += 1;
                Ok(Next::Advance)
            }
            Body::Loop {
                body,
                max_iterations,
                predicate,
                ..
            } => {
                let value = outputs.remove(0);
                let iteration = batch.iteration;
                let satisfied = match predicate(&value) {
                    Ok(satisfied) => satisfied,
                    Err(problem) => {
                        return Ok(Next::Fail(pure_failure(stage, "predicate", problem)));
                    }
                };
                if satisfied || iteration >= *max_iterations {
                    self.state.value = Payload::encode(&LoopResult {
                        value,
                        iterations: iteration,
                        satisfied,
                    })?;
                    self.state.stage += 1;
                    return Ok(Next::Advance);
                }
                let next = iteration + 1;
                let key = indexed_key(stage, u64::from(next))?;
                self.state.value = value.clone();
                Ok(Next::Effects(self.launch(
                    vec![(0, key, body, value)],
                    Vec::new(),
                    next,
                )))
            }
            Body::Transform { .. } => Err(protocol("a transform has no children")),
        }
    }

    /// Runs stages from the current one until one needs children, one
    /// fails, or the workflow completes.
    fn run_stages(&mut self, consumed: usize) -> Result<Transition, StepError> {
        let inner = self.inner.clone();
        // Whether the value is known to satisfy the current stage's input
        // schema, so that a transform need not check it again: at stage 0 it
        // is the workflow's input, which a definition is only ever started
        // with once validated against the descriptor's input schema (the
        // first stage's); after a transform, its output was just checked
        // against its output schema, which `Workflow::new` requires to equal
        // the next stage's input schema. A check of the same bytes against
        // an equal schema could not fail.
        let mut checked = self.state.stage == 0;
        loop {
            let Some(stage) = inner.stages.get(self.state.stage) else {
                return Ok(Transition::Complete {
                    consumed,
                    output: self.state.value.clone(),
                });
            };
            let fail = |failure: Failure| Ok(Transition::Fail { consumed, failure });
            let effects = match &stage.body {
                Body::Transform { input, output, run } => {
                    if !checked && let Err(violation) = input.validate(&self.state.value) {
                        return fail(Failure::contract(
                            "workflow.transform.input_invalid",
                            format!("stage {}: input rejected: {violation}", stage.id),
                        ));
                    }
                    let result = match run(&self.state.value) {
                        Ok(result) => result,
                        Err(problem) => return fail(pure_failure(stage, "transform", problem)),
                    };
                    if let Err(violation) = output.validate(&result) {
                        return fail(Failure::contract(
                            "workflow.transform.output_invalid",
                            format!("stage {}: output rejected: {violation}", stage.id),
                        ));
                    }
                    self.state.value = result;
                    self.state.stage += 1;
                    checked = true;
                    continue;
                }
                Body::Call { child } => {
                    let key = ChildKey::new(&stage.id)?;
                    let input = self.state.value.clone();
                    self.launch(vec![(0, key, child, input)], Vec::new(), 0)
                }
                Body::Switch { select, cases, .. } => {
                    let case = match select(&self.state.value) {
                        Ok(case) => case,
                        Err(problem) => return fail(pure_failure(stage, "selector", problem)),
                    };
                    let Some((case, child)) = cases.iter().find(|(id, _)| *id == case) else {
                        return fail(Failure::contract(
                            "workflow.switch.case_unknown",
                            format!(
                                "stage {}: the selector chose {:?}, which is not a case",
                                stage.id,
                                case.chars().take(80).collect::<String>()
                            ),
                        ));
                    };
                    let key = ChildKey::new(format!("{}.{case}", stage.id))?;
                    let input = self.state.value.clone();
                    self.launch(vec![(0, key, child, input)], Vec::new(), 0)
                }
                Body::Fork { .. } => self.launch_window(stage, 0, Vec::new())?,
                Body::Map { max_items, .. } => {
                    let count = match items(stage, &self.state.value) {
                        Ok(items) => items.len(),
                        Err(failure) => return fail(failure),
                    };
                    if count > *max_items as usize {
                        return fail(Failure::contract(
                            "workflow.map.max_items_exceeded",
                            format!(
                                "stage {}: {count} items exceed max_items {max_items}",
                                stage.id
                            ),
                        ));
                    }
                    if count == 0 {
                        self.state.value = Payload::encode(&Vec::<Payload>::new())?;
                        self.state.stage += 1;
                        continue;
                    }
                    self.launch_window(stage, 0, Vec::new())?
                }
                Body::Loop { body, .. } => {
                    let key = ChildKey::new(format!("{}.1", stage.id))?;
                    let input = self.state.value.clone();
                    self.launch(vec![(0, key, body, input)], Vec::new(), 1)
                }
            };
            return Ok(Transition::Continue { consumed, effects });
        }
    }
}

/// The failure of a pure stage function (`what`: transform, selector,
/// reduce, predicate): its input did not decode (contract
/// `input_invalid`), it refused (execution `failed`), or its result did not
/// encode (contract `output_invalid`). A transform's codes are
/// `workflow.transform.<suffix>`, the others' `workflow.<kind>.<what>_<suffix>`.
fn pure_failure(stage: &Stage, what: &str, problem: Problem) -> Failure {
    let kind = stage.kind();
    let code = |suffix: &str| {
        if kind == StageKind::Transform {
            format!("workflow.{kind}.{suffix}")
        } else {
            format!("workflow.{kind}.{what}_{suffix}")
        }
    };
    let id = &stage.id;
    match problem {
        Problem::Input(message) => Failure::contract(
            &code("input_invalid"),
            format!("stage {id}: {what} input does not decode: {message}"),
        ),
        Problem::Rejected(message) => Failure::new(
            FailureKind::Execution,
            &code("failed"),
            format!("stage {id}: {what} failed: {message}"),
        ),
        Problem::Output(message) => Failure::contract(
            &code("output_invalid"),
            format!("stage {id}: {what} output does not encode: {message}"),
        ),
    }
}

impl Execution for Run {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        let consumed = window.len();
        let inner = self.inner.clone();
        let next = match self.state.batch.take() {
            None if window.is_empty() => Next::Advance,
            None => {
                return Err(protocol(format!(
                    "{} signals arrived while no child runs",
                    window.len()
                )));
            }
            Some(mut batch) => {
                let stage = inner
                    .stages
                    .get(self.state.stage)
                    .ok_or_else(|| protocol("children recorded past the last stage"))?;
                let refused = absorb(stage, &mut batch, window)?;
                let running = running(&batch);
                if !running.is_empty() {
                    let start_failed = batch.slots.iter().any(|slot| {
                        matches!(&slot.status, SlotStatus::Failed { failure }
                            if failure.code().ends_with("start_failed"))
                    });
                    if !(refused && start_failed) {
                        return Err(protocol(format!(
                            "stage {}: children still run but no wait is pending",
                            stage.id
                        )));
                    }
                    self.state.batch = Some(batch);
                    return Ok(Transition::Continue {
                        consumed,
                        effects: vec![wait_all(running)],
                    });
                }
                self.finish(stage, batch)?
            }
        };
        match next {
            Next::Effects(effects) => Ok(Transition::Continue { consumed, effects }),
            Next::Fail(failure) => Ok(Transition::Fail { consumed, failure }),
            Next::Advance => self.run_stages(consumed),
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        self.state.snapshot()
    }

    /// The running stage by id (iteration: its number from 1, or a loop's
    /// iteration), with how many of its children are done.
    fn progress(&self) -> Option<Progress> {
        let stage = self.inner.stages.get(self.state.stage)?;
        let mut progress = Progress::phase(format!("stage {}", stage.id));
        match &self.state.batch {
            Some(batch) if batch.iteration > 0 => {
                progress = progress.with_iteration(u64::from(batch.iteration));
            }
            _ => progress = progress.with_iteration(self.state.stage as u64 + 1),
        }
        if let Some(batch) = &self.state.batch {
            let running = running(batch).len();
            progress = progress.with_detail(format!(
                "{} of {} children done",
                batch.slots.len() - running,
                batch.slots.len()
            ));
        }
        Some(progress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tagged form the flat reading replaces, decoded the direct way.
    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
    enum Tagged {
        Starting,
        Running { process: ProcessId },
        Completed { output: Payload },
        Failed { failure: Failure },
    }

    impl From<Tagged> for SlotStatus {
        fn from(tagged: Tagged) -> SlotStatus {
            match tagged {
                Tagged::Starting => SlotStatus::Starting,
                Tagged::Running { process } => SlotStatus::Running { process },
                Tagged::Completed { output } => SlotStatus::Completed { output },
                Tagged::Failed { failure } => SlotStatus::Failed { failure },
            }
        }
    }

    #[test]
    fn slot_statuses_decode_exactly_as_the_tagged_form() {
        let process = r#""p_0123456789abcdef0123456789abcdef""#;
        let failure = r#"{"code":"x.y","kind":"contract","message":"m"}"#;
        let fields = [
            String::new(),
            format!(r#","process":{process}"#),
            r#","output":null"#.to_owned(),
            r#","output":{"a":[1,2]}"#.to_owned(),
            format!(r#","failure":{failure}"#),
            r#","failure":null"#.to_owned(),
            r#","process":null"#.to_owned(),
            r#","process":"nope""#.to_owned(),
            r#","extra":1"#.to_owned(),
            format!(r#","process":{process},"output":3"#),
            r#","output":3,"output":4"#.to_owned(),
        ];
        let mut accepted = 0;
        for status in ["starting", "running", "completed", "failed", "other"] {
            for field in &fields {
                for text in [
                    format!(r#"{{"status":"{status}"{field}}}"#),
                    format!(
                        r#"{{{}"status":"{status}"}}"#,
                        field.trim_start_matches(',').to_owned()
                            + if field.is_empty() { "" } else { "," }
                    ),
                ] {
                    let flat = serde_json::from_str::<SlotStatus>(&text).ok();
                    let tagged = serde_json::from_str::<Tagged>(&text)
                        .ok()
                        .map(SlotStatus::from);
                    if tagged == Some(SlotStatus::Starting) && !field.is_empty() {
                        // serde lets a tagged unit variant ignore unknown
                        // fields despite `deny_unknown_fields`; the flat
                        // reading refuses them, as every other shape does.
                        assert_eq!(flat, None, "{text}");
                        continue;
                    }
                    assert_eq!(flat, tagged, "{text}");
                    accepted += usize::from(flat.is_some());
                }
            }
        }
        // starting (alone), running (its process), completed (a null or an
        // object output), failed (its failure): five shapes, in both orders.
        assert_eq!(
            accepted,
            2 * 5,
            "each status accepts its own fields, in either order"
        );
        let missing = serde_json::from_str::<SlotStatus>(
            r#"{"process":"p_0123456789abcdef0123456789abcdef"}"#,
        );
        assert!(missing.is_err(), "the status is required");
    }
}
