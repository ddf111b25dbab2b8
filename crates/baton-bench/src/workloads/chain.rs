//! `chain3` (W1): a workflow of three pure transforms, a thousand new roots
//! one after another.

use anyhow::Result;
use baton::run::Payload;
use baton::workflow::{Config as WorkflowConfig, Workflow, transform};

use super::{build_name, per_root};
use crate::measure::Sample;
use crate::store::{BenchStore, StoreKind};

/// `chain3` (W1): three pure transforms, each appending a short string.
pub async fn chain3_run(run: usize, kind: StoreKind, roots: u64) -> Result<Sample> {
    let chain = Workflow::new(WorkflowConfig {
        name: "bench.chain3".into(),
        description: "Three pure stages.".into(),
        build: build_name(),
        stages: vec![
            transform("a", |text: String| Ok(text + "a")),
            transform("b", |text: String| Ok(text + "b")),
            transform("c", |text: String| Ok(text + "c")),
        ],
    })?
    .program::<String, String>();
    let store = BenchStore::fresh(kind)?;
    let expected = Payload::encode(&"xabc")?;
    let prefix = format!("chain3-{run}");
    let measured = per_root(&chain, &store, &prefix, "x".to_owned(), roots, &expected).await?;
    Ok(measured.per(roots, 1e6))
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
}
