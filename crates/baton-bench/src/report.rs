//! What the parent prints: one JSON [`Line`] per workload and store, summed
//! up from its workers' reports (medians and 90th percentiles of the
//! per-run figures), and the human table of all of them.

use std::fmt::Write as _;

use serde::Serialize;

use crate::measure::Sample;
use crate::process::WorkerReport;
use crate::store::StoreKind;
use crate::workloads::Workload;

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
    /// The largest `VmHWM` of the workload's processes.
    peak_rss_bytes: u64,
    /// Median store bytes per unit of work.
    bytes_written: f64,
    /// Median bytes handed to `write(2)` per unit of work (SQLite only).
    #[serde(skip_serializing_if = "Option::is_none")]
    io_bytes: Option<f64>,
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
}

impl Line {
    /// Sums up the reports of `workload`'s worker processes on `store`,
    /// whose runs each did `size` units of work.
    pub fn summarize(
        workload: Workload,
        store: StoreKind,
        size: u64,
        reports: Vec<WorkerReport>,
    ) -> Line {
        let mut samples = Vec::new();
        let mut peak_rss_bytes = 0;
        for report in reports {
            peak_rss_bytes = peak_rss_bytes.max(report.peak_rss_bytes);
            samples.extend(report.samples);
        }
        for sample in &samples {
            peak_rss_bytes = peak_rss_bytes.max(sample.peak_rss_bytes.unwrap_or(0));
        }
        let figures = sorted(samples.iter().map(|s| s.figure));
        Line {
            workload: workload.name(),
            store: store.name(),
            unit: workload.unit(),
            median: round(median(&figures)),
            p90: round(p90(&figures)),
            runs: samples.len(),
            size,
            peak_rss_bytes,
            bytes_written: median_of(&samples, |s| Some(s.bytes_written)).unwrap_or(f64::NAN),
            io_bytes: median_of(&samples, |s| s.io_bytes),
            marginal_bytes: median_of(&samples, |s| s.marginal_bytes),
            total_seconds: median_of(&samples, |s| s.total_seconds),
            cpu_median: median_of(&samples, |s| s.cpu),
            turns: median_of(&samples, |s| s.turns.map(|t| t as f64)),
        }
    }
}

/// The median of sorted values (the mean of the middle two for an even count).
fn median(sorted: &[f64]) -> f64 {
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
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    let rank = (n * 9).div_ceil(10).max(1);
    sorted[rank - 1]
}

fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values
}

/// The rounded median of the values `pick` finds, if it finds any.
fn median_of(samples: &[Sample], pick: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
    let values = sorted(samples.iter().filter_map(pick));
    (!values.is_empty()).then(|| round(median(&values)))
}

/// Rounds to three decimals for printing.
fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
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
        "runs",
        "notes",
    ];
    let mut rows = vec![header.map(str::to_owned).to_vec()];
    for line in results {
        let per = Workload::parse(line.workload).map_or("unit", Workload::per);
        let mut notes = Vec::new();
        if let Some(marginal) = line.marginal_bytes {
            notes.push(format!("marginal {marginal} B/{per}"));
        }
        if let Some(total) = line.total_seconds {
            notes.push(format!("total {total} s"));
        }
        if let Some(turns) = line.turns {
            notes.push(format!("{turns} turns"));
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
    }
}
