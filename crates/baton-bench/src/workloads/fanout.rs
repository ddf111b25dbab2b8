//! `fanout5` (W2): a workflow whose root starts five children, waits for
//! all of them and joins their results, a thousand new roots one after
//! another.

use anyhow::Result;
use baton::run::Payload;
use baton::workflow::{Child, Config as WorkflowConfig, Workflow, fork, transform};

use super::{build_name, per_root};
use crate::measure::Sample;
use crate::store::{BenchStore, StoreKind};

/// `fanout5` (W2): a root starts five children (each a pure transform),
/// waits for all of them and joins their five results.
pub async fn fanout5_run(run: usize, kind: StoreKind, roots: u64) -> Result<Sample> {
    let branch = Workflow::new(WorkflowConfig {
        name: "bench.branch".into(),
        description: "One pure stage.".into(),
        build: build_name(),
        stages: vec![transform("double", |value: u64| Ok(value * 2))],
    })?
    .program::<u64, u64>();
    let branches = (0..5).map(|_| Child::new(&branch)).collect();
    let fanout = Workflow::new(WorkflowConfig {
        name: "bench.fanout5".into(),
        description: "Five children, then a join.".into(),
        build: build_name(),
        stages: vec![fork::<u64, u64, u64, _>("fan", branches, 5, |outputs| {
            Ok(outputs.iter().sum())
        })],
    })?
    .program::<u64, u64>();
    let store = BenchStore::fresh(kind)?;
    // Five branches each double 21.
    let expected = Payload::encode(&210u64)?;
    let prefix = format!("fanout5-{run}");
    let measured = per_root(&fanout, &store, &prefix, 21u64, roots, &expected).await?;
    Ok(measured.per(roots, 1e6))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::check;

    #[tokio::test(flavor = "multi_thread")]
    async fn fanout5_runs_small_on_both_stores() {
        for kind in StoreKind::ALL {
            check(&fanout5_run(0, kind, 5).await.unwrap(), kind, "fanout5");
        }
    }
}
