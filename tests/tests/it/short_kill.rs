//! The short-roots SIGKILL test: a host running many concurrent short roots
//! on SQLite is killed with SIGKILL; every root it saw started and finished
//! is finished in the store, and no root is half-visible.
//!
//! `short_roots` (tests/src/bin/short_roots.rs) runs 16 clients, each with
//! an engine of its own on one store, each starting 40 roots of three pure
//! transforms one after another. Each root ends in its first round, so it
//! is stored by one commit (its start, steps, end and lease release) or not
//! at all. The host is killed at seeded progress markers (counts of roots
//! it reported finished), three times; after each kill, read in this
//! process: every reported root is stored, done and has its output, and
//! every stored tree is done and its log verifies. A last run finishes the
//! rest, and every root is then done exactly once with its output.
//! `cargo xtask soak` runs `BATON_SOAK_ROUNDS` such rounds, each on a fresh
//! database.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use baton::run::store::{ListFilter, Store, TreeStatus};
use baton::run::{Engine, EngineConfig, ProcessId, Scope, StartId};
use baton::store::sqlite::SqliteStore;

const CLIENTS: usize = 16;
const ROOTS: usize = 40;
const KILLS: usize = 3;

/// The start keys a run reported finished, and whether it was killed.
struct Run {
    finished: Vec<String>,
    killed: bool,
}

/// Runs the host; kills it with SIGKILL once it reported `kill_at` roots
/// finished (if asked).
fn run(db: &Path, kill_at: Option<usize>) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_short_roots"))
        .arg(db)
        .arg(CLIENTS.to_string())
        .arg(ROOTS.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the host starts");
    let stdout = child.stdout.take().expect("piped");
    let (mut finished, mut done) = (Vec::new(), false);
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("reads the host's output");
        if line == "DONE" {
            done = true;
        } else if let Some(rest) = line.strip_prefix("F ") {
            let (key, output) = rest.split_once(' ').expect("a key and an output");
            assert_eq!(output, format!("{key}abc"), "the host saw the right output");
            finished.push(key.to_owned());
            if kill_at == Some(finished.len()) {
                // `Child::kill` sends SIGKILL on Unix.
                child.kill().expect("kills");
            }
        }
    }
    let status = child.wait().expect("waits");
    let killed = status.signal() == Some(9);
    assert!(
        killed || (status.success() && done),
        "the host failed on its own: {status:?}"
    );
    Run { finished, killed }
}

fn scope() -> Scope {
    Scope::new("short").expect("valid")
}

/// Checks the store after a run: every reported root is done with its
/// output, every stored tree is done and verifies; returns the stored trees.
async fn check_store(db: &Path, reported: &BTreeSet<String>) -> usize {
    let store = SqliteStore::open(db).expect("opens");
    let listing = store.list(ListFilter::default()).await.expect("lists");
    assert!(listing.unreadable.is_empty(), "{:?}", listing.unreadable);
    let engine = Engine::new(EngineConfig::new(Arc::new(store.clone())))
        .expect("the engine configuration is valid");
    for meta in &listing.trees {
        assert_eq!(
            meta.status,
            TreeStatus::Done,
            "tree {} is half-visible: a short root is stored whole or not at all",
            meta.tree
        );
        engine
            .verify(&scope(), meta.tree)
            .await
            .unwrap_or_else(|error| panic!("{}: the log does not verify: {error}", meta.tree));
    }
    let stored: BTreeSet<_> = listing.trees.iter().map(|meta| meta.tree).collect();
    for key in reported {
        let tree = ProcessId::root(&StartId::new("short", key).expect("valid"));
        assert!(
            stored.contains(&tree),
            "{key} was reported finished but is not stored"
        );
        let output: String = engine
            .process::<String>(&scope(), tree)
            .await
            .expect("a stored tree")
            .output()
            .await
            .expect("its output");
        assert_eq!(output, format!("{key}abc"), "{key}");
    }
    stored.len()
}

#[tokio::test]
async fn sigkill_of_a_host_running_many_short_roots_loses_no_finished_root_and_shows_no_half_root()
{
    let dir = tempfile::tempdir().expect("temp dir");
    // One round in the normal test run, as many as `BATON_SOAK_ROUNDS` asks
    // in `cargo xtask soak`.
    let rounds = std::env::var("BATON_SOAK_ROUNDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(1u64);
    for round in 0..rounds {
        killed_round(&dir.path().join(format!("short-{round}.db")), round).await;
    }
    eprintln!("{} kills in {rounds} round(s)", rounds as usize * KILLS);
}

/// One round on a fresh database: the host is killed `KILLS` times, then
/// runs to the end.
async fn killed_round(db: &Path, round: u64) {
    let total = CLIENTS * ROOTS;
    let mut reported = BTreeSet::new();
    let mut kills = 0;
    // Kill points: seeded, each past what the earlier runs finished (a run
    // reports the roots stored before again, quickly, then new ones).
    let mut seed = 0x5eed_5407_u64 + round;
    let mut runs = 0;
    while kills < KILLS {
        runs += 1;
        assert!(
            runs <= 3 * KILLS,
            "the host finished before it was killed {KILLS} times"
        );
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let step = 20 + (seed >> 33) as usize % (total / (2 * KILLS));
        let outcome = run(db, Some(reported.len() + step));
        reported.extend(outcome.finished);
        let stored = check_store(db, &reported).await;
        assert!(
            stored >= reported.len(),
            "{stored} stored, {} reported",
            reported.len()
        );
        if outcome.killed {
            kills += 1;
        }
    }
    let last = run(db, None);
    assert!(!last.killed);
    reported.extend(last.finished);
    assert_eq!(reported.len(), total, "every root finished");
    assert_eq!(
        check_store(db, &reported).await,
        total,
        "each root stored once"
    );
}
