//! The store and engine conformance kits on PostgreSQL.
//!
//! The store kit moves time by hand through its requests' `now`, so it runs
//! on a store whose leases follow the requests' clock
//! (`LeaseClock::Requests`); everything else in it (compare-and-swap,
//! fencing, snapshots, listing, the crash matrix) is the same code as on
//! the database's clock, which `leases.rs` checks on its own. The engine
//! kit runs on the default store, leases on the database's clock.

use crate::support::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_store_conforms() {
    let server = Server::new();
    baton_testkit::store_conformance(|| server.store_on_request_clock()).await;
}

#[tokio::test]
async fn the_engine_conforms_on_the_postgres_store() {
    let server = Server::new();
    baton_testkit::engine_conformance(|| server.store()).await;
}
