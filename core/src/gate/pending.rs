//! Admission in two steps, for a binding whose waiter must exist before it
//! can be told (an asyncio future, a C++ engine's request object):
//! [`AdmissionGate::admit_pending`] admits or rejects at once, or queues the
//! request with nobody to tell yet; [`PendingAdmission::arm`] then leaves a
//! callback in its cell, unless the request was resolved meanwhile, and then
//! it returns the outcome instead. So the callback never runs before the
//! caller armed it, and an early outcome comes back as a value, never
//! through the callback: the binding keeps no state of its own for that race.
//!
//! The queued cell is pushed as a waiter nobody is told of (not detached, no
//! waker); arming writes the callback into the cell and sets its detached
//! flag with one compare-exchange on the cell's status word, which fails if
//! a grant, an expiry, a displacement or a close came first
//! (`fifo.rs`, `Fifo::detach`).

use std::fmt;
use std::sync::Arc;

use super::callback::{AdmitCallback, CallbackTicket, QueuedCallback};
use super::error::AdmitError;
use super::permit::OwnedPermit;
use super::queue::{Enqueued, Waiter};
use super::raw::Fast;
use super::AdmissionGate;

/// The first step's answer: see [`AdmissionGate::admit_pending`].
#[derive(Debug)]
#[must_use = "a queued request waits until armed or dropped"]
pub enum Pending {
    /// Admitted or rejected at once.
    Ready(Result<OwnedPermit, AdmitError>),
    /// Queued, with nobody to tell yet: arm it, or drop it to leave the
    /// queue.
    Queued(PendingAdmission),
}

/// A queued request that has nobody to tell yet. [`arm`](Self::arm) it with
/// the callback to call; dropping it unarmed takes the request out of the
/// queue (a cancellation), or releases the slot it was granted meanwhile.
#[must_use = "a queued request waits until armed or dropped"]
pub struct PendingAdmission {
    gate: Arc<AdmissionGate>,
    /// The waiter's handle and its cell's generation; `None` once armed.
    cell: Option<(u32, u32)>,
}

impl PendingAdmission {
    /// Leaves `callback` for whoever resolves the request, which calls it
    /// exactly once, on its own thread (see
    /// [`AdmissionGate::admit_with_callback`]); the ticket can cancel it.
    /// If the request was resolved before the arm, its outcome instead, and
    /// `callback` is dropped without being called.
    pub fn arm(
        mut self,
        callback: AdmitCallback,
    ) -> Result<CallbackTicket, Result<OwnedPermit, AdmitError>> {
        let (id, gen) = self.cell.take().expect("armed once: arm takes self");
        let queued = QueuedCallback::new(callback, Arc::clone(&self.gate));
        match self.gate.raw.arm(id, gen, queued) {
            Ok(()) => Ok(CallbackTicket::new(Arc::clone(&self.gate), Some((id, gen)))),
            Err((outcome, queued)) => {
                drop(queued);
                Err(outcome.map(|()| OwnedPermit::new(Arc::clone(&self.gate))))
            }
        }
    }
}

impl Drop for PendingAdmission {
    fn drop(&mut self) {
        if let Some((id, gen)) = self.cell {
            self.gate.raw.cancel(id, gen);
        }
    }
}

impl fmt::Debug for PendingAdmission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingAdmission").finish_non_exhaustive()
    }
}

/// [`AdmissionGate::admit_pending_at`]: admits, rejects or queues with
/// nobody to tell yet.
pub(super) fn admit(gate: &Arc<AdmissionGate>, class: usize) -> Pending {
    let outcome = match gate.raw.admit_fast(class) {
        Fast::Admitted => Ok(()),
        Fast::Rejected(e) => Err(e),
        Fast::Slow => match gate.raw.enqueue(class, Waiter::Later) {
            Enqueued::Queued(id, gen) => {
                return Pending::Queued(PendingAdmission {
                    gate: Arc::clone(gate),
                    cell: Some((id, gen)),
                });
            }
            Enqueued::Direct(_) => Ok(()),
            Enqueued::Rejected(e, _) => Err(e),
        },
    };
    Pending::Ready(outcome.map(|()| OwnedPermit::new(Arc::clone(gate))))
}
