//! `GET /v1/trees/{id}/events`: a tree's event stream as server-sent
//! events, from [`baton::run::Engine::watch`]. Each committed fact carries
//! its log sequence as the event id, so a client that reconnects with
//! `Last-Event-ID` resumes after the last fact it saw and misses none;
//! live events (model token deltas) carry no id. The stream ends after the
//! last fact of a finished tree, or when the host shuts down.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use baton::run::{Watch, WatchEvent};
use futures_util::stream::{self, Stream};
use serde::Deserialize;
use utoipa::IntoParams;

use super::Caller;
use super::problem::{self, Problem};
use super::trees::{path, query, tree_id};
use crate::host::Host;

/// `?from=SEQ`: the first log sequence to send (default 1); a
/// `Last-Event-ID` header, when present, wins (the stream resumes after it).
#[derive(Clone, Copy, Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// The first log sequence to send.
    pub from: Option<u64>,
}

/// The SSE event name of a watch event: its kind (`step_adopted`, `delta`, …).
fn name_of(event: &WatchEvent) -> String {
    serde_json::to_value(&event.kind)
        .ok()
        .and_then(|value| {
            value
                .get("kind")
                .and_then(|kind| kind.as_str().map(str::to_owned))
        })
        .unwrap_or_else(|| "event".to_owned())
}

fn sse(event: &WatchEvent) -> Event {
    let mut sse = Event::default()
        .event(name_of(event))
        .data(serde_json::to_string(event).expect("a watch event encodes"));
    if let Some(seq) = event.seq {
        sse = sse.id(seq.to_string());
    }
    sse
}

/// What the stream does next: read the watch until it ends or the host
/// drains; a read error is sent as an `error` event and ends the stream.
fn events(
    host: Arc<Host>,
    watch: Watch,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    stream::unfold(Some((host, watch)), |state| async move {
        let (host, mut watch) = state?;
        let next = tokio::select! {
            next = watch.next() => next,
            () = host.drained() => None,
        };
        match next {
            Some(Ok(event)) => Some((Ok(sse(&event)), Some((host, watch)))),
            Some(Err(error)) => {
                let data = serde_json::json!({ "code": error.code(), "detail": error.to_string() });
                Some((
                    Ok(Event::default().event("error").data(data.to_string())),
                    None,
                ))
            }
            None => None,
        }
    })
}

/// A tree's events as server-sent events (`text/event-stream`): each event
/// is named after its kind and its data is the event's JSON
/// (`WatchEvent`); committed facts have their log sequence as the event id.
#[utoipa::path(get, path = "/v1/trees/{id}/events", tag = "trees",
    params(("id" = String, Path, description = "The tree id."), EventsQuery,
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this log sequence.")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The event stream.", content_type = "text/event-stream", body = String),
        (status = 400, description = "Malformed id, query or Last-Event-ID.", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No or unknown token.", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such tree in the token's scope.", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Shutting down or the store is unavailable.", body = Problem, content_type = "application/problem+json"),
    ))]
pub(crate) async fn events_route(
    State(host): State<Arc<Host>>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
    from: Result<Query<EventsQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let tree = tree_id(&path(id)?)?;
    let from = query(from)?.from.unwrap_or(1);
    let from = match headers.get("last-event-id") {
        None => from,
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .map(|seen| seen.saturating_add(1))
            .ok_or_else(|| Problem::malformed("Last-Event-ID is not a log sequence"))?,
    };
    let watch = {
        let engine = host.engine().await.map_err(|_| Problem::shutting_down())?;
        engine
            .watch(&caller.scope, tree, from)
            .await
            .map_err(|error| problem::tree(tree, &error))?
    };
    Ok(Sse::new(events(host, watch))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}
