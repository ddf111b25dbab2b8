//! # baton-workflow: workflow stages as one Baton program
//!
//! Owns the workflow [`Definition`](baton_run::program::Definition): an ordered,
//! non-empty list of sealed [`Stage`]s with unique lowercase ids, where the
//! workflow's input is the first stage's input and its output the last
//! stage's output. Adjacent stage schemas must match byte for byte; that is
//! checked once, when [`Workflow::new`] validates its [`Config`], and a
//! mismatch is a typed [`ConfigError`], never a runtime failure.
//!
//! The stages:
//!
//! - [`transform`]: a pure typed function run inside the step;
//! - [`call`]: one declared child program with its budget and capabilities;
//! - [`switch`]: a pure selector picks a case that runs like a call;
//! - [`fork`]: fixed branches on the same input, started in windows and
//!   reduced in declaration order once all succeed;
//! - [`map`]: one child per list item, windowed, outputs in item order;
//! - [`loop_until`]: a body child run at least once until a pure predicate
//!   holds or the iterations run out.
//!
//! A stage does no I/O; outside work is an [`Activity`]: a program whose one
//! effect runs an async function `I -> Result<O, ActivityError>` through its
//! dispatcher, with a replay policy, the effect id as idempotency key, a
//! per-call timeout, panics caught as classified failures and, optionally,
//! a person's approval first. A [`call`] stage runs one like any child; the
//! agent layer wraps one as a model-facing tool. Failures a later attempt
//! may fix carry a [`RetryHint`](baton_run::dispatch::RetryHint)
//! (its certainty and `Retry-After`), which the kernel reads to try a call
//! again as the activity's [`RetryPolicy`](baton_run::dispatch::RetryPolicy)
//! says.
//!
//! Failures carry stable codes `workflow.<kind>.<suffix>`; fan-out stages
//! fail with the lowest-index failure of a window (see `docs/workflow.md`).
//!
//! ```
//! use baton_workflow::{Config, Workflow, transform};
//!
//! let workflow = Workflow::new(Config {
//!     name: "example.review".into(),
//!     description: "Reviews a task and signs it off.".into(),
//!     build: "doc-example 1".into(),
//!     stages: vec![
//!         transform("review", |task: String| Ok(format!("reviewed: {task}"))),
//!         transform("sign", |text: String| Ok(text.len())),
//!     ],
//! })?;
//! let program = workflow.program::<String, usize>();
//! assert_eq!(program.descriptor().name().as_str(), "example.review");
//! # Ok::<(), baton_workflow::ConfigError>(())
//! ```
//!
//! Depend on it (or on the `baton` facade's `baton::workflow`) to compose
//! programs into pipelines. It depends only on `baton-run` and knows
//! nothing of teams, models, coordination programs or stores: the children
//! it runs are opaque programs, and an activity's function is opaque work.
//!
//! No cargo features.

mod activity;
mod execution;
mod stage;
mod workflow;

pub use activity::{
    ACTIVITY_DENIED, ACTIVITY_FAILED, ACTIVITY_INVALID, ACTIVITY_PANICKED, ACTIVITY_TIMED_OUT,
    Activity, ActivityConfig, ActivityContext, ActivityError, ActivityOutput, ActivitySchemas,
    Approval, ApprovalRequest, DEFAULT_ACTIVITY_TIMEOUT, Verdict,
};

pub use stage::{
    Child, LoopResult, Stage, StageKind, TransformError, call, fork, loop_until, map, switch,
    transform,
};
pub use workflow::{Config, ConfigError, MAX_ID_LEN, Workflow};
