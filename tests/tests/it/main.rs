//! Workspace scenarios across several layers, one binary: the worked example,
//! teams with gates and steering, and the SIGKILL test.
#![allow(missing_docs)]

mod agent_example;
mod kill;
mod team_example;
mod team_gate;
mod team_steering;
