//! Canonical payloads assembled from parts that are canonical already.
//!
//! Texts made of other payloads (a state holding every task, a turn's
//! input) are canonical by construction when each part is a [`Payload`],
//! every key is escaped as serde_json escapes it and the keys of each
//! object come in strictly increasing byte order. The writer accepts parts
//! only in those forms and checks only the structure around them, so the
//! parts are copied and never scanned again. Nothing else can enter the
//! text: there is no way to write raw text. [`Payload::with_first_member`]
//! is the one-member case without a writer: an object payload with a
//! member put in front of its first key.

use super::{Payload, PayloadError};

/// Writes one canonical [`Payload`] from payloads, keys and small scalars,
/// copying each part as it is.
///
/// Every method that refuses a misuse leaves the writer as it was, so the
/// text written so far stays a canonical prefix. [`PayloadWriter::finish`]
/// refuses a writer that does not hold exactly one whole value.
///
/// ```
/// use baton_run::Payload;
/// use baton_run::program::PayloadWriter;
///
/// let input = Payload::parse_str(r#"{"b":1,"a":2}"#)?;
/// let mut writer = PayloadWriter::new();
/// writer.begin_object()?;
/// writer.key("input")?;
/// writer.value(&input)?;
/// writer.key("tags")?;
/// writer.begin_array()?;
/// writer.string("x")?;
/// writer.u64(7)?;
/// writer.end_array()?;
/// writer.end_object()?;
/// let payload = writer.finish()?;
/// assert_eq!(payload.as_str(), r#"{"input":{"a":2,"b":1},"tags":["x",7]}"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default)]
pub struct PayloadWriter {
    out: String,
    /// The open arrays and objects, innermost last.
    open: Vec<Open>,
    /// The last key of every open object, one after another: each object's
    /// key starts at its `keys` mark and runs to the next object's mark.
    keys: String,
    /// The deepest nesting of the text written so far.
    deepest: usize,
    /// Whether the one top-level value is complete.
    complete: bool,
}

#[derive(Debug)]
enum Open {
    Array {
        empty: bool,
    },
    Object {
        /// Where this object's last key starts in `keys`.
        mark: usize,
        /// Whether it has a key yet.
        keyed: bool,
        /// Whether its last key still awaits its value.
        awaiting: bool,
    },
}

/// A misuse of a [`PayloadWriter`]; the writer refused it and is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// A key does not come strictly after the object's previous key in byte
    /// order (canonical objects are sorted and have no duplicates).
    #[error("key {key:?} does not come after key {previous:?}")]
    KeyOrder {
        /// The object's previous key.
        previous: String,
        /// The refused key.
        key: String,
    },
    /// A key outside an object.
    #[error("key {key:?} outside an object")]
    KeyOutsideObject {
        /// The refused key.
        key: String,
    },
    /// A key, or the object's end, where the previous key awaits its value.
    #[error("key {key:?} awaits its value")]
    ValueMissing {
        /// The key without a value.
        key: String,
    },
    /// A value inside an object without a key for it.
    #[error("a value in an object needs a key first")]
    KeyMissing,
    /// A second top-level value: a payload is one value.
    #[error("the payload already holds its one value")]
    Complete,
    /// The end of an array or object that is not the innermost one open.
    #[error("no {expected} is open to end")]
    Mismatched {
        /// `"array"` or `"object"`: what the refused end would close.
        expected: &'static str,
    },
    /// Nesting deeper than [`Payload::MAX_DEPTH`].
    #[error("nesting of depth {depth} exceeds the limit of {limit}")]
    TooDeep {
        /// The depth the refused part would reach.
        depth: usize,
        /// The limit in force.
        limit: usize,
    },
    /// [`PayloadWriter::finish`] with arrays or objects still open.
    #[error("{open} arrays or objects are still open")]
    Unclosed {
        /// How many are open.
        open: usize,
    },
    /// [`Payload::with_first_member`] of a payload that is not a JSON
    /// object.
    #[error("the payload is not an object")]
    NotAnObject,
    /// [`PayloadWriter::finish`] before any value was written.
    #[error("no value was written")]
    Empty,
}

impl PayloadWriter {
    /// An empty writer.
    pub fn new() -> PayloadWriter {
        PayloadWriter::default()
    }

    /// An empty writer with room for `capacity` bytes of text.
    pub fn with_capacity(capacity: usize) -> PayloadWriter {
        PayloadWriter {
            out: String::with_capacity(capacity),
            ..PayloadWriter::default()
        }
    }

    /// Opens an object; its keys come next, each followed by its value.
    pub fn begin_object(&mut self) -> Result<(), WriteError> {
        self.start_value(1)?;
        self.out.push('{');
        self.open.push(Open::Object {
            mark: self.keys.len(),
            keyed: false,
            awaiting: false,
        });
        Ok(())
    }

    /// Closes the innermost open object.
    pub fn end_object(&mut self) -> Result<(), WriteError> {
        let Some(Open::Object { mark, awaiting, .. }) = self.open.last() else {
            return Err(WriteError::Mismatched { expected: "object" });
        };
        if *awaiting {
            return Err(WriteError::ValueMissing {
                key: self.keys[*mark..].to_owned(),
            });
        }
        self.keys.truncate(*mark);
        self.open.pop();
        self.out.push('}');
        self.end_value();
        Ok(())
    }

    /// Opens an array; its elements come next.
    pub fn begin_array(&mut self) -> Result<(), WriteError> {
        self.start_value(1)?;
        self.out.push('[');
        self.open.push(Open::Array { empty: true });
        Ok(())
    }

    /// Closes the innermost open array.
    pub fn end_array(&mut self) -> Result<(), WriteError> {
        if !matches!(self.open.last(), Some(Open::Array { .. })) {
            return Err(WriteError::Mismatched { expected: "array" });
        }
        self.open.pop();
        self.out.push(']');
        self.end_value();
        Ok(())
    }

    /// Writes the next key of the innermost open object, escaped as
    /// serde_json escapes it; it must come strictly after the object's
    /// previous key in byte order.
    pub fn key(&mut self, key: &str) -> Result<(), WriteError> {
        let Some(Open::Object {
            mark,
            keyed,
            awaiting,
        }) = self.open.last_mut()
        else {
            return Err(WriteError::KeyOutsideObject {
                key: key.to_owned(),
            });
        };
        let previous = &self.keys[*mark..];
        if *awaiting {
            return Err(WriteError::ValueMissing {
                key: previous.to_owned(),
            });
        }
        if *keyed && key <= previous {
            return Err(WriteError::KeyOrder {
                previous: previous.to_owned(),
                key: key.to_owned(),
            });
        }
        crate::canonical::write_key(&mut self.out, key, *keyed);
        *keyed = true;
        *awaiting = true;
        self.keys.truncate(*mark);
        self.keys.push_str(key);
        Ok(())
    }

    /// Writes a payload's canonical text as the next value.
    pub fn value(&mut self, payload: &Payload) -> Result<(), WriteError> {
        self.start_value(payload.depth())?;
        crate::canonical::append(&mut self.out, payload.as_str());
        self.end_value();
        Ok(())
    }

    /// Writes a string, escaped as serde_json escapes it, as the next value.
    pub fn string(&mut self, text: &str) -> Result<(), WriteError> {
        self.start_value(0)?;
        crate::canonical::write_str(&mut self.out, text);
        self.end_value();
        Ok(())
    }

    /// Writes an unsigned integer as the next value.
    pub fn u64(&mut self, number: u64) -> Result<(), WriteError> {
        self.scalar(itoa::Buffer::new().format(number))
    }

    /// Writes a signed integer as the next value.
    pub fn i64(&mut self, number: i64) -> Result<(), WriteError> {
        self.scalar(itoa::Buffer::new().format(number))
    }

    /// Writes `true` or `false` as the next value.
    pub fn bool(&mut self, value: bool) -> Result<(), WriteError> {
        self.scalar(if value { "true" } else { "false" })
    }

    /// Writes `null` as the next value.
    pub fn null(&mut self) -> Result<(), WriteError> {
        self.scalar("null")
    }

    /// The payload written: exactly one whole value, within
    /// [`Payload::MAX_BYTES`].
    pub fn finish(self) -> Result<Payload, PayloadError> {
        if !self.open.is_empty() {
            return Err(PayloadError::Unfinished(WriteError::Unclosed {
                open: self.open.len(),
            }));
        }
        if !self.complete {
            return Err(PayloadError::Unfinished(WriteError::Empty));
        }
        Payload::from_canonical_at(self.out.into_boxed_str(), Some(self.deepest))
    }

    /// Integers, booleans and `null`, given as their JSON text.
    fn scalar(&mut self, text: &str) -> Result<(), WriteError> {
        self.start_value(0)?;
        self.out.push_str(text);
        self.end_value();
        Ok(())
    }

    /// Checks that a value of nesting `depth` may come next and writes what
    /// precedes it; on a refusal nothing is written.
    fn start_value(&mut self, depth: usize) -> Result<(), WriteError> {
        let reached = self.open.len() + depth;
        match self.open.last() {
            None if self.complete => return Err(WriteError::Complete),
            Some(Open::Object {
                awaiting: false, ..
            }) => return Err(WriteError::KeyMissing),
            _ if reached > Payload::MAX_DEPTH => {
                return Err(WriteError::TooDeep {
                    depth: reached,
                    limit: Payload::MAX_DEPTH,
                });
            }
            _ => {}
        }
        match self.open.last_mut() {
            Some(Open::Array { empty }) => {
                if !*empty {
                    self.out.push(',');
                }
                *empty = false;
            }
            Some(Open::Object { awaiting, .. }) => *awaiting = false,
            None => {}
        }
        self.deepest = self.deepest.max(reached);
        Ok(())
    }

    /// Marks the payload complete when the value just written was the
    /// top-level one.
    fn end_value(&mut self) {
        if self.open.is_empty() {
            self.complete = true;
        }
    }
}

impl Payload {
    /// This payload, a JSON object, with one more member in front: `key`
    /// (which must come before the object's first key in byte order, as
    /// canonical members are sorted) with `value`. Both payloads are
    /// copied, not scanned again.
    ///
    /// ```
    /// use baton_run::Payload;
    ///
    /// let task = Payload::parse_str(r#"{"request":{"key":"a"}}"#)?;
    /// let started = task.with_first_member("process", &Payload::encode(&"p_1")?)?;
    /// assert_eq!(started.as_str(), r#"{"process":"p_1","request":{"key":"a"}}"#);
    /// assert!(task.with_first_member("zone", &Payload::null()).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_first_member(&self, key: &str, value: &Payload) -> Result<Payload, PayloadError> {
        let text = self.as_str();
        let Some(members) = text
            .strip_prefix('{')
            .and_then(|rest| rest.strip_suffix('}'))
        else {
            return Err(PayloadError::Assembly(WriteError::NotAnObject));
        };
        if !members.is_empty() {
            let first = first_key(members);
            if *first <= *key {
                return Err(PayloadError::Assembly(WriteError::KeyOrder {
                    previous: key.to_owned(),
                    key: first.into_owned(),
                }));
            }
        }
        let depth = self.depth().max(value.depth() + 1);
        if depth > Payload::MAX_DEPTH {
            return Err(PayloadError::Assembly(WriteError::TooDeep {
                depth,
                limit: Payload::MAX_DEPTH,
            }));
        }
        let mut out = String::with_capacity(text.len() + key.len() + value.len() + 8);
        out.push('{');
        crate::canonical::write_str(&mut out, key);
        out.push(':');
        crate::canonical::append(&mut out, value.as_str());
        if !members.is_empty() {
            out.push(',');
            crate::canonical::append(&mut out, members);
        }
        out.push('}');
        Payload::from_canonical_at(out.into_boxed_str(), Some(depth))
    }
}

/// The first key of a canonical object's members (its text without the
/// braces, not empty), unescaped: borrowed where it holds no escape.
fn first_key(members: &str) -> std::borrow::Cow<'_, str> {
    let quoted = members
        .strip_prefix('"')
        .expect("a canonical object's members start with a key");
    match quoted.find(['"', '\\']) {
        Some(end) if quoted.as_bytes()[end] == b'"' => std::borrow::Cow::Borrowed(&quoted[..end]),
        _ => {
            let mut de = serde_json::Deserializer::from_str(members);
            std::borrow::Cow::Owned(
                <String as serde::Deserialize>::deserialize(&mut de)
                    .expect("a canonical object's members start with a key"),
            )
        }
    }
}
