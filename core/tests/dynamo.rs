//! The reference system's event-plane envelope (docs/behaviour.md), built
//! here the way `rmp_serde::to_vec_named` writes the reference's own structs:
//! field order as declared, `None` as nil, `payload` as msgpack `bin`; all
//! three payload generations, older envelope layouts and the JSON form,
//! in process and through a real `nats-server`.

#[cfg(feature = "nats")]
#[allow(dead_code)] // each test binary uses part of the support code
mod support;

use std::sync::Arc;

use loadgate::cluster::wire::{decode, ActiveLoad, Decoded, Envelope, WireError};
use loadgate::cluster::{Applied, HandleError, Subscriber, SubscriberConfig};
use loadgate::{ManualClock, Monitor, ReportError, WorkerSpec};
use serde::{Serialize, Serializer};

/// `bytes::Bytes` as serde writes it: a byte string.
struct Bytes(Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

/// The reference's `EventEnvelope`, fields in its declaration order.
#[derive(Serialize)]
struct EventEnvelope {
    publisher_id: u64,
    sequence: u64,
    published_at: u64,
    topic: String,
    payload: Bytes,
}

/// An older layout: `topic` first, nanosecond timestamp.
#[derive(Serialize)]
struct OldEventEnvelope {
    topic: String,
    publisher_id: u64,
    sequence: u64,
    published_at_ns: u64,
    payload: Bytes,
}

/// The newest `ActiveLoad`.
#[derive(Serialize)]
struct ActiveLoadV3 {
    worker_id: u64,
    dp_rank: u32,
    active_decode_blocks: Option<u64>,
    active_prefill_tokens: Option<u64>,
    scheduler_load_scope: Option<&'static str>,
    kv_used_blocks: Option<u64>,
}

/// Before `scheduler_load_scope`, and Dynamo 1.6.1's.
#[derive(Serialize)]
struct ActiveLoadV2 {
    worker_id: u64,
    dp_rank: u32,
    active_decode_blocks: Option<u64>,
    active_prefill_tokens: Option<u64>,
    kv_used_blocks: Option<u64>,
}

/// Before `kv_used_blocks`.
#[derive(Serialize)]
struct ActiveLoadV1 {
    worker_id: u64,
    dp_rank: u32,
    active_decode_blocks: Option<u64>,
    active_prefill_tokens: Option<u64>,
}

fn envelope(publisher_id: u64, sequence: u64, payload: &impl Serialize) -> Vec<u8> {
    rmp_serde::to_vec_named(&EventEnvelope {
        publisher_id,
        sequence,
        published_at: 1_764_720_000_000,
        topic: "kv_metrics".into(),
        payload: Bytes(rmp_serde::to_vec_named(payload).unwrap()),
    })
    .unwrap()
}

fn v3(worker_id: u64, kv_used: Option<u64>, decode: Option<u64>) -> ActiveLoadV3 {
    ActiveLoadV3 {
        worker_id,
        dp_rank: 0,
        active_decode_blocks: decode,
        active_prefill_tokens: None,
        scheduler_load_scope: Some("local"),
        kv_used_blocks: kv_used,
    }
}

fn load(worker_id: u64, dp_rank: u32) -> ActiveLoad {
    ActiveLoad {
        worker_id,
        dp_rank,
        active_decode_blocks: None,
        active_prefill_tokens: None,
        kv_used_blocks: None,
    }
}

#[test]
fn every_payload_generation_and_envelope_layout_decodes() {
    let want = |load: ActiveLoad| {
        Ok(Decoded::Envelope(Envelope {
            publisher_id: 9,
            sequence: 3,
            load,
        }))
    };
    let gen3 = ActiveLoadV3 {
        dp_rank: 2,
        active_prefill_tokens: Some(512),
        scheduler_load_scope: Some("replica_synchronized"),
        ..v3(7, Some(40), Some(30))
    };
    assert_eq!(
        decode(&envelope(9, 3, &gen3)),
        want(ActiveLoad {
            active_decode_blocks: Some(30),
            active_prefill_tokens: Some(512),
            kv_used_blocks: Some(40),
            ..load(7, 2)
        })
    );
    let gen2 = ActiveLoadV2 {
        worker_id: 7,
        dp_rank: 1,
        active_decode_blocks: None,
        active_prefill_tokens: Some(0),
        kv_used_blocks: Some(5),
    };
    assert_eq!(
        decode(&envelope(9, 3, &gen2)),
        want(ActiveLoad {
            active_prefill_tokens: Some(0),
            kv_used_blocks: Some(5),
            ..load(7, 1)
        })
    );
    let gen1 = ActiveLoadV1 {
        worker_id: 7,
        dp_rank: 0,
        active_decode_blocks: Some(12),
        active_prefill_tokens: None,
    };
    assert_eq!(
        decode(&envelope(9, 3, &gen1)),
        want(ActiveLoad {
            active_decode_blocks: Some(12),
            ..load(7, 0)
        })
    );
    // An older envelope layout, matched by field name.
    let old = rmp_serde::to_vec_named(&OldEventEnvelope {
        topic: "kv_metrics".into(),
        publisher_id: 9,
        sequence: 3,
        published_at_ns: 1,
        payload: Bytes(rmp_serde::to_vec_named(&gen1).unwrap()),
    })
    .unwrap();
    assert_eq!(
        decode(&old),
        want(ActiveLoad {
            active_decode_blocks: Some(12),
            ..load(7, 0)
        })
    );
    // The JSON form: serde writes the payload bytes as an array.
    let json = serde_json::to_vec(&EventEnvelope {
        publisher_id: 9,
        sequence: 3,
        published_at: 1,
        topic: "kv_metrics".into(),
        payload: Bytes(rmp_serde::to_vec_named(&gen2).unwrap()),
    })
    .unwrap();
    assert!(json.starts_with(b"{\"publisher_id\":9"));
    assert_eq!(
        decode(&json),
        want(ActiveLoad {
            active_prefill_tokens: Some(0),
            kv_used_blocks: Some(5),
            ..load(7, 1)
        })
    );
    // ... and a nested ActiveLoad object, with unknown fields ignored.
    let nested = br#"{"publisher_id":9,"sequence":3,"published_at":1,"topic":"kv_metrics",
        "payload":{"worker_id":7,"dp_rank":1,"kv_used_blocks":5,"active_prefill_tokens":0,
        "scheduler_load_scope":"local","future_field":[1,2]},"future":null}"#;
    assert_eq!(
        decode(nested),
        want(ActiveLoad {
            active_prefill_tokens: Some(0),
            kv_used_blocks: Some(5),
            ..load(7, 1)
        })
    );
    // What loadgate writes is what Dynamo 1.6.1 writes (its five keys; the
    // recorded envelopes are compared in dynamo_fixtures.rs).
    let e = Envelope {
        publisher_id: 9,
        sequence: 3,
        load: ActiveLoad {
            active_decode_blocks: Some(30),
            kv_used_blocks: Some(40),
            ..load(7, 0)
        },
    };
    let reference = rmp_serde::to_vec_named(&EventEnvelope {
        publisher_id: 9,
        sequence: 3,
        published_at: 5,
        topic: "kv_metrics".into(),
        payload: Bytes(
            rmp_serde::to_vec_named(&ActiveLoadV2 {
                worker_id: 7,
                dp_rank: 0,
                active_decode_blocks: Some(30),
                active_prefill_tokens: None,
                kv_used_blocks: Some(40),
            })
            .unwrap(),
        ),
    })
    .unwrap();
    assert_eq!(e.to_msgpack(5), reference, "byte for byte");
}

#[test]
fn malformed_envelopes_are_typed_errors() {
    let malformed = |bytes: &[u8]| matches!(decode(bytes), Err(WireError::Malformed(_)));
    let no_sequence = rmp_serde::to_vec_named(&serde_json::json!({
        "publisher_id": 1, "payload": serde_json::json!({"worker_id": 1}),
    }))
    .unwrap();
    assert!(malformed(&no_sequence));
    let mut cut = envelope(1, 1, &v3(7, Some(1), None));
    cut.truncate(cut.len() - 3);
    assert!(malformed(&cut));
    let bad_inner = rmp_serde::to_vec_named(&EventEnvelope {
        publisher_id: 1,
        sequence: 1,
        published_at: 1,
        topic: "kv_metrics".into(),
        payload: Bytes(b"\xc1nonsense".to_vec()),
    })
    .unwrap();
    assert!(malformed(&bad_inner));
    assert!(malformed(
        br#"{"publisher_id":1,"sequence":1,"payload":{"dp_rank":1}}"#
    ));
    assert!(malformed(
        br#"{"publisher_id":1,"sequence":1,"payload":[256]}"#
    ));
    assert!(malformed(
        br#"{"publisher_id":1,"sequence":1,"payload":"text"}"#
    ));
}

fn frontend() -> (Arc<Monitor>, Arc<Subscriber>) {
    let monitor = Arc::new(Monitor::with_config(Default::default(), ManualClock::new()).unwrap());
    let spec = WorkerSpec {
        dp_size: 2,
        kv_total_blocks: Some(100),
        ..Default::default()
    };
    monitor.add_worker("m", 7, spec).unwrap();
    let s = Subscriber::new(
        monitor.clone(),
        SubscriberConfig::default(),
        ManualClock::new(),
    )
    .unwrap();
    (monitor, s)
}

#[test]
fn envelopes_are_ordered_per_publisher_and_a_new_publisher_is_a_restart() {
    let (m, s) = frontend();
    let kv = |m: &Monitor| m.rank_load(7, 0).unwrap().kv_used_blocks;
    assert_eq!(
        s.handle(&envelope(1, 0, &v3(7, Some(10), None))),
        Ok(Applied::Report)
    );
    assert_eq!(
        s.handle(&envelope(1, 2, &v3(7, Some(20), None))),
        Ok(Applied::Report)
    );
    assert_eq!(
        s.handle(&envelope(1, 1, &v3(7, Some(15), None))),
        Ok(Applied::OutOfOrder)
    );
    assert_eq!(
        s.handle(&envelope(1, 2, &v3(7, Some(15), None))),
        Ok(Applied::OutOfOrder),
        "a replay"
    );
    assert_eq!(kv(&m), 20);
    // nil keeps the value: only active_decode_blocks changes.
    assert_eq!(
        s.handle(&envelope(1, 3, &v3(7, None, Some(4)))),
        Ok(Applied::Report)
    );
    let rank = m.rank_load(7, 0).unwrap();
    assert_eq!((rank.kv_used_blocks, rank.active_decode_blocks), (20, 4));
    // The worker restarts: a new publisher starts again from 0.
    assert_eq!(
        s.handle(&envelope(2, 0, &v3(7, Some(30), None))),
        Ok(Applied::Report)
    );
    assert_eq!(kv(&m), 30);
    assert_eq!(s.stats().out_of_order, 2);
}

#[test]
fn envelopes_for_undeclared_workers_or_ranks_are_refused_and_counted() {
    let (m, s) = frontend();
    assert_eq!(
        s.handle(&envelope(1, 0, &v3(8, Some(10), None))),
        Err(HandleError::Report(ReportError::UnknownWorker(8)))
    );
    let rank_5 = ActiveLoadV3 {
        dp_rank: 5,
        ..v3(7, Some(10), None)
    };
    assert!(matches!(
        s.handle(&envelope(1, 0, &rank_5)),
        Err(HandleError::Report(ReportError::UndeclaredRank { .. }))
    ));
    assert!(m.workers("m") == vec![7], "nothing registered");
    let refused: Vec<_> = s.refusals().into_iter().filter(|(_, n)| *n > 0).collect();
    assert_eq!(refused, vec![("unknown_worker", 1), ("undeclared_rank", 1)]);
}

#[test]
fn a_loadgate_worker_publishes_what_a_reference_frontend_reads() {
    use loadgate::cluster::{
        dynamo_kv_metrics_subject, InProcessBus, Publisher, PublisherConfig, Subjects, Transport,
        WireFormat,
    };
    use loadgate::LoadReport;
    use std::sync::Mutex;

    let bus = InProcessBus::new();
    // What a reference frontend receives: every endpoint of the namespace.
    type Seen = Arc<Mutex<Vec<(String, Vec<u8>)>>>;
    let seen: Seen = Arc::default();
    let sink = seen.clone();
    let _raw = bus
        .subscribe(
            &dynamo_kv_metrics_subject("dyn", "*", "*").unwrap(),
            Arc::new(move |subject: &str, p: &[u8]| {
                sink.lock().unwrap().push((subject.to_owned(), p.to_vec()));
            }),
        )
        .unwrap();
    // A loadgate frontend following the same subject, the worker declared.
    let (m, s) = frontend();
    let config = SubscriberConfig {
        active_load_subject: Some(dynamo_kv_metrics_subject("dyn", "*", "*").unwrap()),
        ..Default::default()
    };
    let s2 = Subscriber::new(m.clone(), config, ManualClock::new()).unwrap();
    let _attached = s2.attach(&bus, &Subjects::new("dyn").unwrap()).unwrap();
    drop(s);

    let config = PublisherConfig {
        dp_size: 2,
        format: WireFormat::Dynamo {
            namespace: "dyn".into(),
            component: "vllm worker".into(),
            endpoint: "generate".into(),
        },
        ..PublisherConfig::new(7, "m")
    };
    let w = Publisher::new(
        config,
        Arc::new(bus.clone()),
        &Subjects::new("dyn").unwrap(),
        ManualClock::new(),
    )
    .unwrap();
    w.report(
        1,
        &LoadReport {
            kv_used_blocks: Some(42),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(w.flush(), 2, "the first flush is a heartbeat of both ranks");
    assert_eq!(m.rank_load(7, 1).unwrap().kv_used_blocks, 42);

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0].0,
        "namespace.dyn.component.vllm%20worker.endpoint.generate.kv_metrics"
    );
    let Ok(Decoded::Envelope(first)) = decode(&seen[0].1) else {
        panic!("not an envelope")
    };
    let Ok(Decoded::Envelope(second)) = decode(&seen[1].1) else {
        panic!("not an envelope")
    };
    assert_eq!((first.sequence, second.sequence), (0, 1), "counted from 0");
    assert_eq!(first.publisher_id, second.publisher_id);
    assert_eq!(
        second.load,
        ActiveLoad {
            kv_used_blocks: Some(42),
            ..load(7, 1)
        }
    );

    let wildcard = PublisherConfig {
        format: WireFormat::Dynamo {
            namespace: "dyn".into(),
            component: "*".into(),
            endpoint: "generate".into(),
        },
        ..PublisherConfig::new(8, "m")
    };
    assert!(wildcard.validate().is_err());
}

/// Through a real server: a reference worker's envelopes (every payload
/// generation, msgpack and JSON) reach a loadgate frontend that follows the
/// reference subjects, and a loadgate worker publishing the reference format
/// is read by a subscriber of the reference subject.
#[cfg(feature = "nats")]
#[test]
fn reference_envelopes_cross_a_real_nats_server_both_ways() {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use loadgate::cluster::nats::NatsTransport;
    use loadgate::cluster::{
        dynamo_kv_metrics_subject, Publisher, PublisherConfig, Subjects, Transport, WireFormat,
    };
    use loadgate::{LoadReport, MonotonicClock};
    use support::nats_server::NatsServer;

    let server = NatsServer::start();
    let url = server.url();
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };

    // A loadgate frontend following every endpoint of namespace "dyn",
    // with the reference's workers declared.
    let monitor = Arc::new(Monitor::new());
    for id in [7, 8, 9] {
        let spec = WorkerSpec {
            dp_size: 2,
            kv_total_blocks: Some(100),
            ..Default::default()
        };
        monitor.add_worker("m", id, spec).unwrap();
    }
    let config = SubscriberConfig {
        active_load_subject: Some(dynamo_kv_metrics_subject("dyn", "*", "*").unwrap()),
        ..Default::default()
    };
    let s = Subscriber::new(monitor.clone(), config, MonotonicClock::shared()).unwrap();
    let frontend = NatsTransport::connect(&url).unwrap();
    let _attached = s.attach(&frontend, &Subjects::new("dyn").unwrap()).unwrap();

    // A reference worker of each payload generation, on its own subject.
    let worker = NatsTransport::connect(&url).unwrap();
    let subject =
        |component: &str| dynamo_kv_metrics_subject("dyn", component, "generate").unwrap();
    let gen3 = ActiveLoadV3 {
        dp_rank: 1,
        ..v3(7, Some(70), Some(1))
    };
    let gen2 = ActiveLoadV2 {
        worker_id: 8,
        dp_rank: 0,
        active_decode_blocks: None,
        active_prefill_tokens: None,
        kv_used_blocks: Some(80),
    };
    let gen1 = ActiveLoadV1 {
        worker_id: 9,
        dp_rank: 1,
        active_decode_blocks: Some(90),
        active_prefill_tokens: None,
    };
    worker
        .publish(&subject("backend"), envelope(1, 0, &gen3))
        .unwrap();
    worker
        .publish(&subject("vllm.worker"), envelope(2, 0, &gen2))
        .unwrap();
    let json = serde_json::to_vec(&EventEnvelope {
        publisher_id: 3,
        sequence: 0,
        published_at: 1,
        topic: "kv_metrics".into(),
        payload: Bytes(rmp_serde::to_vec_named(&gen1).unwrap()),
    })
    .unwrap();
    worker.publish(&subject("prefill"), json).unwrap();
    // A replay of worker 7's first envelope, now with other load: dropped.
    worker
        .publish(&subject("backend"), envelope(1, 0, &v3(7, Some(1), None)))
        .unwrap();
    worker
        .publish(&subject("backend"), envelope(1, 1, &v3(7, None, Some(2))))
        .unwrap();
    worker.flush().unwrap();
    wait("every envelope applied", &|| {
        let rank = |id, r| monitor.rank_load(id, r).unwrap();
        rank(7, 1).kv_used_blocks == 70
            && rank(7, 0).active_decode_blocks == 2
            && rank(8, 0).kv_used_blocks == 80
            && rank(9, 1).active_decode_blocks == 90
    });
    wait("the replay counted", &|| s.stats().out_of_order == 1);
    assert_eq!(
        monitor.rank_load(7, 0).unwrap().kv_used_blocks,
        0,
        "the replay changed nothing"
    );

    // A loadgate worker publishing the reference format, read by a plain
    // subscriber of the reference subject.
    let received: Arc<Mutex<Vec<Envelope>>> = Arc::default();
    let sink = received.clone();
    let reader = NatsTransport::connect(&url).unwrap();
    let _sub = reader
        .subscribe(
            &dynamo_kv_metrics_subject("dyn", "lg", "*").unwrap(),
            Arc::new(move |_: &str, p: &[u8]| {
                if let Ok(Decoded::Envelope(e)) = decode(p) {
                    sink.lock().unwrap().push(e);
                }
            }),
        )
        .unwrap();
    reader.flush().unwrap();
    let config = PublisherConfig {
        format: WireFormat::Dynamo {
            namespace: "dyn".into(),
            component: "lg".into(),
            endpoint: "generate".into(),
        },
        heartbeat: Duration::from_millis(50),
        ..PublisherConfig::new(11, "m")
    };
    let transport: Arc<dyn Transport> = Arc::new(NatsTransport::connect(&url).unwrap());
    let w = Publisher::spawn(config, transport, &Subjects::new("dyn").unwrap()).unwrap();
    w.report(
        0,
        &LoadReport {
            kv_used_blocks: Some(33),
            ..Default::default()
        },
    )
    .unwrap();
    wait("the reference-format report arrived", &|| {
        received
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.load.worker_id == 11 && e.load.kv_used_blocks == Some(33))
    });
    let got = received.lock().unwrap();
    assert!(
        got.windows(2).all(|w| w[1].sequence == w[0].sequence + 1),
        "one publisher, sequence counting up: {:?}",
        got.iter().map(|e| e.sequence).collect::<Vec<_>>()
    );
    assert_eq!(got[0].sequence, 0);
}
