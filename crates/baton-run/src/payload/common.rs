//! How much two texts share at their start or at their end, for code that
//! reads or records by difference.

/// Block lengths compared at a time, largest first: each level narrows to
/// the first block of the last that differs, and the rest is compared byte
/// by byte, so texts of hundreds of kilobytes cost a few hundred
/// comparisons, not one per block of 64 or 256 bytes.
const BLOCKS: [usize; 2] = [4096, 64];

/// The length of the longest common prefix of `a` and `b`: how much of a
/// payload's text a recently read one already covers.
pub fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let length = a.len().min(b.len());
    let (a, b) = (&a[..length], &b[..length]);
    let mut at = 0;
    for block in BLOCKS {
        let same = a[at..]
            .chunks_exact(block)
            .zip(b[at..].chunks_exact(block))
            .take_while(|(x, y)| x == y)
            .count();
        at += same * block;
    }
    at + a[at..]
        .iter()
        .zip(&b[at..])
        .take_while(|(x, y)| x == y)
        .count()
}

/// The length of the longest common suffix of `a` and `b`.
pub(crate) fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    let length = a.len().min(b.len());
    let (a, b) = (&a[a.len() - length..], &b[b.len() - length..]);
    let mut kept = 0;
    for block in BLOCKS {
        let (a, b) = (&a[..length - kept], &b[..length - kept]);
        let same = a
            .rchunks_exact(block)
            .zip(b.rchunks_exact(block))
            .take_while(|(x, y)| x == y)
            .count();
        kept += same * block;
    }
    let (a, b) = (&a[..length - kept], &b[..length - kept]);
    kept + a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_common_prefix_is_found_across_blocks() {
        let a = vec![7u8; 10_000];
        for split in [
            0, 1, 63, 64, 65, 255, 256, 257, 4095, 4096, 4097, 8191, 9999,
        ] {
            let mut b = a.clone();
            b[split] = 8;
            assert_eq!(common_prefix(&a, &b), split);
            assert_eq!(common_suffix(&a, &b), a.len() - split - 1);
        }
        assert_eq!(common_prefix(&a, &a), 10_000);
        assert_eq!(common_prefix(&a, &a[..300]), 300);
        assert_eq!(common_prefix(&a[..0], &a), 0);
        assert_eq!(common_suffix(&a, &a[..300]), 300);
        assert_eq!(common_suffix(&a[..0], &a), 0);
    }

    proptest! {
        /// Found a block at a time, the shared start and end agree with a
        /// byte-by-byte scan, for texts of any lengths.
        #[test]
        fn the_shared_start_and_end_are_the_longest_there_are(
            base in proptest::collection::vec(0u8..3, 0..10_000),
            edit in 0usize..10_000,
            byte in 0u8..3,
            cut in 0usize..10_000,
        ) {
            let mut other = base.clone();
            if let Some(slot) = other.get_mut(edit) {
                *slot = byte;
            }
            for other in [&other[..], &other[..cut.min(other.len())], &other[other.len() - cut.min(other.len())..]] {
                let front = base.iter().zip(other).take_while(|(x, y)| x == y).count();
                prop_assert_eq!(common_prefix(&base, other), front);
                let back = base.iter().rev().zip(other.iter().rev()).take_while(|(x, y)| x == y).count();
                prop_assert_eq!(common_suffix(&base, other), back);
            }
        }
    }
}
