//! A monitor's own bookings announced as a Dynamo 1.6.1 router's
//! `active_sequences_events` (`cluster::BookingAnnouncer`): byte for byte
//! what 1.6.1 accepted (`fixtures/dynamo-1.6.1/sequences-multitoken/
//! accepted_add.jsonl`, where those bytes turned its frontend's answer to
//! 529, and `announced/`, loadgate's own announcements recorded beside a
//! live 1.6.1), read back by another monitor as the router's bookings they
//! stand for, skipped by the announcing monitor's own subscriber, and
//! bounded: a full queue drops and counts, one announcer per monitor; and
//! a long prompt's booking (a hash per block) is read past the 16 KiB of a
//! load message, up to 1 MiB.

#[allow(dead_code)] // each test binary uses part of the support code
mod support;

use std::sync::Arc;

use loadgate::cluster::wire::{decode, Announcement, Decoded, SequenceChange};
use loadgate::cluster::{
    BookingAnnouncer, ClusterError, InProcessBus, Subjects, Subscriber, SubscriberConfig,
    Subscription, Transport,
};
use loadgate::{ManualClock, Monitor, WorkerSpec};
use support::recorded::{fixture, messages};

const KV_METRICS: &str = "namespace.dynamo.component.backend.endpoint.generate.kv_metrics";
const SUBJECT: &str =
    "namespace.dynamo.component.backend.endpoint.generate.active_sequences_events";

/// The announcement a recorded message would be, if loadgate wrote it;
/// `None` for one it cannot write (block hashes not of its making, a
/// `lora_name`, an untracked prefill, an output estimate).
fn as_announcement(v: &serde_json::Value, first_hash: u64) -> Option<(Announcement<'_>, u64)> {
    let (env, ev) = (&v["envelope"], &v["decoded"]);
    // Present, and nil (a missing one is written differently).
    let nil = |v: &serde_json::Value, key: &str| v.get(key).is_some_and(|x| x.is_null());
    if env["topic"] != "active_sequences_events" || !nil(ev, "lora_name") {
        return None;
    }
    let change = match &ev["data"] {
        serde_json::Value::String(s) if s == "Free" => SequenceChange::Free,
        serde_json::Value::String(s) if s == "MarkPrefillCompleted" => SequenceChange::PrefillDone,
        data => {
            let add = &data["AddRequest"];
            let hashes = add["token_sequence"].as_array()?;
            let ours = hashes
                .iter()
                .enumerate()
                .all(|(i, h)| h.as_u64() == Some(if i == 0 { first_hash } else { i as u64 }));
            let hint = &add["prefill_load_hint"];
            if !ours
                || add["track_prefill_tokens"] != true
                || !nil(add, "expected_output_tokens")
                || !nil(hint, "expected_prefill_duration")
            {
                return None;
            }
            SequenceChange::Add {
                blocks: hashes.len() as u64,
                prefill_tokens: hint["initial_effective_prefill_tokens"].as_u64()?,
            }
        }
    };
    let a = Announcement {
        publisher_id: env["publisher_id"].as_u64()?,
        sequence: env["sequence"].as_u64()?,
        published_at: env["published_at"].as_u64()?,
        router_id: ev["router_id"].as_u64()?,
        request_id: ev["request_id"].as_str()?,
        worker_id: ev["worker"]["worker_id"].as_u64()?,
        dp_rank: ev["worker"]["dp_rank"].as_u64()? as u32,
        change,
        first_hash,
    };
    Some((a, hashes_of(v)))
}

fn hashes_of(v: &serde_json::Value) -> u64 {
    v["decoded"]["data"]["AddRequest"]["token_sequence"]
        .as_array()
        .map_or(0, |h| h.len() as u64)
}

#[test]
fn announcements_are_byte_for_byte_what_dynamo_accepted() {
    let mut written = 0;
    for (bytes, v) in messages("sequences-multitoken/accepted_add.jsonl") {
        let Some((a, _)) = as_announcement(&v, 0) else {
            continue;
        };
        assert_eq!(a.to_msgpack(), bytes, "step {}", v["step"]);
        written += 1;
    }
    // add-prefill (2), mark-by-worker-A, free-both (2), the frees after
    // it, add-minimal... at least the steps that turned Dynamo to 529 and
    // back.
    assert!(written >= 8, "{written} recorded messages rewritten");
    let steps = messages("sequences-multitoken/accepted_add.jsonl");
    let turned: Vec<_> = steps
        .iter()
        .filter(|(_, v)| v["step"] == "add-prefill" && v["probe_status"] == 529)
        .collect();
    assert_eq!(
        turned.len(),
        2,
        "the recorded adds that made Dynamo answer 529"
    );
}

#[test]
fn loadgates_own_announcements_recorded_beside_dynamo_are_rewritten_exactly() {
    let events = messages("announced/announced.jsonl");
    assert!(events.len() >= 4, "{} recorded", events.len());
    let mut adds = 0;
    for (bytes, v) in &events {
        let first = v["decoded"]["data"]["AddRequest"]["token_sequence"][0]
            .as_u64()
            .unwrap_or(0);
        let (a, _) = as_announcement(v, first).expect("one of loadgate's own");
        assert_eq!(a.to_msgpack(), *bytes, "{}", v["decoded"]);
        let Ok(Decoded::Sequence(e)) = decode(bytes) else {
            panic!("not read back");
        };
        assert_eq!(e.change, a.change);
        adds += usize::from(matches!(a.change, SequenceChange::Add { .. }));
    }
    // Two bookings per rank (decode, then prefill), each freed; the
    // prefill ones marked done.
    let steps: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("announced/steps.json")).unwrap())
            .unwrap();
    let ranks = steps["ranks"].as_array().unwrap().len();
    assert_eq!((events.len(), adds), (5 * ranks, 2 * ranks));
    // What Dynamo's frontend answered once they were published.
    let status = |step: &str| {
        steps["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["step"] == step)
            .map(|s| s["status"].as_u64().unwrap())
    };
    assert_eq!(status("decode-booked"), Some(529));
    assert_eq!(status("decode-released"), Some(200));
    assert_eq!(status("prefill-booked"), Some(529));
    assert_eq!(status("prefill-released"), Some(200));
}

/// Every payload published on the subject from now on.
fn tap(bus: &InProcessBus) -> (Arc<std::sync::Mutex<Vec<Vec<u8>>>>, Subscription) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let tap = bus
        .subscribe(
            SUBJECT,
            Arc::new(move |_: &str, p: &[u8]| log.lock().unwrap().push(p.to_vec())),
        )
        .unwrap();
    (seen, tap)
}

fn monitor(clock: &Arc<ManualClock>) -> Arc<Monitor> {
    let m = Arc::new(Monitor::with_config(Default::default(), clock.clone()).unwrap());
    let spec = WorkerSpec {
        dp_size: 2,
        kv_total_blocks: Some(64),
        ..Default::default()
    };
    m.add_worker("tiny", 7, spec).unwrap();
    m
}

fn dynamo_reader(m: &Arc<Monitor>, clock: &Arc<ManualClock>) -> Arc<Subscriber> {
    let config = SubscriberConfig {
        active_load_subject: Some(KV_METRICS.into()),
        ..Default::default()
    };
    Subscriber::new(m.clone(), config, clock.clone()).unwrap()
}

/// (blocks, prefill tokens) booked on rank `rank` of worker 7.
fn load(m: &Monitor, rank: u32) -> (u64, u64) {
    let l = m.rank_load(7, rank).unwrap();
    (l.active_decode_blocks, l.active_prefill_tokens.unwrap_or(0))
}

#[test]
fn another_monitor_reads_the_announced_bookings_as_a_routers_and_the_announcer_skips_its_own() {
    let clock = ManualClock::new();
    let (a, b) = (monitor(&clock), monitor(&clock));
    let bus = InProcessBus::new();
    let subjects = Subjects::new("dynamo").unwrap();
    let (ra, rb) = (dynamo_reader(&a, &clock), dynamo_reader(&b, &clock));
    let (attached_a, attached_b) = (
        ra.attach(&bus, &subjects).unwrap(),
        rb.attach(&bus, &subjects).unwrap(),
    );
    let announcer = BookingAnnouncer::new(a.clone(), KV_METRICS).unwrap();
    assert_eq!(announcer.subject(), SUBJECT);
    let (seen, _tap) = tap(&bus);
    let settle = || {
        attached_a.settle();
        attached_b.settle();
    };

    let mut first = a.book_with_prefill(7, 1, 10, 170).unwrap();
    let second = a.book(7, 0, 3).unwrap();
    assert_eq!(announcer.flush(&bus), 2);
    settle();
    assert_eq!((load(&b, 1), load(&b, 0)), ((10, 170), (3, 0)));
    assert_eq!(load(&a, 1), (10, 170), "a counts its own once");
    assert_eq!(ra.router_bookings(), 0);
    assert_eq!(rb.router_bookings(), 2);

    // The booking router's own mark: the prefill goes at once.
    first.prefill_done();
    assert_eq!(announcer.flush(&bus), 1);
    settle();
    assert_eq!(load(&b, 1), (10, 0));
    drop(first);
    second.release();
    assert_eq!(announcer.flush(&bus), 2);
    settle();
    assert_eq!((load(&b, 1), load(&b, 0)), ((0, 0), (0, 0)));
    assert_eq!(rb.router_bookings(), 0);
    assert_eq!(
        (announcer.stats().published, announcer.stats().lost),
        (5, 0)
    );

    // What went out: one router id, one request id per booking, sequenced.
    let sent: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|p| match decode(p) {
            Ok(Decoded::Sequence(e)) => e,
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(sent.iter().all(|e| e.router_id == announcer.router_id()));
    assert_eq!(sent[0].request_id, sent[2].request_id);
    assert_ne!(sent[0].request_id, sent[1].request_id);
    assert_eq!(
        sent.iter().map(|e| e.change).collect::<Vec<_>>(),
        [
            SequenceChange::Add {
                blocks: 10,
                prefill_tokens: 170
            },
            SequenceChange::Add {
                blocks: 3,
                prefill_tokens: 0
            },
            SequenceChange::PrefillDone,
            SequenceChange::Free,
            SequenceChange::Free,
        ]
    );
}

#[test]
fn one_announcer_per_monitor_on_one_endpoint_and_releases_outlive_it() {
    let clock = ManualClock::new();
    let m = monitor(&clock);
    for bad in [
        "namespace.dynamo.component.*.endpoint.generate.kv_metrics",
        "namespace.dynamo.component.backend.endpoint.generate.other",
        "loadgate.dynamo.load.>",
    ] {
        let e = BookingAnnouncer::new(m.clone(), bad).unwrap_err();
        assert!(matches!(e, ClusterError::InvalidSubject(_)), "{bad}: {e}");
    }
    let before = m.book(7, 0, 1).unwrap(); // made before: never announced
    let first = BookingAnnouncer::new(m.clone(), KV_METRICS).unwrap();
    let e = BookingAnnouncer::new(m.clone(), KV_METRICS).unwrap_err();
    assert!(matches!(e, ClusterError::InvalidConfig(_)), "{e}");
    let router = first.router_id();
    let held = m.book(7, 0, 4).unwrap();
    let bus = InProcessBus::new();
    assert_eq!(first.flush(&bus), 1);
    drop(first);
    // Off: a new booking is not announced, a release of an announced one
    // waits for the next announcer, which keeps the monitor's router id.
    let unannounced = m.book(7, 1, 2).unwrap();
    drop((held, unannounced, before));
    let second = BookingAnnouncer::new(m.clone(), KV_METRICS).unwrap();
    assert_eq!(second.router_id(), router);
    let (seen, _tap) = tap(&bus);
    assert_eq!(second.flush(&bus), 1);
    let Ok(Decoded::Sequence(e)) = decode(&seen.lock().unwrap()[0]) else {
        panic!("not a sequence event");
    };
    assert_eq!(e.change, SequenceChange::Free);
}

#[test]
fn a_full_queue_drops_and_counts_and_an_unannounced_booking_stays_silent() {
    use loadgate::cluster::wire::MAX_ANNOUNCED_BLOCKS;
    let clock = ManualClock::new();
    let m = monitor(&clock);
    let announcer = BookingAnnouncer::new(m.clone(), KV_METRICS).unwrap();
    let capacity = loadgate::monitor::OUTBOX_CAPACITY;
    let held: Vec<_> = (0..capacity + 10)
        .map(|_| m.book(7, 0, 0).unwrap())
        .collect();
    assert_eq!(announcer.stats().lost, 10);
    let bus = InProcessBus::new();
    assert_eq!(announcer.flush(&bus), capacity);
    drop(held);
    // The ten never announced push no release.
    assert_eq!(announcer.flush(&bus), capacity);
    assert_eq!(announcer.stats().published, 2 * capacity as u64);
    // A booking past the hashes a message carries is announced as that many.
    let big = m.book(7, 0, u64::MAX).unwrap();
    let (seen, _tap) = tap(&bus);
    assert_eq!(announcer.flush(&bus), 1);
    let bytes = seen.lock().unwrap()[0].clone();
    assert!(bytes.len() < 256 * 1024, "{} bytes", bytes.len());
    let Ok(Decoded::Sequence(e)) = decode(&bytes) else {
        panic!("not a sequence event");
    };
    assert_eq!(
        e.change,
        SequenceChange::Add {
            blocks: MAX_ANNOUNCED_BLOCKS,
            prefill_tokens: 0
        }
    );
    drop(big);
}

#[test]
fn bookings_from_many_threads_are_announced_in_order_and_a_reader_ends_at_zero() {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    let clock = ManualClock::new();
    let (a, b) = (monitor(&clock), monitor(&clock));
    let bus = InProcessBus::new();
    let reader = dynamo_reader(&b, &clock);
    let attached = reader
        .attach(&bus, &Subjects::new("dynamo").unwrap())
        .unwrap();
    let announcer = BookingAnnouncer::new(a.clone(), KV_METRICS).unwrap();
    // Per request: the changes seen, in order.
    let seen: Arc<std::sync::Mutex<HashMap<String, Vec<SequenceChange>>>> = Default::default();
    let log = seen.clone();
    let _tap = bus
        .subscribe(
            SUBJECT,
            Arc::new(move |_: &str, p: &[u8]| {
                let Ok(Decoded::Sequence(e)) = decode(p) else {
                    panic!("not a sequence event");
                };
                log.lock()
                    .unwrap()
                    .entry(e.request_id)
                    .or_default()
                    .push(e.change);
            }),
        )
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let (flusher, stop) = (announcer.clone(), done.clone());
    let bus = Arc::new(bus);
    let on = bus.clone();
    let flushing = std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            flusher.flush(&*on);
        }
    });
    const THREADS: u64 = 4;
    const EACH: u64 = 5_000;
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                for i in 0..EACH {
                    let mut booking = a
                        .book_with_prefill(7, (i % 2) as u32, 1 + t, i % 3)
                        .unwrap();
                    if i % 2 == 0 {
                        booking.prefill_done();
                    }
                    if i % 5 == 0 {
                        std::thread::yield_now();
                    }
                    drop(booking);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    flushing.join().unwrap();
    announcer.flush(&*bus);
    attached.settle();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len() as u64, THREADS * EACH);
    for (request, changes) in seen.iter() {
        let ok = matches!(
            changes.as_slice(),
            [SequenceChange::Add { .. }, SequenceChange::Free]
                | [
                    SequenceChange::Add { .. },
                    SequenceChange::PrefillDone,
                    SequenceChange::Free
                ]
        );
        assert!(ok, "{request}: {changes:?}");
    }
    assert_eq!(announcer.stats().lost, 0);
    assert_eq!((load(&b, 0), load(&b, 1)), ((0, 0), (0, 0)));
    assert_eq!(reader.router_bookings(), 0);
}

#[test]
fn a_long_prompts_booking_is_read_past_16_kib_and_refused_past_1_mib() {
    use loadgate::cluster::MAX_SEQUENCE_PAYLOAD;
    let clock = ManualClock::new();
    let b = monitor(&clock);
    let bus = InProcessBus::new();
    let reader = dynamo_reader(&b, &clock);
    let attached = reader
        .attach(&bus, &Subjects::new("dynamo").unwrap())
        .unwrap();
    // 6,000 blocks of 16 tokens: a 96,000-token prompt's booking.
    let long = Announcement {
        publisher_id: 1,
        sequence: 0,
        published_at: 0,
        router_id: 42,
        request_id: "long",
        worker_id: 7,
        dp_rank: 0,
        change: SequenceChange::Add {
            blocks: 6_000,
            prefill_tokens: 96_000,
        },
        first_hash: u64::MAX,
    }
    .to_msgpack();
    assert!(long.len() > SubscriberConfig::default().max_payload);
    bus.publish(SUBJECT, long).unwrap();
    bus.publish(SUBJECT, vec![0x80; MAX_SEQUENCE_PAYLOAD + 1])
        .unwrap();
    attached.settle();
    assert_eq!(load(&b, 0), (6_000, 96_000));
    let oversized = reader
        .refusals()
        .into_iter()
        .find(|(reason, _)| *reason == "oversized")
        .map(|(_, n)| n);
    assert_eq!(oversized, Some(1));
}
