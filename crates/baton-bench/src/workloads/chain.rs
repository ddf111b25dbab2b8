//! `chain3` (W1): a workflow of three pure transforms, a thousand new roots
//! one after another.

use anyhow::Result;
use baton::run::{Payload, Program};
use baton::workflow::{Config as WorkflowConfig, Workflow, transform};

use super::{Concurrent, build_name, concurrent_roots, per_root};
use crate::measure::Sample;
use crate::report::nearest_rank;
use crate::store::{BenchStore, StoreKind};

/// The `chain3` program: three pure transforms, each appending a short
/// string.
fn chain3_program() -> Result<Program<String, String>> {
    Ok(Workflow::new(WorkflowConfig {
        name: "bench.chain3".into(),
        description: "Three pure stages.".into(),
        build: build_name(),
        stages: vec![
            transform("a", |text: String| Ok(text + "a")),
            transform("b", |text: String| Ok(text + "b")),
            transform("c", |text: String| Ok(text + "c")),
        ],
    })?
    .program::<String, String>())
}

/// `chain3` (W1): `roots` roots of three pure transforms, one after
/// another; the figure is µs per root.
pub async fn chain3_run(run: usize, kind: StoreKind, roots: u64) -> Result<Sample> {
    let chain = chain3_program()?;
    let store = BenchStore::fresh(kind)?;
    let expected = Payload::encode(&"xabc")?;
    let prefix = format!("chain3-{run}");
    let measured = per_root(&chain, &store, &prefix, "x".to_owned(), roots, &expected).await?;
    Ok(measured.per(roots, 1e6))
}

/// `chain3 --clients` (issue 21's throughput workload): `roots` roots of
/// the same program from `clients` concurrent hosts, each with an engine of
/// its own on one store, each starting roots one after another. The figure
/// is runs per second over the whole phase; `p50_us` and `p99_us` are the
/// runs' start-to-output latencies; CPU and bytes are per root.
pub async fn chain3_clients_run(
    run: usize,
    kind: StoreKind,
    clients: usize,
    roots: u64,
) -> Result<Sample> {
    let chain = chain3_program()?;
    let store = BenchStore::fresh(kind)?;
    let expected = Payload::encode(&"xabc")?;
    let prefix = format!("chain3-clients-{run}");
    let Concurrent {
        measured,
        latencies,
    } = concurrent_roots(
        &chain,
        &store,
        &prefix,
        "x".to_owned(),
        clients,
        roots,
        &expected,
    )
    .await?;
    let mut micros: Vec<f64> = latencies.iter().map(|t| t.as_secs_f64() * 1e6).collect();
    micros.sort_by(f64::total_cmp);
    let runs_per_second = micros.len() as f64 / measured.seconds;
    Ok(Sample {
        figure: runs_per_second,
        runs_per_second: Some(runs_per_second),
        p50_us: Some(nearest_rank(&micros, 50)),
        p99_us: Some(nearest_rank(&micros, 99)),
        ..measured.per(roots, 1e6)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::check;

    #[tokio::test(flavor = "multi_thread")]
    async fn chain3_runs_small_on_both_stores() {
        for kind in StoreKind::ALL {
            check(&chain3_run(0, kind, 10).await.unwrap(), kind, "chain3");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn chain3_with_four_clients_completes_every_root_on_both_stores() {
        // 10 roots over 4 clients: shares of 3, 3, 2 and 2; each root's
        // output is checked inside the run, which fails on a wrong one.
        for kind in StoreKind::ALL {
            let sample = chain3_clients_run(0, kind, 4, 10).await.unwrap();
            check(&sample, kind, "chain3 --clients");
            let (p50, p99) = (sample.p50_us.unwrap(), sample.p99_us.unwrap());
            assert!(p50 > 0.0 && p50 <= p99, "{sample:?}");
            assert_eq!(sample.runs_per_second, Some(sample.figure));
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn concurrent_hosts_report_one_latency_per_root_even_with_idle_clients() {
        let chain = chain3_program().unwrap();
        let store = BenchStore::fresh(StoreKind::Memory).unwrap();
        let expected = Payload::encode(&"xabc").unwrap();
        let done = concurrent_roots(&chain, &store, "few", "x".to_owned(), 4, 3, &expected)
            .await
            .unwrap();
        assert_eq!(done.latencies.len(), 3, "three roots over four clients");
        let wrong = Payload::encode(&"nope").unwrap();
        let refused = concurrent_roots(&chain, &store, "wrong", "x".to_owned(), 2, 2, &wrong)
            .await
            .err()
            .expect("a root with another output fails the run");
        assert!(refused.to_string().contains("not with"), "{refused:#}");
    }
}
