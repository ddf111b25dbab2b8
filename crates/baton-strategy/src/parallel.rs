//! Parallel: every agent on the same input, at most `max_concurrency` at
//! once; an error mode decides what failures do, and a merge (a pure
//! function or a model) combines the outcomes.

use baton_run::{Failure, FailureKind, Name, Payload, Program};
use baton_team::{Binding, Decision, Policy, Turn};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::driver::{self, Next, Rule, Start, TurnView};
use crate::model::{Helper, ModelConfig};
use crate::pure::Pure;
use crate::roster::Roster;
use crate::{Agent, AgentInput, AgentResult, ConfigError, Outcome, Work};

/// `FailFast`: the first failure (the earliest in roster order among those
/// seen together) fails the team, which cancels the agents still running.
/// Its kind is the agent's failure's kind.
pub const AGENT_FAILED: &str = "strategy.parallel.agent_failed";
/// `Collect`: every agent ran and at least one failed; the message lists
/// every failure (kind `external`).
pub const AGENTS_FAILED: &str = "strategy.parallel.agents_failed";
/// `BestEffort`: no agent succeeded; the message lists every failure (kind
/// `external`).
pub const ALL_FAILED: &str = "strategy.parallel.all_failed";
/// The model merger failed; the message carries its failure.
pub const MERGE_FAILED: &str = "strategy.parallel.merge_failed";

/// What agent failures do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorMode {
    /// The first failure cancels the other agents and fails the team.
    #[default]
    FailFast,
    /// Every agent runs; any failure fails the team with every error.
    Collect,
    /// Every agent runs; the team succeeds with the successes and fails,
    /// with every error, only if none succeeded.
    BestEffort,
}

/// What a merge is given: the task and every agent's outcome, in roster
/// order (under `BestEffort` some are failures).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeInput {
    /// The team's task.
    pub task: Payload,
    /// Every agent's outcome, in roster order.
    pub results: Vec<AgentResult>,
}

/// A model merger's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Merged {
    /// The merged answer.
    pub answer: String,
}

/// How the outcomes become the team's output.
#[derive(Clone, Debug, Default)]
pub enum Merge {
    /// The successful outputs as a JSON array, in roster order.
    #[default]
    Outputs,
    /// A pure function of the outcomes.
    Pure(Pure<MergeInput, Payload>),
    /// A model reads the [`MergeInput`] and answers a [`Merged`]; its
    /// `answer` (a JSON string) is the output. It runs as one more task of
    /// the team, `merge`.
    Model(ModelConfig),
}

/// How to build a [`Parallel`] team. Validated once by [`Parallel::new`].
#[derive(Clone, Debug)]
pub struct ParallelConfig {
    /// The team's descriptor name (lowercase dotted).
    pub name: String,
    /// What the team does.
    pub description: String,
    /// The agents; results are reported in this order.
    pub agents: Vec<Agent>,
    /// The most agents running at once (at least 1).
    pub max_concurrency: u32,
    /// What failures do.
    pub errors: ErrorMode,
    /// How the outcomes are merged.
    pub merge: Merge,
}

/// A parallel team's output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParallelOutput {
    /// The merged output.
    pub output: Payload,
    /// Every agent's outcome, in roster order.
    pub results: Vec<AgentResult>,
}

/// The parallel strategy bound as a team.
#[derive(Clone, Debug)]
pub struct Parallel {
    program: Program<Work, ParallelOutput>,
    coordinator: Policy,
}

#[derive(Serialize)]
struct Settings {
    max_concurrency: u32,
    errors: ErrorMode,
    merge: &'static str,
}

impl Parallel {
    /// Validates the configuration and binds the team.
    pub fn new(config: ParallelConfig) -> Result<Parallel, ConfigError> {
        if config.max_concurrency == 0 {
            return Err(ConfigError::ZeroConcurrency);
        }
        let roster = Roster::new(config.agents)?;
        let mut builds = Vec::new();
        let mut helpers = Vec::new();
        let (merge, kind) = match config.merge {
            Merge::Outputs => (Merging::Outputs, "outputs"),
            Merge::Pure(function) => {
                builds.push(function.checked("the merge")?.to_owned());
                (Merging::Pure(function), "pure")
            }
            Merge::Model(model) => {
                let program = Helper {
                    name: format!("{}.merge", config.name),
                    description: "Merge the agents' outcomes into one answer.",
                    system: MERGE_PROMPT,
                    model: &model,
                    temperature: None,
                }
                .program::<MergeInput, Merged>()?;
                let name = program.descriptor().name().clone();
                helpers.push(Binding::new(&program));
                (Merging::Model(name), "model")
            }
        };
        let agents = roster.len() as u64;
        let settings = Payload::encode(&Settings {
            max_concurrency: config.max_concurrency,
            errors: config.errors,
            merge: kind,
        })?;
        let bound = driver::Team {
            name: config.name,
            description: config.description,
            roster,
            helpers,
            rule: Fan {
                max_concurrency: config.max_concurrency as usize,
                errors: config.errors,
                merge,
            },
            settings,
            builds,
            max_tasks: agents + 1,
            max_concurrent: config.max_concurrency,
        }
        .bind()?;
        Ok(Parallel {
            program: bound.program,
            coordinator: bound.coordinator,
        })
    }

    /// The team program: start it with [`Work`].
    pub fn program(&self) -> Program<Work, ParallelOutput> {
        self.program.clone()
    }

    /// The coordinator the team runs each turn.
    pub fn coordinator(&self) -> Program<Turn, Decision> {
        self.coordinator.program()
    }
}

const MERGE_PROMPT: &str = "You merge the results of several agents who worked on the same task. \
The user message is a JSON object with the task and every agent's outcome in order. \
Answer with a JSON object {\"answer\": \"...\"} holding the merged answer.";

enum Merging {
    Outputs,
    Pure(Pure<MergeInput, Payload>),
    Model(Name),
}

struct Fan {
    max_concurrency: usize,
    errors: ErrorMode,
    merge: Merging,
}

/// The key of agent `index`'s task.
fn key(index: usize) -> String {
    format!("agent.{}", index + 1)
}

/// `a: code: message; b: …` over failed outcomes.
fn listing(results: &[AgentResult]) -> String {
    results
        .iter()
        .filter_map(|result| match &result.outcome {
            Outcome::Failed { failure } => Some(format!(
                "{}: {}: {}",
                result.agent, failure.code, failure.message
            )),
            Outcome::Succeeded { .. } => None,
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl Rule for Fan {
    const STRATEGY: &'static str = "parallel";

    fn next(&self, view: &TurnView<'_>, roster: &Roster) -> Result<Next, Failure> {
        let facts: Vec<_> = (0..roster.len())
            .map(|index| view.get(&key(index)))
            .collect();
        if self.errors == ErrorMode::FailFast {
            for (index, fact) in facts.iter().enumerate() {
                if let Some(Some(Err(cause))) = fact.map(|fact| fact.result()) {
                    return Err(driver::agent_failed(
                        Self::STRATEGY,
                        "agent_failed",
                        format!("agent {}", roster.get(index).id()),
                        cause,
                    ));
                }
            }
        }
        let started = facts.iter().filter(|fact| fact.is_some()).count();
        let running = facts
            .iter()
            .filter(|fact| fact.is_some_and(|fact| fact.running()))
            .count();
        let room = self.max_concurrency.saturating_sub(running);
        let input = driver::encode(&AgentInput::task(view.task.clone()))?;
        let starts: Vec<Start> = (started..roster.len())
            .take(room)
            .map(|index| Start::agent(key(index), index, input.clone()))
            .collect();
        if !starts.is_empty() {
            return Ok(Next::Start(starts));
        }
        if running > 0 || started < roster.len() {
            return Ok(Next::Wait);
        }
        let results: Vec<AgentResult> = facts
            .iter()
            .enumerate()
            .filter_map(|(index, fact)| {
                let outcome = match (*fact)?.result()? {
                    Ok(output) => Outcome::Succeeded {
                        output: output.clone(),
                    },
                    Err(failure) => Outcome::Failed {
                        failure: failure.clone(),
                    },
                };
                Some(AgentResult {
                    agent: roster.get(index).id().clone(),
                    outcome,
                })
            })
            .collect();
        let failed = results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Failed { .. }))
            .count();
        match self.errors {
            ErrorMode::Collect if failed > 0 => {
                return Err(driver::failure(
                    Self::STRATEGY,
                    "agents_failed",
                    FailureKind::External,
                    format!(
                        "{failed} of {} agents failed: {}",
                        results.len(),
                        listing(&results)
                    ),
                ));
            }
            ErrorMode::BestEffort if failed == results.len() => {
                return Err(driver::failure(
                    Self::STRATEGY,
                    "all_failed",
                    FailureKind::External,
                    format!(
                        "every one of {} agents failed: {}",
                        results.len(),
                        listing(&results)
                    ),
                ));
            }
            _ => {}
        }
        let merge_input = MergeInput {
            task: view.task.clone(),
            results,
        };
        let output = match &self.merge {
            Merging::Outputs => driver::encode(
                &merge_input
                    .results
                    .iter()
                    .filter_map(|result| result.outcome.output())
                    .collect::<Vec<_>>(),
            )?,
            Merging::Pure(function) => function.call(&merge_input)?,
            Merging::Model(helper) => match view.get("merge").map(|fact| fact.result()) {
                None => {
                    return Ok(Next::Start(vec![Start::helper(
                        "merge",
                        helper,
                        &merge_input,
                    )?]));
                }
                Some(None) => return Ok(Next::Wait),
                Some(Some(Err(cause))) => {
                    return Err(driver::agent_failed(
                        Self::STRATEGY,
                        "merge_failed",
                        "the model merger".into(),
                        cause,
                    ));
                }
                Some(Some(Ok(merged))) => {
                    let merged: Merged = merged.decode().map_err(|error| {
                        driver::failure(
                            Self::STRATEGY,
                            "merge_failed",
                            FailureKind::Contract,
                            error.to_string(),
                        )
                    })?;
                    driver::encode(&merged.answer)?
                }
            },
        };
        Ok(Next::Complete(driver::encode(&ParallelOutput {
            output,
            results: merge_input.results,
        })?))
    }
}
