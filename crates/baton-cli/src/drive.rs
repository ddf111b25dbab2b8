//! Driving a tree until it settles, and shutting an engine down.
//!
//! A tree has settled when no live process runs: each waits for an answer
//! or is parked on an unknown effect, or the root ended. The engine says
//! when that holds; the command line never polls.

use std::time::Duration;

use baton::run::{
    Condition, Engine, Payload, ProcessHandle, Scope, TreeError, TreeId, TreeView, Visibility,
};

use crate::error::{CliError, Explain};

/// Takes `tree` up (when this engine does not run it yet) and waits until
/// it has settled; returns it as it then is. A tree another live engine
/// holds (a `serve` drives it) is returned as it stands.
pub async fn settle(
    engine: &Engine,
    scope: &Scope,
    tree: TreeId,
    bin: &str,
) -> Result<TreeView, CliError> {
    let handle: ProcessHandle<Payload> = match engine.process(scope, tree).await {
        Ok(handle) => handle,
        // Another live engine (a `serve`) holds the tree and drives it on:
        // it is shown as it stands.
        Err(TreeError::LeaseHeld { .. }) => {
            return engine
                .inspect(scope, tree, Visibility::Public)
                .await
                .map_err(|error| error.explain(bin));
        }
        Err(error) => return Err(error.explain(bin)),
    };
    handle
        .until(Condition::Quiescent)
        .await
        .map_err(|error| error.explain(bin))
}

/// Shuts `engine` down: stops admitting work, lets in-flight steps commit,
/// gives in-flight dispatches up to `grace` to settle and their settlements
/// to commit, then releases every lease it holds. A dispatch still in
/// flight after `grace` stays pending in the log, for recovery to decide by
/// its replay policy.
pub async fn shutdown(engine: Engine, grace: Duration) {
    engine.shutdown(grace).await;
}
