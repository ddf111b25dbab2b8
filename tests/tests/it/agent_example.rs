//! The worked example of the team specification with a model-backed
//! coordinator: an `Adapter` over an interaction on a `ScriptedModel` that
//! decides from the Turn it is given, an `InputGate` worker and a reviewer
//! workflow. The program is `baton_examples::team_review` itself.

use std::sync::Arc;

use baton::run::{Engine, EngineConfig, MemoryStore, Payload, StartId, StartRequest, Status};
use baton_examples::team_review as example;

#[tokio::test]
async fn the_model_backed_coordinator_runs_the_worked_example() {
    let team = example::team().expect("builds");
    let engine = Engine::new(EngineConfig {
        programs: vec![team.erase()],
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })
    .expect("the engine configuration is valid");
    let request = StartRequest::new(
        StartId::new("example", "agent-example").expect("valid"),
        example::TASK.to_owned(),
    );
    let handle = engine.start(&team, request).await.expect("starts");
    let output = handle.output().await.expect("completes");
    handle.join().await.expect("drains");
    assert_eq!(output, example::EXPECTED);

    let view = handle.inspect().await.expect("inspects");
    let root = view.root();
    let turns: Vec<_> = root
        .children
        .keys()
        .filter(|k| k.as_str().starts_with("team.turn."))
        .collect();
    assert_eq!(turns.len(), 4, "four coordinator turns");
    let gate = view
        .process(root.children[&"input".parse().expect("key")])
        .expect("gate");
    assert_eq!(gate.status, Status::Canceled, "the gate was canceled");
    let review = view
        .process(root.children[&"review".parse().expect("key")])
        .expect("review");
    assert_eq!(
        review
            .termination
            .as_ref()
            .and_then(|t| t.output())
            .map(Payload::as_str),
        Some("\"reviewed: inspect deployment\"")
    );
    // Each turn's coordinator is a workflow whose interaction made one model call.
    for turn in turns {
        let coordinator = view.process(root.children[turn]).expect("coordinator");
        assert_eq!(coordinator.status, Status::Completed);
    }
}

#[test]
fn the_scripted_model_refuses_an_unexpected_turn() {
    let turn: baton::team::Turn = serde_json::from_value(serde_json::json!({
        "number": 9, "state": "x", "workers": [], "tasks": [], "controls": []
    }))
    .expect("a turn");
    assert!(example::decide(&turn).is_err());
}
