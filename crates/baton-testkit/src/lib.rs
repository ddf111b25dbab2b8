//! # baton-testkit: conformance suites and test doubles for Baton
//!
//! Owns what every implementation of a kernel contract is checked with:
//! [`definition_conformance`] for [`Definition`](baton_run::program::Definition)s, a [`ScriptedDispatcher`]
//! that counts how often each effect id was dispatched, a
//! [`FaultStore`] that cuts a store before or after the n-th commit of a
//! given record kind, as a crash would, [`store_conformance`], the suite
//! every [`Store`](baton_run::store::Store) implementation calls from its tests,
//! [`migrated_store_conformance`], what a store must keep of a database an
//! older build wrote, and
//! [`engine_conformance`], the engine's scenarios run on such a store, with
//! the test [`programs`] they drive, the strategies of the stable
//! toolchain's [`fuzz`] tests, and [`strict::check_openai_strict`],
//! OpenAI's published strict-mode schema rules as a checker for providers
//! that send strict schemas.
//!
//! Depend on it from tests (`[dev-dependencies]`). It knows only `baton-run`;
//! it knows nothing of particular strategies, providers or store backends.
//!
//! No cargo features.

mod conformance;
mod dispatcher;
mod engine;
mod fault;
pub mod fuzz;
mod inbox;
mod migration;
pub mod programs;
mod store;
pub mod strict;

pub use conformance::{ConformanceCase, definition_conformance};
pub use dispatcher::ScriptedDispatcher;
pub use engine::engine_conformance;
pub use fault::{Cut, FaultStore, start_into_crash};
pub use inbox::answer_across_engines;
pub use migration::{StoredTree, migrated_store_conformance, waiting_tree};
pub use store::{noise, store_conformance};
