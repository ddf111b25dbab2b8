//! A process's input as the engine compares and records it: its digest,
//! worked out when first needed.
//!
//! A start is told apart from another start of the same id, and a child
//! start from another of the same key, by program and input; a tree
//! snapshot records each process's input digest. A tree that ends in the
//! round that started it is neither compared nor snapshotted again, yet
//! hashing its inputs up front cost a blake3 pass over every input (a
//! 250 KB input's hash is a tenth of each of its ten steps' time). So a
//! process created by this engine holds its input until the digest is
//! asked for or the round that created it is committed with the tree going
//! on ([`InputDigest::settle`]); then only the digest is kept, so a
//! waiting tree holds no inputs. Two held inputs are compared by their
//! canonical texts, which are equal exactly when their digests are.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::digest::Digest;
use crate::payload::Payload;

/// The digest of a process's input, or the input it is the digest of.
#[derive(Clone)]
pub(crate) enum InputDigest {
    /// The digest (read from a snapshot, or settled).
    Known(Digest),
    /// The input, hashed when the digest is asked for (the payload keeps
    /// the digest once computed, shared with every copy of it).
    Of(Payload),
}

impl InputDigest {
    /// The digest of `input`, to be computed when needed.
    pub(crate) fn of(input: &Payload) -> InputDigest {
        InputDigest::Of(input.clone())
    }

    /// The digest.
    pub(crate) fn digest(&self) -> Digest {
        match self {
            InputDigest::Known(digest) => *digest,
            InputDigest::Of(input) => input.digest(),
        }
    }

    /// Whether this is the digest of `input`: texts compared where the
    /// input is held, else `input`'s digest.
    pub(crate) fn is_of(&self, input: &Payload) -> bool {
        match self {
            InputDigest::Known(digest) => *digest == input.digest(),
            InputDigest::Of(held) => held.as_str() == input.as_str(),
        }
    }

    /// Keeps only the digest, computing it if it was not yet.
    pub(crate) fn settle(&mut self) {
        if let InputDigest::Of(input) = self {
            *self = InputDigest::Known(input.digest());
        }
    }

    /// Whether the input is still held.
    #[cfg(test)]
    pub(crate) fn is_held(&self) -> bool {
        matches!(self, InputDigest::Of(_))
    }
}

impl PartialEq for InputDigest {
    fn eq(&self, other: &InputDigest) -> bool {
        match other {
            InputDigest::Of(input) => self.is_of(input),
            InputDigest::Known(digest) => self.digest() == *digest,
        }
    }
}

impl Eq for InputDigest {}

impl fmt::Debug for InputDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.digest(), f)
    }
}

impl Serialize for InputDigest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.digest().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for InputDigest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<InputDigest, D::Error> {
        Digest::deserialize(deserializer).map(InputDigest::Known)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn payload(text: &str) -> Payload {
        Payload::parse_str(text).expect("json")
    }

    proptest! {
        /// Held or known, an input digest compares, reads and writes as
        /// the digest of its input: two inputs' digests are equal exactly
        /// when their canonical texts are, whichever form each side takes.
        #[test]
        fn an_input_digest_is_its_inputs_digest(
            a in "[a-c]{0,3}",
            b in "[a-c]{0,3}",
            settle_a: bool,
            settle_b: bool,
        ) {
            let (pa, pb) = (payload(&format!("{a:?}")), payload(&format!("{b:?}")));
            let mut da = InputDigest::of(&pa);
            let mut db = InputDigest::of(&pb);
            prop_assert!(da.is_held());
            if settle_a {
                da.settle();
                prop_assert!(!da.is_held());
            }
            if settle_b {
                db.settle();
            }
            prop_assert_eq!(da.digest(), pa.digest());
            prop_assert_eq!(da == db, a == b);
            prop_assert_eq!(da.is_of(&pb), a == b);
            prop_assert_eq!(db.is_of(&pa), a == b);
            let text = serde_json::to_string(&da).expect("encodes");
            prop_assert_eq!(&text, &serde_json::to_string(&pa.digest()).expect("encodes"));
            let read: InputDigest = serde_json::from_str(&text).expect("reads");
            prop_assert!(!read.is_held());
            prop_assert_eq!(read, InputDigest::Known(pa.digest()));
        }
    }
}
