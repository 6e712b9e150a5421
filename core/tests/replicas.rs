//! Booking sync between frontend replicas, shared mode
//! (`cluster/replicas.rs`): each frontend sees the others' bookings once,
//! never its own twice, through lost, repeated, late, hostile and
//! restarted messages; a change carries only what changed, and a gap is
//! repaired by the whole state asked for; a joining frontend learns at
//! once; a silent one is forgotten.

mod support;

use std::sync::Arc;
use std::time::Duration;

use loadgate::cluster::replicas::{
    BookingSync, BookingSyncConfig, QueueEntry, RankEntry, SyncApplied, SyncError, SyncMessage,
    MAX_QUEUES, MAX_SHARED, SYNC_VERSION,
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

/// What a message carries.
fn read(sent: &[(String, Vec<u8>)]) -> SyncMessage {
    assert_eq!(sent.len(), 1, "one message");
    SyncMessage::decode(&sent[0].1).unwrap()
}

#[test]
fn a_change_carries_only_the_ranks_that_changed() {
    let clock = ManualClock::new();
    let (a, b) = (Frontend::new("a", &clock), Frontend::new("b", &clock));
    let _x = a.monitor.book(1, 0, 5).unwrap();
    let _y = a.monitor.book(2, 0, 7).unwrap();
    let first = a.send();
    let m = read(&first);
    assert!(m.full && m.hello && m.ranks.len() == 2, "{m:?}");
    b.deliver(&first);
    let z = a.monitor.book(2, 0, 1).unwrap();
    let change = a.send();
    let m = read(&change);
    assert!(!m.full && !m.hello, "{m:?}");
    assert_eq!(
        m.ranks,
        vec![entry(2, 0, 8)],
        "the new total of the one rank"
    );
    assert!(change[0].1.len() < 80, "{} bytes", change[0].1.len());
    b.deliver(&change);
    assert_eq!((b.blocks(1), b.blocks(2)), (5, 8));
    // Booked and released within one interval: nothing to send.
    drop(z);
    drop(a.monitor.book(1, 0, 3).unwrap());
    assert_eq!(read(&a.send()).ranks, vec![entry(2, 0, 7)]);
    assert!(a.send().is_empty());
    drop(_x);
    let gone = a.send();
    assert_eq!(read(&gone).ranks, vec![entry(1, 0, 0)], "a rank left: zero");
    b.deliver(&gone);
    // b missed one change (the release of z): it is behind until asked.
    assert_eq!((b.blocks(1), b.blocks(2)), (0, 8));
    let stats = a.sync.stats();
    assert_eq!((stats.sent, stats.snapshots_sent), (4, 1));
}

#[test]
fn a_lost_change_is_counted_and_repaired_by_the_whole_state_asked_for() {
    let clock = ManualClock::new();
    let (a, b) = (Frontend::new("a", &clock), Frontend::new("b", &clock));
    let first = a.monitor.book(1, 0, 5).unwrap();
    exchange(&[&a, &b]);
    let second = a.monitor.book(2, 0, 7).unwrap();
    let lost = a.send();
    drop(first);
    let third = a.send();
    assert_eq!(read(&third).ranks, vec![entry(1, 0, 0)]);
    assert_eq!(
        b.sync.handle_on(&third[0].0, &third[0].1),
        Ok(SyncApplied::Behind),
        "applied: a change is absolute"
    );
    assert_eq!(
        (b.blocks(1), b.blocks(2)),
        (0, 0),
        "worker 2's change was lost"
    );
    // Late and repeated: dropped.
    for m in [&lost, &third] {
        assert_eq!(
            b.sync.handle_on(&m[0].0, &m[0].1),
            Ok(SyncApplied::OutOfOrder)
        );
    }
    let stats = b.sync.stats();
    assert_eq!((stats.gaps, stats.out_of_order, stats.behind), (1, 2, 1));
    // b asks at its next tick; a answers with its whole state.
    let ask = b.send();
    assert_eq!(read(&ask).resync, vec!["a".to_string()]);
    assert!(b.send().is_empty(), "asked once per heartbeat");
    a.deliver(&ask);
    let whole = a.send();
    assert!(read(&whole).full);
    assert_eq!(
        b.sync.handle_on(&whole[0].0, &whole[0].1),
        Ok(SyncApplied::Applied)
    );
    assert_eq!((b.blocks(1), b.blocks(2)), (0, 7));
    let stats = b.sync.stats();
    assert_eq!((stats.behind, stats.resyncs), (0, 1));
    drop(second);
}

#[test]
fn an_unanswered_ask_is_repeated_every_heartbeat() {
    let clock = ManualClock::new();
    let (a, b) = (Frontend::new("a", &clock), Frontend::new("b", &clock));
    let _x = a.monitor.book(1, 0, 5).unwrap();
    a.send(); // lost: b first hears a by a change
    let _y = a.monitor.book(2, 0, 3).unwrap();
    let change = a.send();
    assert_eq!(
        b.sync.handle_on(&change[0].0, &change[0].1),
        Ok(SyncApplied::Behind)
    );
    assert_eq!((b.blocks(1), b.blocks(2)), (0, 3));
    assert_eq!(read(&b.send()).resync, vec!["a".to_string()]); // lost too
    clock.advance(Duration::from_millis(999));
    assert!(b.send().is_empty());
    clock.advance(Duration::from_millis(1));
    let ask = b.send();
    assert_eq!(read(&ask).resync, vec!["a".to_string()]);
    a.deliver(&ask);
    b.deliver(&a.send());
    assert_eq!((b.blocks(1), b.blocks(2)), (5, 3));
    assert_eq!(b.sync.stats().behind, 0);
}

#[test]
fn the_whole_state_goes_every_snapshot_interval() {
    let clock = ManualClock::new();
    let mut config = BookingSyncConfig::new("a");
    config.snapshot_every = Duration::from_secs(5);
    let a = Frontend::with(config, &clock);
    let _x = a.monitor.book(1, 0, 5).unwrap();
    assert!(read(&a.send()).full);
    let mut kinds = Vec::new();
    for _ in 0..10 {
        clock.advance(Duration::from_secs(1));
        let m = read(&a.send());
        kinds.push((m.full, m.ranks.len()));
    }
    let heartbeat = (false, 0);
    let whole = (true, 1);
    assert_eq!(
        kinds,
        [heartbeat, heartbeat, heartbeat, heartbeat, whole].repeat(2)
    );
}

#[test]
fn nothing_changed_sends_nothing_until_the_heartbeat() {
    let clock = ManualClock::new();
    let a = Frontend::new("a", &clock);
    let _x = a.monitor.book(1, 0, 5).unwrap();
    let whole = a.send();
    assert_eq!(whole.len(), 1);
    for _ in 0..10 {
        clock.advance(Duration::from_millis(50));
        assert!(a.send().is_empty(), "unchanged within the heartbeat");
    }
    clock.advance(Duration::from_millis(500));
    let heartbeat = a.send();
    assert!(read(&heartbeat).ranks.is_empty(), "the heartbeat is empty");
    assert!(heartbeat[0].1.len() < whole[0].1.len());
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
fn a_removed_worker_leaves_the_others_views() {
    let clock = ManualClock::new();
    let (a, b) = (Frontend::new("a", &clock), Frontend::new("b", &clock));
    let _x = a.monitor.book(1, 0, 20).unwrap();
    let _y = a.monitor.book(2, 0, 5).unwrap();
    b.deliver(&a.send());
    assert_eq!((b.blocks(1), b.blocks(2)), (20, 5));
    a.monitor.remove_worker(2).unwrap();
    let change = a.send();
    assert_eq!(read(&change).ranks, vec![entry(2, 0, 0)]);
    b.deliver(&change);
    assert_eq!((b.blocks(1), b.blocks(2)), (20, 0));
    // Registered again, it starts from nothing here and there.
    a.monitor.add_worker(M, 2, spec(1, 100)).unwrap();
    assert!(a.send().is_empty());
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
    // At b's next heartbeat tick, a's 20 blocks go on the new worker whole.
    clock.advance(Duration::from_secs(1));
    b.send();
    assert_eq!(b.blocks(1), 20);
    drop(x);
    b.deliver(&a.send());
    assert_eq!(b.blocks(1), 0);
}

/// A whole state.
fn payload(frontend: &str, instance: u64, seq: u64, ranks: Vec<RankEntry>) -> Vec<u8> {
    SyncMessage {
        v: SYNC_VERSION,
        frontend: frontend.into(),
        instance,
        seq,
        hello: false,
        full: true,
        ranks,
        queues: Vec::new(),
        resync: Vec::new(),
        lease: None,
    }
    .to_msgpack()
}

/// A change.
fn change(frontend: &str, seq: u64, ranks: Vec<RankEntry>, queues: Vec<QueueEntry>) -> Vec<u8> {
    let mut m = SyncMessage::decode(&payload(frontend, 1, seq, ranks)).unwrap();
    m.full = false;
    m.queues = queues;
    m.to_msgpack()
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
    // Unknown workers and ranks are kept aside; of a repeated rank the
    // last counts; an absurd count is cut.
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
    assert_eq!((b.blocks(1), b.blocks(2)), (6, MAX_SHARED));
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
    // So is a change that adds more (four held, three new).
    let more = (3..6).map(|w| entry(w, 0, 1)).collect();
    let e = b
        .sync
        .handle_on(&on("a"), &change("a", 2, more, vec![]))
        .unwrap_err();
    assert_eq!(e, SyncError::TooManyEntries { limit: 6 });
    assert_eq!((b.blocks(1), b.blocks(2)), (6, MAX_SHARED));
    assert_eq!(
        b.sync
            .handle_on(&on("b"), &payload("b", 1, 1, vec![entry(1, 0, 1)])),
        Ok(SyncApplied::Own)
    );
    assert_eq!(b.blocks(1), 6);
    // Queues past the bound, by changes: refused.
    let queue = |i: usize| QueueEntry {
        model: format!("m{i}"),
        requests: 1,
        tokens: 1,
    };
    let mut seq = 1;
    for chunk in (0..MAX_QUEUES).collect::<Vec<_>>().chunks(64) {
        seq += 1;
        let queues = chunk.iter().map(|&i| queue(i)).collect();
        assert_eq!(
            b.sync
                .handle_on(&on("a"), &change("a", seq, vec![], queues)),
            Ok(SyncApplied::Applied),
        );
    }
    let e = b
        .sync
        .handle_on(
            &on("a"),
            &change("a", seq + 1, vec![], vec![queue(MAX_QUEUES)]),
        )
        .unwrap_err();
    assert_eq!(e, SyncError::TooManyQueues { limit: MAX_QUEUES });
    assert_eq!(b.sync.remote_queues().len(), MAX_QUEUES);
    let stats = b.sync.stats();
    assert_eq!((stats.refused, stats.received), (7, 1 + seq - 1));
    // The saturated rank comes back down exactly when a drops it.
    b.sync
        .handle_on(&on("a"), &payload("a", 1, seq + 1, vec![]))
        .unwrap();
    assert_eq!((b.blocks(1), b.blocks(2)), (0, 0));
    assert!(b.sync.remote_queues().is_empty());
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
    c.snapshot_every = Duration::from_millis(999);
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
