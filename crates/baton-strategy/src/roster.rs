//! The shared vocabulary: agents and their roster, what an agent is given,
//! and what it produced.

use std::collections::BTreeMap;

use baton_agent::{InteractionInput, InteractionOutput, Steering};
use baton_run::program::Schema;
use baton_run::{Budget, Capabilities, Failure, Name, Payload, Program};
use baton_team::Binding;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// The rule agent ids keep.
const ID_RULE: &str = "expected 1 to 64 characters from A-Z a-z 0-9 - _ . :";

/// An agent's id within a roster: 1 to 64 characters from `A-Z a-z 0-9 - _ . :`.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(try_from = "String", into = "String")]
pub struct AgentId(String);

impl AgentId {
    /// Validates an id.
    pub fn new(text: impl Into<String>) -> Result<AgentId, ConfigError> {
        let text = text.into();
        let ok = (1..=64).contains(&text.len())
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
        if ok {
            Ok(AgentId(text))
        } else {
            Err(ConfigError::InvalidAgentId {
                id: text.chars().take(80).collect(),
                rule: ID_RULE,
            })
        }
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for AgentId {
    type Error = ConfigError;
    fn try_from(text: String) -> Result<AgentId, ConfigError> {
        AgentId::new(text)
    }
}

impl From<AgentId> for String {
    fn from(id: AgentId) -> String {
        id.0
    }
}

impl std::fmt::Display for AgentId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a router, a planner or a supervisor sees of an agent: its id,
/// name, description and capabilities (the seed's `AgentInfo`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentCard {
    /// The agent's id.
    pub id: AgentId,
    /// Its name, for people and models.
    pub name: String,
    /// What it does.
    pub description: String,
    /// What it can do, for capability routing (free-form words).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
}

/// How a strategy talks to an agent's program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentKind {
    /// Any program: it is given its input as the strategy builds it (an
    /// [`AgentInput`] unless a step maps it), and its output is its result.
    /// It receives board messages as [`BoardMessage`](crate::BoardMessage)
    /// signals when its signal schema accepts them.
    Program,
    /// A model-backed [`Interaction`](baton_agent::Interaction): the
    /// strategy renders the input as one user message, the final answer's
    /// text (a JSON string) is its result, and board messages reach it as
    /// [`Steering`] at its next safe boundary.
    Chat,
}

/// One agent of a roster: its card, how it is run, and whether it posts to
/// the board.
#[derive(Clone, Debug)]
pub struct Agent {
    card: AgentCard,
    kind: AgentKind,
    binding: Binding,
    posts: bool,
}

impl Agent {
    /// An agent running `program` (kind [`AgentKind::Program`]); its name
    /// is its id and its description its program's.
    pub fn program<I, O>(id: &str, program: &Program<I, O>) -> Result<Agent, ConfigError> {
        let id = AgentId::new(id)?;
        Ok(Agent {
            card: AgentCard {
                name: id.as_str().to_owned(),
                description: program.descriptor().description().to_owned(),
                id,
                capabilities: Vec::new(),
            },
            kind: AgentKind::Program,
            binding: Binding::new(program),
            posts: false,
        })
    }

    /// An agent running a model-backed interaction (kind
    /// [`AgentKind::Chat`]). Refused unless the program has exactly the
    /// interaction's input, output and signal schemas.
    pub fn chat(
        id: &str,
        interaction: &Program<InteractionInput, InteractionOutput>,
    ) -> Result<Agent, ConfigError> {
        let mut agent = Agent::program(id, interaction)?;
        let descriptor = interaction.descriptor();
        let checks = [
            (
                "input",
                descriptor.input_schema(),
                Schema::of::<InteractionInput>(),
            ),
            (
                "output",
                descriptor.output_schema(),
                Schema::of::<InteractionOutput>(),
            ),
            (
                "signal",
                descriptor.signal_schema(),
                Schema::of::<Steering>(),
            ),
        ];
        for (which, actual, expected) in checks {
            if *actual != expected {
                return Err(ConfigError::ChatContract {
                    id: agent.card.id.to_string(),
                    which,
                });
            }
        }
        agent.kind = AgentKind::Chat;
        Ok(agent)
    }

    /// Sets the name shown to models and people.
    pub fn named(mut self, name: impl Into<String>) -> Agent {
        self.card.name = name.into();
        self
    }

    /// Sets the description shown to models and people.
    pub fn described(mut self, description: impl Into<String>) -> Agent {
        self.card.description = description.into();
        self
    }

    /// Sets the capabilities capability routing scores.
    pub fn with_capabilities<S: Into<String>>(
        mut self,
        capabilities: impl IntoIterator<Item = S>,
    ) -> Agent {
        self.card.capabilities = capabilities.into_iter().map(Into::into).collect();
        self
    }

    /// Grants each of the agent's tasks this budget (debited from the team
    /// for good).
    pub fn with_budget(mut self, budget: Budget) -> Agent {
        self.binding = self.binding.with_budget(budget);
        self
    }

    /// Grants each of the agent's tasks these kernel capabilities (a subset
    /// of the team's).
    pub fn with_grants(mut self, grants: Capabilities) -> Agent {
        self.binding = self.binding.with_capabilities(grants);
        self
    }

    /// Declares that the agent posts to the board: its output is a
    /// [`Posted`](crate::Posted), whose `output` is its result and whose
    /// `posts` go on the board when its task ends. Program agents only: a
    /// chat agent's output is its answer's text, and a roster refuses a
    /// posting chat agent (`strategy.roster.posting_chat`).
    pub fn posting(mut self) -> Agent {
        self.posts = true;
        self
    }

    /// The agent's id.
    pub fn id(&self) -> &AgentId {
        &self.card.id
    }

    /// What models and people see of it.
    pub fn card(&self) -> &AgentCard {
        &self.card
    }

    /// How it is run.
    pub fn kind(&self) -> AgentKind {
        self.kind
    }

    /// Its program and grants.
    pub fn binding(&self) -> &Binding {
        &self.binding
    }

    /// Whether it posts to the board.
    pub fn posts(&self) -> bool {
        self.posts
    }
}

/// What a strategy gives an agent by default: the task and the outputs of
/// the agents its work builds on (the previous step, a plan task's
/// dependencies).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentInput {
    /// The task: the team's task, or the part of it this agent works on.
    pub task: Payload,
    /// Earlier results this work builds on, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<Contribution>,
}

impl AgentInput {
    /// An input of a task alone.
    pub fn task(task: Payload) -> AgentInput {
        AgentInput {
            task,
            context: Vec::new(),
        }
    }
}

/// One earlier result an agent builds on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Contribution {
    /// The agent that produced it.
    pub agent: AgentId,
    /// The plan task it answered, if it came from a plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// What it produced.
    pub output: Payload,
}

/// How one agent's task ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum Outcome {
    /// It completed with this result.
    Succeeded {
        /// The result.
        output: Payload,
    },
    /// It failed, was canceled or could not start.
    Failed {
        /// Why.
        failure: Failure,
    },
}

impl Outcome {
    /// The result, when it succeeded.
    pub fn output(&self) -> Option<&Payload> {
        match self {
            Outcome::Succeeded { output } => Some(output),
            Outcome::Failed { .. } => None,
        }
    }
}

/// One agent's outcome, as strategies report it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentResult {
    /// The agent.
    pub agent: AgentId,
    /// How its task ended.
    pub outcome: Outcome,
}

/// A validated roster: unique ids and one program per agent.
#[derive(Clone, Debug)]
pub(crate) struct Roster {
    agents: Vec<Agent>,
    by_program: BTreeMap<Name, usize>,
    by_id: BTreeMap<AgentId, usize>,
}

impl Roster {
    /// Validates `agents`: at least one, unique ids, unique program names,
    /// no posting chat agent.
    pub fn new(agents: Vec<Agent>) -> Result<Roster, ConfigError> {
        if agents.is_empty() {
            return Err(ConfigError::EmptyRoster);
        }
        let mut by_id = BTreeMap::new();
        let mut by_program = BTreeMap::new();
        for (index, agent) in agents.iter().enumerate() {
            if agent.posts && agent.kind == AgentKind::Chat {
                return Err(ConfigError::PostingChat {
                    id: agent.card.id.to_string(),
                });
            }
            if by_id.insert(agent.card.id.clone(), index).is_some() {
                return Err(ConfigError::DuplicateAgent {
                    id: agent.card.id.to_string(),
                });
            }
            let name = agent.binding.program.descriptor().name().clone();
            if let Some(first) = by_program.insert(name.clone(), index) {
                return Err(ConfigError::DuplicateProgram {
                    first: agents[first].card.id.to_string(),
                    second: agent.card.id.to_string(),
                    program: name.to_string(),
                });
            }
        }
        Ok(Roster {
            agents,
            by_program,
            by_id,
        })
    }

    pub fn agents(&self) -> &[Agent] {
        &self.agents
    }

    pub fn get(&self, index: usize) -> &Agent {
        &self.agents[index]
    }

    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// The index of the agent with this id.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        AgentId::new(id)
            .ok()
            .and_then(|id| self.by_id.get(&id).copied())
    }

    /// The index of the agent whose program has this descriptor name.
    pub fn by_program(&self, name: &Name) -> Option<usize> {
        self.by_program.get(name).copied()
    }

    pub fn cards(&self) -> Vec<AgentCard> {
        self.agents.iter().map(|agent| agent.card.clone()).collect()
    }

    /// What the roster contributes to a coordinator's identity.
    pub fn digested(&self) -> Vec<DigestedAgent<'_>> {
        self.agents
            .iter()
            .map(|agent| DigestedAgent {
                card: &agent.card,
                kind: agent.kind,
                program: agent.binding.program.reference().digest,
                posts: agent.posts,
            })
            .collect()
    }
}

/// An agent as a coordinator's identity covers it.
#[derive(Serialize)]
pub(crate) struct DigestedAgent<'a> {
    card: &'a AgentCard,
    kind: AgentKind,
    program: baton_run::Digest,
    posts: bool,
}

/// The text of a payload for a model: a JSON string as itself, anything
/// else as its JSON text.
pub(crate) fn text_of(payload: &Payload) -> String {
    match payload.to_value() {
        serde_json::Value::String(text) => text,
        _ => payload.as_str().to_owned(),
    }
}

/// Renders an agent's input as the user message a chat agent reads.
pub(crate) fn render_input(input: &Payload) -> String {
    let Ok(input) = input.decode::<AgentInput>() else {
        return text_of(input);
    };
    let mut text = text_of(&input.task);
    for contribution in &input.context {
        let from = match &contribution.key {
            Some(key) => format!("{} (task {key})", contribution.agent),
            None => contribution.agent.to_string(),
        };
        text.push_str(&format!(
            "\n\nFrom {from}:\n{}",
            text_of(&contribution.output)
        ));
    }
    text
}
