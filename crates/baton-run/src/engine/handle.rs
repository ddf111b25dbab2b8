//! [`ProcessHandle`]: what a host holds to signal, control, inspect and
//! await one process of a tree.

use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use tokio::sync::oneshot;

use crate::failure::Termination;
use crate::ids::{ChildKey, ProcessId, Scope, TreeId};
use crate::payload::Payload;

use super::actor::Command;
use super::error::{ControlError, OutputError, RuntimeError, SignalError, TreeError};
use super::shared::TreeShared;
use super::view::{TreeView, Visibility};
use super::{EngineInner, SignalReceipt, SignalRequest};

/// What a start returned: the root of a new tree, or of the tree the same
/// start made before. It dereferences to the [`ProcessHandle`].
pub enum Started<O = Payload> {
    /// The start made a new tree; its first record is durable.
    New(ProcessHandle<O>),
    /// The same start id was started before with the same program and input.
    Existing(ProcessHandle<O>),
}

impl<O> Started<O> {
    /// Whether this start made the tree.
    pub fn is_new(&self) -> bool {
        matches!(self, Started::New(_))
    }

    /// The root's handle.
    pub fn into_handle(self) -> ProcessHandle<O> {
        match self {
            Started::New(handle) | Started::Existing(handle) => handle,
        }
    }
}

impl<O> std::ops::Deref for Started<O> {
    type Target = ProcessHandle<O>;

    fn deref(&self) -> &ProcessHandle<O> {
        match self {
            Started::New(handle) | Started::Existing(handle) => handle,
        }
    }
}

impl<O> std::fmt::Debug for Started<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_new() { "New" } else { "Existing" };
        f.debug_tuple(kind).field(&**self).finish()
    }
}

/// What a host can wait for on a tree, with [`ProcessHandle::until`] or
/// [`super::Engine::until`]. Each holds once the root has terminated, since
/// nothing else can happen then.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Condition {
    /// A wait for an answer is open somewhere in the tree, or the tree is
    /// quiescent (no wait will open without outside input).
    WaitOpened,
    /// No live process is running: each waits for an answer or is parked
    /// with an unknown effect, so only a host can move the tree on.
    Quiescent,
    /// The root has terminated.
    Terminal,
}

/// A handle on a root process.
pub struct ProcessHandle<O = Payload> {
    engine: Arc<EngineInner>,
    shared: Arc<TreeShared>,
    process: ProcessId,
    types: PhantomData<fn() -> O>,
}

impl<O> Clone for ProcessHandle<O> {
    fn clone(&self) -> Self {
        ProcessHandle {
            engine: self.engine.clone(),
            shared: self.shared.clone(),
            process: self.process,
            types: PhantomData,
        }
    }
}

impl<O> std::fmt::Debug for ProcessHandle<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessHandle")
            .field("process", &self.process)
            .finish()
    }
}

impl<O> ProcessHandle<O> {
    pub(super) fn new(
        engine: Arc<EngineInner>,
        shared: Arc<TreeShared>,
        process: ProcessId,
    ) -> ProcessHandle<O> {
        ProcessHandle {
            engine,
            shared,
            process,
            types: PhantomData,
        }
    }

    /// What the tree's handles share.
    pub(super) fn shared(&self) -> Arc<TreeShared> {
        self.shared.clone()
    }

    /// The process id.
    pub fn id(&self) -> ProcessId {
        self.process
    }

    /// The tree it belongs to.
    pub fn tree(&self) -> TreeId {
        self.shared.tree
    }

    /// Its scope.
    pub fn scope(&self) -> &Scope {
        &self.shared.scope
    }

    fn closed(&self) -> RuntimeError {
        RuntimeError::Closed {
            tree: self.shared.tree,
        }
    }

    /// Waits for the termination.
    pub async fn await_result(&self) -> Result<Termination, RuntimeError> {
        let process = self.process;
        let result = self
            .shared
            .outcome
            .wait_for(|o| {
                (o.terminations.contains_key(&process) || o.stopped.is_some() || o.finished)
                    .then(|| (o.terminations.get(&process).cloned(), o.stopped.clone()))
            })
            .await;
        match result {
            Some((Some(termination), _)) => Ok(termination),
            Some((None, Some(error))) => Err(error),
            _ => Err(self.closed()),
        }
    }

    /// Waits until the tree's committed state meets `condition`, then
    /// returns its view; at once when it already does. A tree whose writer
    /// stopped reports why; no host needs to loop on [`ProcessHandle::inspect`].
    pub async fn until(&self, condition: Condition) -> Result<TreeView, ControlError> {
        let root = self.shared.tree;
        let result = self
            .shared
            .outcome
            .wait_for(|o| {
                let reached = o.finished
                    || o.terminations.contains_key(&root)
                    || match condition {
                        Condition::Terminal => false,
                        Condition::Quiescent => o.reached.quiescent,
                        Condition::WaitOpened => o.reached.quiescent || o.reached.wait_open,
                    };
                (reached || o.stopped.is_some()).then(|| o.stopped.clone())
            })
            .await;
        match result {
            Some(None) => self.inspect().await,
            Some(Some(error)) => Err(ControlError::Stopped(error)),
            None => Err(ControlError::Stopped(self.closed())),
        }
    }

    /// Waits until this process and its whole subtree have terminated (for
    /// the root: until the tree's task has released the tree).
    pub async fn join(&self) -> Result<Termination, RuntimeError> {
        let termination = self.await_result().await?;
        let (process, root) = (self.process, self.process == self.shared.tree);
        let joined =
            self.shared
                .outcome
                .wait_for(|o| {
                    (o.finished || (!root && o.drained.contains(&process)) || o.stopped.is_some())
                        .then(|| {
                            (
                                o.finished || o.drained.contains(&process),
                                o.stopped.clone(),
                            )
                        })
                })
                .await;
        match joined {
            Some((true, _)) => Ok(termination),
            Some((false, Some(error))) => Err(error),
            _ => Err(self.closed()),
        }
    }

    /// A handle on this process's child under `key` (which may not exist yet).
    pub fn child<O2>(&self, key: &ChildKey) -> ProcessHandle<O2> {
        ProcessHandle::new(
            self.engine.clone(),
            self.shared.clone(),
            ProcessId::child(self.process, key),
        )
    }

    /// Waits for completion and decodes the output.
    pub async fn output(&self) -> Result<O, OutputError>
    where
        O: DeserializeOwned,
    {
        let termination = self.await_result().await?;
        match termination.output() {
            Some(output) => Ok(output.decode()?),
            None => Err(OutputError::NotCompleted(termination)),
        }
    }

    async fn request<T, E: From<RuntimeError>>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, E>>) -> Command,
        terminated: impl FnOnce() -> E,
    ) -> Result<T, E> {
        let (reply, answer) = oneshot::channel();
        let sent = self
            .engine
            .send(&self.shared, Box::new(make(reply)))
            .is_ok();
        if sent && let Ok(result) = answer.await {
            return result;
        }
        // No owner task took the command (or it ended before answering):
        // say why from what the tree published.
        let outcome = self.shared.outcome.read();
        Err(match &outcome.stopped {
            Some(error) => error.clone().into(),
            None if outcome.finished || outcome.terminations.contains_key(&self.process) => {
                terminated()
            }
            None => self.closed().into(),
        })
    }

    pub(super) async fn control(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<(), ControlError>>) -> Command,
    ) -> Result<(), ControlError> {
        let process = self.process;
        self.request(make, || ControlError::Terminated { process })
            .await
    }

    /// Delivers a host signal. It is acknowledged only after its record
    /// commits; the same id with the same content is an idempotent no-op.
    ///
    /// A resend of an admitted signal (same id, same content) is a
    /// `Duplicate` even after the process or its whole tree has ended.
    pub async fn signal(&self, request: SignalRequest) -> Result<SignalReceipt, SignalError> {
        let process = self.process;
        let sent = request.clone();
        let result = self
            .request(
                |reply| Command::Signal {
                    process,
                    request: sent,
                    reply,
                },
                || SignalError::Terminated { process },
            )
            .await;
        match result {
            // No writer took the signal: the tree has ended. Its receipts are
            // in the store.
            Err(SignalError::Terminated { .. }) => {
                self.engine
                    .stored_receipt(self.shared.tree, Some(process), request)
                    .await
            }
            other => other,
        }
    }

    /// Answers a wait anywhere in this process's tree, routed by the wait
    /// id inside the tree's writer (see [`Engine::answer`]).
    ///
    /// [`Engine::answer`]: super::Engine::answer
    pub(super) async fn answer(
        &self,
        request: SignalRequest,
    ) -> Result<SignalReceipt, SignalError> {
        let tree = self.shared.tree;
        let sent = request.clone();
        let result = self
            .request(
                |reply| Command::Answer {
                    request: sent,
                    reply,
                },
                || SignalError::Terminated { process: tree },
            )
            .await;
        match result {
            Err(SignalError::Terminated { .. }) => {
                self.engine.stored_receipt(tree, None, request).await
            }
            other => other,
        }
    }

    /// Requests cancellation (intent is durable when this returns; the
    /// process ends `Canceled` once in-flight work settles).
    pub async fn cancel(&self, reason: impl Into<String>) -> Result<(), ControlError> {
        let process = self.process;
        let reason = reason.into();
        self.control(|reply| Command::Cancel {
            process,
            reason,
            reply,
        })
        .await
    }

    /// Kills the process at once; in-flight effects are left unresolved.
    pub async fn kill(&self) -> Result<(), ControlError> {
        let process = self.process;
        self.control(|reply| Command::Kill { process, reply }).await
    }

    /// The committed state as a view.
    pub async fn inspect(&self) -> Result<TreeView, ControlError> {
        let process = self.process;
        let view = self
            .request(
                |reply| Command::Inspect { reply },
                || ControlError::Terminated { process },
            )
            .await;
        match view {
            Err(ControlError::Terminated { .. }) => {
                let load = self
                    .engine
                    .store
                    .load(self.shared.tree)
                    .await
                    .map_err(TreeError::from)?;
                let (state, seq, head) = self.engine.checked_fold(self.shared.tree, &load, None)?;
                let mut view = TreeView::of(&state, seq, head, Visibility::Public);
                self.shared.progress.overlay(&mut view);
                Ok(view)
            }
            other => other,
        }
    }
}
