//! The database schema and its migrations.
//!
//! The schema version is SQLite's `user_version`; `application_id` marks a
//! file as a Baton store. Opening checks both before anything is written:
//! a file of a newer schema, a database of another application or a file
//! that is not a database is refused and left untouched.

use rusqlite::{Connection, OptionalExtension};

/// `application_id` of a Baton store ("BATN").
pub(crate) const APPLICATION_ID: i32 = 0x4241_544e;

/// Migrations in order; migration `i` takes the schema from version `i` to
/// `i + 1`. The current version is their count.
const MIGRATIONS: &[&str] = &[
    // Version 1.
    "
    CREATE TABLE trees (
        key         INTEGER PRIMARY KEY,
        id          TEXT NOT NULL UNIQUE,
        -- Listing metadata: NULL until the first append.
        scope       TEXT,
        status      TEXT,
        updated     INTEGER,
        -- The writer lease: all NULL when released.
        lease_token INTEGER,
        lease_owner TEXT,
        lease_until INTEGER,
        -- The last fencing token granted (tokens strictly increase).
        last_token  INTEGER NOT NULL,
        head_seq    INTEGER NOT NULL,
        head_hash   BLOB NOT NULL
    );
    CREATE INDEX trees_by_status ON trees (status, scope, id);
    CREATE INDEX trees_by_scope ON trees (scope, status, id);

    -- One row per record; the body is inline or a manifest of chunk ids.
    CREATE TABLE records (
        tree   INTEGER NOT NULL,
        seq    INTEGER NOT NULL,
        kind   TEXT NOT NULL,
        prev   BLOB NOT NULL,
        hash   BLOB NOT NULL,
        body   BLOB,
        chunks BLOB,
        PRIMARY KEY (tree, seq)
    );

    -- The latest snapshot of a tree.
    CREATE TABLE snapshots (
        tree   INTEGER PRIMARY KEY,
        seq    INTEGER NOT NULL,
        head   BLOB NOT NULL,
        digest BLOB NOT NULL,
        body   BLOB,
        chunks BLOB
    );

    -- Pieces of large bodies, stored once per tree by digest.
    CREATE TABLE chunks (
        id     INTEGER PRIMARY KEY,
        tree   INTEGER NOT NULL,
        digest BLOB NOT NULL,
        bytes  BLOB NOT NULL,
        UNIQUE (tree, digest)
    );
    ",
    // Version 2: what a listing shows and filters by. The root's program
    // (name and exact version), the start time and the labels (a JSON
    // object, NULL for none) are facts of a tree's start that every append
    // writes again; rows of version 1 hold NULL until their next append.
    "
    ALTER TABLE trees ADD COLUMN program_name TEXT;
    ALTER TABLE trees ADD COLUMN program_digest BLOB;
    ALTER TABLE trees ADD COLUMN created INTEGER;
    ALTER TABLE trees ADD COLUMN labels TEXT;
    ",
    // Version 3: each tree's inbox, commands posted for the engine that
    // holds the tree. A message is pending while its outcome is NULL; the
    // holder settles it once (fenced by its lease token).
    "
    CREATE TABLE inbox (
        seq     INTEGER PRIMARY KEY AUTOINCREMENT,
        tree    INTEGER NOT NULL,
        id      TEXT NOT NULL,
        body    TEXT NOT NULL,
        posted  INTEGER NOT NULL,
        outcome TEXT,
        UNIQUE (tree, id)
    );
    CREATE INDEX inbox_pending ON inbox (seq) WHERE outcome IS NULL;
    ",
    // Version 4: fewer index pages per commit. A tree is listed by scope
    // (every status) through `trees_by_scope`, and by status through
    // `trees_open`, which holds unfinished trees only: a root stored done
    // in its first commit (most short runs) writes no entry there, and a
    // tree that ends leaves it. Listings of done trees read the scope
    // index or the table.
    "
    DROP INDEX trees_by_status;
    DROP INDEX trees_by_scope;
    CREATE INDEX trees_by_scope ON trees (scope, id);
    CREATE INDEX trees_open ON trees (status, scope, id) WHERE status <> 'done';
    ",
    // Version 5: the first records of a tree that ends in its first
    // commit, when short, packed into its row (`packed.rs`), so such a run
    // writes no row of `records` and no entry of its key. NULL for rows
    // written before and for trees whose first records were not packed.
    "
    ALTER TABLE trees ADD COLUMN log BLOB;
    ",
    // Version 6: packed first records may be stored compressed (version 2
    // of the packed form, `packed.rs`), which a build of version 5 would
    // read as damage; it refuses this version instead. No table changes,
    // and logs packed before stay as they are (version 1, still read).
    "",
    // Version 7: packed first records may be stored compact (version 3 of
    // the packed form: hex digits as bytes, hashes computed again when
    // read), which a build of version 6 would read as damage; it refuses
    // this version instead. No table changes; versions 1 and 2 still read.
    "",
];

/// The schema version this build writes.
pub(crate) const CURRENT: i64 = MIGRATIONS.len() as i64;

/// What a file holds before it is migrated.
pub(crate) enum Found {
    /// A Baton store (or an empty file) at this version.
    Store(i64),
    /// A database of another application.
    Foreign,
}

/// Reads the identity and version of the file. Reads only; a file that is
/// not a database fails here with `SQLITE_NOTADB`.
pub(crate) fn inspect(conn: &Connection) -> rusqlite::Result<Found> {
    let objects: i64 = conn.query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))?;
    let application: i32 = conn.query_row("PRAGMA application_id", [], |r| r.get(0))?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if application == APPLICATION_ID || (application == 0 && objects == 0 && version == 0) {
        Ok(Found::Store(version))
    } else {
        Ok(Found::Foreign)
    }
}

/// Brings the schema from `version` to [`CURRENT`], one transaction per step.
pub(crate) fn migrate(conn: &mut Connection, version: i64) -> rusqlite::Result<()> {
    for (index, migration) in MIGRATIONS.iter().enumerate() {
        let target = index as i64 + 1;
        if target <= version {
            continue;
        }
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        // Another process may have migrated meanwhile.
        let now: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if now < target {
            tx.execute_batch(migration)?;
            tx.execute_batch(&format!(
                "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {target};"
            ))?;
        }
        tx.commit()?;
    }
    Ok(())
}

/// The journal mode after asking for WAL.
pub(crate) fn enable_wal(conn: &Connection) -> rusqlite::Result<Option<String>> {
    conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .optional()
}
