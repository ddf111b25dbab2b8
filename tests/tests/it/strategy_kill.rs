//! The strategies' SIGKILL test: every strategy scenario, killed mid-run
//! with `kill -9` at seeded progress markers, recovers and finishes with
//! the same outputs as an uninterrupted run, and no model request is ever
//! sent twice.
//!
//! `strategies_killable` (tests/src/bin/strategies_killable.rs) runs the
//! six scenarios of `baton_examples::strategies` twice each on a SQLite
//! file, writing every model request to a side file before the model
//! answers. It is killed at seeded-random progress markers (counts of the
//! committed events it prints) a few times, each restart recovering and
//! resolving the model calls lost in the crash with their scripted
//! answers; then it runs to the end.
//!
//! Bounded: four kills of a child that runs twelve small trees.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use baton::run::log::RecordBody;
use baton::run::{
    Engine, EngineConfig, Payload, ProcessId, Scope, Settlement, StartId, Status, TreeId,
};
use baton::store::sqlite::SqliteStore;
use baton_examples::strategies::Scenario;

const KILLS: usize = 4;
const RUNS: u32 = 2;

struct Run {
    lines: Vec<String>,
    killed: bool,
}

/// Runs the child; kills it with SIGKILL right after marker `kill_at`.
fn run(db: &Path, side: &Path, kill_at: Option<usize>) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_strategies_killable"))
        .arg(db)
        .arg(side)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the child starts");
    let stdout = child.stdout.take().expect("piped");
    let (mut lines, mut markers, mut sent) = (Vec::new(), 0, false);
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("reads the child's output");
        if line.starts_with("E ") {
            markers += 1;
        }
        let at_marker = kill_at == Some(markers) && line.starts_with("E ");
        lines.push(line);
        if at_marker && !sent {
            child.kill().expect("kills");
            sent = true;
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
        assert_eq!(lines.last().map(String::as_str), Some("DONE"));
    }
    for line in &lines {
        assert!(!line.starts_with("RECOVER-ERROR"), "{line}");
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

fn trees() -> Vec<(String, TreeId)> {
    Scenario::ALL
        .iter()
        .flat_map(|scenario| {
            (0..RUNS).map(move |n| {
                let key = format!("{}-{n}", scenario.name());
                let tree = ProcessId::root(&StartId::new("strategies", &key).expect("valid"));
                (key, tree)
            })
        })
        .collect()
}

/// Every tree's output, after checking that each log verifies.
async fn outputs(db: &Path) -> (BTreeMap<String, Payload>, SqliteStore) {
    let store = SqliteStore::open(db).expect("opens");
    let engine = Engine::new(EngineConfig::new(Arc::new(store.clone())))
        .expect("the engine configuration is valid");
    let scope = Scope::new("strategies").expect("valid");
    let mut outputs = BTreeMap::new();
    for (key, tree) in trees() {
        engine
            .verify(&scope, tree)
            .await
            .unwrap_or_else(|error| panic!("{key}: the log does not verify: {error}"));
        let handle = engine
            .process::<Payload>(&scope, tree)
            .await
            .expect("a stored tree");
        let termination = handle.await_result().await.expect("terminated");
        assert_eq!(termination.status(), Status::Completed, "{key}");
        outputs.insert(key, termination.output().expect("output").clone());
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
async fn every_strategy_killed_mid_run_finishes_with_the_same_output_and_no_model_call_sent_twice()
{
    let dir = tempfile::tempdir().expect("temp dir");

    // The uninterrupted run.
    let (reference_db, reference_side) = (dir.path().join("ref.db"), dir.path().join("ref.side"));
    let reference = run(&reference_db, &reference_side, None);
    let total = reference
        .lines
        .iter()
        .filter(|l| l.starts_with("E "))
        .count();
    assert!(total > 200, "{total} progress markers");
    let (expected, _) = outputs(&reference_db).await;
    for scenario in Scenario::ALL {
        let line = scenario
            .line(&expected[&format!("{}-0", scenario.name())])
            .expect("a result line");
        assert!(
            line.starts_with(&format!("{}: ", scenario.name())),
            "{line}"
        );
    }
    let calls = side_lines(&reference_side).len();

    // The killed runs.
    let (db, side) = (dir.path().join("killed.db"), dir.path().join("killed.side"));
    let mut random = Seeded(0x5eed_0020_2026);
    let (mut kills, mut runs, mut resolved) = (0, 0, BTreeSet::new());
    let mut kill_points = Vec::new();
    while kills < KILLS {
        runs += 1;
        assert!(
            runs <= 3 * KILLS,
            "the child finished before it was killed {KILLS} times"
        );
        let kill_at = 1 + random.below(total / (2 * KILLS));
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

    // The same outputs as the uninterrupted run, and every log verifies.
    let (actual, store) = outputs(&db).await;
    assert_eq!(
        actual, expected,
        "outputs after {kills} kills at {kill_points:?}"
    );

    // No model request was sent more often than in the uninterrupted run
    // (some requests, such as a plan task's, are the same in both runs of
    // a scenario), and each call was made once or, lost in a kill,
    // resolved by the host.
    let lines = side_lines(&side);
    let count = |lines: &[String]| {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for line in lines {
            *counts.entry(line.clone()).or_default() += 1;
        }
        counts
    };
    let reference_counts = count(&side_lines(&reference_side));
    for (request, sent) in count(&lines) {
        let allowed = reference_counts.get(&request).copied().unwrap_or_default();
        assert!(
            sent <= allowed,
            "a model request was sent {sent} times, {allowed} without kills: {request}"
        );
    }
    assert!(lines.len() <= calls && lines.len() + resolved.len() >= calls);

    // Every unknown effect was surfaced and resolved by the host, and
    // nothing else was resolved.
    let mut unknown = BTreeSet::new();
    let mut resolutions = BTreeSet::new();
    for (_, tree) in trees() {
        for record in store.records(tree).await.expect("reads") {
            match record.decode().expect("decodes") {
                RecordBody::EffectSettled {
                    effect,
                    settlement: Settlement::Unknown { .. },
                    ..
                } => {
                    unknown.insert(format!("{tree} {effect}"));
                }
                RecordBody::EffectResolved { effect, .. } => {
                    resolutions.insert(format!("{tree} {effect}"));
                }
                _ => {}
            }
        }
    }
    assert_eq!(unknown, resolutions, "every unknown effect is resolved");
    assert_eq!(
        resolved, unknown,
        "the host resolved exactly the unknown effects"
    );
    eprintln!(
        "{kills} kills at markers {kill_points:?} of {total}; {} unknown model calls resolved; {} model calls of {calls}",
        unknown.len(),
        lines.len()
    );
}
