//! Hierarchy: three levels and seven leaf workers all run exactly once;
//! delegation by model, pure function and to every child; results flow
//! up; failure codes, construction rules, conformance and crashes.

use baton_agent::{ModelError, Request, Response};
use baton_run::{Failure, Payload, Program};
use baton_strategy::hierarchy::{
    Assignment, CHILD_FAILED, DUPLICATE_CHILD, Delegation, DelegationRequest, LevelOutput,
    Supervisor, UNKNOWN_CHILD,
};
use baton_strategy::{Agent, Hierarchy, HierarchyConfig, Pure, Work};
use baton_testkit::definition_conformance;
use serde_json::json;

use crate::common::*;

/// Supervisors name every child, with the task prefixed by the child's id,
/// unless the task asks otherwise.
fn answer(request: &Request) -> Result<Response, ModelError> {
    if system(request).starts_with("You supervise a team") {
        let request: DelegationRequest = Payload::parse_str(&last_user(request))
            .and_then(|p| p.decode())
            .map_err(|e| ModelError::Malformed(e.to_string()))?;
        let task: String = request.task.decode().unwrap_or_default();
        let ids: Vec<String> = request.children.iter().map(|c| c.id.to_string()).collect();
        let named: Vec<String> = match task.as_str() {
            "unknown" => vec!["ghost".into()],
            "twice" => vec![ids[0].clone(), ids[0].clone()],
            "only first" => vec![ids[0].clone()],
            _ => ids,
        };
        let assignments: Vec<_> = named
            .iter()
            .map(|child| json!({ "child": child, "task": format!("{child}: {task}") }))
            .collect();
        return Ok(Response::text(
            json!({ "assignments": assignments }).to_string(),
        ));
    }
    echo(request).ok_or_else(|| ModelError::Malformed("not an agent's request".into()))
}

fn supervisor(
    id: &str,
    delegation: Delegation,
    workers: Vec<Agent>,
    teams: Vec<Supervisor>,
) -> Supervisor {
    Supervisor {
        id: id.into(),
        name: format!("The {id}"),
        description: format!("The {id}'s team."),
        delegation,
        workers,
        teams,
    }
}

/// Three levels, seven leaf workers: the ceo (a model) over w1, w2 and two
/// teams: eng (everyone) over w3, w4 and infra (a pure function) over w5;
/// ops (a model) over w6, w7.
fn company(models: &Models) -> Hierarchy {
    let every = Pure::new("test every child 1", |request: &DelegationRequest| {
        Ok(request
            .children
            .iter()
            .map(|child| Assignment {
                child: child.id.to_string(),
                task: request.task.clone(),
            })
            .collect())
    });
    let w = |id: &str| echo_agent(models, id);
    let infra = supervisor("infra", Delegation::Pure(every), vec![w("w5")], vec![]);
    let eng = supervisor("eng", Delegation::All, vec![w("w3"), w("w4")], vec![infra]);
    let ops = supervisor(
        "ops",
        Delegation::Model(models.config("ops")),
        vec![w("w6"), w("w7")],
        vec![],
    );
    let ceo = supervisor(
        "ceo",
        Delegation::Model(models.config("ceo")),
        vec![w("w1"), w("w2")],
        vec![eng, ops],
    );
    Hierarchy::new(HierarchyConfig {
        name: "test.company".into(),
        description: "A company.".into(),
        root: ceo,
    })
    .expect("valid")
}

fn program(models: &Models) -> Program<Work, LevelOutput> {
    company(models).program()
}

fn level(payload: &Payload) -> LevelOutput {
    payload.decode().expect("a level's output")
}

#[tokio::test]
async fn three_levels_and_seven_leaf_workers_all_run_exactly_once_and_results_flow_up() {
    let models = Models::new(answer);
    let company = company(&models);
    let (engine, handle, ended) =
        run(&company.program(), "company", work("plan the quarter")).await;
    let root = level(ended.output().expect("completed"));
    assert_eq!(root.supervisor.as_str(), "ceo");
    let children: Vec<&str> = root.results.iter().map(|r| r.agent.as_str()).collect();
    assert_eq!(children, ["w1", "w2", "eng", "ops"]);
    assert_eq!(
        root.results[0].outcome.output(),
        Some(&payload(&"w1 did w1: plan the quarter"))
    );
    let eng = level(root.results[2].outcome.output().expect("eng succeeded"));
    let infra = level(eng.results[2].outcome.output().expect("infra succeeded"));
    assert_eq!(infra.supervisor.as_str(), "infra");
    assert_eq!(
        infra.results[0].outcome.output(),
        Some(&payload(&"w5 did eng: plan the quarter"))
    );
    let ops = level(root.results[3].outcome.output().expect("ops succeeded"));
    assert_eq!(
        ops.results[1].outcome.output(),
        Some(&payload(&"w7 did w7: ops: plan the quarter"))
    );
    let calls = models.calls();
    for worker in ["w1", "w2", "w3", "w4", "w5", "w6", "w7"] {
        assert_eq!(
            calls.get(worker),
            Some(&1),
            "{worker} ran exactly once: {calls:?}"
        );
    }
    assert_eq!((calls["ceo"], calls["ops"]), (1, 1));
    let view = handle.inspect().await.expect("inspects");
    let leaves = view
        .processes
        .iter()
        .filter(|p| p.program.as_str().starts_with("agent.w"))
        .count();
    assert_eq!(leaves, 7);
    // Every level's coordinator keeps the definition contract on the turns
    // it was given.
    assert_eq!(company.coordinators().len(), 4);
    for coordinator in company.coordinators() {
        let name = coordinator.descriptor().name().to_string();
        let turns = turns_of(&engine, handle.tree(), &name).await;
        assert!(turns.len() >= 2, "{name}: {} turns", turns.len());
        let checked =
            definition_conformance(coordinator.definition().as_ref(), &turn_cases(&turns));
        assert_eq!(checked, turns.len(), "{name}");
    }
}

#[tokio::test]
async fn only_the_children_the_delegation_names_run_and_bad_delegations_are_classified() {
    let models = Models::new(answer);
    let (_, _, ended) = run(&program(&models), "first", work("only first")).await;
    let root = level(ended.output().expect("completed"));
    assert_eq!(root.results.len(), 1);
    assert_eq!(models.calls()["w2"], 0);
    for (task, code) in [("unknown", UNKNOWN_CHILD), ("twice", DUPLICATE_CHILD)] {
        let models = Models::new(answer);
        let (_, _, ended) = run(&program(&models), task, work(task)).await;
        assert_eq!(failure_of(&ended).code(), code, "{task}");
        assert_eq!(models.calls()["w1"], 0, "{task}: nothing was delegated");
    }
}

#[tokio::test]
async fn a_failing_child_fails_its_level_and_every_level_above() {
    let models = Models::new(answer);
    let broken = supervisor(
        "eng",
        Delegation::All,
        vec![
            echo_agent(&models, "w3"),
            program_agent("w4", Behaviour::Fail, None),
        ],
        vec![],
    );
    let ceo = supervisor(
        "ceo",
        Delegation::All,
        vec![echo_agent(&models, "w1")],
        vec![broken],
    );
    let hierarchy = Hierarchy::new(HierarchyConfig {
        name: "test.broken".into(),
        description: "Broken.".into(),
        root: ceo,
    })
    .expect("valid");
    let (_, _, ended) = run(&hierarchy.program(), "broken", work("go")).await;
    let failure = failure_of(&ended);
    assert_eq!(failure.code(), CHILD_FAILED);
    assert!(
        failure.message.contains("child eng of supervisor ceo failed: strategy.hierarchy.child_failed: child w4 of supervisor eng failed: test.agent.failed"),
        "{failure}"
    );
}

#[test]
fn empty_supervisors_and_repeated_ids_are_refused() {
    let models = Models::new(answer);
    let build = |root: Supervisor| {
        Hierarchy::new(HierarchyConfig {
            name: "test.rules".into(),
            description: "Rules.".into(),
            root,
        })
        .map(|_| ())
        .map_err(|e| e.code())
    };
    let empty = supervisor("lead", Delegation::All, vec![], vec![]);
    assert_eq!(
        build(supervisor(
            "ceo",
            Delegation::All,
            vec![echo_agent(&models, "w1")],
            vec![empty]
        )),
        Err("strategy.hierarchy.empty_supervisor")
    );
    let again = supervisor(
        "eng",
        Delegation::All,
        vec![program_agent("w1", Behaviour::Echo, None)],
        vec![],
    );
    assert_eq!(
        build(supervisor(
            "ceo",
            Delegation::All,
            vec![echo_agent(&models, "w1")],
            vec![again]
        )),
        Err("strategy.roster.duplicate_agent")
    );
    let failing = Pure::new("", |_: &DelegationRequest| {
        Err(Failure::execution("x", "y"))
    });
    assert_eq!(
        build(supervisor(
            "ceo",
            Delegation::Pure(failing),
            vec![echo_agent(&models, "w1")],
            vec![]
        )),
        Err("strategy.config.build")
    );
}

#[tokio::test]
async fn a_crash_at_any_commit_resumes_to_the_same_output_without_repeating_a_model_call() {
    let crashes = crash_everywhere(program, answer, "plan the quarter").await;
    assert!(crashes >= 15, "{crashes} crashes checked");
}

#[tokio::test]
async fn the_agent_stream_shows_every_level_and_leaf_and_one_completion() {
    let models = Models::new(answer);
    let (engine, handle, _) = run(
        &company(&models).program(),
        "stream",
        work("plan the quarter"),
    )
    .await;
    let events = agent_stream(&engine, handle.tree()).await;
    assert!(started_agents(&events).len() >= 7, "{events:#?}");
    assert!(matches!(
        events.last(),
        Some(baton_agent::AgentEvent::Complete { .. })
    ));
}
