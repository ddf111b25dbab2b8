//! Labels: small key–value pairs a host gives a tree when it starts it, so
//! that listings can be filtered by them (`team=billing`, `env=staging`).
//!
//! Labels are recorded with the tree's start and never change; they are not
//! part of a start's identity (see `StartRequest::labels`).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The most labels one tree carries.
pub const MAX_LABELS: usize = 32;

/// The longest label key, in bytes.
pub const MAX_LABEL_KEY_BYTES: usize = 63;

/// The longest label value, in bytes.
pub const MAX_LABEL_VALUE_BYTES: usize = 256;

const KEY_RULE: &str =
    "expected 1 to 63 characters from a-z 0-9 . _ -, starting with a letter or digit";

/// Why labels were refused. The refused key or value is handed back.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LabelError {
    /// A key breaks the key rule.
    #[error("engine.label.key: invalid label key {key:?}: {KEY_RULE}")]
    Key {
        /// The refused key (at most 80 characters of it).
        key: String,
    },
    /// A value is too long or holds a control character.
    #[error(
        "engine.label.value: the value of label {key} is invalid: expected at most {MAX_LABEL_VALUE_BYTES} bytes without control characters"
    )]
    Value {
        /// The label's key.
        key: String,
        /// The refused value.
        value: String,
    },
    /// More labels than a tree carries.
    #[error("engine.label.too_many: {count} labels given, at most {MAX_LABELS} allowed")]
    TooMany {
        /// How many were given.
        count: usize,
    },
    /// One key was given twice with different values.
    #[error("engine.label.duplicate: label {key} is given twice with different values")]
    Duplicate {
        /// The key.
        key: String,
    },
    /// A `key=value` pair without `=`.
    #[error("engine.label.pair: {text:?} is not a key=value pair")]
    Pair {
        /// The refused text.
        text: String,
    },
}

impl LabelError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            LabelError::Key { .. } => "engine.label.key",
            LabelError::Value { .. } => "engine.label.value",
            LabelError::TooMany { .. } => "engine.label.too_many",
            LabelError::Duplicate { .. } => "engine.label.duplicate",
            LabelError::Pair { .. } => "engine.label.pair",
        }
    }
}

fn check_key(text: &str) -> Result<(), LabelError> {
    let bytes = text.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= MAX_LABEL_KEY_BYTES
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(LabelError::Key {
            key: text.chars().take(80).collect(),
        })
    }
}

fn check_value(key: &str, value: &str) -> Result<(), LabelError> {
    if value.len() <= MAX_LABEL_VALUE_BYTES && !value.chars().any(char::is_control) {
        Ok(())
    } else {
        Err(LabelError::Value {
            key: key.to_owned(),
            value: value.to_owned(),
        })
    }
}

/// A label's key: 1 to 63 characters from `a-z 0-9 . _ -`, starting with a
/// letter or a digit.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LabelKey(Arc<str>);

impl LabelKey {
    /// Validates and wraps the text.
    pub fn new(text: impl AsRef<str>) -> Result<LabelKey, LabelError> {
        let text = text.as_ref();
        check_key(text)?;
        Ok(LabelKey(text.into()))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LabelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LabelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LabelKey({:?})", &*self.0)
    }
}

impl FromStr for LabelKey {
    type Err = LabelError;
    fn from_str(text: &str) -> Result<LabelKey, LabelError> {
        LabelKey::new(text)
    }
}

/// A tree's labels: at most [`MAX_LABELS`] pairs of a [`LabelKey`] and a
/// value of at most [`MAX_LABEL_VALUE_BYTES`] bytes without control
/// characters, kept in key order. Serialized as a JSON object.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Labels(BTreeMap<LabelKey, String>);

impl Labels {
    /// No labels.
    pub fn new() -> Labels {
        Labels::default()
    }

    /// Labels from `(key, value)` pairs, validated; a key given twice with
    /// the same value counts once.
    pub fn from_pairs<K, V>(pairs: impl IntoIterator<Item = (K, V)>) -> Result<Labels, LabelError>
    where
        K: AsRef<str>,
        V: Into<String>,
    {
        let mut labels = Labels::new();
        let mut count = 0usize;
        for (key, value) in pairs {
            let key = LabelKey::new(key)?;
            let value = value.into();
            check_value(key.as_str(), &value)?;
            match labels.0.get(&key) {
                Some(existing) if *existing == value => {}
                Some(_) => {
                    return Err(LabelError::Duplicate {
                        key: key.to_string(),
                    });
                }
                None => {
                    count += 1;
                    labels.0.insert(key, value);
                }
            }
        }
        if count > MAX_LABELS {
            return Err(LabelError::TooMany { count });
        }
        Ok(labels)
    }

    /// Labels from `key=value` texts (as a command line takes them), validated.
    pub fn parse_pairs<S: AsRef<str>>(
        texts: impl IntoIterator<Item = S>,
    ) -> Result<Labels, LabelError> {
        let mut pairs = Vec::new();
        for text in texts {
            let text = text.as_ref();
            let Some((key, value)) = text.split_once('=') else {
                return Err(LabelError::Pair {
                    text: text.chars().take(80).collect(),
                });
            };
            pairs.push((key.to_owned(), value.to_owned()));
        }
        Labels::from_pairs(pairs)
    }

    /// Adds or replaces one label.
    pub fn insert(&mut self, key: LabelKey, value: impl Into<String>) -> Result<(), LabelError> {
        let value = value.into();
        check_value(key.as_str(), &value)?;
        if !self.0.contains_key(&key) && self.0.len() >= MAX_LABELS {
            return Err(LabelError::TooMany {
                count: self.0.len() + 1,
            });
        }
        self.0.insert(key, value);
        Ok(())
    }

    /// The value of a label.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k.as_str() == key)
            .map(|(_, value)| value.as_str())
    }

    /// The labels in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&LabelKey, &str)> {
        self.0.iter().map(|(key, value)| (key, value.as_str()))
    }

    /// How many labels there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether every pair of `selector` is one of these labels (an empty
    /// selector matches everything).
    pub fn contains_all(&self, selector: &Labels) -> bool {
        selector
            .0
            .iter()
            .all(|(key, value)| self.0.get(key) == Some(value))
    }

    /// The labels as a canonical JSON object (keys in order, no whitespace),
    /// as stores keep them.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a map of strings always serializes")
    }

    /// Labels from the JSON object [`Labels::to_json`] wrote, validated.
    pub fn from_json(text: &str) -> Result<Labels, String> {
        serde_json::from_str(text).map_err(|error| error.to_string())
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| (k.as_str(), v)))
            .finish()
    }
}

/// `key=value` pairs joined by commas, in key order.
impl fmt::Display for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, (key, value)) in self.0.iter().enumerate() {
            if n > 0 {
                f.write_str(",")?;
            }
            write!(f, "{key}={value}")?;
        }
        Ok(())
    }
}

impl TryFrom<BTreeMap<String, String>> for Labels {
    type Error = LabelError;
    fn try_from(map: BTreeMap<String, String>) -> Result<Labels, LabelError> {
        Labels::from_pairs(map)
    }
}

impl Serialize for Labels {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (k.as_str(), v)))
    }
}

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Labels, D::Error> {
        let map = BTreeMap::<String, String>::deserialize(deserializer)?;
        Labels::try_from(map).map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for Labels {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Labels".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "object",
            "maxProperties": MAX_LABELS,
            "propertyNames": { "pattern": "^[a-z0-9][a-z0-9._-]{0,62}$" },
            "additionalProperties": { "type": "string", "maxLength": MAX_LABEL_VALUE_BYTES }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_rule() {
        for good in ["a", "team", "0", "app.kubernetes_io-name", &"k".repeat(63)] {
            assert!(LabelKey::new(good).is_ok(), "{good}");
        }
        for bad in ["", "Team", "-a", ".a", "a b", "a/b", "é", &"k".repeat(64)] {
            let error = LabelKey::new(bad).expect_err(bad);
            assert_eq!(error.code(), "engine.label.key");
        }
    }

    #[test]
    fn values_are_bounded_and_printable() {
        assert!(Labels::from_pairs([("a", "")]).is_ok());
        assert!(Labels::from_pairs([("a", "x".repeat(256))]).is_ok());
        let long = Labels::from_pairs([("a", "x".repeat(257))]).expect_err("too long");
        assert_eq!(long.code(), "engine.label.value");
        let control = Labels::from_pairs([("a", "x\ny")]).expect_err("control");
        assert_eq!(
            control,
            LabelError::Value {
                key: "a".into(),
                value: "x\ny".into()
            }
        );
    }

    #[test]
    fn at_most_32_labels() {
        let pairs = |n: usize| (0..n).map(|i| (format!("k{i}"), "v".to_owned()));
        assert_eq!(Labels::from_pairs(pairs(32)).expect("32 fit").len(), 32);
        let error = Labels::from_pairs(pairs(33)).expect_err("33 do not");
        assert_eq!(error, LabelError::TooMany { count: 33 });
        let mut labels = Labels::from_pairs(pairs(32)).expect("32 fit");
        let key = LabelKey::new("k0").expect("valid");
        labels.insert(key, "w").expect("replacing keeps 32");
        let key = LabelKey::new("extra").expect("valid");
        assert_eq!(
            labels.insert(key, "v").expect_err("a 33rd").code(),
            "engine.label.too_many"
        );
    }

    #[test]
    fn pairs_parse_and_conflicting_duplicates_are_refused() {
        let labels =
            Labels::parse_pairs(["team=billing", "env=a=b", "team=billing"]).expect("valid");
        assert_eq!(labels.get("team"), Some("billing"));
        assert_eq!(labels.get("env"), Some("a=b"));
        assert_eq!(labels.to_string(), "env=a=b,team=billing");
        assert_eq!(
            Labels::parse_pairs(["team=a", "team=b"]).expect_err("conflict"),
            LabelError::Duplicate { key: "team".into() }
        );
        assert_eq!(
            Labels::parse_pairs(["team"]).expect_err("no =").code(),
            "engine.label.pair"
        );
    }

    #[test]
    fn json_round_trips_and_deserializing_validates() {
        let labels = Labels::from_pairs([("b", "2"), ("a", "1")]).expect("valid");
        assert_eq!(labels.to_json(), r#"{"a":"1","b":"2"}"#);
        assert_eq!(Labels::from_json(&labels.to_json()), Ok(labels));
        assert!(Labels::from_json(r#"{"Bad":"1"}"#).is_err());
    }

    #[test]
    fn a_selector_matches_when_every_pair_is_present() {
        let labels = Labels::from_pairs([("team", "billing"), ("env", "prod")]).expect("valid");
        let select = |pairs: &[(&str, &str)]| {
            Labels::from_pairs(pairs.iter().copied()).expect("valid selector")
        };
        assert!(labels.contains_all(&Labels::new()));
        assert!(labels.contains_all(&select(&[("team", "billing")])));
        assert!(labels.contains_all(&select(&[("team", "billing"), ("env", "prod")])));
        assert!(!labels.contains_all(&select(&[("team", "sales")])));
        assert!(!labels.contains_all(&select(&[("team", "billing"), ("zone", "a")])));
    }
}
