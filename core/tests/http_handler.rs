//! The `/busy_threshold` handler: every status code SPEC §5 lists, plus the
//! overload status read from the environment once.

use loadgate::http::{handle_busy_threshold, overload_status, MAX_BODY_BYTES};
use loadgate::{LoadReport, ManualClock, Monitor, MonitorConfig, Reason, WorkerSpec};
use serde_json::{json, Value};

const JSON: Option<&str> = Some("application/json");

fn monitor() -> Monitor {
    let m = Monitor::with_config(MonitorConfig::default(), ManualClock::new()).unwrap();
    m.add_worker(
        "llama",
        1,
        WorkerSpec {
            kv_total_blocks: Some(100),
            ..Default::default()
        },
    )
    .unwrap();
    m.add_worker("qwen", 2, WorkerSpec::default()).unwrap();
    m
}

fn post(m: &Monitor, body: Value) -> (u16, Value) {
    call(m, "POST", JSON, body.to_string().as_bytes())
}

fn call(m: &Monitor, method: &str, ct: Option<&str>, body: &[u8]) -> (u16, Value) {
    let (status, body) = handle_busy_threshold(m, method, ct, body);
    (
        status,
        serde_json::from_str(&body).expect("every answer is JSON"),
    )
}

#[test]
fn post_sets_merges_and_echoes_every_field_with_the_version() {
    let m = monitor();
    let (status, body) = post(
        &m,
        json!({"model": "llama", "active_decode_blocks_threshold": 0.5}),
    );
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({
            "model": "llama",
            "active_decode_blocks_threshold": 0.5,
            "active_prefill_tokens_threshold": null,
            "active_prefill_tokens_threshold_frac": null,
            "version": 1
        })
    );
    let (_, body) = post(
        &m,
        json!({"model": "llama", "active_prefill_tokens_threshold": 4096}),
    );
    assert_eq!(body["active_decode_blocks_threshold"], 0.5);
    assert_eq!(body["active_prefill_tokens_threshold"], 4096);
    assert_eq!(body["version"], 2);
    // It takes effect at once.
    m.report(
        1,
        0,
        &LoadReport {
            kv_used_blocks: Some(60),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(m.is_busy(1).unwrap());
    let (status, body) = post(
        &m,
        json!({"model": "llama", "clear": ["active_decode_blocks_threshold"]}),
    );
    assert_eq!(status, 200);
    assert_eq!(body["active_decode_blocks_threshold"], Value::Null);
    assert_eq!(body["version"], 3);
    assert!(!m.is_busy(1).unwrap());
}

#[test]
fn post_without_thresholds_is_a_read() {
    let m = monitor();
    post(
        &m,
        json!({"model": "llama", "active_prefill_tokens_threshold_frac": 1.5}),
    );
    let (status, body) = post(
        &m,
        json!({"model": "llama", "active_decode_blocks_threshold": null}),
    );
    assert_eq!(status, 200);
    assert_eq!(body["active_prefill_tokens_threshold_frac"], 1.5);
    assert_eq!(body["version"], 1, "a read does not bump the version");
    let (status, body) = post(&m, json!({"model": "unknown"}));
    assert_eq!(status, 200, "a read of an unknown model is all-null");
    assert_eq!(
        body,
        json!({
            "model": "unknown",
            "active_decode_blocks_threshold": null,
            "active_prefill_tokens_threshold": null,
            "active_prefill_tokens_threshold_frac": null,
            "version": 0
        })
    );
}

#[test]
fn get_lists_every_model() {
    let m = monitor();
    post(
        &m,
        json!({"model": "qwen", "active_prefill_tokens_threshold": 10}),
    );
    let (status, body) = call(&m, "GET", None, b"");
    assert_eq!(status, 200);
    let list = body["thresholds"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["model"], "llama");
    assert_eq!(list[0]["version"], 0);
    assert_eq!(list[1]["model"], "qwen");
    assert_eq!(list[1]["active_prefill_tokens_threshold"], 10);
}

#[test]
fn every_error_status() {
    let m = monitor();
    let cases: Vec<(u16, &str, Option<&str>, Vec<u8>)> = vec![
        (404, "POST", JSON, br#"{"model": "nope", "active_decode_blocks_threshold": 0.5}"#.to_vec()),
        (404, "POST", JSON, br#"{"model": "nope", "clear": ["active_decode_blocks_threshold"]}"#.to_vec()),
        (400, "POST", JSON, br#"{"model": "llama", "active_decode_blocks_threshold": 1.5}"#.to_vec()),
        (400, "POST", JSON, br#"{"model": "llama", "active_decode_blocks_threshold": -0.1}"#.to_vec()),
        (400, "POST", JSON, br#"{"model": "llama", "active_prefill_tokens_threshold": -5}"#.to_vec()),
        (400, "POST", JSON, br#"{"model": "llama", "active_prefill_tokens_threshold_frac": -1}"#.to_vec()),
        (400, "POST", JSON, br#"{"model": "llama", "clear": ["bogus"]}"#.to_vec()),
        (
            400,
            "POST",
            JSON,
            br#"{"model": "llama", "active_prefill_tokens_threshold": 3, "clear": ["active_prefill_tokens_threshold"]}"#
                .to_vec(),
        ),
        (400, "POST", JSON, b"{not json".to_vec()),
        (400, "POST", JSON, br#"{"model": "llama", "active_decode_blocks_threshold": 1e999}"#.to_vec()),
        (422, "POST", JSON, br#"{"model": 5}"#.to_vec()),
        (422, "POST", JSON, br#"{"active_decode_blocks_threshold": 0.5}"#.to_vec()),
        (422, "POST", JSON, br#"{"model": "llama", "active_decode_blocks_threshold": "0.5"}"#.to_vec()),
        (422, "POST", JSON, br#"{"model": "llama", "active_prefill_tokens_threshold": 1.5}"#.to_vec()),
        (422, "POST", JSON, br#"{"model": "llama", "clear": "active_decode_blocks_threshold"}"#.to_vec()),
        (422, "POST", JSON, br#"{"model": "llama", "clear": [1]}"#.to_vec()),
        (422, "POST", JSON, br#"[1, 2]"#.to_vec()),
        (415, "POST", Some("text/plain"), br#"{"model": "llama"}"#.to_vec()),
        (415, "POST", Some("application/x-www-form-urlencoded"), b"model=llama".to_vec()),
        (415, "POST", None, br#"{"model": "llama"}"#.to_vec()),
        (413, "POST", JSON, vec![b' '; MAX_BODY_BYTES + 1]),
        (405, "DELETE", JSON, b"".to_vec()),
    ];
    for (want, method, ct, body) in cases {
        let (status, answer) = call(&m, method, ct, &body);
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
        assert_eq!(status, want, "{method} {ct:?} {shown}: {answer}");
        assert!(
            answer["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{answer}"
        );
    }
    assert_eq!(
        m.thresholds("llama").unwrap().version,
        0,
        "no refused request changed anything"
    );
}

#[test]
fn json_content_types_with_parameters_are_accepted() {
    let m = monitor();
    for ct in [
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/merge-patch+json",
    ] {
        let (status, _) = call(&m, "POST", Some(ct), br#"{"model": "llama"}"#);
        assert_eq!(status, 200, "{ct}");
    }
    let (status, _) = call(&m, "post", JSON, br#"{"model": "llama"}"#);
    assert_eq!(status, 200, "methods are case-insensitive");
}

#[test]
fn a_body_of_exactly_the_limit_is_parsed() {
    let m = monitor();
    let mut body = br#"{"model": "llama"}"#.to_vec();
    body.resize(MAX_BODY_BYTES, b' ');
    assert_eq!(call(&m, "POST", JSON, &body).0, 200);
}

/// Runs `overload_status()` in a child process with the variable set, and
/// checks the value is read once: changing the variable later has no effect.
#[test]
fn overload_status_comes_from_the_environment_once() {
    if let Ok(expected) = std::env::var("LOADGATE_CHILD_EXPECT") {
        assert_eq!(overload_status(), expected.parse::<u16>().unwrap());
        std::env::set_var("DYN_HTTP_OVERLOAD_STATUS_CODE", "418");
        assert_eq!(
            overload_status(),
            expected.parse::<u16>().unwrap(),
            "cached"
        );
        assert_eq!(
            Reason::AllWorkersBusy.http_status(),
            expected.parse::<u16>().unwrap()
        );
        assert_eq!(Reason::NoWorkers.http_status(), 503);
        assert_eq!(Reason::Closed.http_status(), 503);
        return;
    }
    for (raw, expected) in [
        (None, 529),
        (Some(" 429 "), 429),
        (Some("abc"), 529),
        (Some("199"), 529),
        (Some("503"), 503),
    ] {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "overload_status_comes_from_the_environment_once",
            "--test-threads=1",
        ])
        .env("LOADGATE_CHILD_EXPECT", expected.to_string());
        match raw {
            Some(v) => cmd.env("DYN_HTTP_OVERLOAD_STATUS_CODE", v),
            None => cmd.env_remove("DYN_HTTP_OVERLOAD_STATUS_CODE"),
        };
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{raw:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "the child ran the test"
        );
    }
}
