//! Content-defined chunking: how large record bodies and snapshot states are
//! split into pieces that are stored once per tree by digest.
//!
//! A record of a step carries the process's whole execution state, so a
//! 250 KB state that changes a few bytes per step would cost 250 KB per step
//! if bodies were stored whole. Instead a body longer than [`INLINE_MAX`] is
//! cut where a rolling gear hash over the last 64 bytes hits a pattern (so
//! cut points depend on content, not on offsets, and an edit only moves the
//! cuts next to it), each piece is stored once per tree under its blake3
//! digest, and the record keeps a manifest of piece ids. Reassembly
//! concatenates the pieces in manifest order, so the bytes read back are
//! exactly the bytes that were hashed into the log chain.

/// Bodies up to this many bytes are stored inline in their row.
pub(crate) const INLINE_MAX: usize = 4096;

/// The blake3 derive-key context of piece digests.
const CONTEXT: &str = "baton-store-sqlite 2026-12-01 chunk v1";

/// The digest a piece is stored under.
pub(crate) fn digest(piece: &[u8]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new_derive_key(CONTEXT);
    hasher.update(piece);
    *hasher.finalize().as_bytes()
}

/// The blake3 derive-key context of snapshot state digests.
const STATE_CONTEXT: &str = "baton-store-sqlite 2026-12-01 snapshot state v1";

/// The digest of a whole snapshot state, checked when it is read back
/// (records are covered by the log chain; snapshot states are not).
pub(crate) fn state_digest(state: &[u8]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new_derive_key(STATE_CONTEXT);
    hasher.update(state);
    *hasher.finalize().as_bytes()
}

/// Appends `value` as an unsigned LEB128 varint.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Decodes a manifest of varints; `None` if it is malformed.
pub(crate) fn read_varints(mut bytes: &[u8]) -> Option<Vec<u64>> {
    let mut values = Vec::with_capacity(bytes.len() / 2);
    while !bytes.is_empty() {
        values.push(read_varint(&mut bytes)?);
    }
    Some(values)
}

/// Decodes the varint `bytes` starts with and moves past it; `None` if it
/// is cut short or too long.
pub(crate) fn read_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    let mut shift = 0u32;
    loop {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        if shift > 63 {
            return None;
        }
        value |= u64::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip() {
        let values = [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX];
        let mut bytes = Vec::new();
        for value in values {
            put_varint(&mut bytes, value);
        }
        assert_eq!(read_varints(&bytes), Some(values.to_vec()));
        assert_eq!(read_varints(&[0x80]), None);
    }
}
