//! Folding a stored tree: the records a store returns, checked against
//! the hash chain and applied to the latest snapshot by the same
//! [`TreeState::apply`] the engine stages with; and verifying everything a
//! store keeps of a tree, the store's own record of it included.

use crate::digest::Digest;
use crate::ids::TreeId;
use crate::storage::TreeLoad;

use super::super::error::TreeError;
use super::TreeState;

/// Folds a stored tree: verifies the chain from the snapshot head, decodes
/// the snapshot and applies the records after it, then checks the store's
/// record of the tree against the log (see [`check_row`]).
pub(in crate::engine) fn fold(
    tree: TreeId,
    load: &TreeLoad,
) -> Result<(TreeState, u64, Digest), TreeError> {
    let (start_seq, start_head, state) = match &load.snapshot {
        Some(snapshot) => (
            snapshot.seq,
            snapshot.head,
            Some(decode_snapshot(tree, snapshot)?),
        ),
        None => (0, Digest::ZERO, None),
    };
    let folded = apply_records(
        tree,
        (start_seq, start_head, state),
        &load.records,
        |_, _| Ok(()),
    )?;
    check_row(tree, load, &folded)?;
    Ok(folded)
}

/// Folds everything a store keeps of a tree (its history), calling `each`
/// after each record is applied: from the first record when the whole log
/// is kept, else from the latest snapshot.
pub(in crate::engine) fn replay(
    tree: TreeId,
    history: &TreeLoad,
    each: impl FnMut(&crate::log::Record, &TreeState) -> Result<(), TreeError>,
) -> Result<(TreeState, u64, Digest), TreeError> {
    let whole = history
        .records
        .first()
        .is_some_and(|record| record.seq == 1);
    let start = match &history.snapshot {
        Some(snapshot) if !whole => (
            snapshot.seq,
            snapshot.head,
            Some(decode_snapshot(tree, snapshot)?),
        ),
        _ => (0, Digest::ZERO, None),
    };
    let records: Vec<_> = match &history.snapshot {
        Some(snapshot) if !whole => history
            .records
            .iter()
            .filter(|record| record.seq > snapshot.seq)
            .cloned()
            .collect(),
        _ => history.records.clone(),
    };
    apply_records(tree, start, &records, each)
}

/// What [`verify_history`] checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::engine) struct Checked {
    /// The first record checked.
    pub first: u64,
    /// The snapshot the check started from, when the records before it are
    /// no longer kept.
    pub from_snapshot: Option<u64>,
    /// The snapshot compared with the log it covers (its head with the
    /// chain, its state with a fold of the records before it).
    pub snapshot_matched: Option<u64>,
    /// Whether the store recorded a head to compare the log's with.
    pub head_recorded: bool,
}

/// Verifies every record a store keeps of a tree: from the first record
/// when it keeps the whole log (then the snapshot, if any, must match the
/// chain and the fold of the records it covers), else from its snapshot;
/// then the store's record of the tree against the log.
pub(in crate::engine) fn verify_history(
    tree: TreeId,
    history: &TreeLoad,
) -> Result<(TreeState, u64, Digest, Checked), TreeError> {
    let first = history.records.first().map(|record| record.seq);
    let (folded, checked) = match (first, &history.snapshot) {
        (Some(1), snapshot) => {
            let mut matched = None;
            let folded = apply_records(
                tree,
                (0, Digest::ZERO, None),
                &history.records,
                |record, state| {
                    let Some(snapshot) = snapshot.as_ref().filter(|s| s.seq == record.seq) else {
                        return Ok(());
                    };
                    if snapshot.head != record.hash {
                        return Err(corrupt(
                            tree,
                            Some(record.seq),
                            format!(
                                "the snapshot at record {} names head {}, but the record's hash is {}",
                                record.seq, snapshot.head, record.hash
                            ),
                        ));
                    }
                    let encoded = serde_json::to_vec(state).map_err(|error| {
                        corrupt(
                            tree,
                            Some(record.seq),
                            format!("state does not encode: {error}"),
                        )
                    })?;
                    if encoded[..] != snapshot.state[..] {
                        return Err(corrupt(
                            tree,
                            Some(record.seq),
                            format!(
                                "the snapshot at record {} does not match the log it covers",
                                record.seq
                            ),
                        ));
                    }
                    matched = Some(record.seq);
                    Ok(())
                },
            )?;
            if let Some(snapshot) = snapshot
                && matched.is_none()
            {
                return Err(corrupt(
                    tree,
                    Some(snapshot.seq),
                    format!(
                        "the snapshot at record {} lies past the log's last record {}",
                        snapshot.seq, folded.1
                    ),
                ));
            }
            let checked = Checked {
                first: 1,
                from_snapshot: None,
                snapshot_matched: matched,
                head_recorded: false,
            };
            (folded, checked)
        }
        (_, Some(snapshot)) => {
            if let Some(first) = first
                && first != snapshot.seq + 1
            {
                return Err(corrupt(
                    tree,
                    Some(snapshot.seq + 1),
                    format!(
                        "records {} to {} are missing after the snapshot at {}",
                        snapshot.seq + 1,
                        first - 1,
                        snapshot.seq
                    ),
                ));
            }
            let state = decode_snapshot(tree, snapshot)?;
            let folded = apply_records(
                tree,
                (snapshot.seq, snapshot.head, Some(state)),
                &history.records,
                |_, _| Ok(()),
            )?;
            let checked = Checked {
                first: snapshot.seq + 1,
                from_snapshot: Some(snapshot.seq),
                snapshot_matched: None,
                head_recorded: false,
            };
            (folded, checked)
        }
        (Some(first), None) => {
            return Err(corrupt(
                tree,
                Some(1),
                format!("records 1 to {} are missing", first - 1),
            ));
        }
        (None, None) => return Err(TreeError::NotFound { tree }),
    };
    check_row(tree, history, &folded)?;
    let checked = Checked {
        head_recorded: history.recorded_head.is_some(),
        ..checked
    };
    Ok((folded.0, folded.1, folded.2, checked))
}

fn corrupt(tree: TreeId, record: Option<u64>, message: String) -> TreeError {
    TreeError::Corrupt {
        tree,
        record,
        message,
    }
}

fn decode_snapshot(tree: TreeId, snapshot: &crate::log::Snapshot) -> Result<TreeState, TreeError> {
    serde_json::from_slice(&snapshot.state).map_err(|error| {
        corrupt(
            tree,
            Some(snapshot.seq),
            format!("snapshot at {} does not decode: {error}", snapshot.seq),
        )
    })
}

/// Applies `records` after `(seq, head, state)`, checking each against the
/// chain and decoding it once; `each` sees every record with the state it
/// leaves.
fn apply_records(
    tree: TreeId,
    (mut head_seq, mut head, mut state): (u64, Digest, Option<TreeState>),
    records: &[crate::log::Record],
    mut each: impl FnMut(&crate::log::Record, &TreeState) -> Result<(), TreeError>,
) -> Result<(TreeState, u64, Digest), TreeError> {
    for record in records {
        let at = Some(record.seq);
        let body = crate::log::check(head_seq, head, record)
            .map_err(|error| corrupt(tree, at, error.to_string()))?;
        (head_seq, head) = (record.seq, record.hash);
        let folded = match &mut state {
            None => state
                .insert(TreeState::started(&body).map_err(|e| corrupt(tree, at, e.to_string()))?),
            Some(state) => {
                state.apply(&body).map_err(|error| {
                    corrupt(tree, at, format!("record {}: {error}", record.seq))
                })?;
                state
            }
        };
        folded.history_bytes += record.body.len() as u64;
        each(record, folded)?;
    }
    let state = state.ok_or(TreeError::NotFound { tree })?;
    if state.root != tree {
        return Err(corrupt(
            tree,
            Some(1),
            format!("log names root {}", state.root),
        ));
    }
    Ok((state, head_seq, head))
}

/// Checks the store's record of a tree against its folded log: the head
/// the store recorded with its last append must be the log's (a log that
/// lost its last records is not a shorter log), and the listing's scope must
/// be the one the tree's first record names (a changed listing row moves no
/// tree into another scope).
fn check_row(
    tree: TreeId,
    load: &TreeLoad,
    (state, head_seq, head): &(TreeState, u64, Digest),
) -> Result<(), TreeError> {
    if let Some((recorded_seq, recorded_hash)) = load.recorded_head
        && (recorded_seq, recorded_hash) != (*head_seq, *head)
    {
        let message = if recorded_seq > *head_seq {
            format!(
                "the log ends at record {head_seq}, but the store recorded its head at record {recorded_seq}: records are missing"
            )
        } else {
            format!(
                "the store recorded the head at record {recorded_seq} ({recorded_hash}), but the log's head is record {head_seq} ({head})"
            )
        };
        return Err(corrupt(
            tree,
            Some(recorded_seq.min(*head_seq + 1)),
            message,
        ));
    }
    if let Some(meta) = &load.meta
        && meta.scope != state.start.scope
    {
        return Err(corrupt(
            tree,
            Some(1),
            format!(
                "the store lists the tree under scope {}, but its first record names scope {}",
                meta.scope, state.start.scope
            ),
        ));
    }
    Ok(())
}
