//! The SIGKILL test: nothing the engine reported as committed is lost after
//! `kill -9`, and no `Never` effect is ever sent twice.
//!
//! `killable` (tests/src/bin/killable.rs) runs 50 trees on a SQLite file. It
//! is killed with SIGKILL at seeded-random progress markers (counts of the
//! committed events it prints, never wall-clock moments) at least ten times,
//! each restart recovering with `RecoverOptions { force: false }` and
//! resolving the unknown effects it finds; then it runs to the end. The
//! result must equal an uninterrupted run's.

use std::sync::Arc;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};

use baton::run::log::RecordBody;
use baton::run::{
    Engine, EngineConfig, Payload, ProcessId, Scope, Settlement, StartId, Status, TreeId,
};
use baton::store::sqlite::SqliteStore;

const TREES: u64 = 50;
const KILLS: usize = 12;

/// How one run of the child went.
struct Run {
    lines: Vec<String>,
    killed: bool,
}

/// Runs the child; kills it with SIGKILL right after it reports marker
/// `kill_at` (if any). Reads whatever it printed before dying.
fn run(db: &Path, side: &Path, kill_at: Option<usize>) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_killable"))
        .arg(db)
        .arg(side)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the child starts");
    let stdout = child.stdout.take().expect("piped");
    let mut lines = Vec::new();
    let mut markers = 0;
    let mut kill_sent = false;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("reads the child's output");
        if line.starts_with("E ") {
            markers += 1;
        }
        let at_marker = kill_at == Some(markers) && line.starts_with("E ");
        lines.push(line);
        if at_marker && !kill_sent {
            // `Child::kill` sends SIGKILL on Unix.
            child.kill().expect("kills");
            kill_sent = true;
        }
    }
    let status = child.wait().expect("waits");
    let killed = status.signal() == Some(9);
    assert!(
        killed || status.success(),
        "the child failed on its own: {status:?}; last lines: {:?}",
        &lines[lines.len().saturating_sub(5)..]
    );
    if !killed {
        // Events of the last drains may print after it.
        assert!(
            lines.iter().any(|line| line == "DONE"),
            "a run that was not killed finishes its work"
        );
    }
    for line in &lines {
        assert!(
            !line.starts_with("RECOVER-ERROR"),
            "recovery without force must reclaim a dead owner's lease: {line}"
        );
    }
    Run { lines, killed }
}

/// A small seeded generator (xorshift64*), so kill points are reproducible.
struct Seeded(u64);

impl Seeded {
    fn below(&mut self, bound: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % bound.max(1)
    }
}

fn tree(n: u64) -> TreeId {
    ProcessId::root(&StartId::new("kill", format!("tree-{n}")).expect("valid"))
}

fn scope() -> Scope {
    Scope::new("kill").expect("valid")
}

/// Every tree's output, after checking that each log verifies.
async fn outputs(db: &Path) -> (BTreeMap<TreeId, Payload>, SqliteStore) {
    let store = SqliteStore::open(db).expect("opens");
    let engine = Engine::new(EngineConfig::new(Arc::new(store.clone())))
        .expect("the engine configuration is valid");
    let mut outputs = BTreeMap::new();
    for n in 0..TREES {
        let tree = tree(n);
        engine
            .verify(&scope(), tree)
            .await
            .unwrap_or_else(|error| panic!("tree {n}: the log does not verify: {error}"));
        let handle = engine
            .process::<Payload>(&scope(), tree)
            .await
            .expect("a stored tree");
        let termination = handle.await_result().await.expect("terminated");
        assert_eq!(termination.status(), Status::Completed, "tree {n}");
        outputs.insert(tree, termination.output().expect("output").clone());
    }
    (outputs, store)
}

fn side_lines(side: &Path) -> Vec<String> {
    std::fs::read_to_string(side)
        .expect("reads the side file")
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn sigkill_at_random_progress_markers_loses_nothing_and_never_repeats_an_effect() {
    let dir = tempfile::tempdir().expect("temp dir");

    // The uninterrupted run.
    let (reference_db, reference_side) = (dir.path().join("ref.db"), dir.path().join("ref.side"));
    let reference = run(&reference_db, &reference_side, None);
    let total = reference
        .lines
        .iter()
        .filter(|l| l.starts_with("E "))
        .count();
    assert!(total > 500, "{total} progress markers");
    assert_eq!(side_lines(&reference_side).len(), 2 * TREES as usize);
    let (expected, _) = outputs(&reference_db).await;

    // Rounds of killed runs: one in the normal test run, as many as
    // `BATON_SOAK_ROUNDS` asks in `cargo xtask soak`.
    let rounds = std::env::var("BATON_SOAK_ROUNDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(1u64);
    let mut all_kills = 0;
    for round in 0..rounds {
        all_kills += killed_round(dir.path(), round, total, &expected).await;
    }
    eprintln!("{all_kills} kills in {rounds} round(s)");
}

/// One round of killed runs on a fresh database: the child is killed at
/// least ten times, then runs to the end; returns how often it was killed.
async fn killed_round(
    dir: &Path,
    round: u64,
    total: usize,
    expected: &BTreeMap<TreeId, Payload>,
) -> usize {
    // The killed runs.
    let (db, side) = (
        dir.join(format!("killed-{round}.db")),
        dir.join(format!("killed-{round}.side")),
    );
    let mut random = Seeded(0x5eed_ba70_2026 + round);
    let (mut kills, mut resolved, mut runs) = (0, BTreeSet::new(), 0);
    let mut kill_points = Vec::new();
    while kills < KILLS {
        runs += 1;
        assert!(
            runs <= 3 * KILLS,
            "the child finished before it was killed {KILLS} times"
        );
        // Early enough in each run that the work outlasts every kill.
        let kill_at = 1 + random.below(total / (3 * KILLS));
        let outcome = run(&db, &side, Some(kill_at));
        for line in &outcome.lines {
            if let Some(rest) = line.strip_prefix("RESOLVED ") {
                assert!(resolved.insert(rest.to_owned()), "resolved twice: {rest}");
            }
        }
        if outcome.killed {
            kills += 1;
            kill_points.push(kill_at);
        }
    }
    let last = run(&db, &side, None);
    for line in &last.lines {
        if let Some(rest) = line.strip_prefix("RESOLVED ") {
            assert!(resolved.insert(rest.to_owned()), "resolved twice: {rest}");
        }
    }
    assert!(kills >= 10, "killed {kills} times at {kill_points:?}");

    // Same outputs as the uninterrupted run, and every log verifies.
    let (actual, store) = outputs(&db).await;
    assert_eq!(
        &actual, expected,
        "outputs after {kills} kills at {kill_points:?}"
    );

    // No `Never` effect was dispatched twice.
    let lines = side_lines(&side);
    let unique: BTreeSet<&String> = lines.iter().collect();
    assert_eq!(unique.len(), lines.len(), "an effect was dispatched twice");

    // Every unknown effect was surfaced (settled unknown on recovery) and
    // resolved by the host, and nothing else was resolved.
    let mut unknown = BTreeSet::new();
    let mut resolutions = BTreeSet::new();
    let mut changes = 0;
    for n in 0..TREES {
        for record in store.records(tree(n)).await.expect("reads") {
            match record.decode().expect("decodes") {
                RecordBody::StepAdopted {
                    state_change: Some(_),
                    ..
                } => changes += 1,
                RecordBody::EffectSettled {
                    effect,
                    settlement: Settlement::Unknown { .. },
                    ..
                } => {
                    unknown.insert(format!("{} {effect}", tree(n)));
                }
                RecordBody::EffectResolved { effect, .. } => {
                    resolutions.insert(format!("{} {effect}", tree(n)));
                }
                _ => {}
            }
        }
    }
    // The states are large enough that steps are recorded as changes, so
    // the recoveries above rebuilt states from them.
    assert!(changes >= TREES, "steps recorded as changes: {changes}");
    assert_eq!(unknown, resolutions, "every unknown effect is resolved");
    assert_eq!(
        resolved, unknown,
        "the host resolved exactly the unknown effects"
    );
    eprintln!(
        "{kills} kills at markers {kill_points:?} of {total}; {} unknown effects resolved; {} dispatches",
        unknown.len(),
        lines.len()
    );
    kills
}
