//! A policy's identity covers its settings: policies that differ only in
//! their settings are different programs (and so are the teams they
//! coordinate), equal settings give equal identities, a policy without
//! settings keeps the identity of its name, description and build, and a
//! run recorded under other settings is refused on recovery while one
//! under equal settings resumes. A corrupt team state is refused with
//! `team.state.invalid`.
#![allow(missing_docs)]

use std::sync::Arc;

use baton_run::dispatch::{DispatchCall, Dispatcher, ReplayPolicy};
use baton_run::program::{
    Definition, Descriptor, Effect, Execution, ExecutionState, ProgramConfig, Schema, Signal,
    StepError, Transition, configuration_digest, implementation_digest,
};
use baton_run::{
    BoxFuture, ChildKey, Engine, EngineConfig, Failure, FailureKind, MemoryStore, Name, Payload,
    Program, Quota, RecoverOptions, RuntimeError, Settlement, StartId, StartRequest,
};
use baton_team::{Binding, Config, Decision, Mode, Policy, PolicyConfig, TaskRequest, Turn};
use serde::Serialize;
use serde_json::json;
use tokio::sync::Notify;

/// What the test router is configured with: the worker it sends the
/// team's input to, and a label it adds to the task's input.
#[derive(Clone, Serialize)]
struct Route {
    worker: String,
    label: String,
}

fn route(label: &str) -> Route {
    Route {
        worker: "test.hang".into(),
        label: label.into(),
    }
}

/// A policy that starts one task under `route` on turn 1, waits for it,
/// and completes with its output; `decide` closes over the same route its
/// settings hold.
fn router(route: Route) -> Policy {
    let settings = Payload::encode(&route).expect("a route encodes");
    Policy::new(PolicyConfig {
        name: "test.router".into(),
        description: "Sends the input to the configured worker.".into(),
        build: "policy-identity-test 1".into(),
        settings,
        decide: Arc::new(move |turn: &Turn| {
            let fail = |message: String| Failure::contract("test.route.failed", message);
            if let Some(task) = turn.tasks.first() {
                let output = task.output().cloned().unwrap_or_else(Payload::null);
                return Ok(Decision::complete(turn.state.clone(), output));
            }
            let input = Payload::encode(&json!({"label": route.label, "input": turn.state}))
                .map_err(|e| fail(e.to_string()))?;
            let request = TaskRequest::new(
                ChildKey::new("routed").map_err(|e| fail(e.to_string()))?,
                Name::new(&route.worker).map_err(|e| fail(e.to_string()))?,
                input,
            );
            Ok(Decision::new(Mode::Wait, turn.state.clone()).with_task(request))
        }),
    })
    .expect("a valid policy")
}

fn digest(policy: &Policy) -> baton_run::Digest {
    policy.program().reference().digest
}

/// A worker that dispatches once to a dispatcher that never settles, and
/// says so through `dispatched` each time its dispatch is sent.
fn hanging_worker(dispatched: Arc<Notify>) -> Program {
    Program::new(ProgramConfig {
        definition: Arc::new(Hang(
            Descriptor::new("test.hang", "Never finishes.", Schema::any(), Schema::any())
                .expect("valid"),
        )),
        dispatcher: Some(Arc::new(Unanswered(dispatched))),
        implementation: implementation_digest("policy-identity-test", "1"),
        configuration: configuration_digest(&"test.hang").expect("encodes"),
    })
}

struct Hang(Descriptor);

struct HangRun {
    dispatched: bool,
}

impl Definition for Hang {
    fn descriptor(&self) -> &Descriptor {
        &self.0
    }

    fn start(&self, _: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(HangRun { dispatched: false }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(HangRun {
            dispatched: state.decode()?,
        }))
    }
}

impl Execution for HangRun {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        if self.dispatched {
            return Err(StepError::other("the dispatch never settles"));
        }
        self.dispatched = true;
        Ok(Transition::Continue {
            consumed: window.len(),
            effects: vec![Effect::dispatch(Payload::null())],
        })
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.dispatched)
    }
}

struct Unanswered(Arc<Notify>);

impl Dispatcher for Unanswered {
    fn replay_policy(&self, _: &Payload) -> ReplayPolicy {
        ReplayPolicy::SameIdentity
    }

    fn dispatch(&self, _: DispatchCall) -> BoxFuture<'static, Settlement> {
        self.0.notify_one();
        Box::pin(std::future::pending())
    }
}

fn team(coordinator: &Policy, worker: &Program) -> Program<u64, Payload> {
    baton_team::compile::<u64, Payload>(Config {
        name: "test.routed".into(),
        description: "A team with a configured router.".into(),
        coordinator: Binding::new(&coordinator.program()),
        workers: vec![Binding::new(worker)],
        max_turns: Quota::Finite(4),
        max_tasks: Quota::Finite(1),
        max_concurrent_tasks: 1,
        max_controls_per_turn: 1,
        stall_turns: baton_team::DEFAULT_STALL_TURNS,
    })
    .expect("a valid team")
}

#[test]
fn policies_that_differ_only_in_their_settings_are_different_programs() {
    let a = router(route("a"));
    let b = router(route("b"));
    assert_ne!(digest(&a), digest(&b));
    assert_ne!(
        a.program().reference().configuration,
        b.program().reference().configuration
    );
    assert_eq!(
        a.program().reference().implementation,
        b.program().reference().implementation
    );
    let worker = hanging_worker(Arc::default());
    assert_ne!(
        team(&a, &worker).reference().digest,
        team(&b, &worker).reference().digest,
        "a team covers its coordinator's settings"
    );
}

#[test]
fn equal_settings_give_equal_identities() {
    assert_eq!(digest(&router(route("a"))), digest(&router(route("a"))));
    // Settings are canonical payloads: the order a value writes its fields
    // in does not matter.
    #[derive(Serialize)]
    struct HighFirst {
        high: u32,
        low: u32,
    }
    #[derive(Serialize)]
    struct LowFirst {
        low: u32,
        high: u32,
    }
    let policy = |settings: Payload| {
        Policy::new(PolicyConfig {
            name: "test.thresholds".into(),
            description: "Decides by thresholds.".into(),
            build: "policy-identity-test 1".into(),
            settings,
            decide: Arc::new(|turn: &Turn| {
                Ok(Decision::complete(turn.state.clone(), Payload::null()))
            }),
        })
        .expect("valid")
    };
    let forward = policy(Payload::encode(&HighFirst { high: 9, low: 1 }).expect("encodes"));
    let backward = policy(Payload::encode(&LowFirst { low: 1, high: 9 }).expect("encodes"));
    assert_eq!(digest(&forward), digest(&backward));
}

#[test]
fn a_policy_without_settings_is_identified_by_its_name_description_and_build() {
    let policy = Policy::new(PolicyConfig {
        name: "test.plain".into(),
        description: "Decides from the turn alone.".into(),
        build: "policy-identity-test 1".into(),
        settings: Payload::null(),
        decide: Arc::new(|turn: &Turn| Ok(Decision::complete(turn.state.clone(), Payload::null()))),
    })
    .expect("valid");
    assert_eq!(
        policy.program().reference().configuration,
        configuration_digest(&json!({
            "name": "test.plain",
            "description": "Decides from the turn alone.",
            "build": "policy-identity-test 1",
        }))
        .expect("encodes")
    );
    let configured = Policy::new(PolicyConfig {
        name: "test.plain".into(),
        description: "Decides from the turn alone.".into(),
        build: "policy-identity-test 1".into(),
        settings: Payload::encode(&json!({})).expect("encodes"),
        decide: Arc::new(|turn: &Turn| Ok(Decision::complete(turn.state.clone(), Payload::null()))),
    })
    .expect("valid");
    assert_ne!(digest(&policy), digest(&configured));
}

#[tokio::test]
async fn a_run_recorded_under_other_settings_is_refused_and_one_under_equal_settings_resumes() {
    let store = MemoryStore::keeping_history();
    let dispatched = Arc::new(Notify::new());
    let recorded = team(&router(route("a")), &hanging_worker(dispatched.clone()));
    let first = Engine::new(EngineConfig {
        programs: vec![recorded.erase()],
        ..EngineConfig::new(Arc::new(store.clone()))
    })
    .expect("the engine configuration is valid");
    let handle = first
        .start(
            &recorded,
            StartRequest::new(StartId::new("acme", "routed").expect("valid"), 7u64),
        )
        .await
        .expect("starts");
    // The worker's dispatch is sent only once its step is durable.
    dispatched.notified().await;
    drop(first);
    assert!(matches!(
        handle.await_result().await,
        Err(RuntimeError::Closed { .. })
    ));

    // The same team with the router's settings changed is another program.
    let changed = team(&router(route("b")), &hanging_worker(dispatched.clone()));
    let other = Engine::new(EngineConfig {
        programs: vec![changed.erase()],
        ..EngineConfig::new(Arc::new(store.clone()))
    })
    .expect("the engine configuration is valid");
    let report = other
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    assert_eq!(report.len(), 1);
    assert_eq!(report[0].0, handle.tree());
    assert_eq!(
        report[0].1.as_ref().expect_err("refused").code(),
        "engine.program.unavailable"
    );
    drop(other);

    // A policy built again with equal settings is the same program: the
    // run resumes, and the worker's pending dispatch is sent again.
    let rebuilt = team(&router(route("a")), &hanging_worker(dispatched.clone()));
    assert_eq!(rebuilt.reference().digest, recorded.reference().digest);
    let second = Engine::new(EngineConfig {
        programs: vec![rebuilt.erase()],
        ..EngineConfig::new(Arc::new(store.clone()))
    })
    .expect("the engine configuration is valid");
    let report = second
        .recover(RecoverOptions::default())
        .await
        .expect("lists");
    assert!(report[0].1.is_ok(), "{report:?}");
    dispatched.notified().await;
}

#[test]
fn a_corrupt_team_state_is_refused_as_an_invalid_state() {
    let worker = hanging_worker(Arc::default());
    let team = team(&router(route("a")), &worker);
    for (state, message) in [
        (
            json!({"initial": 7, "tasks": []}),
            "team: invalid state: tasks: an empty list is omitted, not written",
        ),
        (
            json!({"initial": 7, "extra": 1}),
            "team: invalid state: unknown field `extra`",
        ),
        (
            json!({"turn": {"number": 1, "state": 7}, "tasks": [
                {"request": {"key": "a b", "worker": "test.hang", "input": 1},
                 "rejection": {"kind": "contract", "code": "x.y", "message": "m"}}]}),
            r#"team: invalid state: invalid child key "a b""#,
        ),
    ] {
        let payload = Payload::from_value(&state).expect("encodes");
        let Err(StepError(failure)) = team.definition().restore(&ExecutionState(payload)) else {
            panic!("{state} restored");
        };
        assert_eq!(failure.kind, FailureKind::Contract, "{state}");
        assert_eq!(failure.code(), "team.state.invalid", "{state}");
        assert!(
            failure.message.starts_with(message),
            "{state}: {}",
            failure.message
        );
    }
}
