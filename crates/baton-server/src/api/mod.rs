//! The HTTP API: routes, the bearer-token extractor, request bodies and
//! the `?until=` option.
//!
//! Every route but `/healthz`, `/readyz` and `/openapi.json` needs a token,
//! and a token sees only its scope: a tree of another scope is answered
//! exactly as a missing tree (404). To add a route, write its handler in a
//! module of its own (as `trees.rs`), give it a `#[utoipa::path]`, add it
//! to `router` and to the `paths(...)` of [`openapi::ApiDoc`]; the test
//! `the_openapi_document_lists_every_route` holds the two together.

pub mod events;
pub mod openapi;
pub mod problem;
pub mod trees;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use baton::run::{Condition, Scope};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use crate::host::Host;
use problem::Problem;

/// The router over a host, with the body limit.
pub(crate) fn router(host: Arc<Host>, body_limit: usize) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/openapi.json", get(openapi::document))
        .route("/v1/trees", post(trees::start).get(trees::list))
        .route("/v1/trees/{id}", get(trees::inspect))
        .route("/v1/trees/{id}/log", get(trees::log))
        .route("/v1/trees/{id}/events", get(events::events_route))
        .route("/v1/trees/{id}/waits/{wait_id}", post(trees::answer))
        .route("/v1/trees/{id}/cancel", post(trees::cancel))
        .route(
            "/v1/trees/{id}/effects/{effect_id}/resolve",
            post(trees::resolve),
        )
        .merge(crate::console::routes())
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(host)
}

async fn not_found() -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        "serve.route.not_found",
        "no such route",
    )
}

/// Liveness: the process serves HTTP.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, description = "The process is alive.")))]
pub(crate) async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness: the initial recovery finished and no shutdown began.
#[utoipa::path(get, path = "/readyz", tag = "health", responses(
    (status = 200, description = "Ready for work."),
    (status = 503, description = "Recovering or shutting down.", body = Problem, content_type = "application/problem+json"),
))]
pub(crate) async fn readyz(State(host): State<Arc<Host>>) -> Response {
    if host.is_ready() {
        "ready\n".into_response()
    } else if host.is_draining() {
        Problem::shutting_down().into_response()
    } else {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "serve.recovering",
            "the initial recovery has not finished",
        )
        .into_response()
    }
}

/// The caller, as its bearer token says: the one scope it sees.
#[derive(Clone, Debug)]
pub struct Caller {
    /// The token's scope.
    pub scope: Scope,
}

impl FromRequestParts<Arc<Host>> for Caller {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, host: &Arc<Host>) -> Result<Caller, Problem> {
        let Some(value) = parts.headers.get(header::AUTHORIZATION) else {
            return cookie_caller(parts, host);
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim);
        match token.and_then(|token| host.tokens.scope_of(token)) {
            Some(scope) => Ok(Caller {
                scope: scope.clone(),
            }),
            None => Err(Problem::new(
                StatusCode::UNAUTHORIZED,
                "serve.auth.invalid",
                "the bearer token is not one this host knows",
            )),
        }
    }
}

/// The caller of a request without `Authorization`: the console's cookie
/// (`EventSource` cannot send headers). A request that changes anything
/// (not `GET` or `HEAD`) with the cookie must also carry the page's CSRF
/// token in the `x-baton-csrf` header, so another site cannot make a
/// signed-in browser post to the API.
fn cookie_caller(parts: &Parts, host: &Host) -> Result<Caller, Problem> {
    let Some(token) = crate::console::auth::cookie_token(&parts.headers) else {
        return Err(Problem::new(
            StatusCode::UNAUTHORIZED,
            "serve.auth.missing",
            "send `Authorization: Bearer TOKEN` (or sign in to the console)",
        ));
    };
    let Some(scope) = host.tokens.scope_of(&token) else {
        return Err(Problem::new(
            StatusCode::UNAUTHORIZED,
            "serve.auth.invalid",
            "the console cookie's token is not one this host knows",
        ));
    };
    let safe = parts.method == Method::GET || parts.method == Method::HEAD;
    if !safe {
        let presented = parts
            .headers
            .get(crate::console::auth::CSRF_HEADER)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default();
        if !host.csrf.check(&token, presented) {
            return Err(Problem::new(
                StatusCode::FORBIDDEN,
                "serve.auth.csrf",
                "a request with the console cookie that changes anything needs the page's CSRF token in `x-baton-csrf`",
            ));
        }
    }
    Ok(Caller {
        scope: scope.clone(),
    })
}

/// A request body, read whole within the body limit.
pub(crate) fn body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, Problem> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "serve.request.too_large",
                "the request body is larger than this host accepts",
            )
        } else {
            Problem::malformed(format!("the request body could not be read: {rejection}"))
        }
    })
}

/// A JSON request body of type `T`.
pub(crate) fn json<T: serde::de::DeserializeOwned>(
    bytes: Result<Bytes, BytesRejection>,
) -> Result<T, Problem> {
    let bytes = body(bytes)?;
    if bytes.trim_ascii().is_empty() {
        return Err(Problem::malformed(
            "the request body is empty: this route takes a JSON object (GET /openapi.json describes it)",
        ));
    }
    serde_json::from_slice(&bytes)
        .map_err(|error| Problem::malformed(format!("the request body is not valid: {error}")))
}

/// A condition a request may wait for before it answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Until {
    /// A wait for an answer is open (or the tree is quiescent).
    WaitOpened,
    /// No live process is running: each waits or is parked, or the tree ended.
    Quiescent,
    /// The root terminated.
    Terminal,
}

impl Until {
    pub(crate) fn condition(self) -> Condition {
        match self {
            Until::WaitOpened => Condition::WaitOpened,
            Until::Quiescent => Condition::Quiescent,
            Until::Terminal => Condition::Terminal,
        }
    }
}

/// `?until=…&timeout_ms=…`: answer once the tree meets a condition (or the
/// timeout passes, capped by the host's longest wait), so clients need not poll.
#[derive(Clone, Copy, Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UntilQuery {
    /// The condition to wait for.
    #[param(inline)]
    pub until: Option<Until>,
    /// The longest wait in milliseconds (the host caps it; default the cap).
    pub timeout_ms: Option<u64>,
}

impl UntilQuery {
    pub(crate) fn timeout(&self, host: &Host) -> Duration {
        self.timeout_ms.map_or(host.max_wait, |ms| {
            Duration::from_millis(ms).min(host.max_wait)
        })
    }
}
