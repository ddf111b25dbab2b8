//! The multi-process SIGKILL test: three host processes
//! (`src/bin/soak_host.rs`) serve one database with a few hundred trees
//! whose `Never` effects append to a side file, and are killed with
//! SIGKILL at seeded-random progress markers (counts of the committed
//! events they print, never wall-clock moments), each killed host started
//! again at once. The survivors and the restarted host take up a killed
//! host's trees (its lease is reclaimed because its process is gone). At the
//! end every tree is done or parked on an unknown effect, no effect's side
//! effect happened twice, every effect reported done happened exactly
//! once, and every log verifies.
//!
//! Rounds (a fresh database each): at least five in the normal test run
//! (twelve kills each), as many as `BATON_SOAK_ROUNDS` asks in
//! `cargo xtask soak` (84 rounds: about a thousand kills).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use baton_run::log::RecordBody;

use baton_run::store::{ListFilter, Store, TreeStatus};
use baton_run::{Engine, EngineConfig, ProcessId, Scope, Settlement, StartId, TreeId};
use baton_store_postgres::PostgresStore;

use crate::support::{Server, block};

const HOSTS: usize = 3;
const TREES: usize = 240;
const KILLS: usize = 12;
const ROUNDS: u64 = 5;

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

/// A line a host printed (`None` at the end of its output), tagged with
/// the host and which start of it printed it.
type Line = (usize, u32, Option<String>);

struct Hosts<'a> {
    url: &'a str,
    side: &'a Path,
    children: Vec<Child>,
    generations: Vec<u32>,
    lines: mpsc::Sender<Line>,
}

impl Hosts<'_> {
    fn spawn(&mut self, index: usize) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_baton-postgres-soak-host"))
            .arg(self.url)
            .arg(self.side)
            .arg(index.to_string())
            .arg(HOSTS.to_string())
            .arg(TREES.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("a host starts");
        let stdout = child.stdout.take().expect("piped");
        let generation = self.generations[index] + 1;
        self.generations[index] = generation;
        let lines = self.lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if lines.send((index, generation, Some(line))).is_err() {
                    return;
                }
            }
            let _ = lines.send((index, generation, None));
        });
        if index < self.children.len() {
            self.children[index] = child;
        } else {
            self.children.push(child);
        }
    }

    /// Kills host `index` with SIGKILL, waits for it, starts it again.
    fn kill_and_restart(&mut self, index: usize) -> bool {
        let child = &mut self.children[index];
        if child.try_wait().expect("polls").is_some() {
            return false;
        }
        // `Child::kill` sends SIGKILL on Unix.
        child.kill().expect("kills");
        let status = child.wait().expect("waits");
        let killed = status.signal() == Some(9);
        self.spawn(index);
        killed
    }
}

impl Drop for Hosts<'_> {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One round on a fresh database: kills hosts `KILLS` times, lets them
/// finish, checks the outcome; returns (kills, done trees, parked trees).
fn round(server: &Server, dir: &Path, round: u64) -> (usize, usize, usize) {
    let url = server.database();
    let side = dir.join(format!("side-{round}"));
    let (lines, received) = mpsc::channel();
    let mut hosts = Hosts {
        url: &url,
        side: &side,
        children: Vec::new(),
        generations: vec![0; HOSTS],
        lines,
    };
    for index in 0..HOSTS {
        hosts.spawn(index);
    }
    let mut random = Seeded(0x5eed_ba70_9057 + round);
    let (mut markers, mut kills) = (0usize, 0usize);
    let mut next_kill = 1 + random.below(60);
    let mut finished = [false; HOSTS];
    let mut tail: Vec<String> = Vec::new();
    while finished.iter().any(|done| !done) {
        let (index, generation, line) = received
            .recv_timeout(Duration::from_secs(90))
            .unwrap_or_else(|_| {
                panic!("round {round} stalled after {kills} kills; last lines: {tail:?}")
            });
        if generation != hosts.generations[index] {
            continue; // what a killed host printed last
        }
        let Some(line) = line else {
            let status = hosts.children[index].wait().expect("waits");
            assert!(
                status.success(),
                "host {index} failed on its own: {status:?}; last lines: {tail:?}"
            );
            assert!(
                finished[index],
                "host {index} exited before its work was done"
            );
            continue;
        };
        assert!(!line.starts_with("RECOVER-ERROR"), "round {round}: {line}");
        if line == "DONE" {
            finished[index] = true;
        }
        if line.starts_with("E ") {
            markers += 1;
        }
        tail.push(format!("{index}: {line}"));
        if tail.len() > 8 {
            tail.remove(0);
        }
        if kills < KILLS && markers >= next_kill {
            let running: Vec<usize> = (0..HOSTS).filter(|index| !finished[*index]).collect();
            if running.is_empty() {
                continue;
            }
            let victim = running[random.below(running.len())];
            if hosts.kill_and_restart(victim) {
                kills += 1;
            }
            next_kill = markers + 1 + random.below(60);
        }
    }
    drop(hosts);
    let (done, parked) = block(check(&url, &side));
    (kills, done, parked)
}

fn tree(n: usize) -> TreeId {
    ProcessId::root(&StartId::new("soak", format!("tree-{n}")).expect("valid"))
}

/// Every tree is done or parked and verifies; no side effect happened
/// twice; every effect settled as a success happened exactly once.
async fn check(url: &str, side: &Path) -> (usize, usize) {
    let store = PostgresStore::open(url).expect("opens");
    let listing = store.list(ListFilter::default()).await.expect("lists");
    assert!(listing.unreadable.is_empty(), "{:?}", listing.unreadable);
    assert_eq!(listing.trees.len(), TREES, "every tree was started");
    let engine = Engine::new(EngineConfig::new(Arc::new(store.clone())))
        .expect("the engine configuration is valid");
    let scope = Scope::new("soak").expect("valid");
    let lines: Vec<String> = std::fs::read_to_string(side)
        .expect("reads the side file")
        .lines()
        .map(str::to_owned)
        .collect();
    let happened: BTreeSet<&String> = lines.iter().collect();
    assert_eq!(
        happened.len(),
        lines.len(),
        "an effect's side effect happened twice"
    );
    let numbers: BTreeMap<TreeId, usize> = (0..TREES).map(|n| (tree(n), n)).collect();
    let (mut done, mut parked, mut sent) = (0, 0, 0);
    for meta in &listing.trees {
        match meta.status {
            TreeStatus::Done => done += 1,
            TreeStatus::NeedsAttention => parked += 1,
            other => panic!("tree {} ended {other}", meta.tree),
        }
        engine
            .verify(&scope, meta.tree)
            .await
            .unwrap_or_else(|error| panic!("tree {}: the log does not verify: {error}", meta.tree));
        let n = numbers[&meta.tree];
        // Dispatches are the effects with a pending record; each one
        // settled as a success happened exactly once.
        let records = store.history(meta.tree).await.expect("reads").records;
        let mut dispatched = BTreeSet::new();
        for record in records {
            match record.decode().expect("decodes") {
                RecordBody::EffectPending { effect, .. } => {
                    dispatched.insert(effect);
                }
                RecordBody::EffectSettled {
                    effect,
                    settlement: Settlement::Succeeded { .. },
                    ..
                } if dispatched.contains(&effect) => {
                    assert!(
                        happened.contains(&format!("{n} {effect}")),
                        "tree {n}: dispatch {effect} settled without its side effect"
                    );
                }
                _ => {}
            }
        }
        sent += dispatched.len();
    }
    assert!(
        lines.len() <= sent,
        "{} side effects of {sent} dispatches",
        lines.len()
    );
    (done, parked)
}

#[test]
fn sigkill_of_hosts_sharing_one_database_loses_nothing_and_never_repeats_an_effect() {
    let server = Server::new();
    let dir = tempfile::tempdir().expect("temp dir");
    let rounds = std::env::var("BATON_SOAK_ROUNDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(ROUNDS)
        .max(1);
    let (mut kills, mut done, mut parked) = (0, 0, 0);
    for number in 0..rounds {
        let (k, d, p) = round(&server, dir.path(), number);
        assert!(k >= KILLS - 2, "round {number}: only {k} kills");
        kills += k;
        done += d;
        parked += p;
    }
    assert!(
        rounds < ROUNDS || kills >= 50,
        "{kills} kills in {rounds} rounds"
    );
    eprintln!(
        "{kills} kills of {HOSTS} hosts in {rounds} round(s) of {TREES} trees: {done} done, {parked} parked on an unknown effect"
    );
}
