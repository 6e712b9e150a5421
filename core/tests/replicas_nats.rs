//! Booking sync between frontend replicas over a real `nats-server`
//! (docs/replicas.md): three frontends share their bookings, a late one
//! learns them from the others' answers to its hello, a frontend that
//! stops is forgotten, everyone recovers from a server restart, and a
//! frontend whose client drops messages (a slow consumer) recovers by the
//! whole states it asks for, never booking past a line in leased mode.
//! Waits are for conditions, with a limit that only turns a hang into a
//! failure.
#![cfg(feature = "nats")]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use loadgate::cluster::nats::NatsOptions;
use loadgate::cluster::replicas::{
    BookingSync, BookingSyncConfig, RankEntry, SyncAttached, SyncMessage, SyncMode, SYNC_VERSION,
};
use loadgate::cluster::{Subjects, Transport};
use loadgate::{Monitor, MonotonicClock};
use support::monitor_fixture::{decode, spec, M};
use support::nats_auth::{connect, user};
use support::nats_server::{NatsServer, ScratchDir};
use support::wait_for;

struct Frontend {
    monitor: Arc<Monitor>,
    sync: Arc<BookingSync>,
    attached: Option<SyncAttached>,
}

fn frontend(url: &str, id: &str) -> Frontend {
    frontend_with(url, id, &NatsOptions::default())
}

/// A frontend whose connection uses `options`.
fn frontend_with(url: &str, id: &str, options: &NatsOptions) -> Frontend {
    frontend_in(url, id, options, SyncMode::Shared)
}

/// A frontend in `mode`; its workers' line is half their 1000 blocks.
fn frontend_in(url: &str, id: &str, options: &NatsOptions, mode: SyncMode) -> Frontend {
    let monitor = Arc::new(Monitor::new());
    for w in 1..=4 {
        monitor.add_worker(M, w, spec(1, 1000)).unwrap();
    }
    monitor.set_thresholds(M, &decode(0.5)).unwrap();
    let subjects = Subjects::new("it").unwrap();
    let mut config = BookingSyncConfig::new(id);
    config.mode = mode;
    config.lease = Duration::from_millis(200);
    config.heartbeat = Duration::from_millis(100);
    config.expire_after = Duration::from_millis(400);
    let sync =
        BookingSync::new(monitor.clone(), &subjects, config, MonotonicClock::shared()).unwrap();
    let transport: Arc<dyn Transport> = Arc::new(connect(url, options).unwrap());
    let attached = Some(sync.attach(transport, &subjects).unwrap());
    Frontend {
        monitor,
        sync,
        attached,
    }
}

impl Frontend {
    fn blocks(&self, worker: u64) -> u64 {
        self.monitor
            .rank_load(worker, 0)
            .unwrap()
            .active_decode_blocks
    }
}

fn all_see(frontends: &[&Frontend], worker: u64, blocks: u64) -> bool {
    frontends.iter().all(|f| f.blocks(worker) == blocks)
}

#[test]
fn frontends_share_bookings_over_nats_and_recover() {
    let mut server = NatsServer::start();
    let url = server.url();
    let (a, b, mut c) = (
        frontend(&url, "a"),
        frontend(&url, "b"),
        frontend(&url, "c"),
    );
    // A burst from every frontend onto the same workers.
    let started = Instant::now();
    let held: Vec<_> = [(&a, 10), (&b, 20), (&c, 30)]
        .iter()
        .flat_map(|(f, n)| (1..=4).map(move |w| f.monitor.book(w, 0, *n).unwrap()))
        .collect();
    wait_for("every frontend sees 60 blocks on each worker", || {
        (1..=4).all(|w| all_see(&[&a, &b, &c], w, 60))
    });
    eprintln!("converged in {:?}", started.elapsed());

    // A late frontend knows the load from the answers to its hello.
    let started = Instant::now();
    let d = frontend(&url, "d");
    wait_for("the late frontend sees 60 blocks", || {
        (1..=4).all(|w| d.blocks(w) == 60)
    });
    eprintln!("a late frontend knew the load in {:?}", started.elapsed());

    // C stops: the others forget its bookings after its silence.
    c.attached = None;
    wait_for("c's 30 blocks leave the others' views", || {
        (1..=4).all(|w| all_see(&[&a, &b, &d], w, 30))
    });
    assert!(a.sync.stats().expired >= 1);

    // A server restart: connections come back, and the next snapshots put
    // every frontend back in line.
    let port = server.port();
    server.stop();
    std::thread::sleep(Duration::from_millis(300));
    let _server = NatsServer::start_on(port);
    let more = b.monitor.book(1, 0, 5).unwrap();
    wait_for("b's new booking reaches a and d after the restart", || {
        all_see(&[&a, &b, &d], 1, 35)
    });
    drop(more);
    drop(held);
    wait_for("every booking released everywhere", || {
        (1..=4).all(|w| all_see(&[&a, &b, &d], w, 0))
    });
    let stats = a.sync.stats();
    eprintln!("a: {stats:?}");
    assert!(stats.sent > 0 && stats.received > 0 && stats.refused == 0);
}

/// With the permissions docs/nats.md recommends, each frontend may publish
/// only its own snapshots: one that speaks for another is stopped by the
/// server, and the others still share their bookings.
#[test]
fn per_frontend_permissions_bind_a_frontend_to_its_own_snapshots() {
    let frontend_user = |id: &str| {
        format!(
            r#"{{ user: "{id}", password: "pw-{id}",
                 permissions: {{ publish: ["loadgate.it.bookings.{id}"],
                                 subscribe: ["loadgate.it.load.*", "loadgate.it.bookings.*"] }} }}"#
        )
    };
    let config = format!(
        "authorization {{\n  users = [\n    {}\n    {}\n  ]\n}}\n",
        frontend_user("a"),
        frontend_user("b")
    );
    let dir = ScratchDir::new("replicas-permissions");
    let server = NatsServer::start_with_config(&dir, &config);
    let url = server.url();
    let a = frontend_with(&url, "a", &user("a", "pw-a"));
    let b = frontend_with(&url, "b", &user("b", "pw-b"));
    let _x = a.monitor.book(1, 0, 40).unwrap();
    wait_for("b sees a's booking", || b.blocks(1) == 40);
    // A publishes a snapshot of a third frontend on that frontend's
    // subject: the server drops it, so nobody starts tracking a "c".
    let spoof = SyncMessage {
        v: SYNC_VERSION,
        frontend: "c".into(),
        instance: 1,
        seq: 1,
        hello: false,
        full: true,
        ranks: vec![RankEntry {
            worker_id: 2,
            dp_rank: 0,
            blocks: 999,
            prefill: 0,
        }],
        queues: Vec::new(),
        resync: Vec::new(),
        lease: None,
    };
    let t = connect(&url, &user("a", "pw-a")).unwrap();
    t.publish("loadgate.it.bookings.c", spoof.to_msgpack())
        .unwrap();
    t.flush().unwrap();
    // B's next booking still reaches a, after the spoof would have.
    let _y = b.monitor.book(3, 0, 7).unwrap();
    wait_for("a sees b's booking", || a.blocks(3) == 7);
    for f in [&a, &b] {
        assert_eq!(f.blocks(2), 0);
        assert_eq!(f.sync.stats().frontends, 1, "only the other one");
    }
}

/// A client that holds one received message while its handler runs:
/// most of a flood is dropped, and with it some of the others' messages.
fn slow_consumer() -> NatsOptions {
    NatsOptions {
        subscription_capacity: Some(1),
        ..NatsOptions::default()
    }
}

/// Publishes a burst of junk on the bookings subjects from a connection of
/// its own (every frontend refuses it; a slow consumer drops most of it).
fn flood(raw: &loadgate::cluster::nats::NatsTransport) {
    for _ in 0..400 {
        raw.publish("loadgate.it.bookings.zz", vec![0xc1]).unwrap();
    }
}

#[test]
fn a_slow_consumer_that_drops_messages_recovers_by_whole_states() {
    let server = NatsServer::start();
    let url = server.url();
    let a = frontend(&url, "a");
    let c = frontend_with(&url, "c", &slow_consumer());
    let raw = connect(&url, &NatsOptions::default()).unwrap();
    let mut held = Vec::new();
    wait_for("c misses some of a's messages", || {
        flood(&raw);
        let w = 1 + held.len() as u64 % 4;
        held.push(a.monitor.book(w, 0, 1).unwrap());
        std::thread::sleep(Duration::from_millis(3));
        c.sync.stats().gaps > 0
    });
    // Some of a's bookings released while c still drops.
    held.truncate(held.len() / 2);
    flood(&raw);
    let truth = |w: u64| a.monitor.rank_load(w, 0).unwrap().active_decode_blocks;
    wait_for("c's view of a is exact again", || {
        c.sync.stats().behind == 0 && (1..=4).all(|w| c.blocks(w) == truth(w))
    });
    let (sc, sa) = (c.sync.stats(), a.sync.stats());
    eprintln!("slow consumer c: {sc:?}\na: {sa:?}");
    assert!(sc.gaps > 0 && sc.resyncs > 0, "{sc:?}");
    assert!(
        sa.snapshots_sent >= 2,
        "a's join and at least one repair: {sa:?}"
    );
    assert!(
        sa.snapshots_sent < sa.sent,
        "most of what a sent were changes: {sa:?}"
    );
}

/// Leased mode over the same slow consumer: three frontends book greedily
/// on one worker while one of them drops messages, and the fleet's
/// bookings never pass the worker's line (500 blocks).
#[test]
fn leased_mode_never_books_past_the_line_beside_a_slow_consumer() {
    let server = NatsServer::start();
    let url = server.url();
    let plain = NatsOptions::default();
    let fronts = [
        frontend_in(&url, "a", &plain, SyncMode::Leased),
        frontend_in(&url, "b", &plain, SyncMode::Leased),
        frontend_in(&url, "c", &slow_consumer(), SyncMode::Leased),
    ];
    let raw = connect(&url, &plain).unwrap();
    let mut held: Vec<Vec<loadgate::Booking>> = vec![Vec::new(), Vec::new(), Vec::new()];
    let mut most = 0;
    let started = Instant::now();
    let mut round = 0u64;
    while started.elapsed() < Duration::from_secs(3) || fronts[2].sync.stats().gaps == 0 {
        assert!(started.elapsed() < Duration::from_secs(60), "no gap at c");
        round += 1;
        if round % 4 == 0 {
            flood(&raw);
        }
        for (i, f) in fronts.iter().enumerate() {
            // Book until refused, then release a third at random-ish.
            while let Ok(b) = f.monitor.book(1, 0, 5) {
                held[i].push(b);
                let truth: u64 = held.iter().flatten().map(loadgate::Booking::blocks).sum();
                most = most.max(truth);
                assert!(truth <= 500, "the fleet booked {truth} of a line of 500");
            }
            let len = held[i].len();
            held[i].truncate((len * 2 / 3 + round as usize % 2).min(len));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let stats: Vec<_> = fronts.iter().map(|f| f.sync.stats()).collect();
    eprintln!("most booked at once: {most} of 500; {stats:?}");
    assert!(most > 250, "the fleet used its line: {most}");
}
