//! Reading stored values back: integers, digests, statuses, record kinds and
//! listing metadata, as a damaged or hand-edited row may hold them. Each
//! decodes or is a `Corrupt` store error; none panics.

use baton_run::store::StoreError;
pub(crate) use baton_run::store::{
    StoredMeta, stored_digest as digest, stored_kind, stored_uint as uint,
};

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, ToSql};

/// Parameters of a statement.
pub(crate) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// Runs `sql` through the connection's statement cache: a statement is
/// parsed once per connection, and each later run is one round trip.
pub(crate) async fn query(
    client: &impl GenericClient,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<Row>, tokio_postgres::Error> {
    let statement = client.prepare_cached(sql).await?;
    client.query(&statement, params).await
}

/// [`query`] for at most one row.
pub(crate) async fn query_opt(
    client: &impl GenericClient,
    sql: &str,
    params: Params<'_>,
) -> Result<Option<Row>, tokio_postgres::Error> {
    let statement = client.prepare_cached(sql).await?;
    client.query_opt(&statement, params).await
}

/// [`query`] for a statement without rows; the number of rows it changed.
pub(crate) async fn execute(
    client: &impl GenericClient,
    sql: &str,
    params: Params<'_>,
) -> Result<u64, tokio_postgres::Error> {
    let statement = client.prepare_cached(sql).await?;
    client.execute(&statement, params).await
}

pub(crate) fn corrupt(what: impl Into<String>) -> StoreError {
    StoreError::corrupt(what)
}

/// PostgreSQL integers are signed; values past `i64::MAX` (292 million
/// years of milliseconds, or that many tokens) are stored as `i64::MAX`.
pub(crate) fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Column `index` of `row`, or a `Corrupt` error naming it (a column whose
/// type was changed by hand, say).
pub(crate) fn column<'a, T: FromSql<'a>>(row: &'a Row, index: usize) -> Result<T, StoreError> {
    row.try_get(index).map_err(|error| {
        let name = row.columns().get(index).map_or("?", |column| column.name());
        corrupt(format!("stored column {name} does not read back: {error}"))
    })
}

/// Reads the listing columns of `row` starting at column `at`: `scope,
/// status, updated, program_name, program_digest, created, labels::text`.
pub(crate) fn read_meta(row: &Row, at: usize) -> Result<StoredMeta, StoreError> {
    Ok(StoredMeta {
        scope: column(row, at)?,
        status: column(row, at + 1)?,
        updated: column(row, at + 2)?,
        program_name: column(row, at + 3)?,
        program_digest: column(row, at + 4)?,
        created: column(row, at + 5)?,
        labels: column(row, at + 6)?,
    })
}

/// Fuzzing the decoders of stored fields (see `baton_testkit::fuzz`):
/// digests, statuses, record kinds, integers and listing metadata, as a
/// damaged row may hold them. Each decodes or is a `Corrupt` error; none
/// panics.
#[cfg(test)]
mod fuzz {
    use baton_testkit::fuzz;
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(fuzz::config())]

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
            if let Some(digests) = crate::chunk::read_manifest(&bytes) {
                prop_assert_eq!(crate::chunk::manifest(&digests), bytes.clone());
            }
            if let Ok(tree) = text.parse::<baton_run::TreeId>()
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
