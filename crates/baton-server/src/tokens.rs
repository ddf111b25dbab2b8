//! API tokens bound to scopes, kept only as blake3 hashes.
//!
//! A token is configured at start (from a file of `SCOPE TOKEN` lines, an
//! environment variable of the same form, or code) and never kept in clear:
//! the host keeps the keyed hash of each token and the scope it is bound to,
//! and a request's bearer token is hashed the same way and looked up.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use baton::run::Scope;

/// The derive-key context of token hashes (one fixed, dated context per
/// purpose, as the kernel's digests have).
const CONTEXT: &str = "baton-server 2026-12-03 api token";

/// The shortest token accepted, in bytes: a token is a secret, not a name.
pub const MIN_TOKEN_BYTES: usize = 16;

/// The hash of a token, as kept.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct TokenHash([u8; 32]);

impl TokenHash {
    fn of(token: &str) -> TokenHash {
        TokenHash(blake3::derive_key(CONTEXT, token.as_bytes()))
    }
}

/// Why a token or a tokens file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// A line is not `SCOPE TOKEN`.
    #[error("serve.tokens.malformed: {source_name} line {line}: expected `SCOPE TOKEN`")]
    Malformed {
        /// The file or variable the line came from.
        source_name: String,
        /// The line number, from 1.
        line: usize,
    },
    /// The scope is not a valid scope.
    #[error("serve.tokens.scope: {source_name} line {line}: {message}")]
    Scope {
        /// The file or variable the line came from.
        source_name: String,
        /// The line number, from 1.
        line: usize,
        /// Why the scope is invalid.
        message: String,
    },
    /// The token is shorter than [`MIN_TOKEN_BYTES`].
    #[error(
        "serve.tokens.short: {source_name} line {line}: a token needs at least {MIN_TOKEN_BYTES} bytes"
    )]
    Short {
        /// The file or variable the line came from.
        source_name: String,
        /// The line number, from 1.
        line: usize,
    },
    /// The same token was given twice.
    #[error("serve.tokens.duplicate: {source_name} line {line}: the token was given before")]
    Duplicate {
        /// The file or variable the line came from.
        source_name: String,
        /// The line number, from 1.
        line: usize,
    },
    /// The tokens file could not be read.
    #[error("serve.tokens.unreadable: cannot read {}: {source}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The environment variable is not set (or not valid UTF-8).
    #[error("serve.tokens.unset: the environment variable {name} is not set")]
    Unset {
        /// The variable.
        name: String,
    },
}

impl TokenError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            TokenError::Malformed { .. } => "serve.tokens.malformed",
            TokenError::Scope { .. } => "serve.tokens.scope",
            TokenError::Short { .. } => "serve.tokens.short",
            TokenError::Duplicate { .. } => "serve.tokens.duplicate",
            TokenError::Unreadable { .. } => "serve.tokens.unreadable",
            TokenError::Unset { .. } => "serve.tokens.unset",
        }
    }
}

/// API tokens and the scope each is bound to; the tokens themselves are
/// kept only as hashes. A token sees exactly its one scope.
#[derive(Clone, Default)]
pub struct Tokens {
    by_hash: BTreeMap<TokenHash, Scope>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Hashes are not secrets, but there is nothing to learn from them.
        f.debug_struct("Tokens")
            .field("count", &self.by_hash.len())
            .finish()
    }
}

impl Tokens {
    /// No tokens: every request but health is refused.
    pub fn new() -> Tokens {
        Tokens::default()
    }

    /// Binds `token` to `scope`; a token shorter than [`MIN_TOKEN_BYTES`] or
    /// given twice is refused.
    pub fn insert(&mut self, scope: Scope, token: &str) -> Result<(), TokenError> {
        self.add("code", 1, scope, token)
    }

    fn add(
        &mut self,
        source_name: &str,
        line: usize,
        scope: Scope,
        token: &str,
    ) -> Result<(), TokenError> {
        if token.len() < MIN_TOKEN_BYTES {
            return Err(TokenError::Short {
                source_name: source_name.to_owned(),
                line,
            });
        }
        let hash = TokenHash::of(token);
        if self.by_hash.contains_key(&hash) {
            return Err(TokenError::Duplicate {
                source_name: source_name.to_owned(),
                line,
            });
        }
        self.by_hash.insert(hash, scope);
        Ok(())
    }

    /// Adds the tokens of `text`: one `SCOPE TOKEN` per line (blank lines
    /// and lines starting with `#` are skipped). `source_name` names the
    /// text in errors.
    pub fn extend_from_text(&mut self, source_name: &str, text: &str) -> Result<(), TokenError> {
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let mut words = trimmed.split_whitespace();
            let (Some(scope), Some(token), None) = (words.next(), words.next(), words.next())
            else {
                return Err(TokenError::Malformed {
                    source_name: source_name.to_owned(),
                    line,
                });
            };
            let scope = Scope::new(scope).map_err(|error| TokenError::Scope {
                source_name: source_name.to_owned(),
                line,
                message: error.to_string(),
            })?;
            self.add(source_name, line, scope, token)?;
        }
        Ok(())
    }

    /// Adds the tokens of a file of `SCOPE TOKEN` lines.
    pub fn extend_from_file(&mut self, path: &Path) -> Result<(), TokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Unreadable {
            path: path.to_owned(),
            source,
        })?;
        self.extend_from_text(&path.display().to_string(), &text)
    }

    /// Adds the tokens of the environment variable `name`, which holds
    /// `SCOPE TOKEN` lines as a file would.
    pub fn extend_from_env(&mut self, name: &str) -> Result<(), TokenError> {
        let text = std::env::var(name).map_err(|_| TokenError::Unset {
            name: name.to_owned(),
        })?;
        self.extend_from_text(name, &text)
    }

    /// How many tokens are configured.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether no token is configured.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// The scope a presented token is bound to, if any.
    pub fn scope_of(&self, token: &str) -> Option<&Scope> {
        self.by_hash.get(&TokenHash::of(token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(name: &str) -> Scope {
        Scope::new(name).unwrap()
    }

    #[test]
    fn a_token_file_binds_each_token_to_its_scope_and_skips_comments() {
        let mut tokens = Tokens::new();
        tokens
            .extend_from_text(
                "tokens",
                "# operators\nteam-a aaaaaaaaaaaaaaaaaaaa\n\n  team-b   bbbbbbbbbbbbbbbbbbbb  \n",
            )
            .unwrap();
        assert_eq!(tokens.len(), 2);
        assert_eq!(
            tokens.scope_of("aaaaaaaaaaaaaaaaaaaa"),
            Some(&scope("team-a"))
        );
        assert_eq!(
            tokens.scope_of("bbbbbbbbbbbbbbbbbbbb"),
            Some(&scope("team-b"))
        );
        assert_eq!(tokens.scope_of("cccccccccccccccccccc"), None);
        assert_eq!(tokens.scope_of(""), None);
    }

    #[test]
    fn malformed_short_and_duplicate_tokens_are_refused_with_their_line() {
        let mut tokens = Tokens::new();
        let error = tokens.extend_from_text("f", "team-a\n").unwrap_err();
        assert_eq!(error.code(), "serve.tokens.malformed");
        let error = tokens
            .extend_from_text("f", "\nteam-a short\n")
            .unwrap_err();
        assert!(
            matches!(error, TokenError::Short { line: 2, .. }),
            "{error}"
        );
        let error = tokens
            .extend_from_text("f", "a xxxxxxxxxxxxxxxxxxxx\nb xxxxxxxxxxxxxxxxxxxx\n")
            .unwrap_err();
        assert!(
            matches!(error, TokenError::Duplicate { line: 2, .. }),
            "{error}"
        );
        let error = tokens
            .extend_from_text("f", "Not A Scope! yyyyyyyyyyyyyyyyyyyyyyy\n")
            .unwrap_err();
        assert_eq!(error.code(), "serve.tokens.malformed");
    }

    #[test]
    fn tokens_load_from_a_file_and_a_missing_file_or_variable_is_named() {
        let dir = std::env::temp_dir().join(format!("baton-server-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens");
        std::fs::write(&path, "ops 0123456789abcdef0123\n").unwrap();
        let mut tokens = Tokens::new();
        tokens.extend_from_file(&path).unwrap();
        assert_eq!(tokens.scope_of("0123456789abcdef0123"), Some(&scope("ops")));
        let error = tokens.extend_from_file(&dir.join("absent")).unwrap_err();
        assert_eq!(error.code(), "serve.tokens.unreadable");
        assert!(error.to_string().contains("absent"), "{error}");
        let error = tokens
            .extend_from_env("BATON_SERVER_TEST_TOKENS_THAT_ARE_NOT_SET")
            .unwrap_err();
        assert_eq!(error.code(), "serve.tokens.unset");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_debug_form_shows_no_token() {
        let mut tokens = Tokens::new();
        tokens.insert(scope("a"), "secret-secret-secret").unwrap();
        let shown = format!("{tokens:?}");
        assert!(!shown.contains("secret"), "{shown}");
    }
}
