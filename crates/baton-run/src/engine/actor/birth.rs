//! A new root's first round: the steps it takes at once, run on the
//! caller's task, and the commit that creates the tree in the store.

use tracing::Instrument;

use crate::log::Record;
use crate::storage::{CreateTree, Created, StoreError, TreeMeta};

use super::super::error::RuntimeError;
use super::Actor;

/// How a new root's first round ended.
// Matched at once by the start that drove the round; boxing the actor would
// only add an allocation to every start that goes on.
#[allow(clippy::large_enum_variant)]
pub(in crate::engine) enum FirstRound {
    /// The tree ended in its first round, or stopped (its handles say why).
    Ended,
    /// The tree goes on: run the actor in a task of its own.
    Continues(Actor),
    /// The first commit of an unborn tree created nothing: the store holds
    /// the tree already ([`Created::Exists`]) or someone else's live lease
    /// on it ([`Created::LeaseHeld`]). Nothing was published.
    NotCreated(Created),
    /// The first commit of an unborn tree failed: nothing is reported
    /// committed and nothing was published.
    Failed(StoreError),
}

impl Actor {
    /// Makes this the owner of a new root whose start record is not durable
    /// yet: the first commit creates the tree with `start` in front.
    pub fn unborn(mut self, start: Record) -> Actor {
        self.unborn = Some(start);
        self
    }

    /// A new root's first round, on the caller's task: the steps it can
    /// take at once and their commit. Hands the actor back when the tree
    /// goes on (to run in a task of its own).
    pub async fn first_round(mut self, span: tracing::Span) -> FirstRound {
        span.in_scope(|| self.drive());
        // An unborn tree commits even with nothing staged: its start.
        if (!self.staged.is_empty() || self.unborn.is_some())
            && let Err(error) = self.commit().instrument(span.clone()).await
        {
            if let Some(refused) = self.refused.take() {
                return FirstRound::NotCreated(refused);
            }
            if self.unborn_failed {
                return FirstRound::Failed(match error {
                    RuntimeError::Storage { error, .. } => error,
                    other => StoreError::unavailable(other.to_string()),
                });
            }
            self.stop(error);
            return FirstRound::Ended;
        }
        if self.state.done() {
            self.finish().instrument(span).await;
            return FirstRound::Ended;
        }
        FirstRound::Continues(self)
    }

    /// The first commit of an unborn tree: its start record and `records`
    /// in one transaction that also grants the lease (kept unless
    /// `release`). A refusal is kept in `refused` for the first round.
    pub(super) async fn create(
        &mut self,
        start: Record,
        records: Vec<Record>,
        meta: TreeMeta,
        release: bool,
    ) -> Result<(), RuntimeError> {
        let mut all = Vec::with_capacity(records.len() + 1);
        all.push(start);
        all.extend(records);
        let now = meta.updated;
        let create = CreateTree {
            tree: self.tree,
            owner: self.engine.owner.clone(),
            now,
            ttl: self.engine.lease_ttl,
            records: all,
            meta,
            hold: !release,
        };
        let (tree, head_seq) = (self.tree, 0);
        match self.engine.store.create_tree(create).await {
            Ok(Created::Committed(lease)) => {
                self.owner.token = lease.token;
                if !release {
                    self.engine.hold(tree, lease.token);
                }
                self.lease_until = lease.until;
                self.renew_at = now.plus(self.engine.lease_ttl / 3);
                Ok(())
            }
            Ok(refused) => {
                self.refused = Some(refused);
                Err(RuntimeError::Fenced { tree, head_seq })
            }
            Err(error) => {
                self.unborn_failed = true;
                Err(RuntimeError::Storage {
                    tree,
                    head_seq,
                    error,
                })
            }
        }
    }
}
