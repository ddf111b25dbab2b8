//! The kernel's integration tests, one binary: engine behaviour, recovery,
//! trees, limits, stores, payloads, schemas and the payload writer.
#![allow(missing_docs)]

mod conformance;
mod engine;
mod fuzz;
mod hosting;
mod limits;
mod payload;
mod pipeline;
mod recovery;
mod retry;
mod schema;
mod store;
mod store_conformance;
mod trees;
mod versions;
mod writer;
