//! How the console signs in: the API token held in an `HttpOnly`,
//! `SameSite=Strict` cookie, and the CSRF tokens every form post carries.
//!
//! A signed-in page's CSRF token is the keyed hash of the API token under a
//! secret drawn when the host starts, so only a page this host rendered for
//! that token knows it (and a restart makes open pages' forms stale, which
//! they then say). The sign-in form, before any token, uses a double-submit
//! nonce: the same random value in a cookie and in the form.

use std::sync::Arc;

use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use baton::run::Scope;

use crate::host::Host;

/// The cookie that holds the API token.
pub(crate) const TOKEN_COOKIE: &str = "baton_token";

/// The cookie that holds the sign-in form's nonce.
pub(crate) const LOGIN_COOKIE: &str = "baton_login";

/// The header a script sends the CSRF token in when it posts to the API
/// with the cookie rather than a bearer token.
pub(crate) const CSRF_HEADER: &str = "x-baton-csrf";

/// The derive-key context of the CSRF key (one fixed, dated context per
/// purpose, as the token hashes have).
const CONTEXT: &str = "baton-server 2026-12-03 console csrf";

/// The per-host secret CSRF tokens are keyed with.
#[derive(Clone)]
pub(crate) struct CsrfKey([u8; 32]);

impl std::fmt::Debug for CsrfKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CsrfKey(..)")
    }
}

impl CsrfKey {
    /// A key from the operating system's random source.
    pub(crate) fn random() -> Result<CsrfKey, getrandom::Error> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed)?;
        Ok(CsrfKey(blake3::derive_key(CONTEXT, &seed)))
    }

    fn hash(&self, api_token: &str) -> blake3::Hash {
        blake3::keyed_hash(&self.0, api_token.as_bytes())
    }

    /// The CSRF token of pages rendered for `api_token`.
    pub(crate) fn token_for(&self, api_token: &str) -> String {
        self.hash(api_token).to_hex().to_string()
    }

    /// Whether `presented` is the CSRF token of `api_token` (compared in
    /// constant time).
    pub(crate) fn check(&self, api_token: &str, presented: &str) -> bool {
        blake3::Hash::from_hex(presented.trim()).is_ok_and(|hash| hash == self.hash(api_token))
    }
}

/// A fresh random nonce, as hex (the sign-in form's double submit).
pub(crate) fn nonce() -> Option<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).ok()?;
    Some(blake3::Hash::from_bytes(bytes).to_hex().to_string())
}

/// Whether two nonces are equal (compared in constant time).
pub(crate) fn same_nonce(a: &str, b: &str) -> bool {
    match (
        blake3::Hash::from_hex(a.trim()),
        blake3::Hash::from_hex(b.trim()),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The value of the cookie `name` in a request's `Cookie` headers.
pub(crate) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim_matches('"').to_owned())
}

/// Whether the request came through a proxy that terminated TLS, so the
/// cookie is marked `Secure`.
fn secure(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|proto| proto.eq_ignore_ascii_case("https"))
}

/// A `Set-Cookie` value: `HttpOnly`, `SameSite=Strict`, on `path`; `None`
/// as `value` clears the cookie.
pub(crate) fn set_cookie(
    request: &HeaderMap,
    name: &str,
    value: Option<&str>,
    path: &str,
) -> HeaderValue {
    let mut text = match value {
        Some(value) => format!("{name}={value}; Path={path}; HttpOnly; SameSite=Strict"),
        None => format!("{name}=; Path={path}; HttpOnly; SameSite=Strict; Max-Age=0"),
    };
    if secure(request) {
        text.push_str("; Secure");
    }
    // Tokens and nonces are checked printable ASCII, so this always holds.
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Whether `token` may travel in a cookie: printable ASCII without the
/// characters a cookie value cannot hold.
pub(crate) fn cookie_safe(token: &str) -> bool {
    !token.is_empty()
        && token
            .bytes()
            .all(|byte| byte.is_ascii_graphic() && !matches!(byte, b';' | b',' | b'"' | b'\\'))
}

/// A signed-in console user: the scope its token sees, the token and the
/// CSRF token its forms carry.
#[derive(Clone, Debug)]
pub(crate) struct Session {
    /// The token's scope.
    pub(crate) scope: Scope,
    /// The CSRF token of this session's forms.
    pub(crate) csrf: String,
}

impl Session {
    /// Whether a posted form's CSRF token is this session's.
    pub(crate) fn accepts(&self, presented: &str) -> bool {
        same_nonce(&self.csrf, presented)
    }
}

/// Why a page could not be shown to the caller: not signed in, or signed
/// in with a token the host no longer accepts.
pub(crate) enum SignedOut {
    /// No cookie: to the sign-in page.
    Missing,
    /// A cookie with a token this host does not know.
    Rejected,
}

impl IntoResponse for SignedOut {
    fn into_response(self) -> Response {
        match self {
            SignedOut::Missing => Redirect::to("/login").into_response(),
            SignedOut::Rejected => {
                let mut response = Redirect::to("/login?reason=rejected").into_response();
                if let Ok(value) = HeaderValue::from_str(&format!(
                    "{TOKEN_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
                )) {
                    response.headers_mut().insert(header::SET_COOKIE, value);
                }
                response
            }
        }
    }
}

/// The API token of the cookie, if one is sent.
pub(crate) fn cookie_token(headers: &HeaderMap) -> Option<String> {
    cookie(headers, TOKEN_COOKIE).filter(|token| !token.is_empty())
}

impl axum::extract::FromRequestParts<Arc<Host>> for Session {
    type Rejection = SignedOut;

    async fn from_request_parts(parts: &mut Parts, host: &Arc<Host>) -> Result<Session, SignedOut> {
        let token = cookie_token(&parts.headers).ok_or(SignedOut::Missing)?;
        let scope = host
            .tokens
            .scope_of(&token)
            .ok_or(SignedOut::Rejected)?
            .clone();
        Ok(Session {
            scope,
            csrf: host.csrf.token_for(&token),
        })
    }
}

/// The status of a refused form: its CSRF token is not this session's.
pub(crate) const STALE_FORM: StatusCode = StatusCode::FORBIDDEN;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_csrf_token_is_bound_to_its_api_token_and_to_the_host_key() {
        let key = CsrfKey::random().unwrap();
        let other = CsrfKey::random().unwrap();
        let token = key.token_for("token-of-scope-a-0123456789");
        assert!(key.check("token-of-scope-a-0123456789", &token));
        assert!(!key.check("token-of-scope-b-0123456789", &token));
        assert!(!other.check("token-of-scope-a-0123456789", &token));
        assert!(!key.check("token-of-scope-a-0123456789", "not hex"));
        assert!(!key.check("token-of-scope-a-0123456789", ""));
    }

    #[test]
    fn cookies_are_read_by_name_from_every_cookie_header() {
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("a=1; b=2"));
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("baton_token=tok-en; c=3"),
        );
        assert_eq!(cookie(&headers, "b").as_deref(), Some("2"));
        assert_eq!(cookie(&headers, TOKEN_COOKIE).as_deref(), Some("tok-en"));
        assert_eq!(cookie(&headers, "missing"), None);
    }

    #[test]
    fn the_cookie_is_http_only_and_same_site_strict_and_secure_behind_tls() {
        let mut request = HeaderMap::new();
        let plain = set_cookie(&request, TOKEN_COOKIE, Some("t"), "/");
        assert_eq!(
            plain.to_str().unwrap(),
            "baton_token=t; Path=/; HttpOnly; SameSite=Strict"
        );
        request.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        let tls = set_cookie(&request, TOKEN_COOKIE, None, "/");
        assert!(
            tls.to_str().unwrap().ends_with("Max-Age=0; Secure"),
            "{tls:?}"
        );
        assert!(cookie_safe("abc-DEF_123"));
        assert!(!cookie_safe("a;b") && !cookie_safe("a b") && !cookie_safe(""));
    }
}
