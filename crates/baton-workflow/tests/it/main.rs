//! The workflow stages' integration tests, one binary: configuration rules,
//! definition conformance, stages run under the engine and activities.
#![allow(missing_docs)]

mod activity;
mod common;
mod config;
mod conformance;
mod workflow;
