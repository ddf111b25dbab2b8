//! A reader of canonical payload text into typed values, for
//! [`Payload::decode`](super::Payload::decode).
//!
//! It answers exactly as `serde_json::from_str` would, or not at all: every
//! visitor sees the calls serde_json's deserializer makes for the same text
//! (the same visit methods, in the same order, with the same values), and
//! anything it does not read the way serde_json does (whitespace, floats,
//! integers outside 64 bits, escapes of surrogates, byte strings, nesting
//! near serde_json's limit, any error at all) ends the attempt with
//! [`Miss`], after which the caller asks serde_json itself. So a success is
//! serde_json's success and every error is serde_json's error, message
//! included.
//!
//! What it does better is the common case of a canonical state: strings are
//! scanned a block of 64 bytes at a time (serde_json tests 8), and numbers,
//! literals and keys are read without serde_json's whitespace and error
//! bookkeeping.

use std::fmt;

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeOwned, DeserializeSeed, Visitor};
use serde::forward_to_deserialize_any;

use crate::canonical::RAW_VALUE_TOKEN;

/// Decodes canonical `text` into `T` when this reader can vouch that
/// serde_json would decode it to the same value; `None` otherwise
/// (serde_json then decides, and reports any error).
pub(super) fn decode<T: DeserializeOwned>(text: &str) -> Option<T> {
    let mut reader = Reader {
        text,
        at: 0,
        remaining_depth: DEPTH,
        scratch: String::new(),
    };
    let value = T::deserialize(&mut reader).ok()?;
    (reader.at == text.len()).then_some(value)
}

/// The nesting this reader allows: fewer levels than serde_json's 128
/// (which counts the same containers), so it never reads a text that
/// serde_json refuses as too deep.
const DEPTH: u8 = 120;

/// The attempt is over: serde_json decides.
#[derive(Debug)]
pub(super) struct Miss;

impl fmt::Display for Miss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("left to serde_json")
    }
}

impl std::error::Error for Miss {}

impl de::Error for Miss {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Miss
    }
}

type Result<T> = std::result::Result<T, Miss>;

/// serde_json's deserializer over a number's text.
type Json<'de> = serde_json::Deserializer<serde_json::de::StrRead<'de>>;

struct Reader<'de> {
    text: &'de str,
    at: usize,
    remaining_depth: u8,
    /// Unescaped text of the last string read that held escapes.
    scratch: String,
}

/// A string read: a slice of the input when it holds no escapes,
/// otherwise the reader's scratch.
enum Text<'de> {
    Borrowed(&'de str),
    Copied,
}

impl<'de> Reader<'de> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Result<()> {
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(Miss)
        }
    }

    fn literal(&mut self, word: &str) -> Result<()> {
        if self.text[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(())
        } else {
            Err(Miss)
        }
    }

    /// Whether a container whose closing byte is `close` holds another
    /// element or entry, past the comma before it unless it is the first.
    fn another(&mut self, close: u8, first: &mut bool) -> Result<bool> {
        if self.peek() == Some(close) {
            return Ok(false);
        }
        if !std::mem::take(first) {
            self.eat(b',')?;
        }
        Ok(true)
    }

    /// Enters a container, within the depth allowed.
    fn enter(&mut self) -> Result<()> {
        self.remaining_depth = self.remaining_depth.checked_sub(1).ok_or(Miss)?;
        Ok(())
    }

    fn leave(&mut self) {
        self.remaining_depth += 1;
    }

    /// Reads the string that starts at the current quote, unescaping it
    /// into the scratch when it holds escapes, as serde_json's `parse_str`.
    fn string(&mut self) -> Result<Text<'de>> {
        self.eat(b'"')?;
        let bytes = self.text.as_bytes();
        let start = self.at;
        let mut at = start + super::plain_run_long(&bytes[start..]);
        if bytes.get(at) == Some(&b'"') {
            self.at = at + 1;
            return Ok(Text::Borrowed(&self.text[start..at]));
        }
        self.scratch.clear();
        self.scratch.push_str(&self.text[start..at]);
        loop {
            match bytes.get(at) {
                Some(b'"') => {
                    self.at = at + 1;
                    return Ok(Text::Copied);
                }
                Some(b'\\') => {
                    let (ch, width) = unescape(&bytes[at + 1..]).ok_or(Miss)?;
                    self.scratch.push(ch);
                    at += 1 + width;
                }
                // A control character, or the end of the text.
                _ => return Err(Miss),
            }
            let run = super::plain_run_long(&bytes[at..]);
            self.scratch.push_str(&self.text[at..at + run]);
            at += run;
        }
    }

    fn visit_string<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        match self.string()? {
            Text::Borrowed(text) => visitor.visit_borrowed_str(text),
            Text::Copied => visitor.visit_str(&self.scratch),
        }
    }

    /// The end of the number that starts here: the bytes a JSON number can
    /// hold (serde_json judges whether they are one).
    fn number_end(&self) -> usize {
        let bytes = self.text.as_bytes();
        self.at
            + bytes[self.at..]
                .iter()
                .position(|byte| !matches!(byte, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                .unwrap_or(bytes.len() - self.at)
    }

    /// A number at the current position, visited as serde_json's
    /// `deserialize_number` visits it: a non-negative integer that fits 64
    /// bits as `u64`, a negative one that fits as `i64`. Anything else
    /// (floats, longer integers, forms serde_json refuses) is handed to
    /// serde_json over the number's own text with `forward`.
    fn number<V: Visitor<'de>>(
        &mut self,
        visitor: V,
        forward: impl FnOnce(&mut Json<'de>, V) -> serde_json::Result<V::Value>,
    ) -> Result<V::Value> {
        let end = self.number_end();
        let digits = &self.text.as_bytes()[self.at..end];
        let value = match digits.split_first() {
            Some((b'-', magnitude)) => match integer(magnitude) {
                Some(magnitude @ 1..=0x8000_0000_0000_0000) => {
                    visitor.visit_i64((magnitude as i64).wrapping_neg())
                }
                _ => forward_number(&self.text[self.at..end], visitor, forward),
            },
            Some((b'0'..=b'9', _)) => match integer(digits) {
                Some(value) => visitor.visit_u64(value),
                None => forward_number(&self.text[self.at..end], visitor, forward),
            },
            _ => Err(Miss),
        }?;
        self.at = end;
        Ok(value)
    }

    /// A number at the current position handed whole to serde_json with
    /// `forward`.
    fn forwarded<V: Visitor<'de>>(
        &mut self,
        visitor: V,
        forward: impl FnOnce(&mut Json<'de>, V) -> serde_json::Result<V::Value>,
    ) -> Result<V::Value> {
        if !matches!(self.peek(), Some(b'-' | b'0'..=b'9')) {
            return Err(Miss);
        }
        let end = self.number_end();
        let value = forward_number(&self.text[self.at..end], visitor, forward)?;
        self.at = end;
        Ok(value)
    }

    /// Passes over the value that starts here and returns its text. Its
    /// containers count against the depth allowed, where serde_json's
    /// `ignore_value` counts none: a deeper value is left to serde_json.
    fn skip(&mut self) -> Result<&'de str> {
        let start = self.at;
        de::Deserializer::deserialize_any(&mut *self, de::IgnoredAny)?;
        Ok(&self.text[start..self.at])
    }

    /// A sequence's elements for `visitor`, then its closing bracket.
    fn seq<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        self.eat(b'[')?;
        self.enter()?;
        let value = visitor.visit_seq(Elements {
            reader: self,
            first: true,
        });
        self.leave();
        let value = value?;
        self.eat(b']')?;
        Ok(value)
    }

    /// An object's entries for `visitor`, then its closing brace.
    fn map<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        self.eat(b'{')?;
        self.enter()?;
        let value = visitor.visit_map(Entries {
            reader: self,
            first: true,
        });
        self.leave();
        let value = value?;
        self.eat(b'}')?;
        Ok(value)
    }
}

/// A non-negative integer in JSON's form (no leading zeros) that fits 64
/// bits.
fn integer(digits: &[u8]) -> Option<u64> {
    match digits {
        [] => None,
        [b'0'] => Some(0),
        [b'0', ..] => None,
        _ => digits.iter().try_fold(0u64, |value, digit| {
            let digit = digit.checked_sub(b'0').filter(|digit| *digit < 10)?;
            value.checked_mul(10)?.checked_add(u64::from(digit))
        }),
    }
}

/// serde_json's reading of one number's text.
fn forward_number<'de, V: Visitor<'de>>(
    text: &'de str,
    visitor: V,
    forward: impl FnOnce(&mut Json<'de>, V) -> serde_json::Result<V::Value>,
) -> Result<V::Value> {
    let mut json = serde_json::Deserializer::from_str(text);
    let value = forward(&mut json, visitor).map_err(|_| Miss)?;
    json.end().map_err(|_| Miss)?;
    Ok(value)
}

/// One escape after its backslash: the character and the bytes it took.
/// Surrogates (serde_json pairs them, or refuses them) are left to
/// serde_json.
fn unescape(bytes: &[u8]) -> Option<(char, usize)> {
    let simple = match bytes.first()? {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let hex = std::str::from_utf8(bytes.get(1..5)?).ok()?;
            if !hex.bytes().all(|byte| byte.is_ascii_hexdigit()) {
                return None;
            }
            let code = u32::from_str_radix(hex, 16).ok()?;
            return char::from_u32(code).map(|ch| (ch, 5));
        }
        _ => return None,
    };
    Some((simple, 1))
}

/// The numeric hints, each read as serde_json's `deserialize_number`
/// reads it (see [`Reader::number`]), the same hint passed on to serde_json
/// for what the reader leaves.
macro_rules! numbers {
    ($($method:ident)*) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
            self.number(visitor, |json, visitor| de::Deserializer::$method(json, visitor))
        })*
    };
}

/// The numeric hints of a key, each the integer inside its quotes (see
/// [`Key::integer`]).
macro_rules! integer_keys {
    ($($method:ident)*) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
            self.integer(visitor)
        })*
    };
}

impl<'de> de::Deserializer<'de> for &mut Reader<'de> {
    type Error = Miss;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek().ok_or(Miss)? {
            b'n' => {
                self.literal("null")?;
                visitor.visit_unit()
            }
            b't' => {
                self.literal("true")?;
                visitor.visit_bool(true)
            }
            b'f' => {
                self.literal("false")?;
                visitor.visit_bool(false)
            }
            b'"' => self.visit_string(visitor),
            b'[' => self.seq(visitor),
            b'{' => self.map(visitor),
            _ => self.number(visitor, |json, visitor| {
                de::Deserializer::deserialize_any(json, visitor)
            }),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b't') => {
                self.literal("true")?;
                visitor.visit_bool(true)
            }
            Some(b'f') => {
                self.literal("false")?;
                visitor.visit_bool(false)
            }
            _ => Err(Miss),
        }
    }

    numbers! {
        deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_f32 deserialize_f64
    }

    /// serde_json reads 128-bit integers its own way; all of them go to it.
    fn deserialize_i128<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.forwarded(visitor, |json, visitor| {
            de::Deserializer::deserialize_i128(json, visitor)
        })
    }

    fn deserialize_u128<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.forwarded(visitor, |json, visitor| {
            de::Deserializer::deserialize_u128(json, visitor)
        })
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_str(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.visit_string(visitor)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.visit_string(visitor)
    }

    /// Byte strings (serde_json reads them without checking their
    /// escapes) are left to serde_json.
    fn deserialize_bytes<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Miss)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Miss)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        if self.peek() == Some(b'n') {
            self.literal("null")?;
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.literal("null")?;
        visitor.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        self.deserialize_unit(visitor)
    }

    /// serde_json's raw values (what [`Payload`](super::Payload) and
    /// `RawValue` ask for) are handed out as serde_json hands them out: a
    /// map of one entry, the token and the value's text.
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        if name == RAW_VALUE_TOKEN {
            let raw = self.skip()?;
            visitor.visit_map(Raw { raw: Some(raw) })
        } else {
            visitor.visit_newtype_struct(self)
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.seq(visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value> {
        self.seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        visitor: V,
    ) -> Result<V::Value> {
        self.seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.map(visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        match self.peek() {
            Some(b'[') => self.seq(visitor),
            _ => self.map(visitor),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        match self.peek() {
            Some(b'"') => visitor.visit_enum(UnitVariant { reader: self }),
            Some(b'{') => {
                self.at += 1;
                self.enter()?;
                let value = visitor.visit_enum(Variant { reader: self });
                self.leave();
                let value = value?;
                self.eat(b'}')?;
                Ok(value)
            }
            _ => Err(Miss),
        }
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.visit_string(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.skip()?;
        visitor.visit_unit()
    }
}

/// An array's elements.
struct Elements<'r, 'de> {
    reader: &'r mut Reader<'de>,
    first: bool,
}

impl<'de> de::SeqAccess<'de> for Elements<'_, 'de> {
    type Error = Miss;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        if !self.reader.another(b']', &mut self.first)? {
            return Ok(None);
        }
        seed.deserialize(&mut *self.reader).map(Some)
    }
}

/// An object's entries.
struct Entries<'r, 'de> {
    reader: &'r mut Reader<'de>,
    first: bool,
}

impl<'de> de::MapAccess<'de> for Entries<'_, 'de> {
    type Error = Miss;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        if !self.reader.another(b'}', &mut self.first)? {
            return Ok(None);
        }
        if self.reader.peek() != Some(b'"') {
            return Err(Miss);
        }
        seed.deserialize(Key {
            reader: &mut *self.reader,
        })
        .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        self.reader.eat(b':')?;
        seed.deserialize(&mut *self.reader)
    }
}

/// An object's key, read as serde_json's `MapKey` reads it: a string, or
/// for integer hints the integer inside the quotes.
struct Key<'r, 'de> {
    reader: &'r mut Reader<'de>,
}

impl<'de> Key<'_, 'de> {
    /// An integer key, visited as serde_json's `deserialize_number` would
    /// visit the number inside the quotes; other numbers are left to it.
    fn integer<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let value = match self.reader.string()? {
            Text::Borrowed(text) => text.as_bytes(),
            Text::Copied => return Err(Miss),
        };
        match value.split_first() {
            Some((b'-', magnitude)) => match integer(magnitude) {
                Some(magnitude @ 1..=0x8000_0000_0000_0000) => {
                    visitor.visit_i64((magnitude as i64).wrapping_neg())
                }
                _ => Err(Miss),
            },
            _ => visitor.visit_u64(integer(value).ok_or(Miss)?),
        }
    }
}

impl<'de> de::Deserializer<'de> for Key<'_, 'de> {
    type Error = Miss;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.reader.visit_string(visitor)
    }

    integer_keys! {
        deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_f32 deserialize_f64
    }

    fn deserialize_i128<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Miss)
    }

    fn deserialize_u128<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Miss)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.reader.string()? {
            Text::Borrowed("true") => visitor.visit_bool(true),
            Text::Borrowed("false") => visitor.visit_bool(false),
            _ => Err(Miss),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        if name == RAW_VALUE_TOKEN {
            Err(Miss)
        } else {
            visitor.visit_newtype_struct(self)
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        de::Deserializer::deserialize_enum(self.reader, name, variants, visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Miss)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Miss)
    }

    forward_to_deserialize_any! {
        char str string unit unit_struct seq tuple tuple_struct map struct
        identifier ignored_any
    }
}

/// An enum written as its variant's name.
struct UnitVariant<'r, 'de> {
    reader: &'r mut Reader<'de>,
}

impl<'de> de::EnumAccess<'de> for UnitVariant<'_, 'de> {
    type Error = Miss;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self)> {
        let variant = seed.deserialize(&mut *self.reader)?;
        Ok((variant, self))
    }
}

impl<'de> de::VariantAccess<'de> for UnitVariant<'_, 'de> {
    type Error = Miss;

    fn unit_variant(self) -> Result<()> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, _: T) -> Result<T::Value> {
        Err(Miss)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value> {
        Err(Miss)
    }

    fn struct_variant<V: Visitor<'de>>(self, _: &'static [&'static str], _: V) -> Result<V::Value> {
        Err(Miss)
    }
}

/// An enum written as an object of one entry, its variant's name and its
/// content (the opening brace already read).
struct Variant<'r, 'de> {
    reader: &'r mut Reader<'de>,
}

impl<'de> de::EnumAccess<'de> for Variant<'_, 'de> {
    type Error = Miss;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self)> {
        if self.reader.peek() != Some(b'"') {
            return Err(Miss);
        }
        let variant = seed.deserialize(Key {
            reader: &mut *self.reader,
        })?;
        self.reader.eat(b':')?;
        Ok((variant, self))
    }
}

impl<'de> de::VariantAccess<'de> for Variant<'_, 'de> {
    type Error = Miss;

    fn unit_variant(self) -> Result<()> {
        de::Deserialize::deserialize(self.reader)
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value> {
        seed.deserialize(self.reader)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value> {
        self.reader.seq(visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        de::Deserializer::deserialize_struct(self.reader, "", fields, visitor)
    }
}

/// A raw value as serde_json hands it out: one entry, whose key is the
/// token and whose value is the text.
struct Raw<'de> {
    raw: Option<&'de str>,
}

impl<'de> de::MapAccess<'de> for Raw<'de> {
    type Error = Miss;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        if self.raw.is_none() {
            return Ok(None);
        }
        seed.deserialize(RawKey).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        let raw = self.raw.take().ok_or(Miss)?;
        seed.deserialize(BorrowedStrDeserializer::new(raw))
    }
}

/// The key of a raw value's one entry.
struct RawKey;

impl<'de> de::Deserializer<'de> for RawKey {
    type Error = Miss;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_borrowed_str(RAW_VALUE_TOKEN)
    }

    forward_to_deserialize_any! {
        bool u8 u16 u32 u64 u128 i8 i16 i32 i64 i128 f32 f64 char str string seq
        bytes byte_buf map struct option unit newtype_struct ignored_any
        unit_struct tuple_struct tuple enum identifier
    }
}

#[cfg(test)]
mod tests;
