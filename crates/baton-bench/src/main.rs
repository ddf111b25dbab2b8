//! # baton-bench: workloads that measure the Baton kernel
//!
//! `baton-bench [WORKLOAD...] [--store memory|sqlite|postgres[=URL]] [--json] [--runs N]
//! [--clients [N]] [--roots N] ...` runs the named workloads (all of them when none is named) on the named
//! stores (memory and SQLite when none is named) and prints one JSON line per workload
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
//! - `postgres` (only when named; `postgres=URL` names the server, by
//!   default `postgres://postgres@127.0.0.1:5432/postgres`): a
//!   `PostgresStore` with its defaults (leases on the database's clock,
//!   compaction on) in a database of its own per run, created on that server
//!   and dropped afterwards. The server's own durability settings apply
//!   (`fsync`, `synchronous_commit`); the figures name them.
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
//!   overhead;
//! - on `postgres`, the growth of `PostgresStore::bytes_written`, counted
//!   the same way (a manifest is 32 bytes per piece).
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
//!   run (`--roots`), one after another; the figure is wall time per root.
//! - `chain3 --clients N` (issue 21's throughput workload; N is 64 when no
//!   number follows): N concurrent hosts, each a tokio task with an
//!   `Engine` of its own on the run's one store (as separate hosts on one
//!   database would be), each starting its share of the run's roots (100
//!   per client unless `--roots` says, split evenly) one after another and
//!   awaiting each output. The figure is runs per second over the whole
//!   phase (`runs_per_second`), with `p50_us` and `p99_us`, the
//!   nearest-rank percentiles of the runs' start-to-output wall times, and
//!   `clients`. Without `--clients`, `chain3` is the per-root workload
//!   above; with it and no other workload named, only `chain3` runs.
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
//!   time per task, and the run also reports the coordinator turns and the
//!   milliseconds to read the finished tree back (`inspect`: load its log,
//!   verify the hash chain and fold every record, as recovery does).
//! - `resume1000` (W5): 1000 roots (`--resume`) each park on a
//!   `baton::coordination::InputGate`; the engine closes; then a fresh
//!   engine on the same store recovers every tree and answers every gate
//!   concurrently (each answer a task of its own from opening the tree's
//!   handle to its output, as concurrent requests to a host are), and the
//!   phase ends when every output has arrived. On
//!   `memory` the second phase runs in the same process over the same
//!   `MemoryStore`; on `sqlite` and `postgres` it runs in a separate process (this binary
//!   again, with the hidden `--resume-phase2 STORE` flag) and is timed from
//!   opening the store. The figure is milliseconds per tree;
//!   `total_seconds` is the whole phase; bytes are those of that phase.
//! - `idle` (W6): many roots (`--idle`) each wait on an `InputGate`; the
//!   figure is resident memory growth per waiting process.
//!
//! ## Floors
//!
//! Figures that depend on the machine's disk or server are also given
//! against a floor measured in the same worker process, just before the
//! measured runs (after the warm-up; `idle` measures after its run, so the
//! floor's freed memory cannot hide growth):
//! - `commit_floor_us` (`sqlite` and `postgres`, every workload): the median
//!   of 200 one-row durable transactions after 5 warm-up ones. On `sqlite`,
//!   a database file of its own in a fresh directory beside the stores'
//!   (under `TMPDIR`, the same file system), WAL with `synchronous = FULL`
//!   as `SqliteStore` sets them, each commit `BEGIN IMMEDIATE`, one
//!   `INSERT` of a 64-byte row, `COMMIT`. On `postgres`, a database of its
//!   own on the same server (the server's `fsync` and `synchronous_commit`
//!   apply as for the store), each commit one prepared `INSERT` in its own
//!   transaction (one round trip).
//! - `floor_ratio` (`chain3` and `fanout5` on durable stores): the median
//!   per-run time in µs over `commit_floor_us`; for `chain3 --clients`, the
//!   `p50_us` over it. Issue 21 asks for 1.3 (`chain3`) and 1.5 (`fanout5`).
//! - `paced_commit_us` and `pace_us` (`chain3` and `fanout5` on durable
//!   stores, one host), measured after the measured runs: the mean latency
//!   of the same 200 transactions (after 5), each begun after `pace_us` of
//!   spinning on the CPU, the median CPU time per run of the measured runs.
//!   A run works between its commits, and a virtual disk may answer a flush
//!   that follows some work more slowly than one that follows another at
//!   once; the mean, since a run's figure is a mean and slow flushes come
//!   in a tail. Beside `cpu_median` it says what the run's commit would
//!   cost were it a bare one-row commit.
//! - `state_floor_ms` (`state-*`, every store): the median of 21 passes,
//!   after 3 warm-up ones, of one canonical encode of a state of the
//!   workload's size with the kernel's own encoder (`ExecutionState::encode`,
//!   as a step's snapshot) followed by one blake3 hash of the encoded bytes
//!   (`Payload::digest`); on durable stores `state_target_ms` is
//!   `state_floor_ms + 1.3 × commit_floor_us`, issue 21's bound per stage.
//! - `restore_floor_ms` (`state-*`, every store): in the same passes, timed
//!   apart, one decode of the encoded state into the carried type
//!   (`ExecutionState::decode`, what the `state-*` program's `restore`
//!   does). The kernel restores every candidate state through its
//!   `Definition` before adopting it, so a stage costs at least
//!   `state_floor_ms + restore_floor_ms` besides its commit.
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
//!
//! ## Allocator
//!
//! The bench links mimalloc as its process allocator, as the `baton` binary
//! does (feature `mimalloc`, on by default); built with
//! `--no-default-features` it runs on the system allocator. Each JSON line's
//! `allocator` field says which (`mimalloc` or `system`).
//!
//! ## Code
//!
//! - `main.rs`: the entry point; it picks the parent's, a worker's or the
//!   second `resume1000` phase's role and, as the parent, runs every
//!   workload on every store and prints the lines and the table.
//! - [`args`]: the command line.
//! - [`process`]: one process per workload: spawning this binary as a
//!   worker, the worker's loop, and the report it hands back.
//! - [`report`]: the JSON line, its statistics and the table.
//! - [`measure`]: a measured phase and the figures of one run.
//! - [`probe`]: the wall clock and the `/proc` readings.
//! - [`floor`]: the commit and state floors.
//! - [`store`]: the fresh store each run gets.
//! - [`workloads`]: the workloads, one module per family.

mod args;
mod floor;
mod measure;
mod probe;
mod process;
mod report;
mod store;
mod workloads;

use std::process::ExitCode;

use anyhow::Result;

use crate::args::{Options, USAGE};
use crate::report::table;
use crate::workloads::resume::resume_phase2_main;

/// The allocator the `baton` binary links, so the figures are what it runs
/// (feature `mimalloc`, on by default; each JSON line names the allocator).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let result = match Options::parse(&args) {
        Ok(options) => {
            crate::store::set_postgres_server(&options.postgres);
            crate::store::set_sqlite_page_size(options.page_size);
            crate::store::set_sqlite_commit_on(options.commit_on);
            match (options.resume_phase2.clone(), options.worker) {
                (Some(path), _) => {
                    hosted(async move { resume_phase2_main(&path, options.resume).await }).await
                }
                (None, Some(workload)) => {
                    hosted(async move { process::worker(workload, &options).await }).await
                }
                (None, None) => orchestrate(&options),
            }
        }
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

/// Runs every selected workload on every selected store in worker processes
/// and prints the results.
fn orchestrate(options: &Options) -> Result<()> {
    let mut results = Vec::new();
    for &workload in &options.workloads {
        for &store in &options.stores {
            let line = process::measure(workload, store, options)?;
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
