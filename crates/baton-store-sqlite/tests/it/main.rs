//! The SQLite store's integration tests, one binary: the store and engine
//! conformance kits, the corruption matrix and file fuzzing, and what only
//! a file-backed store can show.
#![allow(missing_docs)]

mod commits;
mod conformance;
mod corruption;
mod engine;
mod inbox;
mod sqlite;
