//! Schema validation of payload text agrees with validation of the payload's
//! `serde_json::Value`: the same verdict for every schema and instance, and
//! the same violation for every rejected payload.

use std::path::PathBuf;

use baton_run::program::{ChildSignal, Descriptor, Schema};
use baton_run::{Budget, Cause, Failure, FailureKind, Payload, SignalId, Termination, Usage};
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Map, Value, json};

/// Checks text validation against value validation for one instance.
fn agree(schema: &Schema, instance: &Value) -> Result<(), TestCaseError> {
    let payload = Payload::from_value(instance).expect("small JSON encodes");
    let value = payload.to_value();
    let expected = schema.validate_value(&value);
    prop_assert_eq!(
        schema.is_valid(&payload),
        expected.is_ok(),
        "schema {} instance {}",
        schema.json().as_str(),
        payload.as_str()
    );
    prop_assert_eq!(schema.validate(&payload), expected);
    Ok(())
}

// ---------------------------------------------------------------------------
// Instances: a small vocabulary, so that random instances often meet a
// schema's names, constants and bounds exactly, or just miss them.

const NAMES: &[&str] = &["a", "b", "c", "é", "a\"b", "\n", "p"];

const STRINGS: &[&str] = &[
    "",
    "a",
    "ab",
    "abc",
    "é",
    "éé",
    "🦀",
    "🦀🦀",
    "a\nb",
    "\u{1}",
    "\u{1f}\u{1f}",
    "\t",
    "\n\n\n\n\n",
    "x\\y",
    "\"q\"",
    "p_0123456789abcdef0123456789abcdef",
    "p_0123456789ABCDEF0123456789abcdef",
    "2024-01-02",
    "2024-13-45",
    "a@b.c",
];

/// Number literals as serde_json reads them: integers, floats that are
/// whole, fractions, exponents, extremes, and a literal past `u64`.
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "3",
    "1.0",
    "1.5",
    "1e2",
    "-0.0",
    "0.1",
    "0.30000000000000004",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "1e300",
    "-2.5",
    "100",
];

fn number(index: usize) -> Value {
    serde_json::from_str(NUMBERS[index % NUMBERS.len()]).expect("a number literal")
}

fn string(index: usize) -> Value {
    Value::String(STRINGS[index % STRINGS.len()].to_owned())
}

fn name(index: usize) -> String {
    NAMES[index % NAMES.len()].to_owned()
}

fn leaf() -> impl Strategy<Value = Value> + Clone {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<usize>().prop_map(number),
        any::<usize>().prop_map(string),
    ]
}

fn instance() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((any::<usize>().prop_map(name), inner), 0..4)
                .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

// ---------------------------------------------------------------------------
// Schemas: any keyword of draft 2020-12 that does not reach outside the
// document, nested, with local references into `$defs`.

const PATTERNS: &[&str] = &[
    "^a",
    "b$",
    "^p_[0-9a-f]{32}$",
    "é",
    "^\\p{L}+$",
    "^.{2}$",
    "\\d",
];
const FORMATS: &[&str] = &["date", "email", "uint64", "uri", "ipv4", "unknown-format"];
const TYPES: &[&str] = &[
    "null", "boolean", "integer", "number", "string", "array", "object",
];

fn small() -> impl Strategy<Value = Value> + Clone {
    (0u64..6).prop_map(Value::from)
}

/// One keyword with its value, built from `inner` subschemas.
fn keyword(inner: BoxedStrategy<Value>) -> impl Strategy<Value = (String, Value)> {
    let named = |word: &str| word.to_owned();
    let subschemas = prop::collection::vec(inner.clone(), 1..4).prop_map(Value::Array);
    let properties = prop::collection::vec((any::<usize>().prop_map(name), inner.clone()), 0..4)
        .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>()));
    let names = prop::collection::vec(
        any::<usize>().prop_map(|index| Value::from(name(index))),
        0..3,
    )
    .prop_map(Value::Array);
    prop_oneof![
        prop::sample::select(TYPES).prop_map(move |kind| (named("type"), json!(kind))),
        prop::collection::vec(prop::sample::select(TYPES), 1..3).prop_map(move |kinds| {
            let mut kinds: Vec<&str> = kinds;
            kinds.sort_unstable();
            kinds.dedup();
            (named("type"), json!(kinds))
        }),
        properties.prop_map(move |value| (named("properties"), value)),
        names
            .clone()
            .prop_map(move |value| (named("required"), value)),
        prop_oneof![any::<bool>().prop_map(Value::Bool), inner.clone()]
            .prop_map(move |value| (named("additionalProperties"), value)),
        inner.clone().prop_map(move |value| (named("items"), value)),
        subschemas
            .clone()
            .prop_map(move |value| (named("prefixItems"), value)),
        instance().prop_map(move |value| (named("const"), value)),
        prop::collection::vec(instance(), 1..4)
            .prop_map(move |values| (named("enum"), json!(values))),
        subschemas
            .clone()
            .prop_map(move |value| (named("oneOf"), value)),
        subschemas
            .clone()
            .prop_map(move |value| (named("anyOf"), value)),
        subschemas.prop_map(move |value| (named("allOf"), value)),
        inner.clone().prop_map(move |value| (named("not"), value)),
        (
            prop::sample::select(
                &[
                    "minimum",
                    "maximum",
                    "exclusiveMinimum",
                    "exclusiveMaximum",
                    "multipleOf",
                ][..]
            ),
            any::<usize>().prop_map(number),
        )
            .prop_filter("multipleOf is positive", |(word, value)| {
                *word != "multipleOf" || value.as_f64().is_some_and(|value| value > 0.0)
            })
            .prop_map(move |(word, value)| (named(word), value)),
        (
            prop::sample::select(
                &[
                    "minLength",
                    "maxLength",
                    "minItems",
                    "maxItems",
                    "minProperties",
                    "maxProperties",
                ][..]
            ),
            small(),
        )
            .prop_map(move |(word, value)| (named(word), value)),
        prop::sample::select(PATTERNS).prop_map(move |pattern| (named("pattern"), json!(pattern))),
        prop::sample::select(FORMATS).prop_map(move |format| (named("format"), json!(format))),
        prop::sample::select(&["#/$defs/A", "#/$defs/B", "#"][..])
            .prop_map(move |target| (named("$ref"), json!(target))),
        (inner.clone(), inner.clone(), inner.clone()).prop_map(move |(when, then, otherwise)| {
            (
                named("if"),
                json!({"$comment": "split below", "if": when, "then": then, "else": otherwise}),
            )
        }),
        (prop::sample::select(PATTERNS), inner.clone()).prop_map(move |(pattern, schema)| (
            named("patternProperties"),
            json!({ pattern: schema })
        )),
        inner
            .clone()
            .prop_map(move |value| (named("propertyNames"), value)),
        inner
            .clone()
            .prop_map(move |value| (named("contains"), value)),
        any::<bool>().prop_map(move |unique| (named("uniqueItems"), json!(unique))),
        prop_oneof![Just(Value::Bool(false)), inner.clone()]
            .prop_map(move |value| (named("unevaluatedProperties"), value)),
        prop_oneof![Just(Value::Bool(false)), inner]
            .prop_map(move |value| (named("unevaluatedItems"), value)),
        (any::<usize>(), names).prop_map(move |(index, value)| {
            (named("dependentRequired"), json!({ name(index): value }))
        }),
        Just((named("description"), json!("an annotation"))),
        Just((named("default"), json!({"a": 1}))),
        Just((named("deprecated"), json!(true))),
    ]
}

/// A schema object of up to four keywords (an `if` keyword carries its
/// `then` and `else`).
fn schema_object(inner: BoxedStrategy<Value>) -> impl Strategy<Value = Value> {
    prop::collection::vec(keyword(inner), 0..5).prop_map(|keywords| {
        let mut schema = Map::new();
        for (word, value) in keywords {
            if word == "if" {
                for branch in ["if", "then", "else"] {
                    schema.insert(branch.to_owned(), value[branch].clone());
                }
            } else {
                schema.insert(word, value);
            }
        }
        Value::Object(schema)
    })
}

fn subschema() -> BoxedStrategy<Value> {
    let base = prop_oneof![
        any::<bool>().prop_map(Value::Bool),
        schema_object(Just(json!({})).boxed()),
    ];
    base.prop_recursive(3, 24, 4, |inner| schema_object(inner.boxed()))
        .boxed()
}

/// A root schema with two definitions its `$ref`s point at.
fn root_schema() -> impl Strategy<Value = Value> {
    (schema_object(subschema()), subschema(), subschema()).prop_map(|(root, a, b)| {
        let mut root = match root {
            Value::Object(root) => root,
            _ => unreachable!("schema_object builds objects"),
        };
        root.insert("$defs".to_owned(), json!({"A": a, "B": b}));
        Value::Object(root)
    })
}

// ---------------------------------------------------------------------------
// Instances drawn from a schema: mostly satisfying it, with near misses.

/// A deterministic stream of choices.
struct Choices(u64);

impl Choices {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound.max(1) as u64) as usize
    }

    fn one_in(&mut self, odds: usize) -> bool {
        self.below(odds) == 0
    }
}

/// An instance meant to satisfy `schema` (found in `root`), with a small
/// chance at every node of a near miss: a wrong or neighbouring value, a
/// required member dropped, an unknown member added.
fn draw(root: &Value, schema: &Value, choices: &mut Choices, depth: usize) -> Value {
    if choices.one_in(12) || depth > 8 {
        return near_miss(choices);
    }
    let Some(object) = schema.as_object() else {
        return near_miss(choices);
    };
    if let Some(target) = object.get("$ref").and_then(Value::as_str) {
        let resolved = target
            .strip_prefix("#/$defs/")
            .and_then(|name| root["$defs"].get(name))
            .unwrap_or(root);
        if choices.below(4) > 0 {
            return draw(root, resolved, choices, depth + 1);
        }
    }
    if let Some(value) = object.get("const") {
        return respell(value, choices);
    }
    if let Some(Value::Array(values)) = object.get("enum") {
        return respell(&values[choices.below(values.len())], choices);
    }
    for word in ["oneOf", "anyOf", "allOf"] {
        if let Some(Value::Array(branches)) = object.get(word) {
            let branch = &branches[choices.below(branches.len())];
            return draw(root, branch, choices, depth + 1);
        }
    }
    let kind = match object.get("type") {
        Some(Value::String(kind)) => kind.clone(),
        Some(Value::Array(kinds)) if !kinds.is_empty() => kinds[choices.below(kinds.len())]
            .as_str()
            .unwrap_or("null")
            .to_owned(),
        _ if object.contains_key("properties") => "object".to_owned(),
        _ if object.contains_key("items") => "array".to_owned(),
        _ => return near_miss(choices),
    };
    match kind.as_str() {
        "object" => {
            let mut members = Map::new();
            if let Some(Value::Object(properties)) = object.get("properties") {
                let required: Vec<&str> = object
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|names| names.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                for (name, property) in properties {
                    let wanted = required.contains(&name.as_str()) || choices.below(3) > 0;
                    // A required member is dropped now and then.
                    if wanted && !choices.one_in(20) {
                        members.insert(name.clone(), draw(root, property, choices, depth + 1));
                    }
                }
            }
            if choices.one_in(15) {
                members.insert(name(choices.below(NAMES.len())), near_miss(choices));
            }
            Value::Object(members)
        }
        "array" => {
            let items = object.get("items").cloned().unwrap_or(json!({}));
            let count = choices.below(4);
            Value::Array(
                (0..count)
                    .map(|_| draw(root, &items, choices, depth + 1))
                    .collect(),
            )
        }
        "string" => match object.get("pattern").and_then(Value::as_str) {
            Some("^p_[0-9a-f]{32}$") if !choices.one_in(6) => {
                json!(format!("p_{:032x}", u128::from(choices.next())))
            }
            _ => string(choices.below(STRINGS.len())),
        },
        "integer" => number([0, 1, 2, 3, 4, 5, 11, 12, 13, 16][choices.below(10)]),
        "number" => number(choices.below(NUMBERS.len())),
        "boolean" => Value::Bool(choices.one_in(2)),
        _ => Value::Null,
    }
}

/// `value` with some whole numbers written the other way (`1` as `1.0`,
/// `100.0` as `100`): equal for JSON Schema, different for serde_json.
fn respell(value: &Value, choices: &mut Choices) -> Value {
    match value {
        Value::Number(number) if choices.one_in(2) => {
            if let Some(whole) = number.as_i64() {
                json!(whole as f64)
            } else if let Some(whole) = number
                .as_f64()
                .filter(|float| float.fract() == 0.0 && float.abs() < 1e15)
            {
                json!(whole as i64)
            } else {
                value.clone()
            }
        }
        Value::Array(items) => {
            Value::Array(items.iter().map(|item| respell(item, choices)).collect())
        }
        Value::Object(members) => Value::Object(
            members
                .iter()
                .map(|(name, member)| (name.clone(), respell(member, choices)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn near_miss(choices: &mut Choices) -> Value {
    match choices.below(6) {
        0 => Value::Null,
        1 => Value::Bool(choices.one_in(2)),
        2 | 3 => number(choices.below(NUMBERS.len())),
        4 => string(choices.below(STRINGS.len())),
        _ => json!({ name(choices.below(NAMES.len())): number(choices.below(NUMBERS.len())) }),
    }
}

/// Instances drawn from `root` by `seeds`.
fn drawn(root: &Value, seeds: &[u64]) -> Vec<Value> {
    seeds
        .iter()
        .map(|seed| draw(root, root, &mut Choices(seed | 1), 0))
        .collect()
}

proptest! {
    #![proptest_config(Config::with_cases(2000))]

    #[test]
    fn random_schemas_agree_on_random_instances(
        root in root_schema(),
        instances in prop::collection::vec(instance(), 1..6),
        seeds in prop::collection::vec(any::<u64>(), 4),
    ) {
        // Some random schemas are not valid (a `$ref` cycle that never
        // reaches an instance is fine, a bad regex is not): both ways
        // refuse those alike.
        let Ok(schema) = Schema::new(Payload::from_value(&root).expect("small JSON")) else {
            return Ok(());
        };
        for instance in instances.iter().chain(&drawn(&root, &seeds)) {
            agree(&schema, instance)?;
        }
    }
}

proptest! {
    #![proptest_config(Config::with_cases(500))]

    /// One payload checked against several schemas in turn, and against
    /// each again, gets each schema's own verdict every time: what a
    /// payload remembers of a schema it satisfied never answers for
    /// another, nor for the same schema compiled anew.
    #[test]
    fn a_payload_checked_against_schemas_in_turn_gets_each_ones_verdict(
        roots in prop::collection::vec(root_schema(), 2..4),
        instances in prop::collection::vec(instance(), 1..4),
    ) {
        let schemas: Vec<Schema> = roots
            .iter()
            .filter_map(|root| Schema::new(Payload::from_value(root).expect("small JSON")).ok())
            .collect();
        for instance in &instances {
            let payload = Payload::from_value(instance).expect("small JSON encodes");
            let value = payload.to_value();
            for schema in schemas.iter().chain(schemas.iter().rev()) {
                let expected = schema.validate_value(&value);
                prop_assert_eq!(schema.is_valid(&payload), expected.is_ok(), "schema {}", schema.json().as_str());
                prop_assert_eq!(schema.validate(&payload), expected);
                let again = Schema::new(schema.json().clone()).expect("compiled before");
                prop_assert_eq!(again.is_valid(&payload), schema.is_valid(&payload));
            }
        }
    }
}

/// Two schemas that a payload tells apart: what it satisfied under the
/// first does not carry over to the second, and back.
#[test]
fn a_payload_satisfying_one_schema_is_still_judged_by_the_next() {
    let integer = Schema::parse(r#"{"type":"integer"}"#).unwrap();
    let string = Schema::parse(r#"{"type":"string"}"#).unwrap();
    let five = Payload::parse_str("5").unwrap();
    assert!(integer.is_valid(&five));
    assert!(!string.is_valid(&five));
    assert!(string.validate(&five).is_err());
    assert!(integer.is_valid(&five));
    let word = Payload::parse_str(r#""five""#).unwrap();
    assert!(string.is_valid(&word));
    assert!(!integer.is_valid(&word));
    // A schema compiled after another was dropped starts with no payload
    // believing it satisfied.
    drop(string);
    let positive = Schema::parse(r#"{"type":"integer","minimum":6}"#).unwrap();
    assert!(!positive.is_valid(&five));
    assert!(
        !Schema::parse(r#"{"type":"string"}"#)
            .unwrap()
            .is_valid(&five)
    );
}

/// One branch of a `oneOf` of constants as schemars writes a documented
/// enum's variant, or one that only looks like it (a type the constant does
/// not have, a keyword that constrains, no constant at all).
fn constant_branch() -> impl Strategy<Value = Value> {
    // Mostly plain constants from a small vocabulary, so that whole
    // choices of them (and repeated constants) are common.
    let constants = prop::sample::select(vec![
        json!("a"),
        json!("b"),
        json!("a\\nb"),
        json!(null),
        json!(true),
        json!(1),
        json!(["a"]),
    ]);
    let kinds = prop::sample::select(&["string", "string", "null", "boolean", "integer"][..]);
    let extras = prop::sample::select(vec![
        json!({}),
        json!({}),
        json!({"description": "a variant"}),
        json!({"title": "A", "deprecated": true}),
        json!({"minLength": 2}),
        json!({"pattern": "^a"}),
    ]);
    (
        prop::option::weighted(0.9, constants),
        prop::option::weighted(0.4, kinds),
        extras,
    )
        .prop_map(|(constant, kind, extras)| {
            let mut branch = extras.as_object().cloned().unwrap_or_default();
            if let Some(constant) = constant {
                branch.insert("const".to_owned(), constant);
            }
            if let Some(kind) = kind {
                branch.insert("type".to_owned(), json!(kind));
            }
            Value::Object(branch)
        })
}

proptest! {
    #![proptest_config(Config::with_cases(1000))]

    /// The text validator checks a `oneOf` of distinct constants as their
    /// `enum`; the verdicts stay those of the schema as written, repeated
    /// constants, mismatched types and constraining keywords included.
    #[test]
    fn choices_of_constants_agree(
        branches in prop::collection::vec(constant_branch(), 1..5),
        nested in any::<bool>(),
        instances in prop::collection::vec(instance(), 1..6),
    ) {
        let choice = json!({"description": "a documented enum", "oneOf": branches});
        let root = if nested {
            json!({"$defs": {"Choice": choice}, "type": "object",
                   "properties": {"a": {"$ref": "#/$defs/Choice"}}})
        } else {
            choice
        };
        let schema = schema_of(&root);
        for instance in &instances {
            agree(&schema, instance)?;
            if nested {
                agree(&schema, &json!({"a": instance}))?;
            }
        }
        for constant in ["a", "b", "a\nb"] {
            agree(&schema, &json!(constant))?;
            agree(&schema, &json!({"a": constant}))?;
        }
        for constant in [json!(null), json!(true), json!(false), json!(1), json!(["a"])] {
            agree(&schema, &constant)?;
            agree(&schema, &json!({"a": constant}))?;
        }
    }
}

/// Lists of the property `l` of `root` (the schema `schema` compiled) get
/// the value validator's verdicts: each list drawn from `pool` (with
/// elements drawn from the item schema, and numbers that begin with each
/// other's digits, added to it, so that elements repeat across lists, at
/// other positions, beside new ones), alone and beside another member, and
/// the lists so far joined, as a team's task list grows (so that each
/// begins with the last list accepted), also with its last element
/// changed and cut short.
fn lists_agree(
    schema: &Schema,
    root: &Value,
    mut pool: Vec<Value>,
    lists: &[Vec<prop::sample::Index>],
    seeds: &[u64],
) -> Result<(), TestCaseError> {
    let item = root["properties"]["l"]["items"].clone();
    for seed in seeds {
        pool.push(draw(root, &item, &mut Choices(seed | 1), 0));
    }
    for literal in ["1", "12", "100", "1.5"] {
        pool.push(serde_json::from_str(literal).expect("a number"));
    }
    let mut grown = Vec::new();
    for list in lists {
        let elements: Vec<Value> = list.iter().map(|index| index.get(&pool).clone()).collect();
        agree(schema, &json!({"l": elements}))?;
        agree(schema, &json!({"a": 1, "l": elements}))?;
        grown.extend(elements);
        agree(schema, &json!({"l": grown}))?;
        if let Some(last) = grown.last().cloned() {
            let mut changed = grown.clone();
            *changed.last_mut().expect("not empty") = json!([last]);
            agree(schema, &json!({"l": changed}))?;
            agree(schema, &json!({"l": grown[..grown.len() - 1]}))?;
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config::with_cases(1000))]

    /// The text validator remembers the elements of a top-level array it
    /// accepted and accepts them again unchecked: lists drawn from a small
    /// pool (so elements repeat across lists, at other positions, beside
    /// new ones), and lists that grow from the ones before (so they begin
    /// with the last list accepted), get the verdicts of the schema as
    /// written.
    #[test]
    fn remembered_items_agree(
        root in schema_object(subschema()),
        items in prop_oneof![Just(json!({"$ref": "#/$defs/A"})), subschema()],
        defs in (subschema(), subschema()),
        pool in prop::collection::vec(instance(), 1..8),
        lists in prop::collection::vec(prop::collection::vec(any::<prop::sample::Index>(), 0..6), 1..8),
        seeds in prop::collection::vec(any::<u64>(), 2),
    ) {
        let Value::Object(mut root) = root else { unreachable!("schema_object builds objects") };
        let list = json!({"type": "array", "items": items});
        match root.get_mut("properties") {
            Some(Value::Object(properties)) => {
                properties.insert("l".to_owned(), list);
            }
            _ => {
                root.insert("properties".to_owned(), json!({"l": list}));
            }
        }
        root.insert("$defs".to_owned(), json!({"A": defs.0, "B": defs.1}));
        let root = Value::Object(root);
        let Ok(schema) = Schema::new(Payload::from_value(&root).expect("small JSON")) else {
            return Ok(());
        };
        lists_agree(&schema, &root, pool, &lists, &seeds)?;
    }
}

/// The root keywords under which nothing but the memoized `items` looks
/// into a list's elements: the text validator's tape then leaves out the
/// subtrees of the elements a list shares with the last one accepted.
fn skippable_root(items: Value, other: Value, required: bool, additional: Option<Value>) -> Value {
    let mut root = json!({
        "type": "object",
        "title": "lists",
        "properties": {"l": {"type": "array", "description": "the list", "items": items}, "a": other},
    });
    if required {
        root["required"] = json!(["l"]);
    }
    if let Some(additional) = additional {
        root["additionalProperties"] = additional;
    }
    root
}

proptest! {
    #![proptest_config(Config::with_cases(1000))]

    /// As `remembered_items_agree`, under a root whose other keywords never
    /// look into the list's elements, so that the elements a list shares
    /// with the last one accepted are not even read: lists drawn from a
    /// small pool of any values (numbers that begin with each other's
    /// digits among them) and lists grown from the ones before get the
    /// verdicts of the schema as written.
    #[test]
    fn skipped_items_agree(
        items in prop_oneof![Just(json!({"$ref": "#/$defs/A"})), subschema()],
        other in subschema(),
        required in any::<bool>(),
        additional in prop::option::of(prop_oneof![any::<bool>().prop_map(Value::Bool), subschema()]),
        defs in (subschema(), subschema()),
        pool in prop::collection::vec(instance(), 1..8),
        lists in prop::collection::vec(prop::collection::vec(any::<prop::sample::Index>(), 0..6), 1..8),
        seeds in prop::collection::vec(any::<u64>(), 2),
    ) {
        let mut root = skippable_root(items, other, required, additional);
        root["$defs"] = json!({"A": defs.0, "B": defs.1});
        let Ok(schema) = Schema::new(Payload::from_value(&root).expect("small JSON")) else {
            return Ok(());
        };
        lists_agree(&schema, &root, pool, &lists, &seeds)?;
    }
}

/// An element is taken as accepted only where it ends as the accepted one
/// did: a number that begins with the digits of an accepted number, and
/// an element after the last accepted one, are checked.
#[test]
fn skipped_items_end_where_the_accepted_ones_do() {
    let schema = schema_of(&skippable_root(
        json!({"maximum": 5}),
        json!(true),
        true,
        None,
    ));
    let check = |list: Value| {
        let payload = Payload::from_value(&json!({"l": list})).expect("JSON");
        (schema.is_valid(&payload), schema.validate(&payload).is_ok())
    };
    assert_eq!(check(json!([1, 2])), (true, true));
    assert_eq!(check(json!([1, 23])), (false, false));
    assert_eq!(check(json!([1, 2])), (true, true));
    assert_eq!(check(json!([1, 2, 3, 4])), (true, true));
    assert_eq!(check(json!([1, 2, 3, 4, 6])), (false, false));
    assert_eq!(check(json!([1, 2, 3, 40])), (false, false));
    assert_eq!(check(json!([1, 2, 3, 4.5])), (true, true));
    assert_eq!(check(json!([1, 2, 3, 4.5, [7]])), (true, true));
    assert_eq!(check(json!([1, 2, 3, 4.5, 7])), (false, false));
    assert_eq!(check(json!([1, 2, 3, 4.5, "x"])), (true, true));
    assert_eq!(check(json!("not a list")), (false, false));
    assert_eq!(check(json!([1, 2, 3, 4.5, "x", 5, 6])), (false, false));
}

// ---------------------------------------------------------------------------
// Real schemas: the team's wire types and the kernel's.

fn team_schema(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../baton-team/tests/schemas")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    serde_json::from_str(&text).expect("a schema file is JSON")
}

fn encode<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).expect("encodes")
}

fn schema_of(value: &Value) -> Schema {
    Schema::new(Payload::from_value(value).expect("JSON")).expect("compiles")
}

/// A value with one change somewhere: a member removed, replaced or added,
/// an element removed or replaced, a scalar replaced.
fn mutate(value: &Value, choices: &mut Choices) -> Value {
    let mut value = value.clone();
    mutate_in_place(&mut value, choices);
    value
}

fn mutate_in_place(value: &mut Value, choices: &mut Choices) {
    let descend = choices.below(3) > 0;
    match value {
        Value::Object(members) if !members.is_empty() && descend => {
            let index = choices.below(members.len());
            let member = members.values_mut().nth(index).expect("in range");
            mutate_in_place(member, choices);
        }
        Value::Array(items) if !items.is_empty() && descend => {
            let index = choices.below(items.len());
            mutate_in_place(&mut items[index], choices);
        }
        Value::Object(members) => {
            let index = choices.below(members.len().max(1));
            let key = members.keys().nth(index).cloned();
            match (choices.below(3), key) {
                (0, Some(key)) => {
                    members.remove(&key);
                }
                (1, Some(key)) => {
                    members.insert(key, near_miss(choices));
                }
                _ => {
                    members.insert(name(choices.below(NAMES.len())), near_miss(choices));
                }
            }
        }
        Value::Array(items) => {
            if !items.is_empty() && choices.one_in(2) {
                items.remove(choices.below(items.len()));
            } else {
                items.push(near_miss(choices));
            }
        }
        scalar => *scalar = near_miss(choices),
    }
}

/// A task as the team reports it, with every optional part filled in.
fn real_task(index: u64) -> Value {
    let failure = Failure::contract("worker.refused", format!("line one\nline \"{index}\""));
    json!({
        "request": {"key": format!("task-{index}"), "worker": "demo.worker", "input": {"n": index}},
        "process": format!("p_{:032x}", u128::from(index) * 7919),
        "outcome": {
            "cause": "completion",
            "status": "completed",
            "output": {"n": index, "text": "é🦀"},
            "unresolved_effects": [format!("e_{:032x}", index)],
        },
        "rejection": if index.is_multiple_of(3) { serde_json::to_value(&failure).expect("encodes") } else { Value::Null },
    })
}

fn real_turn(tasks: u64) -> Value {
    json!({
        "number": 3,
        "state": {"plan": ["a", "b"], "notes": "x\ty"},
        "workers": [{
            "name": "demo.worker",
            "description": "Does the work.",
            "input_schema": {"type": "object"},
            "output_schema": true,
            "signal_schema": false,
        }],
        "tasks": (0..tasks).map(real_task).collect::<Vec<_>>(),
        "controls": [
            {
                "control": {"task": "task-1", "signal": {"id": "s-1", "payload": 1, "wait": format!("w_{:032x}", 5)}},
                "result": {"status": "succeeded", "output": null, "usage": {"tokens": 12}},
            },
            {
                "control": {"task": "task-2", "cancel_reason": "enough"},
                "result": {"status": "failed", "failure": {"kind": "contract", "code": "team.control.refused", "message": "ended"}},
            },
            {
                "control": {"task": "task-3", "cancel_reason": "enough"},
                "result": {"status": "unknown", "diagnostic": "lost"},
            },
        ],
    })
}

fn real_decision() -> Value {
    json!({
        "state": {"plan": ["a"]},
        "mode": "wait",
        "tasks": [{"key": "next", "worker": "demo.worker", "input": [1, 2.5, "three"]}],
        "controls": [{"task": "task-1", "cancel_reason": "done"}],
    })
}

#[test]
fn real_values_satisfy_the_real_schemas() {
    let turn = schema_of(&team_schema("turn"));
    let decision = schema_of(&team_schema("decision"));
    let task = schema_of(&team_schema("task"));
    for (schema, value) in [
        (&turn, real_turn(40)),
        (&decision, real_decision()),
        (&task, real_task(4)),
        (&task, real_task(5)),
    ] {
        let payload = Payload::from_value(&value).expect("encodes");
        assert!(schema.is_valid(&payload), "{}", payload.as_str());
    }
}

proptest! {
    #![proptest_config(Config::with_cases(1000))]

    #[test]
    fn team_schemas_agree_on_mutated_real_values(
        tasks in 0u64..6,
        seeds in prop::collection::vec(any::<u64>(), 1..4),
    ) {
        let turn = schema_of(&team_schema("turn"));
        let decision = schema_of(&team_schema("decision"));
        let task = schema_of(&team_schema("task"));
        for seed in &seeds {
            let mut choices = Choices(seed | 1);
            let mut value = real_turn(tasks);
            // Several changes accumulate, so a value can be a near miss in
            // more than one place.
            for _ in 0..choices.below(3) + 1 {
                value = mutate(&value, &mut choices);
                agree(&turn, &value)?;
            }
            agree(&decision, &mutate(&real_decision(), &mut choices))?;
            agree(&task, &mutate(&real_task(*seed % 7), &mut choices))?;
        }
    }

    #[test]
    fn team_schemas_agree_on_drawn_values(seeds in prop::collection::vec(any::<u64>(), 1..8)) {
        for name in ["turn", "decision", "task", "control", "control_receipt", "task_request", "mode"] {
            let root = team_schema(name);
            let schema = schema_of(&root);
            for instance in drawn(&root, &seeds) {
                agree(&schema, &instance)?;
            }
        }
    }

    #[test]
    fn kernel_schemas_agree_on_mutated_real_values(seeds in prop::collection::vec(any::<u64>(), 1..4)) {
        let failure = Failure::new(FailureKind::External, "tool.http", "status 502: \"bad gateway\"");
        let output = Payload::from_value(&json!({"rows": [1, 2.0, -3], "text": "é\n"})).expect("JSON");
        let signal = ChildSignal {
            id: SignalId::new("s-1").expect("a signal id"),
            wait: None,
            payload: output.clone(),
        };
        let descriptor = Descriptor::typed::<String, u32>("demo.worker", "Does the work.")
            .expect("a descriptor")
            .with_signal_schema(Schema::parse(r#"{"type":"object","required":["n"]}"#).expect("a schema"));
        let cases = [
            (Schema::of::<Failure>(), encode(&failure)),
            (Schema::of::<Termination>(), encode(&Termination::ended(Cause::Failure, failure.clone()))),
            (Schema::of::<Termination>(), encode(&Termination::completed(output.clone()))),
            (Schema::of::<ChildSignal>(), encode(&signal)),
            (Schema::of::<Descriptor>(), encode(&descriptor)),
            (Schema::of::<Budget>(), encode(&Budget::default())),
            (Schema::of::<Usage>(), encode(&Usage::default())),
        ];
        for (schema, value) in &cases {
            agree(schema, value)?;
            for seed in &seeds {
                let mut choices = Choices(seed | 1);
                agree(schema, &mutate(value, &mut choices))?;
                let root = schema.json().to_value();
                agree(schema, &draw(&root, &root, &mut choices, 0))?;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Violations: exactly what the value validator reports.

#[test]
fn violations_are_reported_as_the_value_validator_reports_them() {
    let turn = schema_of(&team_schema("turn"));
    let mut missing = real_turn(3);
    missing["tasks"][1]["request"]
        .as_object_mut()
        .expect("object")
        .remove("worker");
    let mut extra = real_turn(3);
    extra["tasks"][2]["outcome"]["surprise"] = json!(1);
    let mut pattern = real_turn(3);
    pattern["tasks"][0]["process"] = json!("p_XYZ");
    let mut number = real_turn(3);
    number["number"] = json!(1.5);
    for value in [missing, extra, pattern, number] {
        let payload = Payload::from_value(&value).expect("encodes");
        let violation = turn.validate(&payload).expect_err("rejected");
        let reference = jsonschema::draft202012::new(&turn.json().to_value()).expect("compiles");
        let error = reference
            .iter_errors(&value)
            .next()
            .expect("the reference rejects it too");
        assert_eq!(violation.path, error.instance_path().to_string());
        assert_eq!(violation.message, error.to_string());
    }
}

#[test]
fn violation_messages_are_unchanged() {
    let schema = Schema::parse(
        r#"{"type":"object","properties":{"n":{"type":"integer","minimum":2}},"required":["n"],"additionalProperties":false}"#,
    )
    .expect("compiles");
    let cases = [
        (r#"{"n":1.0}"#, "/n", "1.0 is less than the minimum of 2"),
        (r#"{"n":2.5}"#, "/n", r#"2.5 is not of type "integer""#),
        (r#"{}"#, "", r#""n" is a required property"#),
    ];
    for (text, path, message) in cases {
        let violation = schema
            .validate(&Payload::parse_str(text).expect("json"))
            .expect_err(text);
        assert_eq!(
            (violation.path.as_str(), violation.message.as_str()),
            (path, message)
        );
    }
    assert!(schema.is_valid(&Payload::parse_str(r#"{"n":2.0}"#).expect("json")));
    assert!(schema.is_valid(&Payload::parse_str(r#"{"n":1e2}"#).expect("json")));
}

/// Every keyword of draft 2020-12 that stays within the document gives the
/// same verdicts on text as on values; a handful of cases each, chosen to
/// sit on either side of the keyword's rule.
#[test]
fn every_keyword_agrees() {
    let cases: &[(Value, &[&str])] = &[
        (json!({"not": {"type": "string"}}), &[r#""a""#, "1"]),
        (
            json!({"if": {"minimum": 3}, "then": {"multipleOf": 2}, "else": {"const": 1}}),
            &["4", "5", "1", "1.0", "2"],
        ),
        (
            json!({"patternProperties": {"^a": {"type": "integer"}}}),
            &[r#"{"ab":1}"#, r#"{"ab":"x"}"#, r#"{"b":"x"}"#],
        ),
        (
            json!({"propertyNames": {"maxLength": 1}}),
            &[r#"{"a":1}"#, r#"{"ab":1}"#, r#"{"\n":1}"#, r#"{"é":1}"#],
        ),
        (
            json!({"propertyNames": {"pattern": "^\"$"}}),
            &[r#"{"\"":1}"#, r#"{"\\":1}"#],
        ),
        (
            json!({"contains": {"type": "null"}, "minContains": 2}),
            &["[null,null]", "[null,1]"],
        ),
        (
            json!({"uniqueItems": true}),
            &[
                "[1,1.0]",
                "[1,2]",
                r#"[{"a":1},{"a":1.0}]"#,
                r#"["a","\u0061"]"#,
            ],
        ),
        (
            json!({"prefixItems": [{"type": "string"}], "items": false}),
            &[r#"["a"]"#, r#"["a",1]"#, "[1]"],
        ),
        (
            json!({"properties": {"a": true}, "unevaluatedProperties": false}),
            &[r#"{"a":1}"#, r#"{"b":1}"#],
        ),
        (
            json!({"allOf": [{"properties": {"a": true}}], "unevaluatedProperties": false}),
            &[r#"{"a":1}"#, r#"{"a":1,"b":2}"#],
        ),
        (
            json!({"prefixItems": [true], "unevaluatedItems": false}),
            &["[1]", "[1,2]"],
        ),
        (
            json!({"dependentRequired": {"a": ["b"]}}),
            &[r#"{"a":1}"#, r#"{"a":1,"b":2}"#, r#"{"b":1}"#],
        ),
        (
            json!({"dependentSchemas": {"a": {"required": ["c"]}}}),
            &[r#"{"a":1}"#, r#"{"a":1,"c":2}"#],
        ),
        (
            json!({"minProperties": 2, "maxProperties": 2}),
            &[r#"{"a":1}"#, r#"{"a":1,"b":2}"#],
        ),
        (
            json!({"multipleOf": 0.1}),
            &["0.3", "0.30000000000000004", "1"],
        ),
        (
            json!({"const": {"a": [1, "é"]}}),
            &[
                r#"{"a":[1.0,"é"]}"#,
                r#"{"a":[1,"e"]}"#,
                r#"{"a":[1,"é"],"b":1}"#,
            ],
        ),
        (
            json!({"enum": [1, "a\nb", null, [2]]}),
            &["1.0", r#""a\nb""#, r#""a\\nb""#, "null", "[2.0]", "[2,2]"],
        ),
        (
            json!({"maximum": 18446744073709551615u64}),
            &[
                "18446744073709551615",
                "18446744073709551616",
                "-9223372036854775808",
            ],
        ),
        (
            json!({"type": "integer"}),
            &[
                "1",
                "1.0",
                "1.5",
                "1e2",
                "1e300",
                "-0.0",
                "18446744073709551616",
            ],
        ),
        (
            json!({"minLength": 2, "maxLength": 2}),
            &[
                r#""ab""#,
                r#""\n\t""#,
                r#""🦀🦀""#,
                r#""🦀""#,
                r#""\u0001\u0002""#,
                r#""é""#,
            ],
        ),
        (
            json!({"pattern": "^\\p{L}\\s$"}),
            &[r#""é ""#, r#""é\n""#, r#""1 ""#],
        ),
        (
            json!({"format": "date"}),
            &[r#""2024-01-02""#, r#""2024-13-45""#, "1"],
        ),
        (
            json!({"$defs": {"n": {"$anchor": "node", "type": "object", "properties": {"next": {"$ref": "#node"}}}}, "$ref": "#/$defs/n"}),
            &[r#"{"next":{"next":{}}}"#, r#"{"next":{"next":1}}"#],
        ),
        (
            json!({"$dynamicAnchor": "t", "type": "object", "properties": {"c": {"$dynamicRef": "#t"}}}),
            &[r#"{"c":{"c":{}}}"#, r#"{"c":{"c":1}}"#],
        ),
        (json!({"$ref": "#", "type": "object"}), &["{}", "1"]),
        (
            json!({"oneOf": [{"const": "a", "description": "A."}, {"const": "b", "type": "string"}]}),
            &[r#""a""#, r#""b""#, r#""c""#, "null", "1"],
        ),
        (
            // A reference into a choice's branch, which the text
            // validator's rewrite removes: the value validator judges.
            json!({"$defs": {"C": {"oneOf": [{"const": "a"}, {"const": "b"}]}},
                   "properties": {"x": {"$ref": "#/$defs/C/oneOf/1"}, "y": {"$ref": "#/$defs/C"}}}),
            &[
                r#"{"x":"b","y":"a"}"#,
                r#"{"x":"a"}"#,
                r#"{"y":"c"}"#,
                r#"{"x":"b","y":"b"}"#,
            ],
        ),
    ];
    for (schema, instances) in cases {
        let schema = schema_of(schema);
        for text in *instances {
            let payload = Payload::parse_str(text).expect("json");
            agree(&schema, &payload.to_value()).unwrap_or_else(|error| panic!("{error}"));
        }
    }
}

#[test]
fn the_true_and_false_schemas_keep_their_verdicts() {
    let payload = Payload::parse_str(r#"{"a":[1,2]}"#).expect("json");
    assert!(Schema::any().is_valid(&payload));
    assert!(Schema::any().validate(&payload).is_ok());
    assert!(!Schema::reject_all().is_valid(&payload));
    let violation = Schema::reject_all()
        .validate(&payload)
        .expect_err("rejected");
    assert_eq!(violation.path, "");
}
