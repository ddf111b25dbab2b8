//! A server's listed tools as Baton tools: names, schemas, annotations
//! and overrides.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use baton_run::dispatch::ReplayPolicy;
use baton_run::program::{Purpose, Schema};
use baton_run::{Budget, Capabilities, Digest, Meters, Name, Payload};
use baton_workflow::{Activity, ActivityConfig, ActivityContext, ActivitySchemas, Approval};
use serde::Deserialize;
use serde_json::Value;

use super::session::Shared;
use super::{MCP_CALLS, McpError, McpToolOptions};
use crate::chat::valid_tool_name;
use crate::tool::{Tool, ToolReply, object_schema};

/// A tool as a server lists it; fields Baton does not use are ignored.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Listed {
    name: String,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    description: Option<String>,
    input_schema: Value,
    #[serde(default)]
    annotations: Option<Annotations>,
}

/// The hints of a tool's annotations that Baton reads.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Annotations {
    #[serde(default)]
    read_only_hint: Option<bool>,
    #[serde(default)]
    destructive_hint: Option<bool>,
    #[serde(default)]
    idempotent_hint: Option<bool>,
}

/// The grace past a call's own timeout before the activity abandons it:
/// the session's timeout fires first and tells the server to cancel.
const ABANDON_GRACE: Duration = Duration::from_secs(1);

/// The model-facing name of `tool` on `server`: `<server>_<tool>`, every
/// character outside `[a-zA-Z0-9_-]` replaced by `_`, and a name longer
/// than 64 characters cut to 55 and ended with `_` and 8 hex digits of a
/// digest of the whole name, so that it stays unique within providers'
/// limit (`^[a-zA-Z0-9_-]{1,64}$`).
pub fn tool_name(server: &str, tool: &str) -> String {
    let full = format!("{server}_{tool}");
    let clean: String = full
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.len() <= 64 {
        return clean;
    }
    let digest = Digest::of_parts(Purpose::Identity, &[b"mcp tool name", full.as_bytes()]);
    let hex: String = digest.as_bytes()[..4]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("{}_{hex}", &clean[..55])
}

/// The descriptor name of a tool's program: `mcp.` and the model-facing
/// name in lowercase with `-` as `_` (and a leading `t` when it does not
/// start with a letter).
fn program_name(model_name: &str) -> String {
    let mut segment = model_name.to_ascii_lowercase().replace('-', "_");
    if !segment.starts_with(|c: char| c.is_ascii_lowercase()) {
        segment.insert(0, 't');
    }
    format!("mcp.{segment}")
}

/// The replay policy and approval the annotations imply: read-only or
/// idempotent tools are sent again after a crash, others never; a tool
/// that says it is destructive (and not read-only) needs approval.
fn implied(annotations: &Annotations) -> (ReplayPolicy, Approval) {
    let read_only = annotations.read_only_hint == Some(true);
    let replay = if read_only || annotations.idempotent_hint == Some(true) {
        ReplayPolicy::SameIdentity
    } else {
        ReplayPolicy::Never
    };
    let approval = if annotations.destructive_hint == Some(true) && !read_only {
        Approval::Required
    } else {
        Approval::NotRequired
    };
    (replay, approval)
}

/// Turns the listed tools into Baton tools as the configuration says.
pub(crate) fn build(shared: &Arc<Shared>, listed: Vec<Value>) -> Result<Vec<Tool>, McpError> {
    let config = &shared.config;
    let tool_error = |tool: &str, reason: String| McpError::Tool {
        server: config.name.clone(),
        tool: tool.to_owned(),
        reason,
    };
    let mut offered = Vec::new();
    let mut seen = BTreeSet::new();
    for value in listed {
        let tool: Listed = serde_json::from_value(value).map_err(|error| McpError::List {
            server: config.name.clone(),
            reason: format!("a listed tool does not decode: {error}"),
        })?;
        if !seen.insert(tool.name.clone()) {
            return Err(tool_error(&tool.name, "listed twice".into()));
        }
        if config
            .allow
            .as_ref()
            .is_none_or(|allow| allow.contains(&tool.name))
        {
            offered.push(tool);
        }
    }
    let named = config.allow.iter().flatten().chain(config.tools.keys());
    for name in named {
        if !seen.contains(name) {
            return Err(tool_error(name, "the server has no such tool".into()));
        }
    }
    let mut names = BTreeMap::new();
    let mut tools = Vec::with_capacity(offered.len());
    for listed in offered {
        let options = config.tools.get(&listed.name).cloned().unwrap_or_default();
        let tool = one(shared, listed, &options)?;
        if let Some(other) =
            names.insert(tool.name.clone(), tool.program.descriptor().name().clone())
        {
            return Err(tool_error(
                &tool.name,
                format!(
                    "its name {:?} is also the name of {other}; rename one",
                    tool.name
                ),
            ));
        }
        tools.push(tool);
    }
    Ok(tools)
}

fn one(shared: &Arc<Shared>, listed: Listed, options: &McpToolOptions) -> Result<Tool, McpError> {
    let config = &shared.config;
    let server_name = listed.name.clone();
    let tool_error = |reason: String| McpError::Tool {
        server: config.name.clone(),
        tool: server_name.clone(),
        reason,
    };
    let model_name = options
        .name
        .clone()
        .unwrap_or_else(|| tool_name(&config.name, &listed.name));
    if !valid_tool_name(&model_name) {
        return Err(tool_error(format!(
            "the name {model_name:?} is not 1 to 64 of A-Z a-z 0-9 _ -"
        )));
    }
    let mut parameters = listed.input_schema;
    if let Err(found) = object_schema(&parameters) {
        return Err(McpError::Parameters {
            server: config.name.clone(),
            tool: listed.name,
            found,
        });
    }
    // Baton validates with JSON Schema 2020-12 whatever the server
    // declares; the declaration would only mislead the model's provider.
    if let Value::Object(object) = &mut parameters {
        object.remove("$schema");
    }
    let input = Payload::from_value(&parameters)
        .map_err(|error| error.to_string())
        .and_then(|payload| Schema::new(payload).map_err(|error| error.to_string()))
        .map_err(|why| tool_error(format!("its input schema does not compile: {why}")))?;
    let (replay, approval) = implied(&listed.annotations.unwrap_or_default());
    let timeout = options.timeout.unwrap_or(config.call_timeout);
    let mut reserve = Meters::new();
    reserve.insert(Name::new(MCP_CALLS).expect("a valid meter name"), 1);
    let description = listed
        .description
        .filter(|text| !text.trim().is_empty())
        .or(listed.title)
        .unwrap_or_else(|| {
            format!(
                "The tool {} of the MCP server {}.",
                listed.name, config.name
            )
        });
    let activity_config = ActivityConfig {
        name: program_name(&model_name),
        description: format!("MCP tool {:?} of server {:?}", listed.name, config.name),
        build: format!("mcp {} {}", shared.identity, listed.name),
        replay: options.replay.unwrap_or(replay),
        timeout: timeout.saturating_add(ABANDON_GRACE),
        approval: options.approval.unwrap_or(approval),
        reserve,
        requires: Capabilities::none(),
        retry: options.retry.unwrap_or(config.retry),
    };
    let session = shared.clone();
    let called = server_name.clone();
    let activity = Activity::dynamic(
        activity_config,
        ActivitySchemas {
            input,
            output: Schema::of::<ToolReply>(),
        },
        move |arguments: Payload, context: ActivityContext| {
            let session = session.clone();
            let tool = called.clone();
            async move {
                session
                    .call(&tool, arguments, context.idempotency_key(), timeout)
                    .await
            }
        },
    )
    .map_err(|error| tool_error(error.to_string()))?;
    Ok(Tool {
        name: model_name,
        description,
        program: activity.program().erase(),
        budget: call_budget(options.budget.as_ref().unwrap_or(&config.budget)),
        capabilities: Capabilities::none(),
        reply: true,
    })
}

/// The budget each call is granted: `budget`, naming one [`MCP_CALLS`]
/// when it does not name the meter, since the call reserves one and a
/// grant holds nothing of a meter its budget does not name.
fn call_budget(budget: &Budget) -> Budget {
    let calls = Name::new(MCP_CALLS).expect("a valid meter name");
    if budget.meters.contains_key(&calls) {
        budget.clone()
    } else {
        budget.clone().with_meter(calls, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed_sanitized_and_kept_within_the_providers_limit() {
        assert_eq!(tool_name("fs", "read_file"), "fs_read_file");
        assert_eq!(tool_name("git", "log.search/v2"), "git_log_search_v2");
        let long = "x".repeat(80);
        let one = tool_name("srv", &long);
        let other = tool_name("srv", &format!("{long}y"));
        assert_eq!(one.len(), 64);
        assert!(valid_tool_name(&one));
        assert_ne!(one, other, "names cut to the limit stay apart");
    }

    #[test]
    fn annotations_imply_the_replay_policy_and_approval() {
        let hints = |read_only, destructive, idempotent| Annotations {
            read_only_hint: read_only,
            destructive_hint: destructive,
            idempotent_hint: idempotent,
        };
        assert_eq!(
            implied(&hints(Some(true), None, None)),
            (ReplayPolicy::SameIdentity, Approval::NotRequired)
        );
        assert_eq!(
            implied(&hints(None, Some(false), Some(true))),
            (ReplayPolicy::SameIdentity, Approval::NotRequired)
        );
        assert_eq!(
            implied(&hints(None, Some(true), None)),
            (ReplayPolicy::Never, Approval::Required)
        );
        assert_eq!(
            implied(&Annotations::default()),
            (ReplayPolicy::Never, Approval::NotRequired)
        );
    }

    #[test]
    fn a_call_budget_always_names_the_mcp_calls_it_reserves() {
        let calls = Name::new(MCP_CALLS).expect("valid");
        let given = Budget::unlimited().with_steps(8);
        assert_eq!(
            call_budget(&given).meter(&calls),
            baton_run::Quota::Finite(1)
        );
        let named = given.with_meter(calls.clone(), 3);
        assert_eq!(
            call_budget(&named).meter(&calls),
            baton_run::Quota::Finite(3)
        );
    }

    #[test]
    fn program_names_are_valid_descriptor_names() {
        for name in ["fs_read_file", "Everything-Echo", "9lives"] {
            let program = program_name(name);
            assert!(Name::new(&program).is_ok(), "{program}");
        }
    }
}
