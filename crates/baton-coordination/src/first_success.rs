//! `FirstSuccess`: race candidates, keep the first accepted outcome in request order.

use std::collections::BTreeSet;
use std::sync::Arc;

use baton_run::program::{
    Boundary, Condition, Definition, Descriptor, Effect, Execution, ExecutionState, Grant,
    ProgramConfig, Schema, Signal, SignalBody, StepError, Transition, configuration_digest,
    implementation_digest,
};
use baton_run::{
    Budget, Capabilities, ChildKey, Digest, Failure, FailureKind, Payload, ProcessId, Program,
    Settlement, Status, Termination,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// One child to race: a key, one of the declared candidate programs (by
/// its exact `ProgramRef` digest), its input, budget and capabilities.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    /// The child's key, unique among the candidates.
    pub key: ChildKey,
    /// The exact program (`program.reference().digest`).
    #[schemars(with = "String")]
    pub program: Digest,
    /// The child's input.
    pub input: Payload,
    /// The child's budget (debited from the race for good).
    #[serde(default)]
    pub budget: Budget,
    /// The child's capabilities.
    #[serde(default)]
    pub capabilities: Capabilities,
}

/// Why a [`Candidate`] could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CandidateError {
    /// The key is not a valid child key.
    #[error(transparent)]
    Key(#[from] baton_run::IdError),
    /// The input does not encode or fails the program's input schema.
    #[error("candidate input rejected: {0}")]
    Input(Failure),
}

impl Candidate {
    /// A candidate with an unlimited budget and no capabilities; the input
    /// is checked against the program's input schema now, so a bad input
    /// (such as a zero deadline) is an error here rather than a refused start.
    pub fn new<I: Serialize, O>(
        key: &str,
        program: &Program<I, O>,
        input: &I,
    ) -> Result<Candidate, CandidateError> {
        let input = Payload::encode(input).map_err(|error| {
            CandidateError::Input(Failure::contract(
                "execution.input.invalid",
                error.to_string(),
            ))
        })?;
        program
            .descriptor()
            .check_input(&input)
            .map_err(CandidateError::Input)?;
        Ok(Candidate {
            key: ChildKey::new(key)?,
            program: program.reference().digest,
            input,
            budget: Budget::unlimited(),
            capabilities: Capabilities::none(),
        })
    }

    /// Grants the child this budget.
    pub fn with_budget(mut self, budget: Budget) -> Candidate {
        self.budget = budget;
        self
    }

    /// Grants the child these capabilities.
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> Candidate {
        self.capabilities = capabilities;
        self
    }
}

/// A candidate's start result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Start {
    /// The candidate's key.
    pub key: ChildKey,
    /// Its process, when it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessId>,
    /// Why its start was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
}

/// A candidate that reached its result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    /// The candidate's key.
    pub key: ChildKey,
    /// Its process.
    pub process: ProcessId,
    /// How it ended.
    pub termination: Termination,
}

impl Outcome {
    /// Whether it completed.
    pub fn completed(&self) -> bool {
        self.termination.status() == Status::Completed
    }

    /// Its output, when it completed.
    pub fn output(&self) -> Option<&Payload> {
        self.termination.output()
    }
}

/// What a [`FirstSuccess`] completes with. No winner is a valid result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Race {
    /// The first accepted outcome in request order, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub winner: Option<Outcome>,
    /// Every candidate's start result, in request order.
    pub starts: Vec<Start>,
    /// Every outcome observed, in request order.
    pub outcomes: Vec<Outcome>,
}

/// The pure acceptance test: `Ok(true)` accepts an outcome, `Ok(false)`
/// rejects it, an error fails the race.
pub type Accept = Arc<dyn Fn(&Outcome) -> Result<bool, String> + Send + Sync>;

/// How to build a [`FirstSuccess`].
#[derive(Clone)]
pub struct FirstSuccessConfig {
    /// The descriptor name (lowercase dotted).
    pub name: String,
    /// What it races, for people.
    pub description: String,
    /// The identity of the code that built `accept` (closures cannot be
    /// hashed); change it whenever `accept` changes behaviour.
    pub build: String,
    /// The programs candidates may run.
    pub candidates: Vec<Program>,
    /// The most candidates one race may start (at least 1).
    pub max_candidates: u32,
    /// The acceptance test.
    pub accept: Accept,
}

impl std::fmt::Debug for FirstSuccessConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FirstSuccessConfig")
            .field("name", &self.name)
            .field("candidates", &self.candidates)
            .field("max_candidates", &self.max_candidates)
            .finish_non_exhaustive()
    }
}

/// Starts every candidate at once, waits for `Any` of the remaining ones to
/// reach its result, and applies `accept` to the outcomes in request order;
/// the first accepted is the winner. Without a winner it waits again while
/// candidates remain. It completes with a [`Race`]; completing cancels the
/// losers still running (the kernel cancels a completed process's children).
#[derive(Clone)]
pub struct FirstSuccess {
    inner: Arc<Inner>,
}

struct Inner {
    descriptor: Descriptor,
    candidates: Vec<Program>,
    accept: Accept,
    implementation: Digest,
    configuration: Digest,
}

impl std::fmt::Debug for FirstSuccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FirstSuccess")
            .field("name", self.inner.descriptor.name())
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct Digested<'a> {
    name: &'a str,
    description: &'a str,
    candidates: Vec<Digest>,
    max_candidates: u32,
}

impl FirstSuccess {
    /// Validates a configuration: `max_candidates ≥ 1`, at least one
    /// candidate program, a non-empty build identity, a valid descriptor.
    /// The input schema bounds the list to 1..=`max_candidates` candidates.
    pub fn new(config: FirstSuccessConfig) -> Result<FirstSuccess, ConfigError> {
        if config.max_candidates == 0 {
            return Err(ConfigError::ZeroMaxCandidates);
        }
        if config.candidates.is_empty() {
            return Err(ConfigError::NoCandidatePrograms);
        }
        if config.build.trim().is_empty() {
            return Err(ConfigError::Build);
        }
        let mut input = Schema::of::<Vec<Candidate>>().json().to_value();
        if let Some(object) = input.as_object_mut() {
            object.insert("minItems".into(), 1.into());
            object.insert("maxItems".into(), config.max_candidates.into());
        }
        let input = Payload::from_value(&input)
            .map_err(baton_run::program::SchemaError::from)
            .and_then(Schema::new)
            .map_err(|error| ConfigError::Encode {
                message: error.to_string(),
            })?;
        let descriptor = Descriptor::new(
            &config.name,
            config.description.clone(),
            input,
            Schema::of::<Race>(),
        )?;
        let configuration = configuration_digest(&Digested {
            name: &config.name,
            description: &config.description,
            candidates: config
                .candidates
                .iter()
                .map(|program| program.reference().digest)
                .collect(),
            max_candidates: config.max_candidates,
        })
        .map_err(|error| ConfigError::Encode {
            message: error.to_string(),
        })?;
        Ok(FirstSuccess {
            inner: Arc::new(Inner {
                descriptor,
                candidates: config.candidates,
                accept: config.accept,
                implementation: implementation_digest(
                    env!("CARGO_PKG_NAME"),
                    &format!("{}+{}", env!("CARGO_PKG_VERSION"), config.build),
                ),
                configuration,
            }),
        })
    }

    /// Binds the race as a program.
    pub fn program(&self) -> Program<Vec<Candidate>, Race> {
        Program::new(ProgramConfig {
            definition: Arc::new(self.clone()),
            dispatcher: None,
            implementation: self.inner.implementation,
            configuration: self.inner.configuration,
        })
    }
}

/// The race's recorded state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct State {
    /// The candidates, in request order.
    candidates: Vec<Candidate>,
    /// Whether the starts were declared.
    launched: bool,
    /// Start results, in request order once all arrived.
    starts: Vec<Start>,
    /// Outcomes observed, in request order.
    outcomes: Vec<Outcome>,
}

struct Run {
    inner: Arc<Inner>,
    state: State,
}

impl Definition for FirstSuccess {
    fn descriptor(&self) -> &Descriptor {
        &self.inner.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        let candidates: Vec<Candidate> = input.decode()?;
        let mut keys = BTreeSet::new();
        if let Some(duplicate) = candidates.iter().find(|c| !keys.insert(&c.key)) {
            return Err(StepError::classified(
                FailureKind::Contract,
                "coordination.first_success.duplicate_key",
                format!("candidate key {} is used twice", duplicate.key),
            ));
        }
        Ok(Box::new(Run {
            inner: self.inner.clone(),
            state: State {
                candidates,
                launched: false,
                starts: Vec::new(),
                outcomes: Vec::new(),
            },
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(Run {
            inner: self.inner.clone(),
            state: state.decode()?,
        }))
    }

    fn children(&self) -> Vec<Program> {
        self.inner.candidates.clone()
    }
}

fn protocol(message: impl Into<String>) -> StepError {
    StepError(Failure::contract(
        "coordination.first_success.protocol_violated",
        message,
    ))
}

impl Run {
    fn position(&self, key: &ChildKey) -> Result<usize, StepError> {
        self.state
            .candidates
            .iter()
            .position(|candidate| &candidate.key == key)
            .ok_or_else(|| protocol(format!("{key} is not a candidate")))
    }

    /// Folds start results and outcomes in; returns whether a children wait was refused.
    fn observe(&mut self, window: &[Signal]) -> Result<bool, StepError> {
        let mut refused = false;
        for signal in window {
            match &signal.body {
                SignalBody::ChildStarted {
                    key,
                    process,
                    failure,
                    ..
                } => {
                    self.position(key)?;
                    if self.state.starts.iter().any(|start| &start.key == key) {
                        return Err(protocol(format!("a second start result for {key}")));
                    }
                    self.state.starts.push(Start {
                        key: key.clone(),
                        process: *process,
                        failure: failure.clone(),
                    });
                }
                SignalBody::ChildrenReady { children, .. } => {
                    for child in children {
                        if self.state.outcomes.iter().any(|o| o.key == child.key) {
                            continue;
                        }
                        let position = self.position(&child.key)?;
                        let at = self
                            .state
                            .outcomes
                            .iter()
                            .position(|o| self.position(&o.key).is_ok_and(|other| other > position))
                            .unwrap_or(self.state.outcomes.len());
                        self.state.outcomes.insert(
                            at,
                            Outcome {
                                key: child.key.clone(),
                                process: child.process,
                                termination: child.termination.clone(),
                            },
                        );
                    }
                }
                // A children wait is refused when a start before it was refused.
                SignalBody::Settled {
                    settlement: Settlement::Failed { .. },
                    ..
                } => refused = true,
                other => return Err(protocol(format!("unexpected signal {other:?}"))),
            }
        }
        Ok(refused)
    }

    fn output(&self, consumed: usize, winner: Option<Outcome>) -> Result<Transition, StepError> {
        Ok(Transition::Complete {
            consumed,
            output: Payload::encode(&Race {
                winner,
                starts: self.state.starts.clone(),
                outcomes: self.state.outcomes.clone(),
            })?,
        })
    }
}

impl Execution for Run {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        let consumed = window.len();
        if !self.state.launched {
            if !window.is_empty() {
                return Err(protocol("signals arrived before the candidates started"));
            }
            self.state.launched = true;
            let mut effects: Vec<Effect> = self
                .state
                .candidates
                .iter()
                .map(|candidate| Effect::StartChild {
                    key: candidate.key.clone(),
                    program: candidate.program,
                    input: candidate.input.clone(),
                    budget: candidate.budget.clone(),
                    capabilities: candidate.capabilities.clone(),
                    grant: Grant::Exact,
                })
                .collect();
            effects.push(Effect::WaitChildren {
                keys: self
                    .state
                    .candidates
                    .iter()
                    .map(|c| c.key.clone())
                    .collect(),
                boundary: Boundary::Result,
                condition: Condition::Any,
            });
            return Ok(Transition::Continue {
                consumed: 0,
                effects,
            });
        }
        let refused = self.observe(window)?;
        if self.state.starts.len() != self.state.candidates.len() {
            return Err(protocol("a candidate's start result is missing"));
        }
        if refused
            && self
                .state
                .starts
                .iter()
                .all(|start| start.failure.is_none())
        {
            return Err(protocol(
                "a children wait was refused although every candidate started",
            ));
        }
        // Starts arrive in declaration order, which is request order.
        for outcome in &self.state.outcomes {
            match (self.inner.accept)(outcome) {
                Ok(true) => return self.output(consumed, Some(outcome.clone())),
                Ok(false) => {}
                Err(message) => {
                    return Ok(Transition::Fail {
                        consumed,
                        failure: Failure::new(
                            FailureKind::Execution,
                            "coordination.first_success.accept_failed",
                            format!("accept failed on {}: {message}", outcome.key),
                        ),
                    });
                }
            }
        }
        let remaining: Vec<ChildKey> = self
            .state
            .starts
            .iter()
            .filter(|start| start.process.is_some())
            .filter(|start| self.state.outcomes.iter().all(|o| o.key != start.key))
            .map(|start| start.key.clone())
            .collect();
        if remaining.is_empty() {
            return self.output(consumed, None);
        }
        Ok(Transition::Continue {
            consumed,
            effects: vec![Effect::WaitChildren {
                keys: remaining,
                boundary: Boundary::Result,
                condition: Condition::Any,
            }],
        })
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }
}
