//! Workspace scenarios across several layers, one binary: the worked example,
//! teams with gates and steering, the strategy scenarios, and the SIGKILL
//! tests (the kernel's and the strategies').
#![allow(missing_docs)]

mod agent_example;
mod kill;
mod strategy_examples;
mod strategy_kill;
mod team_example;
mod team_gate;
mod team_steering;
