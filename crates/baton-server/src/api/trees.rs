//! The tree routes: start, list, inspect, log, answer, cancel, resolve.
//!
//! Each route reads its caller's scope from the bearer token and passes it
//! to the engine, whose scope check is the one that decides: a tree of
//! another scope is `engine.scope.mismatch` there and a plain 404 here.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::str::FromStr;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use baton::run::store::{ListCursor, ListFilter, TreeStatus};
use baton::run::{
    EffectId, Failure, FailureKind, Labels, Name, Payload, ProcessHandle, Settlement,
    SignalReceipt, StartId, StartRequest, Started, TreeError, TreeId, TreeView, Visibility, WaitId,
};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::{IntoParams, ToSchema};

use super::problem::{self, Problem};
use super::{Caller, UntilQuery, json};
use crate::host::Host;

/// `POST /v1/trees`: what to start.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartBody {
    /// The program's name; its newest registered version starts.
    pub program: String,
    /// The start key: starting the same key again with the same program
    /// and input returns the same tree (200), with another program or
    /// input is a conflict (409).
    pub id: String,
    /// The input, validated against the program's input schema.
    pub input: serde_json::Value,
    /// Labels to carry with the tree (keys `[a-z0-9][a-z0-9._-]{0,62}`,
    /// values up to 256 bytes, at most 32); `GET /v1/trees?label=k=v`
    /// filters by them. A repeated start keeps the first start's labels.
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
}

/// What a start did.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct StartedBody {
    /// The tree's id (its root process).
    pub tree: String,
    /// Whether this request started it (201), rather than finding the same
    /// start done before (200).
    pub new: bool,
    /// The condition asked for with `?until=`, if any.
    #[serde(flatten)]
    pub settled: Option<SettledBody>,
}

/// The state after waiting for a condition (`?until=`).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct SettledBody {
    /// Whether the condition held before the timeout (or the host's
    /// shutdown) ended the wait.
    pub reached: bool,
    /// The tree as it is then (the inspect view).
    #[schema(value_type = Object)]
    pub view: TreeView,
}

/// `GET /v1/trees` filters; the scope is the token's.
#[derive(Clone, Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only trees with this status.
    #[param(inline)]
    pub status: Option<StatusParam>,
    /// Only trees carrying these labels: `k=v` pairs separated by commas
    /// (`label=team=billing,env=prod`); every pair must match.
    pub label: Option<String>,
    /// At most this many trees (1 to 1000; default 100); `next` in the
    /// answer names the next page.
    pub limit: Option<u32>,
    /// The page after this cursor (an earlier answer's `next`).
    pub after: Option<String>,
}

/// The largest page `GET /v1/trees` returns, and its default.
const MAX_PAGE: u32 = 1000;
const DEFAULT_PAGE: u32 = 100;

/// A tree's listing status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StatusParam {
    /// Some process is stepping or has work in flight.
    Running,
    /// Every live process waits for input.
    Waiting,
    /// Some process holds an unknown effect (parked).
    NeedsAttention,
    /// The root terminated.
    Done,
}

impl From<StatusParam> for TreeStatus {
    fn from(status: StatusParam) -> TreeStatus {
        match status {
            StatusParam::Running => TreeStatus::Running,
            StatusParam::Waiting => TreeStatus::Waiting,
            StatusParam::NeedsAttention => TreeStatus::NeedsAttention,
            StatusParam::Done => TreeStatus::Done,
        }
    }
}

/// One tree of a listing, as `baton ps --json` prints it.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct TreeSummary {
    /// The tree.
    pub tree: String,
    /// Its scope.
    pub scope: String,
    /// Its status after its last append.
    pub status: String,
    /// When its last append was made (milliseconds since the epoch).
    pub updated_ms: u64,
    /// When it started (milliseconds since the epoch), when recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_ms: Option<u64>,
    /// Its root program's name, when recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    /// The exact version (digest) of its root program, when recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// `GET /v1/trees`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct TreeList {
    /// The trees, by id.
    pub trees: Vec<TreeSummary>,
    /// The cursor of the next page (pass it as `after`), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// One stored record of a tree's log.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct LogRecord {
    /// Its position in the log, from 1.
    pub seq: u64,
    /// The body's kind.
    pub kind: String,
    /// Its hash.
    pub hash: String,
    /// The previous record's hash.
    pub prev: String,
    /// The body's size in bytes, as hashed.
    pub bytes: usize,
    /// The body, as stored.
    #[schema(value_type = Object)]
    pub body: Box<RawValue>,
}

/// `GET /v1/trees/{id}/log`: the records the store keeps (from the first,
/// or from the latest snapshot when the store compacts).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct TreeLog {
    /// The tree.
    pub tree: String,
    /// The kept records, in order.
    pub records: Vec<LogRecord>,
}

/// What an answer did.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct AnsweredBody {
    /// The tree.
    pub tree: String,
    /// The wait answered.
    pub wait: String,
    /// `admitted`, or `duplicate` for the same answer sent again.
    pub receipt: String,
    /// The condition asked for with `?until=`, if any.
    #[serde(flatten)]
    pub settled: Option<SettledBody>,
}

/// `POST /v1/trees/{id}/cancel`.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Why, for the log.
    pub reason: String,
}

/// What a cancellation or a resolution did.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ControlledBody {
    /// The tree.
    pub tree: String,
    /// The condition asked for with `?until=`, if any.
    #[serde(flatten)]
    pub settled: Option<SettledBody>,
}

/// `POST /v1/trees/{id}/effects/{effect_id}/resolve`: the outcome of an
/// unknown effect, as the host learned it: exactly one of `output` or
/// `failure`.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ResolveBody {
    /// The effect succeeded with this output.
    Output(serde_json::Value),
    /// The effect failed.
    Failure(FailureBody),
}

/// A failure a host reports for an effect.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailureBody {
    /// A stable lowercase dotted code.
    pub code: String,
    /// Text for people.
    pub message: String,
}

pub(crate) fn tree_id(text: &str) -> Result<TreeId, Problem> {
    TreeId::from_str(text).map_err(|error| Problem::malformed(format!("not a tree id: {error}")))
}

pub(crate) fn path<T>(path: Result<Path<T>, PathRejection>) -> Result<T, Problem> {
    path.map(|Path(value)| value)
        .map_err(|rejection| Problem::malformed(rejection.body_text()))
}

pub(crate) fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, Problem> {
    query
        .map(|Query(value)| value)
        .map_err(|rejection| Problem::malformed(rejection.body_text()))
}

/// Waits for `until` on `handle`'s tree within the request's timeout (a
/// shutdown ends the wait early), and returns the tree as it then is.
async fn settle(
    host: &Host,
    handle: &ProcessHandle,
    until: UntilQuery,
) -> Result<Option<SettledBody>, Problem> {
    let Some(condition) = until.until else {
        return Ok(None);
    };
    let tree = handle.tree();
    let waited = tokio::select! {
        waited = tokio::time::timeout(until.timeout(host), handle.until(condition.condition())) => waited.ok(),
        () = host.drained() => None,
    };
    let (view, reached) = match waited {
        Some(Ok(view)) => (view, true),
        Some(Err(error)) => return Err(problem::control(tree, &error)),
        None => (
            handle
                .inspect()
                .await
                .map_err(|error| problem::control(tree, &error))?,
            false,
        ),
    };
    Ok(Some(SettledBody { reached, view }))
}

/// A handle on a tree of the caller's scope, taken up if no engine holds
/// it, and kept by this host.
pub(crate) async fn handle(
    host: &Arc<Host>,
    caller: &Caller,
    tree: TreeId,
) -> Result<ProcessHandle, Problem> {
    let engine = host.engine().await.map_err(|_| Problem::shutting_down())?;
    let handle = engine
        .process::<Payload>(&caller.scope, tree)
        .await
        .map_err(|error| problem::tree(tree, &error))?;
    drop(engine);
    host.track(handle.clone(), None);
    Ok(handle)
}

/// A handle on a tree of the caller's scope, as [`handle`] takes it; `None`
/// when another live engine holds the tree (the engine then forwards the
/// command through the tree's inbox, and the tree is followed there).
async fn handle_unless_held(
    host: &Arc<Host>,
    caller: &Caller,
    tree: TreeId,
) -> Result<Option<ProcessHandle>, Problem> {
    let engine = host.engine().await.map_err(|_| Problem::shutting_down())?;
    let handle = match engine.process::<Payload>(&caller.scope, tree).await {
        Ok(handle) => handle,
        Err(TreeError::LeaseHeld { .. }) => return Ok(None),
        Err(error) => return Err(problem::tree(tree, &error)),
    };
    drop(engine);
    host.track(handle.clone(), None);
    Ok(Some(handle))
}

/// What a command settled to: by the local handle, or (for a tree another
/// engine holds) the tree as the store shows it, the condition not awaited.
async fn settle_or_show(
    host: &Arc<Host>,
    caller: &Caller,
    tree: TreeId,
    handle: Option<(ProcessHandle, tokio::sync::OwnedSemaphorePermit)>,
    until: UntilQuery,
) -> Result<Option<SettledBody>, Problem> {
    if let Some((handle, permit)) = handle {
        host.track(handle.clone(), Some(permit));
        return settle(host, &handle, until).await;
    }
    if until.until.is_none() {
        return Ok(None);
    }
    let engine = host.engine().await.map_err(|_| Problem::shutting_down())?;
    let view = engine
        .inspect(&caller.scope, tree, Visibility::Public)
        .await
        .map_err(|error| problem::tree(tree, &error))?;
    Ok(Some(SettledBody {
        reached: false,
        view,
    }))
}

/// A permit to move one tree, within the request's timeout.
pub(crate) async fn permit(
    host: &Host,
    until: UntilQuery,
) -> Result<tokio::sync::OwnedSemaphorePermit, Problem> {
    match host.permit(until.timeout(host)).await {
        Some(permit) => Ok(permit),
        None if host.is_draining() => Err(Problem::shutting_down()),
        None => Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "serve.capacity.exhausted",
            "the host drives as many trees as it may; try again later",
        )),
    }
}

/// Starts a program, or finds the same start done before.
#[utoipa::path(post, path = "/v1/trees", tag = "trees", request_body = StartBody, params(UntilQuery),
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Started.", body = StartedBody),
        (status = 200, description = "The same start was done before.", body = StartedBody),
        (status = 400, description = "Malformed request.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No or unknown token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No program of that name.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The start key names a tree with another program or input, or another engine holds it.", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The input fails the program's input schema.", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Shutting down, at capacity, or the store is unavailable.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(crate) async fn start(
    State(host): State<Arc<Host>>,
    caller: Caller,
    until: Result<Query<UntilQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let until = query(until)?;
    let body: StartBody = json(body)?;
    let labels = Labels::try_from(body.labels.clone().unwrap_or_default()).map_err(|error| {
        Problem::malformed(format!("invalid labels: {error}")).with_code(error.code())
    })?;
    let name = Name::new(&body.program)
        .map_err(|error| Problem::malformed(format!("not a program name: {error}")))?;
    let id = StartId::new(caller.scope.as_str(), &body.id)
        .map_err(|error| Problem::malformed(format!("not a start id: {error}")))?;
    let input = Payload::from_value(&body.input)
        .map_err(|error| Problem::malformed(format!("the input is not a payload: {error}")))?;
    let permit = permit(&host, until).await?;
    let engine = host.engine().await.map_err(|_| Problem::shutting_down())?;
    let started = engine
        .start_named(
            &name,
            StartRequest {
                labels,
                ..StartRequest::new(id, input)
            },
        )
        .await
        .map_err(|error| problem::start(&error))?;
    drop(engine);
    let (new, handle) = match started {
        Started::New(handle) => (true, handle),
        Started::Existing(handle) => (false, handle),
    };
    host.track(handle.clone(), Some(permit));
    let settled = settle(&host, &handle, until).await?;
    let status = if new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let body = StartedBody {
        tree: handle.tree().to_string(),
        new,
        settled,
    };
    Ok((status, Json(body)).into_response())
}

/// Lists the trees of the token's scope.
#[utoipa::path(get, path = "/v1/trees", tag = "trees", params(ListQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The trees.", body = TreeList),
        (status = 400, description = "Malformed filter.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No or unknown token.", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Shutting down or the store is unavailable.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(crate) async fn list(
    State(host): State<Arc<Host>>,
    caller: Caller,
    filter: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<TreeList>, Problem> {
    let filter = query(filter)?;
    let labels = match &filter.label {
        None => Labels::new(),
        Some(text) => Labels::parse_pairs(text.split(',').filter(|pair| !pair.is_empty()))
            .map_err(|error| {
                Problem::malformed(format!("invalid label filter: {error}")).with_code(error.code())
            })?,
    };
    let limit = filter.limit.unwrap_or(DEFAULT_PAGE);
    let limit = NonZeroU32::new(limit)
        .filter(|limit| limit.get() <= MAX_PAGE)
        .ok_or_else(|| Problem::malformed(format!("limit must be 1 to {MAX_PAGE}")))?;
    let after = filter
        .after
        .as_deref()
        .map(ListCursor::from_str)
        .transpose()
        .map_err(|error| {
            Problem::malformed(format!("invalid after cursor: {error}")).with_code(error.code())
        })?;
    if host.is_draining() {
        return Err(Problem::shutting_down());
    }
    let listing = host
        .store
        .list(ListFilter {
            status: filter.status.map(TreeStatus::from),
            scope: Some(caller.scope.clone()),
            labels,
            limit: Some(limit),
            after,
        })
        .await
        .map_err(|error| {
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "engine.store.failed",
                error.to_string(),
            )
        })?;
    let trees = listing
        .trees
        .into_iter()
        // The store filters by scope; this keeps the promise if one did not.
        .filter(|meta| meta.scope == caller.scope)
        .map(|meta| TreeSummary {
            tree: meta.tree.to_string(),
            scope: meta.scope.to_string(),
            status: meta.status.as_str().to_owned(),
            updated_ms: meta.updated.millis(),
            created_ms: meta.created.map(|created| created.millis()),
            program: meta.program.as_ref().map(|p| p.name.to_string()),
            version: meta.program.as_ref().map(|p| p.digest.to_string()),
            labels: meta
                .labels
                .iter()
                .map(|(key, value)| (key.as_str().to_owned(), value.to_owned()))
                .collect(),
        })
        .collect();
    Ok(Json(TreeList {
        trees,
        next: listing.next.map(|cursor| cursor.to_string()),
    }))
}

/// The inspect view of a tree (`baton inspect --json`); with `?until=`,
/// once the tree meets the condition (header `baton-until: reached` or
/// `timeout`).
#[utoipa::path(get, path = "/v1/trees/{id}", tag = "trees",
    params(("id" = String, Path, description = "The tree id."), UntilQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The tree.", body = Object),
        (status = 400, description = "Malformed id or query.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No or unknown token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such tree in the token's scope.", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Shutting down or the store is unavailable.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(crate) async fn inspect(
    State(host): State<Arc<Host>>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
    until: Result<Query<UntilQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let tree = tree_id(&path(id)?)?;
    let until = query(until)?;
    if until.until.is_none() {
        let engine = host.engine().await.map_err(|_| Problem::shutting_down())?;
        let view = engine
            .inspect(&caller.scope, tree, Visibility::Public)
            .await
            .map_err(|error| problem::tree(tree, &error))?;
        return Ok(Json(view).into_response());
    }
    let handle = handle(&host, &caller, tree).await?;
    let settled = settle(&host, &handle, until)
        .await?
        .expect("a condition was asked for");
    let mut response = Json(settled.view).into_response();
    let state = if settled.reached {
        "reached"
    } else {
        "timeout"
    };
    response
        .headers_mut()
        .insert("baton-until", HeaderValue::from_static(state));
    Ok(response)
}

/// The stored records of a tree.
#[utoipa::path(get, path = "/v1/trees/{id}/log", tag = "trees",
    params(("id" = String, Path, description = "The tree id.")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The kept records.", body = TreeLog),
        (status = 400, description = "Malformed id.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No or unknown token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such tree in the token's scope.", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Shutting down or the store is unavailable.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(crate) async fn log(
    State(host): State<Arc<Host>>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<TreeLog>, Problem> {
    let tree = tree_id(&path(id)?)?;
    {
        // The scope check (and existence) before reading any record.
        let engine = host.engine().await.map_err(|_| Problem::shutting_down())?;
        engine
            .inspect(&caller.scope, tree, Visibility::Public)
            .await
            .map_err(|error| problem::tree(tree, &error))?;
    }
    let history = host.store.history(tree).await.map_err(|error| {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "engine.store.failed",
            error.to_string(),
        )
    })?;
    let mut records = Vec::with_capacity(history.records.len());
    for record in history.records {
        let text = String::from_utf8(record.body.to_vec()).ok();
        let body = text
            .and_then(|text| RawValue::from_string(text).ok())
            .ok_or_else(|| {
                Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "engine.log.corrupt",
                    format!("record {} of tree {tree} is not JSON", record.seq),
                )
            })?;
        records.push(LogRecord {
            seq: record.seq,
            kind: record.kind.as_str().to_owned(),
            hash: record.hash.to_string(),
            prev: record.prev.to_string(),
            bytes: record.body.len(),
            body,
        });
    }
    Ok(Json(TreeLog {
        tree: tree.to_string(),
        records,
    }))
}

/// Answers an open wait; the body is the answer, validated against the
/// wait's answer schema.
#[utoipa::path(post, path = "/v1/trees/{id}/waits/{wait_id}", tag = "trees",
    params(("id" = String, Path, description = "The tree id."), ("wait_id" = String, Path, description = "The wait id."), UntilQuery),
    request_body(content = Object, description = "The answer (any JSON value the wait's answer schema accepts)."),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Admitted (or the same answer again).", body = AnsweredBody),
        (status = 400, description = "Malformed ids or body.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No or unknown token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such tree in the token's scope, or no such wait.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Answered before with another answer, or the process ended.", body = Problem, content_type = "application/problem+json"),
        (status = 504, description = "Another engine holds the tree and did not apply the answer in time; it stays queued and that engine applies it (`engine.forward.timeout`; answering again is safe).", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The answer fails the wait's answer schema.", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Shutting down, at capacity, or the store is unavailable.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(crate) async fn answer(
    State(host): State<Arc<Host>>,
    caller: Caller,
    ids: Result<Path<(String, String)>, PathRejection>,
    until: Result<Query<UntilQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<AnsweredBody>, Problem> {
    let (tree, wait) = path(ids)?;
    let tree = tree_id(&tree)?;
    let wait = WaitId::from_str(&wait)
        .map_err(|error| Problem::malformed(format!("not a wait id: {error}")))?;
    let until = query(until)?;
    let bytes = super::body(body)?;
    if bytes.trim_ascii().is_empty() {
        return Err(Problem::malformed(
            r#"the answer is empty: the request body is the answer, as JSON (a string keeps its quotes: "ship it")"#,
        ));
    }
    let answer = Payload::parse(&bytes)
        .map_err(|error| Problem::malformed(format!("the answer is not JSON: {error}")))?;
    let permit = permit(&host, until).await?;
    let handle = handle_unless_held(&host, &caller, tree).await?;
    let receipt = {
        let engine = host.engine().await.map_err(|_| Problem::shutting_down())?;
        engine
            .answer(&caller.scope, tree, wait, answer)
            .await
            .map_err(|error| problem::signal(tree, &error))?
    };
    let held = handle.map(|handle| (handle, permit));
    let settled = settle_or_show(&host, &caller, tree, held, until).await?;
    Ok(Json(AnsweredBody {
        tree: tree.to_string(),
        wait: wait.to_string(),
        receipt: match receipt {
            SignalReceipt::Admitted => "admitted",
            SignalReceipt::Duplicate => "duplicate",
        }
        .to_owned(),
        settled,
    }))
}

/// Cancels a tree's root (its children are canceled with it).
#[utoipa::path(post, path = "/v1/trees/{id}/cancel", tag = "trees",
    params(("id" = String, Path, description = "The tree id."), UntilQuery),
    request_body = CancelBody,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The cancellation is recorded.", body = ControlledBody),
        (status = 400, description = "Malformed id or body.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No or unknown token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such tree in the token's scope.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The tree ended.", body = Problem, content_type = "application/problem+json"),
        (status = 504, description = "Another engine holds the tree and did not apply the command in time; it stays queued and that engine applies it (`engine.forward.timeout`).", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large.", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Shutting down, at capacity, or the store is unavailable.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(crate) async fn cancel(
    State(host): State<Arc<Host>>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
    until: Result<Query<UntilQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ControlledBody>, Problem> {
    let tree = tree_id(&path(id)?)?;
    let until = query(until)?;
    let body: CancelBody = json(body)?;
    let permit = permit(&host, until).await?;
    let handle = handle_unless_held(&host, &caller, tree).await?;
    {
        let engine = host.engine().await.map_err(|_| Problem::shutting_down())?;
        engine
            .cancel(&caller.scope, tree, tree, body.reason)
            .await
            .map_err(|error| problem::control(tree, &error))?;
    }
    let held = handle.map(|handle| (handle, permit));
    let settled = settle_or_show(&host, &caller, tree, held, until).await?;
    Ok(Json(ControlledBody {
        tree: tree.to_string(),
        settled,
    }))
}

/// Settles an unknown effect with what the host learned of it.
#[utoipa::path(post, path = "/v1/trees/{id}/effects/{effect_id}/resolve", tag = "trees",
    params(("id" = String, Path, description = "The tree id."), ("effect_id" = String, Path, description = "The unknown effect's id."), UntilQuery),
    request_body = ResolveBody,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The effect is settled.", body = ControlledBody),
        (status = 400, description = "Malformed ids or body.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No or unknown token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such tree in the token's scope, or the effect is not unknown.", body = Problem, content_type = "application/problem+json"),
        (status = 504, description = "Another engine holds the tree and did not apply the resolution in time; it stays queued and that engine applies it (`engine.forward.timeout`).", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body too large.", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Shutting down, at capacity, or the store is unavailable.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(crate) async fn resolve(
    State(host): State<Arc<Host>>,
    caller: Caller,
    ids: Result<Path<(String, String)>, PathRejection>,
    until: Result<Query<UntilQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ControlledBody>, Problem> {
    let (tree, effect) = path(ids)?;
    let tree = tree_id(&tree)?;
    let effect = EffectId::from_str(&effect)
        .map_err(|error| Problem::malformed(format!("not an effect id: {error}")))?;
    let until = query(until)?;
    let settlement = match json::<ResolveBody>(body)? {
        ResolveBody::Output(output) => {
            Settlement::ok(Payload::from_value(&output).map_err(|error| {
                Problem::malformed(format!("the output is not a payload: {error}"))
            })?)
        }
        ResolveBody::Failure(failure) => {
            let code = Name::new(&failure.code)
                .map_err(|error| Problem::malformed(format!("not a failure code: {error}")))?;
            Settlement::failed(Failure::new(
                FailureKind::External,
                code.as_str(),
                failure.message,
            ))
        }
    };
    let permit = permit(&host, until).await?;
    let handle = handle_unless_held(&host, &caller, tree).await?;
    {
        let engine = host.engine().await.map_err(|_| Problem::shutting_down())?;
        engine
            .resolve_unknown(&caller.scope, tree, effect, settlement)
            .await
            .map_err(|error| problem::control(tree, &error))?;
    }
    let held = handle.map(|handle| (handle, permit));
    let settled = settle_or_show(&host, &caller, tree, held, until).await?;
    Ok(Json(ControlledBody {
        tree: tree.to_string(),
        settled,
    }))
}
