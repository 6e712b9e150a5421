//! Measures how many load reports per second a frontend decodes and applies:
//! in process (one core, `Subscriber::handle` on pre-encoded messages) and
//! end to end through a real `nats-server` (publisher connection → server →
//! subscriber connection → monitor).
//!
//! Run with `cargo run --release -p loadgate --features nats --example cluster_throughput`
//! (starts its own `nats-server` on a free loopback port; pass `--quick` for a
//! short run).

use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use loadgate::cluster::nats::NatsTransport;
use loadgate::cluster::wire::{LoadMessage, SCHEMA_VERSION};
use loadgate::cluster::{Subjects, Subscriber, SubscriberConfig, Transport};
use loadgate::{Monitor, MonotonicClock};

const WORKERS: u64 = 256;
const RANKS: u32 = 2;

fn message(i: u64) -> Vec<u8> {
    let worker_id = i % WORKERS;
    LoadMessage {
        v: SCHEMA_VERSION,
        instance: 1,
        seq: i + 1,
        worker_id,
        model: "llama-3-70b".into(),
        dp_start: 0,
        dp_size: RANKS,
        dp_rank: ((i / WORKERS) % u64::from(RANKS)) as u32,
        kv_total_blocks: Some(4096),
        max_num_batched_tokens: Some(8192),
        active_decode_blocks: Some(i % 4096),
        kv_used_blocks: Some((i * 7) % 4096),
        active_prefill_tokens: Some(i % 9000),
        waiting_requests: None,
        max_num_seqs: None,
    }
    .to_msgpack()
}

fn messages(n: usize) -> Vec<Vec<u8>> {
    (0..n as u64).map(message).collect()
}

/// Messages are encoded in chunks that stay in cache, as they would when
/// read from a socket; only the handling is timed.
const CHUNK: u64 = 16_384;

fn subscriber() -> Arc<Subscriber> {
    let monitor = Arc::new(Monitor::new());
    let config = SubscriberConfig {
        expire_after: Duration::from_secs(600),
        ..Default::default()
    };
    Subscriber::new(monitor, config, MonotonicClock::shared()).unwrap()
}

fn decode_only(n: usize) -> f64 {
    let payloads = messages(n.min(CHUNK as usize));
    let start = Instant::now();
    for p in &payloads {
        std::hint::black_box(loadgate::cluster::wire::decode(p).unwrap());
    }
    payloads.len() as f64 / start.elapsed().as_secs_f64()
}

fn in_process(n: usize) -> f64 {
    let s = subscriber();
    // Announce every worker first so the timed loop measures steady state.
    for i in 0..WORKERS {
        s.handle(&message(i)).unwrap();
    }
    let mut timed = Duration::ZERO;
    let mut next = WORKERS;
    while next < n as u64 {
        let chunk: Vec<Vec<u8>> = (next..(next + CHUNK).min(n as u64)).map(message).collect();
        next += chunk.len() as u64;
        let start = Instant::now();
        for p in &chunk {
            s.handle(p).unwrap();
        }
        timed += start.elapsed();
    }
    assert_eq!(s.stats().out_of_order, 0);
    (n as u64 - WORKERS) as f64 / timed.as_secs_f64()
}

fn end_to_end(n: usize, url: &str) -> (f64, u64) {
    let payloads = messages(n);
    let s = subscriber();
    let subjects = Subjects::new("bench").unwrap();
    let sub_transport = NatsTransport::connect(url).unwrap();
    let _attached = s.attach(&sub_transport, &subjects).unwrap();
    let publisher = NatsTransport::connect(url).unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    for (i, p) in payloads.into_iter().enumerate() {
        publisher
            .publish(&subjects.load(i as u64 % WORKERS), p)
            .unwrap();
    }
    publisher.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = 0;
    let mut last_change = Instant::now();
    loop {
        let st = s.stats();
        let done = st.applied + st.announced + st.out_of_order;
        received.store(done, Ordering::Relaxed);
        if done as usize >= n
            || Instant::now() > deadline
            || last_change.elapsed() > Duration::from_secs(2)
        {
            break;
        }
        if done != last {
            last = done;
            last_change = Instant::now();
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let done = received.load(Ordering::Relaxed);
    let elapsed = if done as usize >= n {
        start.elapsed()
    } else {
        last_change - start
    };
    (done as f64 / elapsed.as_secs_f64(), n as u64 - done)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 50_000 } else { 1_000_000 };
    println!(
        "decode only (owned message): {:.2} M/s",
        decode_only(n) / 1e6
    );
    let rate = in_process(n);
    println!(
        "in process: decode + apply {:.2} M reports/s on one core ({n} reports)",
        rate / 1e6
    );

    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server =
        Command::new(std::env::var("NATS_SERVER").unwrap_or_else(|_| "nats-server".into()))
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server not found (Debian package nats-server)");
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "nats-server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (rate, lost) = end_to_end(n / 2, &format!("nats://127.0.0.1:{port}"));
    println!(
        "end to end through nats-server: {:.0} k reports/s ({} reports, {lost} dropped by the server as a slow consumer)",
        rate / 1e3,
        n / 2
    );
    let _ = server.kill();
    let _ = server.wait();
}
