//! How an engine is configured, validated once by [`Engine::new`], and the
//! registry of the programs it runs.
//!
//! [`Engine::new`]: super::Engine::new

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::budget::TreeLimits;
use crate::clock::{Clock, SystemClock};
use crate::digest::Digest;
use crate::ids::Name;
use crate::protocol::Program;
use crate::storage::Store;

/// How an engine is built: the one way to configure it. Start from
/// [`EngineConfig::new`] and change fields with struct update syntax;
/// [`Engine::new`](super::Engine::new) validates the whole configuration.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use baton_run::{EngineConfig, MemoryStore};
///
/// let config = EngineConfig {
///     lease_ttl: Duration::from_secs(10),
///     ..EngineConfig::new(Arc::new(MemoryStore::new()))
/// };
/// assert_eq!(config.max_steps_per_commit, 256);
/// ```
pub struct EngineConfig {
    /// Where logs and snapshots live.
    pub store: Arc<dyn Store>,
    /// The programs this engine may start, run and recover; bound children
    /// are registered with their parents. A stored tree is resolved by the
    /// exact digest of its program; a start by name takes the program of
    /// that name registered last (its newest version).
    pub programs: Vec<Program>,
    /// The source of time for deadlines, leases and timers.
    pub clock: Arc<dyn Clock>,
    /// Lease time-to-live for tree writers.
    pub lease_ttl: Duration,
    /// The most steps a tree takes before committing (group commit bound;
    /// 256 by default, so a round of a hundred quick children commits once).
    pub max_steps_per_commit: usize,
    /// Write a snapshot after this many records (and enough log bytes).
    pub snapshot_every: u64,
    /// Events buffered per subscriber before slow subscribers lag.
    pub event_capacity: usize,
    /// Limits given to every tree this engine starts (recorded with the tree).
    pub limits: TreeLimits,
    /// What an idle tree (nothing staged or in flight, no deadline) keeps
    /// in memory while it waits for a command.
    pub sleep: Sleep,
    /// How long an answer, signal, cancellation or resolution for a tree
    /// that another live engine holds waits for that engine to apply it
    /// (the command is posted to the tree's inbox; see
    /// `TreeError::ForwardTimeout`).
    pub forward_timeout: Duration,
    /// The idle alarm: a tree whose owner task runs (work in flight, a
    /// backoff, a deadline) but commits nothing for this long while no
    /// wait of it is open for a person gets one non-durable
    /// [`EventKind::Idle`](super::EventKind::Idle) event (and a warning in
    /// the log), again after each later commit. Not a failure. `None`
    /// (the default) rings no alarm.
    pub idle_alarm: Option<Duration>,
}

impl EngineConfig {
    /// Defaults over `store`: no programs, the system clock, 30 s leases,
    /// 256 steps per commit, a snapshot after 512 records, 4096 buffered
    /// events, the default tree limits, trees unloaded while they sleep, and
    /// 30 s to wait for another engine to apply a forwarded command.
    pub fn new(store: Arc<dyn Store>) -> EngineConfig {
        EngineConfig {
            store,
            programs: Vec::new(),
            clock: Arc::new(SystemClock),
            lease_ttl: Duration::from_secs(30),
            max_steps_per_commit: 256,
            snapshot_every: 512,
            event_capacity: 4096,
            limits: TreeLimits::default(),
            sleep: Sleep::default(),
            forward_timeout: Duration::from_secs(30),
            idle_alarm: None,
        }
    }

    /// Checks every setting that has a floor.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let zero = |field: &'static str| Err(ConfigError::Zero { field });
        if self.lease_ttl.is_zero() {
            return zero("lease_ttl");
        }
        if self.max_steps_per_commit == 0 {
            return zero("max_steps_per_commit");
        }
        if self.snapshot_every == 0 {
            return zero("snapshot_every");
        }
        if self.forward_timeout.is_zero() {
            return zero("forward_timeout");
        }
        if self.event_capacity == 0 {
            return zero("event_capacity");
        }
        if self.idle_alarm.is_some_and(|alarm| alarm.is_zero()) {
            return zero("idle_alarm");
        }
        if self.limits.max_processes == 0 {
            return zero("limits.max_processes");
        }
        if self.limits.max_state_bytes == 0 {
            return zero("limits.max_state_bytes");
        }
        Ok(())
    }
}

/// What an idle tree keeps in memory while it waits (for input, an answer,
/// a resolution). A tree waiting for a person may wait for days; a host may
/// hold many thousands of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sleep {
    /// Its owner task keeps running, with everything in memory.
    Awake,
    /// Its owner task ends; its state stays in memory, packed as JSON, and
    /// is unpacked when a command wakes it.
    Packed,
    /// Its owner task ends and its state leaves memory: only the lease and
    /// what its handles share stay. A command reloads it from the store
    /// (one load and fold), after checking that nobody wrote to it meanwhile.
    #[default]
    Unloaded,
}

/// Why an engine configuration was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A setting that must be positive is zero.
    #[error("engine.config.invalid: {field} must be greater than zero")]
    Zero {
        /// The setting, as named in [`EngineConfig`].
        field: &'static str,
    },
}

impl ConfigError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ConfigError::Zero { .. } => "engine.config.invalid",
        }
    }
}

/// The programs an engine knows: by exact digest (how stored trees are
/// resolved) and by name (how starts by name find the newest version).
#[derive(Default)]
pub(super) struct Registry {
    by_digest: BTreeMap<Digest, Program>,
    /// Digests of each name's registered programs, oldest first.
    by_name: BTreeMap<Name, Vec<Digest>>,
}

impl Registry {
    /// Registers a program and, recursively, its bound children.
    pub fn add(&mut self, program: &Program) {
        let digest = program.reference().digest;
        if self.by_digest.insert(digest, program.clone()).is_none() {
            self.by_name
                .entry(program.reference().name.clone())
                .or_default()
                .push(digest);
            for child in program.children() {
                self.add(child);
            }
        }
    }

    /// The program with this exact digest.
    pub fn get(&self, digest: &Digest) -> Option<&Program> {
        self.by_digest.get(digest)
    }

    /// The program of this name registered last.
    pub fn newest(&self, name: &Name) -> Option<&Program> {
        self.by_name
            .get(name)
            .and_then(|digests| digests.last())
            .and_then(|digest| self.by_digest.get(digest))
    }

    /// The registered versions of a name, oldest first.
    pub fn versions(&self, name: &Name) -> Vec<Program> {
        self.by_name
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|digest| self.by_digest.get(digest))
            .cloned()
            .collect()
    }

    /// Every registered program, by name, each name's versions oldest first.
    pub fn all(&self) -> Vec<Program> {
        self.by_name
            .values()
            .flatten()
            .filter_map(|digest| self.by_digest.get(digest))
            .cloned()
            .collect()
    }
}
