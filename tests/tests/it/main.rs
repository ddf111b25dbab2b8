//! Workspace scenarios across several layers, one binary: the worked example,
//! the research team, a team's decision in strict mode, teams with gates and
//! steering, and the SIGKILL test.
#![allow(missing_docs)]

mod agent_example;
mod kill;
mod research_team;
mod strict_decision;
mod team_example;
mod team_gate;
mod team_steering;
