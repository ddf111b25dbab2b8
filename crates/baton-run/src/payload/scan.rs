//! The canonical scanner: says "certainly canonical" of text that is
//! already exactly a payload's encoding, so parsing it needs no tree of
//! values and no re-encoding.

use super::plain_run;

/// Whether `text` is certainly canonical JSON (see [`Canonical`]); `false`
/// also for canonical texts the scanner leaves to the general path.
pub(crate) fn is_canonical(text: &str) -> bool {
    canonical_depth(text).is_some()
}

/// The nesting depth of `text` when it is already exactly the canonical
/// encoding, so parsing it needs no tree of values and no re-encoding
/// (records and states read back, and texts assembled from canonical
/// pieces, are). `None` sends the text down the general path, which also
/// classifies every error: this check only ever says "certainly canonical".
pub(super) fn canonical_depth(text: &str) -> Option<usize> {
    let mut scanner = Canonical {
        bytes: text.as_bytes(),
        at: 0,
        deepest: 0,
    };
    (scanner.value(0).is_some() && scanner.at == text.len()).then_some(scanner.deepest)
}

/// A scanner that accepts only canonical JSON: no whitespace, object keys
/// without escapes in strictly increasing byte order (so no duplicates),
/// strings escaped exactly as serde_json escapes them, and integers that
/// fit 64 bits without a sign on zero. Floats, escaped keys and nesting
/// deeper than serde_json's limit are left to the general path.
struct Canonical<'a> {
    bytes: &'a [u8],
    at: usize,
    /// The deepest nesting met so far.
    deepest: usize,
}

impl<'a> Canonical<'a> {
    /// Below serde_json's recursion limit (deeper texts take the general
    /// path, which reports the limit).
    const MAX_DEPTH: usize = 100;

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.bytes[self.at..]
            .starts_with(word)
            .then(|| self.at += word.len())
    }

    fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b'"' => self.string().map(|_| ()),
            b'-' | b'0'..=b'9' => self.integer(),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => None,
        }
    }

    fn object(&mut self, depth: usize) -> Option<()> {
        if depth > Self::MAX_DEPTH {
            return None;
        }
        self.deepest = self.deepest.max(depth);
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        let mut previous: Option<&'a [u8]> = None;
        loop {
            let (key, escaped) = self.string()?;
            if escaped || previous.is_some_and(|previous| previous >= key) {
                return None;
            }
            previous = Some(key);
            self.eat(b':')?;
            self.value(depth)?;
            if self.eat(b'}').is_some() {
                return Some(());
            }
            self.eat(b',')?;
        }
    }

    fn array(&mut self, depth: usize) -> Option<()> {
        if depth > Self::MAX_DEPTH {
            return None;
        }
        self.deepest = self.deepest.max(depth);
        self.eat(b'[')?;
        if self.eat(b']').is_some() {
            return Some(());
        }
        loop {
            self.value(depth)?;
            if self.eat(b']').is_some() {
                return Some(());
            }
            self.eat(b',')?;
        }
    }

    /// A string's raw contents (between the quotes) and whether it has
    /// escapes.
    fn string(&mut self) -> Option<(&'a [u8], bool)> {
        let bytes = self.bytes;
        self.eat(b'"')?;
        let start = self.at;
        let mut escaped = false;
        loop {
            self.at += plain_run(bytes.get(self.at..)?);
            match self.peek()? {
                b'"' => {
                    let contents = &bytes[start..self.at];
                    self.at += 1;
                    return Some((contents, escaped));
                }
                b'\\' => {
                    escaped = true;
                    self.at += 1;
                    match self.peek()? {
                        b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't' => self.at += 1,
                        b'u' => {
                            // serde_json writes `\u00xx` (lower-case hex) only
                            // for control characters without a short escape.
                            let hex = self.bytes.get(self.at + 1..self.at + 5)?;
                            let code = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok();
                            let short = matches!(code, Some(0x08 | 0x09 | 0x0a | 0x0c | 0x0d));
                            if !hex.starts_with(b"00")
                                || hex.iter().any(u8::is_ascii_uppercase)
                                || code.is_none_or(|code| code >= 0x20)
                                || short
                            {
                                return None;
                            }
                            self.at += 5;
                        }
                        _ => return None,
                    }
                }
                0x00..=0x1f => return None,
                _ => self.at += 1,
            }
        }
    }

    /// An integer in serde_json's form that it reads back as an integer.
    fn integer(&mut self) -> Option<()> {
        let negative = self.eat(b'-').is_some();
        let digits = self.at;
        while self.peek().is_some_and(|byte| byte.is_ascii_digit()) {
            self.at += 1;
        }
        let text = &self.bytes[digits..self.at];
        if text.is_empty()
            || (text.len() > 1 && text[0] == b'0')
            || matches!(self.peek(), Some(b'.' | b'e' | b'E'))
        {
            return None;
        }
        // Digits without a leading zero fit when they are fewer than the
        // limit's, or as many and not above it (same-length digit strings
        // compare as their numbers do).
        let limit: &[u8] = if negative {
            b"9223372036854775808"
        } else {
            b"18446744073709551615"
        };
        let fits = text.len() < limit.len() || (text.len() == limit.len() && text <= limit);
        (fits && !(negative && text == b"0")).then_some(())
    }
}
