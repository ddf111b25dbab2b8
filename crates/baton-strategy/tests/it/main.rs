//! The strategies' integration tests, one binary: one module per strategy
//! (happy paths, failure codes, coordinator conformance and crashes at
//! every commit), the shared roster rules, the message board, and random
//! plans.
#![allow(missing_docs)]

mod board;
mod common;
mod hierarchy;
mod parallel;
mod planner;
mod plans;
mod roster;
mod router;
mod sequential;
mod swarm;
