//! A Dynamo 1.6.1 KV router's bookings, read from the
//! `active_sequences_events` it published with `--router-replica-sync`
//! (recorded by `tools/dynamo/record_sequences.py` into
//! `tests/fixtures/dynamo-1.6.1/nats/active_sequences.jsonl`): each
//! `AddRequest` books its blocks and prefill tokens on its worker rank,
//! `MarkPrefillCompleted` releases the prefill, `Free` the rest, keyed by
//! request whoever publishes them, as 1.6.1's routers apply them: the
//! booking router's mark shows at once, a worker's at the rank's next
//! publication (`sequences-multitoken/`, answers of 20 to 40 tokens, where
//! the router's mark is missing for one request); the bookings are bounded
//! in count and age, and hostile payloads are typed errors.

#[allow(dead_code)] // each test binary uses part of the support code
mod support;

use std::sync::Arc;
use std::time::Duration;

use loadgate::cluster::wire::{decode, Decoded, SequenceChange, WireError, MAX_REQUEST_ID};
use loadgate::cluster::{
    Applied, HandleError, InProcessBus, Subjects, Subscriber, SubscriberConfig, Transport,
    HIDDEN_RELEASE_LAG,
};
use loadgate::{ManualClock, Monitor, ThresholdUpdate, WorkerSpec};
use serde::Serialize;
use support::recorded::{fixture, messages};

const SUBJECT: &str =
    "namespace.dynamo.component.backend.endpoint.generate.active_sequences_events";

/// The recorded payloads, with what each decodes to.
fn recorded() -> Vec<(Vec<u8>, serde_json::Value)> {
    recorded_in("nats/active_sequences.jsonl")
}

fn recorded_in(path: &str) -> Vec<(Vec<u8>, serde_json::Value)> {
    messages(path)
        .into_iter()
        .map(|(bytes, v)| (bytes, v["decoded"].clone()))
        .collect()
}

/// The worker the recording routed to, declared as its card says (two
/// ranks of 64 blocks, 8192 batched tokens).
fn monitor_with_worker(
    events: &[(Vec<u8>, serde_json::Value)],
) -> (Arc<Monitor>, Arc<ManualClock>, u64) {
    let worker = events[0].1["worker"]["worker_id"].as_u64().unwrap();
    let clock = ManualClock::new();
    let m = Arc::new(Monitor::with_config(Default::default(), clock.clone()).unwrap());
    let spec = WorkerSpec {
        dp_size: 2,
        kv_total_blocks: Some(64),
        max_num_batched_tokens: Some(8192),
        ..Default::default()
    };
    m.add_worker("tiny", worker, spec).unwrap();
    (m, clock, worker)
}

#[test]
fn every_recorded_event_decodes_as_what_it_says() {
    let events = recorded();
    assert!(events.len() >= 12, "{} events", events.len());
    let (mut adds, mut done, mut freed) = (0, 0, 0);
    for (bytes, want) in &events {
        let Ok(Decoded::Sequence(e)) = decode(bytes) else {
            panic!("not decoded as a sequence event: {:?}", decode(bytes));
        };
        assert_eq!(e.request_id, want["request_id"].as_str().unwrap());
        assert_eq!(e.router_id, want["router_id"].as_u64().unwrap());
        assert_eq!(e.worker_id, want["worker"]["worker_id"].as_u64().unwrap());
        assert_eq!(
            u64::from(e.dp_rank),
            want["worker"]["dp_rank"].as_u64().unwrap()
        );
        match e.change {
            SequenceChange::Add {
                blocks,
                prefill_tokens,
            } => {
                let add = &want["data"]["AddRequest"];
                assert_eq!(
                    blocks as usize,
                    add["token_sequence"].as_array().unwrap().len()
                );
                let hint = &add["prefill_load_hint"]["initial_effective_prefill_tokens"];
                assert_eq!(prefill_tokens, hint.as_u64().unwrap());
                adds += 1;
            }
            SequenceChange::PrefillDone => {
                assert_eq!(want["data"], "MarkPrefillCompleted");
                done += 1;
            }
            SequenceChange::Free => {
                assert_eq!(want["data"], "Free");
                freed += 1;
            }
        }
    }
    assert_eq!((adds, done, freed), (4, 8, 4));
}

#[test]
fn the_recorded_routers_bookings_are_held_and_released_as_it_held_them() {
    let events = recorded();
    let (m, clock, worker) = monitor_with_worker(&events);
    let prefill = ThresholdUpdate {
        active_prefill_tokens_threshold: Some(30),
        ..Default::default()
    };
    let thresholds = m.set_thresholds("tiny", &prefill).unwrap().thresholds;
    let s = Subscriber::new(m.clone(), SubscriberConfig::default(), clock).unwrap();
    let (mut held, mut worker_marks) = (std::collections::HashSet::new(), 0);
    for (bytes, want) in &events {
        let request = want["request_id"].as_str().unwrap().to_owned();
        let rank = want["worker"]["dp_rank"].as_u64().unwrap() as u32;
        let router = want["router_id"].as_u64().unwrap();
        let before = m.rank_load(worker, rank).unwrap();
        let applied = s.handle_on(SUBJECT, bytes).unwrap();
        let load = m.rank_load(worker, rank).unwrap();
        match &want["data"] {
            serde_json::Value::Object(add) => {
                assert_eq!(applied, Applied::Report);
                held.insert(request);
                let add = &add["AddRequest"];
                let tokens = add["prefill_load_hint"]["initial_effective_prefill_tokens"].as_u64();
                assert_eq!(load.active_prefill_tokens, tokens);
                let blocks = add["token_sequence"].as_array().unwrap().len() as u64;
                assert_eq!(load.active_decode_blocks, blocks);
                // Every recorded prompt is over 30 tokens but one of 17.
                assert_eq!(thresholds.rank_busy(&load), tokens.unwrap() > 30);
            }
            serde_json::Value::String(kind) if router == worker => {
                // The worker's own MarkPrefillCompleted: applied to the
                // request while it is held, and shown only at the rank's
                // next publication (never, on this clock that stands still).
                assert_eq!(kind, "MarkPrefillCompleted");
                let expected = if held.contains(&request) {
                    Applied::Report
                } else {
                    Applied::Ignored
                };
                assert_eq!(applied, expected);
                assert_eq!(load, before);
                worker_marks += 1;
            }
            serde_json::Value::String(kind) if kind == "MarkPrefillCompleted" => {
                assert_eq!(applied, Applied::Report);
                assert_eq!(load.active_prefill_tokens, Some(0));
                assert!(!thresholds.rank_busy(&load));
            }
            serde_json::Value::String(kind) => {
                assert_eq!((kind.as_str(), applied), ("Free", Applied::Report));
                assert_eq!(load.active_decode_blocks, 0);
                held.remove(&request);
            }
            other => panic!("unexpected data {other}"),
        }
    }
    assert_eq!(worker_marks, 4);
    assert_eq!(s.router_bookings(), 0);
    assert_eq!(s.stats().refused + s.stats().malformed, 0);
}

#[test]
fn an_attached_subscriber_follows_the_endpoints_router_bookings() {
    let events = recorded();
    let (m, clock, worker) = monitor_with_worker(&events);
    let config = SubscriberConfig {
        active_load_subject: Some(
            "namespace.dynamo.component.backend.endpoint.generate.kv_metrics".into(),
        ),
        ..Default::default()
    };
    let s = Subscriber::new(m.clone(), config, clock).unwrap();
    let bus = InProcessBus::new();
    let attached = s.attach(&bus, &Subjects::new("dynamo").unwrap()).unwrap();
    let first_add = &events[0];
    bus.publish(SUBJECT, first_add.0.clone()).unwrap();
    attached.settle();
    let rank = first_add.1["worker"]["dp_rank"].as_u64().unwrap() as u32;
    assert_eq!(s.router_bookings(), 1);
    assert!(m.rank_load(worker, rank).unwrap().active_prefill_tokens > Some(0));
}

/// One request in the reference view of a 1.6.1 router's published load.
struct Reference {
    rank: (u64, u32),
    blocks: u64,
    prefill: u64,
    router: u64,
    /// When another's mark released the prefill unseen.
    hidden: Option<u64>,
    released: bool,
}

/// The router's publication of `rank` at `now`: the releases hidden for at
/// least the lag show.
fn publish(model: &mut std::collections::HashMap<String, Reference>, rank: (u64, u32), now: u64) {
    let lag = HIDDEN_RELEASE_LAG.as_nanos() as u64;
    for r in model.values_mut().filter(|r| r.rank == rank) {
        if r.hidden.is_some_and(|t| now - t >= lag) {
            (r.released, r.hidden) = (true, None);
        }
    }
}

/// A recording with answers of 20 to 40 tokens over two workers (three
/// ranks), where the router published 13 `MarkPrefillCompleted` for 14
/// requests and each worker one for every request it served, replayed on
/// the clock of the envelopes' `published_at`: after every event each rank
/// holds exactly what the router published for it (module docs of
/// `cluster/bookings.rs`): the prefill of the requests not yet shown done,
/// and the blocks of those not freed.
#[test]
fn a_workers_mark_shows_at_the_ranks_next_publication() {
    let path = "sequences-multitoken/active_sequences.jsonl";
    let events = recorded_in(path);
    let published: Vec<u64> = std::fs::read_to_string(fixture(path))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["envelope"]["published_at"].as_u64().unwrap() * 1_000_000
        })
        .collect();
    let workers: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("sequences-multitoken/workers.json")).unwrap(),
    )
    .unwrap();
    let clock = ManualClock::new();
    let m = Arc::new(Monitor::with_config(Default::default(), clock.clone()).unwrap());
    let mut ids = Vec::new();
    for w in ["A", "B"] {
        let id = workers["workers"][w]["worker_id"].as_u64().unwrap();
        let spec = WorkerSpec {
            dp_size: workers["workers"][w]["data_parallel_size"]
                .as_u64()
                .unwrap() as u32,
            kv_total_blocks: Some(64),
            ..Default::default()
        };
        m.add_worker("tiny", id, spec).unwrap();
        ids.push(id);
    }
    let s = Subscriber::new(m.clone(), SubscriberConfig::default(), clock.clone()).unwrap();
    let mut model: std::collections::HashMap<String, Reference> = Default::default();
    let (mut router_marks, mut freed_hidden) = (std::collections::HashSet::new(), 0);
    let mut now = 0;
    for ((bytes, want), at) in events.iter().zip(published) {
        now = now.max(at);
        clock.set_nanos(now);
        let request = want["request_id"].as_str().unwrap().to_owned();
        let rank = (
            want["worker"]["worker_id"].as_u64().unwrap(),
            want["worker"]["dp_rank"].as_u64().unwrap() as u32,
        );
        let router = want["router_id"].as_u64().unwrap();
        s.handle_on(SUBJECT, bytes).unwrap();
        match &want["data"] {
            serde_json::Value::Object(add) => {
                let add = &add["AddRequest"];
                let blocks = add["token_sequence"].as_array().unwrap().len() as u64;
                let prefill = add["prefill_load_hint"]["initial_effective_prefill_tokens"]
                    .as_u64()
                    .unwrap();
                model.entry(request).or_insert(Reference {
                    rank,
                    blocks,
                    prefill,
                    router,
                    hidden: None,
                    released: false,
                });
                publish(&mut model, rank, now);
            }
            serde_json::Value::String(kind) if kind == "MarkPrefillCompleted" => {
                if !ids.contains(&router) {
                    router_marks.insert(request.clone());
                }
                if let Some(r) = model
                    .get_mut(&request)
                    .filter(|r| r.rank == rank && !r.released)
                {
                    if router == r.router {
                        (r.released, r.hidden) = (true, None);
                        publish(&mut model, rank, now);
                    } else if r.hidden.is_none() {
                        r.hidden = Some(now);
                    }
                }
            }
            _ => {
                if model.get(&request).is_some_and(|r| r.rank == rank) {
                    let r = model.remove(&request).unwrap();
                    freed_hidden += usize::from(r.hidden.is_some());
                    publish(&mut model, rank, now);
                }
            }
        }
        for &w in &ids {
            for r in 0..2 {
                let Ok(load) = m.rank_load(w, r) else {
                    continue;
                };
                let on = |e: &&Reference| e.rank == (w, r);
                let blocks: u64 = model.values().filter(on).map(|e| e.blocks).sum();
                let prefill: u64 = model
                    .values()
                    .filter(on)
                    .filter(|e| !e.released)
                    .map(|e| e.prefill)
                    .sum();
                assert_eq!(load.active_decode_blocks, blocks, "{w}/{r}");
                assert_eq!(load.active_prefill_tokens.unwrap_or(0), prefill, "{w}/{r}");
            }
        }
    }
    let adds = events.iter().filter(|e| e.1["data"].is_object()).count();
    assert!(
        router_marks.len() < adds,
        "the recording has a request the router never marked"
    );
    eprintln!("{freed_hidden} requests freed while their release was still hidden");
    assert_eq!(s.router_bookings(), 0);
}

/// A change of request `request` on worker `worker`'s rank 0, published
/// by `router_id`.
fn change(request: &str, worker: u64, kind: &str, router_id: u64) -> Vec<u8> {
    envelope(&Event {
        request_id: request.to_owned(),
        worker: Worker {
            worker_id: worker,
            dp_rank: 0,
        },
        data: kind,
        router_id,
    })
}

/// As a 1.6.1 router applies its replicas' events: by request alone. A
/// repeat of an `AddRequest` from another router books nothing more; a
/// change that names another worker than the booking's changes nothing;
/// a `Free` from another router ends it.
#[test]
fn changes_apply_by_request_whoever_publishes_them() {
    let clock = ManualClock::new();
    let m = Arc::new(Monitor::with_config(Default::default(), clock.clone()).unwrap());
    for w in [5, 6] {
        m.add_worker("tiny", w, WorkerSpec::default()).unwrap();
    }
    let s = Subscriber::new(m.clone(), SubscriberConfig::default(), clock.clone()).unwrap();
    let prefill = |w: u64| {
        m.rank_load(w, 0)
            .unwrap()
            .active_prefill_tokens
            .unwrap_or(0)
    };
    assert_eq!(s.handle(&add("a", 5, 40)).unwrap(), Applied::Report);
    assert_eq!(
        s.handle(&add_by("a", 6, 40, 8)).unwrap(),
        Applied::OutOfOrder,
        "a repeat from router 8"
    );
    assert_eq!((prefill(5), prefill(6), s.router_bookings()), (40, 0, 1));
    for wrong in ["MarkPrefillCompleted", "Free"] {
        assert_eq!(
            s.handle(&change("a", 6, wrong, 6)).unwrap(),
            Applied::Ignored,
            "{wrong} naming another worker"
        );
    }
    assert_eq!(prefill(5), 40);
    // The worker's own mark (router id = its worker id) ends the prefill
    // unseen, until the rank's next publication at least the lag later.
    assert_eq!(
        s.handle(&change("a", 5, "MarkPrefillCompleted", 5))
            .unwrap(),
        Applied::Report
    );
    assert_eq!(prefill(5), 40);
    clock.advance(HIDDEN_RELEASE_LAG / 2);
    s.handle(&add("b", 5, 10)).unwrap();
    assert_eq!(prefill(5), 50, "a publication before the lag shows nothing");
    clock.advance(HIDDEN_RELEASE_LAG / 2);
    s.handle(&add("c", 5, 1)).unwrap();
    assert_eq!(prefill(5), 11, "a's release shows");
    // The booking router's own mark shows at once.
    s.handle(&change("b", 5, "MarkPrefillCompleted", 9))
        .unwrap();
    assert_eq!(prefill(5), 1);
    assert_eq!(m.rank_load(5, 0).unwrap().active_decode_blocks, 9);
    for r in ["a", "b", "c"] {
        assert_eq!(
            s.handle(&change(r, 5, "Free", 77)).unwrap(),
            Applied::Report
        );
    }
    assert_eq!(m.rank_load(5, 0).unwrap().active_decode_blocks, 0);
    assert_eq!(s.router_bookings(), 0);
}

/// A reference envelope around an `active_sequences_events` payload.
fn envelope(payload: &impl Serialize) -> Vec<u8> {
    #[derive(Serialize)]
    struct Envelope<'a> {
        publisher_id: u64,
        sequence: u64,
        published_at: u64,
        topic: &'a str,
        #[serde(with = "serde_bytes_compat")]
        payload: Vec<u8>,
    }
    mod serde_bytes_compat {
        pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(v)
        }
    }
    let inner = rmp_serde::to_vec_named(payload).unwrap();
    rmp_serde::to_vec_named(&Envelope {
        publisher_id: 1,
        sequence: 1,
        published_at: 0,
        topic: "active_sequences_events",
        payload: inner,
    })
    .unwrap()
}

#[derive(Serialize)]
struct Worker {
    worker_id: u64,
    dp_rank: u32,
}

#[derive(Serialize)]
struct Event<D: Serialize> {
    request_id: String,
    worker: Worker,
    data: D,
    router_id: u64,
}

fn add(request: &str, worker: u64, prefill: u64) -> Vec<u8> {
    add_by(request, worker, prefill, 9)
}

/// An `AddRequest` published by router `router_id`.
fn add_by(request: &str, worker: u64, prefill: u64, router_id: u64) -> Vec<u8> {
    envelope(&Event {
        request_id: request.to_owned(),
        worker: Worker {
            worker_id: worker,
            dp_rank: 0,
        },
        data: serde_json::json!({"AddRequest": {
            "token_sequence": [1u64, 2, 3],
            "track_prefill_tokens": true,
            "expected_output_tokens": null,
            "prefill_load_hint": {"initial_effective_prefill_tokens": prefill, "expected_prefill_duration": null},
        }}),
        router_id,
    })
}

#[test]
fn router_bookings_are_bounded_in_count_and_age_and_hostile_events_are_typed() {
    let clock = ManualClock::new();
    let m = Arc::new(Monitor::with_config(Default::default(), clock.clone()).unwrap());
    m.add_worker("tiny", 5, WorkerSpec::default()).unwrap();
    let config = SubscriberConfig {
        router_bookings_max: 1,
        router_booking_ttl: Duration::from_secs(600),
        ..Default::default()
    };
    let s = Subscriber::new(m.clone(), config, clock.clone()).unwrap();
    assert_eq!(s.handle(&add("a", 5, 40)).unwrap(), Applied::Report);
    // The same request again is a duplicate, not a second booking.
    assert_eq!(s.handle(&add("a", 5, 40)).unwrap(), Applied::OutOfOrder);
    assert_eq!(
        s.handle(&add("b", 5, 40)).unwrap_err(),
        HandleError::BookingsFull { limit: 1 }
    );
    assert_eq!(m.rank_load(5, 0).unwrap().active_prefill_tokens, Some(40));
    // A router that never frees its request holds it for the ttl only.
    clock.advance(Duration::from_secs(599));
    s.expire();
    assert_eq!(s.router_bookings(), 1);
    clock.advance(Duration::from_secs(2));
    s.expire();
    assert_eq!(s.router_bookings(), 0);
    assert_eq!(m.rank_load(5, 0).unwrap().active_prefill_tokens, Some(0));

    // A booking on a worker the monitor does not know is refused.
    let e = s.handle(&add("c", 6, 1)).unwrap_err();
    assert_eq!(e.kind(), "unknown_worker", "{e}");
    // Hostile payloads: typed, counted, nothing booked.
    let long = "x".repeat(MAX_REQUEST_ID + 1);
    let e = s.handle(&add(&long, 5, 1)).unwrap_err();
    assert!(matches!(e, HandleError::Wire(WireError::Invalid(_))), "{e}");
    let unknown = envelope(&Event {
        request_id: "d".into(),
        worker: Worker {
            worker_id: 5,
            dp_rank: 0,
        },
        data: "Teleport",
        router_id: 9,
    });
    let e = s.handle(&unknown).unwrap_err();
    assert!(
        matches!(e, HandleError::Wire(WireError::Malformed(_))),
        "{e}"
    );
    assert_eq!(s.router_bookings(), 0);
    assert_eq!(s.stats().malformed, 2);
}
