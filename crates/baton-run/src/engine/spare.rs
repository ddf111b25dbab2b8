//! A thread's spare staged-record buffer: the buffer a finished tree's
//! owner leaves for the next tree the thread starts.

use crate::log::RecordBody;

thread_local! {
    /// A finished tree's staged-record buffer, for the next tree this
    /// thread starts: records are large, and a fresh buffer regrows (moving
    /// them) several times in a tree's first round.
    static SPARE_STAGED: std::cell::Cell<Vec<RecordBody>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The largest staged-record buffer kept for reuse (in records).
const SPARE_STAGED_MAX: usize = 256;

pub(super) fn spare_staged() -> Vec<RecordBody> {
    SPARE_STAGED.with(std::cell::Cell::take)
}

pub(super) fn keep_staged(mut staged: Vec<RecordBody>) {
    staged.clear();
    if staged.capacity() <= SPARE_STAGED_MAX {
        SPARE_STAGED.with(|spare| {
            let current = spare.take();
            spare.set(if current.capacity() >= staged.capacity() {
                current
            } else {
                staged
            });
        });
    }
}
