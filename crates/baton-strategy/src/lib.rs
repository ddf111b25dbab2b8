//! # baton-strategy: ready-made team strategies and the message board
//!
//! Owns six strategies, each a coordinator over the team of `baton-team`,
//! so every one inherits the log, budgets, cancellation, limits and
//! inspection of a team:
//!
//! - [`sequential`]: agents in order, each given the task and the previous
//!   output; the first failure stops the team, naming the agent;
//! - [`parallel`]: every agent on the same input under a concurrency limit,
//!   an [`ErrorMode`](parallel::ErrorMode) (`FailFast`, `Collect`,
//!   `BestEffort`) and a merge (a pure function or a model);
//! - [`router`]: one agent per task, by a pure function, by capability
//!   scoring with a declared tie-break, or by a model answering
//!   `{"agent_id": …}`;
//! - [`planner`]: a model plans tasks with dependencies, the plan is
//!   validated whole before anything starts, tasks start once their
//!   dependencies completed, failures lead to bounded re-planning, and the
//!   model synthesises the answer;
//! - [`swarm`]: agents hand the conversation to each other with generated
//!   `transfer_to_<agent>` tools, within `max_handoffs`;
//! - [`hierarchy`]: supervisors over workers and sub-teams to any depth,
//!   every delegated child running.
//!
//! The vocabulary they share is defined once: the roster's [`Agent`]s
//! (id, name, description, capabilities, and how each is run), what an
//! agent is given ([`AgentInput`]) and how it ended ([`AgentResult`]),
//! pure functions with their build identity ([`Pure`]), model-backed parts
//! ([`ModelConfig`]), the team's working state ([`Work`]), and the
//! message [`board`] between agents: durable, ordered, delivered as signals
//! at safe boundaries, and readable from a tree with [`board::history`].
//!
//! Each strategy is a `Config` validated once by its constructor, and
//! binds as a `Program<Work, Output>`. Every coordinator is one
//! [`Policy`](baton_team::Policy) whose decisions are a pure function of
//! the team's turn: the strategy's progress is the team's task list, never
//! a second record. Failures a caller reacts to carry stable codes
//! `strategy.<name>.<suffix>` (the constants of each module, and
//! [`ConfigError::code`]). See `docs/guides/choosing-a-strategy.md`.
//!
//! ```
//! use std::sync::Arc;
//!
//! use baton_agent::{Response, ScriptedModel};
//! use baton_run::{Engine, EngineConfig, MemoryStore, StartId, StartRequest};
//! use baton_strategy::sequential::SequentialOutput;
//! use baton_strategy::{Agent, ModelConfig, Sequential, SequentialConfig, Work};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Two chat agents on a scripted model that answers with the last user
//! // message, tagged.
//! let model = ScriptedModel::new("tagger", |request| {
//!     let last = request.messages().last().map(|m| m.text()).unwrap_or_default();
//!     let last = last.rsplit('\n').next().unwrap_or_default().to_owned();
//!     Ok(Response::text(format!("[{last}]")))
//! });
//! let config = ModelConfig::new(Arc::new(model));
//! let team = Sequential::new(SequentialConfig {
//!     name: "docs.tagging".into(),
//!     description: "Tag twice.".into(),
//!     agents: vec![
//!         Agent::model("first", "Tags.", "You tag.", &config)?,
//!         Agent::model("second", "Tags again.", "You tag again.", &config)?,
//!     ],
//!     input: None,
//! })?;
//! let engine = Engine::new(EngineConfig {
//!     programs: vec![team.program().erase()],
//!     ..EngineConfig::new(Arc::new(MemoryStore::new()))
//! })?;
//! let output: SequentialOutput = tokio::runtime::Runtime::new()?.block_on(async {
//!     let request = StartRequest::new(StartId::new("docs", "tagging")?, Work::new("notes")?);
//!     let handle = engine.start(&team.program(), request).await?;
//!     Ok::<_, Box<dyn std::error::Error>>(handle.output().await?)
//! })?;
//! // The second agent was given the first one's output.
//! assert_eq!(output.output.decode::<String>()?, "[[notes]]");
//! # Ok(())
//! # }
//! ```
//!
//! Depend on it (or on the facade's `baton::strategy`) to run a strategy.
//! It depends on `baton-run`, `baton-team`, `baton-agent` (model-backed
//! parts) and `baton-workflow` (the adapters' stages). It knows nothing of
//! stores, of the command line or of particular providers: models are
//! `ChatModel`s and agents are programs.
//!
//! No cargo features.

pub mod board;
mod driver;
mod error;
pub mod hierarchy;
mod model;
pub mod parallel;
pub mod planner;
mod pure;
mod roster;
pub mod router;
pub mod sequential;
pub mod swarm;

pub use board::{Board, BoardMessage, Post, Posted, Recipient};
pub use driver::Work;
pub use error::ConfigError;
pub use model::ModelConfig;
pub use pure::Pure;
pub use roster::{
    Agent, AgentCard, AgentId, AgentInput, AgentKind, AgentResult, Contribution, Outcome,
};

pub use hierarchy::{Hierarchy, HierarchyConfig};
pub use parallel::{Parallel, ParallelConfig};
pub use planner::{Planner, PlannerConfig};
pub use router::{Router, RouterConfig};
pub use sequential::{Sequential, SequentialConfig};
pub use swarm::{Swarm, SwarmConfig};
