//! Content-defined cutting of stored bodies into pieces, shared by the
//! store backends that keep large states as content-addressed pieces.
//!
//! A gear hash over a sliding byte window chooses cut points from the
//! content, so an edit in the middle of a large state changes the pieces
//! around it and leaves the others (and their stored copies) as they were.
//! The rule is part of what stores write: every backend that dedupes by
//! piece uses this one, so the same state cuts the same way everywhere.

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

/// Cuts `bytes` into content-defined pieces whose concatenation is
/// `bytes`: every piece but the last is longer than 512 bytes and at most
/// 8 KiB long.
pub fn split_pieces(bytes: &[u8]) -> Vec<&[u8]> {
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

    fn digest(piece: &[u8]) -> [u8; 32] {
        *blake3::hash(piece).as_bytes()
    }

    #[test]
    fn pieces_concatenate_to_the_input_within_bounds() {
        for len in [0, 1, MIN, MIN + 1, MAX, MAX + 1, 100_000] {
            let data = noise(len, 7 + len as u64);
            let pieces = split_pieces(&data);
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
        let before: std::collections::BTreeSet<_> =
            split_pieces(&data).into_iter().map(digest).collect();
        let after = split_pieces(&edited);
        let new = after
            .iter()
            .filter(|p| !before.contains(&digest(p)))
            .count();
        assert!(after.len() > 50, "{} pieces", after.len());
        assert!(new <= 4, "{new} new pieces for two small edits");
    }
}
