//! Canonical payload encoding: key order and whitespace never matter.
#![allow(missing_docs)]

use baton_run::{Descriptor, FailureKind, Payload, Schema};
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
