//! Bearer-token protection of the control endpoint (`/busy_threshold`).
//!
//! A [`ControlAuth`] holds the one token a server accepts and whether reads
//! need it too; [`ControlAuth::verify`] is the single place the
//! `Authorization` header is judged. The token is compared in constant time
//! (`subtle`), so the time an answer takes does not tell how many leading
//! bytes of a guess were right; only the token's length can be learnt from
//! timing, as with every constant-time comparison of byte strings.

use std::fmt;

use subtle::ConstantTimeEq;

/// The `WWW-Authenticate` header value sent with every 401 answer.
pub const BEARER_CHALLENGE: &str = "Bearer";

/// The bearer token guarding the control endpoint, and whether reads need
/// it too.
///
/// With a token configured, a write (a `POST` that sets or clears a
/// threshold) must carry `Authorization: Bearer <token>`; reads (`GET`,
/// `HEAD`, and a `POST` that only reads) stay open unless `protect_reads` is
/// set. The scheme name is matched case-insensitively, the token exactly.
///
/// `Debug` never prints the token.
#[derive(Clone)]
pub struct ControlAuth {
    token: Box<[u8]>,
    protect_reads: bool,
}

/// A token [`ControlAuth::new`] refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlAuthError {
    /// The token is empty (it would make every request look authorised).
    EmptyToken,
    /// The token holds a byte that is not visible ASCII (`0x21..=0x7e`), so
    /// no client could send it in an `Authorization` header.
    UnsendableToken {
        /// Byte offset of the first such byte.
        position: usize,
    },
}

impl fmt::Display for ControlAuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlAuthError::EmptyToken => f.write_str("token must not be empty"),
            ControlAuthError::UnsendableToken { position } => write!(
                f,
                "token byte {position} is not visible ASCII (0x21..=0x7e), \
                 so no client could send it in an Authorization header"
            ),
        }
    }
}

impl std::error::Error for ControlAuthError {}

/// Why [`ControlAuth::verify`] refused a request (answered with 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `Authorization` header, another scheme than `Bearer`, or no token
    /// after the scheme.
    Missing,
    /// A bearer token that is not the configured one.
    Invalid,
}

impl AuthFailure {
    /// The message of the 401 body's `error` field.
    pub const fn message(self) -> &'static str {
        match self {
            AuthFailure::Missing => {
                "missing bearer token: send the header \"Authorization: Bearer <token>\""
            }
            AuthFailure::Invalid => "invalid bearer token",
        }
    }
}

impl fmt::Display for AuthFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for AuthFailure {}

impl ControlAuth {
    /// Guards writes (and reads too when `protect_reads`) with `token`.
    ///
    /// # Errors
    /// [`ControlAuthError::EmptyToken`] for `""`;
    /// [`ControlAuthError::UnsendableToken`] for a token with a space, a
    /// control character or a non-ASCII byte.
    pub fn new(token: impl Into<String>, protect_reads: bool) -> Result<Self, ControlAuthError> {
        let token = token.into().into_bytes();
        if token.is_empty() {
            return Err(ControlAuthError::EmptyToken);
        }
        if let Some(position) = token.iter().position(|b| !b.is_ascii_graphic()) {
            return Err(ControlAuthError::UnsendableToken { position });
        }
        Ok(Self {
            token: token.into_boxed_slice(),
            protect_reads,
        })
    }

    /// Whether reads need the token too.
    pub fn protect_reads(&self) -> bool {
        self.protect_reads
    }

    /// Judges a request's `Authorization` header value (`None` when the
    /// request has none): `Ok` for `Bearer <token>` with this token (scheme
    /// in any case, surrounding spaces and tabs ignored).
    ///
    /// # Errors
    /// [`AuthFailure::Missing`] without a bearer token,
    /// [`AuthFailure::Invalid`] with another one.
    pub fn verify(&self, authorization: Option<&str>) -> Result<(), AuthFailure> {
        let token = bearer_token(authorization).ok_or(AuthFailure::Missing)?;
        // Constant time over the configured token's length (a length
        // mismatch returns at once; see the module docs).
        if bool::from(token.as_bytes().ct_eq(&self.token)) {
            Ok(())
        } else {
            Err(AuthFailure::Invalid)
        }
    }
}

impl fmt::Debug for ControlAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlAuth")
            .field("token", &"<redacted>")
            .field("protect_reads", &self.protect_reads)
            .finish()
    }
}

/// The credentials of `Bearer <credentials>`, or `None` for a missing
/// header, another scheme, or an empty token.
fn bearer_token(authorization: Option<&str>) -> Option<&str> {
    let blank = |c: char| c == ' ' || c == '\t';
    let header = authorization?.trim_matches(blank);
    let (scheme, token) = header.split_once(blank)?;
    let token = token.trim_matches(blank);
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bearer_credentials_are_parsed_leniently_around_the_token_only() {
        assert_eq!(bearer_token(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("bEaReR \t abc ")), Some("abc"));
        assert_eq!(bearer_token(Some(" Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("Bearer a b")), Some("a b"));
        for missing in [
            None,
            Some(""),
            Some("Bearer"),
            Some("Bearer   "),
            Some("Basic abc"),
        ] {
            assert_eq!(bearer_token(missing), None, "{missing:?}");
        }
        assert_eq!(bearer_token(Some("Bearerabc")), None);
    }

    #[test]
    fn tokens_must_be_sendable() {
        assert_eq!(
            ControlAuth::new("", false).unwrap_err(),
            ControlAuthError::EmptyToken
        );
        assert_eq!(
            ControlAuth::new("ab cd", false).unwrap_err(),
            ControlAuthError::UnsendableToken { position: 2 }
        );
        assert!(ControlAuth::new("é", false).is_err());
        assert!(ControlAuth::new("tok\n", false).is_err());
        let auth = ControlAuth::new("s3cret-_.~+/=", true).unwrap();
        assert!(auth.protect_reads());
        assert!(!format!("{auth:?}").contains("s3cret"));
    }

    #[test]
    fn verify_tells_missing_from_invalid() {
        let auth = ControlAuth::new("s3cret", false).unwrap();
        assert_eq!(auth.verify(Some("Bearer s3cret")), Ok(()));
        assert_eq!(auth.verify(Some("bearer s3cret")), Ok(()));
        assert_eq!(auth.verify(None), Err(AuthFailure::Missing));
        assert_eq!(auth.verify(Some("Basic s3cret")), Err(AuthFailure::Missing));
        assert_eq!(
            auth.verify(Some("Bearer S3CRET")),
            Err(AuthFailure::Invalid)
        );
        assert_eq!(auth.verify(Some("Bearer s3cre")), Err(AuthFailure::Invalid));
        assert_eq!(
            auth.verify(Some("Bearer s3crett")),
            Err(AuthFailure::Invalid)
        );
    }
}
