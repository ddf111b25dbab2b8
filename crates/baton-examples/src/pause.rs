//! The pause scenario of `baton demo --pause`: a team whose scripted
//! coordinator asks an input gate for an instruction, waits for a person's
//! answer, and completes with it.
//!
//! The `team` function is shared by the command line and the HTTP API's
//! tests (`baton-server`), so both drive the very same program (its build
//! identity is unchanged since it lived in the command line, so trees
//! started before the move are still resolved by their exact digest).

use baton::coordination::{Answer, InputGate};
use baton::run::{Budget, ChildKey, Failure, Name, Payload, Program, Quota};
use baton::team::{Binding, Config, Decision, Mode, Policy, PolicyConfig, TaskRequest, Turn};

/// The question the scenario asks.
pub const QUESTION: &str = "What should the team deploy?";

/// The task text the command line starts the scenario with.
pub const TASK: &str = "release 1.4";

/// The team: a scripted coordinator asks an input gate for an instruction,
/// waits for it, and completes with `"<task>: done as instructed
/// (<answer>), answer <wait id>"`.
pub fn team() -> Result<Program<String, String>, Box<dyn std::error::Error>> {
    let gate =
        InputGate::typed::<String, String>("demo.instruction", "Ask a person for an instruction.")?;
    let coordinator = Policy::new(PolicyConfig {
        name: "demo.pause_coordinator".into(),
        description: "Ask for an instruction, wait for it, act on it.".into(),
        build: "baton-cli demo pause 1".into(),
        settings: Payload::null(),
        decide: std::sync::Arc::new(decide),
    })?;
    let budget = Budget::unlimited()
        .with_steps(64)
        .with_effects(32)
        .with_signals(64);
    Ok(baton::team::compile::<String, String>(Config {
        name: "demo.pause".into(),
        description: "A team that waits for a human instruction.".into(),
        coordinator: Binding::new(&coordinator.program()).with_budget(budget.clone()),
        workers: vec![Binding::new(&gate.program::<String>()).with_budget(budget)],
        max_turns: Quota::Finite(3),
        max_tasks: Quota::Finite(1),
        max_concurrent_tasks: 1,
        max_controls_per_turn: 1,
        stall_turns: baton::team::DEFAULT_STALL_TURNS,
    })?)
}

/// The coordinator's decision for each turn: ask, then complete with the
/// answer; any other turn is a contract failure.
pub fn decide(turn: &Turn) -> Result<Decision, Failure> {
    let fail = |message: String| Failure::contract("demo.pause.unexpected", message);
    match turn.number {
        1 => {
            let key = ChildKey::new("instruction").map_err(|e| fail(e.to_string()))?;
            let worker = Name::new("demo.instruction").map_err(|e| fail(e.to_string()))?;
            let question = Payload::encode(&QUESTION).map_err(|e| fail(e.to_string()))?;
            Ok(Decision::new(Mode::Wait, turn.state.clone())
                .with_task(TaskRequest::new(key, worker, question)))
        }
        2 => {
            let task = turn
                .task("instruction")
                .ok_or_else(|| fail("the instruction task is missing".into()))?;
            let output = task
                .output()
                .ok_or_else(|| fail("the instruction was not answered".into()))?;
            let answer: Answer = output.decode().map_err(|e| fail(e.to_string()))?;
            let instruction: String = answer.payload.decode().map_err(|e| fail(e.to_string()))?;
            let task_text: String = turn.state.decode().map_err(|e| fail(e.to_string()))?;
            let done = format!(
                "{task_text}: done as instructed ({instruction}), answer {}",
                answer.id
            );
            Ok(Decision::complete(
                turn.state.clone(),
                Payload::encode(&done).map_err(|e| fail(e.to_string()))?,
            ))
        }
        other => Err(fail(format!("unexpected turn {other}"))),
    }
}
