//! Reads: a tree (its row, latest snapshot and records), every kept record
//! of a tree, and the listing. Each runs in one transaction, so it sees one
//! committed state; the writer's group transaction reads the same way.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use baton_run::TreeId;
use baton_run::log::{Record, Snapshot};
use baton_run::store::{ListCursor, ListFilter, Listing, StoreError, TreeLoad, UnreadableRow};
use deadpool_postgres::GenericClient;

use crate::chunk::{self, DIGEST_LEN};
use crate::error::storage;
use crate::rows::{column, corrupt, digest, query, query_opt, read_meta, stored_kind, uint};

type Piece = [u8; DIGEST_LEN];

/// A body as stored: inline bytes, or a manifest of piece digests.
struct Stored {
    body: Option<Vec<u8>>,
    chunks: Option<Vec<u8>>,
}

impl Stored {
    /// The pieces this body needs.
    fn pieces(&self, into: &mut BTreeSet<Piece>) -> Result<(), StoreError> {
        if let (None, Some(manifest)) = (&self.body, &self.chunks) {
            // A malformed manifest is reported when the body is assembled.
            into.extend(chunk::read_manifest(manifest).unwrap_or_default());
        }
        Ok(())
    }

    /// The stored bytes, reassembled from `pieces` when chunked.
    fn assemble(
        self,
        pieces: &BTreeMap<Piece, Vec<u8>>,
        what: &dyn Fn() -> String,
    ) -> Result<Vec<u8>, StoreError> {
        match (self.body, self.chunks) {
            (Some(body), None) => Ok(body),
            (None, Some(manifest)) => {
                let digests = chunk::read_manifest(&manifest)
                    .ok_or_else(|| corrupt(format!("{}: malformed chunk manifest", what())))?;
                let mut bytes = Vec::with_capacity(digests.len() * 2560);
                for piece in digests {
                    let found = pieces.get(&piece).ok_or_else(|| {
                        corrupt(format!(
                            "{}: missing chunk {}",
                            what(),
                            baton_run::Digest::from_bytes(piece)
                        ))
                    })?;
                    bytes.extend_from_slice(found);
                }
                Ok(bytes)
            }
            _ => Err(corrupt(format!(
                "{}: neither an inline body nor a chunk manifest",
                what()
            ))),
        }
    }
}

/// A record row before its body is assembled.
struct RecordRow {
    seq: i64,
    prev: Vec<u8>,
    hash: Vec<u8>,
    kind: String,
    stored: Stored,
}

/// A snapshot row before its state is assembled.
struct SnapshotRow {
    seq: i64,
    head: Vec<u8>,
    digest: Vec<u8>,
    stored: Stored,
}

/// Fetches the pieces of tree `key` that these manifests name.
async fn pieces(
    client: &impl GenericClient,
    key: i64,
    needed: BTreeSet<Piece>,
) -> Result<BTreeMap<Piece, Vec<u8>>, StoreError> {
    if needed.is_empty() {
        return Ok(BTreeMap::new());
    }
    let digests: Vec<&[u8]> = needed.iter().map(|piece| &piece[..]).collect();
    let rows = query(
        client,
        "SELECT digest, bytes FROM baton_chunks WHERE tree = $1 AND digest = ANY($2)",
        &[&key, &digests],
    )
    .await
    .map_err(storage)?;
    let mut found = BTreeMap::new();
    for row in rows {
        let stored: Vec<u8> = column(&row, 0)?;
        if let Ok(piece) = Piece::try_from(&stored[..]) {
            found.insert(piece, column(&row, 1)?);
        }
    }
    Ok(found)
}

fn record_rows(rows: Vec<tokio_postgres::Row>) -> Result<Vec<RecordRow>, StoreError> {
    rows.iter()
        .map(|row| {
            Ok(RecordRow {
                seq: column(row, 0)?,
                prev: column(row, 1)?,
                hash: column(row, 2)?,
                kind: column(row, 3)?,
                stored: Stored {
                    body: column(row, 4)?,
                    chunks: column(row, 5)?,
                },
            })
        })
        .collect()
}

fn assemble_records(
    tree: TreeId,
    rows: Vec<RecordRow>,
    pieces: &BTreeMap<Piece, Vec<u8>>,
) -> Result<Vec<Record>, StoreError> {
    rows.into_iter()
        .map(|row| {
            let seq = row.seq;
            let what = || format!("record {seq} of tree {tree}");
            let body = row.stored.assemble(pieces, &what)?;
            // The stored hash is returned as stored: `verify` recomputes it
            // from the body, so any edit shows at exactly this record.
            Ok(Record::stored(
                uint(seq)?,
                digest(&row.prev)?,
                digest(&row.hash)?,
                stored_kind(&row.kind)?,
                Arc::from(body),
            ))
        })
        .collect()
}

const RECORDS_ALL: &str = "SELECT seq, prev, hash, kind, body, chunks FROM baton_records
     WHERE tree = $1 ORDER BY seq";

const RECORDS_AFTER_SNAPSHOT: &str = "SELECT seq, prev, hash, kind, body, chunks FROM baton_records
     WHERE tree = $1 AND seq > COALESCE((SELECT seq FROM baton_snapshots WHERE tree = $1), 0)
     ORDER BY seq";

/// Reads a tree: metadata, the head its row records, its latest snapshot
/// and the records after it (or, with `whole`, every record kept). Run it
/// inside a transaction that sees one state (repeatable read, or the
/// writer's transaction holding the tree's row lock).
pub(crate) async fn load(
    client: &impl GenericClient,
    tree: TreeId,
    whole: bool,
) -> Result<TreeLoad, StoreError> {
    let id = tree.to_string();
    let row = query_opt(client, LOAD_TREE, &[&id])
        .await
        .map_err(storage)?;
    let Some(row) = row else {
        return Ok(TreeLoad::default());
    };
    let key: i64 = column(&row, 0)?;
    let meta = read_meta(&row, 3)?.decode(tree)?;
    let recorded_head = match &meta {
        Some(_) => Some((
            uint(column(&row, 1)?)?,
            digest(&column::<Vec<u8>>(&row, 2)?)?,
        )),
        None => None,
    };
    // The snapshot and the records after it, asked for together (the
    // client pipelines both queries on the connection).
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&key];
    let snapshot_query = query_opt(
        client,
        "SELECT seq, head, digest, body, chunks FROM baton_snapshots WHERE tree = $1",
        &params,
    );
    let records_query = query(
        client,
        if whole {
            RECORDS_ALL
        } else {
            RECORDS_AFTER_SNAPSHOT
        },
        &params,
    );
    let (snapshot, records) = match tokio::join!(snapshot_query, records_query) {
        (Ok(snapshot), Ok(records)) => (snapshot, records),
        // In one transaction, once one of the pipelined queries fails the
        // other fails only because the transaction is aborted: report the
        // failure that caused it, whichever query answered first.
        (Err(first), Err(second)) => return Err(storage(cause_of(first, second))),
        (Err(error), Ok(_)) | (Ok(_), Err(error)) => return Err(storage(error)),
    };
    let snapshot = snapshot
        .map(|row| {
            Ok::<_, StoreError>(SnapshotRow {
                seq: column(&row, 0)?,
                head: column(&row, 1)?,
                digest: column(&row, 2)?,
                stored: Stored {
                    body: column(&row, 3)?,
                    chunks: column(&row, 4)?,
                },
            })
        })
        .transpose()?;
    let records = record_rows(records)?;
    let mut needed = BTreeSet::new();
    if let Some(snapshot) = &snapshot {
        snapshot.stored.pieces(&mut needed)?;
    }
    for record in &records {
        record.stored.pieces(&mut needed)?;
    }
    let pieces = pieces(client, key, needed).await?;
    let snapshot = match snapshot {
        Some(row) => {
            let seq = row.seq;
            let what = || format!("snapshot of tree {tree} at {seq}");
            let state = row.stored.assemble(&pieces, &what)?;
            if chunk::state_digest(&state)[..] != row.digest[..] {
                return Err(corrupt(format!(
                    "{}: state does not match its digest",
                    what()
                )));
            }
            Some(Snapshot {
                seq: uint(seq)?,
                head: digest(&row.head)?,
                state: state.into(),
            })
        }
        None => None,
    };
    let records = assemble_records(tree, records, &pieces)?;
    Ok(TreeLoad {
        meta,
        snapshot,
        records,
        recorded_head,
    })
}

/// Every stored record of a tree (those after the snapshot when compacted).
pub(crate) async fn records(
    client: &impl GenericClient,
    tree: TreeId,
) -> Result<Vec<Record>, StoreError> {
    let id = tree.to_string();
    let row = query_opt(client, "SELECT key FROM baton_trees WHERE id = $1", &[&id])
        .await
        .map_err(storage)?;
    let Some(row) = row else {
        return Ok(Vec::new());
    };
    let key: i64 = column(&row, 0)?;
    let rows = query(client, RECORDS_ALL, &[&key]).await.map_err(storage)?;
    let rows = record_rows(rows)?;
    let mut needed = BTreeSet::new();
    for record in &rows {
        record.stored.pieces(&mut needed)?;
    }
    let pieces = pieces(client, key, needed).await?;
    assemble_records(tree, rows, &pieces)
}

/// Of two errors of pipelined statements in one transaction, the one that
/// aborted it (the other is then "current transaction is aborted").
fn cause_of(first: tokio_postgres::Error, second: tokio_postgres::Error) -> tokio_postgres::Error {
    if first.code() == Some(&tokio_postgres::error::SqlState::IN_FAILED_SQL_TRANSACTION) {
        second
    } else {
        first
    }
}

/// A tree row: its key, recorded head and listing columns.
const LOAD_TREE: &str = "SELECT key, head_seq, head_hash, scope, status, updated, program_name,
        program_digest, created, labels::text
     FROM baton_trees WHERE id = $1";

/// Lists trees with committed records that pass the filter, sorted by tree
/// id (compared byte by byte, whatever the database's collation), one page
/// at a time; a row that does not read back is reported on its own.
pub(crate) async fn list(
    client: &impl GenericClient,
    filter: &ListFilter,
) -> Result<Listing, StoreError> {
    let status = filter.status.map(|status| status.as_str().to_owned());
    let scope = filter.scope.as_ref().map(|scope| scope.as_str().to_owned());
    let labels = (!filter.labels.is_empty()).then(|| filter.labels.to_json());
    let after = filter.after.as_ref().map(|after| after.row().to_owned());
    // One row more than the page tells whether another page follows.
    let limit = filter.limit.map(|limit| i64::from(limit.get()) + 1);
    // `status` and `updated` are not tested for NULL: a row missing them
    // after its first append is damaged and reported, not hidden.
    let mut rows = query(
        client,
        "SELECT id, scope, status, updated, program_name, program_digest, created, labels::text
             FROM baton_trees
             WHERE (scope IS NOT NULL OR status IS NOT NULL OR updated IS NOT NULL)
               AND ($1::text IS NULL OR status = $1)
               AND ($2::text IS NULL OR scope = $2)
               AND ($3::text IS NULL OR labels @> $3::jsonb)
               AND ($4::text IS NULL OR id COLLATE \"C\" > $4)
             ORDER BY id COLLATE \"C\"
             LIMIT $5",
        &[&status, &scope, &labels, &after, &limit],
    )
    .await
    .map_err(storage)?;
    let mut listing = Listing::default();
    if let Some(limit) = filter.limit
        && rows.len() > limit.get() as usize
    {
        rows.truncate(limit.get() as usize);
        let last = rows.last().map(|row| column::<String>(row, 0));
        listing.next = match last {
            Some(Ok(id)) => Some(ListCursor::after_row(id)),
            Some(Err(error)) => return Err(error),
            None => None,
        };
    }
    for row in rows {
        let id: String = match column(&row, 0) {
            Ok(id) => id,
            Err(error) => {
                listing.unreadable.push(UnreadableRow {
                    tree: None,
                    id: "?".to_owned(),
                    error,
                });
                continue;
            }
        };
        let tree: Result<TreeId, _> = id.parse();
        let meta = match &tree {
            Ok(tree) => read_meta(&row, 1).and_then(|columns| columns.decode(*tree)),
            Err(error) => Err(corrupt(format!("tree id {id:?}: {error}"))),
        };
        let meta = meta.and_then(|meta| {
            meta.ok_or_else(|| {
                corrupt(format!("tree {id}: its listing columns are partly missing"))
            })
        });
        match meta {
            Ok(meta) => listing.trees.push(meta),
            Err(error) => listing.unreadable.push(UnreadableRow {
                tree: tree.ok(),
                id,
                error,
            }),
        }
    }
    // The ids were ordered byte by byte already; sort by the ids themselves
    // so the contract does not hang on the text form.
    listing.trees.sort_by_key(|meta| meta.tree);
    Ok(listing)
}
