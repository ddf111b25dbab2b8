//! The input gate that `resume1000` and `idle` park roots on, and the
//! loop that starts gate roots and returns once all of them wait.

use anyhow::{Result, bail};
use baton::coordination::{Answer, InputGate};
use baton::run::store::{ListFilter, TreeStatus};
use baton::run::{Engine, ProcessHandle, Program, TreeId};

use super::request;
use crate::store::BenchStore;

/// The bench's input gate: its request is the root's index, its answer a
/// boolean.
pub fn gate_program() -> Result<Program<u64, Answer>> {
    Ok(InputGate::typed::<u64, bool>("bench.gate", "Asks for a yes or a no.")?.program())
}

/// Starts `count` gate roots (each asking with its index) and returns once
/// every one of them is waiting.
pub async fn start_waiting(
    store: &BenchStore,
    engine: &Engine,
    gate: &Program<u64, Answer>,
    prefix: &str,
    count: usize,
    handles: &mut Vec<ProcessHandle<Answer>>,
) -> Result<()> {
    let first = handles.len();
    for index in 0..count {
        handles.push(
            engine
                .start(gate, request(format!("{prefix}-{index}"), index as u64)?)
                .await?
                .into_handle(),
        );
    }
    // Watch the store's listing rather than each tree: inspecting a tree
    // wakes it, and a sleeping tree should stay asleep.
    let mut pending: std::collections::BTreeSet<TreeId> =
        handles[first..].iter().map(ProcessHandle::tree).collect();
    let store = store.store();
    let waiting = ListFilter {
        status: Some(TreeStatus::Waiting),
        scope: None,
        ..ListFilter::default()
    };
    let mut polls = 0u32;
    while !pending.is_empty() {
        for meta in store.list(waiting.clone()).await?.trees {
            pending.remove(&meta.tree);
        }
        polls += 1;
        if polls > 100_000 {
            bail!("{} gate roots never reached waiting", pending.len());
        }
        tokio::task::yield_now().await;
    }
    Ok(())
}
