//! The worker admission gate against docs/behaviour.md#worker-admission: one
//! test per rule, with its queue deadline, single-threaded and with a manual
//! clock. Its configuration, statistics, metric names and errors are in
//! `gate_config.rs`.

use std::sync::{Arc, Mutex};

use std::time::Duration;

use loadgate::gate::MAX_LIMIT;
mod support;
use support::gates::{gate, timed_gate};
use support::polling::{granted, poll, queued, rejected};

use loadgate::{
    AdmissionGate, AdmitError, ConfigError, GateConfig, ManualClock, OwnedPermit, Reason,
    TryAdmitError,
};

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
