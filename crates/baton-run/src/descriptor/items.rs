//! Array items the text validator already found to satisfy their schema.
//!
//! A child's input often repeats most of the previous input of the same
//! program: a team's coordinator gets a `Turn` holding every task so far,
//! so checking every turn in full checks each settled task again on every
//! later turn, and a team's checks grow with the square of its tasks.
//!
//! For a schema whose top-level properties hold arrays, the text
//! validator's copy replaces each such property's `items` with
//! [`KEYWORD`], a keyword of this module that checks each element against
//! the same item schema, compiled on its own, and remembers the text of
//! the last array it accepted: the elements an array shares with it at its
//! head (found with one memcmp of the two texts) are accepted without being
//! checked again, and only the elements after them are checked.
//!
//! Where nothing else in the schema looks into such a property's elements
//! (see [`Memoized::skippable`]), the elements it shares with the last
//! array accepted are not even read: the text validator's tape holds one
//! entry per such element, without its subtree (see `text`), so a turn's
//! check costs what its new tasks cost, not what all its tasks do.
//!
//! Why this is the same test. `items` (without `prefixItems`) holds when
//! every element satisfies the item schema, and whether a value satisfies
//! a schema depends only on the value, and a payload's value only on its
//! canonical text, as long as nothing in the schema depends on where it is
//! evaluated from. So the rewrite is made only when every `$ref` in the
//! schema points into its `$defs` (which the item schema compiled on its
//! own carries with it), and no keyword scopes or collects evaluation
//! results (`$id`, `$anchor`, dynamic and recursive references,
//! `unevaluated*`). The memo only ever holds an accepted array, and the value
//! validator still has the last word on every payload the text validator
//! rejects (see `Schema::validate`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use jsonschema::json::{Array, Node};
use jsonschema::{Keyword, ValidationError};
use serde_json::Value;

use super::text::{CanonicalText, TextNode};
use crate::payload::common_prefix;

/// The keyword that stands in for `items` in the text validator's schema.
pub(super) const KEYWORD: &str = "x-baton-memoized-items";

/// Keywords that make a subschema's verdict depend on more than the value
/// and the schema's own `$defs`.
const SCOPED: &[&str] = &[
    "$id",
    "$anchor",
    "$dynamicRef",
    "$dynamicAnchor",
    "$recursiveRef",
    "$recursiveAnchor",
    "unevaluatedItems",
    "unevaluatedProperties",
    KEYWORD,
];

/// The longest array text kept, in bytes: a longer array is checked in
/// full every time.
const LONGEST: usize = 1024 * 1024;

/// Annotations: keywords that never look at the instance.
const ANNOTATIONS: &[&str] = &[
    "$comment",
    "title",
    "description",
    "examples",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// Root keywords besides annotations that never look into a property's
/// value but through the property's own schema (or only at which members
/// are present).
const ROOT_SKIPPABLE: &[&str] = &[
    "$schema",
    "$defs",
    "type",
    "properties",
    "required",
    "additionalProperties",
];

/// Keywords of a rewritten property's schema besides annotations that never
/// look into its elements (its type is read off the array's own entry).
const PROPERTY_SKIPPABLE: &[&str] = &[KEYWORD, "type"];

/// Whether `word` is an annotation or one of `also`.
fn one_of(word: &str, also: &[&str]) -> bool {
    ANNOTATIONS.contains(&word) || also.contains(&word)
}

/// A top-level property whose `items` the keyword stands in for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Memoized {
    /// The property's name.
    pub(super) property: String,
    /// Whether only the keyword looks into the property's elements: the
    /// root's other keywords reach the property through its schema alone,
    /// and that schema holds no keyword but the memo's, `type` and
    /// annotations. Only then may the tape leave out the subtrees of the
    /// elements it shares with the last array accepted.
    pub(super) skippable: bool,
}

/// One property's memo, shared by the keyword compiled for it and the text
/// validator that builds the tapes.
pub(super) type Memo = Arc<Mutex<Accepted>>;

/// The memo of each memoized property, by name.
pub(super) type Memos = BTreeMap<String, Memo>;

/// A fresh memo for each of `memoized`.
pub(super) fn memos(memoized: &[Memoized]) -> Memos {
    memoized
        .iter()
        .map(|memoized| (memoized.property.clone(), Arc::default()))
        .collect()
}

/// The last array a memo accepted, or none.
pub(super) fn last_accepted(memo: &Mutex<Accepted>) -> Option<Arc<AcceptedArray>> {
    memo.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .last
        .clone()
}

/// Replaces the `items` of each top-level property of `schema` with
/// [`KEYWORD`] carrying the property's name and the item schema with the
/// root's `$defs`; the properties it replaced (only if there are any must
/// the validator know the keyword).
pub(super) fn memoize_items(schema: &mut Value) -> Vec<Memoized> {
    let Value::Object(root) = schema else {
        return Vec::new();
    };
    if !root
        .iter()
        .all(|(name, value)| name == "$schema" || self_contained(name, value))
    {
        return Vec::new();
    }
    let root_skippable = root.keys().all(|name| one_of(name, ROOT_SKIPPABLE));
    let defs = root.get("$defs").cloned();
    let Some(Value::Object(properties)) = root.get_mut("properties") else {
        return Vec::new();
    };
    let mut replaced = Vec::new();
    for (name, property) in properties.iter_mut() {
        let Value::Object(property) = property else {
            continue;
        };
        if property.contains_key("prefixItems") {
            continue;
        }
        let Some(Value::Object(items)) = property.get("items") else {
            continue;
        };
        if items.contains_key("$defs") || items.contains_key("$schema") {
            continue;
        }
        let mut alone = items.clone();
        if let Some(defs) = &defs {
            alone.insert("$defs".to_owned(), defs.clone());
        }
        property.remove("items");
        property.insert(
            KEYWORD.to_owned(),
            serde_json::json!({"items": alone, "property": name}),
        );
        replaced.push(Memoized {
            property: name.clone(),
            skippable: root_skippable
                && property.keys().all(|word| one_of(word, PROPERTY_SKIPPABLE)),
        });
    }
    replaced
}

/// Whether the member `name: value` of a schema, and everything in it,
/// keeps verdicts independent of where they are evaluated from: no scoping
/// keyword, every `$ref` into `#/$defs`. Instances (`const`, `enum`, ...)
/// are looked through too, which can only refuse more.
fn self_contained(name: &str, value: &Value) -> bool {
    if SCOPED.contains(&name) || name == "$schema" {
        return false;
    }
    if name == "$ref" && !value.as_str().is_some_and(|to| to.starts_with("#/$defs/")) {
        return false;
    }
    match value {
        Value::Object(members) => members
            .iter()
            .all(|(name, value)| self_contained(name, value)),
        Value::Array(values) => values.iter().all(|value| self_contained("", value)),
        _ => true,
    }
}

/// Builds the keyword from its value (the property's name, and the item
/// schema with the root's `$defs`), for the text validator's options: its
/// memo is the property's among `memos`.
pub(super) fn compile<'a>(
    schema: &'a Value,
    memos: &Memos,
) -> Result<Box<dyn for<'i> Keyword<'i, CanonicalText>>, ValidationError<'a>> {
    let (Some(items), Some(property)) = (
        schema.get("items"),
        schema.get("property").and_then(Value::as_str),
    ) else {
        return Err(ValidationError::custom(
            "the memoized items keyword holds `items` and `property`",
        ));
    };
    let items = jsonschema::options_for::<CanonicalText>()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(items)
        .map_err(|error| ValidationError::custom(error.to_string()))?;
    Ok(Box::new(MemoizedItems {
        items,
        accepted: memos.get(property).cloned().unwrap_or_default(),
    }))
}

/// `items`, with a memo of the last array it accepted.
struct MemoizedItems {
    items: jsonschema::Validator<CanonicalText>,
    accepted: Memo,
}

/// An array that satisfied the keyword: its text, and where each of its
/// elements ends in it (the offset of the `,` or `]` after it).
#[derive(Debug)]
pub(super) struct AcceptedArray {
    pub(super) text: Box<str>,
    pub(super) ends: Vec<usize>,
}

impl AcceptedArray {
    /// How many of its first elements lie wholly in the first `common`
    /// bytes of its text.
    fn within(&self, common: usize) -> usize {
        self.ends.partition_point(|end| *end <= common)
    }

    /// How many of its first elements another text that reads the same for
    /// the first `common` bytes holds there too, each ending where it ends
    /// here: those within them with the `,` or `]` after them, and the next
    /// if it ends just there and closes itself (an object, an array or a
    /// string; where a number or a literal ends depends on the byte after
    /// it).
    pub(super) fn delimited_within(&self, common: usize) -> usize {
        let within = self.ends.partition_point(|end| *end < common);
        let closes_itself = |end: usize| {
            end == common
                && matches!(
                    self.text.as_bytes().get(end.wrapping_sub(1)),
                    Some(b'}' | b']' | b'"')
                )
        };
        match self.ends.get(within) {
            Some(&end) if closes_itself(end) => within + 1,
            _ => within,
        }
    }
}

/// The last array that satisfied the keyword.
#[derive(Debug, Default)]
pub(super) struct Accepted {
    last: Option<Arc<AcceptedArray>>,
}

impl Accepted {
    /// How many of the first elements of `array` (its text, whose elements
    /// end at `ends`) lie wholly in the text it shares with the last array
    /// accepted: they are that array's elements, accepted.
    fn leading(&self, array: &str, ends: &[usize]) -> usize {
        let Some(last) = &self.last else {
            return 0;
        };
        let common = common_prefix(last.text.as_bytes(), array.as_bytes());
        // Both texts open with `[` and read the same up to `common`, so up
        // to there they hold the same elements, ending at the same offsets.
        ends.partition_point(|end| *end <= common)
            .min(last.within(common))
    }
}

impl MemoizedItems {
    fn accepted(&self) -> std::sync::MutexGuard<'_, Accepted> {
        // A cache: a panic while it was held leaves it an accepted array
        // all the same.
        self.accepted.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<'i> Keyword<'i, CanonicalText> for MemoizedItems {
    fn validate(&self, instance: TextNode<'i>) -> Result<(), ValidationError<'i>> {
        if Keyword::<CanonicalText>::is_valid(self, instance) {
            Ok(())
        } else {
            Err(ValidationError::custom(
                "an element does not satisfy the items schema",
            ))
        }
    }

    fn is_valid(&self, instance: TextNode<'i>) -> bool {
        let (Some(array), Some(text)) = (instance.as_array(), instance.container_text()) else {
            return true;
        };
        // Where each element ends, from the array's `[`.
        let base = text.as_ptr() as usize;
        let ends: Vec<usize> = array
            .elements()
            .map(|element| {
                let element = element.text();
                element.as_ptr() as usize - base + element.len()
            })
            .collect();
        let leading = self.accepted().leading(text, &ends);
        // The elements the tape holds without their subtrees lie in the
        // text the tape's builder found the same as an accepted array's.
        if !array
            .elements()
            .skip(leading)
            .all(|element| element.is_accepted() || self.items.is_valid(element))
        {
            return false;
        }
        if leading < ends.len() && text.len() <= LONGEST {
            self.accepted().last = Some(Arc::new(AcceptedArray {
                text: text.into(),
                ends,
            }));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rewritten(schema: &Value) -> Option<Value> {
        let mut schema = schema.clone();
        (!memoize_items(&mut schema).is_empty()).then_some(schema)
    }

    #[test]
    fn top_level_items_become_the_keyword_with_the_defs() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "tasks": {"type": "array", "items": {"$ref": "#/$defs/Task"}},
                "nested": {"type": "object", "properties": {"list": {"items": {"type": "string"}}}},
                "tuple": {"prefixItems": [{"type": "string"}], "items": {"type": "number"}},
                "any": {"items": true},
                "n": {"type": "integer"}
            },
            "$defs": {"Task": {"type": "object", "properties": {"tags": {"items": {"type": "string"}}}}}
        });
        let rewritten = rewritten(&schema).expect("rewritten");
        let properties = &rewritten["properties"];
        assert_eq!(
            properties["tasks"],
            json!({"type": "array", KEYWORD: {
                "items": {"$ref": "#/$defs/Task", "$defs": schema["$defs"]},
                "property": "tasks",
            }})
        );
        // Only top-level properties' schema items; nested ones, tuples
        // and boolean item schemas are left alone, as are the `$defs`.
        for name in ["nested", "tuple", "any", "n"] {
            assert_eq!(properties[name], schema["properties"][name], "{name}");
        }
        assert_eq!(rewritten["$defs"], schema["$defs"]);
    }

    /// Only where nothing but the keyword looks into a property's elements
    /// may the tape leave their subtrees out.
    #[test]
    fn skippable_only_where_the_keyword_alone_reads_the_elements() {
        let skippable = |schema: Value| -> Vec<(String, bool)> {
            let mut schema = schema;
            memoize_items(&mut schema)
                .into_iter()
                .map(|memoized| (memoized.property, memoized.skippable))
                .collect()
        };
        let list = json!({"type": "array", "description": "d", "items": {"type": "object"}});
        assert_eq!(
            skippable(json!({
                "title": "t", "type": "object", "required": ["l"], "additionalProperties": false,
                "properties": {"l": list, "m": {"type": "array", "minItems": 1, "items": true}},
            })),
            // `items: true` is not an object schema: left alone.
            [("l".to_owned(), true)]
        );
        assert_eq!(
            skippable(json!({"properties": {
                "l": list,
                "u": {"type": "array", "uniqueItems": true, "items": {"type": "object"}},
                "c": {"contains": {"type": "object"}, "items": {"type": "object"}},
            }})),
            [
                ("c".to_owned(), false),
                ("l".to_owned(), true),
                ("u".to_owned(), false)
            ]
        );
        for (word, value) in [
            ("allOf", json!([{"properties": {"l": {"minItems": 2}}}])),
            ("anyOf", json!([true])),
            ("oneOf", json!([true])),
            ("not", json!(false)),
            ("if", json!(true)),
            ("dependentSchemas", json!({"l": true})),
            ("patternProperties", json!({"^l$": {"maxItems": 1}})),
            ("const", json!({"l": []})),
            ("enum", json!([{"l": []}])),
            ("minProperties", json!(1)),
        ] {
            assert_eq!(
                skippable(json!({word: value, "properties": {"l": list}})),
                [("l".to_owned(), false)],
                "{word}"
            );
        }
    }

    #[test]
    fn schemas_whose_verdicts_depend_on_scope_are_left_alone() {
        let list = json!({"type": "array", "items": {"$ref": "#/$defs/A"}});
        for (word, value) in [
            ("$ref", json!("#")),
            ("$ref", json!("#/properties/l")),
            ("$ref", json!("other.json")),
            ("$id", json!("https://example.com/a")),
            ("$anchor", json!("a")),
            ("$dynamicRef", json!("#a")),
            ("$dynamicAnchor", json!("a")),
            ("unevaluatedItems", json!(false)),
            ("unevaluatedProperties", json!(false)),
            (KEYWORD, json!({})),
            (
                "$schema",
                json!("https://json-schema.org/draft/2020-12/schema"),
            ),
        ] {
            let schema = json!({
                "properties": {"l": list},
                "$defs": {"A": {"type": "object", "properties": {"x": {word: value}}}}
            });
            assert_eq!(rewritten(&schema), None, "{word}: {value}");
        }
        assert_eq!(
            rewritten(&json!({"properties": {"l": {"items": {"$defs": {}, "type": "string"}}}})),
            None
        );
        assert_eq!(
            rewritten(&json!({"type": "array", "items": {"type": "string"}})),
            None
        );
        assert_eq!(rewritten(&json!(true)), None);
    }

    #[test]
    fn an_array_takes_the_elements_it_opens_with_from_the_last_accepted() {
        let ends = |text: &str| -> Vec<usize> {
            let value: Vec<Value> = serde_json::from_str(text).expect("an array");
            let mut end = 1;
            value
                .iter()
                .map(|element| {
                    end += element.to_string().len() + 1;
                    end - 1
                })
                .collect()
        };
        let last = r#"[{"a":1},{"a":2},{"a":3}]"#;
        let accepted = Accepted {
            last: Some(Arc::new(AcceptedArray {
                text: last.into(),
                ends: ends(last),
            })),
        };
        for (array, leading) in [
            (last, 3),
            (r#"[{"a":1},{"a":2},{"a":3},{"a":4}]"#, 3),
            (r#"[{"a":1},{"a":2}]"#, 2),
            (r#"[{"a":1},{"a":2},{"a":30}]"#, 2),
            (r#"[{"a":1},{"a":22},{"a":3}]"#, 1),
            (r#"[{"a":1,"b":2},{"a":2}]"#, 0),
            (r#"[{"a":2},{"a":1}]"#, 0),
            ("[]", 0),
        ] {
            assert_eq!(accepted.leading(array, &ends(array)), leading, "{array}");
        }
        assert_eq!(Accepted::default().leading(last, &ends(last)), 0);
    }
}
