//! Canonical payload encoding: key order and whitespace never matter.

use baton_run::program::{Descriptor, Schema};
use baton_run::{FailureKind, Payload};
use proptest::prelude::*;
use serde_json::{Map, Value};

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1.0e12f64..1.0e12).prop_map(Value::from),
        "[a-z\\u{e9}\"\\\\ ]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Writes JSON with object keys in reverse order and optional whitespace.
fn render(value: &Value, spaced: bool, out: &mut String) {
    let gap = if spaced { " \n\t" } else { "" };
    match value {
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(gap);
                render(item, spaced, out);
            }
            out.push_str(gap);
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (index, (key, item)) in map.iter().rev().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(gap);
                out.push_str(&serde_json::to_string(key).expect("key"));
                out.push_str(gap);
                out.push(':');
                render(item, spaced, out);
            }
            out.push_str(gap);
            out.push('}');
        }
        leaf => out.push_str(&serde_json::to_string(leaf).expect("leaf")),
    }
}

proptest! {
    #[test]
    fn key_order_and_whitespace_never_change_bytes_or_digest(value in json(), spaced in any::<bool>()) {
        let canonical = Payload::from_value(&value).expect("encodes");
        let mut text = String::new();
        render(&value, spaced, &mut text);
        let parsed = Payload::parse_str(&text).expect("parses");
        prop_assert_eq!(parsed.as_bytes(), canonical.as_bytes());
        prop_assert_eq!(parsed.digest(), canonical.digest());
        // Canonical text parses back to itself.
        prop_assert_eq!(Payload::parse(canonical.as_bytes()).expect("reparses"), canonical);
    }
}

/// Leaves that stress the canonical fast path: control characters, escapes,
/// non-ASCII, and integers at the 64-bit edges.
fn edgy_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => (0u64..30).prop_map(Value::from),
        1 => Just(Value::from(-1.5e300)),
        4 => "[a\u{e9}\u{1}\u{c}\u{8}\u{1f}\u{7f}\n\t\r\"\\\\/0129,:]{1,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-c\u{e9}\n]{0,3}", inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Text edits that turn canonical text into near-canonical text.
const EDITS: [(&str, &str); 15] = [
    ("\\u001f", "\u{1f}"),
    (":0", ":-0"),
    ("[0", "[-0"),
    ("\\u001f", "\\u001F"),
    ("\\n", "\\u000a"),
    ("\\b", "\\u0008"),
    ("/", "\\/"),
    ("\u{e9}", "\\u00e9"),
    ("\u{7f}", "\\u007f"),
    (",", ", "),
    (":", " :"),
    ("0", "-0"),
    ("1", "1.0"),
    ("2", "2e0"),
    ("9", "09"),
];

proptest! {
    /// Whatever the text, parsing gives exactly what the general
    /// canonicalizer (serde_json's tree, re-encoded) gives.
    #[test]
    fn parsing_matches_the_general_canonicalizer(
        value in edgy_json(),
        edit in 0..=EDITS.len(),
        nth in 0usize..8,
    ) {
        let mut text = serde_json::to_string(&value).expect("renders");
        if let Some((from, to)) = EDITS.get(edit) {
            let places: Vec<usize> = text.match_indices(from).map(|(at, _)| at).collect();
            if let Some(&at) = places.get(nth % places.len().max(1)) {
                text.replace_range(at..at + from.len(), to);
            }
        }
        let general = serde_json::from_str::<Value>(&text)
            .ok()
            .map(|value| Payload::from_value(&value).expect("encodes"));
        match Payload::parse_str(&text) {
            Ok(parsed) => prop_assert_eq!(Some(parsed), general),
            // Only duplicate keys (which serde_json's tree drops) may fail
            // where the general path succeeds; edits never make them.
            Err(error) => prop_assert!(general.is_none(), "{error} for {text}"),
        }
    }
}

#[test]
fn near_canonical_texts_are_canonicalized() {
    for (text, canonical) in [
        ("-0", "-0.0"),
        ("1E2", "100.0"),
        ("18446744073709551616", "1.8446744073709552e+19"),
        (r#""\u00E9""#, "\"\u{e9}\""),
        (r#""\/""#, r#""/""#),
        (r#""\u000a""#, r#""\n""#),
        (r#""\u001F""#, r#""\u001f""#),
        (r#"{"b":1,"a":2}"#, r#"{"a":2,"b":1}"#),
        (r#"{"\u0061":1}"#, r#"{"a":1}"#),
    ] {
        let payload = Payload::parse_str(text).expect("valid JSON");
        assert_eq!(payload.as_str(), canonical, "{text}");
    }
    assert!(Payload::parse_str(r#"{"a":1,"a":1}"#).is_err());
    assert!(Payload::parse_str(r#"{"a":1,"\u0061":1}"#).is_err());
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    assert!(
        Payload::parse_str(&deep).is_err(),
        "too deep for serde_json"
    );
}

#[test]
fn a_payload_violating_a_descriptor_schema_is_a_contract_failure_naming_the_path() {
    let descriptor = Descriptor::new(
        "shop.order",
        "Place an order.",
        Schema::parse(r#"{"type":"object","properties":{"lines":{"type":"array","items":{"type":"integer"}}}}"#)
            .expect("valid"),
        Schema::any(),
    )
    .expect("valid");
    let payload = Payload::parse_str(r#"{"lines":[1,2,"three"]}"#).expect("json");
    let failure = descriptor.check_input(&payload).expect_err("violates");
    assert_eq!(failure.kind, FailureKind::Contract);
    assert_eq!(failure.code(), "execution.input.invalid");
    assert!(failure.message.contains("/lines/2"), "{}", failure.message);
}

/// Encodes the general way: a `Value` tree, then its canonical text.
fn general<T: serde::Serialize>(value: &T) -> Option<Payload> {
    serde_json::to_value(value)
        .ok()
        .and_then(|value| Payload::from_value(&value).ok())
}

#[derive(Debug, serde::Serialize)]
#[serde(tag = "kind")]
enum Tagged {
    Unit,
    Fields { zeta: u8, alpha: Option<String> },
}

#[derive(Debug, serde::Serialize)]
enum Variants {
    Unit,
    Newtype(i64),
    Tuple(u8, String),
    Struct { z: f32, a: char },
}

/// Fields out of key order, every scalar kind, nested maps and raw text.
#[derive(Debug, serde::Serialize)]
struct Mixed {
    zulu: f32,
    alpha: f64,
    mike: Option<Vec<u64>>,
    big: i128,
    ints: std::collections::BTreeMap<i32, String>,
    /// Arrives in random order: the encoder must sort it.
    #[expect(
        clippy::disallowed_types,
        reason = "tests that hash-ordered maps encode sorted"
    )]
    names: std::collections::HashMap<String, bool>,
    tagged: Tagged,
    variants: Vec<Variants>,
    payload: Payload,
    raw: Box<serde_json::value::RawValue>,
    tuple: (u8, (), char),
    #[serde(flatten)]
    extra: std::collections::BTreeMap<String, u8>,
}

fn mixed() -> impl Strategy<Value = Mixed> {
    (
        (
            any::<f32>(),
            any::<f64>(),
            any::<Option<Vec<u64>>>(),
            prop_oneof![4 => any::<i64>().prop_map(i128::from), 1 => any::<i128>()],
        ),
        (
            prop::collection::btree_map(any::<i32>(), "[a-z\"]{0,3}", 0..4),
            prop::collection::hash_map("[a-c\\u{e9}]{0,3}", any::<bool>(), 0..4),
            prop::collection::btree_map("[a-z]{1,3}", any::<u8>(), 0..3),
        ),
        (
            any::<u8>(),
            any::<Option<String>>(),
            any::<i64>(),
            any::<char>(),
            any::<bool>(),
        ),
        edgy_json(),
    )
        .prop_map(
            |((zulu, alpha, mike, big), (ints, names, extra), (n, text, i, c, flip), json)| Mixed {
                zulu,
                alpha,
                mike,
                big,
                ints,
                names,
                tagged: if flip {
                    Tagged::Unit
                } else {
                    Tagged::Fields {
                        zeta: n,
                        alpha: text.clone(),
                    }
                },
                variants: vec![
                    Variants::Unit,
                    Variants::Newtype(i),
                    Variants::Tuple(n, text.unwrap_or_default()),
                    Variants::Struct { z: zulu, a: c },
                ],
                payload: Payload::from_value(&json).expect("encodes"),
                raw: serde_json::value::RawValue::from_string(
                    serde_json::to_string_pretty(&json).expect("renders"),
                )
                .expect("valid"),
                tuple: (n, (), c),
                extra,
            },
        )
}

proptest! {
    /// The one-pass encoder gives exactly the general way's bytes, or
    /// fails exactly when it does.
    #[test]
    fn encoding_matches_the_general_way(value in edgy_json(), typed in mixed()) {
        prop_assert_eq!(Payload::encode(&value).ok(), general(&value));
        let encoded = Payload::encode(&typed).ok();
        prop_assert_eq!(&encoded, &general(&typed));
        // Only a 128-bit integer out of range fails.
        prop_assert_eq!(encoded.is_some(), i64::try_from(typed.big).is_ok());
    }
}

#[test]
fn unusual_map_keys_fall_back_to_the_general_way() {
    let bools = std::collections::BTreeMap::from([(true, 1), (false, 2)]);
    assert_eq!(Payload::encode(&bools).ok(), general(&bools));
    let units = std::collections::BTreeMap::from([((), 1)]);
    assert_eq!(Payload::encode(&units).ok(), general(&units));
    let huge = u128::MAX;
    assert_eq!(Payload::encode(&huge).ok(), general(&huge));
    assert_eq!(Payload::encode(&f64::NAN).expect("null").as_str(), "null");
    // A flattened map repeating a field's name: the last value wins.
    #[derive(serde::Serialize)]
    struct Clash {
        b: u8,
        a: u8,
        #[serde(flatten)]
        extra: std::collections::BTreeMap<String, u8>,
    }
    let clash = Clash {
        b: 1,
        a: 2,
        extra: std::collections::BTreeMap::from([("a".to_owned(), 3), ("c".to_owned(), 4)]),
    };
    let encoded = Payload::encode(&clash).expect("encodes");
    assert_eq!(encoded.as_str(), r#"{"a":3,"b":1,"c":4}"#);
    assert_eq!(Some(encoded), general(&clash));
}
