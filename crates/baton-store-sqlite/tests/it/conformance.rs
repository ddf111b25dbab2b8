//! The SQLite store passes the store conformance suite.

use std::sync::atomic::{AtomicUsize, Ordering};

use baton_store_sqlite::SqliteStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_conforms() {
    let dir = tempfile::tempdir().expect("temp dir");
    let next = AtomicUsize::new(0);
    let fresh = || {
        let path = dir
            .path()
            .join(format!("store-{}.db", next.fetch_add(1, Ordering::Relaxed)));
        SqliteStore::create(path).expect("creates")
    };
    baton_testkit::store_conformance(fresh).await;
}
