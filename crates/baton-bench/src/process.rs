//! One process per workload: the parent runs this binary again as a worker
//! for each workload and store (and for each `idle` run), the worker runs
//! the workload and prints a [`WorkerReport`] as its last line, and the
//! parent reads it back.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::args::Options;
use crate::floor::Floors;
use crate::measure::Sample;
use crate::probe::status_bytes;
use crate::report::Line;
use crate::store::StoreKind;
use crate::workloads::{self, Workload};

/// What a worker process reports.
#[derive(Debug, Serialize, Deserialize)]
pub struct WorkerReport {
    /// The figures of each measured run.
    pub samples: Vec<Sample>,
    /// This process's `VmHWM`.
    pub peak_rss_bytes: u64,
    /// The floors measured in this process.
    #[serde(default)]
    pub floors: Floors,
}

impl WorkerReport {
    /// Prints `samples` and `floors` with this process's peak resident
    /// memory, read now, as the JSON line the parent reads.
    pub fn print(samples: Vec<Sample>, floors: Floors) -> Result<()> {
        let report = WorkerReport {
            samples,
            peak_rss_bytes: status_bytes("VmHWM")?,
            floors,
        };
        println!("{}", serde_json::to_string(&report)?);
        Ok(())
    }
}

/// Runs one workload on one store in worker processes and sums it up.
pub fn measure(workload: Workload, store: StoreKind, options: &Options) -> Result<Line> {
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
    Ok(Line::summarize(workload, store, options, reports))
}

/// Runs this binary as a worker for `workload` on `store` and reads its report.
fn spawn_worker(
    workload: Workload,
    store: StoreKind,
    options: &Options,
    runs: usize,
    warm_up: bool,
) -> Result<WorkerReport> {
    let mut command = self_command()?;
    command
        .args(["--worker", workload.name()])
        .args(["--store", &store.spec()])
        .args(["--runs", &runs.to_string()])
        .args(["--steps", &options.steps.to_string()])
        .args(["--dispatches", &options.dispatches.to_string()])
        .args(["--children", &options.children.to_string()])
        .args(["--resume", &options.resume.to_string()])
        .args(["--idle", &options.idle.to_string()])
        .args(["--page-size", &options.page_size.bytes().to_string()])
        .args(["--commit-on", options.commit_on_name()]);
    if let Some(clients) = options.clients {
        command.args(["--clients", &clients.to_string()]);
    }
    if let Some(roots) = options.roots {
        command.args(["--roots", &roots.to_string()]);
    }
    if warm_up {
        command.arg("--warm-up");
    }
    run_self(
        command,
        &format!("the `{}` worker on {}", workload.name(), store.name()),
    )
}

/// A command that runs this process's own executable again.
/// `/proc/self/exe` opens the file this process runs even when a rebuild
/// has since replaced it at its path, so every worker runs the same build
/// as the parent.
pub fn self_command() -> Result<Command> {
    let proc_self = PathBuf::from("/proc/self/exe");
    if proc_self.exists() {
        return Ok(Command::new(proc_self));
    }
    let exe = std::env::current_exe().context("cannot find the bench binary")?;
    Ok(Command::new(exe))
}

/// Runs `command` (this binary again) and reads the report it prints last.
pub fn run_self(mut command: Command, what: &str) -> Result<WorkerReport> {
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

/// Runs one workload in this process and prints a [`WorkerReport`] line.
pub async fn worker(workload: Workload, options: &Options) -> Result<()> {
    let (samples, floors) = worker_runs(workload, options).await?;
    WorkerReport::print(samples, floors)
}

/// Runs one workload in this process: the warm-up run if asked for, the
/// floors, then the measured runs, whose samples it returns with the
/// floors. `idle` measures its floors after its run instead, so that
/// memory the floors freed does not hide the run's growth; `chain3` and
/// `fanout5` (one host) measure their paced commit after their runs,
/// paced by the CPU time the runs took.
pub async fn worker_runs(workload: Workload, options: &Options) -> Result<(Vec<Sample>, Floors)> {
    let [store] = options.stores[..] else {
        bail!("a worker runs on exactly one store");
    };
    let first = usize::from(options.warm_up);
    if options.warm_up {
        workloads::run(workload, 0, store, options).await?;
    }
    let floors_after = workload == Workload::Idle;
    let mut floors = if floors_after {
        Floors::default()
    } else {
        Floors::measure(workload, store).await?
    };
    let mut samples = Vec::with_capacity(options.runs);
    for run in first..first + options.runs {
        samples.push(workloads::run(workload, run, store, options).await?);
    }
    if floors_after {
        floors = Floors::measure(workload, store).await?;
    }
    if matches!(workload, Workload::Chain3 | Workload::Fanout5)
        && options.clients_of(workload).is_none()
    {
        floors.pace(store, &samples).await?;
    }
    Ok((samples, floors))
}
