//! The blocking and callback forms across real threads: timeouts, handoff,
//! close and set_limit waking blocked threads, a waiter enforcing its own
//! queue deadline, and callbacks fired from the thread that frees a slot.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use loadgate::{AdmissionGate, AdmitError, GateConfig};

mod support;
use support::gates::gate;

fn wait_until(cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "condition never held"
        );
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_blocking_wait_times_out_and_leaves_the_queue() {
    let g = gate(1, 1);
    let _p = g.admit_blocking(None).unwrap();
    let start = Instant::now();
    let e = g
        .admit_blocking(Some(Duration::from_millis(30)))
        .unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(30));
    assert_eq!(e, AdmitError::TimedOut);
    assert_eq!(e.reason(), loadgate::Reason::QueueTimeout);
    let s = g.stats();
    assert_eq!((s.queued, s.cancelled, s.rejected_total()), (0, 1, 0));
    // A zero timeout still queues for an instant and leaves cleanly.
    assert_eq!(
        g.admit_blocking(Some(Duration::ZERO)).unwrap_err(),
        AdmitError::TimedOut
    );
    assert_eq!(g.stats().queued, 0);
}

#[test]
fn a_blocked_thread_is_granted_by_a_release_on_another_thread() {
    let g = gate(1, 1);
    let p = g.admit_blocking_owned(None).unwrap();
    let g2 = g.clone();
    let waiter = thread::spawn(move || g2.admit_blocking(Some(Duration::from_secs(10))).map(drop));
    wait_until(|| g.queued() == 1);
    thread::spawn(move || drop(p)).join().unwrap();
    waiter.join().unwrap().unwrap();
    let s = g.stats();
    assert_eq!((s.running, s.admitted_queued), (0, 1));
}

#[test]
fn blocked_threads_are_served_in_arrival_order() {
    let g = gate(1, 4);
    let p = g.admit_blocking_owned(None).unwrap();
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for i in 0..4 {
        let g2 = g.clone();
        let tx = tx.clone();
        threads.push(thread::spawn(move || {
            let p = g2.admit_blocking(None).unwrap();
            tx.send(i).unwrap();
            drop(p);
        }));
        wait_until(|| g.queued() == i + 1);
    }
    drop(p);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(rx.try_iter().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
}

#[test]
fn a_blocked_waiter_enforces_its_own_queue_deadline() {
    let config = GateConfig::new(1)
        .with_queue(2)
        .with_queue_timeout(Some(Duration::from_millis(40)));
    let g = AdmissionGate::new(config).unwrap();
    let _p = g.admit_blocking(None).unwrap();
    let start = Instant::now();
    // Nobody calls expire(): the waiting thread wakes at its deadline.
    let e = g.admit_blocking(None).unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(40));
    assert_eq!(e, AdmitError::QueueTimeout);
    let s = g.stats();
    assert_eq!((s.queued, s.expired), (0, 1));
}

#[test]
fn close_wakes_every_blocked_thread() {
    let g = gate(1, 3);
    let p = g.admit_blocking_owned(None).unwrap();
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let g = g.clone();
            thread::spawn(move || g.admit_blocking(None).map(drop))
        })
        .collect();
    wait_until(|| g.queued() == 3);
    g.close();
    for t in threads {
        assert_eq!(t.join().unwrap().unwrap_err(), AdmitError::Closed);
    }
    drop(p);
    assert_eq!(g.stats().running, 0);
}

#[test]
fn raising_the_limit_wakes_blocked_threads() {
    let g = gate(1, 3);
    let p = g.admit_blocking_owned(None).unwrap();
    let gate_open = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let g = g.clone();
            let b = gate_open.clone();
            thread::spawn(move || {
                let p = g.admit_blocking(None).unwrap();
                b.wait(); // all three hold a slot at once
                drop(p);
            })
        })
        .collect();
    wait_until(|| g.queued() == 3);
    g.set_limit(4).unwrap();
    gate_open.wait();
    for t in threads {
        t.join().unwrap();
    }
    drop(p);
    assert_eq!(g.stats().running, 0);
}

#[test]
fn a_callback_fires_on_the_thread_that_frees_the_slot() {
    let g = gate(1, 1);
    let p = g.admit_blocking_owned(None).unwrap();
    let (tx, rx) = mpsc::channel();
    let ticket = g.admit_with_callback(Box::new(move |r| {
        tx.send((thread::current().id(), r.map(drop))).unwrap();
    }));
    assert!(ticket.is_queued());
    let releaser = thread::spawn(move || {
        drop(p);
        thread::current().id()
    });
    let releaser_id = releaser.join().unwrap();
    let (fired_on, result) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(fired_on, releaser_id);
    result.unwrap();
    assert!(rx.try_recv().is_err(), "exactly once");
    assert!(!ticket.cancel());
}

#[test]
fn racing_cancels_and_releases_fire_each_callback_at_most_once() {
    for _ in 0..200 {
        let g = gate(1, 1);
        let p = g.admit_blocking_owned(None).unwrap();
        let fired = Arc::new(AtomicU32::new(0));
        let f2 = fired.clone();
        let ticket = g.admit_with_callback(Box::new(move |r| {
            f2.fetch_add(1, Ordering::SeqCst);
            drop(r.unwrap());
        }));
        let releaser = thread::spawn(move || drop(p));
        let cancelled = ticket.cancel();
        releaser.join().unwrap();
        assert_eq!(fired.load(Ordering::SeqCst) + u32::from(cancelled), 1);
        let s = g.stats();
        assert_eq!((s.running, s.queued), (0, 0));
    }
}
