//! The overload status rule: which HTTP status an overload rejection gets.
//!
//! A leaf module, so that both [`crate::error`] (`Reason::http_status`) and
//! [`crate::http`] (which re-exports these items as their one public path)
//! use the rule without importing each other.

use std::ops::RangeInclusive;
use std::sync::OnceLock;

/// Environment variable overriding the overload status code.
pub const OVERLOAD_STATUS_ENV: &str = "DYN_HTTP_OVERLOAD_STATUS_CODE";
/// The overload status used when none (or an invalid one) is configured.
pub const DEFAULT_OVERLOAD_STATUS: u16 = 529;

/// Every code an HTTP status line can carry: three digits.
pub const STATUS_CODES: RangeInclusive<u16> = 100..=999;

/// Whether `code` is an HTTP status code (in [`STATUS_CODES`]); the check
/// every status a caller chooses for a rejection answer passes.
pub fn is_status_code(code: u16) -> bool {
    STATUS_CODES.contains(&code)
}

/// The overload status rule applied to the raw env value: a status code
/// that is not informational (1xx), else the default.
pub fn parse_overload_status(raw: Option<&str>) -> u16 {
    raw.and_then(|s| s.trim().parse::<u16>().ok())
        .filter(|code| is_status_code(*code) && *code >= 200)
        .unwrap_or(DEFAULT_OVERLOAD_STATUS)
}

/// The process's overload status: `DYN_HTTP_OVERLOAD_STATUS_CODE`, read once.
pub fn overload_status() -> u16 {
    static CODE: OnceLock<u16> = OnceLock::new();
    *CODE.get_or_init(|| parse_overload_status(std::env::var(OVERLOAD_STATUS_ENV).ok().as_deref()))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn status_codes_have_three_digits() {
        for code in [0, 1, 99, 1000, u16::MAX] {
            assert!(!is_status_code(code), "{code}");
        }
        for code in [100, 199, 200, 429, 529, 999] {
            assert!(is_status_code(code), "{code}");
        }
    }

    #[test]
    fn overload_status_parse_table() {
        for raw in [
            None,
            Some(""),
            Some("abc"),
            Some("99"),
            Some("100"),
            Some("199"),
            Some("1000"),
            Some("-529"),
            Some("5 29"),
        ] {
            assert_eq!(parse_overload_status(raw), 529, "{raw:?}");
        }
        for (raw, code) in [
            ("200", 200),
            (" 429 ", 429),
            ("503", 503),
            ("999", 999),
            ("\t529\n", 529),
        ] {
            assert_eq!(parse_overload_status(Some(raw)), code, "{raw:?}");
        }
    }
}
