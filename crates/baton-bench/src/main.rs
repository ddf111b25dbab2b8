//! # baton-bench: workloads that measure the Baton kernel
//!
//! `baton-bench [WORKLOAD...] [--json] [--runs N]` runs the named workloads
//! (all of them when none is named) on the in-memory store and prints one
//! JSON line per workload, then a table (`--json` prints only the JSON
//! lines). `cargo xtask bench` runs it in release mode.
//!
//! Workloads:
//! - `step`: one root loops `Continue` with no effects and a counter state
//!   until its step budget ends it; the figure is wall time per step.
//! - `dispatch`: one root dispatches one effect per step to an echo
//!   dispatcher; the figure is wall time per dispatch (a pending commit, a
//!   settled commit and a step).
//! - `children`: one root starts ten children at a time (each completes at
//!   once with its input) and waits for all ten, until it has run the asked
//!   number; the figure is wall time per child lifecycle.
//! - `idle`: many roots each open an external wait and sleep on it; the
//!   figure is resident memory growth per waiting process.
//! - `team1000` (ARCHITECTURE §10 W3): a team whose scripted coordinator
//!   requests 100 worker tasks (a one-stage workflow doubling its index)
//!   with mode `wait`, keeps answering `wait` until all 100 have drained,
//!   then requests the next 100, ten rounds, and completes with the sum;
//!   the figure is wall time per task, and the run also reports the
//!   coordinator turns.
//!
//! Each workload runs in a child process of its own (this binary again, with
//! the hidden `--worker` flag) so that its peak resident memory is its own;
//! each `idle` run gets a fresh process, because memory freed by an earlier
//! run would otherwise hide growth. `step` and `dispatch` run once to warm
//! up and then `--runs` times; the medians and 90th percentiles are of the
//! per-run figures. CPU time is the sum over the process's threads of the
//! on-CPU time in `/proc/self/task/*/schedstat`.
//!
//! The bench depends only on the `baton` facade; it measures `baton::run`.

use std::fmt::Write as _;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use baton::run::log::RecordKind;
use baton::run::{
    Boundary, BoxFuture, Budget, ChildKey, Condition, Definition, Descriptor, DispatchCall,
    Dispatcher, Effect, Engine, EngineConfig, Execution, ExecutionState, Failure, MemoryStore,
    Name, Payload, ProcessHandle, Program, ProgramConfig, Quota, ReplayPolicy, Schema, Settlement,
    Signal, SignalBody, StartId, StartRequest, Status, StepError, Transition, TreeId, TreeLimits,
    WaitId, configuration_digest, implementation_digest,
};
use baton::run::{EffectId, RecoverOptions, Scope, SignalId, SignalRequest};
use baton::store::sqlite::SqliteStore;
use baton::team::{
    Binding, Config as TeamConfig, Decision, Mode, Policy, PolicyConfig, TaskRequest, Turn, compile,
};
use baton::workflow::{Child, Config as WorkflowConfig, Workflow, fork, transform};
use serde::{Deserialize, Serialize};

/// Help text, printed for `--help` and after a usage error.
const USAGE: &str = "\
usage: baton-bench [WORKLOAD...] [--json] [--runs N] [--steps N] [--dispatches N] [--children N] [--idle N]

workloads (all when none is named):
  step       wall time per step of a root that loops Continue with a counter state
  dispatch   wall time per dispatch to an echo dispatcher (pending + settled + step)
  children   wall time per child lifecycle (start, complete, wait), ten children at a time
  team1000   wall time per worker task of a team running 1000 tasks, 100 at a time (also: coordinator turns)
  idle       resident memory per process waiting on an external wait

options:
  --json          print only the JSON lines, not the table
  --runs N        measured runs per workload after one warm-up (default 5)
  --steps N       steps per `step` run (default 20000)
  --dispatches N  dispatches per `dispatch` run (default 5000)
  --children N    child lifecycles per `children` run (default 2000)
  --idle N        waiting roots per `idle` run (default 20000)";

/// Roots started (and left waiting) in an `idle` run before the baseline
/// reading, so lazily built runtime and allocator structures are not charged
/// to the measured roots.
const IDLE_WARM_UP: usize = 64;

/// A workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Workload {
    /// Steps with no effects.
    Step,
    /// One echo dispatch per step.
    Dispatch,
    /// Processes asleep on an external wait.
    Idle,
    /// Child lifecycles: start, complete, wait for, ten at a time.
    Children,
    /// A team running 1000 worker tasks, 100 at a time.
    Team1000,
    /// 1000 roots parked on a wait in SQLite, recovered and answered by a fresh engine.
    Resume1000,
    /// W1: a workflow of three pure transforms, a new root per run.
    Chain3,
    /// W2: a root starts five children, waits for all, joins their results.
    Fanout5,
    /// W4: a ten-stage chain carrying 1 KB of random state.
    State1k,
    /// W4: the same with 30 KB.
    State30k,
    /// W4: the same with 250 KB.
    State250k,
}

impl Workload {
    /// Every workload, in the order they run.
    const ALL: [Workload; 11] = [
        Workload::Chain3,
        Workload::Fanout5,
        Workload::State1k,
        Workload::State30k,
        Workload::State250k,
        Workload::Step,
        Workload::Dispatch,
        Workload::Children,
        Workload::Team1000,
        Workload::Resume1000,
        Workload::Idle,
    ];

    fn name(self) -> &'static str {
        match self {
            Workload::Step => "step",
            Workload::Dispatch => "dispatch",
            Workload::Idle => "idle",
            Workload::Children => "children",
            Workload::Team1000 => "team1000",
            Workload::Resume1000 => "resume1000",
            Workload::Chain3 => "chain3",
            Workload::Fanout5 => "fanout5",
            Workload::State1k => "state-1k",
            Workload::State30k => "state-30k",
            Workload::State250k => "state-250k",
        }
    }

    fn parse(name: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == name)
    }

    /// The unit of the headline figure.
    fn unit(self) -> &'static str {
        match self {
            Workload::Step => "us/step",
            Workload::Dispatch => "us/dispatch",
            Workload::Idle => "bytes/process",
            Workload::Children => "us/child",
            Workload::Team1000 => "us/task",
            Workload::Resume1000 => "ms/tree",
            Workload::Chain3 | Workload::Fanout5 => "us/run",
            Workload::State1k | Workload::State30k | Workload::State250k => "ms/stage",
        }
    }

    /// The unit of `bytes_written`.
    fn per(self) -> &'static str {
        match self {
            Workload::Step => "step",
            Workload::Dispatch => "dispatch",
            Workload::Idle => "process",
            Workload::Children => "child",
            Workload::Team1000 => "task",
            Workload::Resume1000 => "tree",
            Workload::Chain3 | Workload::Fanout5 => "run",
            Workload::State1k | Workload::State30k | Workload::State250k => "stage",
        }
    }
}

/// The parsed command line.
#[derive(Debug)]
struct Options {
    workloads: Vec<Workload>,
    json: bool,
    runs: usize,
    steps: u64,
    dispatches: u64,
    children: u64,
    idle: usize,
    /// Hidden: run one workload in this process and print its samples.
    worker: Option<Workload>,
    /// Hidden, with `--worker`: run once before the measured runs.
    warm_up: bool,
}

impl Options {
    fn parse(args: &[String]) -> Result<Options> {
        let mut options = Options {
            workloads: Vec::new(),
            json: false,
            runs: 5,
            steps: 20_000,
            dispatches: 5_000,
            children: 2_000,
            idle: 20_000,
            worker: None,
            warm_up: false,
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut number = |flag: &str| -> Result<u64> {
                let value = args
                    .next()
                    .with_context(|| format!("`{flag}` needs a number\n\n{USAGE}"))?;
                match value.parse::<u64>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => bail!("`{flag}` needs a positive number, got `{value}`\n\n{USAGE}"),
                }
            };
            match arg.as_str() {
                "--json" => options.json = true,
                "--runs" => options.runs = usize::try_from(number("--runs")?)?,
                "--steps" => options.steps = number("--steps")?,
                "--dispatches" => options.dispatches = number("--dispatches")?,
                "--children" => options.children = number("--children")?,
                "--idle" => options.idle = usize::try_from(number("--idle")?)?,
                "--warm-up" => options.warm_up = true,
                "--worker" => {
                    let name = args.next().context("`--worker` needs a workload")?;
                    options.worker = Some(
                        Workload::parse(name)
                            .with_context(|| format!("unknown workload `{name}`\n\n{USAGE}"))?,
                    );
                }
                other => match Workload::parse(other) {
                    Some(workload) if !options.workloads.contains(&workload) => {
                        options.workloads.push(workload);
                    }
                    Some(_) => {}
                    None => bail!("unknown argument `{other}`\n\n{USAGE}"),
                },
            }
        }
        if options.workloads.is_empty() {
            options.workloads = Workload::ALL.to_vec();
        }
        Ok(options)
    }

    /// The work per run: steps, dispatches or waiting roots.
    fn size(&self, workload: Workload) -> u64 {
        match workload {
            Workload::Step => self.steps,
            Workload::Dispatch => self.dispatches,
            Workload::Idle => self.idle as u64,
            Workload::Children => self.children,
            Workload::Team1000 => TEAM_ROUNDS * TEAM_BATCH,
            Workload::Resume1000 => RESUME_TREES as u64,
            Workload::Chain3 | Workload::Fanout5 => SMALL_RUNS,
            Workload::State1k | Workload::State30k | Workload::State250k => STATE_STAGES,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let result = match Options::parse(&args) {
        Ok(options) => match options.worker {
            Some(workload) => {
                let options = std::sync::Arc::new(options);
                tokio::spawn(async move { worker(workload, &options).await })
                    .await
                    .map_err(anyhow::Error::from)
                    .and_then(|r| r)
            }
            None => orchestrate(&options),
        },
        Err(error) => Err(error),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------
// Measurement primitives
// ---------------------------------------------------------------------------

/// Reads the wall clock: the bench's only clock.
#[expect(clippy::disallowed_methods, reason = "benchmarks measure wall time")]
fn now() -> Instant {
    Instant::now()
}

/// A `kB` field of `/proc/self/status` (`VmRSS`, `VmHWM`), in bytes.
fn status_bytes(field: &str) -> Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("failed to read /proc/self/status")?;
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .with_context(|| format!("/proc/self/status has no {field}"))?;
    let kib: u64 = line
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .with_context(|| format!("unreadable {field}: {line}"))?;
    Ok(kib * 1024)
}

/// Nanoseconds every live thread of this process has spent on a CPU.
fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| {
            let schedstat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            schedstat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// The figures of one run.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Sample {
    /// The headline figure, in the workload's unit.
    figure: f64,
    /// CPU microseconds per unit of work, when the figure is a time.
    cpu: Option<f64>,
    /// Log record bytes per unit of work.
    bytes_written: f64,
    /// Coordinator turns (`team1000` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    turns: Option<u64>,
}

/// What a worker process reports.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerReport {
    samples: Vec<Sample>,
    peak_rss_bytes: u64,
}

/// The result of one workload: one JSON line.
#[derive(Debug, Serialize)]
struct Line {
    /// The workload's name.
    workload: &'static str,
    /// The store it ran on.
    store: &'static str,
    /// The unit of `median` and `p90`.
    unit: &'static str,
    /// Median of the per-run figures.
    median: f64,
    /// Nearest-rank 90th percentile of the per-run figures.
    p90: f64,
    /// Measured runs (the warm-up is not counted).
    runs: usize,
    /// Steps, dispatches or waiting roots per run.
    size: u64,
    /// The largest `VmHWM` of the workload's worker processes.
    peak_rss_bytes: u64,
    /// Median log record bytes per step, dispatch or waiting root.
    bytes_written: f64,
    /// Median CPU microseconds (all threads) per unit, for timed workloads.
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_median: Option<f64>,
    /// Median coordinator turns per run (`team1000` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    turns: Option<f64>,
}

/// The median of sorted values (the mean of the middle two for an even count).
fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        f64::midpoint(sorted[n / 2 - 1], sorted[n / 2])
    }
}

/// The nearest-rank 90th percentile of sorted values.
fn p90(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    let rank = (n * 9).div_ceil(10).max(1);
    sorted[rank - 1]
}

fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values
}

// ---------------------------------------------------------------------------
// Orchestration (the parent process)
// ---------------------------------------------------------------------------

/// Runs every selected workload in worker processes and prints the results.
fn orchestrate(options: &Options) -> Result<()> {
    let mut results = Vec::new();
    for &workload in &options.workloads {
        let mut samples = Vec::new();
        let mut peak_rss_bytes = 0;
        let reports = match workload {
            // A fresh process per run: the baseline must not include memory
            // an earlier run freed.
            Workload::Idle => (0..options.runs)
                .map(|_| spawn_worker(workload, options, 1, false))
                .collect::<Result<Vec<_>>>()?,
            Workload::Step
            | Workload::Dispatch
            | Workload::Children
            | Workload::Team1000
            | Workload::Resume1000
            | Workload::Chain3
            | Workload::Fanout5
            | Workload::State1k
            | Workload::State30k
            | Workload::State250k => {
                vec![spawn_worker(workload, options, options.runs, true)?]
            }
        };
        for report in reports {
            samples.extend(report.samples);
            peak_rss_bytes = peak_rss_bytes.max(report.peak_rss_bytes);
        }
        let figures = sorted(samples.iter().map(|s| s.figure));
        let cpu = sorted(samples.iter().filter_map(|s| s.cpu));
        let bytes = sorted(samples.iter().map(|s| s.bytes_written));
        let line = Line {
            workload: workload.name(),
            store: "memory",
            unit: workload.unit(),
            median: round(median(&figures)),
            p90: round(p90(&figures)),
            runs: samples.len(),
            size: options.size(workload),
            peak_rss_bytes,
            bytes_written: round(median(&bytes)),
            cpu_median: (!cpu.is_empty()).then(|| round(median(&cpu))),
            turns: {
                let turns = sorted(samples.iter().filter_map(|s| s.turns.map(|t| t as f64)));
                (!turns.is_empty()).then(|| median(&turns))
            },
        };
        println!("{}", serde_json::to_string(&line)?);
        results.push(line);
    }
    if !options.json {
        println!();
        print!("{}", table(&results));
    }
    Ok(())
}

/// Rounds to three decimals for printing.
fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// Runs this binary as a worker for `workload` and reads its report.
fn spawn_worker(
    workload: Workload,
    options: &Options,
    runs: usize,
    warm_up: bool,
) -> Result<WorkerReport> {
    let exe = std::env::current_exe().context("cannot find the bench binary")?;
    let mut command = Command::new(exe);
    command
        .args(["--worker", workload.name()])
        .args(["--runs", &runs.to_string()])
        .args(["--steps", &options.steps.to_string()])
        .args(["--dispatches", &options.dispatches.to_string()])
        .args(["--children", &options.children.to_string()])
        .args(["--idle", &options.idle.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    if warm_up {
        command.arg("--warm-up");
    }
    let output = command
        .output()
        .with_context(|| format!("failed to run the `{}` worker", workload.name()))?;
    if !output.status.success() {
        bail!(
            "the `{}` worker failed ({})",
            workload.name(),
            output.status
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout
        .lines()
        .last()
        .with_context(|| format!("the `{}` worker printed nothing", workload.name()))?;
    serde_json::from_str(last)
        .with_context(|| format!("the `{}` worker printed `{last}`", workload.name()))
}

/// The human table of the results.
fn table(results: &[Line]) -> String {
    let header = [
        "workload",
        "unit",
        "median",
        "p90",
        "cpu median",
        "bytes written",
        "peak RSS MiB",
        "runs",
    ];
    let mut rows = vec![header.map(str::to_owned).to_vec()];
    for line in results {
        let per = Workload::parse(line.workload).map_or("unit", Workload::per);
        rows.push(vec![
            line.workload.to_owned(),
            line.unit.to_owned(),
            line.median.to_string(),
            line.p90.to_string(),
            line.cpu_median
                .map_or("-".to_owned(), |cpu| cpu.to_string()),
            format!("{} B/{per}", line.bytes_written),
            format!("{:.1}", line.peak_rss_bytes as f64 / 1_048_576.0),
            line.runs.to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|column| rows.iter().map(|row| row[column].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    out
}

// ---------------------------------------------------------------------------
// Workers (one process per workload, or per `idle` run)
// ---------------------------------------------------------------------------

/// Runs one workload in this process and prints a [`WorkerReport`] line.
async fn worker(workload: Workload, options: &Options) -> Result<()> {
    let total = options.runs + usize::from(options.warm_up);
    let mut samples = Vec::with_capacity(total);
    for run in 0..total {
        let sample = match workload {
            Workload::Step => step_run(run, options.steps).await?,
            Workload::Dispatch => dispatch_run(run, options.dispatches).await?,
            Workload::Idle => idle_run(run, options.idle).await?,
            Workload::Children => children_run(run, options.children).await?,
            Workload::Team1000 => team_run(run).await?,
            Workload::Resume1000 => resume_run(run).await?,
            Workload::Chain3 => chain3_run(run).await?,
            Workload::Fanout5 => fanout5_run(run).await?,
            Workload::State1k => state_run(run, 1_000).await?,
            Workload::State30k => state_run(run, 30_000).await?,
            Workload::State250k => state_run(run, 250_000).await?,
        };
        samples.push(sample);
    }
    if options.warm_up {
        samples.remove(0);
    }
    let report = WorkerReport {
        samples,
        peak_rss_bytes: status_bytes("VmHWM")?,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Log bytes of a tree and how many of its records are adopted steps.
fn written(store: &MemoryStore, tree: TreeId) -> (u64, u64) {
    store
        .records(tree)
        .iter()
        .fold((0, 0), |(bytes, steps), r| {
            (
                bytes + r.body.len() as u64,
                steps + u64::from(r.kind == RecordKind::StepAdopted),
            )
        })
}

/// A start request for the bench scope.
fn request(key: String, input: u64) -> Result<StartRequest<u64>> {
    Ok(StartRequest::new(StartId::new("bench", key)?, input))
}

/// `step`: a root that continues with no effects until its budget of
/// `steps` steps ends it (`engine.limit.steps`, the expected ending).
async fn step_run(run: usize, steps: u64) -> Result<Sample> {
    let store = MemoryStore::keeping_history();
    let program = program(Workload::Step, None)?;
    let engine = Engine::new(EngineConfig::new(store.clone()).program(&program));
    let mut start = request(format!("step-{run}"), 0)?;
    start.budget = Budget::unlimited().with_steps(steps);

    let (cpu0, t0) = (cpu_ns(), now());
    let handle = engine.start(&program, start).await?;
    let termination = handle.await_result().await?;
    let (elapsed, cpu) = (now().duration_since(t0), cpu_ns().saturating_sub(cpu0));

    let code = termination.failure().map(|f| f.code().to_owned());
    if termination.status() != Status::Failed || code.as_deref() != Some("engine.limit.steps") {
        bail!("the step root ended {termination}, not with engine.limit.steps");
    }
    let (bytes, adopted) = written(&store, handle.tree());
    if adopted != steps {
        bail!("the step root adopted {adopted} steps, not {steps}");
    }
    engine.close().await;
    Ok(Sample {
        figure: elapsed.as_secs_f64() * 1e6 / steps as f64,
        cpu: Some(cpu as f64 / 1e3 / steps as f64),
        bytes_written: bytes as f64 / adopted as f64,
        turns: None,
    })
}

/// `dispatch`: a root that dispatches one effect per step to an echo
/// dispatcher, `dispatches` times, then completes.
async fn dispatch_run(run: usize, dispatches: u64) -> Result<Sample> {
    let store = MemoryStore::keeping_history();
    let program = program(Workload::Dispatch, Some(Arc::new(Echo)))?;
    let engine = Engine::new(EngineConfig::new(store.clone()).program(&program));
    let start = request(format!("dispatch-{run}"), dispatches)?;

    let (cpu0, t0) = (cpu_ns(), now());
    let handle = engine.start(&program, start).await?;
    let output = handle.output().await?;
    let (elapsed, cpu) = (now().duration_since(t0), cpu_ns().saturating_sub(cpu0));

    if output != dispatches {
        bail!("the dispatch root completed with {output}, not {dispatches}");
    }
    let (bytes, _) = written(&store, handle.tree());
    engine.close().await;
    Ok(Sample {
        figure: elapsed.as_secs_f64() * 1e6 / dispatches as f64,
        cpu: Some(cpu as f64 / 1e3 / dispatches as f64),
        bytes_written: bytes as f64 / dispatches as f64,
        turns: None,
    })
}

/// `children`: a root runs `children` child lifecycles, ten at a time.
async fn children_run(run: usize, children: u64) -> Result<Sample> {
    let store = MemoryStore::keeping_history();
    let program = program(Workload::Children, None)?;
    let engine = Engine::new(EngineConfig::new(store.clone()).program(&program));
    let start = request(format!("children-{run}"), children)?;

    let (cpu0, t0) = (cpu_ns(), now());
    let handle = engine.start(&program, start).await?;
    let output = handle.output().await?;
    let (elapsed, cpu) = (now().duration_since(t0), cpu_ns().saturating_sub(cpu0));

    if output != children {
        bail!("the children root completed with {output}, not {children}");
    }
    let (bytes, _) = written(&store, handle.tree());
    engine.close().await;
    Ok(Sample {
        figure: elapsed.as_secs_f64() * 1e6 / children as f64,
        cpu: Some(cpu as f64 / 1e3 / children as f64),
        bytes_written: bytes as f64 / children as f64,
        turns: None,
    })
}

/// Roots started per `chain3` or `fanout5` sample.
const SMALL_RUNS: u64 = 1_000;

/// Stages of the `state-*` chains.
const STATE_STAGES: u64 = 10;

fn build_name() -> String {
    format!("{} {}", env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
}

/// Runs `program` once per input on a fresh memory store, one new root per
/// run; returns (µs per run, CPU µs per run, log bytes per run).
async fn per_root<I: Serialize + Clone, O>(
    program: &Program<I, O>,
    prefix: &str,
    input: I,
    runs: u64,
) -> Result<(f64, f64, f64)> {
    let store = MemoryStore::keeping_history();
    let engine = Engine::new(EngineConfig::new(store.clone()).program(program));
    let (cpu0, t0) = (cpu_ns(), now());
    let mut trees = Vec::with_capacity(runs as usize);
    for index in 0..runs {
        let start = StartRequest::new(
            StartId::new("bench", format!("{prefix}-{index}"))?,
            input.clone(),
        );
        let handle = engine.start(program, start).await?;
        let termination = handle.join().await?;
        if termination.status() != Status::Completed {
            bail!("a {prefix} root ended {termination}");
        }
        trees.push(handle.tree());
    }
    let (elapsed, cpu) = (now().duration_since(t0), cpu_ns().saturating_sub(cpu0));
    let bytes: u64 = trees.iter().map(|tree| written(&store, *tree).0).sum();
    engine.close().await;
    let runs = runs as f64;
    Ok((
        elapsed.as_secs_f64() * 1e6 / runs,
        cpu as f64 / 1e3 / runs,
        bytes as f64 / runs,
    ))
}

/// `chain3` (W1): three pure transforms, each appending a short string.
async fn chain3_run(run: usize) -> Result<Sample> {
    let chain = Workflow::new(WorkflowConfig {
        name: "bench.chain3".into(),
        description: "Three pure stages.".into(),
        build: build_name(),
        stages: vec![
            transform("a", |text: String| Ok(text + "a")),
            transform("b", |text: String| Ok(text + "b")),
            transform("c", |text: String| Ok(text + "c")),
        ],
    })?
    .program::<String, String>();
    let (figure, cpu, bytes) =
        per_root(&chain, &format!("chain3-{run}"), "x".to_owned(), SMALL_RUNS).await?;
    Ok(Sample {
        figure,
        cpu: Some(cpu),
        bytes_written: bytes,
        turns: None,
    })
}

/// `fanout5` (W2): a root starts five children (each a pure transform),
/// waits for all of them and joins their five results.
async fn fanout5_run(run: usize) -> Result<Sample> {
    let branch = Workflow::new(WorkflowConfig {
        name: "bench.branch".into(),
        description: "One pure stage.".into(),
        build: build_name(),
        stages: vec![transform("double", |value: u64| Ok(value * 2))],
    })?
    .program::<u64, u64>();
    let branches = (0..5).map(|_| Child::new(&branch)).collect();
    let fanout = Workflow::new(WorkflowConfig {
        name: "bench.fanout5".into(),
        description: "Five children, then a join.".into(),
        build: build_name(),
        stages: vec![fork::<u64, u64, u64, _>("fan", branches, 5, |outputs| {
            Ok(outputs.iter().sum())
        })],
    })?
    .program::<u64, u64>();
    let (figure, cpu, bytes) =
        per_root(&fanout, &format!("fanout5-{run}"), 21u64, SMALL_RUNS).await?;
    Ok(Sample {
        figure,
        cpu: Some(cpu),
        bytes_written: bytes,
        turns: None,
    })
}

/// The state carried by the `state-*` chains.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Carried {
    /// Seeded random bytes, hex encoded (incompressible as bytes).
    blob: String,
    /// The small field each stage changes.
    stage: u64,
}

/// Deterministic pseudo-random hex of `len` characters (xorshift64*).
fn random_hex(len: usize, seed: u64) -> String {
    let mut state = seed.max(1);
    let mut out = String::with_capacity(len + 16);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let _ = write!(out, "{:016x}", state.wrapping_mul(0x2545_f491_4f6c_dd1d));
    }
    out.truncate(len);
    out
}

/// `state-*` (W4): a ten-stage chain whose state carries `size` bytes of
/// random data and changes one small field per stage; ms per stage and log
/// bytes per stage (the memory store keeps whole records, so this is what
/// a store without deduplication writes).
async fn state_run(run: usize, size: usize) -> Result<Sample> {
    let stages = (0..STATE_STAGES)
        .map(|index| {
            transform(&format!("s{index}"), |mut carried: Carried| {
                carried.stage += 1;
                Ok(carried)
            })
        })
        .collect();
    let chain = Workflow::new(WorkflowConfig {
        name: "bench.state".into(),
        description: "Ten stages carrying a large state.".into(),
        build: build_name(),
        stages,
    })?
    .program::<Carried, Carried>();
    let input = Carried {
        blob: random_hex(size, 0x5eed + run as u64),
        stage: 0,
    };
    let (figure, cpu, bytes) = per_root(&chain, &format!("state-{size}-{run}"), input, 5).await?;
    let stages = STATE_STAGES as f64;
    Ok(Sample {
        figure: figure / 1e3 / stages,
        cpu: Some(cpu / stages),
        bytes_written: bytes / stages,
        turns: None,
    })
}

/// Trees parked per `resume1000` run.
const RESUME_TREES: usize = 1000;

/// `resume1000` (W5): 1000 roots park on an input wait in a SQLite store;
/// the engine closes, the store is reopened, and a fresh engine recovers
/// every tree and answers it. The figure is milliseconds per tree for the
/// recovery and answer phase (same process; the second phase reopens the
/// database file as a new process would).
async fn resume_run(run: usize) -> Result<Sample> {
    let dir = std::env::temp_dir().join(format!("baton-bench-resume-{}-{run}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("resume.db");
    let program = program(Workload::Idle, None)?;
    {
        let store = SqliteStore::open(&path)?;
        let engine = Engine::new(EngineConfig::new(store).program(&program));
        let mut handles = Vec::with_capacity(RESUME_TREES);
        start_waiting(
            &engine,
            &program,
            &format!("resume-{run}"),
            RESUME_TREES,
            &mut handles,
        )
        .await?;
        engine.close().await;
    }
    let store = SqliteStore::open(&path)?;
    let engine = Engine::new(EngineConfig::new(store.clone()).program(&program));
    let (cpu0, t0) = (cpu_ns(), now());
    let report = engine.recover(RecoverOptions::default()).await?;
    if report.len() != RESUME_TREES || report.iter().any(|(_, result)| result.is_err()) {
        bail!(
            "recovered {} trees, expected {RESUME_TREES} without errors",
            report.len()
        );
    }
    let scope = Scope::new("bench")?;
    // Answer every tree concurrently, as many hosts would: the answers share
    // the store's group commits.
    let mut answering = tokio::task::JoinSet::new();
    for (tree, _) in &report {
        let handle = engine.process::<u64>(&scope, *tree).await?;
        // The idle program's first step declares its wait as effect 0.
        let wait = WaitId::for_effect(EffectId::new(*tree, 0, 0));
        answering.spawn(async move {
            handle
                .signal(SignalRequest {
                    id: SignalId::new("answer")?,
                    wait: Some(wait),
                    payload: Payload::encode(&true)?,
                })
                .await?;
            anyhow::Ok(handle.output().await?)
        });
    }
    while let Some(output) = answering.join_next().await {
        if output?? != 1 {
            bail!("a resumed tree completed with the wrong output");
        }
    }
    let (elapsed, cpu) = (now().duration_since(t0), cpu_ns().saturating_sub(cpu0));
    engine.close().await;
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Sample {
        figure: elapsed.as_secs_f64() * 1e3 / RESUME_TREES as f64,
        cpu: Some(cpu as f64 / 1e3 / RESUME_TREES as f64),
        bytes_written: bytes as f64 / RESUME_TREES as f64,
        turns: None,
    })
}

/// `idle`: starts `roots` roots that each open an external wait and sleep on
/// it; the figure is the growth of resident memory per waiting root.
async fn idle_run(run: usize, roots: usize) -> Result<Sample> {
    let store = MemoryStore::new();
    let program = program(Workload::Idle, None)?;
    let engine = Engine::new(EngineConfig::new(store.clone()).program(&program));
    let mut handles = Vec::with_capacity(IDLE_WARM_UP.max(roots));
    let mut trees = Vec::with_capacity(roots);
    start_waiting(
        &engine,
        &program,
        &format!("warm-{run}"),
        IDLE_WARM_UP,
        &mut handles,
    )
    .await?;
    handles.clear();

    let before = status_bytes("VmRSS")?;
    start_waiting(
        &engine,
        &program,
        &format!("idle-{run}"),
        roots,
        &mut handles,
    )
    .await?;
    trees.extend(handles.iter().map(ProcessHandle::tree));
    // Measured while the host still holds every handle: an idle tree nobody
    // holds is dropped from memory and reloaded from the store on demand.
    let after = status_bytes("VmRSS")?;
    handles.clear();

    let bytes: u64 = trees.iter().map(|tree| written(&store, *tree).0).sum();
    drop(engine);
    Ok(Sample {
        figure: after.saturating_sub(before) as f64 / roots as f64,
        cpu: None,
        bytes_written: bytes as f64 / roots as f64,
        turns: None,
    })
}

/// Starts `count` idle roots and returns once every one of them is waiting.
async fn start_waiting(
    engine: &Engine,
    program: &Program<u64, u64>,
    prefix: &str,
    count: usize,
    handles: &mut Vec<ProcessHandle<u64>>,
) -> Result<()> {
    for index in 0..count {
        handles.push(
            engine
                .start(program, request(format!("{prefix}-{index}"), 0)?)
                .await?,
        );
    }
    for handle in handles.iter() {
        let mut polls = 0u32;
        loop {
            let view = handle.inspect().await?;
            match view.root().status {
                Status::Waiting => break,
                Status::Running if polls < 1_000_000 => {}
                other => bail!("an idle root is {other:?} instead of waiting"),
            }
            polls += 1;
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The measured program and dispatcher
// ---------------------------------------------------------------------------

/// Everything a bench process remembers between steps.
#[derive(Debug, Serialize, Deserialize)]
struct State {
    /// Steps taken (`step`), dispatches declared (`dispatch`) or whether the
    /// wait was declared (`idle`).
    count: u64,
    /// How many dispatches to make (`dispatch` only).
    limit: u64,
    /// The wait it sleeps on (`idle` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wait: Option<WaitId>,
}

/// The behaviour of every bench program; `workload` picks the loop.
struct Bench {
    workload: Workload,
    descriptor: Descriptor,
    /// The idle wait's answer schema, compiled once and shared by every wait.
    answer: Schema,
    /// The declared child program (`children` only).
    child: Option<Program>,
}

struct Run {
    workload: Workload,
    answer: Schema,
    child: Option<baton::run::Digest>,
    state: State,
}

impl Definition for Bench {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(Run {
            workload: self.workload,
            answer: self.answer.clone(),
            child: self.child.as_ref().map(|c| c.reference().digest),
            state: State {
                count: 0,
                limit: input.decode()?,
                wait: None,
            },
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(Run {
            workload: self.workload,
            answer: self.answer.clone(),
            child: self.child.as_ref().map(|c| c.reference().digest),
            state: state.decode()?,
        }))
    }

    fn children(&self) -> Vec<Program> {
        self.child.iter().cloned().collect()
    }
}

impl Execution for Run {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        let state = &mut self.state;
        match self.workload {
            Workload::Step => {
                state.count += 1;
                Ok(Transition::Continue {
                    consumed: window.len(),
                    effects: Vec::new(),
                })
            }
            Workload::Dispatch if state.count < state.limit => {
                state.count += 1;
                Ok(Transition::Continue {
                    consumed: window.len(),
                    effects: vec![Effect::dispatch(Payload::encode(&state.count)?)],
                })
            }
            Workload::Dispatch => Ok(Transition::Complete {
                consumed: window.len(),
                output: Payload::encode(&state.count)?,
            }),
            Workload::Children if state.count < state.limit => {
                let child = self
                    .child
                    .context("no child program")
                    .map_err(StepError::other)?;
                let batch = (state.limit - state.count).min(10);
                let keys = (state.count..state.count + batch)
                    .map(|i| ChildKey::new(format!("c{i}")))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut effects = keys
                    .iter()
                    .map(|key| {
                        Ok(Effect::StartChild {
                            key: key.clone(),
                            program: child,
                            input: Payload::encode(&key.as_str())?,
                            budget: Budget::unlimited(),
                            capabilities: Default::default(),
                        })
                    })
                    .collect::<Result<Vec<_>, StepError>>()?;
                effects.push(Effect::WaitChildren {
                    keys,
                    boundary: Boundary::Result,
                    condition: Condition::All,
                });
                state.count += batch;
                Ok(Transition::Continue {
                    consumed: window.len(),
                    effects,
                })
            }
            Workload::Children => Ok(Transition::Complete {
                consumed: window.len(),
                output: Payload::encode(&state.count)?,
            }),
            Workload::Idle if state.count == 0 => {
                state.count = 1;
                Ok(Transition::Continue {
                    consumed: 0,
                    effects: vec![Effect::Wait {
                        key: ChildKey::new("answer").map_err(StepError::other)?,
                        request: Payload::null(),
                        answer_schema: self.answer.clone(),
                    }],
                })
            }
            Workload::Idle => {
                for (index, signal) in window.iter().enumerate() {
                    match &signal.body {
                        SignalBody::WaitOpened { wait, .. } => state.wait = Some(*wait),
                        SignalBody::Input { payload }
                            if signal.wait.is_some() && signal.wait == state.wait =>
                        {
                            return Ok(Transition::Complete {
                                consumed: index + 1,
                                output: Payload::encode(&payload.decode::<bool>().map(u64::from)?)?,
                            });
                        }
                        _ => {}
                    }
                }
                let wait = state
                    .wait
                    .ok_or_else(|| StepError::other("stepped before the wait opened"))?;
                Ok(Transition::Wait {
                    consumed: window.len(),
                    wait,
                })
            }
            Workload::Team1000
            | Workload::Resume1000
            | Workload::Chain3
            | Workload::Fanout5
            | Workload::State1k
            | Workload::State30k
            | Workload::State250k => Err(StepError::other("this workload runs another program")),
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }
}

/// Binds the bench program of a workload.
fn program(
    workload: Workload,
    dispatcher: Option<Arc<dyn Dispatcher>>,
) -> Result<Program<u64, u64>> {
    let definition = Bench {
        workload,
        descriptor: Descriptor::new(
            &format!("bench.{}", workload.name()),
            "A benchmark workload of the Baton kernel.",
            Schema::of::<u64>(),
            Schema::of::<u64>(),
        )?,
        answer: Schema::of::<bool>(),
        child: (workload == Workload::Children).then(echo_child),
    };
    Ok(Program::new(ProgramConfig {
        definition: Arc::new(definition),
        dispatcher,
        implementation: implementation_digest(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        configuration: configuration_digest(&workload)?,
    }))
}

/// A child that completes at once with its input.
struct EchoChild(Descriptor);

struct EchoRun(Payload);

impl Definition for EchoChild {
    fn descriptor(&self) -> &Descriptor {
        &self.0
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(EchoRun(input.clone())))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(EchoRun(state.0.clone())))
    }
}

impl Execution for EchoRun {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        Ok(Transition::Complete {
            consumed: window.len(),
            output: self.0.clone(),
        })
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        Ok(ExecutionState(self.0.clone()))
    }
}

fn echo_child() -> Program {
    let descriptor = Descriptor::new(
        "bench.echo",
        "Completes with its input.",
        Schema::any(),
        Schema::any(),
    )
    .expect("a static descriptor is valid");
    Program::new(ProgramConfig {
        definition: Arc::new(EchoChild(descriptor)),
        dispatcher: None,
        implementation: implementation_digest(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        configuration: configuration_digest(&()).expect("unit encodes"),
    })
}

/// Rounds of a `team1000` run.
const TEAM_ROUNDS: u64 = 10;

/// Worker tasks per `team1000` round.
const TEAM_BATCH: u64 = 100;

/// The `team1000` coordinator: while tasks run, `wait`; when none runs,
/// request the next round of 100 (each task's input is its index); after
/// ten rounds, complete with the sum of the outputs.
fn team_decide(turn: &Turn) -> Result<Decision, Failure> {
    let bad = |message: String| Failure::execution("bench.team.unexpected", message);
    let state = turn.state.clone();
    if turn.running().next().is_some() {
        return Ok(Decision::new(Mode::Wait, state));
    }
    let done = turn.tasks.len() as u64;
    if done < TEAM_ROUNDS * TEAM_BATCH {
        let worker = Name::new("bench.double").map_err(|e| bad(e.to_string()))?;
        let mut decision = Decision::new(Mode::Wait, state);
        for index in done..done + TEAM_BATCH {
            decision = decision.with_task(TaskRequest::new(
                ChildKey::new(format!("t{index}")).map_err(|e| bad(e.to_string()))?,
                worker.clone(),
                Payload::encode(&index).map_err(|e| bad(e.to_string()))?,
            ));
        }
        return Ok(decision);
    }
    let mut sum = 0u64;
    for task in &turn.tasks {
        let output = task
            .output()
            .ok_or_else(|| bad(format!("task {} did not complete", task.key())))?;
        sum += output.decode::<u64>().map_err(|e| bad(e.to_string()))?;
    }
    let output = Payload::encode(&sum).map_err(|e| bad(e.to_string()))?;
    Ok(Decision::complete(turn.state.clone(), output))
}

/// `team1000`: a team runs ten rounds of 100 worker tasks.
async fn team_run(run: usize) -> Result<Sample> {
    let coordinator = Policy::new(PolicyConfig {
        name: "bench.coordinator".into(),
        description: "Requests rounds of tasks and waits for them.".into(),
        build: format!("{} {}", env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        decide: Arc::new(team_decide),
    })?
    .program();
    let worker = Workflow::new(WorkflowConfig {
        name: "bench.double".into(),
        description: "Doubles its index.".into(),
        build: format!("{} {}", env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        stages: vec![transform("double", |index: u64| Ok(index * 2))],
    })?
    .program::<u64, u64>();
    let team = compile::<u64, u64>(TeamConfig {
        name: "bench.team".into(),
        description: "Runs 1000 worker tasks, 100 at a time.".into(),
        coordinator: Binding::new(&coordinator),
        workers: vec![Binding::new(&worker)],
        max_turns: Quota::Unlimited,
        max_tasks: Quota::Unlimited,
        max_concurrent_tasks: TEAM_BATCH as u32,
        max_controls_per_turn: 1,
    })?;
    let store = MemoryStore::keeping_history();
    let mut config = EngineConfig::new(store.clone()).program(&team);
    config.limits = TreeLimits {
        // 100 tasks and the coordinator at once.
        max_active_children: TEAM_BATCH as u32 + 8,
        ..TreeLimits::default()
    };
    let engine = Engine::new(config);
    let start = StartRequest::new(StartId::new("bench", format!("team-{run}"))?, 0u64);

    let (cpu0, t0) = (cpu_ns(), now());
    let handle = engine.start(&team, start).await?;
    let termination = handle.join().await?;
    let (elapsed, cpu) = (now().duration_since(t0), cpu_ns().saturating_sub(cpu0));

    let tasks = TEAM_ROUNDS * TEAM_BATCH;
    let expected = tasks * (tasks - 1);
    let output: Option<u64> = termination.output().and_then(|o| o.decode().ok());
    if output != Some(expected) {
        bail!("the team ended {termination}, not with {expected}");
    }
    let view = handle.inspect().await?;
    let turns = view
        .root()
        .children
        .keys()
        .filter(|key| key.as_str().starts_with(baton::team::RESERVED_PREFIX))
        .count() as u64;
    let (bytes, _) = written(&store, handle.tree());
    engine.close().await;
    Ok(Sample {
        figure: elapsed.as_secs_f64() * 1e6 / tasks as f64,
        cpu: Some(cpu as f64 / 1e3 / tasks as f64),
        bytes_written: bytes as f64 / tasks as f64,
        turns: Some(turns),
    })
}

/// Settles every dispatch at once with its own request.
struct Echo;

impl Dispatcher for Echo {
    fn replay_policy(&self, _request: &Payload) -> ReplayPolicy {
        ReplayPolicy::Never
    }

    fn dispatch(&self, call: DispatchCall) -> BoxFuture<'static, Settlement> {
        Box::pin(std::future::ready(Settlement::ok(call.request)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        assert_eq!(median(&[1.0, 2.0, 3.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 3.0, 4.0]), 2.5);
        assert_eq!(p90(&[1.0, 2.0, 3.0, 4.0, 5.0]), 5.0);
        assert_eq!(p90(&(1..=10).map(f64::from).collect::<Vec<_>>()), 9.0);
        assert_eq!(p90(&[7.0]), 7.0);
    }

    #[test]
    fn options_parse() {
        let args: Vec<String> = ["idle", "step", "--runs", "3", "--idle", "100", "--json"]
            .map(String::from)
            .to_vec();
        let options = Options::parse(&args).unwrap();
        assert_eq!(options.workloads, [Workload::Idle, Workload::Step]);
        assert_eq!((options.runs, options.idle, options.json), (3, 100, true));
        assert!(Options::parse(&["nope".to_owned()]).is_err());
        assert!(Options::parse(&["--runs".to_owned(), "0".to_owned()]).is_err());
        assert_eq!(Options::parse(&[]).unwrap().workloads, Workload::ALL);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn workloads_run_small() {
        let step = step_run(0, 50).await.unwrap();
        assert!(step.figure > 0.0 && step.bytes_written > 0.0);
        let dispatch = dispatch_run(0, 20).await.unwrap();
        assert!(dispatch.figure > 0.0 && dispatch.bytes_written > 0.0);
        assert!(chain3_run(0).await.unwrap().figure > 0.0);
        assert!(fanout5_run(0).await.unwrap().figure > 0.0);
        let state = state_run(0, 1_000).await.unwrap();
        assert!(
            state.bytes_written * STATE_STAGES as f64 > 1_000.0,
            "the run records its state at least once"
        );
        let children = children_run(0, 25).await.unwrap();
        assert!(children.figure > 0.0 && children.bytes_written > 0.0);
        let idle = idle_run(0, 20).await.unwrap();
        assert!(idle.bytes_written > 0.0);
        let team = team_run(0).await.unwrap();
        // One turn per round at least (when the round has drained by the
        // next turn), plus the turn that outputs the sum.
        assert!(team.figure > 0.0 && team.turns.is_some_and(|turns| turns > TEAM_ROUNDS));
    }
}
