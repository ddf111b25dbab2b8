//! A workflow process's state as text, written and read without serde's
//! machinery for the shapes a running workflow records.
//!
//! A state is snapshotted after every step and restored before it is
//! adopted (and again when a process wakes), so a short workflow spends more
//! on its state's text than on its stages: serde's canonical writer notes and
//! orders every member, and its reader drives a visitor per field. The text
//! here is the same canonical JSON (`Payload::encode` of the state, members in
//! key order), written directly, and read back by matching that exact text.
//! Anything else, a failed slot among them, is left to serde both ways: a
//! state this module does not write is written by serde, and text it does not
//! read is read by serde, whose verdict (and error) then stands. Reading
//! never accepts text serde would refuse: it takes only the one canonical
//! form, and each embedded value is read and certified as a `Payload` (by
//! serde_json, whose raw text a payload takes, or `Payload::parse_str`).

use std::fmt::Write as _;
use std::str::FromStr;

use baton_run::{ChildKey, Payload, ProcessId};

use super::{Batch, Slot, SlotStatus, State};

/// The state's canonical text, exactly as `Payload::encode(state)` writes
/// it, or `None` for a state left to serde (a failed slot, a key that would
/// need escaping).
pub(super) fn encode(state: &State) -> Option<String> {
    // Room for the text to come, within twice its length, so the payload
    // can keep this buffer as it is.
    let batch = state.batch.as_ref().map_or(0, |batch| {
        let parts = batch.done.iter().map(Payload::len);
        let outputs = batch.slots.iter().map(|slot| match &slot.status {
            SlotStatus::Completed { output } => output.len(),
            _ => 0,
        });
        32 + 80 * batch.slots.len() + parts.chain(outputs).sum::<usize>()
    });
    let mut out = String::with_capacity(24 + state.value.len() + batch);
    out.push('{');
    if let Some(batch) = &state.batch {
        encode_batch(batch, &mut out)?;
        out.push(',');
    }
    out.push_str(r#""stage":"#);
    push_uint(&mut out, state.stage as u64);
    out.push_str(r#","value":"#);
    out.push_str(state.value.as_str());
    out.push('}');
    Some(out)
}

fn encode_batch(batch: &Batch, out: &mut String) -> Option<()> {
    out.push_str(r#""batch":{"#);
    if !batch.done.is_empty() {
        out.push_str(r#""done":["#);
        for (at, done) in batch.done.iter().enumerate() {
            if at > 0 {
                out.push(',');
            }
            out.push_str(done.as_str());
        }
        out.push_str("],");
    }
    if batch.iteration > 0 {
        out.push_str(r#""iteration":"#);
        push_uint(out, u64::from(batch.iteration));
        out.push(',');
    }
    out.push_str(r#""slots":["#);
    for (at, slot) in batch.slots.iter().enumerate() {
        if at > 0 {
            out.push(',');
        }
        encode_slot(slot, out)?;
    }
    out.push_str("]}");
    Some(())
}

fn encode_slot(slot: &Slot, out: &mut String) -> Option<()> {
    let key = slot.key.as_str();
    // Keys are ids without quotes, backslashes or control characters; one
    // that had any would need escaping, which serde does.
    if key
        .bytes()
        .any(|byte| byte < 0x20 || byte == b'"' || byte == b'\\')
    {
        return None;
    }
    out.push_str(r#"{"index":"#);
    push_uint(out, u64::from(slot.index));
    out.push_str(r#","key":""#);
    out.push_str(key);
    out.push_str(r#"","status":"#);
    match &slot.status {
        SlotStatus::Starting => out.push_str(r#"{"status":"starting"}"#),
        SlotStatus::Running { process } => {
            write!(out, r#"{{"process":"{process}","status":"running"}}"#)
                .expect("writing to a string does not fail");
        }
        SlotStatus::Completed { output } => {
            out.push_str(r#"{"output":"#);
            out.push_str(output.as_str());
            out.push_str(r#","status":"completed"}"#);
        }
        SlotStatus::Failed { .. } => return None,
    }
    out.push('}');
    Some(())
}

/// Appends `value` in decimal, as serde_json writes it.
fn push_uint(out: &mut String, value: u64) {
    out.push_str(itoa::Buffer::new().format(value));
}

/// The state `text` holds when it is one [`encode`] writes, or `None` to
/// leave it to serde.
pub(super) fn decode(text: &str) -> Option<State> {
    let mut reader = Reader { text, at: 0 };
    reader.eat("{")?;
    let batch = if reader.eat(r#""batch":{"#).is_some() {
        let batch = reader.batch()?;
        reader.eat(",")?;
        Some(batch)
    } else {
        None
    };
    reader.eat(r#""stage":"#)?;
    let stage = usize::try_from(reader.uint()?).ok()?;
    reader.eat(r#","value":"#)?;
    // The value is the last member: the rest but the closing brace. Text
    // that holds more than one value there is no payload, and serde decides.
    let rest = text.get(reader.at..)?.strip_suffix('}')?;
    let value = Payload::parse_str(rest).ok()?;
    Some(State {
        batch,
        stage,
        value,
    })
}

/// Reads canonical text by matching it.
struct Reader<'a> {
    text: &'a str,
    at: usize,
}

impl Reader<'_> {
    /// Steps over `expected` if the text goes on with it.
    fn eat(&mut self, expected: &str) -> Option<()> {
        let rest = self.text.get(self.at..)?;
        rest.starts_with(expected)
            .then(|| self.at += expected.len())
    }

    /// A canonical unsigned integer: `0`, or digits without a leading zero.
    fn uint(&mut self) -> Option<u64> {
        let rest = self.text.get(self.at..)?;
        let len = rest.bytes().take_while(u8::is_ascii_digit).count();
        if len > 1 && rest.starts_with('0') {
            return None;
        }
        // Digits only (no sign), so `parse` refuses just the empty and the
        // too large.
        let value = rest[..len].parse().ok()?;
        self.at += len;
        Some(value)
    }

    /// The text up to the next `"`, which must hold no escape.
    fn plain_string(&mut self) -> Option<&str> {
        let rest = self.text.get(self.at..)?;
        let len = rest.find('"')?;
        let text = &rest[..len];
        if text.bytes().any(|byte| byte == b'\\' || byte < 0x20) {
            return None;
        }
        self.at += len;
        Some(text)
    }

    /// The JSON value the text goes on with, as a payload: read by
    /// serde_json, whose raw text a payload takes (and certifies).
    fn value(&mut self) -> Option<Payload> {
        let rest = self.text.get(self.at..)?;
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Payload>();
        let value = values.next()?.ok()?;
        self.at += values.byte_offset();
        Some(value)
    }

    /// A batch's members after its opening brace, and its closing brace.
    fn batch(&mut self) -> Option<Batch> {
        let mut done = Vec::new();
        if self.eat(r#""done":["#).is_some() {
            loop {
                done.push(self.value()?);
                if self.eat(",").is_none() {
                    break;
                }
            }
            self.eat("],")?;
        }
        let iteration = if self.eat(r#""iteration":"#).is_some() {
            let iteration = u32::try_from(self.uint()?).ok()?;
            self.eat(",")?;
            iteration
        } else {
            0
        };
        self.eat(r#""slots":["#)?;
        let mut slots = Vec::new();
        loop {
            slots.push(self.slot()?);
            if self.eat(",").is_none() {
                break;
            }
        }
        self.eat("]}")?;
        Some(Batch {
            done,
            iteration,
            slots,
        })
    }

    fn slot(&mut self) -> Option<Slot> {
        self.eat(r#"{"index":"#)?;
        let index = u32::try_from(self.uint()?).ok()?;
        self.eat(r#","key":""#)?;
        let key = ChildKey::new(self.plain_string()?).ok()?;
        self.eat(r#"","status":"#)?;
        let status = if self.eat(r#"{"status":"starting"}"#).is_some() {
            SlotStatus::Starting
        } else if self.eat(r#"{"process":""#).is_some() {
            let process = ProcessId::from_str(self.plain_string()?).ok()?;
            self.eat(r#"","status":"running"}"#)?;
            SlotStatus::Running { process }
        } else {
            self.eat(r#"{"output":"#)?;
            let output = self.value()?;
            self.eat(r#","status":"completed"}"#)?;
            SlotStatus::Completed { output }
        };
        self.eat("}")?;
        Some(Slot { index, key, status })
    }
}

#[cfg(test)]
mod tests {
    use baton_run::Failure;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;

    fn payloads() -> impl Strategy<Value = Payload> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            "[a-z\"\\\\{}\\[\\],:\u{1}é ]{0,12}".prop_map(Value::from),
        ];
        let value = leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map("[a-z\"{},]{0,5}", inner, 0..4)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        });
        value.prop_map(|value| Payload::from_value(&value).expect("a payload"))
    }

    fn statuses() -> impl Strategy<Value = SlotStatus> {
        prop_oneof![
            Just(SlotStatus::Starting),
            "[a-z]{1,8}".prop_map(|key| SlotStatus::Running {
                process: ProcessId::child(
                    ProcessId::root(&baton_run::StartId::new("s", "k").expect("valid")),
                    &ChildKey::new(key).expect("valid"),
                ),
            }),
            payloads().prop_map(|output| SlotStatus::Completed { output }),
            "[a-z ]{0,12}".prop_map(|message| SlotStatus::Failed {
                failure: Failure::execution("workflow.fork.branch_failed", message),
            }),
        ]
    }

    fn states() -> impl Strategy<Value = State> {
        let slot =
            (any::<u32>(), "[A-Za-z0-9._:-]{1,12}", statuses()).prop_map(|(index, key, status)| {
                Slot {
                    index,
                    key: ChildKey::new(key).expect("valid"),
                    status,
                }
            });
        let batch = (
            proptest::collection::vec(payloads(), 0..3),
            prop_oneof![Just(0u32), any::<u32>()],
            // A recorded batch has a slot at least (`State::check`).
            proptest::collection::vec(slot, 1..4),
        )
            .prop_map(|(done, iteration, slots)| Batch {
                done,
                iteration,
                slots,
            });
        (
            proptest::option::of(batch),
            prop_oneof![0usize..20, Just(usize::MAX)],
            payloads(),
        )
            .prop_map(|(batch, stage, value)| State {
                batch,
                stage,
                value,
            })
    }

    fn failed(state: &State) -> bool {
        state.batch.as_ref().is_some_and(|batch| {
            batch
                .slots
                .iter()
                .any(|slot| matches!(slot.status, SlotStatus::Failed { .. }))
        })
    }

    fn serde_decode(text: &str) -> Option<State> {
        serde_json::from_str(text).ok()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Written directly, a state is the text serde writes, and it reads
        /// back as itself; only a failed slot is left to serde.
        #[test]
        fn a_state_is_written_and_read_as_serde_does(state in states()) {
            let canonical = Payload::encode(&state).expect("encodes");
            let written = encode(&state);
            prop_assert_eq!(written.is_none(), failed(&state));
            if let Some(written) = &written {
                prop_assert_eq!(written.as_str(), canonical.as_str());
            }
            let read = decode(canonical.as_str());
            prop_assert_eq!(read.is_none(), failed(&state));
            if let Some(read) = read {
                prop_assert_eq!(&read, &state);
            }
            let snapshot = state.snapshot().expect("snapshots");
            prop_assert_eq!(snapshot.0.as_str(), canonical.as_str());
            prop_assert_eq!(State::restore(&snapshot).expect("restores"), state);
        }

        /// Damaged text is never read as anything serde would not read it
        /// as: a byte changed, cut or added anywhere.
        #[test]
        fn damaged_text_reads_as_serde_reads_it_or_not_at_all(
            state in states(),
            at in any::<proptest::sample::Index>(),
            byte in prop_oneof![
                Just(b'"'), Just(b','), Just(b'}'), Just(b']'), Just(b'0'), Just(b'9'),
                Just(b'a'), Just(b'\\'), Just(b' '),
            ],
            change in 0..3u8,
        ) {
            let mut text = Payload::encode(&state).expect("encodes").as_str().as_bytes().to_vec();
            let at = at.index(text.len());
            match change {
                0 => text[at] = byte,
                1 => { text.remove(at); }
                _ => text.insert(at, byte),
            }
            let Ok(text) = String::from_utf8(text) else {
                return Ok(());
            };
            if let Some(read) = decode(&text) {
                prop_assert_eq!(Some(read), serde_decode(&text), "{}", text);
            }
        }
    }

    /// Recorded states the fuzz test edits: two read directly, one (a
    /// failed slot) by serde.
    fn state_seeds() -> Vec<String> {
        vec![
            r#"{"stage":0,"value":21}"#.to_owned(),
            r#"{"batch":{"done":[1,{"a":"x,}"}],"iteration":2,"slots":[{"index":0,"key":"fan.0","status":{"status":"starting"}},{"index":1,"key":"fan.1","status":{"process":"p_0123456789abcdef0123456789abcdef","status":"running"}},{"index":2,"key":"fan.2","status":{"output":[null,"\"]"],"status":"completed"}}]},"stage":1,"value":{"n":-1.5}}"#.to_owned(),
            r#"{"batch":{"slots":[{"index":0,"key":"k","status":{"failure":{"code":"workflow.call.child_failed","kind":"execution","message":"m"},"status":"failed"}}]},"stage":0,"value":null}"#.to_owned(),
        ]
    }

    #[test]
    fn the_fuzz_seeds_are_states() {
        let seeds = state_seeds();
        for seed in &seeds[..2] {
            assert!(decode(seed).is_some(), "{seed}");
        }
        assert_eq!(decode(&seeds[2]), None);
        for seed in &seeds {
            assert!(serde_decode(seed).is_some(), "{seed}");
        }
    }

    proptest! {
        #![proptest_config(baton_testkit::fuzz::config())]

        /// A recorded workflow state as a store returns it after a crash
        /// (`cargo xtask fuzz`): what is read directly is what serde reads,
        /// and whatever restores or not, none panics; a refusal is a
        /// contract failure.
        #[test]
        fn fuzz_workflow_states(text in baton_testkit::fuzz::text(state_seeds())) {
            if let Some(read) = decode(&text) {
                prop_assert_eq!(Some(read), serde_decode(&text), "{}", text);
            }
            if let Ok(payload) = Payload::parse_str(&text) {
                let restored = State::restore(&baton_run::program::ExecutionState(payload));
                if let Err(error) = restored {
                    prop_assert_eq!(error.failure().kind, baton_run::FailureKind::Contract);
                }
            }
        }
    }

    /// What serde refuses is never read: unknown members, a member twice,
    /// numbers that do not fit, keys and ids that are not valid; text of
    /// other shapes serde reads is read as serde reads it, or left to it.
    #[test]
    fn text_of_other_shapes_is_left_to_serde() {
        let slot = |status: &str| {
            format!(
                r#"{{"batch":{{"slots":[{{"index":0,"key":"a","status":{status}}}]}},"stage":0,"value":1}}"#
            )
        };
        let refused = [
            r#"{"stage":0,"value":1,"zeta":2}"#.to_owned(),
            r#"{"stage":0,"stage":1,"value":1}"#.to_owned(),
            r#"{"stage":01,"value":1}"#.to_owned(),
            r#"{"stage":18446744073709551616,"value":1}"#.to_owned(),
            r#"{"stage":-1,"value":1}"#.to_owned(),
            r#"{"stage":0,"value":}"#.to_owned(),
            r#"{"batch":{"slots":[{"index":4294967296,"key":"a","status":{"status":"starting"}}]},"stage":0,"value":1}"#.to_owned(),
            r#"{"batch":{"slots":[{"index":0,"key":"a b","status":{"status":"starting"}}]},"stage":0,"value":1}"#.to_owned(),
            slot(r#"{"process":"p_00","status":"running"}"#),
            slot(r#"{"status":"starting","x":1}"#),
            slot(r#"{"output":1,"process":"p_00000000000000000000000000000000","status":"completed"}"#),
        ];
        for text in &refused {
            assert!(serde_decode(text).is_none(), "serde reads {text}");
            assert_eq!(decode(text), None, "{text}");
        }
        let other = [
            r#"{"stage":0,"value":1 }"#.to_owned(),
            r#"{"batch":{"slots":[]},"stage":0,"value":1}"#.to_owned(),
            r#"{"batch":{"done":[],"slots":[{"index":0,"key":"a","status":{"status":"starting"}}]},"stage":0,"value":1}"#.to_owned(),
            r#"{"batch":{"iteration":0,"slots":[{"index":0,"key":"a","status":{"status":"starting"}}]},"stage":0,"value":1}"#.to_owned(),
            slot(r#"{"output":null,"status":"completed"}"#),
        ];
        for text in &other {
            let read = serde_decode(text);
            assert!(read.is_some(), "serde refuses {text}");
            if let Some(decoded) = decode(text) {
                assert_eq!(Some(decoded), read, "{text}");
            }
        }
        let state = State {
            batch: None,
            stage: 3,
            value: Payload::from_value(&json!({"a": [1, "x,}"]})).expect("a payload"),
        };
        assert_eq!(
            decode(r#"{"stage":3,"value":{"a":[1,"x,}"]}}"#),
            Some(state)
        );
    }
}
