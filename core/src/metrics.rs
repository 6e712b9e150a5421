//! Prometheus text exposition helpers shared by the monitor and the gate.
//!
//! Hot paths only bump plain atomics; this module turns them into text at
//! scrape time. Label values are escaped as the exposition format requires.

use std::fmt::{self, Write};

/// The default metric name prefix, as the reference system uses.
pub const DEFAULT_PREFIX: &str = "dynamo";

/// Upper bounds, in seconds, of the queue-wait histograms' buckets (the
/// gate's and the frontend queue's).
pub(crate) const WAIT_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Writes one histogram's samples over [`WAIT_BUCKETS`]: the cumulative
/// counts up to each bound, the total and the sum in nanoseconds, each
/// sample labelled `labels` (its header is the caller's).
pub(crate) fn wait_histogram(
    out: &mut String,
    prefix: &str,
    name: &str,
    labels: &[(&str, &dyn fmt::Display)],
    cumulative: &[u64; 16],
    total: u64,
    sum_nanos: u64,
) {
    let bucket = format!("{name}_bucket");
    let mut bucket_sample = |le: &dyn fmt::Display, count: u64| {
        let mut l: Vec<(&str, &dyn fmt::Display)> = labels.to_vec();
        l.push(("le", le));
        sample(out, prefix, &bucket, &l, count);
    };
    for (bound, count) in WAIT_BUCKETS.iter().zip(cumulative) {
        bucket_sample(bound, *count);
    }
    bucket_sample(&"+Inf", total);
    let sum = sum_nanos as f64 / 1e9;
    sample(out, prefix, &format!("{name}_sum"), labels, sum);
    sample(out, prefix, &format!("{name}_count"), labels, total);
}

/// Writes `# HELP` and `# TYPE` lines for one metric family.
pub(crate) fn header(out: &mut String, prefix: &str, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {prefix}_{name} {help}");
    let _ = writeln!(out, "# TYPE {prefix}_{name} {kind}");
}

/// Writes one sample line: `prefix_name{l1="v1",...} value`.
pub(crate) fn sample(
    out: &mut String,
    prefix: &str,
    name: &str,
    labels: &[(&str, &dyn fmt::Display)],
    value: impl fmt::Display,
) {
    let _ = write!(out, "{prefix}_{name}");
    if !labels.is_empty() {
        out.push('{');
        for (i, (key, val)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{key}=\"");
            escape_label(out, &val.to_string());
            out.push('"');
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// Escapes a label value: backslash, double quote and newline.
fn escape_label(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Checks that a metric prefix is a valid Prometheus name start.
pub(crate) fn valid_prefix(prefix: &str) -> bool {
    let mut chars = prefix.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut out = String::new();
        sample(&mut out, "p", "m", &[("model", &"a\"b\\c\nd")], 3);
        assert_eq!(out, "p_m{model=\"a\\\"b\\\\c\\nd\"} 3\n");
    }

    #[test]
    fn prefixes_are_validated() {
        assert!(valid_prefix("dynamo"));
        assert!(valid_prefix("my_app:x1"));
        assert!(!valid_prefix(""));
        assert!(!valid_prefix("1abc"));
        assert!(!valid_prefix("a-b"));
    }
}

/// Families a part of loadgate adds to a monitor's metrics text when it
/// registers with the monitor (a booking sync's fleet-wide queues), so
/// that the monitor need not know it.
pub(crate) trait Families: Send + Sync {
    /// Appends the families, under `prefix`.
    fn render(&self, out: &mut String, prefix: &str);
}

/// The parts registered with one monitor, held weakly: a part that is
/// dropped leaves the text. Locked only to register and to render.
#[derive(Default)]
pub(crate) struct MoreFamilies(std::sync::Mutex<Vec<std::sync::Weak<dyn Families>>>);

impl fmt::Debug for MoreFamilies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MoreFamilies")
    }
}

impl MoreFamilies {
    /// Registers `part`.
    pub(crate) fn add(&self, part: std::sync::Weak<dyn Families>) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|p| p.strong_count() > 0);
        all.push(part);
    }

    /// Appends every live part's families.
    pub(crate) fn render(&self, out: &mut String, prefix: &str) {
        let live: Vec<_> = {
            let all = self.0.lock().unwrap_or_else(|e| e.into_inner());
            all.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        for part in live {
            part.render(out, prefix);
        }
    }
}
