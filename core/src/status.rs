//! The overload status rule: which HTTP status an overload rejection gets.
//!
//! A leaf module, so that both [`crate::error`] (`Reason::http_status`) and
//! [`crate::http`] (which re-exports these items as their one public path)
//! use the rule without importing each other.

use std::sync::OnceLock;

/// Environment variable overriding the overload status code.
pub const OVERLOAD_STATUS_ENV: &str = "DYN_HTTP_OVERLOAD_STATUS_CODE";
/// The overload status used when none (or an invalid one) is configured.
pub const DEFAULT_OVERLOAD_STATUS: u16 = 529;

/// The overload status rule applied to the raw env value.
pub fn parse_overload_status(raw: Option<&str>) -> u16 {
    raw.and_then(|s| s.trim().parse::<u16>().ok())
        .filter(|code| (200..=999).contains(code))
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
