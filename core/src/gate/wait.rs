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
//! # Protocol
//!
//! The count changes lock-free, beside the classes' counts (a gate with a
//! wait limit runs the counted protocol of `classes.rs`, with one class
//! too):
//!
//! * **Wait slot first.** A direct admission reserves a wait slot (CAS
//!   `waiting + 1` below `W`), then takes the request slot in the word; a
//!   handoff reserves the request slot, then the wait slot. A reservation
//!   that cannot be completed is given back.
//! * **Freeing a wait slot** (a first response, a direct admission that
//!   gave its reservation back) is `waiting - 1`. Only the one that takes
//!   the count down from `W` can owe a waiter the slot: a handoff or an
//!   arrival that found every wait slot taken read `W`, and the count's
//!   next change after that read is such a decrement (nothing rises past
//!   `W`). That one then makes a read-modify-write of the word
//!   (`fetch_add(0)`) and hands on if waiters are counted; any other stops
//!   there, since a waiter counted while a wait slot was free waits for a
//!   request slot, not for a wait slot (invariant 5 of `state.rs`); with a
//!   queue deadline it still looks at the word, to expire due waiters. A
//!   release that still holds its wait slot gives it back before its
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
//! A gate without a wait limit finds every check here true at once.
//!
//! [`Permit::first_response`]: super::Permit::first_response

use crate::sync::Ordering;

use super::raw::RawGate;
use super::state::{Word, ONE_RUNNING};
use super::tell::Detached;

impl<D: Detached> RawGate<D> {
    /// The wait count, as a gauge.
    pub(super) fn waiting(&self) -> u32 {
        // Relaxed: a gauge read for display; it orders nothing.
        self.state.waiting.load(Ordering::Relaxed)
    }

    /// Gives back a held slot, with its wait slot if `wait`: the wait slot
    /// first, so that the release's `fetch_sub` pairs for both.
    #[inline]
    pub(super) fn release_held(&self, wait: bool) {
        if wait {
            // The release's `fetch_sub` below pairs for it (module docs).
            let _ = self.drop_wait();
        }
        self.release();
    }

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
    /// whether every wait slot was taken before (module docs). The caller
    /// then writes the word.
    #[inline]
    pub(super) fn drop_wait(&self) -> bool {
        let Some(limit) = self.wait_limit else {
            return false;
        };
        // AcqRel: see the module docs.
        let old = self.state.waiting.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(old > 0, "a wait slot given back twice");
        old >= limit
    }

    /// Gives back a wait slot held without a request slot (a first
    /// response, a reservation a direct admission did not use), then hands
    /// on if waiters are counted, when it may owe them one (module docs).
    pub(super) fn free_wait(&self) {
        let w = if self.drop_wait() {
            // AcqRel: the freeing side of the pairing in the module docs.
            Word(self.state.fetch_add(0, Ordering::AcqRel))
        } else if self.deadlines {
            // A wait slot was free before: no waiter was left for want of
            // one (module docs, "Freeing a wait slot"), but the queue moved,
            // so due waiters expire. Acquire: a plain look, not a pairing.
            Word(self.state.load(Ordering::Acquire))
        } else {
            return;
        };
        if w.queued() > 0 {
            self.hand_on(false);
        }
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

    /// A permit's first response: its wait slot goes to the oldest waiter
    /// if a request slot is free too, else back to the gate.
    pub(super) fn first_response(&self) {
        self.free_wait();
    }
}
