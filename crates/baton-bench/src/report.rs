//! What the parent prints: one JSON [`Line`] per workload and store, summed
//! up from its workers' reports (medians and 90th percentiles of the
//! per-run figures), and the human table of all of them.

use std::fmt::Write as _;

use serde::Serialize;

use crate::args::Options;
use crate::measure::Sample;
use crate::process::WorkerReport;
use crate::store::StoreKind;
use crate::workloads::Workload;

/// The process allocator a build of the bench measures with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Allocator {
    /// mimalloc, as the `baton` binary links (feature `mimalloc`, default).
    Mimalloc,
    /// The system allocator (`--no-default-features`).
    System,
}

impl Allocator {
    /// The allocator of this build.
    pub const OF_THIS_BUILD: Allocator = if cfg!(feature = "mimalloc") {
        Allocator::Mimalloc
    } else {
        Allocator::System
    };
}

/// The result of one workload on one store: one JSON line.
#[derive(Debug, Serialize)]
pub struct Line {
    /// The workload's name.
    workload: &'static str,
    /// The store it ran on.
    store: &'static str,
    /// The unit of `median` and `p90`.
    unit: &'static str,
    /// Median of the per-run figures.
    median: f64,
    /// Nearest-rank 90th percentile of the per-run figures.
    p90: f64,
    /// Measured runs (the warm-up is not counted).
    runs: usize,
    /// Steps, dispatches, tasks, roots or stages per run.
    size: u64,
    /// The process allocator of the bench's build: `mimalloc` (the default,
    /// as the `baton` binary links) or `system` (`--no-default-features`).
    allocator: Allocator,
    /// The largest `VmHWM` of the workload's processes.
    peak_rss_bytes: u64,
    /// Median store bytes per unit of work.
    bytes_written: f64,
    /// Median bytes handed to `write(2)` per unit of work (SQLite only).
    #[serde(skip_serializing_if = "Option::is_none")]
    io_bytes: Option<f64>,
    /// The page size of the run's stores in bytes (SQLite only:
    /// `--page-size`, 4096 by default).
    #[serde(skip_serializing_if = "Option::is_none")]
    page_size: Option<u32>,
    /// Who committed the run's short runs (SQLite only: `--commit-on`,
    /// `caller` by default, or `writer`).
    #[serde(skip_serializing_if = "Option::is_none")]
    commit_on: Option<&'static str>,
    /// Median store bytes per extra stage (`state-*` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    marginal_bytes: Option<f64>,
    /// Median seconds of the whole measured phase (`resume1000` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    total_seconds: Option<f64>,
    /// Median CPU microseconds (all threads) per unit, for timed workloads.
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_median: Option<f64>,
    /// Median coordinator turns per run (`team1000` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    turns: Option<f64>,
    /// Median milliseconds to load, verify and fold the finished tree's
    /// log (`team1000` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    inspect_ms: Option<f64>,
    /// Concurrent hosts (`chain3 --clients` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    clients: Option<usize>,
    /// Median durable runs per second over the whole phase (`chain3
    /// --clients` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    runs_per_second: Option<f64>,
    /// Median of the runs' median start-to-output latency in µs (`chain3
    /// --clients` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    p50_us: Option<f64>,
    /// Median of the runs' 99th-percentile start-to-output latency in µs
    /// (`chain3 --clients` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    p99_us: Option<f64>,
    /// Median µs of a one-row durable transaction on the same file system
    /// or server, measured in the workload's process (durable stores only).
    #[serde(skip_serializing_if = "Option::is_none")]
    commit_floor_us: Option<f64>,
    /// The per-run figure in µs over `commit_floor_us`: `median` for
    /// `chain3` and `fanout5`, `p50_us` for `chain3 --clients`.
    #[serde(skip_serializing_if = "Option::is_none")]
    floor_ratio: Option<f64>,
    /// Mean µs of the commit floor's transaction begun after `pace_us` of
    /// CPU work (`chain3` and `fanout5` on durable stores, one host).
    #[serde(skip_serializing_if = "Option::is_none")]
    paced_commit_us: Option<f64>,
    /// The CPU µs spun before each paced transaction: the median CPU time
    /// per run of the workload's measured runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pace_us: Option<f64>,
    /// Median ms of one canonical encode and one hash of the carried state,
    /// measured in the workload's process (`state-*` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    state_floor_ms: Option<f64>,
    /// Median ms of one decode of the encoded carried state as the
    /// workload's program restores it, measured in the workload's process
    /// (`state-*` only): what the kernel's restore before adoption adds to
    /// every stage beside `state_floor_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    restore_floor_ms: Option<f64>,
    /// `state_floor_ms + 1.3 × commit_floor_us` in ms: what a stage should
    /// cost at most (`state-*` on durable stores only).
    #[serde(skip_serializing_if = "Option::is_none")]
    state_target_ms: Option<f64>,
}

impl Line {
    /// Sums up the reports of `workload`'s worker processes on `store`,
    /// run with `options`.
    pub fn summarize(
        workload: Workload,
        store: StoreKind,
        options: &Options,
        reports: Vec<WorkerReport>,
    ) -> Line {
        let mut samples = Vec::new();
        let mut floors = Vec::new();
        let mut peak_rss_bytes = 0;
        for report in reports {
            peak_rss_bytes = peak_rss_bytes.max(report.peak_rss_bytes);
            samples.extend(report.samples);
            floors.push(report.floors);
        }
        for sample in &samples {
            peak_rss_bytes = peak_rss_bytes.max(sample.peak_rss_bytes.unwrap_or(0));
        }
        let figures = sorted(samples.iter().map(|s| s.figure));
        let median_figure = median(&figures);
        let commit_floor_us = median_where(floors.iter().filter_map(|f| f.commit_floor_us));
        let state_floor_ms = median_where(floors.iter().filter_map(|f| f.state_floor_ms));
        let restore_floor_ms = median_where(floors.iter().filter_map(|f| f.restore_floor_ms));
        let paced_commit_us = median_where(floors.iter().filter_map(|f| f.paced_commit_us));
        let pace_us = median_where(floors.iter().filter_map(|f| f.pace_us));
        let p50_us = median_of(&samples, |s| s.p50_us);
        let clients = options.clients_of(workload);
        // The per-run latency that the commit floor bounds.
        let per_run_us = match workload {
            Workload::Chain3 if clients.is_some() => p50_us,
            Workload::Chain3 | Workload::Fanout5 => Some(median_figure),
            _ => None,
        };
        Line {
            workload: workload.name(),
            store: store.name(),
            unit: options.unit(workload),
            median: round(median_figure),
            p90: round(p90(&figures)),
            runs: samples.len(),
            size: options.size(workload),
            allocator: Allocator::OF_THIS_BUILD,
            peak_rss_bytes,
            bytes_written: median_of(&samples, |s| Some(s.bytes_written)).unwrap_or(f64::NAN),
            io_bytes: median_of(&samples, |s| s.io_bytes),
            page_size: (store == StoreKind::Sqlite).then(|| options.page_size.bytes()),
            commit_on: (store == StoreKind::Sqlite).then(|| options.commit_on_name()),
            marginal_bytes: median_of(&samples, |s| s.marginal_bytes),
            total_seconds: median_of(&samples, |s| s.total_seconds),
            cpu_median: median_of(&samples, |s| s.cpu),
            turns: median_of(&samples, |s| s.turns.map(|t| t as f64)),
            inspect_ms: median_of(&samples, |s| s.inspect_ms).map(round),
            clients,
            runs_per_second: median_of(&samples, |s| s.runs_per_second),
            p50_us,
            p99_us: median_of(&samples, |s| s.p99_us),
            commit_floor_us: commit_floor_us.map(round),
            floor_ratio: per_run_us
                .zip(commit_floor_us)
                .map(|(us, floor)| round(us / floor)),
            paced_commit_us: paced_commit_us.map(round),
            pace_us: pace_us.map(round),
            state_floor_ms: state_floor_ms.map(round_fine),
            restore_floor_ms: restore_floor_ms.map(round_fine),
            state_target_ms: state_floor_ms
                .zip(commit_floor_us)
                .map(|(ms, floor)| round_fine(ms + TARGET_COMMITS * floor / 1e3)),
        }
    }
}

/// Commits a `state-*` stage may cost beyond its state floor (issue 21's
/// target: `state_floor + 1.3 × commit_floor` per stage).
const TARGET_COMMITS: f64 = 1.3;

/// The median of sorted values (the mean of the middle two for an even count).
pub fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        f64::midpoint(sorted[n / 2 - 1], sorted[n / 2])
    }
}

/// The nearest-rank 90th percentile of sorted values.
fn p90(sorted: &[f64]) -> f64 {
    nearest_rank(sorted, 90)
}

/// The nearest-rank `percent`th percentile of sorted values: the smallest
/// value at least `percent`% of the values are no larger than.
pub fn nearest_rank(sorted: &[f64], percent: usize) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    let rank = (n * percent).div_ceil(100).clamp(1, n);
    sorted[rank - 1]
}

pub fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values
}

/// The rounded median of the values `pick` finds, if it finds any.
fn median_of(samples: &[Sample], pick: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
    let values = sorted(samples.iter().filter_map(pick));
    (!values.is_empty()).then(|| round(median(&values)))
}

/// The unrounded median of `values`, if there are any.
fn median_where(values: impl Iterator<Item = f64>) -> Option<f64> {
    let values = sorted(values);
    (!values.is_empty()).then(|| median(&values))
}

/// Rounds to three decimals for printing.
fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// Rounds to four significant digits, for figures in ms that may be a few
/// µs (the state floor of `state-1k`).
fn round_fine(value: f64) -> f64 {
    if value == 0.0 || !value.is_finite() {
        return value;
    }
    let scale = 10f64.powi(3 - value.abs().log10().floor() as i32);
    (value * scale).round() / scale
}

/// The human table of the results.
pub fn table(results: &[Line]) -> String {
    let header = [
        "workload",
        "store",
        "unit",
        "median",
        "p90",
        "cpu median",
        "bytes written",
        "io bytes",
        "peak RSS MiB",
        "commit floor",
        "x floor",
        "runs",
        "notes",
    ];
    let mut rows = vec![header.map(str::to_owned).to_vec()];
    for line in results {
        let per = Workload::parse(line.workload).map_or("unit", Workload::per);
        let mut notes = Vec::new();
        if line.allocator == Allocator::System {
            notes.push("system allocator".to_owned());
        }
        if let Some(page) = line.page_size {
            notes.push(format!("{page} B pages"));
        }
        if line.commit_on == Some("writer") {
            notes.push("commits on the writer thread".to_owned());
        }
        if let Some(marginal) = line.marginal_bytes {
            notes.push(format!("marginal {marginal} B/{per}"));
        }
        if let Some(total) = line.total_seconds {
            notes.push(format!("total {total} s"));
        }
        if let Some(turns) = line.turns {
            notes.push(format!("{turns} turns"));
        }
        if let Some(inspect) = line.inspect_ms {
            notes.push(format!("log read back in {inspect} ms"));
        }
        if let Some(clients) = line.clients {
            notes.push(format!("{clients} clients"));
        }
        if let (Some(p50), Some(p99)) = (line.p50_us, line.p99_us) {
            notes.push(format!("p50 {p50} us, p99 {p99} us"));
        }
        if let (Some(paced), Some(pace)) = (line.paced_commit_us, line.pace_us) {
            notes.push(format!(
                "a bare commit after {pace} us of CPU: {paced} us (mean)"
            ));
        }
        if let Some(floor) = line.state_floor_ms {
            notes.push(format!("state floor {floor} ms"));
        }
        if let Some(floor) = line.restore_floor_ms {
            notes.push(format!("restore floor {floor} ms"));
        }
        if let Some(target) = line.state_target_ms {
            notes.push(format!("target {target} ms"));
        }
        rows.push(vec![
            line.workload.to_owned(),
            line.store.to_owned(),
            line.unit.to_owned(),
            line.median.to_string(),
            line.p90.to_string(),
            line.cpu_median
                .map_or("-".to_owned(), |cpu| cpu.to_string()),
            format!("{} B/{per}", line.bytes_written),
            line.io_bytes
                .map_or("-".to_owned(), |io| format!("{io} B/{per}")),
            format!("{:.1}", line.peak_rss_bytes as f64 / 1_048_576.0),
            line.commit_floor_us
                .map_or("-".to_owned(), |floor| format!("{floor} us")),
            line.floor_ratio
                .map_or("-".to_owned(), |ratio| format!("{ratio}")),
            line.runs.to_string(),
            notes.join(", "),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|column| rows.iter().map(|row| row[column].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        assert_eq!(median(&[1.0, 2.0, 3.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 3.0, 4.0]), 2.5);
        assert_eq!(p90(&[1.0, 2.0, 3.0, 4.0, 5.0]), 5.0);
        assert_eq!(p90(&(1..=10).map(f64::from).collect::<Vec<_>>()), 9.0);
        assert_eq!(p90(&[7.0]), 7.0);
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(nearest_rank(&hundred, 50), 50.0);
        assert_eq!(nearest_rank(&hundred, 99), 99.0);
        assert_eq!(nearest_rank(&[3.0, 4.0], 99), 4.0);
        assert_eq!(nearest_rank(&[3.0, 4.0], 0), 3.0);
        assert!(nearest_rank(&[], 50).is_nan());
    }

    #[test]
    fn sqlite_lines_say_their_page_size_and_others_do_not() {
        let report = || WorkerReport {
            samples: vec![Sample {
                figure: 1.0,
                ..Sample::default()
            }],
            peak_rss_bytes: 0,
            floors: Default::default(),
        };
        let args: Vec<String> = ["chain3", "--page-size", "1024"].map(String::from).to_vec();
        let options = Options::parse(&args).unwrap();
        let line = |store| Line::summarize(Workload::Chain3, store, &options, vec![report()]);
        let sqlite = serde_json::to_value(line(StoreKind::Sqlite)).unwrap();
        assert_eq!(sqlite["page_size"], 1024);
        assert_eq!(
            sqlite["allocator"],
            serde_json::to_value(Allocator::OF_THIS_BUILD).unwrap()
        );
        let memory = serde_json::to_value(line(StoreKind::Memory)).unwrap();
        assert!(memory.get("page_size").is_none(), "{memory}");
        let table = table(&[line(StoreKind::Sqlite)]);
        assert!(table.contains("1024 B pages"), "{table}");
        assert_eq!(sqlite["commit_on"], "caller");
        assert!(memory.get("commit_on").is_none(), "{memory}");
        let args: Vec<String> = ["chain3", "--commit-on", "writer"]
            .map(String::from)
            .to_vec();
        let options = Options::parse(&args).unwrap();
        let writer = Line::summarize(
            Workload::Chain3,
            StoreKind::Sqlite,
            &options,
            vec![report()],
        );
        assert_eq!(
            serde_json::to_value(&writer).unwrap()["commit_on"],
            "writer"
        );
        let writer_table = super::table(&[writer]);
        assert!(
            writer_table.contains("commits on the writer thread"),
            "{writer_table}"
        );
    }

    #[test]
    fn fine_rounding_keeps_four_digits() {
        assert_eq!(round_fine(0.001_234_56), 0.001_235);
        assert_eq!(round_fine(1.031_49), 1.031);
        assert_eq!(round_fine(0.0), 0.0);
    }
}
