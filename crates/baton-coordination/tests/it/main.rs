//! The coordination programs' integration tests, one binary: the input gate,
//! first-success racing, deadlines and their definition conformance.
#![allow(missing_docs)]

mod common;
mod conformance;
mod deadline;
mod first_success;
mod gate;
mod input_with_timeout;
