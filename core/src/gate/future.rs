//! The admission futures, [`Admit`] and [`AdmitOwned`]: a request that
//! cannot be admitted at once queues a cell holding its task's waker, and
//! each later poll reads the cell's status (swapping in its waker if it
//! changed: `fifo/owner.rs`, "Wakers").

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use super::error::AdmitError;
use super::permit::{OwnedPermit, Permit};
use super::queue::{Enqueued, Waiter, WakerId};
use super::raw::Fast;
use super::AdmissionGate;

/// Where a future stands.
#[derive(Debug, Clone, Copy)]
pub(super) enum WaitState {
    /// Not polled yet; the request's class.
    Start(usize),
    /// Queued: the waiter's handle, its cell's generation, and which waker
    /// the cell holds.
    Queued(u32, u32, WakerId),
    /// Returned its output.
    Done,
}

/// The shared poll of both futures. Inlined, so that a direct admission or
/// a rejection costs no call; queueing is out of line.
#[inline(always)]
fn poll_admit(
    gate: &AdmissionGate,
    state: &mut WaitState,
    waker: &Waker,
) -> Poll<Result<(), AdmitError>> {
    let outcome = match *state {
        WaitState::Start(class) => match gate.raw.admit_fast(class) {
            Fast::Admitted => Ok(()),
            Fast::Rejected(e) => Err(e),
            Fast::Slow => match enqueue(gate, class, waker) {
                Ok((id, gen)) => {
                    *state = WaitState::Queued(id, gen, WakerId::of(waker));
                    return Poll::Pending;
                }
                Err(outcome) => outcome,
            },
        },
        WaitState::Queued(id, _, ref mut registered) => {
            match gate.raw.poll(id, registered, waker) {
                Poll::Ready(r) => r,
                Poll::Pending => return Poll::Pending,
            }
        }
        WaitState::Done => panic!("admission future polled after it completed"),
    };
    *state = WaitState::Done;
    Poll::Ready(outcome)
}

/// The slow part of a first poll: the cell the request queued in, or its
/// outcome when it was admitted or rejected after all.
#[inline(never)]
fn enqueue(
    gate: &AdmissionGate,
    class: usize,
    waker: &Waker,
) -> Result<(u32, u32), Result<(), AdmitError>> {
    match gate.raw.enqueue(class, Waiter::Task(waker)) {
        Enqueued::Direct(_) => Err(Ok(())),
        Enqueued::Rejected(e, _) => Err(Err(e)),
        Enqueued::Queued(idx, gen) => Ok((idx, gen)),
    }
}

/// Future of [`AdmissionGate::admit`]: resolves to a [`Permit`] or the reason
/// the request was refused. It joins the queue when first polled; dropping it
/// while queued leaves the queue at once (a cancellation, not a rejection),
/// and dropping it after a slot was handed to it releases that slot.
///
/// It is `Unpin` and needs nothing from the executor but its waker, so any
/// executor, or a hand-written loop calling `poll`, can drive it.
#[must_use = "futures do nothing unless polled"]
pub struct Admit<'a> {
    gate: &'a AdmissionGate,
    state: WaitState,
}

impl<'a> Admit<'a> {
    pub(super) fn new(gate: &'a AdmissionGate, class: usize) -> Self {
        Self {
            gate,
            state: WaitState::Start(class),
        }
    }

    /// True while the future sits in the queue (polled, not yet resolved).
    pub fn is_queued(&self) -> bool {
        matches!(self.state, WaitState::Queued(..))
    }
}

impl<'a> Future for Admit<'a> {
    type Output = Result<Permit<'a>, AdmitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        poll_admit(this.gate, &mut this.state, cx.waker()).map_ok(|()| Permit::new(this.gate))
    }
}

impl Drop for Admit<'_> {
    fn drop(&mut self) {
        if let WaitState::Queued(id, gen, _) = self.state {
            self.gate.raw.cancel(id, gen);
        }
    }
}

impl fmt::Debug for Admit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admit")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// Future of [`AdmissionGate::admit_owned`]: like [`Admit`], resolving to an
/// [`OwnedPermit`]. It is `'static`, so it can be stored or spawned.
#[must_use = "futures do nothing unless polled"]
pub struct AdmitOwned {
    gate: Arc<AdmissionGate>,
    state: WaitState,
}

impl AdmitOwned {
    pub(super) fn new(gate: Arc<AdmissionGate>, class: usize) -> Self {
        Self {
            gate,
            state: WaitState::Start(class),
        }
    }

    /// True while the future sits in the queue (polled, not yet resolved).
    pub fn is_queued(&self) -> bool {
        matches!(self.state, WaitState::Queued(..))
    }
}

impl Future for AdmitOwned {
    type Output = Result<OwnedPermit, AdmitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        poll_admit(&this.gate, &mut this.state, cx.waker())
            .map_ok(|()| OwnedPermit::new(Arc::clone(&this.gate)))
    }
}

impl Drop for AdmitOwned {
    fn drop(&mut self) {
        if let WaitState::Queued(id, gen, _) = self.state {
            self.gate.raw.cancel(id, gen);
        }
    }
}

impl fmt::Debug for AdmitOwned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmitOwned")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}
