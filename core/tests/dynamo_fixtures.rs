//! loadgate against what a real Dynamo 1.6.1 deployment sent and answered,
//! recorded by `tools/dynamo/record_fixtures.sh` into
//! `tests/fixtures/dynamo-1.6.1` (its README says how). These run without
//! Dynamo: the bytes are in the repository.

use std::time::Duration;

use base64::Engine as _;
use loadgate::cluster::wire::{decode, Decoded};
use loadgate::http::{error_response_with_status, ErrorStyle};
use loadgate::{LoadReport, Monitor, Policy, Reason, WorkerSpec};
use serde::Deserialize;

#[allow(dead_code)] // each test binary uses part of the support code
mod support;
use support::recorded::{answers, fixture};

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
                    assert_eq!(ours.body, a.text(), "{name}, {reason:?}");
                }
            }
            503 if a.text().contains("Service temporarily unavailable") => {
                unavailable += 1;
                let ours = error_response_with_status(
                    Reason::NoWorkers,
                    ErrorStyle::Dynamo,
                    Duration::from_secs(1),
                    503,
                );
                assert_eq!(ours.body, a.text(), "{name}");
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

/// The refusals 1.6.1 counted by the end of the recording, made again on a
/// loadgate monitor: the same `failures_total` lines for the classes a
/// monitor decides (capacity and unavailable; 1.6.1's transport failures and
/// 404s happen outside it).
#[test]
fn refusals_are_counted_in_dynamos_failures_family() {
    let text = std::fs::read_to_string(fixture("metrics/selected-lines.json")).unwrap();
    let selected: std::collections::BTreeMap<String, Vec<String>> =
        serde_json::from_str(&text).unwrap();
    let recorded: Vec<&String> = selected["frontend_after_worker_gate"]
        .iter()
        .filter(|l| {
            l.starts_with("dynamo_frontend_failures_total{")
                && (l.contains("CapacityExhausted") || l.contains("backend.unavailable"))
        })
        .collect();
    assert_eq!(recorded.len(), 3, "{recorded:?}");
    let count = |reason: &str| -> u64 {
        let line = recorded.iter().find(|l| l.contains(reason)).unwrap();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let m = Monitor::new();
    let spec = WorkerSpec {
        kv_total_blocks: Some(10),
        ..Default::default()
    };
    m.add_worker("tiny", 1, spec).unwrap();
    let full = LoadReport {
        kv_used_blocks: Some(10),
        ..Default::default()
    };
    m.report(1, 0, &full).unwrap();
    let busy = ThresholdUpdate {
        active_decode_blocks_threshold: Some(0.5),
        ..Default::default()
    };
    m.set_thresholds("tiny", &busy).unwrap();
    for _ in 0..count("capacity.pool_exhausted") {
        assert!(m.select("tiny", Policy::RoundRobin).is_err());
    }
    for _ in 0..count("capacity.worker_overloaded") {
        assert!(m.check(1).is_err());
    }
    m.remove_worker(1).unwrap();
    for _ in 0..count("backend.unavailable") {
        assert!(m.select("tiny", Policy::RoundRobin).is_err());
    }
    let ours = m.metrics_text();
    for line in recorded {
        assert!(
            ours.lines().any(|l| l == line),
            "missing {line:?} in\n{ours}"
        );
    }
}

// ----- forward-pass-metrics ------------------------------------------------

use loadgate::cluster::wire::{ForwardPass, WireError};
use loadgate::cluster::{Subscriber, SubscriberConfig};
use loadgate::{ManualClock, Staleness, ThresholdUpdate};

/// Bytes written as msgpack `bin`, as Dynamo writes an envelope's payload.
struct Bin<'a>(&'a [u8]);

impl serde::Serialize for Bin<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

#[derive(serde::Serialize)]
struct EnvelopeOut<'a> {
    publisher_id: u64,
    sequence: u64,
    published_at: u64,
    topic: &'a str,
    payload: Bin<'a>,
}

fn envelope(publisher_id: u64, sequence: u64, topic: &str, payload: &[u8]) -> Vec<u8> {
    rmp_serde::to_vec_named(&EnvelopeOut {
        publisher_id,
        sequence,
        published_at: 1,
        topic,
        payload: Bin(payload),
    })
    .unwrap()
}

/// The recorded forward-pass messages, decoded, with their raw payloads.
fn forward_passes() -> Vec<(ForwardPass, Vec<u8>)> {
    /// An envelope's payload bytes (msgpack `bin`).
    fn payload_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct Bytes;
        impl serde::de::Visitor<'_> for Bytes {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
        }
        d.deserialize_bytes(Bytes)
    }
    #[derive(Deserialize)]
    struct Raw {
        #[serde(deserialize_with = "payload_bytes")]
        payload: Vec<u8>,
    }
    messages()
        .into_iter()
        .filter(|(s, _)| s.ends_with(".forward-pass-metrics"))
        .map(|(subject, bytes)| {
            let Ok(Decoded::ForwardPass(f)) = decode(&bytes) else {
                panic!("{subject}: not decoded: {:?}", decode(&bytes));
            };
            let raw: Raw = rmp_serde::from_slice(&bytes).expect("an envelope");
            (f, raw.payload)
        })
        .collect()
}

#[test]
fn every_recorded_forward_pass_message_decodes_with_its_queue_depth() {
    let all = forward_passes();
    assert!(all.len() >= 50, "{} recorded", all.len());
    let kv_workers: std::collections::BTreeSet<u64> = messages()
        .into_iter()
        .filter(|(s, _)| s.ends_with(".kv_metrics"))
        .filter_map(|(_, b)| match decode(&b) {
            Ok(Decoded::Envelope(e)) => Some(e.load.worker_id),
            _ => None,
        })
        .collect();
    // worker_id travels as a decimal string here and as an integer in
    // kv_metrics: both name the same workers.
    assert!(all.iter().any(|(f, _)| kv_workers.contains(&f.worker_id)));
    assert!(all.iter().any(|(f, _)| f.dp_rank == 1));
    assert!(
        all.iter()
            .any(|(f, _)| f.queued_requests > 0 && f.queued_prefill_tokens > 0),
        "the refusing worker's queue was recorded"
    );
}

/// Workers as Dynamo's discovery declares them: every (worker, rank) the
/// recorded forward passes name.
fn declared(m: &Monitor, passes: &[(ForwardPass, Vec<u8>)]) -> Vec<(u64, u32)> {
    let mut ranks: Vec<(u64, u32)> = passes
        .iter()
        .map(|(f, _)| (f.worker_id, f.dp_rank))
        .collect();
    ranks.sort_unstable();
    ranks.dedup();
    for &(id, _) in &ranks {
        let dp_size = ranks.iter().filter(|(w, _)| *w == id).count() as u32;
        let _ = m.add_worker(
            "tiny",
            id,
            WorkerSpec {
                dp_size,
                kv_total_blocks: Some(64),
                ..Default::default()
            },
        );
    }
    ranks
}

#[test]
fn forward_pass_heartbeats_keep_idle_workers_alive_under_staleness_busy() {
    let passes = forward_passes();
    let clock = ManualClock::new();
    let m = std::sync::Arc::new(Monitor::with_config(Default::default(), clock.clone()).unwrap());
    let ranks = declared(&m, &passes);
    m.set_staleness("tiny", Staleness::Busy, Duration::from_secs(3))
        .unwrap();
    let s = Subscriber::new(m.clone(), SubscriberConfig::default(), clock.clone()).unwrap();
    // An idle rank's recorded heartbeat, sent once a second for a minute.
    let idle = |id: u64, rank: u32| {
        passes
            .iter()
            .find(|(f, _)| f.worker_id == id && f.dp_rank == rank && f.queued_requests == 0)
            .map(|(_, p)| p.clone())
            .expect("an idle heartbeat")
    };
    for second in 0..60u64 {
        for (i, &(id, rank)) in ranks.iter().enumerate() {
            let bytes = envelope(
                100 + i as u64,
                second,
                "forward-pass-metrics",
                &idle(id, rank),
            );
            s.handle_on(
                "namespace.dynamo.component.backend.endpoint.generate.forward-pass-metrics",
                &bytes,
            )
            .unwrap();
        }
        clock.advance(Duration::from_secs(1));
        m.sweep();
        assert!(m.busy_workers("tiny").is_empty(), "second {second}");
    }
    assert_eq!(s.stats().malformed + s.stats().refused, 0);
    // Without the heartbeat the same workers turn stale, so busy.
    clock.advance(Duration::from_secs(4));
    m.sweep();
    m.sweep();
    assert_eq!(m.busy_workers("tiny").len(), m.workers("tiny").len());
}

#[test]
fn forward_pass_queue_depth_feeds_the_waiting_threshold() {
    let passes = forward_passes();
    let m = std::sync::Arc::new(Monitor::new());
    declared(&m, &passes);
    let busy_above_one = ThresholdUpdate {
        waiting_requests_threshold: Some(1),
        ..Default::default()
    };
    m.set_thresholds("tiny", &busy_above_one).unwrap();
    let s = Subscriber::new(m.clone(), SubscriberConfig::default(), ManualClock::new()).unwrap();
    let (queued, payload) = passes
        .iter()
        .filter(|(f, _)| f.queued_requests > 1)
        .max_by_key(|(f, _)| f.queued_requests)
        .expect("a recorded queue");
    let worker = queued.worker_id;
    let single_rank = m.rank_load(worker, 1).is_err();
    let subject = "namespace.dynamo.component.backend.endpoint.generate.forward-pass-metrics";
    s.handle_on(subject, &envelope(7, 10, "forward-pass-metrics", payload))
        .unwrap();
    assert_eq!(
        m.rank_load(worker, queued.dp_rank)
            .unwrap()
            .waiting_requests,
        Some(queued.queued_requests)
    );
    assert_eq!(m.is_busy(worker).unwrap(), single_rank);
    // An older message of the same publisher is dropped; a newer idle one
    // clears the queue.
    let idle = passes
        .iter()
        .find(|(f, _)| {
            f.worker_id == worker && f.dp_rank == queued.dp_rank && f.queued_requests == 0
        })
        .map(|(_, p)| p.clone())
        .expect("an idle message of that rank");
    s.handle_on(subject, &envelope(7, 9, "forward-pass-metrics", &idle))
        .unwrap();
    assert_eq!(
        m.rank_load(worker, queued.dp_rank)
            .unwrap()
            .waiting_requests,
        Some(queued.queued_requests),
        "out of order: dropped"
    );
    s.handle_on(subject, &envelope(7, 11, "forward-pass-metrics", &idle))
        .unwrap();
    assert_eq!(
        m.rank_load(worker, queued.dp_rank)
            .unwrap()
            .waiting_requests,
        Some(0)
    );
    assert!(!m.is_busy(worker).unwrap());
}

#[test]
fn hostile_forward_pass_payloads_are_typed_errors() {
    let fpm = |v: serde_json::Value| {
        envelope(
            1,
            1,
            "forward-pass-metrics",
            &rmp_serde::to_vec_named(&v).unwrap(),
        )
    };
    let err = |v: serde_json::Value| decode(&fpm(v)).unwrap_err();
    assert!(matches!(
        err(serde_json::json!({"version": 1, "worker_id": "12a", "dp_rank": 0})),
        WireError::Malformed(_)
    ));
    assert!(matches!(
        err(serde_json::json!({"version": 1, "worker_id": "9".repeat(500), "dp_rank": 0})),
        WireError::Malformed(_)
    ));
    assert!(matches!(
        err(serde_json::json!({"version": 1, "worker_id": "99999999999999999999", "dp_rank": 0})),
        WireError::Invalid(_)
    ));
    assert_eq!(
        err(serde_json::json!({"version": 2, "worker_id": "1"})),
        WireError::UnsupportedVersion(2)
    );
    let huge = serde_json::json!({"version": 1, "worker_id": 1,
        "queued_requests": {"num_prefill_requests": u64::MAX, "num_decode_requests": 1}});
    assert!(matches!(err(huge), WireError::Invalid(_)));
    assert!(matches!(
        err(serde_json::json!({"version": 1, "worker_id": 1, "dp_rank": "zero"})),
        WireError::Malformed(_)
    ));
    // A well-formed one with no queue section queues nothing.
    let Ok(Decoded::ForwardPass(f)) = decode(&fpm(
        serde_json::json!({"version": 1, "worker_id": "42", "dp_rank": 3}),
    )) else {
        panic!("decodes");
    };
    assert_eq!((f.worker_id, f.dp_rank, f.queued_requests), (42, 3, 0));
}
