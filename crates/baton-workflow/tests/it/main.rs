//! The workflow stages' integration tests, one binary: configuration rules,
//! definition conformance and stages run under the engine.
#![allow(missing_docs)]

mod common;
mod config;
mod conformance;
mod workflow;
