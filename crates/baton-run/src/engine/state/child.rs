//! The folds of a `child_started` record (the child joins the tree and its
//! parent's start effect settles with the child's id as its receipt) and of
//! a `children_ready` record (a children wait settles with the outcomes the
//! tree holds).

use super::{ApplyError, Phase, ProcessState, ProgramId, TreeState, inconsistent};
use crate::engine::round::{ChildrenWait, WaitSettled, wait_children};
use crate::ids::{EffectId, ProcessId};
use crate::log::RecordBody;
use crate::payload::Payload;
use crate::protocol::{ChildOutcome, Effect, ExecutionState, Settlement};

impl TreeState {
    /// Applies a `child_started` record. The child's key, program, input
    /// and capabilities are those its parent's start effect declared, and
    /// its budget the one the effect asked for unless the record holds the
    /// one a clipped grant gave (logs written before the record named them
    /// by the effect repeat them, and must agree with it); its initial
    /// state is its input unless the record holds another.
    pub(super) fn child_started(&mut self, body: &RecordBody) -> Result<(), ApplyError> {
        let RecordBody::ChildStarted {
            parent,
            effect,
            child,
            key: recorded_key,
            name,
            program: recorded_program,
            input: recorded_input,
            budget: recorded_budget,
            capabilities: recorded_capabilities,
            state,
        } = body
        else {
            return inconsistent("not a child start");
        };
        if self.processes.contains_key(child) {
            return inconsistent(format!("child {child} already exists"));
        }
        let parent_id = *parent;
        let parent = self.process_mut(parent_id)?;
        let slot = parent.slot_mut(*effect)?;
        let Effect::StartChild {
            key,
            program,
            input,
            budget,
            capabilities,
            ..
        } = &slot.effect
        else {
            return inconsistent(format!("effect {effect} is not a child start"));
        };
        if slot.phase != Phase::Planned {
            return inconsistent(format!("effect {effect} is not a planned child start"));
        }
        // Logs written before the record named these by the effect carry
        // them: the declared ones.
        let differs = |what: &str| {
            inconsistent(format!(
                "child {child}'s recorded {what} differs from its start effect's"
            ))
        };
        if recorded_key
            .as_ref()
            .is_some_and(|recorded| recorded != key)
        {
            return differs("key");
        }
        if recorded_program.is_some_and(|recorded| recorded != *program) {
            return differs("program");
        }
        if recorded_input
            .as_ref()
            .is_some_and(|recorded| recorded != input)
        {
            return differs("input");
        }
        if recorded_capabilities
            .as_ref()
            .is_some_and(|recorded| recorded != capabilities)
        {
            return differs("capabilities");
        }
        let (key, program, input, capabilities) =
            (key.clone(), *program, input.clone(), capabilities.clone());
        let budget = recorded_budget.as_ref().unwrap_or(budget).clone();
        let state = state
            .clone()
            .unwrap_or_else(|| ExecutionState(input.clone()));
        let receipt = child.payload();
        slot.phase = Phase::Settled(Settlement::ok(receipt));
        parent.children.insert(key.clone(), *child);
        parent.live_children += 1;
        parent.debit(&budget);
        let depth = parent.depth + 1;
        parent.advance();
        let program = ProgramId {
            name: name.clone(),
            digest: program,
        };
        let mut process = ProcessState::new(program, &input, &budget, &capabilities, &state);
        process.parent = Some(parent_id);
        process.key = Some(key);
        process.depth = depth;
        self.processes.insert(*child, Box::new(process));
        Ok(())
    }

    /// Applies a `children_ready` record: the children wait `effect`, the
    /// last effect of `id`'s batch and the only one open, settles with the
    /// outcomes its children's terminations give now, which must meet its
    /// condition (the engine staging it hands them over as `ready`; debug
    /// builds check them), and the batch ends.
    pub(super) fn children_ready(
        &mut self,
        id: ProcessId,
        effect: EffectId,
        ready: Option<(EffectId, Vec<ChildOutcome>)>,
    ) -> Result<(), ApplyError> {
        let process = self
            .processes
            .get(&id)
            .ok_or_else(|| ApplyError(format!("unknown process {id}")))?;
        let Some((slot, before)) = process.batch.split_last() else {
            return inconsistent(format!("{id} has no open effect"));
        };
        let Effect::WaitChildren {
            keys,
            boundary,
            condition,
        } = &slot.effect
        else {
            return inconsistent(format!(
                "effect {effect} is not the children wait ending its batch"
            ));
        };
        if slot.id != effect || slot.phase != Phase::Planned {
            return inconsistent(format!(
                "effect {effect} is not the children wait ending its batch"
            ));
        }
        if before
            .iter()
            .any(|slot| !matches!(&slot.phase, Phase::Settled(s) if !s.is_unknown()))
        {
            return inconsistent(format!(
                "children wait {effect} settled while another effect of its batch is open"
            ));
        }
        let wait = ChildrenWait {
            keys,
            boundary: *boundary,
            condition: *condition,
        };
        let given = ready.filter(|(given, _)| *given == effect);
        let outcomes = match given {
            Some((_, outcomes)) => {
                debug_assert!(
                    matches!(
                        wait_children(self, id, effect, wait),
                        Some(WaitSettled { ready: Some((_, ref expected)), .. }) if *expected == outcomes
                    ),
                    "the outcomes handed over are the tree's"
                );
                outcomes
            }
            None => match wait_children(self, id, effect, wait) {
                Some(WaitSettled {
                    ready: Some((_, outcomes)),
                    ..
                }) => outcomes,
                _ => {
                    return inconsistent(format!(
                        "children wait {effect} is not met at this point of the log"
                    ));
                }
            },
        };
        let process = self.process_mut(id)?;
        let slot = process.slot_mut(effect)?;
        // A placeholder the batch's end below never reads: the outcomes
        // come with it.
        slot.phase = Phase::Settled(Settlement::ok(Payload::null()));
        process.advance_with(Some((effect, outcomes)));
        debug_assert!(process.batch.is_empty(), "a children_ready ends its batch");
        Ok(())
    }
}
