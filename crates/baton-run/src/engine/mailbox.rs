//! A tree owner's mailbox: the commands its handles send it, and the
//! channels that carry them and its dispatches' completions.

use tokio::sync::{mpsc, oneshot};

use crate::ids::{EffectId, ProcessId};
use crate::protocol::Settlement;

use super::dispatch::Completion;
use super::error::{ControlError, RuntimeError, SignalError};
use super::view::TreeView;
use super::{SignalReceipt, SignalRequest};

/// A request from a handle to the tree's owner task.
pub(crate) enum Command {
    Signal {
        process: ProcessId,
        request: SignalRequest,
        reply: oneshot::Sender<Result<SignalReceipt, SignalError>>,
    },
    /// An answer to a wait anywhere in the tree, routed by the wait's id.
    Answer {
        request: SignalRequest,
        reply: oneshot::Sender<Result<SignalReceipt, SignalError>>,
    },
    Cancel {
        process: ProcessId,
        reason: String,
        reply: oneshot::Sender<Result<(), ControlError>>,
    },
    Kill {
        process: ProcessId,
        reply: oneshot::Sender<Result<(), ControlError>>,
    },
    Resolve {
        effect: EffectId,
        settlement: Settlement,
        reply: oneshot::Sender<Result<(), ControlError>>,
    },
    Replay {
        effect: EffectId,
        reply: oneshot::Sender<Result<(), ControlError>>,
    },
    Inspect {
        reply: oneshot::Sender<Result<TreeView, ControlError>>,
    },
    /// Renew the lease now: is this engine still the tree's writer?
    Renew {
        reply: oneshot::Sender<Result<(), RuntimeError>>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
    /// Take no new steps; answer once no dispatch is in flight (the
    /// engine is shutting down and closes the tree next).
    Drain {
        reply: oneshot::Sender<()>,
    },
}

/// The ends of an owner task's channels. Channel items are boxed: tokio
/// allocates each channel's first block of 32 slots up front, so small
/// items keep an idle tree small.
pub(crate) struct Channels {
    pub(super) commands: mpsc::UnboundedReceiver<Box<Command>>,
    pub(super) completions: mpsc::UnboundedReceiver<Box<Completion>>,
    pub(super) completion_sender: mpsc::UnboundedSender<Box<Completion>>,
}

impl Channels {
    /// New channels, and the sender of commands that the tree's door keeps.
    pub fn new() -> (mpsc::UnboundedSender<Box<Command>>, Channels) {
        let (commands_sender, commands) = mpsc::unbounded_channel();
        let (completion_sender, completions) = mpsc::unbounded_channel();
        (
            commands_sender,
            Channels {
                commands,
                completions,
                completion_sender,
            },
        )
    }
}
