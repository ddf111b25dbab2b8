//! # baton-team: the decision-driven team coordinator
//!
//! Owns one program, the *team*: a coordinator program reads a [`Turn`]
//! (the working state, the configured workers, every task so far and the
//! receipts of the previous decision's controls) and returns a
//! [`Decision`] (the next state, new tasks, controls on running tasks, how
//! the next turn starts, or the team's output). Workers run as ordinary
//! child processes; their failures, refused starts and rejected controls
//! are facts in the next turn, never failures of the team. The coordinator
//! is any `Program<Turn, Decision>`: a pure [`Policy`], a workflow, or a
//! model-backed adapter.
//!
//! [`compile`] validates a [`Config`] once and binds the team as a
//! `Program<I, O>` whose state (input) and output schemas come from `I` and
//! `O`. Each turn starts the coordinator as a child under the key
//! `team.turn.<n>`; the team's single wait during a turn covers the running
//! tasks and the coordinator (boundary `Drained`, condition `Any`), so a
//! task that finishes while the coordinator runs is recorded and shows up
//! in the next turn without interrupting the coordinator. The whole
//! decision is validated before any effect is declared.
//!
//! Failure codes (stable): `team.decision.invalid` (contract),
//! `team.protocol.invalid` (contract), `team.state.invalid` (contract),
//! `team.limit.turns` (execution), `team.coordinator.unresolved_effects`
//! (external), and `engine.counter.exhausted` (execution) when the turn
//! counter would overflow; a failed coordinator fails the team with its own
//! kind, code and message. See `docs/team.md`.
//!
//! Depend on it (or on the `baton` facade's `baton::team`) to run a team. It
//! depends only on `baton-run` and knows nothing of models, workflows,
//! input gates or stores: the coordinator and the workers are opaque
//! programs.
//!
//! No cargo features.

mod codec;
mod policy;
mod state;
mod team;
mod typed;
mod wire;

use std::collections::BTreeSet;
use std::sync::Arc;

use baton_run::program::{
    Descriptor, ProgramConfig, Schema, configuration_digest, implementation_digest,
};
use baton_run::{Budget, Capabilities, Program, Quota};
use serde::Serialize;

pub use policy::{Decide, Policy, PolicyConfig};
pub use typed::decision_schema;
pub use wire::{Control, ControlAction, ControlReceipt, Decision, Mode, Task, TaskRequest, Turn};

/// Task keys may not start with this prefix: the team starts its
/// coordinator of turn `n` under the key `team.turn.<n>`.
pub const RESERVED_PREFIX: &str = "team.turn.";

/// Failure code of an invalid decision (kind `contract`).
pub const DECISION_INVALID: &str = "team.decision.invalid";
/// Failure code of a signal outside the team's protocol (kind `contract`).
pub const PROTOCOL_INVALID: &str = "team.protocol.invalid";
/// Failure code of a recorded state that does not restore (kind `contract`).
pub const STATE_INVALID: &str = "team.state.invalid";
/// Failure code of the turn bound (kind `execution`).
pub const LIMIT_TURNS: &str = "team.limit.turns";
/// Failure code of a coordinator whose subtree left unresolved effects
/// (kind `external`).
pub const COORDINATOR_UNRESOLVED: &str = "team.coordinator.unresolved_effects";
/// Failure code of an exhausted counter (kind `execution`).
pub const COUNTER_EXHAUSTED: &str = "engine.counter.exhausted";
/// A team whose turns stopped making progress (see [`Config::stall_turns`]).
pub const STALLED: &str = "team.stalled";
/// A sensible [`Config::stall_turns`]: three turns in a row that make no
/// progress and decide the same thing.
pub const DEFAULT_STALL_TURNS: Quota = Quota::Finite(3);

/// A child program with the grants it receives each time it starts: its
/// budget (debited from the team for good, never refunded) and its
/// capabilities (a subset of the team's).
#[derive(Clone, Debug)]
pub struct Binding {
    /// The exact program.
    pub program: Program,
    /// The budget of each start.
    pub budget: Budget,
    /// The capabilities of each start.
    pub capabilities: Capabilities,
}

impl Binding {
    /// A binding with an unlimited budget and no capabilities.
    pub fn new<I, O>(program: &Program<I, O>) -> Binding {
        Binding {
            program: program.erase(),
            budget: Budget::unlimited(),
            capabilities: Capabilities::none(),
        }
    }

    /// Grants this budget to each start.
    pub fn with_budget(mut self, budget: Budget) -> Binding {
        self.budget = budget;
        self
    }

    /// Grants these capabilities to each start.
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> Binding {
        self.capabilities = capabilities;
        self
    }
}

/// How to build a team. Validated once by [`compile`].
#[derive(Clone, Debug)]
pub struct Config {
    /// The team's descriptor name (lowercase dotted).
    pub name: String,
    /// What the team does, for people.
    pub description: String,
    /// The coordinator: its descriptor's input and output schemas must be
    /// exactly those of [`Turn`] and [`Decision`].
    pub coordinator: Binding,
    /// The workers, selected by descriptor name (names must be unique).
    pub workers: Vec<Binding>,
    /// The most turns; a finite zero is rejected when the team is built.
    pub max_turns: Quota,
    /// The most tasks ever requested, refused starts included; a finite
    /// zero forbids worker starts.
    pub max_tasks: Quota,
    /// The most tasks admitted and not yet observed drained (at least 1).
    pub max_concurrent_tasks: u32,
    /// The most controls in one decision (at least 1).
    pub max_controls_per_turn: u32,
    /// The stall guard: the team fails with [`STALLED`] once this many
    /// turns in a row made no progress — no new task, no control, the
    /// state unchanged, no task outcome arrived during the turn — each
    /// deciding exactly what the turn before it decided.
    /// [`DEFAULT_STALL_TURNS`] suits most teams; `Quota::Unlimited` turns
    /// the guard off; a finite zero is rejected.
    pub stall_turns: Quota,
}

/// Why a team (or a [`Policy`]) could not be built. Nothing is bound.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The name or description is not a valid descriptor.
    #[error("team: invalid configuration: {0}")]
    Descriptor(#[from] baton_run::program::DescriptorError),
    /// No worker is configured.
    #[error("team: invalid configuration: at least one worker is required")]
    NoWorkers,
    /// Two workers share a descriptor name.
    #[error("team: invalid configuration: duplicate worker name {name}")]
    DuplicateWorker {
        /// The repeated name.
        name: String,
    },
    /// The coordinator does not accept `Turn` or does not return `Decision`.
    #[error(
        "team: invalid configuration: the coordinator's {which} schema is not exactly the {expected} schema"
    )]
    CoordinatorContract {
        /// `input` or `output`.
        which: &'static str,
        /// `Turn` or `Decision`.
        expected: &'static str,
    },
    /// `max_turns` is a finite zero: the first turn could never start.
    #[error("team: invalid configuration: max_turns must not be zero")]
    ZeroMaxTurns,
    /// `max_concurrent_tasks` is zero.
    #[error("team: invalid configuration: max_concurrent_tasks must be at least 1")]
    ZeroMaxConcurrentTasks,
    /// `stall_turns` is a finite zero: every turn would count as stalled.
    #[error("team: invalid configuration: stall_turns must not be zero")]
    ZeroStallTurns,
    /// `max_controls_per_turn` is zero.
    #[error("team: invalid configuration: max_controls_per_turn must be at least 1")]
    ZeroMaxControlsPerTurn,
    /// A policy's build identity is empty.
    #[error("team: invalid configuration: the build identity must not be empty")]
    Build,
    /// The configuration could not be encoded.
    #[error("team: invalid configuration: {message}")]
    Encode {
        /// What the encoder reported.
        message: String,
    },
}

impl ConfigError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ConfigError::Descriptor(_) => "team.config.descriptor",
            ConfigError::NoWorkers => "team.config.no_workers",
            ConfigError::DuplicateWorker { .. } => "team.config.duplicate_worker",
            ConfigError::CoordinatorContract { .. } => "team.config.coordinator_contract",
            ConfigError::ZeroMaxTurns => "team.config.max_turns",
            ConfigError::ZeroMaxConcurrentTasks => "team.config.max_concurrent_tasks",
            ConfigError::ZeroMaxControlsPerTurn => "team.config.max_controls_per_turn",
            ConfigError::ZeroStallTurns => "team.config.stall_turns",
            ConfigError::Build => "team.config.build",
            ConfigError::Encode { .. } => "team.config.encode",
        }
    }
}

/// Everything the configuration digest covers.
#[derive(Serialize)]
struct Digested<'a> {
    name: &'a str,
    description: &'a str,
    state_schema: &'a Schema,
    output_schema: &'a Schema,
    coordinator: DigestedBinding<'a>,
    workers: Vec<DigestedBinding<'a>>,
    max_turns: Quota,
    max_tasks: Quota,
    max_concurrent_tasks: u32,
    max_controls_per_turn: u32,
    stall_turns: Quota,
}

#[derive(Serialize)]
struct DigestedBinding<'a> {
    program: baton_run::Digest,
    budget: &'a Budget,
    capabilities: &'a Capabilities,
}

impl<'a> From<&'a Binding> for DigestedBinding<'a> {
    fn from(binding: &'a Binding) -> Self {
        DigestedBinding {
            program: binding.program.reference().digest,
            budget: &binding.budget,
            capabilities: &binding.capabilities,
        }
    }
}

/// Validates a configuration and binds the team as a program whose state
/// (its input, the working memory of turn 1) has the schema of `I` and
/// whose output has the schema of `O`.
///
/// Rejected: an invalid name or description, no workers, duplicate worker
/// names, a coordinator whose schemas are not exactly those of [`Turn`] and
/// [`Decision`], a finite zero `max_turns` (a deliberate choice over
/// failing the first turn at run time), and a zero `max_concurrent_tasks`
/// or `max_controls_per_turn`. A finite zero `max_tasks` is allowed and
/// forbids worker starts.
pub fn compile<I: schemars::JsonSchema, O: schemars::JsonSchema>(
    config: Config,
) -> Result<Program<I, O>, ConfigError> {
    let state_schema = Schema::of::<I>();
    let output_schema = Schema::of::<O>();
    let descriptor = Descriptor::new(
        &config.name,
        config.description.clone(),
        state_schema.clone(),
        output_schema.clone(),
    )?;
    if config.workers.is_empty() {
        return Err(ConfigError::NoWorkers);
    }
    let mut names = BTreeSet::new();
    for worker in &config.workers {
        let name = worker.program.descriptor().name();
        if !names.insert(name.clone()) {
            return Err(ConfigError::DuplicateWorker {
                name: name.to_string(),
            });
        }
    }
    let coordinator = config.coordinator.program.descriptor();
    if coordinator.input_schema() != &Schema::of::<Turn>() {
        return Err(ConfigError::CoordinatorContract {
            which: "input",
            expected: "Turn",
        });
    }
    if coordinator.output_schema() != &Schema::of::<Decision>() {
        return Err(ConfigError::CoordinatorContract {
            which: "output",
            expected: "Decision",
        });
    }
    if config.max_turns == Quota::Finite(0) {
        return Err(ConfigError::ZeroMaxTurns);
    }
    if config.max_concurrent_tasks == 0 {
        return Err(ConfigError::ZeroMaxConcurrentTasks);
    }
    if config.max_controls_per_turn == 0 {
        return Err(ConfigError::ZeroMaxControlsPerTurn);
    }
    if config.stall_turns == Quota::Finite(0) {
        return Err(ConfigError::ZeroStallTurns);
    }
    let configuration = configuration_digest(&Digested {
        name: &config.name,
        description: &config.description,
        state_schema: &state_schema,
        output_schema: &output_schema,
        coordinator: (&config.coordinator).into(),
        workers: config.workers.iter().map(Into::into).collect(),
        max_turns: config.max_turns,
        max_tasks: config.max_tasks,
        max_concurrent_tasks: config.max_concurrent_tasks,
        max_controls_per_turn: config.max_controls_per_turn,
        stall_turns: config.stall_turns,
    })
    .map_err(|error| ConfigError::Encode {
        message: error.to_string(),
    })?;
    let definition = team::Team::new(descriptor, config).map_err(|error| ConfigError::Encode {
        message: error.to_string(),
    })?;
    Ok(Program::new(ProgramConfig {
        definition: Arc::new(definition),
        dispatcher: None,
        implementation: implementation_digest(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        configuration,
    }))
}
