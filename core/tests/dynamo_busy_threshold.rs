//! `/busy_threshold` against Dynamo 1.6.1's recorded answers: every probe
//! the recorder sent, replayed in its order on a monitor in the same state,
//! gets the same status, content type, `Allow` header and body. loadgate's
//! answers carry two keys more per model (`waiting_requests_threshold` and
//! `version`, after 1.6.1's four); they are cut before comparing bytes.

#[allow(dead_code)] // each test binary uses part of the support code
mod support;

use loadgate::http::{serve_busy_threshold, BusyThresholdRequest};
use loadgate::{Monitor, ThresholdUpdate, WorkerSpec};
use support::recorded::answers;

/// `body` less loadgate's extension keys, which follow 1.6.1's in each
/// model's object.
fn without_extensions(body: &str) -> String {
    let mut out = String::with_capacity(body.len());
    let mut rest = body;
    while let Some(at) = rest.find(",\"waiting_requests_threshold\":") {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        rest = &rest[rest.find('}').expect("the object closes")..];
    }
    out.push_str(rest);
    out
}

#[test]
fn every_recorded_busy_threshold_probe_is_answered_as_dynamo_answered() {
    let monitor = Monitor::new();
    for id in [1, 2] {
        monitor
            .add_worker("tiny", id, WorkerSpec::default())
            .unwrap();
    }
    // The state the recording began in (its first GET).
    let start = ThresholdUpdate {
        active_decode_blocks_threshold: Some(0.5),
        active_prefill_tokens_threshold: Some(100),
        ..Default::default()
    };
    monitor.set_thresholds("tiny", &start).unwrap();

    let probes: Vec<_> = answers()
        .into_iter()
        .filter(|(name, _)| name.starts_with("busy_threshold "))
        .collect();
    assert!(probes.len() >= 25, "{} probes recorded", probes.len());
    for (name, recorded) in &probes {
        let body = recorded.request.body_bytes();
        let request = BusyThresholdRequest {
            method: &recorded.request.method,
            content_type: recorded.request.header("content-type"),
            authorization: None,
            body: &body,
        };
        let ours = serve_busy_threshold(&monitor, None, &request);
        assert_eq!(ours.status, recorded.status, "{name}: {}", ours.body);
        assert_eq!(
            ours.content_type(),
            recorded.header("content-type"),
            "{name}"
        );
        assert_eq!(ours.header("allow"), recorded.header("allow"), "{name}");
        if name == "busy_threshold POST unknown field clear" {
            // 1.6.1 ignores `clear` and reads; loadgate clears the named
            // threshold (docs/behaviour.md lists the difference). Put back
            // what 1.6.1 still had.
            assert!(ours
                .body
                .contains("\"active_decode_blocks_threshold\":null"));
            let back = ThresholdUpdate {
                active_decode_blocks_threshold: Some(0.6),
                ..Default::default()
            };
            monitor.set_thresholds("tiny", &back).unwrap();
            continue;
        }
        if recorded.request.method == "HEAD" {
            continue; // the server sends the GET's headers and no body
        }
        assert_eq!(without_extensions(&ours.body), recorded.text(), "{name}");
    }
}

#[test]
fn extension_keys_follow_dynamos_four_in_each_answer() {
    let monitor = Monitor::new();
    monitor.add_worker("m", 1, WorkerSpec::default()).unwrap();
    let (status, body) = loadgate::http::handle_busy_threshold(&monitor, "GET", None, b"");
    assert_eq!(status, 200);
    assert_eq!(
        body,
        "{\"thresholds\":[{\"model\":\"m\",\"active_decode_blocks_threshold\":null,\
         \"active_prefill_tokens_threshold\":null,\"active_prefill_tokens_threshold_frac\":null,\
         \"waiting_requests_threshold\":null,\"version\":0}]}"
    );
    assert_eq!(
        without_extensions(&body),
        "{\"thresholds\":[{\"model\":\"m\",\"active_decode_blocks_threshold\":null,\
         \"active_prefill_tokens_threshold\":null,\"active_prefill_tokens_threshold_frac\":null}]}"
    );
}
