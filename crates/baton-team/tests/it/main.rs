//! The team coordinator's integration tests, one binary: engine scenarios,
//! directly stepped definitions, policy identities, the policy's turn memo
//! and the wire schemas.
#![allow(missing_docs)]

mod common;
mod fuzz;
mod policy_identity;
mod policy_memo;
mod scenarios;
mod schemas;
mod stall;
mod steps;
