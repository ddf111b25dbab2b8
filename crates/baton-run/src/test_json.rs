//! Strategies for JSON values in the kernel's property tests: any value
//! tree, with strings that hold something to escape anywhere and runs long
//! enough to cross the 64-byte blocks of the escape checks and scans.

use proptest::prelude::*;
use serde_json::Value;

/// Text with something to escape anywhere, and runs long enough to cross
/// the scan's blocks of 64 bytes.
pub(crate) fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "(\\PC|[\\x00-\\x1f\"\\\\/])*",
        (
            0usize..300,
            "(\\PC|[\\x00-\\x1f\"\\\\])?",
            any::<proptest::sample::Index>()
        )
            .prop_map(|(len, mark, at)| {
                let mut text: String = (0..len)
                    .map(|i| char::from(b'a' + (i % 26) as u8))
                    .collect();
                text.insert_str(at.index(len + 1), &mark);
                text
            }),
    ]
}

pub(crate) fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop_oneof![Just(0i64), Just(-1), Just(i64::MIN), Just(i64::MAX)].prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::btree_map(text(), inner, 0..5)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}
