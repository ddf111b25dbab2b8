//! The payload writer: canonical by construction, and every misuse refused.

use baton_run::program::{PayloadWriter, WriteError};
use baton_run::{Payload, PayloadError};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Values with the awkward parts: escapes in keys and strings (`"` sorts
/// before `#` raw, after it escaped), non-ASCII, floats, extreme integers.
fn tree() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1.0e12f64..1.0e12).prop_map(Value::from),
        "[a\u{e9}\u{1}\u{1f}\u{7f}\n\"\\\\/#]{0,6}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a\"#\\\\\u{e9}\n\u{1}]{0,3}", inner, 0..5)
                .prop_map(|map| Value::Object(map.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Writes `value`, at each node either copying the whole subtree as one
/// payload or writing it part by part, as `choices` say.
fn write(writer: &mut PayloadWriter, value: &Value, choices: &mut impl Iterator<Item = bool>) {
    if choices.next().unwrap_or(false) {
        let part = Payload::encode(value).expect("encodes");
        writer.value(&part).expect("a value may come");
        return;
    }
    match value {
        Value::Null => writer.null(),
        Value::Bool(flag) => writer.bool(*flag),
        Value::String(text) => writer.string(text),
        Value::Number(number) => match (number.as_u64(), number.as_i64()) {
            (Some(number), _) => writer.u64(number),
            (None, Some(number)) => writer.i64(number),
            _ => writer.value(&Payload::from_value(value).expect("encodes")),
        },
        Value::Array(items) => {
            writer.begin_array().expect("an array may open");
            for item in items {
                write(writer, item, choices);
            }
            writer.end_array()
        }
        Value::Object(map) => {
            writer.begin_object().expect("an object may open");
            // serde_json's map iterates in key order.
            for (key, item) in map {
                writer.key(key).expect("keys come in order");
                write(writer, item, choices);
            }
            writer.end_object()
        }
    }
    .expect("the structure is balanced");
}

proptest! {
    /// Whatever the tree and however it is cut into parts, the writer's
    /// text is byte for byte the canonical encoding of the whole.
    #[test]
    fn written_payloads_are_the_canonical_encoding(
        value in tree(),
        choices in prop::collection::vec(any::<bool>(), 1..64),
    ) {
        let mut writer = PayloadWriter::new();
        write(&mut writer, &value, &mut choices.into_iter().cycle());
        let written = writer.finish().expect("one whole value");
        let expected = Payload::encode(&value).expect("encodes");
        prop_assert_eq!(written.as_str(), expected.as_str());
        prop_assert_eq!(written.digest(), expected.digest());
        prop_assert_eq!(Payload::parse_str(written.as_str()).expect("parses"), written);
    }

    /// Keys in any order: accepted exactly when strictly increasing by
    /// bytes, and a refused key leaves the writer as it was.
    #[test]
    fn keys_are_accepted_only_in_strictly_increasing_byte_order(
        keys in prop::collection::vec("[a\"#\\\\\u{e9}]{0,2}", 0..6),
    ) {
        let mut writer = PayloadWriter::new();
        writer.begin_object().expect("opens");
        let mut accepted = Map::new();
        let mut last: Option<&str> = None;
        for (index, key) in keys.iter().enumerate() {
            let result = writer.key(key);
            if last.is_some_and(|last| last.as_bytes() >= key.as_bytes()) {
                prop_assert_eq!(
                    result,
                    Err(WriteError::KeyOrder {
                        previous: last.unwrap_or_default().to_owned(),
                        key: key.clone(),
                    })
                );
            } else {
                prop_assert_eq!(result, Ok(()));
                writer.u64(index as u64).expect("its value");
                accepted.insert(key.clone(), json!(index));
                last = Some(key);
            }
        }
        writer.end_object().expect("closes");
        let written = writer.finish().expect("one whole value");
        let expected = Payload::from_value(&Value::Object(accepted)).expect("encodes");
        prop_assert_eq!(written.as_str(), expected.as_str());
    }
}

proptest! {
    /// A member put in front of an object: accepted exactly when its key
    /// comes before the object's first key (or the object is empty), and
    /// then the canonical encoding of the object with that member.
    #[test]
    fn a_first_member_goes_only_before_the_first_key(
        members in prop::collection::btree_map("[a\"#\\\\\u{e9}\n]{0,3}", tree(), 0..4),
        key in "[a\"#\\\\\u{e9}\n]{0,3}",
        value in tree(),
    ) {
        let object = Value::Object(members.clone().into_iter().collect());
        let object = Payload::encode(&object).expect("encodes");
        let part = Payload::encode(&value).expect("encodes");
        let fits = members.keys().next().is_none_or(|first| key.as_bytes() < first.as_bytes());
        match object.with_first_member(&key, &part) {
            Ok(joined) => {
                prop_assert!(fits);
                let mut whole = members.clone();
                whole.insert(key.clone(), value.clone());
                let expected = Payload::encode(&Value::Object(whole.into_iter().collect())).expect("encodes");
                prop_assert_eq!(joined.as_str(), expected.as_str());
                let scanned = Payload::parse_str(joined.as_str()).expect("parses");
                prop_assert_eq!(&scanned, &joined);
                // The depth it carries is the one a scan finds: it fits
                // under exactly as many arrays.
                for open in Payload::MAX_DEPTH - 10..Payload::MAX_DEPTH {
                    let fits = |part: &Payload| {
                        let mut writer = PayloadWriter::new();
                        for _ in 0..open {
                            writer.begin_array().expect("within the limit");
                        }
                        writer.value(part).is_ok()
                    };
                    prop_assert_eq!(fits(&joined), fits(&scanned), "under {} arrays", open);
                }
            }
            Err(error) => {
                prop_assert!(!fits);
                prop_assert_eq!(
                    error,
                    PayloadError::Assembly(WriteError::KeyOrder {
                        previous: key.clone(),
                        key: members.keys().next().cloned().unwrap_or_default(),
                    })
                );
            }
        }
    }
}

#[test]
fn a_first_member_goes_only_into_an_object_within_the_depth() {
    let one = Payload::parse_str("1").expect("json");
    for not_an_object in ["[1]", "1", r#""{x}""#, "null"] {
        let part = Payload::parse_str(not_an_object).expect("json");
        assert_eq!(
            part.with_first_member("a", &one),
            Err(PayloadError::Assembly(WriteError::NotAnObject))
        );
    }
    let empty = Payload::parse_str("{}").expect("json");
    assert_eq!(
        empty.with_first_member("a", &one).expect("joins").as_str(),
        r#"{"a":1}"#
    );
    let deepest = Payload::parse_str(&nested(Payload::MAX_DEPTH)).expect("readable");
    assert_eq!(
        empty.with_first_member("a", &deepest),
        Err(PayloadError::Assembly(WriteError::TooDeep {
            depth: Payload::MAX_DEPTH + 1,
            limit: Payload::MAX_DEPTH,
        }))
    );
    let deep = Payload::parse_str(&nested(Payload::MAX_DEPTH - 1)).expect("readable");
    let joined = empty.with_first_member("a", &deep).expect("fits");
    assert_eq!(
        Payload::parse_str(joined.as_str()).expect("readable"),
        joined
    );
    // An escaped first key is compared unescaped, as keys are sorted.
    let escaped = Payload::parse_str(r#"{"\"x":1}"#).expect("json");
    assert!(escaped.with_first_member("\\", &one).is_err());
    assert_eq!(
        escaped
            .with_first_member("\"", &one)
            .expect("joins")
            .as_str(),
        r#"{"\"":1,"\"x":1}"#
    );
}

fn object_with(key: &str) -> PayloadWriter {
    let mut writer = PayloadWriter::new();
    writer.begin_object().expect("opens");
    writer.key(key).expect("first key");
    writer
}

#[test]
fn each_misuse_is_refused_and_leaves_the_writer_usable() {
    let one = Payload::parse_str("1").expect("json");

    // A repeated key, or one out of order.
    let mut writer = object_with("b");
    writer.value(&one).expect("value");
    for key in ["b", "a"] {
        assert_eq!(
            writer.key(key),
            Err(WriteError::KeyOrder {
                previous: "b".into(),
                key: key.into(),
            })
        );
    }
    // A key where the previous one awaits its value, and the end there.
    writer.key("c").expect("in order");
    assert_eq!(
        writer.key("d"),
        Err(WriteError::ValueMissing { key: "c".into() })
    );
    assert_eq!(
        writer.end_object(),
        Err(WriteError::ValueMissing { key: "c".into() })
    );
    writer.value(&one).expect("value");
    // A value without its key.
    assert_eq!(writer.value(&one), Err(WriteError::KeyMissing));
    assert_eq!(writer.string("x"), Err(WriteError::KeyMissing));
    assert_eq!(writer.begin_array(), Err(WriteError::KeyMissing));
    // The wrong end.
    assert_eq!(
        writer.end_array(),
        Err(WriteError::Mismatched { expected: "array" })
    );
    writer.end_object().expect("closes");
    // Ends and keys with nothing open, and a second value.
    assert_eq!(
        writer.end_object(),
        Err(WriteError::Mismatched { expected: "object" })
    );
    assert_eq!(
        writer.key("z"),
        Err(WriteError::KeyOutsideObject { key: "z".into() })
    );
    assert_eq!(writer.null(), Err(WriteError::Complete));
    assert_eq!(writer.begin_object(), Err(WriteError::Complete));
    // Every refusal left the text as it was.
    assert_eq!(
        writer.finish().expect("one whole value").as_str(),
        r#"{"b":1,"c":1}"#
    );

    // A key in an array.
    let mut writer = PayloadWriter::new();
    writer.begin_array().expect("opens");
    assert_eq!(
        writer.key("a"),
        Err(WriteError::KeyOutsideObject { key: "a".into() })
    );
    assert_eq!(
        writer.end_object(),
        Err(WriteError::Mismatched { expected: "object" })
    );
    writer.end_array().expect("closes");
    assert_eq!(writer.finish().expect("whole").as_str(), "[]");
}

#[test]
fn an_unbalanced_or_empty_writer_does_not_finish() {
    assert_eq!(
        PayloadWriter::new().finish(),
        Err(PayloadError::Unfinished(WriteError::Empty))
    );
    let mut writer = PayloadWriter::new();
    writer.begin_array().expect("opens");
    writer.begin_object().expect("opens");
    assert_eq!(
        writer.finish(),
        Err(PayloadError::Unfinished(WriteError::Unclosed { open: 2 }))
    );
    let writer = object_with("a");
    assert_eq!(
        writer.finish(),
        Err(PayloadError::Unfinished(WriteError::Unclosed { open: 1 }))
    );
}

#[test]
fn the_size_limit_is_enforced() {
    let half = Payload::encode(&"x".repeat(Payload::MAX_BYTES / 2)).expect("fits");
    let mut writer = PayloadWriter::new();
    writer.begin_array().expect("opens");
    writer.value(&half).expect("value");
    writer.value(&half).expect("value");
    writer.end_array().expect("closes");
    assert!(matches!(
        writer.finish(),
        Err(PayloadError::TooLarge { limit, .. }) if limit == Payload::MAX_BYTES
    ));
}

/// `depth` arrays, one inside the other.
fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

#[test]
fn nesting_stops_where_serde_json_stops_reading() {
    // The limit is serde_json's: what is written can always be read back.
    let deepest = Payload::parse_str(&nested(Payload::MAX_DEPTH)).expect("readable");
    assert!(Payload::parse_str(&nested(Payload::MAX_DEPTH + 1)).is_err());
    assert_eq!(
        deepest.to_value(),
        deepest.decode::<Value>().expect("reads")
    );

    // Parts as deep as the limit fit only at the top.
    let mut writer = PayloadWriter::new();
    writer.begin_array().expect("opens");
    assert_eq!(
        writer.value(&deepest),
        Err(WriteError::TooDeep {
            depth: Payload::MAX_DEPTH + 1,
            limit: Payload::MAX_DEPTH,
        })
    );
    // Whether the part's depth was found by the scanner, by the writer or
    // by a pass over an encoded text.
    let shallower = Payload::parse_str(&nested(Payload::MAX_DEPTH - 1)).expect("readable");
    let mut inner = PayloadWriter::new();
    inner.begin_array().expect("opens");
    inner.value(&shallower).expect("fits");
    inner.end_array().expect("closes");
    let written = inner.finish().expect("whole");
    let value: Value = serde_json::from_str(&nested(Payload::MAX_DEPTH - 1)).expect("reads");
    let encoded = Payload::encode(&vec![value]).expect("encodes");
    for part in [&written, &encoded] {
        assert_eq!(
            writer.value(part),
            Err(WriteError::TooDeep {
                depth: Payload::MAX_DEPTH + 1,
                limit: Payload::MAX_DEPTH,
            })
        );
    }
    // Strings holding brackets do not count.
    let brackets = Payload::encode(&"[[[{{\\\"[").expect("encodes");
    writer.value(&brackets).expect("a string is no nesting");
    for _ in 1..Payload::MAX_DEPTH {
        writer.begin_array().expect("within the limit");
    }
    assert_eq!(
        writer.begin_object(),
        Err(WriteError::TooDeep {
            depth: Payload::MAX_DEPTH + 1,
            limit: Payload::MAX_DEPTH,
        })
    );
    writer.null().expect("a scalar adds no depth");
    for _ in 0..Payload::MAX_DEPTH {
        writer.end_array().expect("closes");
    }
    let written = writer.finish().expect("whole");
    assert_eq!(
        Payload::parse_str(written.as_str()).expect("readable"),
        written
    );
}

#[test]
fn writers_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<PayloadWriter>();
    check::<WriteError>();
}

/// Long payloads (copied in pieces) arrive whole, with multi-byte
/// characters wherever a piece would end.
#[test]
fn long_values_and_members_are_copied_whole() {
    for len in [2040, 2047, 2048, 2049, 2053, 4100, 9000] {
        for (at, mark) in [(2045, 'é'), (2046, '€'), (2047, '😀'), (4094, 'é')] {
            let mut text: Vec<char> = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            if at < len {
                text[at] = mark;
            }
            let text: String = text.into_iter().collect();
            let long = Payload::encode(&text).unwrap();
            let mut writer = PayloadWriter::new();
            writer.begin_object().unwrap();
            writer.key("long").unwrap();
            writer.value(&long).unwrap();
            writer.end_object().unwrap();
            let written = writer.finish().unwrap();
            assert_eq!(written, Payload::encode(&json!({ "long": text })).unwrap());
            let object = Payload::encode(&json!({ "m": text })).unwrap();
            let fronted = object.with_first_member("a", &long).unwrap();
            assert_eq!(
                fronted,
                Payload::encode(&json!({ "a": text, "m": text })).unwrap(),
                "{len} characters, {mark:?} at {at}"
            );
        }
    }
}
