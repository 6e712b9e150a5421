//! The wait limit `W` against docs/behaviour.md#worker-admission (one test
//! per rule: exactness, first response, handoff, release, cancel, deadline,
//! `set_limit`, the environment variable) and the `backend_admission_*`
//! metrics (docs/behaviour.md#metrics), single-threaded with a manual clock
//! except where a rule is about threads.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use loadgate::gate::WAIT_LIMIT_ENV;

mod support;
use loadgate::{
    AdmissionGate, AdmitError, ConfigError, GateConfig, GateStats, ManualClock, OwnedPermit,
    TryAdmitError,
};
use support::polling::{direct, granted, poll, queued};

/// `N` slots, `W` wait slots, a queue of `Q`, on a manual clock with an
/// optional deadline.
fn gate(
    n: u32,
    w: u32,
    q: u32,
    deadline_ms: Option<u64>,
) -> (Arc<AdmissionGate>, Arc<ManualClock>) {
    let clock = ManualClock::new();
    let config = GateConfig::new(n)
        .with_wait_limit(Some(w))
        .with_queue(q)
        .with_queue_timeout(deadline_ms.map(Duration::from_millis));
    let g = AdmissionGate::with_clock(config, clock.clone()).unwrap();
    (Arc::new(g), clock)
}

/// (running, waiting, queued), after checking the three caps.
fn state(g: &AdmissionGate) -> (u32, u32, u32) {
    let s = g.stats();
    let w = s.wait_limit.expect("a gate with a wait limit");
    assert!(s.running <= s.limit, "{s:?}");
    assert!(s.waiting <= w, "{s:?}");
    assert!(s.waiting <= s.running, "{s:?}");
    assert!(s.in_flight() <= s.limit + s.queue_limit, "{s:?}");
    (s.running, s.waiting, s.queued)
}

#[test]
fn admission_needs_a_request_slot_and_a_wait_slot() {
    let (g, _) = gate(3, 2, 2, None);
    let a = direct(&g);
    let b = g.try_admit_owned().unwrap();
    assert_eq!(state(&g), (2, 2, 0));
    // A request slot is free, but no wait slot: queue, never barge.
    assert_eq!(g.try_admit().unwrap_err(), TryAdmitError::WouldWait);
    let mut c = queued(&g);
    let mut d = queued(&g);
    assert_eq!(state(&g), (2, 2, 2));
    let mut e = g.admit_owned();
    assert!(matches!(
        poll(&mut e),
        Poll::Ready(Err(AdmitError::AtCapacity))
    ));
    assert_eq!(
        g.admit_blocking(None).unwrap_err(),
        AdmitError::AtCapacity,
        "the queue is full"
    );
    // The first response frees a wait slot: the oldest waiter gets it.
    a.first_response();
    assert_eq!(state(&g), (3, 2, 1));
    let c = granted(&mut c);
    assert!(poll(&mut d).is_pending());
    // Request slots are full now: another first response frees a wait slot
    // that nobody can use yet.
    b.first_response();
    assert_eq!(state(&g), (3, 1, 1));
    // A release frees a request slot; a wait slot is free too: handoff.
    drop(a);
    assert_eq!(state(&g), (3, 2, 0));
    let d = granted(&mut d);
    drop((b, c, d));
    assert_eq!(state(&g), (0, 0, 0));
    let s = g.stats();
    assert_eq!((s.admitted_direct, s.admitted_queued), (2, 2));
}

#[test]
fn first_response_is_idempotent_and_a_no_op_without_a_wait_limit() {
    let (g, _) = gate(2, 1, 1, None);
    let a = direct(&g);
    assert!(a.is_waiting());
    a.first_response();
    a.first_response();
    assert!(!a.is_waiting());
    assert_eq!(state(&g), (1, 0, 0));
    let b = g.try_admit().unwrap();
    assert_eq!(state(&g), (2, 1, 0));
    b.first_response();
    b.first_response();
    drop(b);
    drop(a);
    assert_eq!(state(&g), (0, 0, 0));

    let plain = AdmissionGate::new(GateConfig::new(1)).unwrap();
    let p = plain.try_admit().unwrap();
    assert!(!p.is_waiting());
    p.first_response();
    let s = plain.stats();
    assert_eq!((s.running, s.waiting, s.wait_limit), (1, 0, None));
}

#[test]
fn first_response_from_another_thread_hands_off() {
    let (g, _) = gate(2, 1, 1, None);
    let a = direct(&g);
    let mut w = queued(&g);
    std::thread::scope(|s| {
        s.spawn(|| a.first_response());
        s.spawn(|| a.first_response());
    });
    assert_eq!(state(&g), (2, 1, 0), "handed off exactly once");
    let w = granted(&mut w);
    assert!(w.is_waiting());
    drop((a, w));
    assert_eq!(state(&g), (0, 0, 0));
}

#[test]
fn releasing_a_permit_that_never_responded_frees_both_slots() {
    let (g, _) = gate(1, 1, 1, None);
    let a = direct(&g);
    let mut w = queued(&g);
    drop(a);
    assert_eq!(state(&g), (1, 1, 0), "both slots went to the waiter");
    let w = granted(&mut w);
    drop(w);
    assert_eq!(state(&g), (0, 0, 0));
    // Owned and borrowed permits, and the raw round trip, keep the state.
    let p = g.try_admit().unwrap().into_owned(&g);
    assert!(p.is_waiting());
    // SAFETY: from `into_raw`, taken back once.
    let p = unsafe { OwnedPermit::from_raw(p.into_raw()) };
    assert!(p.is_waiting());
    p.first_response();
    // SAFETY: as above.
    let p = unsafe { OwnedPermit::from_raw(p.into_raw()) };
    assert!(!p.is_waiting());
    assert_eq!(state(&g), (1, 0, 0));
    drop(p);
    assert_eq!(state(&g), (0, 0, 0));
}

#[test]
fn a_release_without_a_free_wait_slot_leaves_the_waiter_queued() {
    let (g, _) = gate(2, 1, 1, None);
    let a = direct(&g);
    a.first_response();
    let b = direct(&g);
    let mut w = queued(&g);
    assert_eq!(state(&g), (2, 1, 1));
    drop(a);
    assert_eq!(state(&g), (1, 1, 1), "b still waits for its first response");
    assert!(poll(&mut w).is_pending());
    b.first_response();
    assert_eq!(state(&g), (2, 1, 0));
    drop((granted(&mut w), b));
    assert_eq!(state(&g), (0, 0, 0));
}

#[test]
fn cancel_with_a_wait_limit_never_loses_a_slot() {
    let (g, _) = gate(1, 1, 2, None);
    let a = direct(&g);
    let w1 = queued(&g);
    let w2 = queued(&g);
    drop(w1); // still queued: a cancellation
    a.first_response();
    assert_eq!(state(&g), (1, 0, 1), "no request slot for w2 yet");
    drop(a);
    assert_eq!(state(&g), (1, 1, 0), "w2 was granted both");
    let mut w3 = queued(&g);
    // w2 is granted but never polled: dropping it passes both slots on.
    drop(w2);
    assert_eq!(state(&g), (1, 1, 0));
    let p = granted(&mut w3);
    drop(p);
    assert_eq!(state(&g), (0, 0, 0));
    let s = g.stats();
    assert_eq!(s.cancelled, 1);
    assert_eq!(s.admitted_queued, 2);
}

#[test]
fn the_deadline_expires_waiters_held_back_by_the_wait_limit() {
    let (g, clock) = gate(2, 1, 2, Some(10));
    let a = direct(&g);
    let mut w1 = queued(&g);
    clock.advance(Duration::from_millis(5));
    let mut w2 = queued(&g);
    clock.advance(Duration::from_millis(5));
    // w1 is due exactly now: the first response expires it and serves w2.
    a.first_response();
    assert!(matches!(
        poll(&mut w1),
        Poll::Ready(Err(AdmitError::QueueTimeout))
    ));
    let p = granted(&mut w2);
    assert_eq!(state(&g), (2, 1, 0));
    let mut w3 = queued(&g);
    clock.advance(Duration::from_millis(10));
    assert_eq!(g.expire(), 1);
    assert!(matches!(
        poll(&mut w3),
        Poll::Ready(Err(AdmitError::QueueTimeout))
    ));
    drop((a, p));
    let s = g.stats();
    assert_eq!((s.running, s.waiting, s.queued, s.expired), (0, 0, 0, 2));
}

#[test]
fn raising_the_limit_grants_only_as_many_as_wait_slots_allow() {
    let (g, _) = gate(1, 2, 3, None);
    let a = direct(&g);
    let mut ws: Vec<_> = (0..3).map(|_| queued(&g)).collect();
    g.set_limit(4).unwrap();
    assert_eq!(state(&g), (2, 2, 2), "one wait slot was free");
    let b = granted(&mut ws[0]);
    b.first_response();
    assert_eq!(state(&g), (3, 2, 1));
    let c = granted(&mut ws[1]);
    drop((a, b, c));
    let d = granted(&mut ws[2]);
    assert_eq!(state(&g), (1, 1, 0));
    drop(d);
}

#[test]
fn callbacks_and_blocking_waits_respect_the_wait_limit() {
    let (g, _) = gate(2, 1, 2, None);
    let a = g.admit_blocking_owned(None).unwrap();
    let got: Arc<Mutex<Vec<OwnedPermit>>> = Arc::default();
    let sink = got.clone();
    let ticket = g.admit_with_callback(Box::new(move |r| sink.lock().unwrap().push(r.unwrap())));
    assert!(ticket.is_queued());
    let blocked = {
        let g = g.clone();
        std::thread::spawn(move || g.admit_blocking_owned(None).unwrap())
    };
    while g.stats().queued < 2 {
        std::thread::yield_now();
    }
    a.first_response();
    let b = got.lock().unwrap().pop().expect("the callback was granted");
    assert!(!ticket.is_queued());
    b.first_response();
    assert_eq!(state(&g), (2, 0, 1), "the thread needs a request slot too");
    drop(a);
    let c = blocked.join().unwrap();
    assert!(c.is_waiting());
    assert_eq!(state(&g), (2, 1, 0));
    drop((b, c));
    assert_eq!(state(&g), (0, 0, 0));
}

#[test]
fn exactness_holds_at_every_instant_across_threads() {
    const N: u32 = 3;
    const W: u32 = 2;
    let (g, _) = gate(N, W, 4, None);
    let running = AtomicU32::new(0);
    let waiting = AtomicU32::new(0);
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let (g, running, waiting) = (&g, &running, &waiting);
            s.spawn(move || {
                for i in 0..300u32 {
                    let Ok(p) = g.admit_blocking_owned(None) else {
                        continue;
                    };
                    // Independent counts, raised after the gate admits and
                    // lowered before it frees: never below the gate's own.
                    assert!(running.fetch_add(1, Ordering::SeqCst) < N);
                    assert!(waiting.fetch_add(1, Ordering::SeqCst) < W);
                    state(g);
                    waiting.fetch_sub(1, Ordering::SeqCst);
                    // Most requests respond before they finish; the rest
                    // are released still waiting, which frees both.
                    if (i + t) % 3 != 0 {
                        p.first_response();
                        state(g);
                    }
                    running.fetch_sub(1, Ordering::SeqCst);
                    drop(p);
                }
            });
        }
    });
    assert_eq!(state(&g), (0, 0, 0));
    let s = g.stats();
    assert_eq!(
        s.received,
        s.admitted_direct + s.admitted_queued + s.rejected_total() + s.cancelled
    );
}

#[test]
fn the_wait_limit_comes_from_the_environment() {
    let lookup = |w: Option<&'static str>| {
        move |name: &str| {
            (name == WAIT_LIMIT_ENV)
                .then_some(w)
                .flatten()
                .map(str::to_owned)
        }
    };
    assert_eq!(
        GateConfig::from_lookup(4, lookup(None)).unwrap().wait_limit,
        None
    );
    assert_eq!(
        GateConfig::from_lookup(4, lookup(Some(" 3 ")))
            .unwrap()
            .wait_limit,
        Some(3)
    );
    assert_eq!(
        GateConfig::from_lookup(4, lookup(Some("2097151")))
            .unwrap()
            .wait_limit,
        Some(2_097_151)
    );
    for bad in ["0", "", "-1", "2097152", "two", "1.5"] {
        let e = GateConfig::from_lookup(4, lookup(Some(bad))).unwrap_err();
        assert_eq!(
            e,
            ConfigError::InvalidEnv {
                var: WAIT_LIMIT_ENV,
                value: bad.to_owned(),
                expected: "an integer from 1 to 2097151",
            }
        );
        assert!(e.to_string().contains(WAIT_LIMIT_ENV), "{e}");
    }
    assert_eq!(
        AdmissionGate::new(GateConfig::new(1).with_wait_limit(Some(0))).unwrap_err(),
        ConfigError::ZeroWaitLimit
    );
    assert!(matches!(
        AdmissionGate::new(GateConfig::new(1).with_wait_limit(Some(1 << 21))).unwrap_err(),
        ConfigError::OutOfRange {
            field: "wait_limit",
            ..
        }
    ));
}

#[test]
fn backend_admission_metrics_follow_the_gate() {
    let (g, _) = gate(2, 1, 1, None);
    let a = direct(&g);
    let w = queued(&g);
    let mut full = g.admit_owned();
    assert!(poll(&mut full).is_ready());
    let text = g.metrics_text();
    for line in [
        "# TYPE dynamo_backend_admission_engine_request_count gauge",
        "dynamo_backend_admission_engine_request_count 1",
        "# TYPE dynamo_backend_admission_engine_wait_count gauge",
        "dynamo_backend_admission_engine_wait_count 1",
        "# TYPE dynamo_backend_admission_request_queue_count gauge",
        "dynamo_backend_admission_request_queue_count 1",
        "# TYPE dynamo_backend_admission_request_receive_total counter",
        "dynamo_backend_admission_request_receive_total 3",
        "# TYPE dynamo_backend_admission_request_admit_total counter",
        "dynamo_backend_admission_request_admit_total{source=\"direct\"} 1",
        "dynamo_backend_admission_request_admit_total{source=\"queue\"} 0",
        "# TYPE dynamo_backend_admission_rejection_total counter",
        "dynamo_backend_admission_rejection_total 1",
        "# TYPE dynamo_backend_admission_cancellation_total counter",
        "dynamo_backend_admission_cancellation_total 0",
        // The reference's first family is still there.
        "dynamo_engine_request 1",
        "dynamo_request_queue 1",
        "dynamo_rejection_request_total 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    drop(w);
    a.first_response();
    let text = g.metrics_text();
    for line in [
        "dynamo_backend_admission_engine_wait_count 0",
        "dynamo_backend_admission_request_queue_count 0",
        "dynamo_backend_admission_cancellation_total 1",
        "dynamo_backend_admission_request_receive_total 3",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    drop(a);
    let plain = AdmissionGate::new(GateConfig::new(1)).unwrap();
    let _p = plain.try_admit().unwrap();
    assert!(plain
        .metrics_text()
        .lines()
        .any(|l| l == "dynamo_backend_admission_engine_wait_count 0"));
}

#[test]
fn receive_total_never_goes_down() {
    let (g, clock) = gate(1, 1, 1, Some(5));
    let mut last = 0;
    let mut check = |g: &AdmissionGate| {
        let s: GateStats = g.stats();
        assert!(s.received >= last, "{s:?}");
        last = s.received;
    };
    let a = direct(&g);
    check(&g);
    let w = queued(&g);
    check(&g);
    clock.advance(Duration::from_millis(5));
    assert_eq!(g.expire(), 1);
    check(&g);
    drop(w);
    let w = queued(&g);
    drop(w);
    check(&g);
    g.close();
    check(&g);
    drop(a);
    assert!(g.admit_blocking(None).is_err());
    check(&g);
    let s = g.stats();
    assert_eq!(
        s.received,
        s.admitted_direct
            + s.admitted_queued
            + s.rejected_total()
            + s.cancelled
            + u64::from(s.queued)
    );
    assert_eq!(s.received, 4);
}
