//! The demo programs: the worked example of the team specification, a
//! pause scenario that waits for a human answer, and one scenario per team
//! strategy.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use baton::run::log::RecordKind;
use baton::run::store::TreeStatus;
use baton::run::{
    Engine, Payload, ProcessView, Program, Scope, Settlement, StartId, StartRequest, TreeLimits,
    TreeView,
};
use baton_cli::{CliError, Context, HostHooks, LostEffect, Resolution, WaitArgs};
use baton_testkit::{Cut, FaultStore};
use clap::{Args, ValueEnum};

// The worked example is `baton-examples`' `team_review`, and the strategy
// scenarios are its `strategies`; the command line runs those very programs.
use baton_examples::strategies::Scenario;
use baton_examples::team_review as example;

/// The scope the demo's trees run in.
pub const SCOPE: &str = "demo";

/// The question the pause scenario asks.
pub use baton_examples::pause::QUESTION;

/// `baton demo`'s flags.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// A team strategy to run instead of the worked example.
    #[arg(value_enum, conflicts_with = "pause")]
    scenario: Option<ScenarioArg>,
    /// Run the pause scenario instead: the team waits on an input gate
    /// and this command exits; continue it with `baton answer`.
    #[arg(long)]
    pause: bool,
    /// With --pause: keep running after the team waits; with
    /// --crash-at: keep running after the crash (for crash tests).
    #[arg(long, hide = true)]
    hold: bool,
    /// With a scenario: stop the run as a crash would, before the N-th
    /// commit that starts a child, and leave it for `baton recover`.
    #[arg(long, hide = true, value_name = "N", requires = "scenario")]
    crash_at: Option<usize>,
}

/// The team strategy scenarios of `baton demo`.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum ScenarioArg {
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

impl From<ScenarioArg> for Scenario {
    fn from(scenario: ScenarioArg) -> Scenario {
        match scenario {
            ScenarioArg::Sequential => Scenario::Sequential,
            ScenarioArg::Parallel => Scenario::Parallel,
            ScenarioArg::Router => Scenario::Router,
            ScenarioArg::Planner => Scenario::Planner,
            ScenarioArg::Swarm => Scenario::Swarm,
            ScenarioArg::Hierarchy => Scenario::Hierarchy,
        }
    }
}

/// A demo's failure, as the command line reports it.
fn failed(error: anyhow::Error) -> CliError {
    CliError::host("demo.failed", format!("{error:#}"))
}

/// `baton demo`: opens (or creates) the store and runs the chosen demo on
/// an engine that shuts down gracefully when the demo ends or is stopped.
pub async fn run(context: &Context, args: DemoArgs) -> Result<(), CliError> {
    if args.hold && !args.pause && args.crash_at.is_none() {
        return Err(CliError::argument("--hold needs --pause or --crash-at"));
    }
    let store = context.open_or_create_store()?;
    let scope = context.scope().clone();
    let json = context.json();
    if let (Some(scenario), Some(crash_at)) = (args.scenario, args.crash_at) {
        let fault = FaultStore::new(store.shared());
        fault.arm(RecordKind::ChildStarted, Cut::Before, crash_at);
        let engine = context.engine(Arc::new(fault))?;
        return context
            .drive(engine, WaitArgs::default(), "the demo", async |engine| {
                crashing(engine, &scope, scenario.into(), json, args.hold)
                    .await
                    .map_err(failed)
            })
            .await;
    }
    let engine = context.engine(store.shared())?;
    context
        .drive(engine, WaitArgs::default(), "the demo", async |engine| {
            match (args.scenario, args.pause) {
                (Some(scenario), _) => scenario_run(engine, &scope, scenario.into(), json).await,
                (None, true) => pause(context, engine, &scope, json, args.hold).await,
                (None, false) => example(engine, &scope, json).await,
            }
            .map_err(failed)
        })
        .await
}

/// The demos' hooks into recovery: their models are scripted, so the host
/// knows what each would answer.
pub struct DemoHooks;

impl HostHooks for DemoHooks {
    /// Settles a strategy demo's model call that a crash left unknown with
    /// what its scripted model answers (the model is not called again);
    /// leaves anything else alone.
    fn resolve_lost(&self, lost: &LostEffect<'_>) -> Option<Resolution> {
        lost.tree
            .root()
            .program
            .as_str()
            .strip_prefix("demo.")
            .and_then(Scenario::named)?;
        let call = lost.request?.decode::<baton::agent::ModelCall>().ok()?;
        let response = baton_examples::strategies::answer(&call.request).ok()?;
        Some(Resolution {
            settlement: Settlement::ok(Payload::encode(&response).ok()?),
            note: "a model call lost in the crash, with the scripted model's answer".to_owned(),
        })
    }

    /// A finished strategy demo's result line.
    fn describe(&self, tree: &TreeView) -> Option<String> {
        result_line(tree)
    }
}

/// Every program the command line may run or take up again.
pub fn programs() -> Result<Vec<Program>> {
    let example = example::team()
        .map_err(|error| anyhow::anyhow!("cannot build the worked example: {error}"))?;
    let mut programs = vec![example.erase(), pause_team()?.erase()];
    for scenario in Scenario::ALL {
        let program = scenario.program().map_err(|error| {
            anyhow::anyhow!("cannot build the {} demo: {error}", scenario.name())
        })?;
        programs.push(program.erase());
    }
    Ok(programs)
}

/// Limits for the demo's trees (the defaults).
pub fn limits() -> TreeLimits {
    TreeLimits::default()
}

/// A start key no earlier run used: the time in milliseconds.
#[expect(
    clippy::disallowed_methods,
    reason = "the command line names each new run by the wall clock"
)]
fn fresh_key(prefix: &str) -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis();
    format!("{prefix}-{millis}")
}

/// `baton demo`: runs the worked example to completion and prints its
/// output and a summary of the run.
async fn example(engine: &Engine, scope: &Scope, json: bool) -> Result<()> {
    let team = example::team()
        .map_err(|error| anyhow::anyhow!("cannot build the worked example: {error}"))?;
    let id = StartId::new(scope.as_str(), fresh_key("example"))?;
    let handle = engine
        .start(&team, StartRequest::new(id, example::TASK.to_owned()))
        .await?;
    let output = handle
        .output()
        .await
        .context("the worked example did not complete")?;
    handle.join().await?;
    let view = handle.inspect().await?;
    print!("{}", summary(&view, &output, json));
    Ok(())
}

/// Counts of a finished team run, read from its tree.
pub struct Counts {
    /// Coordinator turns (children keyed `team.turn.<n>`).
    pub turns: usize,
    /// Worker tasks (every other child of the root).
    pub tasks: usize,
}

/// Turns and tasks of a team tree.
pub fn counts(view: &TreeView) -> Counts {
    let keys: Vec<&str> = view
        .root()
        .children
        .keys()
        .map(|key| key.as_str())
        .collect();
    let turns = keys
        .iter()
        .filter(|key| key.starts_with(baton::team::RESERVED_PREFIX))
        .count();
    Counts {
        turns,
        tasks: keys.len() - turns,
    }
}

fn summary(view: &TreeView, output: &str, json: bool) -> String {
    let counts = counts(view);
    let root: &ProcessView = view.root();
    let tasks: Vec<String> = root
        .children
        .iter()
        .filter(|(key, _)| !key.as_str().starts_with(baton::team::RESERVED_PREFIX))
        .filter_map(|(key, id)| view.process(*id).map(|p| format!("{key} {}", p.status)))
        .collect();
    if json {
        return format!(
            "{}\n",
            serde_json::json!({
                "output": output,
                "tree": view.tree.to_string(),
                "turns": counts.turns,
                "tasks": counts.tasks,
                "usage": root.usage,
                "granted": root.granted,
                "log_head_seq": view.head_seq,
                "log_head": view.head.to_string(),
            })
        );
    }
    format!(
        "{output}\n\ntree    {}\nturns   {}\ntasks   {} ({})\nbudget  the team used {} steps, {} effects and {} signals itself\nlog     {} records, head {}\n",
        view.tree,
        counts.turns,
        counts.tasks,
        tasks.join(", "),
        root.usage.steps,
        root.usage.effects,
        root.usage.signals,
        view.head_seq,
        view.head,
    )
}

/// The pause scenario's team (`baton_examples::pause`): a scripted
/// coordinator asks an input gate for an instruction, waits for it, and
/// completes with the answer.
pub fn pause_team() -> Result<Program<String, String>> {
    baton_examples::pause::team()
        .map_err(|error| anyhow::anyhow!("cannot build the pause scenario: {error}"))
}

/// `baton demo --pause`: starts the pause scenario and returns once the team
/// waits for its instruction, printing how to answer.
async fn pause(
    context: &Context,
    engine: &Engine,
    scope: &Scope,
    json: bool,
    hold: bool,
) -> Result<()> {
    let team = pause_team()?;
    let id = StartId::new(scope.as_str(), fresh_key("pause"))?;
    let handle = engine
        .start(
            &team,
            StartRequest::new(id, baton_examples::pause::TASK.to_owned()),
        )
        .await?;
    let tree = handle.tree();
    let view = context.settle(engine, scope, tree).await?;
    if view.status != TreeStatus::Waiting {
        bail!("the pause scenario did not wait (it is {})", view.status);
    }
    let wait = view
        .processes
        .iter()
        .flat_map(|p| p.open_waits.iter())
        .next()
        .context("the team waits but no wait is open")?;
    if json {
        println!(
            "{}",
            serde_json::json!({ "tree": tree.to_string(), "wait": wait.id.to_string(), "question": QUESTION })
        );
    } else {
        println!("the team is waiting for an instruction: {QUESTION}");
        println!("process {tree}");
        println!("wait    {}", wait.id);
        println!(
            "continue with: baton answer {tree} --wait {} '\"ship it\"'",
            wait.id
        );
    }
    if hold {
        // For tests of crash recovery: stay alive, holding the tree's lease,
        // until the process is killed.
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        std::future::pending::<()>().await;
    }
    Ok(())
}

/// Starts a strategy scenario as a new tree.
async fn start_scenario(
    engine: &Engine,
    scope: &Scope,
    scenario: Scenario,
) -> Result<baton::run::ProcessHandle<Payload>> {
    let program = scenario
        .program()
        .map_err(|error| anyhow::anyhow!("cannot build the {} demo: {error}", scenario.name()))?;
    let id = StartId::new(scope.as_str(), fresh_key(scenario.name()))?;
    let work = scenario
        .work()
        .map_err(|error| anyhow::anyhow!("cannot encode the task: {error}"))?;
    Ok(engine
        .start(&program, StartRequest::new(id, work))
        .await?
        .into_handle())
}

/// The result line of a scenario's output.
fn line(scenario: Scenario, output: &Payload) -> Result<String> {
    scenario
        .line(output)
        .map_err(|error| anyhow::anyhow!("the {} demo's output: {error}", scenario.name()))
}

/// `baton demo <scenario>`: runs a strategy scenario to completion and
/// prints its result line.
async fn scenario_run(
    engine: &Engine,
    scope: &Scope,
    scenario: Scenario,
    json: bool,
) -> Result<()> {
    let handle = start_scenario(engine, scope, scenario).await?;
    let output = handle
        .output()
        .await
        .with_context(|| format!("the {} demo did not complete", scenario.name()))?;
    handle.join().await?;
    let line = line(scenario, &output)?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "scenario": scenario.name(),
                "tree": handle.tree().to_string(),
                "line": line,
                "output": output.to_value(),
            })
        );
    } else {
        println!("{line}");
    }
    Ok(())
}

/// `baton demo <scenario> --crash-at N`: runs a strategy scenario on a
/// store that fails, as a crash would, before the N-th commit that starts a
/// child; reports the stopped tree and leaves it for `baton recover`. With
/// `hold`, keeps running (holding the tree's lease) until killed.
async fn crashing(
    engine: &Engine,
    scope: &Scope,
    scenario: Scenario,
    json: bool,
    hold: bool,
) -> Result<()> {
    let handle = start_scenario(engine, scope, scenario).await?;
    let tree = handle.tree();
    match handle.join().await {
        Ok(ended) => {
            // The run ended before the crash point: print it as usual.
            let output = ended
                .output()
                .with_context(|| format!("the {} demo did not complete", scenario.name()))?;
            println!("{}", line(scenario, output)?);
            Ok(())
        }
        Err(_) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "scenario": scenario.name(), "tree": tree.to_string(), "crashed": true })
                );
            } else {
                println!(
                    "the {} demo stopped mid-run at a simulated crash",
                    scenario.name()
                );
                println!("process {tree}");
                println!("finish it with: baton recover");
            }
            if hold {
                use std::io::Write as _;
                let _ = std::io::stdout().flush();
                std::future::pending::<()>().await;
            }
            // Leave as a crash does: the tree's lease stays with this
            // process, which `baton recover` takes over once it is gone.
            std::process::exit(0);
        }
    }
}

/// The result line of a finished strategy demo's tree, if it is one.
pub fn result_line(view: &TreeView) -> Option<String> {
    let root = view.root();
    let name = root.program.as_str().strip_prefix("demo.")?;
    let scenario = Scenario::named(name)?;
    let output = root.termination.as_ref()?.output()?;
    scenario.line(output).ok()
}
