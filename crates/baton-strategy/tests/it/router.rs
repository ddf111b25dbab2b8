//! Router: a pure route, capability scoring and its tie-break, the model
//! router and its unknown ids, conformance and crashes.

use baton_agent::{ModelError, Request, Response, ResponseFormat};
use baton_run::{Failure, Payload, Program};
use baton_strategy::router::{
    ANSWER_INVALID, Choice, NO_MATCH, Route, RouteQuery, RouterOutput, TIE, TieBreak,
    UNKNOWN_AGENT, scores,
};
use baton_strategy::{Agent, Pure, Router, RouterConfig, Work};
use baton_testkit::definition_conformance;
use serde_json::json;

use crate::common::*;

/// The model router picks the agent the task names after `route to `;
/// a task `prose` gets a prose answer.
fn answer(request: &Request) -> Result<Response, ModelError> {
    if system(request).starts_with("You route") {
        let query: RouteQuery = Payload::parse_str(&last_user(request))
            .and_then(|p| p.decode())
            .map_err(|e| ModelError::Malformed(e.to_string()))?;
        let task: String = query.task.decode().unwrap_or_default();
        if task == "prose" {
            return Ok(Response::text("I would pick support, probably."));
        }
        let id = task.strip_prefix("route to ").unwrap_or("support");
        return Ok(Response::text(json!({ "agent_id": id }).to_string()));
    }
    echo(request).ok_or_else(|| ModelError::Malformed("not an agent's request".into()))
}

fn desk(models: &Models) -> Vec<Agent> {
    vec![
        echo_agent(models, "billing").with_capabilities(["invoice", "refund"]),
        echo_agent(models, "support").with_capabilities(["help", "login"]),
        echo_agent(models, "sql").with_capabilities(["sql"]),
    ]
}

fn router(models: &Models, route: Route, fallback: Option<&str>) -> Router {
    Router::new(RouterConfig {
        name: "test.desk".into(),
        description: "Route to one desk.".into(),
        agents: desk(models),
        route,
        fallback: fallback.map(str::to_owned),
    })
    .expect("valid")
}

fn model_router(models: &Models) -> Program<Work, RouterOutput> {
    router(models, Route::Model(models.config("router")), None).program()
}

async fn routed(router: &Router, task: serde_json::Value) -> RouterOutput {
    let (_, _, ended) = run(&router.program(), "routed", Work::of(payload(&task))).await;
    ended
        .output()
        .expect("completed")
        .decode()
        .expect("decodes")
}

#[tokio::test]
async fn a_pure_route_picks_the_agent() {
    let models = Models::new(answer);
    let route = Pure::new("test route 1", |query: &RouteQuery| {
        let task: String = query
            .task
            .decode()
            .map_err(|e| Failure::contract("test.route", e.to_string()))?;
        Ok(if task.contains("invoice") {
            "billing"
        } else {
            "support"
        }
        .to_owned())
    });
    let output = routed(
        &router(&models, Route::Pure(route), None),
        json!("an invoice is wrong"),
    )
    .await;
    assert_eq!(
        (output.agent.as_str(), output.choice),
        ("billing", Choice::Function)
    );
    assert_eq!(output.output, payload(&"billing did an invoice is wrong"));
    assert_eq!(models.calls()["support"], 0, "only the chosen agent ran");
}

#[test]
fn capability_scores_count_keys_twice_and_equal_string_values_once() {
    let models = Models::new(answer);
    let cards: Vec<_> = desk(&models).iter().map(|a| a.card().clone()).collect();
    assert_eq!(
        scores(&payload(&json!({"invoice": 1, "kind": "refund"})), &cards),
        [3, 0, 0]
    );
    assert_eq!(
        scores(&payload(&json!({"message": "sql"})), &cards),
        [0, 0, 1]
    );
    assert_eq!(scores(&payload(&json!("login")), &cards), [0, 1, 0]);
    assert_eq!(scores(&payload(&json!(42)), &cards), [0, 0, 0]);
}

#[tokio::test]
async fn capability_scoring_routes_to_the_best_score_and_breaks_ties_as_declared() {
    let models = Models::new(answer);
    let best = routed(
        &router(&models, Route::Capabilities(TieBreak::RosterOrder), None),
        json!({"message": "sql"}),
    )
    .await;
    assert_eq!(
        (best.agent.as_str(), best.choice),
        ("sql", Choice::Capabilities { score: 1 })
    );
    let tie = json!({"a": "refund", "b": "help"});
    let first = routed(
        &router(&models, Route::Capabilities(TieBreak::RosterOrder), None),
        tie.clone(),
    )
    .await;
    assert_eq!(first.agent.as_str(), "billing");
    let team = router(&models, Route::Capabilities(TieBreak::Refuse), None);
    let (_, _, ended) = run(&team.program(), "tie", Work::of(payload(&tie))).await;
    assert_eq!(failure_of(&ended).code(), TIE);
    let fallback = routed(
        &router(
            &models,
            Route::Capabilities(TieBreak::Refuse),
            Some("support"),
        ),
        tie,
    )
    .await;
    assert_eq!(
        (fallback.agent.as_str(), fallback.choice),
        ("support", Choice::Fallback { requested: None })
    );
    let team = router(&models, Route::Capabilities(TieBreak::RosterOrder), None);
    let (_, _, ended) = run(
        &team.program(),
        "none",
        Work::of(payload(&json!("weather"))),
    )
    .await;
    assert_eq!(failure_of(&ended).code(), NO_MATCH);
}

#[tokio::test]
async fn the_model_router_sees_the_roster_at_temperature_zero_and_its_choice_runs() {
    let models = Models::new(answer);
    let (engine, handle, ended) = run(&model_router(&models), "model", work("route to sql")).await;
    let output: RouterOutput = ended
        .output()
        .expect("completed")
        .decode()
        .expect("decodes");
    assert_eq!(
        (output.agent.as_str(), output.choice),
        ("sql", Choice::Model)
    );
    assert_eq!(output.output, payload(&"sql did route to sql"));
    assert_eq!(models.calls()["router"], 1);
    let turns = recorded_turns(&engine, handle.tree()).await;
    let team = router(&models, Route::Model(models.config("router")), None);
    definition_conformance(
        team.coordinator().definition().as_ref(),
        &turn_cases(&turns),
    );
}

#[tokio::test]
async fn the_model_routers_request_is_strict_json_at_temperature_zero() {
    let models = Models::new(answer);
    let config = models.config("router");
    let team = router(&models, Route::Model(config.clone()), None);
    run(&team.program(), "request", work("route to billing")).await;
    let scripted = config.model.identity();
    assert_eq!(scripted.model, "router");
    let requests: Vec<String> = models.requests();
    let request = requests
        .iter()
        .find(|r| r.contains("You route"))
        .expect("the router was asked");
    let request: Request = Payload::parse_str(request)
        .and_then(|p| p.decode())
        .expect("a request");
    assert_eq!(request.options().temperature, Some(0.0));
    assert!(matches!(
        &request.options().response_format,
        Some(ResponseFormat::JsonSchema { strict: true, .. })
    ));
    let query: RouteQuery = Payload::parse_str(&last_user(&request))
        .and_then(|p| p.decode())
        .expect("a query");
    let ids: Vec<&str> = query.agents.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, ["billing", "support", "sql"]);
}

#[tokio::test]
async fn an_unknown_id_fails_classified_or_goes_to_the_fallback() {
    let models = Models::new(answer);
    let team = router(&models, Route::Model(models.config("router")), None);
    let (_, _, ended) = run(&team.program(), "unknown", work("route to nobody")).await;
    let failure = failure_of(&ended);
    assert_eq!(failure.code(), UNKNOWN_AGENT);
    assert!(failure.message.contains("\"nobody\""), "{failure}");
    let team = router(
        &models,
        Route::Model(models.config("router")),
        Some("support"),
    );
    let (_, _, ended) = run(&team.program(), "fallback", work("route to nobody")).await;
    let output: RouterOutput = ended
        .output()
        .expect("completed")
        .decode()
        .expect("decodes");
    assert_eq!(
        (output.agent.as_str(), output.choice),
        (
            "support",
            Choice::Fallback {
                requested: Some("nobody".into())
            }
        )
    );
}

#[tokio::test]
async fn a_prose_answer_is_never_guessed_from() {
    let models = Models::new(answer);
    let team = router(
        &models,
        Route::Model(models.config("router")),
        Some("billing"),
    );
    let (_, _, ended) = run(&team.program(), "prose", work("prose")).await;
    let failure = failure_of(&ended);
    assert_eq!(failure.code(), ANSWER_INVALID);
    assert!(failure.message.contains("chat.output.invalid"), "{failure}");
    assert_eq!(models.calls()["support"], 0);
}

#[test]
fn an_unknown_fallback_is_refused() {
    let models = Models::new(answer);
    let error = Router::new(RouterConfig {
        name: "test.desk".into(),
        description: "Route.".into(),
        agents: desk(&models),
        route: Route::Capabilities(TieBreak::RosterOrder),
        fallback: Some("nobody".into()),
    })
    .expect_err("refused");
    assert_eq!(error.code(), "strategy.router.unknown_fallback");
}

#[tokio::test]
async fn a_crash_at_any_commit_resumes_to_the_same_output_without_repeating_a_model_call() {
    let crashes = crash_everywhere(model_router, answer, "route to billing").await;
    assert!(crashes >= 10, "{crashes} crashes checked");
}

#[tokio::test]
async fn the_agent_stream_shows_the_routed_agent_and_one_completion() {
    let models = Models::new(answer);
    let program = model_router(&models);
    let (engine, handle, _) = run(&program, "stream", work("route to sql")).await;
    let events = agent_stream(&engine, handle.tree()).await;
    assert!(!started_agents(&events).is_empty(), "{events:#?}");
}
