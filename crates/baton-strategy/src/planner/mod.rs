//! Planner: a model writes a plan of tasks `{key, agent, input,
//! depends_on}`; the plan is validated whole before anything starts; each
//! task starts as soon as its dependencies completed, with their outputs;
//! a failed task leads to a new planning round while `max_iterations`
//! allows; the model synthesises the final answer from the outcomes.

mod plan;

use baton_run::{Failure, FailureKind, Name, Payload, Program};
use baton_team::{Binding, Decision, Policy, Turn};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use plan::{Plan, PlanError, PlanTask, Schedule, validate};

use crate::driver::{self, Fact, Next, Rule, Start, TurnView};
use crate::model::{Helper, ModelConfig};
use crate::roster::Roster;
use crate::{Agent, AgentCard, AgentId, AgentInput, ConfigError, Contribution, Outcome, Work};

/// The planning or the synthesising model call failed, or its answer is
/// not the JSON asked for; the message carries the failure.
pub const MODEL_FAILED: &str = "strategy.planner.model_failed";
/// A plan task failed and no planning round is left; its kind is the
/// task's failure's kind and the message names the task and its agent.
pub const TASK_FAILED: &str = "strategy.planner.task_failed";

/// How to build a [`Planner`] team. Validated once by [`Planner::new`].
#[derive(Clone, Debug)]
pub struct PlannerConfig {
    /// The team's descriptor name (lowercase dotted).
    pub name: String,
    /// What the team does.
    pub description: String,
    /// The agents plans may name.
    pub agents: Vec<Agent>,
    /// The model that plans and synthesises the answer.
    pub model: ModelConfig,
    /// The most tasks in one plan (at least 1).
    pub max_tasks: u32,
    /// The most planning rounds (at least 1): after a failed task, a new
    /// round plans again from every outcome so far.
    pub max_iterations: u32,
}

/// What the planning model is given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanRequest {
    /// The team's task.
    pub task: Payload,
    /// The agents a plan may name.
    pub agents: Vec<AgentCard>,
    /// The planning round, from 1.
    pub round: u32,
    /// The most tasks the plan may have.
    pub max_tasks: u32,
    /// Every task of the earlier rounds and how it ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous: Vec<TaskReport>,
}

/// One planned task and how it ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskReport {
    /// The planning round.
    pub round: u32,
    /// The task's key in its plan.
    pub key: String,
    /// The agent that did it.
    pub agent: AgentId,
    /// How it ended; absent when it never started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
}

/// What the synthesising model is given: the task and every planned task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SynthesisRequest {
    /// The team's task.
    pub task: Payload,
    /// Every planned task of every round and how it ended.
    pub tasks: Vec<TaskReport>,
}

/// The synthesising model's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Synthesis {
    /// The final answer.
    pub answer: String,
}

/// A planner team's output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlannerOutput {
    /// The synthesised answer.
    pub answer: String,
    /// How many planning rounds ran.
    pub rounds: u32,
    /// Every planned task of every round and how it ended.
    pub tasks: Vec<TaskReport>,
}

/// The planner strategy bound as a team.
#[derive(Clone, Debug)]
pub struct Planner {
    program: Program<Work, PlannerOutput>,
    coordinator: Policy,
}

#[derive(Serialize)]
struct Settings {
    max_tasks: u32,
    max_iterations: u32,
}

const PLAN_PROMPT: &str = "You plan work for a team of agents. \
The user message is a JSON object with the task, the agents (id, name, description, capabilities), \
the round, the most tasks a plan may have, and the tasks of earlier rounds with their outcomes. \
Answer with a JSON object {\"tasks\": [{\"key\", \"agent\", \"input\", \"depends_on\"}]}: \
unique keys of letters, digits, - and _; agent ids exactly as listed; \
each input says what the agent should do; depends_on lists the keys whose outputs the task needs, without cycles.";

const ANSWER_PROMPT: &str = "You write the final answer to a task from the work of a team. \
The user message is a JSON object with the task and every planned task with its outcome. \
Answer with a JSON object {\"answer\": \"...\"}.";

impl Planner {
    /// Validates the configuration and binds the team.
    pub fn new(config: PlannerConfig) -> Result<Planner, ConfigError> {
        if config.max_iterations == 0 {
            return Err(ConfigError::ZeroIterations);
        }
        if config.max_tasks == 0 {
            return Err(ConfigError::ZeroTasks);
        }
        let roster = Roster::new(config.agents)?;
        let planner = Helper {
            name: format!("{}.plan", config.name),
            description: "Plan the team's work as tasks with dependencies.",
            system: PLAN_PROMPT,
            model: &config.model,
            temperature: None,
        }
        .program::<PlanRequest, Plan>()?;
        let synthesizer = Helper {
            name: format!("{}.answer", config.name),
            description: "Write the final answer from the team's work.",
            system: ANSWER_PROMPT,
            model: &config.model,
            temperature: None,
        }
        .program::<SynthesisRequest, Synthesis>()?;
        let settings = Payload::encode(&Settings {
            max_tasks: config.max_tasks,
            max_iterations: config.max_iterations,
        })?;
        let rule = Planning {
            planner: planner.descriptor().name().clone(),
            synthesizer: synthesizer.descriptor().name().clone(),
            max_tasks: config.max_tasks,
            max_iterations: config.max_iterations,
        };
        let per_round = u64::from(config.max_tasks) + 1;
        let bound = driver::Team {
            name: config.name,
            description: config.description,
            roster,
            helpers: vec![Binding::new(&planner), Binding::new(&synthesizer)],
            rule,
            settings,
            builds: Vec::new(),
            max_tasks: u64::from(config.max_iterations) * per_round + 1,
            max_concurrent: config.max_tasks,
        }
        .bind()?;
        Ok(Planner {
            program: bound.program,
            coordinator: bound.coordinator,
        })
    }

    /// The team program: start it with [`Work`].
    pub fn program(&self) -> Program<Work, PlannerOutput> {
        self.program.clone()
    }

    /// The coordinator the team runs each turn.
    pub fn coordinator(&self) -> Program<Turn, Decision> {
        self.coordinator.program()
    }
}

struct Planning {
    planner: Name,
    synthesizer: Name,
    max_tasks: u32,
    max_iterations: u32,
}

fn plan_key(round: u32) -> String {
    format!("plan.{round}")
}

fn task_key(round: u32, key: &str) -> String {
    format!("task.{round}.{key}")
}

/// The key of the synthesis task.
const ANSWER_KEY: &str = "answer";

/// One round's plan and its tasks' facts, in plan order.
struct Round<'v, 'a> {
    number: u32,
    schedule: Schedule,
    facts: Vec<Option<&'v Fact<'a>>>,
}

impl Round<'_, '_> {
    fn reports(&self, roster: &Roster) -> Vec<TaskReport> {
        self.schedule
            .tasks()
            .iter()
            .zip(&self.facts)
            .map(|(task, fact)| TaskReport {
                round: self.number,
                key: task.key.clone(),
                agent: roster
                    .get(roster.index_of(&task.agent).unwrap_or_default())
                    .id()
                    .clone(),
                outcome: fact
                    .and_then(|fact| fact.result())
                    .map(|result| match result {
                        Ok(output) => Outcome::Succeeded {
                            output: output.clone(),
                        },
                        Err(failure) => Outcome::Failed {
                            failure: failure.clone(),
                        },
                    }),
            })
            .collect()
    }
}

impl Planning {
    /// Round `number`'s plan, validated, or `None` while it is being written.
    fn round<'v, 'a>(
        &self,
        number: u32,
        view: &'v TurnView<'a>,
        roster: &Roster,
    ) -> Result<Option<Round<'v, 'a>>, Failure> {
        let planned = match view.get(&plan_key(number)).and_then(|fact| fact.result()) {
            None => return Ok(None),
            Some(Err(cause)) => {
                return Err(driver::agent_failed(
                    Self::STRATEGY,
                    "model_failed",
                    format!("the planner (round {number})"),
                    cause,
                ));
            }
            Some(Ok(planned)) => planned,
        };
        let plan: Plan = planned.decode().map_err(|error| {
            driver::failure(
                Self::STRATEGY,
                "model_failed",
                FailureKind::Contract,
                format!("the plan of round {number} does not decode: {error}"),
            )
        })?;
        let ids: Vec<&str> = roster.agents().iter().map(|a| a.id().as_str()).collect();
        let schedule = validate(&plan, &ids, self.max_tasks).map_err(|error| error.failure())?;
        let facts = schedule
            .tasks()
            .iter()
            .map(|task| view.get(&task_key(number, &task.key)))
            .collect();
        Ok(Some(Round {
            number,
            schedule,
            facts,
        }))
    }

    fn request(
        &self,
        view: &TurnView<'_>,
        roster: &Roster,
        round: u32,
        previous: Vec<TaskReport>,
    ) -> PlanRequest {
        PlanRequest {
            task: view.task.clone(),
            agents: roster.cards(),
            round,
            max_tasks: self.max_tasks,
            previous,
        }
    }
}

impl Rule for Planning {
    const STRATEGY: &'static str = "planner";

    fn next(&self, view: &TurnView<'_>, roster: &Roster) -> Result<Next, Failure> {
        let latest = (1..=self.max_iterations)
            .take_while(|round| view.get(&plan_key(*round)).is_some())
            .last();
        let Some(latest) = latest else {
            let request = self.request(view, roster, 1, Vec::new());
            return Ok(Next::Start(vec![Start::helper(
                plan_key(1),
                &self.planner,
                &request,
            )?]));
        };
        let mut reports = Vec::new();
        for number in 1..latest {
            if let Some(round) = self.round(number, view, roster)? {
                reports.extend(round.reports(roster));
            }
        }
        let Some(round) = self.round(latest, view, roster)? else {
            return Ok(Next::Wait);
        };
        reports.extend(round.reports(roster));
        let running = round.facts.iter().flatten().any(|fact| fact.running());
        let failed = round
            .schedule
            .tasks()
            .iter()
            .zip(&round.facts)
            .find_map(|(task, fact)| match fact.and_then(|fact| fact.result()) {
                Some(Err(cause)) => Some((task, cause)),
                _ => None,
            });
        if let Some((task, cause)) = failed {
            if running {
                return Ok(Next::Wait);
            }
            if latest < self.max_iterations {
                let request = self.request(view, roster, latest + 1, reports);
                return Ok(Next::Start(vec![Start::helper(
                    plan_key(latest + 1),
                    &self.planner,
                    &request,
                )?]));
            }
            return Err(driver::agent_failed(
                Self::STRATEGY,
                "task_failed",
                format!("task {} of round {latest} (agent {})", task.key, task.agent),
                cause,
            ));
        }
        let started: Vec<bool> = round.facts.iter().map(Option::is_some).collect();
        let completed: Vec<bool> = round
            .facts
            .iter()
            .map(|fact| fact.is_some_and(|fact| fact.succeeded()))
            .collect();
        let mut starts = Vec::new();
        for index in round.schedule.ready(&started, &completed) {
            let task = &round.schedule.tasks()[index];
            let agent = roster
                .index_of(&task.agent)
                .expect("a valid plan names only agents of the roster");
            let context = round
                .schedule
                .dependencies(index)
                .iter()
                .map(|dependency| {
                    let needed = &round.schedule.tasks()[*dependency];
                    let output = round.facts[*dependency]
                        .and_then(|fact| fact.result())
                        .and_then(|result| result.as_ref().ok())
                        .cloned()
                        .unwrap_or_else(Payload::null);
                    Contribution {
                        agent: roster
                            .get(roster.index_of(&needed.agent).unwrap_or_default())
                            .id()
                            .clone(),
                        key: Some(needed.key.clone()),
                        output,
                    }
                })
                .collect();
            let input = driver::encode(&AgentInput {
                task: driver::encode(&task.input)?,
                context,
            })?;
            starts.push(Start::agent(task_key(latest, &task.key), agent, input));
        }
        if !starts.is_empty() {
            return Ok(Next::Start(starts));
        }
        if running {
            return Ok(Next::Wait);
        }
        match view.get(ANSWER_KEY).map(|fact| fact.result()) {
            None => {
                let request = SynthesisRequest {
                    task: view.task.clone(),
                    tasks: reports,
                };
                Ok(Next::Start(vec![Start::helper(
                    ANSWER_KEY,
                    &self.synthesizer,
                    &request,
                )?]))
            }
            Some(None) => Ok(Next::Wait),
            Some(Some(Err(cause))) => Err(driver::agent_failed(
                Self::STRATEGY,
                "model_failed",
                "the synthesizer".into(),
                cause,
            )),
            Some(Some(Ok(answer))) => {
                let synthesis: Synthesis = answer.decode().map_err(|error| {
                    driver::failure(
                        Self::STRATEGY,
                        "model_failed",
                        FailureKind::Contract,
                        error.to_string(),
                    )
                })?;
                Ok(Next::Complete(driver::encode(&PlannerOutput {
                    answer: synthesis.answer,
                    rounds: latest,
                    tasks: reports,
                })?))
            }
        }
    }
}
