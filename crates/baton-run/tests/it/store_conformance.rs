//! The memory store passes the store conformance suite.

use baton_run::MemoryStore;

#[tokio::test]
async fn memory_store_conforms() {
    baton_testkit::store_conformance(MemoryStore::new).await;
}
