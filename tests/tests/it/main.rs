//! Workspace scenarios across several layers, one binary: the worked example,
//! the research team, a team's decision in strict mode, teams with gates and
//! steering, the strategy scenarios, and the SIGKILL tests (the kernel's,
//! many short roots', the strategies' and an MCP call's).
#![allow(missing_docs)]

mod agent_example;
mod kill;
mod mcp_example;
mod mcp_kill;
mod research_team;
mod short_kill;
mod strategy_examples;
mod strategy_kill;
mod strict_decision;
mod team_example;
mod team_gate;
mod team_steering;
