//! A SIGKILL of the engine during an MCP call: after recovery in a new
//! process on the same SQLite file, a `Never` call is never sent again (it
//! parks as an unknown effect), and a `SameIdentity` call is sent again
//! exactly once, with the same effect id as its idempotency key.
//!
//! `mcp_killable` (tests/src/bin/mcp_killable.rs) is both the engine's host
//! and, run as `mcp_killable serve`, the MCP server it starts over stdio.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

const HOST: &str = env!("CARGO_BIN_EXE_mcp_killable");

fn counter_lines(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("counter"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Ends the server process a killed host left behind (it holds its call).
fn kill_orphan(dir: &Path, mode: &str) {
    if let Ok(pid) = std::fs::read_to_string(dir.join(format!("server-{mode}.pid"))) {
        let _ = Command::new("kill").args(["-9", pid.trim()]).status();
    }
}

/// Starts the host, kills it with SIGKILL once the server has received the
/// call, then recovers in a new process; returns the recovery's report.
fn kill_during_the_call_and_recover(replay: &str) -> (String, Vec<String>) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let database = dir.path().join("baton.db");
    let mut host = Command::new(HOST)
        .args(["run"])
        .arg(&database)
        .arg(dir.path())
        .arg(replay)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the host starts");
    // The server (whose stderr is the host's) reports the call once it has
    // recorded it and before it holds it.
    let stderr = host.stderr.take().expect("piped");
    let received = BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.starts_with("received "));
    assert!(
        received,
        "the call reached the server before the host ended"
    );
    // `Child::kill` sends SIGKILL on Unix.
    host.kill().expect("kills");
    let status = host.wait().expect("reaps");
    assert!(!status.success(), "the host was killed");
    kill_orphan(dir.path(), "run");
    assert_eq!(counter_lines(dir.path()).len(), 1);

    let recovery = Command::new(HOST)
        .args(["recover"])
        .arg(&database)
        .arg(dir.path())
        .arg(replay)
        .stderr(Stdio::inherit())
        .output()
        .expect("the recovery runs");
    kill_orphan(dir.path(), "recover");
    assert!(
        recovery.status.success(),
        "the recovery succeeds: {recovery:?}"
    );
    let report = String::from_utf8_lossy(&recovery.stdout).trim().to_owned();
    (report, counter_lines(dir.path()))
}

#[test]
fn a_never_mcp_call_cut_by_sigkill_is_parked_and_never_sent_again() {
    let (report, lines) = kill_during_the_call_and_recover("never");
    assert_eq!(report, "parked 1");
    assert_eq!(
        lines.len(),
        1,
        "sent once, before the kill, and never again"
    );
}

#[test]
fn a_same_identity_mcp_call_cut_by_sigkill_is_sent_again_once_with_the_same_key() {
    let (report, lines) = kill_during_the_call_and_recover("same");
    assert_eq!(report, "output count 2");
    assert_eq!(lines.len(), 2, "sent before the kill and once after it");
    assert_eq!(lines[0], lines[1], "with the same idempotency key");
    assert_ne!(lines[0], "none");
}
