//! loadgate against what a real Dynamo 1.6.1 deployment sent and answered,
//! recorded by `tools/dynamo/record_fixtures.sh` into
//! `tests/fixtures/dynamo-1.6.1` (its README says how). These run without
//! Dynamo: the bytes are in the repository.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use loadgate::cluster::wire::{decode, Decoded};
use loadgate::http::{error_response_with_status, ErrorStyle};
use loadgate::{LoadReport, Monitor, Reason, WorkerSpec};
use serde::Deserialize;
use serde_json::Value;

fn fixture(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/dynamo-1.6.1")
        .join(path)
}

/// One recorded NATS message.
#[derive(Deserialize)]
struct Message {
    subject: String,
    payload_b64: String,
}

fn messages() -> Vec<(String, Vec<u8>)> {
    let text = std::fs::read_to_string(fixture("nats/messages.jsonl")).expect("the fixture");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let m: Message = serde_json::from_str(l).expect("a recorded message");
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(m.payload_b64)
                .expect("base64");
            (m.subject, bytes)
        })
        .collect()
}

/// The envelope fields the writer takes that `Envelope` does not keep.
#[derive(Deserialize)]
struct Stamp {
    published_at: u64,
}

#[test]
fn every_recorded_kv_metrics_envelope_decodes_and_reencodes_byte_for_byte() {
    let kv: Vec<_> = messages()
        .into_iter()
        .filter(|(s, _)| s.ends_with(".kv_metrics"))
        .collect();
    assert!(kv.len() >= 10, "{} kv_metrics messages recorded", kv.len());
    let mut ranks = std::collections::BTreeSet::new();
    for (subject, bytes) in &kv {
        let Ok(Decoded::Envelope(e)) = decode(bytes) else {
            panic!("{subject}: not decoded as an envelope: {:?}", decode(bytes));
        };
        // Workers leave the router's fields nil and send only kv_used_blocks.
        assert_eq!(e.load.active_decode_blocks, None);
        assert_eq!(e.load.active_prefill_tokens, None);
        assert!(e.load.kv_used_blocks.is_some());
        ranks.insert((e.load.worker_id, e.load.dp_rank));
        let stamp: Stamp = rmp_serde::from_slice(bytes).expect("a stamp");
        assert_eq!(
            e.to_msgpack(stamp.published_at),
            *bytes,
            "{subject}: loadgate writes what Dynamo 1.6.1 wrote"
        );
    }
    assert!(
        ranks.iter().any(|&(_, r)| r == 1),
        "data-parallel ranks recorded: {ranks:?}"
    );
}

/// One recorded HTTP exchange.
#[derive(Deserialize)]
struct Answer {
    status: u16,
    body: Value,
}

fn answers() -> Vec<(String, Answer)> {
    let text = std::fs::read_to_string(fixture("http/answers.json")).expect("the fixture");
    let all: serde_json::Map<String, Value> = serde_json::from_str(&text).expect("JSON");
    all.into_iter()
        .filter_map(|(k, v)| Some((k, serde_json::from_value(v).ok()?)))
        .collect()
}

fn body_text(a: &Answer) -> &str {
    a.body["text"].as_str().expect("a text body")
}

#[test]
fn overload_and_unavailable_bodies_are_dynamos_bytes() {
    let answers = answers();
    let mut overloads = 0;
    let mut unavailable = 0;
    for (name, a) in &answers {
        match a.status {
            529 => {
                overloads += 1;
                for reason in [
                    Reason::AllWorkersBusy,
                    Reason::WorkerOverloaded,
                    Reason::WorkerAtCapacity,
                    Reason::QueueTimeout,
                ] {
                    let ours = error_response_with_status(
                        reason,
                        ErrorStyle::Dynamo,
                        Duration::from_secs(1),
                        529,
                    );
                    assert_eq!(ours.body, body_text(a), "{name}, {reason:?}");
                }
            }
            503 if body_text(a).contains("Service temporarily unavailable") => {
                unavailable += 1;
                let ours = error_response_with_status(
                    Reason::NoWorkers,
                    ErrorStyle::Dynamo,
                    Duration::from_secs(1),
                    503,
                );
                assert_eq!(ours.body, body_text(a), "{name}");
            }
            _ => {}
        }
    }
    assert!(
        overloads >= 2 && unavailable >= 1,
        "{overloads} 529s, {unavailable} 503s"
    );
}

#[test]
fn per_worker_gauges_carry_dynamos_labels_in_its_order() {
    let text = std::fs::read_to_string(fixture("metrics/frontend_after_load.prom")).unwrap();
    let recorded: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("dynamo_frontend_worker_active_decode_blocks{")
                || l.starts_with("dynamo_frontend_worker_active_prefill_tokens{")
        })
        .collect();
    assert!(!recorded.is_empty());
    // The same workers and ranks in loadgate, at the recorded values (all
    // zero after the load).
    let m = Monitor::new();
    for line in &recorded {
        let labels = &line[line.find('{').unwrap() + 1..line.find('}').unwrap()];
        let get = |k: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap()
        };
        let id: u64 = get("worker_id").parse().unwrap();
        if m.workers("tiny").contains(&id) {
            continue;
        }
        let ranks = recorded
            .iter()
            .filter(|l| l.contains(&format!("worker_id=\"{id}\"")) && l.contains("dp_rank=\"1\""))
            .count();
        let spec = WorkerSpec {
            dp_size: if ranks > 0 { 2 } else { 1 },
            ..Default::default()
        };
        m.add_worker("tiny", id, spec).unwrap();
    }
    for id in m.workers("tiny") {
        for rank in 0..2 {
            let zero = LoadReport {
                active_prefill_tokens: Some(0),
                ..Default::default()
            };
            let _ = m.report(id, rank, &zero);
        }
    }
    let ours = m.metrics_text();
    for line in recorded {
        assert!(
            ours.lines().any(|l| l == line),
            "missing {line:?} in\n{ours}"
        );
    }
}
