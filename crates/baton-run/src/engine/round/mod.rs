//! The decisions of a round, as plain functions over a tree's committed
//! state.
//!
//! Each function reads the fold ([`TreeState`]) and the programs of the
//! processes involved and returns the records to stage, with whatever else
//! the owner task must keep (a started child's execution, a stepped
//! process's restored instance). None of them stages, commits, sends or
//! awaits anything: the owner task (`actor.rs`) stages what they return, in
//! order, applying each record to the fold at once, and acts only after the
//! commit. So each decision runs, and is tested, without tokio.
//!
//! User code (a definition's `start`, `step`, `snapshot` and `restore`, a
//! dispatcher's `replay_policy` and `required_capabilities`) is called here
//! behind `catch_unwind`: a panic becomes a classified failure.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use crate::budget::{Dimension, Meters};
use crate::clock::Timestamp;
use crate::digest::{Digest, Purpose};
use crate::failure::{Cause, Failure, Termination};
use crate::ids::{ChildKey, EffectId, ProcessId};
use crate::log::RecordBody;
use crate::payload::Payload;
use crate::protocol::{
    Boundary, Certainty, ChildSignal, Condition, Effect, Program, ReplayPolicy, RetryPolicy,
    Settlement, Signal, SignalBody,
};

use super::error::{ControlError, SignalError};
use super::state::{Phase, ProcessState, TreeState, ending_failure, signal_digest};

mod children;
mod step;
#[cfg(test)]
pub(super) mod tests;

#[cfg(test)]
use children::grant_refusal;
pub(super) use children::{
    ChildStart, ChildrenWait, WaitSettled, control_child, start_child, wait_children,
};
pub(super) use step::{InitError, initialize, panic_failure, step};

/// What a process can do next, decided from its committed state.
pub(super) enum Next {
    /// Nothing now: it waits, or everything at its frontier is in flight.
    Idle,
    /// Its parent ended: record its cancellation.
    Orphaned,
    /// Canceled with dispatches in flight: ask them to stop, then wait.
    Draining,
    /// Canceled with nothing in flight: it ends.
    End { cause: Cause, reason: String },
    /// A planned dispatch, or one whose backoff has passed: reserve its
    /// meters and send it (attempt `attempt`).
    Dispatch {
        effect: EffectId,
        request: Payload,
        reserve: Meters,
        attempt: u32,
    },
    /// A dispatch pending with nothing in flight (after a recovery or a
    /// replay): send it again only if that is safe.
    Redispatch {
        effect: EffectId,
        request: Payload,
        reserve: Meters,
        attempt: u32,
    },
    /// A planned child start.
    StartChild { effect: EffectId, start: ChildStart },
    /// A planned signal (`Ok`) or cancellation (`Err(reason)`) of a child.
    Control {
        effect: EffectId,
        key: ChildKey,
        control: Result<ChildSignal, String>,
    },
    /// A planned children wait.
    WaitChildren {
        effect: EffectId,
        keys: Vec<ChildKey>,
        boundary: Boundary,
        condition: Condition,
    },
    /// A runnable process with nothing at its frontier: step it.
    Step,
}

/// What the owner task knows of dispatches in flight.
pub(super) trait Flights {
    /// Whether `effect` is in flight.
    fn carries(&self, effect: EffectId) -> bool;
    /// Whether any dispatch of `process` is in flight.
    fn any_of(&self, process: ProcessId) -> bool;
}

/// How a round treats a process.
#[derive(Clone, Copy)]
pub(super) struct Pass {
    /// Hold children waits back (something else in the tree can progress).
    pub hold_waits: bool,
    /// Whether the commit has room for another step.
    pub may_step: bool,
    /// The engine clock's time, for backoffs.
    pub now: Timestamp,
}

/// What process `id` can do next.
pub(super) fn next(tree: &TreeState, id: ProcessId, flights: &impl Flights, pass: Pass) -> Next {
    let process = &tree.processes[&id];
    if process.termination.is_some() {
        return Next::Idle;
    }
    // A process whose parent has ended is canceled (completion cancels
    // remaining children; the parent's subtree drains after it).
    if process.cancel.is_none()
        && let Some(parent) = process.parent
        && tree.processes[&parent].termination.is_some()
    {
        return Next::Orphaned;
    }
    if let Some(intent) = &process.cancel {
        if flights.any_of(id) {
            return Next::Draining;
        }
        return Next::End {
            cause: intent.cause,
            reason: intent.reason.clone(),
        };
    }
    let Some(slot) = process.frontier() else {
        return if process.runnable() && pass.may_step {
            Next::Step
        } else {
            Next::Idle
        };
    };
    let effect = slot.id;
    let attempt = slot.failed_attempts.saturating_add(1);
    match (&slot.effect, &slot.phase) {
        (
            Effect::Dispatch {
                request, reserve, ..
            },
            Phase::Planned,
        ) => Next::Dispatch {
            effect,
            request: request.clone(),
            reserve: reserve.clone(),
            attempt,
        },
        (
            Effect::Dispatch {
                request, reserve, ..
            },
            Phase::Backoff { at },
        ) if pass.now >= *at => Next::Dispatch {
            effect,
            request: request.clone(),
            reserve: reserve.clone(),
            attempt,
        },
        (
            Effect::Dispatch {
                request, reserve, ..
            },
            Phase::Pending,
        ) if !flights.carries(effect) => Next::Redispatch {
            effect,
            request: request.clone(),
            reserve: reserve.clone(),
            attempt,
        },
        (
            Effect::StartChild {
                key,
                program,
                input,
                budget,
                capabilities,
                grant,
            },
            Phase::Planned,
        ) => Next::StartChild {
            effect,
            start: ChildStart {
                key: key.clone(),
                program: *program,
                input: input.clone(),
                budget: budget.clone(),
                capabilities: capabilities.clone(),
                grant: *grant,
            },
        },
        (Effect::SignalChild { key, signal }, Phase::Planned) => Next::Control {
            effect,
            key: key.clone(),
            control: Ok(signal.clone()),
        },
        (Effect::CancelChild { key, reason }, Phase::Planned) => Next::Control {
            effect,
            key: key.clone(),
            control: Err(reason.clone()),
        },
        (
            Effect::WaitChildren {
                keys,
                boundary,
                condition,
            },
            Phase::Planned,
        ) if !pass.hold_waits => Next::WaitChildren {
            effect,
            keys: keys.clone(),
            boundary: *boundary,
            condition: *condition,
        },
        _ => Next::Idle,
    }
}

/// The record that fails a process with `failure`.
pub(super) fn fail(process: &ProcessState, id: ProcessId, failure: Failure) -> RecordBody {
    let termination = Termination::failed(failure).with_unresolved(process.unresolved());
    RecordBody::Terminated {
        process: id,
        termination,
    }
}

/// The record that ends a process for `cause` (a kill, a deadline, a
/// cancellation).
pub(super) fn end(process: &ProcessState, id: ProcessId, cause: Cause, reason: &str) -> RecordBody {
    let termination = Termination::ended(cause, ending_failure(cause, reason))
        .with_unresolved(process.unresolved());
    RecordBody::Terminated {
        process: id,
        termination,
    }
}

/// The record that settles `effect` of `process` with a failure.
pub(super) fn refuse(process: ProcessId, effect: EffectId, failure: Failure) -> RecordBody {
    RecordBody::EffectSettled {
        process,
        effect,
        settlement: Settlement::failed(failure),
    }
}

/// The record that settles `effect` of `process` as succeeded.
pub(super) fn settle_ok(process: ProcessId, effect: EffectId, value: Payload) -> RecordBody {
    RecordBody::EffectSettled {
        process,
        effect,
        settlement: Settlement::ok(value),
    }
}

/// The live process `process`, or the error a control gets for it.
pub(super) fn live(tree: &TreeState, process: ProcessId) -> Result<&ProcessState, ControlError> {
    match tree.processes.get(&process) {
        Some(p) if p.termination.is_none() => Ok(p),
        _ => Err(ControlError::Terminated { process }),
    }
}

/// The record of a host's cancellation of a live process, `None` when its
/// cancellation is already recorded.
pub(super) fn cancel(
    tree: &TreeState,
    process: ProcessId,
    reason: String,
) -> Result<Option<RecordBody>, ControlError> {
    let state = live(tree, process)?;
    Ok(state
        .cancel
        .is_none()
        .then_some(RecordBody::CancelRequested {
            process,
            cause: Cause::HostCancellation,
            reason,
        }))
}

/// The records that kill a process and every live descendant at once,
/// parents before children.
pub(super) fn kill(tree: &TreeState, process: ProcessId, into: &mut Vec<RecordBody>) {
    let state = &tree.processes[&process];
    if state.termination.is_none() {
        into.push(end(state, process, Cause::Kill, "killed by the host"));
    }
    for child in state.children.values() {
        kill(tree, *child, into);
    }
}

/// The live process holding `effect` as an unknown effect.
pub(super) fn unknown(tree: &TreeState, effect: EffectId) -> Result<ProcessId, ControlError> {
    tree.processes
        .iter()
        .filter(|(_, p)| p.termination.is_none())
        .find(|(_, p)| {
            p.batch.iter().any(|slot| {
                slot.id == effect && matches!(&slot.phase, Phase::Settled(s) if s.is_unknown())
            })
        })
        .map(|(id, _)| *id)
        .ok_or(ControlError::NotUnknown {
            tree: tree.root,
            effect,
        })
}

/// The records that end every live process once the tree's deadline has
/// passed (the root `host_deadline`, the others `parent_deadline`).
pub(super) fn deadline(tree: &TreeState, now: Timestamp) -> Vec<RecordBody> {
    let Some(deadline) = tree.deadline.filter(|_| tree.root_termination().is_none()) else {
        return Vec::new();
    };
    if now < deadline {
        return Vec::new();
    }
    tree.live_ids()
        .into_iter()
        .map(|id| {
            let cause = if id == tree.root {
                Cause::HostDeadline
            } else {
                Cause::ParentDeadline
            };
            end(&tree.processes[&id], id, cause, "deadline passed")
        })
        .collect()
}

/// The records that close a tree whose log outgrew its history limit:
/// every live process fails, so later writes stay possible and small.
pub(super) fn history(tree: &TreeState) -> Vec<RecordBody> {
    if tree.history_bytes <= tree.limits.max_history_bytes {
        return Vec::new();
    }
    tree.live_ids()
        .into_iter()
        .map(|id| {
            let failure = Failure::execution(
                "engine.limit.history",
                format!(
                    "the tree's log reached {} bytes, over its limit of {}; the tree is closed",
                    tree.history_bytes, tree.limits.max_history_bytes
                ),
            );
            fail(&tree.processes[&id], id, failure)
        })
        .collect()
}

/// Checks a signal for a process before anything is written: `Ok(true)`
/// to admit, `Ok(false)` for an identical signal admitted before.
///
/// The receipt is checked before the process's liveness: a signal resent
/// after its acknowledgement was lost is a duplicate even when the signal
/// itself ended the process (an answer that completed a gate), and the same
/// id with other content is still refused.
pub(super) fn check_signal(
    tree: &TreeState,
    programs: &BTreeMap<ProcessId, Program>,
    process: ProcessId,
    signal: &Signal,
) -> Result<bool, SignalError> {
    let Some(p) = tree.processes.get(&process) else {
        return Err(SignalError::Terminated { process });
    };
    if signal.id.is_engine() {
        return Err(SignalError::Rejected(Failure::contract(
            "engine.signal.reserved",
            format!(
                "signal id {} uses the prefix {}, which is reserved for the engine's own signals",
                signal.id,
                crate::ids::SignalId::ENGINE_PREFIX
            ),
        )));
    }
    if let Some(digest) = p.receipts.get(&signal.id) {
        return if *digest == signal_digest(signal) {
            Ok(false)
        } else {
            Err(SignalError::Conflict {
                id: signal.id.clone(),
            })
        };
    }
    if p.termination.is_some() {
        return Err(SignalError::Terminated { process });
    }
    let SignalBody::Input { payload } = &signal.body else {
        return Err(SignalError::Rejected(Failure::contract(
            "engine.signal.rejected",
            "only input signals can be delivered",
        )));
    };
    match signal.wait {
        Some(wait) => match p.waits.get(&wait) {
            Some(open) => open.answer_schema.validate(payload).map_err(|violation| {
                SignalError::Rejected(Failure::contract(
                    "engine.signal.answer.invalid",
                    format!("answer to {wait} rejected: {violation}"),
                ))
            })?,
            None if p.answered.contains(&wait) => return Err(SignalError::WaitClosed { wait }),
            None => return Err(SignalError::UnknownWait { process, wait }),
        },
        None => {
            programs[&process]
                .descriptor()
                .check_signal(payload)
                .map_err(SignalError::Rejected)?;
        }
    }
    if !p.allows(&Dimension::Signals, 1) {
        return Err(SignalError::BudgetExhausted { process });
    }
    if p.mailbox.len() as u64 >= tree.limits.max_pending_signals {
        return Err(SignalError::MailboxFull {
            process,
            limit: tree.limits.max_pending_signals,
        });
    }
    Ok(true)
}

/// The process that opened `wait`, whether it is open or answered.
pub(super) fn waiter(tree: &TreeState, wait: crate::ids::WaitId) -> Option<ProcessId> {
    tree.processes
        .iter()
        .find(|(_, p)| p.waits.contains_key(&wait) || p.answered.contains(&wait))
        .map(|(id, _)| *id)
}

/// Why an answer found no process that opened its wait.
pub(super) fn no_waiter(tree: &TreeState, request: &super::SignalRequest) -> SignalError {
    match request.wait {
        Some(wait) => SignalError::UnknownWait {
            process: tree.root,
            wait,
        },
        None => SignalError::Rejected(Failure::contract(
            "engine.signal.rejected",
            "an answer names the wait it answers",
        )),
    }
}

/// The receipt of a signal admitted before (a duplicate, or the same id
/// with other content), or a refusal of an engine-reserved id, judged from
/// committed state alone; `None` when the signal was never admitted. For a
/// tree no writer runs any more (finished, or taken up elsewhere).
pub(super) fn receipt(
    tree: &TreeState,
    process: ProcessId,
    signal: &Signal,
) -> Option<Result<bool, SignalError>> {
    let p = tree.processes.get(&process)?;
    if signal.id.is_engine() || p.receipts.contains_key(&signal.id) {
        return Some(check_signal(tree, &BTreeMap::new(), process, signal));
    }
    None
}

/// Whether a dispatch's meter reservation fits its process's budget; the
/// failure its effect settles with when it does not.
pub(super) fn reserve(process: &ProcessState, reserve: &Meters) -> Result<(), Failure> {
    for (meter, amount) in reserve {
        let dimension = Dimension::Meter(meter.clone());
        if !process.allows(&dimension, *amount) {
            return Err(Failure::execution(
                "engine.limit.meter",
                format!(
                    "reserving {amount} {meter} exceeds the remaining budget ({} spent of {})",
                    process.spent(&dimension),
                    process.budget.meter(meter)
                ),
            ));
        }
    }
    Ok(())
}

/// A program's dispatcher's replay policy for `request` (a panicking
/// `replay_policy`, or no dispatcher, counts as `Never`).
fn replay_policy(program: &Program, request: &Payload) -> ReplayPolicy {
    program
        .dispatcher()
        .map(|dispatcher| {
            catch_unwind(AssertUnwindSafe(|| dispatcher.replay_policy(request)))
                .unwrap_or(ReplayPolicy::Never)
        })
        .unwrap_or(ReplayPolicy::Never)
}

/// Whether a dispatch found pending with nothing in flight may be sent
/// again: the host asked for it, or its dispatcher replays under the same
/// identity.
pub(super) fn may_redispatch(program: &Program, request: &Payload, host_allowed: bool) -> bool {
    host_allowed || replay_policy(program, request) == ReplayPolicy::SameIdentity
}

/// The record a dispatcher's answer to an attempt stages: its settlement,
/// or, when the effect's retry policy tries the attempt again, the failed
/// attempt and the end of its backoff. An uncertain failure under a retry
/// policy of a `Never` dispatcher settles unknown: the attempt may have had
/// its effect, so neither a retry nor a failure would be true.
pub(super) fn settle(
    tree: &TreeState,
    program: &Program,
    process: ProcessId,
    effect: EffectId,
    settlement: Settlement,
    now: Timestamp,
) -> RecordBody {
    let settled = |settlement| RecordBody::EffectSettled {
        process,
        effect,
        settlement,
    };
    let slot = tree.processes[&process]
        .batch
        .iter()
        .find(|slot| slot.id == effect);
    let Some((request, policy, failed)) = slot.and_then(|slot| match &slot.effect {
        Effect::Dispatch { request, retry, .. } if !retry.is_none() => {
            Some((request, retry, slot.failed_attempts))
        }
        _ => None,
    }) else {
        return settled(settlement);
    };
    let Settlement::Failed {
        failure,
        usage,
        retry: Some(hint),
    } = &settlement
    else {
        return settled(settlement);
    };
    let attempts_left = failed.saturating_add(1) < policy.attempts;
    let replays = replay_policy(program, request) == ReplayPolicy::SameIdentity;
    let retry = match hint.certainty {
        Certainty::Definite => attempts_left,
        Certainty::Uncertain if !replays && attempts_left => {
            return settled(Settlement::Unknown {
                diagnostic: format!(
                    "attempt {} failed and may have had its effect ({failure}); its dispatcher's replay policy forbids sending it again",
                    failed.saturating_add(1)
                ),
            });
        }
        Certainty::Uncertain => attempts_left,
    };
    if !retry {
        return settled(settlement);
    }
    let delay = backoff(policy, effect, failed.saturating_add(1), hint.after);
    RecordBody::EffectRetrying {
        process,
        effect,
        failure: failure.clone(),
        usage: usage.clone(),
        at: now.plus(delay),
    }
}

/// The backoff after failed attempt `attempt` (1 for the first): the
/// policy's delay doubled per attempt up to its maximum, shortened by up to
/// half by a jitter derived from the effect id and the attempt (the same in
/// every engine and after every recovery), and never shorter than what the
/// other side asked for.
pub(super) fn backoff(
    policy: &RetryPolicy,
    effect: EffectId,
    attempt: u32,
    asked: Option<Duration>,
) -> Duration {
    let doubled = policy.initial_delay_ms.saturating_mul(
        1u64.checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u64::MAX),
    );
    let base = doubled.min(policy.max_delay_ms);
    let digest = Digest::of_parts(
        Purpose::Identity,
        &[
            b"backoff",
            effect.to_string().as_bytes(),
            &attempt.to_le_bytes(),
        ],
    );
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_bytes()[..8]);
    // A fraction in [0, 1) of half the base, taken off it.
    let cut = ((u128::from(base / 2) * u128::from(u64::from_le_bytes(first))) >> 64) as u64;
    let delay = Duration::from_millis(base - cut);
    match asked {
        Some(asked) if asked > delay => asked,
        _ => delay,
    }
}

/// The settlement of a dispatch that may not be sent again.
pub(super) fn unknown_settlement() -> Settlement {
    Settlement::Unknown {
        diagnostic: "the dispatch was pending when its writer stopped; its outcome is unknown and its replay policy forbids sending it again".into(),
    }
}
