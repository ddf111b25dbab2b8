//! # baton-bench: workloads that measure the Baton kernel
//!
//! `baton-bench [WORKLOAD...] [--store memory|sqlite] [--json] [--runs N]`
//! runs the named workloads (all of them when none is named) on the named
//! stores (both when none is named) and prints one JSON line per workload
//! and store, then a table (`--json` prints only the JSON lines).
//! `cargo xtask bench` runs it in release mode.
//!
//! ## Stores
//!
//! Every workload runs on each chosen store, and every run gets a fresh one:
//! - `memory`: `MemoryStore::keeping_history()`.
//! - `sqlite`: a `SqliteStore` with its defaults (WAL, `synchronous =
//!   FULL`, so every commit is durable; compaction on), in a fresh directory
//!   under the system's temporary directory (`TMPDIR`), removed afterwards.
//!
//! The JSON line's `store` field names the store the figures come from.
//! `bytes_written` is the median, per unit of work, of what a run wrote to
//! its store:
//! - on `memory`, the bytes of the log record bodies the run appended
//!   (snapshots are not counted; every record keeps its whole body);
//! - on `sqlite`, the growth of `SqliteStore::bytes_written`: record bodies
//!   and snapshot states stored inline, the manifests of chunked ones, and
//!   only the content-defined pieces that were newly inserted (a piece the
//!   tree already stored is not counted again); no row, index, page or WAL
//!   overhead.
//!
//! On `sqlite` the line also has `io_bytes`: the growth of `wchar` in
//! `/proc/self/io` over the measured phase, per unit of work. It counts
//! every byte the process handed to `write(2)`, so WAL frames (whole
//! pages), checkpoints into the database file and SQLite's headers are
//! included; the checkpoint when the store closes after the run is not.
//!
//! ## Workloads
//!
//! - `chain3` (W1): a workflow of three pure transforms, 1000 new roots per
//!   run, one after another; the figure is wall time per root.
//! - `fanout5` (W2): a workflow that starts five children, waits for all
//!   and joins their results, 1000 new roots per run; time per root.
//! - `state-1k`, `state-30k`, `state-250k` (W4): a kernel program that takes
//!   one step per stage, ten stages (`Continue` with no effects nine times,
//!   then `Complete` with the stage count), carrying a state of 1 KB, 30 KB
//!   or 250 KB of seeded random hex text and a small `stage` field that
//!   every step increments; five roots per run. The figure is milliseconds
//!   per stage, `bytes_written` is everything the run wrote divided by its
//!   stages, and `marginal_bytes` is what one more stage writes: the same
//!   input through a 20-stage version of the program on a fresh store of
//!   the same kind, `(B20 - B10) / 10` per root, so the unavoidable first
//!   write of the input does not count.
//! - `step`: one root loops `Continue` with no effects and a counter state
//!   until its step budget ends it; the figure is wall time per step.
//! - `dispatch`: one root dispatches one effect per step to an echo
//!   dispatcher; the figure is wall time per dispatch (a pending commit, a
//!   settled commit and a step).
//! - `children`: one root starts ten children at a time (each completes at
//!   once with its input) and waits for all ten, until it has run the asked
//!   number; the figure is wall time per child lifecycle.
//! - `team1000` (W3): a team whose scripted coordinator requests 100 worker
//!   tasks (a one-stage workflow doubling its index) with mode `wait`,
//!   keeps answering `wait` until all 100 have drained, then requests the
//!   next 100, ten rounds, and completes with the sum; the figure is wall
//!   time per task, and the run also reports the coordinator turns.
//! - `resume1000` (W5): 1000 roots (`--resume`) each park on a
//!   `baton::coordination::InputGate`; the engine closes; then a fresh
//!   engine on the same store recovers every tree and answers every gate
//!   concurrently, and the phase ends when every output has arrived. On
//!   `memory` the second phase runs in the same process over the same
//!   `MemoryStore`; on `sqlite` it runs in a separate process (this binary
//!   again, with the hidden `--resume-phase2 DB` flag) and is timed from
//!   opening the database file. The figure is milliseconds per tree;
//!   `total_seconds` is the whole phase; bytes are those of that phase.
//! - `idle` (W6): many roots (`--idle`) each wait on an `InputGate`; the
//!   figure is resident memory growth per waiting process.
//!
//! ## Processes and figures
//!
//! Each workload runs, per store, in a child process of its own (this
//! binary again, with the hidden `--worker` and `--store` flags) so that
//! its peak resident memory is its own; each `idle` run gets a fresh
//! process, because memory freed by an earlier run would otherwise hide
//! growth. The other workloads run once to warm up and then `--runs`
//! times; the medians and 90th percentiles are of the per-run figures. CPU
//! time is the sum over the process's threads of the on-CPU time in
//! `/proc/self/task/*/schedstat` (for `resume1000` on `sqlite`, that of the
//! second-phase process).
//!
//! The bench depends only on the `baton` facade; it measures `baton::run`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use baton::coordination::{Answer, InputGate};
use baton::run::log::RecordKind;
use baton::run::{
    Boundary, BoxFuture, Budget, ChildKey, Condition, Definition, Descriptor, DispatchCall,
    Dispatcher, Effect, EffectId, Engine, EngineConfig, Execution, ExecutionState, Failure,
    ListFilter, MemoryStore, Name, Payload, ProcessHandle, Program, ProgramConfig, Quota,
    RecoverOptions, ReplayPolicy, Schema, Scope, Settlement, Signal, SignalId, SignalRequest,
    StartId, StartRequest, Status, StepError, Store, Transition, TreeId, TreeLimits, TreeStatus,
    WaitId, configuration_digest, implementation_digest,
};
use baton::store::sqlite::SqliteStore;
use baton::team::{
    Binding, Config as TeamConfig, Decision, Mode, Policy, PolicyConfig, TaskRequest, Turn, compile,
};
use baton::workflow::{Child, Config as WorkflowConfig, Workflow, fork, transform};
use serde::{Deserialize, Serialize};

/// Help text, printed for `--help` and after a usage error.
const USAGE: &str = "\
usage: baton-bench [WORKLOAD...] [--store memory|sqlite] [--json] [--runs N]
                   [--steps N] [--dispatches N] [--children N] [--resume N] [--idle N]

workloads (all when none is named):
  chain3      wall time per root of a three-transform workflow (1000 roots per run)
  fanout5     wall time per root that starts five children and joins them (1000 roots per run)
  state-1k    ms per stage of a ten-step chain carrying 1 KB of random state (also: marginal bytes per step)
  state-30k   the same with 30 KB
  state-250k  the same with 250 KB
  step        wall time per step of a root that loops Continue with a counter state
  dispatch    wall time per dispatch to an echo dispatcher (pending + settled + step)
  children    wall time per child lifecycle (start, complete, wait), ten children at a time
  team1000    wall time per worker task of a team running 1000 tasks, 100 at a time (also: coordinator turns)
  resume1000  ms per tree to recover roots parked on an input gate with a fresh engine and answer them all
              (sqlite: in a separate process)
  idle        resident memory per process waiting on an input gate

options:
  --store S       memory, sqlite or memory,sqlite; repeatable (default: both)
  --json          print only the JSON lines, not the table
  --runs N        measured runs per workload and store after one warm-up (default 5)
  --steps N       steps per `step` run (default 20000)
  --dispatches N  dispatches per `dispatch` run (default 5000)
  --children N    child lifecycles per `children` run (default 2000)
  --resume N      parked roots per `resume1000` run (default 1000)
  --idle N        waiting roots per `idle` run (default 100000, as W6 asks)";

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
    /// Processes waiting on an input gate.
    Idle,
    /// Child lifecycles: start, complete, wait for, ten at a time.
    Children,
    /// A team running 1000 worker tasks, 100 at a time.
    Team1000,
    /// Roots parked on an input gate, recovered and answered by a fresh engine.
    Resume1000,
    /// W1: a workflow of three pure transforms, a new root per run.
    Chain3,
    /// W2: a root starts five children, waits for all, joins their results.
    Fanout5,
    /// W4: a ten-step chain carrying 1 KB of random state.
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

    /// The unit of work that `bytes_written` and `io_bytes` are divided by.
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

    /// The random state carried by a `state-*` workload, in bytes.
    fn state_size(self) -> Option<usize> {
        match self {
            Workload::State1k => Some(1_000),
            Workload::State30k => Some(30_000),
            Workload::State250k => Some(250_000),
            _ => None,
        }
    }
}

/// A store the workloads run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StoreKind {
    /// `MemoryStore::keeping_history()`.
    Memory,
    /// A `SqliteStore` in a fresh temporary directory, durable commits on.
    Sqlite,
}

impl StoreKind {
    /// Both stores, in the order they run.
    const ALL: [StoreKind; 2] = [StoreKind::Memory, StoreKind::Sqlite];

    fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Sqlite => "sqlite",
        }
    }

    fn parse(name: &str) -> Option<StoreKind> {
        StoreKind::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// The parsed command line.
#[derive(Debug)]
struct Options {
    workloads: Vec<Workload>,
    stores: Vec<StoreKind>,
    json: bool,
    runs: usize,
    steps: u64,
    dispatches: u64,
    children: u64,
    resume: usize,
    idle: usize,
    /// Hidden: run one workload on the one store named in this process and
    /// print its samples.
    worker: Option<Workload>,
    /// Hidden, with `--worker`: run once before the measured runs.
    warm_up: bool,
    /// Hidden: run the second phase of `resume1000` on this SQLite file and
    /// print its sample.
    resume_phase2: Option<PathBuf>,
}

impl Options {
    fn parse(args: &[String]) -> Result<Options> {
        let mut options = Options {
            workloads: Vec::new(),
            stores: Vec::new(),
            json: false,
            runs: 5,
            steps: 20_000,
            dispatches: 5_000,
            children: 2_000,
            resume: 1_000,
            idle: 100_000,
            worker: None,
            warm_up: false,
            resume_phase2: None,
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = |flag: &str, what: &str| -> Result<&String> {
                args.next()
                    .with_context(|| format!("`{flag}` needs {what}\n\n{USAGE}"))
            };
            let number = |flag: &str, value: &str| -> Result<u64> {
                match value.parse::<u64>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => bail!("`{flag}` needs a positive number, got `{value}`\n\n{USAGE}"),
                }
            };
            match arg.as_str() {
                "--json" => options.json = true,
                "--runs" => options.runs = usize::try_from(number(arg, value(arg, "a number")?)?)?,
                "--steps" => options.steps = number(arg, value(arg, "a number")?)?,
                "--dispatches" => options.dispatches = number(arg, value(arg, "a number")?)?,
                "--children" => options.children = number(arg, value(arg, "a number")?)?,
                "--resume" => {
                    options.resume = usize::try_from(number(arg, value(arg, "a number")?)?)?;
                }
                "--idle" => options.idle = usize::try_from(number(arg, value(arg, "a number")?)?)?,
                "--store" => {
                    for name in value(arg, "a store")?.split(',') {
                        let store = StoreKind::parse(name.trim()).with_context(|| {
                            format!("unknown store `{name}` (memory or sqlite)\n\n{USAGE}")
                        })?;
                        if !options.stores.contains(&store) {
                            options.stores.push(store);
                        }
                    }
                }
                "--warm-up" => options.warm_up = true,
                "--worker" => {
                    let name = value(arg, "a workload")?;
                    options.worker = Some(
                        Workload::parse(name)
                            .with_context(|| format!("unknown workload `{name}`\n\n{USAGE}"))?,
                    );
                }
                "--resume-phase2" => {
                    options.resume_phase2 = Some(PathBuf::from(value(arg, "a database path")?));
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
        if options.stores.is_empty() {
            options.stores = StoreKind::ALL.to_vec();
        }
        Ok(options)
    }

    /// The work per run: steps, dispatches, tasks, roots or stages.
    fn size(&self, workload: Workload) -> u64 {
        match workload {
            Workload::Step => self.steps,
            Workload::Dispatch => self.dispatches,
            Workload::Idle => self.idle as u64,
            Workload::Children => self.children,
            Workload::Team1000 => TEAM_ROUNDS * TEAM_BATCH,
            Workload::Resume1000 => self.resume as u64,
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
        Ok(options) => match (options.resume_phase2.clone(), options.worker) {
            (Some(path), _) => {
                hosted(async move { resume_phase2_main(&path, options.resume).await }).await
            }
            (None, Some(workload)) => hosted(async move { worker(workload, &options).await }).await,
            (None, None) => orchestrate(&options),
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

/// Runs a host (a worker, or the second phase of `resume1000`) in a tokio
/// task, as a server's handler would.
async fn hosted(host: impl Future<Output = Result<()>> + Send + 'static) -> Result<()> {
    tokio::spawn(host).await?
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

/// Bytes this process has handed to `write(2)` and its kin so far (`wchar`
/// of `/proc/self/io`; 0 where the kernel does not offer it).
fn io_written() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|line| line.strip_prefix("wchar:"))
                .and_then(|value| value.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A directory of its own under the system's temporary directory, removed
/// with everything in it when dropped.
#[derive(Debug)]
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "baton-bench-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The store behind a [`BenchStore`].
enum Backend {
    Memory(MemoryStore),
    Sqlite(SqliteStore),
}

/// A store for one run: a fresh `MemoryStore` keeping its history, or a
/// `SqliteStore` in a fresh temporary directory that goes away with it.
struct BenchStore {
    kind: StoreKind,
    backend: Backend,
    /// The SQLite file's directory. Declared after the store, so the store
    /// handle is closed before the directory is removed.
    dir: Option<TempDir>,
}

impl BenchStore {
    /// A new, empty store of `kind`.
    fn fresh(kind: StoreKind) -> Result<BenchStore> {
        Ok(match kind {
            StoreKind::Memory => BenchStore {
                kind,
                backend: Backend::Memory(MemoryStore::keeping_history()),
                dir: None,
            },
            StoreKind::Sqlite => {
                let dir = TempDir::new()?;
                let store = SqliteStore::open(dir.0.join("bench.db"))?;
                BenchStore {
                    kind,
                    backend: Backend::Sqlite(store),
                    dir: Some(dir),
                }
            }
        })
    }

    /// Opens an existing SQLite file (whose directory someone else owns).
    fn open_sqlite(path: &Path) -> Result<BenchStore> {
        Ok(BenchStore {
            kind: StoreKind::Sqlite,
            backend: Backend::Sqlite(SqliteStore::open(path)?),
            dir: None,
        })
    }

    /// An engine configuration with the defaults over this store.
    fn config(&self) -> EngineConfig {
        EngineConfig::with_store(self.store())
    }

    /// The store, as the engine sees it.
    fn store(&self) -> Arc<dyn Store> {
        match &self.backend {
            Backend::Memory(store) => Arc::new(store.clone()),
            Backend::Sqlite(store) => Arc::new(store.clone()),
        }
    }

    /// The memory store, to read its records.
    fn memory(&self) -> Option<&MemoryStore> {
        match &self.backend {
            Backend::Memory(store) => Some(store),
            Backend::Sqlite(_) => None,
        }
    }

    /// Payload bytes written to the store so far: on memory, the bodies of
    /// every stored record; on SQLite, `SqliteStore::bytes_written`.
    async fn bytes_written(&self) -> Result<u64> {
        match &self.backend {
            Backend::Memory(store) => {
                let trees = store.list(ListFilter::default()).await?;
                Ok(trees
                    .iter()
                    .flat_map(|meta| store.records(meta.tree))
                    .map(|record| record.body.len() as u64)
                    .sum())
            }
            Backend::Sqlite(store) => Ok(store.bytes_written()),
        }
    }

    /// Closes this handle and hands over the SQLite file's directory, so the
    /// file can be reopened (by another process) before it is removed.
    fn close(self) -> Option<TempDir> {
        let BenchStore { backend, dir, .. } = self;
        drop(backend);
        dir
    }
}

/// The start of a measured phase.
struct Phase {
    kind: StoreKind,
    bytes: u64,
    io: u64,
    cpu: u64,
    t0: Instant,
}

impl Phase {
    /// Starts measuring, given the store's `bytes` written so far.
    fn begin(kind: StoreKind, bytes: u64) -> Phase {
        let (io, cpu) = (io_written(), cpu_ns());
        Phase {
            kind,
            bytes,
            io,
            cpu,
            t0: now(),
        }
    }

    /// Starts measuring on `store`.
    async fn on(store: &BenchStore) -> Result<Phase> {
        Ok(Phase::begin(store.kind, store.bytes_written().await?))
    }

    /// Stops the clocks, then reads what `store` wrote during the phase.
    async fn end(self, store: &BenchStore) -> Result<Measured> {
        let (t1, cpu, io) = (now(), cpu_ns(), io_written());
        let bytes = store.bytes_written().await?;
        Ok(Measured {
            seconds: t1.duration_since(self.t0).as_secs_f64(),
            cpu_ns: cpu.saturating_sub(self.cpu),
            bytes: bytes.saturating_sub(self.bytes),
            io: (self.kind == StoreKind::Sqlite).then(|| io.saturating_sub(self.io)),
        })
    }
}

/// What a measured phase took and wrote.
#[derive(Clone, Copy, Debug)]
struct Measured {
    seconds: f64,
    cpu_ns: u64,
    /// Bytes written to the store.
    bytes: u64,
    /// Bytes handed to `write(2)` (SQLite only).
    io: Option<u64>,
}

impl Measured {
    /// A sample over `units` units of work whose figure is wall time per
    /// unit, scaled by `scale` (1e6 for µs, 1e3 for ms); CPU time is in µs.
    fn per(&self, units: u64, scale: f64) -> Sample {
        let units = units as f64;
        Sample {
            figure: self.seconds * scale / units,
            cpu: Some(self.cpu_ns as f64 / 1e3 / units),
            bytes_written: self.bytes as f64 / units,
            io_bytes: self.io.map(|io| io as f64 / units),
            ..Sample::default()
        }
    }
}

/// The figures of one run.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
struct Sample {
    /// The headline figure, in the workload's unit.
    figure: f64,
    /// CPU microseconds per unit of work, when the figure is a time.
    cpu: Option<f64>,
    /// Store bytes per unit of work.
    bytes_written: f64,
    /// Bytes handed to `write(2)` per unit of work (SQLite only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    io_bytes: Option<f64>,
    /// Store bytes per extra stage (`state-*` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    marginal_bytes: Option<f64>,
    /// Seconds of the whole measured phase (`resume1000` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    total_seconds: Option<f64>,
    /// Coordinator turns (`team1000` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    turns: Option<u64>,
    /// Peak resident memory of a helper process (the second phase of
    /// `resume1000` on SQLite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    peak_rss_bytes: Option<u64>,
}

/// What a worker process reports.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerReport {
    samples: Vec<Sample>,
    peak_rss_bytes: u64,
}

/// The result of one workload on one store: one JSON line.
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
    /// Steps, dispatches, tasks, roots or stages per run.
    size: u64,
    /// The largest `VmHWM` of the workload's processes.
    peak_rss_bytes: u64,
    /// Median store bytes per unit of work.
    bytes_written: f64,
    /// Median bytes handed to `write(2)` per unit of work (SQLite only).
    #[serde(skip_serializing_if = "Option::is_none")]
    io_bytes: Option<f64>,
    /// Median store bytes per extra stage (`state-*` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    marginal_bytes: Option<f64>,
    /// Median seconds of the whole measured phase (`resume1000` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    total_seconds: Option<f64>,
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

/// The rounded median of the values `pick` finds, if it finds any.
fn median_of(samples: &[Sample], pick: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
    let values = sorted(samples.iter().filter_map(pick));
    (!values.is_empty()).then(|| round(median(&values)))
}

// ---------------------------------------------------------------------------
// Orchestration (the parent process)
// ---------------------------------------------------------------------------

/// Runs every selected workload on every selected store in worker processes
/// and prints the results.
fn orchestrate(options: &Options) -> Result<()> {
    let mut results = Vec::new();
    for &workload in &options.workloads {
        for &store in &options.stores {
            let line = measure(workload, store, options)?;
            println!("{}", serde_json::to_string(&line)?);
            results.push(line);
        }
    }
    if !options.json {
        println!();
        print!("{}", table(&results));
    }
    Ok(())
}

/// Runs one workload on one store in worker processes and sums it up.
fn measure(workload: Workload, store: StoreKind, options: &Options) -> Result<Line> {
    let reports = match workload {
        // A fresh process per run: the baseline must not include memory
        // an earlier run freed.
        Workload::Idle => (0..options.runs)
            .map(|_| spawn_worker(workload, store, options, 1, false))
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
            vec![spawn_worker(workload, store, options, options.runs, true)?]
        }
    };
    let mut samples = Vec::new();
    let mut peak_rss_bytes = 0;
    for report in reports {
        peak_rss_bytes = peak_rss_bytes.max(report.peak_rss_bytes);
        samples.extend(report.samples);
    }
    for sample in &samples {
        peak_rss_bytes = peak_rss_bytes.max(sample.peak_rss_bytes.unwrap_or(0));
    }
    let figures = sorted(samples.iter().map(|s| s.figure));
    Ok(Line {
        workload: workload.name(),
        store: store.name(),
        unit: workload.unit(),
        median: round(median(&figures)),
        p90: round(p90(&figures)),
        runs: samples.len(),
        size: options.size(workload),
        peak_rss_bytes,
        bytes_written: median_of(&samples, |s| Some(s.bytes_written)).unwrap_or(f64::NAN),
        io_bytes: median_of(&samples, |s| s.io_bytes),
        marginal_bytes: median_of(&samples, |s| s.marginal_bytes),
        total_seconds: median_of(&samples, |s| s.total_seconds),
        cpu_median: median_of(&samples, |s| s.cpu),
        turns: median_of(&samples, |s| s.turns.map(|t| t as f64)),
    })
}

/// Rounds to three decimals for printing.
fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// Runs this binary as a worker for `workload` on `store` and reads its report.
fn spawn_worker(
    workload: Workload,
    store: StoreKind,
    options: &Options,
    runs: usize,
    warm_up: bool,
) -> Result<WorkerReport> {
    let exe = this_binary()?;
    let mut command = Command::new(exe);
    command
        .args(["--worker", workload.name()])
        .args(["--store", store.name()])
        .args(["--runs", &runs.to_string()])
        .args(["--steps", &options.steps.to_string()])
        .args(["--dispatches", &options.dispatches.to_string()])
        .args(["--children", &options.children.to_string()])
        .args(["--resume", &options.resume.to_string()])
        .args(["--idle", &options.idle.to_string()]);
    if warm_up {
        command.arg("--warm-up");
    }
    run_self(
        command,
        &format!("the `{}` worker on {}", workload.name(), store.name()),
    )
}

/// This process's own executable, to start it again. `/proc/self/exe`
/// opens the file this process runs even when a rebuild has since replaced
/// it at its path, so every worker runs the same build as the parent.
fn this_binary() -> Result<PathBuf> {
    let proc_self = PathBuf::from("/proc/self/exe");
    if proc_self.exists() {
        return Ok(proc_self);
    }
    std::env::current_exe().context("cannot find the bench binary")
}

/// Runs `command` (this binary again) and reads the report it prints last.
fn run_self(mut command: Command, what: &str) -> Result<WorkerReport> {
    let output = command
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("failed to run {what}"))?;
    if !output.status.success() {
        bail!("{what} failed ({})", output.status);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout
        .lines()
        .last()
        .with_context(|| format!("{what} printed nothing"))?;
    serde_json::from_str(last).with_context(|| format!("{what} printed `{last}`"))
}

/// The human table of the results.
fn table(results: &[Line]) -> String {
    let header = [
        "workload",
        "store",
        "unit",
        "median",
        "p90",
        "cpu median",
        "bytes written",
        "io bytes",
        "peak RSS MiB",
        "runs",
        "notes",
    ];
    let mut rows = vec![header.map(str::to_owned).to_vec()];
    for line in results {
        let per = Workload::parse(line.workload).map_or("unit", Workload::per);
        let mut notes = Vec::new();
        if let Some(marginal) = line.marginal_bytes {
            notes.push(format!("marginal {marginal} B/{per}"));
        }
        if let Some(total) = line.total_seconds {
            notes.push(format!("total {total} s"));
        }
        if let Some(turns) = line.turns {
            notes.push(format!("{turns} turns"));
        }
        rows.push(vec![
            line.workload.to_owned(),
            line.store.to_owned(),
            line.unit.to_owned(),
            line.median.to_string(),
            line.p90.to_string(),
            line.cpu_median
                .map_or("-".to_owned(), |cpu| cpu.to_string()),
            format!("{} B/{per}", line.bytes_written),
            line.io_bytes
                .map_or("-".to_owned(), |io| format!("{io} B/{per}")),
            format!("{:.1}", line.peak_rss_bytes as f64 / 1_048_576.0),
            line.runs.to_string(),
            notes.join(", "),
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
// Workers (one process per workload and store, or per `idle` run)
// ---------------------------------------------------------------------------

/// Runs one workload in this process and prints a [`WorkerReport`] line.
async fn worker(workload: Workload, options: &Options) -> Result<()> {
    let [store] = options.stores[..] else {
        bail!("a worker runs on exactly one store");
    };
    let total = options.runs + usize::from(options.warm_up);
    let mut samples = Vec::with_capacity(total);
    for run in 0..total {
        let sample = match workload {
            Workload::Step => step_run(run, store, options.steps).await?,
            Workload::Dispatch => dispatch_run(run, store, options.dispatches).await?,
            Workload::Idle => idle_run(run, store, options.idle).await?,
            Workload::Children => children_run(run, store, options.children).await?,
            Workload::Team1000 => team_run(run, store, TEAM_ROUNDS, TEAM_BATCH).await?,
            Workload::Resume1000 => resume_run(run, store, options.resume, Phase2::Process).await?,
            Workload::Chain3 => chain3_run(run, store, SMALL_RUNS).await?,
            Workload::Fanout5 => fanout5_run(run, store, SMALL_RUNS).await?,
            Workload::State1k | Workload::State30k | Workload::State250k => {
                let size = workload
                    .state_size()
                    .context("a state workload has a size")?;
                state_run(run, store, size, STATE_ROOTS).await?
            }
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

/// Adopted steps among the stored records of `tree`.
fn adopted_steps(store: &MemoryStore, tree: TreeId) -> u64 {
    store
        .records(tree)
        .iter()
        .filter(|r| r.kind == RecordKind::StepAdopted)
        .count() as u64
}

/// A start request for the bench scope.
fn request<I>(key: String, input: I) -> Result<StartRequest<I>> {
    Ok(StartRequest::new(StartId::new("bench", key)?, input))
}

/// `step`: a root that continues with no effects until its budget of
/// `steps` steps ends it (`engine.limit.steps`, the expected ending).
async fn step_run(run: usize, kind: StoreKind, steps: u64) -> Result<Sample> {
    let store = BenchStore::fresh(kind)?;
    let program = program(Workload::Step, None)?;
    let engine = Engine::new(store.config().program(&program));
    let mut start = request(format!("step-{run}"), 0)?;
    start.budget = Budget::unlimited().with_steps(steps);

    let phase = Phase::on(&store).await?;
    let handle = engine.start(&program, start).await?;
    let termination = handle.await_result().await?;
    let measured = phase.end(&store).await?;

    let code = termination.failure().map(|f| f.code().to_owned());
    if termination.status() != Status::Failed || code.as_deref() != Some("engine.limit.steps") {
        bail!("the step root ended {termination}, not with engine.limit.steps");
    }
    // The SQLite store compacts the records its snapshots cover, so only
    // the memory store still holds every adopted step.
    if let Some(memory) = store.memory() {
        let adopted = adopted_steps(memory, handle.tree());
        if adopted != steps {
            bail!("the step root adopted {adopted} steps, not {steps}");
        }
    }
    engine.close().await;
    Ok(measured.per(steps, 1e6))
}

/// `dispatch`: a root that dispatches one effect per step to an echo
/// dispatcher, `dispatches` times, then completes.
async fn dispatch_run(run: usize, kind: StoreKind, dispatches: u64) -> Result<Sample> {
    let store = BenchStore::fresh(kind)?;
    let program = program(Workload::Dispatch, Some(Arc::new(Echo)))?;
    let engine = Engine::new(store.config().program(&program));
    let start = request(format!("dispatch-{run}"), dispatches)?;

    let phase = Phase::on(&store).await?;
    let handle = engine.start(&program, start).await?;
    let output = handle.output().await?;
    let measured = phase.end(&store).await?;

    if output != dispatches {
        bail!("the dispatch root completed with {output}, not {dispatches}");
    }
    engine.close().await;
    Ok(measured.per(dispatches, 1e6))
}

/// `children`: a root runs `children` child lifecycles, ten at a time.
async fn children_run(run: usize, kind: StoreKind, children: u64) -> Result<Sample> {
    let store = BenchStore::fresh(kind)?;
    let program = program(Workload::Children, None)?;
    let engine = Engine::new(store.config().program(&program));
    let start = request(format!("children-{run}"), children)?;

    let phase = Phase::on(&store).await?;
    let handle = engine.start(&program, start).await?;
    let output = handle.output().await?;
    let measured = phase.end(&store).await?;

    if output != children {
        bail!("the children root completed with {output}, not {children}");
    }
    engine.close().await;
    Ok(measured.per(children, 1e6))
}

/// Roots started per `chain3` or `fanout5` sample.
const SMALL_RUNS: u64 = 1_000;

/// Stages of the measured `state-*` chains.
const STATE_STAGES: u64 = 10;

/// Stages of the longer `state-*` chain that `marginal_bytes` compares with.
const MARGINAL_STAGES: u64 = 20;

/// Roots per `state-*` run.
const STATE_ROOTS: u64 = 5;

fn build_name() -> String {
    format!("{} {}", env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
}

/// Runs `program` on `store` for `roots` new roots, one after another, each
/// with `input`, and checks that each completes with `expected`.
async fn per_root<I: Serialize + Clone, O>(
    program: &Program<I, O>,
    store: &BenchStore,
    prefix: &str,
    input: I,
    roots: u64,
    expected: &Payload,
) -> Result<Measured> {
    let engine = Engine::new(store.config().program(program));
    let phase = Phase::on(store).await?;
    for index in 0..roots {
        let handle = engine
            .start(
                program,
                request(format!("{prefix}-{index}"), input.clone())?,
            )
            .await?;
        let termination = handle.join().await?;
        if termination.status() != Status::Completed || termination.output() != Some(expected) {
            bail!("a {prefix} root ended {termination}, not with {expected}");
        }
    }
    let measured = phase.end(store).await?;
    engine.close().await;
    Ok(measured)
}

/// `chain3` (W1): three pure transforms, each appending a short string.
async fn chain3_run(run: usize, kind: StoreKind, roots: u64) -> Result<Sample> {
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
    let store = BenchStore::fresh(kind)?;
    let expected = Payload::encode(&"xabc")?;
    let prefix = format!("chain3-{run}");
    let measured = per_root(&chain, &store, &prefix, "x".to_owned(), roots, &expected).await?;
    Ok(measured.per(roots, 1e6))
}

/// `fanout5` (W2): a root starts five children (each a pure transform),
/// waits for all of them and joins their five results.
async fn fanout5_run(run: usize, kind: StoreKind, roots: u64) -> Result<Sample> {
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
    let store = BenchStore::fresh(kind)?;
    // Five branches each double 21.
    let expected = Payload::encode(&210u64)?;
    let prefix = format!("fanout5-{run}");
    let measured = per_root(&fanout, &store, &prefix, 21u64, roots, &expected).await?;
    Ok(measured.per(roots, 1e6))
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

/// The `state-*` program: one step per stage, each incrementing `stage`;
/// `Continue` with no effects until the last stage, which completes with
/// the stage count.
struct StateChain {
    descriptor: Descriptor,
    stages: u64,
}

struct StateRun {
    stages: u64,
    state: Carried,
}

impl Definition for StateChain {
    fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    fn start(&self, input: &Payload) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(StateRun {
            stages: self.stages,
            state: input.decode()?,
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(StateRun {
            stages: self.stages,
            state: state.decode()?,
        }))
    }
}

impl Execution for StateRun {
    fn step(&mut self, window: &[Signal]) -> Result<Transition, StepError> {
        self.state.stage += 1;
        if self.state.stage < self.stages {
            Ok(Transition::Continue {
                consumed: window.len(),
                effects: Vec::new(),
            })
        } else {
            Ok(Transition::Complete {
                consumed: window.len(),
                output: Payload::encode(&self.state.stage)?,
            })
        }
    }

    fn snapshot(&self) -> Result<ExecutionState, StepError> {
        ExecutionState::encode(&self.state)
    }
}

/// Binds the `state-*` program with `stages` stages.
fn state_program(stages: u64) -> Result<Program<Carried, u64>> {
    let definition = StateChain {
        descriptor: Descriptor::typed::<Carried, u64>(
            "bench.state",
            "One step per stage, carrying a large state.",
        )?,
        stages,
    };
    Ok(Program::new(ProgramConfig {
        definition: Arc::new(definition),
        dispatcher: None,
        implementation: implementation_digest(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        configuration: configuration_digest(&("bench.state", stages))?,
    }))
}

/// `state-*` (W4): `roots` roots each run a ten-stage chain (one kernel step
/// per stage) whose state carries `size` bytes of random hex and changes
/// one small field per stage. The figure is ms per stage; bytes are per
/// stage; `marginal_bytes` compares with a 20-stage chain on a fresh store.
async fn state_run(run: usize, kind: StoreKind, size: usize, roots: u64) -> Result<Sample> {
    let input = Carried {
        blob: random_hex(size, 0x5eed + run as u64),
        stage: 0,
    };
    let prefix = format!("state-{size}-{run}");
    let ten = {
        let store = BenchStore::fresh(kind)?;
        let program = state_program(STATE_STAGES)?;
        let expected = Payload::encode(&STATE_STAGES)?;
        per_root(&program, &store, &prefix, input.clone(), roots, &expected).await?
    };
    let twenty = {
        let store = BenchStore::fresh(kind)?;
        let program = state_program(MARGINAL_STAGES)?;
        let expected = Payload::encode(&MARGINAL_STAGES)?;
        per_root(&program, &store, &prefix, input, roots, &expected).await?
    };
    let per_root_bytes = |m: &Measured| m.bytes as f64 / roots as f64;
    let marginal =
        (per_root_bytes(&twenty) - per_root_bytes(&ten)) / (MARGINAL_STAGES - STATE_STAGES) as f64;
    Ok(Sample {
        marginal_bytes: Some(marginal),
        ..ten.per(roots * STATE_STAGES, 1e3)
    })
}

/// Where the second phase of `resume1000` runs on SQLite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase2 {
    /// In a new process of this binary (`--resume-phase2`), as a restarted
    /// host would.
    Process,
    /// In this process, on a new handle of the file (for tests, whose
    /// binary is not the bench).
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "only the tests run the second phase in process")
    )]
    InProcess,
}

/// The bench's input gate: its request is the root's index, its answer a
/// boolean.
fn gate_program() -> Result<Program<u64, Answer>> {
    Ok(InputGate::typed::<u64, bool>("bench.gate", "Asks for a yes or a no.")?.program())
}

/// `resume1000` (W5): `trees` roots park on an input gate; the engine
/// closes; a fresh engine on the same store recovers and answers them all
/// (on SQLite, in the process `phase2` names). The figure is milliseconds
/// per tree of that second phase.
async fn resume_run(run: usize, kind: StoreKind, trees: usize, phase2: Phase2) -> Result<Sample> {
    let gate = gate_program()?;
    let store = BenchStore::fresh(kind)?;
    {
        let engine = Engine::new(store.config().program(&gate));
        let mut handles = Vec::with_capacity(trees);
        let prefix = format!("resume-{run}");
        start_waiting(&store, &engine, &gate, &prefix, trees, &mut handles).await?;
        // A clean shutdown releases the leases of the trees it reaches, and
        // it reaches the hibernating ones through their handles; a tree
        // nobody holds would keep its lease until it expired.
        engine.close().await;
        drop(handles);
    }
    if store.memory().is_some() {
        // The same process and store, a fresh engine.
        let phase = Phase::on(&store).await?;
        return answer_all(&store, &gate, trees, phase).await;
    }
    let dir = store
        .close()
        .context("a SQLite bench store has a directory")?;
    let path = dir.0.join("bench.db");
    let sample = match phase2 {
        Phase2::InProcess => resume_phase2(&path, trees).await?,
        Phase2::Process => {
            let exe = this_binary()?;
            let mut command = Command::new(exe);
            command
                .arg("--resume-phase2")
                .arg(&path)
                .args(["--resume", &trees.to_string()]);
            let report = tokio::task::spawn_blocking(move || {
                run_self(command, "the second phase of resume1000")
            })
            .await??;
            let [sample] = report.samples[..] else {
                bail!("the second phase of resume1000 reported no single sample");
            };
            Sample {
                peak_rss_bytes: Some(report.peak_rss_bytes),
                ..sample
            }
        }
    };
    drop(dir);
    Ok(sample)
}

/// The second phase of `resume1000` on the SQLite file at `path`, timed
/// from opening it.
async fn resume_phase2(path: &Path, trees: usize) -> Result<Sample> {
    let gate = gate_program()?;
    // A new handle's counter starts at zero.
    let phase = Phase::begin(StoreKind::Sqlite, 0);
    let store = BenchStore::open_sqlite(path)?;
    answer_all(&store, &gate, trees, phase).await
}

/// The hidden `--resume-phase2` process: runs the second phase and prints
/// its [`WorkerReport`].
async fn resume_phase2_main(path: &Path, trees: usize) -> Result<()> {
    let sample = resume_phase2(path, trees).await?;
    let report = WorkerReport {
        samples: vec![sample],
        peak_rss_bytes: status_bytes("VmHWM")?,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// A fresh engine on `store` recovers the `trees` parked gates and answers
/// every one concurrently, as many hosts would (the answers share the
/// store's group commits); the phase ends when every output has arrived.
async fn answer_all(
    store: &BenchStore,
    gate: &Program<u64, Answer>,
    trees: usize,
    phase: Phase,
) -> Result<Sample> {
    let engine = Engine::new(store.config().program(gate));
    let report = engine.recover(RecoverOptions::default()).await?;
    if let Some((tree, Err(error))) = report.iter().find(|(_, result)| result.is_err()) {
        bail!("tree {tree} did not recover: {error}");
    }
    if report.len() != trees {
        bail!("recovered {} trees, expected {trees}", report.len());
    }
    let scope = Scope::new("bench")?;
    let mut answering = tokio::task::JoinSet::new();
    for (tree, _) in &report {
        let handle = engine.process::<Answer>(&scope, *tree).await?;
        // The gate's first step declares its wait as effect 0.
        let wait = WaitId::for_effect(EffectId::new(*tree, 0, 0));
        answering.spawn(async move {
            handle
                .signal(SignalRequest {
                    id: SignalId::new("answer")?,
                    wait: Some(wait),
                    payload: Payload::encode(&true)?,
                })
                .await?;
            let answer = handle.output().await?;
            anyhow::Ok(answer.wait == wait && answer.payload.decode::<bool>()?)
        });
    }
    while let Some(answered) = answering.join_next().await {
        if !answered?? {
            bail!("a resumed gate completed with another answer");
        }
    }
    let measured = phase.end(store).await?;
    engine.close().await;
    Ok(Sample {
        total_seconds: Some(measured.seconds),
        ..measured.per(trees as u64, 1e3)
    })
}

/// `idle` (W6): starts `roots` roots that each wait on an input gate; the
/// figure is the growth of resident memory per waiting root.
async fn idle_run(run: usize, kind: StoreKind, roots: usize) -> Result<Sample> {
    let store = BenchStore::fresh(kind)?;
    let gate = gate_program()?;
    let engine = Engine::new(store.config().program(&gate));
    let mut handles = Vec::with_capacity(IDLE_WARM_UP.max(roots));
    let warm = format!("warm-{run}");
    start_waiting(&store, &engine, &gate, &warm, IDLE_WARM_UP, &mut handles).await?;
    handles.clear();

    let phase = Phase::on(&store).await?;
    let before = status_bytes("VmRSS")?;
    let prefix = format!("idle-{run}");
    start_waiting(&store, &engine, &gate, &prefix, roots, &mut handles).await?;
    // Measured while the host still holds every handle: an idle tree nobody
    // holds is dropped from memory and reloaded from the store on demand.
    let after = status_bytes("VmRSS")?;
    let measured = phase.end(&store).await?;
    handles.clear();
    drop(engine);
    Ok(Sample {
        figure: after.saturating_sub(before) as f64 / roots as f64,
        cpu: None,
        ..measured.per(roots as u64, 1.0)
    })
}

/// Starts `count` gate roots (each asking with its index) and returns once
/// every one of them is waiting.
async fn start_waiting(
    store: &BenchStore,
    engine: &Engine,
    gate: &Program<u64, Answer>,
    prefix: &str,
    count: usize,
    handles: &mut Vec<ProcessHandle<Answer>>,
) -> Result<()> {
    let first = handles.len();
    for index in 0..count {
        handles.push(
            engine
                .start(gate, request(format!("{prefix}-{index}"), index as u64)?)
                .await?,
        );
    }
    // Watch the store's listing rather than each tree: inspecting a tree
    // wakes it, and a sleeping tree should stay asleep.
    let mut pending: std::collections::BTreeSet<TreeId> =
        handles[first..].iter().map(ProcessHandle::tree).collect();
    let store = store.store();
    let waiting = ListFilter {
        status: Some(TreeStatus::Waiting),
        scope: None,
    };
    let mut polls = 0u32;
    while !pending.is_empty() {
        for meta in store.list(waiting.clone()).await? {
            pending.remove(&meta.tree);
        }
        polls += 1;
        if polls > 100_000 {
            bail!("{} gate roots never reached waiting", pending.len());
        }
        tokio::task::yield_now().await;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The measured program and dispatcher
// ---------------------------------------------------------------------------

/// Everything a bench process remembers between steps.
#[derive(Debug, Serialize, Deserialize)]
struct State {
    /// Steps taken (`step`), dispatches declared (`dispatch`) or children
    /// started (`children`).
    count: u64,
    /// How many dispatches or children to run.
    limit: u64,
}

/// The behaviour of the `step`, `dispatch` and `children` programs;
/// `workload` picks the loop.
struct Bench {
    workload: Workload,
    descriptor: Descriptor,
    /// The declared child program (`children` only).
    child: Option<Program>,
}

struct Run {
    workload: Workload,
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
            child: self.child.as_ref().map(|c| c.reference().digest),
            state: State {
                count: 0,
                limit: input.decode()?,
            },
        }))
    }

    fn restore(&self, state: &ExecutionState) -> Result<Box<dyn Execution>, StepError> {
        Ok(Box::new(Run {
            workload: self.workload,
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
            Workload::Idle
            | Workload::Team1000
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
/// request the next round of `batch` (each task's input is its index);
/// after `rounds` rounds, complete with the sum of the outputs.
fn team_decide(turn: &Turn, rounds: u64, batch: u64) -> Result<Decision, Failure> {
    let bad = |message: String| Failure::execution("bench.team.unexpected", message);
    let state = turn.state.clone();
    if turn.running().next().is_some() {
        return Ok(Decision::new(Mode::Wait, state));
    }
    let done = turn.tasks.len() as u64;
    if done < rounds * batch {
        let worker = Name::new("bench.double").map_err(|e| bad(e.to_string()))?;
        let mut decision = Decision::new(Mode::Wait, state);
        for index in done..done + batch {
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

/// `team1000`: a team runs `rounds` rounds of `batch` worker tasks.
async fn team_run(run: usize, kind: StoreKind, rounds: u64, batch: u64) -> Result<Sample> {
    let coordinator = Policy::new(PolicyConfig {
        name: "bench.coordinator".into(),
        description: "Requests rounds of tasks and waits for them.".into(),
        build: build_name(),
        // The rounds and the batch size decide what the coordinator
        // requests, so they are its settings and part of its identity.
        settings: Payload::encode(&std::collections::BTreeMap::from([
            ("batch", batch),
            ("rounds", rounds),
        ]))?,
        decide: Arc::new(move |turn: &Turn| team_decide(turn, rounds, batch)),
    })?
    .program();
    let worker = Workflow::new(WorkflowConfig {
        name: "bench.double".into(),
        description: "Doubles its index.".into(),
        build: build_name(),
        stages: vec![transform("double", |index: u64| Ok(index * 2))],
    })?
    .program::<u64, u64>();
    let team = compile::<u64, u64>(TeamConfig {
        name: "bench.team".into(),
        description: "Runs rounds of worker tasks, a round at a time.".into(),
        coordinator: Binding::new(&coordinator),
        workers: vec![Binding::new(&worker)],
        max_turns: Quota::Unlimited,
        max_tasks: Quota::Unlimited,
        max_concurrent_tasks: u32::try_from(batch)?,
        max_controls_per_turn: 1,
    })?;
    let store = BenchStore::fresh(kind)?;
    let mut config = store.config().program(&team);
    config.limits = TreeLimits {
        // A round of tasks and the coordinator at once.
        max_active_children: u32::try_from(batch)? + 8,
        ..TreeLimits::default()
    };
    let engine = Engine::new(config);
    let start = request(format!("team-{run}"), 0u64)?;

    let phase = Phase::on(&store).await?;
    let handle = engine.start(&team, start).await?;
    let termination = handle.join().await?;
    let measured = phase.end(&store).await?;

    let tasks = rounds * batch;
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
    engine.close().await;
    Ok(Sample {
        turns: Some(turns),
        ..measured.per(tasks, 1e6)
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
        assert_eq!(options.stores, StoreKind::ALL, "both stores by default");
        assert!(Options::parse(&["nope".to_owned()]).is_err());
        assert!(Options::parse(&["--runs".to_owned(), "0".to_owned()]).is_err());
        assert_eq!(Options::parse(&[]).unwrap().workloads, Workload::ALL);
        let stores = |args: &[&str]| {
            let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
            Options::parse(&args).map(|o| o.stores)
        };
        assert_eq!(stores(&["--store", "sqlite"]).unwrap(), [StoreKind::Sqlite]);
        assert_eq!(
            stores(&["--store", "sqlite,memory"]).unwrap(),
            [StoreKind::Sqlite, StoreKind::Memory]
        );
        assert_eq!(
            stores(&[
                "--store", "memory", "--store", "sqlite", "--store", "memory"
            ])
            .unwrap(),
            [StoreKind::Memory, StoreKind::Sqlite]
        );
        assert!(stores(&["--store", "postgres"]).is_err());
        assert!(stores(&["--store"]).is_err());
    }

    /// What every sample of a run on `kind` shows: a positive figure, store
    /// bytes, and write(2) bytes exactly on SQLite.
    fn check(sample: &Sample, kind: StoreKind, what: &str) {
        assert!(sample.figure > 0.0, "{what} on {kind:?}: {sample:?}");
        assert!(sample.bytes_written > 0.0, "{what} on {kind:?}: {sample:?}");
        match kind {
            StoreKind::Memory => assert_eq!(sample.io_bytes, None, "{what}"),
            StoreKind::Sqlite => assert!(
                sample.io_bytes.is_some_and(|io| io > 0.0),
                "{what} on {kind:?}: {sample:?}"
            ),
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn kernel_workloads_run_small_on_both_stores() {
        for kind in StoreKind::ALL {
            check(&step_run(0, kind, 50).await.unwrap(), kind, "step");
            check(&dispatch_run(0, kind, 20).await.unwrap(), kind, "dispatch");
            check(&children_run(0, kind, 25).await.unwrap(), kind, "children");
            check(&chain3_run(0, kind, 10).await.unwrap(), kind, "chain3");
            check(&fanout5_run(0, kind, 5).await.unwrap(), kind, "fanout5");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn state_chains_run_small_and_sqlite_writes_less_than_the_state_per_step() {
        let size = 250_000;
        for kind in StoreKind::ALL {
            let state = state_run(0, kind, size, 1).await.unwrap();
            check(&state, kind, "state");
            assert!(
                state.bytes_written * STATE_STAGES as f64 > size as f64,
                "the run records its input at least once: {state:?}"
            );
            let marginal = state
                .marginal_bytes
                .expect("a state run measures marginal bytes");
            match kind {
                // Every step record carries the whole state.
                StoreKind::Memory => assert!(marginal >= size as f64, "{state:?}"),
                // Unchanged pieces are stored once per tree.
                StoreKind::Sqlite => assert!(marginal > 0.0 && marginal < size as f64, "{state:?}"),
            }
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn team_runs_small_on_both_stores() {
        for kind in StoreKind::ALL {
            let team = team_run(0, kind, 2, 10).await.unwrap();
            check(&team, kind, "team");
            // One turn per round at least (when the round has drained by the
            // next turn), plus the turn that outputs the sum.
            assert!(team.turns.is_some_and(|turns| turns > 2), "{team:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn gates_park_resume_and_idle_on_both_stores() {
        for kind in StoreKind::ALL {
            let resume = resume_run(0, kind, 20, Phase2::InProcess).await.unwrap();
            check(&resume, kind, "resume");
            assert!(resume.total_seconds.is_some_and(|s| s > 0.0), "{resume:?}");
            let idle = idle_run(0, kind, 20).await.unwrap();
            assert!(idle.bytes_written > 0.0, "idle on {kind:?}: {idle:?}");
            assert_eq!(idle.io_bytes.is_some(), kind == StoreKind::Sqlite);
        }
    }
}
