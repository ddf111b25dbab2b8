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
//! The cutting rule is `baton-store-sqlite`'s, kept as a copy because store
//! backends depend on the kernel alone; the manifest differs: it lists piece
//! digests, which are the pieces' keys here.

/// Bodies up to this many bytes are stored inline in their row.
pub(crate) const INLINE_MAX: usize = 4096;

/// No cut before this many bytes of a piece.
const MIN: usize = 512;
/// A cut at the latest after this many bytes.
const MAX: usize = 8192;
/// A cut where the top 11 bits of the gear hash are zero: one position in
/// 2048, so pieces average about `MIN + 2 KiB`.
const MASK: u64 = !0u64 << (64 - 11);

/// The gear table: 256 fixed pseudo-random words (splitmix64 from a fixed
/// seed). Changing it changes where cuts fall, which only costs dedupe
/// against pieces written before the change, never correctness.
const GEAR: [u64; 256] = gear();

const fn gear() -> [u64; 256] {
    let mut table = [0u64; 256];
    let mut state: u64 = 0x6261_746f_6e2d_7371; // "baton-sq"
    let mut index = 0;
    while index < 256 {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        table[index] = z ^ (z >> 31);
        index += 1;
    }
    table
}

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

/// Cuts `bytes` into content-defined pieces whose concatenation is `bytes`.
pub(crate) fn split(bytes: &[u8]) -> Vec<&[u8]> {
    let mut pieces = Vec::with_capacity(bytes.len() / 2048 + 1);
    let mut rest = bytes;
    while !rest.is_empty() {
        let (piece, tail) = rest.split_at(cut(rest));
        pieces.push(piece);
        rest = tail;
    }
    pieces
}

/// Length of the next piece of `data`.
fn cut(data: &[u8]) -> usize {
    if data.len() <= MIN {
        return data.len();
    }
    let limit = data.len().min(MAX);
    let mut hash = 0u64;
    for (offset, byte) in data[MIN..limit].iter().enumerate() {
        hash = (hash << 1).wrapping_add(GEAR[usize::from(*byte)]);
        if hash & MASK == 0 {
            return MIN + offset + 1;
        }
    }
    limit
}

/// The length of one entry of a manifest: a piece's digest.
pub(crate) const DIGEST_LEN: usize = 32;

/// The manifest of a chunked body: the digests of its pieces, in order.
pub(crate) fn manifest(digests: &[[u8; DIGEST_LEN]]) -> Vec<u8> {
    digests.concat()
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

    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn pieces_concatenate_to_the_input_within_bounds() {
        for len in [0, 1, MIN, MIN + 1, MAX, MAX + 1, 100_000] {
            let data = noise(len, 7 + len as u64);
            let pieces = split(&data);
            assert_eq!(pieces.concat(), data);
            for piece in &pieces[..pieces.len().saturating_sub(1)] {
                assert!(piece.len() > MIN && piece.len() <= MAX, "{}", piece.len());
            }
        }
    }

    #[test]
    fn a_small_edit_changes_few_pieces() {
        let data = noise(250_000, 42);
        let mut edited = data.clone();
        edited[123_456] ^= 0xff;
        edited.insert(200_000, b'x');
        let before: std::collections::BTreeSet<_> = split(&data).into_iter().map(digest).collect();
        let after = split(&edited);
        let new = after
            .iter()
            .filter(|p| !before.contains(&digest(p)))
            .count();
        assert!(after.len() > 50, "{} pieces", after.len());
        assert!(new <= 4, "{new} new pieces for two small edits");
    }

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
