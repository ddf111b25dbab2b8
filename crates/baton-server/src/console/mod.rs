//! The web console: server-rendered pages (maud) over the same host as the
//! HTTP API, at `/`.
//!
//! - `GET /login`, `POST /login`, `POST /logout`: sign in with an API token,
//!   kept in the `baton_token` cookie (`HttpOnly`, `SameSite=Strict`); the
//!   API and the event stream accept the cookie too (see [`auth`]).
//! - `GET /`: the scope's trees, needing attention and waiting first, with
//!   filters (status, program) and a search by id.
//! - `GET /trees/{id}`: a tree (`?verify=1` verifies its log); `GET
//!   /trees/{id}/live?after=SEQ` is the fragment the page's script swaps in
//!   when the tree's event stream reports a fact.
//! - `POST /trees/{id}/waits/{wait}`, `/trees/{id}/cancel`,
//!   `/trees/{id}/effects/{effect}/resolve`: the steer forms, each checked
//!   for the session's CSRF token and then by the engine exactly as the
//!   API's routes are; a refusal is shown in the page and writes nothing.
//! - `GET /assets/console.css`, `/assets/console.js`: embedded in the binary.

pub(crate) mod auth;
mod form;
mod pages;
mod tree;

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::{FormRejection, PathRejection, QueryRejection};
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use baton::run::store::{ListFilter, TreeStatus};
use baton::run::{
    Clock as _, ControlError, EffectId, Failure, FailureKind, Name, Payload, Settlement,
    SignalError, SystemClock, TreeError, TreeId, TreeView, Visibility, WaitId,
};
use maud::Markup;
use serde::Deserialize;

use crate::api::problem::Problem;
use crate::api::{Caller, UntilQuery};
use crate::host::Host;
use auth::Session;
use form::{AnswerForm, FieldErrors, Posted};
use pages::ListFilters;
use tree::{Banner, LogRow, Returned, TreePage};

/// The most log rows a tree page shows (the latest ones).
const LOG_ROWS: usize = 1000;

/// The most trees the list reads.
const LIST_LIMIT: u32 = 1000;

/// The console's routes, merged into the API's router.
pub(crate) fn routes() -> Router<Arc<Host>> {
    Router::new()
        .route("/", get(list))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/trees/{id}", get(tree_page))
        .route("/trees/{id}/live", get(live))
        .route("/trees/{id}/waits/{wait}", post(answer))
        .route("/trees/{id}/cancel", post(cancel))
        .route("/trees/{id}/effects/{effect}/resolve", post(resolve))
        .route("/assets/console.css", get(css))
        .route("/assets/console.js", get(js))
}

fn html(status: StatusCode, markup: Markup) -> Response {
    let mut response = (status, markup.into_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // Pages carry CSRF tokens and private payloads: never cached, never framed.
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", pages::CSS)
}

async fn js() -> Response {
    asset("text/javascript; charset=utf-8", pages::JS)
}

fn now_ms() -> u64 {
    SystemClock.now().millis()
}

/// A page that says one thing, with its status.
fn message(session: Option<&Session>, status: StatusCode, title: &str, text: &str) -> Response {
    html(status, pages::message(session, title, text))
}

fn stale_form(session: &Session) -> Response {
    message(
        Some(session),
        auth::STALE_FORM,
        "This form is out of date",
        "The form was not made for this sign-in (the host restarted, or you signed in again): reload the page and try again. Nothing was written.",
    )
}

/// The sign-in page, with a fresh nonce in its cookie.
fn login_response(headers: &HeaderMap, status: StatusCode, message: Option<&str>) -> Response {
    let Some(nonce) = auth::nonce() else {
        return html(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::message(
                None,
                "Cannot sign in",
                "the host could not draw a random nonce",
            ),
        );
    };
    let mut response = html(status, pages::login(&nonce, message));
    response.headers_mut().append(
        header::SET_COOKIE,
        auth::set_cookie(headers, auth::LOGIN_COOKIE, Some(&nonce), "/login"),
    );
    response
}

#[derive(Debug, Default, Deserialize)]
struct LoginQuery {
    reason: Option<String>,
}

async fn login_page(
    headers: HeaderMap,
    query: Result<Query<LoginQuery>, QueryRejection>,
) -> Response {
    let reason = query.ok().and_then(|Query(query)| query.reason);
    let message = match reason.as_deref() {
        Some("rejected") => Some(
            "The token you signed in with is not accepted by this host any more (it may have restarted with other tokens). Sign in again.",
        ),
        Some("signed_out") => Some("Signed out."),
        _ => None,
    };
    login_response(&headers, StatusCode::OK, message)
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    csrf: String,
}

async fn login(
    State(host): State<Arc<Host>>,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    let Ok(Form(form)) = form else {
        return login_response(
            &headers,
            StatusCode::BAD_REQUEST,
            Some("The sign-in form could not be read; try again."),
        );
    };
    let nonce = auth::cookie(&headers, auth::LOGIN_COOKIE).unwrap_or_default();
    if !auth::same_nonce(&nonce, &form.csrf) {
        return login_response(
            &headers,
            auth::STALE_FORM,
            Some("The sign-in form expired (or cookies are off); try again."),
        );
    }
    let token = form.token.trim();
    if !auth::cookie_safe(token) || host.tokens.scope_of(token).is_none() {
        return login_response(
            &headers,
            StatusCode::UNAUTHORIZED,
            Some("That token is not one this host knows. Nothing was signed in."),
        );
    }
    let mut response = Redirect::to("/").into_response();
    let cookies = response.headers_mut();
    cookies.append(
        header::SET_COOKIE,
        auth::set_cookie(&headers, auth::TOKEN_COOKIE, Some(token), "/"),
    );
    cookies.append(
        header::SET_COOKIE,
        auth::set_cookie(&headers, auth::LOGIN_COOKIE, None, "/login"),
    );
    response
}

async fn logout(
    headers: HeaderMap,
    session: Result<Session, auth::SignedOut>,
    form: Result<Form<BTreeMap<String, String>>, FormRejection>,
) -> Response {
    if let Ok(session) = &session {
        let presented = form
            .ok()
            .and_then(|Form(form)| form.get("csrf").cloned())
            .unwrap_or_default();
        if !session.accepts(&presented) {
            return stale_form(session);
        }
    }
    let mut response = Redirect::to("/login?reason=signed_out").into_response();
    response.headers_mut().append(
        header::SET_COOKIE,
        auth::set_cookie(&headers, auth::TOKEN_COOKIE, None, "/"),
    );
    response
}

fn status_filter(text: &str) -> Option<TreeStatus> {
    match text {
        "running" => Some(TreeStatus::Running),
        "waiting" => Some(TreeStatus::Waiting),
        "needs_attention" => Some(TreeStatus::NeedsAttention),
        "done" => Some(TreeStatus::Done),
        _ => None,
    }
}

async fn list(
    State(host): State<Arc<Host>>,
    session: Session,
    filters: Result<Query<ListFilters>, QueryRejection>,
) -> Response {
    let filters = filters.map(|Query(filters)| filters).unwrap_or_default();
    let listing = host
        .store
        .list(ListFilter {
            status: status_filter(&filters.status),
            scope: Some(session.scope.clone()),
            limit: std::num::NonZeroU32::new(LIST_LIMIT),
            ..ListFilter::default()
        })
        .await;
    let listing = match listing {
        Ok(listing) => listing,
        Err(error) => {
            return message(
                Some(&session),
                StatusCode::SERVICE_UNAVAILABLE,
                "The store is unavailable",
                &error.to_string(),
            );
        }
    };
    let program = filters.program.trim();
    let search = filters.q.trim();
    let mut rows: Vec<_> = listing
        .trees
        .into_iter()
        .filter(|meta| meta.scope == session.scope)
        .filter(|meta| {
            program.is_empty()
                || meta
                    .program
                    .as_ref()
                    .is_some_and(|p| p.name.as_str() == program)
        })
        .filter(|meta| search.is_empty() || meta.tree.to_string().contains(search))
        .collect();
    rows.sort_by_key(|meta| {
        (
            pages::rank(meta.status.as_str()),
            std::cmp::Reverse(meta.updated.millis()),
            meta.tree,
        )
    });
    html(
        StatusCode::OK,
        pages::trees(&session, &filters, &rows, listing.next.is_some(), now_ms()),
    )
}

fn tree_id(
    session: &Session,
    id: Result<Path<String>, PathRejection>,
) -> Result<TreeId, Box<Response>> {
    id.ok()
        .and_then(|Path(id)| TreeId::from_str(&id).ok())
        .ok_or_else(|| {
            Box::new(message(
                Some(session),
                StatusCode::NOT_FOUND,
                "No such tree",
                "That is not a tree id.",
            ))
        })
}

/// A tree's view (with its private payloads: the waits' questions and the
/// unknown effects' requests) and its latest log rows after `after`.
async fn load(
    host: &Host,
    session: &Session,
    tree: TreeId,
    after: u64,
) -> Result<(TreeView, Vec<LogRow>, usize), Response> {
    let view = {
        let engine = host.engine().await.map_err(|_| {
            message(
                Some(session),
                StatusCode::SERVICE_UNAVAILABLE,
                "Shutting down",
                "The host is shutting down.",
            )
        })?;
        engine
            .inspect(&session.scope, tree, Visibility::Private)
            .await
    };
    let view = view.map_err(|error| match error {
        TreeError::NotFound { .. } | TreeError::Scope { .. } => message(
            Some(session),
            StatusCode::NOT_FOUND,
            "No such tree",
            &format!(
                "There is no tree {tree} in scope {}.",
                session.scope.as_str()
            ),
        ),
        other => message(
            Some(session),
            StatusCode::SERVICE_UNAVAILABLE,
            "The tree cannot be read",
            &format!("{}: {other}", other.code()),
        ),
    })?;
    let history = host.store.history(tree).await.map_err(|error| {
        message(
            Some(session),
            StatusCode::SERVICE_UNAVAILABLE,
            "The store is unavailable",
            &error.to_string(),
        )
    })?;
    let rows: Vec<LogRow> = history
        .records
        .iter()
        .filter(|record| record.seq > after)
        .map(|record| LogRow {
            seq: record.seq,
            kind: record.kind.as_str().to_owned(),
            process: serde_json::from_slice::<serde_json::Value>(&record.body)
                .ok()
                .and_then(|body| {
                    body.get("process")
                        .or_else(|| body.get("root"))
                        .and_then(|p| p.as_str().map(str::to_owned))
                }),
            bytes: record.body.len(),
            hash: record.hash.to_string(),
        })
        .collect();
    let skipped = rows.len().saturating_sub(LOG_ROWS);
    Ok((view, rows.into_iter().skip(skipped).collect(), skipped))
}

/// Renders the tree page with a banner, a verification or a returned form.
async fn render(
    host: &Host,
    session: &Session,
    tree: TreeId,
    status: StatusCode,
    extra: Extra,
) -> Response {
    let (view, log, log_skipped) = match load(host, session, tree, 0).await {
        Ok(loaded) => loaded,
        Err(response) => return response,
    };
    let page = TreePage {
        session,
        view: &view,
        log: &log,
        log_skipped,
        now_ms: now_ms(),
        banner: extra.banner,
        verification: extra.verification,
        returned: extra.returned,
    };
    html(status, tree::page(&page))
}

/// What a tree page shows beyond the tree.
#[derive(Default)]
struct Extra {
    banner: Option<Banner>,
    verification: Option<Result<baton::run::Verification, String>>,
    returned: Option<Returned>,
}

#[derive(Debug, Default, Deserialize)]
struct TreeQuery {
    verify: Option<String>,
    notice: Option<String>,
}

async fn tree_page(
    State(host): State<Arc<Host>>,
    session: Session,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<TreeQuery>, QueryRejection>,
) -> Response {
    let tree = match tree_id(&session, id) {
        Ok(tree) => tree,
        Err(response) => return *response,
    };
    let query = query.map(|Query(query)| query).unwrap_or_default();
    let mut extra = Extra {
        banner: match query.notice.as_deref() {
            Some("answered") => Some(Banner::info("Answer recorded.")),
            Some("canceled") => Some(Banner::info("Cancellation recorded.")),
            Some("resolved") => Some(Banner::info("Resolution recorded.")),
            _ => None,
        },
        ..Extra::default()
    };
    if query.verify.is_some() {
        let verified = match host.engine().await {
            Ok(engine) => engine
                .verify(&session.scope, tree)
                .await
                .map_err(|error| format!("{}: {error}", error.code())),
            Err(_) => Err("the host is shutting down".to_owned()),
        };
        extra.verification = Some(verified);
    }
    render(&host, &session, tree, StatusCode::OK, extra).await
}

#[derive(Debug, Default, Deserialize)]
struct LiveQuery {
    after: Option<u64>,
}

async fn live(
    State(host): State<Arc<Host>>,
    session: Session,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<LiveQuery>, QueryRejection>,
) -> Response {
    let tree = match tree_id(&session, id) {
        Ok(tree) => tree,
        Err(response) => return *response,
    };
    let after = query.ok().and_then(|Query(query)| query.after).unwrap_or(0);
    let (view, log, _) = match load(&host, &session, tree, after).await {
        Ok(loaded) => loaded,
        Err(response) => return response,
    };
    let page = TreePage {
        session: &session,
        view: &view,
        log: &log,
        log_skipped: 0,
        now_ms: now_ms(),
        banner: None,
        verification: None,
        returned: None,
    };
    html(StatusCode::OK, tree::live(&page))
}

/// A posted form's fields, its CSRF token checked and taken out.
fn posted(
    session: &Session,
    form: Result<Form<BTreeMap<String, String>>, FormRejection>,
) -> Result<Posted, Box<Response>> {
    let Ok(Form(mut fields)) = form else {
        return Err(Box::new(message(
            Some(session),
            StatusCode::BAD_REQUEST,
            "The form could not be read",
            "Nothing was written.",
        )));
    };
    let csrf = fields.remove("csrf").unwrap_or_default();
    if !session.accepts(&csrf) {
        return Err(Box::new(stale_form(session)));
    }
    Ok(fields)
}

/// The banner of an API problem: what happened and that nothing changed.
fn refused(problem: &Problem) -> Banner {
    Banner::error(format!(
        "Refused ({}): {}. Nothing was written.",
        problem.code, problem.detail
    ))
}

fn caller(session: &Session) -> Caller {
    Caller {
        scope: session.scope.clone(),
    }
}

fn see_tree(tree: TreeId, notice: &str) -> Response {
    Redirect::to(&format!("/trees/{tree}?notice={notice}")).into_response()
}

/// Reads the answer a form posted: the whole answer as JSON (`json`), or
/// the generated fields.
fn read_answer(schema: &serde_json::Value, fields: &Posted) -> Result<Payload, FieldErrors> {
    let value = match fields.get("json") {
        Some(text) => serde_json::from_str(text).map_err(|error| {
            FieldErrors::from([("json".to_owned(), format!("not JSON: {error}"))])
        })?,
        None => AnswerForm::of(schema).read(fields)?,
    };
    Payload::from_value(&value)
        .map_err(|error| FieldErrors::from([(String::new(), format!("not a payload: {error}"))]))
}

async fn answer(
    State(host): State<Arc<Host>>,
    session: Session,
    ids: Result<Path<(String, String)>, PathRejection>,
    form: Result<Form<BTreeMap<String, String>>, FormRejection>,
) -> Response {
    let fields = match posted(&session, form) {
        Ok(fields) => fields,
        Err(response) => return *response,
    };
    let Some((tree, wait)) = ids.ok().and_then(|Path((tree, wait))| {
        Some((TreeId::from_str(&tree).ok()?, WaitId::from_str(&wait).ok()?))
    }) else {
        return message(
            Some(&session),
            StatusCode::NOT_FOUND,
            "No such wait",
            "That is not a tree and wait id.",
        );
    };
    let (view, _, _) = match load(&host, &session, tree, u64::MAX).await {
        Ok(loaded) => loaded,
        Err(response) => return response,
    };
    let schema = view
        .processes
        .iter()
        .flat_map(|process| process.open_waits.iter())
        .find(|open| open.id == wait)
        .map(|open| open.answer_schema.to_value());
    let Some(schema) = schema else {
        let banner = Banner::error(format!(
            "This wait is no longer open (it was answered, or the tree is {}): nothing was written.",
            view.status.as_str().replace('_', " ")
        ));
        return render(
            &host,
            &session,
            tree,
            StatusCode::CONFLICT,
            Extra {
                banner: Some(banner),
                ..Extra::default()
            },
        )
        .await;
    };
    let returned = |errors: FieldErrors| Returned {
        target: wait.to_string(),
        posted: fields.clone(),
        errors,
    };
    let answer = match read_answer(&schema, &fields) {
        Ok(answer) => answer,
        Err(errors) => {
            let extra = Extra {
                returned: Some(returned(errors)),
                ..Extra::default()
            };
            return render(
                &host,
                &session,
                tree,
                StatusCode::UNPROCESSABLE_ENTITY,
                extra,
            )
            .await;
        }
    };
    let done = moved(&host, &session, tree, |engine, scope| {
        Box::pin(async move { engine.answer(scope, tree, wait, answer).await.map(|_| ()) })
    })
    .await;
    match done {
        Ok(()) => see_tree(tree, "answered"),
        Err(Moved::Refused(problem)) => {
            let extra = Extra {
                banner: Some(refused(&problem)),
                ..Extra::default()
            };
            render(&host, &session, tree, problem_status(&problem), extra).await
        }
        Err(Moved::Engine(SignalError::Rejected(failure))) => {
            let key = if fields.contains_key("json") {
                "json"
            } else {
                ""
            };
            let errors = FieldErrors::from([(
                key.to_owned(),
                format!(
                    "The answer does not fit the wait's schema: {}. Nothing was written.",
                    failure
                ),
            )]);
            let extra = Extra {
                returned: Some(returned(errors)),
                ..Extra::default()
            };
            render(
                &host,
                &session,
                tree,
                StatusCode::UNPROCESSABLE_ENTITY,
                extra,
            )
            .await
        }
        Err(Moved::Engine(error)) => {
            let problem = crate::api::problem::signal(tree, &error);
            let extra = Extra {
                banner: Some(refused(&problem)),
                ..Extra::default()
            };
            render(&host, &session, tree, problem_status(&problem), extra).await
        }
    }
}

fn problem_status(problem: &Problem) -> StatusCode {
    StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// Why an action that moves a tree on did not happen.
enum Moved<E> {
    /// Refused before the engine acted (capacity, shutdown, no such tree).
    Refused(Problem),
    /// The engine refused it.
    Engine(E),
}

type Action<'a, E> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), E>> + Send + 'a>>;

/// Moves a tree on as the API's routes do: a permit, a handle the host
/// keeps, the engine's operation, then the tree tracked until quiescent.
async fn moved<E>(
    host: &Arc<Host>,
    session: &Session,
    tree: TreeId,
    act: impl for<'a> FnOnce(&'a baton::run::Engine, &'a baton::run::Scope) -> Action<'a, E>,
) -> Result<(), Moved<E>> {
    let until = UntilQuery::default();
    let permit = crate::api::trees::permit(host, until)
        .await
        .map_err(Moved::Refused)?;
    let handle = crate::api::trees::handle(host, &caller(session), tree)
        .await
        .map_err(Moved::Refused)?;
    {
        let engine = host
            .engine()
            .await
            .map_err(|_| Moved::Refused(Problem::shutting_down()))?;
        act(&engine, &session.scope).await.map_err(Moved::Engine)?;
    }
    host.track(handle, Some(permit));
    Ok(())
}

fn tree_and<T: FromStr>(
    session: &Session,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<(TreeId, T), Box<Response>> {
    ids.ok()
        .and_then(|Path((tree, other))| {
            Some((TreeId::from_str(&tree).ok()?, T::from_str(&other).ok()?))
        })
        .ok_or_else(|| {
            Box::new(message(
                Some(session),
                StatusCode::NOT_FOUND,
                "Not found",
                "That is not a tree and effect id.",
            ))
        })
}

async fn cancel(
    State(host): State<Arc<Host>>,
    session: Session,
    id: Result<Path<String>, PathRejection>,
    form: Result<Form<BTreeMap<String, String>>, FormRejection>,
) -> Response {
    let fields = match posted(&session, form) {
        Ok(fields) => fields,
        Err(response) => return *response,
    };
    let tree = match tree_id(&session, id) {
        Ok(tree) => tree,
        Err(response) => return *response,
    };
    let reason = fields.get("reason").map(|r| r.trim()).unwrap_or("");
    if reason.is_empty() {
        let extra = Extra {
            banner: Some(Banner::error(
                "Give a reason to cancel. Nothing was written.",
            )),
            ..Extra::default()
        };
        return render(
            &host,
            &session,
            tree,
            StatusCode::UNPROCESSABLE_ENTITY,
            extra,
        )
        .await;
    }
    let reason = reason.to_owned();
    let done = moved(&host, &session, tree, |engine, scope| {
        Box::pin(async move {
            let handle = engine
                .process::<Payload>(scope, tree)
                .await
                .map_err(ControlError::Tree)?;
            handle.cancel(reason).await
        })
    })
    .await;
    let problem = match done {
        Ok(()) => return see_tree(tree, "canceled"),
        Err(Moved::Refused(problem)) => problem,
        Err(Moved::Engine(error)) => crate::api::problem::control(tree, &error),
    };
    let extra = Extra {
        banner: Some(refused(&problem)),
        ..Extra::default()
    };
    render(&host, &session, tree, problem_status(&problem), extra).await
}

/// The settlement a resolve form posted.
fn settlement(fields: &Posted) -> Result<Settlement, String> {
    match fields.get("outcome").map(String::as_str) {
        Some("output") => {
            let text = fields.get("output").map(|o| o.trim()).unwrap_or("");
            let value: serde_json::Value = serde_json::from_str(text)
                .map_err(|error| format!("the output is not JSON: {error}"))?;
            let payload = Payload::from_value(&value)
                .map_err(|error| format!("the output is not a payload: {error}"))?;
            Ok(Settlement::ok(payload))
        }
        Some("failure") => {
            let code = fields.get("code").map(|c| c.trim()).unwrap_or("");
            let code = Name::new(code).map_err(|error| format!("not a failure code: {error}"))?;
            let message = fields.get("message").map(|m| m.trim()).unwrap_or("");
            if message.is_empty() {
                return Err("give the failure a message".to_owned());
            }
            Ok(Settlement::failed(Failure::new(
                FailureKind::External,
                code.as_str(),
                message,
            )))
        }
        _ => Err("choose what happened: an output or a failure".to_owned()),
    }
}

async fn resolve(
    State(host): State<Arc<Host>>,
    session: Session,
    ids: Result<Path<(String, String)>, PathRejection>,
    form: Result<Form<BTreeMap<String, String>>, FormRejection>,
) -> Response {
    let fields = match posted(&session, form) {
        Ok(fields) => fields,
        Err(response) => return *response,
    };
    let (tree, effect) = match tree_and::<EffectId>(&session, ids) {
        Ok(ids) => ids,
        Err(response) => return *response,
    };
    let settled = match settlement(&fields) {
        Ok(settled) => settled,
        Err(error) => {
            let extra = Extra {
                returned: Some(Returned {
                    target: effect.to_string(),
                    posted: fields.clone(),
                    errors: FieldErrors::from([(
                        String::new(),
                        format!("{error}. Nothing was written."),
                    )]),
                }),
                ..Extra::default()
            };
            return render(
                &host,
                &session,
                tree,
                StatusCode::UNPROCESSABLE_ENTITY,
                extra,
            )
            .await;
        }
    };
    let done = moved(&host, &session, tree, |engine, scope| {
        Box::pin(async move { engine.resolve_unknown(scope, tree, effect, settled).await })
    })
    .await;
    let problem = match done {
        Ok(()) => return see_tree(tree, "resolved"),
        Err(Moved::Refused(problem)) => problem,
        Err(Moved::Engine(error)) => crate::api::problem::control(tree, &error),
    };
    let extra = Extra {
        banner: Some(refused(&problem)),
        ..Extra::default()
    };
    render(&host, &session, tree, problem_status(&problem), extra).await
}
