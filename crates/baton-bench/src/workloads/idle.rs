//! `idle` (W6): many roots each wait on an input gate; the figure is the
//! growth of resident memory per waiting root.

use anyhow::Result;
use baton::run::Engine;

use super::gate::{gate_program, start_waiting};
use crate::measure::{Phase, Sample};
use crate::probe::status_bytes;
use crate::store::{BenchStore, StoreKind};

/// Roots started (and left waiting) in an `idle` run before the baseline
/// reading, so lazily built runtime and allocator structures are not charged
/// to the measured roots.
const IDLE_WARM_UP: usize = 64;

/// `idle` (W6): starts `roots` roots that each wait on an input gate; the
/// figure is the growth of resident memory per waiting root.
pub async fn idle_run(run: usize, kind: StoreKind, roots: usize) -> Result<Sample> {
    let store = BenchStore::fresh(kind)?;
    let gate = gate_program()?;
    let engine = Engine::new(store.config(gate.erase()))?;
    let mut handles = Vec::with_capacity(IDLE_WARM_UP.max(roots));
    let warm = format!("warm-{run}");
    start_waiting(&store, &engine, &gate, &warm, IDLE_WARM_UP, &mut handles).await?;
    handles.clear();

    let phase = Phase::on(&store).await?;
    let before = status_bytes("VmRSS")?;
    let prefix = format!("idle-{run}");
    start_waiting(&store, &engine, &gate, &prefix, roots, &mut handles).await?;
    // Measured while the host still holds every handle: an idle tree nobody
    // holds is dropped from memory and reloaded from the store on demand.
    let after = status_bytes("VmRSS")?;
    let measured = phase.end(&store).await?;
    handles.clear();
    drop(engine);
    Ok(Sample {
        figure: after.saturating_sub(before) as f64 / roots as f64,
        cpu: None,
        ..measured.per(roots as u64, 1.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn gate_roots_idle_on_both_stores() {
        for kind in StoreKind::ALL {
            let idle = idle_run(0, kind, 20).await.unwrap();
            assert!(idle.bytes_written > 0.0, "idle on {kind:?}: {idle:?}");
            assert_eq!(idle.io_bytes.is_some(), kind == StoreKind::Sqlite);
        }
    }
}
