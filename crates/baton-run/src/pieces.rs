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

/// Length of the next piece of `data`: just past the first byte after
/// [`MIN`] where the gear hash of the bytes since [`MIN`] has its top 11
/// bits zero, else [`MAX`] or the end.
///
/// Four bytes a step: the hash after each of them is the hash before the
/// four shifted, plus a sum of their gear words that does not depend on it,
/// so the loop carries one shift and one add per four bytes instead of per
/// byte. The positions found are exactly the byte-at-a-time loop's
/// (`cut_bytewise`, kept in the tests as the definition).
fn cut(data: &[u8]) -> usize {
    if data.len() <= MIN {
        return data.len();
    }
    let limit = data.len().min(MAX);
    let mut hash = 0u64;
    let mut at = MIN;
    let mut quads = data[MIN..limit].chunks_exact(4);
    for quad in &mut quads {
        let gear = |index: usize| GEAR[usize::from(quad[index])];
        // The sums of the gear words up to each byte, as the hash adds
        // them; the hash before the four joins them shifted.
        let t1 = gear(0);
        let t2 = (t1 << 1).wrapping_add(gear(1));
        let t3 = (t2 << 1).wrapping_add(gear(2));
        let t4 = (t3 << 1).wrapping_add(gear(3));
        let h1 = (hash << 1).wrapping_add(t1);
        let h2 = (hash << 2).wrapping_add(t2);
        let h3 = (hash << 3).wrapping_add(t3);
        let h4 = (hash << 4).wrapping_add(t4);
        if (h1 & MASK == 0) | (h2 & MASK == 0) | (h3 & MASK == 0) | (h4 & MASK == 0) {
            let first = [h1, h2, h3, h4]
                .iter()
                .position(|h| h & MASK == 0)
                .expect("one of the four");
            return at + first + 1;
        }
        hash = h4;
        at += 4;
    }
    for &byte in quads.remainder() {
        hash = (hash << 1).wrapping_add(GEAR[usize::from(byte)]);
        at += 1;
        if hash & MASK == 0 {
            return at;
        }
    }
    limit
}

/// A piece of a body cut by [`split_after`]: one a recent cut of the same
/// tree already stored (with the id it was stored under), one repeating an
/// earlier piece of the same body, or one to digest and store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece<'a, Id> {
    /// Exactly the bytes of a piece of a recent cut, which is stored as `id`.
    Known(&'a [u8], Id),
    /// Exactly the bytes of the body's piece at this index (an earlier,
    /// [`Piece::Fresh`] one): stored once, under that piece's id.
    Again(&'a [u8], usize),
    /// A piece no recent cut holds and the body has not held before.
    Fresh(&'a [u8]),
}

impl<'a, Id> Piece<'a, Id> {
    /// The piece's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        match self {
            Piece::Known(bytes, _) | Piece::Again(bytes, _) | Piece::Fresh(bytes) => bytes,
        }
    }
}

/// The last body a store cut for a tree, with the ids its pieces are stored
/// under: what [`split_after`] reuses to cut the tree's next body without
/// scanning and digesting the pieces the two bodies share.
///
/// It holds the body itself (shared, not copied), so a store bounds how
/// many it keeps.
#[derive(Clone, Debug)]
pub struct LastCut<Id> {
    body: std::sync::Arc<[u8]>,
    /// `(start, len, id)` of each piece, in order.
    pieces: Vec<(usize, usize, Id)>,
    /// The first eight bytes of each piece at least that long, with its
    /// index, sorted: where a piece of the next body may be found again.
    heads: Vec<(u64, u32)>,
}

/// How many pieces of the last cut with the same first eight bytes are
/// compared with the next piece (bounds the work on repetitive content).
const CANDIDATES: usize = 4;

impl<Id: Copy> LastCut<Id> {
    /// The cut of `body` into pieces of `lens` bytes stored under their ids,
    /// in order, as [`split_pieces`] or [`split_after`] cut it. `None` if the
    /// lengths do not add up to the body's.
    pub fn new(
        body: std::sync::Arc<[u8]>,
        lens: impl IntoIterator<Item = (usize, Id)>,
    ) -> Option<LastCut<Id>> {
        let mut pieces = Vec::new();
        let mut start = 0usize;
        for (len, id) in lens {
            pieces.push((start, len, id));
            start = start.checked_add(len)?;
        }
        if start != body.len() {
            return None;
        }
        let mut heads: Vec<(u64, u32)> = pieces
            .iter()
            .enumerate()
            .filter_map(|(index, &(start, len, _))| {
                let head = body.get(start..start + len)?.first_chunk::<8>()?;
                Some((u64::from_le_bytes(*head), u32::try_from(index).ok()?))
            })
            .collect();
        heads.sort_unstable();
        // Kept for a while and counted against a store's bound: no spare room.
        pieces.shrink_to_fit();
        heads.shrink_to_fit();
        Some(LastCut {
            body,
            pieces,
            heads,
        })
    }

    /// Bytes of the body this cut holds.
    pub fn len(&self) -> usize {
        self.body.len()
    }

    /// Whether the body is empty.
    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }

    /// Bytes this cut holds in memory: its body and its tables of pieces
    /// (each piece's place and id, and the index of their first bytes).
    pub fn footprint(&self) -> usize {
        self.body.len()
            + self.pieces.capacity() * std::mem::size_of::<(usize, usize, Id)>()
            + self.heads.capacity() * std::mem::size_of::<(u64, u32)>()
    }

    /// The piece of the last cut that the cutter would cut at the start of
    /// `rest` (the unsplit tail of the next body), if any: same bytes, and
    /// the last piece only when `rest` ends with it too.
    fn known(&self, rest: &[u8]) -> Option<(usize, Id)> {
        let head = u64::from_le_bytes(*rest.first_chunk::<8>()?);
        let from = self.heads.partition_point(|&(h, _)| h < head);
        let last = self.pieces.len().checked_sub(1)?;
        self.heads[from..]
            .iter()
            .take_while(|&&(h, _)| h == head)
            .take(CANDIDATES)
            .find_map(|&(_, index)| {
                let index = index as usize;
                let (start, len, id) = self.pieces[index];
                // A piece but the last was cut by the content of its own
                // bytes (or at the longest length), so the same bytes cut the
                // same way; the last may have been cut by the body's end.
                let fits = if index == last {
                    len == rest.len()
                } else {
                    len <= rest.len()
                };
                (fits && rest[..len] == self.body[start..start + len]).then_some((len, id))
            })
    }
}

/// How many recent cuts [`LastCuts`] keeps of one tree. A tree's long
/// bodies often take turns between kinds (a team's step carrying its whole
/// state, then a settlement of its children, then its next step), so the
/// body a new one shares most with is often not the very last one cut.
pub const CUTS_PER_TREE: usize = 4;

/// The last cuts a store's writer keeps, by tree: a bounded memory of each
/// recently written tree's last [`CUTS_PER_TREE`] [`LastCut`]s, the least
/// recently kept tree going first, each tree under a tag the store chooses
/// (a lease's fencing token and the tree's row, say) that a lookup must
/// name again to find its cuts.
///
/// It is only ever a cache of what the store committed: a store keeps a
/// cut once the transaction that stored its pieces has committed, and
/// forgets a tree whenever its pieces may be deleted.
#[derive(Debug)]
pub struct LastCuts<Key, Tag, Id> {
    trees: std::collections::BTreeMap<Key, Kept<Tag, Id>>,
    /// Bytes the cuts kept hold ([`LastCut::footprint`]: their bodies,
    /// shared with the records that hold them, and their piece tables).
    bytes: usize,
    /// Bumped on each keep, so the least recently kept tree goes first.
    stamp: u64,
    max_bytes: usize,
    max_trees: usize,
}

#[derive(Debug)]
struct Kept<Tag, Id> {
    stamp: u64,
    tag: Tag,
    /// Most recent first; at most [`CUTS_PER_TREE`].
    cuts: Vec<LastCut<Id>>,
}

impl<Tag, Id: Copy> Kept<Tag, Id> {
    fn footprint(&self) -> usize {
        self.cuts.iter().map(LastCut::footprint).sum()
    }
}

impl<Key: Ord + Copy, Tag: Eq + Copy, Id: Copy> LastCuts<Key, Tag, Id> {
    /// An empty memory of the cuts of at most `max_trees` trees holding at
    /// most `max_bytes` bytes (bodies and piece tables); a single cut over
    /// a quarter of `max_bytes` is not kept.
    pub fn new(max_trees: usize, max_bytes: usize) -> LastCuts<Key, Tag, Id> {
        LastCuts {
            trees: std::collections::BTreeMap::new(),
            bytes: 0,
            stamp: 0,
            max_bytes,
            max_trees,
        }
    }

    /// The last cuts of tree `key`, most recent first, if they were kept
    /// under `tag` (none otherwise).
    pub fn get(&self, key: Key, tag: Tag) -> &[LastCut<Id>] {
        self.trees
            .get(&key)
            .filter(|kept| kept.tag == tag)
            .map_or(&[], |kept| &kept.cuts[..])
    }

    /// Keeps `cut` as tree `key`'s last, under `tag` (the tree's cuts under
    /// another tag are forgotten), forgetting its oldest beyond
    /// [`CUTS_PER_TREE`] and evicting the least recently kept trees beyond
    /// the bounds. A cut over a quarter of the bytes is not kept.
    pub fn keep(&mut self, key: Key, tag: Tag, cut: LastCut<Id>) {
        if self.trees.get(&key).is_some_and(|kept| kept.tag != tag) {
            self.forget(key);
        }
        if cut.footprint() > self.max_bytes / 4 {
            return;
        }
        self.stamp += 1;
        self.bytes += cut.footprint();
        let stamp = self.stamp;
        let kept = self.trees.entry(key).or_insert_with(|| Kept {
            stamp,
            tag,
            cuts: Vec::with_capacity(CUTS_PER_TREE),
        });
        kept.stamp = stamp;
        kept.cuts.insert(0, cut);
        for old in kept.cuts.drain(CUTS_PER_TREE.min(kept.cuts.len())..) {
            self.bytes -= old.footprint();
        }
        while self.bytes > self.max_bytes || self.trees.len() > self.max_trees {
            let oldest = self
                .trees
                .iter()
                .min_by_key(|(_, kept)| kept.stamp)
                .map(|(key, _)| *key);
            match oldest {
                Some(oldest) => self.forget(oldest),
                None => break,
            }
        }
    }

    /// Forgets tree `key`, handing over its cuts and their tag: for a
    /// store to cut one more body by them (a snapshot that compacts the
    /// tree, say) while they are still good, without keeping them.
    pub fn take(&mut self, key: Key) -> Option<(Tag, Vec<LastCut<Id>>)> {
        let kept = self.trees.remove(&key)?;
        self.bytes -= kept.footprint();
        Some((kept.tag, kept.cuts))
    }

    /// Forgets tree `key` (its pieces may be deleted).
    pub fn forget(&mut self, key: Key) {
        if let Some(kept) = self.trees.remove(&key) {
            self.bytes -= kept.footprint();
        }
    }

    /// Forgets every tree.
    pub fn clear(&mut self) {
        self.trees.clear();
        self.bytes = 0;
    }

    /// Bytes the cuts kept hold, bodies and piece tables.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Cuts `bytes` exactly as [`split_pieces`] does, naming the pieces that
/// `recent` (the tree's previous cuts the store kept, the most recent
/// first) already hold, and those that repeat an earlier piece of `bytes`
/// itself (a start whose initial state holds its input, say): those are
/// found by their first bytes and compared, not scanned for a cut point and
/// digested again, so a body that shares most of its bytes with one of
/// them, or holds the same text twice, costs about one comparison pass for
/// what it shares.
pub fn split_after<'a, Id: Copy>(bytes: &'a [u8], recent: &[&LastCut<Id>]) -> Vec<Piece<'a, Id>> {
    let mut pieces = Vec::with_capacity(bytes.len() / 2048 + 1);
    // The first eight bytes of each fresh piece so far, with its index.
    let mut heads = std::collections::BTreeSet::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        if let Some((len, id)) = recent.iter().find_map(|cut| cut.known(rest)) {
            let (piece, tail) = rest.split_at(len);
            pieces.push(Piece::Known(piece, id));
            rest = tail;
            continue;
        }
        let head = rest
            .first_chunk::<8>()
            .map(|head| u64::from_le_bytes(*head));
        // An earlier piece of this body was cut by its own content (or at
        // the longest length), never by the body's end, so the same bytes
        // here cut the same way.
        let again = head.and_then(|head| {
            heads
                .range((head, 0)..=(head, usize::MAX))
                .take(CANDIDATES)
                .find_map(|&(_, index)| {
                    let earlier: &[u8] = Piece::bytes(&pieces[index]);
                    rest.starts_with(earlier).then_some((earlier.len(), index))
                })
        });
        if let Some((len, index)) = again {
            let (piece, tail) = rest.split_at(len);
            pieces.push(Piece::Again(piece, index));
            rest = tail;
            continue;
        }
        let (piece, tail) = rest.split_at(cut(rest));
        if let Some(head) = head {
            heads.insert((head, pieces.len()));
        }
        pieces.push(Piece::Fresh(piece));
        rest = tail;
    }
    pieces
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

    /// The cut rule, a byte at a time: the definition [`cut`] computes
    /// four bytes a step.
    fn cut_bytewise(data: &[u8]) -> usize {
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

    /// Every cut of long random and repetitive bodies, from every start the
    /// cutter meets and from shifted starts (so a cut falls at each of the
    /// four positions of a step, and the tail has each length).
    #[test]
    fn cuts_fall_where_the_bytewise_rule_puts_them() {
        let mut cuts = 0;
        for seed in 0..6u64 {
            let data = noise(60_000, 11 + seed);
            for shift in 0..8 {
                let mut rest = &data[shift..];
                while !rest.is_empty() {
                    let at = cut(rest);
                    assert_eq!(at, cut_bytewise(rest), "seed {seed}, shift {shift}");
                    rest = &rest[at..];
                    cuts += 1;
                }
            }
        }
        // Lengths around the bounds, where a step or its remainder ends.
        for len in (0..MIN + 9).chain(MAX - 9..MAX + 9) {
            let data = noise(len, 5);
            assert_eq!(cut(&data), cut_bytewise(&data), "{len} bytes");
            let flat = vec![b'a'; len];
            assert_eq!(cut(&flat), cut_bytewise(&flat), "{len} flat bytes");
        }
        assert!(cuts > 1000, "{cuts} cuts checked");
    }

    /// Where the rule cuts a fixed body: stored pieces are named by these
    /// cuts, so a change here would cost every store its dedupe against
    /// what it wrote before.
    #[test]
    fn the_cut_rule_is_stable() {
        let lens: Vec<usize> = split_pieces(&noise(20_000, 42))
            .iter()
            .map(|piece| piece.len())
            .collect();
        assert_eq!(lens, [2735, 2347, 3604, 3715, 3737, 715, 2060, 1087]);
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

    /// The cut of `bytes` recorded as a [`LastCut`], each piece's id its
    /// index in `ids` (the distinct pieces, in order of appearance).
    fn recorded(bytes: &[u8], ids: &mut Vec<Vec<u8>>) -> LastCut<usize> {
        let lens: Vec<(usize, usize)> = split_pieces(bytes)
            .into_iter()
            .map(|piece| (piece.len(), id_of(piece, ids)))
            .collect();
        LastCut::new(std::sync::Arc::from(bytes), lens).expect("pieces add up")
    }

    fn id_of(piece: &[u8], ids: &mut Vec<Vec<u8>>) -> usize {
        match ids.iter().position(|known| known == piece) {
            Some(id) => id,
            None => {
                ids.push(piece.to_vec());
                ids.len() - 1
            }
        }
    }

    /// Applies `edits` (position fraction, removed, inserted bytes) to `data`.
    fn edited(data: &[u8], edits: &[(f64, usize, Vec<u8>)]) -> Vec<u8> {
        let mut out = data.to_vec();
        for (at, removed, inserted) in edits {
            let at = ((out.len() as f64) * at) as usize;
            let end = (at + removed).min(out.len());
            out.splice(at..end, inserted.iter().copied());
        }
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Reusing the last cut never changes the pieces: the same cut points
        /// as `split_pieces`, and every known piece is byte for byte the
        /// piece its id names.
        #[test]
        fn split_after_cuts_as_split_pieces_does(
            len in 0usize..60_000,
            seed in 1u64..u64::MAX,
            repetitive in proptest::bool::ANY,
            edits in proptest::collection::vec(
                (0.0f64..1.0, 0usize..3000, proptest::collection::vec(proptest::num::u8::ANY, 0..40)),
                0..4,
            ),
        ) {
            let base = if repetitive {
                (0..len).map(|i| b"0123456789abcdef"[(i / 700 + seed as usize) % 16]).collect()
            } else {
                noise(len, seed)
            };
            let next = edited(&base, &edits);
            let mut ids = Vec::new();
            let last = recorded(&base, &mut ids);
            // A more recent cut of other bytes, tried first.
            let other = recorded(&noise(len / 2, seed ^ 1), &mut ids);
            let pieces = split_after(&next, &[&other, &last]);
            let bytes: Vec<&[u8]> = pieces.iter().map(Piece::bytes).collect();
            proptest::prop_assert_eq!(&bytes, &split_pieces(&next));
            check_named(&pieces, &ids);
        }
    }

    /// Every known piece is byte for byte the piece its id names, and every
    /// repeat the earlier fresh piece of the same body its index names.
    fn check_named(pieces: &[Piece<'_, usize>], ids: &[Vec<u8>]) {
        for (at, piece) in pieces.iter().enumerate() {
            match *piece {
                Piece::Known(bytes, id) => assert_eq!(bytes, ids[id].as_slice()),
                Piece::Again(bytes, index) => {
                    assert!(index < at, "piece {at} repeats a later one ({index})");
                    assert!(
                        matches!(pieces[index], Piece::Fresh(earlier) if earlier == bytes),
                        "piece {at} is not piece {index} again"
                    );
                }
                Piece::Fresh(_) => {}
            }
        }
    }

    /// A body holding the same text twice (a start's input and the initial
    /// state made from it) is cut as `split_pieces` cuts it, and the second
    /// copy is named as the first's pieces again but for the few pieces
    /// around where it begins and ends.
    #[test]
    fn a_body_repeating_its_own_text_names_the_repeats() {
        let input = noise(250_000, 31);
        let mut body = b"{\"input\":".to_vec();
        body.extend_from_slice(&input);
        body.extend_from_slice(b",\"state\":{\"stage\":0,\"text\":");
        body.extend_from_slice(&input);
        body.extend_from_slice(b"}}");
        let pieces = split_after::<usize>(&body, &[]);
        let bytes: Vec<&[u8]> = pieces.iter().map(Piece::bytes).collect();
        assert_eq!(bytes, split_pieces(&body));
        check_named(&pieces, &[]);
        let fresh = pieces
            .iter()
            .filter(|piece| matches!(piece, Piece::Fresh(_)))
            .count();
        let again = pieces.len() - fresh;
        assert!(pieces.len() > 150, "{} pieces", pieces.len());
        assert!(
            fresh <= pieces.len() / 2 + 3,
            "{fresh} of {} pieces cut afresh, {again} repeats",
            pieces.len()
        );
        // A body without repeats has none.
        let once = noise(100_000, 32);
        let pieces = split_after::<usize>(&once, &[]);
        assert!(pieces.iter().all(|piece| matches!(piece, Piece::Fresh(_))));
        // Text as flat as can be: every piece of the longest length but the
        // first and the last is the first one again.
        let flat = vec![b' '; 100_000];
        let pieces = split_after::<usize>(&flat, &[]);
        assert_eq!(
            pieces.iter().map(Piece::bytes).collect::<Vec<_>>(),
            split_pieces(&flat)
        );
        assert!(
            pieces[1..pieces.len() - 1]
                .iter()
                .all(|piece| matches!(piece, Piece::Again(_, 0))),
            "{pieces:?}"
        );
    }

    #[test]
    fn a_body_sharing_most_bytes_is_mostly_known() {
        let data = noise(250_000, 9);
        let mut ids = Vec::new();
        let last = recorded(&data, &mut ids);
        // A shift near the start, a changed byte in the middle, a longer end.
        let mut next = data.clone();
        next.insert(10, b'x');
        next[125_000] ^= 1;
        next.extend_from_slice(b"tail");
        let pieces = split_after(&next, &[&last]);
        let fresh = pieces
            .iter()
            .filter(|piece| matches!(piece, Piece::Fresh(_)))
            .count();
        assert!(pieces.len() > 50, "{} pieces", pieces.len());
        assert!(fresh <= 6, "{fresh} of {} pieces cut afresh", pieces.len());
        assert_eq!(split_after::<usize>(&next, &[]).len(), pieces.len());
        assert!(LastCut::new(std::sync::Arc::from(&data[..]), [(1usize, 0usize)]).is_none());
    }

    fn one_piece(len: usize) -> LastCut<i64> {
        LastCut::new(std::sync::Arc::from(vec![7u8; len]), [(len, 1i64)]).expect("one piece")
    }

    #[test]
    fn last_cuts_evict_the_least_recently_kept_and_answer_only_their_tag() {
        let max = 1 << 20;
        let mut cuts = LastCuts::new(4, max);
        let size = max / 5;
        for key in 0..6 {
            cuts.keep(key, 7, one_piece(size));
        }
        assert!(cuts.get(0, 7).is_empty(), "the oldest is evicted by bytes");
        assert!(!cuts.get(5, 7).is_empty());
        assert!(cuts.bytes() <= max);
        assert!(cuts.get(5, 8).is_empty(), "another tag finds nothing");
        cuts.keep(9, 7, one_piece(max));
        assert!(cuts.get(9, 7).is_empty(), "a body too large is not kept");
        for key in 10..15 {
            cuts.keep(key, 7, one_piece(10));
        }
        assert!(cuts.get(10, 7).is_empty(), "the oldest is evicted by count");
        assert!(!cuts.get(14, 7).is_empty());
        cuts.keep(14, 8, one_piece(10));
        assert!(cuts.get(14, 7).is_empty(), "a new tag replaces the old");
        assert!(!cuts.get(14, 8).is_empty());
        cuts.forget(14);
        assert!(cuts.get(14, 8).is_empty());
        cuts.clear();
        assert_eq!(cuts.bytes(), 0);
    }

    /// A cut of an empty body (no pieces) knows nothing, and asking it
    /// does not underflow.
    #[test]
    fn an_empty_cut_knows_no_piece() {
        let empty: LastCut<usize> =
            LastCut::new(std::sync::Arc::from(Vec::new()), []).expect("adds up");
        assert!(empty.is_empty());
        assert_eq!(empty.known(&[7u8; 64]), None);
        let next = noise(10_000, 3);
        assert_eq!(
            split_after(&next, &[&empty]).len(),
            split_pieces(&next).len()
        );
    }

    /// The bound counts what a cut holds besides its body: a body of many
    /// small pieces carries tables several times its own size, and those
    /// count against the memory's bytes as the body does.
    #[test]
    fn last_cuts_count_their_piece_tables_against_the_bound() {
        fn many_pieces() -> LastCut<[u8; 32]> {
            let body = std::sync::Arc::from(vec![7u8; 4096]);
            LastCut::new(body, (0..512u32).map(|i| (8usize, [i as u8; 32]))).expect("adds up")
        }
        let footprint = many_pieces().footprint();
        assert!(
            footprint >= 4096 + 512 * (48 + 16),
            "{footprint} bytes for a 4 KB body in 512 pieces"
        );
        let mut cuts = LastCuts::new(64, footprint * 4);
        for key in 1..6 {
            cuts.keep(key, 0, many_pieces());
        }
        assert_eq!(
            cuts.bytes(),
            footprint * 4,
            "four fit, the fifth evicted one"
        );
        assert!(
            cuts.get(1, 0).is_empty(),
            "the oldest went to stay within the bound"
        );
        assert_eq!(cuts.get(5, 0).len(), 1);
        cuts.forget(5);
        assert_eq!(cuts.bytes(), footprint * 3);
    }

    /// A tree keeps its last few cuts, the most recent first; an older one
    /// leaves the memory (and its bytes) when a newer one pushes it out,
    /// and another tag starts the tree's cuts over.
    #[test]
    fn a_tree_keeps_its_last_few_cuts_the_most_recent_first() {
        let mut cuts = LastCuts::new(16, 1 << 20);
        for len in 1..=CUTS_PER_TREE + 2 {
            cuts.keep(3, 7, one_piece(len * 100));
        }
        let lens: Vec<usize> = cuts.get(3, 7).iter().map(LastCut::len).collect();
        let newest = CUTS_PER_TREE + 2;
        let expected: Vec<usize> = (0..CUTS_PER_TREE).map(|i| (newest - i) * 100).collect();
        assert_eq!(lens, expected);
        let held: usize = cuts.get(3, 7).iter().map(LastCut::footprint).sum();
        assert_eq!(
            cuts.bytes(),
            held,
            "the pushed-out cuts' bytes are released"
        );
        cuts.keep(3, 8, one_piece(50));
        assert_eq!(cuts.get(3, 8).len(), 1, "another tag starts over");
        assert!(cuts.get(3, 7).is_empty());
        assert_eq!(cuts.bytes(), one_piece(50).footprint());
        let (tag, taken) = cuts.take(3).expect("kept");
        assert_eq!((tag, taken.len(), taken[0].len()), (8, 1, 50));
        assert!(cuts.get(3, 8).is_empty(), "taken cuts are forgotten");
        assert_eq!(cuts.bytes(), 0);
        assert!(cuts.take(3).is_none());
        // A cut too large to keep leaves the tree's earlier cuts in place.
        let mut small = LastCuts::new(16, 4096);
        small.keep(1, 0, one_piece(100));
        small.keep(1, 0, one_piece(4096));
        assert_eq!(small.get(1, 0).len(), 1);
        assert_eq!(small.get(1, 0)[0].len(), 100);
    }

    /// A body that shares its bytes with a cut older than the tree's last
    /// (the tree's bodies took turns between two kinds) is found in that
    /// cut: only the pieces around its edits are cut afresh.
    #[test]
    fn a_body_is_found_in_any_of_the_recent_cuts() {
        let mut ids = Vec::new();
        let state = noise(200_000, 21);
        let settlement = noise(20_000, 22);
        let older = recorded(&state, &mut ids);
        let last = recorded(&settlement, &mut ids);
        let mut next = state.clone();
        next.splice(5..5, *b"a new head").for_each(drop);
        next.extend_from_slice(b"and a new tail");
        let fresh = |pieces: &[Piece<'_, usize>]| {
            pieces
                .iter()
                .filter(|piece| matches!(piece, Piece::Fresh(_)))
                .count()
        };
        let only_last = split_after(&next, &[&last]);
        assert_eq!(
            fresh(&only_last),
            only_last.len(),
            "the last cut shares nothing"
        );
        let both = split_after(&next, &[&last, &older]);
        assert!(both.len() > 40, "{} pieces", both.len());
        assert!(
            fresh(&both) <= 4,
            "{} of {} cut afresh",
            fresh(&both),
            both.len()
        );
        let bytes: Vec<&[u8]> = both.iter().map(Piece::bytes).collect();
        assert_eq!(bytes, split_pieces(&next));
        check_named(&both, &ids);
    }
}
