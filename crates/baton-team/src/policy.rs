//! `Policy`: a coordinator that is a pure function of the turn and of its
//! settings.

use std::sync::Arc;

use baton_run::program::{
    Definition, Descriptor, Execution, ExecutionState, ProgramConfig, Schema, Signal, StepError,
    Transition, configuration_digest, implementation_digest,
};
use baton_run::{Digest, Failure, Payload, Program};
use serde::Serialize;

use crate::codec::TurnMemo;
use crate::{ConfigError, Decision, Turn};

/// The decision function of a [`Policy`]: pure and deterministic. A
/// returned failure fails the coordinator, and with it the team, with that
/// failure's kind, code and message.
///
/// Everything it depends on besides the turn is either in the policy's
/// [`settings`](PolicyConfig::settings) or in the code its
/// [`build`](PolicyConfig::build) names: a closure captures the settings'
/// typed value, never configuration that is in neither.
pub type Decide = Arc<dyn Fn(&Turn) -> Result<Decision, Failure> + Send + Sync>;

/// How to build a [`Policy`]. Validated once by [`Policy::new`].
///
/// A policy's program identity (its configuration digest) covers its name,
/// description, build and settings, because a recorded run is only
/// replayed, recovered or resumed by the program that recorded it. So the
/// rule is: **everything `decide` depends on besides the turn is either in
/// `settings` or in the code `build` names.** Configuration that changes
/// what the policy decides (a route table, thresholds, a worker's name)
/// goes into `settings`, and `decide` closes over the same value; the code
/// that reads it is named by `build`.
///
/// Two policies that differ only in their settings are two programs: a run
/// recorded under one is refused by an engine that has only the other
/// registered (`engine.program.unavailable`), and a team whose coordinator
/// changed settings is another team program too.
///
/// ```
/// use std::collections::BTreeMap;
/// use std::sync::Arc;
///
/// use baton_run::{ChildKey, Failure, Name, Payload};
/// use baton_team::{Decision, Mode, Policy, PolicyConfig, TaskRequest, Turn};
///
/// // Which worker handles which kind of request is configuration: it goes
/// // into the settings, and `decide` closes over the same table.
/// let routes = BTreeMap::from([("invoice".to_owned(), "billing.clerk".to_owned())]);
/// let settings = Payload::encode(&routes)?;
/// let router = Policy::new(PolicyConfig {
///     name: "example.router".into(),
///     description: "Routes the request to the worker its kind names.".into(),
///     build: "example router 1".into(),
///     settings,
///     decide: Arc::new(move |turn: &Turn| {
///         let fail = |message: String| Failure::contract("example.route.invalid", message);
///         if let Some(task) = turn.tasks.first() {
///             let output = task.output().cloned().unwrap_or_else(Payload::null);
///             return Ok(Decision::complete(turn.state.clone(), output));
///         }
///         let kind: String = turn.state.decode().map_err(|e| fail(e.to_string()))?;
///         let worker = routes
///             .get(&kind)
///             .ok_or_else(|| fail(format!("no route for {kind}")))?;
///         let request = TaskRequest::new(
///             ChildKey::new("route").map_err(|e| fail(e.to_string()))?,
///             Name::new(worker).map_err(|e| fail(e.to_string()))?,
///             turn.state.clone(),
///         );
///         Ok(Decision::new(Mode::Wait, turn.state.clone()).with_task(request))
///     }),
/// })?;
/// assert_eq!(router.program().descriptor().name().as_str(), "example.router");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct PolicyConfig {
    /// The coordinator's descriptor name (lowercase dotted).
    pub name: String,
    /// What it decides, for people.
    pub description: String,
    /// The identity of the code behind `decide` (closures cannot be
    /// hashed); change it whenever that code changes behaviour.
    pub build: String,
    /// The configuration `decide` depends on besides the turn, as a
    /// payload (`Payload::encode(&settings)`), or `Payload::null()` when it
    /// depends on nothing else. It is part of the policy's identity.
    pub settings: Payload,
    /// The decision function.
    pub decide: Decide,
}

impl std::fmt::Debug for PolicyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyConfig")
            .field("name", &self.name)
            .field("build", &self.build)
            .field("settings", &self.settings)
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

/// Everything the configuration digest covers.
#[derive(Serialize)]
struct Digested<'a> {
    name: &'a str,
    description: &'a str,
    build: &'a str,
    /// Left out when null, so a policy without settings keeps the identity
    /// it had before settings were digested, and its recorded runs still
    /// recover. Any other value adds the member, so it never collides with
    /// a policy without settings.
    #[serde(skip_serializing_if = "is_null")]
    settings: &'a Payload,
}

fn is_null(settings: &&Payload) -> bool {
    settings.is_null()
}

impl Policy {
    /// Validates the descriptor and the build identity, and digests the
    /// name, description, build and settings into the program's identity.
    pub fn new(config: PolicyConfig) -> Result<Policy, ConfigError> {
        if config.build.is_empty() {
            return Err(ConfigError::Build);
        }
        let configuration = configuration_digest(&Digested {
            name: &config.name,
            description: &config.description,
            build: &config.build,
            settings: &config.settings,
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
