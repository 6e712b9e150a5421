//! Loom models of the admission gate with one class and no wait limit:
//! every interleaving (up to the preemption bound) of admit, release,
//! cancel, handoff, expiry, adaptive LIFO, the two-step admission,
//! set_limit and close among 2–3 threads, with N and Q of 1–2, on the
//! lock-free queue (`gate/queue.rs`). Each model checks: at most N running
//! and N + Q in flight at every step (read from the state word and from an
//! independent counter), FIFO among waiters, no slot lost or duplicated (a
//! fresh admit finds every slot at the end), and every waiter resolved. The
//! counted protocol (a wait limit, priority classes) has its models in
//! `loom_gate_counted.rs`.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p loadgate
//! --release --test loom_gate --test loom_gate_counted`
#![cfg(loom)]

#[path = "support/loom_gate.rs"]
mod models;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use loadgate::{AdmissionGate, AdmitError, GateConfig, ManualClock, Pending, PendingAdmission};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

use models::*;

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
