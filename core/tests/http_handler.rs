//! The `/busy_threshold` handler: every status code
//! docs/behaviour.md#threshold-endpoint lists, the
//! optional bearer token guarding it, plus the overload status read from the
//! environment once.

use loadgate::http::{
    handle_busy_threshold, overload_status, serve_busy_threshold, BusyThresholdRequest,
    BusyThresholdResponse, ControlAuth, ControlAuthError, MAX_BODY_BYTES,
};
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
    (status, parsed(&body))
}

/// A JSON body's value; a plain-text body (415, 413, 400 for text that is
/// not JSON) as a JSON string; the empty 405 body as null.
fn parsed(body: &str) -> Value {
    if body.is_empty() {
        return Value::Null;
    }
    serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()))
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
            "waiting_requests_threshold": null,
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
            "waiting_requests_threshold": null,
            "version": 0
        })
    );
}

#[test]
fn the_waiting_requests_threshold_is_set_echoed_listed_and_cleared() {
    let m = monitor();
    m.report(
        1,
        0,
        &LoadReport {
            waiting_requests: Some(9),
            ..Default::default()
        },
    )
    .unwrap();
    let (status, body) = post(
        &m,
        json!({"model": "llama", "waiting_requests_threshold": 8}),
    );
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({
            "model": "llama",
            "active_decode_blocks_threshold": null,
            "active_prefill_tokens_threshold": null,
            "active_prefill_tokens_threshold_frac": null,
            "waiting_requests_threshold": 8,
            "version": 1
        })
    );
    assert!(m.is_busy(1).unwrap(), "9 waiting > 8, at once");
    let (_, body) = post(
        &m,
        json!({"model": "llama", "waiting_requests_threshold": u64::MAX}),
    );
    assert_eq!(body["waiting_requests_threshold"], u64::MAX, "any u64");
    assert!(!m.is_busy(1).unwrap());
    let (_, body) = call(&m, "GET", None, b"");
    assert_eq!(
        body["thresholds"][0]["waiting_requests_threshold"],
        u64::MAX
    );
    let (status, body) = post(
        &m,
        json!({"model": "llama", "clear": ["waiting_requests_threshold"]}),
    );
    assert_eq!(status, 200);
    assert_eq!(body["waiting_requests_threshold"], Value::Null);
    assert_eq!(body["version"], 3);
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
        (422, "POST", JSON, br#"{"model": "llama", "active_prefill_tokens_threshold": -5}"#.to_vec()),
        (400, "POST", JSON, br#"{"model": "llama", "active_prefill_tokens_threshold_frac": -1}"#.to_vec()),
        (400, "POST", JSON, br#"{"model": "llama", "clear": ["bogus"]}"#.to_vec()),
        (422, "POST", JSON, br#"{"model": "llama", "waiting_requests_threshold": -1}"#.to_vec()),
        (
            400,
            "POST",
            JSON,
            br#"{"model": "llama", "waiting_requests_threshold": 3, "clear": ["waiting_requests_threshold"]}"#
                .to_vec(),
        ),
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
        (422, "POST", JSON, br#"{"model": "llama", "waiting_requests_threshold": 1.5}"#.to_vec()),
        (422, "POST", JSON, br#"{"model": "llama", "waiting_requests_threshold": "8"}"#.to_vec()),
        (422, "POST", JSON, br#"{"model": "llama", "waiting_requests_threshold": 18446744073709551616}"#.to_vec()),
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
        let error = match (&answer, status) {
            (Value::Null, 405) => continue, // 1.6.1's empty 405
            (Value::String(text), 400 | 413 | 415) => text,
            _ => answer["error"].as_str().unwrap_or_default(),
        };
        assert!(!error.is_empty(), "{status}: {answer}");
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

const TOKEN: &str = "s3cret-token";

fn auth(protect_reads: bool) -> ControlAuth {
    ControlAuth::new(TOKEN, protect_reads).unwrap()
}

/// A request to the handler guarded by `auth`, with `authorization` as the
/// `Authorization` header; the body parsed.
fn call_auth(
    m: &Monitor,
    auth: &ControlAuth,
    method: &str,
    authorization: Option<&str>,
    body: &[u8],
) -> (BusyThresholdResponse, Value) {
    let request = BusyThresholdRequest {
        method,
        content_type: JSON,
        authorization,
        body,
    };
    let response = serve_busy_threshold(m, Some(auth), &request);
    let body = parsed(&response.body);
    (response, body)
}

const SET: &[u8] = br#"{"model": "llama", "active_decode_blocks_threshold": 0.5}"#;

fn assert_unauthorized(response: &BusyThresholdResponse, body: &Value, word: &str) {
    assert_eq!(response.status, 401, "{body}");
    assert_eq!(
        response.headers,
        vec![
            ("content-type", "application/json"),
            ("www-authenticate", "Bearer")
        ]
    );
    let error = body["error"].as_str().expect("a JSON error");
    assert!(error.starts_with(word), "{error}");
    assert!(error.contains("bearer token"), "{error}");
    assert!(!error.contains(TOKEN), "the answer never echoes the token");
}

#[test]
fn a_write_without_the_right_bearer_token_is_refused_and_changes_nothing() {
    let m = monitor();
    let guard = auth(false);
    let refused = [
        (None, "missing"),
        (Some(""), "missing"),
        (Some("Bearer"), "missing"),
        (Some("Basic czNjcmV0LXRva2Vu"), "missing"),
        (Some(TOKEN), "missing"),
        (Some("Token s3cret-token"), "missing"),
        (Some("Bearer wrong"), "invalid"),
        (Some("Bearer S3CRET-TOKEN"), "invalid"),
        (Some("Bearer s3cret-toke"), "invalid"),
        (Some("Bearer s3cret-token2"), "invalid"),
    ];
    let clear = br#"{"model": "llama", "clear": ["active_decode_blocks_threshold"]}"#;
    // A set on an unknown model is a write too: without the token it is
    // 401, not 404.
    let unknown = br#"{"model": "nope", "active_decode_blocks_threshold": 0.5}"#;
    for (authorization, word) in refused {
        for body in [SET, clear, unknown] {
            let (response, answer) = call_auth(&m, &guard, "POST", authorization, body);
            assert_unauthorized(&response, &answer, word);
        }
    }
    let state = m.thresholds("llama").unwrap();
    assert_eq!(state.version, 0, "no refused write bumped the version");
    assert_eq!(state.thresholds.active_decode_blocks_threshold, None);
}

#[test]
fn a_write_with_the_right_bearer_token_is_applied() {
    let m = monitor();
    let guard = auth(false);
    for (n, authorization) in [
        "Bearer s3cret-token",
        "bearer s3cret-token",
        "BEARER \t s3cret-token ",
    ]
    .into_iter()
    .enumerate()
    {
        let (response, body) = call_auth(&m, &guard, "POST", Some(authorization), SET);
        assert_eq!(response.status, 200, "{authorization:?}: {body}");
        assert_eq!(response.headers, vec![("content-type", "application/json")]);
        assert_eq!(body["active_decode_blocks_threshold"], 0.5);
        assert_eq!(body["version"], n + 1);
    }
    let state = m.thresholds("llama").unwrap();
    assert_eq!(state.thresholds.active_decode_blocks_threshold, Some(0.5));
    // The write takes effect: 60 of 100 blocks is above 0.5.
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
    // Authorised requests still get every other answer.
    let unknown = br#"{"model": "nope", "active_decode_blocks_threshold": 0.5}"#;
    let bearer = Some("Bearer s3cret-token");
    assert_eq!(call_auth(&m, &guard, "POST", bearer, unknown).0.status, 404);
    let invalid = br#"{"model": "llama", "active_decode_blocks_threshold": 2}"#;
    assert_eq!(call_auth(&m, &guard, "POST", bearer, invalid).0.status, 400);
}

#[test]
fn reads_stay_open_by_default() {
    let m = monitor();
    let guard = auth(false);
    let (response, body) = call_auth(&m, &guard, "GET", None, b"");
    assert_eq!(response.status, 200);
    assert_eq!(body["thresholds"].as_array().unwrap().len(), 2);
    assert_eq!(call_auth(&m, &guard, "HEAD", None, b"").0.status, 200);
    // A POST that sets and clears nothing is a read.
    let read = br#"{"model": "llama", "active_decode_blocks_threshold": null}"#;
    let (response, body) = call_auth(&m, &guard, "POST", None, read);
    assert_eq!(response.status, 200);
    assert_eq!(body["version"], 0);
    // So is one with a wrong token: the token is only judged for writes.
    let (response, _) = call_auth(&m, &guard, "POST", Some("Bearer wrong"), read);
    assert_eq!(response.status, 200);
    // Requests refused before any state is touched keep their status.
    assert_eq!(call_auth(&m, &guard, "POST", None, b"{oops").0.status, 400);
    let (response, _) = call_auth(&m, &guard, "DELETE", None, b"");
    assert_eq!(response.status, 405);
    assert_eq!(response.headers, vec![("allow", "POST,GET,HEAD")]);
    assert_eq!(response.body, "", "1.6.1's 405 has no body");
}

#[test]
fn protected_reads_need_the_token_too() {
    let m = monitor();
    let guard = auth(true);
    let read = br#"{"model": "llama"}"#;
    for (method, body) in [
        ("GET", &b""[..]),
        ("HEAD", b""),
        ("POST", read),
        ("POST", SET),
    ] {
        let (response, answer) = call_auth(&m, &guard, method, None, body);
        assert_unauthorized(&response, &answer, "missing");
        let (response, answer) = call_auth(&m, &guard, method, Some("Bearer nope"), body);
        assert_unauthorized(&response, &answer, "invalid");
    }
    // Checked before anything else: even a malformed request gets 401.
    let (response, answer) = call_auth(&m, &guard, "DELETE", None, b"");
    assert_unauthorized(&response, &answer, "missing");
    let (response, answer) = call_auth(&m, &guard, "POST", None, b"{oops");
    assert_unauthorized(&response, &answer, "missing");
    assert_eq!(m.thresholds("llama").unwrap().version, 0);

    let bearer = Some("Bearer s3cret-token");
    let (response, body) = call_auth(&m, &guard, "GET", bearer, b"");
    assert_eq!(response.status, 200);
    assert_eq!(body["thresholds"].as_array().unwrap().len(), 2);
    assert_eq!(call_auth(&m, &guard, "POST", bearer, read).0.status, 200);
    let (response, body) = call_auth(&m, &guard, "POST", bearer, SET);
    assert_eq!(response.status, 200);
    assert_eq!(body["version"], 1);
}

#[test]
fn an_empty_or_unsendable_token_is_a_configuration_error() {
    assert_eq!(
        ControlAuth::new("", false).unwrap_err(),
        ControlAuthError::EmptyToken
    );
    assert_eq!(
        ControlAuth::new(String::new(), true).unwrap_err(),
        ControlAuthError::EmptyToken
    );
    for bad in ["two words", "tab\there", "line\n", "caf\u{e9}"] {
        assert!(
            matches!(
                ControlAuth::new(bad, false),
                Err(ControlAuthError::UnsendableToken { .. })
            ),
            "{bad:?}"
        );
    }
    let guard = auth(false);
    assert!(
        !format!("{guard:?}").contains(TOKEN),
        "Debug hides the token"
    );
}

#[test]
fn no_auth_serves_as_the_plain_handler_with_headers() {
    let m = monitor();
    for (method, body) in [("GET", &b""[..]), ("POST", SET), ("PUT", b"")] {
        let request = BusyThresholdRequest {
            method,
            content_type: JSON,
            authorization: None,
            body,
        };
        let other = monitor();
        let served = serve_busy_threshold(&m, None, &request);
        let plain = handle_busy_threshold(&other, method, JSON, body);
        assert_eq!((served.status, served.body), plain, "{method}");
    }
    assert_eq!(m.thresholds("llama").unwrap().version, 1, "no token needed");
}
