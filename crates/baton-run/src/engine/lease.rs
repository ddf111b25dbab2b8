//! Leases and liveness: how an engine names itself as a lease owner, how it
//! tells that another owner is provably gone, and how it becomes a tree's
//! writer.
//!
//! An engine names itself `host/pid/engine-n`. A live lease held by
//! another owner is taken over without `force` only when that owner is
//! provably gone: an engine of this process that no longer exists, or a
//! process of this host that no longer runs.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::Timestamp;
use crate::ids::TreeId;
use crate::storage::{AcquireRequest, Acquired, Lease, StoreError, TreeLoad};

use super::EngineInner;

static ENGINE_COUNTER: AtomicU64 = AtomicU64::new(0);
/// The owner names of this process's engines that have not been dropped.
static LIVE_OWNERS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A new engine's owner name, registered as live until [`retire`].
pub(super) fn new_owner() -> String {
    let owner = format!(
        "{}/{}/engine-{}",
        host_name(),
        std::process::id(),
        ENGINE_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    if let Ok(mut owners) = LIVE_OWNERS.lock() {
        owners.push(owner.clone());
    }
    owner
}

/// Marks an engine's owner name as gone: its leases may be taken over
/// without force by other engines of this process.
pub(super) fn retire(owner: &str) {
    if let Ok(mut owners) = LIVE_OWNERS.lock() {
        owners.retain(|live| live != owner);
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty() && !name.contains('/'))
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Whether a lease owner is provably gone: an engine of this process that
/// no longer exists, or a process of this host that no longer runs.
pub(super) fn owner_is_gone(owner: &str) -> bool {
    let mut parts = owner.split('/');
    let (Some(host), Some(pid), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    if host != host_name() {
        return false;
    }
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    if pid == std::process::id() {
        let live = LIVE_OWNERS
            .lock()
            .map(|owners| owners.iter().any(|o| o == owner))
            .unwrap_or(true);
        return !live;
    }
    let proc_root = std::path::Path::new("/proc");
    proc_root.join("self").exists() && !proc_root.join(pid.to_string()).exists()
}

/// Why a tree's lease could not be had.
pub(super) enum Held {
    /// The store failed.
    Store(StoreError),
    /// A live lease is held by an owner that is not provably gone.
    Lease { owner: String, until: Timestamp },
}

/// Becomes the writer of `tree`, taking over the lease of an owner that is
/// provably gone even without `force`.
pub(super) async fn acquire(
    engine: &EngineInner,
    tree: TreeId,
    force: bool,
) -> Result<(Lease, TreeLoad), Held> {
    let mut force = force;
    loop {
        let request = AcquireRequest {
            tree,
            owner: engine.owner.clone(),
            now: engine.clock.now(),
            ttl: engine.lease_ttl,
            force,
        };
        match engine.store.acquire(request).await.map_err(Held::Store)? {
            Acquired::Granted { lease, load } => {
                engine.hold(tree, lease.token);
                return Ok((lease, load));
            }
            // This engine's own lease, from a tree it no longer has in
            // memory (a sleeping tree no handle held): the caller holds the
            // tree's guard and found no live tree, so nothing of this engine
            // writes to it.
            Acquired::LeaseHeld { owner, .. } if !force && owner == engine.owner => {
                force = true;
            }
            Acquired::LeaseHeld { owner, .. } if !force && owner_is_gone(&owner) => {
                tracing::info!(%tree, %owner, "taking over the lease of a writer that is gone");
                force = true;
            }
            Acquired::LeaseHeld { owner, until } => return Err(Held::Lease { owner, until }),
        }
    }
}
