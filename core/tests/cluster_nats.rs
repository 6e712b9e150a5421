//! Across machines over a real `nats-server`
//! (docs/behaviour.md#across-machines): every frontend converges on the same
//! busy set, survives a server restart, ignores bad messages and forgets
//! silent workers. Convergence times are printed, never asserted: each wait
//! has a generous limit that only turns a hang into a failure.
#![cfg(feature = "nats")]

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loadgate::cluster::nats::NatsTransport;
use loadgate::cluster::wire::{LoadMessage, SCHEMA_VERSION};
use loadgate::cluster::{
    ClusterError, Publisher, PublisherConfig, Subjects, Subscriber, SubscriberConfig, Transport,
};
use loadgate::{
    LoadReport, ManualClock, Monitor, MonotonicClock, Policy, RouteError, SharedClock,
    ThresholdUpdate,
};
use support::nats_server::NatsServer;

/// Tests here report convergence times; run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// How long any wait for another process or thread may take before the
/// test fails: far above what a loaded machine needs, so it bounds a hang,
/// not a speed.
const WAIT: Duration = Duration::from_secs(30);

const NS: &str = "it";
const CHILD_ENV: &str = "LOADGATE_CHILD_FRONTEND_URL";

struct Frontend {
    monitor: Arc<Monitor>,
    subscriber: Arc<Subscriber>,
    _attached: loadgate::cluster::Attached,
}

fn frontend(url: &str, config: SubscriberConfig) -> Frontend {
    frontend_on(url, config, MonotonicClock::shared())
}

/// A frontend whose subscriber reads time from `clock`.
fn frontend_on(url: &str, config: SubscriberConfig, clock: SharedClock) -> Frontend {
    let monitor = Arc::new(Monitor::new());
    let subscriber = Subscriber::new(monitor.clone(), config, clock).unwrap();
    let transport = NatsTransport::connect(url).unwrap();
    let attached = subscriber
        .attach(&transport, &Subjects::new(NS).unwrap())
        .unwrap();
    Frontend {
        monitor,
        subscriber,
        _attached: attached,
    }
}

fn decode_threshold(t: f64) -> ThresholdUpdate {
    ThresholdUpdate {
        active_decode_blocks_threshold: Some(t),
        ..Default::default()
    }
}

fn workers(url: &str, heartbeat: Duration) -> Vec<Publisher> {
    (1..=4)
        .map(|id| {
            let transport: Arc<dyn Transport> = Arc::new(NatsTransport::connect(url).unwrap());
            let config = PublisherConfig {
                dp_size: 2,
                kv_total_blocks: Some(100),
                heartbeat,
                ..PublisherConfig::new(id, "llama")
            };
            Publisher::spawn(config, transport, &Subjects::new(NS).unwrap()).unwrap()
        })
        .collect()
}

fn set_loads(workers: &[Publisher], busy: &[u64]) {
    for (i, w) in workers.iter().enumerate() {
        let id = i as u64 + 1;
        let (a, b) = if busy.contains(&id) {
            (90, 80)
        } else {
            (90, 10)
        };
        w.report(
            0,
            &LoadReport {
                kv_used_blocks: Some(a),
                ..Default::default()
            },
        )
        .unwrap();
        w.report(
            1,
            &LoadReport {
                kv_used_blocks: Some(b),
                ..Default::default()
            },
        )
        .unwrap();
    }
}

/// A frontend in its own process: prints its busy set whenever it changes,
/// and exits when its stdin closes.
fn child_frontend(url: &str) {
    let f = frontend(url, SubscriberConfig::default());
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        let _ = done_tx.send(());
    });
    let mut last = None;
    let mut out = std::io::stdout();
    while done_rx.try_recv().is_err() {
        if f.monitor
            .thresholds("llama")
            .is_some_and(|t| t.version == 0)
        {
            f.monitor
                .set_thresholds("llama", &decode_threshold(0.5))
                .unwrap();
        }
        let busy = f.monitor.busy_workers("llama");
        let workers = f.monitor.workers("llama").len();
        if last.as_ref() != Some(&(busy.clone(), workers)) {
            writeln!(out, "busy {workers} {busy:?}").unwrap();
            out.flush().unwrap();
            last = Some((busy, workers));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits (at most [`WAIT`]) until every frontend shows `expected` busy
/// workers (and all four workers); returns how long it took.
fn converge(
    in_process: &[&Frontend],
    child: &mpsc::Receiver<String>,
    child_state: &mut String,
    expected: &[u64],
) -> Duration {
    let start = Instant::now();
    let want_child = format!("busy 4 {expected:?}");
    loop {
        while let Ok(line) = child.try_recv() {
            *child_state = line;
        }
        let local_ok = in_process.iter().all(|f| {
            f.monitor.busy_workers("llama") == expected && f.monitor.workers("llama").len() == 4
        });
        if local_ok && *child_state == want_child {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < WAIT,
            "no convergence on {expected:?} within {WAIT:?}: child says {child_state:?}, in-process {:?}",
            in_process.iter().map(|f| f.monitor.busy_workers("llama")).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn three_frontends_converge_and_survive_a_server_restart() {
    if let Ok(url) = std::env::var(CHILD_ENV) {
        return child_frontend(&url);
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut server = NatsServer::start();
    let url = server.url();
    let a = frontend(&url, SubscriberConfig::default());
    let b = frontend(&url, SubscriberConfig::default());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "three_frontends_converge_and_survive_a_server_restart",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("busy ") && tx.send(line).is_err() {
                return;
            }
        }
    });
    let ws = workers(&url, Duration::from_secs(1));
    // Wait for the announcements, then set the same thresholds everywhere.
    let deadline = Instant::now() + WAIT;
    while a.monitor.workers("llama").len() < 4 || b.monitor.workers("llama").len() < 4 {
        assert!(Instant::now() < deadline, "workers never announced");
        std::thread::sleep(Duration::from_millis(5));
    }
    a.monitor
        .set_thresholds("llama", &decode_threshold(0.5))
        .unwrap();
    b.monitor
        .set_thresholds("llama", &decode_threshold(0.5))
        .unwrap();
    let mut child_state = String::new();
    converge(&[&a, &b], &rx, &mut child_state, &[]);

    let mut worst = Duration::ZERO;
    for busy in [vec![1, 3], vec![1, 2, 3, 4], vec![2], vec![]] {
        set_loads(&ws, &busy);
        worst = worst.max(converge(&[&a, &b], &rx, &mut child_state, &busy));
    }
    eprintln!("worst convergence across three frontends: {worst:?}");

    // Thresholds set on one frontend stay there.
    a.monitor
        .set_thresholds("llama", &decode_threshold(0.95))
        .unwrap();
    assert_eq!(b.monitor.thresholds("llama").unwrap().version, 1);
    assert_eq!(
        b.monitor
            .thresholds("llama")
            .unwrap()
            .thresholds
            .active_decode_blocks_threshold,
        Some(0.5)
    );
    a.monitor
        .set_thresholds("llama", &decode_threshold(0.5))
        .unwrap();

    // Restart the server: connections come back and the busy sets converge again.
    let port = server.port();
    server.stop();
    // Down for a moment, so the clients see their connections drop; nothing
    // below depends on how long.
    std::thread::sleep(Duration::from_millis(300));
    let _server = NatsServer::start_on(port);
    set_loads(&ws, &[2, 4]);
    // Reconnection takes up to a second of backoff; the next heartbeat or
    // change after it lands brings every frontend back in line.
    let after_restart = converge(&[&a, &b], &rx, &mut child_state, &[2, 4]);
    eprintln!("converged {after_restart:?} after the restart");
    set_loads(&ws, &[3]);
    let reconnected = converge(&[&a, &b], &rx, &mut child_state, &[3]);
    eprintln!("converged {reconnected:?} on the next change after the restart");

    drop(child.stdin.take());
    assert!(child.wait().unwrap().success(), "the child frontend failed");
}

#[test]
fn bad_and_stale_messages_are_counted_and_silent_workers_expire() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let server = NatsServer::start();
    let config = SubscriberConfig {
        expire_after: Duration::from_millis(600),
        ..Default::default()
    };
    // Expiry runs on a manual clock, so "silent" and "heard in time" depend on
    // the messages that arrived, not on how fast this machine delivers them.
    let clock = ManualClock::new();
    let f = frontend_on(&server.url(), config, clock.clone());
    let raw = NatsTransport::connect(&server.url()).unwrap();
    let subjects = Subjects::new(NS).unwrap();
    let msg = |seq: u64, used: u64| LoadMessage {
        v: SCHEMA_VERSION,
        instance: 42,
        seq,
        worker_id: 9,
        model: "solo".into(),
        dp_start: 0,
        dp_size: 1,
        dp_rank: 0,
        kv_total_blocks: Some(10),
        max_num_batched_tokens: None,
        active_decode_blocks: None,
        kv_used_blocks: Some(used),
        active_prefill_tokens: None,
        waiting_requests: None,
        max_num_seqs: None,
    };
    raw.publish(&subjects.load(9), msg(5, 5).to_msgpack())
        .unwrap();
    raw.publish(&subjects.load(9), b"\x93not a map".to_vec())
        .unwrap();
    raw.publish(&subjects.load(9), b"{\"worker_id\": 9, \"v\": 1}".to_vec())
        .unwrap();
    raw.publish(&subjects.load(9), msg(4, 9).to_msgpack())
        .unwrap();
    raw.publish(&subjects.load(9), msg(5, 9).to_json()).unwrap();
    raw.flush().unwrap();
    let deadline = Instant::now() + WAIT;
    while f.subscriber.stats().out_of_order < 2 || f.subscriber.stats().malformed < 2 {
        assert!(
            Instant::now() < deadline,
            "stats: {:?}",
            f.subscriber.stats()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = f.subscriber.stats();
    assert_eq!(
        (stats.announced, stats.malformed, stats.out_of_order),
        (1, 2, 2)
    );
    assert_eq!(
        f.monitor.rank_load(9, 0).unwrap().kv_used_blocks,
        5,
        "bad and stale messages applied nothing"
    );
    assert_eq!(f.monitor.select("solo", Policy::RoundRobin), Ok(9));

    // A publisher with a fast heartbeat keeps its worker alive; the silent
    // worker 9 is removed once 600 ms pass without a message from it and its
    // model becomes unavailable.
    let transport: Arc<dyn Transport> = Arc::new(NatsTransport::connect(&server.url()).unwrap());
    let config = PublisherConfig {
        heartbeat: Duration::from_millis(100),
        ..PublisherConfig::new(10, "duo")
    };
    let alive = Publisher::spawn(config, transport, &subjects).unwrap();
    let deadline = Instant::now() + WAIT;
    while f.monitor.select("duo", Policy::RoundRobin) != Ok(10) {
        assert!(
            Instant::now() < deadline,
            "the live worker was never announced"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // 400 ms on: a heartbeat applied after this point is heard at 400 ms
    // (the sweep, the frontend's own or the one called here, stamps it).
    // Two more applied messages, so at least one was handled wholly after
    // the clock moved.
    clock.advance(Duration::from_millis(400));
    let applied = f.subscriber.stats().applied;
    let deadline = Instant::now() + WAIT;
    while f.subscriber.stats().applied < applied + 2 {
        assert!(Instant::now() < deadline, "no heartbeat arrived");
        std::thread::sleep(Duration::from_millis(5));
    }
    f.subscriber.expire();
    assert_eq!(f.monitor.select("solo", Policy::RoundRobin), Ok(9));
    // 800 ms on: worker 9, silent since 0, is past expire_after; worker 10,
    // heard at 400 ms or later, is not.
    clock.advance(Duration::from_millis(400));
    f.subscriber.expire();
    let deadline = Instant::now() + WAIT;
    while f.monitor.select("solo", Policy::RoundRobin) != Err(RouteError::Unavailable) {
        assert!(Instant::now() < deadline, "silent worker never expired");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(f.subscriber.stats().expired, 1);
    assert_eq!(
        f.monitor.select("duo", Policy::RoundRobin),
        Ok(10),
        "heartbeats keep a live worker registered"
    );
    drop(alive);
}

#[test]
fn a_malformed_url_is_an_invalid_setting_and_an_unreachable_server_a_transport_error() {
    for url in ["nats://", "nats://host:notaport", "nats://[::1", "::::"] {
        match NatsTransport::connect(url) {
            Err(ClusterError::InvalidConfig(why)) => {
                assert!(why.contains(&format!("{url:?}")), "{why}")
            }
            other => panic!("{url}: {other:?}"),
        }
    }
    // A free port with nobody listening: well-formed, unreachable.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let got = NatsTransport::connect(&format!("nats://127.0.0.1:{port}"));
    assert!(matches!(got, Err(ClusterError::Transport(_))), "{got:?}");
}

/// A frontend that follows a Dynamo endpoint's `kv_metrics` also hears its
/// `forward-pass-metrics` over a real server: the queue depth they carry
/// lands in the monitor.
#[test]
fn a_dynamo_subscription_brings_the_endpoints_forward_pass_metrics() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let server = NatsServer::start();
    let kv = loadgate::cluster::dynamo_kv_metrics_subject("dynamo", "backend", "generate").unwrap();
    let config = SubscriberConfig {
        active_load_subject: Some(kv),
        ..Default::default()
    };
    let f = frontend(&server.url(), config);
    f.monitor
        .add_worker("m", 31, loadgate::WorkerSpec::default())
        .unwrap();
    let payload = rmp_serde::to_vec_named(&serde_json::json!({
        "version": 1, "worker_id": "31", "dp_rank": 0, "counter_id": 1, "wall_time": 0.0,
        "queued_requests": {"num_prefill_requests": 3, "sum_prefill_tokens": 90,
                            "num_decode_requests": 1},
    }))
    .unwrap();
    #[derive(serde::Serialize)]
    struct Envelope<'a> {
        publisher_id: u64,
        sequence: u64,
        published_at: u64,
        topic: &'a str,
        #[serde(with = "bin")]
        payload: &'a [u8],
    }
    mod bin {
        pub fn serialize<S: serde::Serializer>(v: &&[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(v)
        }
    }
    let bytes = rmp_serde::to_vec_named(&Envelope {
        publisher_id: 5,
        sequence: 0,
        published_at: 1,
        topic: "forward-pass-metrics",
        payload: &payload,
    })
    .unwrap();
    let raw = NatsTransport::connect(&server.url()).unwrap();
    raw.publish(
        "namespace.dynamo.component.backend.endpoint.generate.forward-pass-metrics",
        bytes,
    )
    .unwrap();
    raw.flush().unwrap();
    let deadline = Instant::now() + WAIT;
    while f.monitor.rank_load(31, 0).unwrap().waiting_requests != Some(4) {
        assert!(Instant::now() < deadline, "{:?}", f.subscriber.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(f.subscriber.stats().applied, 1);
}
