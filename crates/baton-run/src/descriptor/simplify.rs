//! Equivalent schemas that the text validator checks with less work.
//!
//! schemars describes a documented unit-only enum as a `oneOf` of one
//! branch per variant, each a `const` with its `type` and `description`.
//! `jsonschema` checks a `oneOf` by trying every branch (exactly one must
//! match), so each such value costs two checks per variant. When every
//! branch is nothing but a distinct constant, "exactly one branch matches"
//! and "the value is one of the constants" are the same test, which an
//! `enum` answers with one lookup. A team's `Turn` holds two such enums per
//! finished task (its outcome's status and cause).
//!
//! Only the text validator's schema is rewritten: the value validator keeps
//! the schema as given and names every violation, so messages and paths
//! never change. A rewrite that breaks a reference into a removed branch
//! makes the text validator fail to compile, and validation then goes
//! through the value validator, as for any schema the text validator
//! cannot take.

use serde_json::{Map, Value};

/// Keywords whose values are instances, not schemas: never rewritten.
const DATA: &[&str] = &["const", "default", "enum", "examples"];

/// Keywords a constant branch may carry beside `const` and `type`: they
/// annotate and never change a verdict.
const ANNOTATIONS: &[&str] = &[
    "$comment",
    "default",
    "deprecated",
    "description",
    "examples",
    "readOnly",
    "title",
    "writeOnly",
];

/// Rewrites, everywhere in `schema`, each `oneOf` whose branches are all
/// distinct constants into the `enum` of those constants.
pub(super) fn constant_choices(schema: &mut Value) {
    match schema {
        Value::Object(members) => {
            for (name, value) in members.iter_mut() {
                if !DATA.contains(&name.as_str()) {
                    constant_choices(value);
                }
            }
            if members.contains_key("enum") {
                return;
            }
            if let Some(constants) = members.get("oneOf").and_then(constants) {
                members.remove("oneOf");
                members.insert("enum".to_owned(), Value::Array(constants));
            }
        }
        Value::Array(items) => items.iter_mut().for_each(constant_choices),
        _ => {}
    }
}

/// The constants of `branches` when every branch is a constant string,
/// boolean or null (with at most a matching `type` and annotations) and no
/// two constants are equal; otherwise `None`.
fn constants(branches: &Value) -> Option<Vec<Value>> {
    let branches = branches.as_array()?;
    let mut constants: Vec<Value> = Vec::with_capacity(branches.len());
    for branch in branches {
        let constant = constant(branch.as_object()?)?;
        // Two equal constants make a value match two branches, which
        // `oneOf` refuses and `enum` would accept.
        if constants.contains(constant) {
            return None;
        }
        constants.push(constant.clone());
    }
    Some(constants)
}

/// The constant of a branch that is nothing but that constant.
fn constant(branch: &Map<String, Value>) -> Option<&Value> {
    let constant = branch.get("const")?;
    // Numbers are left alone: `const` and `type` compare them by value
    // (`1` and `1.0` are the same integer), which this rewrite need not
    // reason about.
    let kind = match constant {
        Value::String(_) => "string",
        Value::Bool(_) => "boolean",
        Value::Null => "null",
        _ => return None,
    };
    let plain = branch.iter().all(|(name, value)| match name.as_str() {
        "const" => true,
        "type" => value.as_str() == Some(kind),
        other => ANNOTATIONS.contains(&other),
    });
    plain.then_some(constant)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rewritten(mut schema: Value) -> Value {
        constant_choices(&mut schema);
        schema
    }

    #[test]
    fn a_documented_enum_becomes_the_enum_of_its_constants() {
        let schema = json!({
            "description": "The lifecycle status.",
            "oneOf": [
                {"const": "running", "description": "Stepping.", "type": "string"},
                {"const": "done", "type": "string"},
                {"const": null, "title": "nothing"},
                {"const": false}
            ]
        });
        assert_eq!(
            rewritten(schema),
            json!({
                "description": "The lifecycle status.",
                "enum": ["running", "done", null, false]
            })
        );
    }

    #[test]
    fn nested_choices_are_rewritten_where_they_are_schemas() {
        let schema = json!({
            "$defs": {"Status": {"oneOf": [{"const": "a"}, {"const": "b"}]}},
            "properties": {"x": {"items": {"oneOf": [{"const": "c"}]}}},
            "anyOf": [{"oneOf": [{"const": "d"}, {"const": "e"}]}]
        });
        assert_eq!(
            rewritten(schema),
            json!({
                "$defs": {"Status": {"enum": ["a", "b"]}},
                "properties": {"x": {"items": {"enum": ["c"]}}},
                "anyOf": [{"enum": ["d", "e"]}]
            })
        );
    }

    #[test]
    fn choices_that_are_not_plain_distinct_constants_stay() {
        for schema in [
            // The same constant twice: `oneOf` refuses "a".
            json!({"oneOf": [{"const": "a"}, {"const": "a", "description": "again"}]}),
            // A type that the constant does not have matches nothing.
            json!({"oneOf": [{"const": "a", "type": "integer"}, {"const": "b"}]}),
            // A branch with a keyword that constrains.
            json!({"oneOf": [{"const": "a", "minLength": 2}, {"const": "b"}]}),
            // A branch that is no constant.
            json!({"oneOf": [{"const": "a"}, {"type": "string"}]}),
            json!({"oneOf": [{"const": "a"}, true]}),
            // Numbers and compound constants.
            json!({"oneOf": [{"const": 1}, {"const": 1.0}]}),
            json!({"oneOf": [{"const": ["a"]}, {"const": {"a": 1}}]}),
            // An `enum` beside the `oneOf` already.
            json!({"enum": ["a", "b"], "oneOf": [{"const": "a"}, {"const": "c"}]}),
            // Not a list of branches.
            json!({"oneOf": {"const": "a"}}),
        ] {
            assert_eq!(rewritten(schema.clone()), schema);
        }
    }

    #[test]
    fn instances_inside_a_schema_are_never_rewritten() {
        let choice = json!({"oneOf": [{"const": "a"}, {"const": "b"}]});
        let schema = json!({
            "const": choice,
            "default": choice,
            "enum": [choice],
            "examples": [choice]
        });
        assert_eq!(rewritten(schema.clone()), schema);
    }
}
