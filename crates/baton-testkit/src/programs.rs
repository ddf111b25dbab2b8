//! The test programs of [`engine_conformance`](crate::engine_conformance),
//! public so that the kernel's own tests and each backend's tests drive the
//! very same programs: one program per [`Kind`], a [`parent`] that runs
//! children by a [`Plan`], and the helpers the scenarios start them with.
//!
//! Every start id the helpers make is in the scope [`SCOPE`].

mod parent;

pub use parent::{Plan, parent};

use std::sync::Arc;

use baton_run::dispatch::Dispatcher;
use baton_run::program::{
    Definition, Descriptor, Effect, Execution, ExecutionState, ProgramConfig, Schema, Signal,
    SignalBody, StepError, Transition, configuration_digest, implementation_digest,
};
use baton_run::store::Store;
use baton_run::{
    ChildKey, Engine, EngineConfig, Failure, Meters, Name, Payload, Program, StartId, StartRequest,
    WaitId,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// What a test program does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// Dispatches each input item (one transition), completes with the results in order.
    Dispatch,
    /// Opens a wait for a boolean answer and completes with the answer.
    Ask,
    /// Continues with no effects forever.
    Loop,
    /// Panics on its first step.
    Panic,
    /// Dispatches `{"tokens": n}` reserving n tokens, completes with the settlement.
    Metered,
    /// Completes at once with its input.
    Echo,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct State {
    kind: Kind,
    input: Value,
    phase: u32,
    #[serde(default)]
    wait: Option<WaitId>,
}

struct TestDefinition {
    kind: Kind,
    descriptor: Descriptor,
}

struct TestExecution {
    state: State,
}

impl Definition for TestDefinition {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(TestExecution {
            state: State {
                kind: self.kind,
                input: input.to_value(),
                phase: 0,
                wait: None,
            },
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        let state: State = state.decode()?;
        if state.kind != self.kind {
            return Err(StepError::other("state of another kind"));
        }
        Ok(Box::new(TestExecution { state }))
    }
}

fn settled_outputs(window: &[Signal]) -> Result<Vec<Value>, StepError> {
    window
        .iter()
        .map(|signal| match &signal.body {
            SignalBody::Settled { settlement, .. } => {
                Ok(serde_json::to_value(settlement).expect("encodes"))
            }
            other => Err(StepError::other(format!("unexpected signal {other:?}"))),
        })
        .collect()
}

impl Execution for TestExecution {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        let phase = self.state.phase;
        self.state.phase += 1;
        match (self.state.kind, phase) {
            (Kind::Dispatch, 0) => {
                // A list dispatches each item; any other value dispatches itself.
                let items = match &self.state.input {
                    Value::Array(items) => items.clone(),
                    other => vec![other.clone()],
                };
                let effects = items
                    .iter()
                    .map(|item| Payload::from_value(item).map(Effect::dispatch))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Transition::Continue {
                    consumed: 0,
                    effects,
                })
            }
            (Kind::Dispatch | Kind::Metered, 1) => {
                let outputs = settled_outputs(window)?;
                Ok(Transition::Complete {
                    consumed: window.len(),
                    output: Payload::encode(&outputs)?,
                })
            }
            (Kind::Metered, 0) => {
                let tokens = self.state.input.as_u64().unwrap_or(0);
                let mut reserve = Meters::new();
                reserve.insert(Name::new("tokens").expect("valid"), tokens);
                Ok(Transition::Continue {
                    consumed: 0,
                    effects: vec![Effect::Dispatch {
                        request: Payload::encode(&json!({ "tokens": tokens }))?,
                        reserve,
                        retry: baton_run::dispatch::RetryPolicy::none(),
                    }],
                })
            }
            (Kind::Ask, 0) => Ok(Transition::Continue {
                consumed: 0,
                effects: vec![Effect::Wait {
                    key: ChildKey::new("approval").expect("valid"),
                    request: Payload::from_value(&self.state.input)?,
                    answer_schema: Schema::of::<bool>(),
                }],
            }),
            (Kind::Ask, _) => {
                // Consume leading unaddressed notes; wait for the addressed answer.
                for (index, signal) in window.iter().enumerate() {
                    match (&signal.body, self.state.wait) {
                        (SignalBody::WaitOpened { wait, .. }, _) => self.state.wait = Some(*wait),
                        (SignalBody::Input { payload }, Some(wait))
                            if signal.wait == Some(wait) =>
                        {
                            return Ok(Transition::Complete {
                                consumed: index + 1,
                                output: payload.clone(),
                            });
                        }
                        _ => {}
                    }
                }
                let wait = self
                    .state
                    .wait
                    .ok_or_else(|| StepError::other("no wait opened"))?;
                Ok(Transition::Wait {
                    consumed: window.len(),
                    wait,
                })
            }
            (Kind::Echo, _) => Ok(Transition::Complete {
                consumed: window.len(),
                output: Payload::from_value(&self.state.input)?,
            }),
            (Kind::Loop, _) => Ok(Transition::Continue {
                consumed: window.len(),
                effects: Vec::new(),
            }),
            (Kind::Panic, _) => panic!("the test program panics on purpose"),
            (kind, phase) => Ok(Transition::Fail {
                consumed: 0,
                failure: Failure::execution(
                    "test.unexpected",
                    format!("{kind:?} has no phase {phase}"),
                ),
            }),
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }
}

/// Binds the test program of `kind` (named `test.<kind>`); the configuration
/// digest covers the kind. Its input schema is any value, a string for
/// [`Kind::Ask`] and a number for [`Kind::Metered`]; it accepts unaddressed
/// notes `{"note": "..."}` as signals. A [`Kind::Dispatch`] or
/// [`Kind::Metered`] program needs a `dispatcher`.
pub fn program(kind: Kind, dispatcher: Option<Arc<dyn Dispatcher>>) -> Program<Value, Value> {
    let name = format!("test.{}", format!("{kind:?}").to_lowercase());
    let input = match kind {
        Kind::Dispatch => Schema::any(),
        Kind::Ask => Schema::of::<String>(),
        Kind::Metered => Schema::of::<u64>(),
        Kind::Loop | Kind::Panic | Kind::Echo => Schema::any(),
    };
    let descriptor = Descriptor::new(&name, "A test program.", input, Schema::any())
        .expect("valid")
        .with_signal_schema(Schema::parse(r#"{"type":"object","properties":{"note":{"type":"string"}},"required":["note"],"additionalProperties":false}"#).expect("valid"));
    Program::new(ProgramConfig {
        definition: Arc::new(TestDefinition { kind, descriptor }),
        dispatcher,
        implementation: implementation_digest(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        configuration: configuration_digest(&kind).expect("encodes"),
    })
}

/// The scope of every start id the helpers make.
pub const SCOPE: &str = "acme";

/// The start id `key` in [`SCOPE`].
pub fn start_id(key: &str) -> StartId {
    StartId::new(SCOPE, key).expect("valid")
}

/// An engine on `store` with `programs` registered.
pub fn engine(store: Arc<dyn Store>, programs: &[&Program<Value, Value>]) -> Engine {
    let mut config = EngineConfig::new(store);
    for program in programs {
        config.programs.push(program.erase());
    }
    Engine::new(config).expect("the engine configuration is valid")
}

/// A start of a [`program`] under the id `key` with `input`.
pub fn request<I: Serialize>(key: &str, input: I) -> StartRequest<Value> {
    StartRequest::new(start_id(key), serde_json::to_value(input).expect("encodes"))
}

/// Polls the tree until the process of `handle` waits on an open wait, and
/// returns the wait.
pub async fn open_wait<O>(handle: &baton_run::ProcessHandle<O>) -> WaitId {
    for _ in 0..10_000 {
        let view = handle.inspect().await.expect("inspects");
        if let Some(process) = view.process(handle.id())
            && let Some(wait) = process.open_waits.first()
            && process.status == baton_run::Status::Waiting
        {
            return wait.id;
        }
        tokio::task::yield_now().await;
    }
    panic!("no wait opened");
}
