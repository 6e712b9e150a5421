//! Loom models of the admission gate: every interleaving (up to the
//! preemption bound) of admit, release, cancel, handoff, expiry, set_limit
//! and close among 2–3 threads, with N and Q of 1–2. A gate with one class
//! and no wait limit runs on the lock-free queue (`gate/queue.rs`), and a
//! gate with two priority classes on one queue per class
//! (`gate/classes.rs`: displacement, a reserved slot, an arrival counting
//! itself while a slot is freed, a cancel racing a handoff between
//! classes, a displacement racing its victim's cancel); the six models
//! with a wait limit W of 1 (with first responses) run the same counted
//! protocol with the wait count beside it (`gate/wait.rs`). Each model checks: at most N
//! running and N + Q in flight at every step (read from the state word and
//! from an independent counter), FIFO among waiters, no slot lost or
//! duplicated (a fresh admit finds every slot at the end), and every waiter
//! resolved.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p loadgate
//! --release --test loom_gate`
#![cfg(loom)]

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use std::time::Duration;

use loadgate::{
    AdmissionGate, AdmitError, AdmitOwned, GateConfig, ManualClock, OwnedPermit, Pending,
    PendingAdmission,
};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

/// Wakes a loom thread.
struct Unpark(thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Drives a future on the current loom thread, parking between polls.
fn block_on<F: Future>(f: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        thread::park();
    }
}

struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// A future polled once on this thread, so it is queued in a known order.
fn queued(g: &Arc<AdmissionGate>) -> AdmitOwned {
    let mut f = g.admit_owned();
    let waker = Waker::from(Arc::new(Noop));
    assert!(Pin::new(&mut f)
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    f
}

fn gate(limit: u32, queue: u32) -> Arc<AdmissionGate> {
    Arc::new(AdmissionGate::new(GateConfig::new(limit).with_queue(queue)).unwrap())
}

/// Independent count of slots held, checked against N at every admit.
struct Probe {
    running: AtomicUsize,
    limit: usize,
}

impl Probe {
    fn new(limit: u32) -> Arc<Self> {
        Arc::new(Self {
            running: AtomicUsize::new(0),
            limit: limit as usize,
        })
    }
    fn hold(&self, g: &AdmissionGate, p: OwnedPermit) {
        let r = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(r <= self.limit, "{r} running, limit {}", self.limit);
        check_caps(g);
        self.running.fetch_sub(1, Ordering::SeqCst);
        drop(p);
    }
}

fn check_caps(g: &AdmissionGate) {
    let s = g.stats();
    assert!(s.running <= s.limit.max(2), "{s:?}");
    assert!(s.in_flight() <= s.limit.max(2) + s.queue_limit, "{s:?}");
}

/// Nothing running or queued, and every slot can be taken again.
fn check_drained(g: &Arc<AdmissionGate>, limit: u32) {
    let s = g.stats();
    assert_eq!((s.running, s.queued), (0, 0), "{s:?}");
    if !s.closed {
        let all: Vec<_> = (0..limit)
            .map(|_| g.try_admit().expect("a slot was lost"))
            .collect();
        assert!(g.try_admit().is_err(), "a slot was duplicated");
        drop(all);
    }
}

#[test]
fn release_hands_off_while_a_newcomer_tries_to_barge() {
    loom::model(|| {
        let g = gate(1, 1);
        let probe = Probe::new(1);
        let p = g.try_admit_owned().unwrap();
        let w = queued(&g);
        let (g1, pr1) = (g.clone(), probe.clone());
        let waiter = thread::spawn(move || {
            let p = block_on(w).expect("a queued waiter is served");
            pr1.hold(&g1, p);
        });
        let releaser = thread::spawn(move || drop(p));
        // A newcomer: admitted only if the queue already drained.
        match g.try_admit_owned() {
            Ok(p) => probe.hold(&g, p),
            Err(_) => check_caps(&g),
        }
        waiter.join().unwrap();
        releaser.join().unwrap();
        check_drained(&g, 1);
    });
}

#[test]
fn cancel_races_handoff_without_losing_the_slot() {
    loom::model(|| {
        let g = gate(1, 1);
        let p = g.try_admit_owned().unwrap();
        let w = queued(&g);
        let canceller = thread::spawn(move || drop(w));
        let releaser = thread::spawn(move || drop(p));
        canceller.join().unwrap();
        releaser.join().unwrap();
        let s = g.stats();
        // Either it left the queue first, or it was granted and passed the
        // slot back; never both, never neither.
        assert_eq!(s.cancelled + s.admitted_queued, 1, "{s:?}");
        check_drained(&g, 1);
    });
}

#[test]
fn waiters_are_served_first_in_first_out() {
    loom::model(|| {
        let g = gate(1, 2);
        let p = g.try_admit_owned().unwrap();
        let first = queued(&g);
        let second = queued(&g);
        let seq = Arc::new(AtomicUsize::new(0));
        let (s1, s2) = (seq.clone(), seq.clone());
        let t1 = thread::spawn(move || {
            let p = block_on(first).unwrap();
            let n = s1.fetch_add(1, Ordering::SeqCst);
            drop(p);
            n
        });
        let t2 = thread::spawn(move || {
            let p = block_on(second).unwrap();
            let n = s2.fetch_add(1, Ordering::SeqCst);
            drop(p);
            n
        });
        drop(p);
        assert_eq!(t1.join().unwrap(), 0, "the older waiter is served first");
        assert_eq!(t2.join().unwrap(), 1);
        check_drained(&g, 1);
    });
}

#[test]
fn blocking_waiter_and_release_race() {
    loom::model(|| {
        let g = gate(1, 1);
        let probe = Probe::new(1);
        let p = g.try_admit_owned().unwrap();
        let (g1, pr1) = (g.clone(), probe.clone());
        let waiter = thread::spawn(move || {
            // Direct if the release came first, else queued and handed the slot.
            let p = g1.admit_blocking_owned(None).unwrap();
            pr1.hold(&g1, p);
        });
        drop(p);
        waiter.join().unwrap();
        check_drained(&g, 1);
    });
}

#[test]
fn concurrent_admits_respect_n_plus_q() {
    loom::model(|| {
        let g = gate(1, 1);
        let probe = Probe::new(1);
        let outcomes: Vec<_> = (0..2)
            .map(|_| {
                let (g, probe) = (g.clone(), probe.clone());
                thread::spawn(move || match g.admit_blocking_owned(None) {
                    Ok(p) => {
                        probe.hold(&g, p);
                        true
                    }
                    Err(e) => {
                        assert_eq!(e, AdmitError::AtCapacity);
                        false
                    }
                })
            })
            .collect();
        // The main thread admits too: three requests for N + Q = 2 places.
        let mine = match g.try_admit_owned() {
            Ok(p) => {
                probe.hold(&g, p);
                1
            }
            Err(_) => 0,
        };
        let served = outcomes
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|&ok| ok)
            .count();
        let s = g.stats();
        assert_eq!(
            (s.admitted_direct + s.admitted_queued) as usize,
            served + mine
        );
        check_drained(&g, 1);
    });
}

#[test]
fn close_races_a_waiter_and_a_release() {
    loom::model(|| {
        let g = gate(1, 1);
        let p = g.try_admit_owned().unwrap();
        let w = queued(&g);
        let waiter = thread::spawn(move || match block_on(w) {
            Ok(p) => drop(p),
            Err(e) => assert_eq!(e, AdmitError::Closed),
        });
        let releaser = thread::spawn(move || drop(p));
        g.close();
        assert_eq!(g.try_admit().unwrap_err(), loadgate::TryAdmitError::Closed);
        waiter.join().unwrap();
        releaser.join().unwrap();
        check_drained(&g, 1);
    });
}

#[test]
fn raising_the_limit_races_a_release() {
    loom::model(|| {
        let g = gate(1, 2);
        let probe = Probe::new(2);
        let p = g.try_admit_owned().unwrap();
        let w = queued(&g);
        let (g1, pr1) = (g.clone(), probe.clone());
        let waiter = thread::spawn(move || {
            let p = block_on(w).unwrap();
            pr1.hold(&g1, p);
        });
        let g2 = g.clone();
        let raiser = thread::spawn(move || g2.set_limit(2).unwrap());
        probe.hold(&g, p);
        waiter.join().unwrap();
        raiser.join().unwrap();
        check_drained(&g, 2);
    });
}

#[test]
fn a_callback_fires_once_or_is_cancelled() {
    loom::model(|| {
        let g = gate(1, 1);
        let p = g.try_admit_owned().unwrap();
        let fired = Arc::new(AtomicUsize::new(0));
        let f2 = fired.clone();
        let ticket = g.admit_with_callback(Box::new(move |r| {
            f2.fetch_add(1, Ordering::SeqCst);
            drop(r.unwrap());
        }));
        let releaser = thread::spawn(move || drop(p));
        let cancelled = ticket.cancel();
        releaser.join().unwrap();
        assert_eq!(fired.load(Ordering::SeqCst) + usize::from(cancelled), 1);
        drop(ticket);
        check_drained(&g, 1);
    });
}

#[test]
fn a_lock_free_cancel_races_close_and_an_arrival() {
    // The cancel gives the place back without the mutex; close and an
    // arrival under the mutex must neither count the cancelled waiter nor
    // lose the place it gave back.
    loom::model(|| {
        let g = gate(1, 1);
        let p = g.try_admit_owned().unwrap();
        let w = queued(&g);
        let canceller = thread::spawn(move || drop(w));
        let g1 = g.clone();
        let arrival = thread::spawn(move || {
            let mut f = g1.admit_owned();
            let waker = Waker::from(Arc::new(Noop));
            match Pin::new(&mut f).poll(&mut Context::from_waker(&waker)) {
                // Queued behind the slot's holder (the place was free), or
                // refused while the cancelled waiter still held it.
                Poll::Pending => drop(f),
                Poll::Ready(r) => assert_eq!(r.unwrap_err(), AdmitError::AtCapacity),
            }
        });
        canceller.join().unwrap();
        arrival.join().unwrap();
        let s = g.stats();
        assert_eq!((s.queued, s.classes()[0].queued), (0, 0), "{s:?}");
        g.close();
        drop(p);
        check_drained(&g, 1);
        let s = g.stats();
        assert_eq!(s.rejected_closed, 0, "nobody was left to close: {s:?}");
    });
}

#[test]
fn expiry_races_a_release_and_a_cancel() {
    // Two waiters past their deadline: expiry, a release that would hand
    // the slot on and the second waiter's own cancel, all at once. Each
    // waiter ends granted or timed out (the first) or cancelled (the
    // second), and the slot is neither lost nor duplicated.
    loom::model(|| {
        let clock = ManualClock::new();
        let config = GateConfig::new(1)
            .with_queue(2)
            .with_queue_timeout(Some(Duration::from_millis(10)));
        let g = Arc::new(AdmissionGate::with_clock(config, clock.clone()).unwrap());
        let p = g.try_admit_owned().unwrap();
        let first = queued(&g);
        let second = queued(&g);
        clock.advance(Duration::from_millis(10));
        let g1 = g.clone();
        let expirer = thread::spawn(move || {
            g1.expire();
        });
        let releaser = thread::spawn(move || drop(p));
        drop(second);
        match block_on(first) {
            Ok(p) => drop(p),
            Err(e) => assert_eq!(e, AdmitError::QueueTimeout),
        }
        expirer.join().unwrap();
        releaser.join().unwrap();
        check_drained(&g, 1);
    });
}

#[test]
fn a_lifo_handoff_races_the_newest_waiters_cancel_and_a_release() {
    // Adaptive LIFO after an expiry: the next release hands its slot to the
    // newest waiter, while that waiter cancels and a second release hands
    // the other slot on in order. The older waiter is always granted; the
    // newest is granted or cancelled; no slot is lost or duplicated.
    loom::model(|| {
        let clock = ManualClock::new();
        let config = GateConfig::new(2)
            .with_queue(3)
            .with_queue_timeout(Some(Duration::from_millis(10)))
            .with_adaptive_lifo(true);
        let g = Arc::new(AdmissionGate::with_clock(config, clock.clone()).unwrap());
        let p1 = g.try_admit_owned().unwrap();
        let p2 = g.try_admit_owned().unwrap();
        let stale = queued(&g);
        clock.advance(Duration::from_millis(10));
        let older = queued(&g);
        let newest = queued(&g);
        assert_eq!(g.expire(), 1);
        drop(stale);
        let lifo = thread::spawn(move || drop(p1));
        let canceller = thread::spawn(move || drop(newest));
        drop(p2);
        lifo.join().unwrap();
        canceller.join().unwrap();
        let p = block_on(older).expect("two slots for two waiters");
        assert_eq!(g.stats().queued, 0);
        drop(p);
        check_drained(&g, 2);
    });
}

/// A request queued with nobody to tell yet.
fn pending(g: &Arc<AdmissionGate>) -> PendingAdmission {
    match g.admit_pending() {
        Pending::Queued(p) => p,
        Pending::Ready(r) => panic!("expected to queue, got {r:?}"),
    }
}

#[test]
fn an_arm_races_a_release() {
    // The grant comes back from the arm, or through the callback (on the
    // releasing thread, after the arm returned): exactly once.
    loom::model(|| {
        let g = gate(1, 1);
        let p = g.try_admit_owned().unwrap();
        let request = pending(&g);
        let releaser = thread::spawn(move || drop(p));
        let fired = Arc::new(AtomicUsize::new(0));
        let f = Arc::clone(&fired);
        let armed = request.arm(Box::new(move |r| {
            drop(r.expect("granted"));
            f.fetch_add(1, Ordering::SeqCst);
        }));
        releaser.join().unwrap();
        match armed {
            Ok(_ticket) => assert_eq!(fired.load(Ordering::SeqCst), 1),
            Err(outcome) => {
                drop(outcome.expect("granted before the arm"));
                assert_eq!(fired.load(Ordering::SeqCst), 0);
            }
        }
        check_drained(&g, 1);
    });
}

#[test]
fn an_arm_races_close() {
    loom::model(|| {
        let g = gate(1, 1);
        let _p = g.try_admit_owned().unwrap();
        let request = pending(&g);
        let g1 = g.clone();
        let closer = thread::spawn(move || g1.close());
        let fired = Arc::new(AtomicUsize::new(0));
        let f = Arc::clone(&fired);
        let armed = request.arm(Box::new(move |r| {
            assert_eq!(r.unwrap_err(), AdmitError::Closed);
            f.fetch_add(1, Ordering::SeqCst);
        }));
        closer.join().unwrap();
        match armed {
            Ok(_ticket) => assert_eq!(fired.load(Ordering::SeqCst), 1),
            Err(outcome) => {
                assert_eq!(outcome.unwrap_err(), AdmitError::Closed);
                assert_eq!(fired.load(Ordering::SeqCst), 0);
            }
        }
        assert_eq!(g.stats().queued, 0);
    });
}

#[test]
fn close_races_an_arrival_on_its_way_to_the_queue() {
    // An arrival counts itself queued, then pushes its cell: a close
    // between the two must still reject it (close waits for the push).
    loom::model(|| {
        let g = gate(1, 1);
        let p = g.try_admit_owned().unwrap();
        let g1 = g.clone();
        let arrival = thread::spawn(move || match block_on(g1.admit_owned()) {
            Ok(p) => drop(p),
            Err(e) => assert_eq!(e, AdmitError::Closed),
        });
        g.close();
        drop(p);
        arrival.join().unwrap();
        check_drained(&g, 1);
    });
}

fn wait_gate(limit: u32, wait: u32, queue: u32) -> Arc<AdmissionGate> {
    let config = GateConfig::new(limit)
        .with_wait_limit(Some(wait))
        .with_queue(queue);
    Arc::new(AdmissionGate::new(config).unwrap())
}

/// A thread whose admission on a gate with a wait limit must be served
/// (else the model deadlocks): it checks the caps and releases.
fn served_arrival(g: &Arc<AdmissionGate>) -> thread::JoinHandle<()> {
    let g = g.clone();
    thread::spawn(move || {
        let p = block_on(g.admit_owned()).expect("an arrival is served");
        check_wait_caps(&g);
        drop(p);
    })
}

/// At most W without a first response, at most N running.
fn check_wait_caps(g: &AdmissionGate) {
    let s = g.stats();
    assert!(s.waiting <= s.wait_limit.unwrap(), "{s:?}");
    assert!(s.running <= s.limit, "{s:?}");
    assert!(s.in_flight() <= s.limit + s.queue_limit, "{s:?}");
}

#[test]
fn first_response_hands_off_while_a_newcomer_tries_to_barge() {
    loom::model(|| {
        // N = 2, W = 1: the waiter is held back only by the wait slot.
        let g = wait_gate(2, 1, 1);
        let p = g.try_admit_owned().unwrap();
        let w = queued(&g);
        let g1 = g.clone();
        let waiter = thread::spawn(move || {
            let p = block_on(w).expect("a queued waiter is served");
            check_wait_caps(&g1);
            p.first_response();
            drop(p);
        });
        let responder = thread::spawn(move || {
            p.first_response();
            p.first_response(); // idempotent
            drop(p);
        });
        // A newcomer: admitted only once the queue drained and a wait slot
        // is free.
        if let Ok(p) = g.try_admit_owned() {
            check_wait_caps(&g);
            drop(p);
        }
        waiter.join().unwrap();
        responder.join().unwrap();
        let s = g.stats();
        assert_eq!(s.admitted_queued, 1, "{s:?}");
        assert_eq!(s.waiting, 0, "{s:?}");
        check_drained(&g, 1);
    });
}

#[test]
fn first_response_races_a_cancel_without_losing_a_wait_slot() {
    loom::model(|| {
        let g = wait_gate(2, 1, 1);
        let p = g.try_admit_owned().unwrap();
        let w = queued(&g);
        let canceller = thread::spawn(move || drop(w));
        let responder = thread::spawn(move || {
            p.first_response();
            p
        });
        canceller.join().unwrap();
        let p = responder.join().unwrap();
        let s = g.stats();
        // Either it left the queue first, or it was granted both slots and
        // gave them back; never both, never neither.
        assert_eq!(s.cancelled + s.admitted_queued, 1, "{s:?}");
        assert_eq!((s.running, s.waiting, s.queued), (1, 0, 0), "{s:?}");
        drop(p);
        let all: Vec<_> = (0..2).map(|_| g.try_admit_owned()).collect();
        assert!(all[0].is_ok() && all[1].is_err(), "W = 1 admits one");
        drop(all);
        check_drained(&g, 1);
    });
}

#[test]
fn a_release_still_waiting_races_a_blocking_waiter() {
    loom::model(|| {
        let g = wait_gate(1, 1, 1);
        let p = g.try_admit_owned().unwrap();
        let g1 = g.clone();
        let waiter = thread::spawn(move || {
            // Direct if the release came first, else queued and handed both.
            let p = g1.admit_blocking_owned(None).unwrap();
            check_wait_caps(&g1);
            assert!(p.is_waiting());
        });
        drop(p); // never responded: frees both slots
        waiter.join().unwrap();
        assert_eq!(g.stats().waiting, 0);
        check_drained(&g, 1);
    });
}

#[test]
fn a_first_response_races_an_arrival() {
    loom::model(|| {
        // N = 2, W = 1: the arrival is held back by the wait slot alone. It
        // counts itself while the wait slot is freed; one of the two finds
        // the other (`gate/wait.rs`, the pairing).
        let g = wait_gate(2, 1, 1);
        let p = g.try_admit_owned().unwrap();
        let arrival = served_arrival(&g);
        p.first_response();
        arrival.join().unwrap();
        drop(p);
        assert_eq!(g.stats().waiting, 0);
        check_drained(&g, 1);
    });
}

#[test]
fn a_handoff_without_a_wait_slot_races_a_first_response() {
    loom::model(|| {
        // N = 2, W = 1. `a` holds a request slot, `b` a request slot and the
        // wait slot; one waiter. Releasing `a` reserves its slot for the
        // waiter, finds no wait slot and gives the slot back, while `b`'s
        // first response frees the wait slot and finds no request slot.
        let g = wait_gate(2, 1, 1);
        let a = g.try_admit_owned().unwrap();
        a.first_response();
        let b = g.try_admit_owned().unwrap();
        let w = queued(&g);
        let g1 = g.clone();
        let waiter = thread::spawn(move || {
            let p = block_on(w).expect("a queued waiter is served");
            check_wait_caps(&g1);
            drop(p);
        });
        let releaser = thread::spawn(move || drop(a));
        b.first_response();
        releaser.join().unwrap();
        waiter.join().unwrap();
        drop(b);
        let s = g.stats();
        assert_eq!((s.admitted_queued, s.waiting), (1, 0), "{s:?}");
        check_drained(&g, 1);
    });
}

#[test]
fn a_direct_admissions_wait_reservation_races_an_arrival() {
    loom::model(|| {
        // N = 2, W = 1, one request slot held without a wait slot. `try_admit`
        // reserves the wait slot, then takes a request slot unless someone
        // counted in meanwhile; the other arrival may find the wait slot
        // reserved and queue. Whichever way, both are served in turn.
        let g = wait_gate(2, 1, 1);
        let held = g.try_admit_owned().unwrap();
        held.first_response();
        let arrival = served_arrival(&g);
        if let Ok(p) = g.try_admit_owned() {
            check_wait_caps(&g);
            drop(p);
        }
        arrival.join().unwrap();
        drop(held);
        assert_eq!(g.stats().waiting, 0);
        check_drained(&g, 1);
    });
}

// ----- priority classes ----------------------------------------------------

fn queued_at(g: &Arc<AdmissionGate>, priority: u8) -> AdmitOwned {
    let mut f = g.admit_owned_at(priority);
    let waker = Waker::from(Arc::new(Noop));
    assert!(Pin::new(&mut f)
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    f
}

#[test]
fn displacement_races_a_release() {
    loom::model(|| {
        // N = 1, Q = 1, two classes: a class-1 waiter is either handed the
        // released slot or displaced by a class-0 arrival, never both or
        // neither, and the arrival ends up with the slot either way.
        let g =
            Arc::new(AdmissionGate::new(GateConfig::new(1).with_queue(1).with_classes(2)).unwrap());
        let p = g.try_admit_owned_at(0).unwrap();
        let low = queued_at(&g, 1);
        let g1 = g.clone();
        let arrival = thread::spawn(move || {
            let p = block_on(g1.admit_owned_at(0)).expect("class 0 is served");
            check_caps(&g1);
            drop(p);
        });
        // The low waiter: granted (then released) or displaced.
        let low = thread::spawn(move || {
            let low = block_on(low);
            if let Err(e) = &low {
                assert_eq!(*e, AdmitError::Displaced);
            }
            low.is_ok()
        });
        // Releases on the model's own thread, which never parks: a late
        // wake of a thread that parked once is harmless, but loom takes
        // it for the end of a join it is blocked in.
        drop(p);
        let granted = low.join().unwrap();
        arrival.join().unwrap();
        let s = g.stats();
        assert_eq!(s.displaced + u64::from(granted), 1, "{s:?}");
        assert_eq!(
            s.admitted_queued + s.admitted_direct,
            2 + u64::from(granted),
            "{s:?}"
        );
        check_drained(&g, 1);
    });
}

#[test]
fn a_reserved_slot_races_a_handoff_to_a_less_important_class() {
    loom::model(|| {
        // N = 2, the last slot reserved for class 0: class 1 never runs
        // more than one, whatever the interleaving of a class-1 handoff and
        // a class-0 admission.
        let config = GateConfig::new(2).with_queue(1).with_classes(2).with_class(
            0,
            loadgate::ClassConfig {
                queue: 1,
                queue_timeout: None,
                reserved: 1,
            },
        );
        let g = Arc::new(AdmissionGate::new(config).unwrap());
        let class1 = Probe::new(1);
        let p = g.try_admit_owned_at(1).unwrap();
        class1.running.fetch_add(1, Ordering::SeqCst);
        let low = queued_at(&g, 1);
        let (g1, pr) = (g.clone(), class1.clone());
        let waiter = thread::spawn(move || {
            let p = block_on(low).expect("class 1 gets its slot back");
            pr.hold(&g1, p);
        });
        let g1 = g.clone();
        let top = thread::spawn(move || {
            // The reserved slot is free whatever class 1 does.
            let p = g1.try_admit_owned_at(0).expect("the reserved slot");
            check_caps(&g1);
            drop(p);
        });
        // The release, on the model's thread (see `displacement_races_a_release`).
        class1.running.fetch_sub(1, Ordering::SeqCst);
        drop(p);
        waiter.join().unwrap();
        top.join().unwrap();
        check_drained(&g, 2);
        let s = g.stats();
        assert_eq!((s.running, s.queued), (0, 0), "{s:?}");
    });
}

fn two_classes(limit: u32, queue: u32) -> Arc<AdmissionGate> {
    Arc::new(AdmissionGate::new(GateConfig::new(limit).with_queue(queue).with_classes(2)).unwrap())
}

#[test]
fn an_arrival_counting_itself_races_a_release() {
    loom::model(|| {
        // N = 1: the arrival counts itself in the total, then in its class,
        // while the slot is freed; whichever it sees, it gets the slot.
        let g = two_classes(1, 1);
        let p = g.try_admit_owned_at(1).unwrap();
        let g1 = g.clone();
        let arrival = thread::spawn(move || {
            let p = block_on(g1.admit_owned_at(0)).expect("the freed slot is found");
            check_caps(&g1);
            drop(p);
        });
        // The release, on the model's thread (see `displacement_races_a_release`).
        drop(p);
        arrival.join().unwrap();
        check_drained(&g, 1);
    });
}

#[test]
fn a_cancel_races_a_handoff_between_classes() {
    loom::model(|| {
        // N = 1, Q = 2: the class-0 waiter leaves while the slot is freed;
        // the class-1 waiter gets it, directly or after class 0 passed it on.
        let g = two_classes(1, 2);
        let p = g.try_admit_owned_at(0).unwrap();
        let top = queued_at(&g, 0);
        let low = queued_at(&g, 1);
        let canceller = thread::spawn(move || drop(top));
        let g1 = g.clone();
        let waiter = thread::spawn(move || {
            let p = block_on(low).expect("class 1 is served");
            check_caps(&g1);
            drop(p);
        });
        // The release, on the model's thread (see `displacement_races_a_release`).
        drop(p);
        canceller.join().unwrap();
        waiter.join().unwrap();
        let s = g.stats();
        assert_eq!(s.cancelled + s.admitted_queued, 2, "{s:?}");
        check_drained(&g, 1);
    });
}

#[test]
fn a_displacement_races_its_victims_cancel() {
    loom::model(|| {
        // N = 1, Q = 1: a class-0 arrival finds the queue full of one
        // class-1 waiter, which leaves meanwhile; the arrival queues
        // either way (displacing it or taking its place) and is served.
        let g = two_classes(1, 1);
        let p = g.try_admit_owned_at(0).unwrap();
        let low = queued_at(&g, 1);
        let g1 = g.clone();
        let arrival = thread::spawn(move || {
            let p = block_on(g1.admit_owned_at(0)).expect("class 0 is served");
            check_caps(&g1);
            drop(p);
        });
        drop(low);
        let s = g.stats();
        assert!(s.displaced + s.cancelled <= 1, "{s:?}");
        check_caps(&g);
        drop(p);
        arrival.join().unwrap();
        let s = g.stats();
        assert_eq!(s.displaced + s.cancelled, 1, "{s:?}");
        check_drained(&g, 1);
    });
}
