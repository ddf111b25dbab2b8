//! Strict-mode schemas: a JSON Schema transformed into the subset that
//! OpenAI's structured outputs accept with `strict: true`, and answers
//! written against it mapped back to the original schema.
//!
//! The transformed schema keeps the original's meaning as far as the subset
//! allows and is never stricter than the original about what is valid:
//!
//! - every object lists every property in `required`; a property the
//!   original does not require becomes nullable (`anyOf` with `null`), and
//!   [`StrictSchema::restore`] removes a `null` written there, so the answer
//!   reads as if the member were absent;
//! - every object has `additionalProperties: false`; an object whose members
//!   are free (a map, or any object) cannot be expressed;
//! - `oneOf` becomes `anyOf`, a one-element `allOf` its element, and a
//!   `$ref` loses its annotation siblings;
//! - keywords the subset lacks are dropped when they only narrow the value
//!   (`minLength`, `maxLength`, `pattern`, `uniqueItems`, `minProperties`,
//!   `maxProperties`, number formats such as `uint32`, string formats outside
//!   the supported list) and annotations other than `description` are
//!   dropped; Baton's own decode checks the original schema afterwards;
//! - `$defs` and local `$ref`s are kept, so recursive types work.
//!
//! A schema that cannot be expressed (an untyped member such as `{}`, a
//! map, `not`, conditionals, several `allOf` parts, a non-object root, more
//! than the documented size limits) is a [`StrictError`] naming the place;
//! a provider then falls back to a non-strict schema and says so in its
//! trace.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

/// String formats strict mode supports.
pub const SUPPORTED_FORMATS: [&str; 9] = [
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
];

/// Deepest object nesting strict mode accepts.
pub const MAX_NESTING: usize = 10;
/// Most object properties strict mode accepts in one schema.
pub const MAX_PROPERTIES: usize = 5_000;
/// Most enum values strict mode accepts in one schema.
pub const MAX_ENUM_VALUES: usize = 1_000;

/// Why a schema has no strict form.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("strict mode cannot express the schema at {path:?}: {reason}")]
pub struct StrictError {
    /// A JSON pointer into the original schema.
    pub path: String,
    /// What cannot be expressed.
    pub reason: String,
}

/// A schema in the strict subset, with what is needed to map an answer
/// written against it back to the original schema.
#[derive(Clone, Debug, PartialEq)]
pub struct StrictSchema {
    schema: Value,
    /// Pointers (into `schema`) of the properties made nullable.
    nullable: BTreeSet<String>,
}

impl StrictSchema {
    /// Transforms `schema` into the strict subset.
    pub fn new(schema: &Value) -> Result<StrictSchema, StrictError> {
        let root = schema.as_object().ok_or_else(|| StrictError {
            path: String::new(),
            reason: "the root is not an object schema".into(),
        })?;
        let mut transform = Transform::default();
        let mut out = Map::new();
        if let Some(defs) = root.get("$defs") {
            let defs = defs.as_object().ok_or_else(|| StrictError {
                path: "/$defs".into(),
                reason: "$defs is not an object".into(),
            })?;
            let mut strict_defs = Map::new();
            for (name, def) in defs {
                let path = format!("/$defs/{}", escape(name));
                strict_defs.insert(name.clone(), transform.node(def, &path, 0)?);
            }
            out.insert("$defs".into(), Value::Object(strict_defs));
        }
        let mut body = root.clone();
        body.remove("$defs");
        body.remove("definitions").map_or(Ok(()), |_| {
            Err(StrictError {
                path: "/definitions".into(),
                reason: "only $defs are supported".into(),
            })
        })?;
        let Value::Object(body) = transform.node(&Value::Object(body), "", 0)? else {
            unreachable!("an object schema transforms to an object");
        };
        if body.get("type").and_then(Value::as_str) != Some("object") {
            return Err(StrictError {
                path: String::new(),
                reason: "the root must be an object schema (not anyOf, not another type)".into(),
            });
        }
        out.extend(body);
        if transform.properties > MAX_PROPERTIES {
            return Err(StrictError {
                path: String::new(),
                reason: format!(
                    "{} object properties exceed the limit of {MAX_PROPERTIES}",
                    transform.properties
                ),
            });
        }
        if transform.enum_values > MAX_ENUM_VALUES {
            return Err(StrictError {
                path: String::new(),
                reason: format!(
                    "{} enum values exceed the limit of {MAX_ENUM_VALUES}",
                    transform.enum_values
                ),
            });
        }
        Ok(StrictSchema {
            schema: Value::Object(out),
            nullable: transform.nullable,
        })
    }

    /// The schema to send.
    pub fn schema(&self) -> &Value {
        &self.schema
    }

    /// Maps an answer written against the strict schema back to the
    /// original: a `null` in a member the transformation made nullable is
    /// removed, as strict mode writes an absent member that way. Anything
    /// else is left as it is.
    pub fn restore(&self, mut answer: Value) -> Value {
        self.walk(&mut answer, &self.schema, "", 0);
        answer
    }

    fn resolve<'a>(&'a self, reference: &str) -> Option<(&'a Value, String)> {
        let pointer = reference.strip_prefix('#')?;
        Some((self.schema.pointer(pointer)?, pointer.to_owned()))
    }

    fn walk(&self, value: &mut Value, schema: &Value, at: &str, depth: usize) {
        // Recursive schemas over finite answers end, but a schema that
        // refers to itself without consuming the answer must not loop.
        if depth > 256 {
            return;
        }
        if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
            if let Some((target, pointer)) = self.resolve(reference) {
                self.walk(value, target, &pointer, depth + 1);
            }
            return;
        }
        if let Some(branches) = schema.get("anyOf").and_then(Value::as_array) {
            if let Some((index, branch)) = branches
                .iter()
                .enumerate()
                .find(|(_, branch)| self.fits(value, branch, depth))
            {
                self.walk(value, branch, &format!("{at}/anyOf/{index}"), depth + 1);
            }
            return;
        }
        match value {
            Value::Object(members) => {
                let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
                    return;
                };
                for (key, property) in properties {
                    let pointer = format!("{at}/properties/{}", escape(key));
                    if members.get(key).is_some_and(Value::is_null)
                        && self.nullable.contains(&pointer)
                    {
                        members.remove(key);
                    } else if let Some(member) = members.get_mut(key) {
                        self.walk(member, property, &pointer, depth + 1);
                    }
                }
            }
            Value::Array(items) => {
                if let Some(item) = schema.get("items") {
                    for element in items {
                        self.walk(element, item, &format!("{at}/items"), depth + 1);
                    }
                }
            }
            _ => {}
        }
    }

    /// Whether `value` has the shape of `schema` at its top level (enough to
    /// choose an `anyOf` branch: in strict mode an object branch names
    /// every member).
    fn fits(&self, value: &Value, schema: &Value, depth: usize) -> bool {
        if depth > 256 {
            return false;
        }
        if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
            return self
                .resolve(reference)
                .is_some_and(|(target, _)| self.fits(value, target, depth + 1));
        }
        if let Some(branches) = schema.get("anyOf").and_then(Value::as_array) {
            return branches
                .iter()
                .any(|branch| self.fits(value, branch, depth + 1));
        }
        if let Some(options) = schema.get("enum").and_then(Value::as_array) {
            return options.contains(value);
        }
        if let Some(constant) = schema.get("const") {
            return constant == value;
        }
        let types: Vec<&str> = match schema.get("type") {
            Some(Value::String(one)) => vec![one.as_str()],
            Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
            _ => return true,
        };
        types.iter().any(|kind| match (*kind, value) {
            ("null", Value::Null) | ("boolean", Value::Bool(_)) | ("string", Value::String(_)) => {
                true
            }
            ("number", Value::Number(_)) => true,
            ("integer", Value::Number(n)) => n.is_i64() || n.is_u64(),
            ("array", Value::Array(_)) => true,
            ("object", Value::Object(members)) => {
                let properties = schema.get("properties").and_then(Value::as_object);
                properties.is_none_or(|properties| {
                    members.keys().all(|key| properties.contains_key(key))
                        && properties.keys().all(|key| members.contains_key(key))
                })
            }
            _ => false,
        })
    }
}

/// Escapes a key for a JSON pointer.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[derive(Default)]
struct Transform {
    nullable: BTreeSet<String>,
    properties: usize,
    enum_values: usize,
}

/// Keywords that only narrow a value and are dropped.
const DROPPED: [&str; 8] = [
    "minLength",
    "maxLength",
    "pattern",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "contentEncoding",
    "contentMediaType",
];

/// Annotations that are dropped (`description` is kept).
const ANNOTATIONS: [&str; 9] = [
    "title",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// Keywords that cannot be expressed.
const UNSUPPORTED: [&str; 14] = [
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "patternProperties",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "prefixItems",
    "contains",
    "minContains",
    "maxContains",
];

/// Number keywords strict mode keeps.
const NUMBER_KEYWORDS: [&str; 5] = [
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
];

impl Transform {
    fn fail(path: &str, reason: impl Into<String>) -> StrictError {
        StrictError {
            path: path.to_owned(),
            reason: reason.into(),
        }
    }

    /// Transforms one schema node; `depth` counts enclosing objects.
    fn node(&mut self, schema: &Value, path: &str, depth: usize) -> Result<Value, StrictError> {
        let map = match schema {
            Value::Object(map) => map,
            Value::Bool(true) => {
                return Err(Self::fail(path, "an untyped member (any JSON value)"));
            }
            _ => return Err(Self::fail(path, "a schema that accepts nothing")),
        };
        for keyword in UNSUPPORTED {
            if map.contains_key(keyword) {
                return Err(Self::fail(path, format!("the keyword {keyword}")));
            }
        }
        if map.contains_key("$defs") || map.contains_key("definitions") {
            return Err(Self::fail(path, "definitions below the root"));
        }
        if let Some(reference) = map.get("$ref") {
            let reference = reference
                .as_str()
                .filter(|r| *r == "#" || r.starts_with("#/$defs/"))
                .ok_or_else(|| Self::fail(path, "a $ref that is not local to $defs"))?;
            let semantic = map
                .keys()
                .any(|k| k != "$ref" && k != "description" && !ANNOTATIONS.contains(&k.as_str()));
            if semantic {
                return Err(Self::fail(path, "a $ref beside other constraints"));
            }
            let alone = Value::Object(Map::from_iter([(
                "$ref".to_owned(),
                Value::String(reference.to_owned()),
            )]));
            // A description beside a `$ref` is refused; one branch of an
            // `anyOf` keeps it.
            return Ok(match map.get("description") {
                Some(description) => Value::Object(Map::from_iter([
                    ("description".to_owned(), description.clone()),
                    ("anyOf".to_owned(), Value::Array(vec![alone])),
                ])),
                None => alone,
            });
        }
        if let Some(parts) = map.get("allOf") {
            let parts = parts.as_array().map(Vec::as_slice).unwrap_or_default();
            let others = map
                .keys()
                .any(|k| k != "allOf" && k != "description" && !ANNOTATIONS.contains(&k.as_str()));
            return match parts {
                [only] if !others => self.node(only, &format!("{path}/allOf/0"), depth),
                _ => Err(Self::fail(path, "allOf with several parts")),
            };
        }
        let mut out = Map::new();
        if let Some(description) = map.get("description") {
            out.insert("description".into(), description.clone());
        }
        let branches = map.get("anyOf").or_else(|| map.get("oneOf"));
        if let Some(branches) = branches {
            let keyword = if map.contains_key("anyOf") {
                "anyOf"
            } else {
                "oneOf"
            };
            if map.contains_key("anyOf") && map.contains_key("oneOf") {
                return Err(Self::fail(path, "anyOf beside oneOf"));
            }
            let branches = branches
                .as_array()
                .ok_or_else(|| Self::fail(path, format!("{keyword} is not a list")))?;
            let others = map
                .keys()
                .any(|k| k != keyword && k != "description" && !ANNOTATIONS.contains(&k.as_str()));
            if others {
                return Err(Self::fail(
                    path,
                    format!("{keyword} beside other constraints"),
                ));
            }
            let strict = branches
                .iter()
                .enumerate()
                .map(|(i, branch)| self.node(branch, &format!("{path}/{keyword}/{i}"), depth))
                .collect::<Result<Vec<_>, _>>()?;
            out.insert("anyOf".into(), Value::Array(strict));
            return Ok(Value::Object(out));
        }
        let types: Vec<String> = match map.get("type") {
            Some(Value::String(one)) => vec![one.clone()],
            Some(Value::Array(many)) => many
                .iter()
                .map(|t| t.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| Self::fail(path, "a type list with a non-string"))?,
            Some(_) => return Err(Self::fail(path, "a type that is not a string")),
            None => Vec::new(),
        };
        for kind in &types {
            if !matches!(
                kind.as_str(),
                "string" | "number" | "integer" | "boolean" | "object" | "array" | "null"
            ) {
                return Err(Self::fail(path, format!("the type {kind:?}")));
            }
        }
        if let Some(options) = map.get("enum") {
            let options = options
                .as_array()
                .ok_or_else(|| Self::fail(path, "enum is not a list"))?;
            self.enum_values += options.len();
            out.insert("enum".into(), Value::Array(options.clone()));
        }
        if let Some(constant) = map.get("const") {
            out.insert("const".into(), constant.clone());
        }
        let types = if types.is_empty() {
            inferred_types(&out)
                .ok_or_else(|| Self::fail(path, "an untyped member (no type, enum or const)"))?
        } else {
            types
        };
        out.insert(
            "type".into(),
            match types.as_slice() {
                [one] => Value::String(one.clone()),
                many => Value::Array(many.iter().cloned().map(Value::String).collect()),
            },
        );
        let has = |kind: &str| types.iter().any(|t| t == kind);
        if has("object") {
            self.object(map, &mut out, path, depth)?;
        }
        if has("array") {
            match map.get("items") {
                Some(items) => {
                    let items = self.node(items, &format!("{path}/items"), depth)?;
                    out.insert("items".into(), items);
                }
                None => return Err(Self::fail(path, "an array of untyped items")),
            }
            for keyword in ["minItems", "maxItems"] {
                if let Some(bound) = map.get(keyword) {
                    out.insert(keyword.into(), bound.clone());
                }
            }
        }
        if has("number") || has("integer") {
            for keyword in NUMBER_KEYWORDS {
                if let Some(bound) = map.get(keyword) {
                    out.insert(keyword.into(), bound.clone());
                }
            }
        }
        if has("string")
            && let Some(format) = map.get("format").and_then(Value::as_str)
            && SUPPORTED_FORMATS.contains(&format)
        {
            out.insert("format".into(), Value::String(format.to_owned()));
        }
        let known = |k: &str| {
            matches!(
                k,
                "type"
                    | "description"
                    | "enum"
                    | "const"
                    | "properties"
                    | "required"
                    | "additionalProperties"
                    | "items"
                    | "minItems"
                    | "maxItems"
                    | "format"
            ) || NUMBER_KEYWORDS.contains(&k)
                || DROPPED.contains(&k)
                || ANNOTATIONS.contains(&k)
                || k.starts_with("x-")
        };
        if let Some(unknown) = map.keys().find(|k| !known(k)) {
            return Err(Self::fail(path, format!("the keyword {unknown}")));
        }
        Ok(Value::Object(out))
    }

    fn object(
        &mut self,
        map: &Map<String, Value>,
        out: &mut Map<String, Value>,
        path: &str,
        depth: usize,
    ) -> Result<(), StrictError> {
        if depth + 1 > MAX_NESTING {
            return Err(Self::fail(
                path,
                format!("objects nested deeper than {MAX_NESTING} levels"),
            ));
        }
        let empty = Map::new();
        let properties = match map.get("properties") {
            Some(Value::Object(properties)) => properties,
            Some(_) => return Err(Self::fail(path, "properties is not an object")),
            None => &empty,
        };
        match map.get("additionalProperties") {
            None | Some(Value::Bool(false)) => {}
            Some(Value::Bool(true)) | Some(Value::Object(_)) if !properties.is_empty() => {
                // Extra members are allowed but not described: asking for
                // none is still valid against the original.
            }
            Some(_) => {
                return Err(Self::fail(
                    path,
                    "an object with free members (a map or any object)",
                ));
            }
        }
        if properties.is_empty() && map.get("additionalProperties") != Some(&Value::Bool(false)) {
            return Err(Self::fail(
                path,
                "an object with free members (a map or any object)",
            ));
        }
        let required: BTreeSet<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut strict = Map::new();
        for (key, property) in properties {
            self.properties += 1;
            let pointer = format!("{path}/properties/{}", escape(key));
            let mut schema = self.node(property, &pointer, depth + 1)?;
            if !required.contains(key.as_str()) && !accepts_null(&schema) {
                schema = nullable(schema);
                self.nullable.insert(pointer);
            }
            strict.insert(key.clone(), schema);
        }
        out.insert(
            "required".into(),
            Value::Array(strict.keys().cloned().map(Value::String).collect()),
        );
        out.insert("properties".into(), Value::Object(strict));
        out.insert("additionalProperties".into(), Value::Bool(false));
        Ok(())
    }
}

/// The JSON types of a node's `enum` or `const` values, when it has no type.
fn inferred_types(out: &Map<String, Value>) -> Option<Vec<String>> {
    let values: Vec<&Value> = match (out.get("enum"), out.get("const")) {
        (Some(Value::Array(options)), _) => options.iter().collect(),
        (None, Some(constant)) => vec![constant],
        _ => return None,
    };
    let mut types: Vec<String> = Vec::new();
    for value in values {
        let kind = match value {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) | Value::Object(_) => return None,
        };
        if !types.iter().any(|t| t == kind) {
            types.push(kind.to_owned());
        }
    }
    (!types.is_empty()).then_some(types)
}

/// Whether a transformed node accepts `null` by itself.
fn accepts_null(schema: &Value) -> bool {
    let typed_null = match schema.get("type") {
        Some(Value::String(one)) => one == "null",
        Some(Value::Array(many)) => many.iter().any(|t| t == "null"),
        _ => false,
    };
    let enum_null = schema
        .get("enum")
        .and_then(Value::as_array)
        .is_some_and(|options| options.contains(&Value::Null));
    let branch_null = schema
        .get("anyOf")
        .and_then(Value::as_array)
        .is_some_and(|branches| branches.iter().any(accepts_null));
    let enumerated = schema.get("enum").is_some() || schema.get("const").is_some();
    (typed_null && !enumerated) || enum_null || branch_null
}

/// `schema` or `null`: one more `anyOf` branch, or a new `anyOf` holding
/// the schema and keeping its description outside.
fn nullable(mut schema: Value) -> Value {
    if let Some(Value::Array(branches)) = schema.get_mut("anyOf") {
        branches.push(Value::Object(Map::from_iter([(
            "type".to_owned(),
            Value::String("null".into()),
        )])));
        return schema;
    }
    let description = schema
        .as_object_mut()
        .and_then(|map| map.remove("description"));
    let mut out = Map::new();
    if let Some(description) = description {
        out.insert("description".into(), description);
    }
    out.insert(
        "anyOf".into(),
        Value::Array(vec![
            schema,
            Value::Object(Map::from_iter([(
                "type".to_owned(),
                Value::String("null".into()),
            )])),
        ]),
    );
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn optional_members_become_nullable_and_read_back_as_absent() {
        let schema = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "age": {"type": "integer", "format": "uint32", "minimum": 0},
                "note": {"$ref": "#/$defs/Note", "description": "a note"}
            },
            "required": ["name"],
            "$defs": {"Note": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}
        });
        let strict = StrictSchema::new(&schema).expect("expressible");
        assert_eq!(
            strict.schema(),
            &json!({
                "$defs": {"Note": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"], "additionalProperties": false}},
                "type": "object",
                "properties": {
                    "age": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
                    "name": {"type": "string"},
                    "note": {"description": "a note", "anyOf": [{"$ref": "#/$defs/Note"}, {"type": "null"}]}
                },
                "required": ["age", "name", "note"],
                "additionalProperties": false
            })
        );
        assert_eq!(
            strict.restore(json!({"name": "a", "age": null, "note": {"text": "t"}})),
            json!({"name": "a", "note": {"text": "t"}})
        );
    }

    #[test]
    fn untyped_members_maps_and_non_object_roots_are_inexpressible() {
        for (schema, path) in [
            (
                json!({"type": "object", "properties": {"x": true}}),
                "/properties/x",
            ),
            (
                json!({"type": "object", "properties": {"x": {}}}),
                "/properties/x",
            ),
            (
                json!({"type": "object", "additionalProperties": {"type": "string"}}),
                "",
            ),
            (json!({"type": "string"}), ""),
            (
                json!({"type": "object", "properties": {"x": {"not": {"type": "string"}}}}),
                "/properties/x",
            ),
        ] {
            let error = StrictSchema::new(&schema).expect_err("inexpressible");
            assert_eq!(error.path, path, "{error}");
        }
    }
}
