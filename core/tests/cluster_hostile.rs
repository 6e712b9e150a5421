//! A hostile publisher against a running frontend over a real `nats-server`
//! (docs/limits.md): huge, negative, out-of-range and type-confused fields,
//! 10^5 distinct worker ids, thousands of model names, oversized, truncated
//! and deeply nested payloads, spoofed worker ids and replayed messages.
//! The frontend stays up, keeps routing its real workers and applying their
//! reports, holds its memory under the bound docs/limits.md states, and
//! counts every refusal by reason.
//!
//! The only test in its binary, so the process's resident memory is its own.
#![cfg(feature = "nats")]

#[allow(dead_code)] // each test binary uses part of the support code
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loadgate::cluster::nats::NatsTransport;
use loadgate::cluster::wire::{LoadMessage, SCHEMA_VERSION};
use loadgate::cluster::{
    Handler, Publisher, PublisherConfig, Subjects, Subscriber, SubscriberConfig, Transport,
};
use loadgate::{LoadReport, ManualClock, Monitor, Policy};
use support::nats_server::NatsServer;

const NS: &str = "hostile";
const MODEL: &str = "real";
const REAL: [u64; 3] = [1, 2, 3];
const FLOOD_WORKERS: u64 = 100_000;
const FLOOD_MODELS: u64 = 3_000;
/// What docs/limits.md states a frontend with default limits holds at
/// most, measured here as growth of the resident set.
const MEMORY_BOUND_MB: u64 = 160;

fn rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn message(worker_id: u64, model: &str, seq: u64) -> LoadMessage {
    LoadMessage {
        v: SCHEMA_VERSION,
        instance: 42,
        seq,
        worker_id,
        model: model.into(),
        dp_start: 0,
        dp_size: 1,
        dp_rank: 0,
        kv_total_blocks: Some(100),
        max_num_batched_tokens: None,
        active_decode_blocks: None,
        kv_used_blocks: Some(99),
        active_prefill_tokens: None,
        waiting_requests: None,
        max_num_seqs: None,
    }
}

/// Payloads that must each be refused, with the reason they count under.
fn bad_payloads(subjects: &Subjects) -> Vec<(String, Vec<u8>)> {
    let on = |id: u64, p: Vec<u8>| (subjects.load(id), p);
    let json = |id: u64, body: &str| on(id, body.as_bytes().to_vec());
    let mut huge_ranks = message(500_001, "m", 1);
    huge_ranks.dp_size = 1 << 31;
    let mut long_name = message(500_002, "m", 1);
    long_name.model = "n".repeat(10_000);
    let mut rank_outside = message(500_003, "m", 1);
    rank_outside.dp_rank = 5;
    let truncated = message(500_004, "m", 1).to_msgpack();
    let mut deep = vec![0x91u8; 15_000]; // arrays nested 15,000 deep
    deep.push(0xc0);
    vec![
        on(500_001, huge_ranks.to_msgpack()),
        on(500_001, huge_ranks.to_json()),
        on(500_002, long_name.to_msgpack()),
        on(500_003, rank_outside.to_msgpack()),
        on(500_004, truncated[..truncated.len() / 2].to_vec()),
        on(500_005, vec![0x80; 64 * 1024]),
        on(500_005, vec![b' '; 512 * 1024]),
        on(500_006, deep),
        on(500_006, [b"[".repeat(10_000), b"]".repeat(10_000)].concat()),
        json(
            500_007,
            r#"{"v":1,"instance":1,"seq":1,"worker_id":"7","model":"m","dp_rank":0}"#,
        ),
        json(
            500_008,
            r#"{"v":1,"instance":1,"seq":1,"worker_id":500008,"model":"m","dp_rank":0,"dp_size":-1}"#,
        ),
        json(
            500_009,
            r#"{"v":1,"instance":1,"seq":1,"worker_id":500009,"model":"m","dp_rank":0,"dp_size":4294967296}"#,
        ),
        json(
            500_010,
            r#"{"v":1,"instance":-1,"seq":1.5,"worker_id":500010,"model":"m","dp_rank":0}"#,
        ),
        json(
            500_011,
            r#"{"v":1,"instance":1,"seq":1,"worker_id":500011,"model":["m"],"dp_rank":0}"#,
        ),
        json(500_012, r#"{"v":99,"worker_id":500012}"#),
        json(
            500_013,
            r#"{"v":1,"instance":1,"seq":1,"worker_id":500013,"model":"m","dp_rank":0,"kv_used_blocks":1e300}"#,
        ),
        json(500_014, "null"),
        // Spoofed: another worker's subject.
        on(7, message(8, "m", 1).to_msgpack()),
        on(REAL[0], message(REAL[1], MODEL, u64::MAX).to_msgpack()),
    ]
}

#[test]
fn a_hostile_publisher_cannot_take_a_frontend_down() {
    let server = NatsServer::start();
    let url = server.url();
    let subjects = Subjects::new(NS).unwrap();

    // The frontend under attack.
    let monitor = Arc::new(Monitor::new());
    let config = SubscriberConfig {
        expire_after: Duration::from_secs(2),
        ..Default::default()
    };
    // A clock that stands still: no worker is expired, so "the real workers
    // stay routable" checks the flood's effect on the frontend, not whether
    // this machine delivered a heartbeat within expire_after. How late the
    // real reports arrive is printed below.
    let subscriber = Subscriber::new(monitor.clone(), config, ManualClock::new()).unwrap();
    let frontend_transport = NatsTransport::connect(&url).unwrap();
    let _attached = subscriber.attach(&frontend_transport, &subjects).unwrap();

    // A bystander records one real message, to replay it later.
    let recorded: Arc<Mutex<Option<Vec<u8>>>> = Arc::default();
    let bystander = NatsTransport::connect(&url).unwrap();
    let keep = recorded.clone();
    let handler: Handler = Arc::new(move |_: &str, p: &[u8]| {
        keep.lock().unwrap().get_or_insert_with(|| p.to_vec());
    });
    let _recording = bystander
        .subscribe(&subjects.load(REAL[0]), handler)
        .unwrap();

    // The real workers, heartbeating.
    let real: Vec<Publisher> = REAL
        .iter()
        .map(|&id| {
            let transport: Arc<dyn Transport> = Arc::new(NatsTransport::connect(&url).unwrap());
            let config = PublisherConfig {
                kv_total_blocks: Some(100),
                heartbeat: Duration::from_millis(200),
                ..PublisherConfig::new(id, MODEL)
            };
            Publisher::spawn(config, transport, &subjects).unwrap()
        })
        .collect();
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    until("the real workers are registered", &|| {
        monitor.workers(MODEL).len() == REAL.len()
    });
    let rss_before = rss_kb();

    // Throughout the attack the real workers must stay routable.
    let attacking = Arc::new(AtomicBool::new(true));
    let unroutable = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (monitor, attacking, unroutable) =
            (monitor.clone(), attacking.clone(), unroutable.clone());
        std::thread::spawn(move || {
            while attacking.load(Ordering::Relaxed) {
                if monitor.select(MODEL, Policy::RoundRobin).is_err() {
                    unroutable.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    // The real workers' load keeps changing during the attack; each value
    // must reach the frontend, and how long it took is reported.
    let attack_over = Arc::new(AtomicBool::new(false));
    let reporter = {
        let attack_over = attack_over.clone();
        let monitor = monitor.clone();
        std::thread::spawn(move || {
            let mut worst = Duration::ZERO;
            let mut rounds = 0u64;
            let mut value = 0u64;
            while !attack_over.load(Ordering::Relaxed) || rounds < 5 {
                value += 1;
                let sent = Instant::now();
                for w in &real {
                    w.report(
                        0,
                        &LoadReport {
                            kv_used_blocks: Some(value % 50),
                            ..Default::default()
                        },
                    )
                    .unwrap();
                }
                let deadline = sent + Duration::from_secs(30);
                while REAL
                    .iter()
                    .any(|&id| monitor.rank_load(id, 0).map(|l| l.kv_used_blocks) != Ok(value % 50))
                {
                    assert!(Instant::now() < deadline, "a real report was never applied");
                    std::thread::sleep(Duration::from_millis(1));
                }
                worst = worst.max(sent.elapsed());
                rounds += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            (worst, rounds, real)
        })
    };

    // The attack: one publisher, as fast as the connection takes it.
    let attacker = NatsTransport::connect(&url).unwrap();
    let publish = |subject: String, payload: Vec<u8>| attacker.publish(&subject, payload).unwrap();
    let bad = bad_payloads(&subjects);
    for (subject, payload) in &bad {
        publish(subject.clone(), payload.clone());
    }
    for id in 0..FLOOD_WORKERS {
        let worker_id = 1_000_000 + id;
        let model = if id < FLOOD_MODELS {
            format!("flood-model-{id}")
        } else {
            MODEL.to_owned()
        };
        publish(
            subjects.load(worker_id),
            message(worker_id, &model, 1).to_msgpack(),
        );
        if id % 10_000 == 0 {
            for (subject, payload) in &bad {
                publish(subject.clone(), payload.clone());
            }
        }
    }
    let replay = recorded
        .lock()
        .unwrap()
        .clone()
        .expect("a real message was recorded");
    for _ in 0..1_000 {
        publish(subjects.load(REAL[0]), replay.clone());
    }
    // Messages of one publisher arrive in order: once this last one is
    // counted, the frontend has read the whole attack.
    publish(subjects.load(1), br#"{"v":77,"worker_id":1}"#.to_vec());
    attacker.flush().unwrap();
    let published = FLOOD_WORKERS + 1_000 + 11 * bad.len() as u64 + 1;
    let unsupported = || {
        subscriber
            .refusals()
            .iter()
            .find(|(r, _)| *r == "unsupported_version")
            .map_or(0, |(_, n)| *n)
    };
    until("the frontend has read the whole attack", &|| {
        unsupported() == 12
    });
    _attached.settle();
    let handled = {
        let s = subscriber.stats();
        let refused: u64 = subscriber.refusals().iter().map(|(_, n)| n).sum();
        s.applied + s.announced + s.out_of_order + refused
    };
    attack_over.store(true, Ordering::Relaxed);
    let (worst, rounds, _real) = reporter.join().unwrap();
    attacking.store(false, Ordering::Relaxed);
    sampler.join().unwrap();
    let rss_growth_mb = rss_kb().saturating_sub(rss_before) / 1024;

    let reasons: Vec<(&str, u64)> = subscriber
        .refusals()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect();
    let stats = subscriber.stats();
    println!(
        "hostile publisher: {published} messages, {handled} read; real reports applied in {rounds} rounds, \
         slowest {worst:?}; resident memory grew {rss_growth_mb} MB; \
         workers {}, models {}; {stats:?}; refused by reason {reasons:?}",
        monitor.workers(MODEL).len(),
        monitor.models().len(),
    );

    assert_eq!(
        unroutable.load(Ordering::Relaxed),
        0,
        "the real workers stayed routable throughout"
    );
    for id in REAL {
        assert!(monitor.rank_load(id, 0).is_ok(), "real worker {id} kept");
    }
    assert!(
        rss_growth_mb < MEMORY_BOUND_MB,
        "resident memory grew {rss_growth_mb} MB, over the stated {MEMORY_BOUND_MB} MB"
    );
    let limits = monitor.config().limits;
    assert!(monitor.models().len() <= limits.max_models);
    let count = |reason: &str| {
        reasons
            .iter()
            .find(|(r, _)| *r == reason)
            .map_or(0, |(_, n)| *n)
    };
    for reason in [
        "oversized",
        "malformed",
        "unsupported_version",
        "invalid",
        "spoofed",
        "too_many_ranks",
        "name_too_long",
    ] {
        assert!(count(reason) > 0, "{reason} counted: {reasons:?}");
    }
    assert!(
        count("too_many_models") + count("too_many_workers") + count("backlog") > 0,
        "the flood met a bound: {reasons:?}"
    );
    assert!(stats.out_of_order >= 1_000, "every replay was dropped");
    let text = subscriber.metrics_text();
    assert!(text.contains("frontend_load_messages_refused_total{reason=\"spoofed\"}"));
}
