//! `Policy`: a coordinator that is a pure function of the turn.

use std::sync::Arc;

use baton_run::{
    Definition, Descriptor, Digest, Execution, ExecutionState, Failure, Payload, Program,
    ProgramConfig, Schema, Signal, StepError, Transition, configuration_digest,
    implementation_digest,
};
use serde::Serialize;

use crate::codec::TurnMemo;
use crate::{ConfigError, Decision, Turn};

/// The decision function of a [`Policy`]: pure and deterministic. A
/// returned failure fails the coordinator, and with it the team, with that
/// failure's kind, code and message.
pub type Decide = Arc<dyn Fn(&Turn) -> Result<Decision, Failure> + Send + Sync>;

/// How to build a [`Policy`].
#[derive(Clone)]
pub struct PolicyConfig {
    /// The coordinator's descriptor name (lowercase dotted).
    pub name: String,
    /// What it decides, for people.
    pub description: String,
    /// The identity of the code behind `decide` (closures cannot be
    /// hashed); change it whenever `decide` changes behaviour.
    pub build: String,
    /// The decision function.
    pub decide: Decide,
}

impl std::fmt::Debug for PolicyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyConfig")
            .field("name", &self.name)
            .field("build", &self.build)
            .finish_non_exhaustive()
    }
}

/// A coordinator whose one step maps the [`Turn`] it was started with to a
/// [`Decision`] by a pure function: scripted coordinators in tests and
/// benchmarks, and rule-based policies (sequential, round-robin, routing)
/// in applications. Its state is the turn it was given, so snapshotting it
/// costs nothing.
///
/// Clones share one memo of the tasks of recently decoded turns, so a
/// turn decodes only the tasks that changed since a recent turn; what a
/// step decides never depends on the memo.
#[derive(Clone)]
pub struct Policy {
    inner: Arc<PolicyInner>,
}

struct PolicyInner {
    descriptor: Descriptor,
    decide: Decide,
    configuration: Digest,
    /// The tasks of recently decoded turns, shared by every run.
    turns: TurnMemo,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("name", self.inner.descriptor.name())
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct Digested<'a> {
    name: &'a str,
    description: &'a str,
    build: &'a str,
}

impl Policy {
    /// Validates the descriptor and the build identity.
    pub fn new(config: PolicyConfig) -> Result<Policy, ConfigError> {
        if config.build.is_empty() {
            return Err(ConfigError::Build);
        }
        let configuration = configuration_digest(&Digested {
            name: &config.name,
            description: &config.description,
            build: &config.build,
        })
        .map_err(|error| ConfigError::Encode {
            message: error.to_string(),
        })?;
        let descriptor = Descriptor::new(
            &config.name,
            config.description,
            Schema::of::<Turn>(),
            Schema::of::<Decision>(),
        )?;
        Ok(Policy {
            inner: Arc::new(PolicyInner {
                descriptor,
                decide: config.decide,
                configuration,
                turns: TurnMemo::default(),
            }),
        })
    }

    /// Binds the policy as a coordinator program.
    pub fn program(&self) -> Program<Turn, Decision> {
        Program::new(ProgramConfig {
            definition: Arc::new(self.clone()),
            dispatcher: None,
            implementation: implementation_digest(
                env!("CARGO_PKG_NAME"),
                env!("CARGO_PKG_VERSION"),
            ),
            configuration: self.inner.configuration,
        })
    }
}

struct PolicyRun {
    policy: Arc<PolicyInner>,
    /// The turn, kept as its canonical payload: decoded only by the step.
    turn: Payload,
}

impl Definition for Policy {
    fn descriptor(&self) -> &Descriptor {
        &self.inner.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(PolicyRun {
            policy: self.inner.clone(),
            turn: input.clone(),
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(PolicyRun {
            policy: self.inner.clone(),
            turn: state.0.clone(),
        }))
    }
}

impl Execution for PolicyRun {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        if let Some(signal) = window.first() {
            return Err(StepError::classified(
                baton_run::FailureKind::Contract,
                crate::PROTOCOL_INVALID,
                format!("a policy coordinator takes no signals, got {}", signal.id),
            ));
        }
        let turn = self.policy.turns.decode(&self.turn).map_err(|error| {
            StepError::classified(
                baton_run::FailureKind::Contract,
                "execution.input.invalid",
                error.to_string(),
            )
        })?;
        let decision = (self.policy.decide)(&turn).map_err(StepError)?;
        Ok(Transition::Complete {
            consumed: 0,
            output: Payload::encode(&decision)?,
        })
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        Ok(ExecutionState(self.turn.clone()))
    }
}
