//! Router: one agent per task, chosen by a pure function, by capability
//! scoring with a declared tie-break, or by a model that answers
//! `{"agent_id": …}` at temperature 0. An unknown id is a classified
//! failure (or the configured fallback), never a guess from prose.

use std::collections::BTreeSet;

use baton_run::{Failure, FailureKind, Name, Payload, Program};
use baton_team::{Binding, Decision, Policy, Turn};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::driver::{self, Next, Rule, Start, TurnView};
use crate::model::{Helper, ModelConfig};
use crate::pure::Pure;
use crate::roster::Roster;
use crate::{Agent, AgentCard, AgentId, AgentInput, ConfigError, Work};

/// The route named an agent that is not in the roster, and no fallback is
/// configured (kind `contract`).
pub const UNKNOWN_AGENT: &str = "strategy.router.unknown_agent";
/// Capability scoring found no agent with a positive score, and no
/// fallback is configured (kind `execution`).
pub const NO_MATCH: &str = "strategy.router.no_match";
/// Capability scoring tied under [`TieBreak::Refuse`], and no fallback is
/// configured (kind `execution`).
pub const TIE: &str = "strategy.router.tie";
/// The model router's answer is not a JSON `{"agent_id": …}` (kind
/// `contract`); the message carries the decoder's report.
pub const ANSWER_INVALID: &str = "strategy.router.answer_invalid";
/// The model router's call failed; the message carries its failure.
pub const MODEL_FAILED: &str = "strategy.router.model_failed";
/// The chosen agent failed; its kind is the agent's failure's kind.
pub const AGENT_FAILED: &str = "strategy.router.agent_failed";

/// What a pure route and the model router are given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteQuery {
    /// The task to route.
    pub task: Payload,
    /// The roster, in order.
    pub agents: Vec<AgentCard>,
}

/// The model router's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteAnswer {
    /// The id of the agent that should handle the task.
    pub agent_id: String,
}

/// Which agent wins a tie of capability scores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TieBreak {
    /// The tied agent that comes first in the roster.
    #[default]
    RosterOrder,
    /// No one: a tie is [`TIE`] (or the fallback).
    Refuse,
}

/// How the agent is chosen.
#[derive(Clone, Debug)]
pub enum Route {
    /// A pure function of the [`RouteQuery`] returns the agent's id.
    Pure(Pure<RouteQuery, String>),
    /// The highest capability score wins. For each capability of an agent:
    /// +2 when the task is a JSON object with that key, +1 for each of the
    /// task's top-level string values (or the task itself, when it is a
    /// string) equal to it. A best score of 0 is no match.
    Capabilities(TieBreak),
    /// A model sees the [`RouteQuery`] and answers a [`RouteAnswer`] at
    /// temperature 0, as one more task of the team, `route`.
    Model(ModelConfig),
}

/// How to build a [`Router`] team. Validated once by [`Router::new`].
#[derive(Clone, Debug)]
pub struct RouterConfig {
    /// The team's descriptor name (lowercase dotted).
    pub name: String,
    /// What the team does.
    pub description: String,
    /// The agents.
    pub agents: Vec<Agent>,
    /// How the agent is chosen.
    pub route: Route,
    /// The agent that takes the task when the route names no agent of the
    /// roster (an unknown id, no match, a refused tie).
    pub fallback: Option<String>,
}

/// How the agent was chosen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "by", rename_all = "snake_case", deny_unknown_fields)]
pub enum Choice {
    /// The pure route named it.
    Function,
    /// It had the best capability score.
    Capabilities {
        /// Its score.
        score: u64,
    },
    /// The model named it.
    Model,
    /// The route named no agent of the roster and the fallback took it.
    Fallback {
        /// What the route named, if anything.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        requested: Option<String>,
    },
}

/// A router team's output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouterOutput {
    /// The agent that handled the task.
    pub agent: AgentId,
    /// How it was chosen.
    pub choice: Choice,
    /// Its output.
    pub output: Payload,
}

/// The router strategy bound as a team.
#[derive(Clone, Debug)]
pub struct Router {
    program: Program<Work, RouterOutput>,
    coordinator: Policy,
}

#[derive(Serialize)]
struct Settings<'a> {
    route: &'static str,
    tie_break: Option<TieBreak>,
    fallback: Option<&'a str>,
}

impl Router {
    /// Validates the configuration and binds the team.
    pub fn new(config: RouterConfig) -> Result<Router, ConfigError> {
        let roster = Roster::new(config.agents)?;
        let fallback = match &config.fallback {
            Some(id) => Some(
                roster
                    .index_of(id)
                    .ok_or_else(|| ConfigError::UnknownFallback { id: id.clone() })?,
            ),
            None => None,
        };
        let mut builds = Vec::new();
        let mut helpers = Vec::new();
        let (way, kind, tie_break) = match config.route {
            Route::Pure(function) => {
                builds.push(function.checked("the route")?.to_owned());
                (Way::Pure(function), "function", None)
            }
            Route::Capabilities(tie) => (Way::Capabilities(tie), "capabilities", Some(tie)),
            Route::Model(model) => {
                let program = Helper {
                    name: format!("{}.route", config.name),
                    description: "Choose the one agent best suited to the task.",
                    system: ROUTE_PROMPT,
                    model: &model,
                    temperature: Some(0.0),
                }
                .program::<RouteQuery, RouteAnswer>()?;
                let name = program.descriptor().name().clone();
                helpers.push(Binding::new(&program));
                (Way::Model(name), "model", None)
            }
        };
        let settings = Payload::encode(&Settings {
            route: kind,
            tie_break,
            fallback: config.fallback.as_deref(),
        })?;
        let bound = driver::Team {
            name: config.name,
            description: config.description,
            roster,
            helpers,
            rule: Routing { way, fallback },
            settings,
            builds,
            max_tasks: 2,
            max_concurrent: 1,
        }
        .bind()?;
        Ok(Router {
            program: bound.program,
            coordinator: bound.coordinator,
        })
    }

    /// The team program: start it with [`Work`].
    pub fn program(&self) -> Program<Work, RouterOutput> {
        self.program.clone()
    }

    /// The coordinator the team runs each turn.
    pub fn coordinator(&self) -> Program<Turn, Decision> {
        self.coordinator.program()
    }
}

const ROUTE_PROMPT: &str = "You route a task to exactly one agent. \
The user message is a JSON object with the task and the agents (id, name, description, capabilities). \
Answer with a JSON object {\"agent_id\": \"<id>\"} naming the one agent best suited to the task, \
using an id exactly as listed.";

enum Way {
    Pure(Pure<RouteQuery, String>),
    Capabilities(TieBreak),
    Model(Name),
}

struct Routing {
    way: Way,
    fallback: Option<usize>,
}

/// The capability score of each agent for `task`.
pub fn scores(task: &Payload, agents: &[AgentCard]) -> Vec<u64> {
    let value = task.to_value();
    let (keys, strings): (BTreeSet<&str>, Vec<&str>) = match &value {
        serde_json::Value::Object(members) => (
            members.keys().map(String::as_str).collect(),
            members.values().filter_map(|v| v.as_str()).collect(),
        ),
        serde_json::Value::String(text) => (BTreeSet::new(), vec![text.as_str()]),
        _ => (BTreeSet::new(), Vec::new()),
    };
    agents
        .iter()
        .map(|agent| {
            agent
                .capabilities
                .iter()
                .map(|capability| {
                    let key = if keys.contains(capability.as_str()) {
                        2
                    } else {
                        0
                    };
                    let values = strings.iter().filter(|s| **s == capability).count() as u64;
                    key + values
                })
                .sum()
        })
        .collect()
}

/// The key of the chosen agent's task.
const AGENT_KEY: &str = "agent";

impl Routing {
    /// The agent `requested` names, or the fallback, or the failure.
    fn resolve(
        &self,
        requested: &str,
        roster: &Roster,
        how: Choice,
    ) -> Result<(usize, Choice), Failure> {
        if let Some(index) = roster.index_of(requested) {
            return Ok((index, how));
        }
        self.fallback(Some(requested.to_owned())).ok_or_else(|| {
            driver::failure(
                Routing::STRATEGY,
                "unknown_agent",
                FailureKind::Contract,
                format!("the route named {requested:?}, which is not an agent of the roster"),
            )
        })
    }

    fn fallback(&self, requested: Option<String>) -> Option<(usize, Choice)> {
        self.fallback
            .map(|index| (index, Choice::Fallback { requested }))
    }

    /// The choice, or `None` while the model router runs.
    fn choose(
        &self,
        view: &TurnView<'_>,
        roster: &Roster,
    ) -> Result<Option<(usize, Choice)>, Failure> {
        let query = || RouteQuery {
            task: view.task.clone(),
            agents: roster.cards(),
        };
        match &self.way {
            Way::Pure(function) => {
                let id = function.call(&query())?;
                self.resolve(&id, roster, Choice::Function).map(Some)
            }
            Way::Capabilities(tie) => {
                let scores = scores(view.task, &roster.cards());
                let best = scores.iter().copied().max().unwrap_or(0);
                let leaders: Vec<usize> =
                    (0..scores.len()).filter(|i| scores[*i] == best).collect();
                if best == 0 {
                    return self.fallback(None).map(Some).ok_or_else(|| {
                        driver::failure(
                            Self::STRATEGY,
                            "no_match",
                            FailureKind::Execution,
                            "no agent's capabilities match the task",
                        )
                    });
                }
                if leaders.len() > 1 && *tie == TieBreak::Refuse {
                    return self.fallback(None).map(Some).ok_or_else(|| {
                        let ids: Vec<String> = leaders
                            .iter()
                            .map(|i| roster.get(*i).id().to_string())
                            .collect();
                        driver::failure(
                            Self::STRATEGY,
                            "tie",
                            FailureKind::Execution,
                            format!("agents {} tie with score {best}", ids.join(", ")),
                        )
                    });
                }
                Ok(Some((leaders[0], Choice::Capabilities { score: best })))
            }
            Way::Model(_) => match view.get("route").map(|fact| fact.result()) {
                None | Some(None) => Ok(None),
                Some(Some(Err(cause))) => {
                    let suffix = if cause.code() == "workflow.transform.failed" {
                        "answer_invalid"
                    } else {
                        "model_failed"
                    };
                    Err(driver::agent_failed(
                        Self::STRATEGY,
                        suffix,
                        "the model router".into(),
                        cause,
                    ))
                }
                Some(Some(Ok(answer))) => {
                    let answer: RouteAnswer = answer.decode().map_err(|error| {
                        driver::failure(
                            Self::STRATEGY,
                            "answer_invalid",
                            FailureKind::Contract,
                            error.to_string(),
                        )
                    })?;
                    self.resolve(&answer.agent_id, roster, Choice::Model)
                        .map(Some)
                }
            },
        }
    }
}

impl Rule for Routing {
    const STRATEGY: &'static str = "router";

    fn next(&self, view: &TurnView<'_>, roster: &Roster) -> Result<Next, Failure> {
        if let Way::Model(helper) = &self.way
            && view.get("route").is_none()
        {
            let query = RouteQuery {
                task: view.task.clone(),
                agents: roster.cards(),
            };
            return Ok(Next::Start(vec![Start::helper("route", helper, &query)?]));
        }
        let Some((index, choice)) = self.choose(view, roster)? else {
            return Ok(Next::Wait);
        };
        let agent = roster.get(index);
        match view.get(AGENT_KEY).map(|fact| fact.result()) {
            None => Ok(Next::Start(vec![Start::agent(
                AGENT_KEY,
                index,
                driver::encode(&AgentInput::task(view.task.clone()))?,
            )])),
            Some(None) => Ok(Next::Wait),
            Some(Some(Err(cause))) => Err(driver::agent_failed(
                Self::STRATEGY,
                "agent_failed",
                format!("agent {}", agent.id()),
                cause,
            )),
            Some(Some(Ok(output))) => Ok(Next::Complete(driver::encode(&RouterOutput {
                agent: agent.id().clone(),
                choice,
                output: output.clone(),
            })?)),
        }
    }
}
