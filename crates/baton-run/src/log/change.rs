//! A step's state recorded as its change from the state before it.
//!
//! A step that changes a small part of a large state would otherwise write
//! the whole state into its record: encoded into the record, hashed into
//! the chain and cut into pieces by a store, at every step. Its record
//! holds instead the bytes that changed, with how many bytes before and
//! after them are as they were; folding the record puts them back in place
//! in the process's state before the step. The change depends on the two
//! states' canonical texts alone, so it is as deterministic as the states.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::payload::{Payload, common_prefix, common_suffix};
use crate::protocol::ExecutionState;

/// A state as its change from the state before: that state's text with
/// `text` in place of its bytes from `front` to `back` bytes before its end.
#[derive(Clone, Serialize, Deserialize)]
pub struct StateChange {
    /// Bytes kept from the front of the state before.
    pub front: u64,
    /// Bytes kept from the end of the state before.
    pub back: u64,
    /// What stands between them in the new state.
    pub text: String,
    /// The new state whole, where the engine that made the change holds it:
    /// folding the change then takes it instead of building it again.
    /// Never written or read, and not compared.
    #[serde(skip)]
    whole: Option<ExecutionState>,
}

impl StateChange {
    /// States shorter than this are recorded whole: a change saves little,
    /// and a small state's record stays readable on its own.
    pub const FROM_BYTES: usize = 4096;

    /// `after` as a change from `before`, when that is much smaller than
    /// `after` (at most a quarter of it), else `None` (record it whole).
    pub fn between(before: &ExecutionState, after: &ExecutionState) -> Option<StateChange> {
        let (old, new) = (before.0.as_str(), after.0.as_str());
        if new.len() < Self::FROM_BYTES {
            return None;
        }
        let (front, back) = kept(old, new);
        let text = &new[front..new.len() - back];
        (text.len() <= new.len() / 4).then(|| StateChange {
            front: front as u64,
            back: back as u64,
            text: text.to_owned(),
            whole: Some(after.clone()),
        })
    }

    /// Bytes of the state this change makes.
    pub fn state_bytes(&self) -> u64 {
        self.front
            .saturating_add(self.back)
            .saturating_add(self.text.len() as u64)
    }

    /// The state this change makes of `before`; an error says why the
    /// change does not fit it.
    pub fn apply(&self, before: &ExecutionState) -> Result<ExecutionState, String> {
        match &self.whole {
            Some(whole) => {
                debug_assert_eq!(
                    self.build(before).as_ref(),
                    Ok(whole),
                    "a state change makes the state it was made from"
                );
                Ok(whole.clone())
            }
            None => self.build(before),
        }
    }

    /// The state this change makes of `before`, built from its text.
    fn build(&self, before: &ExecutionState) -> Result<ExecutionState, String> {
        let old = before.0.as_str();
        let front = usize::try_from(self.front).unwrap_or(usize::MAX);
        let back = usize::try_from(self.back).unwrap_or(usize::MAX);
        let fits = front
            .checked_add(back)
            .is_some_and(|kept| kept <= old.len())
            && old.is_char_boundary(front)
            && old.is_char_boundary(old.len() - back);
        if !fits {
            return Err(format!(
                "a state change keeps {front} bytes before and {back} after a change to a state of {} bytes",
                old.len()
            ));
        }
        let mut text = String::with_capacity(front + self.text.len() + back);
        text.push_str(&old[..front]);
        text.push_str(&self.text);
        text.push_str(&old[old.len() - back..]);
        Payload::parse_str(&text)
            .map(ExecutionState)
            .map_err(|error| format!("a state change makes no state: {error}"))
    }
}

/// How many bytes the front and the end of `new` share with `old`, not
/// overlapping and each ending at a character boundary of both.
fn kept(old: &str, new: &str) -> (usize, usize) {
    let (a, b) = (old.as_bytes(), new.as_bytes());
    let most = a.len().min(b.len());
    let mut front = common_prefix(a, b);
    while !(old.is_char_boundary(front) && new.is_char_boundary(front)) {
        front -= 1;
    }
    let room = most - front;
    let mut back = common_suffix(&a[a.len() - room..], &b[b.len() - room..]);
    while !(old.is_char_boundary(a.len() - back) && new.is_char_boundary(b.len() - back)) {
        back -= 1;
    }
    (front, back)
}

impl PartialEq for StateChange {
    fn eq(&self, other: &StateChange) -> bool {
        self.front == other.front && self.back == other.back && self.text == other.text
    }
}

impl Eq for StateChange {}

impl fmt::Debug for StateChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateChange")
            .field("front", &self.front)
            .field("back", &self.back)
            .field("text_bytes", &self.text.len())
            .finish()
    }
}

#[cfg(test)]
mod tests;
