//! Change notices: how a store tells its readers that something committed.
//!
//! A notice is a hint to re-read, never the data itself: a reader that
//! receives [`Change::Tree`] reads that tree again, one that receives
//! [`Change::Missed`] reads everything it watches again. A store that sends
//! no notices answers [`Store::changes`](super::Store::changes) with `None`
//! and its readers re-read on a timer of their own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::ids::TreeId;

/// Something committed that a reader may care about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// A commit touched this tree's log or lease: an append, a released
    /// lease.
    Tree(TreeId),
    /// A message was posted to this tree's inbox or settled.
    Inbox(TreeId),
    /// Notices may have been missed (a reader fell behind, a connection was
    /// lost), or something changed that the store cannot name a tree for:
    /// re-read whatever you watch.
    Missed,
}

/// Notices buffered per subscriber before it counts as behind.
const BUFFER: usize = 1024;

/// A subscription to a store's change notices, from
/// [`Store::changes`](super::Store::changes).
///
/// Notices of commits after the subscription was made are delivered, unless
/// a [`Change::Missed`] says some were lost. Dropping it ends the
/// subscription.
#[derive(Debug)]
pub struct Changes {
    receiver: mpsc::Receiver<Change>,
    missed: Arc<AtomicBool>,
}

impl Changes {
    /// A subscription and the sender that feeds it (for store
    /// implementations). The sender never blocks: a subscriber more than a
    /// buffer behind is told [`Change::Missed`] instead.
    pub fn channel() -> (ChangeSender, Changes) {
        let (sender, receiver) = mpsc::channel(BUFFER);
        let missed = Arc::new(AtomicBool::new(false));
        (
            ChangeSender {
                sender,
                missed: missed.clone(),
            },
            Changes { receiver, missed },
        )
    }

    /// The next notice; `None` once the store stopped sending them (the
    /// reader falls back to re-reading on a timer).
    pub async fn next(&mut self) -> Option<Change> {
        if self.missed.swap(false, Ordering::AcqRel) {
            return Some(Change::Missed);
        }
        self.receiver.recv().await
    }
}

/// The sending side of one [`Changes`] subscription.
#[derive(Clone, Debug)]
pub struct ChangeSender {
    sender: mpsc::Sender<Change>,
    missed: Arc<AtomicBool>,
}

impl ChangeSender {
    /// Sends a notice without waiting; `false` once the subscriber is gone.
    pub fn send(&self, change: Change) -> bool {
        match self.sender.try_send(change) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.missed.store(true, Ordering::Release);
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Whether the subscriber is gone.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// Waits until the subscriber is gone.
    pub async fn closed(&self) {
        self.sender.closed().await;
    }
}

/// The subscribers of one store (for store implementations): each notice
/// goes to every live subscriber; subscribers that went away are dropped.
/// Cloning shares the same subscribers.
#[derive(Clone, Debug, Default)]
pub struct ChangeHub {
    subscribers: Arc<Mutex<Vec<ChangeSender>>>,
}

impl ChangeHub {
    /// A hub without subscribers.
    pub fn new() -> ChangeHub {
        ChangeHub::default()
    }

    /// A new subscription.
    pub fn subscribe(&self) -> Changes {
        let (sender, changes) = Changes::channel();
        self.add(sender);
        changes
    }

    /// Adds a subscriber's sender.
    pub fn add(&self, sender: ChangeSender) {
        if let Ok(mut subscribers) = self.subscribers.lock() {
            subscribers.push(sender);
        }
    }

    /// Sends a notice to every live subscriber.
    pub fn notify(&self, change: Change) {
        if let Ok(mut subscribers) = self.subscribers.lock() {
            subscribers.retain(|subscriber| subscriber.send(change));
        }
    }

    /// Whether anyone still listens.
    pub fn is_watched(&self) -> bool {
        self.subscribers.lock().is_ok_and(|mut subscribers| {
            subscribers.retain(|subscriber| !subscriber.is_closed());
            !subscribers.is_empty()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> TreeId {
        crate::ids::ProcessId::root(&crate::ids::StartId::new("acme", "k").expect("valid"))
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_told_it_missed_notices() {
        let hub = ChangeHub::new();
        let mut changes = hub.subscribe();
        for _ in 0..BUFFER + 1 {
            hub.notify(Change::Tree(tree()));
        }
        assert_eq!(changes.next().await, Some(Change::Missed));
        for _ in 0..BUFFER {
            assert_eq!(changes.next().await, Some(Change::Tree(tree())));
        }
        drop(changes);
        assert!(!hub.is_watched());
    }
}
