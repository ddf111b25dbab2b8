//! Two hosts on one store: an answer sent to the host that does not hold
//! the tree is forwarded through the tree's inbox to the one that does, and
//! answered with the same receipt a local answer gets.

use std::sync::Arc;
use std::time::Duration;

use baton::run::MemoryStore;
use baton::run::store::Store;

use crate::support::{Running, TOKEN_A, TOKEN_B, config, open_wait};

const PAUSE: &str = r#"{"program":"demo.pause","id":"held","input":"release 5.0"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_sent_to_another_host_is_applied_by_the_host_holding_the_tree() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    // Neither host's takeover scan runs during the test: only the store's
    // notices move the answer between them.
    let hour = Some(Duration::from_secs(3600));
    let holder = Running::start(baton_server::ServeConfig {
        scan: hour,
        ..config(store.clone())
    })
    .await;
    let other = Running::start(baton_server::ServeConfig {
        scan: hour,
        ..config(store.clone())
    })
    .await;
    let started = holder
        .post(
            "/v1/trees?until=wait_opened&timeout_ms=20000",
            TOKEN_A,
            PAUSE,
        )
        .await;
    assert_eq!(started.status, 201, "{}", started.text);
    let tree = started.json["tree"].as_str().unwrap().to_owned();
    let wait = open_wait(&started.json["view"]);

    // Another scope's token sees no such tree, as on the holding host.
    let hidden = other
        .post(&format!("/v1/trees/{tree}/waits/{wait}"), TOKEN_B, r#""x""#)
        .await;
    assert_eq!(hidden.status, 404, "{}", hidden.text);

    let answered = other
        .post(
            &format!("/v1/trees/{tree}/waits/{wait}"),
            TOKEN_A,
            r#""ship it""#,
        )
        .await;
    assert_eq!(answered.status, 200, "{}", answered.text);
    assert_eq!(answered.json["receipt"], "admitted", "{}", answered.text);

    let done = holder
        .get(
            &format!("/v1/trees/{tree}?until=terminal&timeout_ms=20000"),
            TOKEN_A,
        )
        .await;
    assert_eq!(done.status, 200, "{}", done.text);
    assert_eq!(done.json["status"], "done", "{}", done.text);

    let again = other
        .post(
            &format!("/v1/trees/{tree}/waits/{wait}"),
            TOKEN_A,
            r#""ship it""#,
        )
        .await;
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.json["receipt"], "duplicate");
    holder.stop().await;
    other.stop().await;
}
