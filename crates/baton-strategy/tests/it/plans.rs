//! Random plans: a plan is accepted exactly when it is a DAG over known
//! agents within the limits, and every accepted plan runs each task only
//! after all of its dependencies completed (in the schedule, and through
//! the engine).

use std::collections::{BTreeMap, BTreeSet};

use baton_agent::{ModelError, Request, Response};
use baton_strategy::planner::{Plan, PlanTask, PlannerOutput, validate};
use baton_strategy::{Planner, PlannerConfig};
use baton_team::Turn;
use proptest::prelude::*;
use serde_json::json;

use crate::common::*;

const AGENTS: [&str; 3] = ["a", "b", "c"];
const LIMIT: u32 = 6;

/// The reference rule, written independently of the validator: valid
/// unique keys, known agents, dependencies within the plan, no cycle (by
/// depth-first search), at most `LIMIT` tasks.
fn acceptable(plan: &Plan) -> bool {
    if plan.tasks.len() > LIMIT as usize {
        return false;
    }
    let mut keys = BTreeMap::new();
    for task in &plan.tasks {
        let key_ok = !task.key.is_empty()
            && task.key.len() <= 64
            && task
                .key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !key_ok
            || keys.insert(task.key.clone(), task).is_some()
            || !AGENTS.contains(&task.agent.as_str())
        {
            return false;
        }
    }
    if plan
        .tasks
        .iter()
        .any(|t| t.depends_on.iter().any(|d| !keys.contains_key(d)))
    {
        return false;
    }
    fn cyclic<'a>(
        key: &'a str,
        keys: &BTreeMap<String, &'a PlanTask>,
        path: &mut BTreeSet<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> bool {
        if done.contains(key) {
            return false;
        }
        if !path.insert(key) {
            return true;
        }
        let task = keys[key];
        let found = task.depends_on.iter().any(|d| cyclic(d, keys, path, done));
        path.remove(key);
        done.insert(key);
        found
    }
    let mut done = BTreeSet::new();
    !plan
        .tasks
        .iter()
        .any(|t| cyclic(&t.key, &keys, &mut BTreeSet::new(), &mut done))
}

/// Plans of up to 8 tasks with keys, agents and dependencies drawn from
/// small pools, so duplicates, bad keys, strangers, missing dependencies
/// and cycles all occur.
fn any_plan() -> impl Strategy<Value = Plan> {
    let key = prop_oneof![
        8 => (0..6u8).prop_map(|i| format!("k{i}")),
        1 => Just("bad key".to_owned()),
        1 => Just(String::new()),
    ];
    let agent =
        prop_oneof![6 => (0..3usize).prop_map(|i| AGENTS[i].to_owned()), 1 => Just("x".to_owned())];
    let dependency = (0..7u8).prop_map(|i| format!("k{i}"));
    let task = (key, agent, prop::collection::vec(dependency, 0..3)).prop_map(
        |(key, agent, depends_on)| PlanTask {
            key,
            agent,
            input: "do".into(),
            depends_on,
        },
    );
    prop::collection::vec(task, 0..8).prop_map(|tasks| Plan { tasks })
}

/// Valid plans: unique keys, known agents, dependencies on earlier tasks
/// only, listed in a shuffled order.
fn dag() -> impl Strategy<Value = Plan> {
    (1..=LIMIT as usize)
        .prop_flat_map(|n| {
            let tasks: Vec<_> = (0..n)
                .map(|i| {
                    (
                        0..3usize,
                        prop::collection::btree_set(0..n.max(1), 0..3).prop_map(move |deps| {
                            deps.into_iter().filter(|d| *d < i).collect::<Vec<_>>()
                        }),
                    )
                })
                .collect();
            (tasks, Just((0..n).collect::<Vec<usize>>()).prop_shuffle())
        })
        .prop_map(|(tasks, order)| Plan {
            tasks: order
                .into_iter()
                .map(|i| {
                    let (agent, deps) = &tasks[i];
                    PlanTask {
                        key: format!("t{i}"),
                        agent: AGENTS[*agent].to_owned(),
                        input: format!("step {i}"),
                        depends_on: deps.iter().map(|d| format!("t{d}")).collect(),
                    }
                })
                .collect(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn a_plan_is_accepted_exactly_when_it_is_a_dag_over_known_agents_within_limits(plan in any_plan()) {
        let result = validate(&plan, &AGENTS, LIMIT);
        prop_assert_eq!(result.is_ok(), acceptable(&plan), "{:?}", result);
    }

    #[test]
    fn the_schedule_starts_each_task_once_and_only_after_its_dependencies(plan in dag(), picks in prop::collection::vec(0..8usize, 0..16)) {
        let schedule = validate(&plan, &AGENTS, LIMIT).expect("a DAG over known agents is accepted");
        let n = plan.tasks.len();
        let position: BTreeMap<&str, usize> = plan.tasks.iter().enumerate().map(|(i, t)| (t.key.as_str(), i)).collect();
        let (mut started, mut completed) = (vec![false; n], vec![false; n]);
        let mut running = Vec::new();
        let mut picks = picks.into_iter().cycle();
        while completed.iter().any(|c| !c) {
            for index in schedule.ready(&started, &completed) {
                prop_assert!(!started[index], "started twice");
                for dependency in &plan.tasks[index].depends_on {
                    prop_assert!(completed[position[dependency.as_str()]], "{} started before {}", plan.tasks[index].key, dependency);
                }
                started[index] = true;
                running.push(index);
            }
            prop_assert!(!running.is_empty(), "nothing runs and nothing is ready");
            let pick = picks.next().unwrap_or(0) % running.len();
            completed[running.remove(pick)] = true;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn through_the_engine_every_task_starts_after_its_dependencies_completed(plan in dag()) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
        runtime.block_on(async {
            let planned = json!({ "tasks": plan.tasks }).to_string();
            let models = Models::new(move |request: &Request| -> Result<Response, ModelError> {
                if system(request).starts_with("You plan") {
                    Ok(Response::text(planned.clone()))
                } else {
                    Ok(Response::text(json!({ "answer": "done" }).to_string()))
                }
            });
            let team = Planner::new(PlannerConfig {
                name: "test.dag".into(),
                description: "Random plans.".into(),
                agents: AGENTS.iter().map(|id| program_agent(id, Behaviour::Echo, None)).collect(),
                model: models.config("planner"),
                max_tasks: LIMIT,
                max_iterations: 1,
            })
            .expect("valid");
            let (engine, handle, ended) = run(&team.program(), "dag", work("random")).await;
            let output: PlannerOutput = ended.output().expect("completed").decode().expect("decodes");
            assert_eq!(output.tasks.len(), plan.tasks.len());
            let turns: Vec<Turn> = recorded_turns(&engine, handle.tree())
                .await
                .iter()
                .map(|t| t.decode().expect("a turn"))
                .collect();
            for task in &plan.tasks {
                let key = format!("task.1.{}", task.key);
                let first = turns.iter().position(|t| t.task(&key).is_some()).expect("every task ran");
                let before = &turns[first - 1];
                for dependency in &task.depends_on {
                    let needed = before.task(&format!("task.1.{dependency}")).expect("the dependency started first");
                    assert!(needed.outcome.is_some(), "{key} started before {dependency} completed");
                }
            }
        });
    }
}
