//! Stages: the sealed building blocks of a workflow and their typed constructors.

use std::fmt;
use std::sync::Arc;

use baton_run::program::Schema;
use baton_run::{Budget, Capabilities, Payload, Program};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Why a pure stage function (a transform, a selector, a reducer, a loop
/// predicate) refused its input. It becomes a classified failure of the
/// stage, never a panic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransformError {
    message: String,
}

impl TransformError {
    /// An error with a human message (never parsed).
    pub fn new(message: impl Into<String>) -> TransformError {
        TransformError {
            message: message.into(),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for TransformError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TransformError {}

impl From<String> for TransformError {
    fn from(message: String) -> TransformError {
        TransformError::new(message)
    }
}

impl From<&str> for TransformError {
    fn from(message: &str) -> TransformError {
        TransformError::new(message)
    }
}

/// A child program a stage runs, with the budget and capabilities granted
/// to each of its processes.
#[derive(Clone, Debug)]
pub struct Child {
    pub(crate) program: Program,
    pub(crate) budget: Budget,
    pub(crate) capabilities: Capabilities,
}

impl Child {
    /// A child with an unlimited budget and no capabilities. A parent with
    /// a finite budget cannot grant an unlimited dimension, so give such
    /// workflows a finite child budget with [`Child::with_budget`].
    pub fn new<I, O>(program: &Program<I, O>) -> Child {
        Child {
            program: program.erase(),
            budget: Budget::unlimited(),
            capabilities: Capabilities::none(),
        }
    }

    /// Grants each process of this child this budget (debited from the workflow for good).
    pub fn with_budget(mut self, budget: Budget) -> Child {
        self.budget = budget;
        self
    }

    /// Grants each process of this child these capabilities (a subset of the workflow's).
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> Child {
        self.capabilities = capabilities;
        self
    }

    /// The child program.
    pub fn program(&self) -> &Program {
        &self.program
    }
}

/// The kind of a stage; also the `<kind>` of its failure codes
/// `workflow.<kind>.<suffix>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageKind {
    /// A pure typed function run inside the step.
    Transform,
    /// One declared child program.
    Call,
    /// A pure selector picks a case that runs like a call.
    Switch,
    /// Fixed branches on the same input, reduced in declaration order.
    Fork,
    /// One child per list item, outputs in item order.
    Map,
    /// A body child run until a predicate holds or the iterations run out.
    Loop,
}

impl StageKind {
    /// The lowercase name used in failure codes.
    pub fn as_str(self) -> &'static str {
        match self {
            StageKind::Transform => "transform",
            StageKind::Call => "call",
            StageKind::Switch => "switch",
            StageKind::Fork => "fork",
            StageKind::Map => "map",
            StageKind::Loop => "loop",
        }
    }
}

impl fmt::Display for StageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What went wrong inside a type-erased pure function.
#[derive(Debug)]
pub(crate) enum Problem {
    /// The value did not decode into the function's input type.
    Input(String),
    /// The function refused it.
    Rejected(String),
    /// Its result did not encode.
    Output(String),
}

pub(crate) type PureFn = Arc<dyn Fn(&Payload) -> Result<Payload, Problem> + Send + Sync>;
pub(crate) type SelectFn = Arc<dyn Fn(&Payload) -> Result<String, Problem> + Send + Sync>;
pub(crate) type ReduceFn = Arc<dyn Fn(&[Payload]) -> Result<Payload, Problem> + Send + Sync>;
pub(crate) type PredicateFn = Arc<dyn Fn(&Payload) -> Result<bool, Problem> + Send + Sync>;

/// One stage of a workflow. Sealed: build stages with [`transform`],
/// [`call`], [`switch`], [`fork`], [`map`] and [`loop_until`]; they are
/// validated when the workflow is built.
#[derive(Clone)]
pub struct Stage {
    pub(crate) id: String,
    pub(crate) body: Body,
}

impl fmt::Debug for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stage")
            .field("id", &self.id)
            .field("kind", &self.kind())
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
pub(crate) enum Body {
    Transform {
        input: Schema,
        output: Schema,
        run: PureFn,
    },
    Call {
        child: Child,
    },
    Switch {
        input: Schema,
        select: SelectFn,
        cases: Vec<(String, Child)>,
    },
    Fork {
        input: Schema,
        branch_output: Schema,
        output: Schema,
        branches: Vec<Child>,
        window_size: u32,
        reduce: ReduceFn,
    },
    Map {
        input: Schema,
        output: Schema,
        item_input: Schema,
        item_output: Schema,
        item: Child,
        window_size: u32,
        max_items: u32,
    },
    Loop {
        value: Schema,
        output: Schema,
        body: Child,
        max_iterations: u32,
        predicate: PredicateFn,
    },
}

impl Stage {
    /// The stage id (validated when the workflow is built).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The stage kind.
    pub fn kind(&self) -> StageKind {
        match &self.body {
            Body::Transform { .. } => StageKind::Transform,
            Body::Call { .. } => StageKind::Call,
            Body::Switch { .. } => StageKind::Switch,
            Body::Fork { .. } => StageKind::Fork,
            Body::Map { .. } => StageKind::Map,
            Body::Loop { .. } => StageKind::Loop,
        }
    }

    /// The schema of the value the stage receives.
    pub fn input_schema(&self) -> &Schema {
        match &self.body {
            Body::Transform { input, .. }
            | Body::Switch { input, .. }
            | Body::Fork { input, .. }
            | Body::Map { input, .. } => input,
            Body::Call { child } => child.program.descriptor().input_schema(),
            Body::Loop { value, .. } => value,
        }
    }

    /// The schema of the value the stage produces.
    pub fn output_schema(&self) -> &Schema {
        match &self.body {
            Body::Transform { output, .. }
            | Body::Fork { output, .. }
            | Body::Map { output, .. }
            | Body::Loop { output, .. } => output,
            Body::Call { child } => child.program.descriptor().output_schema(),
            Body::Switch { cases, .. } => cases.first().map_or_else(
                || self.input_schema(),
                |(_, child)| child.program.descriptor().output_schema(),
            ),
        }
    }

    /// Every child program the stage may start, in declaration order.
    pub(crate) fn children(&self) -> Vec<&Child> {
        match &self.body {
            Body::Transform { .. } => Vec::new(),
            Body::Call { child } => vec![child],
            Body::Switch { cases, .. } => cases.iter().map(|(_, child)| child).collect(),
            Body::Fork { branches, .. } => branches.iter().collect(),
            Body::Map { item, .. } => vec![item],
            Body::Loop { body, .. } => vec![body],
        }
    }
}

fn decode<T: DeserializeOwned>(value: &Payload) -> Result<T, Problem> {
    value
        .decode()
        .map_err(|error| Problem::Input(error.to_string()))
}

fn encode<T: Serialize>(value: &T) -> Result<Payload, Problem> {
    Payload::encode(value).map_err(|error| Problem::Output(error.to_string()))
}

/// A pure typed function run inside the step: the value is checked against
/// `I`'s schema and decoded, `f` runs, and its result is encoded and checked
/// against `O`'s schema. An error from `f` fails the stage with
/// `workflow.transform.failed`.
///
/// ```
/// use baton_workflow::transform;
///
/// let review = transform("review", |task: String| Ok(format!("reviewed: {task}")));
/// assert_eq!(review.id(), "review");
/// ```
pub fn transform<I, O, F>(id: &str, f: F) -> Stage
where
    I: DeserializeOwned + JsonSchema,
    O: Serialize + JsonSchema,
    F: Fn(I) -> Result<O, TransformError> + Send + Sync + 'static,
{
    Stage {
        id: id.to_owned(),
        body: Body::Transform {
            input: Schema::of::<I>(),
            output: Schema::of::<O>(),
            run: Arc::new(move |value| {
                let output =
                    f(decode::<I>(value)?).map_err(|error| Problem::Rejected(error.message))?;
                encode(&output)
            }),
        },
    }
}

/// Runs one declared child program on the value, waits for its result and
/// checks its output. The stage's schemas are the child's.
pub fn call(id: &str, child: Child) -> Stage {
    Stage {
        id: id.to_owned(),
        body: Body::Call { child },
    }
}

/// A pure selector picks a case by id; the case runs like a [`call`]. Every
/// case's child takes `I` and all cases share one output schema. An id that
/// names no case fails with contract `workflow.switch.case_unknown`.
pub fn switch<I, S, F>(id: &str, select: F, cases: Vec<(&str, Child)>) -> Stage
where
    I: DeserializeOwned + JsonSchema,
    S: Into<String>,
    F: Fn(I) -> Result<S, TransformError> + Send + Sync + 'static,
{
    Stage {
        id: id.to_owned(),
        body: Body::Switch {
            input: Schema::of::<I>(),
            select: Arc::new(move |value| {
                select(decode::<I>(value)?)
                    .map(Into::into)
                    .map_err(|error| Problem::Rejected(error.message))
            }),
            cases: cases
                .into_iter()
                .map(|(case, child)| (case.to_owned(), child))
                .collect(),
        },
    }
}

/// Fixed branches (children `I → B`) run on the same input, started in
/// windows of `window_size` (1 ≤ `window_size` ≤ branches); once every
/// branch succeeded, `reduce` sees their outputs in declaration order.
pub fn fork<I, B, O, F>(id: &str, branches: Vec<Child>, window_size: u32, reduce: F) -> Stage
where
    I: JsonSchema,
    B: DeserializeOwned + JsonSchema,
    O: Serialize + JsonSchema,
    F: Fn(Vec<B>) -> Result<O, TransformError> + Send + Sync + 'static,
{
    Stage {
        id: id.to_owned(),
        body: Body::Fork {
            input: Schema::of::<I>(),
            branch_output: Schema::of::<B>(),
            output: Schema::of::<O>(),
            branches,
            window_size,
            reduce: Arc::new(move |outputs| {
                let outputs = outputs
                    .iter()
                    .map(decode::<B>)
                    .collect::<Result<Vec<B>, Problem>>()?;
                let output = reduce(outputs).map_err(|error| Problem::Rejected(error.message))?;
                encode(&output)
            }),
        },
    }
}

/// Runs the child `item` (`I → O`) once per element of a `Vec<I>`, in
/// windows of `window_size`, and produces the `Vec<O>` in item order. A
/// list longer than `max_items` fails with contract
/// `workflow.map.max_items_exceeded`; an empty list gives an empty list
/// without starting any child.
pub fn map<I, O>(id: &str, item: Child, window_size: u32, max_items: u32) -> Stage
where
    I: JsonSchema,
    O: JsonSchema,
{
    Stage {
        id: id.to_owned(),
        body: Body::Map {
            input: Schema::of::<Vec<I>>(),
            output: Schema::of::<Vec<O>>(),
            item_input: Schema::of::<I>(),
            item_output: Schema::of::<O>(),
            item,
            window_size,
            max_items,
        },
    }
}

/// The output of a [`loop_until`] stage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoopResult<T> {
    /// The body's last output.
    pub value: T,
    /// How many times the body ran (at least one).
    pub iterations: u32,
    /// Whether the predicate held; `false` when the iterations ran out.
    pub satisfied: bool,
}

/// Runs the child `body` (`T → T`) at least once, feeding each output to
/// the next run, until the pure `predicate` holds or `max_iterations` runs
/// have happened. Running out of iterations still completes, with
/// `satisfied = false`.
pub fn loop_until<T, P>(id: &str, body: Child, max_iterations: u32, predicate: P) -> Stage
where
    T: DeserializeOwned + Serialize + JsonSchema,
    P: Fn(&T) -> Result<bool, TransformError> + Send + Sync + 'static,
{
    Stage {
        id: id.to_owned(),
        body: Body::Loop {
            value: Schema::of::<T>(),
            output: Schema::of::<LoopResult<T>>(),
            body,
            max_iterations,
            predicate: Arc::new(move |value| {
                predicate(&decode::<T>(value)?).map_err(|error| Problem::Rejected(error.message))
            }),
        },
    }
}
