//! Answers across engines on one SQLite file through two handles (two
//! connections): the holder learns of the posted answer from the file's
//! `data_version`, not from a notice of its own handle.

use std::sync::Arc;

use baton_store_sqlite::SqliteStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_through_another_handle_is_applied_by_the_holding_engine() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("shared.db");
    let holder = SqliteStore::create(&path).expect("creates");
    let other = SqliteStore::open(&path).expect("opens");
    baton_testkit::answer_across_engines(Arc::new(holder), Arc::new(other)).await;
}
