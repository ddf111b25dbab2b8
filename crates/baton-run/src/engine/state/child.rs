//! The fold of a `child_started` record: the child joins the tree and its
//! parent's start effect settles with the child's id as its receipt.

use super::{ApplyError, Phase, ProcessState, ProgramId, TreeState, inconsistent};
use crate::log::RecordBody;
use crate::payload::Payload;
use crate::protocol::{Effect, ExecutionState, Settlement};

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
        let receipt = Payload::encode(child).map_err(|e| ApplyError(e.to_string()))?;
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
}
