//! The fold of a `child_started` record: the child joins the tree and its
//! parent's start effect settles with the child's id as its receipt.

use super::{ApplyError, Phase, ProcessState, ProgramId, TreeState, inconsistent};
use crate::log::RecordBody;
use crate::payload::Payload;
use crate::protocol::{Effect, ExecutionState, Settlement};

impl TreeState {
    /// Applies a `child_started` record. The child's input is the one its
    /// parent's start effect declared (the record repeats it only in logs
    /// written before it named it by the effect), and its initial state
    /// that input unless the record holds another.
    pub(super) fn child_started(&mut self, body: &RecordBody) -> Result<(), ApplyError> {
        let RecordBody::ChildStarted {
            parent,
            effect,
            child,
            key,
            name,
            program,
            input: recorded,
            budget,
            capabilities,
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
        let input = match &slot.effect {
            Effect::StartChild { input, .. } if slot.phase == Phase::Planned => input,
            _ => {
                return inconsistent(format!("effect {effect} is not a planned child start"));
            }
        };
        // Logs written before the record named its input by the
        // effect carry it: the declared one.
        if recorded.as_ref().is_some_and(|recorded| recorded != input) {
            return inconsistent(format!(
                "child {child}'s recorded input differs from its start effect's"
            ));
        }
        let input = input.clone();
        let state = state
            .clone()
            .unwrap_or_else(|| ExecutionState(input.clone()));
        let receipt = Payload::encode(child).map_err(|e| ApplyError(e.to_string()))?;
        slot.phase = Phase::Settled(Settlement::ok(receipt));
        parent.children.insert(key.clone(), *child);
        parent.live_children += 1;
        parent.debit(budget);
        let depth = parent.depth + 1;
        parent.advance();
        let program = ProgramId {
            name: name.clone(),
            digest: *program,
        };
        let mut process = ProcessState::new(program, &input, budget, capabilities, &state);
        process.parent = Some(parent_id);
        process.key = Some(key.clone());
        process.depth = depth;
        self.processes.insert(*child, Box::new(process));
        Ok(())
    }
}
