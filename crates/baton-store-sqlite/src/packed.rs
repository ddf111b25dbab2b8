//! A new tree's first records, packed into its row.
//!
//! Every commit writes each page it changed whole to the write-ahead log,
//! so what a short run costs on disk is the number of B-trees it touches
//! more than the bytes it records. A root that ends in its first round
//! commits its row and all its records at once; stored as rows of
//! `records`, they would touch that table and its `(tree, seq)` key besides
//! the tree's row and its two index entries. When they are short (every
//! body inline, the whole at most [`limit`] bytes) they are kept instead in
//! the row's `log` column, in the form below, and the run touches three
//! B-trees, not five.
//!
//! Only a first commit that ends its tree (done, the lease given up) is
//! packed: every later commit of a tree writes its row again, and a row
//! that carries a kilobyte of records leaves room for a few rows a page,
//! where a slim one shares it with a dozen, so trees that wait and are
//! answered together would write several times the pages (measured with
//! `resume1000`: 7 KB a tree became 17-19 KB when waiting trees packed).
//! Should a packed tree be written again (a host taking it up by force,
//! say), its later records go to `records` as always: the packed records
//! are always the log's first ones (from sequence 1, with nothing of
//! theirs in `records`), until a compaction that covers any of them moves
//! the rest to `records` and empties the column.
//!
//! The form: a version byte ([`VERSION`]), the number of records, then per
//! record its kind's name, its hash and its body, each length first
//! (unsigned LEB128 varints, as chunk manifests). Sequences and `prev`
//! hashes are not stored: `Store::create_tree` takes records from sequence
//! 1 after the zero digest, each following the one before
//! (`CreateTree::check`), so they are read back from the order.

use std::sync::Arc;

use baton_run::Digest;
use baton_run::log::Record;
use baton_run::store::{StoreError, stored_digest, stored_kind};

use crate::chunk;

/// The form's version, its first byte.
pub(crate) const VERSION: u8 = 1;

/// The most bytes packed into a row of a database of `page_size` bytes a
/// page: four pages. A row longer than about a page keeps its head in its
/// page and the rest in overflow pages of its own, which SQLite fills
/// whole; the row of a tree that ended is not written again (but for its
/// deletion, or a host taking it up by force), so a long one costs its
/// overflow pages once, as rows of `records` would cost theirs, without
/// the `(tree, seq)` key.
pub(crate) fn limit(page_size: u32) -> usize {
    page_size as usize * 4
}

/// `records` (a new tree's first, from sequence 1, chained) packed, or
/// `None` when a body is not inline or the whole would exceed `max` bytes.
pub(crate) fn pack(records: &[Record], max: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(max.min(1024));
    out.push(VERSION);
    chunk::put_varint(&mut out, records.len() as u64);
    for record in records {
        if record.body.len() > chunk::INLINE_MAX {
            return None;
        }
        let kind = record.kind.as_str();
        chunk::put_varint(&mut out, kind.len() as u64);
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(record.hash.as_bytes());
        chunk::put_varint(&mut out, record.body.len() as u64);
        out.extend_from_slice(&record.body);
        if out.len() > max {
            return None;
        }
    }
    Some(out)
}

/// The records `bytes` holds, from sequence 1; a malformed form is
/// `Corrupt`, named by `what`.
pub(crate) fn unpack(bytes: &[u8], what: &dyn Fn() -> String) -> Result<Vec<Record>, StoreError> {
    let malformed = |detail: &str| StoreError::corrupt(format!("{}: {detail}", what()));
    let mut reader = Reader { bytes };
    let version = reader
        .take(1)
        .ok_or_else(|| malformed("empty packed log"))?[0];
    if version != VERSION {
        return Err(malformed(&format!(
            "packed log of unknown version {version}"
        )));
    }
    let count = reader
        .varint()
        .ok_or_else(|| malformed("packed log: malformed record count"))?;
    // Each record takes at least 35 bytes; a count past that is damage,
    // not a reason to reserve memory.
    if count == 0 || count > (bytes.len() / 35) as u64 {
        return Err(malformed(&format!("packed log: {count} records")));
    }
    let mut records = Vec::with_capacity(count as usize);
    let mut prev = Digest::ZERO;
    for seq in 1..=count {
        let record = |detail: &str| malformed(&format!("packed record {seq}: {detail}"));
        let kind = reader.counted().ok_or_else(|| record("malformed kind"))?;
        let kind = String::from_utf8_lossy(kind);
        let kind = stored_kind(&kind).map_err(|_| record(&format!("unknown kind {kind:?}")))?;
        let hash = reader.take(32).ok_or_else(|| record("truncated hash"))?;
        let hash = stored_digest(hash)?;
        let body = reader.counted().ok_or_else(|| record("truncated body"))?;
        records.push(Record {
            seq,
            prev,
            hash,
            kind,
            body: Arc::from(body),
        });
        prev = hash;
    }
    if !reader.bytes.is_empty() {
        return Err(malformed(&format!(
            "packed log: {} bytes after its records",
            reader.bytes.len()
        )));
    }
    Ok(records)
}

/// Reads a packed log from the front.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < len {
            return None;
        }
        let (head, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Some(head)
    }

    fn varint(&mut self) -> Option<u64> {
        chunk::read_varint(&mut self.bytes)
    }

    /// Bytes preceded by their count.
    fn counted(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        self.take(len)
    }
}

#[cfg(test)]
mod tests {
    use baton_run::log::RecordKind;
    use proptest::prelude::*;

    use super::*;

    fn chain(bodies: &[(RecordKind, Vec<u8>)]) -> Vec<Record> {
        let mut prev = Digest::ZERO;
        bodies
            .iter()
            .enumerate()
            .map(|(at, (kind, body))| {
                let hash = Digest::from_bytes(chunk::digest(body));
                let record = Record {
                    seq: at as u64 + 1,
                    prev,
                    hash,
                    kind: *kind,
                    body: Arc::from(body.as_slice()),
                };
                prev = hash;
                record
            })
            .collect()
    }

    fn kinds() -> impl Strategy<Value = RecordKind> {
        proptest::sample::select(RecordKind::ALL.to_vec())
    }

    proptest! {
        /// What is packed reads back as it was: sequences from 1, each
        /// `prev` the hash before, kinds, hashes and bodies.
        #[test]
        fn packed_records_read_back_as_they_were(
            bodies in proptest::collection::vec((kinds(), proptest::collection::vec(any::<u8>(), 0..300)), 1..8),
        ) {
            let records = chain(&bodies);
            let packed = pack(&records, usize::MAX).expect("inline bodies pack");
            prop_assert_eq!(packed[0], VERSION);
            let read = unpack(&packed, &|| "tree t".into()).expect("reads back");
            prop_assert_eq!(read, records);
        }

        /// A pack is refused, not cut, past its limit: it holds all the
        /// records or none.
        #[test]
        fn a_pack_over_its_limit_is_refused(
            bodies in proptest::collection::vec((kinds(), proptest::collection::vec(any::<u8>(), 0..300)), 1..8),
            max in 0usize..2_000,
        ) {
            let records = chain(&bodies);
            let whole = pack(&records, usize::MAX).expect("inline bodies pack");
            match pack(&records, max) {
                Some(packed) => {
                    prop_assert!(packed.len() <= max);
                    prop_assert_eq!(packed, whole);
                }
                None => prop_assert!(whole.len() > max),
            }
        }
    }

    #[test]
    fn a_body_stored_in_pieces_is_not_packed() {
        let records = chain(&[
            (RecordKind::TreeStarted, b"{}".to_vec()),
            (RecordKind::StepAdopted, vec![b' '; chunk::INLINE_MAX + 1]),
        ]);
        assert_eq!(pack(&records, usize::MAX), None);
    }

    #[test]
    fn damage_is_corrupt_and_named() {
        let records = chain(&[(RecordKind::TreeStarted, b"{\"a\":1}".to_vec())]);
        let packed = pack(&records, usize::MAX).expect("packs");
        let what = || "tree p_1".to_owned();
        let mut cases: Vec<(Vec<u8>, &str)> = vec![
            (Vec::new(), "empty packed log"),
            (vec![2, 1], "unknown version 2"),
            (vec![VERSION, 0], "0 records"),
            (vec![VERSION, 0xff], "malformed record count"),
            (packed[..packed.len() - 1].to_vec(), "truncated body"),
            (packed[..40].to_vec(), "truncated hash"),
            (packed[..20].to_vec(), "packed log: 1 records"),
        ];
        let mut longer = packed.clone();
        longer.push(0);
        cases.push((longer, "1 bytes after its records"));
        let mut kind = packed.clone();
        kind[3] = b'X';
        cases.push((kind, "unknown kind"));
        for (bytes, expected) in cases {
            match unpack(&bytes, &what) {
                Err(StoreError::Corrupt { message, .. }) => {
                    assert!(message.starts_with("tree p_1: "), "{message}");
                    assert!(message.contains(expected), "{message} lacks {expected:?}");
                }
                other => panic!("{bytes:?}: {other:?}"),
            }
        }
    }
}
