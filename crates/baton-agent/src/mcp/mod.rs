//! Model Context Protocol servers' tools as Baton tools (feature `mcp`).
//!
//! An [`McpServer`] is the engine side's connection to one MCP server: a
//! child process spoken to over its stdio, or a streamable HTTP endpoint.
//! [`McpServer::tools`] lists the server's tools and turns each into a
//! [`Tool`](crate::Tool) whose program is a `baton-workflow` activity: every
//! call is a logged `Dispatch` effect with a replay policy, an idempotency
//! key (the effect id, sent as `_meta["dev.baton/idempotency-key"]`), a
//! timeout, a meter charge ([`MCP_CALLS`]) and, for destructive tools, an
//! approval wait.
//!
//! The session is owned by the server handle: it starts when the tools are
//! first listed and starts again at the next call after it died. A call in
//! flight when the session dies is an uncertain failure (the server may
//! have done the work): the kernel parks it as an unknown effect under
//! replay policy `Never` and sends it again under `SameIdentity`. A call
//! that could not be sent (no session could be started, or the write
//! failed) is a definite failure the kernel tries again as the tool's
//! retry policy says.
//!
//! The connection settings enter every tool's program identity, except
//! secrets: environment variable values, header values and bearer tokens
//! are [`Secret`]s, of which only the names enter; [`McpServerConfig::version`]
//! names a change that the settings do not show.

mod session;
mod tools;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use baton_run::dispatch::{ReplayPolicy, RetryPolicy};
use baton_run::{Budget, Digest, Name};
use baton_workflow::Approval;
use serde::Serialize;

use crate::tool::DEFAULT_TOOL_BUDGET;

pub use tools::tool_name;

/// The meter every MCP tool call reserves one of and is charged one of
/// when the server answers: a budget naming it bounds the number of MCP
/// calls (each call's grant is debited from its caller for good).
pub const MCP_CALLS: &str = "mcp_calls";

/// The `_meta` key under which each call sends its idempotency key (the
/// call's effect id, the same when a `SameIdentity` call is sent again).
pub const IDEMPOTENCY_META_KEY: &str = "dev.baton/idempotency-key";

/// Failure code of a call the server answered with a protocol error (an
/// unknown tool, invalid arguments): definite, not tried again.
pub const MCP_CALL_REFUSED: &str = "mcp.call.refused";
/// Failure code of a call whose session died before its answer arrived:
/// uncertain (the server may have done the work).
pub const MCP_CALL_LOST: &str = "mcp.call.lost";
/// Failure code of a call that was never sent because no session could be
/// started or the request could not be written: definite.
pub const MCP_SERVER_UNAVAILABLE: &str = "mcp.server.unavailable";
/// Failure code of a call with no answer within its timeout: uncertain.
pub const MCP_CALL_TIMED_OUT: &str = "mcp.call.timed_out";
/// Failure code of an answer that is not a tool result: definite.
pub const MCP_CALL_MALFORMED: &str = "mcp.call.malformed";

/// A secret value (an environment variable's value, a header value, a
/// token): sent to the server, never logged, never part of an identity.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the transport.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// A server run as a child process, spoken to over its stdin and stdout.
#[derive(Clone, Debug)]
pub struct StdioTransport {
    /// The program to run (a path, or a name looked up in `PATH`).
    pub command: String,
    /// Its arguments (part of the identity: keep secrets in `env`).
    pub args: Vec<String>,
    /// Environment variables set for it (names in the identity, values not).
    pub env: BTreeMap<String, Secret>,
    /// Its working directory (the engine's unless set).
    pub cwd: Option<PathBuf>,
}

impl StdioTransport {
    /// A command with arguments, no extra environment and the engine's
    /// working directory.
    pub fn new(
        command: impl Into<String>,
        args: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        StdioTransport {
            command: command.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: BTreeMap::new(),
            cwd: None,
        }
    }
}

/// A server reached over streamable HTTP.
#[derive(Clone, Debug)]
pub struct HttpTransport {
    /// The endpoint, such as `http://127.0.0.1:8000/mcp`.
    pub url: String,
    /// Headers sent with every request (names in the identity, values not).
    pub headers: BTreeMap<String, Secret>,
    /// A bearer token sent as `Authorization: Bearer …` (not in the identity).
    pub bearer: Option<Secret>,
}

impl HttpTransport {
    /// An endpoint with no headers and no token.
    pub fn new(url: impl Into<String>) -> HttpTransport {
        HttpTransport {
            url: url.into(),
            headers: BTreeMap::new(),
            bearer: None,
        }
    }
}

/// How to reach a server.
#[derive(Clone, Debug)]
pub enum McpTransport {
    /// A child process over stdio, started and supervised by the engine side.
    Stdio(StdioTransport),
    /// A streamable HTTP endpoint.
    Http(HttpTransport),
}

/// Settings of one tool that override what the server's annotations imply.
#[derive(Clone, Debug, Default)]
pub struct McpToolOptions {
    /// The model-facing name instead of `<server>_<tool>`.
    pub name: Option<String>,
    /// The replay policy instead of the one the annotations imply.
    pub replay: Option<ReplayPolicy>,
    /// Whether calls need approval instead of what `destructiveHint` implies.
    pub approval: Option<Approval>,
    /// The per-call timeout instead of the server's.
    pub timeout: Option<Duration>,
    /// The retry policy instead of the server's.
    pub retry: Option<RetryPolicy>,
    /// The budget of each call instead of the server's (one [`MCP_CALLS`]
    /// is added when it does not name the meter).
    pub budget: Option<Budget>,
}

/// How to connect to one MCP server and which of its tools to offer.
/// Validated once by [`McpServer::new`].
#[derive(Clone, Debug)]
pub struct McpServerConfig {
    /// The server's name (`[a-zA-Z0-9_-]`, 1 to 32 characters): the prefix
    /// of its tools' names and part of their program names.
    pub name: String,
    /// How to reach it.
    pub transport: McpTransport,
    /// A version you give the server: change it when the server changes
    /// behaviour in a way its settings do not show (a new release behind
    /// the same command, a rotated secret that changes what it does).
    pub version: String,
    /// The longest one call may take (60 s unless set).
    pub call_timeout: Duration,
    /// The longest starting a session may take (30 s unless set).
    pub connect_timeout: Duration,
    /// How the kernel tries a failed call again: a definite failure (never
    /// sent) under any replay policy, an uncertain one only under
    /// `SameIdentity` (under `Never` it parks as an unknown effect while
    /// attempts are left). [`default_mcp_retry`] unless set.
    pub retry: RetryPolicy,
    /// The budget of each call: [`DEFAULT_TOOL_BUDGET`] and one
    /// [`MCP_CALLS`] unless set (granted clipped to what the caller has
    /// left; one [`MCP_CALLS`] is added when it does not name the meter).
    pub budget: Budget,
    /// The server's tool names to offer; all of them when `None`.
    pub allow: Option<BTreeSet<String>>,
    /// Overrides by the server's tool name.
    pub tools: BTreeMap<String, McpToolOptions>,
}

/// The retry policy of MCP calls unless configured: three attempts,
/// backing off from 200 ms to at most 2 s.
pub fn default_mcp_retry() -> RetryPolicy {
    RetryPolicy::exponential(3, Duration::from_millis(200), Duration::from_secs(2))
}

/// The budget of each MCP call unless configured: [`DEFAULT_TOOL_BUDGET`]
/// and one [`MCP_CALLS`].
pub fn default_mcp_budget() -> Budget {
    DEFAULT_TOOL_BUDGET.with_meter(Name::new(MCP_CALLS).expect("a valid meter name"), 1)
}

impl McpServerConfig {
    /// A configuration with version `1`, the default timeouts, retry policy
    /// and budget, every tool offered and no overrides.
    pub fn new(name: impl Into<String>, transport: McpTransport) -> McpServerConfig {
        McpServerConfig {
            name: name.into(),
            transport,
            version: "1".into(),
            call_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(30),
            retry: default_mcp_retry(),
            budget: default_mcp_budget(),
            allow: None,
            tools: BTreeMap::new(),
        }
    }
}

/// Why a server could not be configured, reached or turned into tools.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The configuration is invalid.
    #[error("mcp server {server:?}: invalid configuration: {reason}")]
    Config {
        /// The server's name.
        server: String,
        /// What is wrong.
        reason: String,
    },
    /// No session could be started.
    #[error("mcp server {server:?} is unavailable: {reason}")]
    Unavailable {
        /// The server's name.
        server: String,
        /// Why.
        reason: String,
    },
    /// Listing the tools failed.
    #[error("mcp server {server:?}: listing its tools failed: {reason}")]
    List {
        /// The server's name.
        server: String,
        /// Why.
        reason: String,
    },
    /// A tool's input schema is not an object schema, which providers
    /// require; leave it out with `allow`.
    #[error(
        "mcp server {server:?}: tool {tool:?} takes {found}, not an object; leave it out with `allow`"
    )]
    Parameters {
        /// The server's name.
        server: String,
        /// The server's tool name.
        tool: String,
        /// What the schema is instead.
        found: String,
    },
    /// A tool cannot be offered as configured (a name clash, an invalid
    /// name, an allow-listed or overridden tool the server does not have).
    #[error("mcp server {server:?}: tool {tool:?}: {reason}")]
    Tool {
        /// The server's name.
        server: String,
        /// The server's tool name.
        tool: String,
        /// Why.
        reason: String,
    },
}

impl McpError {
    /// The stable code: `mcp.config.invalid`, `mcp.server.unavailable`,
    /// `mcp.list.failed`, `mcp.tool.parameters` or `mcp.tool.invalid`.
    pub fn code(&self) -> &'static str {
        match self {
            McpError::Config { .. } => "mcp.config.invalid",
            McpError::Unavailable { .. } => MCP_SERVER_UNAVAILABLE,
            McpError::List { .. } => "mcp.list.failed",
            McpError::Parameters { .. } => "mcp.tool.parameters",
            McpError::Tool { .. } => "mcp.tool.invalid",
        }
    }
}

/// What of a server's settings enters its tools' identity: everything but
/// secret values.
#[derive(Serialize)]
struct Identity<'a> {
    name: &'a str,
    version: &'a str,
    transport: &'static str,
    command: Option<&'a str>,
    args: Option<&'a [String]>,
    env: Option<Vec<&'a str>>,
    cwd: Option<String>,
    url: Option<&'a str>,
    headers: Option<Vec<&'a str>>,
    bearer: bool,
}

fn identity(config: &McpServerConfig) -> Result<Digest, McpError> {
    let mut identity = Identity {
        name: &config.name,
        version: &config.version,
        transport: "stdio",
        command: None,
        args: None,
        env: None,
        cwd: None,
        url: None,
        headers: None,
        bearer: false,
    };
    match &config.transport {
        McpTransport::Stdio(stdio) => {
            identity.command = Some(&stdio.command);
            identity.args = Some(&stdio.args);
            identity.env = Some(stdio.env.keys().map(String::as_str).collect());
            identity.cwd = stdio.cwd.as_ref().map(|cwd| cwd.display().to_string());
        }
        McpTransport::Http(http) => {
            identity.transport = "streamable_http";
            identity.url = Some(&http.url);
            identity.headers = Some(http.headers.keys().map(String::as_str).collect());
            identity.bearer = http.bearer.is_some();
        }
    }
    baton_run::program::configuration_digest(&identity).map_err(|error| McpError::Config {
        server: config.name.clone(),
        reason: error.to_string(),
    })
}

fn validate(config: &McpServerConfig) -> Result<(), McpError> {
    let invalid = |reason: String| McpError::Config {
        server: config.name.clone(),
        reason,
    };
    if !(1..=32).contains(&config.name.len())
        || !config
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(invalid(
            "the name must be 1 to 32 of A-Z a-z 0-9 _ -".into(),
        ));
    }
    if config.version.trim().is_empty() {
        return Err(invalid("the version must not be empty".into()));
    }
    if config.call_timeout.is_zero() || config.connect_timeout.is_zero() {
        return Err(invalid("timeouts must be positive".into()));
    }
    if let Some(problem) = config.retry.problem() {
        return Err(invalid(problem));
    }
    match &config.transport {
        McpTransport::Stdio(stdio) if stdio.command.trim().is_empty() => {
            Err(invalid("the command must not be empty".into()))
        }
        McpTransport::Http(http)
            if !(http.url.starts_with("http://") || http.url.starts_with("https://")) =>
        {
            Err(invalid(format!(
                "the url {:?} is not an http or https url",
                http.url
            )))
        }
        McpTransport::Http(http) => http.headers.iter().try_for_each(|(name, value)| {
            let valid_name = http::HeaderName::from_bytes(name.as_bytes()).is_ok();
            let valid_value = http::HeaderValue::from_str(value.expose()).is_ok();
            if valid_name && valid_value {
                Ok(())
            } else {
                Err(invalid(format!(
                    "the header {name:?} is not a valid header"
                )))
            }
        }),
        McpTransport::Stdio(_) => Ok(()),
    }
}

/// The connection to one MCP server, shared by every tool made from it
/// (cheap to clone). Its session starts when the tools are first listed,
/// or at the first call, and starts again at the next call after it died.
#[derive(Clone)]
pub struct McpServer {
    shared: Arc<session::Shared>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.shared.config.name)
            .field("identity", &self.shared.identity)
            .finish_non_exhaustive()
    }
}

impl McpServer {
    /// Validates a configuration; starts nothing.
    pub fn new(config: McpServerConfig) -> Result<McpServer, McpError> {
        validate(&config)?;
        let identity = identity(&config)?;
        Ok(McpServer {
            shared: Arc::new(session::Shared::new(config, identity)),
        })
    }

    /// Validates a configuration and starts a session.
    pub async fn connect(config: McpServerConfig) -> Result<McpServer, McpError> {
        let server = McpServer::new(config)?;
        server.shared.session().await?;
        Ok(server)
    }

    /// The server's tools, as configured (allow-listed, renamed,
    /// overridden), each a [`Tool`](crate::Tool) whose calls go through
    /// this connection. Starts a session if none is running.
    pub async fn tools(&self) -> Result<Vec<crate::Tool>, McpError> {
        let listed = self.shared.list().await?;
        tools::build(&self.shared, listed)
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.shared.config.name
    }

    /// The digest of the settings that enter its tools' identity.
    pub fn identity(&self) -> Digest {
        self.shared.identity
    }

    /// How many sessions have been started (1 after the first, one more
    /// for each restart).
    pub fn sessions_started(&self) -> u64 {
        self.shared.started()
    }

    /// Ends the running session (a child process is killed); the next call
    /// starts another.
    pub async fn close(&self) {
        self.shared.close().await;
    }
}
