//! Booking sync between frontend replicas over a real `nats-server`
//! (docs/replicas.md): three frontends share their bookings, a late one
//! learns them from the others' answers to its hello, a frontend that
//! stops is forgotten, and everyone recovers from a server restart. Waits
//! are for conditions, with a limit that only turns a hang into a failure.
#![cfg(feature = "nats")]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use loadgate::cluster::nats::NatsOptions;
use loadgate::cluster::replicas::{
    BookingSync, BookingSyncConfig, RankEntry, Snapshot, SyncAttached, SNAPSHOT_VERSION,
};
use loadgate::cluster::{Subjects, Transport};
use loadgate::{Monitor, MonotonicClock};
use support::monitor_fixture::{spec, M};
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
    let spoof = Snapshot {
        v: SNAPSHOT_VERSION,
        frontend: "c".into(),
        instance: 1,
        seq: 1,
        hello: false,
        ranks: vec![RankEntry {
            worker_id: 2,
            dp_rank: 0,
            blocks: 999,
            prefill: 0,
        }],
        queues: Vec::new(),
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
