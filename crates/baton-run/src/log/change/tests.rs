use proptest::prelude::*;
use serde_json::json;

use super::*;

fn state(value: serde_json::Value) -> ExecutionState {
    ExecutionState(Payload::from_value(&value).expect("a payload"))
}

/// `change` as a log read it back: without the whole state it was made
/// with, so applying it builds the state from the text.
fn read_back(change: &StateChange) -> StateChange {
    let text = serde_json::to_string(change).expect("encodes");
    serde_json::from_str(&text).expect("decodes")
}

fn long(fill: &str) -> String {
    fill.repeat(StateChange::FROM_BYTES / fill.len() + 8)
}

#[test]
fn a_small_change_to_a_large_state_is_recorded_as_the_bytes_that_changed() {
    let text = long("abcdefgh");
    let before = state(json!({"count": 1, "text": text}));
    let after = state(json!({"count": 2, "text": text}));
    let change = StateChange::between(&before, &after).expect("a change");
    assert_eq!(change.text, "2");
    assert_eq!(change.front, r#"{"count":"#.len() as u64);
    assert_eq!(
        change.front + 1 + change.back,
        after.0.len() as u64,
        "all but the changed digit is kept"
    );
    assert_eq!(change.apply(&before), Ok(after.clone()));
    assert_eq!(read_back(&change).apply(&before), Ok(after));
}

#[test]
fn small_states_and_large_changes_are_recorded_whole() {
    let before = state(json!({"count": 1, "text": "short"}));
    let after = state(json!({"count": 2, "text": "short"}));
    assert_eq!(StateChange::between(&before, &after), None);
    let before = state(json!({"text": long("a")}));
    let after = state(json!({"text": long("b")}));
    assert_eq!(StateChange::between(&before, &after), None);
}

#[test]
fn a_change_that_does_not_fit_the_state_before_is_an_error_not_a_panic() {
    let text = long("abcdefgh");
    let before = state(json!({"count": 1, "text": text}));
    let after = state(json!({"count": 2, "text": text}));
    let change = read_back(&StateChange::between(&before, &after).expect("a change"));
    let short = state(json!({"count": 1}));
    let error = change.apply(&short).expect_err("too short");
    assert!(error.contains("keeps"), "{error}");
    let wide = StateChange {
        front: u64::MAX,
        back: u64::MAX,
        ..change.clone()
    };
    assert!(wide.apply(&before).is_err());
    // Keeping bytes that split a character.
    let accented = state(json!({"text": long("é")}));
    let split = StateChange {
        front: 10,
        back: 0,
        text: String::new(),
        whole: None,
    };
    let error = split.apply(&accented).expect_err("inside a character");
    assert!(error.contains("keeps"), "{error}");
    // Text that makes no JSON.
    let broken = StateChange {
        text: "\"".into(),
        ..change
    };
    let error = broken.apply(&before).expect_err("no JSON");
    assert!(error.contains("makes no state"), "{error}");
}

fn text_strategy() -> impl Strategy<Value = String> {
    // Few distinct characters, of one to four bytes, so that two texts
    // share long runs and differ inside characters.
    proptest::collection::vec(
        prop::sample::select(vec!['a', 'b', 'é', '€', '𝄞', '"']),
        0..200,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

proptest! {
    /// Whatever two states are, the change between them (when there is
    /// one) makes the second of the first, read back from its text or not,
    /// and keeps only what the two share.
    #[test]
    fn a_change_makes_the_new_state_of_the_old(
        shared in text_strategy(),
        old_part in text_strategy(),
        new_part in text_strategy(),
        tail in text_strategy(),
        repeat in 1usize..40,
    ) {
        let pad = shared.repeat(repeat) + &long("x");
        let before = state(json!({"a": pad, "b": old_part, "c": tail}));
        let after = state(json!({"a": pad, "b": new_part, "c": tail}));
        let (old, new) = kept(before.0.as_str(), after.0.as_str());
        prop_assert!(old + new <= before.0.len().min(after.0.len()));
        prop_assert_eq!(&before.0.as_str()[..old], &after.0.as_str()[..old]);
        prop_assert_eq!(
            &before.0.as_str()[before.0.len() - new..],
            &after.0.as_str()[after.0.len() - new..]
        );
        if let Some(change) = StateChange::between(&before, &after) {
            prop_assert_eq!(change.apply(&before), Ok(after.clone()));
            prop_assert_eq!(read_back(&change).apply(&before), Ok(after.clone()));
        }
    }
}
