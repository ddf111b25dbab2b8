//! The fold: committed tree state rebuilt from records.
//!
//! The engine and recovery share one function, [`TreeState::apply`]: the
//! engine computes a record, applies it, commits it, and only then acts on
//! it; recovery ([`fold`]) verifies the stored records and applies them to
//! the latest snapshot. Steps are never re-executed to rebuild state.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::budget::{Budget, Capabilities, Dimension, Meters, Quota, TreeLimits, Usage};
use crate::clock::Timestamp;
use crate::descriptor::Schema;
use crate::digest::Digest;
use crate::failure::{Cause, Failure, Status, Termination};
use crate::ids::{ChildKey, EffectId, Name, ProcessId, SignalId, StartId, WaitId};
use crate::labels::Labels;
use crate::log::{Delivery, RecordBody};
use crate::payload::Payload;
use crate::protocol::{
    ChildOutcome, Effect, ExecutionState, ProgramRef, ProgramVersion, Settlement, Signal,
    SignalBody, Transition,
};
use crate::storage::{TreeMeta, TreeStatus};

mod child;
mod fold;
mod input;
pub(super) mod snapshot;

pub(super) use fold::{fold, replay, verify_history};
pub(crate) use input::InputDigest;
pub(super) use snapshot::encode as snapshot;

/// The committed state of a whole tree.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TreeState {
    pub start: StartId,
    pub root: ProcessId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Timestamp>,
    pub limits: TreeLimits,
    /// When the tree was started, when its start recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<Timestamp>,
    /// The labels the tree was started with.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
    /// Bytes of log records folded into this state (kept by the writer and
    /// by the fold, not by `apply`, which never sees record sizes).
    #[serde(default)]
    pub history_bytes: u64,
    /// Boxed so a one-process tree does not pay for a whole B-tree node of states.
    pub processes: BTreeMap<ProcessId, Box<ProcessState>>,
}

/// The committed state of one process.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProcessState {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ProcessId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<ChildKey>,
    #[serde(default)]
    pub depth: u32,
    /// Children by key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub children: BTreeMap<ChildKey, ProcessId>,
    /// Budget granted to children, debited for good.
    #[serde(default)]
    pub granted: Usage,
    /// Children not yet terminated.
    #[serde(default)]
    pub live_children: u32,
    pub program: ProgramId,
    pub input: InputDigest,
    pub budget: Budget,
    pub capabilities: Capabilities,
    pub usage: Usage,
    pub status: Status,
    pub steps: u64,
    pub state: ExecutionState,
    /// Unconsumed signals, oldest first.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub mailbox: VecDeque<Signal>,
    /// Signals consumed so far.
    pub consumed: u64,
    /// Host signal ids admitted, with the digest of their content.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub receipts: BTreeMap<SignalId, Digest>,
    /// The current transition's effects, in declaration order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batch: Vec<Slot>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<WaitId>,
    /// External waits open for an answer.
    /// Boxed: a B-tree node holds room for eleven entries.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub waits: BTreeMap<WaitId, Box<OpenWait>>,
    /// External waits already answered.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub answered: BTreeSet<WaitId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel: Option<CancelIntent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination: Option<Termination>,
}

/// Which exact program a process runs: its ref digest, and its name for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProgramId {
    pub name: Name,
    pub digest: Digest,
}

impl From<&ProgramRef> for ProgramId {
    fn from(reference: &ProgramRef) -> ProgramId {
        ProgramId {
            name: reference.name.clone(),
            digest: reference.digest,
        }
    }
}

/// One effect of the current batch.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Slot {
    pub id: EffectId,
    pub effect: Effect,
    pub phase: Phase,
    /// Attempts of a dispatch that failed and were tried again.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed_attempts: u32,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// Where an effect stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Phase {
    Planned,
    Pending,
    /// A failed attempt waits to be tried again once `at` has passed.
    Backoff {
        at: Timestamp,
    },
    Settled(Settlement),
}

/// An external wait open for an answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OpenWait {
    pub effect: EffectId,
    pub key: ChildKey,
    pub request: Payload,
    pub answer_schema: Schema,
}

/// A recorded cancellation request.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelIntent {
    pub cause: Cause,
    pub reason: String,
}

/// A record that does not follow from the state it is applied to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record does not apply: {0}")]
pub(crate) struct ApplyError(pub String);

fn inconsistent<T>(message: impl Into<String>) -> Result<T, ApplyError> {
    Err(ApplyError(message.into()))
}

impl TreeState {
    /// Keeps only the digests of the inputs its processes still hold (a
    /// tree that goes on after a commit: see [`InputDigest`]).
    pub(super) fn settle_inputs(&mut self) {
        for process in self.processes.values_mut() {
            process.input.settle();
        }
    }
}

impl ProcessState {
    fn new(
        program: ProgramId,
        input: &Payload,
        budget: &Budget,
        capabilities: &Capabilities,
        state: &ExecutionState,
    ) -> ProcessState {
        ProcessState {
            parent: None,
            key: None,
            depth: 0,
            children: BTreeMap::new(),
            granted: Usage::default(),
            live_children: 0,
            program,
            input: InputDigest::of(input),
            budget: budget.clone(),
            capabilities: capabilities.clone(),
            usage: Usage::default(),
            status: Status::Running,
            steps: 0,
            state: state.clone(),
            mailbox: VecDeque::new(),
            consumed: 0,
            receipts: BTreeMap::new(),
            batch: Vec::new(),
            waiting: None,
            waits: BTreeMap::new(),
            answered: BTreeSet::new(),
            cancel: None,
            termination: None,
        }
    }

    /// Debits a child's grant from every finite dimension of this budget.
    /// Unlimited dimensions grant without a debit; grants are never refunded.
    fn debit(&mut self, child: &Budget) {
        let add = |quota: Quota, granted: &mut u64, amount: Quota| {
            if let (Quota::Finite(_), Quota::Finite(amount)) = (quota, amount) {
                *granted = granted.saturating_add(amount);
            }
        };
        add(self.budget.steps, &mut self.granted.steps, child.steps);
        add(
            self.budget.effects,
            &mut self.granted.effects,
            child.effects,
        );
        add(
            self.budget.signals,
            &mut self.granted.signals,
            child.signals,
        );
        for (meter, quota) in &self.budget.meters {
            let granted = self.granted.meters.entry(meter.clone()).or_insert(0);
            add(*quota, granted, child.meter(meter));
        }
    }

    /// The first effect not definitely settled (an unknown occupies it).
    pub fn frontier(&self) -> Option<&Slot> {
        self.batch
            .iter()
            .find(|slot| !matches!(&slot.phase, Phase::Settled(s) if !s.is_unknown()))
    }

    /// Effects whose outcome is not known: pending or settled unknown.
    pub fn unresolved(&self) -> Vec<EffectId> {
        self.batch
            .iter()
            .filter(|slot| match &slot.phase {
                Phase::Pending => true,
                Phase::Settled(settlement) => settlement.is_unknown(),
                // A backing-off dispatch failed definitely (or was tried
                // again under its identity); nothing of it is uncertain.
                Phase::Planned | Phase::Backoff { .. } => false,
            })
            .map(|slot| slot.id)
            .collect()
    }

    /// Whether the process should be stepped now.
    pub fn runnable(&self) -> bool {
        self.status == Status::Running && self.termination.is_none() && self.batch.is_empty()
    }

    fn slot_mut(&mut self, effect: EffectId) -> Result<&mut Slot, ApplyError> {
        match self.batch.iter_mut().find(|slot| slot.id == effect) {
            Some(slot) => Ok(slot),
            None => inconsistent(format!("effect {effect} is not in the current batch")),
        }
    }

    /// Settles local effects at the frontier and, once every effect is
    /// settled, delivers their results as signals in declaration order.
    fn advance(&mut self) {
        self.advance_with(None);
    }

    /// [`ProcessState::advance`], with the decoded outcomes of a children
    /// wait if the caller has them (see [`TreeState::apply_with`]).
    fn advance_with(&mut self, mut ready: Option<(EffectId, Vec<ChildOutcome>)>) {
        for slot in &mut self.batch {
            match (&slot.phase, &slot.effect) {
                (Phase::Settled(_), _) => continue,
                (Phase::Planned, Effect::Wait { .. }) => {
                    slot.phase = Phase::Settled(Settlement::ok(Payload::null()));
                }
                // A process blocked on its children is waiting, not running.
                (Phase::Planned, Effect::WaitChildren { .. }) => {
                    self.status = Status::Waiting;
                    return;
                }
                _ => {
                    self.status = Status::Running;
                    return;
                }
            }
        }
        if self
            .batch
            .iter()
            .any(|slot| matches!(&slot.phase, Phase::Settled(s) if s.is_unknown()))
        {
            return;
        }
        for slot in std::mem::take(&mut self.batch) {
            let Phase::Settled(settlement) = slot.phase else {
                unreachable!("every slot was checked settled above")
            };
            let body = match slot.effect {
                Effect::Wait {
                    key,
                    request,
                    answer_schema,
                } => {
                    let wait = WaitId::for_effect(slot.id);
                    self.waits.insert(
                        wait,
                        Box::new(OpenWait {
                            effect: slot.id,
                            key: key.clone(),
                            request: request.clone(),
                            answer_schema,
                        }),
                    );
                    SignalBody::WaitOpened {
                        effect: slot.id,
                        wait,
                        key,
                        request,
                    }
                }
                Effect::Dispatch { .. } => SignalBody::Settled {
                    effect: slot.id,
                    settlement,
                },
                Effect::StartChild { key, .. } => match settlement {
                    Settlement::Succeeded { output, .. } => SignalBody::ChildStarted {
                        effect: slot.id,
                        key,
                        process: ProcessId::from_payload(&output),
                        failure: None,
                    },
                    Settlement::Failed { failure, .. } => SignalBody::ChildStarted {
                        effect: slot.id,
                        key,
                        process: None,
                        failure: Some(failure),
                    },
                    unknown @ Settlement::Unknown { .. } => SignalBody::Settled {
                        effect: slot.id,
                        settlement: unknown,
                    },
                },
                Effect::SignalChild { key, .. } | Effect::CancelChild { key, .. } => {
                    SignalBody::ControlReceipt {
                        effect: slot.id,
                        key,
                        result: settlement,
                    }
                }
                Effect::WaitChildren { .. } => match &settlement {
                    Settlement::Succeeded { output, .. } => match ready
                        .take_if(|(effect, _)| *effect == slot.id)
                        .map(|(_, children)| {
                            // A `children_ready` record's slot holds `null`:
                            // its outcomes come only with it.
                            debug_assert!(
                                output.as_str() == "null"
                                    || output.decode::<Vec<ChildOutcome>>().as_ref()
                                        == Ok(&children),
                                "a settlement's payload encodes the outcomes given with it"
                            );
                            Ok(children)
                        })
                        .unwrap_or_else(|| output.decode())
                    {
                        Ok(children) => SignalBody::ChildrenReady {
                            effect: slot.id,
                            children,
                        },
                        Err(_) => SignalBody::Settled {
                            effect: slot.id,
                            settlement,
                        },
                    },
                    _ => SignalBody::Settled {
                        effect: slot.id,
                        settlement,
                    },
                },
            };
            self.mailbox.push_back(Signal {
                id: SignalId::for_effect(slot.id),
                wait: None,
                body,
            });
        }
        self.status = Status::Running;
    }

    /// Budget used plus budget granted to children, in one dimension.
    pub fn spent(&self, dimension: &Dimension) -> u64 {
        self.usage
            .used(dimension)
            .saturating_add(self.granted.used(dimension))
    }

    /// Whether `more` of a dimension still fits the budget.
    pub fn allows(&self, dimension: &Dimension, more: u64) -> bool {
        self.budget
            .quota(dimension)
            .allows(self.spent(dimension), more)
    }

    /// Appends an admitted signal: closes the wait it answers, wakes the
    /// process if it sleeps on that wait, records the receipt, charges it.
    fn receive(&mut self, signal: &Signal) -> Result<(), ApplyError> {
        if let Some(wait) = signal.wait {
            if self.waits.remove(&wait).is_none() {
                return inconsistent(format!("signal answers wait {wait}, which is not open"));
            }
            self.answered.insert(wait);
            if self.waiting == Some(wait) && self.status == Status::Waiting {
                self.status = Status::Running;
            }
        }
        if !signal.id.is_engine() {
            self.receipts
                .insert(signal.id.clone(), signal_digest(signal));
        }
        self.usage.signals += 1;
        self.mailbox.push_back(signal.clone());
        Ok(())
    }

    fn terminate(&mut self, termination: Termination) {
        self.status = termination.status();
        self.termination = Some(termination);
        self.waiting = None;
        self.waits.clear();
        self.mailbox.clear();
    }

    /// The reservation of a dispatch slot.
    fn reserve_of(slot: &Slot) -> Meters {
        match &slot.effect {
            Effect::Dispatch { reserve, .. } => reserve.clone(),
            _ => Meters::new(),
        }
    }

    fn charge_meters(&mut self, meters: &Meters) {
        for (name, amount) in meters {
            let used = self.usage.meters.entry(name.clone()).or_insert(0);
            *used = used.saturating_add(*amount);
        }
    }

    fn refund_meters(&mut self, meters: &Meters) {
        for (name, amount) in meters {
            if let Some(used) = self.usage.meters.get_mut(name) {
                *used = used.saturating_sub(*amount);
            }
        }
    }

    /// Replaces a pending reservation by the actual usage, capped at the reservation.
    fn settle_meters(&mut self, reserve: &Meters, settlement: &Settlement) {
        if let Some(usage) = settlement.usage() {
            self.settle_meters_used(reserve, usage);
        }
    }

    /// Replaces a reservation by the usage reported, each meter capped at
    /// what was reserved.
    fn settle_meters_used(&mut self, reserve: &Meters, usage: &Meters) {
        self.refund_meters(reserve);
        let actual: Meters = reserve
            .iter()
            .map(|(name, reserved)| {
                (
                    name.clone(),
                    usage.get(name).copied().unwrap_or(0).min(*reserved),
                )
            })
            .collect();
        self.charge_meters(&actual);
    }
}

impl TreeState {
    /// The state a `TreeStarted` record creates.
    pub fn started(body: &RecordBody) -> Result<TreeState, ApplyError> {
        let RecordBody::TreeStarted {
            start,
            root,
            program,
            input,
            budget,
            capabilities,
            deadline,
            limits,
            created,
            labels,
            state,
        } = body
        else {
            return inconsistent("a log must begin with tree_started");
        };
        let process =
            ProcessState::new(program.as_ref().into(), input, budget, capabilities, state);
        Ok(TreeState {
            start: start.clone(),
            root: *root,
            deadline: *deadline,
            limits: limits.clone(),
            created: *created,
            labels: labels.clone(),
            history_bytes: 0,
            processes: BTreeMap::from([(*root, Box::new(process))]),
        })
    }

    fn process_mut(&mut self, id: ProcessId) -> Result<&mut ProcessState, ApplyError> {
        match self.processes.get_mut(&id) {
            Some(process) if process.termination.is_none() => Ok(process),
            Some(_) => inconsistent(format!("process {id} already terminated")),
            None => inconsistent(format!("unknown process {id}")),
        }
    }

    /// The root's termination, once it has one.
    pub fn root_termination(&self) -> Option<&Termination> {
        self.processes
            .get(&self.root)
            .and_then(|p| p.termination.as_ref())
    }

    /// Whether every process has terminated.
    pub fn done(&self) -> bool {
        self.processes.values().all(|p| p.termination.is_some())
    }

    /// Where the state stands for hosts awaiting a condition, at `head_seq`.
    pub(crate) fn reached(&self, head_seq: u64) -> crate::engine::shared::Reached {
        self.summary(head_seq).1
    }

    /// The listing status ([`TreeState::tree_status`]) and where the state
    /// stands for hosts awaiting a condition, in one pass over the processes
    /// (a commit needs both).
    pub(crate) fn summary(&self, head_seq: u64) -> (TreeStatus, crate::engine::shared::Reached) {
        let done = self.root_termination().is_some();
        let (mut running, mut parked, mut wait_open) = (false, false, false);
        for process in self.processes.values().filter(|p| p.termination.is_none()) {
            match process.status {
                Status::Parked => parked = true,
                Status::Running => running = true,
                _ => {}
            }
            wait_open |= !process.waits.is_empty();
        }
        let status = match () {
            () if done => TreeStatus::Done,
            () if parked => TreeStatus::NeedsAttention,
            () if running => TreeStatus::Running,
            () => TreeStatus::Waiting,
        };
        let reached = crate::engine::shared::Reached {
            head_seq,
            quiescent: !running,
            wait_open,
        };
        (status, reached)
    }

    /// The processes not yet terminated, in id order.
    pub fn live_ids(&self) -> Vec<ProcessId> {
        self.processes
            .iter()
            .filter(|(_, p)| p.termination.is_none())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Whether a process and its whole subtree have terminated.
    pub fn drained(&self, id: ProcessId) -> bool {
        let process = &self.processes[&id];
        process.termination.is_some() && process.children.values().all(|child| self.drained(*child))
    }

    /// Unresolved effects anywhere in a subtree.
    pub fn subtree_unresolved(&self, id: ProcessId, into: &mut Vec<EffectId>) {
        let process = &self.processes[&id];
        match &process.termination {
            Some(termination) => into.extend_from_slice(termination.unresolved_effects()),
            None => into.extend(process.unresolved()),
        }
        for child in process.children.values() {
            self.subtree_unresolved(*child, into);
        }
    }

    /// The child keys from the root down to a process.
    pub fn path(&self, mut process: ProcessId) -> Vec<ChildKey> {
        let mut path = Vec::new();
        while let Some(state) = self.processes.get(&process) {
            match (&state.key, state.parent) {
                (Some(key), Some(parent)) => {
                    path.push(key.clone());
                    process = parent;
                }
                _ => break,
            }
        }
        path.reverse();
        path
    }

    /// What a store lists this tree under after an append at `updated`.
    pub fn meta(&self, updated: Timestamp) -> TreeMeta {
        self.meta_with(updated, self.tree_status())
    }

    /// [`TreeState::meta`] with the status already worked out.
    pub(crate) fn meta_with(&self, updated: Timestamp, status: TreeStatus) -> TreeMeta {
        TreeMeta {
            tree: self.root,
            scope: self.start.scope.clone(),
            status,
            updated,
            program: self.processes.get(&self.root).map(|root| ProgramVersion {
                name: root.program.name.clone(),
                digest: root.program.digest,
            }),
            labels: self.labels.clone(),
            created: self.created,
        }
    }

    /// The status a store lists this tree under.
    pub fn tree_status(&self) -> TreeStatus {
        self.summary(0).0
    }

    /// Applies one record.
    pub fn apply(&mut self, body: &RecordBody) -> Result<(), ApplyError> {
        self.apply_with(body, None)
    }

    /// [`TreeState::apply`], given the children's outcomes of a children
    /// wait that `body` settles, as the engine staging it built them: the
    /// fold then takes them instead of decoding them back from the
    /// settlement's payload, which holds exactly their encoding (debug
    /// builds check that the two agree).
    pub(crate) fn apply_with(
        &mut self,
        body: &RecordBody,
        ready: Option<(EffectId, Vec<ChildOutcome>)>,
    ) -> Result<(), ApplyError> {
        self.apply_fact(body, ready)?;
        let ended = match body {
            RecordBody::Terminated { process, .. } => Some(process),
            RecordBody::StepAdopted {
                process,
                transition: Transition::Complete { .. } | Transition::Fail { .. },
                ..
            } => Some(process),
            _ => None,
        };
        if let Some(parent) = ended.and_then(|process| self.processes[process].parent)
            && let Some(parent) = self.processes.get_mut(&parent)
        {
            parent.live_children = parent.live_children.saturating_sub(1);
        }
        Ok(())
    }

    fn apply_fact(
        &mut self,
        body: &RecordBody,
        ready: Option<(EffectId, Vec<ChildOutcome>)>,
    ) -> Result<(), ApplyError> {
        match body {
            RecordBody::TreeStarted { .. } => inconsistent("tree_started may only begin a log"),
            RecordBody::StepAdopted {
                process,
                step,
                state,
                state_change,
                transition,
            } => {
                let id = *process;
                let process = self.process_mut(id)?;
                let adopted = match (state, state_change) {
                    (Some(state), None) => state.clone(),
                    (None, Some(change)) => change.apply(&process.state).map_err(ApplyError)?,
                    _ => {
                        return inconsistent(
                            "a step's record holds its state whole or as a change, not both or neither",
                        );
                    }
                };
                if *step != process.steps {
                    return inconsistent(format!(
                        "step {step} out of order (expected {})",
                        process.steps
                    ));
                }
                if !process.batch.is_empty() {
                    return inconsistent("step adopted while effects are outstanding");
                }
                let consumed = transition.consumed();
                if consumed > process.mailbox.len() {
                    return inconsistent("step consumed more signals than delivered");
                }
                process.mailbox.drain(..consumed);
                process.consumed += consumed as u64;
                process.steps += 1;
                process.usage.steps += 1;
                process.state = adopted;
                process.waiting = None;
                match transition {
                    Transition::Continue { effects, .. } => {
                        let count = effects.len() as u64;
                        process.usage.effects += count;
                        process.usage.signals += count;
                        process.batch = effects
                            .iter()
                            .enumerate()
                            .map(|(index, effect)| Slot {
                                id: EffectId::new(id, *step, index as u32),
                                effect: effect.clone(),
                                phase: Phase::Planned,
                                failed_attempts: 0,
                            })
                            .collect();
                        process.status = Status::Running;
                        process.advance();
                    }
                    Transition::Wait { wait, .. } => {
                        process.waiting = Some(*wait);
                        // A sleeping process keeps no spare mailbox capacity.
                        process.mailbox.shrink_to_fit();
                        let answered = process
                            .mailbox
                            .iter()
                            .any(|signal| signal.wait == Some(*wait));
                        process.status = if answered {
                            Status::Running
                        } else {
                            Status::Waiting
                        };
                    }
                    Transition::Complete { output, .. } => {
                        process.terminate(Termination::completed(output.clone()))
                    }
                    Transition::Fail { failure, .. } => {
                        process.terminate(Termination::failed(failure.clone()))
                    }
                }
                Ok(())
            }
            RecordBody::EffectPending { process, effect } => {
                let process = self.process_mut(*process)?;
                let slot = process.slot_mut(*effect)?;
                let ready = matches!(slot.phase, Phase::Planned | Phase::Backoff { .. });
                if !ready || !matches!(slot.effect, Effect::Dispatch { .. }) {
                    return inconsistent(format!("effect {effect} cannot become pending"));
                }
                slot.phase = Phase::Pending;
                let reserve = ProcessState::reserve_of(slot);
                process.charge_meters(&reserve);
                Ok(())
            }
            RecordBody::EffectRetrying {
                process,
                effect,
                usage,
                at,
                ..
            } => {
                let process = self.process_mut(*process)?;
                let slot = process.slot_mut(*effect)?;
                if slot.phase != Phase::Pending {
                    return inconsistent(format!("effect {effect} cannot back off now"));
                }
                slot.phase = Phase::Backoff { at: *at };
                slot.failed_attempts = slot.failed_attempts.saturating_add(1);
                let reserve = ProcessState::reserve_of(slot);
                // The failed attempt is charged what it used, as a settlement
                // would be; the next attempt reserves again.
                process.settle_meters_used(&reserve, usage);
                Ok(())
            }
            RecordBody::EffectSettled {
                process,
                effect,
                settlement,
            } => {
                let process = self.process_mut(*process)?;
                let slot = process.slot_mut(*effect)?;
                let was_pending = match slot.phase {
                    Phase::Pending => true,
                    // A refusal before any I/O settles a planned effect, or
                    // one backing off before its next attempt.
                    Phase::Planned | Phase::Backoff { .. } if !settlement.is_unknown() => false,
                    _ => return inconsistent(format!("effect {effect} cannot settle now")),
                };
                slot.phase = Phase::Settled(settlement.clone());
                let reserve = ProcessState::reserve_of(slot);
                if was_pending && !settlement.is_unknown() {
                    process.settle_meters(&reserve, settlement);
                }
                if settlement.is_unknown() {
                    process.status = Status::Parked;
                } else {
                    process.advance_with(ready);
                }
                Ok(())
            }
            RecordBody::ChildrenReady { process, effect } => {
                self.children_ready(*process, *effect, ready)
            }
            RecordBody::EffectResolved {
                process,
                effect,
                settlement,
            } => {
                let process = self.process_mut(*process)?;
                let slot = process.slot_mut(*effect)?;
                if !matches!(&slot.phase, Phase::Settled(s) if s.is_unknown())
                    || settlement.is_unknown()
                {
                    return inconsistent(format!(
                        "effect {effect} is not unknown or the resolution is"
                    ));
                }
                slot.phase = Phase::Settled(settlement.clone());
                let reserve = ProcessState::reserve_of(slot);
                process.settle_meters(&reserve, settlement);
                process.status = Status::Running;
                process.advance();
                Ok(())
            }
            RecordBody::EffectReplayed { process, effect } => {
                let process = self.process_mut(*process)?;
                let slot = process.slot_mut(*effect)?;
                if !matches!(&slot.phase, Phase::Settled(s) if s.is_unknown()) {
                    return inconsistent(format!("effect {effect} is not unknown"));
                }
                slot.phase = Phase::Pending;
                process.status = Status::Running;
                Ok(())
            }
            RecordBody::SignalsAdmitted { process, signals } => {
                let process = self.process_mut(*process)?;
                for signal in signals {
                    process.receive(signal)?;
                }
                Ok(())
            }
            RecordBody::CancelRequested {
                process,
                cause,
                reason,
            } => {
                let process = self.process_mut(*process)?;
                if process.cancel.is_none() {
                    process.cancel = Some(CancelIntent {
                        cause: *cause,
                        reason: reason.clone(),
                    });
                }
                Ok(())
            }
            RecordBody::Terminated {
                process,
                termination,
            } => {
                let process = self.process_mut(*process)?;
                process.terminate(termination.clone());
                Ok(())
            }
            RecordBody::ChildStarted { .. } => self.child_started(body),
            RecordBody::ControlDelivered {
                parent,
                effect,
                child,
                delivery,
            } => {
                let parent = self.process_mut(*parent)?;
                let key = match parent.batch.iter().find(|slot| slot.id == *effect) {
                    Some(Slot {
                        effect: Effect::SignalChild { key, .. } | Effect::CancelChild { key, .. },
                        phase: Phase::Planned,
                        ..
                    }) => key.clone(),
                    _ => return inconsistent(format!("effect {effect} is not a planned control")),
                };
                if parent.children.get(&key) != Some(child) {
                    return inconsistent(format!("{child} is not the child {key}"));
                }
                let slot = parent.slot_mut(*effect)?;
                slot.phase = Phase::Settled(Settlement::ok(Payload::null()));
                parent.advance();
                let child = self.process_mut(*child)?;
                match delivery {
                    Delivery::Signal { signal } => child.receive(signal)?,
                    Delivery::Cancel { reason } => {
                        if child.cancel.is_none() {
                            child.cancel = Some(CancelIntent {
                                cause: Cause::ParentCancellation,
                                reason: reason.clone(),
                            });
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

/// Digest identifying a host signal's content (wait and payload), for
/// idempotent admission.
pub(crate) fn signal_digest(signal: &Signal) -> Digest {
    let payload = match &signal.body {
        SignalBody::Input { payload } => payload.digest(),
        _ => Digest::ZERO,
    };
    let wait = signal.wait.map(|w| *w.as_bytes()).unwrap_or([0; 16]);
    Digest::of_parts(
        crate::digest::Purpose::Identity,
        &[b"signal", &wait, payload.as_bytes()],
    )
}

/// A failure for a cancellation or deadline that ended a process.
pub(crate) fn ending_failure(cause: Cause, reason: &str) -> Failure {
    match cause {
        Cause::HostCancellation | Cause::ParentCancellation => {
            Failure::execution("engine.canceled", format!("canceled by {cause}: {reason}"))
        }
        Cause::HostDeadline | Cause::ParentDeadline => {
            Failure::execution("engine.deadline", format!("{cause} passed"))
        }
        Cause::Kill => Failure::execution("engine.killed", format!("killed: {reason}")),
        Cause::Failure | Cause::Completion => {
            Failure::execution("engine.terminated", reason.to_owned())
        }
    }
}
