//! The canonical reader against serde_json: where it answers, it answers
//! what serde_json answers, and it answers for what canonical states hold.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::decode;
use crate::payload::Payload;
use crate::test_json::{text, value};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Shape {
    Unit,
    Newtype(u64),
    Tuple(i8, String),
    Struct { flag: bool, ratio: Option<f64> },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Tagged {
    Plain,
    Sized { size: u32 },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", content = "c")]
enum Adjacent {
    Empty,
    Number(i32),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum Either {
    Count(u16),
    Word(String),
    Pair { left: i64, right: Option<bool> },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Id(String);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Marker;

/// Every shape a program's state is likely to hold.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Everything {
    small: u8,
    signed: i16,
    medium: u32,
    wide: i64,
    unsigned: u64,
    single: f32,
    double: f64,
    flag: bool,
    letter: char,
    text: String,
    maybe_text: Option<String>,
    maybe_number: Option<u32>,
    list: Vec<i32>,
    pair: (u8, String),
    by_name: BTreeMap<String, u64>,
    by_number: BTreeMap<u32, String>,
    by_signed: BTreeMap<i64, bool>,
    shapes: Vec<Shape>,
    tagged: Tagged,
    adjacent: Adjacent,
    either: Vec<Either>,
    id: Id,
    marker: Marker,
    huge: i128,
    huger: u128,
    payload: Payload,
    #[serde(default)]
    defaulted: Vec<String>,
    #[serde(rename = "renamed-field")]
    renamed: Option<Box<Shape>>,
    loose: Loose,
}

/// Members kept by name and the rest kept as they are (serde buffers the
/// whole object first).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Loose {
    known: u8,
    #[serde(flatten)]
    rest: BTreeMap<String, Value>,
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        Just(Shape::Unit),
        any::<u64>().prop_map(Shape::Newtype),
        (any::<i8>(), text()).prop_map(|(a, b)| Shape::Tuple(a, b)),
        (
            any::<bool>(),
            proptest::option::of(any::<f64>().prop_filter("finite", |x| x.is_finite()))
        )
            .prop_map(|(flag, ratio)| Shape::Struct { flag, ratio }),
    ]
}

fn either() -> impl Strategy<Value = Either> {
    prop_oneof![
        any::<u16>().prop_map(Either::Count),
        text().prop_map(Either::Word),
        (any::<i64>(), proptest::option::of(any::<bool>()))
            .prop_map(|(left, right)| Either::Pair { left, right }),
    ]
}

fn everything() -> impl Strategy<Value = Everything> {
    let numbers = (
        any::<u8>(),
        any::<i16>(),
        any::<u32>(),
        any::<i64>(),
        any::<u64>(),
        any::<f32>().prop_filter("finite", |x| x.is_finite()),
        any::<f64>().prop_filter("finite", |x| x.is_finite()),
        any::<bool>(),
        any::<char>(),
        // Payloads hold integers of 64 bits.
        any::<i64>().prop_map(i128::from),
        any::<u64>().prop_map(u128::from),
    );
    let texts = (
        text(),
        proptest::option::of(text()),
        proptest::option::of(any::<u32>()),
        proptest::collection::vec(any::<i32>(), 0..4),
        (any::<u8>(), text()),
        proptest::collection::btree_map(text(), any::<u64>(), 0..3),
        proptest::collection::btree_map(any::<u32>(), text(), 0..3),
        proptest::collection::btree_map(any::<i64>(), any::<bool>(), 0..3),
    );
    let shapes = (
        proptest::collection::vec(shape(), 0..4),
        prop_oneof![
            Just(Tagged::Plain),
            any::<u32>().prop_map(|size| Tagged::Sized { size })
        ],
        prop_oneof![
            Just(Adjacent::Empty),
            any::<i32>().prop_map(Adjacent::Number)
        ],
        proptest::collection::vec(either(), 0..3),
        text(),
        value(),
        proptest::collection::vec(text(), 0..2),
        proptest::option::of(shape()),
        (
            any::<u8>(),
            proptest::collection::btree_map("x[a-z]{0,6}", value(), 0..3),
        ),
    );
    (numbers, texts, shapes).prop_map(|(numbers, texts, shapes)| Everything {
        small: numbers.0,
        signed: numbers.1,
        medium: numbers.2,
        wide: numbers.3,
        unsigned: numbers.4,
        single: numbers.5,
        double: numbers.6,
        flag: numbers.7,
        letter: numbers.8,
        huge: numbers.9,
        huger: numbers.10,
        text: texts.0,
        maybe_text: texts.1,
        maybe_number: texts.2,
        list: texts.3,
        pair: texts.4,
        by_name: texts.5,
        by_number: texts.6,
        by_signed: texts.7,
        shapes: shapes.0,
        tagged: shapes.1,
        adjacent: shapes.2,
        either: shapes.3,
        id: Id(shapes.4),
        marker: Marker,
        payload: Payload::from_value(&shapes.5).expect("a value is a payload"),
        defaulted: shapes.6,
        renamed: shapes.7.map(Box::new),
        loose: Loose {
            known: shapes.8.0,
            rest: shapes.8.1,
        },
    })
}

/// What serde_json answers for `text` as `T`: the value or the error's
/// message.
fn serde_jsons<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    serde_json::from_str(text).map_err(|error| error.to_string())
}

/// What `Payload::decode` answers: the value or the decode error's
/// message (serde_json's own).
fn decoded<T: serde::de::DeserializeOwned>(payload: &Payload) -> Result<T, String> {
    payload.decode().map_err(|error| match error {
        crate::payload::PayloadError::Decode { message } => message,
        other => other.to_string(),
    })
}

/// Replaces the value at a path chosen by `at` (any member or element,
/// at any depth) with `with`.
fn replace_somewhere(value: &mut Value, at: &mut usize, with: &Value) -> bool {
    if *at == 0 {
        *value = with.clone();
        return true;
    }
    *at -= 1;
    match value {
        Value::Array(items) => items
            .iter_mut()
            .any(|item| replace_somewhere(item, at, with)),
        Value::Object(members) => members
            .values_mut()
            .any(|member| replace_somewhere(member, at, with)),
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any canonical text read as a `Value` is read, and as serde_json
    /// reads it.
    #[test]
    fn values_are_read_as_serde_json_reads_them(value in value()) {
        let payload = Payload::from_value(&value).unwrap();
        let read: Value = decode(payload.as_str()).expect("canonical text is read");
        prop_assert_eq!(&read, &serde_json::from_str::<Value>(payload.as_str()).unwrap());
        prop_assert_eq!(&read, &value);
    }

    /// A typed state written canonically is read back by the reader (not
    /// left to serde_json) as serde_json reads it.
    #[test]
    fn typed_states_are_read_as_serde_json_reads_them(state in everything()) {
        let payload = Payload::encode(&state).unwrap();
        let read: Everything = decode(payload.as_str()).expect("a canonical state is read");
        prop_assert_eq!(Ok(read.clone()), serde_jsons::<Everything>(payload.as_str()));
        prop_assert_eq!(Ok(read), decoded::<Everything>(&payload));
    }

    /// With any one value of a state replaced by any other, what the
    /// reader answers is serde_json's answer, and `Payload::decode`
    /// answers serde_json's value or serde_json's error.
    #[test]
    fn a_state_with_a_value_replaced_reads_as_serde_json_reads_it(
        state in everything(),
        at in 0usize..200,
        with in value(),
    ) {
        let mut tree = Payload::encode(&state).unwrap().to_value();
        let mut at = at;
        replace_somewhere(&mut tree, &mut at, &with);
        let payload = Payload::from_value(&tree).unwrap();
        let text = payload.as_str();
        let expected = serde_jsons::<Everything>(text);
        if let Some(read) = decode::<Everything>(text) {
            prop_assert_eq!(Ok(read), expected.clone());
        }
        prop_assert_eq!(decoded::<Everything>(&payload), expected);
        // And as each of the state's parts.
        check_as::<Vec<Shape>>(text)?;
        check_as::<BTreeMap<String, Either>>(text)?;
        check_as::<BTreeMap<u64, Value>>(text)?;
        check_as::<(Tagged, Adjacent)>(text)?;
        check_as::<Option<Vec<Option<char>>>>(text)?;
    }

    /// Any canonical text read as each of several types: the reader's
    /// answers are serde_json's.
    #[test]
    fn any_text_read_as_any_type_reads_as_serde_json_reads_it(value in value()) {
        let payload = Payload::from_value(&value).unwrap();
        let text = payload.as_str();
        check_as::<Everything>(text)?;
        check_as::<Vec<Shape>>(text)?;
        check_as::<BTreeMap<String, Either>>(text)?;
        check_as::<BTreeMap<i32, Vec<f32>>>(text)?;
        check_as::<(Tagged, Adjacent, Id, Marker)>(text)?;
        check_as::<Option<Vec<Option<char>>>>(text)?;
        check_as::<Vec<(u8, i8, u16, i16, u32, i32, f32)>>(text)?;
        check_as::<Vec<i128>>(text)?;
        if let Some(raw) = decode::<Box<serde_json::value::RawValue>>(text) {
            prop_assert_eq!(raw.get(), text);
        }
        check_as::<BTreeMap<String, Payload>>(text)?;
        check_as::<serde::de::IgnoredAny>(text)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// An enum written by name or as an object of one entry holding any
    /// value: the reader's answers are serde_json's.
    #[test]
    fn enums_read_as_serde_json_reads_them(
        name in prop_oneof![
            Just("Unit"), Just("Newtype"), Just("Tuple"), Just("Struct"), Just("Other")
        ],
        content in proptest::option::of(prop_oneof![
            value(),
            Just(Value::Null),
            (any::<i8>(), text()).prop_map(|(a, b)| serde_json::json!([a, b])),
            (any::<bool>(), any::<f64>()).prop_map(|(flag, ratio)| serde_json::json!({"flag": flag, "ratio": ratio})),
        ]),
        extra in proptest::option::of(value()),
    ) {
        let mut written = match content {
            None => Value::from(name),
            Some(content) => serde_json::json!({ name: content }),
        };
        if let (Some(extra), Value::Object(members)) = (extra, &mut written) {
            members.insert("Zzz".to_owned(), extra);
        }
        let payload = Payload::from_value(&written).unwrap();
        let text = payload.as_str();
        check_as::<Shape>(text)?;
        check_as::<BTreeMap<String, Shape>>(text)?;
        prop_assert_eq!(decoded::<Shape>(&payload), serde_jsons::<Shape>(text));
    }
}

proptest! {
    /// Any text at all, JSON or not: the reader never panics, and what it
    /// answers is serde_json's answer.
    #[test]
    fn any_text_at_all_reads_as_serde_json_reads_it(
        text in "([\\[\\]{}:,\" \\\\/0-9eE+.-]|null|true|false|\\\\u[0-9a-fA-F]{4}|\\PC|[\\x00-\\x1f])*",
    ) {
        check_as::<Value>(&text)?;
        check_as::<Vec<Shape>>(&text)?;
        check_as::<BTreeMap<u32, Option<String>>>(&text)?;
    }
}

/// Whatever the reader answers for `text` as `T` is serde_json's value.
fn check_as<T>(text: &str) -> Result<(), TestCaseError>
where
    T: serde::de::DeserializeOwned + std::fmt::Debug + PartialEq,
{
    if let Some(read) = decode::<T>(text) {
        let expected = serde_json::from_str::<T>(text);
        prop_assert!(
            matches!(&expected, Ok(value) if *value == read),
            "the reader gave {:?} for {}, serde_json {:?}",
            read,
            text,
            expected
        );
    }
    Ok(())
}

/// Reads that the reader leaves to serde_json, and serde_json's answers
/// through `Payload::decode`.
#[test]
fn what_the_reader_leaves_is_serde_jsons() {
    // Deeper than the reader goes, within serde_json's limit.
    let deep = format!("{}{}", "[".repeat(124), "]".repeat(124));
    assert!(decode::<Value>(&deep).is_none());
    let payload = Payload::parse_str(&deep).unwrap();
    assert_eq!(
        payload.decode::<Value>().unwrap(),
        serde_json::from_str::<Value>(&deep).unwrap()
    );
    // Nesting of 119 containers is read.
    let fine = format!("{}{}", "[".repeat(119), "]".repeat(119));
    assert!(decode::<Value>(&fine).is_some());
    // Text that is not canonical, or not JSON.
    // Deeper than serde_json allows.
    let deeper = format!("{}{}", "[".repeat(130), "]".repeat(130));
    assert!(decode::<Value>(&deeper).is_none());
    assert!(serde_json::from_str::<Value>(&deeper).is_err());
    for text in [
        "[1\"a\"]",
        "{\"a\":1\"b\":2}",
        "{\"a\"1}",
        "[1, 2]",
        "[1,2] ",
        "[1,]",
        "{\"a\":1,}",
        "[01]",
        "\"\\ud83d\\ude00\"",
        "nul",
        "-",
        "[1:2]",
        "{\"a\",1}",
    ] {
        assert!(decode::<Value>(text).is_none(), "{text}");
    }
    // Every escape serde_json reads, in text that is not canonical.
    for text in [
        r#""a\/b""#,
        r#""\u00e9\u20AC\b\f\n\r\t\"\\""#,
        r#""\u0000""#,
    ] {
        assert_eq!(
            Ok(decode::<String>(text).expect("read")),
            serde_jsons::<String>(text),
            "{text}"
        );
    }
    // Keys read as booleans (serde_json's own reading of such a key
    // panics when it starts with a character of more than one byte, so
    // only ASCII keys here).
    for text in [
        r#"{"true":1}"#,
        r#"{"false":2,"true":3}"#,
        r#"{"yes":1}"#,
        r#"{"t\u0072ue":1}"#,
    ] {
        if let Some(read) = decode::<BTreeMap<bool, u8>>(text) {
            assert_eq!(Ok(read), serde_jsons::<BTreeMap<bool, u8>>(text));
        }
    }
    assert!(decode::<BTreeMap<bool, u8>>(r#"{"false":2,"true":3}"#).is_some());
    // Byte strings.
    assert!(decode::<serde_bytes_like::Bytes>("\"ab\"").is_none());
    // An error is serde_json's, message and position.
    let payload = Payload::parse_str(r#"{"flag":true}"#).unwrap();
    let error = payload.decode::<Shape>().unwrap_err().to_string();
    let expected = serde_json::from_str::<Shape>(payload.as_str())
        .unwrap_err()
        .to_string();
    assert!(error.contains(&expected), "{error} against {expected}");
}

/// A type that asks for bytes, as `serde_bytes` does.
mod serde_bytes_like {
    #[derive(Debug)]
    pub struct Bytes;

    impl<'de> serde::Deserialize<'de> for Bytes {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct Visit;
            impl serde::de::Visitor<'_> for Visit {
                type Value = Bytes;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("bytes")
                }
                fn visit_bytes<E>(self, _: &[u8]) -> Result<Bytes, E> {
                    Ok(Bytes)
                }
            }
            deserializer.deserialize_bytes(Visit)
        }
    }
}

/// A long string is read whole wherever its escapes fall.
#[test]
fn long_strings_are_read_whole_wherever_their_escapes_fall() {
    for len in [0usize, 1, 63, 64, 65, 127, 128, 129, 4096, 250_000] {
        for at in [0, len / 2, len.saturating_sub(1)] {
            let mut text: String = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            if len > 0 {
                text.replace_range(at..=at, "\n");
            }
            let payload = Payload::encode(&text).unwrap();
            assert_eq!(
                decode::<String>(payload.as_str()).as_deref(),
                Some(text.as_str())
            );
        }
    }
}
