//! What watchers read of a program besides its log: its role (a plain
//! program, an agent or a tool; never part of its identity) and the
//! progress a running process reports.

use serde::{Deserialize, Serialize};

/// What a program is to people watching a run
/// ([`Definition::role`](crate::program::Definition::role)).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProgramRole {
    /// Any program (the default).
    #[default]
    Program,
    /// An agent: a model-backed program that answers (an interaction, a
    /// strategy's agent turn).
    Agent,
    /// A tool an agent calls (or an activity a workflow runs).
    Tool,
}

impl ProgramRole {
    /// Whether this is the default role (left out of serialized events).
    pub fn is_program(&self) -> bool {
        *self == ProgramRole::Program
    }
}

/// What a running process is doing now, for people watching it: published
/// as a non-durable event and kept as the process's latest progress in the
/// view of a tree its engine runs (never in the log).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Progress {
    /// The phase, in a few words (`"calling the model"`, `"running tools"`,
    /// a workflow's stage name).
    pub phase: String,
    /// The tool (or activity) running now, when one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The iteration (an agent's model call, a workflow's stage), from 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iteration: Option<u64>,
    /// More detail, such as a tool's own report (`"12 of 40 files"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Progress {
    /// Progress in `phase`.
    pub fn phase(phase: impl Into<String>) -> Progress {
        Progress {
            phase: phase.into(),
            ..Progress::default()
        }
    }

    /// With the tool running now.
    pub fn with_tool(mut self, tool: impl Into<String>) -> Progress {
        self.tool = Some(tool.into());
        self
    }

    /// With the iteration.
    pub fn with_iteration(mut self, iteration: u64) -> Progress {
        self.iteration = Some(iteration);
        self
    }

    /// With more detail.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Progress {
        self.detail = Some(detail.into());
        self
    }
}
