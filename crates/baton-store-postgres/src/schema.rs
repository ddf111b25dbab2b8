//! The database schema and its migrations.
//!
//! The store's tables live in the connection's current schema (`public`
//! unless the URL sets a `search_path`), all named `baton_*`. The table
//! `baton_schema` holds one row, `('baton', version)`: it marks the database
//! as a Baton store and says which migrations ran. Opening checks it before
//! anything is written, under a transaction-scoped advisory lock so that
//! engines opening the same database at once migrate it once: a store of a
//! newer schema, or a database whose tables are not a Baton store's, is
//! refused and left untouched.

use tokio_postgres::Client;

use crate::config::Creation;
use crate::error::OpenError;

/// The advisory lock key that serializes opening and migrating ("BATN").
const OPEN_LOCK: i64 = 0x4241_544e;

/// What `baton_schema.application` holds in a Baton store.
const APPLICATION: &str = "baton";

/// Migrations in order; migration `i` takes the schema from version `i` to
/// `i + 1`. The current version is their count.
const MIGRATIONS: &[&str] = &[
    // Version 1.
    "
    CREATE TABLE baton_schema (
        application text NOT NULL,
        version     integer NOT NULL
    );
    INSERT INTO baton_schema (application, version) VALUES ('baton', 0);

    -- Fencing tokens: one sequence for every tree, so a token is never
    -- minted twice, not even for a tree pruned and started again.
    CREATE SEQUENCE baton_tokens;

    CREATE TABLE baton_trees (
        key         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id          text NOT NULL UNIQUE,
        -- Listing metadata: NULL until the first append.
        scope       text,
        status      text,
        updated     bigint,
        -- The writer lease: all NULL when released. `lease_until` is on the
        -- lease clock (the database's, by default), in ms since the epoch;
        -- `lease_ttl` (ms) is what a renewal extends it by.
        lease_token bigint,
        lease_owner text,
        lease_until bigint,
        lease_ttl   bigint,
        -- The last fencing token granted (tokens strictly increase).
        last_token  bigint NOT NULL,
        head_seq    bigint NOT NULL,
        head_hash   bytea NOT NULL
    );
    CREATE INDEX baton_trees_by_status ON baton_trees (status, scope, id);
    CREATE INDEX baton_trees_by_scope ON baton_trees (scope, status, id);

    -- One row per record; the body is inline or a manifest of piece digests.
    CREATE TABLE baton_records (
        tree   bigint NOT NULL,
        seq    bigint NOT NULL,
        kind   text NOT NULL,
        prev   bytea NOT NULL,
        hash   bytea NOT NULL,
        body   bytea,
        chunks bytea,
        PRIMARY KEY (tree, seq)
    );

    -- The latest snapshot of a tree.
    CREATE TABLE baton_snapshots (
        tree   bigint PRIMARY KEY,
        seq    bigint NOT NULL,
        head   bytea NOT NULL,
        digest bytea NOT NULL,
        body   bytea,
        chunks bytea
    );

    -- Pieces of large bodies, stored once per tree by digest.
    CREATE TABLE baton_chunks (
        tree   bigint NOT NULL,
        digest bytea NOT NULL,
        bytes  bytea NOT NULL,
        PRIMARY KEY (tree, digest)
    );
    -- The pieces are mostly incompressible or already deduplicated.
    ALTER TABLE baton_chunks ALTER COLUMN bytes SET STORAGE EXTERNAL;
    ",
    // Version 2: what a listing shows and filters by. The root's program
    // (name and exact version), the start time and the labels are facts of
    // a tree's start that every append writes again; rows of version 1 hold
    // NULL until their next append. Pages are cut by id in byte order.
    r#"
    ALTER TABLE baton_trees
        ADD COLUMN program_name   text,
        ADD COLUMN program_digest bytea,
        ADD COLUMN created        bigint,
        ADD COLUMN labels         jsonb;
    CREATE INDEX baton_trees_by_labels ON baton_trees USING gin (labels jsonb_path_ops);
    CREATE INDEX baton_trees_by_id_bytes ON baton_trees (id COLLATE "C");
    "#,
    // Version 3: each tree's inbox, commands posted for the engine that
    // holds the tree. A message is pending while its outcome is NULL; the
    // holder settles it once (fenced by its lease token).
    "
    CREATE TABLE baton_inbox (
        seq     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        tree    bigint NOT NULL,
        id      text NOT NULL,
        body    text NOT NULL,
        posted  bigint NOT NULL,
        outcome text,
        UNIQUE (tree, id)
    );
    CREATE INDEX baton_inbox_pending ON baton_inbox (seq) WHERE outcome IS NULL;
    ",
];

/// The schema version this build writes.
pub(crate) const CURRENT: i64 = MIGRATIONS.len() as i64;

/// Checks the database and, as `creation` allows, creates or migrates the
/// store's tables, all in one transaction.
pub(crate) async fn open(
    client: &mut Client,
    creation: Creation,
    target: &str,
    database: &str,
) -> Result<(), OpenError> {
    let failed = |error| OpenError::from_postgres(target, database, error);
    let tx = client.transaction().await.map_err(failed)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&OPEN_LOCK])
        .await
        .map_err(failed)?;
    let tables: Vec<String> = tx
        .query(
            "SELECT c.relname::text FROM pg_class c
             WHERE c.relnamespace = current_schema()::regnamespace
               AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
             ORDER BY 1",
            &[],
        )
        .await
        .map_err(failed)?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let foreign = |tables: &[String]| OpenError::Foreign {
        target: target.to_owned(),
        tables: {
            // Name the tables that are surely not ours, when there are any.
            let others: Vec<&String> = tables.iter().filter(|t| !t.starts_with("baton_")).collect();
            let shown = if others.is_empty() {
                tables.iter().collect()
            } else {
                others
            };
            shown
                .into_iter()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        },
    };
    let version = if tables.iter().any(|table| table == "baton_schema") {
        let rows = tx
            .query("SELECT application, version::bigint FROM baton_schema", &[])
            .await;
        let marker = match rows.as_deref() {
            Ok([row]) => row
                .try_get::<_, String>(0)
                .ok()
                .zip(row.try_get::<_, i64>(1).ok()),
            _ => None,
        };
        match marker {
            Some((application, version)) if application == APPLICATION => version,
            _ => return Err(foreign(&tables)),
        }
    } else if tables.is_empty() {
        match creation {
            Creation::Existing => {
                return Err(OpenError::Missing {
                    target: target.to_owned(),
                });
            }
            Creation::New | Creation::ExistingOrNew => 0,
        }
    } else {
        return Err(foreign(&tables));
    };
    if version > CURRENT {
        return Err(OpenError::NewerSchema {
            target: target.to_owned(),
            found: version,
            supported: CURRENT,
        });
    }
    if version > 0 && creation == Creation::New {
        return Err(OpenError::Exists {
            target: target.to_owned(),
        });
    }
    for (index, migration) in MIGRATIONS.iter().enumerate() {
        let to = index as i64 + 1;
        if to <= version {
            continue;
        }
        tx.batch_execute(migration).await.map_err(failed)?;
        tx.execute("UPDATE baton_schema SET version = $1::bigint", &[&to])
            .await
            .map_err(failed)?;
    }
    tx.commit().await.map_err(failed)
}
