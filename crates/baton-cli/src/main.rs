//! `baton`: run the worked example and the strategy demos, and operate trees
//! in a store.
//!
//! Every subcommand opens an embedded SQLite store (`./baton.db` unless
//! `--store` says otherwise), or, built with the `postgres` feature, a
//! PostgreSQL database (`--store postgres://USER@HOST:PORT/DATABASE`). Errors are one line on stderr and a non-zero
//! exit code; `--json` prints machine-readable output instead of tables.

mod demo;
mod render;
mod store;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use baton::run::log::RecordKind;
use baton::run::store::{ListFilter, Store, TreeStatus};
use baton::run::{
    EffectId, Engine, EngineConfig, Payload, ProcessId, RecoverOptions, Scope, Settlement,
    SignalError, SignalReceipt, TreeView, Visibility, WaitId,
};
use baton_examples::strategies::Scenario;
use baton_testkit::{Cut, FaultStore};
use clap::{Parser, Subcommand, ValueEnum};

use crate::store::CliStore;

/// Durable, budgeted, decision-driven multi-agent work.
#[derive(Debug, Parser)]
#[command(name = "baton", version, about)]
struct Cli {
    /// The store: a SQLite file, or (built with the `postgres` feature) a
    /// postgres://USER@HOST:PORT/DATABASE URL.
    #[arg(long, global = true, default_value = "baton.db")]
    store: String,
    /// The tenant scope of the trees you operate on.
    #[arg(long, global = true, default_value = demo::SCOPE)]
    scope: String,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the worked example: a team whose coordinator continues while an
    /// input gate is pending, then reviews the task. With a scenario, run
    /// that team strategy on scripted models and print its result line.
    Demo {
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
    },
    /// List trees.
    Ps {
        /// Only trees with this status.
        #[arg(long, value_enum)]
        status: Option<StatusFilter>,
        /// Only trees of this tenant scope (default: every scope).
        #[arg(long = "tenant")]
        tenant: Option<String>,
    },
    /// Show a tree: processes, statuses, budgets, open waits, unknown effects.
    Inspect {
        /// The tree (its root process id, `p_…`).
        id: String,
    },
    /// Print a tree's log.
    Log {
        /// The tree.
        id: String,
        /// Recompute the hash chain and report the first bad record.
        #[arg(long)]
        verify: bool,
    },
    /// Answer an open wait and continue the tree until it waits or ends.
    Answer {
        /// The tree.
        id: String,
        /// The wait to answer (`w_…`).
        #[arg(long)]
        wait: String,
        /// The answer as JSON.
        json_answer: String,
    },
    /// Cancel a tree.
    Cancel {
        /// The tree.
        id: String,
        /// Why.
        #[arg(long, default_value = "canceled from the command line")]
        reason: String,
    },
    /// Resolve an unknown effect with its real outcome and continue the tree.
    Resolve {
        /// The tree.
        id: String,
        /// The unknown effect (`e_…`).
        #[arg(long)]
        effect: String,
        /// The effect's output as JSON (a success).
        json_output: String,
    },
    /// Reopen every unfinished tree and drive each until it ends or waits.
    Recover {
        /// Take trees over even from a live writer.
        #[arg(long)]
        force: bool,
    },
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

#[derive(Clone, Copy, Debug, ValueEnum)]
enum StatusFilter {
    Running,
    Waiting,
    NeedsAttention,
    Done,
}

impl From<StatusFilter> for TreeStatus {
    fn from(filter: StatusFilter) -> TreeStatus {
        match filter {
            StatusFilter::Running => TreeStatus::Running,
            StatusFilter::Waiting => TreeStatus::Waiting,
            StatusFilter::NeedsAttention => TreeStatus::NeedsAttention,
            StatusFilter::Done => TreeStatus::Done,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let chain: Vec<String> = error.chain().map(ToString::to_string).collect();
            eprintln!("error: {}", chain.join(": "));
            ExitCode::FAILURE
        }
    }
}

/// Opens the store; every command but `demo` requires it to exist already
/// (commands that only read never create one).
fn open(location: &str, create: bool) -> Result<CliStore> {
    CliStore::open(location, create)
}

fn engine(store: &CliStore) -> Result<Engine> {
    engine_on(store.shared())
}

fn engine_on(store: Arc<dyn Store>) -> Result<Engine> {
    Ok(Engine::new(EngineConfig {
        programs: demo::programs()?,
        limits: demo::limits(),
        ..EngineConfig::new(store)
    })?)
}

fn tree_id(text: &str) -> Result<ProcessId> {
    text.parse()
        .with_context(|| format!("{text:?} is not a tree id (expected p_ and 32 hex digits)"))
}

async fn run(cli: Cli) -> Result<()> {
    let scope = Scope::new(&cli.scope).context("invalid --scope")?;
    match cli.command {
        Command::Demo {
            scenario,
            pause,
            hold,
            crash_at,
        } => {
            if hold && !pause && crash_at.is_none() {
                bail!("--hold needs --pause or --crash-at");
            }
            let store = open(&cli.store, true)?;
            if let (Some(scenario), Some(crash_at)) = (scenario, crash_at) {
                let fault = FaultStore::new(store.shared());
                fault.arm(RecordKind::ChildStarted, Cut::Before, crash_at);
                let engine = engine_on(Arc::new(fault))?;
                return demo::crashing(&engine, &scope, scenario.into(), cli.json, hold).await;
            }
            let engine = engine(&store)?;
            let result = match (scenario, pause) {
                (Some(scenario), _) => {
                    demo::scenario(&engine, &scope, scenario.into(), cli.json).await
                }
                (None, true) => demo::pause(&engine, &scope, cli.json, hold).await,
                (None, false) => demo::example(&engine, &scope, cli.json).await,
            };
            engine.close().await;
            result
        }
        Command::Ps { status, tenant } => {
            let store = open(&cli.store, false)?;
            let filter = ListFilter {
                status: status.map(TreeStatus::from),
                scope: tenant
                    .map(Scope::new)
                    .transpose()
                    .context("invalid --tenant")?,
            };
            let listing = store.shared().list(filter).await?;
            for row in &listing.unreadable {
                eprintln!(
                    "warning: tree row {} does not read back: {}",
                    row.id, row.error
                );
            }
            let trees = listing.trees;
            print!("{}", render::ps(&trees, cli.json));
            Ok(())
        }
        Command::Inspect { id } => {
            let store = open(&cli.store, false)?;
            let view = engine(&store)?
                .inspect(&scope, tree_id(&id)?, Visibility::Public)
                .await?;
            print!("{}", render::tree(&view, cli.json));
            Ok(())
        }
        Command::Log { id, verify } => {
            let store = open(&cli.store, false)?;
            let tree = tree_id(&id)?;
            let engine = engine(&store)?;
            // Scope check (and existence) before printing anything; a
            // verification reports damage with its record number.
            let checked = if verify {
                Some(engine.verify(&scope, tree).await?)
            } else {
                engine.inspect(&scope, tree, Visibility::Public).await?;
                None
            };
            let records = store.records(tree).await?;
            print!("{}", render::log(&records, cli.json));
            if let Some(checked) = checked {
                println!("{}", render::verification(&checked, cli.json));
            }
            Ok(())
        }
        Command::Answer {
            id,
            wait,
            json_answer,
        } => {
            let store = open(&cli.store, false)?;
            let tree = tree_id(&id)?;
            let wait: WaitId = wait
                .parse()
                .with_context(|| format!("{wait:?} is not a wait id"))?;
            let payload =
                Payload::parse_str(&json_answer).context("the answer is not valid JSON")?;
            let engine = engine(&store)?;
            let result = answer(&engine, &scope, tree, wait, payload, cli.json).await;
            engine.close().await;
            result
        }
        Command::Cancel { id, reason } => {
            let store = open(&cli.store, false)?;
            let tree = tree_id(&id)?;
            let engine = engine(&store)?;
            let result = async {
                let handle = engine.process::<Payload>(&scope, tree).await?;
                handle.cancel(reason).await?;
                let view = settle(&engine, &scope, tree).await?;
                print!("{}", render::tree(&view, cli.json));
                Ok(())
            }
            .await;
            engine.close().await;
            result
        }
        Command::Resolve {
            id,
            effect,
            json_output,
        } => {
            let store = open(&cli.store, false)?;
            let tree = tree_id(&id)?;
            let effect: EffectId = effect
                .parse()
                .with_context(|| format!("{effect:?} is not an effect id"))?;
            let output =
                Payload::parse_str(&json_output).context("the output is not valid JSON")?;
            let engine = engine(&store)?;
            let result = async {
                engine
                    .resolve_unknown(&scope, tree, effect, Settlement::ok(output))
                    .await?;
                let view = settle(&engine, &scope, tree).await?;
                print!("{}", render::tree(&view, cli.json));
                Ok(())
            }
            .await;
            engine.close().await;
            result
        }
        Command::Recover { force } => {
            let store = open(&cli.store, false)?;
            let engine = engine(&store)?;
            let scopes: std::collections::BTreeMap<ProcessId, Scope> = store
                .shared()
                .list(ListFilter::default())
                .await?
                .trees
                .into_iter()
                .map(|meta| (meta.tree, meta.scope))
                .collect();
            let result = recover(&engine, &scopes, force, cli.json).await;
            engine.close().await;
            result
        }
    }
}

async fn answer(
    engine: &Engine,
    scope: &Scope,
    tree: ProcessId,
    wait: WaitId,
    payload: Payload,
    json: bool,
) -> Result<()> {
    // The engine routes the answer to the process that opened the wait;
    // its signal id is derived from the wait, so answering twice is a no-op.
    let receipt = match engine.answer(scope, tree, wait, payload).await {
        Ok(receipt) => receipt,
        Err(SignalError::WaitClosed { .. } | SignalError::Conflict { .. }) => {
            bail!("wait {wait} of tree {tree} was already answered with another answer")
        }
        Err(SignalError::UnknownWait { .. }) => {
            bail!("tree {tree} has no wait {wait} (see `baton inspect {tree}` for its open waits)")
        }
        Err(error) => return Err(error.into()),
    };
    if receipt == SignalReceipt::Duplicate && !json {
        println!("(this answer was already delivered)");
    }
    let view = settle(engine, scope, tree).await?;
    print!("{}", render::outcome(&view, json));
    Ok(())
}

/// Drives a tree until it is no longer running (done, waiting or parked),
/// showing progress; gives up after two minutes.
async fn settle(engine: &Engine, scope: &Scope, tree: ProcessId) -> Result<TreeView> {
    let handle = engine.process::<Payload>(scope, tree).await?;
    for _ in 0..12_000 {
        let view = handle.inspect().await?;
        if view.status != TreeStatus::Running {
            return Ok(view);
        }
        pause(Duration::from_millis(10)).await;
    }
    bail!("tree {tree} is still running after two minutes")
}

#[expect(
    clippy::disallowed_methods,
    reason = "the command line polls a running tree between inspections"
)]
async fn pause(duration: Duration) {
    tokio::time::sleep(duration).await;
}

async fn recover(
    engine: &Engine,
    scopes: &std::collections::BTreeMap<ProcessId, Scope>,
    force: bool,
    json: bool,
) -> Result<()> {
    let report = engine
        .recover(RecoverOptions { force, scope: None })
        .await?;
    if report.is_empty() && !json {
        println!("nothing to recover: every tree in the store has finished");
    }
    let mut failures = 0;
    for (index, (tree, result)) in report.iter().enumerate() {
        if !json {
            eprintln!("[{}/{}] {tree}", index + 1, report.len());
        }
        match result {
            Ok(()) => {
                let scope = scopes.get(tree).context("a recovered tree is not listed")?;
                let mut view = settle(engine, scope, *tree).await?;
                // The demos' host knows what their scripted models answer,
                // so it settles the model calls a crash left unknown.
                let resolved = demo::resolve_lost_calls(engine, scope, &view).await?;
                if !resolved.is_empty() {
                    view = settle(engine, scope, *tree).await?;
                }
                print!("{}", render::recovered(&view, json));
                if !json {
                    for effect in &resolved {
                        println!(
                            "  resolved {effect}, a model call lost in the crash, with the scripted model's answer"
                        );
                    }
                    if let Some(line) = demo::result_line(&view) {
                        println!("  {line}");
                    }
                }
            }
            Err(error) => {
                failures += 1;
                if json {
                    println!(
                        "{}",
                        serde_json::json!({ "tree": tree.to_string(), "error": error.to_string(), "code": error.code() })
                    );
                } else {
                    println!("{tree}  not recovered: {error}");
                }
            }
        }
    }
    if failures > 0 {
        bail!(
            "{failures} of {} trees could not be recovered",
            report.len()
        );
    }
    Ok(())
}
