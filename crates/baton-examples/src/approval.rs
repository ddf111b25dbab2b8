//! A program that asks for approval, runs on an in-memory engine, and
//! completes once the host answers: the program of the `baton` facade's
//! crate documentation and of the guide `docs/guides/write-a-program.md`.
//!
//! Run it with `cargo run -p baton-examples --example approval`; it prints
//! `waiting on w_…; answering yes` and then `deploy: approved=true`.

use std::error::Error;
use std::sync::Arc;

use baton::run::program::{
    Definition, Descriptor, Effect, Execution, ExecutionState, ProgramConfig, Schema, Signal,
    SignalBody, StepError, Transition, configuration_digest, implementation_digest,
};
use baton::run::{
    ChildKey, Condition, Engine, EngineConfig, MemoryStore, Payload, Program, SignalId,
    SignalRequest, StartId, StartRequest, WaitId,
};
use serde::{Deserialize, Serialize};

/// The behaviour: immutable, shared by every process of the program.
struct Approval {
    descriptor: Descriptor,
}

/// Everything a process remembers between steps; recorded after every step.
#[derive(Serialize, Deserialize)]
struct State {
    input: String,
    asked: bool,
    wait: Option<WaitId>,
}

struct Run(State);

impl Definition for Approval {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        let state = State {
            input: input.decode()?,
            asked: false,
            wait: None,
        };
        Ok(Box::new(Run(state)))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(Run(state.decode()?)))
    }
}

impl Execution for Run {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        let state = &mut self.0;
        if !state.asked {
            // Declare the wait; the engine opens it and reports its id.
            state.asked = true;
            let ask = Effect::Wait {
                key: ChildKey::new("approval").map_err(StepError::other)?,
                request: Payload::encode(&format!("approve {}?", state.input))?,
                answer_schema: Schema::of::<bool>(),
            };
            return Ok(Transition::Continue {
                consumed: 0,
                effects: vec![ask],
            });
        }
        let Some(signal) = window.first() else {
            return Err(StepError::other("stepped without a signal"));
        };
        match &signal.body {
            // The wait is open: sleep until an answer addressed to it arrives.
            SignalBody::WaitOpened { wait, .. } => {
                state.wait = Some(*wait);
                Ok(Transition::Wait {
                    consumed: 1,
                    wait: *wait,
                })
            }
            // The answer, already validated against the answer schema.
            SignalBody::Input { payload } if signal.wait.is_some() && signal.wait == state.wait => {
                let answer: bool = payload.decode()?;
                let output = Payload::encode(&format!("{}: approved={answer}", state.input))?;
                Ok(Transition::Complete {
                    consumed: 1,
                    output,
                })
            }
            _ => Err(StepError::other("unexpected signal")),
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.0)
    }
}

/// Binds the approval program: `String` in (what to approve), `String` out.
pub fn program() -> Result<Program<String, String>, Box<dyn Error>> {
    Ok(Program::<String, String>::new(ProgramConfig {
        definition: Arc::new(Approval {
            descriptor: Descriptor::typed::<String, String>(
                "example.approval",
                "Asks a person to approve a job.",
            )?,
        }),
        dispatcher: None,
        implementation: implementation_digest(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        configuration: configuration_digest(&())?,
    }))
}

/// Starts the program on an in-memory engine, answers its wait with yes,
/// and returns the lines the example prints: the wait it answers, then the
/// output.
pub async fn run() -> Result<Vec<String>, Box<dyn Error>> {
    let program = program()?;
    let engine = Engine::new(EngineConfig {
        programs: vec![program.erase()],
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })?;
    let start = StartRequest::new(StartId::new("acme", "job-1")?, "deploy".to_string());
    let handle = engine.start(&program, start).await?;

    // The wait opens once the tree's task has stepped and committed: await
    // that moment (it also resolves if the tree can no longer open a wait).
    let view = handle.until(Condition::WaitOpened).await?;
    let wait = view
        .root()
        .open_waits
        .first()
        .ok_or("the approval wait never opened")?
        .id;
    let mut lines = vec![format!("waiting on {wait}; answering yes")];

    handle
        .signal(SignalRequest {
            id: SignalId::new("answer-1")?,
            wait: Some(wait),
            payload: Payload::encode(&true)?,
        })
        .await?;
    lines.push(handle.output().await?);
    Ok(lines)
}
