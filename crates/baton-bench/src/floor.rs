//! The floors a workload's figures are compared with, measured in the
//! worker process that runs the workload, so they share its machine, file
//! system, server and moment:
//! - the commit floor of a durable store: the median latency of a one-row
//!   durable transaction with the store's durability settings, on a
//!   database of the bench's own beside the store's ([`commit_floor_us`]);
//! - the paced commit of `chain3` and `fanout5`: the mean latency of the
//!   same transactions, each begun after the CPU time the workload spends
//!   per run, spent spinning ([`paced_commit_us`]). A virtual disk may
//!   answer a flush that follows another at once much sooner than one
//!   that follows some work, and a run always works between its commits;
//!   the mean, not the median, since a run's time per root is a mean and
//!   such disks' slow flushes come in a tail;
//! - the state floor of a `state-*` workload: the median time of one
//!   canonical encode plus one blake3 hash of a state of that size, with
//!   the kernel's own encoder and digest, and beside it the restore floor:
//!   the median time of one decode of the encoded state as the workload's
//!   program restores it, which the kernel does to every candidate state
//!   before adopting it ([`state_floors_ms`]).

use std::hint::black_box;
use std::time::Duration;

use anyhow::{Context, Result};
use baton::run::program::ExecutionState;
use rusqlite::{Connection, TransactionBehavior};
use serde::{Deserialize, Serialize};

use crate::measure::Sample;
use crate::probe::now;
use crate::report::{median, sorted};
use crate::store::{Database, StoreKind, TempDir};
use crate::workloads::Workload;
use crate::workloads::state::{Carried, carried_state};

/// Commits before the timed ones (connection set-up, the table's first
/// pages, the WAL file's growth).
const COMMIT_WARM_UP: usize = 5;

/// Timed commits; the floor is their median.
const COMMITS: usize = 200;

/// Encodes and hashes before the timed ones.
const STATE_WARM_UP: usize = 3;

/// Timed encodes and hashes; the floor is their median.
const STATE_PASSES: usize = 21;

/// The body of each floor row: about the size of a short run's record.
const ROW: [u8; 64] = [0x5a; 64];

/// The floors of one worker process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Floors {
    /// Median µs of a one-row durable transaction (durable stores only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_floor_us: Option<f64>,
    /// Mean µs of the same transaction begun after [`Floors::pace_us`] of
    /// spinning (`chain3` and `fanout5` on durable stores, one host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paced_commit_us: Option<f64>,
    /// The CPU µs spun before each paced transaction: the median CPU time
    /// per run of the workload's measured runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace_us: Option<f64>,
    /// Median ms of one canonical encode plus one hash of the carried
    /// state (`state-*` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_floor_ms: Option<f64>,
    /// Median ms of one decode of the encoded carried state, as the
    /// workload's program restores it (`state-*` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_floor_ms: Option<f64>,
}

impl Floors {
    /// Measures the floors that `workload` on `kind` is compared with.
    pub async fn measure(workload: Workload, kind: StoreKind) -> Result<Floors> {
        let state = workload.state_size().map(state_floors_ms).transpose()?;
        Ok(Floors {
            commit_floor_us: commit_floor_us(kind).await?,
            state_floor_ms: state.map(|(encode, _)| encode),
            restore_floor_ms: state.map(|(_, restore)| restore),
            ..Floors::default()
        })
    }

    /// Measures the paced commit on `kind`, paced by the median CPU time
    /// per run of `samples` (nothing when the store is not durable or no
    /// run read any CPU time).
    pub async fn pace(&mut self, kind: StoreKind, samples: &[Sample]) -> Result<()> {
        let cpu = sorted(samples.iter().filter_map(|sample| sample.cpu));
        if cpu.is_empty() {
            return Ok(());
        }
        let pace_us = median(&cpu);
        self.paced_commit_us =
            paced_commit_us(kind, Duration::from_secs_f64(pace_us / 1e6)).await?;
        self.pace_us = self.paced_commit_us.map(|_| pace_us);
        Ok(())
    }
}

/// The commit floor of `kind` in µs, `None` for the memory store: the
/// median of [`COMMITS`] one-row transactions after [`COMMIT_WARM_UP`].
/// - SQLite: a database file of its own in a fresh directory beside the
///   stores' (under `TMPDIR`, so on the same file system), in WAL mode with
///   `synchronous = FULL` and the page size of the run's stores like
///   `SqliteStore`; each commit is `BEGIN IMMEDIATE`, one `INSERT`,
///   `COMMIT`.
/// - PostgreSQL: a database of its own on the store's server (so with the
///   server's `fsync` and `synchronous_commit`); each commit is one
///   prepared `INSERT` in its own transaction, one round trip.
pub async fn commit_floor_us(kind: StoreKind) -> Result<Option<f64>> {
    Ok(commits(kind, Duration::ZERO)
        .await?
        .map(|times| median_of(times, 1e6)))
}

/// The latencies of [`COMMITS`] one-row transactions on `kind` (`None` for
/// the memory store), each begun after `pace` of spinning on the CPU (the
/// thread stays busy, as a host that works out its next commit does; the
/// spin is not timed).
async fn commits(kind: StoreKind, pace: Duration) -> Result<Option<Vec<Duration>>> {
    Ok(Some(match kind {
        StoreKind::Memory => return Ok(None),
        StoreKind::Sqlite => tokio::task::spawn_blocking(move || sqlite_commits(pace)).await??,
        StoreKind::Postgres => postgres_commits(pace).await?,
    }))
}

/// The mean latency in µs of [`commit_floor_us`]'s transactions on `kind`,
/// each begun after `pace` of spinning (`None` for the memory store).
async fn paced_commit_us(kind: StoreKind, pace: Duration) -> Result<Option<f64>> {
    Ok(commits(kind, pace).await?.map(|times| {
        let sum: f64 = times.iter().map(Duration::as_secs_f64).sum();
        sum / times.len() as f64 * 1e6
    }))
}

/// Keeps the thread busy for `pace`.
fn spin(pace: Duration) {
    if pace.is_zero() {
        return;
    }
    let start = now();
    while now().duration_since(start) < pace {
        std::hint::spin_loop();
    }
}

/// Times one-row commits on a SQLite file of the bench's own, each after
/// `pace` of spinning.
fn sqlite_commits(pace: Duration) -> Result<Vec<Duration>> {
    let dir = TempDir::new()?;
    let path = dir.file("floor.db");
    let failed = || format!("the commit floor on {}", path.display());
    let mut conn = Connection::open(&path).with_context(failed)?;
    // The page size the run's stores get: a commit writes its changed
    // pages whole, so the floor's page is the store's.
    conn.pragma_update(None, "page_size", crate::store::sqlite_page_size().bytes())
        .with_context(failed)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .with_context(failed)?;
    anyhow::ensure!(
        mode.eq_ignore_ascii_case("wal"),
        "{}: the database refused WAL mode ({mode})",
        failed()
    );
    conn.pragma_update(None, "synchronous", "FULL")
        .with_context(failed)?;
    conn.execute_batch("CREATE TABLE floor (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        .with_context(failed)?;
    let mut times = Vec::with_capacity(COMMITS);
    for commit in 0..COMMIT_WARM_UP + COMMITS {
        spin(pace);
        let t0 = now();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .with_context(failed)?;
        tx.prepare_cached("INSERT INTO floor (body) VALUES (?1)")
            .and_then(|mut insert| insert.execute([&ROW[..]]))
            .with_context(failed)?;
        tx.commit().with_context(failed)?;
        if commit >= COMMIT_WARM_UP {
            times.push(now().duration_since(t0));
        }
    }
    drop(conn);
    drop(dir);
    Ok(times)
}

/// Times one-row commits in a PostgreSQL database of the bench's own, each
/// after `pace` of spinning.
async fn postgres_commits(pace: Duration) -> Result<Vec<Duration>> {
    let database = Database::new()?;
    let failed = || "the commit floor on PostgreSQL".to_owned();
    let (client, connection) = tokio_postgres::connect(database.url(), tokio_postgres::NoTls)
        .await
        .with_context(failed)?;
    let driver = tokio::spawn(connection);
    client
        .batch_execute("CREATE TABLE floor (id bigserial PRIMARY KEY, body bytea NOT NULL)")
        .await
        .with_context(failed)?;
    let insert = client
        .prepare("INSERT INTO floor (body) VALUES ($1)")
        .await
        .with_context(failed)?;
    let mut times = Vec::with_capacity(COMMITS);
    for commit in 0..COMMIT_WARM_UP + COMMITS {
        spin(pace);
        let t0 = now();
        client
            .execute(&insert, &[&&ROW[..]])
            .await
            .with_context(failed)?;
        if commit >= COMMIT_WARM_UP {
            times.push(now().duration_since(t0));
        }
    }
    // The connection ends with its client; the database is dropped after.
    drop(client);
    let _ = driver.await;
    drop(database);
    Ok(times)
}

/// The state and restore floors of a `size`-byte carried state in ms,
/// each the median of [`STATE_PASSES`] passes after [`STATE_WARM_UP`]:
/// a canonical encode (`ExecutionState::encode`, as a step's snapshot)
/// followed by a blake3 hash of the encoded bytes (`Payload::digest`), and
/// then, timed apart, a decode of those bytes into the carried state
/// (`ExecutionState::decode`, as the `state-*` program's restore). Each
/// pass changes the small field, as each stage does.
pub fn state_floors_ms(size: usize) -> Result<(f64, f64)> {
    let mut state = carried_state(size, 0);
    let mut encodes = Vec::with_capacity(STATE_PASSES);
    let mut restores = Vec::with_capacity(STATE_PASSES);
    for pass in 0..STATE_WARM_UP + STATE_PASSES {
        state.stage = pass as u64;
        let t0 = now();
        let encoded = ExecutionState::encode(black_box(&state))?;
        black_box(encoded.0.digest());
        let t1 = now();
        let restored: Carried = black_box(&encoded).decode()?;
        let t2 = now();
        anyhow::ensure!(restored.stage == state.stage, "the state restores");
        drop((encoded, restored));
        if pass >= STATE_WARM_UP {
            encodes.push(t1.duration_since(t0));
            restores.push(t2.duration_since(t1));
        }
    }
    Ok((median_of(encodes, 1e3), median_of(restores, 1e3)))
}

/// The median of `times` in seconds scaled by `scale` (1e6 for µs).
fn median_of(times: Vec<Duration>, scale: f64) -> f64 {
    let mut values: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * scale).collect();
    values.sort_by(f64::total_cmp);
    median(&values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn floors_are_positive_where_they_apply() {
        assert_eq!(commit_floor_us(StoreKind::Memory).await.unwrap(), None);
        let sqlite = commit_floor_us(StoreKind::Sqlite).await.unwrap();
        assert!(sqlite.is_some_and(|us| us > 0.0), "{sqlite:?}");
        let floors = Floors::measure(Workload::State1k, StoreKind::Memory)
            .await
            .unwrap();
        assert_eq!(floors.commit_floor_us, None);
        assert!(
            floors.state_floor_ms.is_some_and(|ms| ms > 0.0),
            "{floors:?}"
        );
        assert!(
            floors.restore_floor_ms.is_some_and(|ms| ms > 0.0),
            "{floors:?}"
        );
        let floors = Floors::measure(Workload::Chain3, StoreKind::Sqlite)
            .await
            .unwrap();
        assert_eq!(floors.state_floor_ms, None, "chain3 carries no large state");
        assert_eq!(floors.restore_floor_ms, None, "nor restores one");
        assert!(floors.commit_floor_us.is_some_and(|us| us > 0.0));
        assert_eq!(floors.paced_commit_us, None, "paced only after the runs");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_paced_commit_spins_its_pace_before_each_commit_but_times_only_the_commit() {
        let pace = Duration::from_micros(400);
        let start = now();
        spin(pace);
        assert!(now().duration_since(start) >= pace);
        let sample = |cpu| Sample {
            figure: 1.0,
            cpu,
            ..Sample::default()
        };
        let mut floors = Floors::default();
        let start = now();
        floors
            .pace(
                StoreKind::Sqlite,
                &[sample(Some(300.0)), sample(Some(100.0)), sample(None)],
            )
            .await
            .unwrap();
        let took = now().duration_since(start);
        assert_eq!(floors.pace_us, Some(200.0), "the median of the runs' CPU");
        assert!(
            floors.paced_commit_us.is_some_and(|us| us > 0.0),
            "{floors:?}"
        );
        let paces = Duration::from_micros(200) * (COMMIT_WARM_UP + COMMITS) as u32;
        assert!(took >= paces, "{took:?}: each commit follows its pace");
        let mut none = Floors::default();
        none.pace(StoreKind::Memory, &[sample(Some(300.0))])
            .await
            .unwrap();
        assert_eq!(none, Floors::default(), "no commit floor in memory");
        none.pace(StoreKind::Sqlite, &[sample(None)]).await.unwrap();
        assert_eq!(none, Floors::default(), "no pace without CPU time");
    }
}
