//! The `/busy_threshold` handler (docs/behaviour.md#threshold-endpoint) on
//! arbitrary method, content type and body, a few requests in a row against
//! one monitor.
//!
//! Every answer: a documented status (200, 400, 404, 405, 413, 415, 422), a
//! body of its content type (`{"error": "..."}` JSON or a plain-text
//! message for errors, empty for 405, the echo for a POST that succeeds),
//! and a refused request leaves every model's thresholds and version as
//! they were. A successful POST echoes exactly what the monitor
//! then holds, and bumps the version by at most one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loadgate::http::{serve_busy_threshold, BusyThresholdRequest, TEXT_CONTENT_TYPE};
use loadgate::monitor::ThresholdState;
use loadgate::{Monitor, WorkerSpec};
use serde_json::{json, Value};

const MODELS: [&str; 2] = ["llama", "mistral"];
const DOCUMENTED: [u16; 7] = [200, 400, 404, 405, 413, 415, 422];

/// One request per NUL-separated chunk: `method LF content-type LF body`,
/// where an empty content-type line means no header. Text framing keeps the
/// seeds readable and lets the fuzzer mutate JSON bodies directly.
fn requests(data: &[u8]) -> impl Iterator<Item = (String, Option<String>, &[u8])> {
    data.split(|&b| b == 0).take(4).filter_map(|chunk| {
        let mut parts = chunk.splitn(3, |&b| b == b'\n');
        let method = String::from_utf8_lossy(parts.next()?).into_owned();
        let ct = parts.next().unwrap_or_default();
        let ct = (!ct.is_empty()).then(|| String::from_utf8_lossy(ct).into_owned());
        Some((method, ct, parts.next().unwrap_or_default()))
    })
}

fn snapshot(m: &Monitor) -> Vec<Option<ThresholdState>> {
    ["llama", "mistral", "unknown"]
        .iter()
        .map(|name| m.thresholds(name))
        .collect()
}

/// The echo of `state`, keys in 1.6.1's order and loadgate's after them.
fn echo(model: &str, state: &ThresholdState) -> String {
    let t = &state.thresholds;
    format!(
        "{{\"model\":{},\"active_decode_blocks_threshold\":{},\"active_prefill_tokens_threshold\":{},\
         \"active_prefill_tokens_threshold_frac\":{},\"waiting_requests_threshold\":{},\"version\":{}}}",
        json!(model),
        json!(t.active_decode_blocks_threshold),
        json!(t.active_prefill_tokens_threshold),
        json!(t.active_prefill_tokens_threshold_frac),
        json!(t.waiting_requests_threshold),
        state.version,
    )
}

fuzz_target!(|data: &[u8]| {
    let monitor = Monitor::new();
    for (i, model) in MODELS.iter().enumerate() {
        monitor
            .add_worker(model, i as u64, WorkerSpec::default())
            .expect("fresh monitor");
    }
    for (method, ct, body) in requests(data) {
        let before = snapshot(&monitor);
        let request = BusyThresholdRequest {
            method: &method,
            content_type: ct.as_deref(),
            authorization: None,
            body,
        };
        let response = serve_busy_threshold(&monitor, None, &request);
        let (status, text) = (response.status, response.body.as_str());
        assert!(
            DOCUMENTED.contains(&status),
            "undocumented status {status}: {text}"
        );
        let after = snapshot(&monitor);
        if status != 200 {
            match response.content_type() {
                None => assert!(status == 405 && text.is_empty(), "{status}: {text}"),
                Some(TEXT_CONTENT_TYPE) => assert!(!text.is_empty(), "{status}: empty text"),
                Some(_) => {
                    let answer: Value = serde_json::from_str(text).unwrap_or_else(|e| {
                        panic!("status {status} body is not JSON ({e}): {text}")
                    });
                    assert!(answer["error"].is_string(), "error body {text}");
                }
            }
            assert_eq!(
                before, after,
                "refused request ({status}) changed thresholds"
            );
            continue;
        }
        let answer: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("status {status} body is not JSON ({e}): {text}"));
        if !method.eq_ignore_ascii_case("POST") {
            assert!(answer["thresholds"].is_array(), "GET body {text}");
            assert_eq!(before, after, "GET changed thresholds");
            continue;
        }
        let name = answer["model"].as_str().expect("echo names the model");
        let i = ["llama", "mistral", "unknown"]
            .iter()
            .position(|m| *m == name);
        let Some(i) = i else {
            // A read of a model the monitor does not know: all null, version 0.
            assert_eq!(text, echo(name, &ThresholdState::default()));
            assert_eq!(monitor.thresholds(name), None);
            continue;
        };
        let state = after[i].unwrap_or_default();
        // Compared as text, as the client reads it: a float parsed back
        // from JSON may differ in the last bit, its text does not.
        assert_eq!(
            text,
            echo(name, &state),
            "echo differs from the stored thresholds"
        );
        let old = before[i].map_or(0, |s| s.version);
        assert!(
            state.version == old || state.version == old + 1,
            "version {old} -> {}",
            state.version
        );
        for (j, (b, a)) in before.iter().zip(&after).enumerate() {
            if j != i {
                assert_eq!(b, a, "a POST for {name} changed another model");
            }
        }
    }
});
