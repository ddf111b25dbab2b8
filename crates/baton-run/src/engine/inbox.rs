//! Commands across engines: a command for a tree that another live engine
//! holds is posted to the tree's inbox in the store, and the holder applies
//! it and settles it with the outcome.
//!
//! The poster ([`EngineInner::forward`]) subscribes to the store's change
//! notices, posts, and awaits the outcome, re-reading on a notice for the
//! tree and on a bounded timer, until
//! [`EngineConfig::forward_timeout`](super::EngineConfig::forward_timeout).
//! The holder runs one inbox task per engine, started when the engine
//! first holds a tree: on a notice of a message for a tree it holds (or a
//! notice that notices were missed) it drains that inbox through its local
//! handles and settles each message, fenced by its lease token; it also
//! drains a tree's inbox right after taking the tree up, for messages
//! posted while the tree changed hands.

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::clock::Timestamp;
use crate::failure::Failure;
use crate::ids::{EffectId, ProcessId, Scope, SignalId, TreeId, WaitId};
use crate::payload::Payload;
use crate::protocol::Settlement;
use crate::storage::{Change, Changes, Message, MessageId, PostOutcome, Settle, SettleOutcome};

use super::actor::Command;
use super::{
    ControlError, EngineInner, ProcessHandle, SignalError, SignalReceipt, SignalRequest, TreeError,
};

/// How often a poster re-reads its message's outcome (and checks whether
/// the holder is still there) between notices.
const POSTER_REREAD: Duration = Duration::from_secs(1);

/// How often the inbox task re-reads the inboxes of the trees its engine
/// holds when the store sends no notices.
const HOLDER_REREAD: Duration = Duration::from_secs(1);

/// A command as posted to a tree's inbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum Forwarded {
    /// [`Engine::answer`](super::Engine::answer).
    Answer {
        scope: Scope,
        wait: WaitId,
        id: SignalId,
        payload: Payload,
    },
    /// A signal to one process of the tree.
    Signal {
        scope: Scope,
        process: ProcessId,
        id: SignalId,
        wait: Option<WaitId>,
        payload: Payload,
    },
    /// A cancellation of one process of the tree.
    Cancel {
        scope: Scope,
        process: ProcessId,
        reason: String,
    },
    /// [`Engine::resolve_unknown`](super::Engine::resolve_unknown).
    Resolve {
        scope: Scope,
        effect: EffectId,
        settlement: Settlement,
    },
    /// [`Engine::replay_unknown`](super::Engine::replay_unknown).
    Replay { scope: Scope, effect: EffectId },
}

impl Forwarded {
    fn scope(&self) -> &Scope {
        match self {
            Forwarded::Answer { scope, .. }
            | Forwarded::Signal { scope, .. }
            | Forwarded::Cancel { scope, .. }
            | Forwarded::Resolve { scope, .. }
            | Forwarded::Replay { scope, .. } => scope,
        }
    }
}

/// What applying a forwarded command gave, as settled in the inbox: the
/// outcome of the local call, its errors by variant.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum Reply {
    Admitted,
    Duplicate,
    Done,
    Terminated { process: ProcessId },
    UnknownWait { process: ProcessId, wait: WaitId },
    WaitClosed { wait: WaitId },
    Rejected { failure: Failure },
    Conflict { id: SignalId },
    BudgetExhausted { process: ProcessId },
    MailboxFull { process: ProcessId, limit: u64 },
    ControlTerminated { process: ProcessId },
    NotUnknown { effect: EffectId },
    Invalid { message: String },
    NotFound,
    Scope { scope: Scope },
    Failed { code: String, message: String },
}

impl Reply {
    fn of_tree(error: &TreeError) -> Reply {
        match error {
            TreeError::NotFound { .. } => Reply::NotFound,
            TreeError::Scope { scope, .. } => Reply::Scope {
                scope: scope.clone(),
            },
            other => Reply::Failed {
                code: other.code().to_owned(),
                message: other.to_string(),
            },
        }
    }

    fn of_signal(result: Result<SignalReceipt, SignalError>) -> Reply {
        match result {
            Ok(SignalReceipt::Admitted) => Reply::Admitted,
            Ok(SignalReceipt::Duplicate) => Reply::Duplicate,
            Err(SignalError::Terminated { process }) => Reply::Terminated { process },
            Err(SignalError::UnknownWait { process, wait }) => Reply::UnknownWait { process, wait },
            Err(SignalError::WaitClosed { wait }) => Reply::WaitClosed { wait },
            Err(SignalError::Rejected(failure)) => Reply::Rejected { failure },
            Err(SignalError::Conflict { id }) => Reply::Conflict { id },
            Err(SignalError::BudgetExhausted { process }) => Reply::BudgetExhausted { process },
            Err(SignalError::MailboxFull { process, limit }) => {
                Reply::MailboxFull { process, limit }
            }
            Err(SignalError::Tree(error)) => Reply::of_tree(&error),
            Err(other) => Reply::Failed {
                code: other.code().to_owned(),
                message: other.to_string(),
            },
        }
    }

    fn of_control(result: Result<(), ControlError>) -> Reply {
        match result {
            Ok(()) => Reply::Done,
            Err(ControlError::Terminated { process }) => Reply::ControlTerminated { process },
            Err(ControlError::NotUnknown { effect, .. }) => Reply::NotUnknown { effect },
            Err(ControlError::Invalid(message)) => Reply::Invalid { message },
            Err(ControlError::Tree(error)) => Reply::of_tree(&error),
            Err(other) => Reply::Failed {
                code: other.code().to_owned(),
                message: other.to_string(),
            },
        }
    }

    /// A reply that is not a tree-level refusal, as a tree error.
    fn tree_error(self, tree: TreeId) -> TreeError {
        match self {
            Reply::NotFound => TreeError::NotFound { tree },
            Reply::Scope { scope } => TreeError::Scope { tree, scope },
            Reply::Failed { code, message } => TreeError::ForwardFailed {
                tree,
                code,
                message,
            },
            other => TreeError::ForwardFailed {
                tree,
                code: "engine.forward.mismatch".into(),
                message: format!("the holder's reply {other:?} does not answer this command"),
            },
        }
    }

    /// The reply as the result of a signal or an answer.
    pub(super) fn into_signal(self, tree: TreeId) -> Result<SignalReceipt, SignalError> {
        match self {
            Reply::Admitted => Ok(SignalReceipt::Admitted),
            Reply::Duplicate => Ok(SignalReceipt::Duplicate),
            Reply::Terminated { process } => Err(SignalError::Terminated { process }),
            Reply::UnknownWait { process, wait } => Err(SignalError::UnknownWait { process, wait }),
            Reply::WaitClosed { wait } => Err(SignalError::WaitClosed { wait }),
            Reply::Rejected { failure } => Err(SignalError::Rejected(failure)),
            Reply::Conflict { id } => Err(SignalError::Conflict { id }),
            Reply::BudgetExhausted { process } => Err(SignalError::BudgetExhausted { process }),
            Reply::MailboxFull { process, limit } => {
                Err(SignalError::MailboxFull { process, limit })
            }
            other => Err(SignalError::Tree(other.tree_error(tree))),
        }
    }

    /// The reply as the result of a control.
    pub(super) fn into_control(self, tree: TreeId) -> Result<(), ControlError> {
        match self {
            Reply::Done => Ok(()),
            Reply::ControlTerminated { process } => Err(ControlError::Terminated { process }),
            Reply::NotUnknown { effect } => Err(ControlError::NotUnknown { tree, effect }),
            Reply::Invalid { message } => Err(ControlError::Invalid(message)),
            other => Err(ControlError::Tree(other.tree_error(tree))),
        }
    }
}

/// Why the poster stopped waiting.
enum Wait {
    /// The holder settled the message.
    Settled(Reply),
    /// The tree is no longer held by another live engine: this engine took
    /// it up (or it finished), and applied the command itself.
    Applied(Reply),
}

impl EngineInner {
    /// Posts `command` to the inbox of `tree`, which `held` says another
    /// live engine holds, and awaits its outcome.
    pub(super) async fn forward(
        self: &Arc<Self>,
        tree: TreeId,
        command: Forwarded,
        held: TreeError,
    ) -> Result<Reply, TreeError> {
        let TreeError::LeaseHeld { owner, .. } = &held else {
            return Err(held);
        };
        let owner = owner.clone();
        let corrupt = |message: String| TreeError::Corrupt {
            tree,
            record: None,
            message,
        };
        let body = Payload::encode(&command).map_err(|error| TreeError::ForwardFailed {
            tree,
            code: match error {
                crate::payload::PayloadError::TooLarge { .. } => "engine.forward.too_large",
                _ => "engine.forward.invalid",
            }
            .to_owned(),
            message: format!("the command does not fit in a message: {error}"),
        })?;
        let id = MessageId::new(format!("fwd.{}", body.digest().to_hex()))
            .map_err(|error| corrupt(error.to_string()))?;
        // Subscribed before posting, so the settlement's notice is not missed.
        let mut changes = self.store.changes().await.ok().flatten();
        let message = Message {
            tree,
            id: id.clone(),
            body,
            posted: self.clock.now(),
        };
        match self.store.post(message.clone()).await? {
            PostOutcome::Posted | PostOutcome::Duplicate => {}
            PostOutcome::UnknownTree => return Err(TreeError::NotFound { tree }),
            PostOutcome::Unsupported => return Err(held),
            PostOutcome::Conflict => {
                return Err(corrupt(format!(
                    "inbox message {id} holds another command than its id names"
                )));
            }
        }
        tracing::debug!(%tree, %owner, %id, "posted a command for the tree's holder");
        let deadline = self.clock.now().plus(self.forward_timeout);
        match self
            .await_outcome(&message, &command, &mut changes, deadline)
            .await?
        {
            Some(Wait::Settled(reply) | Wait::Applied(reply)) => Ok(reply),
            None => Err(TreeError::ForwardTimeout {
                tree,
                owner,
                waited: self.forward_timeout,
            }),
        }
    }

    /// Re-reads the message's outcome on each notice for its tree and on a
    /// timer until `deadline`; on the timer, also takes the tree up if its
    /// holder is gone. `None` at the deadline.
    async fn await_outcome(
        self: &Arc<Self>,
        message: &Message,
        command: &Forwarded,
        changes: &mut Option<Changes>,
        deadline: Timestamp,
    ) -> Result<Option<Wait>, TreeError> {
        let tree = message.tree;
        loop {
            if let Some(posted) = self.store.message(tree, message.id.clone()).await?
                && let Some(outcome) = posted.outcome
            {
                let reply = outcome
                    .decode::<Reply>()
                    .map_err(|error| TreeError::Corrupt {
                        tree,
                        record: None,
                        message: format!(
                            "inbox message {} has an unreadable outcome: {error}",
                            message.id
                        ),
                    })?;
                return Ok(Some(Wait::Settled(reply)));
            }
            let now = self.clock.now();
            if now >= deadline {
                return Ok(None);
            }
            let reread = now.plus(POSTER_REREAD).min(deadline);
            let noticed = tokio::select! {
                noticed = notice_for(changes, Some(tree)) => noticed,
                () = self.clock.sleep_until(reread) => false,
            };
            if !noticed && let Some(reply) = self.apply_if_free(message, command).await {
                return Ok(Some(Wait::Applied(reply)));
            }
        }
    }

    /// Applies the command here when the tree is no longer held by another
    /// live engine (its holder is gone, or the tree finished); `None` while
    /// it is. When this engine now holds the tree, the message is settled
    /// as the holder would.
    async fn apply_if_free(
        self: &Arc<Self>,
        message: &Message,
        command: &Forwarded,
    ) -> Option<Reply> {
        match self
            .attach(message.tree, Some(command.scope()), false)
            .await
        {
            Err(TreeError::LeaseHeld { .. }) => None,
            Err(error) => Some(Reply::of_tree(&error)),
            Ok(_) => {
                let (reply, token) = apply(self, message.tree, command.clone()).await?;
                if let Some(token) = token {
                    settle(self, message, token, &reply).await;
                }
                Some(reply)
            }
        }
    }

    fn held_token(&self, tree: TreeId) -> Option<u64> {
        self.leases.lock().ok()?.get(&tree).copied()
    }

    /// Starts this engine's inbox task if it does not run, and (for
    /// `Some(tree)`) has it drain that tree's inbox.
    pub(super) fn nudge_inbox(self: &Arc<Self>, tree: Option<TreeId>) {
        let Ok(mut inbox) = self.inbox.lock() else {
            return;
        };
        let sender = match &*inbox {
            Some(sender) if !sender.is_closed() => sender.clone(),
            _ => {
                let (sender, nudges) = mpsc::unbounded_channel();
                let task = tokio::spawn(run(Arc::downgrade(self), nudges));
                if let Ok(mut tasks) = self.tasks.lock() {
                    tasks.push(task.abort_handle());
                }
                *inbox = Some(sender.clone());
                sender
            }
        };
        if let Some(tree) = tree {
            let _ = sender.send(tree);
        }
    }
}

/// Waits for a notice about the inbox of `tree` (any tree for `None`), or
/// one that notices were missed: `true`. Never returns without notices
/// (the store sends none, or stopped sending them).
async fn notice_for(changes: &mut Option<Changes>, tree: Option<TreeId>) -> bool {
    loop {
        let Some(subscription) = changes.as_mut() else {
            return std::future::pending().await;
        };
        match subscription.next().await {
            Some(Change::Missed) => return true,
            Some(Change::Inbox(noticed)) if tree.is_none_or(|tree| tree == noticed) => {
                return true;
            }
            Some(_) => {}
            None => *changes = None,
        }
    }
}

/// What the inbox task was woken for.
enum Wake {
    /// Drain this tree's inbox.
    Tree(TreeId),
    /// Drain the inboxes of every tree the engine holds.
    All,
}

/// The inbox task of one engine: drains inboxes on notices, on nudges and
/// (without notices) on a timer; ends with the engine.
async fn run(engine: Weak<EngineInner>, mut nudges: mpsc::UnboundedReceiver<TreeId>) {
    let Some((store, clock)) = engine
        .upgrade()
        .map(|engine| (engine.store.clone(), engine.clock.clone()))
    else {
        return;
    };
    let mut changes = store.changes().await.ok().flatten();
    drop(store);
    loop {
        let without_notices = changes.is_none();
        let wake = tokio::select! {
            nudge = nudges.recv() => match nudge {
                Some(tree) => Wake::Tree(tree),
                None => return,
            },
            change = next_inbox_change(&mut changes) => change,
            () = reread_timer(&*clock, without_notices) => Wake::All,
        };
        let Some(engine) = engine.upgrade() else {
            return;
        };
        drain(&engine, wake).await;
    }
}

async fn next_inbox_change(changes: &mut Option<Changes>) -> Wake {
    loop {
        let Some(subscription) = changes.as_mut() else {
            return std::future::pending().await;
        };
        match subscription.next().await {
            Some(Change::Missed) => return Wake::All,
            Some(Change::Inbox(tree)) => return Wake::Tree(tree),
            Some(_) => {}
            // The store stopped sending notices: re-read on the timer, and
            // re-read now for what may have been missed.
            None => {
                *changes = None;
                return Wake::All;
            }
        }
    }
}

async fn reread_timer(clock: &dyn crate::clock::Clock, without_notices: bool) {
    if without_notices {
        clock.sleep_until(clock.now().plus(HOLDER_REREAD)).await;
    } else {
        std::future::pending::<()>().await;
    }
}

/// Applies and settles the pending messages of the trees `wake` names that
/// this engine holds. A wake for one tree looks that tree up and no other:
/// every root that goes on past its first round wakes the task once, so a
/// cost in the trees held would make starting many roots quadratic.
async fn drain(engine: &Arc<EngineInner>, wake: Wake) {
    let (tree, held) = match wake {
        Wake::Tree(tree) if engine.held_token(tree).is_none() => return,
        Wake::Tree(tree) => (Some(tree), BTreeSet::from([tree])),
        Wake::All => {
            let held: BTreeSet<TreeId> = engine
                .leases
                .lock()
                .map(|leases| leases.keys().copied().collect())
                .unwrap_or_default();
            if held.is_empty() {
                return;
            }
            (None, held)
        }
    };
    let pending = match engine.store.pending(tree).await {
        Ok(pending) => pending,
        Err(error) => {
            tracing::warn!(%error, "the inbox could not be read; it is read again on the next notice");
            return;
        }
    };
    for message in pending.into_iter().filter(|m| held.contains(&m.tree)) {
        let command = match message.body.decode::<Forwarded>() {
            Ok(command) => command,
            Err(error) => {
                let reply = Reply::Failed {
                    code: "engine.forward.invalid".into(),
                    message: format!("the message does not hold a command: {error}"),
                };
                if let Some(token) = engine.held_token(message.tree) {
                    settle(engine, &message, token, &reply).await;
                }
                continue;
            }
        };
        if let Some((reply, Some(token))) = apply(engine, message.tree, command).await {
            settle(engine, &message, token, &reply).await;
        }
    }
}

/// Applies a command through this engine's local handle on the tree, with
/// the lease token it applied under (`None` for a finished tree, which has
/// no writer); `None` when this engine does not hold the tree (any more).
async fn apply(
    engine: &Arc<EngineInner>,
    tree: TreeId,
    command: Forwarded,
) -> Option<(Reply, Option<u64>)> {
    let shared = match engine.attach(tree, Some(command.scope()), false).await {
        Ok(shared) => shared,
        Err(TreeError::LeaseHeld { .. } | TreeError::ShuttingDown { .. }) => return None,
        Err(error) => return Some((Reply::of_tree(&error), engine.held_token(tree))),
    };
    // Read after the take-up: taking a sleeping tree up again grants a
    // newer token, and the one that applies is the one that settles (a
    // tree the command finishes gives its lease up, but its token stays
    // the newest grant).
    let token = engine.held_token(tree);
    let reply = run_command(engine, shared, tree, command).await;
    Some((reply, token))
}

/// Runs a command through a local handle on a tree this engine runs.
async fn run_command(
    engine: &Arc<EngineInner>,
    shared: Arc<super::TreeShared>,
    tree: TreeId,
    command: Forwarded,
) -> Reply {
    let handle = |process| ProcessHandle::<Payload>::new(engine.clone(), shared.clone(), process);
    match command {
        Forwarded::Answer {
            wait, id, payload, ..
        } => {
            let request = SignalRequest {
                id,
                wait: Some(wait),
                payload,
            };
            Reply::of_signal(handle(tree).answer(request).await)
        }
        Forwarded::Signal {
            process,
            id,
            wait,
            payload,
            ..
        } => {
            let request = SignalRequest { id, wait, payload };
            Reply::of_signal(handle(process).signal(request).await)
        }
        Forwarded::Cancel {
            process, reason, ..
        } => Reply::of_control(handle(process).cancel(reason).await),
        Forwarded::Resolve {
            effect, settlement, ..
        } => Reply::of_control(
            handle(tree)
                .control(|reply| Command::Resolve {
                    effect,
                    settlement,
                    reply,
                })
                .await,
        ),
        Forwarded::Replay { effect, .. } => Reply::of_control(
            handle(tree)
                .control(|reply| Command::Replay { effect, reply })
                .await,
        ),
    }
}

async fn settle(engine: &EngineInner, message: &Message, token: u64, reply: &Reply) {
    let outcome = match Payload::encode(reply) {
        Ok(outcome) => outcome,
        Err(error) => {
            tracing::warn!(%error, id = %message.id, "a forwarded command's outcome does not encode");
            return;
        }
    };
    let settled = engine
        .store
        .settle(Settle {
            tree: message.tree,
            id: message.id.clone(),
            token,
            outcome,
        })
        .await;
    match settled {
        Ok(SettleOutcome::Settled | SettleOutcome::AlreadySettled) => {}
        Ok(other) => {
            tracing::info!(tree = %message.tree, id = %message.id, ?other, "a forwarded command was applied but not settled here")
        }
        Err(error) => {
            tracing::warn!(tree = %message.tree, id = %message.id, %error, "a forwarded command was applied but its outcome not stored; the next holder applies it again")
        }
    }
}
