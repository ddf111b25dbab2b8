//! [`to_compact`](super::to_compact)'s text assembled by a caller that
//! writes some parts itself and leaves the others to this serializer: a
//! tree's snapshot writes each process's common members directly.

use std::sync::Arc;

use serde::Serialize;

use super::{Entry, Error, with_scratch, write_compact};

/// The buffer a [`compact_by`] writer appends to, and what writes a value
/// into it as [`to_compact`](super::to_compact) would.
pub(crate) struct Compact<'a> {
    pub out: &'a mut String,
    entries: &'a mut Vec<Entry>,
}

impl Compact<'_> {
    /// Appends `value` as `serde_json::to_vec` writes it, or fails where
    /// this serializer leaves the value to serde_json.
    pub fn value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        write_compact(self.out, self.entries, value)
    }
}

/// The text `write` appends to an empty buffer (the thread's kept one, as
/// [`to_compact`](super::to_compact) uses), in an allocation of its size.
pub(crate) fn compact_by(
    write: impl FnOnce(&mut Compact<'_>) -> Result<(), Error>,
) -> Result<Arc<[u8]>, Error> {
    with_scratch(|out, entries| {
        let mut compact = Compact { out, entries };
        write(&mut compact)?;
        Ok(Arc::from(compact.out.as_bytes()))
    })
}
