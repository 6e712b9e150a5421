//! The priority class a request names in a header (`x-loadgate-priority` by
//! default): what a server's admission middleware asks before it admits a
//! request at a class of a gate with priority classes.
//!
//! A value is a class number (ASCII digits; past 255 it counts as 255, the
//! last class of any gate) or a name the server configured; spaces and tabs
//! around it are ignored. No header gives the default class; anything else
//! gives the class configured for unknown values (a client cannot buy a
//! better class with a malformed header). A proxy the server trusts should
//! set or strip the header: clients choose it otherwise.

use std::collections::HashMap;

/// The header a middleware reads by default.
pub const PRIORITY_HEADER: &str = "x-loadgate-priority";

/// How a header's value names a priority class (module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PriorityNames {
    /// Configured names (trimmed) and their classes.
    names: HashMap<Vec<u8>, u8>,
    /// The class of a request without the header.
    default: u8,
    /// The class of a value that is neither a number nor a name.
    unknown: u8,
}

impl PriorityNames {
    /// Names and their classes (a name is compared with the value's bytes,
    /// spaces and tabs around both ignored), the class of a request without
    /// the header, and the class of a value that names none.
    pub fn new<N: AsRef<[u8]>>(
        names: impl IntoIterator<Item = (N, u8)>,
        default: u8,
        unknown: u8,
    ) -> Self {
        let names = names
            .into_iter()
            .map(|(name, class)| (trim(name.as_ref()).to_vec(), class))
            .collect();
        Self {
            names,
            default,
            unknown,
        }
    }

    /// The class a request names: `value` is the header's raw value, or
    /// `None` without the header.
    pub fn class_of(&self, value: Option<&[u8]>) -> u8 {
        let Some(value) = value else {
            return self.default;
        };
        let value = trim(value);
        if let Some(&class) = self.names.get(value) {
            return class;
        }
        if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
            return self.unknown;
        }
        // Past 255 is past the last class too: no need to read on.
        value
            .iter()
            .try_fold(0u8, |n, d| n.checked_mul(10)?.checked_add(d - b'0'))
            .unwrap_or(u8::MAX)
    }
}

/// `value` without the spaces and tabs around it.
pub(super) fn trim(value: &[u8]) -> &[u8] {
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !blank(b)).unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !blank(b))
        .map_or(start, |i| i + 1);
    &value[start..end]
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_value_names_a_class_by_number_or_name_and_anything_else_is_unknown() {
        let p = PriorityNames::new([("interactive", 0), (" batch\t", 2)], 1, 3);
        assert_eq!(p.class_of(None), 1, "no header: the default");
        assert_eq!(p.class_of(Some(b"interactive")), 0);
        assert_eq!(p.class_of(Some(b" \tbatch ")), 2, "trimmed on both sides");
        assert_eq!(p.class_of(Some(b"2")), 2);
        assert_eq!(p.class_of(Some(b"007")), 7);
        assert_eq!(p.class_of(Some(b"255")), 255);
        assert_eq!(p.class_of(Some(b"256")), 255, "past the last class");
        assert_eq!(p.class_of(Some(&[b'9'; 10_000])), 255, "a long number");
        for bad in [
            &b""[..],
            b" ",
            b"-1",
            b"1.5",
            b"0x1",
            b"Batch",
            b"\xff",
            b"\xd9\xa3",
        ] {
            assert_eq!(p.class_of(Some(bad)), 3, "{bad:?}");
        }
    }
}
