//! A tree's durable inbox: commands posted for the engine that holds the
//! tree, each settled once with an outcome by that engine.
//!
//! An engine that is asked to answer, signal, cancel or resolve a tree
//! whose lease another live engine holds posts the command here and awaits
//! its outcome; the holder, woken by the store's change notices, applies
//! it and settles it. Posting is idempotent by the message's id, and only
//! the current lease holder can settle (by its fencing token), so a stale
//! holder cannot answer for the tree.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::ids::TreeId;
use crate::payload::Payload;

/// A message's id, chosen by the poster: posting the same id twice posts
/// once. 1 to 128 printable ASCII characters.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MessageId(String);

/// A text that is not a message id.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "store.message_id.invalid: {text:?} is not a message id (1 to 128 printable ASCII characters)"
)]
pub struct MessageIdError {
    /// The refused text (at most 80 characters of it).
    pub text: String,
}

impl MessageIdError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        "store.message_id.invalid"
    }
}

impl MessageId {
    /// The longest id, in bytes.
    pub const MAX_LEN: usize = 128;

    /// Checks an id's text.
    pub fn new(text: impl Into<String>) -> Result<MessageId, MessageIdError> {
        let text = text.into();
        let ok = !text.is_empty()
            && text.len() <= MessageId::MAX_LEN
            && text.bytes().all(|b| b.is_ascii_graphic());
        if ok {
            Ok(MessageId(text))
        } else {
            Err(MessageIdError {
                text: text.chars().take(80).collect(),
            })
        }
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for MessageId {
    type Error = MessageIdError;
    fn try_from(text: String) -> Result<MessageId, MessageIdError> {
        MessageId::new(text)
    }
}

impl From<MessageId> for String {
    fn from(id: MessageId) -> String {
        id.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MessageId({:?})", self.0)
    }
}

/// A command posted to a tree's inbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The tree it is for.
    pub tree: TreeId,
    /// Its id (posting the same id again posts nothing).
    pub id: MessageId,
    /// The command, as the engine encodes it.
    pub body: Payload,
    /// When it was posted (the poster's clock).
    pub posted: Timestamp,
}

/// The outcome of [`Store::post`](super::Store::post).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PostOutcome {
    /// The message is durable and its tree's subscribers are told.
    Posted,
    /// A message with this id and this body was posted before; nothing
    /// changed.
    Duplicate,
    /// A message with this id but another body was posted before; nothing
    /// changed.
    Conflict,
    /// The tree has no committed record.
    UnknownTree,
    /// This store keeps no inbox.
    Unsupported,
}

/// A holder's outcome for one message, fenced by its lease token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settle {
    /// The tree.
    pub tree: TreeId,
    /// The message.
    pub id: MessageId,
    /// The settling holder's fencing token: it must be the newest lease
    /// granted on the tree (live, or given up by the holder's last append;
    /// a takeover grants a newer one and fences it).
    pub token: u64,
    /// What applying the message gave, as the engine encodes it.
    pub outcome: Payload,
}

/// The outcome of [`Store::settle`](super::Store::settle).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettleOutcome {
    /// The outcome is durable and the tree's subscribers are told.
    Settled,
    /// The message was settled before; its first outcome stands.
    AlreadySettled,
    /// The token is not the newest lease granted on the tree: nothing was
    /// written.
    Fenced,
    /// No such message.
    Unknown,
    /// This store keeps no inbox.
    Unsupported,
}

/// A posted message and its outcome, once settled (from
/// [`Store::message`](super::Store::message)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Posted {
    /// The message.
    pub message: Message,
    /// Its outcome; `None` while it is pending.
    pub outcome: Option<Payload>,
}
