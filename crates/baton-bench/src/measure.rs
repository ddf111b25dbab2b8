//! A measured phase and what comes of it: [`Phase`] reads the clocks, the
//! CPU time, the store's bytes and the bytes handed to `write(2)` at its
//! start, [`Measured`] is their growth at its end, and a [`Sample`] is the
//! figures of one run that a worker reports.

use std::time::Instant;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::probe::{cpu_ns, io_written, now};
use crate::store::{BenchStore, StoreKind};

/// The start of a measured phase.
pub struct Phase {
    kind: StoreKind,
    bytes: u64,
    io: u64,
    cpu: u64,
    t0: Instant,
}

impl Phase {
    /// Starts measuring, given the store's `bytes` written so far.
    pub fn begin(kind: StoreKind, bytes: u64) -> Phase {
        let (io, cpu) = (io_written(), cpu_ns());
        Phase {
            kind,
            bytes,
            io,
            cpu,
            t0: now(),
        }
    }

    /// Starts measuring on `store`.
    pub async fn on(store: &BenchStore) -> Result<Phase> {
        Ok(Phase::begin(store.kind, store.bytes_written().await?))
    }

    /// Stops the clocks, then reads what `store` wrote during the phase.
    pub async fn end(self, store: &BenchStore) -> Result<Measured> {
        let (t1, cpu, io) = (now(), cpu_ns(), io_written());
        let bytes = store.bytes_written().await?;
        Ok(Measured {
            seconds: t1.duration_since(self.t0).as_secs_f64(),
            cpu_ns: cpu.saturating_sub(self.cpu),
            bytes: bytes.saturating_sub(self.bytes),
            io: (self.kind == StoreKind::Sqlite).then(|| io.saturating_sub(self.io)),
        })
    }
}

/// What a measured phase took and wrote.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    /// Wall time of the phase.
    pub seconds: f64,
    cpu_ns: u64,
    /// Bytes written to the store.
    pub bytes: u64,
    /// Bytes handed to `write(2)` (SQLite only).
    io: Option<u64>,
}

impl Measured {
    /// A sample over `units` units of work whose figure is wall time per
    /// unit, scaled by `scale` (1e6 for µs, 1e3 for ms); CPU time is in µs.
    pub fn per(&self, units: u64, scale: f64) -> Sample {
        let units = units as f64;
        Sample {
            figure: self.seconds * scale / units,
            // A thread's CPU time is accounted when it leaves the CPU or at
            // a scheduler tick, so a phase of a millisecond or two can read
            // no CPU at all: unknown, not zero.
            cpu: (self.cpu_ns > 0).then(|| self.cpu_ns as f64 / 1e3 / units),
            bytes_written: self.bytes as f64 / units,
            io_bytes: self.io.map(|io| io as f64 / units),
            ..Sample::default()
        }
    }
}

/// The figures of one run.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Sample {
    /// The headline figure, in the workload's unit.
    pub figure: f64,
    /// CPU microseconds per unit of work, when the figure is a time.
    pub cpu: Option<f64>,
    /// Store bytes per unit of work.
    pub bytes_written: f64,
    /// Bytes handed to `write(2)` per unit of work (SQLite only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_bytes: Option<f64>,
    /// Store bytes per extra stage (`state-*` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marginal_bytes: Option<f64>,
    /// Seconds of the whole measured phase (`resume1000` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_seconds: Option<f64>,
    /// Coordinator turns (`team1000` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns: Option<u64>,
    /// Milliseconds to read the finished tree back from the store: load,
    /// verify the hash chain and fold every record (`team1000` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inspect_ms: Option<f64>,
    /// Peak resident memory of a helper process (the second phase of
    /// `resume1000` on SQLite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
    /// Runs finished per second over the whole phase (`chain3 --clients`
    /// only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs_per_second: Option<f64>,
    /// Median start-to-output latency of the phase's runs in µs (`chain3
    /// --clients` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_us: Option<f64>,
    /// Nearest-rank 99th percentile of the same latencies in µs (`chain3
    /// --clients` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_us: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(cpu_ns: u64) -> Measured {
        Measured {
            seconds: 0.002,
            cpu_ns,
            bytes: 0,
            io: None,
        }
    }

    #[test]
    fn a_phase_that_read_no_cpu_reports_its_cpu_as_unknown() {
        assert_eq!(measured(0).per(50, 1e6).cpu, None);
        assert_eq!(measured(2_000_000).per(50, 1e6).cpu, Some(40.0));
    }
}
