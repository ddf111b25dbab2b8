//! Planner: a plan of dependent tasks runs each once its dependencies
//! completed; invalid plans fail whole before anything starts; failures
//! re-plan within `max_iterations`; conformance and crashes.

use baton_agent::{ModelError, Request, Response};
use baton_run::{Payload, Program};
use baton_strategy::planner::{
    MODEL_FAILED, PlanRequest, PlannerOutput, SynthesisRequest, TASK_FAILED,
};
use baton_strategy::{Outcome, Planner, PlannerConfig, Work};
use baton_team::Turn;
use baton_testkit::definition_conformance;
use serde_json::{Value, json};

use crate::common::*;

fn task(key: &str, agent: &str, input: &str, depends_on: &[&str]) -> Value {
    json!({ "key": key, "agent": agent, "input": input, "depends_on": depends_on })
}

/// The plan for each task text (and round).
fn plan(text: &str, round: u32) -> Value {
    let tasks = match (text, round) {
        ("write a report", _) => vec![
            task("facts", "researcher", "gather the facts", &[]),
            task("outline", "writer", "outline the report", &["facts"]),
            task("check", "reviewer", "check the facts", &["facts"]),
            task("final", "writer", "write the report", &["outline", "check"]),
        ],
        ("cycle", _) => vec![
            task("a", "writer", "a", &["b"]),
            task("b", "writer", "b", &["a"]),
        ],
        ("ghost", _) => vec![task("a", "writer", "a", &["ghost"])],
        ("stranger", _) => vec![task("a", "nobody", "a", &[])],
        ("too many", _) => (0..5)
            .map(|i| task(&format!("t{i}"), "writer", "x", &[]))
            .collect(),
        ("flaky once", 1) => vec![
            task("fast", "researcher", "look", &[]),
            task("risky", "flaky", "try", &[]),
        ],
        ("flaky once", _) => vec![task("safe", "writer", "do it safely", &[])],
        ("always flaky", _) => vec![task("risky", "flaky", "try", &[])],
        ("nothing", _) => vec![],
        _ => vec![],
    };
    json!({ "tasks": tasks })
}

fn answer(request: &Request) -> Result<Response, ModelError> {
    let parse =
        |text: String| Payload::parse_str(&text).map_err(|e| ModelError::Malformed(e.to_string()));
    if system(request).starts_with("You plan") {
        let request: PlanRequest = parse(last_user(request))?
            .decode()
            .map_err(|e| ModelError::Malformed(e.to_string()))?;
        let task: String = request.task.decode().unwrap_or_default();
        return Ok(Response::text(plan(&task, request.round).to_string()));
    }
    if system(request).starts_with("You write the final answer") {
        let request: SynthesisRequest = parse(last_user(request))?
            .decode()
            .map_err(|e| ModelError::Malformed(e.to_string()))?;
        let done: Vec<String> = request
            .tasks
            .iter()
            .filter(|t| matches!(t.outcome, Some(Outcome::Succeeded { .. })))
            .map(|t| format!("{}.{}", t.round, t.key))
            .collect();
        return Ok(Response::text(
            json!({ "answer": format!("from {}", done.join(", ")) }).to_string(),
        ));
    }
    echo(request).ok_or_else(|| ModelError::Malformed("not an agent's request".into()))
}

fn planner(models: &Models, max_iterations: u32) -> Planner {
    Planner::new(PlannerConfig {
        name: "test.planner".into(),
        description: "Plan and do.".into(),
        agents: vec![
            echo_agent(models, "researcher"),
            echo_agent(models, "writer"),
            echo_agent(models, "reviewer"),
            program_agent("flaky", Behaviour::Fail, None),
        ],
        model: models.config("planner"),
        max_tasks: 4,
        max_iterations,
    })
    .expect("valid")
}

fn reporting(models: &Models) -> Program<Work, PlannerOutput> {
    planner(models, 2).program()
}

#[tokio::test]
async fn tasks_start_once_their_dependencies_completed_with_their_outputs() {
    let models = Models::new(answer);
    let team = planner(&models, 2);
    let (engine, handle, ended) = run(&team.program(), "report", work("write a report")).await;
    let output: PlannerOutput = ended
        .output()
        .expect("completed")
        .decode()
        .expect("decodes");
    assert_eq!(output.answer, "from 1.facts, 1.outline, 1.check, 1.final");
    assert_eq!(output.rounds, 1);
    // The final task read both of its dependencies' outputs.
    let requests = models.requests();
    let last = requests
        .iter()
        .find(|r| r.contains("write the report"))
        .expect("the final task ran");
    assert!(
        last.contains("From writer (task outline)") && last.contains("From reviewer (task check)"),
        "{last}"
    );
    // Outline and check started together, as soon as the facts were in.
    let turns = recorded_turns(&engine, handle.tree()).await;
    let first_with = |key: &str| {
        turns
            .iter()
            .map(|t| t.decode::<Turn>().expect("a turn"))
            .position(|t| t.task(key).is_some())
            .expect("the task started")
    };
    assert_eq!(first_with("task.1.outline"), first_with("task.1.check"));
    assert!(first_with("task.1.facts") < first_with("task.1.outline"));
    assert!(first_with("task.1.check") < first_with("task.1.final"));
    assert_eq!(models.calls()["planner"], 2, "one plan and one synthesis");
    assert_eq!(models.calls()["writer"], 2);
    let checked = definition_conformance(
        team.coordinator().definition().as_ref(),
        &turn_cases(&turns),
    );
    assert_eq!(checked, turns.len());
}

#[tokio::test]
async fn an_invalid_plan_fails_whole_before_any_task_starts() {
    for (task, code) in [
        ("cycle", "strategy.planner.cycle"),
        ("ghost", "strategy.planner.unknown_dependency"),
        ("stranger", "strategy.planner.unknown_agent"),
        ("too many", "strategy.planner.too_many_tasks"),
    ] {
        let models = Models::new(answer);
        let (_, handle, ended) = run(&planner(&models, 2).program(), "invalid", work(task)).await;
        assert_eq!(failure_of(&ended).code(), code, "{task}");
        let view = handle.inspect().await.expect("inspects");
        let started: Vec<_> = view
            .root()
            .children
            .keys()
            .filter(|k| k.as_str().starts_with("task."))
            .collect();
        assert!(started.is_empty(), "{task}: {started:?} started");
        assert_eq!(models.calls()["writer"], 0, "{task}");
    }
}

#[tokio::test]
async fn a_failed_task_leads_to_a_new_plan_from_every_outcome() {
    let models = Models::new(answer);
    let (_, _, ended) = run(&planner(&models, 2).program(), "replan", work("flaky once")).await;
    let output: PlannerOutput = ended
        .output()
        .expect("completed")
        .decode()
        .expect("decodes");
    assert_eq!(output.rounds, 2);
    assert_eq!(output.answer, "from 1.fast, 2.safe");
    let replanned = models
        .requests()
        .into_iter()
        .find(|r| r.contains("\\\"round\\\":2"))
        .expect("a second round was planned");
    assert!(
        replanned.contains("test.agent.failed"),
        "the planner saw the failure: {replanned}"
    );
}

#[tokio::test]
async fn a_task_failing_in_the_last_round_fails_the_team_naming_it() {
    let models = Models::new(answer);
    let (_, _, ended) = run(
        &planner(&models, 2).program(),
        "exhausted",
        work("always flaky"),
    )
    .await;
    let failure = failure_of(&ended);
    assert_eq!(failure.code(), TASK_FAILED);
    assert!(
        failure
            .message
            .contains("task risky of round 2 (agent flaky)"),
        "{failure}"
    );
    assert_eq!(models.calls()["planner"], 2, "two plans, no synthesis");
}

#[tokio::test]
async fn an_empty_plan_goes_straight_to_the_answer_and_a_bad_plan_answer_is_classified() {
    let models = Models::new(answer);
    let (_, _, ended) = run(&planner(&models, 1).program(), "empty", work("nothing")).await;
    let output: PlannerOutput = ended
        .output()
        .expect("completed")
        .decode()
        .expect("decodes");
    assert_eq!(output.answer, "from ");
    let prose = Models::new(|_: &Request| Ok(Response::text("first research, then write")));
    let (_, _, ended) = run(
        &planner(&prose, 1).program(),
        "prose",
        work("write a report"),
    )
    .await;
    assert_eq!(failure_of(&ended).code(), MODEL_FAILED);
}

#[test]
fn zero_limits_are_refused() {
    let models = Models::new(answer);
    for (tasks, iterations, code) in [
        (0, 1, "strategy.planner.zero_tasks"),
        (1, 0, "strategy.planner.zero_iterations"),
    ] {
        let error = Planner::new(PlannerConfig {
            name: "test.planner".into(),
            description: "Plan.".into(),
            agents: vec![echo_agent(&models, "writer")],
            model: models.config("planner"),
            max_tasks: tasks,
            max_iterations: iterations,
        })
        .expect_err("refused");
        assert_eq!(error.code(), code);
    }
}

#[tokio::test]
async fn a_crash_at_any_commit_resumes_to_the_same_output_without_repeating_a_model_call() {
    let crashes = crash_everywhere(reporting, answer, "write a report").await;
    assert!(crashes >= 20, "{crashes} crashes checked");
}

#[tokio::test]
async fn the_agent_stream_shows_the_planner_and_its_tasks_and_one_terminal() {
    let models = Models::new(answer);
    let (engine, handle, _) = run(
        &planner(&models, 2).program(),
        "stream",
        work("write a report"),
    )
    .await;
    let events = agent_stream(&engine, handle.tree()).await;
    assert!(started_agents(&events).len() >= 2, "{events:#?}");
}
