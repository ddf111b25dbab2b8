//! `ConfigError`: why a strategy could not be built. Every variant has a
//! stable code `strategy.<name>.<suffix>`; nothing is bound when building
//! fails.

/// Why a strategy (or an agent of its roster) could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// An agent id breaks the id rule.
    #[error("strategy.roster.invalid_id: invalid agent id {id:?}: {rule}")]
    InvalidAgentId {
        /// The refused id (cut to 80 characters).
        id: String,
        /// The rule it broke.
        rule: &'static str,
    },
    /// The roster is empty.
    #[error("strategy.roster.empty: the roster needs at least one agent")]
    EmptyRoster,
    /// Two agents share an id.
    #[error("strategy.roster.duplicate_agent: agent id {id} is used twice")]
    DuplicateAgent {
        /// The repeated id.
        id: String,
    },
    /// Two agents run programs with the same descriptor name (the team
    /// selects workers by name, so each agent needs a program of its own).
    #[error(
        "strategy.roster.duplicate_program: agents {first} and {second} both run program {program}"
    )]
    DuplicateProgram {
        /// The first agent.
        first: String,
        /// The second agent.
        second: String,
        /// The shared descriptor name.
        program: String,
    },
    /// A chat agent's program does not have the interaction contract.
    #[error(
        "strategy.roster.chat_contract: agent {id}'s program is not an interaction (its {which} schema differs)"
    )]
    ChatContract {
        /// The agent.
        id: String,
        /// `input`, `output` or `signal`.
        which: &'static str,
    },
    /// A chat agent was declared posting (its output is its answer's text,
    /// which carries no posts).
    #[error("strategy.roster.posting_chat: chat agent {id} cannot post to the board")]
    PostingChat {
        /// The agent.
        id: String,
    },
    /// A name or description is not a valid descriptor.
    #[error("strategy.config.descriptor: {0}")]
    Descriptor(#[from] baton_run::program::DescriptorError),
    /// A pure function's build identity is empty.
    #[error("strategy.config.build: the build identity of {what} must not be empty")]
    Build {
        /// Which function.
        what: &'static str,
    },
    /// A model-backed part (an interaction or its adapter) was refused.
    #[error("strategy.config.model: {0}")]
    Model(String),
    /// The team under the strategy was refused.
    #[error("strategy.config.team: {0}")]
    Team(#[from] baton_team::ConfigError),
    /// The configuration does not encode (for its identity).
    #[error("strategy.config.encode: {0}")]
    Encode(String),
    /// `max_concurrency` is zero.
    #[error("strategy.parallel.zero_concurrency: max_concurrency must be at least 1")]
    ZeroConcurrency,
    /// The fallback agent is not in the roster.
    #[error("strategy.router.unknown_fallback: the fallback agent {id} is not in the roster")]
    UnknownFallback {
        /// The fallback id.
        id: String,
    },
    /// `max_iterations` is zero.
    #[error("strategy.planner.zero_iterations: max_iterations must be at least 1")]
    ZeroIterations,
    /// `max_tasks` is zero.
    #[error("strategy.planner.zero_tasks: max_tasks must be at least 1")]
    ZeroTasks,
    /// A swarm has fewer than two agents.
    #[error("strategy.swarm.too_few_agents: a swarm needs at least 2 agents, got {count}")]
    TooFewAgents {
        /// How many it has.
        count: usize,
    },
    /// The initial agent is not in the swarm.
    #[error("strategy.swarm.unknown_initial: the initial agent {id} is not in the swarm")]
    UnknownInitial {
        /// The initial id.
        id: String,
    },
    /// Two agents' handoff tools sanitize to the same name.
    #[error(
        "strategy.swarm.tool_name_collision: agents {first} and {second} both get the handoff tool {tool}"
    )]
    ToolNameCollision {
        /// The first agent.
        first: String,
        /// The second agent.
        second: String,
        /// The shared tool name.
        tool: String,
    },
    /// `max_handoffs` is zero.
    #[error("strategy.swarm.zero_handoffs: max_handoffs must be at least 1")]
    ZeroHandoffs,
    /// A supervisor has neither workers nor sub-teams.
    #[error(
        "strategy.hierarchy.empty_supervisor: supervisor {id} has neither workers nor sub-teams"
    )]
    EmptySupervisor {
        /// The supervisor.
        id: String,
    },
}

impl ConfigError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ConfigError::InvalidAgentId { .. } => "strategy.roster.invalid_id",
            ConfigError::EmptyRoster => "strategy.roster.empty",
            ConfigError::DuplicateAgent { .. } => "strategy.roster.duplicate_agent",
            ConfigError::DuplicateProgram { .. } => "strategy.roster.duplicate_program",
            ConfigError::ChatContract { .. } => "strategy.roster.chat_contract",
            ConfigError::PostingChat { .. } => "strategy.roster.posting_chat",
            ConfigError::Descriptor(_) => "strategy.config.descriptor",
            ConfigError::Build { .. } => "strategy.config.build",
            ConfigError::Model(_) => "strategy.config.model",
            ConfigError::Team(_) => "strategy.config.team",
            ConfigError::Encode(_) => "strategy.config.encode",
            ConfigError::ZeroConcurrency => "strategy.parallel.zero_concurrency",
            ConfigError::UnknownFallback { .. } => "strategy.router.unknown_fallback",
            ConfigError::ZeroIterations => "strategy.planner.zero_iterations",
            ConfigError::ZeroTasks => "strategy.planner.zero_tasks",
            ConfigError::TooFewAgents { .. } => "strategy.swarm.too_few_agents",
            ConfigError::UnknownInitial { .. } => "strategy.swarm.unknown_initial",
            ConfigError::ToolNameCollision { .. } => "strategy.swarm.tool_name_collision",
            ConfigError::ZeroHandoffs => "strategy.swarm.zero_handoffs",
            ConfigError::EmptySupervisor { .. } => "strategy.hierarchy.empty_supervisor",
        }
    }
}

impl From<baton_agent::InteractionConfigError> for ConfigError {
    fn from(error: baton_agent::InteractionConfigError) -> ConfigError {
        ConfigError::Model(error.to_string())
    }
}

impl From<baton_agent::AdapterError> for ConfigError {
    fn from(error: baton_agent::AdapterError) -> ConfigError {
        ConfigError::Model(error.to_string())
    }
}

impl From<baton_run::PayloadError> for ConfigError {
    fn from(error: baton_run::PayloadError) -> ConfigError {
        ConfigError::Encode(error.to_string())
    }
}
