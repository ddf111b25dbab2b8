//! A parent program that starts, waits for, signals and cancels children.

use std::sync::Arc;

use baton_run::program::{
    Boundary, ChildSignal, Condition, Definition, Descriptor, Effect, Execution, ExecutionState,
    Grant, ProgramConfig, Schema, Signal, SignalBody, StepError, Transition, configuration_digest,
    implementation_digest,
};
use baton_run::{Budget, Capabilities, ChildKey, Payload, Program, Settlement, SignalId, Status};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How a [`parent`] runs its children. Its first step starts one child per
/// key of its input (a list of keys) and waits for them; it completes with
/// `{"started": [[key, "ok" or refusal code]], "ready": [[key, status,
/// output]], "receipts": ["delivered" or failure code]}`.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    /// The budget granted to each child.
    pub child_budget: Budget,
    /// The capabilities granted to each child.
    pub child_capabilities: Capabilities,
    /// The boundary of the wait for the children.
    pub boundary: Boundary,
    /// The condition of the wait for the children.
    pub condition: Condition,
    /// After the wait, cancel children not yet ready and wait for them to drain.
    pub cancel_rest: bool,
    /// Instead of waiting: signal the first child a note, then cancel it and
    /// wait for it to drain.
    pub note: bool,
}

impl Plan {
    /// Waits for every child at `boundary` under `condition`; each child is
    /// granted 2 steps, 1 effect and 4 signals and no capabilities.
    pub fn new(boundary: Boundary, condition: Condition) -> Plan {
        Plan {
            child_budget: Budget::unlimited()
                .with_steps(2)
                .with_effects(1)
                .with_signals(4),
            child_capabilities: Capabilities::none(),
            boundary,
            condition,
            cancel_rest: false,
            note: false,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct ParentState {
    keys: Vec<String>,
    phase: u32,
    started: Vec<(String, String)>,
    ready: Vec<(String, Status, Value)>,
    receipts: Vec<String>,
}

struct Parent {
    plan: Plan,
    child: Program,
    descriptor: Descriptor,
}

struct ParentRun {
    plan: Plan,
    child: baton_run::Digest,
    state: ParentState,
}

impl Definition for Parent {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }
    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(ParentRun {
            plan: self.plan.clone(),
            child: self.child.reference().digest,
            state: ParentState {
                keys: input.decode()?,
                ..ParentState::default()
            },
        }))
    }
    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(ParentRun {
            plan: self.plan.clone(),
            child: self.child.reference().digest,
            state: state.decode()?,
        }))
    }
    fn children(&self) -> Vec<Program> {
        vec![self.child.clone()]
    }
}

fn key(text: &str) -> ChildKey {
    ChildKey::new(text).expect("valid key")
}

impl ParentRun {
    fn observe(&mut self, window: &[Signal]) {
        for signal in window {
            match &signal.body {
                SignalBody::ChildStarted { key, failure, .. } => self.state.started.push((
                    key.to_string(),
                    failure
                        .as_ref()
                        .map_or("ok".to_owned(), |f| f.code().to_owned()),
                )),
                SignalBody::ChildrenReady { children, .. } => {
                    for child in children {
                        if self
                            .state
                            .ready
                            .iter()
                            .all(|(k, _, _)| k != child.key.as_str())
                        {
                            let output = child
                                .termination
                                .output()
                                .map_or(Value::Null, Payload::to_value);
                            self.state.ready.push((
                                child.key.to_string(),
                                child.termination.status(),
                                output,
                            ));
                        }
                    }
                }
                SignalBody::ControlReceipt { result, .. } => {
                    self.state.receipts.push(match result {
                        Settlement::Succeeded { .. } => "delivered".to_owned(),
                        Settlement::Failed { failure, .. } => failure.code().to_owned(),
                        Settlement::Unknown { .. } => "unknown".to_owned(),
                    })
                }
                _ => {}
            }
        }
    }

    fn started_keys(&self) -> Vec<ChildKey> {
        self.state
            .started
            .iter()
            .filter(|(_, code)| code == "ok")
            .map(|(k, _)| key(k))
            .collect()
    }

    fn output(&self) -> Result<Transition, StepError> {
        Ok(Transition::Complete {
            consumed: 0,
            output: Payload::encode(&json!({
                "started": self.state.started,
                "ready": self.state.ready,
                "receipts": self.state.receipts,
            }))?,
        })
    }
}

impl Execution for ParentRun {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        self.observe(window);
        let phase = self.state.phase;
        self.state.phase += 1;
        let consumed = window.len();
        let keys: Vec<ChildKey> = self.state.keys.iter().map(|k| key(k)).collect();
        let start = |k: &ChildKey| -> Result<Effect, StepError> {
            Ok(Effect::StartChild {
                key: k.clone(),
                program: self.child,
                input: Payload::encode(&k.as_str())?,
                budget: self.plan.child_budget.clone(),
                capabilities: self.plan.child_capabilities.clone(),
                grant: Grant::Exact,
            })
        };
        match (phase, self.plan.note) {
            (0, false) => {
                let mut effects = keys.iter().map(start).collect::<Result<Vec<_>, _>>()?;
                effects.push(Effect::WaitChildren {
                    keys: keys.clone(),
                    boundary: self.plan.boundary,
                    condition: self.plan.condition,
                });
                Ok(Transition::Continue { consumed, effects })
            }
            (0, true) => Ok(Transition::Continue {
                consumed,
                effects: vec![
                    start(&keys[0])?,
                    Effect::SignalChild {
                        key: keys[0].clone(),
                        signal: ChildSignal {
                            id: SignalId::new("note-1").expect("valid"),
                            wait: None,
                            payload: Payload::encode(&json!({"note": "from the parent"}))?,
                        },
                    },
                ],
            }),
            (1, true) => Ok(Transition::Continue {
                consumed,
                effects: vec![
                    Effect::CancelChild {
                        key: keys[0].clone(),
                        reason: "done".into(),
                    },
                    Effect::WaitChildren {
                        keys: vec![keys[0].clone()],
                        boundary: Boundary::Drained,
                        condition: Condition::All,
                    },
                ],
            }),
            (1, false) if self.plan.cancel_rest => {
                let rest: Vec<ChildKey> = self
                    .started_keys()
                    .into_iter()
                    .filter(|k| self.state.ready.iter().all(|(r, _, _)| r != k.as_str()))
                    .collect();
                if rest.is_empty() {
                    return self.output().map(|t| with_consumed(t, consumed));
                }
                let mut effects: Vec<Effect> = rest
                    .iter()
                    .map(|k| Effect::CancelChild {
                        key: k.clone(),
                        reason: "a sibling won".into(),
                    })
                    .collect();
                effects.push(Effect::WaitChildren {
                    keys: rest,
                    boundary: Boundary::Drained,
                    condition: Condition::All,
                });
                Ok(Transition::Continue { consumed, effects })
            }
            _ => self.output().map(|t| with_consumed(t, consumed)),
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }
}

fn with_consumed(transition: Transition, consumed: usize) -> Transition {
    match transition {
        Transition::Complete { output, .. } => Transition::Complete { consumed, output },
        other => other,
    }
}

/// Binds a parent that runs `child` (a test [`program`](super::program))
/// by `plan`; the configuration digest covers the plan.
pub fn parent(plan: Plan, child: &Program<Value, Value>) -> Program<Vec<String>, Value> {
    let descriptor = Descriptor::new(
        "test.parent",
        "Runs children.",
        Schema::of::<Vec<String>>(),
        Schema::any(),
    )
    .expect("valid");
    let configuration = configuration_digest(&plan).expect("encodes");
    Program::new(ProgramConfig {
        definition: Arc::new(Parent {
            plan,
            child: child.erase(),
            descriptor,
        }),
        dispatcher: None,
        implementation: implementation_digest(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        configuration,
    })
}
