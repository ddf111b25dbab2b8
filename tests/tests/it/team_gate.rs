//! A team with an input gate worker: the host's answer wakes the waiting
//! team and the next turn shows the gate's outcome with the answer's signal
//! id; an explicit JSON `null` output survives a crash and recovery.

use std::sync::Arc;

use baton::coordination::{Answer, InputGate};
use baton::run::log::RecordKind;
use baton::run::{
    ChildKey, Engine, EngineConfig, Failure, MemoryStore, Name, Payload, Program, Quota,
    RecoverOptions, Scope, SignalId, SignalRequest, StartId, StartRequest, Status,
};
use baton::team::{
    Binding, Config, Decision, Mode, Policy, PolicyConfig, TaskRequest, Turn, compile,
};
use baton_testkit::{Cut, FaultStore};

fn coordinator(
    build: &str,
    decide: impl Fn(&Turn) -> Result<Decision, Failure> + Send + Sync + 'static,
) -> Program<Turn, Decision> {
    Policy::new(PolicyConfig {
        name: "test.coordinator".into(),
        description: "A scripted coordinator.".into(),
        build: build.into(),
        settings: Payload::null(),
        decide: Arc::new(decide),
    })
    .expect("valid")
    .program()
}

fn gate() -> Program<String, Answer> {
    InputGate::typed::<String, String>("test.approval", "Asks for approval.")
        .expect("valid")
        .program()
}

fn config(coordinator: &Program<Turn, Decision>) -> Config {
    Config {
        name: "test.team".into(),
        description: "A team with a gate.".into(),
        coordinator: Binding::new(coordinator),
        workers: vec![Binding::new(&gate())],
        max_turns: Quota::Finite(8),
        max_tasks: Quota::Unlimited,
        max_concurrent_tasks: 2,
        max_controls_per_turn: 1,
        stall_turns: baton::team::DEFAULT_STALL_TURNS,
    }
}

fn start(key: &str) -> StartRequest<String> {
    StartRequest::new(
        StartId::new("acme", key).expect("valid"),
        "deploy".to_owned(),
    )
}

fn ask() -> ChildKey {
    ChildKey::new("ask").expect("valid")
}

#[tokio::test]
async fn the_hosts_answer_to_a_gate_wakes_the_waiting_team_with_its_signal_id() {
    let coordinator = coordinator("gate 1", |turn| match turn.number {
        1 => Ok(
            Decision::new(Mode::Wait, turn.state.clone()).with_task(TaskRequest::new(
                ask(),
                Name::new("test.approval").expect("valid"),
                Payload::encode(&"approve the deploy?").expect("encodes"),
            )),
        ),
        2 => {
            let task = turn.task("ask").expect("listed");
            let answer: Answer = task
                .output()
                .ok_or_else(|| Failure::execution("test.gate.missing", "no answer"))?
                .decode()
                .map_err(|error| Failure::execution("test.gate.decode", error.to_string()))?;
            let output =
                Payload::encode(&format!("{}: {}", answer.id, answer.payload)).expect("encodes");
            Ok(Decision::complete(turn.state.clone(), output))
        }
        _ => Err(Failure::execution(
            "test.turn.unexpected",
            "unexpected turn",
        )),
    });
    let team = compile::<String, String>(config(&coordinator)).expect("valid");
    let engine = Engine::new(EngineConfig {
        programs: vec![team.erase()],
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })
    .expect("the engine configuration is valid");
    let handle = engine.start(&team, start("gate")).await.expect("starts");
    let gate = handle.child::<Answer>(&ask());
    // The team is waiting on the gate, which is waiting on the host.
    let mut wait = None;
    for _ in 0..100_000 {
        let view = handle.inspect().await.expect("inspects");
        if let Some(process) = view.process(gate.id())
            && let Some(open) = process.open_waits.first()
            && process.status == Status::Waiting
        {
            wait = Some(open.id);
            break;
        }
        tokio::task::yield_now().await;
    }
    let wait = wait.expect("the gate opened its wait");
    gate.signal(SignalRequest {
        id: SignalId::new("approval-7").expect("valid"),
        wait: Some(wait),
        payload: Payload::encode(&"yes").expect("encodes"),
    })
    .await
    .expect("admitted");
    let output = handle.output().await.expect("completes");
    assert_eq!(output, "approval-7: \"yes\"");
    handle.join().await.expect("joins");
}

#[tokio::test]
async fn an_explicit_null_output_survives_a_crash_and_recovery_as_present() {
    let coordinator = coordinator("null 1", |turn| {
        Ok(Decision::complete(turn.state.clone(), Payload::null()))
    });
    let team = compile::<String, Option<String>>(config(&coordinator)).expect("valid");
    let memory = MemoryStore::keeping_history();
    let faulty = FaultStore::new(Arc::new(memory.clone()));
    // The first commit that adopts a step is cut after it reached the store.
    faulty.arm(RecordKind::StepAdopted, Cut::After, 1);
    let first = Engine::new(EngineConfig {
        programs: vec![team.erase()],
        ..EngineConfig::new(Arc::new(faulty.clone()))
    })
    .expect("the engine configuration is valid");
    // The team ends in its first round, so that commit is its whole run:
    // the crash cuts the start itself, after it was stored.
    let tree = baton_testkit::start_into_crash(&first, &team, start("null")).await;
    assert!(faulty.crashed());
    drop(first);
    let second = Engine::new(EngineConfig {
        programs: vec![team.erase()],
        ..EngineConfig::new(faulty.inner())
    })
    .expect("the engine configuration is valid");
    second
        .recover(RecoverOptions::default())
        .await
        .expect("recovers");
    let scope = Scope::new("acme").expect("valid");
    let handle = second
        .start(&team, start("null"))
        .await
        .expect("starts again");
    assert!(!handle.is_new(), "the crashed start was stored");
    assert_eq!(handle.tree(), tree);
    let ended = handle.join().await.expect("joins");
    assert_eq!(ended.status(), Status::Completed);
    assert_eq!(
        ended.output(),
        Some(&Payload::null()),
        "null is a present output"
    );
    // A fresh engine folding the stored log sees the same.
    let third = Engine::new(EngineConfig {
        programs: vec![team.erase()],
        ..EngineConfig::new(Arc::new(memory.clone()))
    })
    .expect("the engine configuration is valid");
    let again = third
        .process::<Option<String>>(&scope, tree)
        .await
        .expect("attached")
        .await_result()
        .await
        .expect("finished");
    assert_eq!(again.output(), Some(&Payload::null()));
}
