//! Proves that the gate's hot paths allocate nothing: direct admit and
//! release, rejection, queueing and handoff (future and blocking forms),
//! cancellation, expiry, and the wait limit's paths (first response, release
//! of a permit still waiting, admission under the lock). A counting global
//! allocator (`loadgate-testkit`) counts the allocations each thread makes;
//! each test warms up first (thread-locals, the waker) and measures only the
//! region it names.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::Duration;

use loadgate::{AdmissionGate, AdmitError, ClassConfig, GateConfig, ManualClock};
use loadgate_testkit::alloc::{allocations, CountingAlloc};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

const ROUNDS: usize = 1000;

#[test]
fn the_counter_sees_allocations() {
    let (n, b) = allocations(|| std::hint::black_box(Box::new(7u64)));
    assert_eq!(*b, 7);
    assert!(n >= 1);
}

#[test]
fn direct_admit_and_release_allocate_nothing() {
    let g = Arc::new(AdmissionGate::new(GateConfig::new(2).with_queue(2)).unwrap());
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    let round = |cx: &mut Context<'_>| {
        drop(g.try_admit().unwrap());
        drop(g.try_admit_owned().unwrap());
        drop(g.admit_blocking(None).unwrap());
        let mut f = g.admit();
        match Pin::new(&mut f).poll(cx) {
            Poll::Ready(Ok(p)) => drop(p),
            other => panic!("{other:?}"),
        }
        let mut f = g.admit_owned();
        match Pin::new(&mut f).poll(cx) {
            Poll::Ready(Ok(p)) => drop(p),
            other => panic!("{other:?}"),
        }
        // The callback form allocates its Box; a direct admit adds nothing.
    };
    round(&mut cx);
    let (n, ()) = allocations(|| {
        for _ in 0..ROUNDS {
            round(&mut cx);
        }
    });
    assert_eq!(n, 0);
    assert_eq!(g.stats().admitted_direct, 5 * (ROUNDS as u64 + 1));
}

#[test]
fn rejection_allocates_nothing() {
    let g = Arc::new(AdmissionGate::new(GateConfig::new(1).with_queue(1)).unwrap());
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    let _p = g.try_admit().unwrap();
    let mut w = g.admit();
    assert!(Pin::new(&mut w).poll(&mut cx).is_pending());
    let round = |cx: &mut Context<'_>| {
        let mut f = g.admit_owned();
        assert!(matches!(
            Pin::new(&mut f).poll(cx),
            Poll::Ready(Err(AdmitError::AtCapacity))
        ));
        assert_eq!(g.admit_blocking(None).unwrap_err(), AdmitError::AtCapacity);
        assert!(g.try_admit().is_err());
    };
    round(&mut cx);
    let (n, ()) = allocations(|| {
        for _ in 0..ROUNDS {
            round(&mut cx);
        }
    });
    assert_eq!(n, 0);
}

#[test]
fn queued_handoff_and_cancel_allocate_nothing() {
    let g = AdmissionGate::new(GateConfig::new(1).with_queue(4)).unwrap();
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    let round = |cx: &mut Context<'_>| {
        let p = g.try_admit().unwrap();
        let mut a = g.admit();
        let mut b = g.admit();
        let c = g.admit();
        let mut c = c;
        assert!(Pin::new(&mut a).poll(cx).is_pending());
        assert!(Pin::new(&mut b).poll(cx).is_pending());
        assert!(Pin::new(&mut c).poll(cx).is_pending());
        drop(c); // cancel while queued
        drop(p); // handoff to a
        let pa = match Pin::new(&mut a).poll(cx) {
            Poll::Ready(Ok(p)) => p,
            other => panic!("{other:?}"),
        };
        drop(pa); // handoff to b, which is dropped before it looks
        drop(b); // cancel racing handoff: the slot comes back
        assert_eq!(g.running(), 0);
    };
    round(&mut cx);
    let (n, ()) = allocations(|| {
        for _ in 0..ROUNDS {
            round(&mut cx);
        }
    });
    assert_eq!(n, 0);
    let s = g.stats();
    assert_eq!((s.running, s.queued), (0, 0));
    assert_eq!(s.admitted_queued, 2 * (ROUNDS as u64 + 1));
}

#[test]
fn priority_classes_displacement_and_reserved_slots_allocate_nothing() {
    let config = GateConfig::new(2).with_queue(2).with_classes(3).with_class(
        0,
        ClassConfig {
            queue: 2,
            queue_timeout: None,
            reserved: 1,
        },
    );
    let g = AdmissionGate::new(config).unwrap();
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    let round = |cx: &mut Context<'_>| {
        let low = g.try_admit_at(2).unwrap();
        let mut low_a = g.admit_at(2);
        let mut low_b = g.admit_at(2);
        assert!(Pin::new(&mut low_a).poll(cx).is_pending());
        assert!(Pin::new(&mut low_b).poll(cx).is_pending());
        // The reserved slot, while class 2 waits.
        let top = g.try_admit_at(0).unwrap();
        // Two class-1 arrivals displace both class-2 waiters, newest first.
        let mut mid_a = g.admit_at(1);
        let mut mid_b = g.admit_at(1);
        assert!(Pin::new(&mut mid_a).poll(cx).is_pending());
        assert!(Pin::new(&mut mid_b).poll(cx).is_pending());
        for f in [&mut low_b, &mut low_a] {
            assert!(matches!(
                Pin::new(f).poll(cx),
                Poll::Ready(Err(AdmitError::Displaced))
            ));
        }
        // A class-2 arrival now displaces nobody and is rejected.
        assert!(matches!(
            Pin::new(&mut g.admit_at(2)).poll(cx),
            Poll::Ready(Err(AdmitError::AtCapacity))
        ));
        drop(top); // the reserved slot is not class 1's: it stays free
        drop(low); // class 1's slot: handed to mid_a
        let pa = match Pin::new(&mut mid_a).poll(cx) {
            Poll::Ready(Ok(p)) => p,
            other => panic!("{other:?}"),
        };
        drop(mid_b); // cancelled while queued
        drop(pa);
        assert_eq!((g.running(), g.queued()), (0, 0));
    };
    round(&mut cx);
    let (n, ()) = allocations(|| {
        for _ in 0..ROUNDS {
            round(&mut cx);
        }
    });
    assert_eq!(n, 0);
    assert_eq!(g.stats().displaced, 2 * (ROUNDS as u64 + 1));
}

#[test]
fn expiry_allocates_nothing() {
    let clock = ManualClock::new();
    let config = GateConfig::new(1)
        .with_queue(2)
        .with_queue_timeout(Some(Duration::from_millis(5)));
    let g = AdmissionGate::with_clock(config, clock.clone()).unwrap();
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    let p = g.try_admit().unwrap();
    let round = |cx: &mut Context<'_>| {
        let mut a = g.admit();
        assert!(Pin::new(&mut a).poll(cx).is_pending());
        clock.advance(Duration::from_millis(5));
        assert_eq!(g.expire(), 1);
        assert!(matches!(
            Pin::new(&mut a).poll(cx),
            Poll::Ready(Err(AdmitError::QueueTimeout))
        ));
    };
    round(&mut cx);
    let (n, ()) = allocations(|| {
        for _ in 0..ROUNDS {
            round(&mut cx);
        }
    });
    assert_eq!(n, 0);
    drop(p);
}

#[test]
fn blocking_handoff_between_threads_allocates_nothing() {
    let g = Arc::new(AdmissionGate::new(GateConfig::new(1).with_queue(1)).unwrap());
    let rounds = 200;
    let (to_waiter, waiter_rx) = std::sync::mpsc::sync_channel::<()>(0);
    let (to_main, main_rx) = std::sync::mpsc::sync_channel::<u64>(0);
    let g2 = g.clone();
    let waiter = thread::spawn(move || {
        let mut total = 0;
        for i in 0..=rounds {
            waiter_rx.recv().unwrap();
            // Warm-up round (i == 0) is not counted.
            let (n, ()) = allocations(|| {
                let p = g2.admit_blocking(None).unwrap();
                drop(p);
            });
            if i > 0 {
                total += n;
            }
        }
        to_main.send(total).unwrap();
    });
    let mut released = 0;
    for i in 0..=rounds {
        let p = g.try_admit().unwrap();
        to_waiter.send(()).unwrap();
        // The slot is held, so the waiter queues; release once it has.
        while g.queued() == 0 {
            thread::yield_now();
        }
        let (n, ()) = allocations(|| drop(p));
        if i > 0 {
            released += n;
        }
        while g.running() != 0 || g.queued() != 0 {
            thread::yield_now();
        }
    }
    let waiter_allocs = main_rx.recv().unwrap();
    waiter.join().unwrap();
    assert_eq!((released, waiter_allocs), (0, 0));
    assert_eq!(
        g.stats().admitted_queued,
        rounds as u64 + 1,
        "every round was a handoff"
    );
}

#[test]
fn wait_limit_paths_allocate_nothing() {
    // N = 2, W = 1: admission under the lock, first response with and
    // without a handoff, release of a permit still waiting (with handoff),
    // cancel of a waiter held back by W, and the locked try_admit.
    let config = GateConfig::new(2).with_wait_limit(Some(1)).with_queue(2);
    let g = Arc::new(AdmissionGate::new(config).unwrap());
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    let round = |cx: &mut Context<'_>| {
        let p = g.try_admit().unwrap();
        assert!(g.try_admit().is_err(), "no wait slot");
        let mut a = g.admit();
        let mut b = g.admit_owned();
        assert!(Pin::new(&mut a).poll(cx).is_pending());
        assert!(Pin::new(&mut b).poll(cx).is_pending());
        p.first_response(); // hands both free slots to a
        p.first_response();
        let pa = match Pin::new(&mut a).poll(cx) {
            Poll::Ready(Ok(p)) => p,
            other => panic!("{other:?}"),
        };
        drop(p); // frees a request slot; no wait slot for b
        drop(pa); // never responded: both slots go to b
        let pb = match Pin::new(&mut b).poll(cx) {
            Poll::Ready(Ok(p)) => p,
            other => panic!("{other:?}"),
        };
        let mut c = g.admit();
        assert!(Pin::new(&mut c).poll(cx).is_pending());
        drop(c); // cancel while held back by W
        pb.first_response(); // nobody to hand to
        drop(pb); // lock-free release: responded, nobody queued
        let d = g.admit_blocking(None).unwrap();
        drop(d);
        assert_eq!((g.running(), g.waiting(), g.queued()), (0, 0, 0));
    };
    round(&mut cx);
    let (n, ()) = allocations(|| {
        for _ in 0..ROUNDS {
            round(&mut cx);
        }
    });
    assert_eq!(n, 0);
    let s = g.stats();
    assert_eq!(s.admitted_queued, 2 * (ROUNDS as u64 + 1));
    assert_eq!(s.cancelled, ROUNDS as u64 + 1);
}

#[test]
fn after_raising_the_limit_queueing_allocates_nothing() {
    // Raising the limit may allocate (cells for the new slots' waiters);
    // using them afterwards may not: here 60 waiters are granted and have
    // not looked yet while 4 more queue, 64 cells at once where the gate
    // was built with 5.
    let g = AdmissionGate::new(GateConfig::new(1).with_queue(4)).unwrap();
    g.set_limit(60).unwrap();
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    let mut permits = Vec::with_capacity(60);
    let mut granted = Vec::with_capacity(64);
    let (n, ()) = allocations(|| {
        for _ in 0..60 {
            permits.push(g.try_admit().unwrap());
        }
        for _ in 0..16 {
            for _ in 0..4 {
                let mut f = g.admit();
                assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
                granted.push(f);
            }
            if !permits.is_empty() {
                permits.truncate(permits.len() - 4); // hands 4 slots on
            }
        }
        for mut f in granted.drain(..) {
            match Pin::new(&mut f).poll(&mut cx) {
                Poll::Ready(Ok(p)) => drop(p),
                Poll::Pending => {} // the last 4 still wait: dropping cancels
                Poll::Ready(Err(e)) => panic!("{e:?}"),
            }
        }
    });
    assert_eq!(n, 0, "allocations after raising the limit");
    assert_eq!((g.running(), g.queued()), (0, 0));
}
