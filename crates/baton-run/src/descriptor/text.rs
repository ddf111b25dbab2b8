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
        let head = hinted(text, at, tape, open.len(), hints)
            .and_then(|hint| accepted_head(bytes, at, &hint.accepted, tape));
        at = if let Some(resume) = head {
            // The array stays open after its last accepted element.
            open.push(index);
            resume
        } else {
            match value(text, at, tape)? {
                Read::Ended(end) => end,
                Read::Opened(first) => {
                    open.push(index);
                    at = first;
                    continue 'value;
                }
            }
        };
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

/// The hint naming the array at `at`, when it is the value of a member of
/// the root object (`open` containers deep: one), whose name entry was the
/// last one written.
fn hinted<'h>(
    text: &str,
    at: usize,
    tape: &[Entry],
    open: usize,
    hints: &'h [Hint<'h>],
) -> Option<&'h Hint<'h>> {
    if hints.is_empty() || open != 1 || text.as_bytes().get(at) != Some(&b'[') {
        return None;
    }
    let name = tape
        .last()
        .filter(|name| name.kind == Kind::Key && !name.escaped)?;
    let name = &text[name.start as usize..name.end as usize];
    hints.iter().find(|hint| hint.name == name)
}

/// What [`value`] read at a place.
enum Read {
    /// A whole value, ending where it says.
    Ended(usize),
    /// A container with members, whose first member begins where it says
    /// (an object's first name read): the caller keeps it open.
    Opened(usize),
}

/// Writes the entry of the value at `at` (for a container with members,
/// only the container's own entry and, for an object, its first name).
fn value(text: &str, at: usize, tape: &mut Vec<Entry>) -> Option<Read> {
    let bytes = text.as_bytes();
    let index = u32::try_from(tape.len()).ok()?;
    let start = at as u32;
    let leaf = |kind, end: usize, tape: &mut Vec<Entry>| {
        tape.push(Entry {
            kind,
            escaped: false,
            start,
            end: end as u32,
            len: 0,
            next: index + 1,
        });
        Read::Ended(end)
    };
    Some(match *bytes.get(at)? {
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
            let first = at + 1;
            if *bytes.get(first)? == close {
                let entry = &mut tape[index as usize];
                entry.end = (first + 1) as u32;
                entry.next = index + 1;
                Read::Ended(first + 1)
            } else if kind == Kind::Object {
                Read::Opened(key(bytes, first, tape)?)
            } else {
                Read::Opened(first)
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
            Read::Ended(end + 1)
        }
        b'n' if bytes[at..].starts_with(b"null") => leaf(Kind::Null, at + 4, tape),
        b't' if bytes[at..].starts_with(b"true") => leaf(Kind::True, at + 4, tape),
        b'f' if bytes[at..].starts_with(b"false") => leaf(Kind::False, at + 5, tape),
        b'-' | b'0'..=b'9' => {
            let mut end = at + 1;
            while bytes
                .get(end)
                .is_some_and(|byte| matches!(byte, b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-'))
            {
                end += 1;
            }
            // A short integer literal in JSON's form always reads;
            // anything else is read here, so that `number` never fails.
            if !plain_integer(&bytes[at..end]) {
                text[at..end].parse::<Number>().ok()?;
            }
            leaf(Kind::Number, end, tape)
        }
        _ => return None,
    })
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
mod tests;
