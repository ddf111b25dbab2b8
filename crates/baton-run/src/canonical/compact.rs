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

/// Appends `text`, which needs no escaping (an id's or a digest's text),
/// as a JSON string.
pub(crate) fn quoted(out: &mut String, text: &str) {
    debug_assert!(
        text.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
    );
    out.reserve(text.len() + 2);
    out.push('"');
    out.push_str(text);
    out.push('"');
}

/// Appends `value` as serde_json writes an unsigned integer.
pub(crate) fn number(out: &mut String, value: u64) {
    out.push_str(itoa::Buffer::new().format(value));
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
