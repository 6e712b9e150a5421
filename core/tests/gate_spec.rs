//! The worker admission gate against docs/behaviour.md#worker-admission (one
//! test per rule, with its queue deadline and environment variables), the
//! gate's metric names (docs/behaviour.md#metrics) and bad input
//! (docs/behaviour.md#bad-input-and-limits), single-threaded and with a manual
//! clock.

use std::sync::{Arc, Mutex};

use std::time::Duration;

use loadgate::gate::{MAX_CLASSES, MAX_LIMIT, MAX_QUEUE, QUEUE_LIMIT_ENV, QUEUE_TIMEOUT_ENV};
mod support;
use support::polling::{granted, poll, queued, rejected};

use loadgate::{
    AdmissionGate, AdmitError, ClassStats, ConfigError, GateConfig, GateStats, ManualClock,
    OwnedPermit, Reason, TryAdmitError,
};

fn gate(limit: u32, queue: u32) -> Arc<AdmissionGate> {
    Arc::new(AdmissionGate::new(GateConfig::new(limit).with_queue(queue)).unwrap())
}

fn timed_gate(
    limit: u32,
    queue: u32,
    ms: u64,
    lifo: bool,
) -> (Arc<AdmissionGate>, Arc<ManualClock>) {
    let clock = ManualClock::new();
    let config = GateConfig::new(limit)
        .with_queue(queue)
        .with_queue_timeout(Some(Duration::from_millis(ms)))
        .with_adaptive_lifo(lifo);
    (
        Arc::new(AdmissionGate::with_clock(config, clock.clone()).unwrap()),
        clock,
    )
}

// ----- worker-admission: N slots, queue of exactly Q, N + Q in flight -----

#[test]
fn at_most_n_run_and_q_wait_the_rest_is_rejected() {
    let g = gate(2, 3);
    let p1 = g.try_admit_owned().unwrap();
    let p2 = g.try_admit_owned().unwrap();
    let mut waiters: Vec<_> = (0..3).map(|_| queued(&g)).collect();
    let s = g.stats();
    assert_eq!((s.running, s.queued, s.in_flight()), (2, 3, 5));
    // Every further form is rejected with the reference message.
    let mut f = g.admit_owned();
    let e = rejected(&mut f);
    assert_eq!(e, AdmitError::AtCapacity);
    assert_eq!(e.to_string(), "Server overloaded: worker at capacity");
    assert_eq!(e.reason(), Reason::WorkerAtCapacity);
    assert_eq!(g.admit_blocking(None).unwrap_err(), AdmitError::AtCapacity);
    assert_eq!(g.try_admit().unwrap_err(), TryAdmitError::WouldWait);
    assert_eq!(
        g.stats().rejected_at_capacity,
        2,
        "try_admit is not a rejection"
    );
    drop(p1);
    drop(p2);
    let permits: Vec<_> = waiters.iter_mut().take(2).map(granted).collect();
    assert_eq!(g.stats().running, 2);
    drop(permits);
    let last = granted(&mut waiters[2]);
    drop(last);
    drop(waiters);
    let s = g.stats();
    assert_eq!((s.running, s.queued), (0, 0));
    assert_eq!((s.admitted_direct, s.admitted_queued), (2, 3));
}

#[test]
fn queue_of_zero_means_no_queue_at_all() {
    let g = gate(1, 0);
    let p = g.try_admit_owned().unwrap();
    let mut f = g.admit_owned();
    assert_eq!(rejected(&mut f), AdmitError::AtCapacity);
    assert_eq!(
        g.admit_blocking(Some(Duration::from_secs(5))).unwrap_err(),
        AdmitError::AtCapacity
    );
    let fired = Arc::new(Mutex::new(Vec::new()));
    let log = fired.clone();
    let ticket = g.admit_with_callback(Box::new(move |r| log.lock().unwrap().push(r.err())));
    assert!(!ticket.is_queued());
    assert_eq!(*fired.lock().unwrap(), vec![Some(AdmitError::AtCapacity)]);
    assert_eq!(g.stats().queued, 0);
    drop(p);
    assert!(g.try_admit().is_ok());
}

#[test]
fn queue_of_one_holds_exactly_one_waiter() {
    let g = gate(1, 1);
    let p = g.try_admit_owned().unwrap();
    let mut w = queued(&g);
    let mut f = g.admit_owned();
    assert_eq!(rejected(&mut f), AdmitError::AtCapacity);
    assert_eq!(g.stats().in_flight(), 2);
    drop(p);
    let p = granted(&mut w);
    // The queue place is free again: exactly one more may wait.
    let _w2 = queued(&g);
    let mut f = g.admit_owned();
    assert_eq!(rejected(&mut f), AdmitError::AtCapacity);
    drop(p);
}

// ----- worker-admission: direct only when free and nobody queued; FIFO ---

#[test]
fn no_barging_past_waiters_and_fifo_order() {
    let g = gate(1, 8);
    let p = g.try_admit_owned().unwrap();
    let mut ws: Vec<_> = (0..5).map(|_| queued(&g)).collect();
    drop(p);
    // The freed slot went to the oldest waiter; a newcomer must queue.
    assert_eq!(g.try_admit().unwrap_err(), TryAdmitError::WouldWait);
    let mut late = queued(&g);
    for i in 0..5 {
        for later in ws.iter_mut().skip(i + 1) {
            assert!(poll(later).is_pending(), "waiter {i} must be served first");
        }
        assert!(poll(&mut late).is_pending());
        let p = granted(&mut ws[i]);
        drop(p);
    }
    drop(granted(&mut late));
    assert_eq!(g.stats().admitted_queued, 6);
    assert_eq!(g.stats().admitted_direct, 1);
}

// ----- worker-admission: permits until release; handoff; any thread ------

#[test]
fn permit_is_held_until_dropped_and_release_hands_off() {
    let g = gate(1, 1);
    let p = g.try_admit().unwrap();
    assert_eq!(g.running(), 1);
    assert!(g.try_admit().is_err());
    p.release();
    assert_eq!(g.running(), 0);
    let p = g.try_admit_owned().unwrap();
    let mut w = queued(&g);
    drop(p);
    // Handed over: still one running, nobody queued, slot owed to the waiter.
    let s = g.stats();
    assert_eq!((s.running, s.queued), (1, 0));
    assert_eq!(g.try_admit().unwrap_err(), TryAdmitError::WouldWait);
    let p = granted(&mut w);
    assert_eq!(g.running(), 1);
    drop(p);
    assert_eq!(g.running(), 0);
}

#[test]
fn permits_move_to_and_release_from_other_threads() {
    let g = gate(2, 2);
    let borrowed = g.try_admit().unwrap();
    let owned = g.try_admit_owned().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || drop(borrowed));
    });
    std::thread::spawn(move || owned.release()).join().unwrap();
    assert_eq!(g.running(), 0);
    let p = g.try_admit().unwrap().into_owned(&g);
    std::thread::spawn(move || drop(p)).join().unwrap();
    assert_eq!(g.stats().running, 0);
}

// ----- worker-admission: cancel frees the place; cancel racing handoff ---

#[test]
fn cancel_frees_the_queue_place_and_is_not_a_rejection() {
    let g = gate(1, 1);
    let p = g.try_admit_owned().unwrap();
    let w = queued(&g);
    drop(w);
    let s = g.stats();
    assert_eq!((s.queued, s.cancelled, s.rejected_total()), (0, 1, 0));
    let mut w = queued(&g);
    drop(p);
    drop(granted(&mut w));
    assert_eq!(g.stats().running, 0);
}

#[test]
fn cancel_after_handoff_passes_the_slot_on() {
    let g = gate(1, 2);
    let p = g.try_admit_owned().unwrap();
    let w1 = queued(&g);
    let mut w2 = queued(&g);
    drop(p); // granted to w1, which never looks
    drop(w1); // the slot goes on to w2, not lost
    let s = g.stats();
    assert_eq!((s.running, s.queued, s.cancelled), (1, 0, 0));
    let p2 = granted(&mut w2);
    drop(p2);
    let s = g.stats();
    assert_eq!((s.running, s.queued, s.admitted_queued), (0, 0, 2));
    // And with nobody left, a granted-then-dropped waiter frees the slot.
    let p = g.try_admit_owned().unwrap();
    let w = queued(&g);
    drop(p);
    drop(w);
    assert_eq!(g.running(), 0);
    assert!(g.try_admit().is_ok());
}

// ----- queue-deadline: exact boundary, adaptive LIFO ---------------------

#[test]
fn deadline_expires_exactly_at_the_boundary() {
    let (g, clock) = timed_gate(1, 4, 100, false);
    let p = g.try_admit_owned().unwrap();
    let mut w = queued(&g);
    assert_eq!(g.next_deadline(), Some(100_000_000));
    clock.advance(Duration::from_nanos(99_999_999));
    assert_eq!(g.expire(), 0);
    assert!(poll(&mut w).is_pending());
    clock.advance(Duration::from_nanos(1));
    assert_eq!(g.expire(), 1);
    let e = rejected(&mut w);
    assert_eq!(e, AdmitError::QueueTimeout);
    assert_eq!(
        e.to_string(),
        "Server overloaded: request rejected after exceeding the backend admission queue delay"
    );
    assert_eq!(g.next_deadline(), None);
    let s = g.stats();
    assert_eq!(
        (s.queued, s.expired, s.rejected(Reason::QueueTimeout)),
        (0, 1, 1)
    );
    drop(p);
}

#[test]
fn deadline_is_off_unless_configured() {
    let clock = ManualClock::new();
    let g = AdmissionGate::with_clock(GateConfig::new(1).with_queue(1), clock.clone()).unwrap();
    let _p = g.try_admit().unwrap();
    let mut w = g.admit();
    assert!(poll(&mut w).is_pending());
    clock.advance(Duration::from_secs(3600));
    assert_eq!(g.expire(), 0);
    assert_eq!(g.next_deadline(), None);
    assert!(poll(&mut w).is_pending());
}

#[test]
fn deadline_is_checked_when_the_queue_moves() {
    let (g, clock) = timed_gate(1, 2, 50, false);
    let p = g.try_admit_owned().unwrap();
    let mut old = queued(&g);
    clock.advance(Duration::from_millis(30));
    let mut young = queued(&g);
    clock.advance(Duration::from_millis(20)); // old is due, young is not
                                              // A release skips (and rejects) the due waiter and serves the next one.
    drop(p);
    assert_eq!(rejected(&mut old), AdmitError::QueueTimeout);
    let p = granted(&mut young);
    // An admit into a full queue expires due waiters before rejecting.
    let mut a = queued(&g);
    let mut b = queued(&g);
    clock.advance(Duration::from_millis(50));
    let mut c = queued(&g);
    assert_eq!(rejected(&mut a), AdmitError::QueueTimeout);
    assert_eq!(rejected(&mut b), AdmitError::QueueTimeout);
    assert_eq!(g.stats().expired, 3);
    drop(p);
    drop(granted(&mut c));
    assert_eq!(g.stats().rejected_at_capacity, 0);
}

#[test]
fn adaptive_lifo_serves_the_newest_once_after_an_expiry() {
    let (g, clock) = timed_gate(1, 8, 100, true);
    let p = g.try_admit_owned().unwrap();
    let mut stale = queued(&g);
    clock.advance(Duration::from_millis(60));
    let mut w: Vec<_> = (0..3).map(|_| queued(&g)).collect();
    clock.advance(Duration::from_millis(40));
    assert_eq!(g.expire(), 1);
    assert_eq!(rejected(&mut stale), AdmitError::QueueTimeout);
    drop(p);
    // Newest first, once...
    assert!(poll(&mut w[0]).is_pending());
    assert!(poll(&mut w[1]).is_pending());
    let p = granted(&mut w[2]);
    drop(p);
    // ...then FIFO again.
    assert!(poll(&mut w[1]).is_pending());
    let p = granted(&mut w[0]);
    drop(p);
    drop(granted(&mut w[1]));

    // Without adaptive LIFO the oldest is served after an expiry.
    let (g, clock) = timed_gate(1, 8, 100, false);
    let p = g.try_admit_owned().unwrap();
    let _stale = queued(&g);
    clock.advance(Duration::from_millis(60));
    let mut w: Vec<_> = (0..2).map(|_| queued(&g)).collect();
    clock.advance(Duration::from_millis(40));
    assert_eq!(g.expire(), 1);
    drop(p);
    assert!(poll(&mut w[1]).is_pending());
    drop(granted(&mut w[0]));
}

// ----- worker-admission: set_limit; close --------------------------------

#[test]
fn raising_the_limit_grants_waiters_at_once() {
    let g = gate(1, 4);
    let p = g.try_admit_owned().unwrap();
    let mut w: Vec<_> = (0..4).map(|_| queued(&g)).collect();
    g.set_limit(3).unwrap();
    let s = g.stats();
    assert_eq!((s.running, s.queued, s.limit), (3, 2, 3));
    let a = granted(&mut w[0]);
    let b = granted(&mut w[1]);
    assert!(poll(&mut w[2]).is_pending());
    g.set_limit(10).unwrap();
    let c = granted(&mut w[2]);
    let d = granted(&mut w[3]);
    assert_eq!(g.stats().running, 5);
    drop((p, a, b, c, d));
    assert_eq!(g.running(), 0);
}

#[test]
fn lowering_the_limit_revokes_nothing() {
    let g = gate(3, 2);
    let mut held: Vec<_> = (0..3).map(|_| g.try_admit_owned().unwrap()).collect();
    let mut w = queued(&g);
    g.set_limit(1).unwrap();
    let s = g.stats();
    assert_eq!((s.running, s.queued, s.limit), (3, 1, 1));
    // Releases drain running down to the new limit before anyone is served.
    held.pop();
    assert!(poll(&mut w).is_pending());
    held.pop();
    assert!(poll(&mut w).is_pending());
    assert_eq!(g.running(), 1);
    held.pop();
    let p = granted(&mut w);
    assert_eq!(g.running(), 1);
    assert!(g.try_admit().is_err());
    drop(p);
    assert!(g.try_admit().is_ok());
    assert_eq!(g.set_limit(0), Err(ConfigError::ZeroLimit));
    assert!(g.set_limit(MAX_LIMIT + 1).is_err());
    assert_eq!(g.limit(), 1, "a refused set_limit changes nothing");
}

#[test]
fn close_rejects_every_waiter_and_every_later_admit() {
    let g = gate(1, 3);
    let p = g.try_admit_owned().unwrap();
    let mut w: Vec<_> = (0..2).map(|_| queued(&g)).collect();
    let fired = Arc::new(Mutex::new(Vec::new()));
    let log = fired.clone();
    let ticket = g.admit_with_callback(Box::new(move |r| log.lock().unwrap().push(r.err())));
    assert!(ticket.is_queued());
    g.close();
    assert!(g.is_closed());
    for f in &mut w {
        assert_eq!(rejected(f), AdmitError::Closed);
    }
    assert_eq!(*fired.lock().unwrap(), vec![Some(AdmitError::Closed)]);
    assert!(!ticket.cancel());
    let mut f = g.admit_owned();
    assert_eq!(rejected(&mut f), AdmitError::Closed);
    assert_eq!(g.admit_blocking(None).unwrap_err(), AdmitError::Closed);
    assert_eq!(g.try_admit().unwrap_err(), TryAdmitError::Closed);
    assert_eq!(AdmitError::Closed.reason(), Reason::Closed);
    // The held permit still releases normally.
    assert_eq!(g.running(), 1);
    drop(p);
    let s = g.stats();
    assert_eq!((s.running, s.queued, s.rejected_closed), (0, 0, 5));
    g.close();
}

// ----- worker-admission: the callback form -------------------------------

type Log = Arc<Mutex<Vec<Result<OwnedPermit, AdmitError>>>>;

fn callback(log: &Log) -> loadgate::AdmitCallback {
    let log = log.clone();
    Box::new(move |r| log.lock().unwrap().push(r))
}

#[test]
fn callback_fires_exactly_once_in_every_case() {
    let (g, clock) = timed_gate(1, 3, 10, false);
    let log: Log = Arc::default();
    // Immediate grant.
    let t0 = g.admit_with_callback(callback(&log));
    assert!(!t0.is_queued() && !t0.cancel());
    assert_eq!(log.lock().unwrap().len(), 1);
    let p = log.lock().unwrap().pop().unwrap().unwrap();
    // Queued, then granted by a release on this thread.
    let t1 = g.admit_with_callback(callback(&log));
    let t2 = g.admit_with_callback(callback(&log));
    let t3 = g.admit_with_callback(callback(&log));
    assert!(t1.is_queued() && t2.is_queued() && t3.is_queued());
    // Full: rejected at once.
    let _t4 = g.admit_with_callback(callback(&log));
    assert_eq!(
        log.lock().unwrap().pop().unwrap().unwrap_err(),
        AdmitError::AtCapacity
    );
    drop(p);
    assert!(!t1.is_queued());
    let p1 = log.lock().unwrap().pop().unwrap().unwrap();
    // Cancelled in time: never fires.
    assert!(t2.cancel());
    assert!(!t2.cancel(), "a second cancel is too late");
    // Expired.
    clock.advance(Duration::from_millis(10));
    assert_eq!(g.expire(), 1);
    assert_eq!(
        log.lock().unwrap().pop().unwrap().unwrap_err(),
        AdmitError::QueueTimeout
    );
    assert!(!t3.cancel());
    assert!(log.lock().unwrap().is_empty());
    drop(p1);
    let s = g.stats();
    assert_eq!((s.running, s.queued, s.cancelled, s.expired), (0, 0, 1, 1));
}

#[test]
fn callbacks_that_drop_their_permit_chain_without_recursion() {
    let n = 20_000;
    let g = gate(1, n);
    let p = g.try_admit_owned().unwrap();
    let fired = Arc::new(std::sync::atomic::AtomicU32::new(0));
    for _ in 0..n {
        let fired = fired.clone();
        // Each callback drops its permit at once, handing the slot on.
        let _ = g.admit_with_callback(Box::new(move |r| {
            fired.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            drop(r.unwrap());
        }));
    }
    assert_eq!(g.queued(), n);
    drop(p); // would overflow the stack if every handoff recursed
    assert_eq!(fired.load(std::sync::atomic::Ordering::Relaxed), n);
    let s = g.stats();
    assert_eq!(
        (s.running, s.queued, s.admitted_queued),
        (0, 0, u64::from(n))
    );
}

#[test]
fn a_pending_callback_keeps_the_gate_until_it_fires() {
    let g = gate(1, 1);
    let p = g.try_admit_owned().unwrap();
    let log: Log = Arc::default();
    let ticket = g.admit_with_callback(callback(&log));
    drop(ticket); // dropping the ticket does not cancel
    let weak = Arc::downgrade(&g);
    drop(g);
    drop(p); // hands the slot to the callback
    let permit = log.lock().unwrap().pop().unwrap().unwrap();
    assert!(weak.upgrade().is_some());
    drop(permit);
    assert!(
        weak.upgrade().is_none(),
        "the gate is freed once nothing refers to it"
    );
}

// ----- environment-variables and bad-input-and-limits: configuration ------

fn lookup(q: Option<&str>, t: Option<&str>) -> Result<GateConfig, ConfigError> {
    GateConfig::from_lookup(4, |name| match name {
        QUEUE_LIMIT_ENV => q.map(str::to_owned),
        QUEUE_TIMEOUT_ENV => t.map(str::to_owned),
        _ => None,
    })
}

#[test]
fn env_queue_limit_table() {
    let ok = |v: Option<&str>, q: u32| {
        let c = lookup(v, None).unwrap();
        assert_eq!(
            (c.limit, c.queue, c.queue_timeout),
            (4, q, None),
            "value {v:?}"
        );
    };
    ok(None, 16);
    ok(Some("0"), 0);
    ok(Some("1"), 1);
    ok(Some("2"), 2);
    ok(Some(" 7 "), 7);
    ok(Some("\t12\n"), 12);
    ok(Some("2097151"), MAX_QUEUE);
    for bad in [
        "",
        "  ",
        "abc",
        "-1",
        "+3",
        "1.5",
        "0x10",
        "2097152",
        "99999999999999999999999",
    ] {
        let e = lookup(Some(bad), None).unwrap_err();
        let text = e.to_string();
        assert!(text.contains(QUEUE_LIMIT_ENV), "{text}");
        assert!(text.contains(&format!("{bad:?}")), "{text}");
        assert!(matches!(
            e,
            ConfigError::InvalidEnv {
                var: QUEUE_LIMIT_ENV,
                ..
            }
        ));
    }
}

#[test]
fn env_queue_timeout_table() {
    assert_eq!(lookup(None, None).unwrap().queue_timeout, None);
    assert_eq!(
        lookup(None, Some("250")).unwrap().queue_timeout,
        Some(Duration::from_millis(250))
    );
    assert_eq!(
        lookup(None, Some(" 1 ")).unwrap().queue_timeout,
        Some(Duration::from_millis(1))
    );
    for bad in ["0", "abc", "", "-5", "1.5", "99999999999999999999999"] {
        let e = lookup(None, Some(bad)).unwrap_err();
        assert!(e.to_string().contains(QUEUE_TIMEOUT_ENV), "{e}");
        assert!(matches!(
            e,
            ConfigError::InvalidEnv {
                var: QUEUE_TIMEOUT_ENV,
                ..
            }
        ));
    }
    let c = lookup(Some("3"), Some("40")).unwrap();
    assert_eq!(
        (c.queue, c.queue_timeout),
        (3, Some(Duration::from_millis(40)))
    );
}

#[test]
fn from_env_reads_the_process_environment() {
    // The only test in this binary that touches these variables.
    std::env::set_var(QUEUE_LIMIT_ENV, " 5 ");
    std::env::set_var(QUEUE_TIMEOUT_ENV, "75");
    let c = GateConfig::from_env(3).unwrap();
    assert_eq!(
        (c.limit, c.queue, c.queue_timeout),
        (3, 5, Some(Duration::from_millis(75)))
    );
    std::env::set_var(QUEUE_LIMIT_ENV, "many");
    assert!(GateConfig::from_env(3).is_err());
    std::env::remove_var(QUEUE_LIMIT_ENV);
    std::env::remove_var(QUEUE_TIMEOUT_ENV);
    let c = GateConfig::from_env(3).unwrap();
    assert_eq!((c.queue, c.queue_timeout), (16, None));
}

#[test]
fn bad_configurations_are_refused_with_clear_errors() {
    let build = |c: GateConfig| AdmissionGate::new(c).map(|_| ()).unwrap_err();
    assert_eq!(build(GateConfig::new(0)), ConfigError::ZeroLimit);
    assert!(build(GateConfig::new(0)).to_string().contains("at least 1"));
    assert!(lookup(None, None).is_ok());
    assert_eq!(
        GateConfig::from_lookup(0, |_| None).unwrap_err(),
        ConfigError::ZeroLimit
    );
    let e = build(GateConfig::new(MAX_LIMIT + 1));
    assert!(e.to_string().contains("limit = 2097152"), "{e}");
    let e = build(GateConfig::new(1).with_queue(MAX_QUEUE + 1));
    assert!(e.to_string().contains("queue = 2097152"), "{e}");
    let e = build(GateConfig::new(1).with_queue_timeout(Some(Duration::ZERO)));
    assert_eq!(e, ConfigError::ZeroTimeout);
    let e = build(GateConfig::new(1).with_metrics_prefix("bad-prefix"));
    assert!(e.to_string().contains("bad-prefix"), "{e}");
    assert!(AdmissionGate::new(GateConfig::new(MAX_LIMIT).with_queue(0)).is_ok());
}

// ----- stats and metrics ---------------------------------------------------

#[test]
fn stats_count_every_outcome() {
    let (g, clock) = timed_gate(1, 2, 10, false);
    let p = g.try_admit_owned().unwrap();
    let w1 = queued(&g);
    let mut w2 = queued(&g);
    let mut full = g.admit_owned();
    assert_eq!(rejected(&mut full), AdmitError::AtCapacity);
    drop(w1);
    clock.advance(Duration::from_millis(10));
    assert_eq!(g.expire(), 1);
    assert_eq!(rejected(&mut w2), AdmitError::QueueTimeout);
    let mut w3 = queued(&g);
    drop(p);
    let p = granted(&mut w3);
    g.close();
    assert!(g.try_admit().is_err());
    let mut late = g.admit_owned();
    assert_eq!(rejected(&mut late), AdmitError::Closed);
    drop(p);
    assert_eq!(
        g.stats(),
        GateStats {
            running: 0,
            queued: 0,
            limit: 1,
            queue_limit: 2,
            waiting: 0,
            wait_limit: None,
            closed: true,
            received: 6,
            admitted_direct: 1,
            admitted_queued: 1,
            rejected_at_capacity: 1,
            rejected_closed: 1,
            expired: 1,
            cancelled: 1,
            displaced: 0,
            class_count: 1,
            classes: {
                let mut classes = [ClassStats::default(); MAX_CLASSES];
                classes[0] = ClassStats {
                    queued: 0,
                    queue_limit: 2,
                    rejected_at_capacity: 1,
                    expired: 1,
                    rejected_closed: 1,
                    displaced: 0,
                };
                classes
            },
        }
    );
    assert_eq!(g.stats().rejected_total(), 3);
}

#[test]
fn metrics_text_has_the_reference_names() {
    let (g, clock) = timed_gate(2, 1, 1000, false);
    let a = g.try_admit_owned().unwrap();
    let b = g.try_admit_owned().unwrap();
    let mut w = queued(&g);
    let mut r = g.admit_owned();
    assert!(poll(&mut r).is_ready());
    clock.advance(Duration::from_millis(3));
    drop(a);
    let c = granted(&mut w);
    let text = g.metrics_text();
    for line in [
        "# TYPE dynamo_rejection_request_total counter",
        "dynamo_rejection_request_total 1",
        "# TYPE dynamo_engine_request gauge",
        "dynamo_engine_request 2",
        "# TYPE dynamo_request_queue gauge",
        "dynamo_request_queue 0",
        "dynamo_engine_request_limit 2",
        "dynamo_request_queue_limit 1",
        "dynamo_request_admitted_total{path=\"direct\"} 2",
        "dynamo_request_admitted_total{path=\"queued\"} 1",
        "dynamo_request_rejection_by_reason_total{reason=\"worker_at_capacity\"} 1",
        "dynamo_request_rejection_by_reason_total{reason=\"queue_timeout\"} 0",
        "dynamo_request_rejection_by_reason_total{reason=\"closed\"} 0",
        "dynamo_request_cancelled_total 0",
        "dynamo_request_queue_expired_total 0",
        "# TYPE dynamo_request_queue_wait_seconds histogram",
        "dynamo_request_queue_wait_seconds_bucket{le=\"0.001\"} 0",
        "dynamo_request_queue_wait_seconds_bucket{le=\"0.005\"} 1",
        "dynamo_request_queue_wait_seconds_bucket{le=\"+Inf\"} 1",
        "dynamo_request_queue_wait_seconds_sum 0.003",
        "dynamo_request_queue_wait_seconds_count 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    drop((b, c));
    let custom = AdmissionGate::new(GateConfig::new(1).with_metrics_prefix("worker")).unwrap();
    assert_eq!(custom.metrics_prefix(), "worker");
    let text = custom.metrics_text();
    assert!(text.contains("worker_rejection_request_total 0"));
    assert!(text.contains("worker_engine_request 0"));
    assert!(text.contains("worker_request_queue 0"));
    assert!(!text.contains("dynamo_"));
}

#[test]
fn errors_map_to_reasons_and_messages() {
    for (e, reason) in [
        (AdmitError::AtCapacity, Reason::WorkerAtCapacity),
        (AdmitError::QueueTimeout, Reason::QueueTimeout),
        (AdmitError::Closed, Reason::Closed),
        (AdmitError::Displaced, Reason::Displaced),
    ] {
        assert_eq!(e.reason(), reason);
        assert_eq!(e.to_string(), reason.message());
    }
    // The caller's own timeout reports as a queue timeout, with its own
    // text (the one every binding gives).
    assert_eq!(AdmitError::TimedOut.reason(), Reason::QueueTimeout);
    assert_eq!(
        AdmitError::TimedOut.to_string(),
        "timed out waiting for an engine slot; the request left the queue"
    );
    assert_eq!(TryAdmitError::Closed.to_string(), Reason::Closed.message());
    assert!(!TryAdmitError::WouldWait.to_string().is_empty());
}

#[test]
fn try_admit_never_queues_and_is_never_counted_as_a_rejection() {
    let g = gate(1, 4);
    let p = g.try_admit().unwrap();
    for _ in 0..10 {
        assert_eq!(g.try_admit().unwrap_err(), TryAdmitError::WouldWait);
    }
    let s = g.stats();
    assert_eq!((s.queued, s.rejected_total(), s.admitted_direct), (0, 0, 1));
    drop(p);
}

#[test]
fn gate_debug_shows_the_state() {
    let g = gate(3, 1);
    let _p = g.try_admit().unwrap();
    let text = format!("{g:?}");
    assert!(
        text.contains("running: 1") && text.contains("limit: 3"),
        "{text}"
    );
}

#[test]
fn handles_are_send_and_sync_where_it_matters() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<AdmissionGate>();
    send_sync::<loadgate::Permit<'static>>();
    send_sync::<OwnedPermit>();
    send_sync::<loadgate::CallbackTicket>();
    send::<loadgate::Admit<'static>>();
    send::<loadgate::AdmitOwned>();
    fn unpin<T: Unpin>() {}
    unpin::<loadgate::Admit<'static>>();
    unpin::<loadgate::AdmitOwned>();
}

#[test]
fn operations_on_long_queues_resolve_every_waiter() {
    // More waiters than one batch of wakeups: set_limit, close and expire
    // work through the whole queue.
    let g = gate(1, 100);
    let p = g.try_admit_owned().unwrap();
    let mut w: Vec<_> = (0..100).map(|_| queued(&g)).collect();
    g.set_limit(81).unwrap();
    let s = g.stats();
    assert_eq!((s.running, s.queued, s.limit), (81, 20, 81));
    let permits: Vec<_> = w.iter_mut().take(80).map(granted).collect();
    g.close();
    for f in w.iter_mut().skip(80) {
        assert_eq!(rejected(f), AdmitError::Closed);
    }
    drop((p, permits));
    assert_eq!(g.stats().running, 0);

    let (g, clock) = timed_gate(1, 100, 10, false);
    let p = g.try_admit_owned().unwrap();
    let mut w: Vec<_> = (0..100).map(|_| queued(&g)).collect();
    clock.advance(Duration::from_millis(10));
    assert_eq!(g.expire(), 100);
    for f in &mut w {
        assert_eq!(rejected(f), AdmitError::QueueTimeout);
    }
    // A release with 100 due waiters expires them all, then serves the live one.
    let mut w: Vec<_> = (0..99).map(|_| queued(&g)).collect();
    clock.advance(Duration::from_millis(10));
    let mut live = queued(&g);
    drop(p);
    for f in &mut w {
        assert_eq!(rejected(f), AdmitError::QueueTimeout);
    }
    drop(granted(&mut live));
    let s = g.stats();
    assert_eq!((s.running, s.queued, s.expired), (0, 0, 199));
}
