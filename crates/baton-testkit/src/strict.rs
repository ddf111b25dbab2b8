//! A checker of OpenAI's published rules for strict structured outputs
//! ("Structured Outputs", section "Supported schemas", of OpenAI's platform
//! documentation), written independently of the transformation it checks,
//! so a provider's strict schemas can be held to the rules in tests.
//!
//! Each rule quotes the documentation; one rule (`ref-alone`) is not in the
//! published list but was observed (issue 16: a `$ref` beside a
//! `description` is refused) and says so.

use serde_json::Value;

/// One strict-mode rule and the documentation it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StrictRule {
    /// A short stable id.
    pub id: &'static str,
    /// The rule as documented (or observed).
    pub quote: &'static str,
}

/// "Root objects must not be anyOf and must be an object".
pub const ROOT_OBJECT: StrictRule = StrictRule {
    id: "root-object",
    quote: "Root objects must not be anyOf and must be an object",
};
/// "All fields must be required".
pub const ALL_REQUIRED: StrictRule = StrictRule {
    id: "all-required",
    quote: "All fields must be required: To use Structured Outputs, all fields or function parameters must be specified as required.",
};
/// "additionalProperties: false must always be set in objects".
pub const NO_ADDITIONAL: StrictRule = StrictRule {
    id: "additional-properties",
    quote: "additionalProperties: false must always be set in objects",
};
/// The supported types: a schema must say which it is.
pub const SUPPORTED_TYPES: StrictRule = StrictRule {
    id: "supported-types",
    quote: "Supported types: The following types are supported for Structured Outputs: String, Number, Boolean, Integer, Object, Array, Enum, anyOf",
};
/// Keywords outside the supported properties, composition included.
pub const SUPPORTED_KEYWORDS: StrictRule = StrictRule {
    id: "supported-keywords",
    quote: "Supported properties: ... Supported string properties: pattern, format. Supported number properties: multipleOf, maximum, exclusiveMaximum, minimum, exclusiveMinimum. Supported array properties: minItems, maxItems. Some type-specific keywords are not yet supported: Composition: allOf, not, dependentRequired, dependentSchemas, if, then, else",
};
/// The supported string formats.
pub const FORMATS: StrictRule = StrictRule {
    id: "formats",
    quote: "format: Predefined formats for strings. Supported formats are: date-time, time, date, duration, email, hostname, ipv4, ipv6, uuid",
};
/// Size and nesting limits.
pub const LIMITS: StrictRule = StrictRule {
    id: "limits",
    quote: "Objects have limitations on nesting depth and size: A schema may have up to 5000 object properties total, with up to 10 levels of nesting. ... A schema may have up to 1000 enum values across all enum properties. ... total string length of all property names, definition names, enum values, and const values cannot exceed 120,000 characters",
};
/// Definitions and references.
pub const DEFINITIONS: StrictRule = StrictRule {
    id: "definitions",
    quote: "Definitions are supported: You can use definitions to define subschemas which are referenced throughout your schema. ... Recursive schemas are supported: Sample recursive schema using # to indicate root recursion.",
};
/// Observed, not published: a `$ref` stands alone.
pub const REF_ALONE: StrictRule = StrictRule {
    id: "ref-alone",
    quote: "(observed, issue 16; not in the published list) a $ref with sibling keywords, such as a description, is refused",
};

/// Every rule the checker applies.
pub const RULES: [StrictRule; 9] = [
    ROOT_OBJECT,
    ALL_REQUIRED,
    NO_ADDITIONAL,
    SUPPORTED_TYPES,
    SUPPORTED_KEYWORDS,
    FORMATS,
    LIMITS,
    DEFINITIONS,
    REF_ALONE,
];

/// Where a schema breaks a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StrictViolation {
    /// The rule broken.
    pub rule: StrictRule,
    /// A JSON pointer to the offending schema.
    pub path: String,
    /// What is wrong there.
    pub detail: String,
}

const FORMAT_VALUES: [&str; 9] = [
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

const KEYWORDS: [&str; 21] = [
    "type",
    "description",
    "title",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "anyOf",
    "$ref",
    "$defs",
    "pattern",
    "format",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "minItems",
    "maxItems",
];

const TYPES: [&str; 7] = [
    "string", "number", "boolean", "integer", "object", "array", "null",
];

struct Checker<'a> {
    root: &'a Value,
    found: Vec<StrictViolation>,
    properties: usize,
    enum_values: usize,
    strings: usize,
}

impl Checker<'_> {
    fn flag(&mut self, rule: StrictRule, path: &str, detail: impl Into<String>) {
        self.found.push(StrictViolation {
            rule,
            path: path.to_owned(),
            detail: detail.into(),
        });
    }

    fn node(&mut self, schema: &Value, path: &str, depth: usize) {
        let Some(map) = schema.as_object() else {
            self.flag(SUPPORTED_TYPES, path, "a boolean schema");
            return;
        };
        for key in map.keys() {
            if !KEYWORDS.contains(&key.as_str()) {
                self.flag(SUPPORTED_KEYWORDS, path, format!("the keyword {key}"));
            }
        }
        if path.is_empty() {
            let is_object = map.get("type").and_then(Value::as_str) == Some("object");
            if map.contains_key("anyOf") || !is_object {
                self.flag(ROOT_OBJECT, path, "the root is not a plain object schema");
            }
        } else if map.contains_key("$defs") {
            self.flag(DEFINITIONS, path, "$defs below the root");
        }
        if let Some(reference) = map.get("$ref") {
            if map.len() > 1 {
                self.flag(REF_ALONE, path, "a $ref with siblings");
            }
            let target = reference
                .as_str()
                .and_then(|r| r.strip_prefix('#'))
                .and_then(|pointer| self.root.pointer(pointer));
            if target.is_none() {
                self.flag(
                    DEFINITIONS,
                    path,
                    format!("the $ref {reference} does not resolve locally"),
                );
            }
            return;
        }
        if let Some(branches) = map.get("anyOf") {
            match branches.as_array() {
                Some(branches) => {
                    for (i, branch) in branches.iter().enumerate() {
                        self.node(branch, &format!("{path}/anyOf/{i}"), depth);
                    }
                }
                None => self.flag(SUPPORTED_TYPES, path, "anyOf is not a list"),
            }
            return;
        }
        if let Some(options) = map.get("enum").and_then(Value::as_array) {
            self.enum_values += options.len();
            self.strings += options
                .iter()
                .filter_map(Value::as_str)
                .map(str::len)
                .sum::<usize>();
        }
        if let Some(Value::String(constant)) = map.get("const") {
            self.strings += constant.len();
        }
        let types: Vec<&str> = match map.get("type") {
            Some(Value::String(one)) => vec![one.as_str()],
            Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
            Some(_) => {
                self.flag(SUPPORTED_TYPES, path, "a type that is not a name");
                return;
            }
            None if map.contains_key("enum") || map.contains_key("const") => Vec::new(),
            None => {
                self.flag(SUPPORTED_TYPES, path, "a schema without a type");
                return;
            }
        };
        for kind in &types {
            if !TYPES.contains(kind) {
                self.flag(SUPPORTED_TYPES, path, format!("the type {kind}"));
            }
        }
        if let Some(format) = map.get("format") {
            let supported = types.contains(&"string")
                && format.as_str().is_some_and(|f| FORMAT_VALUES.contains(&f));
            if !supported {
                self.flag(FORMATS, path, format!("the format {format}"));
            }
        }
        if types.contains(&"object") {
            self.object(map, path, depth + 1);
        }
        if types.contains(&"array") {
            match map.get("items") {
                Some(items) => self.node(items, &format!("{path}/items"), depth),
                None => self.flag(SUPPORTED_TYPES, path, "an array without items"),
            }
        }
    }

    fn object(&mut self, map: &serde_json::Map<String, Value>, path: &str, depth: usize) {
        if depth > 10 {
            self.flag(LIMITS, path, format!("object nesting level {depth}"));
        }
        if map.get("additionalProperties") != Some(&Value::Bool(false)) {
            self.flag(NO_ADDITIONAL, path, "additionalProperties is not false");
        }
        let properties = map
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let required: Vec<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for (key, property) in &properties {
            self.properties += 1;
            self.strings += key.len();
            if !required.contains(&key.as_str()) {
                self.flag(
                    ALL_REQUIRED,
                    path,
                    format!("the property {key} is not required"),
                );
            }
            self.node(property, &format!("{path}/properties/{key}"), depth);
        }
    }
}

/// Every place `schema` breaks a strict-mode rule; empty when it keeps
/// them all.
pub fn check_openai_strict(schema: &Value) -> Vec<StrictViolation> {
    let mut checker = Checker {
        root: schema,
        found: Vec::new(),
        properties: 0,
        enum_values: 0,
        strings: 0,
    };
    if let Some(defs) = schema.get("$defs") {
        match defs.as_object() {
            Some(defs) => {
                for (name, def) in defs {
                    checker.strings += name.len();
                    checker.node(def, &format!("/$defs/{name}"), 0);
                }
            }
            None => checker.flag(DEFINITIONS, "/$defs", "$defs is not an object"),
        }
    }
    checker.node(schema, "", 0);
    if checker.properties > 5000 {
        let detail = format!("{} object properties", checker.properties);
        checker.flag(LIMITS, "", detail);
    }
    if checker.enum_values > 1000 {
        let detail = format!("{} enum values", checker.enum_values);
        checker.flag(LIMITS, "", detail);
    }
    if checker.strings > 120_000 {
        let detail = format!("{} characters of names and values", checker.strings);
        checker.flag(LIMITS, "", detail);
    }
    checker.found
}
