//! Child programs and helpers shared by the workflow tests.

use std::sync::Arc;

use baton_run::program::{
    Definition, Descriptor, Effect, Execution, ExecutionState, ProgramConfig, Schema, Signal,
    SignalBody, StepError, Transition, configuration_digest, implementation_digest,
};
use baton_run::{
    ChildKey, Engine, EngineConfig, Event, EventKind, Failure, MemoryStore, Payload, ProcessHandle,
    ProcessId, Program, SignalId, SignalRequest, StartId, StartRequest, Status, WaitId,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a test child does with its `u64` input.
#[derive(Clone, Copy, Debug, Serialize)]
pub enum Op {
    /// Completes at once with input + k.
    Add(u64),
    /// Fails at once with external `test.child.failed`.
    Fail,
    /// Opens a wait for an `i64`; completes with it, or fails
    /// `test.child.refused` when it is negative.
    Ask,
}

struct ChildDefinition {
    op: Op,
    descriptor: Descriptor,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChildState {
    input: u64,
    asked: bool,
    wait: Option<WaitId>,
}

struct ChildRun {
    op: Op,
    state: ChildState,
}

impl Definition for ChildDefinition {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }
    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(ChildRun {
            op: self.op,
            state: ChildState {
                input: input.decode()?,
                asked: false,
                wait: None,
            },
        }))
    }
    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(ChildRun {
            op: self.op,
            state: state.decode()?,
        }))
    }
}

impl Execution for ChildRun {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        let consumed = window.len();
        match self.op {
            Op::Add(k) => Ok(Transition::Complete {
                consumed,
                output: Payload::encode(&(self.state.input + k))?,
            }),
            Op::Fail => Ok(Transition::Fail {
                consumed,
                failure: Failure::external("test.child.failed", "this child always fails"),
            }),
            Op::Ask if !self.state.asked => {
                self.state.asked = true;
                Ok(Transition::Continue {
                    consumed,
                    effects: vec![Effect::Wait {
                        key: ChildKey::new("answer")?,
                        request: Payload::encode(&self.state.input)?,
                        answer_schema: Schema::of::<i64>(),
                    }],
                })
            }
            Op::Ask => {
                for (index, signal) in window.iter().enumerate() {
                    match &signal.body {
                        SignalBody::WaitOpened { wait, .. } => self.state.wait = Some(*wait),
                        SignalBody::Input { payload } if signal.wait.is_some() => {
                            let answer: i64 = payload.decode()?;
                            return Ok(match u64::try_from(answer) {
                                Ok(answer) => Transition::Complete {
                                    consumed: index + 1,
                                    output: Payload::encode(&answer)?,
                                },
                                Err(_) => Transition::Fail {
                                    consumed: index + 1,
                                    failure: Failure::external(
                                        "test.child.refused",
                                        "a negative answer",
                                    ),
                                },
                            });
                        }
                        _ => {}
                    }
                }
                let wait = self.state.wait.ok_or_else(|| StepError::other("no wait"))?;
                Ok(Transition::Wait { consumed, wait })
            }
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }
}

/// A `u64 → u64` child program.
pub fn child(op: Op) -> Program<u64, u64> {
    let name = match op {
        Op::Add(_) => "test.add",
        Op::Fail => "test.fail",
        Op::Ask => "test.ask",
    };
    Program::new(ProgramConfig {
        definition: Arc::new(ChildDefinition {
            op,
            descriptor: Descriptor::typed::<u64, u64>(name, "A test child.").expect("valid"),
        }),
        dispatcher: None,
        implementation: implementation_digest(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        configuration: configuration_digest(&op).expect("encodes"),
    })
}

pub fn key(text: &str) -> ChildKey {
    ChildKey::new(text).expect("valid key")
}

pub fn engine<I, O>(program: &Program<I, O>) -> Engine {
    Engine::new(EngineConfig {
        programs: vec![program.erase()],
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })
    .expect("the engine configuration is valid")
}

pub fn request<I>(key: &str, input: I) -> StartRequest<I> {
    StartRequest::new(StartId::new("acme", key).expect("valid"), input)
}

/// Polls until the process has an open wait and is waiting on it.
pub async fn open_wait<O>(handle: &ProcessHandle<O>) -> WaitId {
    for _ in 0..10_000 {
        let view = handle.inspect().await.expect("inspects");
        if let Some(process) = view.process(handle.id())
            && let Some(wait) = process.open_waits.first()
            && process.status == Status::Waiting
        {
            return wait.id;
        }
        tokio::task::yield_now().await;
    }
    panic!("no wait opened");
}

/// Answers a child's open wait.
pub async fn answer<O>(root: &ProcessHandle<O>, child_key: &str, answer: i64) {
    let child = root.child::<Value>(&key(child_key));
    let wait = open_wait(&child).await;
    child
        .signal(SignalRequest {
            id: SignalId::new(format!("answer-{child_key}")).expect("valid"),
            wait: Some(wait),
            payload: Payload::encode(&answer).expect("encodes"),
        })
        .await
        .expect("admitted");
}

/// Drains an event receiver.
pub fn drain(events: &mut baton_run::Events) -> Vec<Event> {
    let mut all = Vec::new();
    while let Some(event) = events.try_recv().expect("no event is dropped") {
        all.push(event);
    }
    all
}

/// The most children of `parent` alive at once, and how many started, per the events.
pub fn peak_children(events: &[Event], parent: ProcessId) -> (usize, usize) {
    let mut alive = std::collections::BTreeSet::new();
    let (mut peak, mut started) = (0, 0);
    let mut children = std::collections::BTreeSet::new();
    for event in events {
        match &event.kind {
            EventKind::ChildStarted { parent: p, .. } if *p == parent => {
                children.insert(event.process);
                alive.insert(event.process);
                started += 1;
                peak = peak.max(alive.len());
            }
            EventKind::Terminated { .. } if children.contains(&event.process) => {
                alive.remove(&event.process);
            }
            _ => {}
        }
    }
    (peak, started)
}
