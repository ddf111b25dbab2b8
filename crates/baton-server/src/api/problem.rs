//! Errors as problem documents (RFC 9457, `application/problem+json`)
//! carrying Baton's stable failure code, and the HTTP status of each
//! engine error.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use baton::run::{ControlError, RuntimeError, SignalError, StartError, TreeError, TreeId};
use serde::Serialize;
use utoipa::ToSchema;

/// The media type of problem documents.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// A problem document: what went wrong, with the stable code to act on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct Problem {
    /// A URI naming the problem type: `urn:baton:problem:<code>`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the status.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What happened to this request, for people.
    pub detail: String,
    /// Baton's stable failure code (such as `engine.tree.not_found`).
    pub code: String,
}

impl Problem {
    /// A problem with `status`, `code` and `detail`.
    pub fn new(status: StatusCode, code: &str, detail: impl Into<String>) -> Problem {
        Problem {
            kind: format!("urn:baton:problem:{code}"),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
            code: code.to_owned(),
        }
    }

    /// The request is malformed (400).
    pub fn malformed(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, "serve.request.malformed", detail)
    }

    /// The host is shutting down (503).
    pub fn shutting_down() -> Problem {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "serve.shutting_down",
            "the host is shutting down and takes no new work",
        )
    }

    /// No tree with that id in the caller's scope (404): a tree of another
    /// scope reads exactly as a missing one.
    pub fn no_tree(tree: &str) -> Problem {
        Problem::new(
            StatusCode::NOT_FOUND,
            "engine.tree.not_found",
            format!("no tree {tree}"),
        )
    }

    /// The same problem under another code.
    pub fn with_code(mut self, code: &str) -> Problem {
        self.kind = format!("urn:baton:problem:{code}");
        self.code = code.to_owned();
        self
    }

    fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// The problem of a tree error, for the tree `tree`.
pub fn tree(tree: TreeId, error: &TreeError) -> Problem {
    let code = error.code();
    match error {
        TreeError::NotFound { .. } | TreeError::Scope { .. } => Problem::no_tree(&tree.to_string()),
        TreeError::LeaseHeld { .. } | TreeError::ProgramUnavailable { .. } => {
            Problem::new(StatusCode::CONFLICT, code, error.to_string())
        }
        TreeError::Stopped(stopped) => runtime(stopped),
        // The command is queued in the tree's inbox; the holder applies it.
        TreeError::ForwardTimeout { .. } => {
            Problem::new(StatusCode::GATEWAY_TIMEOUT, code, error.to_string())
        }
        TreeError::ForwardFailed { .. } => {
            Problem::new(StatusCode::BAD_GATEWAY, code, error.to_string())
        }
        TreeError::Store(_) => {
            Problem::new(StatusCode::SERVICE_UNAVAILABLE, code, error.to_string())
        }
        _ => Problem::new(StatusCode::INTERNAL_SERVER_ERROR, code, error.to_string()),
    }
}

/// The problem of a writer that stopped.
pub fn runtime(error: &RuntimeError) -> Problem {
    let status = match error {
        RuntimeError::Fenced { .. } | RuntimeError::Conflict { .. } => StatusCode::CONFLICT,
        RuntimeError::Storage { .. } | RuntimeError::Closed { .. } => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    Problem::new(status, error.code(), error.to_string())
}

/// The problem of a refused start.
pub fn start(error: &StartError) -> Problem {
    let code = error.code();
    let status = match error {
        StartError::Input(_) | StartError::Program(_) => StatusCode::UNPROCESSABLE_ENTITY,
        StartError::Conflict { .. } | StartError::LeaseHeld { .. } | StartError::Fenced { .. } => {
            StatusCode::CONFLICT
        }
        StartError::Unregistered { .. } | StartError::UnknownProgram { .. } => {
            StatusCode::NOT_FOUND
        }
        StartError::Tree(tree_error) => {
            // A start names its tree by start id; the tree id is in the message.
            return Problem::new(tree_status(tree_error), code, error.to_string());
        }
        StartError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    Problem::new(status, code, error.to_string())
}

fn tree_status(error: &TreeError) -> StatusCode {
    match error {
        TreeError::NotFound { .. } | TreeError::Scope { .. } => StatusCode::NOT_FOUND,
        TreeError::LeaseHeld { .. } | TreeError::ProgramUnavailable { .. } => StatusCode::CONFLICT,
        TreeError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        TreeError::Stopped(stopped) => runtime(stopped).status(),
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The problem of a refused answer.
pub fn signal(tree_id: TreeId, error: &SignalError) -> Problem {
    let code = error.code();
    let status = match error {
        SignalError::Rejected(_) => StatusCode::UNPROCESSABLE_ENTITY,
        SignalError::UnknownWait { .. } => StatusCode::NOT_FOUND,
        SignalError::Terminated { .. }
        | SignalError::WaitClosed { .. }
        | SignalError::Conflict { .. }
        | SignalError::BudgetExhausted { .. }
        | SignalError::MailboxFull { .. } => StatusCode::CONFLICT,
        SignalError::Stopped(stopped) => return runtime(stopped),
        SignalError::Tree(error) => return tree(tree_id, error),
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    Problem::new(status, code, error.to_string())
}

/// The problem of a refused control (cancel, resolve) or wait.
pub fn control(tree_id: TreeId, error: &ControlError) -> Problem {
    let code = error.code();
    let status = match error {
        ControlError::Terminated { .. } => StatusCode::CONFLICT,
        ControlError::NotUnknown { .. } => StatusCode::NOT_FOUND,
        ControlError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
        ControlError::Tree(error) => return tree(tree_id, error),
        ControlError::Stopped(stopped) => return runtime(stopped),
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    Problem::new(status, code, error.to_string())
}
