//! The wait limit `W`: at most `W` admitted requests without their first
//! response. A request is admitted only when a request slot (`N`) and a
//! wait slot (`W`) are both free; [`Permit::first_response`] gives the wait
//! slot back, and releasing a permit gives back whatever it still holds.
//!
//! The wait count is not in the state word (its 64 bits are taken): it is
//! an atomic changed only under the gate's mutex, and every decision that
//! reads it is made under the mutex. So a gate with a wait limit admits
//! only under the mutex (`try_direct` refuses, `admit_fast` sends a
//! request that might be admitted to the slow path), while the lock-free
//! paths that do not need the count stay lock-free: rejection while no slot
//! is free and the queue is full, and the release of a permit that already
//! responded while nobody is queued. A gate without a wait limit never
//! reaches this file.
//!
//! Invariant 4 of the state word becomes: `queued > 0` implies
//! `running >= limit`, or every wait slot taken, or `closed`. A freed wait
//! slot with a free request slot therefore goes to the oldest waiter at
//! once, as a freed request slot does.
//!
//! [`Permit::first_response`]: super::Permit::first_response

use crate::sync::{lock, Ordering};

use super::raw::RawGate;
use super::state::Word;
use super::table::Table;
use super::wake::WakeList;

impl RawGate {
    /// Whether a wait slot is free (always without a wait limit). Call with
    /// the mutex held.
    #[inline]
    pub(super) fn wait_free(&self) -> bool {
        self.free_waits() > 0
    }

    /// The wait count, as a gauge.
    pub(super) fn waiting(&self) -> u32 {
        // Relaxed: a gauge read for display; it orders nothing.
        self.waiting.load(Ordering::Relaxed)
    }

    /// Free wait slots (`u32::MAX` without a wait limit). Call with the
    /// mutex held.
    pub(super) fn free_waits(&self) -> u32 {
        match self.wait_limit {
            None => u32::MAX,
            // Relaxed: changed only under the mutex, which we hold.
            Some(w) => w.saturating_sub(self.waiting.load(Ordering::Relaxed)),
        }
    }

    /// An admission takes a wait slot (a no-op without a wait limit). Call
    /// with the mutex held, after checking [`wait_free`](Self::wait_free).
    #[inline]
    pub(super) fn take_wait(&self) {
        if self.wait_limit.is_some() {
            // Relaxed: only under the mutex, which orders it.
            let n = self.waiting.load(Ordering::Relaxed);
            debug_assert!(self.wait_limit.is_some_and(|w| n < w));
            self.waiting.store(n + 1, Ordering::Relaxed);
        }
    }

    /// A wait slot comes back. Call with the mutex held.
    pub(super) fn put_wait(&self) {
        // Relaxed: only under the mutex, which orders it.
        let n = self.waiting.load(Ordering::Relaxed);
        debug_assert!(n > 0, "first response without a held wait slot");
        self.waiting.store(n - 1, Ordering::Relaxed);
    }

    /// Gives back a held slot, and with `wait` its wait slot too.
    #[inline]
    pub(super) fn release_held(&self, wait: bool) {
        if wait {
            self.release_with_wait();
        } else {
            self.release_slot();
        }
    }

    /// `try_admit` of `class` on a gate with a wait limit, or with classes
    /// while someone waits: admits if a request slot within the class's
    /// share and a wait slot are free and nobody of the class or a more
    /// important one is queued; the word seen otherwise. Under the mutex,
    /// but on the lock-free queues (no wait limit there), which decide by
    /// the classes' counts (`classes.rs`).
    pub(super) fn try_direct_slow(&self, class: usize) -> Result<(), Word> {
        if self.lock_free() {
            return self.try_direct_counted(class);
        }
        let mut t = lock(&self.table);
        // Nobody of this class or a more important one waits.
        let first = self.first_in_line(&mut t, class);
        self.take_slot_while(|w| {
            !w.closed() && first && self.classes.room(class, w) && self.wait_free()
        })?;
        self.take_wait();
        Ok(())
    }

    /// A permit's first response: its wait slot goes to the oldest waiter
    /// if a request slot is free too, else back to the gate.
    pub(super) fn first_response(&self) {
        self.in_batches(|t, wakes| self.first_response_locked(t, wakes));
    }

    /// False when the wake list filled with expired waiters first (call
    /// again; the wait slot was not given back yet).
    fn first_response_locked(&self, t: &mut Table, wakes: &mut WakeList) -> bool {
        // Acquire: the rule for loads under the mutex.
        let w = Word(self.state.load(Ordering::Acquire));
        if w.queued() > 0 && !w.closed() {
            let now = self.clock.now_nanos();
            if self.deadlines {
                self.expire_locked(t, now, wakes);
                if self.head_is_due(t, now) {
                    return false;
                }
            }
            // The most important class with a waiter, if a request slot is
            // free within its share.
            if let Some(class) = self.live_class(t).filter(|&k| self.classes.room(k, w)) {
                if wakes.is_full() {
                    return false;
                }
                let Some(idx) = self.claim_next(t, class) else {
                    return false; // cancelled meanwhile: look again
                };
                // The waiter takes a free request slot and the wait slot we
                // give up (count unchanged). A CAS loop: `running` may fall
                // meanwhile (a lock-free release), never rise (`queued > 0`,
                // invariant 3), so the room seen above is still there. The
                // word first (see `grant`).
                self.update(|w| Word::new(w.running() + 1, w.queued() - 1, w.limit(), w.closed()));
                self.grant(t, idx, now, wakes);
                self.sync_head(t);
                return true;
            }
        }
        self.put_wait();
        true
    }
}
