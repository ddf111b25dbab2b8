//! Escaping string contents as serde_json does: `"`, `\\` and control
//! characters, the common ones by their short forms. Most text has
//! nothing to escape, which is checked a block or a word at a time.

use super::append;

/// Appends `text` escaped as serde_json escapes string contents: `"`, `\\`
/// and control characters only, the common ones by their short forms.
#[inline]
pub(super) fn escape_into(out: &mut String, text: &str) {
    // Most text has nothing to escape: look for that a block or a word at a
    // time.
    if needs_escape(text.as_bytes()) {
        escape_slow(out, text);
    } else {
        append(out, text);
    }
}

/// [`escape_into`] for text that has something to escape: the next byte
/// to escape is found a word at a time ([`next_escape`]), and the plain
/// run before it copied at once. JSON text kept as a string (a state's
/// change) has a quote every few bytes, so this is most of its encoding.
#[cold]
fn escape_slow(out: &mut String, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = text.as_bytes();
    let mut plain = 0;
    // Every byte escaped is ASCII, so the text between them is cut at
    // character boundaries.
    while let Some(at) = next_escape(bytes, plain) {
        let byte = bytes[at];
        append(out, &text[plain..at]);
        plain = at + 1;
        let short = match byte {
            b'"' => '"',
            b'\\' => '\\',
            b'\n' => 'n',
            b'\r' => 'r',
            b'\t' => 't',
            0x08 => 'b',
            0x0c => 'f',
            _ => 'u',
        };
        out.push('\\');
        out.push(short);
        if short == 'u' {
            out.push_str("00");
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
    }
    append(out, &text[plain..]);
}

const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);

/// The high bit of each byte of `word` below `limit` (at most 0x80) may be
/// set, and some is exactly when some byte is: the classic test for "has a
/// byte less than". A byte is flagged without being below `limit` only
/// above one that is (a borrow carries upward), so in a little-endian word
/// the lowest flagged byte is the first such byte.
fn below(word: u64, limit: u8) -> u64 {
    word.wrapping_sub(ONES * u64::from(limit)) & !word & HIGHS
}

/// Whether `byte` is written escaped: `"`, `\\` or a control character.
fn to_escape(byte: u8) -> bool {
    byte < 0x20 || byte == b'"' || byte == b'\\'
}

/// [`below`]'s flags for the bytes of `word` to escape: `"`, `\\` and
/// control characters.
fn escapes(word: u64) -> u64 {
    below(word, 0x20)
        | below(word ^ (ONES * u64::from(b'"')), 1)
        | below(word ^ (ONES * u64::from(b'\\')), 1)
}

/// The first byte at or after `from` that is `"`, `\\` or a control
/// character, looked for eight bytes at a time: in a little-endian word
/// the lowest byte flagged by the "has a byte less than" test is the first
/// such byte (its false positives only follow a true one).
fn next_escape(bytes: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(eight) = bytes.get(at..at + 8) {
        let found = escapes(u64::from_le_bytes(eight.try_into().expect("eight bytes")));
        if found != 0 {
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    bytes[at.min(bytes.len())..]
        .iter()
        .position(|&byte| to_escape(byte))
        .map(|offset| at + offset)
}

/// Whether any byte of `bytes` is `"`, `\\` or a control character,
/// checked a block of [`BLOCK`] bytes at a time, then a word at a time;
/// the last few bytes are checked as one more word (the last eight bytes
/// again; in text shorter than a word, its first four and last four bytes,
/// or its bytes one by one below four), since most strings written are
/// keys and ids shorter than a few words.
#[inline]
pub(super) fn needs_escape(bytes: &[u8]) -> bool {
    fn word(eight: &[u8]) -> u64 {
        u64::from_ne_bytes(eight.try_into().expect("eight bytes"))
    }
    // Long text a block at a time, a form the compiler turns into vector
    // compares (about three times the words' speed over a 250 KB string);
    // the words take the rest.
    let mut blocks = bytes.chunks_exact(BLOCK);
    if blocks.any(block_escapes) {
        return true;
    }
    let bytes = blocks.remainder();
    let mut chunks = bytes.chunks_exact(8);
    if chunks.any(|chunk| escapes(word(chunk)) != 0) {
        return true;
    }
    let rest = chunks.remainder();
    let last = match (bytes.len().checked_sub(8), rest.len()) {
        (_, 0) => return false,
        (Some(from), _) => word(&bytes[from..]),
        // Shorter than a word: its first four bytes and its last four
        // (overlapping) make one, without copying it anywhere.
        (None, 4..) => {
            let half = |four: &[u8]| u32::from_ne_bytes(four.try_into().expect("four bytes"));
            u64::from(half(&rest[..4])) | (u64::from(half(&rest[rest.len() - 4..])) << 32)
        }
        (None, _) => {
            return rest.iter().any(|&byte| to_escape(byte));
        }
    };
    escapes(last) != 0
}

/// The bytes [`needs_escape`] checks together.
pub(crate) const BLOCK: usize = 64;

/// Whether a block holds a byte to escape: every byte compared, no early
/// exit inside the block, so that the loop vectorizes.
pub(crate) fn block_escapes(block: &[u8]) -> bool {
    let mut found = false;
    for &byte in block {
        found |= (byte < 0x20) | (byte == b'"') | (byte == b'\\');
    }
    found
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::next_escape;

    proptest! {
        /// From any place, the word-at-a-time search finds the byte a
        /// byte-by-byte search finds, with bytes to escape anywhere (as
        /// many as JSON text kept as a string has) or none.
        #[test]
        fn the_next_byte_to_escape_is_the_first_one(
            bytes in proptest::collection::vec(
                prop_oneof![
                    Just(b'"'), Just(b'\\'), 0u8..0x20, 0x20u8..=0xff, 0x20u8..=0xff, 0x20u8..=0xff,
                ],
                0..80,
            ),
            from_share in 0.0f64..=1.0,
        ) {
            let from = (bytes.len() as f64 * from_share) as usize;
            let expected = bytes[from..]
                .iter()
                .position(|&byte| byte < 0x20 || byte == b'"' || byte == b'\\')
                .map(|offset| from + offset);
            prop_assert_eq!(next_escape(&bytes, from), expected);
        }
    }
}
