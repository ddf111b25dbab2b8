//! What the bench reads from the system: the wall clock (its only clock)
//! and the `/proc/self` figures for resident memory, CPU time and bytes
//! handed to `write(2)`.

use std::time::Instant;

use anyhow::{Context, Result};

/// Reads the wall clock: the bench's only clock.
#[expect(clippy::disallowed_methods, reason = "benchmarks measure wall time")]
pub fn now() -> Instant {
    Instant::now()
}

/// A `kB` field of `/proc/self/status` (`VmRSS`, `VmHWM`), in bytes.
pub fn status_bytes(field: &str) -> Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("failed to read /proc/self/status")?;
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .with_context(|| format!("/proc/self/status has no {field}"))?;
    let kib: u64 = line
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .with_context(|| format!("unreadable {field}: {line}"))?;
    Ok(kib * 1024)
}

/// Nanoseconds every live thread of this process has spent on a CPU.
pub fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| {
            let schedstat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            schedstat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// Bytes this process has handed to `write(2)` and its kin so far (`wchar`
/// of `/proc/self/io`; 0 where the kernel does not offer it).
pub fn io_written() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|line| line.strip_prefix("wchar:"))
                .and_then(|value| value.trim().parse().ok())
        })
        .unwrap_or(0)
}
