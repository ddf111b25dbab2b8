//! A plan, validated whole: keys, agents, dependencies, acyclicity and the
//! task limit; and the schedule of a valid plan (what may start once which
//! tasks completed).

use std::collections::{BTreeMap, BTreeSet};

use baton_run::Failure;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A plan as the planning model writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// The tasks, in any order.
    pub tasks: Vec<PlanTask>,
}

/// One task of a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanTask {
    /// The task's key, unique in the plan: 1 to 64 characters from
    /// `A-Z a-z 0-9 - _`.
    pub key: String,
    /// The id of the agent that does it.
    pub agent: String,
    /// What the agent should do.
    pub input: String,
    /// Keys of the tasks whose outputs it needs; it starts once they all
    /// completed.
    #[serde(default)]
    pub depends_on: Vec<String>,
}

/// Why a plan was refused. Nothing of a refused plan starts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// More tasks than the limit.
    #[error("the plan has {count} tasks, over the limit of {limit}")]
    TooManyTasks {
        /// How many it has.
        count: usize,
        /// The limit.
        limit: u32,
    },
    /// A key breaks the key rule.
    #[error("task key {key:?} is not 1 to 64 characters from A-Z a-z 0-9 - _")]
    InvalidKey {
        /// The key.
        key: String,
    },
    /// Two tasks share a key.
    #[error("task key {key} is used twice")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// A task names an agent outside the roster.
    #[error("task {key} names agent {agent:?}, which is not in the roster")]
    UnknownAgent {
        /// The task.
        key: String,
        /// The agent it names.
        agent: String,
    },
    /// A task depends on a key the plan does not have.
    #[error("task {key} depends on {dependency:?}, which is not a task of the plan")]
    UnknownDependency {
        /// The task.
        key: String,
        /// The missing key.
        dependency: String,
    },
    /// The dependencies form a cycle (a task depending on itself
    /// included).
    #[error("the dependencies of tasks {} form a cycle", keys.join(", "))]
    Cycle {
        /// The tasks on or behind a cycle, in plan order.
        keys: Vec<String>,
    },
}

impl PlanError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            PlanError::TooManyTasks { .. } => "strategy.planner.too_many_tasks",
            PlanError::InvalidKey { .. } => "strategy.planner.invalid_key",
            PlanError::DuplicateKey { .. } => "strategy.planner.duplicate_key",
            PlanError::UnknownAgent { .. } => "strategy.planner.unknown_agent",
            PlanError::UnknownDependency { .. } => "strategy.planner.unknown_dependency",
            PlanError::Cycle { .. } => "strategy.planner.cycle",
        }
    }

    /// The failure a planner team fails with (kind `contract`).
    pub fn failure(&self) -> Failure {
        Failure::contract(self.code(), format!("invalid plan: {self}"))
    }
}

/// A valid plan: every key valid and unique, every agent known, every
/// dependency a task of the plan, no cycle, within the task limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    tasks: Vec<PlanTask>,
    /// Each task's dependencies, as indices, deduplicated and ascending.
    dependencies: Vec<Vec<usize>>,
}

fn valid_key(key: &str) -> bool {
    (1..=64).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Validates a plan whole against the roster's agent ids and the task
/// limit. The checks run in this order, and the first broken one is
/// reported: the limit; each task's key (valid, then new) and agent, in
/// plan order; each dependency, in plan order; cycles.
pub fn validate(plan: &Plan, agents: &[&str], max_tasks: u32) -> Result<Schedule, PlanError> {
    if plan.tasks.len() > max_tasks as usize {
        return Err(PlanError::TooManyTasks {
            count: plan.tasks.len(),
            limit: max_tasks,
        });
    }
    let mut index = BTreeMap::new();
    for (position, task) in plan.tasks.iter().enumerate() {
        if !valid_key(&task.key) {
            return Err(PlanError::InvalidKey {
                key: task.key.clone(),
            });
        }
        if index.insert(task.key.as_str(), position).is_some() {
            return Err(PlanError::DuplicateKey {
                key: task.key.clone(),
            });
        }
        if !agents.contains(&task.agent.as_str()) {
            return Err(PlanError::UnknownAgent {
                key: task.key.clone(),
                agent: task.agent.clone(),
            });
        }
    }
    let mut dependencies = Vec::with_capacity(plan.tasks.len());
    for task in &plan.tasks {
        let mut needs = BTreeSet::new();
        for dependency in &task.depends_on {
            let Some(position) = index.get(dependency.as_str()) else {
                return Err(PlanError::UnknownDependency {
                    key: task.key.clone(),
                    dependency: dependency.clone(),
                });
            };
            needs.insert(*position);
        }
        dependencies.push(needs.into_iter().collect::<Vec<_>>());
    }
    // Kahn's algorithm: what never becomes free of dependencies lies on or
    // behind a cycle.
    let mut missing: Vec<usize> = dependencies.iter().map(Vec::len).collect();
    let mut free: Vec<usize> = (0..missing.len()).filter(|i| missing[*i] == 0).collect();
    let mut seen = 0;
    while let Some(done) = free.pop() {
        seen += 1;
        for (task, needs) in dependencies.iter().enumerate() {
            if needs.contains(&done) {
                missing[task] -= 1;
                if missing[task] == 0 {
                    free.push(task);
                }
            }
        }
    }
    if seen < plan.tasks.len() {
        return Err(PlanError::Cycle {
            keys: (0..plan.tasks.len())
                .filter(|i| missing[*i] > 0)
                .map(|i| plan.tasks[i].key.clone())
                .collect(),
        });
    }
    Ok(Schedule {
        tasks: plan.tasks.clone(),
        dependencies,
    })
}

impl Schedule {
    /// The tasks, in plan order.
    pub fn tasks(&self) -> &[PlanTask] {
        &self.tasks
    }

    /// The positions of task `index`'s dependencies, ascending.
    pub fn dependencies(&self, index: usize) -> &[usize] {
        &self.dependencies[index]
    }

    /// The tasks that may start now, in plan order: not started yet, and
    /// every dependency completed. `started` and `completed` are indexed by
    /// plan position.
    pub fn ready(&self, started: &[bool], completed: &[bool]) -> Vec<usize> {
        (0..self.tasks.len())
            .filter(|i| !started.get(*i).copied().unwrap_or(false))
            .filter(|i| {
                self.dependencies[*i]
                    .iter()
                    .all(|d| completed.get(*d).copied().unwrap_or(false))
            })
            .collect()
    }
}
