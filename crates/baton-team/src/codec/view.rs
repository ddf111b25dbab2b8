//! A borrowed view of one recorded task, for restore.
//!
//! Restore checks every task of the recorded state, but most tasks are
//! settled (refused, or drained with their outcome recorded): no step
//! changes them again, and the team only copies their text into snapshots
//! and turns. Decoding each of them into a full [`Task`] would build its
//! payloads, strings and outcome on every restore, only to drop them. The
//! view reads the same JSON with borrowed strings and skipped payloads and
//! accepts exactly what decoding a [`Task`] accepts.
//!
//! A payload position is skipped as any JSON value: the recorded state is a
//! [`Payload`](baton_run::Payload), so each of its values is already a
//! valid canonical payload. The identifier rules of `ChildKey` and `Name`
//! are restated here to be checked on borrowed text; the unit tests hold
//! them, and the whole view, to the decoding of the real types.

use baton_run::{Cause, ChildKey, EffectId, FailureKind, Name, ProcessId, Status, Termination};
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, Visitor};

use super::CodecError;
use super::forms::check_task;

#[cfg(doc)]
use crate::Task;

/// One task's JSON, borrowed from the recorded state.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskView<'a> {
    #[serde(borrow)]
    pub request: RequestView<'a>,
    #[serde(default, deserialize_with = "baton_run::program::deserialize_present")]
    pub process: Option<ProcessId>,
    #[serde(default, deserialize_with = "baton_run::program::deserialize_present")]
    pub outcome: Option<OutcomeView>,
    #[serde(default, deserialize_with = "baton_run::program::deserialize_present")]
    pub rejection: Option<FailureView>,
}

/// A `TaskRequest`: the worker's name is checked by the caller, against
/// the configured workers.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RequestView<'a> {
    pub key: &'a str,
    pub worker: &'a str,
    #[serde(rename = "input")]
    _input: IgnoredAny,
}

/// A `Termination`, as its wire form decodes it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OutcomeView {
    status: Status,
    cause: Cause,
    // An explicit JSON `null` output is a present output.
    #[serde(default, deserialize_with = "baton_run::program::deserialize_present")]
    output: Option<IgnoredAny>,
    // As in the kernel's wire form: a plain option (`null` is absent).
    #[serde(default)]
    failure: Option<FailureView>,
    #[serde(default, rename = "unresolved_effects")]
    _unresolved_effects: Vec<EffectId>,
}

/// A `Failure`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FailureView {
    #[serde(rename = "kind")]
    _kind: FailureKind,
    #[serde(rename = "code")]
    _code: Code,
    #[serde(rename = "message")]
    _message: AnyString,
}

/// A failure code (a `Name`), read from borrowed text without being kept.
struct Code;

impl<'de> Deserialize<'de> for Code {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <&'de str>::deserialize(deserializer)?;
        if Name::check(text).is_ok() {
            Ok(Code)
        } else {
            Err(de::Error::custom(format_args!(
                "invalid failure code {text:?}"
            )))
        }
    }
}

/// Any JSON string, escaped or not, read without being kept.
struct AnyString;

impl<'de> Deserialize<'de> for AnyString {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Strings;
        impl Visitor<'_> for Strings {
            type Value = AnyString;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<AnyString, E> {
                Ok(AnyString)
            }
        }
        deserializer.deserialize_str(Strings)
    }
}

impl<'a> TaskView<'a> {
    /// Reads one task's JSON and checks every rule decoding a [`Task`]
    /// checks, but the worker name's (left to the configuration).
    pub fn read(text: &'a str) -> Result<TaskView<'a>, CodecError> {
        let view: TaskView<'a> = serde_json::from_str(text)?;
        let key = view.request.key;
        ChildKey::check(key).map_err(|_| CodecError::ChildKey { key: key.into() })?;
        check_task(
            key,
            view.process.is_some(),
            view.outcome.is_some(),
            view.rejection.is_some(),
        )?;
        if let Some(outcome) = &view.outcome {
            outcome.check()?;
        }
        Ok(view)
    }

    /// Whether a step may still change the task: it awaits admission or runs.
    pub fn is_live(&self) -> bool {
        match self.process {
            None => self.rejection.is_none(),
            Some(_) => self.outcome.is_none(),
        }
    }
}

impl OutcomeView {
    /// The rules of the kernel's `Termination`.
    fn check(&self) -> Result<(), CodecError> {
        Termination::check_shape(
            self.status,
            self.cause,
            self.output.is_some(),
            self.failure.is_some(),
        )
        .map_err(|reason| CodecError::Outcome { reason })
    }
}

#[cfg(test)]
mod tests {
    use baton_run::Payload;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;
    use crate::Task;

    fn failure() -> impl Strategy<Value = Value> {
        let kind = prop::sample::select(vec![
            json!("external"),
            json!("panic"),
            json!("oops"),
            json!(1),
        ]);
        let code = prop::sample::select(vec![
            json!("test.worker.failed"),
            json!("Bad.Code"),
            json!("x."),
            json!(""),
            json!(7),
        ]);
        let message = prop::sample::select(vec![
            json!("m"),
            json!("a \"quoted\"\nline"),
            json!(null),
            json!(["m"]),
        ]);
        (
            optional(kind, 0.9),
            optional(code, 0.9),
            optional(message, 0.9),
            optional(Just(json!(1)), 0.05),
        )
            .prop_map(|(kind, code, message, extra)| {
                object([
                    ("kind", kind),
                    ("code", code),
                    ("message", message),
                    ("extra", extra),
                ])
            })
    }

    fn outcome() -> impl Strategy<Value = Value> {
        let status = prop::sample::select(vec![
            json!("completed"),
            json!("failed"),
            json!("canceled"),
            json!("timed_out"),
            json!("running"),
            json!("done"),
        ]);
        let cause = prop::sample::select(vec![
            json!("completion"),
            json!("failure"),
            json!("parent_cancellation"),
            json!("host_deadline"),
            json!("kill"),
            json!(null),
        ]);
        let output = prop::sample::select(vec![json!(2), json!(null), json!({"a": [1, "x"]})]);
        let failure = prop_oneof![4 => failure(), 1 => Just(json!(null))];
        let effects = prop::sample::select(vec![
            json!([]),
            json!(["e_0123456789abcdef0123456789abcdef"]),
            json!(["e_0123"]),
            json!(null),
        ]);
        (
            optional(status, 0.95),
            optional(cause, 0.95),
            optional(output, 0.5),
            optional(failure, 0.5),
            optional(effects, 0.2),
            optional(Just(json!(true)), 0.05),
        )
            .prop_map(|(status, cause, output, failure, effects, extra)| {
                object([
                    ("status", status),
                    ("cause", cause),
                    ("output", output),
                    ("failure", failure),
                    ("unresolved_effects", effects),
                    ("extra", extra),
                ])
            })
    }

    fn task() -> impl Strategy<Value = Value> {
        let key = prop::sample::select(vec![
            json!("t1"),
            json!("a:b-c_d.e"),
            json!("has space"),
            json!("quote\"d"),
            json!(""),
            json!("k".repeat(129)),
            json!(3),
        ]);
        let input = prop::sample::select(vec![json!(1), json!(null), json!({"x": [true, "é"]})]);
        let request = (
            optional(key, 0.95),
            optional(Just(json!("w.num")), 0.95),
            optional(input, 0.95),
            optional(Just(json!(0)), 0.05),
        )
            .prop_map(|(key, worker, input, extra)| {
                object([
                    ("key", key),
                    ("worker", worker),
                    ("input", input),
                    ("extra", extra),
                ])
            });
        let process = prop::sample::select(vec![
            json!("p_0123456789abcdef0123456789abcdef"),
            json!("p_0123456789ABCDEF0123456789ABCDEF"),
            json!("e_0123456789abcdef0123456789abcdef"),
            json!(null),
        ]);
        let rejection = prop_oneof![4 => failure(), 1 => Just(json!(null))];
        let outcome = prop_oneof![6 => outcome(), 1 => Just(json!(null))];
        (
            optional(request, 0.97),
            optional(process, 0.6),
            optional(outcome, 0.5),
            optional(rejection, 0.2),
            optional(Just(json!([])), 0.03),
        )
            .prop_map(|(request, process, outcome, rejection, extra)| {
                object([
                    ("request", request),
                    ("process", process),
                    ("outcome", outcome),
                    ("rejection", rejection),
                    ("extra", extra),
                ])
            })
    }

    /// `Some(value)` with probability `p`, else absent.
    fn optional<S: Strategy<Value = Value>>(
        value: S,
        p: f64,
    ) -> impl Strategy<Value = Option<Value>> {
        prop::option::weighted(p, value)
    }

    fn object<const N: usize>(fields: [(&str, Option<Value>); N]) -> Value {
        Value::Object(
            fields
                .into_iter()
                .filter_map(|(name, value)| value.map(|value| (name.to_owned(), value)))
                .collect(),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, .. ProptestConfig::default() })]
        /// The view accepts a task's canonical JSON exactly when decoding a
        /// `Task` does (worker names are all valid here: the view leaves
        /// them to the configuration).
        #[test]
        fn the_view_accepts_exactly_what_a_task_decodes(task in task()) {
            let text = Payload::from_value(&task).expect("encodes");
            let decoded = serde_json::from_str::<Task>(text.as_str());
            let viewed = TaskView::read(text.as_str());
            prop_assert_eq!(
                viewed.is_ok(),
                decoded.is_ok(),
                "{}: view {:?}, decode {:?}",
                text,
                viewed.err(),
                decoded.err()
            );
        }
    }

    #[test]
    fn the_generator_reaches_valid_tasks_of_every_kind() {
        for text in [
            r#"{"request":{"input":1,"key":"t1","worker":"w.num"}}"#,
            r#"{"process":"p_0123456789abcdef0123456789abcdef","request":{"input":1,"key":"t1","worker":"w.num"}}"#,
            r#"{"outcome":{"cause":"completion","output":null,"status":"completed"},"process":"p_0123456789abcdef0123456789abcdef","request":{"input":1,"key":"t1","worker":"w.num"}}"#,
            r#"{"outcome":{"cause":"failure","failure":{"code":"test.worker.failed","kind":"external","message":"a \"quoted\"\nline"},"status":"failed","unresolved_effects":["e_0123456789abcdef0123456789abcdef"]},"process":"p_0123456789abcdef0123456789abcdef","request":{"input":1,"key":"t1","worker":"w.num"}}"#,
            r#"{"rejection":{"code":"test.worker.failed","kind":"external","message":"m"},"request":{"input":1,"key":"t1","worker":"w.num"}}"#,
        ] {
            assert!(serde_json::from_str::<Task>(text).is_ok(), "{text}");
            assert!(TaskView::read(text).is_ok(), "{text}");
        }
    }
}
