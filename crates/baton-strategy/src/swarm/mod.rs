//! Swarm: agents hand the conversation to each other with generated
//! `transfer_to_<agent>` tools; the active agent continues the shared
//! conversation until one answers without handing off. `max_handoffs` ends
//! the swarm with its own code; the handoff history is in the team's task
//! list and in the output.
//!
//! Each turn of an agent is one task of the team running that agent's turn
//! program: one model call whose answer is either the reply or exactly one
//! transfer call. A handoff ends the turn; the next agent's turn starts
//! from the conversation with the call and its result appended. The seed's
//! handoff tools ran the target inside the caller's tool loop; here the
//! caller's turn ends, so one conversation has one active agent at a time.

mod turn;

use std::collections::BTreeMap;

use baton_agent::{Message, ToolResult, ToolSpec};
use baton_run::{Failure, FailureKind, Payload, Program};
use baton_team::{Decision, Policy, Turn};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use turn::{HandoffCall, SwarmInput, SwarmReply};

use crate::driver::{self, Next, Rule, Start, TurnView};
use crate::model::{ModelConfig, name_segment};
use crate::roster::{Roster, text_of};
use crate::{Agent, AgentId, ConfigError, Work};

/// The swarm asked for one handoff more than `max_handoffs` (kind
/// `execution`).
pub const MAX_HANDOFFS: &str = "strategy.swarm.max_handoffs";
/// An agent's answer called tools but was not exactly one transfer call
/// with valid arguments (kind `contract`).
pub const HANDOFF_INVALID: &str = "strategy.swarm.handoff_invalid";
/// An agent's turn failed (its model call failed); its kind is the
/// turn's failure's kind.
pub const AGENT_FAILED: &str = "strategy.swarm.agent_failed";

/// The most handoffs when a configuration does not say.
pub const DEFAULT_MAX_HANDOFFS: u32 = 10;

/// One agent of a swarm.
#[derive(Clone, Debug)]
pub struct SwarmAgent {
    /// Its id (its transfer tool is `transfer_to_<id>`, sanitized).
    pub id: String,
    /// Its name.
    pub name: String,
    /// What it does: the description of its transfer tool.
    pub description: String,
    /// Its system prompt.
    pub system: String,
    /// Its model.
    pub model: ModelConfig,
}

/// How to build a [`Swarm`]. Validated once by [`Swarm::new`].
#[derive(Clone, Debug)]
pub struct SwarmConfig {
    /// The team's descriptor name (lowercase dotted); each agent's turn
    /// program is `<name>.<id as a name segment>`.
    pub name: String,
    /// What the team does.
    pub description: String,
    /// The agents (at least 2).
    pub agents: Vec<SwarmAgent>,
    /// The agent that answers first (the first agent when `None`).
    pub initial: Option<String>,
    /// The most handoffs (at least 1; [`DEFAULT_MAX_HANDOFFS`] by default).
    pub max_handoffs: u32,
}

impl SwarmConfig {
    /// A swarm of `agents` starting with the first, allowing
    /// [`DEFAULT_MAX_HANDOFFS`] handoffs.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        agents: Vec<SwarmAgent>,
    ) -> SwarmConfig {
        SwarmConfig {
            name: name.into(),
            description: description.into(),
            agents,
            initial: None,
            max_handoffs: DEFAULT_MAX_HANDOFFS,
        }
    }
}

/// One handoff of a swarm.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Handoff {
    /// The turn that handed off, from 1.
    pub turn: u32,
    /// The agent that handed off.
    pub from: AgentId,
    /// The agent that took over.
    pub to: AgentId,
    /// What it told the next agent, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A swarm's output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SwarmOutput {
    /// The final answer's text.
    pub answer: String,
    /// The agent that gave it.
    pub agent: AgentId,
    /// Every handoff, in order.
    pub handoffs: Vec<Handoff>,
    /// The whole shared conversation, the final answer included.
    pub conversation: Vec<Message>,
}

/// The swarm strategy bound as a team.
#[derive(Clone, Debug)]
pub struct Swarm {
    program: Program<Work, SwarmOutput>,
    coordinator: Policy,
    turns: Vec<Program<SwarmInput, SwarmReply>>,
}

/// The transfer tool's name for agent `id`: `transfer_to_<id>` with every
/// character outside `A-Z a-z 0-9 _ -` replaced by `_`, cut to 64 bytes.
pub fn tool_name(id: &str) -> String {
    let mut name: String = format!("transfer_to_{id}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    name.truncate(64);
    name
}

/// The transfer tool to `target`.
fn tool(target: &SwarmAgent) -> ToolSpec {
    ToolSpec {
        name: tool_name(&target.id),
        description: target.description.clone(),
        parameters: serde_json::json!({
            "type": "object",
            "properties": {
                "message": {
                    "type": "string",
                    "description": "What the next agent should know or do."
                }
            },
            "additionalProperties": false
        }),
    }
}

#[derive(Serialize)]
struct Settings<'a> {
    initial: &'a str,
    max_handoffs: u32,
}

impl Swarm {
    /// Validates the configuration and binds the team: at least two
    /// agents, valid and unique ids, transfer tool names that do not
    /// collide, a known initial agent and at least one handoff.
    pub fn new(config: SwarmConfig) -> Result<Swarm, ConfigError> {
        if config.agents.len() < 2 {
            return Err(ConfigError::TooFewAgents {
                count: config.agents.len(),
            });
        }
        if config.max_handoffs == 0 {
            return Err(ConfigError::ZeroHandoffs);
        }
        let mut tools: BTreeMap<String, &str> = BTreeMap::new();
        for agent in &config.agents {
            AgentId::new(agent.id.as_str())?;
            if let Some(first) = tools.insert(tool_name(&agent.id), &agent.id) {
                if first == agent.id {
                    return Err(ConfigError::DuplicateAgent {
                        id: agent.id.clone(),
                    });
                }
                return Err(ConfigError::ToolNameCollision {
                    first: first.to_owned(),
                    second: agent.id.clone(),
                    tool: tool_name(&agent.id),
                });
            }
        }
        let initial = config
            .initial
            .clone()
            .unwrap_or_else(|| config.agents[0].id.clone());
        let initial_index = config
            .agents
            .iter()
            .position(|agent| agent.id == initial)
            .ok_or_else(|| ConfigError::UnknownInitial {
                id: initial.clone(),
            })?;
        let mut agents = Vec::new();
        let mut turns = Vec::new();
        for agent in &config.agents {
            let others = config
                .agents
                .iter()
                .filter(|other| other.id != agent.id)
                .map(|other| Ok((tool(other), AgentId::new(other.id.as_str())?)))
                .collect::<Result<Vec<_>, ConfigError>>()?;
            let program = turn::SwarmTurn::program(turn::TurnSpec {
                agent: AgentId::new(agent.id.as_str())?,
                name: format!("{}.{}", config.name, name_segment(&agent.id)),
                description: format!("{}'s turn in the swarm {}", agent.name, config.name),
                system: agent.system.clone(),
                model: agent.model.clone(),
                tools: others,
            })?;
            agents.push(
                Agent::program(&agent.id, &program)?
                    .named(agent.name.clone())
                    .described(agent.description.clone())
                    .with_budget(agent.model.budget.clone()),
            );
            turns.push(program);
        }
        let roster = Roster::new(agents)?;
        let settings = Payload::encode(&Settings {
            initial: &initial,
            max_handoffs: config.max_handoffs,
        })?;
        let bound = driver::Team {
            name: config.name,
            description: config.description,
            roster,
            helpers: Vec::new(),
            rule: Handoffs {
                initial: initial_index,
                max_handoffs: config.max_handoffs,
            },
            settings,
            builds: Vec::new(),
            max_tasks: u64::from(config.max_handoffs) + 1,
            max_concurrent: 1,
        }
        .bind()?;
        Ok(Swarm {
            program: bound.program,
            coordinator: bound.coordinator,
            turns,
        })
    }

    /// The team program: start it with [`Work`] (its task becomes the
    /// conversation's first user message).
    pub fn program(&self) -> Program<Work, SwarmOutput> {
        self.program.clone()
    }

    /// The coordinator the team runs each turn.
    pub fn coordinator(&self) -> Program<Turn, Decision> {
        self.coordinator.program()
    }

    /// Each agent's turn program, in configuration order.
    pub fn turns(&self) -> &[Program<SwarmInput, SwarmReply>] {
        &self.turns
    }
}

struct Handoffs {
    initial: usize,
    max_handoffs: u32,
}

fn turn_key(turn: usize) -> String {
    format!("turn.{turn}")
}

fn decode<T: serde::de::DeserializeOwned>(payload: &Payload, what: &str) -> Result<T, Failure> {
    payload.decode().map_err(|error| {
        driver::failure(
            Handoffs::STRATEGY,
            "protocol",
            FailureKind::Contract,
            format!("{what} does not decode: {error}"),
        )
    })
}

impl Rule for Handoffs {
    const STRATEGY: &'static str = "swarm";

    fn next(&self, view: &TurnView<'_>, roster: &Roster) -> Result<Next, Failure> {
        let Some(last) = view.facts.last() else {
            let input = SwarmInput {
                conversation: vec![Message::user(text_of(view.task))],
            };
            return Ok(Next::Start(vec![Start::agent(
                turn_key(1),
                self.initial,
                driver::encode(&input)?,
            )]));
        };
        let agent = roster.get(last.agent.unwrap_or(self.initial)).id().clone();
        let reply: SwarmReply = match last.result() {
            None => return Ok(Next::Wait),
            Some(Err(cause)) if cause.code() == HANDOFF_INVALID => {
                return Err(driver::failure(
                    Self::STRATEGY,
                    "handoff_invalid",
                    cause.kind,
                    format!("agent {agent}: {}", cause.message),
                ));
            }
            Some(Err(cause)) => {
                return Err(driver::agent_failed(
                    Self::STRATEGY,
                    "agent_failed",
                    format!("agent {agent} (turn {})", view.facts.len()),
                    cause,
                ));
            }
            Some(Ok(reply)) => decode(reply, "a turn's reply")?,
        };
        let mut handoffs = Vec::new();
        for (index, fact) in view.facts.iter().enumerate() {
            let Some(Ok(output)) = fact.result() else {
                continue;
            };
            let reply: SwarmReply = decode(output, "a turn's reply")?;
            if let Some(call) = reply.handoff {
                handoffs.push(Handoff {
                    turn: index as u32 + 1,
                    from: roster.get(fact.agent.unwrap_or(self.initial)).id().clone(),
                    to: call.to,
                    message: call.message,
                });
            }
        }
        let input: SwarmInput = decode(last.input, "a turn's input")?;
        let mut conversation = input.conversation;
        conversation.push(reply.message.clone());
        let Some(call) = reply.handoff else {
            return Ok(Next::Complete(driver::encode(&SwarmOutput {
                answer: reply.message.text(),
                agent,
                handoffs,
                conversation,
            })?));
        };
        if handoffs.len() > self.max_handoffs as usize {
            return Err(driver::failure(
                Self::STRATEGY,
                "max_handoffs",
                FailureKind::Execution,
                format!(
                    "agent {agent} asked for handoff {} to {}, over the limit of {}",
                    handoffs.len(),
                    call.to,
                    self.max_handoffs
                ),
            ));
        }
        let target = roster.index_of(call.to.as_str()).ok_or_else(|| {
            driver::failure(
                Self::STRATEGY,
                "handoff_invalid",
                FailureKind::Contract,
                format!(
                    "agent {agent} handed off to {}, who is not in the swarm",
                    call.to
                ),
            )
        })?;
        let result = Message::tool_results(vec![ToolResult {
            id: call.call_id.clone(),
            name: call.tool.clone(),
            output: format!("Transferred to {}.", call.to),
            is_error: false,
        }])
        .map_err(|error| {
            driver::failure(
                Self::STRATEGY,
                "protocol",
                FailureKind::Contract,
                error.to_string(),
            )
        })?;
        conversation.push(result);
        Ok(Next::Start(vec![Start::agent(
            turn_key(view.facts.len() + 1),
            target,
            driver::encode(&SwarmInput { conversation })?,
        )]))
    }
}
