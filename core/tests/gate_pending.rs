//! Admission in two steps (`admit_pending`, then `arm`): the outcome comes
//! back as a value when the request was decided before the arm, through the
//! callback exactly once otherwise, and never both; an unarmed request
//! dropped leaves the queue or gives its slot back.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loadgate::{
    AdmissionGate, AdmitCallback, AdmitError, GateConfig, ManualClock, OwnedPermit, Pending,
    PendingAdmission,
};

mod support;
use support::gates::gate;

/// A callback that stores its outcome, and where it stores it.
type Fired = Arc<Mutex<Vec<Result<OwnedPermit, AdmitError>>>>;

fn recorder() -> (Fired, AdmitCallback) {
    let fired: Fired = Arc::default();
    let f = Arc::clone(&fired);
    (fired, Box::new(move |r| f.lock().unwrap().push(r)))
}

fn queued(p: Pending) -> PendingAdmission {
    match p {
        Pending::Queued(q) => q,
        Pending::Ready(r) => panic!("expected to queue, got {r:?}"),
    }
}

#[test]
fn a_request_decided_at_once_is_ready() {
    let g = gate(1, 0);
    let Pending::Ready(Ok(p)) = g.admit_pending() else {
        panic!("a free slot admits at once")
    };
    let Pending::Ready(Err(e)) = g.admit_pending() else {
        panic!("no slot and no queue rejects at once")
    };
    assert_eq!(e, AdmitError::AtCapacity);
    drop(p);
    g.close();
    assert!(matches!(
        g.admit_pending(),
        Pending::Ready(Err(AdmitError::Closed))
    ));
}

#[test]
fn an_armed_request_is_told_through_its_callback_once() {
    let g = gate(1, 1);
    let held = g.try_admit_owned().unwrap();
    let pending = queued(g.admit_pending());
    let (fired, callback) = recorder();
    let ticket = pending.arm(callback).expect("still queued when armed");
    assert!(ticket.is_queued());
    assert!(
        fired.lock().unwrap().is_empty(),
        "not before a slot is free"
    );
    drop(held);
    let outcome = fired.lock().unwrap().pop().expect("told once");
    let permit = outcome.expect("granted");
    assert!(fired.lock().unwrap().is_empty());
    assert_eq!((g.running(), g.queued()), (1, 0));
    drop(permit);
    assert_eq!(g.stats().admitted_queued, 1);
}

#[test]
fn a_request_granted_before_its_arm_comes_back_as_a_value() {
    let g = gate(1, 1);
    let held = g.try_admit_owned().unwrap();
    let pending = queued(g.admit_pending());
    drop(held); // the slot goes to the queued request, which nobody is told of yet
    assert_eq!((g.running(), g.queued()), (1, 0));
    let calls = Arc::new(AtomicU32::new(0));
    let c = Arc::clone(&calls);
    let outcome = pending
        .arm(Box::new(move |_| {
            c.fetch_add(1, Ordering::Relaxed);
        }))
        .expect_err("granted before the arm");
    let permit = outcome.expect("the grant");
    assert_eq!(
        calls.load(Ordering::Relaxed),
        0,
        "the callback is never called"
    );
    drop(permit);
    assert_eq!((g.running(), g.queued()), (0, 0));
}

#[test]
fn a_request_rejected_before_its_arm_comes_back_as_a_value() {
    let clock = ManualClock::new();
    let config = GateConfig::new(1)
        .with_queue(2)
        .with_queue_timeout(Some(Duration::from_millis(10)));
    let g = Arc::new(AdmissionGate::with_clock(config, clock.clone()).unwrap());
    let _held = g.try_admit_owned().unwrap();
    let expiring = queued(g.admit_pending());
    clock.advance(Duration::from_millis(10));
    let closing = queued(g.admit_pending());
    assert_eq!(g.expire(), 1);
    let (fired, callback) = recorder();
    let outcome = expiring.arm(callback).expect_err("expired before the arm");
    assert_eq!(outcome.unwrap_err(), AdmitError::QueueTimeout);
    g.close();
    let (also_fired, callback) = recorder();
    assert_eq!(
        closing.arm(callback).unwrap_err().unwrap_err(),
        AdmitError::Closed
    );
    assert!(fired.lock().unwrap().is_empty() && also_fired.lock().unwrap().is_empty());
    assert_eq!(g.queued(), 0);
}

#[test]
fn dropping_an_unarmed_request_cancels_it_or_gives_its_slot_back() {
    let g = gate(1, 2);
    let held = g.try_admit_owned().unwrap();
    let left = queued(g.admit_pending());
    drop(left);
    assert_eq!(g.queued(), 0);
    assert_eq!(g.stats().cancelled, 1);
    let granted = queued(g.admit_pending());
    drop(held);
    assert_eq!(g.running(), 1, "granted to the unarmed request");
    drop(granted);
    assert_eq!((g.running(), g.queued()), (0, 0));
    assert!(g.try_admit().is_ok(), "the slot came back");
}

#[test]
fn an_armed_request_can_be_cancelled_by_its_ticket() {
    let g = gate(1, 1);
    let held = g.try_admit_owned().unwrap();
    let (fired, callback) = recorder();
    let ticket = queued(g.admit_pending()).arm(callback).unwrap();
    assert!(ticket.cancel());
    assert_eq!(g.queued(), 0);
    drop(held);
    assert!(
        fired.lock().unwrap().is_empty(),
        "a cancelled callback is never called"
    );
    assert_eq!(g.running(), 0);
}

#[test]
fn an_arm_racing_a_release_tells_the_outcome_exactly_once() {
    // Another thread releases the slot while this one arms: the grant comes
    // back from the arm or through the callback, never both, never lost.
    let g = gate(1, 1);
    let (mut through_arm, mut through_callback) = (0, 0);
    for _ in 0..20_000 {
        let held = g.try_admit_owned().unwrap();
        let pending = queued(g.admit_pending());
        let releaser = std::thread::spawn(move || drop(held));
        let (fired, callback) = recorder();
        let permit = match pending.arm(callback) {
            Err(outcome) => {
                through_arm += 1;
                outcome.unwrap()
            }
            Ok(_ticket) => {
                releaser.join().unwrap();
                through_callback += 1;
                let mut fired = fired.lock().unwrap();
                assert_eq!(fired.len(), 1);
                fired.pop().unwrap().unwrap()
            }
        };
        drop(permit);
        assert_eq!((g.running(), g.queued()), (0, 0));
    }
    assert!(through_arm + through_callback == 20_000);
}
