//! blake3 digests with one derive-key context per purpose.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a digest is computed for; each purpose has its own fixed, dated
/// blake3 derive-key context so digests of different purposes never collide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Purpose {
    /// Canonical payload bytes.
    Payload,
    /// A descriptor's contract (name, description, schemas).
    Contract,
    /// A program reference (contract, implementation, configuration, children).
    Program,
    /// Implementation identity (crate name and version, or a build identity).
    Implementation,
    /// Configuration identity (every configuration field).
    Configuration,
    /// Derived identifiers (process, effect, wait, engine signal ids).
    Identity,
    /// The log hash chain.
    LogChain,
}

impl Purpose {
    /// The blake3 derive-key context string; stable API, never change a string.
    pub const fn context(self) -> &'static str {
        match self {
            Purpose::Payload => "baton 2026-11-30 payload v1",
            Purpose::Contract => "baton 2026-11-30 contract v1",
            Purpose::Program => "baton 2026-11-30 program ref v1",
            Purpose::Implementation => "baton 2026-11-30 implementation v1",
            Purpose::Configuration => "baton 2026-11-30 configuration v1",
            Purpose::Identity => "baton 2026-11-30 identity v1",
            Purpose::LogChain => "baton 2026-11-30 log chain v1",
        }
    }

    /// Every purpose, in declaration order (the index of each thread's kept
    /// hashers).
    const ALL: [Purpose; 7] = [
        Purpose::Payload,
        Purpose::Contract,
        Purpose::Program,
        Purpose::Implementation,
        Purpose::Configuration,
        Purpose::Identity,
        Purpose::LogChain,
    ];

    /// A fresh derive-key hasher for this purpose.
    fn hasher(self) -> blake3::Hasher {
        blake3::Hasher::new_derive_key(self.context())
    }

    /// The digest of what `feed` gives this purpose's hasher. Digests are
    /// taken several times per step; deriving a purpose's key costs a blake3
    /// compression and a `blake3::Hasher` is about 1.9 KB to copy, so each
    /// thread keeps one hasher per purpose and resets it before use (`reset`
    /// keeps the derived key).
    fn digest(self, feed: impl FnOnce(&mut blake3::Hasher)) -> Digest {
        thread_local! {
            static HASHERS: std::cell::RefCell<[blake3::Hasher; 7]> =
                std::cell::RefCell::new(Purpose::ALL.map(Purpose::hasher));
        }
        let mut feed = Some(feed);
        let kept = HASHERS.try_with(|hashers| {
            // Never borrowed twice (`feed` only updates), but a digest
            // taken while one is being taken would still be right.
            let mut hashers = hashers.try_borrow_mut().ok()?;
            let hasher = &mut hashers[self as usize];
            // Reset before use: a feed that panicked leaves no trace.
            hasher.reset();
            (feed.take()?)(hasher);
            Some(Digest(*hasher.finalize().as_bytes()))
        });
        match (kept, feed) {
            (Ok(Some(digest)), _) => digest,
            // No thread-local hasher to be had (a thread being torn down).
            (_, Some(feed)) => {
                let mut hasher = self.hasher();
                feed(&mut hasher);
                Digest(*hasher.finalize().as_bytes())
            }
            (_, None) => unreachable!("a feed taken is a digest returned"),
        }
    }
}

/// A 32-byte blake3 digest, shown as `b3:<hex>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The all-zero digest, used as the `prev` of a log's first record.
    pub const ZERO: Digest = Digest([0; 32]);

    /// Digest of `bytes` for `purpose`.
    pub fn of(purpose: Purpose, bytes: &[u8]) -> Digest {
        purpose.digest(|hasher| {
            hasher.update(bytes);
        })
    }

    /// Digest of a sequence of parts; each part is length-prefixed so part
    /// boundaries are unambiguous.
    pub fn of_parts(purpose: Purpose, parts: &[&[u8]]) -> Digest {
        // The hasher sees exactly the prefixes and parts in order, but short
        // ones reach it gathered into one run: every `update` costs its own
        // bookkeeping, and a record's chain hash is six of them otherwise.
        purpose.digest(|hasher| {
            let mut gathered = [0u8; 128];
            let mut filled = 0;
            for part in parts {
                let prefix = (part.len() as u64).to_le_bytes();
                if filled + prefix.len() > gathered.len() {
                    hasher.update(&gathered[..filled]);
                    filled = 0;
                }
                gathered[filled..filled + prefix.len()].copy_from_slice(&prefix);
                filled += prefix.len();
                if filled + part.len() <= gathered.len() {
                    gathered[filled..filled + part.len()].copy_from_slice(part);
                    filled += part.len();
                } else {
                    hasher.update(&gathered[..filled]);
                    filled = 0;
                    hasher.update(part);
                }
            }
            hasher.update(&gathered[..filled]);
        })
    }

    /// The raw bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Builds a digest from raw bytes (e.g. read back from a store).
    pub const fn from_bytes(bytes: [u8; 32]) -> Digest {
        Digest(bytes)
    }

    /// Lower-case hex without the `b3:` prefix.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    HexText::new("", bytes).as_str().to_owned()
}

/// A short prefix and the lower-case hex of up to 32 bytes, built on the
/// stack: ids and digests are written into every record, so their text
/// form must not cost an allocation and a trip through `fmt`.
pub(crate) struct HexText {
    buf: [u8; HexText::CAPACITY],
    len: usize,
}

impl HexText {
    const CAPACITY: usize = 8 + 64;

    /// `prefix` (ASCII, at most 8 bytes) then the hex of `bytes` (at most 32).
    pub(crate) fn new(prefix: &str, bytes: &[u8]) -> HexText {
        debug_assert!(prefix.is_ascii() && prefix.len() <= 8 && bytes.len() <= 32);
        let mut buf = [0u8; HexText::CAPACITY];
        buf[..prefix.len()].copy_from_slice(prefix.as_bytes());
        let mut len = prefix.len();
        let mut quads = bytes.chunks_exact(4);
        for quad in &mut quads {
            let quad: [u8; 4] = quad.try_into().expect("chunks of four");
            buf[len..len + 8].copy_from_slice(&hex_quad(quad));
            len += 8;
        }
        for &byte in quads.remainder() {
            buf[len..len + 2].copy_from_slice(&hex_quad([byte, 0, 0, 0])[..2]);
            len += 2;
        }
        HexText { buf, len }
    }

    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).expect("an ASCII prefix and hex digits")
    }
}

/// The lower-case hex digits of four bytes, computed on all eight at once
/// in one word: ids and digests are written into every record.
fn hex_quad(quad: [u8; 4]) -> [u8; 8] {
    const LOW_NIBBLES: u64 = 0x000f_000f_000f_000f;
    const ONES: u64 = 0x0101_0101_0101_0101;
    let word = u64::from(u32::from_be_bytes(quad));
    // Spread the bytes two apart, then each byte's high nibble into the
    // byte above its low one: one nibble a byte, most significant first.
    let spread = ((word & 0xffff_0000) << 16) | (word & 0xffff);
    let spread = ((spread & 0x0000_ff00_0000_ff00) << 8) | (spread & 0x0000_00ff_0000_00ff);
    let nibbles = ((spread & (LOW_NIBBLES << 4)) << 4) | (spread & LOW_NIBBLES);
    // A byte whose nibble is 10 or more carries into its bit 4 when 6 is
    // added; those take 'a' - '0' - 10 more than the digits' '0'.
    let letters = ((nibbles + 6 * ONES) >> 4) & ONES;
    (nibbles + 0x30 * ONES + letters * 0x27).to_be_bytes()
}

/// Each byte's value as a lower-case hex digit, or `0xff` for a byte that
/// is none.
static HEX_VALUES: [u8; 256] = {
    let mut table = [0xff; 256];
    let mut at = 0;
    while at < 16 {
        let digit = b"0123456789abcdef"[at];
        table[digit as usize] = at as u8;
        at += 1;
    }
    table
};

/// The `N` bytes `text` spells in lower-case hex, or `None`. Digits are
/// looked up, and one check at the end refuses any that was not one: ids
/// are random, so a branch on each digit's range would be mispredicted
/// about every third digit.
pub(crate) fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != N * 2 {
        return None;
    }
    let mut out = [0u8; N];
    let mut seen = 0u8;
    for (byte, pair) in out.iter_mut().zip(text.as_bytes().chunks_exact(2)) {
        let (high, low) = (HEX_VALUES[pair[0] as usize], HEX_VALUES[pair[1] as usize]);
        seen |= high | low;
        *byte = high << 4 | low;
    }
    (seen & 0xf0 == 0).then_some(out)
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(HexText::new("b3:", &self.0).as_str())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A digest string was not `b3:` followed by 64 lower-case hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed digest {text:?}: expected b3: followed by 64 lower-case hex digits")]
pub struct DigestParseError {
    /// The rejected text (truncated to 80 characters).
    pub text: String,
}

impl FromStr for Digest {
    type Err = DigestParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.strip_prefix("b3:")
            .and_then(unhex::<32>)
            .map(Digest)
            .ok_or_else(|| DigestParseError {
                text: text.chars().take(80).collect(),
            })
    }
}

impl Digest {
    /// The text form (`b3:` and 64 hex digits), built on the stack.
    pub(crate) fn text(&self) -> HexText {
        HexText::new("b3:", &self.0)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.text().as_str())
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::payload::read_str(deserializer, str::parse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pair of ASCII characters reads as the byte its two lower-case
    /// digits spell, or as none when either is not one; a wrong length
    /// reads as none.
    #[test]
    fn unhex_reads_exactly_lower_case_digit_pairs() {
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        for high in 0u8..128 {
            for low in 0u8..128 {
                let text = String::from_utf8(vec![b'7', b'f', high, low]).expect("ascii");
                let expected = digit(high)
                    .zip(digit(low))
                    .map(|(high, low)| [0x7f, high << 4 | low]);
                assert_eq!(unhex::<2>(&text), expected, "{text:?}");
            }
        }
        assert_eq!(unhex::<1>("7"), None);
        assert_eq!(unhex::<1>("7f0"), None);
        assert_eq!(unhex::<1>("é"), None);
        assert_eq!(unhex::<2>("éé"), None);
    }

    /// Every byte in every position of a word writes its two digits, as a
    /// table of the sixteen digits would.
    #[test]
    fn hex_is_each_bytes_two_digits() {
        let digits =
            |bytes: &[u8]| -> String { bytes.iter().map(|byte| format!("{byte:02x}")).collect() };
        for byte in 0..=255u8 {
            for at in 0..4 {
                let mut quad = [0x5a; 4];
                quad[at] = byte;
                assert_eq!(hex_quad(quad).to_vec(), digits(&quad).into_bytes());
            }
        }
        let bytes: Vec<u8> = (0..32u8).map(|n| n.wrapping_mul(37) ^ 0xc3).collect();
        for len in 0..=32 {
            let text = HexText::new("p_", &bytes[..len]);
            assert_eq!(text.as_str(), format!("p_{}", digits(&bytes[..len])));
        }
    }

    #[test]
    fn hex_reads_back_lower_case_digits_only() {
        let bytes: [u8; 4] = [0x00, 0x9f, 0xa0, 0xff];
        let text = hex(&bytes);
        assert_eq!(text, "009fa0ff");
        assert_eq!(unhex::<4>(&text), Some(bytes));
        for bad in [
            "009FA0FF",
            "009fa0fg",
            "009fa0f",
            "009fa0fff",
            "009f a0f",
            "+09fa0ff",
        ] {
            assert_eq!(unhex::<4>(bad), None, "{bad}");
        }
        for byte in 0..=255u8 {
            assert_eq!(unhex::<1>(&hex(&[byte])), Some([byte]));
        }
    }

    #[test]
    fn cached_hashers_match_derive_key() {
        for (index, purpose) in Purpose::ALL.into_iter().enumerate() {
            assert_eq!(purpose as usize, index, "ALL is in declaration order");
            let mut fresh = blake3::Hasher::new_derive_key(purpose.context());
            fresh.update(b"some bytes");
            assert_eq!(
                Digest::of(purpose, b"some bytes").as_bytes(),
                fresh.finalize().as_bytes()
            );
        }
    }

    /// Each thread's kept hashers start every digest afresh: after long
    /// inputs (several chunks, so their stack of chaining values is used),
    /// after other purposes and on other threads, a digest is the one a new
    /// derive-key hasher gives.
    #[test]
    fn kept_hashers_start_every_digest_afresh() {
        let fresh = |purpose: Purpose, bytes: &[u8]| {
            let mut hasher = blake3::Hasher::new_derive_key(purpose.context());
            hasher.update(bytes);
            Digest(*hasher.finalize().as_bytes())
        };
        let long = vec![7u8; 5 * 1024 + 3];
        let check = || {
            for purpose in Purpose::ALL {
                for bytes in [&b"short"[..], &long, &b""[..], &b"short"[..]] {
                    assert_eq!(Digest::of(purpose, bytes), fresh(purpose, bytes));
                }
                let parts: [&[u8]; 2] = [&long, b"tail"];
                let mut joined = Vec::new();
                for part in parts {
                    joined.extend_from_slice(&(part.len() as u64).to_le_bytes());
                    joined.extend_from_slice(part);
                }
                assert_eq!(Digest::of_parts(purpose, &parts), fresh(purpose, &joined));
            }
        };
        check();
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(check);
            }
        });
        check();
    }

    #[test]
    fn purposes_separate_digests() {
        assert_ne!(
            Digest::of(Purpose::Payload, b"x"),
            Digest::of(Purpose::Identity, b"x")
        );
    }

    proptest::proptest! {
        /// Gathering short parts changes nothing hashed: the digest is
        /// that of every prefix and part given to the hasher one by one.
        #[test]
        fn parts_hash_as_their_prefixed_concatenation(
            parts in proptest::collection::vec(
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
                0..6,
            ),
        ) {
            let mut hasher = Purpose::LogChain.hasher();
            for part in &parts {
                hasher.update(&(part.len() as u64).to_le_bytes());
                hasher.update(part);
            }
            let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            proptest::prop_assert_eq!(
                Digest::of_parts(Purpose::LogChain, &slices),
                Digest(*hasher.finalize().as_bytes())
            );
        }
    }

    /// The gathering buffer's edges: a prefix that no longer fits, a part
    /// that fills it exactly, and one longer than it.
    #[test]
    fn parts_at_the_gathering_buffers_edges_hash_as_given() {
        let parts: [&[u8]; 6] = [&[1; 113], &[2; 0], &[3; 112], &[4; 7], &[5; 200], &[6; 1]];
        for count in 1..=parts.len() {
            for start in 0..count {
                let parts = &parts[start..count];
                let mut hasher = Purpose::Identity.hasher();
                for part in parts {
                    hasher.update(&(part.len() as u64).to_le_bytes());
                    hasher.update(part);
                }
                assert_eq!(
                    Digest::of_parts(Purpose::Identity, parts),
                    Digest(*hasher.finalize().as_bytes()),
                    "{} parts from {start}",
                    parts.len()
                );
            }
        }
    }

    #[test]
    fn parts_are_unambiguous() {
        assert_ne!(
            Digest::of_parts(Purpose::Identity, &[b"ab", b"c"]),
            Digest::of_parts(Purpose::Identity, &[b"a", b"bc"])
        );
    }

    #[test]
    fn text_round_trip_and_rejections() {
        let digest = Digest::of(Purpose::Payload, b"hello");
        let text = digest.to_string();
        assert!(text.starts_with("b3:"));
        assert_eq!(text.parse::<Digest>(), Ok(digest));
        assert!("b3:zz".parse::<Digest>().is_err());
        assert!(text.to_uppercase().parse::<Digest>().is_err());
        assert!(text.trim_start_matches("b3:").parse::<Digest>().is_err());
    }
}
