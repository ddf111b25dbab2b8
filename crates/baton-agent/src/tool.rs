//! Tools: programs the model may call by name, and tools made from async
//! functions.

use std::future::Future;
use std::time::Duration;

use baton_run::dispatch::{ReplayPolicy, RetryPolicy};
use baton_run::{Budget, Capabilities, Meters, Payload, Program, Quota};
use baton_workflow::{Activity, ActivityConfig, ActivityContext, ActivityError, Approval};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chat::{ToolSpec, valid_tool_name};

/// The error a tool function returns: an activity's error (a classified
/// failure the model reads as the tool's result).
pub type ToolError = ActivityError;

/// What a tool function receives besides its arguments: an activity's
/// context, whose [`idempotency_key`](ActivityContext::idempotency_key) is
/// the call's effect id.
pub type ToolContext = ActivityContext;

/// The budget each tool call is granted unless the tool says otherwise:
/// 8 steps, 4 effects and 8 signals, enough for a tool function with
/// approval (4 steps, 2 effects, 3 signals), and no meter. It is granted
/// clipped to what the calling interaction has left, so it never fails a
/// call for a grant the caller cannot afford.
pub const DEFAULT_TOOL_BUDGET: Budget = Budget {
    steps: Quota::Finite(8),
    effects: Quota::Finite(4),
    signals: Quota::Finite(8),
    meters: std::collections::BTreeMap::new(),
};

/// Why a tool could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolConfigError {
    /// The model-facing name is not `[A-Za-z0-9_-]`, 1 to 64 characters.
    #[error("invalid tool name {name:?}: expected 1 to 64 of A-Z a-z 0-9 _ -")]
    Name {
        /// The name.
        name: String,
    },
    /// The arguments' schema is not an object schema, which providers
    /// require of a tool's parameters. Take a struct as the input.
    #[error(
        "tool {name:?}: the arguments' schema must be an object schema (a struct), not {found}"
    )]
    Parameters {
        /// The tool's name.
        name: String,
        /// What the schema is instead.
        found: String,
    },
    /// The activity behind a tool function is invalid.
    #[error("tool {name:?}: {source}")]
    Activity {
        /// The tool's name.
        name: String,
        /// Why.
        source: baton_workflow::ConfigError,
    },
}

/// Checks that a tool's parameters are an object schema; returns what they
/// are otherwise.
pub(crate) fn object_schema(parameters: &Value) -> Result<(), String> {
    match parameters.get("type") {
        Some(Value::String(kind)) if kind == "object" => Ok(()),
        Some(kind) => Err(format!("a schema of type {kind}")),
        None if parameters.get("anyOf").is_some() || parameters.get("oneOf").is_some() => {
            Err("a union (anyOf/oneOf)".into())
        }
        None => Err(format!("the untyped schema {parameters}")),
    }
}

/// A tool: a program the model may call by name. The model's arguments are
/// checked against the program's input schema before the call starts, and
/// each call runs as a child of the interaction with the tool's budget
/// (clipped to what the interaction has left) and capabilities.
#[derive(Clone, Debug)]
pub struct Tool {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) program: Program,
    pub(crate) budget: Budget,
    pub(crate) capabilities: Capabilities,
    /// Whether the program's output is a [`ToolReply`] the model reads as
    /// its text, marked as an error when the reply says so.
    pub(crate) reply: bool,
}

/// The output of a tool that answers as a tool server does: the text the
/// model reads and whether it reports an error. A call that completes with
/// `is_error` is a model-visible error, not a failure of the call: the
/// tool ran and told the model what went wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolReply {
    /// What the model reads.
    pub text: String,
    /// Whether the tool reports an error.
    #[serde(default)]
    pub is_error: bool,
    /// Structured content the tool returned besides its text (kept in the
    /// log for programs and people; the model reads `text`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured: Option<Payload>,
}

/// How to build a tool from an async function. The replay policy, timeout
/// and approval are the activity's (see [`ActivityConfig`]).
#[derive(Clone, Debug)]
pub struct ToolConfig {
    /// The name the model calls it by (`[A-Za-z0-9_-]`, 1 to 64 characters).
    /// The activity's descriptor name is `tool.` followed by the name in
    /// lowercase with `-` as `_`.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The identity of the function's code (change it when the function
    /// changes behaviour).
    pub build: String,
    /// `Never` (the default): a call lost in a crash is an unknown effect
    /// the host resolves. `SameIdentity` for idempotent functions: the call
    /// is sent again with the same idempotency key.
    pub replay: ReplayPolicy,
    /// The longest one call may run.
    pub timeout: Duration,
    /// Whether a person must approve each call first.
    pub approval: Approval,
    /// The budget of each call ([`DEFAULT_TOOL_BUDGET`] unless set), granted
    /// clipped to what the calling interaction has left.
    pub budget: Budget,
    /// Capabilities each call needs (and is granted by the interaction).
    pub capabilities: Capabilities,
    /// Meter usage charged before each call (its worst case).
    pub reserve: Meters,
    /// How the kernel tries a failed call again (see
    /// `ActivityConfig::retry`); none by default.
    pub retry: RetryPolicy,
}

impl ToolConfig {
    /// A configuration with build `default`, replay policy `Never`, the
    /// activity's default timeout, no approval, [`DEFAULT_TOOL_BUDGET`], no
    /// capabilities and no reservation.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> ToolConfig {
        let defaults = ActivityConfig::new("tool", "");
        ToolConfig {
            name: name.into(),
            description: description.into(),
            build: defaults.build,
            replay: defaults.replay,
            timeout: defaults.timeout,
            approval: defaults.approval,
            budget: DEFAULT_TOOL_BUDGET,
            capabilities: Capabilities::none(),
            reserve: Meters::new(),
            retry: defaults.retry,
        }
    }
}

impl Tool {
    /// A tool running `program` with [`DEFAULT_TOOL_BUDGET`] and no
    /// capabilities. Its input schema must be an object schema, which
    /// [`Interaction::new`](crate::Interaction::new) checks.
    pub fn new<I, O>(
        name: impl Into<String>,
        description: impl Into<String>,
        program: &Program<I, O>,
    ) -> Tool {
        Tool {
            name: name.into(),
            description: description.into(),
            program: program.erase(),
            budget: DEFAULT_TOOL_BUDGET,
            capabilities: Capabilities::none(),
            reply: false,
        }
    }

    /// A tool that runs `function` as an [`Activity`]: each call is a child
    /// whose one effect dispatches the function with the model's arguments
    /// (an `I`), its effect id as idempotency key, under the configured
    /// replay policy, timeout and approval; a panic fails the call with
    /// `workflow.activity.panicked`. The model-facing parameters are `I`'s
    /// schema, which must be an object schema. Each call runs in an
    /// `execute_tool` span carrying `gen_ai.tool.name` (see the crate docs).
    pub fn function<I, O, F, Fut>(config: ToolConfig, function: F) -> Result<Tool, ToolConfigError>
    where
        I: DeserializeOwned + JsonSchema + Send + 'static,
        O: Serialize + JsonSchema + 'static,
        F: Fn(I, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, ToolError>> + Send + 'static,
    {
        if !valid_tool_name(&config.name) {
            return Err(ToolConfigError::Name { name: config.name });
        }
        let parameters = baton_run::program::Schema::of::<I>().json().to_value();
        if let Err(found) = object_schema(&parameters) {
            return Err(ToolConfigError::Parameters {
                name: config.name,
                found,
            });
        }
        // Each call runs in an `execute_tool` span named for the tool.
        let tool_name: std::sync::Arc<str> = config.name.as_str().into();
        let traced = move |input: I, context: ToolContext| {
            let span = crate::telemetry::tool_span(&tool_name);
            let recorder = span.clone();
            let call = function(input, context);
            tracing::Instrument::instrument(
                async move {
                    let result = call.await;
                    if let Err(error) = &result {
                        crate::telemetry::record_error(&recorder, error.code());
                    }
                    result
                },
                span,
            )
        };
        let activity = Activity::<I, O>::new(
            ActivityConfig {
                name: format!("tool.{}", config.name.to_lowercase().replace('-', "_")),
                description: config.description.clone(),
                build: config.build,
                replay: config.replay,
                timeout: config.timeout,
                approval: config.approval,
                reserve: config.reserve,
                requires: config.capabilities.clone(),
                retry: config.retry,
            },
            traced,
        )
        .map_err(|source| ToolConfigError::Activity {
            name: config.name.clone(),
            source,
        })?;
        Ok(Tool {
            name: config.name,
            description: config.description,
            program: activity.program().erase(),
            budget: config.budget,
            capabilities: config.capabilities,
            reply: false,
        })
    }

    /// Grants each call this budget (clipped to what the interaction has
    /// left, and debited from it for good).
    pub fn with_budget(mut self, budget: Budget) -> Tool {
        self.budget = budget;
        self
    }

    /// Grants each call these capabilities.
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> Tool {
        self.capabilities = capabilities;
        self
    }

    /// The model-facing name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The program each call runs.
    pub fn program(&self) -> &Program {
        &self.program
    }

    pub(crate) fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.clone(),
            description: self.description.clone(),
            parameters: self.program.descriptor().input_schema().json().to_value(),
        }
    }
}
