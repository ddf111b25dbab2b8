//! The wire contract between a team and its coordinator: [`Turn`] in,
//! [`Decision`] out, and the task and control facts they carry.
//!
//! Every type decodes strictly: unknown fields are rejected, an optional
//! member is either absent or a real value (an explicit JSON `null` is
//! refused), except [`Decision::output`], where an explicit `null` is a
//! present output.

use std::borrow::Cow;

use baton_run::program::{ChildSignal, Descriptor};
use baton_run::{
    ChildKey, Failure, Meters, Name, Payload, ProcessId, Settlement, Status, Termination,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How the next turn starts after a decision that does not complete the team.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Start the next turn as soon as the decision's start results and
    /// control receipts are in, while tasks keep running.
    Continue,
    /// Start the next turn once at least one running task has drained,
    /// unless an outcome already arrived during this turn or nothing is
    /// running; then start it at once. An older running task still delays
    /// the turn when every new start was refused: use `Continue` to react
    /// to the receipts at once.
    Wait,
}

/// A request to start one bounded execution of a configured worker.
///
/// Follow-up work gets a new key and carries the earlier result in its
/// input; a finished task is never resumed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskRequest {
    /// The task's key: new within the team, not starting with
    /// [`RESERVED_PREFIX`](crate::RESERVED_PREFIX).
    pub key: ChildKey,
    /// The worker's descriptor name.
    pub worker: Name,
    /// The worker's input (checked against its input schema).
    pub input: Payload,
}

impl TaskRequest {
    /// A request for `worker` under `key`.
    pub fn new(key: ChildKey, worker: Name, input: Payload) -> TaskRequest {
        TaskRequest { key, worker, input }
    }
}

/// One task and the kernel facts about it, in the order they happen.
///
/// A task with only its request awaits admission (only while the decision
/// that requested it is being applied). A refused start has a `rejection`
/// and nothing else. An admitted task has its `process`; once it and its
/// whole subtree have drained, its `outcome` is added (with the effects
/// left unresolved anywhere in its subtree).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, try_from = "crate::codec::TaskWire")]
pub struct Task {
    /// What was requested.
    pub request: TaskRequest,
    /// The task's process, once admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessId>,
    /// How it ended, once it drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Termination>,
    /// Why its start was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejection: Option<Failure>,
}

impl Task {
    /// A task awaiting admission.
    pub fn pending(request: TaskRequest) -> Task {
        Task {
            request,
            process: None,
            outcome: None,
            rejection: None,
        }
    }

    /// The task's key.
    pub fn key(&self) -> &ChildKey {
        &self.request.key
    }

    /// Whether it awaits admission (no kernel fact yet).
    pub fn is_pending(&self) -> bool {
        self.process.is_none() && self.rejection.is_none()
    }

    /// Whether it was admitted and its drained outcome has not been observed.
    pub fn is_running(&self) -> bool {
        self.process.is_some() && self.outcome.is_none()
    }

    /// The terminal status, once drained.
    pub fn status(&self) -> Option<Status> {
        self.outcome.as_ref().map(Termination::status)
    }

    /// The output, once drained after completing (an explicit JSON `null`
    /// output is present).
    pub fn output(&self) -> Option<&Payload> {
        self.outcome.as_ref().and_then(Termination::output)
    }
}

/// What a control asks of a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlAction {
    /// Deliver this signal to the task; the recipient interprets it (an
    /// addressed answer for an input gate, steering for an interaction).
    Signal(ChildSignal),
    /// Ask the task to cancel, for this reason. The receipt confirms intent
    /// only; the task's drained outcome arrives later, `Canceled`.
    Cancel(String),
}

/// A control on an admitted task: exactly one of a signal or a cancel
/// reason. JSON: `{"task", "signal"}` or `{"task", "cancel_reason"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    into = "crate::codec::ControlWire",
    try_from = "crate::codec::ControlWire"
)]
pub struct Control {
    /// The task's key.
    pub task: ChildKey,
    /// What to do.
    pub action: ControlAction,
}

impl Control {
    /// A signal control.
    pub fn signal(task: ChildKey, signal: ChildSignal) -> Control {
        Control {
            task,
            action: ControlAction::Signal(signal),
        }
    }

    /// A cancel control.
    pub fn cancel(task: ChildKey, reason: impl Into<String>) -> Control {
        Control {
            task,
            action: ControlAction::Cancel(reason.into()),
        }
    }
}

/// The schema of [`Control`]: one of two closed shapes.
#[derive(JsonSchema)]
#[serde(untagged, deny_unknown_fields)]
#[allow(dead_code)]
enum ControlShape {
    /// A signal control.
    Signal {
        /// The task's key.
        task: ChildKey,
        /// The signal to deliver.
        signal: ChildSignal,
    },
    /// A cancel control.
    Cancel {
        /// The task's key.
        task: ChildKey,
        /// Why.
        cancel_reason: String,
    },
}

impl JsonSchema for Control {
    fn schema_name() -> Cow<'static, str> {
        "Control".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        ControlShape::json_schema(generator)
    }
}

/// The schema of a kernel [`Settlement`].
#[derive(JsonSchema)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
#[schemars(rename = "Settlement")]
#[allow(dead_code)]
enum SettlementShape {
    /// Delivered (a cancel: intent recorded).
    Succeeded {
        /// The kernel's receipt.
        output: Payload,
        /// Meter usage.
        #[serde(default)]
        usage: Meters,
    },
    /// Refused.
    Failed {
        /// Why.
        failure: Failure,
        /// Meter usage.
        #[serde(default)]
        usage: Meters,
    },
    /// Not known.
    Unknown {
        /// Bounded diagnostic text.
        diagnostic: String,
    },
}

/// The receipt of one control of the previous decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ControlReceipt {
    /// The control as decided.
    pub control: Control,
    /// The kernel's result: `succeeded` when delivered (for a cancel, the
    /// intent is recorded), `failed` when refused (for example, the task had
    /// already ended).
    #[schemars(with = "SettlementShape")]
    pub result: Settlement,
}

/// What the coordinator receives at the start of each turn: its complete,
/// portable input.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    /// The turn's number, from 1.
    pub number: u64,
    /// The working memory: the team's input on turn 1, then the previous
    /// decision's state.
    pub state: Payload,
    /// The configured workers' descriptors (their exact contracts, without
    /// budgets or capabilities).
    pub workers: Vec<Descriptor>,
    /// Every task so far, in request order. Outcomes that arrived while the
    /// previous coordinator ran are here.
    pub tasks: Vec<Task>,
    /// Receipts of the previous decision's controls only.
    pub controls: Vec<ControlReceipt>,
}

impl Turn {
    /// The task under `key`.
    pub fn task(&self, key: &str) -> Option<&Task> {
        self.tasks.iter().find(|task| task.key().as_str() == key)
    }

    /// Tasks admitted whose outcome has not been observed.
    pub fn running(&self) -> impl Iterator<Item = &Task> {
        self.tasks.iter().filter(|task| task.is_running())
    }
}

/// What the coordinator returns.
///
/// A present `output` completes the team (an explicit JSON `null` is a
/// present output) and admits no mode, tasks or controls. Otherwise `mode`
/// is required and says how the next turn starts. The whole decision is
/// validated before any task starts or any control is sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    /// How the next turn starts; absent exactly when `output` is present.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "baton_run::program::deserialize_present"
    )]
    #[schemars(with = "Mode")]
    pub mode: Option<Mode>,
    /// The next working state (replaces the current one in full; checked
    /// against the team's state schema, even when completing).
    pub state: Payload,
    /// New tasks to start, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskRequest>,
    /// Controls on admitted tasks, sent after the starts, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub controls: Vec<Control>,
    /// The team's output; present completes the team.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "baton_run::program::deserialize_present"
    )]
    #[schemars(with = "Payload")]
    pub output: Option<Payload>,
}

impl Decision {
    /// A decision in `mode` with `state` and no actions.
    pub fn new(mode: Mode, state: Payload) -> Decision {
        Decision {
            mode: Some(mode),
            state,
            tasks: Vec::new(),
            controls: Vec::new(),
            output: None,
        }
    }

    /// A decision that completes the team with `output`.
    pub fn complete(state: Payload, output: Payload) -> Decision {
        Decision {
            mode: None,
            state,
            tasks: Vec::new(),
            controls: Vec::new(),
            output: Some(output),
        }
    }

    /// Adds a task request.
    pub fn with_task(mut self, task: TaskRequest) -> Decision {
        self.tasks.push(task);
        self
    }

    /// Adds a control.
    pub fn with_control(mut self, control: Control) -> Decision {
        self.controls.push(control);
        self
    }
}
