//! Driving the gate's futures by hand in tests: poll once with a no-op
//! waker, and the outcomes the gate tests expect (queued, granted, direct,
//! rejected).
#![allow(dead_code)] // each including binary uses a different subset

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use loadgate::{AdmissionGate, AdmitError, AdmitOwned, OwnedPermit};

/// Polls a future once with a no-op waker.
pub fn poll<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(Waker::noop()))
}

/// A request of class `priority` that must queue.
pub fn queued_at(g: &Arc<AdmissionGate>, priority: u8) -> AdmitOwned {
    let mut f = g.admit_owned_at(priority);
    assert!(
        poll(&mut f).is_pending(),
        "expected to queue: {:?}",
        g.stats()
    );
    assert!(f.is_queued());
    f
}

/// A class-0 request that must queue.
pub fn queued(g: &Arc<AdmissionGate>) -> AdmitOwned {
    queued_at(g, 0)
}

/// A queued future's permit, which it must have been granted.
pub fn granted(f: &mut AdmitOwned) -> OwnedPermit {
    match poll(f) {
        Poll::Ready(Ok(p)) => p,
        other => panic!("expected a permit, got {other:?}"),
    }
}

/// A future's refusal, which it must have had.
pub fn rejected(f: &mut AdmitOwned) -> AdmitError {
    match poll(f) {
        Poll::Ready(Err(e)) => e,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// A request of class `priority` that must be admitted at once.
pub fn direct_at(g: &Arc<AdmissionGate>, priority: u8) -> OwnedPermit {
    match poll(&mut g.admit_owned_at(priority)) {
        Poll::Ready(Ok(p)) => p,
        other => panic!("expected a direct admission, got {other:?}"),
    }
}

/// A class-0 request that must be admitted at once.
pub fn direct(g: &Arc<AdmissionGate>) -> OwnedPermit {
    direct_at(g, 0)
}

/// A queued future's outcome without its permit: `None` while queued, else
/// `Ok(())` (the permit is released at once) or the error.
pub fn outcome(f: &mut AdmitOwned) -> Option<Result<(), AdmitError>> {
    match poll(f) {
        Poll::Ready(r) => Some(r.map(drop)),
        Poll::Pending => None,
    }
}
