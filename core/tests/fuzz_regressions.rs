//! Inputs the fuzz targets (`fuzz/`) found, replayed as plain tests so each
//! stays fixed. One test per finding; the doc comment names the target and
//! gives the minimized input as the operations it decodes to.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use loadgate::{AdmissionGate, AdmitError, GateConfig, ManualClock};

struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// `gate_ops`: `Setup { limit: 1, queue: 47, timeout_ms: Some(1), lifo:
/// false }`, then 47 queued callbacks, `Advance(47)`, `AdmitFuture`.
///
/// An admission that finds the queue full expires the due waiters to make
/// room. With more due waiters than one wake batch (32), the gate expired
/// one batch, queued the newcomer and left the other 15 overdue waiters in
/// the queue (stats: expired 32, queued 16), where the reference gate
/// expires all 47 (expired 47, queued 1).
#[test]
fn a_full_queue_expires_every_due_waiter_before_queueing() {
    let clock = ManualClock::new();
    let config = GateConfig::new(1)
        .with_queue(47)
        .with_queue_timeout(Some(Duration::from_millis(1)));
    let gate = Arc::new(AdmissionGate::with_clock(config, clock.clone()).unwrap());
    let _running = gate.try_admit_owned().unwrap();

    let timed_out = Arc::new(AtomicUsize::new(0));
    let tickets: Vec<_> = (0..47)
        .map(|_| {
            let timed_out = timed_out.clone();
            gate.admit_with_callback(Box::new(move |r| {
                assert!(matches!(r, Err(AdmitError::QueueTimeout)), "{r:?}");
                timed_out.fetch_add(1, Ordering::Relaxed);
            }))
        })
        .collect();
    assert_eq!(gate.queued(), 47);
    assert!(tickets.iter().all(|t| t.is_queued()));

    clock.advance(Duration::from_millis(47));
    let waker = Waker::from(Arc::new(Noop));
    let mut newcomer = gate.admit_owned();
    assert!(Pin::new(&mut newcomer)
        .poll(&mut Context::from_waker(&waker))
        .is_pending());

    let s = gate.stats();
    assert_eq!(
        (s.expired, s.queued),
        (47, 1),
        "every due waiter expires: {s:?}"
    );
    assert_eq!(timed_out.load(Ordering::Relaxed), 47);
    assert!(tickets.iter().all(|t| !t.is_queued()));
}
