//! `GET /v1/trees/{id}/events`: a tree's event stream as server-sent
//! events, from [`baton::run::Engine::watch`]. Each committed fact carries
//! its log sequence as the event id, so a client that reconnects with
//! `Last-Event-ID` resumes after the last fact it saw and misses none;
//! live events (model token deltas) carry no id. The stream ends after the
//! last fact of a finished tree, or when the host shuts down.
//!
//! `?view=agents` sends the agent stream view instead
//! ([`baton::agent::AgentStream`]): `agent_start`, `token`, tool calls,
//! handoffs, `agent_end` and one terminal `complete` or `error`, each event
//! named after its type. The view is folded from the tree's first fact;
//! an event carries, as its id, the sequence of the fact that made it, so
//! a reconnect with `Last-Event-ID` resumes after it too.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use baton::agent::AgentStream;
use baton::run::{Watch, WatchEvent};
use futures_util::stream::{self, Stream};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::Caller;
use super::problem::{self, Problem};
use super::trees::{path, query, tree_id};
use crate::host::Host;

/// `?from=SEQ`: the first log sequence to send (default 1); a
/// `Last-Event-ID` header, when present, wins (the stream resumes after it).
/// `?view=agents`: the agent stream view instead of the tree's events.
#[derive(Clone, Copy, Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// The first log sequence to send.
    pub from: Option<u64>,
    /// What to send: `events` (the default) or `agents`.
    pub view: Option<EventsView>,
}

/// What an event stream sends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventsView {
    /// The tree's events (`WatchEvent`s).
    #[default]
    Events,
    /// The agent stream view (`AgentEvent`s).
    Agents,
}

/// The agent stream view of a watch: the fold, the facts already sent
/// before a reconnect (their agent events are not sent again), and agent
/// events waiting to go out.
struct Agents {
    view: AgentStream,
    seen: u64,
    queue: VecDeque<Event>,
}

impl Agents {
    /// Folds one watch event; queues the agent events it makes, except
    /// those of facts the client saw before it reconnected.
    fn take(&mut self, event: &WatchEvent) {
        let resent = event.seq.is_some_and(|seq| seq <= self.seen);
        for agent_event in self.view.push(event) {
            if resent {
                continue;
            }
            let value = serde_json::to_value(&agent_event).unwrap_or_default();
            let name = value["type"].as_str().unwrap_or("event").to_owned();
            let mut sse = Event::default().event(name).data(value.to_string());
            if let Some(seq) = event.seq {
                sse = sse.id(seq.to_string());
            }
            self.queue.push_back(sse);
        }
    }
}

/// One client's stream: the host (to stop when it drains), the tree's
/// watch and, for `?view=agents`, the view folded from it.
struct Streaming {
    host: Arc<Host>,
    watch: Watch,
    agents: Option<Agents>,
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
fn events(streaming: Streaming) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    stream::unfold(Some(streaming), |state| async move {
        let mut streaming = state?;
        loop {
            if let Some(queued) = streaming
                .agents
                .as_mut()
                .and_then(|agents| agents.queue.pop_front())
            {
                return Some((Ok(queued), Some(streaming)));
            }
            let next = tokio::select! {
                next = streaming.watch.next() => next,
                () = streaming.host.drained() => None,
            };
            match next {
                Some(Ok(event)) => match streaming.agents.as_mut() {
                    None => return Some((Ok(sse(&event)), Some(streaming))),
                    Some(agents) => agents.take(&event),
                },
                Some(Err(error)) => {
                    let data =
                        serde_json::json!({ "code": error.code(), "detail": error.to_string() });
                    return Some((
                        Ok(Event::default().event("error").data(data.to_string())),
                        None,
                    ));
                }
                None => return None,
            }
        }
    })
}

/// A tree's events as server-sent events (`text/event-stream`): each event
/// is named after its kind and its data is the event's JSON
/// (`WatchEvent`); committed facts have their log sequence as the event id.
/// With `?view=agents`, the agent stream view: events named after their
/// `type` (`agent_start`, `token`, …, one `complete` or `error`), each with
/// the sequence of the fact that made it as its id.
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
    let asked = query(from)?;
    let from = asked.from.unwrap_or(1);
    let from = match headers.get("last-event-id") {
        None => from,
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .map(|seen| seen.saturating_add(1))
            .ok_or_else(|| Problem::malformed("Last-Event-ID is not a log sequence"))?,
    };
    // The agent view is a fold of the whole stream: it reads from the first
    // fact and sends what comes after `from`.
    let agents = (asked.view == Some(EventsView::Agents)).then(|| Agents {
        view: AgentStream::new(),
        seen: from.saturating_sub(1),
        queue: VecDeque::new(),
    });
    let first = if agents.is_some() { 1 } else { from };
    let watch = {
        let engine = host.engine().await.map_err(|_| Problem::shutting_down())?;
        engine
            .watch(&caller.scope, tree, first)
            .await
            .map_err(|error| problem::tree(tree, &error))?
    };
    let streaming = Streaming {
        host,
        watch,
        agents,
    };
    Ok(Sse::new(events(streaming))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}
