//! Threaded stress: 4 threads share 10^6 admit / hold / release / cancel
//! operations (futures, blocking waits with tiny timeouts, callbacks and
//! `try_admit`) on a small gate. Independent counters, kept outside the gate,
//! check the caps at every step: a holder counts itself after it got its
//! permit and uncounts itself before it releases, so the counters never
//! exceed the truth, and any over-admission by the gate can push them past
//! `N` (running) or `N + Q` (in flight). At the end nothing runs or waits.
//!
//! The same again on a gate with three priority classes (a reserved slot, a
//! small class queue), each admission at a random class: there a waiter can
//! also be displaced, which its owner learns only when it next polls, so the
//! independent in-flight count may run ahead of the truth and only the
//! running count and the gate's own state are checked at every step. Once
//! more with a 20 µs queue deadline on one class: its waiters also expire.
//! And with a wait limit `W` below `N` (alone, and with two classes and a
//! deadline): holders also send first responses, and an independent count
//! of permits still holding a wait slot is checked against `W`. And with
//! adaptive LIFO and a 20 µs deadline (alone, and with two classes and a
//! wait limit): each expiry hands the next slot to the newest waiter. Where
//! waiters expire, their owners too learn it only when they next poll, so
//! the in-flight count is not checked there either.
//!
//! `LOADGATE_STRESS_OPS` overrides the number of operations of each test.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use loadgate::{AdmissionGate, AdmitError, AdmitOwned, ClassConfig, GateConfig, OwnedPermit};

const THREADS: usize = 4;
const N: u32 = 3;
const Q: u32 = 4;

struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// The independent view: slots held and requests in flight as the threads
/// know them.
struct Probe {
    running: AtomicU32,
    in_flight: AtomicU32,
    /// Held permits that still hold a wait slot, and the gate's wait limit.
    waiting: AtomicU32,
    wait_limit: Option<u32>,
    /// Whether the in-flight count is exact: no displacement and no expiry,
    /// which another thread decides and the owner learns only when it next
    /// polls (meanwhile the count runs ahead of the truth).
    check_in_flight: bool,
}

impl Probe {
    fn got_slot(&self, was_queued: bool) {
        let r = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(r <= N, "{r} running with N = {N}");
        if let Some(w) = self.wait_limit {
            let n = self.waiting.fetch_add(1, Ordering::SeqCst) + 1;
            assert!(n <= w, "{n} waiting for a first response with W = {w}");
        }
        if !was_queued {
            self.enter();
        }
    }
    fn enter(&self) {
        let f = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(
            !self.check_in_flight || f <= N + Q,
            "{f} in flight with N + Q = {}",
            N + Q
        );
    }
    fn leave_queue(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
    fn first_response(&self, p: &OwnedPermit) {
        if p.is_waiting() {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            p.first_response();
        }
    }
    fn release(&self, p: OwnedPermit) {
        if p.is_waiting() {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        self.running.fetch_sub(1, Ordering::SeqCst);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        drop(p);
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn worker(gate: Arc<AdmissionGate>, probe: Arc<Probe>, seed: u64, ops: usize, deadlines: bool) {
    let mut rng = Rng(seed);
    let classes = gate.classes() as u64;
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    let mut held: Vec<OwnedPermit> = Vec::new();
    let mut waiting: Vec<AdmitOwned> = Vec::new();
    let (tx, rx) = mpsc::channel::<OwnedPermit>();
    let mut tickets = Vec::new();
    for _ in 0..ops {
        // Permits handed to our callbacks by other threads.
        while let Ok(p) = rx.try_recv() {
            held.push(p);
        }
        match rng.below(100) {
            0..=29 if held.len() + waiting.len() < 4 => {
                let mut f = gate.admit_owned_at(rng.below(classes) as u8);
                match Pin::new(&mut f).poll(&mut cx) {
                    Poll::Ready(Ok(p)) => {
                        probe.got_slot(false);
                        held.push(p);
                    }
                    Poll::Ready(Err(_)) => {}
                    Poll::Pending => {
                        probe.enter();
                        waiting.push(f);
                    }
                }
            }
            30..=44 => {
                let mut keep = Vec::with_capacity(waiting.len());
                for mut f in waiting.drain(..) {
                    match Pin::new(&mut f).poll(&mut cx) {
                        Poll::Ready(Ok(p)) => {
                            probe.got_slot(true);
                            held.push(p);
                        }
                        Poll::Ready(Err(AdmitError::Displaced)) if classes > 1 => {
                            probe.leave_queue();
                        }
                        Poll::Ready(Err(AdmitError::QueueTimeout)) if deadlines => {
                            probe.leave_queue();
                        }
                        Poll::Ready(Err(e)) => panic!("not displaced, not due: {e:?}"),
                        Poll::Pending => keep.push(f),
                    }
                }
                waiting = keep;
            }
            45..=74 if !held.is_empty() => {
                let i = rng.below(held.len() as u64) as usize;
                if probe.wait_limit.is_some() && held[i].is_waiting() && rng.below(2) == 0 {
                    probe.first_response(&held[i]);
                } else {
                    probe.release(held.swap_remove(i));
                }
            }
            75..=84 if !waiting.is_empty() => {
                // Cancel: may race a handoff, which then passes the slot on.
                let i = rng.below(waiting.len() as u64) as usize;
                probe.leave_queue();
                drop(waiting.swap_remove(i));
            }
            85..=89 if held.is_empty() => {
                // Blocking wait with a tiny timeout (times out or is granted).
                let timeout = Duration::from_micros(rng.below(50));
                let priority = rng.below(classes) as u8;
                if let Ok(p) = gate.admit_blocking_owned_at(priority, Some(timeout)) {
                    probe.got_slot(false);
                    held.push(p);
                }
            }
            90..=94 if tickets.len() < 2 => {
                let tx = tx.clone();
                let probe2 = probe.clone();
                let priority = rng.below(classes) as u8;
                let ticket = gate.admit_with_callback_at(
                    priority,
                    Box::new(move |r| {
                        if let Ok(p) = r {
                            probe2.got_slot(false);
                            // The receiver may be gone at the very end.
                            if let Err(mpsc::SendError(p)) = tx.send(p) {
                                probe2.release(p);
                            }
                        }
                    }),
                );
                tickets.push(ticket);
            }
            95..=97 if !tickets.is_empty() => {
                let t = tickets.swap_remove(0);
                t.cancel();
            }
            _ => {
                if let Ok(p) = gate.try_admit_owned_at(rng.below(classes) as u8) {
                    probe.got_slot(false);
                    held.push(p);
                }
            }
        }
        let s = gate.stats();
        assert!(s.running <= N && s.queued <= Q, "gate state {s:?}");
        assert!(s.waiting <= s.wait_limit.unwrap_or(0), "gate state {s:?}");
    }
    // Wind down.
    for t in tickets {
        t.cancel();
    }
    for _ in waiting.drain(..) {
        probe.leave_queue();
    }
    for p in held.drain(..) {
        probe.release(p);
    }
    // Callbacks that fired before their cancel: give their permits back.
    drop(tx);
    std::thread::yield_now();
    while let Ok(p) = rx.try_recv() {
        probe.release(p);
    }
    // Any still in flight are sent later; the receiver is dropped and the
    // callback releases them itself.
}

#[test]
fn four_threads_never_exceed_the_caps() {
    stress(GateConfig::new(N).with_queue(Q));
}

#[test]
fn four_threads_with_a_wait_limit_never_exceed_the_caps() {
    // W = 2 < N = 3: admissions wait for wait slots as well as request
    // slots; first responses free wait slots on any thread.
    stress(GateConfig::new(N).with_queue(Q).with_wait_limit(Some(2)));
}

#[test]
fn four_threads_with_a_wait_limit_and_classes_never_exceed_the_caps() {
    let s = stress(
        GateConfig::new(N)
            .with_queue(Q)
            .with_wait_limit(Some(2))
            .with_classes(2)
            .with_class(
                1,
                ClassConfig {
                    queue: Q,
                    queue_timeout: Some(Duration::from_micros(20)),
                    reserved: 0,
                },
            ),
    );
    assert!(s.expired > 0, "expiry was exercised: {s:?}");
}

#[test]
fn four_threads_with_adaptive_lifo_never_exceed_the_caps() {
    // Waiters expire after 20 µs; each expiry hands the next slot to the
    // newest waiter, racing releases, cancels, arrivals and other expiries.
    let s = stress(
        GateConfig::new(N)
            .with_queue(Q)
            .with_queue_timeout(Some(Duration::from_micros(20)))
            .with_adaptive_lifo(true),
    );
    assert!(s.expired > 0, "expiry was exercised: {s:?}");
}

#[test]
fn four_threads_with_adaptive_lifo_classes_and_a_wait_limit_never_exceed_the_caps() {
    let s = stress(
        GateConfig::new(N)
            .with_queue(Q)
            .with_wait_limit(Some(2))
            .with_queue_timeout(Some(Duration::from_micros(20)))
            .with_classes(2)
            .with_adaptive_lifo(true),
    );
    assert!(s.expired > 0, "expiry was exercised: {s:?}");
}

#[test]
fn four_threads_with_priority_classes_and_deadlines_never_exceed_the_caps() {
    // Class 1's waiters expire after 20 µs: expiry, from any thread's
    // release, arrival or blocking wait, races handoffs and displacement.
    let s = stress(GateConfig::new(N).with_queue(Q).with_classes(3).with_class(
        1,
        ClassConfig {
            queue: Q,
            queue_timeout: Some(Duration::from_micros(20)),
            reserved: 0,
        },
    ));
    assert!(s.expired > 0, "expiry was exercised: {s:?}");
    assert!(
        s.classes().iter().all(|c| c.queued == 0),
        "every class drained: {s:?}"
    );
}

#[test]
fn four_threads_with_priority_classes_never_exceed_the_caps() {
    let s = stress(
        GateConfig::new(N)
            .with_queue(Q)
            .with_classes(3)
            .with_class(
                0,
                ClassConfig {
                    queue: Q,
                    queue_timeout: None,
                    reserved: 1,
                },
            )
            .with_class(
                2,
                ClassConfig {
                    queue: 2,
                    queue_timeout: None,
                    reserved: 0,
                },
            ),
    );
    assert!(s.displaced > 0, "displacement was exercised: {s:?}");
    assert!(
        s.classes().iter().all(|c| c.queued == 0),
        "every class drained: {s:?}"
    );
}

/// Runs the workers on a gate of `config` and checks the end state; the
/// final stats.
fn stress(config: GateConfig) -> loadgate::GateStats {
    let total: usize = std::env::var("LOADGATE_STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let deadlines =
        config.queue_timeout.is_some() || config.classes.iter().any(|c| c.queue_timeout.is_some());
    let gate = Arc::new(AdmissionGate::new(config).unwrap());
    let probe = Arc::new(Probe {
        running: AtomicU32::new(0),
        in_flight: AtomicU32::new(0),
        waiting: AtomicU32::new(0),
        wait_limit: gate.wait_limit(),
        check_in_flight: gate.classes() == 1 && !deadlines,
    });
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let gate = gate.clone();
            let probe = probe.clone();
            std::thread::spawn(move || {
                worker(
                    gate,
                    probe,
                    0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1),
                    total / THREADS,
                    deadlines,
                )
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = gate.stats();
    assert_eq!((s.running, s.queued, s.waiting), (0, 0, 0), "{s:?}");
    assert_eq!(probe.running.load(Ordering::SeqCst), 0);
    assert!(s.admitted_direct + s.admitted_queued > 0);
    assert!(s.admitted_queued > 0, "the queue was exercised: {s:?}");
    assert!(s.rejected_at_capacity > 0, "rejection was exercised: {s:?}");
    assert!(s.cancelled > 0, "cancellation was exercised: {s:?}");
    // A fresh admission still finds every slot.
    let free = N.min(gate.wait_limit().unwrap_or(N));
    let all: Vec<_> = (0..free).map(|_| gate.try_admit().unwrap()).collect();
    assert!(gate.try_admit().is_err(), "a slot was duplicated");
    drop(all);
    s
}
