//! The blocking wait: a thread queues a cell holding a waker that unparks
//! it (`tell.rs`) and parks until the cell is resolved, its own timeout
//! runs out, or its queue deadline comes, which it enforces itself.

use std::time::{Duration, Instant};

use crate::sync::{park, park_timeout, spin_wait};

use super::error::AdmitError;
use super::queue::{outcome, split_id, Enqueued, Waiter};
use super::raw::{Fast, RawGate};
use super::tell::Detached;

impl<D: Detached> RawGate<D> {
    /// The blocking wait of a request of `class`: `Ok` once the thread holds
    /// a slot.
    pub(super) fn wait_blocking(
        &self,
        class: usize,
        timeout: Option<Duration>,
    ) -> Result<(), AdmitError> {
        match self.admit_fast(class) {
            Fast::Admitted => return Ok(()),
            Fast::Rejected(e) => return Err(e),
            Fast::Slow => {}
        }
        let give_up = timeout.and_then(|d| Instant::now().checked_add(d));
        match self.enqueue(class, Waiter::Thread) {
            Enqueued::Direct(_) => Ok(()),
            Enqueued::Rejected(e, _) => Err(e),
            Enqueued::Queued(id, gen) => self.block(id, gen, give_up),
        }
    }

    /// A blocking waiter's wait from its push (waiter `id` of generation
    /// `gen`) until its outcome, its queue deadline or `give_up`.
    fn block(&self, id: u32, gen: u32, give_up: Option<Instant>) -> Result<(), AdmitError> {
        let (class, cell) = split_id(id);
        let fifo = &self.fifos[class];
        loop {
            // The cell holds this thread's waker since the push (`fifo/owner.rs`,
            // "Wakers"): whoever resolves it unparks us.
            if let Some(o) = outcome(fifo.settled(cell)) {
                fifo.free_cell(cell);
                return o;
            }
            let mut wait = None;
            if let Some(timeout) = self.classes.timeout[class] {
                let now = self.clock.now_nanos();
                let due = fifo.enqueued_at(cell).saturating_add(timeout);
                if now >= due {
                    self.expire();
                    // Expiry stops at the first waiter not due; one ahead
                    // of us may have read the clock a moment later.
                    if self.leave(class, cell, gen, Some(AdmitError::QueueTimeout)) {
                        return Err(AdmitError::QueueTimeout);
                    }
                    continue;
                }
                wait = Some(Duration::from_nanos(due - now));
            }
            if let Some(give_up) = give_up {
                let now = Instant::now();
                if now >= give_up {
                    if self.leave(class, cell, gen, None) {
                        return Err(AdmitError::TimedOut);
                    }
                    // Resolved meanwhile (or being resolved): its outcome
                    // comes first.
                    spin_wait();
                    continue;
                }
                let left = give_up - now;
                wait = Some(wait.map_or(left, |w: Duration| w.min(left)));
            }
            match wait {
                None => park(),
                Some(d) => park_timeout(d),
            }
        }
    }
}
