//! Program versions: a tree keeps the exact version it started with, new
//! starts by name take the newest, and a tree whose version is not
//! registered is refused with what differs and what to register.

use std::sync::Arc;

use baton_run::{
    Engine, EngineConfig, IdentityPart, Labels, MemoryStore, Name, Payload, ProcessHandle, Program,
    RecoverOptions, Scope, StartRequest, Status, TreeError, TreeId, VersionMismatch, Visibility,
};
use baton_testkit::programs::{
    Kind, SCOPE, engine, open_wait, program, program_version, request, start_id,
};
use serde_json::{Value, json};

fn scope() -> Scope {
    Scope::new(SCOPE).expect("valid")
}

fn ask(build: &str, setting: Value) -> Program<Value, Value> {
    program_version(Kind::Ask, None, build, &setting)
}

/// Starts an `Ask` tree of `version` on `store` and leaves it waiting for
/// its answer, its lease released.
async fn waiting_tree(store: Arc<MemoryStore>, version: &Program<Value, Value>) -> TreeId {
    let engine = engine(store, &[version]);
    let handle = engine
        .start(version, request("versioned", "proceed?"))
        .await
        .expect("starts");
    open_wait(&handle).await;
    engine.close().await;
    handle.tree()
}

/// The refusal an engine with `registered` gives the tree.
async fn refusal(
    store: Arc<MemoryStore>,
    tree: TreeId,
    registered: &[&Program<Value, Value>],
) -> TreeError {
    let engine = engine(store, registered);
    let error = match engine.process::<Value>(&scope(), tree).await {
        Ok(_) => panic!("the tree was taken up without its version"),
        Err(error) => error,
    };
    assert_eq!(error.code(), "engine.program.unavailable", "{error}");
    // Recovery reports the same and leaves the tree alone.
    let report = engine
        .recover(RecoverOptions::default())
        .await
        .expect("recovers");
    assert_eq!(report.len(), 1);
    assert_eq!(report[0].1.as_ref().err(), Some(&error));
    engine.close().await;
    error
}

fn mismatch(error: &TreeError) -> &VersionMismatch {
    match error {
        TreeError::ProgramUnavailable { mismatch, .. } => mismatch.as_ref(),
        other => panic!("unexpected {other}"),
    }
}

#[tokio::test]
async fn a_running_tree_keeps_its_version_while_new_starts_take_the_newest() {
    let store = Arc::new(MemoryStore::new());
    let (v1, v2) = (ask("1.0.0", json!(null)), ask("2.0.0", json!(null)));
    let old = waiting_tree(store.clone(), &v1).await;
    let engine = engine(store.clone(), &[&v1, &v2]);
    let name = Name::new("test.ask").expect("valid");
    let input = Payload::encode(&json!("new?")).expect("encodes");
    let new = engine
        .start_named(&name, StartRequest::new(start_id("newest"), input))
        .await
        .expect("starts by name")
        .tree();
    let view = |tree| {
        let engine = &engine;
        async move {
            engine
                .inspect(&scope(), tree, Visibility::Public)
                .await
                .expect("inspects")
        }
    };
    assert_eq!(
        view(new).await.program,
        v2.reference().version(),
        "the newest version"
    );
    assert_eq!(
        view(old).await.program,
        v1.reference().version(),
        "the version it started with"
    );
    // The old tree goes on with its own version.
    let handle: ProcessHandle = engine.process(&scope(), old).await.expect("taken up");
    let wait = open_wait(&handle).await;
    engine
        .answer(
            &scope(),
            old,
            wait,
            Payload::encode(&true).expect("encodes"),
        )
        .await
        .expect("answers");
    let termination = handle.await_result().await.expect("terminates");
    assert_eq!(termination.status(), Status::Completed);
    engine.close().await;
}

#[tokio::test]
async fn an_unregistered_version_names_the_part_that_differs_and_what_to_register() {
    let store = Arc::new(MemoryStore::new());
    let v1 = ask("1.0.0", json!(null));
    let tree = waiting_tree(store.clone(), &v1).await;
    let needed = v1.reference().clone();

    let rebuilt = ask("2.0.0", json!(null));
    let error = refusal(store.clone(), tree, &[&rebuilt]).await;
    assert_eq!(
        mismatch(&error),
        &VersionMismatch::Parts {
            registered: rebuilt.reference().digest,
            parts: vec![IdentityPart::Build],
            build: needed.implementation,
            configuration: needed.configuration,
        }
    );
    let message = error.to_string();
    for part in [
        "test.ask",
        "differs in its build",
        &format!("register the version built as {}", needed.implementation),
        &format!("with configuration {}", needed.configuration),
    ] {
        assert!(message.contains(part), "{message:?} lacks {part:?}");
    }

    let reconfigured = ask("1.0.0", json!({"temperature": 1}));
    let error = refusal(store.clone(), tree, &[&reconfigured]).await;
    assert!(
        matches!(mismatch(&error), VersionMismatch::Parts { parts, .. } if parts == &[IdentityPart::Configuration]),
        "{error}"
    );
    assert!(
        error.to_string().contains("differs in its configuration"),
        "{error}"
    );

    let both = ask("2.0.0", json!({"temperature": 1}));
    let error = refusal(store.clone(), tree, &[&both]).await;
    assert!(
        matches!(mismatch(&error), VersionMismatch::Parts { parts, .. } if parts == &[IdentityPart::Build, IdentityPart::Configuration]),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("differs in its build and configuration"),
        "{error}"
    );

    // Of several versions the closest is named, the newest among equals.
    let error = refusal(store.clone(), tree, &[&both, &rebuilt, &reconfigured]).await;
    assert!(
        matches!(mismatch(&error), VersionMismatch::Parts { registered, .. } if *registered == reconfigured.reference().digest),
        "{error}"
    );

    let other = program(Kind::Echo, None);
    let error = refusal(store.clone(), tree, &[&other]).await;
    assert_eq!(mismatch(&error), &VersionMismatch::Name);
    assert!(
        error
            .to_string()
            .contains("no version of that name is registered"),
        "{error}"
    );

    // Refusals left the tree untouched: its own version finishes it.
    let engine = engine(store, &[&v1, &rebuilt]);
    let handle: ProcessHandle = engine.process(&scope(), tree).await.expect("taken up");
    let wait = open_wait(&handle).await;
    engine
        .answer(
            &scope(),
            tree,
            wait,
            Payload::encode(&true).expect("encodes"),
        )
        .await
        .expect("answers");
    assert_eq!(
        handle.await_result().await.expect("terminates").status(),
        Status::Completed
    );
    engine.close().await;
}

#[tokio::test]
async fn without_its_start_record_a_refusal_lists_the_registered_versions() {
    // A snapshot after every record: the store drops the start record.
    let store = Arc::new(MemoryStore::new());
    let v1 = ask("1.0.0", json!(null));
    let config = EngineConfig {
        programs: vec![v1.erase()],
        snapshot_every: 1,
        ..EngineConfig::new(store.clone())
    };
    let first = Engine::new(config).expect("valid");
    let handle = first
        .start(&v1, request("compacted", "proceed?"))
        .await
        .expect("starts");
    open_wait(&handle).await;
    first.close().await;
    let tree = handle.tree();
    assert!(
        store
            .records(tree)
            .first()
            .is_none_or(|record| record.seq > 1),
        "the start record was compacted away"
    );
    let rebuilt = ask("2.0.0", json!(null));
    let error = refusal(store, tree, &[&rebuilt]).await;
    assert_eq!(
        mismatch(&error),
        &VersionMismatch::Unknown {
            registered: vec![rebuilt.reference().digest]
        }
    );
    assert!(
        error
            .to_string()
            .contains(&rebuilt.reference().digest.to_string()),
        "{error}"
    );
}

#[tokio::test]
async fn labels_are_recorded_with_the_start_and_shown_by_inspect() {
    let store = Arc::new(MemoryStore::new());
    let v1 = ask("1.0.0", json!(null));
    let engine = engine(store, &[&v1]);
    let labels = Labels::parse_pairs(["team=billing", "ticket=t-42"]).expect("valid");
    let handle = engine
        .start(
            &v1,
            StartRequest {
                labels: labels.clone(),
                ..request("labeled", "proceed?")
            },
        )
        .await
        .expect("starts");
    let view = engine
        .inspect(&scope(), handle.tree(), Visibility::Public)
        .await
        .expect("inspects");
    assert_eq!(view.labels, labels);
    assert!(view.created.is_some(), "the start time is recorded");
    engine.close().await;
}
