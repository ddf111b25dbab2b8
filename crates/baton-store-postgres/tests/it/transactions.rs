//! What a start costs in database transactions, as the server itself counts
//! them (`pg_stat_database.xact_commit` of the store's own database).

use std::sync::Arc;
use std::time::Duration;

use baton_testkit::programs::{Kind, engine, program, request};
use serde_json::json;

use crate::support::{Server, connect, server_url};

/// The transactions committed in database `name` once every connection to
/// it has closed. A backend reports its counts when it exits (an idle one
/// may hold them for up to ten seconds), so this waits for the database's
/// backends to be gone, then reads the count (from a connection to another
/// database, where the reading itself is counted) until three reads agree.
#[expect(
    clippy::disallowed_methods,
    reason = "the server's backends exit and report on their own time: nothing to await"
)]
async fn commits_after_exit(name: &str) -> i64 {
    let client = connect(&server_url()).await;
    for _ in 0..200 {
        let open: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                &[&name],
            )
            .await
            .expect("reads the server's activity")
            .get(0);
        if open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let read = || async {
        client
            .query_one(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = $1",
                &[&name],
            )
            .await
            .expect("reads the database's statistics")
            .get::<_, i64>(0)
    };
    let (mut last, mut same) = (read().await, 0);
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = read().await;
        same = if now == last { same + 1 } else { 0 };
        last = now;
        if same == 2 {
            return now;
        }
    }
    panic!("the transaction count of {name} never settled");
}

/// The transactions of one life of a store in a fresh database: opened, an
/// engine started on it, a first root, `roots` more roots, closed.
async fn transactions_of(server: &Server, roots: usize) -> i64 {
    let store = server.store();
    let name = store
        .target()
        .rsplit('/')
        .next()
        .expect("a database name")
        .to_owned();
    let echo = program(Kind::Echo, None);
    let engine = engine(Arc::new(store.clone()), &[&echo]);
    for n in 0..=roots {
        let handle = engine
            .start(&echo, request(&format!("root-{n}"), json!(n)))
            .await
            .expect("starts");
        assert_eq!(handle.output().await.expect("completes"), json!(n));
    }
    engine.close().await;
    drop(store);
    commits_after_exit(&name).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_root_that_ends_in_its_first_round_costs_one_database_transaction() {
    let server = Server::new();
    // The same life twice, once with five roots more: what the opening,
    // the engine and the closing cost is the same, so the difference is
    // what the five roots cost. (An engine that only ran trees which ended
    // in their first round listens to no notices: a delivered notice is a
    // transaction of the listening backend too.)
    let one = transactions_of(&server, 0).await;
    let six = transactions_of(&server, 5).await;
    assert_eq!(
        six - one,
        5,
        "five roots that end in their first round, five transactions ({one} and {six} in all)"
    );
}
