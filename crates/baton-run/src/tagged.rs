//! Decoding internally tagged enums without buffering them.
//!
//! serde's derive reads an internally tagged enum (`{"kind": "…", …}`) by
//! first buffering the whole object into its private `Content` tree, since
//! the tag could come last; every payload inside it is then rebuilt as text
//! from that tree. For a record body carrying a large state that is most of
//! the cost of folding a log. Bodies are written with their tag first (serde
//! writes an internally tagged enum's tag before its fields), so the tag is
//! read first and the named variant's fields are read straight from the
//! rest of the object, payloads borrowed as text. An object whose first
//! member is not the tag (never written by Baton, but valid JSON) is read
//! the buffered way, with the same verdict as before.
//!
//! [`tag_first!`] defines such an enum once: the public type with its
//! serializer, and two private deserializers derived for it (serde's
//! `remote`), one per path, so neither repeats the variants by hand.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::CowStrDeserializer;
use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, VariantAccess, Visitor,
};
use serde_json::Value;

/// An enum read by [`deserialize`].
pub(crate) trait TagFirst: Sized {
    /// The tag's member name.
    const TAG: &'static str;
    /// What the enum is, for error messages.
    const EXPECTING: &'static str;

    /// Reads the variant a deserializer presents as an externally tagged
    /// enum (the tag as the variant's name, the other members as its fields).
    fn from_variant<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error>;

    /// Reads the whole object the buffered way.
    fn from_value(value: Value) -> Result<Self, serde_json::Error>;
}

/// Reads a `T` from an object, its tag first when it comes first.
pub(crate) fn deserialize<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TagFirst,
{
    deserializer.deserialize_any(Tagged(PhantomData))
}

struct Tagged<T>(PhantomData<T>);

impl<'de, T: TagFirst> Visitor<'de> for Tagged<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let Some(first) = map.next_key_seed(Text)? else {
            return Err(de::Error::missing_field(T::TAG));
        };
        if first == T::TAG {
            let tag = map.next_value_seed(Text)?;
            return T::from_variant(Variant { tag, map });
        }
        // The slow path: the object as a `Value`, read by the tagged derive.
        let mut object = serde_json::Map::new();
        object.insert(first.into_owned(), map.next_value_seed(Strict)?);
        members(&mut map, &mut object)?;
        T::from_value(Value::Object(object)).map_err(de::Error::custom)
    }

    /// serde's buffered reader also takes the tag and the fields as an
    /// array; so does this one, the buffered way.
    fn visit_seq<S: de::SeqAccess<'de>>(self, seq: S) -> Result<T, S::Error> {
        let array = Strict.visit_seq(seq)?;
        T::from_value(array).map_err(de::Error::custom)
    }
}

/// Reads the rest of an object's members into `object`, refusing a repeated
/// one (a `Value` would keep the last).
fn members<'de, A: MapAccess<'de>>(
    map: &mut A,
    object: &mut serde_json::Map<String, Value>,
) -> Result<(), A::Error> {
    while let Some(key) = map.next_key::<String>()? {
        let value = map.next_value_seed(Strict)?;
        if object.contains_key(&key) {
            return Err(de::Error::custom(format_args!("duplicate field `{key}`")));
        }
        object.insert(key, value);
    }
    Ok(())
}

/// A `Value` that refuses a repeated member at any depth, as the buffered
/// reader and a payload's own check do.
struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Strict)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = serde_json::Map::new();
        members(&mut map, &mut object)?;
        Ok(Value::Object(object))
    }
}

/// A string, borrowed from the input when it has no escapes.
struct Text;

impl<'de> DeserializeSeed<'de> for Text {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Text {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(text))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(text.to_owned()))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(text))
    }
}

/// The rest of a tagged object, presented as the externally tagged variant
/// its tag names.
struct Variant<'de, A> {
    tag: Cow<'de, str>,
    map: A,
}

impl<'de, A: MapAccess<'de>> Deserializer<'de> for Variant<'de, A> {
    type Error = A::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        visitor.visit_enum(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

impl<'de, A: MapAccess<'de>> EnumAccess<'de> for Variant<'de, A> {
    type Error = A::Error;
    type Variant = Fields<A>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Fields<A>), A::Error> {
        let variant = seed.deserialize(CowStrDeserializer::<A::Error>::new(self.tag))?;
        Ok((variant, Fields(self.map)))
    }
}

/// The members after the tag, as a struct variant's fields.
struct Fields<A>(A);

impl<'de, A: MapAccess<'de>> VariantAccess<'de> for Fields<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        Err(de::Error::custom("expected a struct variant"))
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, _seed: T) -> Result<T::Value, A::Error> {
        Err(de::Error::custom("expected a struct variant"))
    }

    fn tuple_variant<V: Visitor<'de>>(
        self,
        _len: usize,
        _visitor: V,
    ) -> Result<V::Value, A::Error> {
        Err(de::Error::custom("expected a struct variant"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        visitor.visit_map(self.0)
    }
}

/// Defines an internally tagged enum of struct variants (`tag`, snake-case
/// variant names, unknown fields refused) that [`deserialize`] reads tag
/// first. `remote` is the enum's own name as a string (serde's `remote`
/// attribute takes a literal), checked by the compiler against the enum.
macro_rules! tag_first {
    (
        tag = $tag:literal, remote = $remote:literal, expecting = $expecting:literal;
        $(#[$attr:meta])*
        $vis:vis enum $name:ident {
            $(
                $(#[$variant_attr:meta])*
                $variant:ident {
                    $( $(#[$field_attr:meta])* $field:ident : $ty:ty ),* $(,)?
                }
            ),* $(,)?
        }
    ) => {
        $(#[$attr])*
        #[derive(::serde::Serialize)]
        #[serde(tag = $tag, rename_all = "snake_case", deny_unknown_fields)]
        $vis enum $name {
            $(
                $(#[$variant_attr])*
                $variant { $( $(#[$field_attr])* $field: $ty ),* }
            ),*
        }

        const _: () = {
            /// The variants read with their tag as the variant's name.
            #[derive(::serde::Deserialize)]
            #[serde(remote = $remote, rename_all = "snake_case", deny_unknown_fields)]
            #[allow(dead_code)]
            enum Named {
                $( $variant { $( $(#[$field_attr])* $field: $ty ),* } ),*
            }

            /// The variants read the buffered way.
            #[derive(::serde::Deserialize)]
            #[serde(remote = $remote, tag = $tag, rename_all = "snake_case", deny_unknown_fields)]
            #[allow(dead_code)]
            enum Buffered {
                $( $variant { $( $(#[$field_attr])* $field: $ty ),* } ),*
            }

            impl $crate::tagged::TagFirst for $name {
                const TAG: &'static str = $tag;
                const EXPECTING: &'static str = $expecting;

                fn from_variant<'de, D: ::serde::Deserializer<'de>>(
                    deserializer: D,
                ) -> Result<Self, D::Error> {
                    Named::deserialize(deserializer)
                }

                fn from_value(value: ::serde_json::Value) -> Result<Self, ::serde_json::Error> {
                    Buffered::deserialize(value)
                }
            }

            impl<'de> ::serde::Deserialize<'de> for $name {
                fn deserialize<D: ::serde::Deserializer<'de>>(
                    deserializer: D,
                ) -> Result<Self, D::Error> {
                    $crate::tagged::deserialize(deserializer)
                }
            }
        };
    };
}

pub(crate) use tag_first;

#[cfg(test)]
mod tests {
    use serde::Serialize;
    use serde::de::DeserializeOwned;

    use crate::budget::{Budget, Meters};
    use crate::failure::Failure;
    use crate::ids::{ChildKey, EffectId, ProcessId, StartId};
    use crate::payload::Payload;
    use crate::protocol::{Boundary, Condition, Effect, Grant, Settlement, SignalBody, Transition};

    /// `value` read back from its own text (tag first), from the text with
    /// the tag moved last, and from a `serde_json::Value` (sorted members).
    fn reads_back<T>(tag: &str, value: &T)
    where
        T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        let text = serde_json::to_string(value).expect("encodes");
        assert!(text.starts_with(&format!(r#"{{"{tag}":"#)), "{text}");
        assert_eq!(&serde_json::from_str::<T>(&text).expect("tag first"), value);
        let serde_json::Value::Object(mut object) = serde_json::to_value(value).expect("encodes")
        else {
            panic!("an object: {text}");
        };
        let tag_value = object.remove(tag).expect("tagged");
        let rest = serde_json::to_string(&object).expect("encodes");
        let moved = format!(
            r#"{}{}"{tag}":{tag_value}}}"#,
            &rest[..rest.len() - 1],
            if object.is_empty() { "" } else { "," }
        );
        assert_eq!(
            &serde_json::from_str::<T>(&moved).expect("tag last"),
            value,
            "{moved}"
        );
        let sorted = serde_json::to_value(value).expect("encodes");
        assert_eq!(
            &serde_json::from_value::<T>(sorted).expect("from a value"),
            value
        );
    }

    fn payload(text: &str) -> Payload {
        Payload::parse_str(text).expect("valid")
    }

    /// Every protocol enum read tag first decodes to what it was, nested
    /// enums and payloads with escapes included; and so does the same text
    /// with its tag last.
    #[test]
    fn protocol_enums_read_back_with_their_tag_first_or_last() {
        let process = ProcessId::root(&StartId::new("acme", "s").expect("valid"));
        let effect = EffectId::new(process, 2, 0);
        let key = ChildKey::new("child").expect("valid");
        let failure = Failure::execution("test.failed", "it \"failed\"\n");
        let start = Effect::StartChild {
            key: key.clone(),
            program: crate::digest::Digest::ZERO,
            input: payload(r#"{"a":[1,2,{"b":"c\\d"}],"e":null}"#),
            budget: Budget::unlimited(),
            capabilities: crate::budget::Capabilities::none(),
            grant: Grant::Clipped,
        };
        let wait = Effect::WaitChildren {
            keys: vec![key.clone()],
            boundary: Boundary::Drained,
            condition: Condition::Quorum(1),
        };
        reads_back("effect", &start);
        reads_back("effect", &wait);
        reads_back(
            "effect",
            &Effect::CancelChild {
                key: key.clone(),
                reason: "enough".into(),
            },
        );
        for transition in [
            Transition::Continue {
                consumed: 1,
                effects: vec![start, wait],
            },
            Transition::Complete {
                consumed: 0,
                output: payload(r#""done""#),
            },
            Transition::Fail {
                consumed: 3,
                failure: failure.clone(),
            },
        ] {
            reads_back("transition", &transition);
        }
        let succeeded = Settlement::Succeeded {
            output: payload("[true,false,-1.5]"),
            usage: Meters::default(),
        };
        for settlement in [
            succeeded.clone(),
            Settlement::Failed {
                failure: failure.clone(),
                usage: Meters::default(),
                retry: None,
            },
            Settlement::Unknown {
                diagnostic: "lost".into(),
            },
        ] {
            reads_back("status", &settlement);
        }
        for body in [
            SignalBody::Input {
                payload: payload(r#"{"x":"\u0000"}"#),
            },
            SignalBody::Settled {
                effect,
                settlement: succeeded.clone(),
            },
            SignalBody::ChildStarted {
                effect,
                key: key.clone(),
                process: None,
                failure: Some(failure),
            },
            SignalBody::ControlReceipt {
                effect,
                key,
                result: succeeded,
            },
        ] {
            reads_back("signal", &body);
        }
        reads_back(
            "delivery",
            &crate::log::Delivery::Cancel {
                reason: "stop \"now\"".into(),
            },
        );
    }

    /// A repeated member is refused with the tag last as with it first, at
    /// any depth (a payload's duplicate key included).
    #[test]
    fn a_repeated_member_is_refused_wherever_the_tag_is() {
        for text in [
            r#"{"status":"succeeded","output":{"a":1,"a":2}}"#,
            r#"{"output":{"a":1,"a":2},"status":"succeeded"}"#,
            r#"{"output":[{"b":{"a":1,"a":2}}],"status":"succeeded"}"#,
            r#"{"output":1,"output":2,"status":"succeeded"}"#,
            r#"{"output":1,"status":"succeeded","status":"succeeded"}"#,
        ] {
            assert!(serde_json::from_str::<Settlement>(text).is_err(), "{text}");
        }
        let nested = r#"{"consumed":0,"failure":{"kind":"execution","kind":"execution","code":"a.b","message":"m"},"transition":"fail"}"#;
        assert!(
            serde_json::from_str::<Transition>(nested).is_err(),
            "{nested}"
        );
    }

    /// The array form serde's tagged reader takes (the tag, then the fields
    /// in order) is still read, and still checked.
    #[test]
    fn the_array_form_reads_as_before() {
        let read = serde_json::from_str::<Transition>(r#"["complete",2,{"b":1,"a":[]}]"#);
        assert_eq!(
            read.expect("an array"),
            Transition::Complete {
                consumed: 2,
                output: payload(r#"{"a":[],"b":1}"#),
            }
        );
        for text in [
            r#"["complete",2]"#,
            r#"["finish",2,1]"#,
            "[]",
            r#"["complete",2,{"a":1,"a":2}]"#,
        ] {
            assert!(serde_json::from_str::<Transition>(text).is_err(), "{text}");
        }
    }

    /// A payload written out of canonical form (members unsorted, spaces,
    /// escapes) is read to the same canonical payload on either path.
    #[test]
    fn a_payload_out_of_canonical_form_reads_the_same_on_either_path() {
        let first = r#"{"status":"succeeded", "output": { "b" : [1.50, "\u0041"], "a":{} }}"#;
        let last = r#"{"output": { "b" : [1.50, "\u0041"], "a":{} }, "status":"succeeded"}"#;
        let read = |text: &str| serde_json::from_str::<Settlement>(text).expect(text);
        assert_eq!(read(first), read(last));
        let Settlement::Succeeded { output, .. } = read(first) else {
            panic!("succeeded");
        };
        assert_eq!(output.as_str(), r#"{"a":{},"b":[1.5,"A"]}"#);
    }

    /// The variant's fields are still checked: a missing field, a member of
    /// another variant, and a tag of no variant are refused.
    #[test]
    fn a_variant_missing_a_field_or_with_another_variants_is_refused() {
        let cases = [
            (
                r#"{"transition":"complete","consumed":0}"#,
                "missing field `output`",
            ),
            (
                r#"{"transition":"complete","consumed":0,"output":1,"effects":[]}"#,
                "unknown field `effects`",
            ),
            (
                r#"{"transition":"finish","consumed":0}"#,
                "unknown variant `finish`",
            ),
            (
                r#"{"consumed":0,"transition":"finish"}"#,
                "unknown variant `finish`",
            ),
        ];
        for (text, expected) in cases {
            let error = serde_json::from_str::<Transition>(text)
                .expect_err(text)
                .to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }
}
