//! Loom models of the gate's counted protocol (`gate/classes.rs`,
//! `gate/wait.rs`): six with a wait limit W of 1 (with first responses),
//! and seven with two priority classes (displacement, a reserved slot, an
//! arrival counting itself while a slot is freed, a cancel racing a handoff
//! between classes, a displacement racing its victim's cancel, a slot
//! passed by a release racing a close, two releases passing slots at once). The checks
//! are those of `loom_gate.rs`, plus at most W admitted without a first
//! response.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p loadgate
//! --release --test loom_gate_counted`
#![cfg(loom)]

#[path = "support/loom_gate.rs"]
mod models;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};

use loadgate::{AdmissionGate, AdmitError, AdmitOwned, GateConfig};
use loom::sync::atomic::Ordering;
use loom::thread;

use models::*;

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

#[test]
fn a_passed_slot_races_a_close() {
    loom::model(|| {
        // N = 1: the release passes its slot to the class-1 waiter while
        // the gate closes; the waiter is either granted (then releases) or
        // refused as closed, and the slot is neither kept nor lost.
        let g = two_classes(1, 1);
        let p = g.try_admit_owned_at(0).unwrap();
        let low = queued_at(&g, 1);
        let g1 = g.clone();
        let closer = thread::spawn(move || g1.close());
        let waiter = thread::spawn(move || match block_on(low) {
            Ok(p) => drop(p),
            Err(e) => assert_eq!(e, AdmitError::Closed),
        });
        // The release, on the model's thread (see `displacement_races_a_release`).
        drop(p);
        closer.join().unwrap();
        waiter.join().unwrap();
        check_drained(&g, 1);
    });
}

#[test]
fn two_releases_pass_their_slots_to_two_classes() {
    loom::model(|| {
        // N = 2, a waiter in each class: two releases at once each pass a
        // slot on; each waiter is served once and never more than N run.
        let g = two_classes(2, 2);
        let (p0, p1) = (
            g.try_admit_owned_at(0).unwrap(),
            g.try_admit_owned_at(1).unwrap(),
        );
        let (top, low) = (queued_at(&g, 0), queued_at(&g, 1));
        let g1 = g.clone();
        let waiter = thread::spawn(move || {
            let top = block_on(top).expect("class 0 is served");
            let low = block_on(low).expect("class 1 is served");
            let s = g1.stats();
            assert_eq!((s.running, s.queued), (2, 0), "{s:?}");
            drop((top, low));
        });
        let releaser = thread::spawn(move || drop(p1));
        // The other release, on the model's thread (see `displacement_races_a_release`).
        drop(p0);
        releaser.join().unwrap();
        waiter.join().unwrap();
        assert_eq!(g.stats().admitted_queued, 2);
        check_drained(&g, 2);
    });
}
