//! Parallel: the concurrency limit, the three error modes, the merges,
//! conformance and crashes.

use baton_agent::{ModelError, Request, Response};
use baton_run::{Failure, Payload, Program, Status};
use baton_strategy::parallel::{
    AGENT_FAILED, AGENTS_FAILED, ALL_FAILED, ErrorMode, Merge, MergeInput, ParallelOutput,
};
use baton_strategy::{Outcome, Parallel, ParallelConfig, Pure, Work};
use baton_team::Turn;
use baton_testkit::definition_conformance;

use crate::common::*;

fn answer(request: &Request) -> Result<Response, ModelError> {
    if system(request).starts_with("You merge") {
        let input: MergeInput = Payload::parse_str(&last_user(request))
            .and_then(|p| p.decode())
            .map_err(|e| ModelError::Malformed(e.to_string()))?;
        let texts: Vec<String> = input
            .results
            .iter()
            .filter_map(|r| r.outcome.output())
            .map(|o| o.decode::<String>().unwrap_or_default())
            .collect();
        let merged = serde_json::json!({ "answer": texts.join(" | ") });
        return Ok(Response::text(merged.to_string()));
    }
    echo(request).ok_or_else(|| ModelError::Malformed("not an agent's request".into()))
}

fn config(agents: Vec<baton_strategy::Agent>, errors: ErrorMode, merge: Merge) -> ParallelConfig {
    ParallelConfig {
        name: "test.fan".into(),
        description: "Fan out.".into(),
        agents,
        max_concurrency: 2,
        errors,
        merge,
    }
}

fn reviewers(models: &Models) -> Program<Work, ParallelOutput> {
    let agents = ["security", "style", "tests", "docs"]
        .iter()
        .map(|id| echo_agent(models, id))
        .collect();
    Parallel::new(config(
        agents,
        ErrorMode::FailFast,
        Merge::Model(models.config("merger")),
    ))
    .expect("valid")
    .program()
}

#[tokio::test]
async fn every_agent_runs_on_the_same_input_within_the_limit_and_outputs_keep_roster_order() {
    let models = Models::new(answer);
    let agents = ["security", "style", "tests", "docs"]
        .iter()
        .map(|id| echo_agent(&models, id))
        .collect();
    let team = Parallel::new(config(agents, ErrorMode::FailFast, Merge::Outputs)).expect("valid");
    let (engine, handle, ended) = run(&team.program(), "fan", work("the diff")).await;
    let output: ParallelOutput = ended
        .output()
        .expect("completed")
        .decode()
        .expect("decodes");
    assert_eq!(
        output.output,
        payload(&[
            "security did the diff",
            "style did the diff",
            "tests did the diff",
            "docs did the diff"
        ])
    );
    let turns = recorded_turns(&engine, handle.tree()).await;
    for turn in &turns {
        let turn: Turn = turn.decode().expect("a turn");
        let running = turn.running().count();
        assert!(running <= 2, "turn {} has {running} running", turn.number);
    }
    let second: Turn = turns[1].decode().expect("a turn");
    assert_eq!(
        second.tasks.len(),
        2,
        "the first decision started two agents"
    );
    let checked = definition_conformance(
        team.coordinator().definition().as_ref(),
        &turn_cases(&turns),
    );
    assert_eq!(checked, turns.len());
}

#[tokio::test]
async fn a_pure_merge_sees_every_outcome_in_roster_order() {
    let merge = Pure::new("test join 1", |input: &MergeInput| {
        let ids: Vec<&str> = input.results.iter().map(|r| r.agent.as_str()).collect();
        Payload::encode(&ids.join(",")).map_err(|e| Failure::execution("test.merge", e.to_string()))
    });
    let agents = vec![
        program_agent("c", Behaviour::Echo, None),
        program_agent("a", Behaviour::Echo, None),
        program_agent("b", Behaviour::Echo, None),
    ];
    let team =
        Parallel::new(config(agents, ErrorMode::Collect, Merge::Pure(merge))).expect("valid");
    let (_, _, ended) = run(&team.program(), "pure", work("x")).await;
    let output: ParallelOutput = ended
        .output()
        .expect("completed")
        .decode()
        .expect("decodes");
    assert_eq!(output.output, payload(&"c,a,b"));
}

#[tokio::test]
async fn a_model_merger_answers_the_output() {
    let models = Models::new(answer);
    let (_, _, ended) = run(&reviewers(&models), "merged", work("the diff")).await;
    let output: ParallelOutput = ended
        .output()
        .expect("completed")
        .decode()
        .expect("decodes");
    assert_eq!(
        output.output,
        payload(
            &"security did the diff | style did the diff | tests did the diff | docs did the diff"
        )
    );
    assert_eq!(models.calls()["merger"], 1);
}

#[tokio::test]
async fn fail_fast_cancels_the_running_siblings_and_join_proves_they_drained() {
    let agents = vec![
        program_agent("slow", Behaviour::Hang, None),
        program_agent("broken", Behaviour::Fail, None),
        program_agent("stuck", Behaviour::Hang, None),
    ];
    let mut config = config(agents, ErrorMode::FailFast, Merge::Outputs);
    config.max_concurrency = 3;
    let team = Parallel::new(config).expect("valid");
    let (_, handle, ended) = run(&team.program(), "fail-fast", work("x")).await;
    let failure = failure_of(&ended);
    assert_eq!(failure.code(), AGENT_FAILED);
    assert!(
        failure
            .message
            .contains("agent broken failed: test.agent.failed"),
        "{failure}"
    );
    let view = handle.inspect().await.expect("inspects");
    assert!(
        view.processes.iter().all(|p| p.status.is_terminal()),
        "join returned after the drain"
    );
    for hanging in ["test.slow", "test.stuck"] {
        let process = view
            .processes
            .iter()
            .find(|p| p.program.as_str() == hanging)
            .expect("the sibling ran");
        assert_eq!(process.status, Status::Canceled, "{hanging}");
    }
}

#[tokio::test]
async fn collect_runs_every_agent_and_fails_with_every_error() {
    let agents = vec![
        program_agent("a", Behaviour::Echo, None),
        program_agent("b", Behaviour::Fail, None),
        program_agent("c", Behaviour::Fail, None),
    ];
    let team = Parallel::new(config(agents, ErrorMode::Collect, Merge::Outputs)).expect("valid");
    let (_, handle, ended) = run(&team.program(), "collect", work("x")).await;
    let failure = failure_of(&ended);
    assert_eq!(failure.code(), AGENTS_FAILED);
    assert!(
        failure
            .message
            .starts_with("2 of 3 agents failed: b: test.agent.failed"),
        "{failure}"
    );
    assert!(
        failure.message.contains("; c: test.agent.failed"),
        "{failure}"
    );
    let view = handle.inspect().await.expect("inspects");
    let a = view
        .processes
        .iter()
        .find(|p| p.program.as_str() == "test.a")
        .expect("a ran");
    assert_eq!(a.status, Status::Completed);
}

#[tokio::test]
async fn best_effort_succeeds_with_the_successes() {
    let agents = vec![
        program_agent("a", Behaviour::Echo, None),
        program_agent("b", Behaviour::Fail, None),
    ];
    let team = Parallel::new(config(agents, ErrorMode::BestEffort, Merge::Outputs)).expect("valid");
    let (_, _, ended) = run(&team.program(), "best-effort", work("x")).await;
    let output: ParallelOutput = ended
        .output()
        .expect("completed")
        .decode()
        .expect("decodes");
    assert_eq!(output.output, payload(&["a saw {\"task\":\"x\"}"]));
    assert!(
        matches!(&output.results[1].outcome, Outcome::Failed { failure } if failure.code() == "test.agent.failed")
    );
}

#[tokio::test]
async fn best_effort_with_every_agent_failing_fails_with_every_error() {
    let agents = vec![
        program_agent("a", Behaviour::Fail, None),
        program_agent("b", Behaviour::Fail, None),
    ];
    let team = Parallel::new(config(agents, ErrorMode::BestEffort, Merge::Outputs)).expect("valid");
    let (_, _, ended) = run(&team.program(), "all-failed", work("x")).await;
    let failure = failure_of(&ended);
    assert_eq!(failure.code(), ALL_FAILED);
    assert!(
        failure
            .message
            .contains("a: test.agent.failed: agent a failed on purpose")
            && failure
                .message
                .contains("b: test.agent.failed: agent b failed on purpose"),
        "{failure}"
    );
}

#[test]
fn a_zero_concurrency_is_refused() {
    let mut config = config(
        vec![program_agent("a", Behaviour::Echo, None)],
        ErrorMode::FailFast,
        Merge::Outputs,
    );
    config.max_concurrency = 0;
    let error = Parallel::new(config).expect_err("refused");
    assert_eq!(error.code(), "strategy.parallel.zero_concurrency");
}

#[tokio::test]
async fn a_crash_at_any_commit_resumes_to_the_same_output_without_repeating_a_model_call() {
    let crashes = crash_everywhere(reviewers, answer, "the diff").await;
    assert!(crashes >= 15, "{crashes} crashes checked");
}

#[tokio::test]
async fn usage_by_agent_sums_exactly_to_what_the_models_reported() {
    // Each agent's model reports its own usage; the merger reports 50 in, 5 out.
    let usage_of = |request: &Request| -> baton_agent::Usage {
        let (input, output) = match system(request).as_str() {
            "You are security." => (11, 1),
            "You are style." => (12, 2),
            "You are tests." => (13, 3),
            "You are docs." => (14, 4),
            _ => (50, 5),
        };
        baton_agent::Usage {
            input_tokens: input,
            output_tokens: output,
            ..baton_agent::Usage::default()
        }
    };
    let models =
        Models::new(move |request| answer(request).map(|r| r.with_usage(usage_of(request))));
    let (engine, handle, ended) = run(&reviewers(&models), "usage", work("the diff")).await;
    assert_eq!(ended.status(), Status::Completed, "{ended:?}");
    let view = engine
        .inspect(&scope(), handle.tree(), baton_run::Visibility::Public)
        .await
        .expect("inspects");
    let report = view.usage();
    let meter = |usage: &baton_run::Usage, name: &str| {
        usage
            .meters
            .get(&baton_run::Name::new(name).expect("valid"))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(
        meter(&report.total, baton_agent::TOKENS_IN),
        11 + 12 + 13 + 14 + 50
    );
    assert_eq!(
        meter(&report.total, baton_agent::TOKENS_OUT),
        1 + 2 + 3 + 4 + 5
    );
    assert_eq!(meter(&report.total, baton_agent::TOKENS), 100 + 15);
    // Each model call is charged to the process that made it, once.
    let mut per_call: Vec<u64> = report
        .processes
        .iter()
        .map(|row| meter(&row.own, baton_agent::TOKENS_IN))
        .filter(|tokens| *tokens > 0)
        .collect();
    per_call.sort_unstable();
    assert_eq!(per_call, vec![11, 12, 13, 14, 50]);
    // The roll-ups agree with the rows: the root's subtree is the whole
    // tree, and the programs together are the total.
    assert_eq!(report.processes[0].subtree, report.total);
    let by_program: u64 = report
        .programs
        .values()
        .map(|program| meter(&program.usage, baton_agent::TOKENS_IN))
        .sum();
    assert_eq!(by_program, 100);
    let steps: u64 = report.processes.iter().map(|row| row.own.steps).sum();
    assert_eq!(steps, report.total.steps);
    let named = report
        .processes
        .iter()
        .find(|row| meter(&row.own, baton_agent::TOKENS_IN) == 11)
        .expect("the security agent's call");
    assert!(!named.path.is_empty(), "a worker sits below the root");
}

#[tokio::test]
async fn the_agent_stream_shows_every_reviewer_and_one_completion() {
    let models = Models::new(answer);
    let (engine, handle, _) = run(&reviewers(&models), "stream", work("the diff")).await;
    let events = agent_stream(&engine, handle.tree()).await;
    assert!(started_agents(&events).len() >= 2, "{events:#?}");
    assert!(matches!(
        events.last(),
        Some(baton_agent::AgentEvent::Complete { .. })
    ));
}
