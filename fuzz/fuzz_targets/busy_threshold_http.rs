//! The `/busy_threshold` handler (docs/behaviour.md#threshold-endpoint) on
//! arbitrary method, content type and body, a few requests in a row against
//! one monitor.
//!
//! Every answer: a documented status (200, 400, 404, 405, 413, 415, 422), a
//! JSON body (`{"error": "..."}` for errors, the echo for a POST that
//! succeeds), and a refused request leaves every model's thresholds and
//! version as they were. A successful POST echoes exactly what the monitor
//! then holds, and bumps the version by at most one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loadgate::http::handle_busy_threshold;
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

fuzz_target!(|data: &[u8]| {
    let monitor = Monitor::new();
    for (i, model) in MODELS.iter().enumerate() {
        monitor
            .add_worker(model, i as u64, WorkerSpec::default())
            .expect("fresh monitor");
    }
    for (method, ct, body) in requests(data) {
        let before = snapshot(&monitor);
        let (status, text) = handle_busy_threshold(&monitor, &method, ct.as_deref(), body);
        assert!(
            DOCUMENTED.contains(&status),
            "undocumented status {status}: {text}"
        );
        let answer: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("status {status} body is not JSON ({e}): {text}"));
        let after = snapshot(&monitor);
        if status != 200 {
            assert!(answer["error"].is_string(), "error body {text}");
            assert_eq!(
                before, after,
                "refused request ({status}) changed thresholds"
            );
            continue;
        }
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
            let want = json!({
                "model": name,
                "active_decode_blocks_threshold": null,
                "active_prefill_tokens_threshold": null,
                "active_prefill_tokens_threshold_frac": null,
                "waiting_requests_threshold": null,
                "version": 0,
            });
            assert_eq!(text, want.to_string());
            assert_eq!(monitor.thresholds(name), None);
            continue;
        };
        let state = after[i].unwrap_or_default();
        let t = &state.thresholds;
        // Compared as text, as the client reads it: a float parsed back
        // from JSON may differ in the last bit, its text does not.
        let want = json!({
            "model": name,
            "active_decode_blocks_threshold": t.active_decode_blocks_threshold,
            "active_prefill_tokens_threshold": t.active_prefill_tokens_threshold,
            "active_prefill_tokens_threshold_frac": t.active_prefill_tokens_threshold_frac,
            "waiting_requests_threshold": t.waiting_requests_threshold,
            "version": state.version,
        });
        assert_eq!(
            text,
            want.to_string(),
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
