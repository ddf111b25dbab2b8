//! Workers, coordinators and helpers shared by the team tests.

use std::sync::{Arc, Mutex};

use baton_run::dispatch::{DispatchCall, Dispatcher, ReplayPolicy};
use baton_run::program::{
    Definition, Descriptor, Effect, Execution, ExecutionState, ProgramConfig, Schema, Signal,
    SignalBody, StepError, Transition, configuration_digest, implementation_digest,
};
use baton_run::store::Store;
use baton_run::{
    BoxFuture, ChildKey, EffectId, Engine, EngineConfig, Failure, Name, Payload, ProcessHandle,
    ProcessId, Program, Quota, Settlement, StartId, StartRequest, Status, WaitId,
};
use baton_team::{Binding, Config, Decision, Policy, PolicyConfig, Turn};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub fn key(text: &str) -> ChildKey {
    ChildKey::new(text).expect("valid key")
}

pub fn name(text: &str) -> Name {
    Name::new(text).expect("valid name")
}

pub fn payload(value: Value) -> Payload {
    Payload::from_value(&value).expect("encodes")
}

pub fn request<I>(key: &str, input: I) -> StartRequest<I> {
    StartRequest::new(StartId::new("acme", key).expect("valid"), input)
}

/// What a test worker does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// Completes at once with its input.
    Echo,
    /// Opens a wait for a JSON answer and completes with the answer.
    Ask,
    /// Fails at once with external `test.worker.failed`.
    Fail,
    /// Coordinator only: opens a wait, then decides once answered.
    Pause,
    /// Coordinator only: dispatches to a dispatcher that never settles.
    Hang,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkerState {
    input: Payload,
    phase: u32,
    #[serde(default)]
    wait: Option<WaitId>,
}

struct Worker {
    kind: Kind,
    descriptor: Descriptor,
    decide: Option<baton_team::Decide>,
    pause_on: u64,
}

struct WorkerRun {
    kind: Kind,
    state: WorkerState,
    decide: Option<baton_team::Decide>,
    pause_on: u64,
}

impl Definition for Worker {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(WorkerRun {
            kind: self.kind,
            decide: self.decide.clone(),
            pause_on: self.pause_on,
            state: WorkerState {
                input: input.clone(),
                phase: 0,
                wait: None,
            },
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(WorkerRun {
            kind: self.kind,
            decide: self.decide.clone(),
            pause_on: self.pause_on,
            state: state.decode()?,
        }))
    }
}

impl WorkerRun {
    fn decided(&self) -> Result<Payload, StepError> {
        let turn: Turn = self.state.input.decode()?;
        let decide = self
            .decide
            .as_ref()
            .expect("a coordinator kind has a decide");
        Ok(Payload::encode(&decide(&turn).map_err(StepError)?)?)
    }
}

impl Execution for WorkerRun {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        let consumed = window.len();
        let phase = self.state.phase;
        self.state.phase += 1;
        match (self.kind, phase) {
            (Kind::Echo, _) => Ok(Transition::Complete {
                consumed,
                output: self.state.input.clone(),
            }),
            (Kind::Fail, _) => Err(StepError(Failure::external(
                "test.worker.failed",
                "the worker failed on purpose",
            ))),
            (Kind::Pause, 0) if self.state.input.decode::<Turn>()?.number != self.pause_on => {
                Ok(Transition::Complete {
                    consumed,
                    output: self.decided()?,
                })
            }
            (Kind::Ask | Kind::Pause, 0) => Ok(Transition::Continue {
                consumed,
                effects: vec![Effect::Wait {
                    key: key("question"),
                    request: Payload::null(),
                    answer_schema: Schema::any(),
                }],
            }),
            (Kind::Hang, 0) => Ok(Transition::Continue {
                consumed,
                effects: vec![Effect::dispatch(Payload::null())],
            }),
            (Kind::Ask | Kind::Pause, _) => {
                for (index, signal) in window.iter().enumerate() {
                    match &signal.body {
                        SignalBody::WaitOpened { wait, .. } => self.state.wait = Some(*wait),
                        SignalBody::Input { payload }
                            if signal.wait.is_some() && signal.wait == self.state.wait =>
                        {
                            let output = if self.kind == Kind::Pause {
                                self.decided()?
                            } else {
                                payload.clone()
                            };
                            return Ok(Transition::Complete {
                                consumed: index + 1,
                                output,
                            });
                        }
                        _ => {}
                    }
                }
                Ok(Transition::Wait {
                    consumed,
                    wait: self.state.wait.expect("the wait opened"),
                })
            }
            (Kind::Hang, _) => Err(StepError::other("a hanging coordinator never settles")),
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }
}

/// Never settles.
struct Never;

impl Dispatcher for Never {
    fn replay_policy(&self, _: &Payload) -> ReplayPolicy {
        ReplayPolicy::Never
    }

    fn dispatch(&self, _: DispatchCall) -> BoxFuture<'static, Settlement> {
        Box::pin(std::future::pending())
    }
}

/// A worker program of `kind` named `name` taking any input.
pub fn worker(kind: Kind, name: &str) -> Program {
    Program::new(ProgramConfig {
        definition: Arc::new(Worker {
            kind,
            descriptor: Descriptor::new(name, "A test worker.", Schema::any(), Schema::any())
                .expect("valid"),
            decide: None,
            pause_on: 0,
        }),
        dispatcher: None,
        implementation: implementation_digest("baton-team-tests", "1"),
        configuration: configuration_digest(&(kind, name)).expect("encodes"),
    })
}

/// A coordinator that opens a wait before deciding turn `pause_on`
/// (`Pause`) or hangs on a dispatch (`Hang`).
pub fn special_coordinator(
    kind: Kind,
    pause_on: u64,
    decide: impl Fn(&Turn) -> Result<Decision, Failure> + Send + Sync + 'static,
) -> Program {
    Program::new(ProgramConfig {
        definition: Arc::new(Worker {
            kind,
            descriptor: Descriptor::new(
                "test.coordinator",
                "A test coordinator.",
                Schema::of::<Turn>(),
                Schema::of::<Decision>(),
            )
            .expect("valid"),
            decide: Some(Arc::new(decide)),
            pause_on,
        }),
        dispatcher: Some(Arc::new(Never)),
        implementation: implementation_digest("baton-team-tests", "1"),
        configuration: configuration_digest(&(kind, pause_on)).expect("encodes"),
    })
}

/// Turns seen by a scripted coordinator.
#[derive(Clone, Default)]
pub struct Seen(pub Arc<Mutex<Vec<Turn>>>);

impl Seen {
    pub fn record(&self, turn: &Turn) {
        let mut turns = self.0.lock().expect("not poisoned");
        // Re-runs of the same turn (restore checks) are not new turns.
        if turns.last().is_none_or(|last| last.number != turn.number) {
            turns.push(turn.clone());
        }
    }

    pub fn turns(&self) -> Vec<Turn> {
        self.0.lock().expect("not poisoned").clone()
    }
}

/// A scripted coordinator.
pub fn policy(
    build: &str,
    decide: impl Fn(&Turn) -> Result<Decision, Failure> + Send + Sync + 'static,
) -> Program {
    Policy::new(PolicyConfig {
        name: "test.coordinator".into(),
        description: "A scripted coordinator.".into(),
        build: build.into(),
        settings: Payload::null(),
        decide: Arc::new(decide),
    })
    .expect("valid policy")
    .program()
    .erase()
}

pub fn unexpected(turn: &Turn) -> Failure {
    Failure::execution(
        "test.turn.unexpected",
        format!("unexpected turn {}", turn.number),
    )
}

/// A team config with generous limits.
pub fn config(coordinator: Program, workers: Vec<Program>) -> Config {
    Config {
        name: "test.team".into(),
        description: "A test team.".into(),
        coordinator: Binding::new(&coordinator),
        workers: workers.iter().map(Binding::new).collect(),
        max_turns: Quota::Unlimited,
        max_tasks: Quota::Unlimited,
        max_concurrent_tasks: 8,
        max_controls_per_turn: 4,
        stall_turns: baton_team::DEFAULT_STALL_TURNS,
    }
}

pub fn engine<I, O>(store: Arc<dyn Store>, program: &Program<I, O>) -> Engine {
    Engine::new(EngineConfig {
        programs: vec![program.erase()],
        ..EngineConfig::new(store)
    })
    .expect("the engine configuration is valid")
}

/// The id of a worker's first wait (declared by its first step).
pub fn first_wait(process: ProcessId) -> WaitId {
    WaitId::for_effect(EffectId::new(process, 0, 0))
}

/// Polls until the process has an open wait and is waiting on it.
pub async fn open_wait<O>(handle: &ProcessHandle<O>) -> WaitId {
    for _ in 0..100_000 {
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

/// Polls until the process has terminated in the store's view.
pub async fn terminated<O>(handle: &ProcessHandle<O>) {
    for _ in 0..100_000 {
        let view = handle.inspect().await.expect("inspects");
        if view
            .process(handle.id())
            .is_some_and(|process| process.status.is_terminal())
        {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never terminated");
}

pub fn json_of<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).expect("encodes")
}
