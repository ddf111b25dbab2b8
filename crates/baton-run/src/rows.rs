//! Decoding what a store backend reads back from its rows: the listing
//! columns of a tree ([`StoredMeta`]) and the integers, digests and
//! statuses they hold, each damaged value a [`StoreError::corrupt`] error
//! naming it. The SQL backends read the columns their own way and share
//! these rules.

use crate::clock::Timestamp;
use crate::digest::Digest;
use crate::ids::{Name, Scope, TreeId};
use crate::labels::Labels;
use crate::log::RecordKind;
use crate::protocol::ProgramVersion;
use crate::storage::{StoreError, TreeMeta, TreeStatus};

/// A stored non-negative integer (SQL integers are signed).
pub fn stored_uint(value: i64) -> Result<u64, StoreError> {
    u64::try_from(value)
        .map_err(|_| StoreError::corrupt(format!("negative stored integer {value}")))
}

/// A stored 32-byte digest.
pub fn stored_digest(bytes: &[u8]) -> Result<Digest, StoreError> {
    let array: [u8; 32] = bytes
        .try_into()
        .map_err(|_| StoreError::corrupt(format!("stored digest of {} bytes", bytes.len())))?;
    Ok(Digest::from_bytes(array))
}

/// A stored tree status (its `as_str` text).
pub fn stored_status(text: &str) -> Result<TreeStatus, StoreError> {
    [
        TreeStatus::Running,
        TreeStatus::Waiting,
        TreeStatus::NeedsAttention,
        TreeStatus::Done,
    ]
    .into_iter()
    .find(|status| status.as_str() == text)
    .ok_or_else(|| StoreError::corrupt(format!("unknown tree status {text:?}")))
}

/// A stored record kind (its `as_str` text).
pub fn stored_kind(text: &str) -> Result<RecordKind, StoreError> {
    RecordKind::ALL
        .into_iter()
        .find(|kind| kind.as_str() == text)
        .ok_or_else(|| StoreError::corrupt(format!("unknown record kind {text:?}")))
}

/// A tree's listing columns as a SQL row holds them: `scope, status,
/// updated, program_name, program_digest, created, labels` (the labels as
/// their JSON text); every one may be absent in a row that has no
/// committed record yet, and the program and start time in a row migrated
/// from an older schema.
#[derive(Clone, Debug, Default)]
pub struct StoredMeta {
    /// The tenant scope.
    pub scope: Option<String>,
    /// The status's text.
    pub status: Option<String>,
    /// The last append's time, in milliseconds.
    pub updated: Option<i64>,
    /// The root program's name.
    pub program_name: Option<String>,
    /// The root program's digest bytes.
    pub program_digest: Option<Vec<u8>>,
    /// The start time, in milliseconds.
    pub created: Option<i64>,
    /// The labels' JSON object.
    pub labels: Option<String>,
}

impl StoredMeta {
    /// The listing metadata of `tree`; `None` for a row with no committed
    /// record yet (no scope, status or time).
    pub fn decode(self, tree: TreeId) -> Result<Option<TreeMeta>, StoreError> {
        let corrupt = StoreError::corrupt;
        let (Some(scope), Some(status), Some(updated)) = (self.scope, self.status, self.updated)
        else {
            return Ok(None);
        };
        let program = match (self.program_name, self.program_digest) {
            (Some(name), Some(bytes)) => Some(ProgramVersion {
                name: Name::new(&name).map_err(|error| corrupt(error.to_string()))?,
                digest: stored_digest(&bytes)?,
            }),
            (None, None) => None,
            _ => {
                return Err(corrupt(format!(
                    "tree {tree}: its program columns are partly missing"
                )));
            }
        };
        let labels = match self.labels {
            Some(text) => Labels::from_json(&text)
                .map_err(|error| corrupt(format!("tree {tree}: stored labels: {error}")))?,
            None => Labels::new(),
        };
        Ok(Some(TreeMeta {
            tree,
            scope: Scope::new(&scope).map_err(|error| corrupt(error.to_string()))?,
            status: stored_status(&status)?,
            updated: Timestamp(stored_uint(updated)?),
            program,
            labels,
            created: self.created.map(stored_uint).transpose()?.map(Timestamp),
        }))
    }
}
