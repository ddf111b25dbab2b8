//! Answers across engines on one database through two store handles (two
//! sets of connections, as two machines would have): the holder learns of
//! the posted answer only from `NOTIFY` (its engine re-reads its inbox on
//! no timer while the store sends notices, and its lease outlives the test),
//! applies it and settles it; the poster learns of the settlement the same
//! way. Then a holder that never applies makes the answer time out queued,
//! and the engine that takes the tree over applies it. A stale holder's
//! settlement is fenced (the store kit's inbox case, run on PostgreSQL by
//! `conformance.rs`).

use std::sync::Arc;

use baton_store_postgres::{Creation, PostgresConfig, PostgresStore};

use crate::support::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_given_through_another_engine_is_applied_by_the_holding_engine() {
    let server = Server::new();
    let url = server.database();
    let open = |creation| {
        PostgresStore::open_with(PostgresConfig {
            creation,
            read_connections: 2,
            ..PostgresConfig::new(url.clone())
        })
        .expect("opens")
    };
    let holder = open(Creation::New);
    let other = open(Creation::Existing);
    baton_testkit::answer_across_engines(Arc::new(holder), Arc::new(other)).await;
}
