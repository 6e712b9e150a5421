//! Booking sync between frontend replicas, shared mode
//! (`cluster/replicas.rs`): each frontend sees the others' bookings once,
//! never its own twice, through lost, repeated, late, hostile and
//! restarted snapshots; a joining frontend learns at once; a silent one is
//! forgotten.

mod support;

use std::sync::Arc;
use std::time::Duration;

use loadgate::cluster::replicas::{
    BookingSync, BookingSyncConfig, RankEntry, Snapshot, SyncApplied, SyncError, MAX_SHARED,
    SNAPSHOT_VERSION,
};
use loadgate::cluster::{InProcessBus, Subjects, Transport};
use loadgate::{ManualClock, Monitor};
use support::monitor_fixture::{decode, monitor_with, spec, M};
use support::Outbox;

/// One frontend: a monitor with workers 1 and 2 (one rank of 100 blocks
/// each), its sync and its outbox.
struct Frontend {
    monitor: Arc<Monitor>,
    sync: Arc<BookingSync>,
    out: Outbox,
}

impl Frontend {
    fn new(id: &str, clock: &Arc<ManualClock>) -> Self {
        Self::with(BookingSyncConfig::new(id), clock)
    }

    fn with(config: BookingSyncConfig, clock: &Arc<ManualClock>) -> Self {
        let monitor = Arc::new(monitor_with(clock.clone()));
        for w in [1, 2] {
            monitor.add_worker(M, w, spec(1, 100)).unwrap();
        }
        let subjects = Subjects::new("test").unwrap();
        let sync = BookingSync::new(monitor.clone(), &subjects, config, clock.clone()).unwrap();
        Self {
            monitor,
            sync,
            out: Outbox::default(),
        }
    }

    /// Ticks and returns what it sent.
    fn send(&self) -> Vec<(String, Vec<u8>)> {
        self.sync.tick(&self.out).unwrap();
        self.out.take()
    }

    fn deliver(&self, sent: &[(String, Vec<u8>)]) {
        for (subject, payload) in sent {
            self.sync.handle_on(subject, payload).unwrap();
        }
    }

    fn blocks(&self, worker: u64) -> u64 {
        self.monitor
            .rank_load(worker, 0)
            .unwrap()
            .active_decode_blocks
    }
}

/// Every frontend ticks and every other hears it, twice (hellos answered).
fn exchange(all: &[&Frontend]) {
    for _ in 0..2 {
        for (i, f) in all.iter().enumerate() {
            let sent = f.send();
            for (j, g) in all.iter().enumerate() {
                if i != j {
                    g.deliver(&sent);
                }
            }
        }
    }
}

#[test]
fn each_frontend_sees_the_others_bookings_once_and_never_its_own_twice() {
    let clock = ManualClock::new();
    let (a, b) = (Frontend::new("a", &clock), Frontend::new("b", &clock));
    let booked_a = a.monitor.book(1, 0, 40).unwrap();
    let booked_b = b.monitor.book(1, 0, 10).unwrap();
    exchange(&[&a, &b]);
    assert_eq!((a.blocks(1), b.blocks(1)), (50, 50));
    // Many more rounds: nothing echoes back into a frontend's own count.
    for _ in 0..5 {
        clock.advance(Duration::from_secs(1));
        exchange(&[&a, &b]);
    }
    assert_eq!((a.blocks(1), b.blocks(1)), (50, 50));
    assert_eq!((a.blocks(2), b.blocks(2)), (0, 0));
    drop(booked_a);
    exchange(&[&a, &b]);
    assert_eq!((a.blocks(1), b.blocks(1)), (10, 10));
    drop(booked_b);
    exchange(&[&a, &b]);
    assert_eq!((a.blocks(1), b.blocks(1)), (0, 0));
}

#[test]
fn a_report_that_overwrites_the_router_fields_never_travels() {
    let clock = ManualClock::new();
    let (a, b) = (Frontend::new("a", &clock), Frontend::new("b", &clock));
    let mut x = a.monitor.book_with_prefill(1, 0, 10, 100).unwrap();
    // A worker that reports the router-owned fields too (it should not):
    // A's own view takes them, its snapshot does not.
    let report = loadgate::LoadReport {
        active_decode_blocks: Some(777),
        active_prefill_tokens: Some(5000),
        ..Default::default()
    };
    a.monitor.report(1, 0, &report).unwrap();
    b.deliver(&a.send());
    let load = b.monitor.rank_load(1, 0).unwrap();
    assert_eq!(
        (load.active_decode_blocks, load.active_prefill_tokens),
        (10, Some(100))
    );
    x.prefill_done();
    b.deliver(&a.send());
    let load = b.monitor.rank_load(1, 0).unwrap();
    assert_eq!(
        (load.active_decode_blocks, load.active_prefill_tokens),
        (10, Some(0))
    );
}

#[test]
fn the_busy_rule_sees_the_fleet_total() {
    let clock = ManualClock::new();
    let (a, b) = (Frontend::new("a", &clock), Frontend::new("b", &clock));
    for f in [&a, &b] {
        f.monitor.set_thresholds(M, &decode(0.5)).unwrap();
    }
    let _x = a.monitor.book(1, 0, 30).unwrap();
    let _y = b.monitor.book(1, 0, 30).unwrap();
    assert!(!a.monitor.is_busy(1).unwrap() && !b.monitor.is_busy(1).unwrap());
    exchange(&[&a, &b]);
    assert!(a.monitor.is_busy(1).unwrap(), "60 of 100 blocks booked");
    assert!(b.monitor.is_busy(1).unwrap());
}

#[test]
fn a_lost_snapshot_is_counted_and_repaired_by_the_next() {
    let clock = ManualClock::new();
    let (a, b) = (Frontend::new("a", &clock), Frontend::new("b", &clock));
    let first = a.monitor.book(1, 0, 5).unwrap();
    b.deliver(&a.send());
    let second = a.monitor.book(2, 0, 7).unwrap();
    let lost = a.send();
    assert_eq!(lost.len(), 1);
    drop(first);
    let third = a.send();
    // Late and repeated: dropped.
    b.deliver(&third);
    assert_eq!(
        b.sync.handle_on(&lost[0].0, &lost[0].1),
        Ok(SyncApplied::OutOfOrder)
    );
    assert_eq!(
        b.sync.handle_on(&third[0].0, &third[0].1),
        Ok(SyncApplied::OutOfOrder)
    );
    assert_eq!((b.blocks(1), b.blocks(2)), (0, 7));
    let stats = b.sync.stats();
    assert_eq!((stats.gaps, stats.out_of_order, stats.received), (1, 2, 2));
    drop(second);
}

#[test]
fn nothing_changed_sends_nothing_until_the_heartbeat() {
    let clock = ManualClock::new();
    let a = Frontend::new("a", &clock);
    let _x = a.monitor.book(1, 0, 5).unwrap();
    assert_eq!(a.send().len(), 1);
    for _ in 0..10 {
        clock.advance(Duration::from_millis(50));
        assert!(a.send().is_empty(), "unchanged within the heartbeat");
    }
    clock.advance(Duration::from_millis(500));
    assert_eq!(a.send().len(), 1, "the heartbeat");
    let _y = a.monitor.book(1, 0, 1).unwrap();
    assert_eq!(a.send().len(), 1, "a change goes at the next tick");
    assert_eq!(a.sync.stats().sent, 3);
    assert!(a.sync.stats().last_size > 0);
}

#[test]
fn a_joining_frontend_hears_the_others_at_once() {
    let clock = ManualClock::new();
    let (a, b) = (Frontend::new("a", &clock), Frontend::new("b", &clock));
    let _x = a.monitor.book(1, 0, 12).unwrap();
    exchange(&[&a, &b]);
    assert!(a.send().is_empty(), "nothing new");
    let c = Frontend::new("c", &clock);
    let hello = c.send();
    a.deliver(&hello);
    b.deliver(&hello);
    // A's state has not changed, but the hello makes it send.
    c.deliver(&a.send());
    c.deliver(&b.send());
    assert_eq!(c.blocks(1), 12);
}

#[test]
fn a_silent_frontend_is_forgotten() {
    let clock = ManualClock::new();
    let (a, b) = (Frontend::new("a", &clock), Frontend::new("b", &clock));
    let _x = a.monitor.book(1, 0, 20).unwrap();
    b.deliver(&a.send());
    assert_eq!(b.blocks(1), 20);
    clock.advance(Duration::from_millis(2999));
    b.send();
    assert_eq!(b.blocks(1), 20, "not silent long enough");
    clock.advance(Duration::from_millis(1));
    b.send();
    assert_eq!(b.blocks(1), 0);
    let stats = b.sync.stats();
    assert_eq!((stats.expired, stats.frontends), (1, 0));
}

#[test]
fn a_restarted_frontend_replaces_its_old_bookings() {
    let clock = ManualClock::new();
    let b = Frontend::new("b", &clock);
    let old = Frontend::new("a", &clock);
    let _x = old.monitor.book(1, 0, 20).unwrap();
    for _ in 0..3 {
        clock.advance(Duration::from_secs(1));
        b.deliver(&old.send());
    }
    // The same id, a new process: its first snapshot is accepted (a new
    // instance starts a new order) and replaces the old bookings.
    let new = Frontend::new("a", &clock);
    let _y = new.monitor.book(2, 0, 3).unwrap();
    b.deliver(&new.send());
    assert_eq!((b.blocks(1), b.blocks(2)), (0, 3));
    assert_eq!(b.sync.stats().frontends, 1);
}

#[test]
fn a_worker_registered_again_starts_from_nothing_shared() {
    let clock = ManualClock::new();
    let (a, b) = (Frontend::new("a", &clock), Frontend::new("b", &clock));
    let x = a.monitor.book(1, 0, 20).unwrap();
    b.deliver(&a.send());
    b.monitor.remove_worker(1).unwrap();
    b.monitor.add_worker(M, 1, spec(1, 100)).unwrap();
    assert_eq!(b.blocks(1), 0);
    // Unchanged, A's heartbeat puts its 20 blocks on the new worker whole.
    clock.advance(Duration::from_secs(1));
    b.deliver(&a.send());
    assert_eq!(b.blocks(1), 20);
    drop(x);
    b.deliver(&a.send());
    assert_eq!(b.blocks(1), 0);
}

fn payload(frontend: &str, instance: u64, seq: u64, ranks: Vec<RankEntry>) -> Vec<u8> {
    Snapshot {
        v: SNAPSHOT_VERSION,
        frontend: frontend.into(),
        instance,
        seq,
        hello: false,
        ranks,
        queues: Vec::new(),
        lease: None,
    }
    .to_msgpack()
}

fn entry(worker_id: u64, dp_rank: u32, blocks: u64) -> RankEntry {
    RankEntry {
        worker_id,
        dp_rank,
        blocks,
        prefill: 0,
    }
}

#[test]
fn hostile_snapshots_are_refused_and_counted() {
    let clock = ManualClock::new();
    let mut config = BookingSyncConfig::new("b");
    config.max_frontends = 1;
    config.max_payload = 4096;
    config.max_entries = 6;
    let b = Frontend::with(config, &clock);
    let on = |id: &str| format!("loadgate.test.bookings.{id}");
    let e = b.sync.handle_on(&on("a"), &vec![0x90; 5000]).unwrap_err();
    assert!(matches!(e, SyncError::Oversized { len: 5000, .. }), "{e}");
    let e = b.sync.handle_on(&on("a"), b"\xc1").unwrap_err();
    assert!(matches!(e, SyncError::Wire(_)), "{e}");
    // Another frontend's name on a's subject.
    let e = b
        .sync
        .handle_on(&on("a"), &payload("x", 1, 1, vec![entry(1, 0, 99)]))
        .unwrap_err();
    assert!(matches!(e, SyncError::Spoofed { .. }), "{e}");
    assert!(e.to_string().contains("\"x\""), "{e}");
    // Unknown workers and ranks are skipped; a repeated rank counts once;
    // an absurd count is cut.
    let ranks = vec![
        entry(1, 0, 5),
        entry(1, 0, 6),
        entry(9, 0, 50),
        entry(2, 7, 50),
        entry(2, 0, u64::MAX),
    ];
    assert_eq!(
        b.sync.handle_on(&on("a"), &payload("a", 1, 1, ranks)),
        Ok(SyncApplied::Applied)
    );
    assert_eq!((b.blocks(1), b.blocks(2)), (5, MAX_SHARED));
    let e = b
        .sync
        .handle_on(&on("c"), &payload("c", 1, 1, vec![]))
        .unwrap_err();
    assert_eq!(e, SyncError::TooManyFrontends { limit: 1 });
    // More entries than kept in all: refused, and a's stay as they were.
    let many = (0..7).map(|i| entry(1, 0, i)).collect();
    let e = b
        .sync
        .handle_on(&on("a"), &payload("a", 1, 5, many))
        .unwrap_err();
    assert_eq!(e, SyncError::TooManyEntries { limit: 6 });
    assert_eq!((b.blocks(1), b.blocks(2)), (5, MAX_SHARED));
    assert_eq!(
        b.sync
            .handle_on(&on("b"), &payload("b", 1, 1, vec![entry(1, 0, 1)])),
        Ok(SyncApplied::Own)
    );
    assert_eq!(b.blocks(1), 5);
    let stats = b.sync.stats();
    assert_eq!((stats.refused, stats.received), (5, 1));
    // The saturated rank comes back down exactly when a drops it.
    b.sync
        .handle_on(&on("a"), &payload("a", 1, 2, vec![]))
        .unwrap();
    assert_eq!((b.blocks(1), b.blocks(2)), (0, 0));
}

#[test]
fn bad_settings_are_refused() {
    let clock = ManualClock::new();
    let monitor = Arc::new(monitor_with(clock.clone()));
    let subjects = Subjects::new("test").unwrap();
    let mut bad = Vec::new();
    for id in ["", "a.b", "a*", "a b"] {
        bad.push(BookingSyncConfig::new(id));
    }
    let mut c = BookingSyncConfig::new("a");
    c.debounce = Duration::ZERO;
    bad.push(c.clone());
    c = BookingSyncConfig::new("a");
    c.expire_after = c.heartbeat;
    bad.push(c.clone());
    c = BookingSyncConfig::new("a");
    c.max_entries = 0;
    bad.push(c.clone());
    c = BookingSyncConfig::new("a");
    c.max_frontends = 0;
    bad.push(c.clone());
    c.max_frontends = 4097;
    bad.push(c);
    for config in bad {
        let e = BookingSync::new(monitor.clone(), &subjects, config.clone(), clock.clone())
            .unwrap_err();
        assert!(!e.to_string().is_empty(), "{config:?}");
    }
}

#[test]
fn attached_frontends_share_bookings_over_a_bus() {
    let clock = ManualClock::new();
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let subjects = Subjects::new("test").unwrap();
    let (a, b) = (Frontend::new("a", &clock), Frontend::new("b", &clock));
    let _ha = a.sync.attach(bus.clone(), &subjects).unwrap();
    let _hb = b.sync.attach(bus.clone(), &subjects).unwrap();
    let _x = a.monitor.book(1, 0, 30).unwrap();
    let _y = b.monitor.book(2, 0, 4).unwrap();
    support::wait_for("both bookings", || (a.blocks(2), b.blocks(1)) == (4, 30));
    assert_eq!((a.blocks(1), b.blocks(2)), (30, 4));
}

#[test]
fn the_fleets_queues_show_in_each_frontends_metrics() {
    use loadgate::flow::{FlowConfig, FlowRequest};
    use loadgate::monitor::{DispatchRequest, FlowControlConfig};
    let clock = ManualClock::new();
    let (a, b) = (Frontend::new("a", &clock), Frontend::new("b", &clock));
    let gauge = |f: &Frontend| {
        let text = f.monitor.metrics_text();
        text.lines()
            .find(|l| l.starts_with("dynamo_frontend_fleet_queue_requests{model=\"llama\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
    };
    assert_eq!(gauge(&a), None, "no frontend has a queue");
    for f in [&a, &b] {
        f.monitor.set_thresholds(M, &decode(0.5)).unwrap();
        let flow = FlowControlConfig {
            queue: FlowConfig::new(8),
            policy: loadgate::Policy::RoundRobin,
        };
        f.monitor.set_flow_control(M, Some(&flow)).unwrap();
    }
    // A's workers are full: three of its requests wait.
    let held: Vec<_> = [1, 2].map(|w| a.monitor.book(w, 0, 90).unwrap()).into();
    let request = DispatchRequest {
        blocks: Some(1),
        ..DispatchRequest::new(FlowRequest::new("t"))
    };
    let waiting: Vec<_> = (0..3)
        .map(|_| {
            a.monitor
                .dispatch_with_callback(M, &request, Box::new(drop))
        })
        .collect();
    assert!(waiting.iter().all(|h| h.is_waiting()));
    exchange(&[&a, &b]);
    assert_eq!(gauge(&a), Some(3), "its own");
    assert_eq!(gauge(&b), Some(3), "its peer's, from the snapshot");
    drop(waiting);
    drop(held);
}
