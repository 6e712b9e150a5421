//! The blocking wait: a thread queues a cell and sleeps on one of the gate's
//! condition variables (shared by cell index) until the cell is resolved,
//! its own timeout runs out, or the queue deadline comes, which it enforces
//! itself.

use std::time::{Duration, Instant};

use crate::sync::{lock, Ordering};

use super::error::AdmitError;
use super::raw::{Enqueued, Fast, RawGate};
use super::state::Word;
use super::table::Waiter;
use super::wake::WakeList;

impl RawGate {
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
        let mut wakes = WakeList::new();
        let step = self.enqueue(class, Waiter::Thread, &mut wakes);
        wakes.run(self);
        let idx = match step {
            Enqueued::Direct(_) => return Ok(()),
            Enqueued::Rejected(e, _) => return Err(e),
            Enqueued::Queued(idx, gen) => {
                if self.lock_free() {
                    return self.lf_block((idx, gen), give_up);
                }
                idx
            }
        };
        let cv = &self.condvars[idx as usize % self.condvars.len()];
        let mut t = lock(&self.table);
        loop {
            if let Some(outcome) = self.cells.load(idx).1.outcome() {
                self.cells.free(idx);
                return outcome;
            }
            let mut wait = None;
            // Acquire: the rule for loads under the mutex (`closed` itself
            // only changes under it).
            let closed = Word(self.state.load(Ordering::Acquire)).closed();
            if let Some(deadline) = self.classes.timeout[class].filter(|_| !closed) {
                // (Once closed, close() rejects us and notifies.)
                let now = self.clock.now_nanos();
                let due = t.cells[idx as usize].enqueued_at.saturating_add(deadline);
                if now >= due {
                    // Everyone ahead of us in our class is older, so due too:
                    // expire from the heads until our own cell is reached.
                    let mut wakes = WakeList::new();
                    self.expire_locked(&mut t, now, &mut wakes);
                    drop(t);
                    wakes.run(self);
                    t = lock(&self.table);
                    continue;
                }
                wait = Some(Duration::from_nanos(due - now));
            }
            if let Some(give_up) = give_up {
                let now = Instant::now();
                if now >= give_up {
                    self.unqueue_locked(&mut t, idx);
                    t.take_waiter(idx); // a thread: nothing to drop
                    self.cells.free(idx);
                    return Err(AdmitError::TimedOut);
                }
                let left = give_up - now;
                wait = Some(wait.map_or(left, |w: Duration| w.min(left)));
            }
            t = match wait {
                None => crate::sync::wait(cv, t),
                Some(d) => crate::sync::wait_timeout(cv, t, d),
            };
        }
    }
}
