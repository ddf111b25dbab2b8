//! Strict-mode schemas held to OpenAI's published rules: the checker
//! (`baton_testkit::strict`, which quotes each rule) refuses a fixture that
//! breaks each rule, and every schema the transformation produces keeps
//! them all, for structs with optional, enum, nested, recursive and integer
//! members.

use baton_agent::strict::StrictSchema;
use baton_run::program::Schema;
use baton_testkit::strict::{RULES, StrictRule, check_openai_strict};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

/// Optional, enum (plain and tagged), nested, recursive and integer members.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Everything {
    /// A plain member.
    pub name: String,
    /// An unsigned integer (schemars writes `format: uint32`).
    pub count: u32,
    /// A tagged enum.
    pub kind: Kind,
    /// An optional nested struct.
    #[serde(default)]
    pub nested: Option<Nested>,
    /// A recursive member.
    pub children: Vec<Everything>,
    /// An optional string that is absent or a string, never `null` (as
    /// the team's wire types are).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "baton_run::program::deserialize_present"
    )]
    #[schemars(with = "String", length(min = 1))]
    pub note: Option<String>,
}

/// A tagged enum.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Kind {
    /// A file.
    File,
    /// A folder with a number of items.
    Folder {
        /// How many.
        items: i64,
    },
}

/// A nested struct with an optional integer.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Nested {
    /// A label.
    pub label: String,
    /// An optional weight.
    #[serde(default)]
    pub weight: Option<u8>,
}

/// Asserts that a schema keeps every strict-mode rule.
pub fn check(schema: &Value) {
    let violations = check_openai_strict(schema);
    assert!(
        violations.is_empty(),
        "the strict schema breaks rules: {violations:#?}\n{schema:#}"
    );
}

fn broken(schema: Value) -> Vec<&'static str> {
    check_openai_strict(&schema)
        .into_iter()
        .map(|violation| violation.rule.id)
        .collect()
}

#[test]
fn transformed_schemas_keep_every_rule() {
    for schema in [
        Schema::of::<Everything>(),
        Schema::of::<Nested>(),
        Schema::of::<baton_agent::Steering>(),
    ] {
        let strict = StrictSchema::new(&schema.json().to_value()).expect("expressible");
        check(strict.schema());
    }
}

#[test]
fn a_strict_answer_maps_back_to_a_value_of_the_type() {
    let strict =
        StrictSchema::new(&Schema::of::<Everything>().json().to_value()).expect("expressible");
    let answer = json!({
        "name": "a", "count": 1, "kind": {"type": "file"},
        "nested": {"label": "l", "weight": null},
        "children": [], "note": null
    });
    let restored = strict.restore(answer);
    assert_eq!(
        restored,
        json!({"name": "a", "count": 1, "kind": {"type": "file"}, "nested": {"label": "l", "weight": null}, "children": []}),
        "an absent `note` was written as null; a nullable weight keeps its null"
    );
    let decoded: Everything = serde_json::from_value(restored).expect("decodes");
    assert_eq!((decoded.name.as_str(), decoded.count), ("a", 1));
    assert!(matches!(decoded.kind, Kind::File) && decoded.children.is_empty());
    assert!(decoded.note.is_none());
    assert_eq!(
        decoded.nested.map(|nested| (nested.label, nested.weight)),
        Some(("l".to_owned(), None))
    );
    let folder: Kind =
        serde_json::from_value(json!({"type": "folder", "items": 2})).expect("a kind");
    assert!(matches!(folder, Kind::Folder { items: 2 }));
    let unmapped = json!({
        "name": "a", "count": 1, "kind": {"type": "file"}, "nested": null, "children": [], "note": null
    });
    assert!(
        serde_json::from_value::<Everything>(unmapped).is_err(),
        "without the mapping a null `note` is refused"
    );
}

#[test]
fn the_checker_refuses_a_fixture_breaking_each_rule() {
    let object = |properties: Value| {
        let required: Vec<String> = properties
            .as_object()
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
    };
    let mut deep = json!({"type": "string"});
    for _ in 0..11 {
        deep = object(json!({"x": deep}));
    }
    let many: Vec<Value> = (0..1_001).map(|i| json!(format!("v{i}"))).collect();
    let fixtures: Vec<(StrictRule, Value)> = vec![
        (
            RULES[0],
            json!({"anyOf": [object(json!({"a": {"type": "string"}}))]}),
        ),
        (
            RULES[1],
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": [], "additionalProperties": false}),
        ),
        (
            RULES[2],
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}),
        ),
        (RULES[3], object(json!({"a": {}}))),
        (
            RULES[4],
            object(json!({"a": {"type": "string", "minLength": 1}})),
        ),
        (
            RULES[4],
            object(json!({"a": {"oneOf": [{"type": "string"}]}})),
        ),
        (
            RULES[4],
            object(json!({"a": {"allOf": [{"type": "string"}]}})),
        ),
        (
            RULES[5],
            object(json!({"a": {"type": "integer", "format": "uint32"}})),
        ),
        (RULES[6], deep),
        (
            RULES[6],
            object(json!({"a": {"type": "string", "enum": many}})),
        ),
        (RULES[7], object(json!({"a": {"$ref": "#/$defs/Missing"}}))),
        (
            RULES[8],
            json!({
                "$defs": {"B": object(json!({"b": {"type": "string"}}))},
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/B", "description": "a b"}},
                "required": ["a"],
                "additionalProperties": false
            }),
        ),
    ];
    for (rule, fixture) in fixtures {
        let ids = broken(fixture.clone());
        assert!(
            ids.contains(&rule.id),
            "the fixture for {:?} ({}) was not refused for it: {ids:?}\n{fixture:#}",
            rule.id,
            rule.quote
        );
    }
    // A fixture for every rule.
    assert_eq!(RULES.len(), 9);
}

#[test]
fn raw_schemars_schemas_break_the_rules_the_transformation_fixes() {
    let raw = Schema::of::<Everything>().json().to_value();
    let ids = broken(raw);
    for rule in ["all-required", "supported-keywords", "formats", "ref-alone"] {
        assert!(ids.contains(&rule), "{rule} not reported: {ids:?}");
    }
}

#[test]
fn untyped_members_have_no_strict_form() {
    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Loose {
        any: Value,
    }
    let error =
        StrictSchema::new(&Schema::of::<Loose>().json().to_value()).expect_err("inexpressible");
    assert_eq!(error.path, "/properties/any");
}
