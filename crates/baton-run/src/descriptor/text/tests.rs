use jsonschema::json::conformance;
use proptest::prelude::*;

use super::*;

fn with_root<T>(text: &str, f: impl FnOnce(TextNode<'_>) -> T) -> T {
    let mut tape = Vec::new();
    build(text, &mut tape, &[]).expect("well-formed text");
    let doc = Doc { text, tape };
    f(doc.root())
}

#[test]
fn the_tape_keeps_the_validators_contract() {
    let text = serde_json::to_string(&conformance::document()).expect("encodes");
    with_root(&text, |root| {
        conformance::assert_conformance::<CanonicalText>(&root);
    });
}

#[test]
fn escaped_names_and_strings_are_decoded() {
    let text = r#"{"\"a\n":"x\\y\u0001","b":"🦀é","c":[1.0,-0.0,18446744073709551616]}"#;
    with_root(text, |root| {
        let object = root.as_object().expect("object");
        let names: Vec<String> = object
            .members()
            .map(|(name, _)| name.into_owned())
            .collect();
        assert_eq!(names, ["\"a\n", "b", "c"]);
        let escaped = object
            .get(&"\"a\n".to_owned())
            .expect("found by its decoded name");
        assert_eq!(escaped.as_string().as_deref(), Some("x\\y\u{1}"));
        assert_eq!(escaped.string_length(), Some(4));
        assert_eq!(escaped.string_length_within(4, 4), Some(true));
        assert_eq!(escaped.string_length_within(5, 9), Some(false));
        let plain = object.get(&"b".to_owned()).expect("found");
        assert_eq!(plain.string_length(), Some(2));
        assert_eq!(plain.string_length_within(2, 2), Some(true));
        assert!(
            object.get(&"\\\"a\\n".to_owned()).is_none(),
            "raw text is no name"
        );
        let value = serde_json::from_str::<Value>(text).expect("json");
        assert!(root.equals_value(&value));
        assert_eq!(root.to_value().as_ref(), &value);
    });
}

#[test]
fn string_nodes_hold_names_verbatim() {
    let mut buffer = StringDoc::default();
    for name in ["plain", "\"quoted\"", "back\\slash", "\n"] {
        CanonicalText::with_string_node(&mut buffer, name, |node| {
            assert_eq!(node.as_string().as_deref(), Some(name));
            assert!(node.equals_value(&Value::String(name.to_owned())));
            assert_eq!(node.to_value().as_ref(), &Value::String(name.to_owned()));
        });
    }
}

/// The accepted array `text` as a hint for the member `name`.
fn hint<'h>(name: &'h str, text: &str) -> Hint<'h> {
    let elements: Vec<Value> = serde_json::from_str(text).expect("an array");
    let mut end = 0;
    let ends = elements
        .iter()
        .map(|element| {
            end += 1 + element.to_string().len();
            end
        })
        .collect();
    Hint {
        name,
        accepted: Arc::new(AcceptedArray {
            text: text.into(),
            ends,
        }),
    }
}

/// The texts of the accepted entries of the tape of `text`, or none
/// when it has no tape.
fn accepted_in(text: &str, hints: &[Hint<'_>]) -> Option<Vec<String>> {
    let mut tape = Vec::new();
    build(text, &mut tape, hints)?;
    let doc = Doc { text, tape };
    Some(
        (0..doc.tape.len() as u32)
            .map(|at| TextNode { doc: &doc, at })
            .filter(TextNode::is_accepted)
            .map(|node| node.text().to_owned())
            .collect(),
    )
}

/// A top-level array's head shared with the hint's accepted array gets
/// one entry per element; what follows is read as always, and the
/// nodes read the same values as a tape without hints.
#[test]
fn hinted_arrays_hold_their_accepted_head_unread() {
    let hints = [hint("l", r#"[{"a":1},[2,{"b":"c"}],"d",1,2]"#)];
    for (text, accepted) in [
        (
            r#"{"l":[{"a":1},[2,{"b":"c"}],"d",1,2],"m":[{"a":1}]}"#,
            &[r#"{"a":1}"#, r#"[2,{"b":"c"}]"#, r#""d""#, "1", "2"][..],
        ),
        // The last accepted element, a number, is read again: the
        // byte after it differs.
        (
            r#"{"l":[{"a":1},[2,{"b":"c"}],"d",1,2,3]}"#,
            &[r#"{"a":1}"#, r#"[2,{"b":"c"}]"#, r#""d""#, "1"],
        ),
        // A number is a whole element only with the byte after it.
        (
            r#"{"l":[{"a":1},[2,{"b":"c"}],"d",1,23]}"#,
            &[r#"{"a":1}"#, r#"[2,{"b":"c"}]"#, r#""d""#, "1"],
        ),
        (
            r#"{"l":[{"a":1},[2,{"b":"c"}],"d",12]}"#,
            &[r#"{"a":1}"#, r#"[2,{"b":"c"}]"#, r#""d""#],
        ),
        (r#"{"l":[{"a":1},[2,{"b":"cd"}]]}"#, &[r#"{"a":1}"#]),
        (r#"{"l":[{"a":2}]}"#, &[]),
        (r#"{"l":[]}"#, &[]),
        (r#"{"l":{"a":1}}"#, &[]),
        // Only members of the root object, by their name.
        (r#"{"m":[{"a":1},1]}"#, &[]),
        (r#"{"x":{"l":[{"a":1},1]}}"#, &[]),
        (r#"[{"l":[{"a":1},1]}]"#, &[]),
        (r#"{"\u006c":[{"a":1},1]}"#, &[]),
    ] {
        let found = accepted_in(text, &hints).expect("a tape");
        assert_eq!(found, accepted, "{text}");
        // Every other node reads as without the hint.
        let value: Value = serde_json::from_str(text).expect("JSON");
        let mut tape = Vec::new();
        build(text, &mut tape, &hints).expect("a tape");
        let doc = Doc { text, tape };
        assert!(doc.root().equals(&value), "{text}");
        assert_eq!(*doc.root().to_value(), value, "{text}");
    }
    // An element that closes itself is whole without the byte after it.
    for (accepted, text, count) in [
        (
            r#"[{"a":1},{"b":2}]"#,
            r#"{"l":[{"a":1},{"b":2},{"c":3}]}"#,
            2,
        ),
        (r#"[{"a":1},[2]]"#, r#"{"l":[{"a":1},[2],3]}"#, 2),
        (r#"[{"a":1},"b"]"#, r#"{"l":[{"a":1},"b","c"]}"#, 2),
        (r#"[{"a":1},"b"]"#, r#"{"l":[{"a":1},"bc"]}"#, 1),
        (r#"[{"a":1},true]"#, r#"{"l":[{"a":1},true,1]}"#, 1),
        (r#"[{"a":1},{"b":2}]"#, r#"{"l":[{"a":1},{"b":2}]}"#, 2),
    ] {
        let found = accepted_in(text, &[hint("l", accepted)]).expect("a tape");
        assert_eq!(found.len(), count, "{text}");
    }
    // Text that goes on badly after the shared head has no tape.
    for text in [
        r#"{"l":[{"a":1},[2,{"b":"c"}],"d",1,2"#,
        r#"{"l":[{"a":1},[2,{"b":"c"}],"d",1,2}"#,
        r#"{"l":[{"a":1},[2,{"b":"c"}],"d",1,2,]}"#,
        r#"{"l":[{"a":1},[2,{"b":"c"}],"d",1,2]"#,
    ] {
        assert_eq!(accepted_in(text, &hints), None, "{text}");
    }
}

#[test]
fn text_that_is_not_one_value_has_no_tape() {
    for text in [
        "",
        "{",
        "[1,]",
        "{\"a\"}",
        "{\"a\":1,}",
        "[1]x",
        "nul",
        "-",
        "1.",
        "\"a",
        "{1:2}",
        "[1 ]",
        "[\"\\q\"]",
        "{\"\\q\":1}",
    ] {
        assert!(build(text, &mut Vec::new(), &[]).is_none(), "{text:?}");
    }
}

proptest! {
    /// An integer literal reads as the same number, taken by the
    /// standard parser or left to serde_json's.
    #[test]
    fn plain_numbers_are_the_numbers_serde_json_reads(
        literal in prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| format!("-{n}")),
            "-?[0-9]{0,21}",
        ],
    ) {
        let read = literal.parse::<Number>().ok();
        match plain_number(&literal) {
            Some(number) => prop_assert_eq!(Some(number), read),
            None => prop_assert!(
                !plain_integer(literal.as_bytes())
                    || literal == "-0"
                    || literal.parse::<i64>().is_err(),
                "{} is plain but left to serde_json", literal
            ),
        }
    }
}

#[test]
fn minus_zero_and_the_edges_of_i64_and_u64_read_as_serde_json_reads_them() {
    for literal in [
        "0",
        "-0",
        "9223372036854775807",
        "-9223372036854775808",
        "-9223372036854775809",
        "1234567890123456789",
        "-1234567890123456789",
        "9999999999999999999",
        "-9999999999999999999",
    ] {
        let text = format!("[{literal}]");
        let mut tape = Vec::new();
        build(&text, &mut tape, &[]).expect("a number");
        let doc = Doc { text: &text, tape };
        let read = doc.number(doc.entry(1));
        let expected: Number = literal.parse().expect("a number");
        assert_eq!(read, expected, "{literal}");
        assert_eq!(
            Value::Number(read).to_string(),
            Value::Number(expected).to_string(),
            "{literal}"
        );
    }
}

#[test]
fn plain_integers_are_the_numbers_read_without_parsing() {
    for literal in [
        "0",
        "-0",
        "7",
        "-12",
        "1234567890123456789",
        "-9223372036854775808",
    ] {
        assert!(plain_integer(literal.as_bytes()), "{literal}");
        assert!(literal.parse::<Number>().is_ok(), "{literal}");
    }
    for literal in [
        "",
        "-",
        "01",
        "-01",
        "1.0",
        "1e2",
        "+1",
        "18446744073709551615",
        "99999999999999999999",
        "1-",
    ] {
        assert!(!plain_integer(literal.as_bytes()), "{literal}");
    }
    // Longer literals are read, and one that no number holds leaves no
    // tape.
    let huge = format!("[{}]", "9".repeat(400));
    assert!(build(&huge, &mut Vec::new(), &[]).is_none());
    assert!(build("[18446744073709551616,-0,0]", &mut Vec::new(), &[]).is_some());
}

proptest! {
    #[test]
    fn any_text_builds_a_tape_or_none_without_panicking(text in "[\\[\\]{}\",:0-9a-z\\\\.eE+-]{0,24}") {
        let mut tape = Vec::new();
        let built = build(&text, &mut tape, &[]).is_some();
        // Whatever the scanner accepts, serde_json reads as one value,
        // and the tape's root spans all of it.
        if built {
            let value: Value = serde_json::from_str(&text).expect("accepted text is JSON");
            let doc = Doc { text: &text, tape };
            prop_assert_eq!(doc.root().to_value().into_owned(), value);
        }
    }
}
