//! A serde serializer that writes canonical JSON in one pass.
//!
//! The general way to canonical bytes is to build a `serde_json::Value`
//! (whose maps keep keys sorted) and write it out: a tree of allocations
//! per payload. This serializer writes straight into one buffer instead; an
//! object's entries are written in the order they come and, only when they
//! did not come in key order, rearranged once at the object's end.
//!
//! It produces exactly the bytes of the general way or fails: on any error
//! (an unusual map key, a 128-bit integer out of range, a malformed raw
//! value) the caller falls back to the general way, which then decides.
//!
//! The same serializer, with keys left in the order they come
//! ([`to_compact`]), writes exactly what `serde_json::to_writer` writes, or
//! leaves the value to serde_json where it cannot vouch for that (a
//! misstated length, a map key without its value, an arbitrary-precision
//! number):
//! records and tree snapshots are that text, and serde_json's own writer
//! checks every byte of every string for escapes one at a time, where this
//! one checks 64 bytes at a time (a word at a time for short strings),
//! copies raw payload text without taking a copy of it first, and copies
//! long runs in pieces ([`append`]).

use std::borrow::Cow;
use std::sync::Arc;

use serde::ser::{self, Impossible, Serialize};
use serde_json::ser::{CompactFormatter, Formatter};

mod compact;
mod escape;
mod map_key;

pub(crate) use compact::{Compact, compact_by, number, quoted};
use escape::escape_into;
#[cfg(test)]
use escape::needs_escape;
pub(crate) use escape::{BLOCK, block_escapes};
use map_key::MapKey;

type Error = serde_json::Error;

/// The newtype / struct name by which serde_json's raw values travel.
pub(crate) const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// The struct name by which serde_json's numbers travel when its
/// `arbitrary_precision` feature is on: left to serde_json, which writes
/// them as numbers.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

/// Canonical JSON text of `value`, or an error when this serializer cannot
/// vouch for the result (the caller then takes the general way).
pub(crate) fn to_text<T: Serialize + ?Sized>(value: &T) -> Result<Box<str>, Error> {
    with_scratch(|out, entries| {
        value.serialize(Canon {
            out: &mut *out,
            entries,
            keys: Keys::Sorted,
        })?;
        Ok(Box::from(out.as_str()))
    })
}

/// Exactly the bytes `serde_json::to_vec(value)` would give, in an
/// allocation of their size. Whatever this serializer cannot vouch for is
/// written by serde_json itself, whose error is the answer when it fails
/// too.
pub(crate) fn to_compact<T: Serialize + ?Sized>(value: &T) -> Result<Arc<[u8]>, Error> {
    compact_by(|compact| compact.value(value)).or_else(|_| serde_json::to_vec(value).map(Arc::from))
}

/// [`to_compact`]'s text of `value` as `write` writes it directly (the
/// snapshot and record writers), or as [`to_compact`] writes it where
/// `write` fails. Debug builds check that the two texts agree, so every
/// test that writes a value checks its direct writer.
pub(crate) fn to_compact_by<T: Serialize + ?Sized>(
    value: &T,
    write: impl FnOnce(&mut Compact<'_>) -> Result<(), Error>,
) -> Result<Arc<[u8]>, Error> {
    let text = compact_by(write).or_else(|_| to_compact(value))?;
    debug_assert_eq!(
        std::str::from_utf8(&text).ok(),
        to_compact(value)
            .ok()
            .as_deref()
            .and_then(|serde| std::str::from_utf8(serde).ok()),
        "the direct text is serde's"
    );
    Ok(text)
}

/// Appends what this serializer writes of `value` with keys as given, or
/// fails where it leaves the value to serde_json ([`to_compact`]'s first
/// way).
fn write_compact<T: Serialize + ?Sized>(
    out: &mut String,
    entries: &mut Vec<Entry>,
    value: &T,
) -> Result<(), Error> {
    value.serialize(Canon {
        out,
        entries,
        keys: Keys::AsGiven,
    })
}

/// What [`to_compact`] writes without its fallback, or why it falls back:
/// tests check that the kernel's own values never need serde_json.
#[cfg(test)]
pub(crate) fn compact_only<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, Error> {
    let mut out = String::new();
    write_compact(&mut out, &mut Vec::new(), value)?;
    Ok(out.into_bytes())
}

/// Runs `write` on an empty buffer kept per thread, for text that is then
/// copied once into an allocation of its exact size: a fresh buffer would
/// regrow (copying) several times for every payload or record. Beside it,
/// an empty stack of object entries, also kept, which every object of the
/// value shares (see [`Object`]), so that writing an object allocates
/// nothing. A nested call (a value whose serialization encodes another
/// payload) finds both busy and gets fresh ones.
fn with_scratch<R>(write: impl FnOnce(&mut String, &mut Vec<Entry>) -> R) -> R {
    thread_local! {
        static SCRATCH: std::cell::RefCell<(String, Vec<Entry>)> =
            const { std::cell::RefCell::new((String::new(), Vec::new())) };
    }
    /// The largest buffer a thread keeps between uses.
    const KEPT: usize = 1 << 20;
    /// The most entries a thread keeps room for between uses.
    const KEPT_ENTRIES: usize = 1 << 12;
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut scratch) => {
            let (buffer, entries) = &mut *scratch;
            buffer.clear();
            entries.clear();
            let result = write(buffer, entries);
            if buffer.capacity() > KEPT {
                *buffer = String::new();
            }
            // Keys kept by an entry left after a failure are dropped now.
            entries.clear();
            if entries.capacity() > KEPT_ENTRIES {
                *entries = Vec::new();
            }
            result
        }
        Err(_) => write(&mut String::with_capacity(64), &mut Vec::new()),
    })
}

fn unsupported(what: &str) -> Error {
    ser::Error::custom(format_args!("{what} is left to the general encoder"))
}

/// Writes a JSON string exactly as serde_json escapes it.
pub(crate) fn write_str(out: &mut String, text: &str) {
    out.reserve(text.len() + 2);
    out.push('"');
    escape_into(out, text);
    out.push('"');
}

/// Writes an object member's key and its colon, after a comma unless it
/// is the first: most keys are a field's name, short and with nothing to
/// escape, so room for the whole is made once.
pub(crate) fn write_key(out: &mut String, key: &str, comma: bool) {
    out.reserve(key.len() + 4);
    if comma {
        out.push(',');
    }
    out.push('"');
    escape_into(out, key);
    out.push_str("\":");
}

/// Appends a float as serde_json writes it: `write` calls serde_json's own
/// compact formatter (`ryu`). Integers are written by `itoa`, as serde_json
/// writes them.
pub(crate) fn push_number(
    out: &mut String,
    write: impl FnOnce(&mut CompactFormatter, &mut Ascii<'_>) -> std::io::Result<()>,
) -> Result<(), Error> {
    write(&mut CompactFormatter, &mut Ascii(out)).map_err(Error::io)
}

/// A `String` as the writer of serde_json's formatter, which writes
/// numbers in ASCII.
pub(crate) struct Ascii<'a>(&'a mut String);

impl std::io::Write for Ascii<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let text = std::str::from_utf8(bytes)
            .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidData, error))?;
        self.0.push_str(text);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Appends `bytes` to `out`, a long run a piece of at most [`PIECE`] bytes
/// at a time. One `memcpy` of a long run into a buffer at an odd offset
/// can be many times slower than the same bytes copied in pieces: on the
/// AMD EPYC machines this project is measured on, glibc copies a run of
/// more than a few kilobytes with `rep movsb`, which took 73 µs for 250 KB
/// written one byte past an aligned source against 4.4 µs in 2 KiB pieces
/// (and 4.4 µs aligned). A long string or payload is always written at
/// such an offset, after its quote or its key.
#[inline]
pub(crate) fn append(out: &mut String, text: &str) {
    if text.len() <= PIECE {
        out.push_str(text);
    } else {
        append_long(out, text);
    }
}

/// The longest piece [`append`] copies at once: small enough that glibc
/// copies it with vector moves.
pub(crate) const PIECE: usize = 2048;

/// [`append`] of a run longer than a piece, cut at character boundaries
/// (a character is at most four bytes, so no piece is empty).
#[cold]
fn append_long(out: &mut String, text: &str) {
    out.reserve(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let cut = rest.floor_char_boundary(PIECE);
        out.push_str(&rest[..cut]);
        rest = &rest[cut..];
    }
}

/// Escapes formatted text as it is written (for `collect_str`).
struct Escaping<'a>(&'a mut String);

impl std::fmt::Write for Escaping<'_> {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        escape_into(self.0, text);
        Ok(())
    }
}

/// The order of an object's members in the output.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// Canonical: sorted by key, a repeated key written once with its last
    /// value, as a `Value` map holds them.
    Sorted,
    /// As the value gives them, repeats and all: serde_json's own output.
    AsGiven,
}

impl Keys {
    /// Whether a container declared with `len` must refuse any element.
    /// serde_json closes a container declared empty at once, so elements
    /// that come anyway (a `Serialize` that misstates its length) follow
    /// the closing bracket in its output; as given, such a value is left
    /// to serde_json. A `Value`, which sorted keys stand for, takes them.
    fn declared_empty(self, len: Option<usize>) -> bool {
        self == Keys::AsGiven && len == Some(0)
    }
}

struct Canon<'a> {
    out: &'a mut String,
    /// The entries of the objects being written, innermost last.
    entries: &'a mut Vec<Entry>,
    keys: Keys,
}

impl<'a> ser::Serializer for Canon<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Seq<'a>;
    type SerializeTuple = Seq<'a>;
    type SerializeTupleStruct = Seq<'a>;
    type SerializeTupleVariant = Seq<'a>;
    type SerializeMap = Object<'a>;
    type SerializeStruct = Object<'a>;
    type SerializeStructVariant = Object<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.out.push_str(if v { "true" } else { "false" });
        Ok(())
    }

    fn serialize_i8(self, v: i8) -> Result<(), Error> {
        self.serialize_i64(i64::from(v))
    }

    fn serialize_i16(self, v: i16) -> Result<(), Error> {
        self.serialize_i64(i64::from(v))
    }

    fn serialize_i32(self, v: i32) -> Result<(), Error> {
        self.serialize_i64(i64::from(v))
    }

    fn serialize_i64(self, v: i64) -> Result<(), Error> {
        self.out.push_str(itoa::Buffer::new().format(v));
        Ok(())
    }

    fn serialize_i128(self, v: i128) -> Result<(), Error> {
        match (i64::try_from(v), u64::try_from(v)) {
            (Ok(v), _) => self.serialize_i64(v),
            (_, Ok(v)) => self.serialize_u64(v),
            _ => Err(unsupported("a 128-bit integer")),
        }
    }

    fn serialize_u8(self, v: u8) -> Result<(), Error> {
        self.serialize_u64(u64::from(v))
    }

    fn serialize_u16(self, v: u16) -> Result<(), Error> {
        self.serialize_u64(u64::from(v))
    }

    fn serialize_u32(self, v: u32) -> Result<(), Error> {
        self.serialize_u64(u64::from(v))
    }

    fn serialize_u64(self, v: u64) -> Result<(), Error> {
        self.out.push_str(itoa::Buffer::new().format(v));
        Ok(())
    }

    fn serialize_u128(self, v: u128) -> Result<(), Error> {
        match u64::try_from(v) {
            Ok(v) => self.serialize_u64(v),
            Err(_) => Err(unsupported("a 128-bit integer")),
        }
    }

    /// As a `Value` holds it: widened to f64; as serde_json writes it
    /// (its own shortest form) when keys are as given.
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        match self.keys {
            Keys::Sorted => self.serialize_f64(f64::from(v)),
            Keys::AsGiven if v.is_finite() => {
                push_number(self.out, |formatter, out| formatter.write_f32(out, v))
            }
            Keys::AsGiven => self.serialize_unit(),
        }
    }

    /// Non-finite numbers are `null`, as in a `Value`.
    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        if v.is_finite() {
            push_number(self.out, |formatter, out| formatter.write_f64(out, v))
        } else {
            self.serialize_unit()
        }
    }

    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }

    fn serialize_str(self, v: &str) -> Result<(), Error> {
        write_str(self.out, v);
        Ok(())
    }

    fn collect_str<T: std::fmt::Display + ?Sized>(self, value: &T) -> Result<(), Error> {
        use std::fmt::Write as _;
        self.out.push('"');
        write!(Escaping(&mut *self.out), "{value}")
            .map_err(|_| unsupported("a failing Display"))?;
        self.out.push('"');
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        let mut seq = ser::Serializer::serialize_seq(self, Some(v.len()))?;
        for byte in v {
            ser::SerializeSeq::serialize_element(&mut seq, byte)?;
        }
        ser::SerializeSeq::end(seq)
    }

    fn serialize_none(self) -> Result<(), Error> {
        self.serialize_unit()
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), Error> {
        self.out.push_str("null");
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.serialize_str(variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.out.push('{');
        write_str(self.out, variant);
        self.out.push(':');
        value.serialize(Canon {
            out: &mut *self.out,
            entries: &mut *self.entries,
            keys: self.keys,
        })?;
        self.out.push('}');
        Ok(())
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Seq<'a>, Error> {
        self.out.push('[');
        Ok(Seq {
            out: self.out,
            entries: self.entries,
            keys: self.keys,
            first: true,
            variant: false,
            declared_empty: self.keys.declared_empty(len),
        })
    }

    fn serialize_tuple(self, len: usize) -> Result<Seq<'a>, Error> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<Seq<'a>, Error> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Seq<'a>, Error> {
        self.out.push('{');
        write_str(self.out, variant);
        self.out.push_str(":[");
        Ok(Seq {
            out: self.out,
            entries: self.entries,
            keys: self.keys,
            first: true,
            variant: true,
            declared_empty: self.keys.declared_empty(Some(len)),
        })
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Object<'a>, Error> {
        Ok(Object::open(self, len, false))
    }

    fn serialize_struct(self, name: &'static str, len: usize) -> Result<Object<'a>, Error> {
        if name == RAW_VALUE_TOKEN {
            return Ok(Object::raw(self));
        }
        if name == NUMBER_TOKEN {
            return Err(unsupported("an arbitrary-precision number"));
        }
        Ok(Object::open(self, Some(len), false))
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Object<'a>, Error> {
        self.out.push('{');
        write_str(self.out, variant);
        self.out.push(':');
        Ok(Object::open(self, Some(len), true))
    }
}

struct Seq<'a> {
    out: &'a mut String,
    entries: &'a mut Vec<Entry>,
    keys: Keys,
    first: bool,
    /// A tuple variant: `{"variant":[...]}`.
    variant: bool,
    /// Declared empty while keys are as given ([`Keys::declared_empty`]).
    declared_empty: bool,
}

impl Seq<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        value.serialize(Canon {
            out: &mut *self.out,
            entries: &mut *self.entries,
            keys: self.keys,
        })
    }

    fn close(self) -> Result<(), Error> {
        if self.declared_empty && !self.first {
            return Err(unsupported("elements after a declared length of zero"));
        }
        self.out.push(']');
        if self.variant {
            self.out.push('}');
        }
        Ok(())
    }
}

impl ser::SerializeSeq for Seq<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

impl ser::SerializeTuple for Seq<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

impl ser::SerializeTupleStruct for Seq<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

impl ser::SerializeTupleVariant for Seq<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

/// One written `"key":value` of an object and where its text lies.
struct Entry {
    key: Cow<'static, str>,
    start: usize,
    end: usize,
}

/// An object being written. With sorted keys, each entry is noted (its key
/// and where its text lies) on the stack of entries the whole value shares:
/// an object's entries lie above `base` while it is open, the entries of an
/// object inside one of its values lie above those and are gone again when
/// that object closes, so no object allocates a list of its own.
struct Object<'a> {
    out: &'a mut String,
    entries: &'a mut Vec<Entry>,
    keys: Keys,
    /// Where the entries begin (just after `{`; for a raw value, where its
    /// text begins).
    start: usize,
    /// Where this object's entries begin on the stack.
    base: usize,
    /// How many entries were written.
    written: usize,
    /// A map's key, between `serialize_key` and `serialize_value`.
    key: Option<Cow<'static, str>>,
    /// A struct variant: `{"variant":{...}}`.
    variant: bool,
    /// serde_json's raw value: one field holding the JSON text, which is
    /// written in place of the object.
    raw: bool,
    /// Declared empty while keys are as given ([`Keys::declared_empty`]).
    declared_empty: bool,
}

impl<'a> Object<'a> {
    fn open(canon: Canon<'a>, len: Option<usize>, variant: bool) -> Object<'a> {
        canon.out.push('{');
        let start = canon.out.len();
        let base = canon.entries.len();
        Object {
            out: canon.out,
            entries: canon.entries,
            keys: canon.keys,
            start,
            base,
            written: 0,
            key: None,
            variant,
            raw: false,
            declared_empty: canon.keys.declared_empty(len),
        }
    }

    /// serde_json's raw value, whose one field is its JSON text.
    fn raw(canon: Canon<'a>) -> Object<'a> {
        let start = canon.out.len();
        let base = canon.entries.len();
        Object {
            out: canon.out,
            entries: canon.entries,
            keys: canon.keys,
            start,
            base,
            written: 0,
            key: None,
            variant: false,
            raw: true,
            declared_empty: false,
        }
    }

    fn entry<T: Serialize + ?Sized>(
        &mut self,
        key: Cow<'static, str>,
        value: &T,
    ) -> Result<(), Error> {
        let start = self.out.len() + usize::from(self.written > 0);
        write_key(self.out, &key, self.written > 0);
        self.written += 1;
        let mark = self.entries.len();
        let written = value.serialize(Canon {
            out: &mut *self.out,
            entries: &mut *self.entries,
            keys: self.keys,
        });
        if let Err(error) = written {
            // An object inside the value that failed before it closed left
            // its entries: gone, so this object's stay its own.
            self.entries.truncate(mark);
            return Err(error);
        }
        if self.keys == Keys::Sorted {
            self.entries.push(Entry {
                key,
                start,
                end: self.out.len(),
            });
        }
        Ok(())
    }

    /// Closes the object; with sorted keys, putting its entries in key
    /// order first if they came in another (a repeated map key keeps its
    /// last value, as a `Value` map does).
    fn close(self) -> Result<(), Error> {
        if self.raw {
            return self.close_raw();
        }
        if self.key.is_some() || (self.declared_empty && self.written > 0) {
            return Err(unsupported(
                "a map key without a value, or members after a declared length of zero",
            ));
        }
        let entries = &mut self.entries[self.base..];
        let in_order = entries.windows(2).all(|w| w[0].key < w[1].key);
        if !in_order {
            let written = self.out.split_off(self.start);
            // Stable: equal keys stay in arrival order, so the last wins.
            entries.sort_by(|a, b| a.key.cmp(&b.key));
            let mut first = true;
            for (index, entry) in entries.iter().enumerate() {
                if entries
                    .get(index + 1)
                    .is_some_and(|next| next.key == entry.key)
                {
                    continue;
                }
                if !first {
                    self.out.push(',');
                }
                first = false;
                append(
                    self.out,
                    &written[entry.start - self.start..entry.end - self.start],
                );
            }
        }
        self.entries.truncate(self.base);
        self.out.push('}');
        if self.variant {
            self.out.push('}');
        }
        Ok(())
    }

    /// A raw value: its text was written in place of the object.
    fn close_raw(self) -> Result<(), Error> {
        if self.written == 1 {
            Ok(())
        } else {
            Err(unsupported("a malformed raw value"))
        }
    }
}

impl ser::SerializeMap for Object<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        if self.key.is_some() {
            return Err(unsupported("a map key after a key without a value"));
        }
        self.key = Some(key.serialize(MapKey)?);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let key = self
            .key
            .take()
            .ok_or_else(|| unsupported("a map value without a key"))?;
        self.entry(key, value)
    }

    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

impl ser::SerializeStruct for Object<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        if self.raw {
            if key != RAW_VALUE_TOKEN || self.written > 0 {
                return Err(unsupported("a malformed raw value"));
            }
            self.written = 1;
            return value.serialize(RawText {
                out: &mut *self.out,
                keys: self.keys,
            });
        }
        self.entry(Cow::Borrowed(key), value)
    }

    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

impl ser::SerializeStructVariant for Object<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.entry(Cow::Borrowed(key), value)
    }

    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

/// The one field of a raw value: its JSON text, written where the value
/// goes. With sorted keys, text that is not canonical already is
/// canonicalized; as given, it is written as it is, as serde_json does.
struct RawText<'a> {
    out: &'a mut String,
    keys: Keys,
}

/// Serializer methods that refuse their value: anything but the one kind a
/// serializer takes is left to the general way. Scalars first (one value,
/// no result type), then the rest with their arguments and result types.
macro_rules! refuse {
    (
        $what:literal;
        $($scalar:ident($value:ty)),* ;
        $($method:ident $(<$generic:ident>)? ($($arg:ty),*) -> $ret:ty;)*
    ) => {
        $(fn $scalar(self, _: $value) -> Result<(), Error> {
            Err(unsupported($what))
        })*
        $(fn $method $(<$generic: Serialize + ?Sized>)? (
            self,
            $(_: $arg),*
        ) -> Result<$ret, Error> {
            Err(unsupported($what))
        })*
    };
}

impl ser::Serializer for RawText<'_> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Impossible<(), Error>;
    type SerializeTuple = Impossible<(), Error>;
    type SerializeTupleStruct = Impossible<(), Error>;
    type SerializeTupleVariant = Impossible<(), Error>;
    type SerializeMap = Impossible<(), Error>;
    type SerializeStruct = Impossible<(), Error>;
    type SerializeStructVariant = Impossible<(), Error>;

    fn serialize_str(self, text: &str) -> Result<(), Error> {
        if self.keys == Keys::AsGiven || crate::payload::is_canonical(text) {
            append(self.out, text);
        } else {
            let payload = crate::Payload::parse_str(text)
                .map_err(|error| <Error as ser::Error>::custom(error.to_string()))?;
            append(self.out, payload.as_str());
        }
        Ok(())
    }

    refuse! { "a raw value that is not text";
        serialize_bool(bool), serialize_char(char), serialize_bytes(&[u8]),
        serialize_i8(i8), serialize_i16(i16), serialize_i32(i32), serialize_i64(i64),
        serialize_u8(u8), serialize_u16(u16), serialize_u32(u32), serialize_u64(u64),
        serialize_f32(f32), serialize_f64(f64), serialize_unit_struct(&'static str);
        serialize_none() -> ();
        serialize_unit() -> ();
        serialize_unit_variant(&'static str, u32, &'static str) -> ();
        serialize_seq(Option<usize>) -> Self::SerializeSeq;
        serialize_tuple(usize) -> Self::SerializeTuple;
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct;
        serialize_tuple_variant(&'static str, u32, &'static str, usize)
            -> Self::SerializeTupleVariant;
        serialize_map(Option<usize>) -> Self::SerializeMap;
        serialize_struct(&'static str, usize) -> Self::SerializeStruct;
        serialize_struct_variant(&'static str, u32, &'static str, usize)
            -> Self::SerializeStructVariant;
        serialize_some<T>(&T) -> ();
        serialize_newtype_struct<T>(&'static str, &T) -> ();
        serialize_newtype_variant<T>(&'static str, u32, &'static str, &T) -> ();
    }
}

#[cfg(test)]
mod tests;
