//! What the gate's loom models share (`loom_gate.rs`,
//! `loom_gate_counted.rs`): driving a future on a loom thread, a gate, and
//! the checks every model makes.

// Each model file uses its own part of these.
#![allow(dead_code)]

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use loadgate::{AdmissionGate, AdmitOwned, GateConfig, OwnedPermit};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

/// Wakes a loom thread.
pub struct Unpark(thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Drives a future on the current loom thread, parking between polls.
pub fn block_on<F: Future>(f: F) -> F::Output {
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

pub struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// A future polled once on this thread, so it is queued in a known order.
pub fn queued(g: &Arc<AdmissionGate>) -> AdmitOwned {
    let mut f = g.admit_owned();
    let waker = Waker::from(Arc::new(Noop));
    assert!(Pin::new(&mut f)
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    f
}

pub fn gate(limit: u32, queue: u32) -> Arc<AdmissionGate> {
    Arc::new(AdmissionGate::new(GateConfig::new(limit).with_queue(queue)).unwrap())
}

/// Independent count of slots held, checked against N at every admit.
pub struct Probe {
    pub running: AtomicUsize,
    pub limit: usize,
}

impl Probe {
    pub fn new(limit: u32) -> Arc<Self> {
        Arc::new(Self {
            running: AtomicUsize::new(0),
            limit: limit as usize,
        })
    }
    pub fn hold(&self, g: &AdmissionGate, p: OwnedPermit) {
        let r = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(r <= self.limit, "{r} running, limit {}", self.limit);
        check_caps(g);
        self.running.fetch_sub(1, Ordering::SeqCst);
        drop(p);
    }
}

pub fn check_caps(g: &AdmissionGate) {
    let s = g.stats();
    assert!(s.running <= s.limit.max(2), "{s:?}");
    assert!(s.in_flight() <= s.limit.max(2) + s.queue_limit, "{s:?}");
}

/// Nothing running or queued, and every slot can be taken again.
pub fn check_drained(g: &Arc<AdmissionGate>, limit: u32) {
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
