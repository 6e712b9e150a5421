//! Priority classes (docs/behaviour.md#priority-classes): a freed slot goes
//! to the most important class with a waiter, reserved slots, per-class
//! queue limits and deadlines, displacement from a full queue, sheddable
//! classes, and `N + Q` exact whatever the mix, under threads too.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use loadgate::{
    AdmissionGate, AdmitError, ClassConfig, ConfigError, GateConfig, ManualClock, Reason,
    TryAdmitError,
};

mod support;
use support::polling::{direct_at, granted, outcome, poll, queued_at};

fn class(queue: u32, reserved: u32) -> ClassConfig {
    ClassConfig {
        queue,
        queue_timeout: None,
        reserved,
    }
}

fn gate(config: GateConfig) -> Arc<AdmissionGate> {
    Arc::new(AdmissionGate::new(config).unwrap())
}

#[test]
fn a_freed_slot_goes_to_the_most_important_class_first_then_fifo() {
    let g = gate(GateConfig::new(1).with_queue(8).with_classes(3));
    let p = direct_at(&g, 2);
    let mut low_a = queued_at(&g, 2);
    let mut mid = queued_at(&g, 1);
    let mut high_a = queued_at(&g, 0);
    let mut high_b = queued_at(&g, 0);
    let mut low_b = queued_at(&g, 2);
    let mut order = [&mut high_a, &mut high_b, &mut mid, &mut low_a, &mut low_b];
    drop(p);
    for i in 0..order.len() {
        let permit = granted(order[i]);
        // Every later waiter is still queued until this one releases.
        for later in order.iter_mut().skip(i + 1) {
            assert_eq!(outcome(later), None, "waiter {i} went first");
        }
        assert_eq!(g.stats().queued, 4 - i as u32);
        drop(permit);
    }
}

#[test]
fn an_arrival_of_a_more_important_class_queues_ahead_but_never_barges() {
    let g = gate(GateConfig::new(1).with_queue(4).with_classes(2));
    let p = direct_at(&g, 1);
    let mut low = queued_at(&g, 1);
    // No slot is free: class 0 waits too, ahead of class 1.
    assert_eq!(g.try_admit_at(0).err(), Some(TryAdmitError::WouldWait));
    let mut high = queued_at(&g, 0);
    drop(p);
    let _p = granted(&mut high);
    assert_eq!(outcome(&mut low), None);
}

#[test]
fn reserved_slots_go_only_to_the_classes_they_are_reserved_for() {
    // N = 4; the last slot is for class 0 only, the last 2 for classes 0
    // and 1: class 1 may use 3 slots, class 2 may use 2.
    let g = gate(
        GateConfig::new(4)
            .with_queue(4)
            .with_classes(3)
            .with_class(0, class(4, 1))
            .with_class(1, class(4, 2)),
    );
    let held: Vec<_> = (0..2).map(|_| direct_at(&g, 2)).collect();
    let mut low = queued_at(&g, 2);
    // Class 1 may take the third slot although class 2 waits: it is not
    // class 2's to have.
    let mid = g
        .try_admit_owned_at(1)
        .expect("a slot within class 1's share");
    let mut mid_waiting = queued_at(&g, 1);
    let top = direct_at(&g, 0);
    assert_eq!(g.stats().running, 4);
    // The last slot, freed, stays free for class 0: class 1 already has 3.
    drop(top);
    assert_eq!(outcome(&mut mid_waiting), None);
    assert_eq!(g.stats().running, 3);
    // A slot within class 1's share goes to the class-1 waiter.
    drop(mid);
    let mid2 = granted(&mut mid_waiting);
    assert_eq!(outcome(&mut low), None);
    drop(mid2);
    assert_eq!(outcome(&mut low), None, "2 still run: no room for class 2");
    drop(held);
    assert_eq!(outcome(&mut low), Some(Ok(())));
}

#[test]
fn a_full_queue_displaces_the_newest_waiter_of_the_least_important_class_below() {
    let g = gate(GateConfig::new(1).with_queue(3).with_classes(3));
    let p = direct_at(&g, 0);
    let mut mid = queued_at(&g, 1);
    let mut low_old = queued_at(&g, 2);
    let mut low_new = queued_at(&g, 2);
    // Full: a class-0 arrival displaces the newest class-2 waiter.
    let mut high = queued_at(&g, 0);
    assert_eq!(outcome(&mut low_new), Some(Err(AdmitError::Displaced)));
    assert_eq!(outcome(&mut low_old), None);
    // A class-2 arrival displaces nobody (nobody below it) and is rejected.
    let mut low = g.admit_owned_at(2);
    assert_eq!(outcome(&mut low), Some(Err(AdmitError::AtCapacity)));
    // A class-1 arrival displaces the remaining class-2 waiter, not class 1.
    let mid_new = queued_at(&g, 1);
    assert_eq!(outcome(&mut low_old), Some(Err(AdmitError::Displaced)));
    // Now nobody is below class 1: another class-1 arrival is rejected.
    let mut more = g.admit_owned_at(1);
    assert_eq!(outcome(&mut more), Some(Err(AdmitError::AtCapacity)));
    let s = g.stats();
    assert_eq!((s.running, s.queued), (1, 3), "N + Q exact");
    assert_eq!(s.displaced, 2);
    assert_eq!(s.classes()[2].displaced, 2);
    assert_eq!(s.classes()[2].rejected_at_capacity, 1);
    assert_eq!(s.classes()[1].rejected_at_capacity, 1);
    assert_eq!(s.rejected(Reason::Displaced), 2);
    assert_eq!(s.rejected_total(), 4);
    drop(p);
    let _high = granted(&mut high);
    assert_eq!(outcome(&mut mid), None);
    drop(mid_new);
}

#[test]
fn displaced_is_an_overload_with_its_own_reason() {
    let e = AdmitError::Displaced;
    assert_eq!(e.reason(), Reason::Displaced);
    assert_eq!(Reason::Displaced.as_str(), "displaced");
    assert!(Reason::Displaced.is_overload());
    assert_eq!(Reason::from_name("displaced"), Some(Reason::Displaced));
    assert!(e.to_string().starts_with("Server overloaded"));
}

#[test]
fn a_class_with_no_queue_is_shed_when_its_share_is_full() {
    let g = gate(
        GateConfig::new(2)
            .with_queue(4)
            .with_classes(2)
            .with_class(1, class(0, 0)),
    );
    let a = direct_at(&g, 1);
    let b = direct_at(&g, 1);
    let mut shed = g.admit_owned_at(1);
    assert_eq!(outcome(&mut shed), Some(Err(AdmitError::AtCapacity)));
    let _waits = queued_at(&g, 0);
    // It displaces nobody and never waits, even with the queue not full.
    assert!(matches!(
        poll(&mut g.admit_owned_at(1)),
        Poll::Ready(Err(AdmitError::AtCapacity))
    ));
    assert_eq!(g.stats().classes()[1].rejected_at_capacity, 2);
    drop((a, b));
}

#[test]
fn each_class_has_its_own_queue_limit_within_the_whole_queue() {
    let g = gate(
        GateConfig::new(1)
            .with_queue(3)
            .with_classes(2)
            .with_class(1, class(1, 0)),
    );
    let p = direct_at(&g, 0);
    let _low = queued_at(&g, 1);
    // Class 1's own queue is full although the whole queue is not.
    let mut low = g.admit_owned_at(1);
    assert_eq!(outcome(&mut low), Some(Err(AdmitError::AtCapacity)));
    let _a = queued_at(&g, 0);
    let _b = queued_at(&g, 0);
    assert_eq!(g.stats().classes()[0].queued, 2);
    assert_eq!(g.stats().classes()[1].queued, 1);
    drop(p);
}

#[test]
fn each_class_expires_at_its_own_deadline() {
    let clock = ManualClock::new();
    let config = GateConfig::new(1)
        .with_queue(4)
        .with_classes(2)
        .with_class(
            0,
            ClassConfig {
                queue: 4,
                queue_timeout: Some(Duration::from_millis(100)),
                reserved: 0,
            },
        )
        .with_class(
            1,
            ClassConfig {
                queue: 4,
                queue_timeout: Some(Duration::from_millis(10)),
                reserved: 0,
            },
        );
    let g = Arc::new(AdmissionGate::with_clock(config, clock.clone()).unwrap());
    let p = direct_at(&g, 0);
    let mut high = queued_at(&g, 0);
    let mut low = queued_at(&g, 1);
    assert_eq!(g.time_to_next_deadline(), Some(Duration::from_millis(10)));
    clock.advance(Duration::from_millis(9));
    assert_eq!(g.expire(), 0);
    clock.advance(Duration::from_millis(1));
    assert_eq!(g.expire(), 1, "exactly at the deadline");
    assert_eq!(outcome(&mut low), Some(Err(AdmitError::QueueTimeout)));
    assert_eq!(g.time_to_next_deadline(), Some(Duration::from_millis(90)));
    clock.advance(Duration::from_millis(90));
    assert_eq!(g.expire(), 1);
    assert_eq!(outcome(&mut high), Some(Err(AdmitError::QueueTimeout)));
    let s = g.stats();
    assert_eq!((s.classes()[0].expired, s.classes()[1].expired), (1, 1));
    drop(p);
}

#[test]
fn a_priority_past_the_last_class_is_the_last_class() {
    let g = gate(GateConfig::new(1).with_queue(2).with_classes(2));
    let p = direct_at(&g, 255);
    let mut last = queued_at(&g, 9);
    let mut first = queued_at(&g, 0);
    drop(p);
    let _first = granted(&mut first);
    assert_eq!(outcome(&mut last), None);
    assert_eq!(g.stats().classes()[1].queued, 1);
}

#[test]
fn blocking_waits_and_callbacks_take_a_class_too() {
    let g = gate(GateConfig::new(1).with_queue(2).with_classes(2));
    let p = g.admit_blocking_owned_at(1, None).unwrap();
    let fired = Arc::new(AtomicU32::new(u32::MAX));
    let f = fired.clone();
    let ticket = g.admit_with_callback_at(
        1,
        Box::new(move |r| {
            f.store(u32::from(r.is_ok()), Ordering::SeqCst);
        }),
    );
    assert!(ticket.is_queued());
    std::thread::scope(|s| {
        let waiter = s.spawn(|| g.admit_blocking_at(0, None).map(drop));
        // Wait (generously) until the thread has queued ahead of the callback.
        let start = std::time::Instant::now();
        while g.stats().classes()[0].queued == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "thread never queued"
            );
            std::thread::yield_now();
        }
        drop(p);
        assert_eq!(waiter.join().unwrap(), Ok(()));
    });
    // The class-0 thread went first and released; then the callback.
    assert_eq!(fired.load(Ordering::SeqCst), 1);
}

#[test]
fn class_settings_are_checked() {
    let bad = |c: GateConfig| AdmissionGate::new(c).err();
    assert!(matches!(
        bad(GateConfig::new(2).with_queue(4).with_class(0, class(5, 0))),
        Some(ConfigError::InvalidClass {
            index: 0,
            field: "queue",
            value: 5,
            max: 4
        })
    ));
    assert!(matches!(
        bad(GateConfig::new(2).with_queue(4).with_class(1, class(1, 3))),
        Some(ConfigError::InvalidClass {
            index: 1,
            field: "reserved",
            value: 3,
            max: 2
        })
    ));
    let msg = bad(GateConfig::new(2).with_queue(4).with_class(1, class(1, 3)))
        .unwrap()
        .to_string();
    assert!(msg.contains("class 1") && msg.contains("reserved"), "{msg}");
    assert!(matches!(
        bad(GateConfig::new(2).with_classes(9)),
        Some(ConfigError::OutOfRange {
            field: "classes",
            value: 9,
            max: 8
        })
    ));
    assert!(matches!(
        bad(GateConfig::new(2).with_class(9, class(1, 0))),
        Some(ConfigError::OutOfRange {
            field: "classes",
            ..
        })
    ));
    assert_eq!(AdmissionGate::new(GateConfig::new(1)).unwrap().classes(), 1);
    assert_eq!(
        AdmissionGate::new(GateConfig::new(1).with_classes(8))
            .unwrap()
            .classes(),
        8
    );
}

#[test]
fn metrics_show_each_class() {
    let g = gate(GateConfig::new(1).with_queue(1).with_classes(2));
    let p = direct_at(&g, 0);
    let mut low = queued_at(&g, 1);
    let _high = queued_at(&g, 0);
    assert_eq!(outcome(&mut low), Some(Err(AdmitError::Displaced)));
    let text = g.metrics_text();
    for line in [
        "dynamo_request_queue_by_class{class=\"0\"} 1",
        "dynamo_request_queue_by_class{class=\"1\"} 0",
        "dynamo_request_queue_limit_by_class{class=\"1\"} 1",
        "dynamo_request_rejection_by_class_total{class=\"1\",reason=\"displaced\"} 1",
        "dynamo_request_rejection_by_class_total{class=\"0\",reason=\"displaced\"} 0",
        "dynamo_request_rejection_by_reason_total{reason=\"displaced\"} 1",
        "dynamo_backend_admission_rejection_total 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    drop(p);
}

/// Threads admit at random classes (futures polled by hand, some dropped
/// while queued), hold and release: at no instant do more than `N` run or
/// more than `Q` wait, a class never runs beyond its share, and at rest every
/// slot and place is back.
#[test]
fn exact_under_threads_with_classes() {
    const N: u32 = 3;
    const Q: u32 = 4;
    let g = gate(
        GateConfig::new(N)
            .with_queue(Q)
            .with_classes(3)
            .with_class(0, class(Q, 1))
            .with_class(2, class(2, 0)),
    );
    let running = AtomicU32::new(0);
    let ops: u32 = std::env::var("LOADGATE_STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
        / 4;
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let (g, running) = (&g, &running);
            s.spawn(move || {
                let mut seed = 0x9e37_79b9u32.wrapping_mul(t + 1);
                let mut next = move || {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    seed
                };
                for _ in 0..ops {
                    let priority = (next() % 3) as u8;
                    let mut f = g.admit_owned_at(priority);
                    let permit = loop {
                        match poll(&mut f) {
                            Poll::Ready(r) => break r.ok(),
                            Poll::Pending if next() % 8 == 0 => break None, // cancel
                            Poll::Pending => std::thread::yield_now(),
                        }
                    };
                    drop(f);
                    let s = g.stats();
                    assert!(s.running <= N && s.queued <= Q, "{s:?}");
                    if let Some(p) = permit {
                        let n = running.fetch_add(1, Ordering::SeqCst);
                        assert!(n < N, "more than N run");
                        std::thread::yield_now();
                        running.fetch_sub(1, Ordering::SeqCst);
                        drop(p);
                    }
                }
            });
        }
    });
    let s = g.stats();
    assert_eq!((s.running, s.queued), (0, 0), "{s:?}");
    assert_eq!(
        s.received,
        s.admitted_direct + s.admitted_queued + s.rejected_total() + s.cancelled
    );
}
