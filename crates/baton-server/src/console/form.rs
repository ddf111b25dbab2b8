//! Answer forms generated from a wait's answer schema, and the answer read
//! back from a posted form.
//!
//! The supported shapes are strings (with `minLength`, `maxLength` and
//! `pattern` as HTML constraints), numbers and integers (`minimum`,
//! `maximum`), booleans, enums and `const` (a select), objects with
//! `properties` (a fieldset per object, `required` honoured), and a type
//! with `null` beside one other (an empty field is `null`). Anything else
//! (arrays, `oneOf`, references) is a JSON text field. The page checks the
//! HTML constraints and JSON syntax; the server reads the form back here
//! (a field that does not parse is an error on that field) and the engine
//! then checks the whole answer against the schema, so nothing is written
//! unless both agree.

use std::collections::BTreeMap;

use maud::{Markup, html};
use serde_json::{Map, Number, Value};

/// How deep objects nest before the rest is a JSON field.
const MAX_DEPTH: usize = 8;

/// The form field name of the answer's root value; nested fields append a
/// JSON pointer (`v/address/city`).
const ROOT: &str = "v";

/// What a field edits.
#[derive(Clone, Debug, PartialEq)]
enum Kind {
    Text {
        min_length: Option<u64>,
        max_length: Option<u64>,
        pattern: Option<String>,
    },
    Number {
        integer: bool,
        minimum: Option<f64>,
        maximum: Option<f64>,
    },
    Boolean,
    Choice(Vec<Value>),
    Object(Vec<Node>),
    Json,
}

/// One field: where it sits in the answer, its label and what it edits.
#[derive(Clone, Debug, PartialEq)]
struct Node {
    /// The form field name (`v` plus a JSON pointer).
    name: String,
    label: String,
    description: Option<String>,
    required: bool,
    nullable: bool,
    kind: Kind,
}

/// The form of one answer schema.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct AnswerForm {
    root: Node,
}

/// Values a posted form carried, by field name, to show again beside the
/// errors.
pub(crate) type Posted = BTreeMap<String, String>;

/// What a rejected answer shows: errors by field name (`""` for the whole
/// answer).
pub(crate) type FieldErrors = BTreeMap<String, String>;

fn pointer_part(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The one type of `schema` other than `null`, and whether `null` is
/// allowed beside it.
fn single_type(schema: &Map<String, Value>) -> (Option<&str>, bool) {
    match schema.get("type") {
        Some(Value::String(kind)) => (Some(kind.as_str()), false),
        Some(Value::Array(kinds)) => {
            let names: Vec<&str> = kinds.iter().filter_map(Value::as_str).collect();
            let nullable = names.contains(&"null");
            let others: Vec<&str> = names.into_iter().filter(|kind| *kind != "null").collect();
            match others.as_slice() {
                [one] => (Some(*one), nullable),
                _ => (None, nullable),
            }
        }
        _ => (None, false),
    }
}

fn node(schema: &Value, name: String, label: String, required: bool, depth: usize) -> Node {
    let empty = Map::new();
    let object = schema.as_object().unwrap_or(&empty);
    let description = object
        .get("description")
        .or_else(|| object.get("title"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let (kind_name, nullable) = single_type(object);
    let uint = |key: &str| object.get(key).and_then(Value::as_u64);
    let float = |key: &str| object.get(key).and_then(Value::as_f64);
    let kind = if let Some(Value::Array(options)) = object.get("enum") {
        Kind::Choice(options.clone())
    } else if let Some(value) = object.get("const") {
        Kind::Choice(vec![value.clone()])
    } else {
        match kind_name {
            Some("string") => Kind::Text {
                min_length: uint("minLength"),
                max_length: uint("maxLength"),
                pattern: object
                    .get("pattern")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            },
            Some(kind @ ("number" | "integer")) => Kind::Number {
                integer: kind == "integer",
                minimum: float("minimum"),
                maximum: float("maximum"),
            },
            Some("boolean") => Kind::Boolean,
            Some("object") if depth < MAX_DEPTH => match object.get("properties") {
                Some(Value::Object(properties)) => {
                    let required_keys: Vec<&str> = object
                        .get("required")
                        .and_then(Value::as_array)
                        .map(|keys| keys.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    Kind::Object(
                        properties
                            .iter()
                            .map(|(key, schema)| {
                                node(
                                    schema,
                                    format!("{name}/{}", pointer_part(key)),
                                    key.clone(),
                                    required_keys.contains(&key.as_str()),
                                    depth + 1,
                                )
                            })
                            .collect(),
                    )
                }
                _ => Kind::Json,
            },
            _ => Kind::Json,
        }
    };
    Node {
        name,
        label,
        description,
        required,
        nullable,
        kind,
    }
}

impl AnswerForm {
    /// The form of an answer schema (a JSON Schema as JSON).
    pub(crate) fn of(schema: &Value) -> AnswerForm {
        AnswerForm {
            root: node(schema, ROOT.to_owned(), "Answer".to_owned(), true, 0),
        }
    }

    /// The form's fields, their ids prefixed with `id` (unique on the
    /// page), showing `posted` values and `errors` beside their fields.
    pub(crate) fn fields(&self, id: &str, posted: &Posted, errors: &FieldErrors) -> Markup {
        field(&self.root, id, posted, errors)
    }

    /// Reads the answer a form posted; errors by field name when a field
    /// does not parse.
    pub(crate) fn read(&self, posted: &Posted) -> Result<Value, FieldErrors> {
        let mut errors = FieldErrors::new();
        let value = read(&self.root, posted, &mut errors);
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(value.unwrap_or(Value::Null))
    }
}

/// A field's HTML id: the form's id and the field name, made safe.
fn html_id(form: &str, name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("{form}-{safe}")
}

/// An option's label: a string as itself, anything else as JSON.
fn option_label(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

fn number_text(value: f64) -> String {
    let text = value.to_string();
    text.strip_suffix(".0").map(str::to_owned).unwrap_or(text)
}

fn field(node: &Node, form: &str, posted: &Posted, errors: &FieldErrors) -> Markup {
    let id = html_id(form, &node.name);
    let error_id = format!("{id}-error");
    let error = errors.get(&node.name);
    let value = posted.get(&node.name).cloned().unwrap_or_default();
    let hint = html! {
        @if let Some(description) = &node.description { span.hint { (description) } }
        span.field-error id=(error_id) role="alert" { @if let Some(error) = error { (error) } }
    };
    match &node.kind {
        Kind::Object(children) => html! {
            fieldset.object {
                legend { (node.label) @if !node.required { " (optional)" } }
                (hint)
                @for child in children { (field(child, form, posted, errors)) }
            }
        },
        Kind::Boolean => html! {
            div.field.checkbox {
                input type="checkbox" id=(id) name=(node.name) value="true"
                    aria-describedby=(error_id) checked[value == "true"];
                label for=(id) { (node.label) }
                (hint)
            }
        },
        Kind::Choice(options) => html! {
            div.field {
                label for=(id) { (node.label) @if !node.required { " (optional)" } }
                select id=(id) name=(node.name) aria-describedby=(error_id) required[node.required] {
                    @if !node.required || options.len() > 1 {
                        option value="" selected[value.is_empty()] { "Choose…" }
                    }
                    @for option in options {
                        @let text = option.to_string();
                        option value=(text) selected[value == text || options.len() == 1] { (option_label(option)) }
                    }
                }
                (hint)
            }
        },
        Kind::Text {
            min_length,
            max_length,
            pattern,
        } => html! {
            div.field {
                label for=(id) { (node.label) @if !node.required { " (optional)" } }
                input type="text" id=(id) name=(node.name) value=(value) aria-describedby=(error_id)
                    required[node.required && min_length.is_some_and(|min| min > 0)]
                    minlength=[min_length] maxlength=[max_length] pattern=[pattern.as_deref()]
                    autocomplete="off";
                (hint)
            }
        },
        Kind::Number {
            integer,
            minimum,
            maximum,
        } => html! {
            div.field {
                label for=(id) { (node.label) @if !node.required { " (optional)" } }
                input type="number" id=(id) name=(node.name) value=(value) aria-describedby=(error_id)
                    step=(if *integer { "1" } else { "any" }) required[node.required && !node.nullable]
                    min=[minimum.map(number_text)] max=[maximum.map(number_text)];
                (hint)
            }
        },
        Kind::Json => html! {
            div.field {
                label for=(id) { (node.label) " (JSON)" @if !node.required { " (optional)" } }
                textarea id=(id) name=(node.name) rows="3" data-json="" aria-describedby=(error_id)
                    required[node.required] { (value) }
                (hint)
            }
        },
    }
}

/// The value of `node` in `posted`; `None` when an optional field was left
/// empty (so it is left out of its object).
fn read(node: &Node, posted: &Posted, errors: &mut FieldErrors) -> Option<Value> {
    let text = posted.get(&node.name).map(String::as_str).unwrap_or("");
    let empty = text.trim().is_empty();
    let mut fail = |message: String| {
        errors.insert(node.name.clone(), message);
        None
    };
    let absent = |node: &Node| {
        if node.nullable {
            Some(Value::Null)
        } else {
            None
        }
    };
    match &node.kind {
        Kind::Object(children) => {
            let mut object = Map::new();
            for child in children {
                if let Some(value) = read(child, posted, errors) {
                    object.insert(child.label.clone(), value);
                }
            }
            Some(Value::Object(object))
        }
        Kind::Boolean => Some(Value::Bool(text == "true")),
        Kind::Text { .. } => {
            if text.is_empty() && !node.required {
                absent(node)
            } else {
                Some(Value::String(text.to_owned()))
            }
        }
        Kind::Choice(options) => {
            if empty {
                if node.required {
                    return fail("choose one".to_owned());
                }
                return absent(node);
            }
            match serde_json::from_str::<Value>(text) {
                Ok(value) if options.contains(&value) => Some(value),
                _ => fail(format!("{text} is not one of the choices")),
            }
        }
        Kind::Number { integer, .. } => {
            if empty {
                if node.required && !node.nullable {
                    return fail("enter a number".to_owned());
                }
                return absent(node);
            }
            let text = text.trim();
            if *integer {
                match text.parse::<i64>() {
                    Ok(whole) => Some(Value::from(whole)),
                    Err(_) => fail(format!("{text} is not a whole number")),
                }
            } else {
                match text.parse::<f64>().ok().and_then(Number::from_f64) {
                    Some(number) => Some(Value::Number(number)),
                    None => fail(format!("{text} is not a number")),
                }
            }
        }
        Kind::Json => {
            if empty {
                if node.required {
                    return fail("enter a JSON value".to_owned());
                }
                return absent(node);
            }
            match serde_json::from_str::<Value>(text) {
                Ok(value) => Some(value),
                Err(error) => fail(format!("not JSON: {error}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn posted(pairs: &[(&str, &str)]) -> Posted {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    fn schema() -> Value {
        serde_json::json!({
            "type": "object",
            "required": ["approve", "reason", "amount", "count", "level"],
            "properties": {
                "approve": {"type": "boolean"},
                "reason": {"type": "string", "minLength": 3, "description": "Why"},
                "amount": {"type": "number", "minimum": 0},
                "count": {"type": "integer", "maximum": 10},
                "level": {"enum": ["low", "high", 3]},
                "note": {"type": ["string", "null"]},
                "extra": {"type": "array", "items": {"type": "string"}},
                "address": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}, "a/b": {"type": "integer"}}}
            }
        })
    }

    #[test]
    fn a_form_reads_back_every_supported_field_kind() {
        let form = AnswerForm::of(&schema());
        let answer = form
            .read(&posted(&[
                ("v/approve", "true"),
                ("v/reason", "looks fine"),
                ("v/amount", "12.5"),
                ("v/count", "3"),
                ("v/level", "3"),
                ("v/note", ""),
                ("v/extra", r#"["a","b"]"#),
                ("v/address/city", "Lyon"),
                ("v/address/a~1b", ""),
            ]))
            .unwrap();
        assert_eq!(
            answer,
            serde_json::json!({
                "approve": true, "reason": "looks fine", "amount": 12.5, "count": 3,
                "level": 3, "note": null, "extra": ["a", "b"], "address": {"city": "Lyon"}
            })
        );
    }

    #[test]
    fn fields_that_do_not_parse_are_errors_on_those_fields() {
        let form = AnswerForm::of(&schema());
        let errors = form
            .read(&posted(&[
                ("v/reason", "ok"),
                ("v/amount", "twelve"),
                ("v/count", "2.5"),
                ("v/level", r#""medium""#),
                ("v/extra", "[1,"),
                ("v/address/city", "x"),
            ]))
            .unwrap_err();
        let names: Vec<&str> = errors.keys().map(String::as_str).collect();
        assert_eq!(names, ["v/amount", "v/count", "v/extra", "v/level"]);
        assert!(errors["v/count"].contains("whole number"), "{errors:?}");
    }

    #[test]
    fn every_field_is_labelled_and_carries_its_html_constraints() {
        let form = AnswerForm::of(&schema());
        let html = form
            .fields("w1", &Posted::new(), &FieldErrors::new())
            .into_string();
        for id in [
            "w1-v-approve",
            "w1-v-reason",
            "w1-v-amount",
            "w1-v-count",
            "w1-v-level",
            "w1-v-note",
            "w1-v-extra",
            "w1-v-address-city",
        ] {
            assert!(html.contains(&format!("for=\"{id}\"")), "{id} in {html}");
            assert!(html.contains(&format!("id=\"{id}\"")), "{id} in {html}");
        }
        assert!(html.contains(r#"minlength="3""#), "{html}");
        assert!(html.contains(r#"step="1""#) && html.contains(r#"max="10""#));
        assert!(html.contains(r#"min="0""#), "{html}");
        assert!(
            html.contains("<legend>address (optional)</legend>"),
            "{html}"
        );
        assert!(html.contains("data-json"), "{html}");
    }

    #[test]
    fn a_plain_string_schema_is_one_text_field_and_a_number_one_number_field() {
        let form = AnswerForm::of(&serde_json::json!({"type": "string"}));
        assert_eq!(
            form.read(&posted(&[("v", "ship it")])).unwrap(),
            Value::from("ship it")
        );
        let form = AnswerForm::of(&serde_json::json!({"type": "integer"}));
        assert_eq!(form.read(&posted(&[("v", " 7 ")])).unwrap(), Value::from(7));
        assert!(form.read(&posted(&[("v", "")])).is_err());
        let form = AnswerForm::of(&serde_json::json!(true));
        assert_eq!(
            form.read(&posted(&[("v", "{\"a\":1}")])).unwrap(),
            serde_json::json!({"a": 1})
        );
    }
}
