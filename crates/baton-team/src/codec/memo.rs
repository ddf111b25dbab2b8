//! Restore by difference: the tasks of a few recently restored states.
//!
//! The kernel restores every candidate state, and consecutive states of a
//! team differ only in a few tasks and the turn: the settled tasks at the
//! front of the task list are byte for byte those of the state restored
//! before. Restore compares the new text with the texts kept here (a
//! memcmp, far cheaper than parsing), reuses what it read of the tasks
//! that lie wholly in the longest common prefix, and reads only the rest
//! (see `record::decode_after`).
//!
//! The memo is only a cache: the record restored, and whether a state is
//! accepted, never depend on what it holds. It is shared by every run of
//! one team (concurrent runs included), holds at most [`Memo::ENTRIES`]
//! states, and its lock is held only to copy or replace entries, never
//! while parsing or comparing.

use std::ops::Range;
use std::sync::Arc;

use baton_run::program::common_prefix;
use baton_run::{Payload, ProcessId};

use super::recent::Recent;

/// What restore read of one task: its payload, and spans of the state's
/// text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    /// The task's canonical JSON, made once and shared by every record
    /// restored with the task unchanged.
    pub payload: Payload,
    /// The task's JSON.
    pub span: Range<usize>,
    /// Its request's key.
    pub key: Range<usize>,
    /// Its request's worker.
    pub worker: Range<usize>,
    pub process: Option<ProcessId>,
    /// Whether a step may still change it (awaiting admission or running).
    pub live: bool,
}

/// A restored (accepted) state and what restore read of its tasks.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Restored {
    pub source: Payload,
    /// Every task, in request order.
    pub tasks: Box<[Seen]>,
    /// Its tasks' keys and processes, sorted.
    pub index: Index,
}

impl Restored {
    /// `tasks` of `source`, an accepted state (whose keys and processes
    /// are therefore unique), indexed by sorting.
    pub fn new(source: &Payload, tasks: Vec<Seen>) -> Restored {
        let index = Index::sorted(source.as_str(), &tasks);
        Restored::with_index(source, tasks, index)
    }

    /// `tasks` of `source` with their index, made by [`Index::after`].
    pub fn with_index(source: &Payload, tasks: Vec<Seen>, index: Index) -> Restored {
        Restored {
            source: source.clone(),
            tasks: tasks.into_boxed_slice(),
            index,
        }
    }
}

/// The keys and processes of a restored state's tasks, each sorted: a
/// restore by difference checks only its new tasks' keys and processes
/// against the tasks it reuses (by a galloping search in the base's
/// index), instead of sorting every task's again, and merges the two into
/// the new state's index.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Index {
    /// Task positions, in the order of their keys' text.
    keys: Box<[u32]>,
    /// Each task's process with the task's position, by process.
    processes: Box<[(u128, u32)]>,
}

/// Two tasks of a state share a key or a process.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Repeated {
    Key(String),
    Process(ProcessId),
}

fn process_key(process: ProcessId) -> u128 {
    u128::from_be_bytes(*process.as_bytes())
}

fn position(index: usize) -> u32 {
    u32::try_from(index).expect("a team holds far fewer than 2^32 tasks")
}

impl Index {
    /// The index of `tasks` of the state `text`, sorted afresh. Repeated
    /// keys or processes are indexed side by side (a full restore's check
    /// rejects such a state before it is kept).
    fn sorted(text: &str, tasks: &[Seen]) -> Index {
        let mut keys: Vec<u32> = (0..tasks.len()).map(position).collect();
        keys.sort_unstable_by(|&a, &b| {
            text[tasks[a as usize].key.clone()].cmp(&text[tasks[b as usize].key.clone()])
        });
        let mut processes: Vec<(u128, u32)> = tasks
            .iter()
            .enumerate()
            .filter_map(|(at, task)| Some((process_key(task.process?), position(at))))
            .collect();
        processes.sort_unstable();
        Index {
            keys: keys.into_boxed_slice(),
            processes: processes.into_boxed_slice(),
        }
    }

    /// The index of `tasks` of the state `text`, whose first `reused`
    /// tasks are those of `base` (same bytes at the same offsets, so same
    /// key spans and processes), or [`Repeated`] when a key or process of
    /// the tasks after them is repeated, among them or in the reused ones.
    /// `base`'s tasks were accepted, so the reused ones are unique among
    /// themselves.
    pub fn after(
        text: &str,
        base: &Restored,
        reused: usize,
        tasks: &[Seen],
    ) -> Result<Index, Repeated> {
        let fresh = &tasks[reused..];
        let key = |at: u32| &text[tasks[at as usize].key.clone()];
        let mut new_keys: Vec<u32> = (reused..tasks.len()).map(position).collect();
        new_keys.sort_unstable_by(|&a, &b| key(a).cmp(key(b)));
        if let Some(pair) = new_keys
            .windows(2)
            .find(|pair| key(pair[0]) == key(pair[1]))
        {
            return Err(Repeated::Key(key(pair[0]).into()));
        }
        // The base's positions below `reused` name the same tasks here;
        // the others name tasks this state no longer has.
        let kept = |at: u32| (at as usize) < reused;
        let base_key = |at: u32| &base.source.as_str()[base.tasks[at as usize].key.clone()];
        let keys = merge(&base.index.keys, kept, new_keys, |at, from| {
            gallop(&base.index.keys, from, |&entry| {
                base_key(entry).cmp(key(at))
            })
        })
        .map_err(|at| Repeated::Key(key(at).into()))?;

        let mut new_processes: Vec<(u128, u32)> = fresh
            .iter()
            .enumerate()
            .filter_map(|(at, task)| Some((process_key(task.process?), position(reused + at))))
            .collect();
        new_processes.sort_unstable();
        let process = |at: u32| {
            tasks[at as usize]
                .process
                .expect("indexed tasks have a process")
        };
        if let Some(pair) = new_processes.windows(2).find(|pair| pair[0].0 == pair[1].0) {
            return Err(Repeated::Process(process(pair[0].1)));
        }
        let processes = merge(
            &base.index.processes,
            |(_, at)| kept(at),
            new_processes,
            |(process, _), from| {
                gallop(&base.index.processes, from, |&(entry, _)| {
                    entry.cmp(&process)
                })
            },
        )
        .map_err(|(_, at)| Repeated::Process(process(at)))?;
        Ok(Index {
            keys: keys.into_boxed_slice(),
            processes: processes.into_boxed_slice(),
        })
    }
}

/// Merges `fresh` (sorted, without repeats) into the entries of `base`
/// (sorted) that `kept` keeps, placing each fresh item by `find`, a
/// search in `base` from the last place found on ([`gallop`]; `Ok` where
/// `base` holds an equal entry): a few comparisons per fresh item and a
/// copy of `base`, not a comparison per entry. The fresh item equal to a
/// kept entry, if any, is the error.
fn merge<T: Copy>(
    base: &[T],
    kept: impl Fn(T) -> bool,
    fresh: Vec<T>,
    find: impl Fn(T, usize) -> Result<usize, usize>,
) -> Result<Vec<T>, T> {
    let mut merged = Vec::with_capacity(base.len() + fresh.len());
    let mut from = 0;
    for item in fresh {
        let at = match find(item, from) {
            Ok(at) if kept(base[at]) => return Err(item),
            Ok(at) | Err(at) => at,
        };
        merged.extend(base[from..at].iter().copied().filter(|&entry| kept(entry)));
        merged.push(item);
        from = at;
    }
    merged.extend(base[from..].iter().copied().filter(|&entry| kept(entry)));
    Ok(merged)
}

/// Where the target that `order` compares entries with lies in
/// `sorted[from..]`, as `binary_search_by` answers, found by steps that
/// double from `from` and then a binary search within the last step: few
/// comparisons when the place is near `from`, as it is for the sorted
/// items [`merge`] places one after another.
fn gallop<T>(
    sorted: &[T],
    from: usize,
    order: impl Fn(&T) -> std::cmp::Ordering,
) -> Result<usize, usize> {
    let (mut low, mut high, mut step) = (from, from, 1);
    while high < sorted.len() && order(&sorted[high]) == std::cmp::Ordering::Less {
        low = high + 1;
        high += step;
        step *= 2;
    }
    // The target lies in `sorted[low..=high]`, or at the end.
    let end = sorted.len().min(high + 1);
    match sorted[low..end].binary_search_by(order) {
        Ok(at) => Ok(low + at),
        Err(at) => Err(low + at),
    }
}

/// The most recently restored states of one team, newest first.
#[derive(Debug, Default)]
pub(crate) struct Memo {
    recent: Recent<Restored>,
}

impl Memo {
    /// How many states are kept: enough for a few runs of the team at once.
    pub const ENTRIES: usize = 4;

    /// The kept state sharing the longest prefix with `text` (the newest
    /// on a tie), and the length of that prefix; none when no kept state
    /// shares a byte with it.
    pub fn nearest(&self, text: &str) -> Option<(Arc<Restored>, usize)> {
        let mut best: Option<(Arc<Restored>, usize)> = None;
        for entry in self.recent.entries() {
            let common = common_prefix(entry.source.as_bytes(), text.as_bytes());
            if common > best.as_ref().map_or(0, |(_, length)| *length) {
                best = Some((entry, common));
            }
        }
        best
    }

    /// Keeps `restored` as the newest entry, dropping the oldest beyond
    /// [`Memo::ENTRIES`]. A state without tasks has nothing to reuse and is
    /// not kept.
    pub fn insert(&self, restored: Restored) {
        if restored.tasks.is_empty() {
            return;
        }
        self.recent.keep(Arc::new(restored), Self::ENTRIES);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.recent.len()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{gallop, merge};

    proptest! {
        /// From any place at or before the target's, the search answers
        /// as a binary search of the whole list does.
        #[test]
        fn gallop_finds_what_a_binary_search_finds(
            mut sorted in prop::collection::vec(0u16..500, 0..80),
            target in 0u16..520,
            from_share in 0.0f64..=1.0,
        ) {
            sorted.sort_unstable();
            sorted.dedup();
            let expected = sorted.binary_search(&target);
            let place = match expected { Ok(at) | Err(at) => at };
            let from = (place as f64 * from_share) as usize;
            prop_assert_eq!(gallop(&sorted, from, |entry| entry.cmp(&target)), expected);
        }

        /// The merge is the sorted union of the kept entries and the fresh
        /// ones, or names a fresh item that a kept entry equals.
        #[test]
        fn merge_is_the_sorted_union_or_names_a_repeat(
            base in prop::collection::btree_set(0u16..300, 0..60),
            fresh in prop::collection::btree_set(0u16..300, 0..20),
            dropped in prop::collection::btree_set(0u16..300, 0..40),
        ) {
            let base: Vec<u16> = base.into_iter().collect();
            let kept = |entry: u16| !dropped.contains(&entry);
            let repeats: Vec<u16> = fresh.iter().copied().filter(|item| base.contains(item) && kept(*item)).collect();
            let merged = merge(&base, kept, fresh.iter().copied().collect(), |item, from| {
                gallop(&base, from, |entry| entry.cmp(&item))
            });
            match merged {
                Ok(merged) => {
                    prop_assert!(repeats.is_empty());
                    let mut union: Vec<u16> = base.iter().copied().filter(|&entry| kept(entry)).collect();
                    union.extend(fresh.iter().copied());
                    union.sort_unstable();
                    union.dedup();
                    prop_assert_eq!(merged, union);
                }
                Err(item) => prop_assert_eq!(Some(&item), repeats.first()),
            }
        }
    }
}
