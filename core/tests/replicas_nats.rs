//! Booking sync between frontend replicas over a real `nats-server`
//! (docs/replicas.md): three frontends share their bookings, a late one
//! learns them from the others' answers to its hello, a frontend that
//! stops is forgotten, and everyone recovers from a server restart. Waits
//! are for conditions, with a limit that only turns a hang into a failure.
#![cfg(feature = "nats")]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use loadgate::cluster::nats::NatsTransport;
use loadgate::cluster::replicas::{BookingSync, BookingSyncConfig, SyncAttached};
use loadgate::cluster::{Subjects, Transport};
use loadgate::{Monitor, MonotonicClock};
use support::monitor_fixture::{spec, M};
use support::nats_server::NatsServer;
use support::wait_for;

struct Frontend {
    monitor: Arc<Monitor>,
    sync: Arc<BookingSync>,
    attached: Option<SyncAttached>,
}

fn frontend(url: &str, id: &str) -> Frontend {
    let monitor = Arc::new(Monitor::new());
    for w in 1..=4 {
        monitor.add_worker(M, w, spec(1, 1000)).unwrap();
    }
    let subjects = Subjects::new("it").unwrap();
    let mut config = BookingSyncConfig::new(id);
    config.heartbeat = Duration::from_millis(100);
    config.expire_after = Duration::from_millis(400);
    let sync =
        BookingSync::new(monitor.clone(), &subjects, config, MonotonicClock::shared()).unwrap();
    let transport: Arc<dyn Transport> = Arc::new(NatsTransport::connect(url).unwrap());
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
