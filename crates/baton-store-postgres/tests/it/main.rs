//! The PostgreSQL store's integration tests, one binary: the store and
//! engine conformance kits, leases on the database's clock, the corruption
//! matrix, classified errors, change notices, what a start costs in
//! transactions, and the multi-process SIGKILL soak. Every test makes its
//! own databases (random names) on the server `BATON_TEST_POSTGRES` names
//! and drops them afterwards; a test fails, naming the variable, when the
//! server cannot be reached.
#![allow(missing_docs)]

mod conformance;
mod corruption;
mod errors;
mod inbox;
mod leases;
mod migration;
mod soak;
mod store;
mod support;
mod transactions;
