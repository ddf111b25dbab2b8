//! Host commands by tree id: answers, signals, cancellations, resolutions
//! and replays. A tree this engine runs (or can take up) gets the command
//! through its local handle; a tree whose lease another live engine holds
//! gets it through its inbox in the store (see `inbox.rs`), with the same
//! result a local call gives.

use crate::ids::{EffectId, ProcessId, Scope, SignalId, TreeId, WaitId};
use crate::payload::Payload;
use crate::protocol::Settlement;

use super::actor::Command;
use super::inbox::Forwarded;
use super::{
    ControlError, Engine, ProcessHandle, SignalError, SignalReceipt, SignalRequest, TreeError,
};

impl Engine {
    /// Answers a wait anywhere in a tree, by the wait's id: the tree's
    /// writer finds the process that opened it. The answer's signal id is
    /// derived from the wait (`answer.<wait id>`), so sending the same answer
    /// again is a `Duplicate` (also after it completed the process or the
    /// whole tree) and another answer to the same wait is a `Conflict`.
    ///
    /// When another live engine holds the tree, the answer is posted to the
    /// tree's inbox and this call waits (up to
    /// [`EngineConfig::forward_timeout`](super::EngineConfig::forward_timeout))
    /// for that engine to apply it.
    pub async fn answer(
        &self,
        scope: &Scope,
        tree: TreeId,
        wait: WaitId,
        value: Payload,
    ) -> Result<SignalReceipt, SignalError> {
        let request = SignalRequest {
            id: SignalId::new(format!("answer.{wait}")).expect("a wait id makes a valid signal id"),
            wait: Some(wait),
            payload: value,
        };
        match self.process::<Payload>(scope, tree).await {
            Ok(handle) => handle.answer(request).await,
            Err(held @ TreeError::LeaseHeld { .. }) => {
                let command = Forwarded::Answer {
                    scope: scope.clone(),
                    wait,
                    id: request.id,
                    payload: request.payload,
                };
                let reply = self.inner.forward(tree, command, held).await;
                reply.map_err(SignalError::from_tree)?.into_signal(tree)
            }
            Err(error) => Err(SignalError::from_tree(error)),
        }
    }

    /// Delivers a host signal to a process of a tree (see
    /// [`ProcessHandle::signal`]); through the tree's inbox when another
    /// live engine holds it, as [`Engine::answer`] does.
    pub async fn signal(
        &self,
        scope: &Scope,
        tree: TreeId,
        process: ProcessId,
        request: SignalRequest,
    ) -> Result<SignalReceipt, SignalError> {
        match self.process::<Payload>(scope, tree).await {
            Ok(handle) => self.handle_of(&handle, process).signal(request).await,
            Err(held @ TreeError::LeaseHeld { .. }) => {
                let command = Forwarded::Signal {
                    scope: scope.clone(),
                    process,
                    id: request.id,
                    wait: request.wait,
                    payload: request.payload,
                };
                let reply = self.inner.forward(tree, command, held).await;
                reply.map_err(SignalError::from_tree)?.into_signal(tree)
            }
            Err(error) => Err(SignalError::from_tree(error)),
        }
    }

    /// Requests cancellation of a process of a tree (see
    /// [`ProcessHandle::cancel`]); through the tree's inbox when another
    /// live engine holds it, as [`Engine::answer`] does.
    pub async fn cancel(
        &self,
        scope: &Scope,
        tree: TreeId,
        process: ProcessId,
        reason: impl Into<String>,
    ) -> Result<(), ControlError> {
        let reason = reason.into();
        match self.process::<Payload>(scope, tree).await {
            Ok(handle) => self.handle_of(&handle, process).cancel(reason).await,
            Err(held @ TreeError::LeaseHeld { .. }) => {
                let command = Forwarded::Cancel {
                    scope: scope.clone(),
                    process,
                    reason,
                };
                self.inner
                    .forward(tree, command, held)
                    .await?
                    .into_control(tree)
            }
            Err(error) => Err(ControlError::Tree(error)),
        }
    }

    /// Settles an unknown effect anywhere in a tree with the host's
    /// settlement (never unknown); through the tree's inbox when another
    /// live engine holds it, as [`Engine::answer`] does.
    pub async fn resolve_unknown(
        &self,
        scope: &Scope,
        tree: TreeId,
        effect: EffectId,
        settlement: Settlement,
    ) -> Result<(), ControlError> {
        if settlement.is_unknown() {
            return Err(ControlError::Invalid(
                "a resolution must be succeeded or failed".into(),
            ));
        }
        match self.process::<Payload>(scope, tree).await {
            Ok(handle) => {
                handle
                    .control(|reply| Command::Resolve {
                        effect,
                        settlement,
                        reply,
                    })
                    .await
            }
            Err(held @ TreeError::LeaseHeld { .. }) => {
                let command = Forwarded::Resolve {
                    scope: scope.clone(),
                    effect,
                    settlement,
                };
                self.inner
                    .forward(tree, command, held)
                    .await?
                    .into_control(tree)
            }
            Err(error) => Err(ControlError::Tree(error)),
        }
    }

    /// Dispatches an unknown effect of a tree again under its identity (the
    /// host asserts it is safe); through the tree's inbox when another live
    /// engine holds it, as [`Engine::answer`] does.
    pub async fn replay_unknown(
        &self,
        scope: &Scope,
        tree: TreeId,
        effect: EffectId,
    ) -> Result<(), ControlError> {
        match self.process::<Payload>(scope, tree).await {
            Ok(handle) => {
                handle
                    .control(|reply| Command::Replay { effect, reply })
                    .await
            }
            Err(held @ TreeError::LeaseHeld { .. }) => {
                let command = Forwarded::Replay {
                    scope: scope.clone(),
                    effect,
                };
                self.inner
                    .forward(tree, command, held)
                    .await?
                    .into_control(tree)
            }
            Err(error) => Err(ControlError::Tree(error)),
        }
    }

    /// A handle on `process` in the tree of `root`.
    fn handle_of(
        &self,
        root: &ProcessHandle<Payload>,
        process: ProcessId,
    ) -> ProcessHandle<Payload> {
        ProcessHandle::new(self.inner.clone(), root.shared(), process)
    }
}
