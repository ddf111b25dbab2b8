//! One scenario per team strategy, each on scripted models, each ending in
//! one result line: the programs `baton demo <scenario>` runs and the
//! workspace's SIGKILL test kills.
//!
//! Every model of every scenario answers with [`answer`], a pure function
//! of the request, so a host that lost a model call in a crash can resolve
//! it with exactly the answer the model would have given. Run one with
//! `cargo run -p baton-examples --example strategies -- NAME`.

use std::error::Error;
use std::sync::Arc;

use baton::agent::{ChatModel, ModelError, Request, Response, Role, ScriptedModel, ToolCall};
use baton::run::{Engine, EngineConfig, MemoryStore, Payload, Program, StartId, StartRequest};
use baton::strategy::hierarchy::{Delegation, DelegationRequest, LevelOutput, Supervisor};
use baton::strategy::parallel::{ErrorMode, Merge, MergeInput, ParallelOutput};
use baton::strategy::planner::{PlanRequest, PlannerOutput, SynthesisRequest};
use baton::strategy::router::{Choice, Route, RouteQuery, RouterOutput};
use baton::strategy::sequential::SequentialOutput;
use baton::strategy::swarm::{SwarmAgent, SwarmOutput, tool_name};
use baton::strategy::{
    Agent, Hierarchy, HierarchyConfig, ModelConfig, Parallel, ParallelConfig, Planner,
    PlannerConfig, Router, RouterConfig, Sequential, SequentialConfig, Swarm, SwarmConfig, Work,
};

/// The errors of this module.
pub type Failure = Box<dyn Error + Send + Sync>;

/// A strategy scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scenario {
    /// A writer, a reviewer and an editor in turn.
    Sequential,
    /// Three reviewers at once, merged by a model.
    Parallel,
    /// A model routes a refund to the billing desk.
    Router,
    /// A model plans research and writing, then answers.
    Planner,
    /// Triage hands a double charge to billing, billing to refunds.
    Swarm,
    /// A chief delegates to docs and to an engineering team of two.
    Hierarchy,
}

impl Scenario {
    /// Every scenario, in the order the guide lists them.
    pub const ALL: [Scenario; 6] = [
        Scenario::Sequential,
        Scenario::Parallel,
        Scenario::Router,
        Scenario::Planner,
        Scenario::Swarm,
        Scenario::Hierarchy,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Sequential => "sequential",
            Scenario::Parallel => "parallel",
            Scenario::Router => "router",
            Scenario::Planner => "planner",
            Scenario::Swarm => "swarm",
            Scenario::Hierarchy => "hierarchy",
        }
    }

    /// The scenario with this name.
    pub fn named(name: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The task it starts with.
    pub fn task(self) -> &'static str {
        match self {
            Scenario::Sequential => "release notes for 1.4",
            Scenario::Parallel => "the 1.4 diff",
            Scenario::Router => "refund for invoice 7",
            Scenario::Planner => "a launch post for 1.4",
            Scenario::Swarm => "I was charged twice for invoice 7",
            Scenario::Hierarchy => "ship 1.4",
        }
    }

    /// The line a finished run prints.
    pub fn expected(self) -> &'static str {
        match self {
            Scenario::Sequential => {
                "sequential: a draft of release notes for 1.4, reviewed, edited"
            }
            Scenario::Parallel => "parallel: security: no findings; style: 2 nits; tests: all pass",
            Scenario::Router => {
                "router: billing, chosen by the model: issued the refund for invoice 7"
            }
            Scenario::Planner => {
                "planner: a launch post on faster recovery and team strategies (2 tasks, 1 round)"
            }
            Scenario::Swarm => {
                "swarm: refunded the duplicate charge (triage -> billing -> refunds)"
            }
            Scenario::Hierarchy => {
                "hierarchy: ceo: docs: release notes written; eng: [backend: api deployed; frontend: ui deployed]"
            }
        }
    }

    /// The work it starts with.
    pub fn work(self) -> Result<Work, Failure> {
        Ok(Work::new(self.task())?)
    }

    /// Its team program, on scripted models answering with [`answer`].
    pub fn program(self) -> Result<Program<Work, Payload>, Failure> {
        self.program_with(&|name: &str| -> Arc<dyn ChatModel> {
            Arc::new(ScriptedModel::new(name, answer))
        })
    }

    /// Its team program on the models `model` gives for each model name
    /// (a host wrapping the scripted models, say to record their calls).
    pub fn program_with(
        self,
        model: &dyn Fn(&str) -> Arc<dyn ChatModel>,
    ) -> Result<Program<Work, Payload>, Failure> {
        let config = |name: &str| ModelConfig::new(model(name));
        let agent = |id: &str, what: &str| {
            Agent::model(id, what, &format!("You are {id}. {what}"), &config(id))
        };
        let name = format!("demo.{}", self.name());
        let description = format!("The {} demo.", self.name());
        let program = match self {
            Scenario::Sequential => Sequential::new(SequentialConfig {
                name,
                description,
                agents: vec![
                    agent("writer", "Drafts.")?,
                    agent("reviewer", "Reviews drafts.")?,
                    agent("editor", "Edits reviewed drafts.")?,
                ],
                input: None,
            })?
            .program()
            .retype(),
            Scenario::Parallel => Parallel::new(ParallelConfig {
                name,
                description,
                agents: vec![
                    agent("security", "Reviews for security.")?,
                    agent("style", "Reviews for style.")?,
                    agent("tests", "Runs the tests.")?,
                ],
                max_concurrency: 2,
                errors: ErrorMode::FailFast,
                merge: Merge::Model(config("merger")),
            })?
            .program()
            .retype(),
            Scenario::Router => Router::new(RouterConfig {
                name,
                description,
                agents: vec![
                    agent("billing", "Invoices and refunds.")?
                        .with_capabilities(["invoice", "refund"]),
                    agent("support", "Everything else.")?.with_capabilities(["help"]),
                ],
                route: Route::Model(config("router")),
                fallback: Some("support".into()),
            })?
            .program()
            .retype(),
            Scenario::Planner => Planner::new(PlannerConfig {
                name,
                description,
                agents: vec![
                    agent("researcher", "Collects facts.")?,
                    agent("writer", "Writes posts.")?,
                ],
                model: config("planner"),
                max_tasks: 4,
                max_iterations: 2,
            })?
            .program()
            .retype(),
            Scenario::Swarm => {
                let member = |id: &str, what: &str| SwarmAgent {
                    id: id.into(),
                    name: id.into(),
                    description: what.into(),
                    system: format!("You are {id}. {what}"),
                    model: config(id),
                };
                Swarm::new(SwarmConfig::new(
                    name,
                    description,
                    vec![
                        member("triage", "Finds who should help."),
                        member("billing", "Answers billing questions."),
                        member("refunds", "Issues refunds."),
                    ],
                ))?
                .program()
                .retype()
            }
            Scenario::Hierarchy => {
                let eng = Supervisor {
                    id: "eng".into(),
                    name: "Engineering".into(),
                    description: "Builds and deploys.".into(),
                    delegation: Delegation::All,
                    workers: vec![
                        agent("backend", "Deploys the API.")?,
                        agent("frontend", "Deploys the UI.")?,
                    ],
                    teams: Vec::new(),
                };
                Hierarchy::new(HierarchyConfig {
                    name,
                    description,
                    root: Supervisor {
                        id: "ceo".into(),
                        name: "The chief".into(),
                        description: "Runs the release.".into(),
                        delegation: Delegation::Model(config("ceo")),
                        workers: vec![agent("docs", "Writes release notes.")?],
                        teams: vec![eng],
                    },
                })?
                .program()
                .retype()
            }
        };
        Ok(program)
    }

    /// The result line of a finished run's output.
    pub fn line(self, output: &Payload) -> Result<String, Failure> {
        let text = |payload: &Payload| -> Result<String, Failure> { Ok(payload.decode()?) };
        let body = match self {
            Scenario::Sequential => text(&output.decode::<SequentialOutput>()?.output)?,
            Scenario::Parallel => text(&output.decode::<ParallelOutput>()?.output)?,
            Scenario::Router => {
                let routed: RouterOutput = output.decode()?;
                let how = match routed.choice {
                    Choice::Model => "chosen by the model",
                    Choice::Function => "chosen by the route",
                    Choice::Capabilities { .. } => "chosen by capability",
                    Choice::Fallback { .. } => "the fallback",
                };
                format!("{}, {how}: {}", routed.agent, text(&routed.output)?)
            }
            Scenario::Planner => {
                let planned: PlannerOutput = output.decode()?;
                let rounds = if planned.rounds == 1 {
                    "round"
                } else {
                    "rounds"
                };
                format!(
                    "{} ({} tasks, {} {rounds})",
                    planned.answer,
                    planned.tasks.len(),
                    planned.rounds
                )
            }
            Scenario::Swarm => {
                let swarm: SwarmOutput = output.decode()?;
                let mut path = vec![
                    swarm
                        .handoffs
                        .first()
                        .map_or(swarm.agent.to_string(), |h| h.from.to_string()),
                ];
                path.extend(swarm.handoffs.iter().map(|h| h.to.to_string()));
                format!("{} ({})", swarm.answer, path.join(" -> "))
            }
            Scenario::Hierarchy => level(&output.decode()?)?,
        };
        Ok(format!("{}: {body}", self.name()))
    }
}

/// `supervisor: child: result; team: [ … ]`.
fn level(output: &LevelOutput) -> Result<String, Failure> {
    let mut parts = Vec::new();
    for result in &output.results {
        let payload = result.outcome.output().ok_or("a delegated child failed")?;
        match payload.decode::<LevelOutput>() {
            Ok(team) => {
                let inner = level(&team)?;
                let inner = inner
                    .split_once(": ")
                    .map_or(inner.clone(), |(_, rest)| rest.to_owned());
                parts.push(format!("{}: [{inner}]", result.agent));
            }
            Err(_) => parts.push(format!("{}: {}", result.agent, payload.decode::<String>()?)),
        }
    }
    Ok(format!("{}: {}", output.supervisor, parts.join("; ")))
}

fn malformed(error: impl std::fmt::Display) -> ModelError {
    ModelError::Malformed(error.to_string())
}

fn last_user(request: &Request) -> String {
    request
        .messages()
        .iter()
        .rev()
        .find(|m| m.role() == Role::User)
        .map(|m| m.text())
        .unwrap_or_default()
}

fn json<T: serde::de::DeserializeOwned>(request: &Request) -> Result<T, ModelError> {
    Payload::parse_str(&last_user(request))
        .and_then(|payload| payload.decode())
        .map_err(malformed)
}

fn object(value: serde_json::Value) -> Response {
    Response::text(value.to_string())
}

fn transfer(to: &str, message: &str) -> Result<Response, ModelError> {
    Response::calls(vec![ToolCall {
        id: format!("call-{to}"),
        name: tool_name(to),
        arguments: serde_json::json!({ "message": message }).to_string(),
    }])
    .map_err(malformed)
}

/// The text after the last `From …:` line of a rendered input: the
/// previous agent's output.
fn previous(text: &str) -> &str {
    text.rsplit_once(":\n").map_or(text, |(_, after)| after)
}

/// What every scripted model of the scenarios answers: a pure function of
/// the request.
pub fn answer(request: &Request) -> Result<Response, ModelError> {
    let system = request
        .messages()
        .first()
        .filter(|m| m.role() == Role::System)
        .map(|m| m.text())
        .unwrap_or_default();
    if system.starts_with("You merge") {
        let input: MergeInput = json(request)?;
        let parts: Vec<String> = input
            .results
            .iter()
            .map(|r| {
                let output = r.outcome.output().map(|o| o.decode::<String>());
                format!(
                    "{}: {}",
                    r.agent,
                    output.and_then(Result::ok).unwrap_or_default()
                )
            })
            .collect();
        return Ok(object(serde_json::json!({ "answer": parts.join("; ") })));
    }
    if system.starts_with("You route") {
        let query: RouteQuery = json(request)?;
        let task: String = query.task.decode().map_err(malformed)?;
        let id = if task.contains("invoice") {
            "billing"
        } else {
            "support"
        };
        return Ok(object(serde_json::json!({ "agent_id": id })));
    }
    if system.starts_with("You plan") {
        let _: PlanRequest = json(request)?;
        return Ok(object(serde_json::json!({ "tasks": [
            { "key": "facts", "agent": "researcher", "input": "collect the changes in 1.4", "depends_on": [] },
            { "key": "draft", "agent": "writer", "input": "write the launch post", "depends_on": ["facts"] },
        ] })));
    }
    if system.starts_with("You write the final answer") {
        let synthesis: SynthesisRequest = json(request)?;
        let last = synthesis
            .tasks
            .iter()
            .rev()
            .find_map(|t| t.outcome.as_ref().and_then(|o| o.output()))
            .map(|o| o.decode::<String>())
            .transpose()
            .map_err(malformed)?
            .unwrap_or_default();
        return Ok(object(serde_json::json!({ "answer": last })));
    }
    if system.starts_with("You supervise") {
        let delegation: DelegationRequest = json(request)?;
        let task: String = delegation.task.decode().map_err(malformed)?;
        let assignments: Vec<_> = delegation
            .children
            .iter()
            .map(|c| serde_json::json!({ "child": c.id, "task": format!("{}: {task}", c.id) }))
            .collect();
        return Ok(object(serde_json::json!({ "assignments": assignments })));
    }
    let id = system
        .strip_prefix("You are ")
        .and_then(|rest| rest.split_once('.'))
        .map(|(id, _)| id)
        .ok_or_else(|| malformed("an unexpected request"))?;
    let input = last_user(request);
    let text = match id {
        "writer" if input.contains("From researcher") => {
            let facts = previous(&input);
            let topics = facts.split_once(": ").map_or(facts, |(_, topics)| topics);
            format!("a launch post on {topics}")
        }
        "writer" => format!("a draft of {input}"),
        "reviewer" => format!("{}, reviewed", previous(&input)),
        "editor" => format!("{}, edited", previous(&input)),
        "security" => "no findings".into(),
        "style" => "2 nits".into(),
        "tests" => "all pass".into(),
        "billing" if system.contains("Invoices") => format!("issued the {input}"),
        "support" => format!("helped with {input}"),
        "researcher" => "the changes in 1.4: faster recovery and team strategies".into(),
        "triage" => return transfer("billing", "a double charge"),
        "billing" => return transfer("refunds", "refund the second charge of invoice 7"),
        "refunds" => "refunded the duplicate charge".into(),
        "docs" => "release notes written".into(),
        "backend" => "api deployed".into(),
        "frontend" => "ui deployed".into(),
        other => return Err(malformed(format!("no script for {other}"))),
    };
    Ok(Response::text(text))
}

/// Runs a scenario on an in-memory engine to its end and returns its
/// result line.
pub async fn run(scenario: Scenario) -> Result<String, Failure> {
    let program = scenario.program()?;
    let engine = Engine::new(EngineConfig {
        programs: vec![program.erase()],
        ..EngineConfig::new(Arc::new(MemoryStore::new()))
    })?;
    let request = StartRequest::new(StartId::new("example", scenario.name())?, scenario.work()?);
    let handle = engine.start(&program, request).await?;
    let output = handle.output().await?;
    handle.join().await?;
    scenario.line(&output)
}
