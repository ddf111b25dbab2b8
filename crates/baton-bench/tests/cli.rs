//! The bench binary end to end: worker processes on both stores, and the
//! second phase of `resume1000` in a process of its own on SQLite.
#![allow(missing_docs)]

use std::process::Command;

use serde_json::Value;

#[test]
fn gate_workloads_print_one_line_per_workload_and_store() {
    let output = Command::new(env!("CARGO_BIN_EXE_baton-bench"))
        .args(["resume1000", "idle", "--store", "memory,sqlite"])
        .args(["--resume", "20", "--idle", "20", "--runs", "1", "--json"])
        .output()
        .expect("the bench runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}: {stderr}", output.status);
    let lines: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let keys: Vec<(&str, &str)> = lines
        .iter()
        .map(|line| {
            (
                line["workload"].as_str().expect("a workload"),
                line["store"].as_str().expect("a store"),
            )
        })
        .collect();
    assert_eq!(
        keys,
        [
            ("resume1000", "memory"),
            ("resume1000", "sqlite"),
            ("idle", "memory"),
            ("idle", "sqlite"),
        ]
    );
    for line in &lines {
        let sqlite = line["store"] == "sqlite";
        assert!(
            line["bytes_written"].as_f64().is_some_and(|b| b > 0.0),
            "{line}"
        );
        assert!(
            line["peak_rss_bytes"].as_u64().is_some_and(|b| b > 0),
            "{line}"
        );
        assert_eq!(line["runs"], 1, "{line}");
        assert_eq!(line["io_bytes"].is_number(), sqlite, "{line}");
        if line["workload"] == "resume1000" {
            assert_eq!(line["size"], 20, "{line}");
            assert!(line["median"].as_f64().is_some_and(|m| m > 0.0), "{line}");
            assert!(line["total_seconds"].is_number(), "{line}");
        }
    }
}

/// Runs the bench with `args` and `--json`, and reads its lines.
fn json_lines(args: &[&str]) -> Vec<Value> {
    let output = Command::new(env!("CARGO_BIN_EXE_baton-bench"))
        .args(args)
        .arg("--json")
        .output()
        .expect("the bench runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}: {stderr}", output.status);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

fn positive(line: &Value, field: &str) -> bool {
    line[field].as_f64().is_some_and(|value| value > 0.0)
}

#[test]
fn durable_lines_carry_their_floors_and_state_lines_their_state_floor() {
    let lines = json_lines(&[
        "chain3",
        "fanout5",
        "state-1k",
        "--store",
        "memory,sqlite",
        "--roots",
        "5",
        "--runs",
        "1",
    ]);
    assert_eq!(lines.len(), 6, "{lines:?}");
    for line in &lines {
        let durable = line["store"] == "sqlite";
        let state = line["workload"] == "state-1k";
        assert_eq!(positive(line, "commit_floor_us"), durable, "{line}");
        assert_eq!(positive(line, "floor_ratio"), durable && !state, "{line}");
        assert_eq!(positive(line, "state_floor_ms"), state, "{line}");
        // Paced by the runs' CPU time, so present where that was read.
        let paced = durable && !state && positive(line, "cpu_median");
        assert_eq!(positive(line, "paced_commit_us"), paced, "{line}");
        assert_eq!(positive(line, "pace_us"), paced, "{line}");
        if paced {
            assert_eq!(line["pace_us"], line["cpu_median"], "{line}");
        }
        assert_eq!(
            positive(line, "state_target_ms"),
            state && durable,
            "{line}"
        );
        if state && durable {
            let floor = line["state_floor_ms"].as_f64().expect("a state floor");
            let commit = line["commit_floor_us"].as_f64().expect("a commit floor");
            let target = line["state_target_ms"].as_f64().expect("a target");
            assert!(
                target > floor && target > commit * 1.3 / 1e3 * 0.99,
                "{line}"
            );
        }
        assert!(line["clients"].is_null(), "{line}");
        if !state {
            assert_eq!(line["size"], 5, "{line}");
        }
    }
}

#[test]
fn chain3_with_clients_reports_throughput_and_latency_percentiles() {
    let lines = json_lines(&[
        "chain3",
        "--clients",
        "4",
        "--roots",
        "12",
        "--store",
        "memory,sqlite",
        "--runs",
        "1",
    ]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for line in &lines {
        let durable = line["store"] == "sqlite";
        assert_eq!(line["workload"], "chain3", "{line}");
        assert_eq!(line["unit"], "runs/s", "{line}");
        assert_eq!(line["clients"], 4, "{line}");
        assert_eq!(line["size"], 12, "{line}");
        for field in ["median", "runs_per_second", "p50_us", "p99_us"] {
            assert!(positive(line, field), "{field}: {line}");
        }
        assert_eq!(line["median"], line["runs_per_second"], "{line}");
        assert!(line["p50_us"].as_f64() <= line["p99_us"].as_f64(), "{line}");
        assert_eq!(positive(line, "commit_floor_us"), durable, "{line}");
        assert_eq!(positive(line, "floor_ratio"), durable, "{line}");
    }
}

#[test]
fn clients_zero_is_refused_with_a_clear_message() {
    let output = Command::new(env!("CARGO_BIN_EXE_baton-bench"))
        .args(["chain3", "--clients", "0"])
        .output()
        .expect("the bench runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("`--clients` needs a positive number of concurrent hosts, got `0`"),
        "{stderr}"
    );
}
