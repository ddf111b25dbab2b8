//! Content-defined chunking: how large record bodies and snapshot states are
//! split into pieces that are stored once per tree by digest.
//!
//! A record of a step carries the process's whole execution state, so a
//! 250 KB state that changes a few bytes per step would cost 250 KB per step
//! if bodies were stored whole. Instead a body longer than [`INLINE_MAX`] is
//! cut where a rolling gear hash over the last 64 bytes hits a pattern (so
//! cut points depend on content, not on offsets, and an edit only moves the
//! cuts next to it), each piece is stored once per tree under its blake3
//! digest, and the record keeps a manifest of piece digests. Reassembly
//! concatenates the pieces in manifest order, so the bytes read back are
//! exactly the bytes that were hashed into the log chain.
//!
//! The cutting rule is the kernel's (`baton_run::store::split_pieces`),
//! shared with `baton-store-sqlite`; the manifest differs: it lists piece
//! digests, which are the pieces' keys here.

/// Bodies up to this many bytes are stored inline in their row.
pub(crate) const INLINE_MAX: usize = 4096;

/// The blake3 derive-key context of piece digests.
const CONTEXT: &str = "baton-store-postgres 2026-12-01 chunk v1";

/// The digest a piece is stored under.
pub(crate) fn digest(piece: &[u8]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new_derive_key(CONTEXT);
    hasher.update(piece);
    *hasher.finalize().as_bytes()
}

/// The blake3 derive-key context of snapshot state digests.
const STATE_CONTEXT: &str = "baton-store-postgres 2026-12-01 snapshot state v1";

/// The digest of a whole snapshot state, checked when it is read back
/// (records are covered by the log chain; snapshot states are not).
pub(crate) fn state_digest(state: &[u8]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new_derive_key(STATE_CONTEXT);
    hasher.update(state);
    *hasher.finalize().as_bytes()
}

/// The writer's memory of each recently written tree's last few cuts
/// (`baton_run::store::CUTS_PER_TREE`), under the fencing token they were
/// written with and the tree's row: the next body of the tree, appended
/// under the same token to the same row, reuses the pieces it shares with
/// any of them by comparison instead of cutting, digesting and
/// sending them again (`baton_run::store::split_after`). Only the holder of
/// a token can append to its tree, so nobody else can have changed the
/// tree's pieces while the token is current; the writer forgets a tree
/// before each transaction that releases it, and every tree before a
/// prune, whatever their outcome, and takes a tree's cuts out before each
/// transaction that snapshots it (a compaction deletes pieces): they serve
/// the state of the tree's first snapshot in that transaction only, and the
/// snapshot's own cut is kept if it commits.
pub(crate) type Cuts = baton_run::store::LastCuts<baton_run::TreeId, CutTag, [u8; DIGEST_LEN]>;

/// What a remembered cut was written under: the lease's fencing token and
/// the tree's row key (a tree pruned and started again has a new row, whose
/// tokens could repeat if the token sequence was ever reset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CutTag {
    pub(crate) token: u64,
    pub(crate) row: i64,
}

/// A memory of at most 1,024 trees' last cuts holding at most 32 MiB: their
/// bodies (shared with the records the engine wrote, so a tree costs
/// nothing beyond its last few bodies) and their tables of pieces.
pub(crate) fn cuts() -> Cuts {
    Cuts::new(1024, 32 << 20)
}

/// The length of one entry of a manifest: a piece's digest.
pub(crate) const DIGEST_LEN: usize = 32;

/// The manifest of a chunked body: the digests of its pieces, in order.
pub(crate) fn manifest<'a>(digests: impl IntoIterator<Item = &'a [u8; DIGEST_LEN]>) -> Vec<u8> {
    digests.into_iter().flatten().copied().collect()
}

/// The piece digests of a manifest; `None` if its length is not a whole
/// number of digests.
pub(crate) fn read_manifest(bytes: &[u8]) -> Option<Vec<[u8; DIGEST_LEN]>> {
    if !bytes.len().is_multiple_of(DIGEST_LEN) {
        return None;
    }
    bytes
        .chunks_exact(DIGEST_LEN)
        .map(|digest| digest.try_into().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_round_trip_and_refuse_partial_digests() {
        let digests = [digest(b"one"), digest(b"two"), digest(b"one")];
        let bytes = manifest(&digests);
        assert_eq!(bytes.len(), 3 * DIGEST_LEN);
        assert_eq!(read_manifest(&bytes), Some(digests.to_vec()));
        assert_eq!(read_manifest(&bytes[1..]), None);
        assert_eq!(read_manifest(&[]), Some(Vec::new()));
    }
}
