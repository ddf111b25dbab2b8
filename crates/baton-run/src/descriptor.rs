//! Descriptors: a program's name, description and JSON Schemas.

mod items;
mod simplify;
mod text;

use std::fmt;
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::digest::{Digest, Purpose};
use crate::failure::Failure;
use crate::ids::{IdError, Name};
use crate::payload::{Payload, PayloadError, SchemaMark};

/// A compiled JSON Schema (draft 2020-12) with its canonical JSON.
#[derive(Clone)]
pub struct Schema {
    json: Payload,
    validator: Arc<Validators>,
}

/// The validators of one schema, shared by every `Schema` of the same
/// canonical JSON.
struct Validators {
    /// This compiled schema's mark, under which payloads that satisfy it
    /// remember so (see [`Schema::is_valid`]).
    mark: SchemaMark,
    /// Validates `serde_json::Value`s, and reports the violations of every
    /// payload the text validator rejects.
    value: jsonschema::Validator,
    /// The same schema compiled for canonical payload text, compiled when a
    /// payload is first validated, with equivalent rewrites that check
    /// faster (`simplify`) and a memo of the top-level arrays' accepted
    /// elements (`items`); `None` if it would not compile (a reference
    /// into a rewritten part), and the value validator then judges alone.
    text: OnceLock<Option<TextValidator>>,
}

/// The validator of canonical payload text, and the memos of the top-level
/// arrays whose accepted elements its tapes may hold without their
/// subtrees.
struct TextValidator {
    validator: jsonschema::Validator<text::CanonicalText>,
    skippable: Vec<(String, items::Memo)>,
}

impl Validators {
    /// The text validator's verdict on `payload`, or `None` when only the
    /// value validator can judge it.
    fn text_verdict(&self, schema: &Payload, payload: &Payload) -> Option<bool> {
        let text = self.text.get_or_init(|| {
            let mut schema = schema.to_value();
            simplify::constant_choices(&mut schema);
            let options = jsonschema::options_for::<text::CanonicalText>()
                .with_draft(jsonschema::Draft::Draft202012);
            let memoized = items::memoize_items(&mut schema);
            let memos = items::memos(&memoized);
            let skippable = memoized
                .iter()
                .filter(|memoized| memoized.skippable)
                .filter_map(|memoized| {
                    let memo = memos.get(&memoized.property)?;
                    Some((memoized.property.clone(), Arc::clone(memo)))
                })
                .collect();
            let options = if memoized.is_empty() {
                options
            } else {
                options.with_keyword(items::KEYWORD, move |_parent, value, _location| {
                    items::compile(value, &memos)
                })
            };
            let validator = options.build(&schema).ok()?;
            Some(TextValidator {
                validator,
                skippable,
            })
        });
        let text = text.as_ref()?;
        if text.skippable.is_empty() {
            return text::is_valid(&text.validator, payload.as_str(), &[]);
        }
        // What each skippable array last accepted, taken now: a concurrent
        // check may accept another meanwhile, and what was accepted stays so.
        let hints: Vec<text::Hint<'_>> = text
            .skippable
            .iter()
            .filter_map(|(name, memo)| {
                Some(text::Hint {
                    name,
                    accepted: items::last_accepted(memo)?,
                })
            })
            .collect();
        text::is_valid(&text.validator, payload.as_str(), &hints)
    }
}

/// Why a schema could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// The schema is not valid JSON Schema 2020-12.
    #[error("invalid JSON Schema: {message}")]
    Invalid {
        /// What the compiler reported.
        message: String,
    },
    /// The schema JSON itself was malformed.
    #[error(transparent)]
    Payload(#[from] PayloadError),
}

/// A payload that does not satisfy a schema; `path` is the JSON Pointer of
/// the first offending value (empty for the root).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("schema violation at {}: {message}", if path.is_empty() { "/" } else { path.as_str() })]
pub struct SchemaViolation {
    /// JSON Pointer into the payload.
    pub path: String,
    /// What the validator reported.
    pub message: String,
}

impl Schema {
    /// Compiles a schema given as a payload. The same schema compiled again
    /// anywhere in the process while the first is in use shares its
    /// validator: records and states that carry a schema (an input wait's
    /// answer schema) are read far more often than schemas are written.
    pub fn new(json: Payload) -> Result<Schema, SchemaError> {
        let digest = json.digest();
        if let Some(validator) = compiled::find(&digest) {
            return Ok(Schema { json, validator });
        }
        let validator = jsonschema::draft202012::new(&json.to_value()).map_err(|error| {
            SchemaError::Invalid {
                message: error.to_string(),
            }
        })?;
        let validator = compiled::keep(
            digest,
            Arc::new(Validators {
                mark: SchemaMark::fresh(),
                value: validator,
                text: OnceLock::new(),
            }),
        );
        Ok(Schema { json, validator })
    }

    /// Compiles a schema given as JSON text.
    pub fn parse(text: &str) -> Result<Schema, SchemaError> {
        Schema::new(Payload::parse_str(text)?)
    }

    /// The schema schemars derives for `T`.
    pub fn of<T: schemars::JsonSchema>() -> Schema {
        let schema =
            schemars::SchemaGenerator::new(schemars::generate::SchemaSettings::draft2020_12())
                .into_root_schema_for::<T>();
        let value = serde_json::to_value(&schema).expect("a derived schema is JSON");
        Schema::new(Payload::from_value(&value).expect("a derived schema is small JSON"))
            .expect("schemars derives valid draft 2020-12 schemas")
    }

    /// The schema `true`: accepts every value.
    pub fn any() -> Schema {
        Schema::new(Payload::from_value(&Value::Bool(true)).expect("true encodes"))
            .expect("true compiles")
    }

    /// The schema `false`: rejects every value.
    pub fn reject_all() -> Schema {
        Schema::new(Payload::from_value(&Value::Bool(false)).expect("false encodes"))
            .expect("false compiles")
    }

    /// The canonical schema JSON.
    pub fn json(&self) -> &Payload {
        &self.json
    }

    /// Whether this is the schema `false`.
    pub fn rejects_all(&self) -> bool {
        self.json.as_str() == "false"
    }

    /// Validates a payload, reporting the first violation.
    ///
    /// The payload's canonical text is validated in place, with no
    /// `serde_json::Value` built for it. Only a rejected payload is parsed
    /// into a `Value`, so that the value validator names the violation
    /// exactly as it always has (and has the last word on the verdict).
    pub fn validate(&self, payload: &Payload) -> Result<(), SchemaViolation> {
        if self.is_valid(payload) {
            return Ok(());
        }
        let value = payload.to_value();
        self.validate_value(&value)
    }

    /// Whether a payload satisfies the schema: the verdict of
    /// [`Schema::validate`] without the cost of naming a violation.
    pub fn is_valid(&self, payload: &Payload) -> bool {
        if self.json.as_str() == "true" || payload.satisfies(self.validator.mark) {
            return true;
        }
        let valid = match self.validator.text_verdict(&self.json, payload) {
            Some(verdict) => verdict,
            None => self.validator.value.is_valid(&payload.to_value()),
        };
        if valid {
            payload.note_satisfies(self.validator.mark);
        }
        valid
    }

    /// Validates an already parsed value.
    pub fn validate_value(&self, value: &Value) -> Result<(), SchemaViolation> {
        // The boolean check is much cheaper than collecting errors.
        if self.validator.value.is_valid(value) {
            return Ok(());
        }
        match self.validator.value.iter_errors(value).next() {
            None => Ok(()),
            Some(error) => Err(SchemaViolation {
                path: error.instance_path().to_string(),
                message: error.to_string().chars().take(512).collect(),
            }),
        }
    }
}

impl PartialEq for Schema {
    fn eq(&self, other: &Self) -> bool {
        self.json == other.json
    }
}

impl Eq for Schema {}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Schema({:?})", self.json)
    }
}

impl Serialize for Schema {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(serializer)
    }
}

/// Validators in use, by the digest of their schema's canonical JSON.
mod compiled {
    use std::collections::BTreeMap;
    use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

    use super::Validators;
    use crate::digest::Digest;

    struct Compiled {
        validators: BTreeMap<Digest, Weak<Validators>>,
        /// Entries when dead ones were last swept.
        swept: usize,
    }

    static COMPILED: LazyLock<Mutex<Compiled>> = LazyLock::new(|| {
        Mutex::new(Compiled {
            validators: BTreeMap::new(),
            swept: 0,
        })
    });

    pub(super) fn find(digest: &Digest) -> Option<Arc<Validators>> {
        let compiled = COMPILED.lock().unwrap_or_else(PoisonError::into_inner);
        compiled.validators.get(digest).and_then(Weak::upgrade)
    }

    /// Keeps `validator` for reuse (or returns one compiled meanwhile).
    pub(super) fn keep(digest: Digest, validator: Arc<Validators>) -> Arc<Validators> {
        let mut compiled = COMPILED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(existing) = compiled.validators.get(&digest).and_then(Weak::upgrade) {
            return existing;
        }
        compiled
            .validators
            .insert(digest, Arc::downgrade(&validator));
        // Sweep dead entries whenever the map has doubled since the last
        // sweep, so it stays proportional to the schemas in use.
        if compiled.validators.len() >= 2 * compiled.swept.max(64) {
            compiled
                .validators
                .retain(|_, weak| weak.strong_count() > 0);
            compiled.swept = compiled.validators.len();
        }
        validator
    }
}

impl<'de> Deserialize<'de> for Schema {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Schema::new(Payload::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for Schema {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "JsonSchema".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": ["object", "boolean"] })
    }
}

/// Why a descriptor could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DescriptorError {
    /// The name is not a lowercase dotted name.
    #[error(transparent)]
    Name(#[from] IdError),
    /// The description is empty or longer than 4096 bytes.
    #[error("description must be 1 to 4096 bytes, got {len}")]
    Description {
        /// Its length in bytes.
        len: usize,
    },
}

/// What a program is: a lowercase dotted name, a description, and JSON
/// Schemas for its input, output and unaddressed signals. The signal schema
/// defaults to `false`, which rejects all unaddressed input.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, try_from = "DescriptorWire")]
pub struct Descriptor {
    name: Name,
    description: String,
    input_schema: Schema,
    output_schema: Schema,
    signal_schema: Schema,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct DescriptorWire {
    name: Name,
    description: String,
    input_schema: Schema,
    output_schema: Schema,
    signal_schema: Schema,
}

impl TryFrom<DescriptorWire> for Descriptor {
    type Error = DescriptorError;

    fn try_from(wire: DescriptorWire) -> Result<Self, DescriptorError> {
        Descriptor::new(
            wire.name.as_str(),
            wire.description,
            wire.input_schema,
            wire.output_schema,
        )
        .map(|descriptor| descriptor.with_signal_schema(wire.signal_schema))
    }
}

impl Descriptor {
    /// Largest description accepted, in bytes.
    pub const MAX_DESCRIPTION: usize = 4096;

    /// Builds a descriptor; the signal schema starts as `false`.
    pub fn new(
        name: &str,
        description: impl Into<String>,
        input_schema: Schema,
        output_schema: Schema,
    ) -> Result<Descriptor, DescriptorError> {
        let name = Name::new(name)?;
        let description = description.into();
        if description.is_empty() || description.len() > Self::MAX_DESCRIPTION {
            return Err(DescriptorError::Description {
                len: description.len(),
            });
        }
        Ok(Descriptor {
            name,
            description,
            input_schema,
            output_schema,
            signal_schema: Schema::reject_all(),
        })
    }

    /// A descriptor whose input and output schemas schemars derives from `I` and `O`.
    pub fn typed<I: schemars::JsonSchema, O: schemars::JsonSchema>(
        name: &str,
        description: impl Into<String>,
    ) -> Result<Descriptor, DescriptorError> {
        Descriptor::new(name, description, Schema::of::<I>(), Schema::of::<O>())
    }

    /// Replaces the schema for unaddressed signals.
    pub fn with_signal_schema(mut self, schema: Schema) -> Descriptor {
        self.signal_schema = schema;
        self
    }

    /// The name.
    pub fn name(&self) -> &Name {
        &self.name
    }

    /// The description.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Schema of the input.
    pub fn input_schema(&self) -> &Schema {
        &self.input_schema
    }

    /// Schema of the output.
    pub fn output_schema(&self) -> &Schema {
        &self.output_schema
    }

    /// Schema of unaddressed signals.
    pub fn signal_schema(&self) -> &Schema {
        &self.signal_schema
    }

    /// Digest of the canonical contract JSON.
    pub fn digest(&self) -> Digest {
        let contract = Payload::encode(self).expect("a descriptor always encodes");
        Digest::of(Purpose::Contract, contract.as_bytes())
    }

    /// Validates an input: a `contract` failure `execution.input.invalid` naming the path.
    pub fn check_input(&self, input: &Payload) -> Result<(), Failure> {
        check(
            &self.input_schema,
            input,
            "execution.input.invalid",
            "input",
            &self.name,
        )
    }

    /// Validates an output: a `contract` failure `execution.output.invalid` naming the path.
    pub fn check_output(&self, output: &Payload) -> Result<(), Failure> {
        check(
            &self.output_schema,
            output,
            "execution.output.invalid",
            "output",
            &self.name,
        )
    }

    /// Validates an unaddressed signal: `engine.signal.rejected` naming the path.
    pub fn check_signal(&self, payload: &Payload) -> Result<(), Failure> {
        check(
            &self.signal_schema,
            payload,
            "engine.signal.rejected",
            "unaddressed signal",
            &self.name,
        )
    }
}

fn check(
    schema: &Schema,
    payload: &Payload,
    code: &str,
    what: &str,
    name: &Name,
) -> Result<(), Failure> {
    schema.validate(payload).map_err(|violation| {
        Failure::contract(code, format!("{what} of {name} rejected: {violation}"))
    })
}

impl fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Descriptor")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_schema_shares_one_validator_while_in_use() {
        let text = r#"{"type":"object","properties":{"shared-validator-test":{"type":"integer"}}}"#;
        let first = Schema::parse(text).expect("compiles");
        let second = Schema::parse(&format!(" {text} ")).expect("compiles");
        assert!(Arc::ptr_eq(&first.validator, &second.validator));
        let payload = Payload::parse_str(r#"{"shared-validator-test":"x"}"#).expect("json");
        assert!(
            second.validate(&payload).is_err(),
            "the shared validator still checks"
        );
        let other = Schema::parse(r#"{"type":"string"}"#).expect("compiles");
        assert!(!Arc::ptr_eq(&first.validator, &other.validator));
    }

    #[derive(serde::Serialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Order {
        item: String,
        quantity: u32,
    }

    #[test]
    fn violation_names_the_path() {
        let descriptor =
            Descriptor::typed::<Order, String>("shop.order", "Place an order.").expect("valid");
        let bad = Payload::parse_str(r#"{"item":"tea","quantity":"two"}"#).expect("json");
        let failure = descriptor.check_input(&bad).expect_err("rejected");
        assert_eq!(failure.kind, crate::FailureKind::Contract);
        assert_eq!(failure.code(), "execution.input.invalid");
        assert!(failure.message.contains("/quantity"), "{}", failure.message);
        let good = Payload::parse_str(r#"{"item":"tea","quantity":2}"#).expect("json");
        assert!(descriptor.check_input(&good).is_ok());
    }

    #[derive(serde::Serialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Batch {
        orders: Vec<Order>,
        note: String,
    }

    /// A list whose elements were accepted before is checked by its new
    /// elements, and a new bad element is found among remembered ones.
    #[test]
    fn remembered_elements_never_hide_a_bad_one() {
        let schema = Schema::of::<Batch>();
        let order = |quantity: Value| serde_json::json!({"item": "tea", "quantity": quantity});
        let batch = |orders: &[Value]| {
            Payload::from_value(&serde_json::json!({"orders": orders, "note": "n"})).expect("json")
        };
        let mut orders: Vec<Value> = (0..5).map(|n| order(n.into())).collect();
        assert!(schema.is_valid(&batch(&orders)));
        // The text validator compiled, with the keyword standing in for
        // the orders' `items`.
        assert!(matches!(schema.validator.text.get(), Some(Some(_))));
        for bad in [
            order("two".into()),
            order(Value::from(-1)),
            serde_json::json!({"item": "tea"}),
            serde_json::json!([]),
            Value::Null,
        ] {
            orders.push(bad.clone());
            assert!(!schema.is_valid(&batch(&orders)), "{bad}");
            assert_eq!(
                schema
                    .validate(&batch(&orders))
                    .map_err(|violation| violation.path),
                Err(if bad.is_object() && bad.get("quantity").is_some() {
                    "/orders/5/quantity".to_owned()
                } else {
                    "/orders/5".to_owned()
                }),
                "{bad}"
            );
            orders.pop();
            assert!(schema.is_valid(&batch(&orders)));
        }
        let note =
            Payload::from_value(&serde_json::json!({"orders": orders, "note": 1})).expect("json");
        assert!(
            !schema.is_valid(&note),
            "the rest of the payload is checked"
        );
    }

    #[test]
    fn signals_are_rejected_by_default() {
        let descriptor = Descriptor::typed::<String, String>("a.b", "x").expect("valid");
        assert!(descriptor.check_signal(&Payload::null()).is_err());
    }

    #[test]
    fn bad_descriptors_are_refused() {
        assert!(Descriptor::new("Bad", "x", Schema::any(), Schema::any()).is_err());
        assert!(Descriptor::new("a", "", Schema::any(), Schema::any()).is_err());
        assert!(Schema::parse(r#"{"type": 12}"#).is_err());
    }

    #[test]
    fn digest_tracks_the_contract() {
        let a = Descriptor::typed::<String, String>("a.b", "x").expect("valid");
        let b = Descriptor::typed::<String, u32>("a.b", "x").expect("valid");
        assert_ne!(a.digest(), b.digest());
        let round: Descriptor =
            serde_json::from_str(&serde_json::to_string(&a).expect("ser")).expect("de");
        assert_eq!(round.digest(), a.digest());
    }
}
