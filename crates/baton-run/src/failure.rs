//! Failures, statuses and terminations.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{EffectId, Name};
use crate::payload::Payload;

/// The class of a failure. Retryability is deliberately not a kind.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The program or engine could not carry out the work.
    Execution,
    /// Someone broke a contract: schema, protocol, configuration.
    Contract,
    /// The outside world failed: a provider, a tool, a worker.
    External,
    /// User code panicked.
    Panic,
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureKind::Execution => "execution",
            FailureKind::Contract => "contract",
            FailureKind::External => "external",
            FailureKind::Panic => "panic",
        })
    }
}

/// A domain failure: a stable `code` that drives behaviour and a bounded
/// human `message` that never does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Failure {
    /// The class of failure.
    pub kind: FailureKind,
    /// Stable code such as `engine.limit.steps`.
    pub code: Name,
    /// Bounded human text; never parsed.
    pub message: String,
}

impl Failure {
    /// Longest message kept, in bytes; longer messages are cut at a char boundary.
    pub const MAX_MESSAGE: usize = 1024;

    /// Builds a failure. `code` must be a valid lowercase dotted name; this
    /// constructor is for codes written in source, so an invalid code is a
    /// programming error reported as `engine.failure.invalid`.
    pub fn new(kind: FailureKind, code: &str, message: impl Into<String>) -> Failure {
        let mut message = message.into();
        if message.len() > Self::MAX_MESSAGE {
            let cut = (0..=Self::MAX_MESSAGE)
                .rev()
                .find(|i| message.is_char_boundary(*i))
                .unwrap_or(0);
            message.truncate(cut);
        }
        match Name::new(code) {
            Ok(code) => Failure {
                kind,
                code,
                message,
            },
            Err(_) => Failure {
                kind,
                code: Name::new("engine.failure.invalid").expect("static code is valid"),
                message: format!(
                    "invalid failure code {:?}: {message}",
                    code.chars().take(80).collect::<String>()
                ),
            },
        }
    }

    /// An `execution` failure.
    pub fn execution(code: &str, message: impl Into<String>) -> Failure {
        Failure::new(FailureKind::Execution, code, message)
    }

    /// A `contract` failure.
    pub fn contract(code: &str, message: impl Into<String>) -> Failure {
        Failure::new(FailureKind::Contract, code, message)
    }

    /// An `external` failure.
    pub fn external(code: &str, message: impl Into<String>) -> Failure {
        Failure::new(FailureKind::External, code, message)
    }

    /// The code as text.
    pub fn code(&self) -> &str {
        self.code.as_str()
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failure {}: {}", self.kind, self.code, self.message)
    }
}

impl std::error::Error for Failure {}

/// The error a step, start or restore returns. A classified error keeps its
/// kind and code; anything else becomes `execution.step.failed`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StepError(pub Failure);

impl StepError {
    /// A classified error with its own kind and code.
    pub fn classified(kind: FailureKind, code: &str, message: impl Into<String>) -> StepError {
        StepError(Failure::new(kind, code, message))
    }

    /// An unclassified error: `execution.step.failed`.
    pub fn other(message: impl fmt::Display) -> StepError {
        StepError(Failure::execution(
            "execution.step.failed",
            message.to_string(),
        ))
    }

    /// The failure this error records.
    pub fn failure(&self) -> &Failure {
        &self.0
    }
}

impl From<Failure> for StepError {
    fn from(failure: Failure) -> StepError {
        StepError(failure)
    }
}

impl From<crate::ids::IdError> for StepError {
    fn from(error: crate::ids::IdError) -> StepError {
        StepError(Failure::contract("execution.id.invalid", error.to_string()))
    }
}

impl From<crate::payload::PayloadError> for StepError {
    fn from(error: crate::payload::PayloadError) -> StepError {
        StepError(Failure::contract(
            "execution.payload.invalid",
            error.to_string(),
        ))
    }
}

/// The lifecycle status of a process.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Stepping or advancing effects.
    Running,
    /// Waiting for an addressed signal.
    Waiting,
    /// Holding an unknown effect; needs the host's attention.
    Parked,
    /// Completed with an output.
    Completed,
    /// Failed.
    Failed,
    /// Canceled by its parent or the host.
    Canceled,
    /// Its own or an ancestor's deadline passed.
    TimedOut,
    /// Killed.
    Killed,
}

impl Status {
    /// Whether the status is one of the five terminal ones.
    pub fn is_terminal(self) -> bool {
        !matches!(self, Status::Running | Status::Waiting | Status::Parked)
    }

    /// Lowercase name used in views (`parked` shows as `needs_attention`).
    pub fn view_name(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Waiting => "waiting",
            Status::Parked => "needs_attention",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Canceled => "canceled",
            Status::TimedOut => "timed_out",
            Status::Killed => "killed",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.view_name())
    }
}

/// Why a process terminated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// The program completed.
    Completion,
    /// The program or engine failed it.
    Failure,
    /// The host canceled it.
    HostCancellation,
    /// Its parent canceled it.
    ParentCancellation,
    /// The host deadline passed.
    HostDeadline,
    /// An ancestor's deadline passed.
    ParentDeadline,
    /// It was killed.
    Kill,
}

impl Cause {
    /// The status this cause produces.
    pub fn status(self) -> Status {
        match self {
            Cause::Completion => Status::Completed,
            Cause::Failure => Status::Failed,
            Cause::HostCancellation | Cause::ParentCancellation => Status::Canceled,
            Cause::HostDeadline | Cause::ParentDeadline => Status::TimedOut,
            Cause::Kill => Status::Killed,
        }
    }

    /// Priority when causes race: kill > deadline > cancellation > failure > completion.
    pub fn priority(self) -> u8 {
        match self {
            Cause::Completion => 0,
            Cause::Failure => 1,
            Cause::HostCancellation | Cause::ParentCancellation => 2,
            Cause::HostDeadline | Cause::ParentDeadline => 3,
            Cause::Kill => 4,
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cause::Completion => "completion",
            Cause::Failure => "failure",
            Cause::HostCancellation => "host cancellation",
            Cause::ParentCancellation => "parent cancellation",
            Cause::HostDeadline => "host deadline",
            Cause::ParentDeadline => "parent deadline",
            Cause::Kill => "kill",
        })
    }
}

/// How a process ended: its cause (hence status), the output or failure,
/// and the ids of effects left unresolved anywhere in its subtree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, try_from = "TerminationWire")]
pub struct Termination {
    // Fields in key order: canonical payloads then need no rearranging.
    cause: Cause,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    failure: Option<Failure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output: Option<Payload>,
    status: Status,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    unresolved_effects: Vec<EffectId>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct TerminationWire {
    status: Status,
    cause: Cause,
    // An explicit JSON `null` output is a present output.
    #[serde(default, deserialize_with = "crate::payload::deserialize_present")]
    output: Option<Payload>,
    #[serde(default)]
    failure: Option<Failure>,
    #[serde(default)]
    unresolved_effects: Vec<EffectId>,
}

impl TryFrom<TerminationWire> for Termination {
    type Error = String;

    fn try_from(wire: TerminationWire) -> Result<Self, String> {
        Termination::check_shape(
            wire.status,
            wire.cause,
            wire.output.is_some(),
            wire.failure.is_some(),
        )?;
        Ok(Termination {
            status: wire.status,
            cause: wire.cause,
            output: wire.output,
            failure: wire.failure,
            unresolved_effects: wire.unresolved_effects,
        })
    }
}

impl Termination {
    /// The rule every recorded termination keeps, for readers that check
    /// one without building it: the status follows from the cause, and a
    /// completed termination carries exactly an output, any other exactly
    /// a failure.
    pub fn check_shape(
        status: Status,
        cause: Cause,
        has_output: bool,
        has_failure: bool,
    ) -> Result<(), String> {
        if cause.status() != status {
            return Err(format!(
                "status {status} does not follow from cause {cause}"
            ));
        }
        let completed = status == Status::Completed;
        if completed != has_output || completed == has_failure {
            return Err(
                "a completed termination carries exactly an output, any other exactly a failure"
                    .into(),
            );
        }
        Ok(())
    }

    /// Completed with `output`.
    pub fn completed(output: Payload) -> Termination {
        Termination {
            status: Status::Completed,
            cause: Cause::Completion,
            output: Some(output),
            failure: None,
            unresolved_effects: Vec::new(),
        }
    }

    /// Ended by `cause` (anything but completion) with `failure` describing it.
    pub fn ended(cause: Cause, failure: Failure) -> Termination {
        debug_assert!(cause != Cause::Completion, "completion carries an output");
        let cause = if cause == Cause::Completion {
            Cause::Failure
        } else {
            cause
        };
        Termination {
            status: cause.status(),
            cause,
            output: None,
            failure: Some(failure),
            unresolved_effects: Vec::new(),
        }
    }

    /// Failed with `failure`.
    pub fn failed(failure: Failure) -> Termination {
        Termination::ended(Cause::Failure, failure)
    }

    /// Attaches the unresolved effect ids (sorted, deduplicated).
    pub fn with_unresolved(mut self, mut effects: Vec<EffectId>) -> Termination {
        effects.sort();
        effects.dedup();
        self.unresolved_effects = effects;
        self
    }

    /// The terminal status.
    pub fn status(&self) -> Status {
        self.status
    }

    /// Why it ended.
    pub fn cause(&self) -> Cause {
        self.cause
    }

    /// The output, present exactly when completed (an explicit JSON `null` is present).
    pub fn output(&self) -> Option<&Payload> {
        self.output.as_ref()
    }

    /// The failure, present exactly when not completed.
    pub fn failure(&self) -> Option<&Failure> {
        self.failure.as_ref()
    }

    /// Effects left unresolved anywhere in the subtree.
    pub fn unresolved_effects(&self) -> &[EffectId] {
        &self.unresolved_effects
    }
}

impl fmt::Display for Termination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.output, &self.failure) {
            (Some(output), _) => write!(f, "{} ({}): {}", self.status, self.cause, output),
            (_, Some(failure)) => write!(f, "{} ({}): {}", self.status, self.cause, failure),
            _ => write!(f, "{} ({})", self.status, self.cause),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_message_is_bounded_and_code_checked() {
        let failure = Failure::execution("engine.limit.steps", "é".repeat(2000));
        assert!(failure.message.len() <= Failure::MAX_MESSAGE);
        assert_eq!(
            Failure::execution("Bad Code", "x").code(),
            "engine.failure.invalid"
        );
    }

    #[test]
    fn termination_json_is_validated() {
        let ok = Termination::completed(Payload::null());
        let text = serde_json::to_string(&ok).expect("serializes");
        assert_eq!(
            serde_json::from_str::<Termination>(&text).expect("parses"),
            ok
        );
        assert!(
            serde_json::from_str::<Termination>(
                r#"{"status":"failed","cause":"completion","output":1}"#
            )
            .is_err()
        );
        assert!(
            serde_json::from_str::<Termination>(r#"{"status":"completed","cause":"completion"}"#)
                .is_err()
        );
    }

    #[test]
    fn priority_order() {
        assert!(Cause::Kill.priority() > Cause::HostDeadline.priority());
        assert!(Cause::HostDeadline.priority() > Cause::HostCancellation.priority());
        assert!(Cause::HostCancellation.priority() > Cause::Failure.priority());
        assert!(Cause::Failure.priority() > Cause::Completion.priority());
    }
}
