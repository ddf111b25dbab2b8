//! Canonical payload text as a JSON representation the schema validator
//! reads in place.
//!
//! `jsonschema` validates any representation that implements its
//! [`Json`] trait, with the same compiled keywords and the same semantics.
//! Checking a payload through a `serde_json::Value` means building and
//! dropping a tree of maps and strings per payload, which is most of the
//! cost of checking a large input. This module owns the cheaper
//! representation: one pass over the canonical text records every value's
//! kind and byte span in a flat tape (its buffer reused per thread), and a
//! node is an index into that tape. Strings and keys without escapes are
//! borrowed from the text; escaped ones are decoded by serde_json, and
//! numbers are read from their literal by serde_json's own number parser,
//! so every accessor answers exactly what the `Value` of the same text
//! would.
//!
//! The scanner trusts that the text is one well-formed JSON value (payloads
//! always are) but never panics on anything else: text it cannot read
//! yields no tape, and the caller validates through a `Value` instead.
//!
//! Given [`Hint`]s, the elements a top-level array shares at its head with
//! an array its memoized `items` keyword accepted (see `items`) get one
//! [`Kind::Accepted`] entry each, their subtrees left out: the text is not
//! read past the common prefix's memcmp. The text validator gives hints
//! only for properties whose elements nothing but that keyword looks into,
//! and the keyword accepts such elements unchecked.

use std::borrow::Cow;
use std::cell::Cell;

use std::sync::Arc;

use jsonschema::json::{Array, Json, Node, NodeIdentity, Object, cmp};
use jsonschema::types::JsonType;
use serde_json::{Number, Value};

use super::items::AcceptedArray;

/// The JSON representation of canonical payload text.
pub(crate) struct CanonicalText;

/// A top-level member whose value, an array, may open with elements of an
/// array accepted before.
pub(crate) struct Hint<'h> {
    /// The member's name.
    pub(crate) name: &'h str,
    /// The array its memo last accepted.
    pub(crate) accepted: Arc<AcceptedArray>,
}

/// Validates the root of `text` with `validator`, or `None` when the text
/// cannot be read as one JSON value; `hints` name the top-level arrays
/// whose accepted elements the tape may hold without their subtrees.
pub(crate) fn is_valid(
    validator: &jsonschema::Validator<CanonicalText>,
    text: &str,
    hints: &[Hint<'_>],
) -> Option<bool> {
    thread_local! {
        // Reused by every validation on this thread, so a tape allocates
        // only while it grows.
        static TAPE: Cell<Vec<Entry>> = const { Cell::new(Vec::new()) };
    }
    let mut tape = TAPE.take();
    tape.clear();
    let verdict = if build(text, &mut tape, hints).is_some() {
        let doc = Doc { text, tape };
        let verdict = validator.is_valid(doc.root());
        tape = doc.tape;
        Some(verdict)
    } else {
        None
    };
    // A huge payload's tape is not worth keeping for the next small one.
    if tape.capacity() <= KEPT_ENTRIES {
        TAPE.set(tape);
    }
    verdict
}

/// Largest tape buffer a thread keeps between validations (about 1.5 MB).
const KEPT_ENTRIES: usize = 1 << 16;

/// What a tape entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Null,
    False,
    True,
    Number,
    String,
    Array,
    Object,
    /// An object member's name; its value's entry follows it.
    Key,
    /// An element of a top-level array whose text is that of an element
    /// its memoized `items` keyword accepted: its subtree is not on the
    /// tape, and nothing but that keyword reads it.
    Accepted,
}

/// One value (or member name) of the text.
#[derive(Debug, Clone, Copy)]
struct Entry {
    kind: Kind,
    /// For strings and keys: the contents contain escapes.
    escaped: bool,
    /// Strings and keys: first byte of the contents (after the quote);
    /// others: first byte of the value.
    start: u32,
    /// Strings and keys: the closing quote; others: one past the value.
    end: u32,
    /// Containers: members or elements.
    len: u32,
    /// The entry after this value's whole subtree (its next sibling).
    next: u32,
}

/// A text and its tape.
pub(crate) struct Doc<'t> {
    text: &'t str,
    tape: Vec<Entry>,
}

impl<'t> Doc<'t> {
    fn root(&self) -> TextNode<'_> {
        TextNode { doc: self, at: 0 }
    }

    fn entry(&self, at: u32) -> &Entry {
        &self.tape[at as usize]
    }

    fn contents(&self, entry: &Entry) -> &'t str {
        &self.text[entry.start as usize..entry.end as usize]
    }

    /// The decoded contents of a string or key entry.
    fn string(&self, entry: &Entry) -> Cow<'t, str> {
        if !entry.escaped {
            return Cow::Borrowed(self.contents(entry));
        }
        // The quotes around the contents are part of the text.
        let quoted = &self.text[entry.start as usize - 1..entry.end as usize + 1];
        Cow::Owned(serde_json::from_str(quoted).expect("the tape checked this string"))
    }

    fn number(&self, entry: &Entry) -> Number {
        let literal = self.contents(entry);
        plain_number(literal)
            .unwrap_or_else(|| literal.parse().expect("the tape checked this number"))
    }
}

/// Fills `tape` with the entries of `text`, a single JSON value without
/// whitespace (canonical text never has any), in document order; a
/// top-level array that `hints` name gets one [`Kind::Accepted`] entry for
/// each element it shares at its head with the array its hint accepted.
fn build(text: &str, tape: &mut Vec<Entry>, hints: &[Hint<'_>]) -> Option<()> {
    let bytes = text.as_bytes();
    u32::try_from(bytes.len()).ok()?;
    let mut open: Vec<u32> = Vec::new();
    let mut at = 0usize;
    'value: loop {
        let index = u32::try_from(tape.len()).ok()?;
        let start = at as u32;
        // The value of a member of the root object (a name entry was the
        // last one written) that a hint names.
        let accepted = if !hints.is_empty() && open.len() == 1 && bytes.get(at) == Some(&b'[') {
            tape.last()
                .filter(|name| name.kind == Kind::Key && !name.escaped)
                .and_then(|name| {
                    let name = &text[name.start as usize..name.end as usize];
                    hints.iter().find(|hint| hint.name == name)
                })
        } else {
            None
        };
        if let Some(resume) =
            accepted.and_then(|hint| accepted_head(bytes, at, &hint.accepted, tape))
        {
            open.push(index);
            at = resume;
        } else {
            let leaf = |kind, end: usize, tape: &mut Vec<Entry>| {
                tape.push(Entry {
                    kind,
                    escaped: false,
                    start,
                    end: end as u32,
                    len: 0,
                    next: index + 1,
                });
                end
            };
            match *bytes.get(at)? {
                open_byte @ (b'{' | b'[') => {
                    let (kind, close) = if open_byte == b'{' {
                        (Kind::Object, b'}')
                    } else {
                        (Kind::Array, b']')
                    };
                    tape.push(Entry {
                        kind,
                        escaped: false,
                        start,
                        end: start,
                        len: 0,
                        next: index,
                    });
                    at += 1;
                    if *bytes.get(at)? == close {
                        at += 1;
                        let entry = &mut tape[index as usize];
                        entry.end = at as u32;
                        entry.next = index + 1;
                    } else {
                        open.push(index);
                        if kind == Kind::Object {
                            at = key(bytes, at, tape)?;
                        }
                        continue 'value;
                    }
                }
                b'"' => {
                    let (end, escaped) = string(bytes, at + 1)?;
                    tape.push(Entry {
                        kind: Kind::String,
                        escaped,
                        start: start + 1,
                        end: end as u32,
                        len: 0,
                        next: index + 1,
                    });
                    if escaped {
                        serde_json::from_str::<String>(&text[at..=end]).ok()?;
                    }
                    at = end + 1;
                }
                b'n' if bytes[at..].starts_with(b"null") => at = leaf(Kind::Null, at + 4, tape),
                b't' if bytes[at..].starts_with(b"true") => at = leaf(Kind::True, at + 4, tape),
                b'f' if bytes[at..].starts_with(b"false") => at = leaf(Kind::False, at + 5, tape),
                b'-' | b'0'..=b'9' => {
                    let mut end = at + 1;
                    while bytes.get(end).is_some_and(|byte| {
                        matches!(byte, b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
                    }) {
                        end += 1;
                    }
                    // A short integer literal in JSON's form always reads;
                    // anything else is read here, so that `number` never fails.
                    if !plain_integer(&bytes[at..end]) {
                        text[at..end].parse::<Number>().ok()?;
                    }
                    at = leaf(Kind::Number, end, tape);
                }
                _ => return None,
            }
        }
        // A value just ended: it belongs to the innermost open container,
        // which either goes on or closes (and is then a value that ended).
        loop {
            let Some(&container) = open.last() else {
                return (at == bytes.len()).then_some(());
            };
            let next = u32::try_from(tape.len()).ok()?;
            let entry = &mut tape[container as usize];
            entry.len += 1;
            let object = entry.kind == Kind::Object;
            match *bytes.get(at)? {
                b',' => {
                    at += 1;
                    if object {
                        at = key(bytes, at, tape)?;
                    }
                    continue 'value;
                }
                byte @ (b'}' | b']') if (byte == b'}') == object => {
                    at += 1;
                    entry.end = at as u32;
                    entry.next = next;
                    open.pop();
                }
                _ => return None,
            }
        }
    }
}

/// Writes the array at `at` and the elements it shares at its head with
/// `accepted`, one [`Kind::Accepted`] entry each, and returns where its last
/// such element ends; none when it shares no whole element.
///
/// Up to the end of the common prefix the two texts are the same bytes, and
/// the accepted text is a well-formed array, so each element that lies
/// wholly within it with the separator after it is there a whole value,
/// ending where it ends in `accepted`: the one its text there is. What
/// follows the last of them (that separator) is read as after any element.
fn accepted_head(
    bytes: &[u8],
    at: usize,
    accepted: &AcceptedArray,
    tape: &mut Vec<Entry>,
) -> Option<usize> {
    let common = crate::payload::common_prefix(accepted.text.as_bytes(), bytes.get(at..)?);
    let count = accepted.delimited_within(common);
    let ends = accepted.ends.get(..count).filter(|ends| !ends.is_empty())?;
    let index = u32::try_from(tape.len()).ok()?;
    let start = u32::try_from(at).ok()?;
    // The element after the last accepted one is counted as it ends.
    tape.push(Entry {
        kind: Kind::Array,
        escaped: false,
        start,
        end: start,
        len: u32::try_from(count - 1).ok()?,
        next: index,
    });
    let mut from = at + 1;
    for &end in ends {
        let entry = u32::try_from(tape.len()).ok()?;
        tape.push(Entry {
            kind: Kind::Accepted,
            escaped: false,
            start: u32::try_from(from).ok()?,
            end: u32::try_from(at + end).ok()?,
            len: 0,
            next: entry + 1,
        });
        from = at + end + 1;
    }
    Some(at + ends[count - 1])
}

/// Whether `literal` is an integer in JSON's form (`-?(0|[1-9][0-9]*)`)
/// of at most 19 digits: `i64` or `u64` holds it, so it reads as a number.
fn plain_integer(literal: &[u8]) -> bool {
    let digits = literal.strip_prefix(b"-").unwrap_or(literal);
    (1..=19).contains(&digits.len())
        && digits.iter().all(u8::is_ascii_digit)
        && (digits[0] != b'0' || digits.len() == 1)
}

/// The number a [`plain_integer`] literal reads as, read by the standard
/// integer parser (most numbers a schema looks at are such, and are looked
/// at by several keywords): exactly what serde_json's number parser gives
/// for it. `None` for anything else, and for `-0`, which serde_json reads
/// as a float, and a negative literal `i64` does not hold: those are left
/// to serde_json.
fn plain_number(literal: &str) -> Option<Number> {
    if !plain_integer(literal.as_bytes()) {
        return None;
    }
    match literal.strip_prefix('-') {
        None => literal.parse::<u64>().ok().map(Number::from),
        Some("0") => None,
        Some(_) => literal.parse::<i64>().ok().map(Number::from),
    }
}

/// Reads a member name and its colon at `at`, returning where the value starts.
fn key(bytes: &[u8], at: usize, tape: &mut Vec<Entry>) -> Option<usize> {
    if *bytes.get(at)? != b'"' {
        return None;
    }
    let (end, escaped) = string(bytes, at + 1)?;
    if escaped {
        let quoted = std::str::from_utf8(&bytes[at..=end]).ok()?;
        serde_json::from_str::<String>(quoted).ok()?;
    }
    let index = u32::try_from(tape.len()).ok()?;
    tape.push(Entry {
        kind: Kind::Key,
        escaped,
        start: at as u32 + 1,
        end: end as u32,
        len: 0,
        next: index + 1,
    });
    (*bytes.get(end + 1)? == b':').then_some(end + 2)
}

/// Finds the closing quote of a string whose contents start at `at`, and
/// whether the contents have escapes.
fn string(bytes: &[u8], mut at: usize) -> Option<(usize, bool)> {
    let mut escaped = false;
    loop {
        at += crate::payload::plain_run(bytes.get(at..)?);
        match *bytes.get(at)? {
            b'"' => return Some((at, escaped)),
            // An escape's second byte is never a quote that ends the
            // string; a `\u` escape's hex digits are neither quote nor
            // backslash.
            b'\\' => {
                escaped = true;
                at += 2;
            }
            _ => at += 1,
        }
    }
}

impl Json for CanonicalText {
    type Node<'a> = TextNode<'a>;
    type PreparedKey = String;
    type StringBuffer = StringDoc;

    // A lookup scans the members, so one pass over them always beats
    // several lookups.
    const KEYS_PER_LOOKUP: usize = 1 << 16;
    const ACYCLIC: bool = true;

    fn prepare_key(key: &str) -> String {
        key.to_owned()
    }

    fn with_string_node<T>(
        buffer: &mut StringDoc,
        string: &str,
        f: impl FnOnce(TextNode<'_>) -> T,
    ) -> T {
        // The tape reads the string verbatim (not as escaped JSON): its
        // entry is marked unescaped and spans the whole text.
        let mut tape = std::mem::take(&mut buffer.tape);
        tape.clear();
        tape.push(Entry {
            kind: Kind::String,
            escaped: false,
            start: 0,
            end: u32::try_from(string.len()).expect("a property name fits the payload limit"),
            len: 0,
            next: 1,
        });
        let doc = Doc { text: string, tape };
        let result = f(doc.root());
        buffer.tape = doc.tape;
        result
    }
}

/// The buffer behind string nodes built for property names.
#[derive(Default)]
pub(crate) struct StringDoc {
    tape: Vec<Entry>,
}

/// A value in a tape.
#[derive(Clone, Copy)]
pub(crate) struct TextNode<'a> {
    doc: &'a Doc<'a>,
    at: u32,
}

impl<'a> TextNode<'a> {
    fn entry(&self) -> &'a Entry {
        self.doc.entry(self.at)
    }

    /// The node's JSON text (a slice of the payload's canonical text).
    pub(crate) fn text(&self) -> &'a str {
        let entry = self.entry();
        let (start, end) = (entry.start as usize, entry.end as usize);
        match entry.kind {
            // A string's span is its contents; its quotes are around it
            // (a property name's string node has none: it is its text).
            Kind::String | Kind::Key => start
                .checked_sub(1)
                .and_then(|open| self.doc.text.get(open..=end))
                .unwrap_or(&self.doc.text[start..end]),
            _ => &self.doc.text[start..end],
        }
    }

    /// Whether the node is an element the tape holds without its subtree,
    /// because its memoized `items` keyword accepted its text before.
    pub(crate) fn is_accepted(&self) -> bool {
        self.entry().kind == Kind::Accepted
    }

    /// The text of an object or array node (its canonical JSON, which
    /// determines its value); none for other nodes.
    pub(crate) fn container_text(&self) -> Option<&'a str> {
        matches!(self.entry().kind, Kind::Object | Kind::Array).then(|| self.text())
    }

    /// JSON equality with `expected`, numbers compared mathematically, as
    /// `jsonschema`'s `cmp::equal` does on the `Value` of this node.
    fn equals(&self, expected: &Value) -> bool {
        let entry = self.entry();
        match (entry.kind, expected) {
            (Kind::Accepted, expected) => cmp::equal(&self.to_value(), expected),
            (Kind::Null, Value::Null) => true,
            (Kind::True, Value::Bool(expected)) => *expected,
            (Kind::False, Value::Bool(expected)) => !*expected,
            (Kind::Number, Value::Number(expected)) => {
                cmp::equal_numbers(&self.doc.number(entry), expected)
            }
            (Kind::String, Value::String(expected)) => self.doc.string(entry) == expected.as_str(),
            (Kind::Array, Value::Array(expected)) => {
                entry.len as usize == expected.len()
                    && TextArray(*self)
                        .elements()
                        .zip(expected)
                        .all(|(element, expected)| element.equals(expected))
            }
            (Kind::Object, Value::Object(expected)) => {
                // Names are unique on both sides, so equal counts and every
                // member found equal mean equal objects.
                entry.len as usize == expected.len()
                    && TextObject(*self).members().all(|(name, value)| {
                        expected
                            .get(name.as_ref())
                            .is_some_and(|expected| value.equals(expected))
                    })
            }
            _ => false,
        }
    }
}

impl<'a> Node<'a, CanonicalText> for TextNode<'a> {
    type Object = TextObject<'a>;
    type Array = TextArray<'a>;
    type Number = Number;

    fn as_object(&self) -> Option<TextObject<'a>> {
        (self.entry().kind == Kind::Object).then_some(TextObject(*self))
    }

    fn as_array(&self) -> Option<TextArray<'a>> {
        (self.entry().kind == Kind::Array).then_some(TextArray(*self))
    }

    fn as_string(&self) -> Option<Cow<'a, str>> {
        let entry = self.entry();
        (entry.kind == Kind::String).then(|| self.doc.string(entry))
    }

    fn as_number(&self) -> Option<Number> {
        let entry = self.entry();
        (entry.kind == Kind::Number).then(|| self.doc.number(entry))
    }

    fn as_boolean(&self) -> Option<bool> {
        match self.entry().kind {
            Kind::True => Some(true),
            Kind::False => Some(false),
            _ => None,
        }
    }

    fn is_null(&self) -> bool {
        self.entry().kind == Kind::Null
    }

    fn is_number(&self) -> bool {
        self.entry().kind == Kind::Number
    }

    fn json_type(&self) -> JsonType {
        match self.entry().kind {
            Kind::Null => JsonType::Null,
            Kind::False | Kind::True => JsonType::Boolean,
            Kind::Number => JsonType::Number,
            Kind::String | Kind::Key => JsonType::String,
            Kind::Array => JsonType::Array,
            Kind::Object => JsonType::Object,
            // Its first byte says what it is.
            Kind::Accepted => match self.doc.text.as_bytes()[self.entry().start as usize] {
                b'{' => JsonType::Object,
                b'[' => JsonType::Array,
                b'"' => JsonType::String,
                b't' | b'f' => JsonType::Boolean,
                b'n' => JsonType::Null,
                _ => JsonType::Number,
            },
        }
    }

    fn string_length(&self) -> Option<u64> {
        self.as_string().map(|string| string.chars().count() as u64)
    }

    fn string_length_within(&self, min: u64, max: u64) -> Option<bool> {
        let entry = self.entry();
        if entry.kind != Kind::String {
            return None;
        }
        if !entry.escaped {
            // A code point takes one to four bytes, so the count lies in
            // `ceil(bytes / 4)..=bytes`.
            let bytes = u64::from(entry.end - entry.start);
            let fewest = bytes.div_ceil(4);
            if bytes < min || fewest > max {
                return Some(false);
            }
            if min <= fewest && bytes <= max {
                return Some(true);
            }
        }
        self.string_length()
            .map(|length| (min..=max).contains(&length))
    }

    fn equals_value(&self, expected: &Value) -> bool {
        self.equals(expected)
    }

    fn to_value(&self) -> Cow<'a, Value> {
        let entry = self.entry();
        Cow::Owned(match entry.kind {
            Kind::Null => Value::Null,
            Kind::False => Value::Bool(false),
            Kind::True => Value::Bool(true),
            Kind::Number => Value::Number(self.doc.number(entry)),
            Kind::String | Kind::Key => Value::String(self.doc.string(entry).into_owned()),
            Kind::Array | Kind::Object | Kind::Accepted => {
                serde_json::from_str(self.doc.contents(entry))
                    .expect("the tape spans a well-formed value")
            }
        })
    }

    fn identity(&self) -> Option<NodeIdentity> {
        Some(NodeIdentity::tagged(
            std::ptr::from_ref(self.doc) as usize,
            self.at,
        ))
    }
}

/// An object node.
pub(crate) struct TextObject<'a>(TextNode<'a>);

impl<'a> Object<'a, CanonicalText> for TextObject<'a> {
    type Node = TextNode<'a>;
    type MemberName = Cow<'a, str>;
    type MembersIter = Members<'a>;

    fn len(&self) -> usize {
        self.0.entry().len as usize
    }

    fn get(&self, key: &String) -> Option<TextNode<'a>> {
        let doc = self.0.doc;
        let mut members = self.members_raw();
        members.find_map(|(name, value)| {
            let matches = if name.escaped {
                doc.string(name) == key.as_str()
            } else {
                doc.contents(name) == key
            };
            matches.then_some(value)
        })
    }

    fn members(&self) -> Members<'a> {
        Members(self.members_raw())
    }
}

impl<'a> TextObject<'a> {
    fn members_raw(&self) -> RawMembers<'a> {
        RawMembers {
            doc: self.0.doc,
            at: self.0.at + 1,
            left: self.0.entry().len,
        }
    }
}

/// An object's name entries and value nodes, in document order.
struct RawMembers<'a> {
    doc: &'a Doc<'a>,
    at: u32,
    left: u32,
}

impl<'a> Iterator for RawMembers<'a> {
    type Item = (&'a Entry, TextNode<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let name = self.doc.entry(self.at);
        let value = TextNode {
            doc: self.doc,
            at: self.at + 1,
        };
        self.at = value.entry().next;
        Some((name, value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

/// An object's members with their decoded names.
pub(crate) struct Members<'a>(RawMembers<'a>);

impl<'a> Iterator for Members<'a> {
    type Item = (Cow<'a, str>, TextNode<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        let doc = self.0.doc;
        self.0.next().map(|(name, value)| (doc.string(name), value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

/// An array node.
pub(crate) struct TextArray<'a>(TextNode<'a>);

impl<'a> Array<'a, CanonicalText> for TextArray<'a> {
    type Node = TextNode<'a>;
    type ElementsIter = Elements<'a>;

    fn len(&self) -> usize {
        self.0.entry().len as usize
    }

    fn elements(&self) -> Elements<'a> {
        Elements {
            doc: self.0.doc,
            at: self.0.at + 1,
            left: self.0.entry().len,
        }
    }
}

/// An array's elements, in order.
pub(crate) struct Elements<'a> {
    doc: &'a Doc<'a>,
    at: u32,
    left: u32,
}

impl<'a> Iterator for Elements<'a> {
    type Item = TextNode<'a>;

    fn next(&mut self) -> Option<TextNode<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let element = TextNode {
            doc: self.doc,
            at: self.at,
        };
        self.at = element.entry().next;
        Some(element)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

#[cfg(test)]
mod tests {
    use jsonschema::json::conformance;
    use proptest::prelude::*;

    use super::*;

    fn with_root<T>(text: &str, f: impl FnOnce(TextNode<'_>) -> T) -> T {
        let mut tape = Vec::new();
        build(text, &mut tape, &[]).expect("well-formed text");
        let doc = Doc { text, tape };
        f(doc.root())
    }

    #[test]
    fn the_tape_keeps_the_validators_contract() {
        let text = serde_json::to_string(&conformance::document()).expect("encodes");
        with_root(&text, |root| {
            conformance::assert_conformance::<CanonicalText>(&root);
        });
    }

    #[test]
    fn escaped_names_and_strings_are_decoded() {
        let text = r#"{"\"a\n":"x\\y\u0001","b":"🦀é","c":[1.0,-0.0,18446744073709551616]}"#;
        with_root(text, |root| {
            let object = root.as_object().expect("object");
            let names: Vec<String> = object
                .members()
                .map(|(name, _)| name.into_owned())
                .collect();
            assert_eq!(names, ["\"a\n", "b", "c"]);
            let escaped = object
                .get(&"\"a\n".to_owned())
                .expect("found by its decoded name");
            assert_eq!(escaped.as_string().as_deref(), Some("x\\y\u{1}"));
            assert_eq!(escaped.string_length(), Some(4));
            assert_eq!(escaped.string_length_within(4, 4), Some(true));
            assert_eq!(escaped.string_length_within(5, 9), Some(false));
            let plain = object.get(&"b".to_owned()).expect("found");
            assert_eq!(plain.string_length(), Some(2));
            assert_eq!(plain.string_length_within(2, 2), Some(true));
            assert!(
                object.get(&"\\\"a\\n".to_owned()).is_none(),
                "raw text is no name"
            );
            let value = serde_json::from_str::<Value>(text).expect("json");
            assert!(root.equals_value(&value));
            assert_eq!(root.to_value().as_ref(), &value);
        });
    }

    #[test]
    fn string_nodes_hold_names_verbatim() {
        let mut buffer = StringDoc::default();
        for name in ["plain", "\"quoted\"", "back\\slash", "\n"] {
            CanonicalText::with_string_node(&mut buffer, name, |node| {
                assert_eq!(node.as_string().as_deref(), Some(name));
                assert!(node.equals_value(&Value::String(name.to_owned())));
                assert_eq!(node.to_value().as_ref(), &Value::String(name.to_owned()));
            });
        }
    }

    /// The accepted array `text` as a hint for the member `name`.
    fn hint<'h>(name: &'h str, text: &str) -> Hint<'h> {
        let elements: Vec<Value> = serde_json::from_str(text).expect("an array");
        let mut end = 0;
        let ends = elements
            .iter()
            .map(|element| {
                end += 1 + element.to_string().len();
                end
            })
            .collect();
        Hint {
            name,
            accepted: Arc::new(AcceptedArray {
                text: text.into(),
                ends,
            }),
        }
    }

    /// The texts of the accepted entries of the tape of `text`, or none
    /// when it has no tape.
    fn accepted_in(text: &str, hints: &[Hint<'_>]) -> Option<Vec<String>> {
        let mut tape = Vec::new();
        build(text, &mut tape, hints)?;
        let doc = Doc { text, tape };
        Some(
            (0..doc.tape.len() as u32)
                .map(|at| TextNode { doc: &doc, at })
                .filter(TextNode::is_accepted)
                .map(|node| node.text().to_owned())
                .collect(),
        )
    }

    /// A top-level array's head shared with the hint's accepted array gets
    /// one entry per element; what follows is read as always, and the
    /// nodes read the same values as a tape without hints.
    #[test]
    fn hinted_arrays_hold_their_accepted_head_unread() {
        let hints = [hint("l", r#"[{"a":1},[2,{"b":"c"}],"d",1,2]"#)];
        for (text, accepted) in [
            (
                r#"{"l":[{"a":1},[2,{"b":"c"}],"d",1,2],"m":[{"a":1}]}"#,
                &[r#"{"a":1}"#, r#"[2,{"b":"c"}]"#, r#""d""#, "1", "2"][..],
            ),
            // The last accepted element, a number, is read again: the
            // byte after it differs.
            (
                r#"{"l":[{"a":1},[2,{"b":"c"}],"d",1,2,3]}"#,
                &[r#"{"a":1}"#, r#"[2,{"b":"c"}]"#, r#""d""#, "1"],
            ),
            // A number is a whole element only with the byte after it.
            (
                r#"{"l":[{"a":1},[2,{"b":"c"}],"d",1,23]}"#,
                &[r#"{"a":1}"#, r#"[2,{"b":"c"}]"#, r#""d""#, "1"],
            ),
            (
                r#"{"l":[{"a":1},[2,{"b":"c"}],"d",12]}"#,
                &[r#"{"a":1}"#, r#"[2,{"b":"c"}]"#, r#""d""#],
            ),
            (r#"{"l":[{"a":1},[2,{"b":"cd"}]]}"#, &[r#"{"a":1}"#]),
            (r#"{"l":[{"a":2}]}"#, &[]),
            (r#"{"l":[]}"#, &[]),
            (r#"{"l":{"a":1}}"#, &[]),
            // Only members of the root object, by their name.
            (r#"{"m":[{"a":1},1]}"#, &[]),
            (r#"{"x":{"l":[{"a":1},1]}}"#, &[]),
            (r#"[{"l":[{"a":1},1]}]"#, &[]),
            (r#"{"\u006c":[{"a":1},1]}"#, &[]),
        ] {
            let found = accepted_in(text, &hints).expect("a tape");
            assert_eq!(found, accepted, "{text}");
            // Every other node reads as without the hint.
            let value: Value = serde_json::from_str(text).expect("JSON");
            let mut tape = Vec::new();
            build(text, &mut tape, &hints).expect("a tape");
            let doc = Doc { text, tape };
            assert!(doc.root().equals(&value), "{text}");
            assert_eq!(*doc.root().to_value(), value, "{text}");
        }
        // An element that closes itself is whole without the byte after it.
        for (accepted, text, count) in [
            (
                r#"[{"a":1},{"b":2}]"#,
                r#"{"l":[{"a":1},{"b":2},{"c":3}]}"#,
                2,
            ),
            (r#"[{"a":1},[2]]"#, r#"{"l":[{"a":1},[2],3]}"#, 2),
            (r#"[{"a":1},"b"]"#, r#"{"l":[{"a":1},"b","c"]}"#, 2),
            (r#"[{"a":1},"b"]"#, r#"{"l":[{"a":1},"bc"]}"#, 1),
            (r#"[{"a":1},true]"#, r#"{"l":[{"a":1},true,1]}"#, 1),
            (r#"[{"a":1},{"b":2}]"#, r#"{"l":[{"a":1},{"b":2}]}"#, 2),
        ] {
            let found = accepted_in(text, &[hint("l", accepted)]).expect("a tape");
            assert_eq!(found.len(), count, "{text}");
        }
        // Text that goes on badly after the shared head has no tape.
        for text in [
            r#"{"l":[{"a":1},[2,{"b":"c"}],"d",1,2"#,
            r#"{"l":[{"a":1},[2,{"b":"c"}],"d",1,2}"#,
            r#"{"l":[{"a":1},[2,{"b":"c"}],"d",1,2,]}"#,
            r#"{"l":[{"a":1},[2,{"b":"c"}],"d",1,2]"#,
        ] {
            assert_eq!(accepted_in(text, &hints), None, "{text}");
        }
    }

    #[test]
    fn text_that_is_not_one_value_has_no_tape() {
        for text in [
            "",
            "{",
            "[1,]",
            "{\"a\"}",
            "{\"a\":1,}",
            "[1]x",
            "nul",
            "-",
            "1.",
            "\"a",
            "{1:2}",
            "[1 ]",
            "[\"\\q\"]",
            "{\"\\q\":1}",
        ] {
            assert!(build(text, &mut Vec::new(), &[]).is_none(), "{text:?}");
        }
    }

    proptest! {
        /// An integer literal reads as the same number, taken by the
        /// standard parser or left to serde_json's.
        #[test]
        fn plain_numbers_are_the_numbers_serde_json_reads(
            literal in prop_oneof![
                any::<u64>().prop_map(|n| n.to_string()),
                any::<i64>().prop_map(|n| n.to_string()),
                any::<u64>().prop_map(|n| format!("-{n}")),
                "-?[0-9]{0,21}",
            ],
        ) {
            let read = literal.parse::<Number>().ok();
            match plain_number(&literal) {
                Some(number) => prop_assert_eq!(Some(number), read),
                None => prop_assert!(
                    !plain_integer(literal.as_bytes())
                        || literal == "-0"
                        || literal.parse::<i64>().is_err(),
                    "{} is plain but left to serde_json", literal
                ),
            }
        }
    }

    #[test]
    fn minus_zero_and_the_edges_of_i64_and_u64_read_as_serde_json_reads_them() {
        for literal in [
            "0",
            "-0",
            "9223372036854775807",
            "-9223372036854775808",
            "-9223372036854775809",
            "1234567890123456789",
            "-1234567890123456789",
            "9999999999999999999",
            "-9999999999999999999",
        ] {
            let text = format!("[{literal}]");
            let mut tape = Vec::new();
            build(&text, &mut tape, &[]).expect("a number");
            let doc = Doc { text: &text, tape };
            let read = doc.number(doc.entry(1));
            let expected: Number = literal.parse().expect("a number");
            assert_eq!(read, expected, "{literal}");
            assert_eq!(
                Value::Number(read).to_string(),
                Value::Number(expected).to_string(),
                "{literal}"
            );
        }
    }

    #[test]
    fn plain_integers_are_the_numbers_read_without_parsing() {
        for literal in [
            "0",
            "-0",
            "7",
            "-12",
            "1234567890123456789",
            "-9223372036854775808",
        ] {
            assert!(plain_integer(literal.as_bytes()), "{literal}");
            assert!(literal.parse::<Number>().is_ok(), "{literal}");
        }
        for literal in [
            "",
            "-",
            "01",
            "-01",
            "1.0",
            "1e2",
            "+1",
            "18446744073709551615",
            "99999999999999999999",
            "1-",
        ] {
            assert!(!plain_integer(literal.as_bytes()), "{literal}");
        }
        // Longer literals are read, and one that no number holds leaves no
        // tape.
        let huge = format!("[{}]", "9".repeat(400));
        assert!(build(&huge, &mut Vec::new(), &[]).is_none());
        assert!(build("[18446744073709551616,-0,0]", &mut Vec::new(), &[]).is_some());
    }

    proptest! {
        #[test]
        fn any_text_builds_a_tape_or_none_without_panicking(text in "[\\[\\]{}\",:0-9a-z\\\\.eE+-]{0,24}") {
            let mut tape = Vec::new();
            let built = build(&text, &mut tape, &[]).is_some();
            // Whatever the scanner accepts, serde_json reads as one value,
            // and the tape's root spans all of it.
            if built {
                let value: Value = serde_json::from_str(&text).expect("accepted text is JSON");
                let doc = Doc { text: &text, tape };
                prop_assert_eq!(doc.root().to_value().into_owned(), value);
            }
        }
    }
}
