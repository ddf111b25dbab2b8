//! The worked example of the team specification: a model-backed
//! coordinator keeps working while an input gate is pending, cancels the
//! gate, has a reviewer workflow review the task, and completes.
//!
//! Run it with `cargo run -p baton-examples --example team_review`; it
//! prints `coordinator continued while input was pending; reviewed: inspect
//! deployment`.
//!
//! The coordinator is an [`Adapter`] over an interaction whose model is a
//! [`ScriptedModel`] that decides from the `Turn` it is given, exactly as a
//! provider-backed model would be asked to. The `team` function below is
//! shared with the `baton demo` command and the workspace test of this
//! example (both depend on this crate), so all three run the same program.

use std::sync::Arc;

use baton::agent::{
    Adapter, AdapterConfig, Interaction, InteractionConfig, InteractionInput, InteractionOutput,
    Message, ModelError, Response, ScriptedModel,
};
use baton::coordination::InputGate;
use baton::run::{Budget, ChildKey, Name, Payload, Program, Quota, Status};
use baton::team::{Binding, Config, Control, Decision, Mode, TaskRequest, Turn};
use baton::workflow::{TransformError, Workflow, transform};

/// The task the team works on.
pub const TASK: &str = "inspect deployment";

/// The line the example prints when it works.
pub const EXPECTED: &str =
    "coordinator continued while input was pending; reviewed: inspect deployment";

/// The coordinator's decision for each turn, following the specification's
/// logic exactly; any unexpected turn is an error the model reports.
pub fn decide(turn: &Turn) -> Result<Decision, String> {
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
                return Err("expected exactly the input task".into());
            };
            if !task.is_running() {
                return Err("the input task was not outstanding".into());
            }
            let mut decision = Decision::new(Mode::Wait, state);
            decision.controls.push(Control::cancel(
                task.key().clone(),
                "No replacement instruction is needed.",
            ));
            Ok(decision)
        }
        3 => {
            let input = turn.task("input").ok_or("the input task is missing")?;
            if input.status() != Some(Status::Canceled) {
                return Err(format!(
                    "the input task did not drain canceled: {:?}",
                    input.status()
                ));
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
            let review = turn.task("review").ok_or("the review task is missing")?;
            let output = review.output().ok_or("the review produced no output")?;
            let review: String = output.decode().map_err(|e| e.to_string())?;
            let final_output = Payload::encode(&format!(
                "coordinator continued while input was pending; {review}"
            ))
            .map_err(|e| e.to_string())?;
            Ok(Decision::complete(state, final_output))
        }
        other => Err(format!("unexpected coordinator turn {other}")),
    }
}

fn key(text: &str) -> Result<ChildKey, String> {
    ChildKey::new(text).map_err(|e| e.to_string())
}

fn name(text: &str) -> Result<Name, String> {
    Name::new(text).map_err(|e| e.to_string())
}

/// The deterministic local model: reads the rendered Turn from the one
/// user message and answers with the Decision as JSON text.
pub fn model() -> ScriptedModel {
    ScriptedModel::new("example-decisions", |request| {
        let text = request
            .messages()
            .last()
            .map(Message::text)
            .ok_or_else(|| ModelError::Malformed("expected one rendered turn".into()))?;
        let turn: Turn = Payload::parse_str(&text)
            .and_then(|payload| payload.decode())
            .map_err(|e| ModelError::Malformed(e.to_string()))?;
        let decision = decide(&turn).map_err(ModelError::Malformed)?;
        let json = Payload::encode(&decision).map_err(|e| ModelError::Malformed(e.to_string()))?;
        Ok(Response::text(json.as_str()))
    })
}

/// The team: the model-backed coordinator, an input gate and a reviewer.
pub fn team() -> Result<Program<String, String>, Box<dyn std::error::Error>> {
    let interaction = Interaction::new(InteractionConfig::new(
        "example.decision_model",
        "Choose the next team decision.",
        Arc::new(model()),
        4096,
        1,
    ))?;
    let budget = Budget::unlimited()
        .with_steps(64)
        .with_effects(32)
        .with_signals(64);
    let coordinator = Adapter::new(AdapterConfig::<Turn, Decision> {
        name: "example.coordinator".into(),
        description: "Render a turn and decode a completed model decision.".into(),
        build: "team_review example 1".into(),
        interaction: interaction.program(),
        budget: budget.clone(),
        capabilities: Default::default(),
        build_input: Box::new(|turn: &Turn| {
            let rendered = Payload::encode(turn).map_err(|e| TransformError::new(e.to_string()))?;
            Ok(InteractionInput::new(vec![Message::user(
                rendered.as_str(),
            )]))
        }),
        decode_output: Box::new(|output: InteractionOutput| {
            baton::agent::output::decode::<Decision>(&output.response)
                .map_err(|e| TransformError::new(e.to_string()))
        }),
    })?;
    let gate =
        InputGate::typed::<String, String>("example.input", "Wait for an external instruction.")?;
    let reviewer = Workflow::new(baton::workflow::Config {
        name: "example.reviewer".into(),
        description: "Review a task.".into(),
        build: "team_review example 1".into(),
        stages: vec![transform("review", |task: String| {
            Ok::<_, TransformError>(format!("reviewed: {task}"))
        })],
    })?;
    let team = baton::team::compile::<String, String>(Config {
        name: "example.collaboration".into(),
        description: "Run model decisions alongside background work.".into(),
        coordinator: Binding::new(&coordinator.program()).with_budget(
            Budget::unlimited()
                .with_steps(256)
                .with_effects(128)
                .with_signals(256),
        ),
        workers: vec![
            Binding::new(&gate.program::<String>()).with_budget(budget.clone()),
            Binding::new(&reviewer.program::<String, String>()).with_budget(budget),
        ],
        max_turns: Quota::Finite(4),
        max_tasks: Quota::Finite(2),
        max_concurrent_tasks: 2,
        max_controls_per_turn: 1,
        stall_turns: baton::team::DEFAULT_STALL_TURNS,
    })?;
    Ok(team)
}

/// Runs the team on an in-memory engine to the end and returns its output,
/// [`EXPECTED`].
pub async fn run() -> Result<String, Box<dyn std::error::Error>> {
    use baton::run::{Engine, EngineConfig, MemoryStore, StartId, StartRequest};
    let team = team()?;
    let engine = Engine::new(EngineConfig {
        programs: vec![team.erase()],
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })?;
    let request = StartRequest::new(StartId::new("example", "team-review")?, TASK.to_owned());
    let handle = engine.start(&team, request).await?;
    let output = handle.output().await?;
    handle.join().await?;
    Ok(output)
}
