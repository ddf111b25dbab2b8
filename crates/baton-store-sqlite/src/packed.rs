//! A new tree's first records, packed into its row.
//!
//! Every commit writes each page it changed whole to the write-ahead log,
//! so what a short run costs on disk is the number of B-trees it touches
//! more than the bytes it records. A root that ends in its first round
//! commits its row and all its records at once; stored as rows of
//! `records`, they would touch that table and its `(tree, seq)` key besides
//! the tree's row and its two index entries. When they are short (every
//! body inline, the whole stored in at most [`limit`] bytes) they are kept
//! instead in the row's `log` column, in the form below, and the run
//! touches three B-trees, not five.
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
//! that is shorter (no checksum: the records' hashes check them).
//! [`COMPACT`] (version 3, written since schema version 7) is what a
//! short run's records take now: LZ4 against [`COMPACT_DICTIONARY`] of a
//! form that leaves out what LZ4 cannot shorten. Hashes are random bytes,
//! so it keeps none: the reader computes each record's chain hash again
//! and checks the last against the first [`CHECK_BYTES`] of the hash it
//! had, which the form keeps (any damage the decoder lets through changes
//! the records and so that hash; the tree's row keeps its whole head
//! besides). Digests and ids are hex text, half of it redundant, so every
//! run of 64 or 32 hex digits in a body is stored as its bytes
//! ([`shrink`]). Kinds are a byte each ([`KINDS`]). The dictionary ends
//! with the tree's own id, which its records name ([`dictionary`]), so a
//! compact log reads only as its own tree's. Only records whose
//! hashes are their chain hashes, as the kernel seals them, are stored
//! compact; others keep their hashes in version 2 or 1. Records the
//! kernel sealed in this process and nobody changed since are known to be
//! such without hashing them again ([`log::is_chain`]); others are hashed
//! again to tell. A `chain3` run's
//! records take about 300 bytes compact, against 530 compressed and 870
//! plain, and its row about 470 against 700: more rows share a page, and
//! the table grows by fewer pages. The dictionaries and the list of kinds
//! are part of their forms: another one would be another version.

use std::borrow::Cow;
use std::sync::Arc;

use baton_run::log::{self, Record};
use baton_run::store::{StoreError, stored_digest, stored_kind};
use baton_run::{Digest, TreeId};

use crate::chunk;

/// The version byte of records stored as they are.
pub(crate) const PLAIN: u8 = 1;

/// The version byte of records stored as their length and an LZ4 block
/// compressed against [`DICTIONARY`].
pub(crate) const COMPRESSED: u8 = 2;

/// The version byte of records stored compact: their length and an LZ4
/// block compressed against [`COMPACT_DICTIONARY`] of the compact form
/// (kinds as codes, hex digits as bytes, one check for all the hashes).
pub(crate) const COMPACT: u8 = 3;

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

/// The preset dictionary of [`COMPACT`] logs: the members of the records a
/// short run writes in the order the kernel writes them, each run of hex
/// digits already turned into its marker (see [`shrink`]), the start last
/// (LZ4 finds the last of equal strings first). A tree's logs are
/// compressed against this and the tree's own id ([`dictionary`]). Never
/// to change: stored logs are read with it.
pub(crate) const COMPACT_DICTIONARY: &[u8] = concat!(
    "{\"kind\":\"effect_settled\",\"process\":\"p_\u{2}\",\"effect\":\"e_\u{2}\",",
    "\"settlement\":{\"status\":\"succeeded\",\"output\":[{\"key\":\"",
    "\",\"process\":\"p_\u{2}\",\"termination\":{\"cause\":\"completion\",\"output\":,\"status\":\"completed\"}}",
    "{\"kind\":\"child_started\",\"parent\":\"p_\u{2}\",\"effect\":\"e_\u{2}\",\"child\":\"p_\u{2}\",\"key\":\"\",\"name\":\"",
    "\",\"program\":\"b3:\u{1}\"",
    "\"transition\":{\"transition\":\"continue\",\"consumed\":0,\"effects\":[{\"effect\":\"start_child\",\"key\":\"",
    "{\"effect\":\"wait_children\",\"keys\":[\"\"],\"boundary\":\"result\",\"condition\":\"all\"}",
    "{\"kind\":\"step_adopted\",\"process\":\"p_\u{2}\",\"step\":0,\"state\":{\"stage\":1,\"value\":",
    "},\"transition\":{\"transition\":\"complete\",\"consumed\":0,\"output\":}}",
    "{\"kind\":\"tree_started\",\"start\":{\"scope\":\"\",\"key\":\"",
    "\",\"root\":\"p_\u{2}\",\"program\":{\"name\":\"\",\"contract\":\"b3:\u{1}\",",
    "\"implementation\":\"b3:\u{1}\",\"configuration\":\"b3:\u{1}\",\"children\":[],",
    "\"digest\":\"b3:\u{1}\"},\"input\":",
    ",\"budget\":{},\"capabilities\":[],\"created\":1,\"labels\":{},\"state\":{\"stage\":0,\"value\":",
)
.as_bytes();

/// The dictionary of `tree`'s [`COMPACT`] log: [`COMPACT_DICTIONARY`], then
/// the tree's id as its records hold it shrunk, which each of them names.
fn dictionary(tree: TreeId) -> Vec<u8> {
    let mut dictionary = Vec::with_capacity(COMPACT_DICTIONARY.len() + 20);
    dictionary.extend_from_slice(COMPACT_DICTIONARY);
    dictionary.extend_from_slice(b"\"p_");
    dictionary.push(NARROW);
    dictionary.extend_from_slice(tree.as_bytes());
    dictionary
}

/// The kinds a [`COMPACT`] log names by their position here, from 1 (0
/// names a kind by its name, for kinds added after this list). Never to
/// reorder: stored logs are read with it.
const KINDS: [&str; 12] = [
    "tree_started",
    "step_adopted",
    "effect_pending",
    "effect_settled",
    "effect_resolved",
    "effect_replayed",
    "signals_admitted",
    "cancel_requested",
    "terminated",
    "child_started",
    "control_delivered",
    "effect_retrying",
];

/// How many bytes of the last record's hash a [`COMPACT`] log keeps to
/// check the records it holds (whose hashes it recomputes).
const CHECK_BYTES: usize = 8;

/// The most bytes a [`COMPRESSED`] log may say its records take: what the
/// largest page size allows ([`limit`] of 64 KiB). A longer length is
/// damage, not a reason to reserve memory.
const MAX_RECORDS_BYTES: usize = 4 * 65_536;

/// The most bytes a packed log takes (stored, compressed or not) in a row
/// of a database of `page_size` bytes a page: four pages. A row longer
/// than about a page keeps its head in its page and the rest in overflow
/// pages of its own, which SQLite fills whole; the row of a tree that
/// ended is not written again (but for its deletion, or a host taking it
/// up by force), so a long one costs its overflow pages once, as rows of
/// `records` would cost theirs, without the `(tree, seq)` key.
pub(crate) fn limit(page_size: u32) -> usize {
    page_size as usize * 4
}

/// `records` (the first of new tree `tree`, from sequence 1, chained)
/// packed in at most `max` bytes, or `None` when a body is not inline, the
/// plain form would take more than twice `max` bytes (a compact form is
/// seldom under half of it, and trying costs time) or what is
/// stored would take more than `max`. Compact when the records' hashes are
/// their chain hashes (as the kernel seals them) and that is shorter, else
/// compressed when that is shorter, else plain.
pub(crate) fn pack(records: &[Record], tree: TreeId, max: usize) -> Option<Vec<u8>> {
    let bound = max.saturating_mul(2).min(MAX_RECORDS_BYTES);
    let mut plain_len = 1 + varint_len(records.len());
    for record in records {
        if record.body.len() > chunk::INLINE_MAX {
            return None;
        }
        let kind = record.kind.as_str().len();
        plain_len +=
            varint_len(kind) + kind + 32 + varint_len(record.body.len()) + record.body.len();
        if plain_len > bound {
            return None;
        }
    }
    let within = |stored: Vec<u8>| (stored.len() <= max).then_some(stored);
    if sealed(records) {
        let form = compact_form(records);
        let block = lz4_flex::block::compress_with_dict(&form, &dictionary(tree));
        let compact = framed(COMPACT, form.len(), &block);
        if compact.len() < plain_len {
            return within(compact);
        }
    }
    let plain = plain_form(records);
    let form = &plain[1..];
    let block = lz4_flex::block::compress_with_dict(form, DICTIONARY);
    let compressed = framed(COMPRESSED, form.len(), &block);
    within(if compressed.len() < plain.len() {
        compressed
    } else {
        plain
    })
}

/// The bytes of an unsigned LEB128 varint of `value`.
fn varint_len(value: usize) -> usize {
    (usize::BITS - value.max(1).leading_zeros()).div_ceil(7) as usize
}

/// Whether `records` are a chain from sequence 1 whose every hash is the
/// chain hash of its record, so that a reader may compute them again
/// instead of reading them. Records the kernel sealed in this process are
/// taken at their seal's word ([`log::is_chain`]); others are hashed again.
fn sealed(records: &[Record]) -> bool {
    !records.is_empty() && log::is_chain(0, Digest::ZERO, records)
}

/// A version byte, the length of the form a block holds, and the block.
fn framed(version: u8, len: usize, block: &[u8]) -> Vec<u8> {
    let mut framed = Vec::with_capacity(block.len() + 4);
    framed.push(version);
    chunk::put_varint(&mut framed, len as u64);
    framed.extend_from_slice(block);
    framed
}

/// The plain form of `records`: the version byte, the number of records,
/// then per record its kind's name, its hash and its body.
fn plain_form(records: &[Record]) -> Vec<u8> {
    let len: usize = records.iter().map(|r| r.body.len() + 48).sum();
    let mut plain = Vec::with_capacity(len + 4);
    plain.push(PLAIN);
    chunk::put_varint(&mut plain, records.len() as u64);
    for record in records {
        let kind = record.kind.as_str();
        chunk::put_varint(&mut plain, kind.len() as u64);
        plain.extend_from_slice(kind.as_bytes());
        plain.extend_from_slice(record.hash.as_bytes());
        chunk::put_varint(&mut plain, record.body.len() as u64);
        plain.extend_from_slice(&record.body);
    }
    plain
}

/// The compact form of sealed `records`: their number, then per record its
/// kind's code (its position in [`KINDS`] from 1, or 0 and its name) and
/// its body shrunk ([`shrink`]), length first, then the first
/// [`CHECK_BYTES`] of the last record's hash.
fn compact_form(records: &[Record]) -> Vec<u8> {
    let len: usize = records.iter().map(|r| r.body.len() + 4).sum();
    let mut form = Vec::with_capacity(len + CHECK_BYTES + 2);
    let mut body = Vec::with_capacity(records.iter().map(|r| r.body.len()).max().unwrap_or(0));
    chunk::put_varint(&mut form, records.len() as u64);
    let mut last = Digest::ZERO;
    for record in records {
        let kind = record.kind.as_str();
        match KINDS.iter().position(|known| *known == kind) {
            Some(at) => form.push(at as u8 + 1),
            None => {
                form.push(0);
                chunk::put_varint(&mut form, kind.len() as u64);
                form.extend_from_slice(kind.as_bytes());
            }
        }
        body.clear();
        shrink(&record.body, &mut body);
        chunk::put_varint(&mut form, body.len() as u64);
        form.extend_from_slice(&body);
        last = record.hash;
    }
    form.extend_from_slice(&last.as_bytes()[..CHECK_BYTES]);
    form
}

/// In a shrunk body: 32 bytes follow that stand for 64 hex digits.
const WIDE: u8 = 1;
/// In a shrunk body: 16 bytes follow that stand for 32 hex digits.
const NARROW: u8 = 2;
/// In a shrunk body: the next byte (one of these three markers) stands
/// for itself.
const ESCAPE: u8 = 3;

/// Appends `text` to `out` with every run of exactly 64 or 32 lowercase
/// hex digits (digests and ids) as [`WIDE`] or [`NARROW`] and the bytes
/// they stand for, half the length; a marker byte in `text` is escaped.
/// [`expand`] undoes it for any bytes.
///
/// It looks at one byte in 32 outside such runs: a run of 32 digits or
/// more that starts in a window of 32 bytes covers the window's last
/// byte, so a window whose last byte is no digit holds the start of none.
fn shrink(text: &[u8], out: &mut Vec<u8>) {
    let is_hex = |byte: u8| HEX_VALUES[usize::from(byte)] != NOT_HEX;
    // `text[..copied]` is in `out`; no run of 32 digits or more starts
    // in `text[copied..window]`, and none reaches back before `window`.
    let mut copied = 0;
    let mut window = 0;
    while window + 32 <= text.len() {
        let last = window + 31;
        if !is_hex(text[last]) {
            window += 32;
            continue;
        }
        let start = window
            + text[window..last]
                .iter()
                .rposition(|byte| !is_hex(*byte))
                .map_or(0, |at| at + 1);
        let end = last
            + text[last..]
                .iter()
                .position(|byte| !is_hex(*byte))
                .unwrap_or(text.len() - last);
        let marker = match end - start {
            64 => Some(WIDE),
            32 => Some(NARROW),
            _ => None,
        };
        if let Some(marker) = marker {
            escaped(&text[copied..start], out);
            out.push(marker);
            let mut bytes = [0u8; 32];
            for (byte, pair) in bytes.iter_mut().zip(text[start..end].chunks_exact(2)) {
                *byte = HEX_VALUES[usize::from(pair[0])] << 4 | HEX_VALUES[usize::from(pair[1])];
            }
            out.extend_from_slice(&bytes[..(end - start) / 2]);
            copied = end;
        }
        window = end;
    }
    escaped(&text[copied..], out);
}

/// In [`HEX_VALUES`]: the byte is no lowercase hex digit.
const NOT_HEX: u8 = 0xff;

/// Each byte's value as a lowercase hex digit, or [`NOT_HEX`]: one load
/// where [`shrink`] asks whether a byte is a digit and what it stands for.
const HEX_VALUES: [u8; 256] = {
    let mut table = [NOT_HEX; 256];
    let mut value = 0;
    while value < 16 {
        let digit = if value < 10 {
            b'0' + value
        } else {
            b'a' + value - 10
        };
        table[digit as usize] = value;
        value += 1;
    }
    table
};

/// Appends `text` to `out`, each marker byte escaped.
fn escaped(text: &[u8], out: &mut Vec<u8>) {
    let marker = |byte: &u8| (WIDE..=ESCAPE).contains(byte);
    // Text (JSON) has none: one pass that can be vectorized, then a copy.
    if !text.iter().fold(false, |any, byte| any | marker(byte)) {
        out.extend_from_slice(text);
        return;
    }
    for byte in text {
        if marker(byte) {
            out.push(ESCAPE);
        }
        out.push(*byte);
    }
}

/// The text [`shrink`] made `shrunk` from; `None` when `shrunk` is no
/// such form (a marker without its bytes, an escape of another byte).
fn expand(shrunk: &[u8]) -> Option<Vec<u8>> {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = Vec::with_capacity(shrunk.len() + shrunk.len() / 2);
    let mut at = 0;
    while let Some(&byte) = shrunk.get(at) {
        at += 1;
        match byte {
            WIDE | NARROW => {
                let len = if byte == WIDE { 32 } else { 16 };
                let bytes = shrunk.get(at..at + len)?;
                at += len;
                for byte in bytes {
                    out.push(DIGITS[usize::from(byte >> 4)]);
                    out.push(DIGITS[usize::from(byte & 15)]);
                }
            }
            ESCAPE => {
                let escaped = *shrunk
                    .get(at)
                    .filter(|next| (WIDE..=ESCAPE).contains(*next))?;
                out.push(escaped);
                at += 1;
            }
            _ => out.push(byte),
        }
    }
    Some(out)
}

/// The records `bytes` holds, the first of tree `tree`, from sequence 1; a
/// malformed form is `Corrupt`, named by `what`.
pub(crate) fn unpack(
    bytes: &[u8],
    tree: TreeId,
    what: &dyn Fn() -> String,
) -> Result<Vec<Record>, StoreError> {
    let malformed = |detail: &str| StoreError::corrupt(format!("{}: {detail}", what()));
    match form(bytes, tree, &malformed)? {
        (COMPACT, form) => read_compact(&form, &malformed),
        (_, form) => read_records(&form, &malformed),
    }
}

/// Tree `tree`'s packed log in the plain form (its version byte first): a
/// compressed one decompressed, a compact one written out again, a plain
/// one as it is. For tools and tests that look into a store file;
/// `Corrupt` when `bytes` is no packed log of that tree.
pub fn plain(bytes: &[u8], tree: TreeId) -> Result<Vec<u8>, StoreError> {
    let malformed = |detail: &str| StoreError::corrupt(format!("a packed log: {detail}"));
    match form(bytes, tree, &malformed)? {
        (COMPACT, form) => Ok(plain_form(&read_compact(&form, &malformed)?)),
        (_, form) => {
            let mut plain = Vec::with_capacity(form.len() + 1);
            plain.push(PLAIN);
            plain.extend_from_slice(&form);
            Ok(plain)
        }
    }
}

/// The version of a packed log and its records' form: after its version
/// byte, and decompressed when compressed.
fn form<'a>(
    bytes: &'a [u8],
    tree: TreeId,
    malformed: &dyn Fn(&str) -> StoreError,
) -> Result<(u8, Cow<'a, [u8]>), StoreError> {
    let (&version, rest) = bytes
        .split_first()
        .ok_or_else(|| malformed("empty packed log"))?;
    let compact;
    let dictionary = match version {
        PLAIN => return Ok((PLAIN, Cow::Borrowed(rest))),
        COMPRESSED => DICTIONARY,
        COMPACT => {
            compact = dictionary(tree);
            &compact
        }
        _ => {
            return Err(malformed(&format!(
                "packed log of unknown version {version}"
            )));
        }
    };
    let mut block = rest;
    let len = chunk::read_varint(&mut block)
        .and_then(|len| usize::try_from(len).ok())
        .filter(|len| (1..=MAX_RECORDS_BYTES).contains(len))
        .ok_or_else(|| malformed("compressed packed log: malformed length"))?;
    let form = lz4_flex::block::decompress_with_dict(block, len, dictionary)
        .map_err(|error| malformed(&format!("compressed packed log: {error}")))?;
    if form.len() != len {
        return Err(malformed(&format!(
            "compressed packed log: {} bytes where its length says {len}",
            form.len()
        )));
    }
    Ok((version, Cow::Owned(form)))
}

/// The records of a compact form ([`compact_form`]), their hashes computed
/// and the last one checked.
fn read_compact(
    form: &[u8],
    malformed: &dyn Fn(&str) -> StoreError,
) -> Result<Vec<Record>, StoreError> {
    let mut reader = Reader { bytes: form };
    // Each record takes at least 2 bytes.
    let count = reader.count(2, malformed)?;
    let mut records: Vec<Record> = Vec::with_capacity(count as usize);
    let mut prev = Digest::ZERO;
    for seq in 1..=count {
        let record = |detail: &str| malformed(&format!("packed record {seq}: {detail}"));
        let code = reader.take(1).ok_or_else(|| record("malformed kind"))?[0];
        let name = match code {
            0 => String::from_utf8_lossy(reader.counted().ok_or_else(|| record("malformed kind"))?),
            code => Cow::Borrowed(
                *KINDS
                    .get(usize::from(code) - 1)
                    .ok_or_else(|| record(&format!("unknown kind code {code}")))?,
            ),
        };
        let kind = stored_kind(&name).map_err(|_| record(&format!("unknown kind {name:?}")))?;
        let shrunk = reader.counted().ok_or_else(|| record("truncated body"))?;
        let body = expand(shrunk).ok_or_else(|| record("malformed body"))?;
        let record = Record::from_parts(seq, prev, kind, Arc::from(body));
        prev = record.hash;
        records.push(record);
    }
    let check = reader
        .take(CHECK_BYTES)
        .ok_or_else(|| malformed("packed log: truncated check"))?;
    reader.end(malformed)?;
    if check != &prev.as_bytes()[..CHECK_BYTES] {
        return Err(malformed(
            "packed log: the records do not hash to the log's check",
        ));
    }
    Ok(records)
}

/// The records of a packed log's form (after its version, and after its
/// decompression).
fn read_records(
    form: &[u8],
    malformed: &dyn Fn(&str) -> StoreError,
) -> Result<Vec<Record>, StoreError> {
    let mut reader = Reader { bytes: form };
    // Each record takes at least 35 bytes.
    let count = reader.count(35, malformed)?;
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
        records.push(Record::stored(seq, prev, hash, kind, Arc::from(body)));
        prev = hash;
    }
    reader.end(malformed)?;
    Ok(records)
}

/// Reads a packed log from the front.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// The number of records, refused when zero or more than the bytes
    /// left hold records of at least `least` bytes (damage, not a reason
    /// to reserve memory).
    fn count(
        &mut self,
        least: usize,
        malformed: &dyn Fn(&str) -> StoreError,
    ) -> Result<u64, StoreError> {
        let count = self
            .varint()
            .ok_or_else(|| malformed("packed log: malformed record count"))?;
        if count == 0 || count > (self.bytes.len() / least) as u64 {
            return Err(malformed(&format!("packed log: {count} records")));
        }
        Ok(count)
    }

    /// `Ok` when every byte was read.
    fn end(&self, malformed: &dyn Fn(&str) -> StoreError) -> Result<(), StoreError> {
        match self.bytes.len() {
            0 => Ok(()),
            left => Err(malformed(&format!(
                "packed log: {left} bytes after its records"
            ))),
        }
    }

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
    use baton_run::log::{RecordKind, chain_hash};
    use proptest::prelude::*;

    use super::*;

    /// The tree the tests' logs are packed for.
    const TREE: &str = "p_ff9095ed8d224f03e291a7de2d0c8442";

    fn tree() -> TreeId {
        TREE.parse().expect("a tree id")
    }

    fn chain(bodies: &[(RecordKind, Vec<u8>)]) -> Vec<Record> {
        let mut prev = Digest::ZERO;
        bodies
            .iter()
            .enumerate()
            .map(|(at, (kind, body))| {
                let hash = Digest::from_bytes(chunk::digest(body));
                let record =
                    Record::stored(at as u64 + 1, prev, hash, *kind, Arc::from(body.as_slice()));
                prev = hash;
                record
            })
            .collect()
    }

    /// [`shrink`] as its contract says, one byte at a time.
    fn shrunk_byte_by_byte(text: &[u8]) -> Vec<u8> {
        let is_hex = |byte: &u8| byte.is_ascii_digit() || (b'a'..=b'f').contains(byte);
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(byte) = text.get(at) {
            if is_hex(byte) {
                let run = text[at..].iter().take_while(|byte| is_hex(byte)).count();
                let digits = &text[at..at + run];
                match run {
                    64 => out.push(WIDE),
                    32 => out.push(NARROW),
                    _ => out.extend_from_slice(digits),
                }
                if run == 64 || run == 32 {
                    let digits = std::str::from_utf8(digits).expect("digits");
                    out.extend(
                        (0..run)
                            .step_by(2)
                            .map(|at| u8::from_str_radix(&digits[at..at + 2], 16).expect("hex")),
                    );
                }
                at += run;
            } else {
                if (WIDE..=ESCAPE).contains(byte) {
                    out.push(ESCAPE);
                }
                out.push(*byte);
                at += 1;
            }
        }
        out
    }

    /// Records as the kernel seals them: each hash the chain hash.
    fn sealed(bodies: &[(RecordKind, Vec<u8>)]) -> Vec<Record> {
        let mut prev = Digest::ZERO;
        bodies
            .iter()
            .enumerate()
            .map(|(at, (kind, body))| {
                let record =
                    Record::from_parts(at as u64 + 1, prev, *kind, Arc::from(body.as_slice()));
                prev = record.hash;
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
            match unpack(&bytes, tree(), &|| "tree p_1".to_owned()) {
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
            let packed = pack(&records, tree(), usize::MAX).expect("inline bodies pack");
            prop_assert!([PLAIN, COMPRESSED].contains(&packed[0]));
            let read = unpack(&packed, tree(), &|| "tree t".into()).expect("reads back");
            prop_assert_eq!(read, records);
        }

        /// A pack is refused, not cut, past its limit: it holds all the
        /// records or none.
        #[test]
        fn a_pack_over_its_limit_is_refused(
            bodies in proptest::collection::vec((kinds(), prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..300),
                "(p_[0-9a-f]{32}|b3:[0-9a-f]{64}|[a-z:,]{0,9}){0,12}".prop_map(String::into_bytes),
            ]), 1..8),
            max in 0usize..2_000,
            seal in any::<bool>(),
        ) {
            let records = if seal { sealed(&bodies) } else { chain(&bodies) };
            let whole = pack(&records, tree(), usize::MAX).expect("inline bodies pack");
            let plain_len = plain(&whole, tree()).expect("a packed log").len();
            prop_assert!(whole.len() <= plain_len, "never longer than the plain form");
            match pack(&records, tree(), max) {
                Some(packed) => {
                    prop_assert!(packed.len() <= max && plain_len <= 2 * max);
                    prop_assert_eq!(packed, whole);
                }
                None => prop_assert!(whole.len() > max || plain_len > 2 * max),
            }
        }

        /// Shrinking is undone for any bytes: text with digests and ids,
        /// marker bytes, runs of hex digits of every length.
        #[test]
        fn shrunk_text_expands_to_itself(
            parts in proptest::collection::vec(prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..40),
                "[0-9a-f]{0,70}".prop_map(String::into_bytes),
                "[0-9a-f]{32}|[0-9a-f]{64}".prop_map(String::into_bytes),
                proptest::collection::vec(1u8..=3, 0..4),
            ], 0..8),
        ) {
            let text = parts.concat();
            let mut shrunk = Vec::new();
            shrink(&text, &mut shrunk);
            prop_assert!(shrunk.len() <= text.len() * 2);
            prop_assert_eq!(&shrunk, &shrunk_byte_by_byte(&text), "every such run, and only those");
            prop_assert_eq!(expand(&shrunk), Some(text));
        }

        /// Sealed records read back as they were, with the hashes the
        /// reader computes again.
        #[test]
        fn sealed_records_read_back_as_they_were(
            bodies in proptest::collection::vec((kinds(), prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..300),
                "(p_[0-9a-f]{32}|b3:[0-9a-f]{64}|[a-z\\{\\}:\",\\x01]{0,20}){0,12}".prop_map(String::into_bytes),
            ]), 1..8),
        ) {
            let records = sealed(&bodies);
            let packed = pack(&records, tree(), usize::MAX).expect("inline bodies pack");
            prop_assert!([PLAIN, COMPRESSED, COMPACT].contains(&packed[0]));
            prop_assert!(packed.len() <= plain(&packed, tree()).expect("a packed log").len());
            prop_assert_eq!(unpack(&packed, tree(), &|| "tree t".into()), Ok(records));
        }
    }

    /// A chain whose hashes are not its chain hashes keeps them: it is
    /// never stored compact, which would compute others.
    #[test]
    fn records_with_other_hashes_are_not_stored_compact() {
        let mut records = sealed_short_run();
        assert_eq!(
            pack(&records, tree(), usize::MAX).expect("packs")[0],
            COMPACT
        );
        let mut hash = *records[1].hash.as_bytes();
        hash[31] ^= 1;
        records[1].hash = Digest::from_bytes(hash);
        let packed = pack(&records, tree(), usize::MAX).expect("packs");
        assert_eq!(packed[0], COMPRESSED);
        assert_eq!(unpack(&packed, tree(), &|| "tree t".into()), Ok(records));
        assert_eq!(
            pack(&short_run(), tree(), usize::MAX).expect("packs")[0],
            COMPRESSED
        );
        // Sealed records changed after sealing, still linked as a store
        // takes them: a body swapped under its hash, a last record's hash
        // made that of another sequence number.
        let mut swapped = sealed_short_run();
        swapped[0].body = Arc::from(&b"{\"other\":1}"[..]);
        let mut renumbered = sealed_short_run();
        let last = renumbered.last_mut().expect("records");
        last.hash = chain_hash(last.seq + 1, last.prev, &last.body);
        for records in [swapped, renumbered] {
            let packed = pack(&records, tree(), usize::MAX).expect("packs");
            assert_ne!(packed[0], COMPACT);
            assert_eq!(unpack(&packed, tree(), &|| "tree t".into()), Ok(records));
        }
    }

    #[test]
    fn a_body_stored_in_pieces_is_not_packed() {
        let records = chain(&[
            (RecordKind::TreeStarted, b"{}".to_vec()),
            (RecordKind::StepAdopted, vec![b' '; chunk::INLINE_MAX + 1]),
        ]);
        assert_eq!(pack(&records, tree(), usize::MAX), None);
    }

    #[test]
    fn damage_is_corrupt_and_named() {
        let records = chain(&[(RecordKind::TreeStarted, b"{\"a\":1}".to_vec())]);
        let packed = plain(&pack(&records, tree(), usize::MAX).expect("packs"), tree())
            .expect("a packed log");
        let mut cases: Vec<(Vec<u8>, &str)> = vec![
            (Vec::new(), "empty packed log"),
            (vec![4, 1], "unknown version 4"),
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
        let packed = pack(&records, tree(), usize::MAX).expect("packs");
        assert_eq!(packed[0], COMPRESSED);
        let plain: usize = records.iter().map(|r| r.body.len() + 32 + 14).sum();
        assert!(
            packed.len() * 10 < plain * 7,
            "{} bytes compressed of about {plain}",
            packed.len()
        );
        assert_eq!(unpack(&packed, tree(), &|| "tree t".into()), Ok(records));
    }

    /// Schema version 5 stored every packed log plain; such logs read as
    /// they always did.
    #[test]
    fn a_plain_log_reads_as_the_same_records() {
        let packed = pack(&short_run(), tree(), usize::MAX).expect("packs");
        let plain = plain(&packed, tree()).expect("a packed log");
        assert_eq!(plain[0], PLAIN);
        assert!(plain.len() > packed.len());
        assert_eq!(unpack(&plain, tree(), &|| "tree t".into()), Ok(short_run()));
        assert_eq!(super::plain(&plain, tree()), Ok(plain.clone()));
    }

    /// A compressed log written by this version of the form, kept as bytes:
    /// it must read the same in every later build (the dictionary and the
    /// block format are the form).
    #[test]
    fn a_stored_compressed_log_reads_in_every_build() {
        let stored = include_bytes!("packed_v2.bin");
        assert_eq!(stored[0], COMPRESSED);
        assert_eq!(unpack(stored, tree(), &|| "tree t".into()), Ok(short_run()));
    }

    #[test]
    fn damage_to_a_compressed_log_is_corrupt_and_named() {
        let packed = pack(&short_run(), tree(), usize::MAX).expect("packs");
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
            let _ = unpack(&flipped, tree(), &what);
        }
    }

    /// [`short_run`] sealed as the kernel seals records.
    fn sealed_short_run() -> Vec<Record> {
        let bodies: Vec<(RecordKind, Vec<u8>)> = short_run()
            .iter()
            .map(|record| (record.kind, record.body.to_vec()))
            .collect();
        sealed(&bodies)
    }

    #[test]
    fn a_sealed_short_run_is_stored_compact_and_read_back() {
        let records = sealed_short_run();
        let compact = pack(&records, tree(), usize::MAX).expect("packs");
        assert_eq!(compact[0], COMPACT);
        let plain = plain_form(&records);
        let compressed = pack(&short_run(), tree(), usize::MAX).expect("packs");
        assert_eq!(compressed[0], COMPRESSED);
        // Digests and ids as bytes, one check for two hashes: well under
        // the compressed form (about 540 bytes here) and half the plain.
        assert!(
            compact.len() * 10 < compressed.len() * 7 && compact.len() * 2 < plain.len(),
            "{} bytes compact, {} compressed, {} plain",
            compact.len(),
            compressed.len(),
            plain.len()
        );
        assert_eq!(
            unpack(&compact, tree(), &|| "tree t".into()),
            Ok(records.clone())
        );
        assert_eq!(super::plain(&compact, tree()), Ok(plain));
    }

    /// A compact log written by this version of the form, kept as bytes:
    /// it must read the same in every later build (the dictionary, the
    /// kinds' codes, the shrinking and the block format are the form). The
    /// file is `pack(&sealed_short_run(), tree(), usize::MAX)` as the form's
    /// first build wrote it.
    #[test]
    fn a_stored_compact_log_reads_in_every_build() {
        let stored = include_bytes!("packed_v3.bin");
        assert_eq!(stored[0], COMPACT);
        assert_eq!(
            unpack(stored, tree(), &|| "tree t".into()),
            Ok(sealed_short_run())
        );
    }

    /// A kind this form's list does not name is stored by its name.
    #[test]
    fn a_kind_without_a_code_is_stored_by_name() {
        let records = sealed(&[(RecordKind::TreeStarted, b"{}".to_vec())]);
        let mut form = compact_form(&records);
        assert_eq!(form[1], 1, "tree_started is code 1");
        form.splice(1..2, [0, 12].into_iter().chain(*b"tree_started"));
        let block = lz4_flex::block::compress_with_dict(&form, &dictionary(tree()));
        let stored = framed(COMPACT, form.len(), &block);
        assert_eq!(unpack(&stored, tree(), &|| "tree t".into()), Ok(records));
    }

    #[test]
    fn damage_to_a_compact_log_is_corrupt_and_named() {
        let records = sealed_short_run();
        let form = compact_form(&records);
        let stored = |form: &[u8]| {
            let block = lz4_flex::block::compress_with_dict(form, &dictionary(tree()));
            framed(COMPACT, form.len(), &block)
        };
        let edited = |at: usize, byte: u8| {
            let mut form = form.clone();
            form[at] = byte;
            stored(&form)
        };
        let last = form.len() - 1;
        let body_at = 3; // count, code, one length byte of the first body
        assert_eq!(&form[..2], &[2, 1]);
        let mut cases: Vec<(Vec<u8>, &str)> = vec![
            (
                edited(last, form[last] ^ 1),
                "do not hash to the log's check",
            ),
            (stored(&form[..last]), "packed log: truncated check"),
            (
                stored(&form[..form.len() - CHECK_BYTES - 1]),
                "packed record 2: truncated body",
            ),
            (edited(1, 13), "unknown kind code 13"),
            (edited(0, 0), "0 records"),
            (edited(body_at + 1, b'x'), "do not hash to the log's check"),
        ];
        let mut longer = form.clone();
        longer.push(0);
        cases.push((stored(&longer), "1 bytes after its records"));
        // A marker cut short, and an escape of a byte that is no marker.
        for shrunk in [vec![WIDE, 1, 2], vec![ESCAPE, b'a']] {
            let mut bad = vec![1, 2];
            chunk::put_varint(&mut bad, shrunk.len() as u64);
            bad.extend_from_slice(&shrunk);
            bad.extend_from_slice(&[0; CHECK_BYTES]);
            cases.push((stored(&bad), "packed record 1: malformed body"));
        }
        assert_corrupt(cases);
        // Every byte of the stored log flipped in turn: damage, or (a bit
        // the decoder does not read) the same records, never others.
        let compact = pack(&records, tree(), usize::MAX).expect("packs");
        // The log is the tree's own: read for another tree (its id is in
        // the dictionary), it is damage, not another tree's records.
        let other: TreeId = "p_0123456789abcdef0123456789abcdef".parse().expect("an id");
        assert!(matches!(
            unpack(&compact, other, &|| "tree p_1".into()),
            Err(StoreError::Corrupt { .. })
        ));
        for at in 1..compact.len() {
            let mut flipped = compact.clone();
            flipped[at] ^= 0x5a;
            match unpack(&flipped, tree(), &|| "tree p_1".into()) {
                Ok(read) => assert_eq!(read, records, "byte {at}"),
                Err(StoreError::Corrupt { message, .. }) => {
                    assert!(message.starts_with("tree p_1: "), "{message}")
                }
                Err(other) => panic!("{other:?}"),
            }
        }
    }
}
