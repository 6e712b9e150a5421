//! The owner's side of a waiter cell: taking and freeing it, reading its
//! status, and the hand-over of its waker and of its callback (arming).
//!
//! # Wakers
//!
//! A waiter that is not detached leaves its waker in its cell, and the cell's
//! status word says who owns it: the `WAKER` flag beside `QUEUED` hands it to
//! the resolvers. Whoever moves the cell out of `QUEUED` from a word with the
//! flag (a grant, a leave: each a CAS on the word) takes the waker before
//! storing the final status, and wakes it after: a grant to such a cell goes
//! through `CANCELLING` (resolving) for that, a leave does anyway. The owner
//! puts its waker in before the push publishes the cell; to swap in another
//! (a poll with a new waker) it clears the flag by CAS (the slot is its own
//! again), swaps, and sets the flag by CAS; if a resolver moved the cell on
//! meanwhile, it saw no flag and took nothing, and the owner takes its
//! waker back and reads the outcome. So a waker is handed over by the status
//! change that resolves the cell, with no read-modify-write of its own, and
//! an owner that finds `CANCELLING` waits a few instructions for the outcome.
//!

use std::task::Waker;

use crate::sync::{spin_wait, Ordering};

use super::words::*;
use super::Fifo;

impl<T: Default> Fifo<T> {
    // ----- waiter cells ---------------------------------------------------------

    /// A free waiter cell and its generation, or `None` when all are taken.
    pub(in crate::gate) fn take_cell(&self) -> Option<(u32, u32)> {
        self.cells.take()
    }

    /// Gives back a cell its owner is done with (taken and never pushed, or
    /// resolved and its outcome taken).
    pub(in crate::gate) fn free_cell(&self, cell: u32) {
        self.cells.free(cell);
    }

    /// The caller's part of a cell.
    #[inline]
    pub(in crate::gate) fn payload(&self, cell: u32) -> &T {
        &self.cells.get(cell).payload
    }

    /// The clock time at which a cell was pushed (for its owner, or a
    /// teller of a granted cell, before the cell is freed).
    #[inline]
    pub(in crate::gate) fn enqueued_at(&self, cell: u32) -> u64 {
        // Relaxed: written before the Release that made the cell queued,
        // which the caller has read.
        self.cells.get(cell).enqueued_at.load(Ordering::Relaxed)
    }

    /// How many waiters were ever pushed: the positions handed out.
    pub(in crate::gate) fn pushed(&self) -> u64 {
        // Relaxed: a statistic.
        self.enq.load(Ordering::Relaxed)
    }

    /// A cell's generation and status.
    #[inline]
    pub(in crate::gate) fn status(&self, cell: u32) -> (u32, Status) {
        // Acquire: pairs with a grant's or rejection's Release.
        waiter_status(self.cells.get(cell).state.load(Ordering::Acquire))
    }

    /// Makes queued cell `cell` (generation `gen`), pushed neither detached
    /// nor with a waker, detached: from now on whoever resolves it frees it
    /// and tells what its owner left in the payload. `Err` with its final
    /// status if it was resolved first: the owner keeps the cell.
    pub(in crate::gate) fn detach(&self, cell: u32, gen: u32) -> Result<(), Status> {
        let w = self.cells.get(cell);
        loop {
            // Acquire: a final status's Release (the outcome).
            let word = w.state.load(Ordering::Acquire);
            let (g, status) = waiter_status(word);
            debug_assert_eq!(g, gen, "detached a cell it does not own");
            match status {
                Status::Queued => {
                    debug_assert_eq!(word & (DETACHED | WAKER), 0);
                    // Release: a resolver that claims the detached word
                    // (Acquire) sees the payload.
                    if w.state
                        .compare_exchange(
                            word,
                            word | DETACHED,
                            Ordering::Release,
                            Ordering::Relaxed,
                        )
                        .is_ok()
                    {
                        return Ok(());
                    }
                }
                Status::Cancelling => spin_wait(),
                status => return Err(status),
            }
        }
    }

    /// A cell's status once any resolution in flight has finished (a
    /// `Cancelling` cell is a few instructions from its final status): for
    /// its owner.
    pub(in crate::gate) fn settled(&self, cell: u32) -> Status {
        loop {
            match self.status(cell).1 {
                Status::Cancelling => spin_wait(),
                status => return status,
            }
        }
    }

    /// The owner of queued cell `cell` makes `waker` the one its resolver
    /// wakes, in place of the one the cell holds ("Wakers"). `None` once it
    /// is; the cell's final status if it was resolved first.
    pub(in crate::gate) fn register(&self, cell: u32, waker: &Waker) -> Option<Status> {
        let w = self.cells.get(cell);
        loop {
            // Acquire: a final status's Release (the outcome).
            let word = w.state.load(Ordering::Acquire);
            match waiter_status(word).1 {
                Status::Queued => {}
                Status::Cancelling => {
                    spin_wait();
                    continue;
                }
                status => return Some(status),
            }
            let mine = word & !WAKER;
            // Take the slot back from the resolvers. Relaxed: the waker in
            // it is ours; a failure means a resolver moved the cell on.
            if word & WAKER != 0
                && w.state
                    .compare_exchange(word, mine, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            // SAFETY: the owner, queued without `WAKER`: the slot is ours.
            let stale = unsafe { w.put_waker(Some(waker.clone())) };
            // Release: the resolver that takes the waker (Acquire) sees it.
            let handed = w
                .state
                .compare_exchange(mine, mine | WAKER, Ordering::Release, Ordering::Relaxed)
                .is_ok();
            if !handed {
                // Resolved meanwhile, with no waker to take: ours again.
                // SAFETY: the word has not said `WAKER` since we cleared it.
                drop(unsafe { w.take_waker() });
            }
            drop(stale);
            if handed {
                return None;
            }
        }
    }
}
