//! The Dynamo 1.6.1 fixtures recorded by `tools/dynamo/record_fixtures.sh`
//! (`tests/fixtures/dynamo-1.6.1`): their paths, and the HTTP exchanges in
//! the order they were made.
#![allow(dead_code)] // each including binary uses a different subset

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

/// The path of a recorded fixture file.
pub fn fixture(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/dynamo-1.6.1")
        .join(path)
}

/// The messages of a recorded `.jsonl` file: each one's bytes (its
/// `payload_b64`) and the whole line.
pub fn messages(path: &str) -> Vec<(Vec<u8>, Value)> {
    use base64::Engine as _;
    let text = std::fs::read_to_string(fixture(path)).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(v["payload_b64"].as_str().unwrap())
                .unwrap();
            (bytes, v)
        })
        .collect()
}

/// One recorded HTTP exchange.
#[derive(Deserialize)]
pub struct Answer {
    /// What was sent.
    pub request: Request,
    /// The status answered.
    pub status: u16,
    /// The headers answered, names in lower case.
    pub headers: Vec<(String, String)>,
    /// `{"text": ...}`, or a description of a large body.
    pub body: Value,
    /// Seconds since the recording began (absent for sampled answers).
    pub t: Option<f64>,
}

/// A recorded request.
#[derive(Deserialize)]
pub struct Request {
    /// The method.
    pub method: String,
    /// The headers sent.
    pub headers: Vec<(String, String)>,
    /// `{"text": ...}`, `{"size": n, ...}` for a padded body, or null.
    pub body: Value,
}

impl Answer {
    /// The answered body's text.
    pub fn text(&self) -> &str {
        self.body["text"].as_str().expect("a text body")
    }

    /// The value of answered header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Request {
    /// The value of sent header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body sent: the recorded text, or `{"model": "tiny"` padded with
    /// spaces before its closing brace to the recorded size.
    pub fn body_bytes(&self) -> Vec<u8> {
        if let Some(text) = self.body["text"].as_str() {
            return text.as_bytes().to_vec();
        }
        let Some(size) = self.body["size"].as_u64() else {
            return Vec::new();
        };
        let head = br#"{"model": "tiny""#;
        let mut body = head.to_vec();
        body.resize(size as usize - 1, b' ');
        body.push(b'}');
        body
    }
}

/// Every recorded exchange, named, in the order it was made (sampled
/// answers, which have no time, last).
pub fn answers() -> Vec<(String, Answer)> {
    let text = std::fs::read_to_string(fixture("http/answers.json")).expect("the fixture");
    let all: serde_json::Map<String, Value> = serde_json::from_str(&text).expect("JSON");
    let mut answers: Vec<(String, Answer)> = all
        .into_iter()
        .map(|(k, v)| {
            let answer = serde_json::from_value(v).unwrap_or_else(|e| panic!("{k}: {e}"));
            (k, answer)
        })
        .collect();
    let at = |a: &Answer| a.t.unwrap_or(f64::INFINITY);
    answers.sort_by(|a, b| at(&a.1).total_cmp(&at(&b.1)));
    answers
}
