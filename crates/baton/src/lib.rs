//! # Baton: durable, budgeted multi-agent work
//!
//! This is the facade. It owns no logic: it re-exports each Baton layer
//! under one namespaced module, so every concept has exactly one public
//! path (`baton::run::Engine`, `baton::run::Program`, ...). Applications
//! depend on this crate. Implementors of a contract (a store backend, a
//! dispatcher for a new kind of effect) may depend on the lower crate
//! directly.
//!
//! ## Layers
//!
//! | module | crate | what it holds |
//! | --- | --- | --- |
//! | [`run`] | `baton-run` | the run kernel: programs, effects, signals, the log, stores, budgets, the engine |
//! | [`workflow`] | `baton-workflow` | workflow stages as one program: transform, call, switch, fork, map, loop; activities (async functions as programs) |
//! | [`coordination`] | `baton-coordination` | an input gate, first-success racing, deadlines with a timer dispatcher |
//! | [`agent`] | `baton-agent` | chat types, the model trait, typed output, the model-backed interaction, tools, the adapter, a scripted model, providers |
//! | [`team`] | `baton-team` | the team coordinator: a coordinator program turns each `Turn` into a `Decision` over worker tasks |
//! | [`strategy`] | `baton-strategy` | ready-made team strategies (sequential, parallel, router, planner, swarm, hierarchy) and the message board between agents |
//! | [`store`] | `baton-store-*` | durable store backends: [`store::sqlite`] (`baton-store-sqlite`, the embedded default) and `store::postgres` (`baton-store-postgres`, shared by engines on several machines) |
//!
//! The in-memory store stays where the contract is, at `baton::run::MemoryStore`.
//!
//! ## Features
//!
//! - `sqlite` (default): the embedded durable store, `baton::store::sqlite`.
//! - `postgres`: the shared durable store on PostgreSQL,
//!   `baton::store::postgres`, for many engines on many machines (leases on
//!   the database's clock, change notices).
//! - `openai` (default): the OpenAI-compatible Chat Completions provider,
//!   `baton::agent::openai`.
//! - `anthropic` (default): the Anthropic Messages API provider,
//!   `baton::agent::anthropic` (the same HTTP client as `openai`).
//! - `mcp`: Model Context Protocol servers' tools as durable, budgeted
//!   tools, `baton::agent::mcp` (the official SDK rmcp).
//!
//! ## The model in one page
//!
//! **Programs are deterministic state machines.** A
//! [`Definition`](run::program::Definition) is immutable behaviour: a
//! [`Descriptor`](run::program::Descriptor) (a lowercase dotted name and JSON Schemas
//! for input, output and unaddressed signals), a way to `start` an
//! [`Execution`](run::program::Execution) from an input, and a way to `restore` one
//! from a recorded [`ExecutionState`](run::program::ExecutionState). An execution is
//! the private state of one process. Its `step` receives the whole
//! unconsumed part of its mailbox (its *window*) and returns one
//! [`Transition`](run::program::Transition): `Continue` with effects, `Wait` for an
//! addressed answer, `Complete` with an output, or `Fail`; each says how
//! many leading signals it consumed. A step does no I/O and gets no clock.
//! Before a step's new state is adopted, the engine snapshots it and
//! restores it through the definition, and keeps the restored instance, so
//! a state that cannot round-trip is refused instead of being lost in a
//! crash.
//!
//! **Effects are declared, not performed.** A step returns
//! [`Effect`](run::program::Effect)s and the engine carries them out in declaration
//! order. `Effect::Wait` opens an external wait that the host answers;
//! `Effect::Dispatch` sends an opaque request (a model call, a timer, a
//! tool) to the program's [`Dispatcher`](run::dispatch::Dispatcher). Once every
//! effect of a transition has settled, their results come back as
//! [`Signal`](run::program::Signal)s in declaration order: a wait arrives as
//! `SignalBody::WaitOpened` carrying its [`WaitId`](run::WaitId), a dispatch
//! as `SignalBody::Settled`. Host input arrives as `SignalBody::Input`,
//! addressed to a wait (an answer, validated against the wait's answer
//! schema) or unaddressed (validated against the descriptor's signal
//! schema, which rejects everything by default). Only an addressed answer
//! releases a wait.
//!
//! **The log is written before anything acts.** Every tree (a root process
//! and its descendants) has one append-only, hash-chained log of facts. The
//! engine commits a record and only then acts on it: a dispatch's pending
//! record is durable before the dispatcher is called, a settlement before
//! the process sees it, a host signal before it is acknowledged. Recovery
//! folds the records after the latest snapshot and restores each execution
//! from its recorded state; it never re-runs a step.
//!
//! **Budgets only shrink.** A [`Budget`](run::Budget) limits steps,
//! effects, signals and named meters (such as `tokens`). Everything is
//! charged before the work starts, and running out is a classified
//! [`Failure`](run::Failure) such as `engine.limit.steps`, never a hang.
//!
//! **Uncertain effects are never silently repeated.** A dispatch found
//! pending after a crash is sent again under the same
//! [`EffectId`](run::EffectId) only if its dispatcher's
//! [`ReplayPolicy`](run::dispatch::ReplayPolicy) is `SameIdentity`. Otherwise it
//! settles as *unknown*, its process parks (`needs_attention`), and the
//! host resolves it with a settlement or explicitly replays it.
//!
//! **Scopes.** A root is named by a [`StartId`](run::StartId): a tenant
//! [`Scope`](run::Scope) and a key. Its process id is derived from both, so
//! starting the same id again with the same program and input returns the
//! same process, and every engine call that looks a tree up checks the
//! caller's scope.
//!
//! **The engine** ([`Engine`](run::Engine)) runs trees on tokio, one owner
//! task per tree, over a [`Store`](run::store::Store): in memory
//! ([`MemoryStore`](run::MemoryStore)) or durable on disk
//! (`baton::store::sqlite::SqliteStore`, one SQLite file). A [`Program`](run::Program) binds a
//! definition to its dispatcher and to digests of its implementation and
//! configuration; `engine.start` returns a
//! [`ProcessHandle`](run::ProcessHandle) to signal, cancel, kill, inspect
//! and await the process.
//!
//! ## Example: a program that asks for approval
//!
//! The program opens one external wait, sleeps until the host answers it,
//! and completes with the answer.
//!
//! ```
//! use std::sync::Arc;
//!
//! use baton::run::program::{
//!     Definition, Descriptor, Effect, Execution, ExecutionState, ProgramConfig, Schema, Signal,
//!     SignalBody, StepError, Transition, configuration_digest, implementation_digest,
//! };
//! use baton::run::{
//!     ChildKey, Condition, Engine, EngineConfig, MemoryStore, Payload, Program, SignalId,
//!     SignalRequest, StartId, StartRequest, WaitId,
//! };
//! use serde::{Deserialize, Serialize};
//!
//! /// The behaviour: immutable, shared by every process of the program.
//! struct Approval {
//!     descriptor: Descriptor,
//! }
//!
//! /// Everything a process remembers between steps; recorded after every step.
//! #[derive(Serialize, Deserialize)]
//! struct State {
//!     input: String,
//!     asked: bool,
//!     wait: Option<WaitId>,
//! }
//!
//! struct Run(State);
//!
//! impl Definition for Approval {
//!     fn descriptor(&self) -> &Descriptor {
//!         &self.descriptor
//!     }
//!
//!     fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
//!         let state = State {
//!             input: input.decode()?,
//!             asked: false,
//!             wait: None,
//!         };
//!         Ok(Box::new(Run(state)))
//!     }
//!
//!     fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
//!         Ok(Box::new(Run(state.decode()?)))
//!     }
//! }
//!
//! impl Execution for Run {
//!     fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
//!         let state = &mut self.0;
//!         if !state.asked {
//!             // Declare the wait; the engine opens it and reports its id.
//!             state.asked = true;
//!             let ask = Effect::Wait {
//!                 key: ChildKey::new("approval").map_err(StepError::other)?,
//!                 request: Payload::encode(&format!("approve {}?", state.input))?,
//!                 answer_schema: Schema::of::<bool>(),
//!             };
//!             return Ok(Transition::Continue {
//!                 consumed: 0,
//!                 effects: vec![ask],
//!             });
//!         }
//!         let Some(signal) = window.first() else {
//!             return Err(StepError::other("stepped without a signal"));
//!         };
//!         match &signal.body {
//!             // The wait is open: sleep until an answer addressed to it arrives.
//!             SignalBody::WaitOpened { wait, .. } => {
//!                 state.wait = Some(*wait);
//!                 Ok(Transition::Wait {
//!                     consumed: 1,
//!                     wait: *wait,
//!                 })
//!             }
//!             // The answer, already validated against the answer schema.
//!             SignalBody::Input { payload } if signal.wait.is_some() && signal.wait == state.wait => {
//!                 let answer: bool = payload.decode()?;
//!                 let output = Payload::encode(&format!("{}: approved={answer}", state.input))?;
//!                 Ok(Transition::Complete {
//!                     consumed: 1,
//!                     output,
//!                 })
//!             }
//!             _ => Err(StepError::other("unexpected signal")),
//!         }
//!     }
//!
//!     fn snapshot(&self) -> Result<ExecutionState, StepError> {
//!         ExecutionState::encode(&self.0)
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let program = Program::<String, String>::new(ProgramConfig {
//!         definition: Arc::new(Approval {
//!             descriptor: Descriptor::typed::<String, String>(
//!                 "example.approval",
//!                 "Asks a person to approve a job.",
//!             )?,
//!         }),
//!         dispatcher: None,
//!         implementation: implementation_digest(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
//!         configuration: configuration_digest(&())?,
//!     });
//!     let engine = Engine::new(EngineConfig {
//!         programs: vec![program.erase()],
//!         ..EngineConfig::new(Arc::new(MemoryStore::new()))
//!     })?;
//!     let start = StartRequest::new(StartId::new("acme", "job-1")?, "deploy".to_string());
//!     let handle = engine.start(&program, start).await?;
//!
//!     // The wait opens once the tree's task has stepped and committed: await
//!     // that moment (it also resolves if the tree can no longer open a wait).
//!     let view = handle.until(Condition::WaitOpened).await?;
//!     let wait = view
//!         .root()
//!         .open_waits
//!         .first()
//!         .ok_or("the approval wait never opened")?
//!         .id;
//!
//!     handle
//!         .signal(SignalRequest {
//!             id: SignalId::new("answer-1")?,
//!             wait: Some(wait),
//!             payload: Payload::encode(&true)?,
//!         })
//!         .await?;
//!     assert_eq!(handle.output().await?, "deploy: approved=true");
//!     Ok(())
//! }
//! ```
//!
//! The same program runs as `cargo run -p baton-examples --example approval`.
//! `docs/concepts.md` explains each idea at more length and
//! `docs/architecture.md` maps the crates.

#[doc(inline)]
pub use baton_run as run;

#[doc(inline)]
pub use baton_workflow as workflow;

#[doc(inline)]
pub use baton_coordination as coordination;

#[doc(inline)]
pub use baton_agent as agent;

#[doc(inline)]
pub use baton_team as team;

#[doc(inline)]
pub use baton_strategy as strategy;

/// Durable store backends, each behind its cargo feature. The store
/// contract and the in-memory store are in [`run`] (`baton::run::store::Store`,
/// `baton::run::MemoryStore`).
pub mod store {
    #[cfg(feature = "sqlite")]
    #[doc(inline)]
    pub use baton_store_sqlite as sqlite;

    #[cfg(feature = "postgres")]
    #[doc(inline)]
    pub use baton_store_postgres as postgres;
}

/// The README's library example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
