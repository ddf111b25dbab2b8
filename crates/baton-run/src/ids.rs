//! Identifiers: validated names and keys, and hash-derived process, effect
//! and wait ids.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::digest::{Digest, HexText, Purpose, unhex};

/// A rejected identifier or name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {text:?}: {rule}")]
pub struct IdError {
    /// Which kind of identifier was rejected.
    pub what: &'static str,
    /// The rejected text (truncated to 80 characters).
    pub text: String,
    /// The rule it broke.
    pub rule: &'static str,
}

impl IdError {
    fn new(what: &'static str, text: &str, rule: &'static str) -> IdError {
        IdError {
            what,
            text: text.chars().take(80).collect(),
            rule,
        }
    }
}

const IDENTITY_RULE: &str = "expected 1 to 128 characters from A-Z a-z 0-9 - _ . :";

fn check_identity(what: &'static str, text: &str) -> Result<(), IdError> {
    let ok = !text.is_empty()
        && text.len() <= 128
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
    if ok {
        Ok(())
    } else {
        Err(IdError::new(what, text, IDENTITY_RULE))
    }
}

const NAME_RULE: &str = "expected lowercase dotted segments, each starting with a letter, from a-z 0-9 _, at most 128 bytes";

fn check_name(what: &'static str, text: &str) -> Result<(), IdError> {
    let ok = !text.is_empty()
        && text.len() <= 128
        && text.split('.').all(|segment| {
            segment
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_lowercase())
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        });
    if ok {
        Ok(())
    } else {
        Err(IdError::new(what, text, NAME_RULE))
    }
}

const SCOPE_RULE: &str =
    "expected tenant[/user[/session]], each segment 1 to 128 characters from A-Z a-z 0-9 - _ . :";

fn check_scope(what: &'static str, text: &str) -> Result<(), IdError> {
    let segments: Vec<&str> = text.split('/').collect();
    let ok = text.len() <= 256
        && segments.len() <= 3
        && segments.iter().all(|s| check_identity(what, s).is_ok());
    if ok {
        Ok(())
    } else {
        Err(IdError::new(what, text, SCOPE_RULE))
    }
}

/// A host-supplied signal id: an identity that does not use the reserved prefix.
fn check_host_signal(what: &'static str, text: &str) -> Result<(), IdError> {
    check_identity(what, text)?;
    if text.starts_with(SignalId::ENGINE_PREFIX) {
        return Err(IdError::new(
            what,
            text,
            "the prefix engine: is reserved for engine-minted signals",
        ));
    }
    Ok(())
}

/// Declares a validated text identifier. `$check` guards `new` (what callers
/// may create); `$stored` guards deserialization (what a log may hold).
macro_rules! text_id {
    ($(#[$meta:meta])* $name:ident, $what:literal, $check:ident, $stored:ident, $max:literal) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(std::sync::Arc<str>);

        impl $name {
            /// Validates and wraps the text.
            pub fn new(text: impl AsRef<str>) -> Result<Self, IdError> {
                let text = text.as_ref();
                $check($what, text)?;
                Ok(Self(text.into()))
            }

            /// The text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// Checks `text` by the rule decoding applies (what a log may
            /// hold), without building the identifier.
            pub fn check(text: &str) -> Result<(), IdError> {
                $stored($what, text)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(text: &str) -> Result<Self, IdError> {
                Self::new(text)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                crate::payload::read_str(deserializer, |text| {
                    $stored($what, text).map(|()| Self(text.into()))
                })
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn inline_schema() -> bool {
                true
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string", "minLength": 1, "maxLength": $max })
            }
        }
    };
}

text_id!(
    /// A parent-scoped key naming one child of a process.
    ChildKey, "child key", check_identity, check_identity, 128
);
text_id!(
    /// The caller-chosen key of a root start, unique within its scope.
    StartKey, "start key", check_identity, check_identity, 128
);
text_id!(
    /// A lowercase dotted name: descriptors, meters, capabilities, failure codes.
    Name, "name", check_name, check_name, 128
);
text_id!(
    /// Identity of a signal. Host-supplied ids are caller-stable text; ids the
    /// engine mints for its own signals start with the reserved prefix
    /// `engine:`, which `new` refuses.
    SignalId, "signal id", check_host_signal, check_host_signal, 128
);
text_id!(
    /// The tenant scope of a root (tenant, optionally `tenant/user` or
    /// `tenant/user/session`). Every engine call that touches a process
    /// checks the caller's scope.
    Scope, "scope", check_scope, check_scope, 256
);

impl SignalId {
    /// Prefix reserved for engine-minted signal ids.
    pub const ENGINE_PREFIX: &'static str = "engine:";

    /// The engine's id for the signal that carries an effect's result.
    pub fn for_effect(effect: EffectId) -> SignalId {
        // Laid out on the stack, so the id's one allocation is its own.
        const PREFIX: usize = SignalId::ENGINE_PREFIX.len();
        let effect = effect.text();
        let mut text = [0u8; PREFIX + 2 + 32];
        text[..PREFIX].copy_from_slice(Self::ENGINE_PREFIX.as_bytes());
        text[PREFIX..].copy_from_slice(effect.as_str().as_bytes());
        SignalId(
            std::str::from_utf8(&text)
                .expect("an ASCII prefix and an id's text")
                .into(),
        )
    }

    /// Reads a stored signal id, engine-minted ones included: the kernel's
    /// own records and states hold result signals under the reserved
    /// prefix. Every other way in (`new`, `from_str`, deserialization)
    /// refuses that prefix, so no host or program can forge one.
    pub(crate) fn deserialize_stored<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<SignalId, D::Error> {
        crate::payload::read_str(deserializer, |text| {
            check_identity("signal id", text).map(|()| SignalId(text.into()))
        })
    }

    /// Whether the engine minted this id.
    pub fn is_engine(&self) -> bool {
        self.0.starts_with(Self::ENGINE_PREFIX)
    }
}

impl Scope {
    /// The tenant (first segment).
    pub fn tenant(&self) -> &str {
        self.0.split('/').next().unwrap_or(&self.0)
    }
}

/// Names a root process: the caller's scope and a key unique within it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartId {
    /// The tenant scope.
    pub scope: Scope,
    /// The caller's key.
    pub key: StartKey,
}

impl StartId {
    /// Builds a start id from text, validating both parts.
    pub fn new(scope: impl AsRef<str>, key: impl AsRef<str>) -> Result<StartId, IdError> {
        Ok(StartId {
            scope: Scope::new(scope)?,
            key: StartKey::new(key)?,
        })
    }
}

macro_rules! derived_id {
    ($(#[$meta:meta])* $name:ident, $prefix:literal, $what:literal) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name([u8; 16]);

        impl $name {
            fn derive(parts: &[&[u8]]) -> $name {
                let digest = Digest::of_parts(Purpose::Identity, parts);
                let mut bytes = [0u8; 16];
                bytes.copy_from_slice(&digest.as_bytes()[..16]);
                $name(bytes)
            }

            /// The raw 16 bytes.
            pub const fn as_bytes(&self) -> &[u8; 16] {
                &self.0
            }

            /// The text form, built on the stack.
            pub(crate) fn text(&self) -> HexText {
                HexText::new($prefix, &self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(self.text().as_str())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(text: &str) -> Result<Self, IdError> {
                text.strip_prefix($prefix)
                    .and_then(unhex::<16>)
                    .map($name)
                    .ok_or_else(|| {
                        IdError::new($what, text, concat!("expected ", $prefix, " followed by 32 lower-case hex digits"))
                    })
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.text().as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                crate::payload::read_str(deserializer, str::parse)
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn inline_schema() -> bool {
                true
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string", "pattern": concat!("^", $prefix, "[0-9a-f]{32}$") })
            }
        }
    };
}

derived_id!(
    /// A process: `H(scope, key)` for a root, `H(parent, child key)` for a child.
    ProcessId, "p_", "process id"
);
derived_id!(
    /// An effect: `H(process, step, index)`.
    EffectId, "e_", "effect id"
);
derived_id!(
    /// A wait: `H(effect)`.
    WaitId, "w_", "wait id"
);

impl ProcessId {
    /// The root process named by a start id.
    pub fn root(start: &StartId) -> ProcessId {
        ProcessId::derive(&[
            b"root",
            start.scope.as_str().as_bytes(),
            start.key.as_str().as_bytes(),
        ])
    }

    /// The child of `parent` under `key`.
    pub fn child(parent: ProcessId, key: &ChildKey) -> ProcessId {
        ProcessId::derive(&[b"child", &parent.0, key.as_str().as_bytes()])
    }

    /// The id as a payload (a start effect's receipt), exactly as
    /// `Payload::encode` writes it: a JSON string, which an id's text fills
    /// without escapes.
    pub(crate) fn payload(&self) -> crate::payload::Payload {
        crate::payload::Payload::plain_string(self.text().as_str())
    }

    /// The id `payload` holds, as `Payload::decode` reads it, or `None`
    /// where that fails: a canonical string holds an id's characters only
    /// unescaped, so its text between the quotes is the id's.
    pub(crate) fn from_payload(payload: &crate::payload::Payload) -> Option<ProcessId> {
        let text = payload.as_str().strip_prefix('"')?.strip_suffix('"')?;
        text.parse().ok()
    }
}

impl EffectId {
    /// The `index`-th effect declared by `process` in step `step`.
    pub fn new(process: ProcessId, step: u64, index: u32) -> EffectId {
        EffectId::derive(&[
            b"effect",
            &process.0,
            &step.to_le_bytes(),
            &index.to_le_bytes(),
        ])
    }
}

impl WaitId {
    /// The wait opened by `effect`.
    pub fn for_effect(effect: EffectId) -> WaitId {
        WaitId::derive(&[b"wait", &effect.0])
    }
}

/// A tree is named by its root process.
pub type TreeId = ProcessId;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_accepts_exactly_what_decoding_accepts() {
        for text in [
            "a",
            "t-1",
            "team.turn.3",
            "Ab:9",
            "",
            "has space",
            "ümlaut",
            &"x".repeat(129),
        ] {
            let decoded = serde_json::from_value::<ChildKey>(serde_json::json!(text)).is_ok();
            assert_eq!(ChildKey::check(text).is_ok(), decoded, "{text:?}");
            let decoded = serde_json::from_value::<Name>(serde_json::json!(text)).is_ok();
            assert_eq!(Name::check(text).is_ok(), decoded, "{text:?}");
        }
        assert!(Name::check("w.echo").is_ok() && Name::check("W.echo").is_err());
    }

    #[test]
    fn names_and_keys_validate() {
        assert!(Name::new("example.reviewer").is_ok());
        assert!(Name::new("Example").is_err());
        assert!(Name::new("a..b").is_err());
        assert!(Name::new("").is_err());
        assert!(Name::new("1a").is_err());
        assert!(ChildKey::new("review-1:a").is_ok());
        assert!(ChildKey::new("has space").is_err());
        assert!(ChildKey::new("x".repeat(129)).is_err());
        assert!(SignalId::new("engine:x").is_err());
        assert!(Scope::new("acme/alice/s1").is_ok());
        assert!(Scope::new("acme//x").is_err());
        assert!(Scope::new("a/b/c/d").is_err());
    }

    #[test]
    fn a_reserved_signal_id_is_refused_on_every_way_in_but_the_kernel_s_own_records() {
        let error = serde_json::from_str::<SignalId>(r#""engine:x""#)
            .expect_err("serde refuses the reserved prefix");
        assert!(error.to_string().contains("reserved"), "{error}");
        assert!("engine:x".parse::<SignalId>().is_err());
        assert!(serde_json::from_str::<SignalId>(r#""host-1""#).is_ok());
        // The engine's result signals, as its records and states hold them.
        let effect = EffectId::new(
            ProcessId::root(&StartId::new("acme", "job").expect("valid")),
            0,
            0,
        );
        let minted = SignalId::for_effect(effect);
        let signal = crate::protocol::Signal {
            id: minted.clone(),
            wait: None,
            body: crate::protocol::SignalBody::Input {
                payload: crate::payload::Payload::null(),
            },
        };
        let text = serde_json::to_string(&signal).expect("encodes");
        let back: crate::protocol::Signal = serde_json::from_str(&text).expect("decodes");
        assert_eq!(back.id, minted);
        assert!(
            serde_json::from_str::<SignalId>(&serde_json::to_string(&minted).expect("encodes"))
                .is_err()
        );
    }

    #[test]
    fn derived_ids_are_stable_and_parse() {
        let start = StartId::new("acme", "job-1").expect("valid");
        let root = ProcessId::root(&start);
        assert_eq!(root, ProcessId::root(&start));
        assert_ne!(
            root,
            ProcessId::root(&StartId::new("other", "job-1").expect("valid"))
        );
        let text = root.to_string();
        assert!(text.starts_with("p_"));
        assert_eq!(text.parse::<ProcessId>(), Ok(root));
        assert!(text.replace("p_", "e_").parse::<ProcessId>().is_err());
        let effect = EffectId::new(root, 3, 0);
        assert_ne!(effect, EffectId::new(root, 3, 1));
        assert_ne!(WaitId::for_effect(effect).as_bytes(), effect.as_bytes());
    }

    #[test]
    fn text_forms_agree() {
        let root = ProcessId::root(&StartId::new("acme", "job-1").expect("valid"));
        let effect = EffectId::new(root, 3, 0);
        let text = effect.to_string();
        assert_eq!(text.len(), 2 + 32);
        assert_eq!(
            serde_json::to_string(&effect).unwrap(),
            format!("\"{text}\"")
        );
        assert_eq!(
            format!("{effect:>40}"),
            format!("{text:>40}"),
            "Display pads"
        );
        assert_eq!(
            SignalId::for_effect(effect).as_str(),
            format!("engine:{text}")
        );
        let digest = crate::digest::Digest::of(crate::digest::Purpose::Payload, b"x");
        let shown = digest.to_string();
        assert_eq!(shown, format!("b3:{}", digest.to_hex()));
        assert_eq!(
            serde_json::to_string(&digest).unwrap(),
            format!("\"{shown}\"")
        );
        assert_eq!(shown.parse(), Ok(digest));
    }

    proptest::proptest! {
        /// A process id as a start effect's receipt is the payload serde
        /// writes, and any payload reads back as the id serde reads, or
        /// as none where serde refuses it.
        #[test]
        fn a_process_id_payload_is_serdes(
            bytes in proptest::array::uniform16(proptest::prelude::any::<u8>()),
            text in "(\"p_[0-9a-fA-F]{30,34}\"|\"[a-z_0-9\\\\u]{0,40}\"|[0-9]{1,3}|null)",
        ) {
            let id = ProcessId(bytes);
            let payload = id.payload();
            proptest::prop_assert_eq!(&payload, &crate::payload::Payload::encode(&id).unwrap());
            proptest::prop_assert_eq!(ProcessId::from_payload(&payload), Some(id));
            for payload in [
                crate::payload::Payload::parse_str(&text).ok(),
                crate::payload::Payload::encode(&format!("p_{}", id.to_string().split_at(2).1)).ok(),
                crate::payload::Payload::encode(&id.to_string().to_uppercase()).ok(),
            ]
            .into_iter()
            .flatten()
            {
                proptest::prop_assert_eq!(
                    ProcessId::from_payload(&payload),
                    payload.decode::<ProcessId>().ok(),
                    "{}",
                    payload
                );
            }
        }
    }
}
