//! Immutable JSON payloads with one canonical byte encoding.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use serde::de::{DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use serde_json::ser::Formatter as _;

use crate::digest::{Digest, Purpose};

mod common;
mod read;
mod scan;
mod writer;

pub use common::common_prefix;
pub(crate) use common::common_suffix;
use scan::canonical_depth;
pub(crate) use scan::is_canonical;
pub use writer::{PayloadWriter, WriteError};

/// An immutable JSON value held in its canonical encoding: object keys
/// sorted, no insignificant whitespace, numbers in serde_json's shortest
/// round-trip form, duplicate keys rejected.
///
/// Two payloads are equal exactly when their canonical bytes are equal, so
/// key order and whitespace of the text they were parsed from never matter.
#[derive(Clone)]
pub struct Payload(Arc<Inner>);

struct Inner {
    /// Canonical JSON text: checked or written canonical where it was made,
    /// so it is never parsed again to be kept.
    text: Box<str>,
    digest: OnceLock<Digest>,
    /// How deeply arrays and objects nest in the text (0 for a scalar):
    /// known where the text was checked or written, else found on demand.
    depth: OnceLock<usize>,
    /// The compiled schema this payload was last found to satisfy (its
    /// [`SchemaMark`]), or 0: a payload handed from layer to layer is
    /// checked against the same schema again and again (a child's input
    /// by each start, an output by its stage and by the engine), and a
    /// verdict on the same text by the same validator cannot change.
    satisfies: AtomicU64,
}

/// A compiled schema's mark, unique in the process (never 0, never
/// reused), under which payloads remember satisfying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SchemaMark(u64);

impl SchemaMark {
    /// A mark no schema compiled before has.
    pub(crate) fn fresh() -> SchemaMark {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        SchemaMark(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// Why a payload could not be built or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PayloadError {
    /// The text is not one well-formed JSON value.
    #[error("malformed JSON: {message}")]
    Malformed {
        /// What the parser reported.
        message: String,
    },
    /// An object repeats a key.
    #[error("duplicate object key {key:?}")]
    DuplicateKey {
        /// The repeated key.
        key: String,
    },
    /// The canonical encoding exceeds the size limit.
    #[error("payload of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Canonical size in bytes.
        size: usize,
        /// The limit in force.
        limit: usize,
    },
    /// A Rust value could not be encoded as JSON.
    #[error("cannot encode value as JSON: {message}")]
    Encode {
        /// What serde reported.
        message: String,
    },
    /// The payload does not decode into the requested type.
    #[error("cannot decode payload: {message}")]
    Decode {
        /// What serde reported.
        message: String,
    },
    /// A [`PayloadWriter`] was finished before it held one whole value.
    #[error("cannot finish payload: {0}")]
    Unfinished(WriteError),
    /// Parts that do not make a canonical payload were put together (see
    /// [`Payload::with_first_member`]).
    #[error("cannot assemble payload: {0}")]
    Assembly(WriteError),
}

impl Payload {
    /// Largest canonical payload accepted anywhere: 8 MiB. Engines may set a
    /// smaller per-tree limit.
    pub const MAX_BYTES: usize = 8 * 1024 * 1024;

    /// Deepest nesting of arrays and objects that serde_json reads back
    /// (its recursion limit): parsing refuses deeper text, and a
    /// [`PayloadWriter`] refuses to write it.
    pub const MAX_DEPTH: usize = 127;

    /// Parses JSON text into its canonical form.
    pub fn parse(text: &[u8]) -> Result<Payload, PayloadError> {
        Self::parse_checked(text, std::str::from_utf8(text).ok())
    }

    /// Parses JSON text given as a string (already UTF-8, so the canonical
    /// scan does not check it again).
    pub fn parse_str(text: &str) -> Result<Payload, PayloadError> {
        Self::parse_checked(text.as_bytes(), Some(text))
    }

    /// Parses JSON text given as an owned string: text that is already
    /// canonical becomes the payload as it is, checked but not parsed again
    /// or copied out (its buffer is kept, shrunk to the text's length,
    /// which an allocator may do in place); any other text is parsed as
    /// [`Payload::parse_str`] parses it.
    ///
    /// ```
    /// use baton_run::Payload;
    ///
    /// let kept = Payload::parse_string(r#"{"a":1,"b":[true]}"#.to_owned())?;
    /// assert_eq!(kept.as_str(), r#"{"a":1,"b":[true]}"#);
    /// let sorted = Payload::parse_string(r#"{ "b": [true], "a": 1 }"#.to_owned())?;
    /// assert_eq!(sorted, kept);
    /// # Ok::<(), baton_run::PayloadError>(())
    /// ```
    pub fn parse_string(text: String) -> Result<Payload, PayloadError> {
        match canonical_depth(&text) {
            Some(depth) => Self::from_canonical_at(text.into_boxed_str(), Some(depth)),
            None => Self::parse_str(&text),
        }
    }

    /// Parses `text`, which is `utf8` when that is given.
    fn parse_checked(text: &[u8], utf8: Option<&str>) -> Result<Payload, PayloadError> {
        if text.len() > Self::MAX_BYTES.saturating_mul(4) {
            return Err(PayloadError::TooLarge {
                size: text.len(),
                limit: Self::MAX_BYTES,
            });
        }
        if let Some(text) = utf8
            && let Some(depth) = canonical_depth(text)
        {
            return Self::from_canonical_at(text.into(), Some(depth));
        }
        let mut deserializer = serde_json::Deserializer::from_slice(text);
        let canonical = StrictText::read(&mut deserializer).map_err(classify_parse_error)?;
        deserializer.end().map_err(classify_parse_error)?;
        Self::from_canonical_text(canonical)
    }

    /// Canonicalizes a JSON value. `serde_json::Map` keeps keys sorted, so
    /// serializing the value yields the canonical bytes directly.
    pub fn from_value(value: &Value) -> Result<Payload, PayloadError> {
        let raw = serde_json::value::to_raw_value(value).map_err(|error| PayloadError::Encode {
            message: error.to_string(),
        })?;
        Self::from_canonical(raw.into())
    }

    /// A payload of text this module wrote canonically.
    fn from_canonical_text(text: String) -> Result<Payload, PayloadError> {
        Self::from_canonical(text.into_boxed_str())
    }

    /// Keeps text that is canonical JSON by construction (written by
    /// serde_json from a value, by this module's canonical writers, or
    /// checked by the canonical scanner): parsing it again would only cost.
    fn from_canonical(text: Box<str>) -> Result<Payload, PayloadError> {
        Self::from_canonical_at(text, None)
    }

    /// [`Payload::from_canonical`] of text whose nesting depth is known
    /// where it was checked or written (set in place: a `OnceLock` set
    /// after the fact costs a trip through its `Once`).
    fn from_canonical_at(text: Box<str>, depth: Option<usize>) -> Result<Payload, PayloadError> {
        let size = text.len();
        if size > Self::MAX_BYTES {
            return Err(PayloadError::TooLarge {
                size,
                limit: Self::MAX_BYTES,
            });
        }
        Ok(Payload(Arc::new(Inner {
            text,
            digest: OnceLock::new(),
            depth: depth.map_or_else(OnceLock::new, OnceLock::from),
            satisfies: AtomicU64::new(0),
        })))
    }

    /// Encodes a typed value canonically.
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Payload, PayloadError> {
        // One pass straight to canonical text; anything that pass cannot
        // vouch for takes the general way through a value tree.
        if let Ok(text) = crate::canonical::to_text(value) {
            return Self::from_canonical(text);
        }
        let value = serde_json::to_value(value).map_err(|error| PayloadError::Encode {
            message: error.to_string(),
        })?;
        Self::from_value(&value)
    }

    /// Decodes into a typed value, exactly as `serde_json::from_str` would
    /// decode the canonical text (the same value, the same error).
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, PayloadError> {
        // A reader made for canonical text answers first; whatever it does
        // not answer for (floats, byte strings, any error) is serde_json's.
        if let Some(value) = read::decode(self.as_str()) {
            return Ok(value);
        }
        serde_json::from_str(self.as_str()).map_err(|error| PayloadError::Decode {
            message: error.to_string(),
        })
    }

    /// The JSON `null` payload.
    pub fn null() -> Payload {
        Self::from_canonical("null".into()).expect("null is small")
    }

    /// The JSON string of an id's text, which needs no escape: as
    /// `Payload::encode(text)` writes it, quoted by the canonical writer's
    /// own helper for ids, without serde.
    pub(crate) fn plain_string(text: &str) -> Payload {
        let mut quoted = String::new();
        crate::canonical::quoted(&mut quoted, text);
        Self::from_canonical_at(quoted.into_boxed_str(), Some(0)).expect("an id's text is small")
    }

    /// The canonical JSON text.
    pub fn as_str(&self) -> &str {
        &self.0.text
    }

    /// The canonical bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.as_str().as_bytes()
    }

    /// Size of the canonical encoding in bytes.
    pub fn len(&self) -> usize {
        self.as_str().len()
    }

    /// Never true: the smallest payload is a one-byte JSON number. Present so
    /// `len` has its customary companion.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The payload as a `serde_json::Value`.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.as_str()).expect("canonical payload text is valid JSON")
    }

    /// Whether this is JSON `null`.
    pub fn is_null(&self) -> bool {
        self.as_str() == "null"
    }

    /// blake3 digest of the canonical bytes (computed once).
    pub fn digest(&self) -> Digest {
        *self
            .0
            .digest
            .get_or_init(|| Digest::of(Purpose::Payload, self.as_bytes()))
    }

    /// Whether the digest was computed (for tests of what is hashed).
    #[cfg(test)]
    pub(crate) fn digest_known(&self) -> bool {
        self.0.digest.get().is_some()
    }

    /// Whether this payload was found to satisfy the schema marked `mark`.
    pub(crate) fn satisfies(&self, mark: SchemaMark) -> bool {
        self.0.satisfies.load(Ordering::Relaxed) == mark.0
    }

    /// Notes that this payload satisfies the schema marked `mark`.
    pub(crate) fn note_satisfies(&self, mark: SchemaMark) {
        self.0.satisfies.store(mark.0, Ordering::Relaxed);
    }

    /// How deeply arrays and objects nest (0 for a scalar); found once, by
    /// one pass over the text, unless known where the payload was made.
    fn depth(&self) -> usize {
        *self.0.depth.get_or_init(|| nesting(self.as_bytes()))
    }
}

/// The nesting depth of canonical JSON text: brackets outside strings.
fn nesting(text: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &byte in text {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// How many bytes at the start of `bytes` can sit in a JSON string as they
/// are: the offset of the first quote, backslash or control character
/// (below 0x20), or the length. Eight bytes are tested at a time.
pub(crate) fn plain_run(bytes: &[u8]) -> usize {
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    const HIGH: u64 = ONES << 7;
    let special = |byte: &u8| matches!(byte, b'"' | b'\\' | 0x00..=0x1f);
    let mut at = 0;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let quote = word ^ (ONES * u64::from(b'"'));
        let backslash = word ^ (ONES * u64::from(b'\\'));
        // A byte's high bit is set where it is zero (the quote or the
        // backslash) or below 0x20; a borrow can flag a byte above a
        // flagged one, never below, so the lowest flag is exact.
        let flags = (quote.wrapping_sub(ONES) & !quote
            | backslash.wrapping_sub(ONES) & !backslash
            | word.wrapping_sub(ONES * 0x20) & !word)
            & HIGH;
        if flags != 0 {
            return at + (flags.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at + bytes[at..]
        .iter()
        .position(special)
        .unwrap_or(bytes.len() - at)
}

/// [`plain_run`] for text that may hold long strings: the first 64 bytes
/// a word at a time (most strings are keys and ids, whose end is near),
/// then whole blocks of 64 bytes, then words again.
pub(crate) fn plain_run_long(bytes: &[u8]) -> usize {
    use crate::canonical::{BLOCK, block_escapes};
    let first = plain_run(&bytes[..bytes.len().min(BLOCK)]);
    if first < BLOCK {
        return first;
    }
    let at = BLOCK
        + bytes[BLOCK..]
            .chunks_exact(BLOCK)
            .take_while(|block| !block_escapes(block))
            .count()
            * BLOCK;
    at + plain_run(&bytes[at..])
}

/// For `#[serde(default, deserialize_with = "...")]` on an optional member
/// that is either absent or holds a value: the member's value is
/// deserialized as `T` itself, so an explicit JSON `null` is refused unless
/// `T` accepts it (a [`Payload`] does: a `null` output is a present one).
pub fn deserialize_present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

/// Reads a string and hands it to `make` as it is read, borrowed when the
/// input allows (serde's `Cow<str>` and `String` always copy it first).
pub(crate) fn read_str<'de, D, T, E>(
    deserializer: D,
    make: impl FnOnce(&str) -> Result<T, E>,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    E: fmt::Display,
{
    struct Text<F>(F);

    impl<'de, T, E: fmt::Display, F: FnOnce(&str) -> Result<T, E>> serde::de::Visitor<'de> for Text<F> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }

        fn visit_str<Er: serde::de::Error>(self, text: &str) -> Result<T, Er> {
            (self.0)(text).map_err(Er::custom)
        }

        fn visit_bytes<Er: serde::de::Error>(self, bytes: &[u8]) -> Result<T, Er> {
            match std::str::from_utf8(bytes) {
                Ok(text) => self.visit_str(text),
                Err(_) => Err(Er::invalid_value(
                    serde::de::Unexpected::Bytes(bytes),
                    &self,
                )),
            }
        }
    }

    deserializer.deserialize_str(Text(make))
}

fn classify_parse_error(error: serde_json::Error) -> PayloadError {
    let message = error.to_string();
    match message.strip_prefix(DUPLICATE_PREFIX) {
        Some(rest) => PayloadError::DuplicateKey {
            key: rest
                .split(" at line ")
                .next()
                .unwrap_or(rest)
                .trim_matches('"')
                .to_owned(),
        },
        None => PayloadError::Malformed { message },
    }
}

const DUPLICATE_PREFIX: &str = "duplicate object key ";

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.as_str() == other.as_str()
    }
}

impl Eq for Payload {}

impl std::hash::Hash for Payload {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 256;
        let text = self.as_str();
        if text.len() <= SHOWN {
            write!(f, "Payload({text})")
        } else {
            let cut = (0..=SHOWN)
                .rev()
                .find(|i| text.is_char_boundary(*i))
                .unwrap_or(0);
            write!(f, "Payload({}… {} bytes)", &text[..cut], text.len())
        }
    }
}

impl fmt::Display for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Payload {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Exactly as serde_json's `RawValue` serializes: serde_json's
        // serializers write the text as it is; any other serializer sees a
        // struct holding one string.
        let mut raw = serializer.serialize_struct(RAW_VALUE_TOKEN, 1)?;
        raw.serialize_field(RAW_VALUE_TOKEN, self.as_str())?;
        raw.end()
    }
}

impl<'de> Deserialize<'de> for Payload {
    /// From serde_json (text or `Value`), the payload is taken from the raw
    /// text of the value, which is kept as is when already canonical; any
    /// other deserializer goes through a strict value tree. The raw text is
    /// asked for the way `serde_json::value::RawValue` asks for it; were
    /// serde_json to stop answering that way, the strict path would serve
    /// and only speed would be lost.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_newtype_struct(RAW_VALUE_TOKEN, PayloadVisitor)
    }
}

/// The newtype name by which serde_json's deserializers hand out a value's
/// raw text (what `RawValue` uses).
use crate::canonical::RAW_VALUE_TOKEN;

struct PayloadVisitor;

impl<'de> Visitor<'de> for PayloadVisitor {
    type Value = Payload;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    /// Any deserializer but serde_json's: a strict value tree.
    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Payload, D::Error> {
        let text = StrictText::read(deserializer)?;
        Payload::from_canonical_text(text).map_err(serde::de::Error::custom)
    }

    /// serde_json's answer: one entry, the token and the raw text.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Payload, A::Error> {
        // Key and text are read as they come, neither copied first.
        struct Token;
        impl<'de> DeserializeSeed<'de> for Token {
            type Value = bool;
            fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
                read_str(deserializer, |key| {
                    Ok::<_, std::convert::Infallible>(key == RAW_VALUE_TOKEN)
                })
            }
        }
        struct Text;
        impl<'de> DeserializeSeed<'de> for Text {
            type Value = Payload;
            fn deserialize<D: Deserializer<'de>>(
                self,
                deserializer: D,
            ) -> Result<Payload, D::Error> {
                read_str(deserializer, Payload::parse_str)
            }
        }
        if map.next_key_seed(Token)? != Some(true) {
            return Err(serde::de::Error::custom("expected serde_json's raw value"));
        }
        map.next_value_seed(Text)
    }
}

impl schemars::JsonSchema for Payload {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Payload".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::Schema::default()
    }
}

/// Deserializes any JSON value straight into its canonical text (object
/// keys sorted), rejecting duplicate object keys (serde_json alone keeps
/// the last duplicate silently).
struct StrictText<'a> {
    out: &'a mut String,
}

impl StrictText<'_> {
    /// The canonical text of whatever `deserializer` holds.
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
        let mut out = String::with_capacity(64);
        StrictText { out: &mut out }.deserialize(deserializer)?;
        Ok(out)
    }
}

impl<'de> DeserializeSeed<'de> for StrictText<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictText<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<(), E> {
        self.out.push_str(if value { "true" } else { "false" });
        Ok(())
    }

    fn visit_i64<E>(self, value: i64) -> Result<(), E> {
        self.out.push_str(itoa::Buffer::new().format(value));
        Ok(())
    }

    fn visit_u64<E>(self, value: u64) -> Result<(), E> {
        self.out.push_str(itoa::Buffer::new().format(value));
        Ok(())
    }

    /// As a `serde_json::Number` writes it; non-finite numbers are refused.
    fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<(), E> {
        if !value.is_finite() {
            return Err(E::custom("non-finite number"));
        }
        crate::canonical::push_number(self.out, |formatter, out| formatter.write_f64(out, value))
            .map_err(E::custom)
    }

    fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<(), E> {
        crate::canonical::write_str(self.out, value);
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.out.push_str("null");
        Ok(())
    }

    fn visit_none<E>(self) -> Result<(), E> {
        self.out.push_str("null");
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.out.push('[');
        let mut first = true;
        loop {
            let mark = self.out.len();
            if !first {
                self.out.push(',');
            }
            if seq
                .next_element_seed(StrictText {
                    out: &mut *self.out,
                })?
                .is_none()
            {
                self.out.truncate(mark);
                break;
            }
            first = false;
        }
        self.out.push(']');
        Ok(())
    }

    /// Writes the entries as they come, then puts them in key order if they
    /// came in another; a repeated key is an error.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.out.push('{');
        let start = self.out.len();
        let mut entries: Vec<(String, usize, usize)> = Vec::new();
        let mut in_order = true;
        while let Some(key) = map.next_key::<String>()? {
            let comma = !entries.is_empty();
            let from = self.out.len() + usize::from(comma);
            crate::canonical::write_key(self.out, &key, comma);
            map.next_value_seed(StrictText {
                out: &mut *self.out,
            })?;
            if let Some((last, _, _)) = entries.last() {
                in_order &= *last < key;
            }
            entries.push((key, from, self.out.len()));
        }
        if !in_order {
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            if let Some(pair) = entries.windows(2).find(|pair| pair[0].0 == pair[1].0) {
                return Err(serde::de::Error::custom(format_args!(
                    "{DUPLICATE_PREFIX}{:?}",
                    pair[0].0
                )));
            }
            let written = self.out.split_off(start);
            for (index, (_, from, to)) in entries.iter().enumerate() {
                if index > 0 {
                    self.out.push(',');
                }
                self.out.push_str(&written[from - start..to - start]);
            }
        }
        self.out.push('}');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The word-at-a-time scan stops where a byte-at-a-time scan does.
        #[test]
        fn plain_runs_end_where_a_byte_scan_ends(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::prelude::Just(b'"'),
                    proptest::prelude::Just(b'\\'),
                    0x00u8..0x20,
                    0x20u8..=0xff,
                    0x20u8..=0xff,
                    0x20u8..=0xff,
                    0x20u8..=0xff,
                ],
                0..200,
            ),
            start in 0usize..40,
        ) {
            let bytes = &bytes[start.min(bytes.len())..];
            let expected = bytes
                .iter()
                .position(|byte| *byte == b'"' || *byte == b'\\' || *byte < 0x20)
                .unwrap_or(bytes.len());
            proptest::prop_assert_eq!(plain_run(bytes), expected);
            proptest::prop_assert_eq!(plain_run_long(bytes), expected);
        }
    }

    #[test]
    fn plain_runs_stop_at_every_special_byte_in_every_lane() {
        for special in [b'"', b'\\', 0x00, 0x1f, 0x0a] {
            for length in (0..20).chain([63, 64, 65, 71, 127, 128, 129, 150]) {
                for at in 0..=length {
                    let mut bytes = vec![b'a'; length];
                    // Bytes just above the specials, and high bytes, around it.
                    for (index, byte) in bytes.iter_mut().enumerate() {
                        *byte = [b'a', 0x20, b'#', b']', 0x80, 0xff, b'!'][index % 7];
                    }
                    if at < length {
                        bytes[at] = special;
                    }
                    assert_eq!(plain_run(&bytes), at, "{special:#x} at {at} of {length}");
                    assert_eq!(
                        plain_run_long(&bytes),
                        at,
                        "{special:#x} at {at} of {length}"
                    );
                }
            }
        }
    }

    #[test]
    fn key_order_and_whitespace_do_not_matter() {
        let a = Payload::parse_str(r#"{ "b": 1, "a": [true, null, "x"] }"#).expect("valid");
        let b = Payload::parse_str(r#"{"a":[true,null,"x"],"b":1}"#).expect("valid");
        assert_eq!(a.as_str(), r#"{"a":[true,null,"x"],"b":1}"#);
        assert_eq!(a, b);
        assert_eq!(a.digest(), b.digest());
    }

    #[test]
    fn rejects_bad_text() {
        assert!(matches!(
            Payload::parse_str(""),
            Err(PayloadError::Malformed { .. })
        ));
        assert!(matches!(
            Payload::parse_str("{\"a\":1} trailing"),
            Err(PayloadError::Malformed { .. })
        ));
        assert_eq!(
            Payload::parse_str(r#"{"a":1,"a":2}"#),
            Err(PayloadError::DuplicateKey { key: "a".into() })
        );
        assert!(matches!(
            Payload::parse_str(r#"{"a":{"b":1,"b":1}}"#),
            Err(PayloadError::DuplicateKey { .. })
        ));
    }

    #[test]
    fn size_limit_is_enforced() {
        let big = "x".repeat(Payload::MAX_BYTES);
        assert!(matches!(
            Payload::encode(&big),
            Err(PayloadError::TooLarge { .. })
        ));
    }

    #[test]
    fn typed_round_trip() {
        let payload = Payload::encode(&vec![1u32, 2, 3]).expect("encodes");
        assert_eq!(
            payload.decode::<Vec<u32>>().expect("decodes"),
            vec![1, 2, 3]
        );
        assert!(payload.decode::<String>().is_err());
    }

    #[test]
    fn every_deserializer_yields_canonical_payloads_and_rejects_duplicates() {
        #[derive(Deserialize)]
        #[serde(tag = "kind")]
        enum Tagged {
            One { payload: Payload },
        }
        let expected = r#"{"a":{"c":2,"d":1},"b":[1,"x"]}"#;
        let text = r#"{ "b": [1, "x"], "a": {"d": 1, "c": 2} }"#;
        // serde_json text: the raw text, canonicalized.
        let from_text: Payload = serde_json::from_str(text).expect("parses");
        // A serde_json value: its text.
        let value: Value = serde_json::from_str(text).expect("parses");
        let from_value: Payload = serde_json::from_value(value).expect("converts");
        // An internally tagged enum buffers its fields: the strict tree.
        let tagged = format!(r#"{{"payload":{text},"kind":"One"}}"#);
        let Tagged::One {
            payload: from_buffer,
        } = serde_json::from_str(&tagged).expect("parses");
        for payload in [from_text, from_value, from_buffer] {
            assert_eq!(payload.as_str(), expected);
        }
        let duplicate = r#"{"a":1,"a":2}"#;
        assert!(serde_json::from_str::<Payload>(duplicate).is_err());
        let tagged = format!(r#"{{"kind":"One","payload":{duplicate}}}"#);
        assert!(serde_json::from_str::<Tagged>(&tagged).is_err());
        assert!(serde_json::from_str::<Payload>("[1,]").is_err());
    }

    #[test]
    fn serde_embeds_canonical_text() {
        let payload = Payload::parse_str(r#"{"z":1,"a":2}"#).expect("valid");
        let text = serde_json::to_string(&vec![payload.clone()]).expect("serializes");
        assert_eq!(text, r#"[{"a":2,"z":1}]"#);
        let back: Vec<Payload> = serde_json::from_str(r#"[{ "z" : 1, "a" : 2 }]"#).expect("parses");
        assert_eq!(back[0], payload);
        // Into a value tree and through the canonical encoder, as serde_json's
        // own raw values go.
        let nested = serde_json::json!({"p": payload.clone()});
        assert_eq!(nested, serde_json::json!({"p": {"a": 2, "z": 1}}));
        let wrapped = Payload::encode(&vec![payload.clone(), Payload::null()]).expect("encodes");
        assert_eq!(wrapped.as_str(), r#"[{"a":2,"z":1},null]"#);
    }

    /// The canonical scanner vouches for an integer exactly when serde_json
    /// reads it back as a 64-bit integer written the same way: at the
    /// limits, one past them, and with a sign on zero or leading zeros.
    #[test]
    fn the_scanner_takes_the_integers_serde_reads_as_written() {
        let serde_says = |text: &str| match serde_json::from_str::<Value>(text) {
            Ok(Value::Number(number)) => {
                (number.is_u64() || number.is_i64()) && number.to_string() == text
            }
            _ => false,
        };
        for text in [
            "0",
            "-0",
            "00",
            "01",
            "-01",
            "7",
            "-7",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "-9223372036854775809",
            "-18446744073709551615",
            "18446744073709551615",
            "18446744073709551616",
            "19999999999999999999",
            "99999999999999999999",
            "100000000000000000000",
            "-",
            "1.5",
            "1e3",
        ] {
            assert_eq!(is_canonical(text), serde_says(text), "{text}");
        }
        let list = "[18446744073709551615,-9223372036854775808,0]";
        assert!(is_canonical(list));
        assert!(!is_canonical("[18446744073709551616]"));
    }
}
