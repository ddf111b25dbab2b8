//! Sequential: agents in a configured order, each given the task and the
//! previous agent's output; the first failure stops the team and names the
//! agent.

use baton_run::{Payload, Program};
use baton_team::{Decision, Policy, Turn};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::driver::{self, Next, Rule, Start, TurnView};
use crate::pure::Pure;
use crate::roster::Roster;
use crate::{Agent, AgentCard, AgentInput, AgentResult, ConfigError, Contribution, Outcome, Work};

/// Code of the failure of an agent of the sequence (its kind is the
/// agent's failure's kind; the message names the agent and the step).
pub const AGENT_FAILED: &str = "strategy.sequential.agent_failed";

/// What a step's input mapping is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepContext {
    /// The step, from 1.
    pub step: usize,
    /// The agent about to run.
    pub agent: AgentCard,
    /// The team's task.
    pub task: Payload,
    /// The previous agent's output (none for the first step).
    pub previous: Option<Contribution>,
}

/// How to build a [`Sequential`] team. Validated once by
/// [`Sequential::new`].
#[derive(Clone, Debug)]
pub struct SequentialConfig {
    /// The team's descriptor name (lowercase dotted); its coordinator is
    /// `<name>.coordinator`.
    pub name: String,
    /// What the team does.
    pub description: String,
    /// The agents, in the order they run.
    pub agents: Vec<Agent>,
    /// Maps each step's context to the agent's input; without it, each
    /// agent gets an [`AgentInput`] of the task and the previous output.
    pub input: Option<Pure<StepContext, Payload>>,
}

/// A sequential team's output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SequentialOutput {
    /// The last agent's output.
    pub output: Payload,
    /// Every step's result, in order.
    pub steps: Vec<AgentResult>,
}

/// The sequential strategy bound as a team.
#[derive(Clone, Debug)]
pub struct Sequential {
    program: Program<Work, SequentialOutput>,
    coordinator: Policy,
}

impl Sequential {
    /// Validates the configuration and binds the team.
    pub fn new(config: SequentialConfig) -> Result<Sequential, ConfigError> {
        let roster = Roster::new(config.agents)?;
        let builds = match &config.input {
            Some(input) => vec![input.checked("the input mapping")?.to_owned()],
            None => Vec::new(),
        };
        let steps = roster.len() as u64;
        let bound = driver::Team {
            name: config.name,
            description: config.description,
            roster,
            helpers: Vec::new(),
            rule: Sequence {
                input: config.input,
            },
            settings: Payload::null(),
            builds,
            max_tasks: steps,
            max_concurrent: 1,
        }
        .bind()?;
        Ok(Sequential {
            program: bound.program,
            coordinator: bound.coordinator,
        })
    }

    /// The team program: start it with [`Work`].
    pub fn program(&self) -> Program<Work, SequentialOutput> {
        self.program.clone()
    }

    /// The coordinator the team runs each turn.
    pub fn coordinator(&self) -> Program<Turn, Decision> {
        self.coordinator.program()
    }
}

struct Sequence {
    input: Option<Pure<StepContext, Payload>>,
}

impl Rule for Sequence {
    const STRATEGY: &'static str = "sequential";

    fn next(&self, view: &TurnView<'_>, roster: &Roster) -> Result<Next, baton_run::Failure> {
        let total = roster.len();
        let mut steps = Vec::new();
        for (index, fact) in view.facts.iter().enumerate() {
            let agent = roster.get(index).id();
            match fact.result() {
                None => return Ok(Next::Wait),
                Some(Err(cause)) => {
                    return Err(driver::agent_failed(
                        Self::STRATEGY,
                        "agent_failed",
                        format!("agent {agent} (step {} of {total})", index + 1),
                        cause,
                    ));
                }
                Some(Ok(output)) => steps.push(AgentResult {
                    agent: agent.clone(),
                    outcome: Outcome::Succeeded {
                        output: output.clone(),
                    },
                }),
            }
        }
        let done = steps.len();
        if done == total {
            let output = steps
                .last()
                .and_then(|step| step.outcome.output())
                .cloned()
                .unwrap_or_else(Payload::null);
            return Ok(Next::Complete(driver::encode(&SequentialOutput {
                output,
                steps,
            })?));
        }
        let previous = steps.last().map(|step| Contribution {
            agent: step.agent.clone(),
            key: None,
            output: step.outcome.output().cloned().unwrap_or_else(Payload::null),
        });
        let input = match &self.input {
            Some(map) => map.call(&StepContext {
                step: done + 1,
                agent: roster.get(done).card().clone(),
                task: view.task.clone(),
                previous,
            })?,
            None => driver::encode(&AgentInput {
                task: view.task.clone(),
                context: previous.into_iter().collect(),
            })?,
        };
        Ok(Next::Start(vec![Start::agent(
            format!("step.{}", done + 1),
            done,
            input,
        )]))
    }
}
