//! A team coordinator steers a running interaction worker with a signal
//! control; the steering reaches the worker's next model call.

use std::sync::Arc;

use baton::agent::{
    Interaction, InteractionConfig, InteractionInput, InteractionOutput, Message, Response,
    ScriptedModel, Steering,
};
use baton::run::program::ChildSignal;
use baton::run::{
    Budget, ChildKey, Engine, EngineConfig, Failure, MemoryStore, Name, Payload, Quota, SignalId,
    StartId, StartRequest, Status,
};
use baton::team::{
    Binding, Config, Control, Decision, Mode, Policy, PolicyConfig, TaskRequest, Turn,
};

const STEER: &str = "focus on the rollback plan";

fn coordinator_decides(turn: &Turn) -> Result<Decision, Failure> {
    let fail = |message: String| Failure::contract("test.steering.unexpected", message);
    let key = ChildKey::new("agent").map_err(|e| fail(e.to_string()))?;
    match turn.number {
        1 => {
            let input = InteractionInput::new(vec![Message::user("draft the deploy plan")]);
            let input = Payload::encode(&input).map_err(|e| fail(e.to_string()))?;
            let worker = Name::new("test.agent").map_err(|e| fail(e.to_string()))?;
            Ok(Decision::new(Mode::Continue, turn.state.clone())
                .with_task(TaskRequest::new(key, worker, input)))
        }
        2 => {
            let steering = Steering {
                messages: vec![STEER.to_owned()],
            };
            let signal = ChildSignal {
                id: SignalId::new("steer-1").map_err(|e| fail(e.to_string()))?,
                wait: None,
                payload: Payload::encode(&steering).map_err(|e| fail(e.to_string()))?,
            };
            let mut decision = Decision::new(Mode::Wait, turn.state.clone());
            decision.controls.push(Control::signal(key, signal));
            Ok(decision)
        }
        _ => {
            let task = turn
                .task("agent")
                .ok_or_else(|| fail("no agent task".into()))?;
            if task.status() != Some(Status::Completed) {
                return Err(fail(format!("the agent ended {:?}", task.status())));
            }
            let output: InteractionOutput = task
                .output()
                .ok_or_else(|| fail("no output".into()))?
                .decode()
                .map_err(|e| fail(e.to_string()))?;
            let text = Payload::encode(&output.response.message().text())
                .map_err(|e| fail(e.to_string()))?;
            Ok(Decision::complete(turn.state.clone(), text))
        }
    }
}

#[tokio::test]
async fn a_signal_control_steers_the_workers_next_model_call() {
    // The model answers "steered" once a request carries the steering text;
    // the validator asks again until it does (bounded by max_model_calls).
    let model = ScriptedModel::new("steerable", |request| {
        let steered = request.messages().iter().any(|m| m.text().contains(STEER));
        Ok(Response::text(if steered { "steered" } else { "plain" }))
    });
    let mut config = InteractionConfig::new(
        "test.agent",
        "Drafts plans.",
        Arc::new(model.clone()),
        256,
        6,
    );
    config.build = "team steering test 1".into();
    config.validator = Some(Arc::new(|response: &Response| {
        if response.message().text() == "steered" {
            Ok(())
        } else {
            Err("wait for the operator's steering".into())
        }
    }));
    let worker = Interaction::new(config).expect("valid").program();
    let coordinator = Policy::new(PolicyConfig {
        name: "test.steering_coordinator".into(),
        description: "Starts an agent, then steers it.".into(),
        build: "team steering test 1".into(),
        settings: Payload::null(),
        decide: Arc::new(coordinator_decides),
    })
    .expect("valid");
    let budget = Budget::unlimited()
        .with_steps(128)
        .with_effects(64)
        .with_signals(128);
    let team = baton::team::compile::<String, String>(Config {
        name: "test.steering_team".into(),
        description: "A team that steers its agent.".into(),
        coordinator: Binding::new(&coordinator.program()).with_budget(budget.clone()),
        workers: vec![Binding::new(&worker).with_budget(budget)],
        max_turns: Quota::Finite(6),
        max_tasks: Quota::Finite(1),
        max_concurrent_tasks: 1,
        max_controls_per_turn: 1,
        stall_turns: baton::team::DEFAULT_STALL_TURNS,
    })
    .expect("valid");
    let engine = Engine::new(EngineConfig {
        programs: vec![team.erase()],
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })
    .expect("the engine configuration is valid");
    let request = StartRequest::new(
        StartId::new("acme", "steering").expect("valid"),
        "deploy".to_owned(),
    );
    let handle = engine.start(&team, request).await.expect("starts");
    assert_eq!(handle.output().await.expect("completes"), "steered");
    handle.join().await.expect("drains");
    let requests = model.requests();
    let first_steered = requests
        .iter()
        .position(|r| r.messages().iter().any(|m| m.text().contains(STEER)))
        .expect("a model request carried the steering");
    // Every request after the steering arrived carries it; none before did.
    assert!(
        requests[..first_steered]
            .iter()
            .all(|r| r.messages().iter().all(|m| !m.text().contains(STEER)))
    );
    assert_eq!(
        requests.len(),
        first_steered + 1,
        "the steered answer was accepted at once"
    );
}
