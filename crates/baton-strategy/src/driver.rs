//! The one coordinator every strategy runs: a [`Policy`] that reads the
//! team's [`Turn`] as a [`TurnView`] of agent and helper tasks, runs the
//! board, asks the strategy's [`Rule`] what comes next, and writes the
//! [`Decision`].
//!
//! A strategy keeps no progress of its own: what happened is the team's
//! task list (every task with its request and outcome), so a rule is a
//! pure function of the view, and a restored team resumes exactly where
//! its log says it was. The working state holds only the task and the
//! board ([`Work`]).

use std::sync::Arc;

use baton_agent::{InteractionInput, InteractionOutput, Message};
use baton_run::{ChildKey, Failure, FailureKind, Name, Payload, Program, Quota, Status};
use baton_team::{Binding, Decision, Mode, Policy, PolicyConfig, Task, TaskRequest, Turn};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::board::{self, Board, Post};
use crate::roster::{Roster, render_input};
use crate::{AgentKind, ConfigError};

/// A strategy team's working state, and its input: the task, and the
/// message board.
///
/// Start a strategy with [`Work::new`] (or [`Work::of`]); the board starts
/// empty and the team keeps it as agents post.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Work {
    /// The task the team works on.
    pub task: Payload,
    /// The message board.
    #[serde(default, skip_serializing_if = "Board::is_empty")]
    pub board: Board,
}

impl Work {
    /// Work on `task`, encoded as JSON.
    pub fn new<T: Serialize + ?Sized>(task: &T) -> Result<Work, baton_run::PayloadError> {
        Ok(Work::of(Payload::encode(task)?))
    }

    /// Work on a task given as a payload.
    pub fn of(task: Payload) -> Work {
        Work {
            task,
            board: Board::default(),
        }
    }
}

/// Where a task stands.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum State {
    /// Requested, admitted and not yet observed drained.
    Running,
    /// Ended: its result (a chat agent's answer text, a posting agent's
    /// `output`), or why it did not succeed.
    Done(Result<Payload, Failure>),
}

/// One task of the team, as a strategy reads it.
#[derive(Clone, Debug)]
pub(crate) struct Fact<'a> {
    pub key: &'a str,
    /// The roster index of its agent; `None` for a helper task.
    pub agent: Option<usize>,
    /// The input it was started with, as the team recorded it (for a chat
    /// agent: the rendered interaction input).
    pub input: &'a Payload,
    pub state: State,
    /// A posting agent's posts.
    pub posts: Vec<Post>,
}

impl Fact<'_> {
    pub fn running(&self) -> bool {
        matches!(self.state, State::Running)
    }

    pub fn result(&self) -> Option<&Result<Payload, Failure>> {
        match &self.state {
            State::Running => None,
            State::Done(result) => Some(result),
        }
    }

    pub fn succeeded(&self) -> bool {
        matches!(self.state, State::Done(Ok(_)))
    }
}

/// The turn as a strategy reads it: the task and every task so far, in
/// request order.
pub(crate) struct TurnView<'a> {
    pub task: &'a Payload,
    pub facts: Vec<Fact<'a>>,
}

impl<'a> TurnView<'a> {
    fn new(task: &'a Payload, turn: &'a Turn, roster: &Roster) -> TurnView<'a> {
        let facts = turn.tasks.iter().map(|task| fact(task, roster)).collect();
        TurnView { task, facts }
    }

    pub fn get(&self, key: &str) -> Option<&Fact<'a>> {
        self.facts.iter().find(|fact| fact.key == key)
    }

    pub fn any_running(&self) -> bool {
        self.facts.iter().any(Fact::running)
    }
}

fn fact<'a>(task: &'a Task, roster: &Roster) -> Fact<'a> {
    let agent = roster.by_program(&task.request.worker);
    let mut posts = Vec::new();
    let state = if let Some(rejection) = &task.rejection {
        State::Done(Err(rejection.clone()))
    } else if let Some(outcome) = &task.outcome {
        match (outcome.status(), outcome.output()) {
            (Status::Completed, Some(output)) => State::Done(match agent {
                None => Ok(output.clone()),
                Some(index) => {
                    let agent = roster.get(index);
                    match agent.kind() {
                        AgentKind::Chat => answer_text(output),
                        AgentKind::Program if agent.posts() => {
                            board::split(output, roster).map(|(output, taken)| {
                                posts = taken;
                                output
                            })
                        }
                        AgentKind::Program => Ok(output.clone()),
                    }
                }
            }),
            (status, _) => State::Done(Err(outcome.failure().cloned().unwrap_or_else(|| {
                Failure::external(
                    "strategy.agent.not_completed",
                    format!("the task ended {}", status.view_name()),
                )
            }))),
        }
    } else {
        State::Running
    };
    Fact {
        key: task.request.key.as_str(),
        agent,
        input: &task.request.input,
        state,
        posts,
    }
}

/// A chat agent's result: its final answer's text, as a JSON string.
fn answer_text(output: &Payload) -> Result<Payload, Failure> {
    let output: InteractionOutput = output.decode().map_err(|error| {
        Failure::contract(
            "strategy.agent.output_invalid",
            format!("a chat agent's output is not an interaction output: {error}"),
        )
    })?;
    Payload::encode(&output.response.message().text())
        .map_err(|error| Failure::execution("strategy.agent.output_invalid", error.to_string()))
}

/// What to start: an agent of the roster or a helper, under a key.
#[derive(Clone, Debug)]
pub(crate) struct Start {
    pub key: String,
    pub target: Target,
    /// The agent's input as the strategy builds it; a chat agent gets it
    /// rendered as one user message.
    pub input: Payload,
}

#[derive(Clone, Debug)]
pub(crate) enum Target {
    Agent(usize),
    Helper(Name),
}

impl Start {
    pub fn agent(key: impl Into<String>, index: usize, input: Payload) -> Start {
        Start {
            key: key.into(),
            target: Target::Agent(index),
            input,
        }
    }

    pub fn helper<T: Serialize>(
        key: impl Into<String>,
        helper: &Name,
        input: &T,
    ) -> Result<Start, Failure> {
        Ok(Start {
            key: key.into(),
            target: Target::Helper(helper.clone()),
            input: encode(input)?,
        })
    }
}

/// What a strategy does next.
pub(crate) enum Next {
    /// Start these tasks, then wait for the next task to end.
    Start(Vec<Start>),
    /// Wait for the next task to end.
    Wait,
    /// Complete the team with this output.
    Complete(Payload),
}

/// A strategy's rules: a pure function of the turn.
pub(crate) trait Rule: Send + Sync + 'static {
    /// The strategy's name in its codes (`strategy.<name>.<suffix>`).
    const STRATEGY: &'static str;

    fn next(&self, view: &TurnView<'_>, roster: &Roster) -> Result<Next, Failure>;
}

/// A failure with the code `strategy.<strategy>.<suffix>`.
pub(crate) fn failure(
    strategy: &str,
    suffix: &str,
    kind: FailureKind,
    message: impl Into<String>,
) -> Failure {
    Failure::new(kind, &format!("strategy.{strategy}.{suffix}"), message)
}

pub(crate) fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Payload, Failure> {
    Payload::encode(value)
        .map_err(|error| Failure::execution("strategy.encode.failed", error.to_string()))
}

/// `agent <id> failed: <code>: <message>`, for failures that name an agent.
pub(crate) fn agent_failed(strategy: &str, suffix: &str, what: String, cause: &Failure) -> Failure {
    failure(
        strategy,
        suffix,
        cause.kind,
        format!("{what} failed: {}: {}", cause.code, cause.message),
    )
}

/// The coordinator behind every strategy.
struct Driver<R> {
    roster: Roster,
    helpers: Vec<Binding>,
    rule: R,
}

impl<R: Rule> Driver<R> {
    fn decide(&self, turn: &Turn) -> Result<Decision, Failure> {
        let mut work: Work = turn.state.decode().map_err(|error| {
            failure(
                R::STRATEGY,
                "state_invalid",
                FailureKind::Contract,
                format!("the working state does not decode: {error}"),
            )
        })?;
        let Work { task, board } = &mut work;
        let view = TurnView::new(task, turn, &self.roster);
        let controls = board.absorb(&view, &self.roster);
        let next = self.rule.next(&view, &self.roster)?;
        let running = view.any_running();
        let state = encode(&work)?;
        let starts = match next {
            Next::Complete(output) => return Ok(Decision::complete(state, output)),
            Next::Wait => Vec::new(),
            Next::Start(starts) => starts,
        };
        if starts.is_empty() && !running {
            // A rule that neither starts, waits on something nor completes
            // would leave the team with nothing to wait for.
            return Err(failure(
                R::STRATEGY,
                "stalled",
                FailureKind::Execution,
                "nothing runs and nothing is left to start",
            ));
        }
        let mut decision = Decision::new(Mode::Wait, state);
        for start in starts {
            decision.tasks.push(self.request(start)?);
        }
        decision.controls = controls;
        Ok(decision)
    }

    /// The task request of a start: a chat agent's input rendered, every
    /// input checked against its program's input schema first.
    fn request(&self, start: Start) -> Result<TaskRequest, Failure> {
        let (program, input, who) = match &start.target {
            Target::Agent(index) => {
                let agent = self.roster.get(*index);
                let input = match agent.kind() {
                    AgentKind::Chat => encode(&InteractionInput::new(vec![Message::user(
                        render_input(&start.input),
                    )]))?,
                    AgentKind::Program => start.input,
                };
                (
                    &agent.binding().program,
                    input,
                    format!("agent {}", agent.id()),
                )
            }
            Target::Helper(name) => {
                let helper = self
                    .helpers
                    .iter()
                    .find(|helper| helper.program.descriptor().name() == name)
                    .ok_or_else(|| {
                        failure(
                            R::STRATEGY,
                            "helper_unknown",
                            FailureKind::Execution,
                            format!("no helper {name}"),
                        )
                    })?;
                (&helper.program, start.input, format!("{name}"))
            }
        };
        program
            .descriptor()
            .input_schema()
            .validate(&input)
            .map_err(|violation| {
                failure(
                    R::STRATEGY,
                    "input_invalid",
                    FailureKind::Contract,
                    format!(
                        "{who} rejects its input at {:?}: {}",
                        violation.path, violation.message
                    ),
                )
            })?;
        let key = ChildKey::new(&start.key).map_err(|error| {
            failure(
                R::STRATEGY,
                "key_invalid",
                FailureKind::Execution,
                error.to_string(),
            )
        })?;
        Ok(TaskRequest::new(
            key,
            program.descriptor().name().clone(),
            input,
        ))
    }
}

/// Everything needed to bind a strategy as a team.
pub(crate) struct Team<R> {
    pub name: String,
    pub description: String,
    pub roster: Roster,
    pub helpers: Vec<Binding>,
    pub rule: R,
    /// What the rule depends on besides the turn and the roster.
    pub settings: Payload,
    /// The build identities of the user's functions the rule calls.
    pub builds: Vec<String>,
    /// The most tasks the strategy ever starts.
    pub max_tasks: u64,
    /// The most tasks running at once.
    pub max_concurrent: u32,
}

/// The most board deliveries in one decision.
pub(crate) const MAX_DELIVERIES: u32 = 1024;

/// What a coordinator's identity covers besides its name and build.
#[derive(Serialize)]
struct Settings<'a> {
    roster: Vec<crate::roster::DigestedAgent<'a>>,
    helpers: Vec<baton_run::Digest>,
    strategy: &'a Payload,
}

/// A strategy bound as a team program, and its coordinator.
pub(crate) struct Bound<O> {
    pub program: Program<Work, O>,
    pub coordinator: Policy,
}

impl<R: Rule> Team<R> {
    pub fn bind<O: JsonSchema>(self) -> Result<Bound<O>, ConfigError> {
        let settings = Payload::encode(&Settings {
            roster: self.roster.digested(),
            helpers: self
                .helpers
                .iter()
                .map(|helper| helper.program.reference().digest)
                .collect(),
            strategy: &self.settings,
        })?;
        let mut build = format!(
            "baton-strategy {} {}",
            R::STRATEGY,
            env!("CARGO_PKG_VERSION")
        );
        for user in &self.builds {
            build.push_str("; ");
            build.push_str(user);
        }
        let workers: Vec<Binding> = self
            .roster
            .agents()
            .iter()
            .map(|agent| agent.binding().clone())
            .chain(self.helpers.iter().cloned())
            .collect();
        let driver = Arc::new(Driver {
            roster: self.roster,
            helpers: self.helpers,
            rule: self.rule,
        });
        let coordinator = Policy::new(PolicyConfig {
            name: format!("{}.coordinator", self.name),
            description: format!("Coordinates {}: {}", self.name, self.description),
            build,
            settings,
            decide: Arc::new(move |turn: &Turn| driver.decide(turn)),
        })?;
        let program = baton_team::compile::<Work, O>(baton_team::Config {
            name: self.name,
            description: self.description,
            coordinator: Binding::new(&coordinator.program()),
            workers,
            max_turns: Quota::Unlimited,
            max_tasks: Quota::Finite(self.max_tasks),
            max_concurrent_tasks: self.max_concurrent.max(1),
            max_controls_per_turn: MAX_DELIVERIES,
            stall_turns: baton_team::DEFAULT_STALL_TURNS,
        })?;
        Ok(Bound {
            program,
            coordinator,
        })
    }
}
