//! Classified errors: every way opening can fail is an `OpenError` that
//! converts to the right `StoreError` kind and says what to do next; a
//! database that is not a Baton store of this build is left untouched; a
//! connection killed during a commit reports nothing committed that is not,
//! and the tree verifies and recovers afterwards.

use std::sync::Arc;
use std::time::Duration;

use baton_run::store::{ListFilter, Store, StoreError};
use baton_run::{
    Engine, EngineConfig, Payload, RecoverOptions, RuntimeError, Scope, SignalError, SignalId,
    SignalReceipt, SignalRequest, Status,
};
use baton_store_postgres::{Creation, OpenError, PostgresConfig, PostgresStore, SCHEMA_VERSION};
use baton_testkit::programs::{Kind, SCOPE, open_wait, program, request};

use crate::support::{Server, connect, server_url, url_of};

fn open(url: &str, creation: Creation) -> Result<PostgresStore, OpenError> {
    PostgresStore::open_with(PostgresConfig {
        creation,
        connect_timeout: Duration::from_secs(2),
        ..PostgresConfig::new(url)
    })
}

/// The error's kind as the engine sees it, and its message.
fn classified(error: OpenError) -> (StoreError, String) {
    let message = error.to_string();
    (StoreError::from(error), message)
}

#[test]
fn a_bad_url_or_setting_is_refused_before_connecting() {
    for url in [
        "not a url at all",
        "postgres://user@host:99999/db",
        "postgres://h",
    ] {
        let error = open(url, Creation::ExistingOrNew).expect_err("refused");
        assert!(matches!(error, OpenError::Url { .. }), "{url}: {error:?}");
        let (kind, message) = classified(error);
        assert!(!kind.retryable(), "{url}: {kind}");
        assert!(
            message.contains("postgres://USER@HOST:PORT/DATABASE"),
            "{message}"
        );
    }
    let error = PostgresStore::open_with(PostgresConfig {
        max_batch: 0,
        ..PostgresConfig::new(server_url())
    })
    .expect_err("refused");
    assert!(
        matches!(
            error,
            OpenError::Config {
                field: "max_batch",
                ..
            }
        ),
        "{error:?}"
    );
    assert!(matches!(
        StoreError::from(error),
        StoreError::Refused { .. }
    ));
}

#[test]
fn an_unreachable_server_is_unavailable_and_retryable() {
    // Port 1 on the loopback: nothing listens there.
    let error = open(
        "postgres://postgres@127.0.0.1:1/postgres",
        Creation::Existing,
    )
    .expect_err("nothing listens on port 1");
    assert!(matches!(error, OpenError::Unreachable { .. }), "{error:?}");
    let (kind, message) = classified(error);
    assert!(kind.retryable(), "{kind}");
    assert!(message.contains("check that the server runs"), "{message}");
}

#[test]
fn an_unknown_database_or_role_is_refused_and_names_the_fix() {
    let _server = Server::new();
    let missing = url_of(&server_url(), "baton_no_such_database");
    let error = open(&missing, Creation::ExistingOrNew).expect_err("no database");
    assert!(matches!(error, OpenError::NoDatabase { .. }), "{error:?}");
    let (kind, message) = classified(error);
    assert!(matches!(kind, StoreError::Refused { .. }), "{kind}");
    assert!(
        message.contains("createdb baton_no_such_database"),
        "{message}"
    );

    let config = tokio_postgres::Config::from_str_checked(&server_url());
    let stranger = format!(
        "postgres://baton_no_such_role@{}/postgres",
        config.host_and_port()
    );
    let error = open(&stranger, Creation::ExistingOrNew).expect_err("no such role");
    assert!(matches!(error, OpenError::Login { .. }), "{error:?}");
    let (kind, message) = classified(error);
    assert!(matches!(kind, StoreError::Refused { .. }), "{kind}");
    assert!(message.contains("check the user and password"), "{message}");
}

/// Reads the server URL's host and port.
trait HostAndPort {
    fn from_str_checked(url: &str) -> tokio_postgres::Config;
    fn host_and_port(&self) -> String;
}

impl HostAndPort for tokio_postgres::Config {
    fn from_str_checked(url: &str) -> tokio_postgres::Config {
        url.parse().expect("a valid server URL")
    }

    fn host_and_port(&self) -> String {
        let host = match self.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            _ => "127.0.0.1".to_owned(),
        };
        format!(
            "{host}:{}",
            self.get_ports().first().copied().unwrap_or(5432)
        )
    }
}

/// The tables of the database at `url`, with their row counts.
async fn tables(url: &str) -> Vec<(String, i64)> {
    let client = connect(url).await;
    let names: Vec<String> = client
        .query(
            "SELECT relname::text FROM pg_class
             WHERE relnamespace = current_schema()::regnamespace AND relkind = 'r' ORDER BY 1",
            &[],
        )
        .await
        .expect("lists tables")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut counted = Vec::new();
    for name in names {
        let count: i64 = client
            .query_one(&format!("SELECT count(*) FROM {name}"), &[])
            .await
            .expect("counts")
            .get(0);
        counted.push((name, count));
    }
    counted
}

#[tokio::test]
async fn databases_that_are_not_a_store_of_this_build_are_refused_and_left_untouched() {
    let server = Server::new();

    // An empty database: no store unless creation is asked for.
    let empty = server.database();
    let error = open(&empty, Creation::Existing).expect_err("no store");
    assert!(matches!(error, OpenError::Missing { .. }), "{error:?}");
    assert!(error.to_string().contains("open_or_create"), "{error}");
    assert!(tables(&empty).await.is_empty(), "nothing was created");
    drop(open(&empty, Creation::New).expect("creates"));
    let error = open(&empty, Creation::New).expect_err("a store is there");
    assert!(matches!(error, OpenError::Exists { .. }), "{error:?}");
    drop(open(&empty, Creation::Existing).expect("opens the store"));

    // Another application's database.
    let foreign = server.database();
    connect(&foreign)
        .await
        .batch_execute("CREATE TABLE notes (text text); INSERT INTO notes VALUES ('hi');")
        .await
        .expect("creates");
    let before = tables(&foreign).await;
    for creation in [Creation::Existing, Creation::New, Creation::ExistingOrNew] {
        let error = open(&foreign, creation).expect_err("refused");
        match &error {
            OpenError::Foreign { tables, .. } => assert_eq!(tables, "notes"),
            other => panic!("{creation:?}: {other:?}"),
        }
        assert!(matches!(
            StoreError::from(error),
            StoreError::Refused { .. }
        ));
    }
    assert_eq!(tables(&foreign).await, before, "left untouched");

    // A table named like ours that is someone else's marker.
    let lookalike = server.database();
    connect(&lookalike)
        .await
        .batch_execute(
            "CREATE TABLE baton_schema (application text, version integer);
                        INSERT INTO baton_schema VALUES ('other', 1);",
        )
        .await
        .expect("creates");
    let error = open(&lookalike, Creation::ExistingOrNew).expect_err("refused");
    assert!(matches!(error, OpenError::Foreign { .. }), "{error:?}");

    // A store of a newer schema.
    let future = server.database();
    drop(open(&future, Creation::New).expect("creates"));
    connect(&future)
        .await
        .execute(
            "UPDATE baton_schema SET version = $1::bigint",
            &[&(SCHEMA_VERSION + 1)],
        )
        .await
        .expect("updates");
    let before = tables(&future).await;
    let error = open(&future, Creation::ExistingOrNew).expect_err("refused");
    match &error {
        OpenError::NewerSchema {
            found, supported, ..
        } => assert_eq!((*found, *supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION)),
        other => panic!("unexpected {other:?}"),
    }
    assert!(error.to_string().contains("upgrade Baton"), "{error}");
    assert_eq!(tables(&future).await, before, "left untouched");
}

#[tokio::test]
async fn tables_dropped_under_a_running_store_are_a_refusal_that_says_what_to_do() {
    let server = Server::new();
    let store = server.store();
    let url = url_of(
        &server_url(),
        store.target().rsplit('/').next().expect("a name"),
    );
    connect(&url)
        .await
        .batch_execute("DROP TABLE baton_records")
        .await
        .expect("drops");
    let tree = baton_run::ProcessId::root(&baton_run::StartId::new(SCOPE, "x").expect("valid"));
    let error = store
        .acquire(baton_run::store::AcquireRequest {
            tree,
            owner: "a".into(),
            now: baton_run::Timestamp(0),
            ttl: Duration::from_secs(1),
            force: false,
        })
        .await
        .expect_err("the records table is gone");
    assert!(matches!(error, StoreError::Refused { .. }), "{error}");
    assert!(!error.retryable());
    assert!(error.to_string().contains("dropped or altered"), "{error}");
}

fn answer(id: &str, wait: baton_run::WaitId, value: bool) -> SignalRequest {
    SignalRequest {
        id: SignalId::new(id).expect("valid"),
        wait: Some(wait),
        payload: Payload::encode(&value).expect("encodes"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_killed_during_a_commit_reports_nothing_committed_and_the_tree_recovers() {
    let server = Server::new();
    let store = server.store();
    let url = url_of(
        &server_url(),
        store.target().rsplit('/').next().expect("a name"),
    );
    let scope = Scope::new(SCOPE).expect("valid");
    let ask = program(Kind::Ask, None);
    // Awake, so the answer's first write is its commit (a sleeping tree
    // renews its lease first, and a failed renewal is only retried).
    let engine = Engine::new(EngineConfig {
        programs: vec![ask.erase()],
        sleep: baton_run::Sleep::Awake,
        ..EngineConfig::new(Arc::new(store.clone()))
    })
    .expect("the engine configuration is valid");
    let handle = engine
        .start(&ask, request("killed", "q"))
        .await
        .expect("starts");
    let wait = open_wait(&handle).await;
    let tree = handle.tree();
    let before = store.records(tree).await.expect("reads");

    // Hold the tree's row, so the writer's commit of the answer waits
    // inside its transaction; then kill the writer's connection there.
    let mut blocker = connect(&url).await;
    let hold = blocker.transaction().await.expect("begins");
    hold.execute(
        "SELECT 1 FROM baton_trees WHERE id = $1 FOR UPDATE",
        &[&tree.to_string()],
    )
    .await
    .expect("locks the row");
    let signal = {
        let handle = handle.clone();
        tokio::spawn(async move { handle.signal(answer("yes", wait, true)).await })
    };
    let admin = connect(&url).await;
    let killed = loop {
        let rows = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'baton:writer'
                   AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .expect("queries");
        if rows.iter().any(|row| row.get::<_, bool>(0)) {
            break true;
        }
        tokio::task::yield_now().await;
    };
    assert!(killed);
    hold.rollback().await.expect("releases the row");

    let outcome = signal.await.expect("the signal task");
    match &outcome {
        Err(SignalError::Stopped(RuntimeError::Storage { error, .. })) => {
            assert!(error.retryable(), "a lost connection is retryable: {error}");
            assert!(matches!(error, StoreError::Unavailable { .. }), "{error}");
            assert!(
                error
                    .to_string()
                    .contains("nothing of this call is reported committed"),
                "{error}"
            );
        }
        other => panic!("the killed commit was reported as {other:?}"),
    }
    assert!(matches!(
        handle.await_result().await,
        Err(RuntimeError::Storage { .. })
    ));
    // Nothing of the killed commit is in the database.
    assert_eq!(store.records(tree).await.expect("reads again"), before);

    // The store connects again; the tree verifies, is taken up and finishes.
    drop(handle);
    drop(engine);
    let engine = Engine::new(EngineConfig {
        programs: vec![ask.erase()],
        ..EngineConfig::new(Arc::new(store.clone()))
    })
    .expect("the engine configuration is valid");
    let checked = engine.verify(&scope, tree).await.expect("verifies");
    assert_eq!(checked.head_seq, before.len() as u64);
    let report = engine
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    assert!(
        report.iter().all(|(_, result)| result.is_ok()),
        "{report:?}"
    );
    let taken = engine
        .process::<Payload>(&scope, tree)
        .await
        .expect("taken up");
    assert_eq!(
        taken.signal(answer("yes", wait, true)).await,
        Ok(SignalReceipt::Admitted)
    );
    assert_eq!(
        taken.await_result().await.expect("completes").status(),
        Status::Completed
    );
    assert!(engine.verify(&scope, tree).await.is_ok());
    let listed = store.list(ListFilter::default()).await.expect("lists");
    assert_eq!(listed.trees.len(), 1);
}
