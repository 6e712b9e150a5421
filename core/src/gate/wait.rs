//! The wait limit `W`: at most `W` admitted requests without their first
//! response. A request is admitted only when a request slot (`N`) and a
//! wait slot (`W`) are both free; [`Permit::first_response`] gives the wait
//! slot back, and releasing a permit gives back whatever it still holds.
//!
//! The wait count is not in the state word (its 64 bits are taken): it is
//! an atomic beside it, on the same cache line (`raw.rs`, `StateLine`). Invariant 4 of the state word becomes: `queued >
//! 0` implies `running >= limit`, or every wait slot taken, or `closed`. A
//! freed wait slot with a free request slot therefore goes to the oldest
//! waiter at once, as a freed request slot does.
//!
//! # On the lock-free queues
//!
//! A gate without adaptive LIFO runs the counted protocol of `classes.rs`
//! (with one class too) and takes no lock:
//!
//! * **Wait slot first.** A direct admission reserves a wait slot (CAS
//!   `waiting + 1` below `W`), then takes the request slot in the word; a
//!   handoff reserves the request slot, then the wait slot. A reservation
//!   that cannot be completed is given back.
//! * **Freeing a wait slot** (a first response, a direct admission that
//!   gave its reservation back) is `waiting - 1`, then a read-modify-write
//!   of the word (`fetch_add(0)`), then a handoff if waiters are counted.
//!   A release that still holds its wait slot gives it back before its
//!   request slot, whose `fetch_sub` is that read-modify-write.
//! * **A handoff that finds no wait slot** gives its request slot back
//!   (an `AcqRel` `fetch_sub`) and reads the wait count again: it goes on
//!   only if a wait slot came free meanwhile, else whoever frees one next
//!   hands on.
//!
//! The pairing is the one of `classes.rs`, on a second location: a freed
//! wait slot (a write of the count, then a read of the word) against a
//! handoff or an arrival that saw every wait slot taken (a write of the
//! word, then a read of the count). Both sides write the word with a
//! read-modify-write, `AcqRel`; the word's modification order puts one
//! before the other, and the later one sees the earlier one's write. A
//! loom model loses a wake-up without it.
//!
//! # On the table
//!
//! With adaptive LIFO the count is changed only under the gate's mutex, and
//! every decision that reads it is made under the mutex. So such a gate
//! admits only under the mutex (`try_direct` refuses, `admit_fast` sends a
//! request that might be admitted to the slow path), while the lock-free
//! paths that do not need the count stay lock-free: rejection while no
//! slot is free and the queue is full, and the release of a permit that
//! already responded while nobody is queued.
//!
//! A gate without a wait limit never reaches this file.
//!
//! [`Permit::first_response`]: super::Permit::first_response

use crate::sync::{lock, Ordering};

use super::raw::RawGate;
use super::state::{Word, ONE_RUNNING};
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
        self.state.waiting.load(Ordering::Relaxed)
    }

    /// Free wait slots (`u32::MAX` without a wait limit). Call with the
    /// mutex held.
    pub(super) fn free_waits(&self) -> u32 {
        match self.wait_limit {
            None => u32::MAX,
            // Relaxed: changed only under the mutex, which we hold.
            Some(w) => w.saturating_sub(self.state.waiting.load(Ordering::Relaxed)),
        }
    }

    /// An admission takes a wait slot (a no-op without a wait limit). Call
    /// with the mutex held, after checking [`wait_free`](Self::wait_free).
    #[inline]
    pub(super) fn take_wait(&self) {
        if self.wait_limit.is_some() {
            // Relaxed: only under the mutex, which orders it.
            let n = self.state.waiting.load(Ordering::Relaxed);
            debug_assert!(self.wait_limit.is_some_and(|w| n < w));
            self.state.waiting.store(n + 1, Ordering::Relaxed);
        }
    }

    /// A wait slot comes back. Call with the mutex held.
    pub(super) fn put_wait(&self) {
        // Relaxed: only under the mutex, which orders it.
        let n = self.state.waiting.load(Ordering::Relaxed);
        debug_assert!(n > 0, "first response without a held wait slot");
        self.state.waiting.store(n - 1, Ordering::Relaxed);
    }

    /// Gives back a held slot, and with `wait` its wait slot too.
    #[inline]
    pub(super) fn release_held(&self, wait: bool) {
        if self.lock_free() {
            return self.lf_release_grant(wait);
        }
        if wait {
            self.release_with_wait();
        } else {
            self.release_slot();
        }
    }

    // ----- on the lock-free queues (module docs) ---------------------------

    /// Reserves a wait slot: CAS `waiting + 1` below `W` (always true
    /// without a wait limit).
    #[inline]
    pub(super) fn reserve_wait(&self) -> bool {
        let Some(limit) = self.wait_limit else {
            return true;
        };
        // AcqRel: a change of the count, ordered with its other changes;
        // Acquire for each new guess.
        self.state
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok()
    }

    /// Whether every wait slot is taken (never without a wait limit).
    pub(super) fn waits_full(&self) -> bool {
        // Acquire: pairs with the AcqRel changes of the count (module docs).
        self.wait_limit
            .is_some_and(|limit| self.state.waiting.load(Ordering::Acquire) >= limit)
    }

    /// Takes a held wait slot off the count (a no-op without a wait limit):
    /// the caller then writes the word (module docs).
    #[inline]
    pub(super) fn drop_wait(&self) {
        if self.wait_limit.is_some() {
            // AcqRel: see the module docs.
            let old = self.state.waiting.fetch_sub(1, Ordering::AcqRel);
            debug_assert!(old > 0, "a wait slot given back twice");
        }
    }

    /// Gives back a wait slot held without a request slot (a first
    /// response, a reservation a direct admission did not use), then hands
    /// on if waiters are counted (module docs).
    pub(super) fn free_wait(&self) {
        self.drop_wait();
        // AcqRel: the freeing side of the pairing in the module docs.
        let w = Word(self.state.fetch_add(0, Ordering::AcqRel));
        if w.queued() > 0 {
            self.lf_hand_on(false);
        }
    }

    /// Gives back a granted slot, with its wait slot if `wait`: the wait
    /// slot first, so that the release's `fetch_sub` pairs for both.
    #[inline]
    pub(super) fn lf_release_grant(&self, wait: bool) {
        if wait {
            self.drop_wait();
        }
        self.lf_release();
    }

    /// A handoff holding a request slot found every wait slot taken: gives
    /// the request slot back and says whether a wait slot came free
    /// meanwhile (then the handoff goes on; module docs).
    pub(super) fn undo_for_waits(&self) -> bool {
        // AcqRel: a freeing write, and the handoff's side of the pairing.
        self.state.fetch_sub(ONE_RUNNING, Ordering::AcqRel);
        !self.waits_full()
    }

    /// For an arrival's direct admission: holds a wait slot, reserving one
    /// unless `held` says it does already (always true without a wait
    /// limit, where `held` stays false).
    pub(super) fn hold_wait(&self, held: &mut bool) -> bool {
        if self.wait_limit.is_none() || *held {
            return true;
        }
        *held = self.reserve_wait();
        *held
    }

    /// Gives back the wait slot an arrival held for a direct admission it
    /// did not make.
    pub(super) fn unhold_wait(&self, held: &mut bool) {
        if std::mem::take(held) {
            self.free_wait();
        }
    }

    /// `try_admit` of `class` on a gate with a wait limit, or with classes
    /// while someone waits: admits if a request slot within the class's
    /// share and a wait slot are free and nobody of the class or a more
    /// important one is queued; the word seen otherwise. Under the mutex,
    /// but on the lock-free queues, which decide by the classes' counts
    /// (`classes.rs`).
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
        if self.lock_free() {
            return self.free_wait();
        }
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
