//! The canonical and compact writers against serde_json's own output.

use proptest::prelude::*;

use super::*;
use crate::test_json::value;

fn needs_escape_naive(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .any(|&byte| byte < 0x20 || byte == b'"' || byte == b'\\')
}

/// Every byte at every position of short texts (the words, and a rest
/// shorter than a word read as two overlapping halves or byte by byte)
/// and of texts around one, two and three blocks of 64 bytes long, with a
/// remainder of words and bytes after their blocks.
#[test]
fn needs_escape_finds_every_byte_at_every_position() {
    let lens = (1..=17).chain([63, 64, 65, 71, 72, 127, 128, 129, 192, 203]);
    for len in lens {
        for at in 0..len {
            for byte in 0..=255u8 {
                let mut text = vec![b'a'; len];
                text[at] = byte;
                assert_eq!(
                    needs_escape(&text),
                    needs_escape_naive(&text),
                    "byte {byte:#04x} at {at} of {len}"
                );
            }
        }
    }
}

/// A long run goes in pieces cut at character boundaries, at any offset,
/// and arrives whole, whatever the width of the characters a piece would
/// end inside.
#[test]
fn long_runs_are_appended_whole_at_any_offset() {
    for filler in ["a", "é", "€", "𝄞", "ab€"] {
        let run: String = std::iter::repeat_n(filler, 10_000 / filler.len() + 1).collect();
        for offset in [0, 1, 7, 8, 9, 63, 4095] {
            for chars in [0, 1, 2047, 2048, 2049, 4097, 10_000] {
                let end = run.floor_char_boundary(chars);
                let mut out = "x".repeat(offset);
                append(&mut out, &run[..end]);
                assert_eq!(out.len(), offset + end);
                assert!(out[..offset].bytes().all(|b| b == b'x'));
                assert_eq!(
                    &out[offset..],
                    &run[..end],
                    "{end} bytes of {filler:?} after {offset}"
                );
            }
        }
    }
}

proptest! {
    /// The word-at-a-time test answers exactly as the byte-at-a-time one,
    /// over text dense in bytes near the limits (0x1f, 0x20, quotes,
    /// backslashes, high bytes).
    #[test]
    fn needs_escape_is_exact(bytes in proptest::collection::vec(
        prop_oneof![
            Just(0x1fu8), Just(0x20), Just(b'"'), Just(b'\\'), Just(b'!'),
            Just(0x5b), Just(0x5d), Just(0x80), Just(0xff), Just(0x00), any::<u8>()
        ],
        0..300,
    )) {
        prop_assert_eq!(needs_escape(&bytes), needs_escape_naive(&bytes));
    }

    /// Long text (past the blocks of the escape test and the pieces of a
    /// long copy), with a few characters to escape anywhere or none, is
    /// escaped as serde_json escapes it.
    #[test]
    fn long_strings_escape_as_serde_json_does(
        len in 0usize..6000,
        marks in proptest::collection::vec(
            (any::<proptest::sample::Index>(), prop_oneof![
                Just('"'), Just('\\'), Just('\n'), Just('\u{1}'), Just('\u{1f}'), Just('é'), Just('€'),
            ]),
            0..4,
        ),
    ) {
        let mut chars: Vec<char> = (0..len).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        for (at, mark) in marks {
            if !chars.is_empty() {
                let at = at.index(chars.len());
                chars[at] = mark;
            }
        }
        let text: String = chars.into_iter().collect();
        let mut out = String::new();
        write_str(&mut out, &text);
        prop_assert_eq!(&out, &serde_json::to_string(&text).unwrap());
        // And inside a value, as a snapshot writes it.
        let value = serde_json::json!({"text": text, "n": 1});
        let written = to_text(&value).unwrap();
        prop_assert_eq!(written.as_bytes(), serde_json::to_vec(&value).unwrap());
    }

    /// Escaped text is what serde_json writes.
    #[test]
    fn strings_escape_as_serde_json_does(text in "(\\PC|[\\x00-\\x1f\"\\\\])*") {
        let mut out = String::new();
        write_str(&mut out, &text);
        prop_assert_eq!(out, serde_json::to_string(&text).unwrap());
    }

    /// Compact text is serde_json's, byte for byte, for any value
    /// tree: escapes, non-ASCII, floats, integers at their edges.
    #[test]
    fn compact_text_is_serde_jsons(value in value()) {
        prop_assert_eq!(
            to_compact(&value).unwrap().to_vec(),
            serde_json::to_vec(&value).unwrap()
        );
    }
}

/// Every shape serde gives a serializer, each in the compact text
/// serde_json writes: the ones this serializer writes itself and the
/// ones it leaves to serde_json (keys that are not text, 128-bit
/// integers beyond 64 bits).
#[test]
fn every_shape_is_written_as_serde_json_writes_it() {
    use std::collections::BTreeMap;

    use serde::Serialize;

    use crate::Payload;

    #[derive(Serialize)]
    struct Unit;
    #[derive(Serialize)]
    struct Newtype(u8);
    #[derive(Serialize)]
    struct Pair(i8, &'static str);
    #[derive(Serialize)]
    struct Empty {}
    #[derive(Serialize)]
    enum Variant {
        Unit,
        Newtype(f32),
        Tuple(u16, bool),
        Struct { z: char, a: Option<u8> },
    }
    #[derive(Serialize)]
    #[serde(tag = "kind", rename_all = "snake_case")]
    enum Tagged {
        Plain { zeta: u32, alpha: Payload },
        Wrapped(BTreeMap<String, u8>),
    }
    #[derive(Serialize)]
    struct Flat {
        last: u8,
        #[serde(flatten)]
        rest: BTreeMap<String, i64>,
    }
    /// A map that repeats a key and one whose text is written as it is
    /// formatted.
    struct Repeats;
    impl Serialize for Repeats {
        fn serialize<S: ser::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            use ser::SerializeMap;
            let mut map = serializer.serialize_map(None)?;
            map.serialize_entry("b", &1)?;
            map.serialize_entry("a", &2)?;
            map.serialize_entry("b", &3)?;
            map.serialize_entry(&7u64, &format_args!("{}\"{}\n", 1, "x"))?;
            map.end()
        }
    }
    #[derive(Serialize)]
    struct Everything {
        unit: Unit,
        unit_value: (),
        newtype: Newtype,
        pair: Pair,
        empty: Empty,
        empty_map: BTreeMap<String, u8>,
        empty_list: Vec<u8>,
        variants: Vec<Variant>,
        tagged: Vec<Tagged>,
        flat: Flat,
        repeats: Repeats,
        floats: (f32, f32, f32, f64, f64, f64),
        text: (char, char, String),
        #[serde(with = "serde_bytes_like")]
        bytes: Vec<u8>,
        integer_keys: BTreeMap<i32, bool>,
        absent: Option<u8>,
    }
    mod serde_bytes_like {
        pub fn serialize<S: serde::Serializer>(
            bytes: &[u8],
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            serializer.serialize_bytes(bytes)
        }
    }
    let payload = Payload::encode(&serde_json::json!({"b": [1, "\u{1}"], "a": null})).unwrap();
    let everything = Everything {
        unit: Unit,
        unit_value: (),
        newtype: Newtype(7),
        pair: Pair(-3, "pair"),
        empty: Empty {},
        empty_map: BTreeMap::new(),
        empty_list: Vec::new(),
        variants: vec![
            Variant::Unit,
            Variant::Newtype(0.1),
            Variant::Tuple(9, true),
            Variant::Struct { z: '"', a: None },
        ],
        tagged: vec![
            Tagged::Plain {
                zeta: 1,
                alpha: payload,
            },
            Tagged::Wrapped(BTreeMap::from([("k\u{7f}".to_owned(), 1)])),
        ],
        flat: Flat {
            last: 1,
            rest: BTreeMap::from([("m".to_owned(), -1), ("a".to_owned(), 2)]),
        },
        repeats: Repeats,
        floats: (0.1, f32::MAX, f32::NAN, 1e300, -0.0, f64::INFINITY),
        text: ('\u{0}', '\u{e9}', "tab\tquote\"slash\\".to_owned()),
        bytes: vec![0, 255, 34],
        integer_keys: BTreeMap::from([(-1, true), (2, false)]),
        absent: None,
    };
    // Written by this serializer itself, not by its fallback.
    assert_eq!(
        String::from_utf8(fast(&everything).expect("written here")).unwrap(),
        serde_json::to_string(&everything).unwrap()
    );
    assert_eq!(
        to_compact(&everything).unwrap().to_vec(),
        serde_json::to_vec(&everything).unwrap()
    );
    // 128-bit integers within 64 bits are written here; past them, and keys
    // that are not text, are left to serde_json, and come out as it writes.
    let narrow = (u128::from(u64::MAX), i128::from(i64::MIN), 7u128, -7i128);
    assert_eq!(
        fast(&narrow).expect("written here"),
        serde_json::to_vec(&narrow).unwrap()
    );
    assert_general(&u128::MAX);
    assert_general(&i128::MIN);
    assert_general(&BTreeMap::from([(true, 1), (false, 2)]));
    assert_general(&BTreeMap::from([(u128::MAX, 1)]));
    // And what serde_json refuses is refused.
    assert!(to_compact(&BTreeMap::from([(vec![1u8], 1)])).is_err());
}

/// The bytes of `value` from this serializer alone, keys as given (no
/// fallback to serde_json).
fn fast<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, Error> {
    compact_only(value)
}

/// `value` is one this serializer leaves to serde_json, and the compact
/// text is then serde_json's own.
fn assert_general<T: Serialize + ?Sized>(value: &T) {
    assert!(fast(value).is_err(), "left to serde_json");
    assert_eq!(
        to_compact(value).unwrap().to_vec(),
        serde_json::to_vec(value).unwrap()
    );
}

/// A `Serialize` that misuses the serializer in one of the ways serde_json
/// writes something of its own for.
enum Misuse {
    /// Declares an empty sequence, then sends an element.
    EmptySeq,
    /// Declares an empty map, then sends an entry.
    EmptyMap,
    /// Declares a struct of no fields, then sends one.
    EmptyStruct,
    /// Two keys, then one value.
    TwoKeys,
    /// A key, then the end.
    KeyAlone,
    /// serde_json's arbitrary-precision number, by its struct name.
    Number,
}

impl Serialize for Misuse {
    fn serialize<S: ser::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use ser::{SerializeMap, SerializeSeq, SerializeStruct};
        match self {
            Misuse::EmptySeq => {
                let mut seq = serializer.serialize_seq(Some(0))?;
                seq.serialize_element(&1)?;
                seq.end()
            }
            Misuse::EmptyMap => {
                let mut map = serializer.serialize_map(Some(0))?;
                map.serialize_entry("a", &1)?;
                map.end()
            }
            Misuse::EmptyStruct => {
                let mut object = serializer.serialize_struct("Empty", 0)?;
                object.serialize_field("a", &1)?;
                object.end()
            }
            Misuse::TwoKeys => {
                let mut map = serializer.serialize_map(None)?;
                map.serialize_key("a")?;
                map.serialize_key("b")?;
                map.serialize_value(&1)?;
                map.end()
            }
            Misuse::KeyAlone => {
                let mut map = serializer.serialize_map(None)?;
                map.serialize_key("a")?;
                map.end()
            }
            Misuse::Number => {
                let mut number = serializer.serialize_struct(NUMBER_TOKEN, 1)?;
                number.serialize_field(NUMBER_TOKEN, "12345678901234567890123")?;
                number.end()
            }
        }
    }
}

/// Whatever serde_json makes of a misused serializer, compact text is
/// the same: this serializer refuses each misuse and leaves it to serde_json.
#[test]
fn misused_serializers_are_left_to_serde_json() {
    for misuse in [
        Misuse::EmptySeq,
        Misuse::EmptyMap,
        Misuse::EmptyStruct,
        Misuse::TwoKeys,
        Misuse::KeyAlone,
        Misuse::Number,
    ] {
        assert_general(&misuse);
    }
    // Sorted keys stand for a `Value`, which takes a misstated length.
    assert_eq!(to_text(&Misuse::EmptySeq).unwrap().as_ref(), "[1]");
}

/// Canonical text puts every object's members in key order, a key given
/// twice once with its last value, whatever order the value gives them,
/// nested or not and first member or not: the text of the same value read
/// into a JSON value and written again.
#[test]
fn canonical_text_orders_members_as_a_json_value_does() {
    use std::collections::BTreeMap;

    use ser::SerializeMap;
    use serde::Serialize;

    #[derive(Serialize)]
    struct Inner {
        z: u8,
        a: &'static str,
        m: Vec<u8>,
    }
    /// Members out of order, one of them twice.
    struct Shuffled;
    impl Serialize for Shuffled {
        fn serialize<S: ser::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let mut map = serializer.serialize_map(None)?;
            map.serialize_entry("kb", &1)?;
            map.serialize_entry("k\"a", &2)?;
            map.serialize_entry("kb", &3)?;
            map.serialize_entry("", &4)?;
            map.end()
        }
    }
    #[derive(Serialize)]
    struct Outer {
        zeta: Inner,
        alpha: Option<Inner>,
        beta: BTreeMap<String, Inner>,
        shuffled: Shuffled,
        in_order: (u8, Shuffled),
    }
    let inner = || Inner {
        z: 1,
        a: "x,\"y",
        m: vec![3, 2],
    };
    let outer = Outer {
        zeta: inner(),
        alpha: Some(inner()),
        beta: BTreeMap::from([("q".to_owned(), inner()), ("b".to_owned(), inner())]),
        shuffled: Shuffled,
        in_order: (0, Shuffled),
    };
    let text = to_text(&outer).expect("written here, not by the general way");
    let value = serde_json::to_value(&outer).unwrap();
    assert_eq!(&*text, crate::Payload::from_value(&value).unwrap().as_str());
    assert!(text.starts_with(r#"{"alpha":{"a":"x,\"y","m":[3,2],"z":1},"beta":{"b":"#));
    assert!(text.contains(r#""shuffled":{"":4,"k\"a":2,"kb":3}"#));
}
