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
