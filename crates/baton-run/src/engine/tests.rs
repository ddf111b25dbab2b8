//! What the engine keeps and computes of a tree, seen from inside.

use std::sync::Arc;

use super::*;
use crate::ids::StartId;
use crate::protocol::Transition;
use crate::storage::MemoryStore;

fn scripted(name: &str, transition: Transition) -> Program {
    super::round::tests::program(name, transition, Vec::new())
}

/// A root that ends in its first round never has its input hashed, and a
/// repeated start compares the inputs' texts; a root that goes on keeps
/// its input's digest from its first commit on, not its input.
#[tokio::test(flavor = "multi_thread")]
async fn an_input_is_hashed_only_for_a_tree_that_goes_on() {
    let ending = scripted(
        "ending",
        Transition::Complete {
            consumed: 0,
            output: Payload::null(),
        },
    );
    let looping = scripted(
        "looping",
        Transition::Continue {
            consumed: 0,
            effects: Vec::new(),
        },
    );
    let engine = Engine::new(EngineConfig {
        programs: vec![ending.clone(), looping.clone()],
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })
    .expect("a valid configuration");
    let input = |text: &str| Payload::parse_str(text).expect("json");
    let start = |program: &Program, key: &str, input: &Payload| {
        let name = program.descriptor().name().clone();
        let request = StartRequest::new(StartId::new("acme", key).expect("id"), input.clone());
        let engine = &engine;
        async move { engine.start_named(&name, request).await }
    };

    let ended = input(r#"{"text":"ends"}"#);
    let started = start(&ending, "ends", &ended).await.expect("starts");
    let tree = started.id();
    let handle = started.into_handle();
    handle.await_result().await.expect("ends");
    assert!(
        !ended.digest_known(),
        "a tree that ended never hashed its input"
    );
    let again = start(&ending, "ends", &input(r#"{"text":"ends"}"#))
        .await
        .expect("the same start");
    assert_eq!(again.id(), tree);
    assert!(!again.is_new());
    let other = start(&ending, "ends", &input(r#"{"text":"other"}"#)).await;
    assert!(matches!(other, Err(StartError::Conflict { .. })));
    assert!(!ended.digest_known(), "the inputs' texts were compared");

    let going = input(r#"{"text":"goes on"}"#);
    let started = start(&looping, "goes-on", &going).await.expect("starts");
    assert!(going.digest_known(), "a tree that goes on hashed its input");
    let shared = engine.inner.live(started.id()).expect("running");
    let held = shared.input.lock().expect("not poisoned").is_held();
    assert!(!held, "it keeps the input's digest, not the input");
    let again = start(&looping, "goes-on", &going)
        .await
        .expect("the same start");
    assert!(!again.is_new());
    let other = start(&looping, "goes-on", &ended).await;
    assert!(matches!(other, Err(StartError::Conflict { .. })));
    engine.close().await;
}
