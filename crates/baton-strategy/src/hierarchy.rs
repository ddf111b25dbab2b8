//! Hierarchy: supervisors over workers and sub-teams, nested to any depth.
//! Each supervisor is a team of its own: it delegates to the children its
//! delegation names (every child, a pure function's choice, or a model's
//! plan), every one of them runs, concurrently, and their results flow back
//! up as the level's output. A sub-team is a child like a worker: its
//! output is its own level's output.
//!
//! The seed's hierarchy ran as a graph that followed only the first edge
//! out of a supervisor, so only the first worker ever ran; here each named
//! child is a task of the supervisor's team.

use std::collections::BTreeSet;

use baton_run::{Failure, FailureKind, Name, Payload, Program};
use baton_team::{Binding, Decision, Turn};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::driver::{self, Next, Rule, Start, TurnView};
use crate::model::{Helper, ModelConfig};
use crate::pure::Pure;
use crate::roster::Roster;
use crate::{Agent, AgentCard, AgentId, AgentInput, AgentResult, ConfigError, Outcome, Work};

/// The delegation named a child the supervisor does not have (kind
/// `contract`).
pub const UNKNOWN_CHILD: &str = "strategy.hierarchy.unknown_child";
/// The delegation named a child twice (kind `contract`).
pub const DUPLICATE_CHILD: &str = "strategy.hierarchy.duplicate_child";
/// A delegated child failed; its kind is the child's failure's kind and
/// the message names the supervisor and the child.
pub const CHILD_FAILED: &str = "strategy.hierarchy.child_failed";
/// The supervisor's model failed or answered something other than the
/// JSON asked for.
pub const MODEL_FAILED: &str = "strategy.hierarchy.model_failed";

/// What a supervisor's delegation is given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DelegationRequest {
    /// The level's task.
    pub task: Payload,
    /// The supervisor's children: its workers, then its sub-teams.
    pub children: Vec<AgentCard>,
}

/// One child's share of the work.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Assignment {
    /// The child's id.
    pub child: String,
    /// Its task (a sub-team works on it as its own task).
    pub task: Payload,
}

/// A supervisor model's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Delegations {
    /// The assignments; every child named runs.
    pub assignments: Vec<ModelAssignment>,
}

/// One assignment as a model writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelAssignment {
    /// The child's id.
    pub child: String,
    /// What it should do.
    pub task: String,
}

/// How a supervisor chooses its children's work.
#[derive(Clone, Debug, Default)]
pub enum Delegation {
    /// Every child gets the level's task.
    #[default]
    All,
    /// A pure function of the [`DelegationRequest`] assigns the work.
    Pure(Pure<DelegationRequest, Vec<Assignment>>),
    /// A model reads the [`DelegationRequest`] and answers
    /// [`Delegations`], as one more task of the level's team, `delegate`.
    Model(ModelConfig),
}

/// One supervisor of the hierarchy, with its workers and sub-teams.
#[derive(Clone, Debug)]
pub struct Supervisor {
    /// Its id (unique in the whole hierarchy, like every agent's).
    pub id: String,
    /// Its name.
    pub name: String,
    /// What its team does.
    pub description: String,
    /// How it delegates.
    pub delegation: Delegation,
    /// Its workers.
    pub workers: Vec<Agent>,
    /// Its sub-teams.
    pub teams: Vec<Supervisor>,
}

/// How to build a [`Hierarchy`]. Validated once by [`Hierarchy::new`].
#[derive(Clone, Debug)]
pub struct HierarchyConfig {
    /// The root team's descriptor name (lowercase dotted); a sub-team is
    /// `<name>.l<path>`, its path the positions of its supervisors among
    /// their siblings' sub-teams (`<name>.l1`, `<name>.l1_2`, …).
    pub name: String,
    /// What the hierarchy does.
    pub description: String,
    /// The root supervisor.
    pub root: Supervisor,
}

/// A level's output: its supervisor and its children's results, in the
/// order the delegation named them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LevelOutput {
    /// The supervisor.
    pub supervisor: AgentId,
    /// Each delegated child's result (a sub-team's is its `LevelOutput`).
    pub results: Vec<AgentResult>,
}

/// The hierarchy bound as nested teams.
#[derive(Clone, Debug)]
pub struct Hierarchy {
    program: Program<Work, LevelOutput>,
    coordinators: Vec<Program<Turn, Decision>>,
}

impl Hierarchy {
    /// Validates the whole tree (unique ids, no supervisor without
    /// children) and binds every level, deepest first.
    pub fn new(config: HierarchyConfig) -> Result<Hierarchy, ConfigError> {
        let mut ids = BTreeSet::new();
        let mut coordinators = Vec::new();
        let program = level(
            &config.root,
            Place {
                root: &config.name,
                path: String::new(),
                description: &config.description,
            },
            &mut ids,
            &mut coordinators,
        )?;
        coordinators.reverse();
        Ok(Hierarchy {
            program,
            coordinators,
        })
    }

    /// The root team program: start it with [`Work`].
    pub fn program(&self) -> Program<Work, LevelOutput> {
        self.program.clone()
    }

    /// Every level's coordinator, the root's first.
    pub fn coordinators(&self) -> &[Program<Turn, Decision>] {
        &self.coordinators
    }
}

const DELEGATE_PROMPT: &str = "You supervise a team. \
The user message is a JSON object with the task and your children (id, name, description, capabilities). \
Answer with a JSON object {\"assignments\": [{\"child\": \"<id>\", \"task\": \"...\"}]} \
naming each child that should work on the task, with what it should do; every child you name runs.";

#[derive(Serialize)]
struct Settings<'a> {
    supervisor: &'a str,
    delegation: &'static str,
    teams: &'a BTreeSet<usize>,
}

fn claim(ids: &mut BTreeSet<String>, id: &str) -> Result<(), ConfigError> {
    AgentId::new(id)?;
    if !ids.insert(id.to_owned()) {
        return Err(ConfigError::DuplicateAgent { id: id.to_owned() });
    }
    Ok(())
}

/// Where a level sits: the root's name and the level's path below it.
struct Place<'a> {
    root: &'a str,
    /// Empty for the root; `1`, `1_2`, … below it.
    path: String,
    description: &'a str,
}

impl Place<'_> {
    fn name(&self) -> String {
        if self.path.is_empty() {
            self.root.to_owned()
        } else {
            format!("{}.l{}", self.root, self.path)
        }
    }

    fn below(&self, position: usize) -> String {
        if self.path.is_empty() {
            format!("{}", position + 1)
        } else {
            format!("{}_{}", self.path, position + 1)
        }
    }
}

/// Binds one supervisor's level (its sub-teams first).
fn level(
    supervisor: &Supervisor,
    place: Place<'_>,
    ids: &mut BTreeSet<String>,
    coordinators: &mut Vec<Program<Turn, Decision>>,
) -> Result<Program<Work, LevelOutput>, ConfigError> {
    let name = place.name();
    let name = name.as_str();
    claim(ids, &supervisor.id)?;
    if supervisor.workers.is_empty() && supervisor.teams.is_empty() {
        return Err(ConfigError::EmptySupervisor {
            id: supervisor.id.clone(),
        });
    }
    let mut children = Vec::new();
    for worker in &supervisor.workers {
        claim(ids, worker.id().as_str())?;
        children.push(worker.clone());
    }
    let mut teams = BTreeSet::new();
    for (position, team) in supervisor.teams.iter().enumerate() {
        let below = Place {
            root: place.root,
            path: place.below(position),
            description: &team.description,
        };
        let program = level(team, below, ids, coordinators)?;
        teams.insert(children.len());
        children.push(
            Agent::program(&team.id, &program)?
                .named(team.name.clone())
                .described(team.description.clone()),
        );
    }
    let mut builds = Vec::new();
    let mut helpers = Vec::new();
    let (delegating, kind) = match &supervisor.delegation {
        Delegation::All => (Delegating::All, "all"),
        Delegation::Pure(function) => {
            builds.push(function.checked("the delegation")?.to_owned());
            (Delegating::Pure(function.clone()), "pure")
        }
        Delegation::Model(model) => {
            let program = Helper {
                name: format!("{name}.delegate"),
                description: "Assign the team's work to its children.",
                system: DELEGATE_PROMPT,
                model,
                temperature: None,
            }
            .program::<DelegationRequest, Delegations>()?;
            let helper = program.descriptor().name().clone();
            helpers.push(Binding::new(&program));
            (Delegating::Model(helper), "model")
        }
    };
    let roster = Roster::new(children)?;
    let settings = Payload::encode(&Settings {
        supervisor: &supervisor.id,
        delegation: kind,
        teams: &teams,
    })?;
    let count = roster.len() as u64;
    let bound = driver::Team {
        name: name.to_owned(),
        description: place.description.to_owned(),
        roster,
        helpers,
        rule: Level {
            supervisor: AgentId::new(supervisor.id.as_str())?,
            delegating,
            teams,
        },
        settings,
        builds,
        max_tasks: count + 1,
        max_concurrent: count as u32,
    }
    .bind()?;
    coordinators.push(bound.coordinator.program());
    Ok(bound.program)
}

enum Delegating {
    All,
    Pure(Pure<DelegationRequest, Vec<Assignment>>),
    Model(Name),
}

struct Level {
    supervisor: AgentId,
    delegating: Delegating,
    /// Roster positions of the sub-teams (they take [`Work`]).
    teams: BTreeSet<usize>,
}

const DELEGATE_KEY: &str = "delegate";

fn child_key(index: usize) -> String {
    format!("child.{}", index + 1)
}

impl Level {
    /// The assignments, or `None` while the supervisor's model decides.
    fn assignments(
        &self,
        view: &TurnView<'_>,
        roster: &Roster,
    ) -> Result<Option<Vec<Assignment>>, Failure> {
        let request = || DelegationRequest {
            task: view.task.clone(),
            children: roster.cards(),
        };
        match &self.delegating {
            Delegating::All => Ok(Some(
                roster
                    .agents()
                    .iter()
                    .map(|agent| Assignment {
                        child: agent.id().to_string(),
                        task: view.task.clone(),
                    })
                    .collect(),
            )),
            Delegating::Pure(function) => function.call(&request()).map(Some),
            Delegating::Model(_) => match view.get(DELEGATE_KEY).map(|fact| fact.result()) {
                None | Some(None) => Ok(None),
                Some(Some(Err(cause))) => Err(driver::agent_failed(
                    Self::STRATEGY,
                    "model_failed",
                    format!("supervisor {}'s model", self.supervisor),
                    cause,
                )),
                Some(Some(Ok(answer))) => {
                    let answer: Delegations = answer.decode().map_err(|error| {
                        driver::failure(
                            Self::STRATEGY,
                            "model_failed",
                            FailureKind::Contract,
                            error.to_string(),
                        )
                    })?;
                    answer
                        .assignments
                        .into_iter()
                        .map(|assignment| {
                            Ok(Assignment {
                                child: assignment.child,
                                task: driver::encode(&assignment.task)?,
                            })
                        })
                        .collect::<Result<Vec<_>, Failure>>()
                        .map(Some)
                }
            },
        }
    }
}

impl Rule for Level {
    const STRATEGY: &'static str = "hierarchy";

    fn next(&self, view: &TurnView<'_>, roster: &Roster) -> Result<Next, Failure> {
        if let Delegating::Model(helper) = &self.delegating
            && view.get(DELEGATE_KEY).is_none()
        {
            let request = DelegationRequest {
                task: view.task.clone(),
                children: roster.cards(),
            };
            return Ok(Next::Start(vec![Start::helper(
                DELEGATE_KEY,
                helper,
                &request,
            )?]));
        }
        let Some(assignments) = self.assignments(view, roster)? else {
            return Ok(Next::Wait);
        };
        let mut named = BTreeSet::new();
        let mut children = Vec::with_capacity(assignments.len());
        for assignment in &assignments {
            let index = roster.index_of(&assignment.child).ok_or_else(|| {
                driver::failure(
                    Self::STRATEGY,
                    "unknown_child",
                    FailureKind::Contract,
                    format!(
                        "supervisor {} delegated to {:?}, which is not one of its children",
                        self.supervisor, assignment.child
                    ),
                )
            })?;
            if !named.insert(index) {
                return Err(driver::failure(
                    Self::STRATEGY,
                    "duplicate_child",
                    FailureKind::Contract,
                    format!(
                        "supervisor {} delegated to {} twice",
                        self.supervisor, assignment.child
                    ),
                ));
            }
            children.push(index);
        }
        let mut starts = Vec::new();
        for (assignment, index) in assignments.iter().zip(&children) {
            if view.get(&child_key(*index)).is_none() {
                let input = if self.teams.contains(index) {
                    driver::encode(&Work::of(assignment.task.clone()))?
                } else {
                    driver::encode(&AgentInput::task(assignment.task.clone()))?
                };
                starts.push(Start::agent(child_key(*index), *index, input));
            }
        }
        if !starts.is_empty() {
            return Ok(Next::Start(starts));
        }
        let mut results = Vec::with_capacity(children.len());
        for index in &children {
            let agent = roster.get(*index).id();
            match view.get(&child_key(*index)).and_then(|fact| fact.result()) {
                None => return Ok(Next::Wait),
                Some(Err(cause)) => {
                    return Err(driver::agent_failed(
                        Self::STRATEGY,
                        "child_failed",
                        format!("child {agent} of supervisor {}", self.supervisor),
                        cause,
                    ));
                }
                Some(Ok(output)) => results.push(AgentResult {
                    agent: agent.clone(),
                    outcome: Outcome::Succeeded {
                        output: output.clone(),
                    },
                }),
            }
        }
        Ok(Next::Complete(driver::encode(&LevelOutput {
            supervisor: self.supervisor.clone(),
            results,
        })?))
    }
}
