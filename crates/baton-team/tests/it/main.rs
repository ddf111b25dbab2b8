//! The team coordinator's integration tests, one binary: engine scenarios,
//! directly stepped definitions, the policy's turn memo and the wire schemas.
#![allow(missing_docs)]

mod common;
mod policy_memo;
mod scenarios;
mod schemas;
mod steps;
