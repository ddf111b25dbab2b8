//! # baton-examples: the runnable examples of Baton
//!
//! Owns the examples as library modules, so that the `baton` command line
//! (`baton demo`), the workspace tests and the thin binaries under
//! `examples/` run the very same programs:
//!
//! - [`team_review`]: the worked example of the team specification, a
//!   model-backed coordinator with an input gate and a reviewer workflow;
//! - [`approval`]: a program written from scratch that waits for a person's
//!   answer, the program of the facade's crate documentation;
//! - [`pipeline`]: a workflow of two pure stages on the embedded SQLite store;
//! - [`input_with_timeout`]: an input gate racing a deadline inside
//!   `FirstSuccess`, under a manual clock;
//! - [`research_team`]: a model coordinator and a researcher agent whose
//!   tools touch the world (an HTTP search, a file write), offline on
//!   scripted models or on a real provider from the conventional variables.
//! - [`mcp_tools`]: an interaction whose tools come from the reference
//!   Model Context Protocol server over stdio, each call a budgeted effect;
//! - [`pause`]: the pause scenario of `baton demo --pause`, a team that
//!   waits for a person's instruction (also driven through the HTTP API);
//! - [`strategies`]: one scenario per team strategy (sequential, parallel,
//!   router, planner, swarm, hierarchy) on scripted models, each ending in
//!   one result line.
//!
//! Run one with `cargo run -p baton-examples --example NAME`. Each module's
//! `run` returns the lines its binary prints.
//!
//! Depends on the `baton` facade only, as an application would; the
//! command line, the workspace tests and the benchmarks may depend on it,
//! no library does. Not published. No cargo features.

pub mod approval;
pub mod input_with_timeout;
pub mod mcp_tools;
pub mod pause;
pub mod pipeline;
pub mod research_team;
pub mod strategies;
pub mod team_review;
