//! Sequential: order, the previous output, input mapping, the first
//! failure, conformance and crashes.

use baton_agent::{ModelError, Request, Response};
use baton_run::{Failure, Payload, Program};
use baton_strategy::sequential::{AGENT_FAILED, SequentialOutput, StepContext};
use baton_strategy::{Pure, Sequential, SequentialConfig, Work};
use baton_testkit::definition_conformance;

use crate::common::*;

fn answer(request: &Request) -> Result<Response, ModelError> {
    echo(request).ok_or_else(|| ModelError::Malformed("not an agent's request".into()))
}

fn pipeline(models: &Models) -> Program<Work, SequentialOutput> {
    Sequential::new(SequentialConfig {
        name: "test.pipeline".into(),
        description: "Write, review and edit.".into(),
        agents: vec![
            echo_agent(models, "writer"),
            echo_agent(models, "reviewer"),
            echo_agent(models, "editor"),
        ],
        input: None,
    })
    .expect("valid")
    .program()
}

#[tokio::test]
async fn agents_run_in_order_each_given_the_task_and_the_previous_output() {
    let models = Models::new(answer);
    let (_, handle, ended) = run(&pipeline(&models), "order", work("release notes")).await;
    let output: SequentialOutput = ended
        .output()
        .expect("completed")
        .decode()
        .expect("decodes");
    let agents: Vec<&str> = output.steps.iter().map(|s| s.agent.as_str()).collect();
    assert_eq!(agents, ["writer", "reviewer", "editor"]);
    let texts: Vec<String> = output
        .steps
        .iter()
        .map(|s| {
            s.outcome
                .output()
                .expect("succeeded")
                .decode::<String>()
                .expect("text")
        })
        .collect();
    assert_eq!(texts[0], "writer did release notes");
    assert_eq!(
        texts[1],
        "reviewer did release notes\n\nFrom writer:\nwriter did release notes"
    );
    assert!(texts[2].starts_with("editor did release notes\n\nFrom reviewer:\nreviewer did"));
    assert_eq!(output.output, payload(&texts[2]));
    assert!(
        models.calls().values().all(|calls| *calls == 1),
        "{:?}",
        models.calls()
    );
    let view = handle.inspect().await.expect("inspects");
    assert_eq!(processes(&view)["agent.editor"], 1);
}

#[tokio::test]
async fn a_step_input_mapping_replaces_the_default_input() {
    let map = Pure::new("test mapping 1", |step: &StepContext| {
        let from = match &step.previous {
            Some(previous) => previous
                .output
                .decode::<String>()
                .map_err(|e| Failure::contract("test.mapping.invalid", e.to_string()))?,
            None => step
                .task
                .decode::<String>()
                .map_err(|e| Failure::contract("test.mapping.invalid", e.to_string()))?,
        };
        Payload::encode(&format!("step {} for {}: {from}", step.step, step.agent.id))
            .map_err(|e| Failure::contract("test.mapping.invalid", e.to_string()))
    });
    let team = Sequential::new(SequentialConfig {
        name: "test.mapped".into(),
        description: "Mapped steps.".into(),
        agents: vec![
            program_agent("a", Behaviour::Echo, None),
            program_agent("b", Behaviour::Echo, None),
        ],
        input: Some(map),
    })
    .expect("valid");
    let (_, _, ended) = run(&team.program(), "mapped", work("go")).await;
    let output: SequentialOutput = ended
        .output()
        .expect("completed")
        .decode()
        .expect("decodes");
    assert_eq!(
        output.output,
        payload(&"b saw \"step 2 for b: a saw \\\"step 1 for a: go\\\"\"")
    );
}

#[tokio::test]
async fn the_first_failure_stops_the_team_and_names_the_agent() {
    let team = Sequential::new(SequentialConfig {
        name: "test.failing".into(),
        description: "Stops at b.".into(),
        agents: vec![
            program_agent("a", Behaviour::Echo, None),
            program_agent("b", Behaviour::Fail, None),
            program_agent("c", Behaviour::Echo, None),
        ],
        input: None,
    })
    .expect("valid");
    let (_, handle, ended) = run(&team.program(), "failing", work("go")).await;
    let failure = failure_of(&ended);
    assert_eq!(failure.code(), AGENT_FAILED);
    assert!(
        failure.message.contains("agent b (step 2 of 3)")
            && failure.message.contains("test.agent.failed"),
        "{failure}"
    );
    let view = handle.inspect().await.expect("inspects");
    assert!(!processes(&view).contains_key("test.c"), "c never ran");
}

#[tokio::test]
async fn an_empty_roster_is_refused() {
    let error = Sequential::new(SequentialConfig {
        name: "test.empty".into(),
        description: "Nobody.".into(),
        agents: Vec::new(),
        input: None,
    })
    .expect_err("refused");
    assert_eq!(error.code(), "strategy.roster.empty");
}

#[tokio::test]
async fn the_coordinator_keeps_the_definition_contract() {
    let models = Models::new(answer);
    let team = Sequential::new(SequentialConfig {
        name: "test.pipeline".into(),
        description: "Write, review and edit.".into(),
        agents: vec![
            echo_agent(&models, "writer"),
            echo_agent(&models, "reviewer"),
            echo_agent(&models, "editor"),
        ],
        input: None,
    })
    .expect("valid");
    let (engine, handle, _) = run(&team.program(), "conformance", work("notes")).await;
    let turns = recorded_turns(&engine, handle.tree()).await;
    assert_eq!(turns.len(), 4, "one turn per step and one to complete");
    let checked = definition_conformance(
        team.coordinator().definition().as_ref(),
        &turn_cases(&turns),
    );
    assert_eq!(checked, 4);
}

#[tokio::test]
async fn a_crash_at_any_commit_resumes_to_the_same_output_without_repeating_a_model_call() {
    let crashes = crash_everywhere(pipeline, answer, "release notes").await;
    assert!(crashes >= 15, "{crashes} crashes checked");
}

#[tokio::test]
async fn the_agent_stream_shows_each_agent_in_order_and_one_completion() {
    let models = Models::new(answer);
    let (engine, handle, _) = run(&pipeline(&models), "stream", work("release notes")).await;
    let events = agent_stream(&engine, handle.tree()).await;
    assert_eq!(started_agents(&events).len(), 3, "{events:#?}");
    assert!(
        matches!(
            events.last(),
            Some(baton_agent::AgentEvent::Complete { output: Some(_) })
        ),
        "{events:#?}"
    );
}

#[tokio::test]
async fn a_failed_team_ends_its_agent_stream_with_one_error() {
    let team = Sequential::new(SequentialConfig {
        name: "test.failing".into(),
        description: "Stops at a.".into(),
        agents: vec![program_agent("a", Behaviour::Fail, None)],
        input: None,
    })
    .expect("valid");
    let (engine, handle, _) = run(&team.program(), "stream-failing", work("go")).await;
    let events = agent_stream(&engine, handle.tree()).await;
    match events.last() {
        Some(baton_agent::AgentEvent::Error {
            status,
            failure: Some(failure),
        }) => {
            assert_eq!(*status, baton_run::Status::Failed);
            assert_eq!(failure.code(), AGENT_FAILED);
        }
        other => panic!("expected an error at the end, got {other:?}"),
    }
}
