//! The SQLite store passes the store conformance suite, whichever thread
//! commits its writes.

use std::sync::atomic::{AtomicUsize, Ordering};

use baton_store_sqlite::{CommitOn, Creation, SqliteConfig, SqliteStore};

async fn conforms(commit_on: CommitOn) {
    let dir = tempfile::tempdir().expect("temp dir");
    let next = AtomicUsize::new(0);
    let fresh = || {
        let path = dir
            .path()
            .join(format!("store-{}.db", next.fetch_add(1, Ordering::Relaxed)));
        SqliteStore::open_with(
            path,
            SqliteConfig {
                creation: Creation::New,
                commit_on,
                ..SqliteConfig::default()
            },
        )
        .expect("creates")
    };
    baton_testkit::store_conformance(fresh).await;
}

/// The awaiting tasks commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_conforms() {
    conforms(CommitOn::Caller).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_conforms_committing_on_its_writer_thread() {
    conforms(CommitOn::WriterThread).await;
}

/// Tasks may not block in place here: the writer thread commits.
#[tokio::test(flavor = "current_thread")]
async fn sqlite_store_conforms_on_a_current_thread_runtime() {
    conforms(CommitOn::Caller).await;
}
