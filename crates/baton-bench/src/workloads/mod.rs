//! The workloads, one module per family, and what they share: the
//! [`Workload`] names and units, [`run`] (one run of any of them), the start
//! request and build name every program uses, and [`per_root`], the loop
//! of the workloads that time many short roots one after another.
//!
//! - [`chain`]: `chain3` (W1).
//! - [`fanout`]: `fanout5` (W2).
//! - [`team`]: `team1000` (W3).
//! - [`state`]: `state-1k`, `state-30k`, `state-250k` (W4).
//! - [`resume`]: `resume1000` (W5).
//! - [`idle`]: `idle` (W6).
//! - [`kernel`]: the kernel's own, `step`, `dispatch` and `children`.
//! - [`gate`]: the input gate that `resume1000` and `idle` park roots on.

pub mod chain;
pub mod fanout;
pub mod gate;
pub mod idle;
pub mod kernel;
pub mod resume;
pub mod state;
pub mod team;

use std::time::Duration;

use anyhow::{Context, Result, bail};
use baton::run::program::implementation_digest;
use baton::run::{Digest, Engine, Payload, Program, StartId, StartRequest, Status};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use crate::args::Options;
use crate::measure::{Measured, Phase, Sample};
use crate::probe::now;
use crate::store::{BenchStore, StoreKind};

/// A workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
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
    pub const ALL: [Workload; 11] = [
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

    pub fn name(self) -> &'static str {
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

    pub fn parse(name: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == name)
    }

    /// The unit of the headline figure.
    pub fn unit(self) -> &'static str {
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
    pub fn per(self) -> &'static str {
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
    pub fn state_size(self) -> Option<usize> {
        match self {
            Workload::State1k => Some(1_000),
            Workload::State30k => Some(30_000),
            Workload::State250k => Some(250_000),
            _ => None,
        }
    }
}

/// Roots started per `chain3` or `fanout5` sample unless `--roots` says.
pub const SMALL_RUNS: u64 = 1_000;

/// Runs `workload` once (run number `run`) on a fresh store of `kind`, at
/// the size `options` asks for.
pub async fn run(
    workload: Workload,
    run: usize,
    store: StoreKind,
    options: &Options,
) -> Result<Sample> {
    Ok(match workload {
        Workload::Step => kernel::step_run(run, store, options.steps).await?,
        Workload::Dispatch => kernel::dispatch_run(run, store, options.dispatches).await?,
        Workload::Idle => idle::idle_run(run, store, options.idle).await?,
        Workload::Children => kernel::children_run(run, store, options.children).await?,
        Workload::Team1000 => {
            team::team_run(run, store, team::TEAM_ROUNDS, team::TEAM_BATCH).await?
        }
        Workload::Resume1000 => {
            resume::resume_run(run, store, options.resume, resume::Phase2::Process).await?
        }
        Workload::Chain3 => match options.clients_of(workload) {
            Some(clients) => {
                chain::chain3_clients_run(run, store, clients, options.roots(workload)).await?
            }
            None => chain::chain3_run(run, store, options.roots(workload)).await?,
        },
        Workload::Fanout5 => fanout::fanout5_run(run, store, options.roots(workload)).await?,
        Workload::State1k | Workload::State30k | Workload::State250k => {
            let size = workload
                .state_size()
                .context("a state workload has a size")?;
            state::state_run(run, store, size, state::STATE_ROOTS).await?
        }
    })
}

/// The scope every bench root starts in.
const SCOPE: &str = "bench";

/// A start request for the bench scope.
fn request<I>(key: String, input: I) -> Result<StartRequest<I>> {
    Ok(StartRequest::new(StartId::new(SCOPE, key)?, input))
}

fn build_name() -> String {
    format!("{} {}", env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
}

/// The implementation digest of every program the bench binds itself.
fn implementation() -> Digest {
    implementation_digest(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
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
    let engine = Engine::new(store.config(program.erase()))?;
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

/// What a phase of concurrent hosts took: the phase as a whole and each
/// root's start-to-output latency.
pub struct Concurrent {
    /// The whole phase, from before the first start to the last output.
    pub measured: Measured,
    /// Each root's latency, from before its `start` to its termination.
    pub latencies: Vec<Duration>,
}

/// Runs `program` on `store` for `roots` new roots, each with `input`, from
/// `clients` concurrent hosts: each host is a tokio task with an engine of
/// its own on the one store (as separate processes on one database would
/// be) that starts its share of the roots one after another and awaits
/// each output, checking that it is `expected`. The engines are made
/// before the phase starts and closed after it ends.
async fn concurrent_roots<I, O>(
    program: &Program<I, O>,
    store: &BenchStore,
    prefix: &str,
    input: I,
    clients: usize,
    roots: u64,
    expected: &Payload,
) -> Result<Concurrent>
where
    I: Serialize + Clone + Send + Sync + 'static,
    O: 'static,
{
    let engines = (0..clients)
        .map(|_| Engine::new(store.config(program.erase())))
        .collect::<Result<Vec<_>, _>>()?;
    let clients = clients as u64;
    let phase = Phase::on(store).await?;
    let mut hosts = JoinSet::new();
    for (client, engine) in (0..clients).zip(engines) {
        // An even split; the first `roots % clients` hosts take one more.
        let share = roots / clients + u64::from(client < roots % clients);
        let program = program.clone();
        let input = input.clone();
        let expected = expected.clone();
        let prefix = format!("{prefix}-{client}");
        hosts.spawn(async move {
            let mut latencies = Vec::with_capacity(usize::try_from(share).unwrap_or(0));
            for index in 0..share {
                let t0 = now();
                let handle = engine
                    .start(
                        &program,
                        request(format!("{prefix}-{index}"), input.clone())?,
                    )
                    .await?;
                let termination = handle.join().await?;
                latencies.push(now().duration_since(t0));
                if termination.status() != Status::Completed
                    || termination.output() != Some(&expected)
                {
                    bail!("a {prefix} root ended {termination}, not with {expected}");
                }
            }
            Ok((engine, latencies))
        });
    }
    let mut engines = Vec::with_capacity(hosts.len());
    let mut latencies = Vec::new();
    while let Some(host) = hosts.join_next().await {
        let (engine, host_latencies) = host??;
        engines.push(engine);
        latencies.extend(host_latencies);
    }
    let measured = phase.end(store).await?;
    for engine in engines {
        engine.close().await;
    }
    Ok(Concurrent {
        measured,
        latencies,
    })
}

/// What every sample of a run on `kind` shows: a positive figure, store
/// bytes, and write(2) bytes exactly on SQLite.
#[cfg(test)]
fn check(sample: &Sample, kind: StoreKind, what: &str) {
    assert!(sample.figure > 0.0, "{what} on {kind:?}: {sample:?}");
    assert!(sample.bytes_written > 0.0, "{what} on {kind:?}: {sample:?}");
    match kind {
        StoreKind::Memory | StoreKind::Postgres => assert_eq!(sample.io_bytes, None, "{what}"),
        StoreKind::Sqlite => assert!(
            sample.io_bytes.is_some_and(|io| io > 0.0),
            "{what} on {kind:?}: {sample:?}"
        ),
    }
}
