//! The storage of the team's two caches (the restore memo and the
//! policy's turn memo): a few recent entries behind a lock.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// A few recent entries behind a lock, newest first: the storage of the
/// team's caches (the restore memo and the policy's turn memo). Entries are
/// immutable once kept, so the lock is held only to copy the list or to
/// add one, and a panic elsewhere while it was held cannot have left a
/// half-written entry.
#[derive(Debug)]
pub(crate) struct Recent<T: ?Sized> {
    kept: Mutex<VecDeque<Arc<T>>>,
}

impl<T: ?Sized> Default for Recent<T> {
    fn default() -> Self {
        Recent {
            kept: Mutex::new(VecDeque::new()),
        }
    }
}

impl<T: ?Sized> Recent<T> {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Arc<T>>> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The kept entries, newest first.
    pub fn entries(&self) -> Vec<Arc<T>> {
        self.lock().iter().cloned().collect()
    }

    /// Keeps `entry` as the newest, dropping the oldest beyond `limit`.
    pub fn keep(&self, entry: Arc<T>, limit: usize) {
        let mut kept = self.lock();
        kept.push_front(entry);
        kept.truncate(limit);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }
}
