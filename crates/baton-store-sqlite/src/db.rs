//! The store's operations as SQL over one connection. Writes run inside the
//! writer thread's group transaction; reads inside a reader transaction.

use std::collections::BTreeSet;
use std::sync::Arc;

use baton_run::log::{Record, Snapshot};
use baton_run::store::{
    AcquireRequest, Acquired, Append, AppendOutcome, CreateTree, Created, Lease, ListCursor,
    ListFilter, Listing, StoreError, TreeLoad, TreeMeta, TreeStatus, UnreadableRow,
};
use baton_run::store::{LastCut, Piece, split_after};
use baton_run::store::{StoredMeta, stored_digest as digest, stored_kind, stored_uint as uint};
use baton_run::{Digest, Timestamp, TreeId};
use rusqlite::{Connection, ErrorCode, OptionalExtension, params};

use crate::chunk;
use crate::cuts::Writing;
use crate::packed;

/// Maps a SQLite failure to a storage error, keeping it as the cause:
/// damaged files, and columns holding a value of another type than the
/// store wrote there (SQLite does not enforce column types, so a file
/// edited by hand can hold text where a blob belongs), are `Corrupt`; a
/// full disk, a read-only file, refused permissions or a schema SQLite
/// cannot use are `Refused` (retrying will not help); busy or locked
/// databases, I/O errors and everything else are `Unavailable`.
pub(crate) fn storage(error: rusqlite::Error) -> StoreError {
    let message = || format!("sqlite: {error}");
    let kind = match &error {
        rusqlite::Error::InvalidColumnType(_, name, found) => StoreError::corrupt(format!(
            "column {name} holds a value of type {found}, not what the store wrote"
        )),
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => StoreError::corrupt(message()),
        _ => match error.sqlite_error_code() {
            Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
                StoreError::corrupt(message())
            }
            Some(
                ErrorCode::DiskFull
                | ErrorCode::ReadOnly
                | ErrorCode::PermissionDenied
                | ErrorCode::CannotOpen
                | ErrorCode::AuthorizationForStatementDenied
                | ErrorCode::SchemaChanged
                | ErrorCode::TooBig,
            ) => StoreError::refused(message()),
            _ => StoreError::unavailable(message()),
        },
    };
    kind.caused_by(error)
}

pub(crate) fn corrupt(what: impl Into<String>) -> StoreError {
    StoreError::corrupt(what)
}

/// SQLite integers are signed; values past `i64::MAX` (292 million years of
/// milliseconds, or that many tokens) are stored as `i64::MAX`.
pub(crate) fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A tree's row as the writer needs it.
pub(crate) struct TreeRow {
    pub(crate) key: i64,
    lease_token: Option<i64>,
    lease_owner: Option<String>,
    lease_until: Option<i64>,
    pub(crate) last_token: i64,
    pub(crate) head_seq: u64,
    head_hash: Digest,
}

pub(crate) fn tree_row(conn: &Connection, tree: TreeId) -> Result<Option<TreeRow>, StoreError> {
    let mut statement = conn
        .prepare_cached(
            "SELECT key, lease_token, lease_owner, lease_until, last_token, head_seq, head_hash
             FROM trees WHERE id = ?1",
        )
        .map_err(storage)?;
    let row = statement
        .query_row([tree.to_string()], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, Option<i64>>(1)?,
                row.get::<_, Option<String>>(2)?,
                row.get::<_, Option<i64>>(3)?,
                row.get::<_, i64>(4)?,
                row.get::<_, i64>(5)?,
                row.get::<_, Vec<u8>>(6)?,
            ))
        })
        .optional()
        .map_err(storage)?;
    let Some((key, lease_token, lease_owner, lease_until, last_token, head_seq, head_hash)) = row
    else {
        return Ok(None);
    };
    Ok(Some(TreeRow {
        key,
        lease_token,
        lease_owner,
        lease_until,
        last_token,
        head_seq: uint(head_seq)?,
        head_hash: digest(&head_hash)?,
    }))
}

/// `program_name`, `program_digest`, `created` and `labels`, as bound.
type Listed<'a> = (
    Option<&'a str>,
    Option<Vec<u8>>,
    Option<i64>,
    Option<String>,
);

/// The listing columns a tree's metadata fills besides its scope, status
/// and time: program name and digest, start time and labels (`NULL` when
/// absent, labels also when empty).
fn listed(meta: &TreeMeta) -> Listed<'_> {
    (
        meta.program.as_ref().map(|program| program.name.as_str()),
        meta.program
            .as_ref()
            .map(|program| program.digest.as_bytes().to_vec()),
        meta.created.map(|created| int(created.0)),
        (!meta.labels.is_empty()).then(|| meta.labels.to_json()),
    )
}

/// How a body is stored: inline bytes, or a manifest of chunk ids with the
/// cut that made it (for the writer to remember).
struct Stored {
    body: Option<Vec<u8>>,
    chunks: Option<Vec<u8>>,
    cut: Option<LastCut<i64>>,
}

/// Stores `bytes` inline or as chunks of tree `key`.
///
/// A long body is cut the kernel's way; the pieces the tree's last cuts
/// (remembered by this writer) already stored are taken as they are, the
/// others are looked up by digest and stored if new; the caller remembers
/// the new cut. Adds to
/// `written.bytes` the payload bytes this stores: the inline body, or the
/// manifest plus each piece that was not already stored for the tree (see
/// `SqliteStore::bytes_written`).
fn encode(
    conn: &Connection,
    key: i64,
    bytes: &Arc<[u8]>,
    written: &mut Writing<'_>,
) -> Result<Stored, StoreError> {
    if bytes.len() <= chunk::INLINE_MAX {
        written.bytes += bytes.len() as u64;
        return Ok(Stored {
            body: Some(bytes.to_vec()),
            chunks: None,
            cut: None,
        });
    }
    let mut find = conn
        .prepare_cached("SELECT id FROM chunks WHERE tree = ?1 AND digest = ?2")
        .map_err(storage)?;
    // A fresh piece is usually new (most of a new tree's first body, the
    // changed part of a later one): one statement stores it, and only a
    // piece the tree already holds is looked up after.
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO chunks (tree, digest, bytes) VALUES (?1, ?2, ?3) \
             ON CONFLICT (tree, digest) DO NOTHING",
        )
        .map_err(storage)?;
    // Inside the group's transaction: no other connection commits until ours.
    written.cuts.check(conn);
    let recent: Vec<&LastCut<i64>> = written.cuts.get(key).iter().collect();
    let pieces = split_after(bytes, &recent);
    let mut manifest = Vec::with_capacity(pieces.len() * 3);
    let mut lens: Vec<(usize, i64)> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        let id = match piece {
            Piece::Known(_, id) => id,
            // An earlier piece of this body: stored (or found) above.
            Piece::Again(_, index) => lens[index].1,
            Piece::Fresh(piece) => {
                let digest = chunk::digest(piece);
                let inserted = insert
                    .execute(params![key, &digest[..], piece])
                    .map_err(storage)?;
                if inserted == 1 {
                    written.bytes += piece.len() as u64;
                    conn.last_insert_rowid()
                } else {
                    find.query_row(params![key, &digest[..]], |row| row.get(0))
                        .map_err(storage)?
                }
            }
        };
        chunk::put_varint(&mut manifest, uint(id)?);
        lens.push((piece.bytes().len(), id));
    }
    written.bytes += manifest.len() as u64;
    Ok(Stored {
        body: None,
        chunks: Some(manifest),
        cut: LastCut::new(Arc::clone(bytes), lens),
    })
}

/// Reassembles bytes stored by [`encode`].
fn decode(
    conn: &Connection,
    key: i64,
    body: Option<Vec<u8>>,
    chunks: Option<Vec<u8>>,
    what: &dyn Fn() -> String,
) -> Result<Vec<u8>, StoreError> {
    match (body, chunks) {
        (Some(body), None) => Ok(body),
        (None, Some(manifest)) => {
            let ids = chunk::read_varints(&manifest)
                .ok_or_else(|| corrupt(format!("{}: malformed chunk manifest", what())))?;
            let mut fetch = conn
                .prepare_cached("SELECT bytes FROM chunks WHERE id = ?1 AND tree = ?2")
                .map_err(storage)?;
            let mut bytes = Vec::with_capacity(ids.len() * 2560);
            for id in ids {
                let piece: Option<Vec<u8>> = fetch
                    .query_row(params![int(id), key], |row| row.get(0))
                    .optional()
                    .map_err(storage)?;
                let piece =
                    piece.ok_or_else(|| corrupt(format!("{}: missing chunk {id}", what())))?;
                bytes.extend_from_slice(&piece);
            }
            Ok(bytes)
        }
        _ => Err(corrupt(format!(
            "{}: neither an inline body nor a chunk manifest",
            what()
        ))),
    }
}

/// Chunk ids a manifest references.
fn manifest_ids(manifest: Option<Vec<u8>>, into: &mut BTreeSet<i64>) -> Result<(), StoreError> {
    if let Some(manifest) = manifest {
        let ids =
            chunk::read_varints(&manifest).ok_or_else(|| corrupt("malformed chunk manifest"))?;
        into.extend(ids.into_iter().map(int));
    }
    Ok(())
}

/// The listing columns, in [`StoredMeta`] order, for a `SELECT`.
const META_COLUMNS: &str = "scope, status, updated, program_name, program_digest, created, labels";

/// Reads the listing columns starting at column `at`.
fn read_meta(row: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<StoredMeta> {
    Ok(StoredMeta {
        scope: row.get(at)?,
        status: row.get(at + 1)?,
        updated: row.get(at + 2)?,
        program_name: row.get(at + 3)?,
        program_digest: row.get(at + 4)?,
        created: row.get(at + 5)?,
        labels: row.get(at + 6)?,
    })
}

/// Reads a tree: metadata, the head its row records, its latest snapshot
/// and the records after it (or, with `whole`, every record kept).
pub(crate) fn load(conn: &Connection, tree: TreeId, whole: bool) -> Result<TreeLoad, StoreError> {
    let row = conn
        .prepare_cached(&format!(
            "SELECT key, head_seq, head_hash, log, {META_COLUMNS} FROM trees WHERE id = ?1"
        ))
        .map_err(storage)?
        .query_row([tree.to_string()], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, Vec<u8>>(2)?,
                row.get::<_, Option<Vec<u8>>>(3)?,
                read_meta(row, 4)?,
            ))
        })
        .optional()
        .map_err(storage)?;
    let Some((key, head_seq, head_hash, log, columns)) = row else {
        return Ok(TreeLoad::default());
    };
    let meta = columns.decode(tree)?;
    let recorded_head = match &meta {
        Some(_) => Some((uint(head_seq)?, digest(&head_hash)?)),
        None => None,
    };
    let snapshot = read_snapshot(conn, tree, key)?;
    let after = match (&snapshot, whole) {
        (Some(snapshot), false) => snapshot.seq,
        _ => 0,
    };
    let records = read_records(conn, tree, TreeLog { key, log }, after)?;
    Ok(TreeLoad {
        meta,
        snapshot,
        records,
        recorded_head,
    })
}

fn read_snapshot(
    conn: &Connection,
    tree: TreeId,
    key: i64,
) -> Result<Option<Snapshot>, StoreError> {
    let row = conn
        .prepare_cached("SELECT seq, head, digest, body, chunks FROM snapshots WHERE tree = ?1")
        .map_err(storage)?
        .query_row([key], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, Vec<u8>>(1)?,
                row.get::<_, Vec<u8>>(2)?,
                row.get::<_, Option<Vec<u8>>>(3)?,
                row.get::<_, Option<Vec<u8>>>(4)?,
            ))
        })
        .optional()
        .map_err(storage)?;
    let Some((seq, head, expected, body, chunks)) = row else {
        return Ok(None);
    };
    let what = || format!("snapshot of tree {tree} at {seq}");
    let state = decode(conn, key, body, chunks, &what)?;
    if chunk::state_digest(&state)[..] != expected[..] {
        return Err(corrupt(format!(
            "{}: state does not match its digest",
            what()
        )));
    }
    Ok(Some(Snapshot {
        seq: uint(seq)?,
        head: digest(&head)?,
        state: state.into(),
    }))
}

/// Where a tree's records are: its row's key, and its packed first records
/// (see `packed.rs`), if any.
struct TreeLog {
    key: i64,
    log: Option<Vec<u8>>,
}

/// The packed first records of a tree, when its row has them.
fn unpack(tree: TreeId, log: Option<&[u8]>) -> Result<Vec<Record>, StoreError> {
    match log {
        Some(log) => packed::unpack(log, tree, &|| format!("the first records of tree {tree}")),
        None => Ok(Vec::new()),
    }
}

/// The records of a tree after sequence `after`: those packed in its row,
/// then the rows of `records`.
fn read_records(
    conn: &Connection,
    tree: TreeId,
    stored: TreeLog,
    after: u64,
) -> Result<Vec<Record>, StoreError> {
    let TreeLog { key, log } = stored;
    let mut records = unpack(tree, log.as_deref())?;
    records.retain(|record| record.seq > after);
    let mut statement = conn
        .prepare_cached(
            "SELECT seq, prev, hash, kind, body, chunks FROM records
             WHERE tree = ?1 AND seq > ?2 ORDER BY seq",
        )
        .map_err(storage)?;
    let rows = statement
        .query_map(params![key, int(after)], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, Vec<u8>>(1)?,
                row.get::<_, Vec<u8>>(2)?,
                row.get::<_, String>(3)?,
                row.get::<_, Option<Vec<u8>>>(4)?,
                row.get::<_, Option<Vec<u8>>>(5)?,
            ))
        })
        .map_err(storage)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(storage)?;
    records.reserve(rows.len());
    for (seq, prev, hash, kind, body, chunks) in rows {
        let what = || format!("record {seq} of tree {tree}");
        let body = decode(conn, key, body, chunks, &what)?;
        // The stored hash is returned as stored: `verify` recomputes it
        // from the body, so any edit shows at exactly this record.
        records.push(Record::stored(
            uint(seq)?,
            digest(&prev)?,
            digest(&hash)?,
            stored_kind(&kind)?,
            Arc::from(body),
        ));
    }
    Ok(records)
}

/// Every stored record of a tree (those after the snapshot when compacted).
pub(crate) fn history(conn: &Connection, tree: TreeId) -> Result<Vec<Record>, StoreError> {
    let stored = conn
        .prepare_cached("SELECT key, log FROM trees WHERE id = ?1")
        .map_err(storage)?
        .query_row([tree.to_string()], |row| {
            Ok(TreeLog {
                key: row.get(0)?,
                log: row.get(1)?,
            })
        })
        .optional()
        .map_err(storage)?;
    match stored {
        Some(stored) => read_records(conn, tree, stored, 0),
        None => Ok(Vec::new()),
    }
}

/// Lists trees with committed records that pass the filter, sorted by tree
/// id, one page at a time; a row that does not read back is reported on its
/// own.
pub(crate) fn list(conn: &Connection, filter: &ListFilter) -> Result<Listing, StoreError> {
    // The statement's shape follows the filter, so each shape can use its
    // index (unfinished trees by status, or trees by scope) and is prepared
    // once.
    let mut sql = format!("SELECT id, {META_COLUMNS} FROM trees WHERE scope IS NOT NULL");
    let mut bind: Vec<(String, Box<dyn rusqlite::ToSql>)> = Vec::new();
    if let Some(status) = filter.status {
        sql.push_str(" AND status = :status");
        bind.push((":status".into(), Box::new(status.as_str())));
        // Says so in the index's own terms, so the planner may use the
        // index of unfinished trees (`trees_open`).
        if status != TreeStatus::Done {
            sql.push_str(" AND status <> 'done'");
        }
    }
    if let Some(scope) = &filter.scope {
        sql.push_str(" AND scope = :scope");
        bind.push((":scope".into(), Box::new(scope.as_str().to_owned())));
    }
    // Label keys are `[a-z0-9._-]`, so a quoted JSON path names each one
    // exactly.
    for (n, (key, value)) in filter.labels.iter().enumerate() {
        sql.push_str(&format!(" AND json_extract(labels, :path{n}) = :value{n}"));
        bind.push((format!(":path{n}"), Box::new(format!("$.\"{key}\""))));
        bind.push((format!(":value{n}"), Box::new(value.to_owned())));
    }
    if let Some(after) = &filter.after {
        sql.push_str(" AND id > :after");
        bind.push((":after".into(), Box::new(after.row().to_owned())));
    }
    sql.push_str(" ORDER BY id");
    if let Some(limit) = filter.limit {
        // One row more than the page tells whether another page follows.
        sql.push_str(" LIMIT :limit");
        bind.push((":limit".into(), Box::new(i64::from(limit.get()) + 1)));
    }
    let mut statement = conn.prepare_cached(&sql).map_err(storage)?;
    let params: Vec<(&str, &dyn rusqlite::ToSql)> = bind
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_ref()))
        .collect();
    let mut rows = statement
        .query_map(params.as_slice(), |row| {
            Ok((row.get::<_, String>(0)?, read_meta(row, 1)?))
        })
        .map_err(storage)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(storage)?;
    let mut listing = Listing::default();
    if let Some(limit) = filter.limit
        && rows.len() > limit.get() as usize
    {
        rows.truncate(limit.get() as usize);
        listing.next = rows.last().map(|(id, _)| ListCursor::after_row(id.clone()));
    }
    for (id, columns) in rows {
        let tree: Result<TreeId, _> = id.parse();
        let meta = match &tree {
            Ok(tree) => columns.decode(*tree),
            Err(error) => Err(corrupt(format!("tree id {id:?}: {error}"))),
        };
        match meta {
            Ok(Some(meta)) => listing.trees.push(meta),
            Ok(None) => {}
            Err(error) => listing.unreadable.push(UnreadableRow {
                tree: tree.ok(),
                id,
                error,
            }),
        }
    }
    // Text order of `p_<hex>` ids is byte order; sort anyway so the
    // contract does not hang on that.
    listing.trees.sort_by_key(|meta| meta.tree);
    Ok(listing)
}

/// Grants the writer lease of a tree (creating its row) or reports the
/// live lease of someone else.
pub(crate) fn acquire(conn: &Connection, request: &AcquireRequest) -> Result<Acquired, StoreError> {
    let row = match tree_row(conn, request.tree)? {
        Some(row) => row,
        None => {
            conn.prepare_cached(
                "INSERT INTO trees (id, last_token, head_seq, head_hash) VALUES (?1, 0, 0, ?2)",
            )
            .map_err(storage)?
            .execute(params![
                request.tree.to_string(),
                &Digest::ZERO.as_bytes()[..]
            ])
            .map_err(storage)?;
            tree_row(conn, request.tree)?
                .ok_or_else(|| StoreError::unavailable("a tree row vanished"))?
        }
    };
    if let (Some(_), Some(owner), Some(until)) =
        (row.lease_token, &row.lease_owner, row.lease_until)
        && until > int(request.now.0)
        && !request.force
    {
        return Ok(Acquired::LeaseHeld {
            owner: owner.clone(),
            until: Timestamp(uint(until)?),
        });
    }
    let token = row.last_token + 1;
    let until = request.now.plus(request.ttl);
    conn.prepare_cached(
        "UPDATE trees SET last_token = ?1, lease_token = ?1, lease_owner = ?2, lease_until = ?3
         WHERE key = ?4",
    )
    .map_err(storage)?
    .execute(params![token, &request.owner, int(until.0), row.key])
    .map_err(storage)?;
    Ok(Acquired::Granted {
        lease: Lease {
            token: uint(token)?,
            owner: request.owner.clone(),
            until,
        },
        load: load(conn, request.tree, false)?,
    })
}

/// The stored hash of record `seq` of tree `tree` (row `key`), in
/// `records` or among the first records packed in its row.
fn stored_hash(
    conn: &Connection,
    tree: TreeId,
    key: i64,
    seq: u64,
) -> Result<Option<Digest>, StoreError> {
    let hash: Option<Vec<u8>> = conn
        .prepare_cached("SELECT hash FROM records WHERE tree = ?1 AND seq = ?2")
        .map_err(storage)?
        .query_row(params![key, int(seq)], |row| row.get(0))
        .optional()
        .map_err(storage)?;
    if let Some(hash) = hash {
        return digest(&hash).map(Some);
    }
    let packed = unpack(tree, packed_log(conn, key)?.as_deref())?;
    Ok(packed
        .into_iter()
        .find(|record| record.seq == seq)
        .map(|record| record.hash))
}

/// The first records packed in the row of tree `key`, if it has them.
fn packed_log(conn: &Connection, key: i64) -> Result<Option<Vec<u8>>, StoreError> {
    let log: Option<Option<Vec<u8>>> = conn
        .prepare_cached("SELECT log FROM trees WHERE key = ?1")
        .map_err(storage)?
        .query_row([key], |row| row.get(0))
        .optional()
        .map_err(storage)?;
    Ok(log.flatten())
}

/// Inserts `records` of tree `key`, their long bodies as pieces.
fn insert_records(
    conn: &Connection,
    key: i64,
    records: &[Record],
    written: &mut Writing<'_>,
) -> Result<(), StoreError> {
    for record in records {
        let Stored { body, chunks, cut } = encode(conn, key, &record.body, written)?;
        if let Some(cut) = cut {
            written.cuts.keep(key, cut);
        }
        insert_row(conn, key, record, body.as_deref(), chunks.as_deref())?;
    }
    Ok(())
}

/// Inserts `record` of tree `key` as a row of `records`, its body inline
/// or a manifest of pieces.
fn insert_row(
    conn: &Connection,
    key: i64,
    record: &Record,
    body: Option<&[u8]>,
    chunks: Option<&[u8]>,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO records (tree, seq, kind, prev, hash, body, chunks)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .map_err(storage)?
    .execute(params![
        key,
        int(record.seq),
        record.kind.as_str(),
        &record.prev.as_bytes()[..],
        &record.hash.as_bytes()[..],
        body,
        chunks
    ])
    .map_err(storage)?;
    Ok(())
}

/// A new tree's first commit as the writer takes it: checked, and with the
/// first records of a tree they end already packed for its row (see
/// `packed.rs`). The caller's thread builds it, so that packing (a hash
/// pass, the compact form and its compression) runs beside other callers
/// instead of on the writer thread, which every commit queues for.
pub(crate) struct NewTree {
    create: CreateTree,
    /// The packed first records, if the tree ends in this commit and they
    /// fit in `packed::limit` of the file's page size.
    log: Option<Vec<u8>>,
}

impl NewTree {
    /// Whether this first commit holds a whole short run: the tree ended
    /// in it (the lease given up) or waits after its first round (records
    /// beyond the start). A root that acts in its first round is created
    /// with its start alone and goes on writing.
    pub(crate) fn short_run(&self) -> bool {
        !self.create.hold || self.create.records.len() > 1
    }

    /// Checks `create` and packs the records of a tree it ends into at
    /// most `pack_max` bytes.
    pub(crate) fn new(create: CreateTree, pack_max: usize) -> Result<NewTree, StoreError> {
        create.check()?;
        // The short first records of a tree they end go into its row; a
        // tree that goes on keeps a slim row, which each of its later
        // commits writes again.
        let ends = !create.hold && create.meta.status == TreeStatus::Done;
        let log = if ends {
            packed::pack(&create.records, create.tree, pack_max)
        } else {
            None
        };
        Ok(NewTree { create, log })
    }

    pub(crate) fn tree(&self) -> TreeId {
        self.create.tree
    }
}

/// A new tree's first commit (see `Store::create_tree`): one row written
/// with its metadata, head and lease, then its records.
pub(crate) fn create_tree(
    conn: &Connection,
    new: &NewTree,
    written: &mut Writing<'_>,
) -> Result<Created, StoreError> {
    let NewTree { create, log } = new;
    let row = tree_row(conn, create.tree)?;
    if let Some(row) = &row {
        // A snapshot or a compaction never lowers the head.
        if row.head_seq > 0 {
            return Ok(Created::Exists);
        }
        if let (Some(_), Some(owner), Some(until)) =
            (row.lease_token, &row.lease_owner, row.lease_until)
            && until > int(create.now.0)
        {
            return Ok(Created::LeaseHeld {
                owner: owner.clone(),
                until: Timestamp(uint(until)?),
            });
        }
    }
    let token = row.as_ref().map_or(1, |row| row.last_token + 1);
    let until = create.now.plus(create.ttl);
    let (lease_token, lease_owner, lease_until) = if create.hold {
        (Some(token), Some(create.owner.as_str()), Some(int(until.0)))
    } else {
        (None, None, None)
    };
    let last = create.records.last().ok_or_else(|| corrupt("no record"))?;
    let meta = &create.meta;
    let (program_name, program_digest, created, labels) = listed(meta);
    let values = params![
        create.tree.to_string(),
        meta.scope.as_str(),
        meta.status.as_str(),
        int(meta.updated.0),
        lease_token,
        lease_owner,
        lease_until,
        token,
        int(last.seq),
        &last.hash.as_bytes()[..],
        program_name,
        program_digest,
        created,
        labels,
        log.as_deref(),
    ];
    let key = match &row {
        // A row without records: a lease that was given up or ran out.
        Some(row) => {
            conn.prepare_cached(
                "UPDATE trees SET scope = ?2, status = ?3, updated = ?4,
                     lease_token = ?5, lease_owner = ?6, lease_until = ?7, last_token = ?8,
                     head_seq = ?9, head_hash = ?10, program_name = ?11, program_digest = ?12,
                     created = ?13, labels = ?14, log = ?15
                 WHERE id = ?1",
            )
            .map_err(storage)?
            .execute(values)
            .map_err(storage)?;
            row.key
        }
        None => {
            conn.prepare_cached(
                "INSERT INTO trees (id, scope, status, updated, lease_token, lease_owner,
                     lease_until, last_token, head_seq, head_hash, program_name, program_digest,
                     created, labels, log)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
            )
            .map_err(storage)?
            .execute(values)
            .map_err(storage)?;
            conn.last_insert_rowid()
        }
    };
    if log.is_some() {
        // The same payload bytes as inline rows of `records` would count.
        written.bytes += create
            .records
            .iter()
            .map(|record| record.body.len() as u64)
            .sum::<u64>();
    } else {
        insert_records(conn, key, &create.records, written)?;
    }
    Ok(Created::Committed(Lease {
        token: uint(token)?,
        owner: create.owner.clone(),
        until,
    }))
}

/// One append: compare-and-swap on the expected head and the fencing token.
/// Adds the payload bytes it stores to `written`.
pub(crate) fn append(
    conn: &Connection,
    append: &Append,
    written: &mut Writing<'_>,
) -> Result<AppendOutcome, StoreError> {
    let Some(row) = tree_row(conn, append.tree)? else {
        return Ok(AppendOutcome::Fenced);
    };
    if row.lease_token != Some(int(append.token)) {
        return Ok(AppendOutcome::Fenced);
    }
    let head = row.head_seq;
    let (head_seq, head_hash) = match (append.records.first(), append.records.last()) {
        (Some(first), Some(last)) => {
            let Some(expected) = first.seq.checked_sub(1) else {
                return Ok(AppendOutcome::Conflict { head });
            };
            if expected < head {
                // An identical retry of an acknowledged append is a
                // duplicate; anything else at a committed sequence conflicts.
                for record in &append.records {
                    if stored_hash(conn, append.tree, row.key, record.seq)? != Some(record.hash) {
                        return Ok(AppendOutcome::Conflict { head });
                    }
                }
                return Ok(AppendOutcome::Duplicate);
            }
            if expected > head || first.prev != row.head_hash {
                return Ok(AppendOutcome::Conflict { head });
            }
            insert_records(conn, row.key, &append.records, written)?;
            (last.seq, last.hash)
        }
        _ => (row.head_seq, row.head_hash),
    };
    let meta = &append.meta;
    let (program_name, program_digest, created, labels) = listed(meta);
    conn.prepare_cached(
        "UPDATE trees SET scope = ?1, status = ?2, updated = ?3, head_seq = ?4, head_hash = ?5,
             program_name = ?6, program_digest = ?7, created = ?8, labels = ?9
         WHERE key = ?10",
    )
    .map_err(storage)?
    .execute(params![
        meta.scope.as_str(),
        meta.status.as_str(),
        int(meta.updated.0),
        int(head_seq),
        &head_hash.as_bytes()[..],
        program_name,
        program_digest,
        created,
        labels,
        row.key
    ])
    .map_err(storage)?;
    Ok(AppendOutcome::Committed)
}

/// Stores a snapshot and, when `compact`, deletes the records it covers and
/// the chunks nothing references any more. Adds the payload bytes it stores
/// to `written`.
pub(crate) fn write_snapshot(
    conn: &Connection,
    tree: TreeId,
    token: u64,
    snapshot: &Snapshot,
    compact: bool,
    written: &mut Writing<'_>,
) -> Result<AppendOutcome, StoreError> {
    let Some(row) = tree_row(conn, tree)? else {
        return Ok(AppendOutcome::Fenced);
    };
    if row.lease_token != Some(int(token)) {
        return Ok(AppendOutcome::Fenced);
    }
    let head = row.head_seq;
    let previous = conn
        .prepare_cached("SELECT seq, head FROM snapshots WHERE tree = ?1")
        .map_err(storage)?
        .query_row([row.key], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?))
        })
        .optional()
        .map_err(storage)?;
    let previous = match previous {
        Some((seq, hash)) => Some((uint(seq)?, digest(&hash)?)),
        None => None,
    };
    // The hash of the record the snapshot covers, wherever it is still known.
    let covered = if snapshot.seq == head {
        Some(row.head_hash)
    } else if let Some((_, hash)) = previous.filter(|(seq, _)| *seq == snapshot.seq) {
        Some(hash)
    } else {
        stored_hash(conn, tree, row.key, snapshot.seq)?
    };
    // The snapshot must name a point of this chain: not past the head, not
    // behind the current snapshot, and matching the record it covers.
    let behind = previous.is_some_and(|(seq, _)| snapshot.seq < seq);
    if snapshot.seq > head || behind || covered != Some(snapshot.head) {
        return Ok(AppendOutcome::Conflict { head });
    }
    let Stored { body, chunks, cut } = encode(conn, row.key, &snapshot.state, written)?;
    conn.prepare_cached(
        "INSERT OR REPLACE INTO snapshots (tree, seq, head, digest, body, chunks)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .map_err(storage)?
    .execute(params![
        row.key,
        int(snapshot.seq),
        &snapshot.head.as_bytes()[..],
        &chunk::state_digest(&snapshot.state)[..],
        body,
        chunks
    ])
    .map_err(storage)?;
    if compact {
        conn.prepare_cached("DELETE FROM records WHERE tree = ?1 AND seq <= ?2")
            .map_err(storage)?
            .execute(params![row.key, int(snapshot.seq)])
            .map_err(storage)?;
        unpack_covered(conn, tree, row.key, snapshot.seq)?;
        collect_chunks(conn, row.key)?;
        // The cuts of deleted records may name deleted chunks; the
        // snapshot's own are all referenced by it, and the tree's next
        // step shares most of them.
        written.cuts.forget(row.key);
    }
    if let Some(cut) = cut {
        written.cuts.keep(row.key, cut);
    }
    Ok(AppendOutcome::Committed)
}

/// Empties the packed first records of tree `tree` (row `key`) once a
/// compaction covers any of them: those after `seq` become rows of
/// `records`, so the packed records stay the log's first ones.
fn unpack_covered(conn: &Connection, tree: TreeId, key: i64, seq: u64) -> Result<(), StoreError> {
    let Some(log) = packed_log(conn, key)? else {
        return Ok(());
    };
    for record in unpack(tree, Some(&log))? {
        if record.seq > seq {
            // Packed bodies are inline ones.
            insert_row(conn, key, &record, Some(&record.body), None)?;
        }
    }
    conn.prepare_cached("UPDATE trees SET log = NULL WHERE key = ?1")
        .map_err(storage)?
        .execute([key])
        .map_err(storage)?;
    Ok(())
}

/// Deletes the chunks of a tree that neither a stored record nor the
/// snapshot references. Chunks are scoped to their tree, so this reads only
/// that tree's manifests (after compaction: the records since the snapshot).
fn collect_chunks(conn: &Connection, key: i64) -> Result<(), StoreError> {
    let mut live = BTreeSet::new();
    let manifests = conn
        .prepare_cached(
            "SELECT chunks FROM records WHERE tree = ?1 AND chunks IS NOT NULL
             UNION ALL SELECT chunks FROM snapshots WHERE tree = ?1 AND chunks IS NOT NULL",
        )
        .map_err(storage)?
        .query_map([key], |row| row.get::<_, Vec<u8>>(0))
        .map_err(storage)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(storage)?;
    for manifest in manifests {
        manifest_ids(Some(manifest), &mut live)?;
    }
    let stored = conn
        .prepare_cached("SELECT id FROM chunks WHERE tree = ?1")
        .map_err(storage)?
        .query_map([key], |row| row.get::<_, i64>(0))
        .map_err(storage)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(storage)?;
    let mut delete = conn
        .prepare_cached("DELETE FROM chunks WHERE id = ?1")
        .map_err(storage)?;
    for id in stored.into_iter().filter(|id| !live.contains(id)) {
        delete.execute([id]).map_err(storage)?;
    }
    Ok(())
}

/// Extends a lease; `false` if the token is no longer current.
pub(crate) fn renew(
    conn: &Connection,
    tree: TreeId,
    token: u64,
    until: Timestamp,
) -> Result<bool, StoreError> {
    let changed = conn
        .prepare_cached("UPDATE trees SET lease_until = ?1 WHERE id = ?2 AND lease_token = ?3")
        .map_err(storage)?
        .execute(params![int(until.0), tree.to_string(), int(token)])
        .map_err(storage)?;
    Ok(changed == 1)
}

/// Gives up a lease (no-op if the token is not current).
pub(crate) fn release(conn: &Connection, tree: TreeId, token: u64) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE trees SET lease_token = NULL, lease_owner = NULL, lease_until = NULL
         WHERE id = ?1 AND lease_token = ?2",
    )
    .map_err(storage)?
    .execute(params![tree.to_string(), int(token)])
    .map_err(storage)?;
    Ok(())
}

/// Deletes `done` trees last updated before `older_than`, with their
/// records, snapshots and chunks. Returns how many trees were removed.
pub(crate) fn prune(conn: &Connection, older_than: Timestamp) -> Result<usize, StoreError> {
    let keys = conn
        .prepare_cached("SELECT key FROM trees WHERE status = ?1 AND updated < ?2")
        .map_err(storage)?
        .query_map(
            params![TreeStatus::Done.as_str(), int(older_than.0)],
            |row| row.get::<_, i64>(0),
        )
        .map_err(storage)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(storage)?;
    for key in &keys {
        for sql in [
            "DELETE FROM records WHERE tree = ?1",
            "DELETE FROM snapshots WHERE tree = ?1",
            "DELETE FROM chunks WHERE tree = ?1",
            "DELETE FROM inbox WHERE tree = ?1",
            "DELETE FROM trees WHERE key = ?1",
        ] {
            conn.prepare_cached(sql)
                .map_err(storage)?
                .execute([key])
                .map_err(storage)?;
        }
    }
    Ok(keys.len())
}

/// Fuzzing the decoders of stored rows (see `baton_testkit::fuzz`): chunk
/// manifests, digests, statuses, record kinds, scopes and tree ids, as a
/// damaged file may hold them. Each decodes or is a classified
/// `StoreError`; none panics.
#[cfg(test)]
mod fuzz {
    use baton_testkit::fuzz;
    use proptest::prelude::*;

    use baton_run::log::RecordKind;

    use super::*;

    /// Two packed records, as a short first commit leaves them.
    fn packed_sample() -> Vec<u8> {
        let first = Record::stored(
            1,
            Digest::ZERO,
            Digest::from_bytes([1; 32]),
            RecordKind::TreeStarted,
            Arc::from(&b"{\"tree\":1}"[..]),
        );
        let second = Record::stored(
            2,
            first.hash,
            Digest::from_bytes([2; 32]),
            RecordKind::Terminated,
            Arc::from(&b"{}"[..]),
        );
        packed::pack(&[first, second], fuzz_tree(), usize::MAX).expect("packs")
    }

    /// A packed log stored compressed: the records of a short run.
    fn compressed_sample() -> Vec<u8> {
        let body = concat!(
            r#"{"kind":"tree_started","start":{"scope":"s","key":"k"},"#,
            r#""root":"p_0123456789abcdef0123456789abcdef","program":{"name":"a.b","#,
            r#""contract":"b3:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","#,
            r#""children":[],"digest":"b3:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},"#,
            r#""input":1,"budget":{},"capabilities":[],"created":1,"state":{"stage":0,"value":1}}"#,
        );
        let record = Record::stored(
            1,
            Digest::ZERO,
            Digest::from_bytes([1; 32]),
            RecordKind::TreeStarted,
            Arc::from(body.as_bytes()),
        );
        let packed = packed::pack(&[record], fuzz_tree(), usize::MAX).expect("packs");
        assert_eq!(packed[0], packed::COMPRESSED);
        packed
    }

    /// The tree the fuzzed logs are read for.
    fn fuzz_tree() -> TreeId {
        "p_0123456789abcdef0123456789abcdef"
            .parse()
            .expect("a tree id")
    }

    /// A packed log stored compact: the same run's records, sealed.
    fn compact_sample() -> Vec<u8> {
        let plain = packed::plain(&compressed_sample(), fuzz_tree()).expect("a packed log");
        let first = packed::unpack(&plain, fuzz_tree(), &|| "tree t".into()).expect("reads");
        let started = Record::from_parts(1, Digest::ZERO, first[0].kind, first[0].body.clone());
        let ended = Record::from_parts(
            2,
            started.hash,
            RecordKind::Terminated,
            Arc::from(&b"{}"[..]),
        );
        let packed = packed::pack(&[started, ended], fuzz_tree(), usize::MAX).expect("packs");
        assert_eq!(packed[0], packed::COMPACT);
        packed
    }

    proptest! {
        #![proptest_config(fuzz::config())]

        #[test]
        fn fuzz_chunk_manifests(bytes in fuzz::bytes(vec![vec![0x81, 0x01, 0x7f, 0xff, 0xff, 0x03]])) {
            if let Some(ids) = chunk::read_varints(&bytes) {
                let mut again = Vec::new();
                for id in &ids {
                    chunk::put_varint(&mut again, *id);
                }
                prop_assert_eq!(chunk::read_varints(&again), Some(ids));
            }
        }

        #[test]
        fn fuzz_packed_logs(bytes in fuzz::bytes(vec![packed_sample(), compressed_sample(), compact_sample()])) {
            // Reads whole or is `Corrupt`; what reads is a chain from
            // sequence 1 and packs again to what reads the same.
            match packed::unpack(&bytes, fuzz_tree(), &|| "tree t".into()) {
                Ok(records) => {
                    let mut prev = Digest::ZERO;
                    for (at, record) in records.iter().enumerate() {
                        prop_assert_eq!(record.seq, at as u64 + 1);
                        prop_assert_eq!(record.prev, prev);
                        prev = record.hash;
                    }
                    // (`None` for a body too long to have been packed.)
                    if let Some(again) = packed::pack(&records, fuzz_tree(), usize::MAX) {
                        prop_assert_eq!(packed::unpack(&again, fuzz_tree(), &|| "tree t".into()), Ok(records));
                    }
                }
                Err(error) => prop_assert!(matches!(error, StoreError::Corrupt { .. }), "{error}"),
            }
        }

        #[test]
        fn fuzz_row_fields(
            bytes in fuzz::bytes(vec![vec![7; 32], b"needs_attention".to_vec()]),
            text in fuzz::text(vec!["acme/alice".to_owned(), "waiting".to_owned(), "step_adopted".to_owned(), "p_0123456789abcdef0123456789abcdef".to_owned()]),
            number in any::<i64>(),
        ) {
            let refused = |error: &StoreError| matches!(error, StoreError::Corrupt { .. });
            if let Err(error) = digest(&bytes) {
                prop_assert!(refused(&error), "{error}");
            }
            if let Err(error) = baton_run::store::stored_status(&text) {
                prop_assert!(refused(&error), "{error}");
            }
            if let Err(error) = stored_kind(&text) {
                prop_assert!(refused(&error), "{error}");
            }
            if let Err(error) = uint(number) {
                prop_assert!(refused(&error), "{error}");
            }
            if let Ok(tree) = text.parse::<TreeId>()
                && let Err(error) = (StoredMeta {
                    scope: Some(text.clone()),
                    status: Some(text.clone()),
                    updated: Some(number),
                    program_name: Some(text.clone()),
                    program_digest: Some(bytes.clone()),
                    created: Some(number),
                    labels: Some(text.clone()),
                })
                .decode(tree)
            {
                prop_assert!(refused(&error), "{error}");
            }
        }
    }
}
