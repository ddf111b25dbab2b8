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
//! The form: a version byte, then the records. The records are the number
//! of records, then per record its kind's name, its hash and its body,
//! each length first (unsigned LEB128 varints, as chunk manifests).
//! Sequences and `prev` hashes are not stored: `Store::create_tree` takes
//! records from sequence 1 after the zero digest, each following the one
//! before (`CreateTree::check`), so they are read back from the order.
//! [`PLAIN`] (version 1, the only one of schema version 5) stores the
//! records as they are; [`COMPRESSED`] (version 2, written since schema
//! version 6) stores their length and then the records as an LZ4 block
//! compressed against [`DICTIONARY`], the text records share, whenever
//! that is shorter (no checksum: the records' hashes check them): a short
//! run's records shrink to between a third and two thirds, so fewer rows
//! spill into overflow pages and more share a page. The dictionary is
//! part of the form: another one would be another version.

use std::borrow::Cow;
use std::sync::Arc;

use baton_run::Digest;
use baton_run::log::Record;
use baton_run::store::{StoreError, stored_digest, stored_kind};

use crate::chunk;

/// The version byte of records stored as they are.
pub(crate) const PLAIN: u8 = 1;

/// The version byte of records stored as their length and an LZ4 block
/// compressed against [`DICTIONARY`].
pub(crate) const COMPRESSED: u8 = 2;

/// The preset dictionary of [`COMPRESSED`] logs: the kinds' names and the
/// members of the records a short run writes (its start, its steps, its
/// children's starts and a wait's settlement), so that even a run of two
/// records finds its repeats. Never to change: stored logs are read with
/// it.
pub(crate) const DICTIONARY: &[u8] = concat!(
    "tree_startedstep_adoptedeffect_pendingeffect_settledeffect_resolved",
    "effect_replayedsignals_admittedcancel_requestedterminatedchild_started",
    "control_deliveredeffect_retrying",
    r#"{"kind":"tree_started","start":{"scope":"","key":""},"root":"p_"#,
    r#"","program":{"name":"","contract":"b3:","implementation":"b3:"#,
    r#"","configuration":"b3:","children":["b3:"],"digest":"b3:"#,
    r#""},"input":,"budget":{},"capabilities":[],"created":,"labels":{"#,
    r#"},"state":{"#,
    r#"{"kind":"step_adopted","process":"p_","step":0,"state":{"stage":1,"value":"#,
    r#"},"transition":{"transition":"complete","consumed":0,"output":}}"#,
    r#"{"kind":"child_started","parent":"p_","effect":"e_","child":"p_","key":"","name":""#,
    r#","program":"b3:"#,
    r#""transition":{"transition":"continue","consumed":0,"effects":[{"effect":"start_child","key":""#,
    r#"{"effect":"wait_children","keys":[""],"boundary":"result","condition":"all"}"#,
    r#"{"kind":"effect_settled","process":"p_","effect":"e_","settlement":{"status":"succeeded","output":[{"key":""#,
    r#"","process":"p_","termination":{"cause":"completion","output":,"status":"completed"}}"#,
)
.as_bytes();

/// The most bytes a [`COMPRESSED`] log may say its records take: what the
/// largest page size allows ([`limit`] of 64 KiB). A longer length is
/// damage, not a reason to reserve memory.
const MAX_RECORDS_BYTES: usize = 4 * 65_536;

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
/// `None` when a body is not inline or the plain form would take more than
/// `max` bytes. Compressed when that is shorter.
pub(crate) fn pack(records: &[Record], max: usize) -> Option<Vec<u8>> {
    let mut plain = Vec::with_capacity(max.min(1024));
    plain.push(PLAIN);
    chunk::put_varint(&mut plain, records.len() as u64);
    for record in records {
        if record.body.len() > chunk::INLINE_MAX {
            return None;
        }
        let kind = record.kind.as_str();
        chunk::put_varint(&mut plain, kind.len() as u64);
        plain.extend_from_slice(kind.as_bytes());
        plain.extend_from_slice(record.hash.as_bytes());
        chunk::put_varint(&mut plain, record.body.len() as u64);
        plain.extend_from_slice(&record.body);
        if plain.len() > max {
            return None;
        }
    }
    let form = &plain[1..];
    let block = lz4_flex::block::compress_with_dict(form, DICTIONARY);
    let mut compressed = Vec::with_capacity(block.len() + 4);
    compressed.push(COMPRESSED);
    chunk::put_varint(&mut compressed, form.len() as u64);
    compressed.extend_from_slice(&block);
    Some(if compressed.len() < plain.len() {
        compressed
    } else {
        plain
    })
}

/// The records `bytes` holds, from sequence 1; a malformed form is
/// `Corrupt`, named by `what`.
pub(crate) fn unpack(bytes: &[u8], what: &dyn Fn() -> String) -> Result<Vec<Record>, StoreError> {
    let malformed = |detail: &str| StoreError::corrupt(format!("{}: {detail}", what()));
    read_records(&form(bytes, &malformed)?, &malformed)
}

/// A packed log in the plain form (its version byte first): a compressed
/// one decompressed, a plain one as it is. For tools and tests that look
/// into a store file; `Corrupt` when `bytes` is no packed log.
pub fn plain(bytes: &[u8]) -> Result<Vec<u8>, StoreError> {
    let malformed = |detail: &str| StoreError::corrupt(format!("a packed log: {detail}"));
    let form = form(bytes, &malformed)?;
    let mut plain = Vec::with_capacity(form.len() + 1);
    plain.push(PLAIN);
    plain.extend_from_slice(&form);
    Ok(plain)
}

/// The records' form of a packed log: after its version byte, and
/// decompressed when compressed.
fn form<'a>(
    bytes: &'a [u8],
    malformed: &dyn Fn(&str) -> StoreError,
) -> Result<Cow<'a, [u8]>, StoreError> {
    let (&version, rest) = bytes
        .split_first()
        .ok_or_else(|| malformed("empty packed log"))?;
    match version {
        PLAIN => Ok(Cow::Borrowed(rest)),
        COMPRESSED => {
            let mut block = rest;
            let len = chunk::read_varint(&mut block)
                .and_then(|len| usize::try_from(len).ok())
                .filter(|len| (1..=MAX_RECORDS_BYTES).contains(len))
                .ok_or_else(|| malformed("compressed packed log: malformed length"))?;
            let form = lz4_flex::block::decompress_with_dict(block, len, DICTIONARY)
                .map_err(|error| malformed(&format!("compressed packed log: {error}")))?;
            if form.len() != len {
                return Err(malformed(&format!(
                    "compressed packed log: {} bytes where its length says {len}",
                    form.len()
                )));
            }
            Ok(Cow::Owned(form))
        }
        _ => Err(malformed(&format!(
            "packed log of unknown version {version}"
        ))),
    }
}

/// The records of a packed log's form (after its version, and after its
/// decompression).
fn read_records(
    form: &[u8],
    malformed: &dyn Fn(&str) -> StoreError,
) -> Result<Vec<Record>, StoreError> {
    let mut reader = Reader { bytes: form };
    let count = reader
        .varint()
        .ok_or_else(|| malformed("packed log: malformed record count"))?;
    // Each record takes at least 35 bytes; a count past that is damage,
    // not a reason to reserve memory.
    if count == 0 || count > (form.len() / 35) as u64 {
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

    /// Each damaged log is `Corrupt`, named after its tree, with `expected`
    /// in its message.
    fn assert_corrupt(cases: Vec<(Vec<u8>, &str)>) {
        for (bytes, expected) in cases {
            match unpack(&bytes, &|| "tree p_1".to_owned()) {
                Err(StoreError::Corrupt { message, .. }) => {
                    assert!(message.starts_with("tree p_1: "), "{message}");
                    assert!(message.contains(expected), "{message} lacks {expected:?}");
                }
                other => panic!("{bytes:?}: {other:?}"),
            }
        }
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
            prop_assert!([PLAIN, COMPRESSED].contains(&packed[0]));
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
            let plain_len = plain(&whole).expect("a packed log").len();
            prop_assert!(whole.len() <= plain_len, "never longer than the plain form");
            match pack(&records, max) {
                Some(packed) => {
                    prop_assert!(plain_len <= max);
                    prop_assert_eq!(packed, whole);
                }
                None => prop_assert!(plain_len > max),
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
        let packed = plain(&pack(&records, usize::MAX).expect("packs")).expect("a packed log");
        let mut cases: Vec<(Vec<u8>, &str)> = vec![
            (Vec::new(), "empty packed log"),
            (vec![3, 1], "unknown version 3"),
            (vec![PLAIN, 0], "0 records"),
            (vec![PLAIN, 0xff], "malformed record count"),
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
        assert_corrupt(cases);
    }

    /// The records of a short run as the kernel writes them: its start and
    /// the step that completes it.
    fn short_run() -> Vec<Record> {
        chain(&[
            (
                RecordKind::TreeStarted,
                concat!(
                    r#"{"kind":"tree_started","start":{"scope":"bench","key":"chain3-0-7"},"#,
                    r#""root":"p_ff9095ed8d224f03e291a7de2d0c8442","program":{"name":"bench.chain3","#,
                    r#""contract":"b3:ddf41f1e25ba0ea5aca91e43b6ba570bdf5a60d2aa49cc9069986abf7baa11d7","#,
                    r#""implementation":"b3:842d1a2dfd594bb5995afa02f12ce92b77d4ecb622ec855e34de8ccbee4a2d5b","#,
                    r#""configuration":"b3:d2647accb76312a5e2b4c1d0f9e8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0","#,
                    r#""children":[],"digest":"b3:0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9"},"#,
                    r#""input":21,"budget":{},"capabilities":[],"created":1796422398361,"state":{"stage":0,"value":21}}"#,
                )
                .as_bytes()
                .to_vec(),
            ),
            (
                RecordKind::StepAdopted,
                concat!(
                    r#"{"kind":"step_adopted","process":"p_ff9095ed8d224f03e291a7de2d0c8442","step":0,"#,
                    r#""state":{"stage":3,"value":168},"transition":{"transition":"complete","consumed":0,"output":168}}"#,
                )
                .as_bytes()
                .to_vec(),
            ),
        ])
    }

    #[test]
    fn a_short_runs_records_are_stored_compressed_and_read_back() {
        let records = short_run();
        let packed = pack(&records, usize::MAX).expect("packs");
        assert_eq!(packed[0], COMPRESSED);
        let plain: usize = records.iter().map(|r| r.body.len() + 32 + 14).sum();
        assert!(
            packed.len() * 10 < plain * 7,
            "{} bytes compressed of about {plain}",
            packed.len()
        );
        assert_eq!(unpack(&packed, &|| "tree t".into()), Ok(records));
    }

    /// Schema version 5 stored every packed log plain; such logs read as
    /// they always did.
    #[test]
    fn a_plain_log_reads_as_the_same_records() {
        let packed = pack(&short_run(), usize::MAX).expect("packs");
        let plain = plain(&packed).expect("a packed log");
        assert_eq!(plain[0], PLAIN);
        assert!(plain.len() > packed.len());
        assert_eq!(unpack(&plain, &|| "tree t".into()), Ok(short_run()));
        assert_eq!(super::plain(&plain), Ok(plain.clone()));
    }

    /// A compressed log written by this version of the form, kept as bytes:
    /// it must read the same in every later build (the dictionary and the
    /// block format are the form).
    #[test]
    fn a_stored_compressed_log_reads_in_every_build() {
        let stored = include_bytes!("packed_v2.bin");
        assert_eq!(stored[0], COMPRESSED);
        assert_eq!(unpack(stored, &|| "tree t".into()), Ok(short_run()));
    }

    #[test]
    fn damage_to_a_compressed_log_is_corrupt_and_named() {
        let packed = pack(&short_run(), usize::MAX).expect("packs");
        assert_eq!(packed[0], COMPRESSED);
        let what = || "tree p_1".to_owned();
        let mut block = &packed[1..];
        let len = chunk::read_varint(&mut block).expect("a length");
        let mut cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![COMPRESSED], "malformed length"),
            (vec![COMPRESSED, 0], "malformed length"),
            // 2^20 bytes: past what any page size packs.
            (vec![COMPRESSED, 0x80, 0x80, 0x40, 1], "malformed length"),
            (
                packed[..packed.len() - 9].to_vec(),
                "compressed packed log: ",
            ),
        ];
        // A length one more than the records take.
        let mut longer = vec![COMPRESSED];
        chunk::put_varint(&mut longer, len + 1);
        longer.extend_from_slice(block);
        cases.push((longer, "where its length says"));
        // A length one less.
        let mut shorter = vec![COMPRESSED];
        chunk::put_varint(&mut shorter, len - 1);
        shorter.extend_from_slice(block);
        cases.push((shorter, "compressed packed log: "));
        assert_corrupt(cases);
        // Every byte flipped in turn: read as damage or as records, never
        // a panic (a flipped literal reads as other records, which the
        // chain's hashes then refuse further up).
        for at in 1..packed.len() {
            let mut flipped = packed.clone();
            flipped[at] ^= 0x5a;
            let _ = unpack(&flipped, &what);
        }
    }
}
