//! The OpenAPI document, generated from the routes' types and annotations
//! and served at `GET /openapi.json` (no UI bundle).

use axum::Json;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::Until;
use super::problem::Problem;
use super::trees::{
    AnsweredBody, CancelBody, ControlledBody, FailureBody, LogRecord, ResolveBody, SettledBody,
    StartBody, StartedBody, StatusParam, TreeList, TreeLog, TreeSummary,
};

/// The API's OpenAPI document.
#[derive(OpenApi)]
#[openapi(
    info(title = "Baton", description = "Start, inspect and move on the trees of a Baton host."),
    paths(
        super::healthz,
        super::readyz,
        document,
        super::trees::start,
        super::trees::list,
        super::trees::inspect,
        super::trees::log,
        super::events::events_route,
        super::trees::answer,
        super::trees::cancel,
        super::trees::resolve,
    ),
    components(schemas(
        Problem, Until, StartBody, StartedBody, SettledBody, StatusParam, TreeSummary, TreeList,
        LogRecord, TreeLog, AnsweredBody, CancelBody, ControlledBody, ResolveBody, FailureBody,
        super::events::EventsView,
    )),
    modifiers(&Bearer),
)]
pub struct ApiDoc;

/// Declares the bearer-token scheme the routes name.
struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "meta", responses((status = 200, description = "The OpenAPI document.", body = Object)))]
pub(crate) async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
