//! The Prometheus text exposition format (version 0.0.4), one sample line
//! at a time: `name{label="value",...} value [timestamp]`.
//!
//! Only the lines of the metrics an engine mapping asks for are parsed, and
//! strictly: a bad name, label, escape or value is an error the caller
//! counts. Every other line, comments (`# HELP`, `# TYPE`) included, is
//! skipped without being read past its name. Nothing here panics on any
//! input, and nothing allocates more than the labels of one line.

use std::borrow::Cow;
use std::fmt;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample<'a> {
    /// Metric name, e.g. `vllm:num_requests_waiting`.
    pub(crate) name: &'a str,
    /// Label pairs in line order, values unescaped.
    pub(crate) labels: Vec<(&'a str, Cow<'a, str>)>,
    /// The value (`NaN` and the infinities included).
    pub(crate) value: f64,
}

impl Sample<'_> {
    /// The value of label `name`, if the line has it.
    pub(crate) fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_ref())
    }
}

/// Why a sample line was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LineError(pub(crate) &'static str);

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// The metric name a line starts with, or `None` for a blank or comment
/// line (or one that does not start with a name: the caller's strict parse
/// refuses it if it matters).
pub(crate) fn line_name(line: &str) -> Option<&str> {
    let line = line.trim_start();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
    (end > 0).then(|| &line[..end])
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

fn is_label_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Parses one sample line strictly.
pub(crate) fn parse_sample(line: &str) -> Result<Sample<'_>, LineError> {
    let rest = line.trim_start();
    let name = line_name(rest).ok_or(LineError("no metric name"))?;
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(LineError("metric name starts with a digit"));
    }
    let mut rest = &rest[name.len()..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = after;
        loop {
            rest = rest.trim_start();
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let end = rest.find(|c: char| !is_label_char(c)).unwrap_or(rest.len());
            let key = &rest[..end];
            if key.is_empty() || key.starts_with(|c: char| c.is_ascii_digit()) {
                return Err(LineError("bad label name"));
            }
            rest = rest[end..].trim_start();
            rest = rest
                .strip_prefix('=')
                .ok_or(LineError("label without '='"))?
                .trim_start();
            rest = rest
                .strip_prefix('"')
                .ok_or(LineError("label value not quoted"))?;
            let (value, after) = label_value(rest)?;
            labels.push((key, value));
            rest = after.trim_start();
            if let Some(after) = rest.strip_prefix(',') {
                rest = after;
            } else if !rest.starts_with('}') {
                return Err(LineError("labels not separated by ','"));
            }
        }
    }
    if !rest.starts_with([' ', '\t']) {
        return Err(LineError("no space before the value"));
    }
    let mut fields = rest.split_ascii_whitespace();
    let value = fields.next().ok_or(LineError("no value"))?;
    let value = parse_value(value).ok_or(LineError("value is not a number"))?;
    if let Some(ts) = fields.next() {
        ts.parse::<i64>()
            .map_err(|_| LineError("timestamp is not an integer"))?;
    }
    if fields.next().is_some() {
        return Err(LineError("text after the timestamp"));
    }
    Ok(Sample {
        name,
        labels,
        value,
    })
}

/// A quoted label value up to its closing quote (already past the opening
/// one), unescaping `\\`, `\"` and `\n`; and the text after it.
fn label_value(s: &str) -> Result<(Cow<'_, str>, &str), LineError> {
    let mut owned: Option<String> = None;
    let mut start = 0;
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => {
                let value = match owned {
                    Some(mut o) => {
                        o.push_str(&s[start..i]);
                        Cow::Owned(o)
                    }
                    None => Cow::Borrowed(&s[..i]),
                };
                return Ok((value, &s[i + 1..]));
            }
            '\\' => {
                let o = owned.get_or_insert_with(String::new);
                o.push_str(&s[start..i]);
                match chars.next() {
                    Some((_, '\\')) => o.push('\\'),
                    Some((_, '"')) => o.push('"'),
                    Some((_, 'n')) => o.push('\n'),
                    _ => return Err(LineError("bad escape in a label value")),
                }
                start = i + 2;
            }
            _ => {}
        }
    }
    Err(LineError("label value not closed"))
}

/// A sample value as Go and Python clients write it: decimal or scientific,
/// `NaN`, `+Inf`, `-Inf` (`Inf` too).
fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        // Rust's parser also takes "inf", "infinity" and "nan" in any case,
        // which the format does not: refuse any letter but an exponent.
        _ if s
            .bytes()
            .any(|b| b.is_ascii_alphabetic() && b != b'e' && b != b'E') =>
        {
            None
        }
        _ => s.parse().ok(),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_engines_write() {
        let s = parse_sample(
            r#"vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0"#,
        )
        .unwrap();
        assert_eq!(s.name, "vllm:num_requests_waiting");
        assert_eq!(s.label("engine"), Some("0"));
        assert_eq!(
            s.label("model_name"),
            Some("meta-llama/Llama-3.1-8B-Instruct")
        );
        assert_eq!(s.value, 3.0);
        let s =
            parse_sample("sglang:token_usage{model_name=\"qwen\",} 1.2e-05 1712345678901").unwrap();
        assert_eq!(s.value, 1.2e-05, "trailing comma and a timestamp");
        assert_eq!(parse_sample("up 1").unwrap().labels, vec![]);
        assert!(parse_sample("x{} +Inf").unwrap().value.is_infinite());
        assert!(parse_sample("x NaN").unwrap().value.is_nan());
        let s = parse_sample(r#"x{a="q\"uo\\te\nd, {}"} -0.5"#).unwrap();
        assert_eq!(s.label("a"), Some("q\"uo\\te\nd, {}"));
        assert_eq!(s.value, -0.5);
    }

    #[test]
    fn refuses_malformed_lines() {
        for bad in [
            "",
            "{a=\"b\"} 1",
            "1x 2",
            "x",
            "x{a=\"b\"}",
            "x{a=\"b\"}1",
            "x{a=b} 1",
            "x{a=\"b} 1",
            "x{a=\"b\" c=\"d\"} 1",
            "x{=\"b\"} 1",
            "x{a=\"\\q\"} 1",
            "x one",
            "x inf",
            "x 1 2.5",
            "x 1 2 3",
            "x{a=\"b\"",
        ] {
            assert!(parse_sample(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names_are_read_without_parsing_the_rest() {
        assert_eq!(line_name("vllm:x{engine=\"0\"} 1"), Some("vllm:x"));
        assert_eq!(line_name("  up 1"), Some("up"));
        assert_eq!(line_name("# TYPE up gauge"), None);
        assert_eq!(line_name(""), None);
        assert_eq!(line_name("{} 1"), None);
    }
}
