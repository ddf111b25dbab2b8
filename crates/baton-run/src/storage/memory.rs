//! `MemoryStore`: the reference implementation of the store contract, in
//! process memory.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use crate::clock::Timestamp;
use crate::digest::Digest;
use crate::ids::TreeId;
use crate::log::{Record, Snapshot};
use crate::protocol::BoxFuture;

use crate::payload::Payload;

use super::{
    AcquireRequest, Acquired, Append, AppendOutcome, Change, ChangeHub, Changes, CreateTree,
    Created, Lease, ListFilter, Listing, Message, MessageId, PostOutcome, Posted, Settle,
    SettleOutcome, Store, StoreError, TreeLoad, TreeMeta,
};

struct Entry {
    lease: Option<Lease>,
    last_token: u64,
    meta: Option<TreeMeta>,
    snapshot: Option<Snapshot>,
    records: Vec<Record>,
    /// The head of the last append, kept apart from the records.
    head: (u64, Digest),
    /// The tree's inbox in the order posted, each message with its outcome
    /// once settled.
    inbox: Vec<(Message, Option<Payload>)>,
}

impl Default for Entry {
    fn default() -> Entry {
        Entry {
            lease: None,
            last_token: 0,
            meta: None,
            snapshot: None,
            records: Vec::new(),
            head: (0, Digest::ZERO),
            inbox: Vec::new(),
        }
    }
}

impl Entry {
    fn head(&self) -> (u64, Digest) {
        self.head
    }

    /// Grants the lease to `owner` for `ttl` from `now`, with the next
    /// token.
    fn grant(&mut self, owner: String, now: Timestamp, ttl: std::time::Duration) -> Lease {
        self.last_token += 1;
        let lease = Lease {
            token: self.last_token,
            owner,
            until: now.plus(ttl),
        };
        self.lease = Some(lease.clone());
        lease
    }

    fn token_is_current(&self, token: u64) -> bool {
        self.lease
            .as_ref()
            .is_some_and(|lease| lease.token == token)
    }

    /// The latest snapshot and the records after it (a store that keeps its
    /// history still loads only what folds onto the snapshot).
    fn load(&self) -> TreeLoad {
        let after = self.snapshot.as_ref().map_or(0, |snapshot| snapshot.seq);
        TreeLoad {
            meta: self.meta.clone(),
            snapshot: self.snapshot.clone(),
            records: self
                .records
                .iter()
                .filter(|record| record.seq > after)
                .cloned()
                .collect(),
            recorded_head: self.meta.as_ref().map(|_| self.head),
        }
    }

    /// Every kept record, with the latest snapshot.
    fn history(&self) -> TreeLoad {
        TreeLoad {
            meta: self.meta.clone(),
            snapshot: self.snapshot.clone(),
            records: self.records.clone(),
            recorded_head: self.meta.as_ref().map(|_| self.head),
        }
    }

    /// Appends and, when asked and the records are (or already were)
    /// committed, gives up the lease.
    fn append(&mut self, append: Append) -> AppendOutcome {
        let release = append.release;
        let outcome = self.append_records(append);
        if release && matches!(outcome, AppendOutcome::Committed | AppendOutcome::Duplicate) {
            self.lease = None;
        }
        outcome
    }

    fn post(&mut self, message: Message) -> PostOutcome {
        match self
            .inbox
            .iter()
            .find(|(posted, _)| posted.id == message.id)
        {
            Some((posted, _)) if posted.body == message.body => PostOutcome::Duplicate,
            Some(_) => PostOutcome::Conflict,
            None => {
                self.inbox.push((message, None));
                PostOutcome::Posted
            }
        }
    }

    fn settle(&mut self, settle: Settle) -> SettleOutcome {
        // The newest grant settles, also after its last append gave the
        // lease up; a takeover grants a newer token and fences the old one.
        let current = settle.token == self.last_token;
        let Some((_, outcome)) = self
            .inbox
            .iter_mut()
            .find(|(message, _)| message.id == settle.id)
        else {
            return SettleOutcome::Unknown;
        };
        if !current {
            return SettleOutcome::Fenced;
        }
        if outcome.is_some() {
            return SettleOutcome::AlreadySettled;
        }
        *outcome = Some(settle.outcome);
        SettleOutcome::Settled
    }

    fn append_records(&mut self, append: Append) -> AppendOutcome {
        if !self.token_is_current(append.token) {
            return AppendOutcome::Fenced;
        }
        let Some(first) = append.records.first() else {
            self.meta = Some(append.meta);
            return AppendOutcome::Committed;
        };
        let (head, head_hash) = self.head();
        let Some(expected) = first.seq.checked_sub(1) else {
            return AppendOutcome::Conflict { head };
        };
        if expected < head {
            let offset = self.records.first().map_or(u64::MAX, |r| r.seq);
            let identical = expected + 1 >= offset
                && append.records.iter().all(|record| {
                    let index = (record.seq - offset) as usize;
                    self.records
                        .get(index)
                        .is_some_and(|stored| stored.hash == record.hash)
                });
            return if identical {
                AppendOutcome::Duplicate
            } else {
                AppendOutcome::Conflict { head }
            };
        }
        if expected > head || first.prev != head_hash {
            return AppendOutcome::Conflict { head };
        }
        if let Some(last) = append.records.last() {
            self.head = (last.seq, last.hash);
        }
        self.records
            .extend(append.records.into_iter().map(Record::unsealed));
        self.meta = Some(append.meta);
        AppendOutcome::Committed
    }
}

/// A store in process memory: the reference implementation of the store
/// contract, for tests, benchmarks and single-process use without
/// durability. Cloning shares the same data.
#[derive(Clone, Default)]
pub struct MemoryStore {
    trees: Arc<Mutex<BTreeMap<TreeId, Entry>>>,
    keep_history: bool,
    changes: ChangeHub,
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore").finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// An empty store that compacts records covered by a snapshot.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// An empty store that keeps every record even after snapshots.
    pub fn keeping_history() -> MemoryStore {
        MemoryStore {
            keep_history: true,
            ..MemoryStore::default()
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<TreeId, Entry>) -> T) -> Result<T, StoreError> {
        let mut trees = self
            .trees
            .lock()
            .map_err(|_| StoreError::unavailable("memory store lock poisoned"))?;
        Ok(f(&mut trees))
    }

    /// Every stored record of `tree` (after compaction, those after the
    /// snapshot). For inspection and tests.
    pub fn records(&self, tree: TreeId) -> Vec<Record> {
        self.with(|trees| {
            trees
                .get(&tree)
                .map(|e| e.records.clone())
                .unwrap_or_default()
        })
        .unwrap_or_default()
    }

    /// Deletes one stored record, as a lost write or a careless hand would.
    /// For tests of tamper detection. Returns whether the record existed.
    pub fn drop_record(&self, tree: TreeId, seq: u64) -> bool {
        self.with(|trees| {
            let Some(entry) = trees.get_mut(&tree) else {
                return false;
            };
            let before = entry.records.len();
            entry.records.retain(|record| record.seq != seq);
            entry.records.len() != before
        })
        .unwrap_or(false)
    }

    /// Rewrites the listing metadata of a tree, as a careless hand would.
    /// For tests of tamper detection. Returns whether the tree exists.
    pub fn tamper_meta(&self, tree: TreeId, edit: impl FnOnce(&mut TreeMeta)) -> bool {
        self.with(|trees| {
            let Some(meta) = trees.get_mut(&tree).and_then(|e| e.meta.as_mut()) else {
                return false;
            };
            edit(meta);
            true
        })
        .unwrap_or(false)
    }

    /// Rewrites the stored bytes of one record without fixing its hash, as an
    /// attacker or a broken disk would. For tests of tamper detection.
    /// Returns whether the record exists.
    pub fn tamper(&self, tree: TreeId, seq: u64, edit: impl FnOnce(&mut Vec<u8>)) -> bool {
        self.with(|trees| {
            let Some(record) = trees
                .get_mut(&tree)
                .and_then(|e| e.records.iter_mut().find(|r| r.seq == seq))
            else {
                return false;
            };
            let mut bytes = record.body.to_vec();
            edit(&mut bytes);
            record.body = bytes.into();
            true
        })
        .unwrap_or(false)
    }
}

impl Store for MemoryStore {
    fn acquire(&self, request: AcquireRequest) -> BoxFuture<'_, Result<Acquired, StoreError>> {
        let result = self.with(|trees| {
            let entry = trees.entry(request.tree).or_default();
            if let Some(lease) = &entry.lease
                && lease.until > request.now
                && !request.force
            {
                return Acquired::LeaseHeld {
                    owner: lease.owner.clone(),
                    until: lease.until,
                };
            }
            let lease = entry.grant(request.owner.clone(), request.now, request.ttl);
            Acquired::Granted {
                lease,
                load: entry.load(),
            }
        });
        Box::pin(std::future::ready(result))
    }

    fn create_tree(&self, create: CreateTree) -> BoxFuture<'_, Result<Created, StoreError>> {
        let tree = create.tree;
        let result = create.check().and_then(|()| {
            self.with(|trees| {
                let entry = trees.entry(tree).or_default();
                if entry.meta.is_some() || entry.head.0 > 0 || entry.snapshot.is_some() {
                    return Created::Exists;
                }
                if let Some(lease) = &entry.lease
                    && lease.until > create.now
                {
                    return Created::LeaseHeld {
                        owner: lease.owner.clone(),
                        until: lease.until,
                    };
                }
                let lease = entry.grant(create.owner, create.now, create.ttl);
                if !create.hold {
                    entry.lease = None;
                }
                if let Some(last) = create.records.last() {
                    entry.head = (last.seq, last.hash);
                }
                entry.records = create.records.into_iter().map(Record::unsealed).collect();
                entry.meta = Some(create.meta);
                Created::Committed(lease)
            })
        });
        if matches!(result, Ok(Created::Committed(_))) {
            self.changes.notify(Change::Tree(tree));
        }
        Box::pin(std::future::ready(result))
    }

    fn load(&self, tree: TreeId) -> BoxFuture<'_, Result<TreeLoad, StoreError>> {
        let result = self.with(|trees| trees.get(&tree).map(Entry::load).unwrap_or_default());
        Box::pin(std::future::ready(result))
    }

    fn history(&self, tree: TreeId) -> BoxFuture<'_, Result<TreeLoad, StoreError>> {
        let result = self.with(|trees| trees.get(&tree).map(Entry::history).unwrap_or_default());
        Box::pin(std::future::ready(result))
    }

    fn append(&self, batch: Vec<Append>) -> BoxFuture<'_, Result<Vec<AppendOutcome>, StoreError>> {
        let mut touched = Vec::new();
        let result = self.with(|trees| {
            batch
                .into_iter()
                .map(|append| {
                    let tree = append.tree;
                    let outcome = match trees.get_mut(&tree) {
                        Some(entry) => entry.append(append),
                        None => AppendOutcome::Fenced,
                    };
                    if outcome == AppendOutcome::Committed {
                        touched.push(tree);
                    }
                    outcome
                })
                .collect()
        });
        for tree in touched {
            self.changes.notify(Change::Tree(tree));
        }
        Box::pin(std::future::ready(result))
    }

    fn write_snapshot(
        &self,
        tree: TreeId,
        token: u64,
        snapshot: Snapshot,
    ) -> BoxFuture<'_, Result<AppendOutcome, StoreError>> {
        let keep_history = self.keep_history;
        let result = self.with(|trees| {
            let Some(entry) = trees.get_mut(&tree).filter(|e| e.token_is_current(token)) else {
                return AppendOutcome::Fenced;
            };
            let (head, _) = entry.head();
            let covered = entry
                .records
                .iter()
                .find(|r| r.seq == snapshot.seq)
                .map(|r| r.hash);
            if snapshot.seq > head || covered.is_some_and(|hash| hash != snapshot.head) {
                return AppendOutcome::Conflict { head };
            }
            if !keep_history {
                entry.records.retain(|record| record.seq > snapshot.seq);
            }
            entry.snapshot = Some(snapshot);
            AppendOutcome::Committed
        });
        Box::pin(std::future::ready(result))
    }

    fn renew(
        &self,
        tree: TreeId,
        token: u64,
        until: Timestamp,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let result = self.with(
            |trees| match trees.get_mut(&tree).and_then(|e| e.lease.as_mut()) {
                Some(lease) if lease.token == token => {
                    lease.until = until;
                    true
                }
                _ => false,
            },
        );
        Box::pin(std::future::ready(result))
    }

    fn release(&self, tree: TreeId, token: u64) -> BoxFuture<'_, Result<(), StoreError>> {
        let result = self.with(|trees| {
            if let Some(entry) = trees.get_mut(&tree)
                && entry.token_is_current(token)
            {
                entry.lease = None;
                return true;
            }
            false
        });
        if result == Ok(true) {
            self.changes.notify(Change::Tree(tree));
        }
        Box::pin(std::future::ready(result.map(|_| ())))
    }

    fn list(&self, filter: ListFilter) -> BoxFuture<'_, Result<Listing, StoreError>> {
        let result = self.with(|trees| {
            let rows = trees
                .values()
                .filter_map(|entry| entry.meta.as_ref())
                .filter(|meta| filter.matches(meta))
                .map(|meta| Ok(meta.clone()))
                .collect();
            Listing::page(rows, &filter)
        });
        Box::pin(std::future::ready(result))
    }

    fn changes(&self) -> BoxFuture<'_, Result<Option<Changes>, StoreError>> {
        Box::pin(std::future::ready(Ok(Some(self.changes.subscribe()))))
    }

    fn post(&self, message: Message) -> BoxFuture<'_, Result<PostOutcome, StoreError>> {
        let tree = message.tree;
        let result = self.with(|trees| match trees.get_mut(&tree) {
            Some(entry) if entry.meta.is_some() => entry.post(message),
            _ => PostOutcome::UnknownTree,
        });
        if result == Ok(PostOutcome::Posted) {
            self.changes.notify(Change::Inbox(tree));
        }
        Box::pin(std::future::ready(result))
    }

    fn pending(&self, tree: Option<TreeId>) -> BoxFuture<'_, Result<Vec<Message>, StoreError>> {
        let result = self.with(|trees| {
            trees
                .iter()
                .filter(|(id, _)| tree.is_none_or(|tree| tree == **id))
                .flat_map(|(_, entry)| entry.inbox.iter())
                .filter(|(_, outcome)| outcome.is_none())
                .map(|(message, _)| message.clone())
                .collect()
        });
        Box::pin(std::future::ready(result))
    }

    fn settle(&self, settle: Settle) -> BoxFuture<'_, Result<SettleOutcome, StoreError>> {
        let tree = settle.tree;
        let result = self.with(|trees| match trees.get_mut(&tree) {
            Some(entry) => entry.settle(settle),
            None => SettleOutcome::Unknown,
        });
        if result == Ok(SettleOutcome::Settled) {
            self.changes.notify(Change::Inbox(tree));
        }
        Box::pin(std::future::ready(result))
    }

    fn message(
        &self,
        tree: TreeId,
        id: MessageId,
    ) -> BoxFuture<'_, Result<Option<Posted>, StoreError>> {
        let result = self.with(|trees| {
            let entry = trees.get(&tree)?;
            let (message, outcome) = entry.inbox.iter().find(|(message, _)| message.id == id)?;
            Some(Posted {
                message: message.clone(),
                outcome: outcome.clone(),
            })
        });
        Box::pin(std::future::ready(result))
    }
}
