//! A database an older build created: schema version 1, written with that
//! version's DDL, is migrated when opened, and its trees read, list and go
//! on.

use std::sync::Arc;

use baton_store_postgres::{Creation, PostgresConfig, PostgresStore};

use crate::support::{Server, connect};

/// Schema version 1, as builds before listings kept programs, labels and
/// start times created it.
const SCHEMA_1: &str = "
    CREATE TABLE baton_schema (
        application text NOT NULL,
        version     integer NOT NULL
    );
    INSERT INTO baton_schema (application, version) VALUES ('baton', 1);
    CREATE SEQUENCE baton_tokens;
    CREATE TABLE baton_trees (
        key         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id          text NOT NULL UNIQUE,
        scope       text,
        status      text,
        updated     bigint,
        lease_token bigint,
        lease_owner text,
        lease_until bigint,
        lease_ttl   bigint,
        last_token  bigint NOT NULL,
        head_seq    bigint NOT NULL,
        head_hash   bytea NOT NULL
    );
    CREATE INDEX baton_trees_by_status ON baton_trees (status, scope, id);
    CREATE INDEX baton_trees_by_scope ON baton_trees (scope, status, id);
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
    CREATE TABLE baton_snapshots (
        tree   bigint PRIMARY KEY,
        seq    bigint NOT NULL,
        head   bytea NOT NULL,
        digest bytea NOT NULL,
        body   bytea,
        chunks bytea
    );
    CREATE TABLE baton_chunks (
        tree   bigint NOT NULL,
        digest bytea NOT NULL,
        bytes  bytea NOT NULL,
        PRIMARY KEY (tree, digest)
    );
    ALTER TABLE baton_chunks ALTER COLUMN bytes SET STORAGE EXTERNAL;
";

#[tokio::test]
async fn a_database_of_schema_version_1_is_migrated_and_its_trees_read_list_and_go_on() {
    let server = Server::new();
    let url = server.database();
    let old = baton_testkit::waiting_tree().await;
    {
        let client = connect(&url).await;
        client
            .batch_execute(SCHEMA_1)
            .await
            .expect("the version 1 schema");
        let last = old.records.last().expect("the tree has records");
        let key: i64 = client
            .query_one(
                "INSERT INTO baton_trees (id, scope, status, updated, last_token, head_seq, head_hash)
                 VALUES ($1, $2, $3, $4, nextval('baton_tokens'), $5, $6) RETURNING key",
                &[
                    &old.tree.to_string(),
                    &old.meta.scope.as_str(),
                    &old.meta.status.as_str(),
                    &(old.meta.updated.0 as i64),
                    &(last.seq as i64),
                    &&last.hash.as_bytes()[..],
                ],
            )
            .await
            .expect("the tree's row")
            .get(0);
        for record in &old.records {
            assert!(
                record.body.len() <= 4096,
                "version 1 kept small bodies inline"
            );
            client
                .execute(
                    "INSERT INTO baton_records (tree, seq, kind, prev, hash, body)
                     VALUES ($1, $2, $3, $4, $5, $6)",
                    &[
                        &key,
                        &(record.seq as i64),
                        &record.kind.as_str(),
                        &&record.prev.as_bytes()[..],
                        &&record.hash.as_bytes()[..],
                        &&record.body[..],
                    ],
                )
                .await
                .expect("a record");
        }
    }
    let store = PostgresStore::open_with(PostgresConfig {
        creation: Creation::Existing,
        ..PostgresConfig::new(url.clone())
    })
    .expect("a version 1 database opens");
    baton_testkit::migrated_store_conformance(Arc::new(store), &old).await;
    let version: i32 = connect(&url)
        .await
        .query_one("SELECT version FROM baton_schema", &[])
        .await
        .expect("reads")
        .get(0);
    assert_eq!(
        i64::from(version),
        baton_store_postgres::SCHEMA_VERSION,
        "the database was migrated to the current version"
    );
}
