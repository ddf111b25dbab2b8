//! The worked example of the team specification with a scripted
//! coordinator: turn 1 starts an input gate, turn 2 cancels it with mode
//! wait, turn 3 sees it canceled and starts the reviewer workflow, turn 4
//! reads the reviewer's output and completes.

use std::sync::{Arc, Mutex};

use baton::coordination::InputGate;
use baton::run::{
    Budget, ChildKey, Engine, EngineConfig, Failure, MemoryStore, Name, Payload, Quota, StartId,
    StartRequest, Status,
};
use baton::team::{
    Binding, Config, Control, Decision, Mode, Policy, PolicyConfig, TaskRequest, Turn, compile,
};
use baton::workflow::{Workflow, transform};

const TASK: &str = "inspect deployment";
const EXPECTED: &str =
    "coordinator continued while input was pending; reviewed: inspect deployment";

fn fail(message: &str) -> Failure {
    Failure::execution("example.turn.unexpected", message)
}

fn key(text: &str) -> Result<ChildKey, Failure> {
    ChildKey::new(text).map_err(|error| fail(&error.to_string()))
}

fn name(text: &str) -> Result<Name, Failure> {
    Name::new(text).map_err(|error| fail(&error.to_string()))
}

/// The coordinator's logic, exactly as the specification's example.
fn decide(turn: &Turn) -> Result<Decision, Failure> {
    let state = turn.state.clone();
    match turn.number {
        1 => Ok(
            Decision::new(Mode::Continue, state.clone()).with_task(TaskRequest::new(
                key("input")?,
                name("example.input")?,
                state,
            )),
        ),
        2 => {
            let [task] = turn.tasks.as_slice() else {
                return Err(fail("expected exactly the input task"));
            };
            if !task.is_running() {
                return Err(fail("background input task was not outstanding"));
            }
            Ok(
                Decision::new(Mode::Wait, state).with_control(Control::cancel(
                    key("input")?,
                    "No replacement instruction is needed.",
                )),
            )
        }
        3 => {
            if turn.tasks[0].status() != Some(Status::Canceled) {
                return Err(fail("input cancellation did not drain"));
            }
            Ok(
                Decision::new(Mode::Wait, state.clone()).with_task(TaskRequest::new(
                    key("review")?,
                    name("example.reviewer")?,
                    state,
                )),
            )
        }
        4 => {
            let review = match turn.tasks.as_slice() {
                [_, review] => review
                    .output()
                    .ok_or_else(|| fail("review outcome is missing"))?,
                _ => return Err(fail("review outcome is missing")),
            };
            let review: String = review.decode().map_err(|error| fail(&error.to_string()))?;
            let output = Payload::encode(&format!(
                "coordinator continued while input was pending; {review}"
            ))
            .map_err(|error| fail(&error.to_string()))?;
            Ok(Decision::complete(state, output))
        }
        _ => Err(fail("unexpected coordinator turn")),
    }
}

#[tokio::test]
async fn the_worked_example_runs_four_turns_and_prints_the_expected_line() {
    let turns: Arc<Mutex<Vec<Turn>>> = Arc::default();
    let seen = turns.clone();
    let coordinator = Policy::new(PolicyConfig {
        name: "example.coordinator".into(),
        description: "Follows the worked example.".into(),
        build: "team-example 1".into(),
        settings: Payload::null(),
        decide: Arc::new(move |turn: &Turn| {
            let mut seen = seen.lock().expect("not poisoned");
            if seen.last().is_none_or(|last| last.number != turn.number) {
                seen.push(turn.clone());
            }
            decide(turn)
        }),
    })
    .expect("valid")
    .program();
    let gate = InputGate::typed::<String, String>("example.input", "Wait for an instruction.")
        .expect("valid")
        .program::<String>();
    let reviewer = Workflow::new(baton::workflow::Config {
        name: "example.reviewer".into(),
        description: "Review a task.".into(),
        build: "team-example 1".into(),
        stages: vec![transform("review", |task: String| {
            Ok(format!("reviewed: {task}"))
        })],
    })
    .expect("valid")
    .program::<String, String>();
    let budget = Budget::unlimited()
        .with_steps(32)
        .with_effects(16)
        .with_signals(32);
    let team = compile::<String, String>(Config {
        name: "example.collaboration".into(),
        description: "Run decisions alongside background work.".into(),
        coordinator: Binding::new(&coordinator).with_budget(
            Budget::unlimited()
                .with_steps(64)
                .with_effects(32)
                .with_signals(64),
        ),
        workers: vec![
            Binding::new(&gate).with_budget(budget.clone()),
            Binding::new(&reviewer).with_budget(budget),
        ],
        max_turns: Quota::Finite(4),
        max_tasks: Quota::Finite(2),
        max_concurrent_tasks: 2,
        max_controls_per_turn: 1,
        stall_turns: baton::team::DEFAULT_STALL_TURNS,
    })
    .expect("valid team");
    let engine = Engine::new(EngineConfig {
        programs: vec![team.erase()],
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })
    .expect("the engine configuration is valid");
    let handle = engine
        .start(
            &team,
            StartRequest::new(
                StartId::new("example", "team-1").expect("valid"),
                TASK.to_owned(),
            ),
        )
        .await
        .expect("starts");
    let termination = handle.join().await.expect("joins");
    assert_eq!(termination.status(), Status::Completed, "{termination}");
    let output: String = termination
        .output()
        .expect("output")
        .decode()
        .expect("a string");
    assert_eq!(output, EXPECTED);

    let turns = turns.lock().expect("not poisoned").clone();
    assert_eq!(
        turns.iter().map(|t| t.number).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    assert_eq!(turns[2].tasks[0].status(), Some(Status::Canceled));
    assert_eq!(
        turns[2].controls.len(),
        1,
        "turn 3 shows the cancel receipt"
    );
    let gate = handle
        .child::<Payload>(&ChildKey::new("input").expect("valid"))
        .await_result()
        .await
        .expect("the gate ended");
    assert_eq!(gate.status(), Status::Canceled);
}
