//! Waiter cells' outcomes, readable without the gate's mutex.
//!
//! Each waiter cell (see `table.rs`) has an atomic *state word* here, so
//! that a queued future's poll and drop, a callback ticket's `is_queued`
//! and the drop of a waiter that was already resolved need no lock; a
//! *free stack* of cells, to which an owner gives its cell back without the
//! lock once it has taken its outcome; and a *cancelled stack*, on which a
//! dropped future leaves its cell for a mutex holder to unlink.
//!
//! # State word
//!
//! ```text
//!  63..32          31..16     15..8        7..0
//! +---------------+----------+------------+-----------+
//! | generation    | unused   | error code | status    |
//! +---------------+----------+------------+-----------+
//! ```
//!
//! Status: `FREE`, `QUEUED`, `CLAIMED`, `GRANTED`, `REJECTED` (with the error
//! code), `CANCELLED`.
//! The generation is bumped each time the cell is freed, so a callback
//! ticket naming an older generation knows its request is gone.
//!
//! Transitions, and who makes them:
//!
//! * `FREE(g) → QUEUED(g)`: an enqueuer, under the mutex, on a cell it took
//!   from the free stack.
//! * `QUEUED(g) → CLAIMED(g)`: a resolver under the mutex (CAS), before it
//!   counts the grant or rejection in the state word; a racing cancel loses.
//! * `CLAIMED(g) → GRANTED(g) | REJECTED(g, e)`: the same resolver, after
//!   the state word counts it and it took everything it needs from the cell
//!   (the waker, the queue time). After this store the resolver never
//!   touches the cell again, so the owner may free it at once.
//! * `QUEUED(g) → CANCELLED(g)`: a dropped future, without the mutex (CAS),
//!   then it pushes the cell on the *cancelled stack* (its own link) and
//!   gives its place back in the state word. A mutex holder pops it, unlinks
//!   it if a pick has not already, and frees it. A callback ticket's cancel
//!   makes the same CAS under the mutex and unlinks and frees the cell
//!   itself.
//! * `GRANTED | REJECTED → FREE(g + 1)`: the cell's owner, once it has
//!   taken the outcome, with or without the mutex; then it pushes the cell
//!   on the free stack. A callback's cell is freed by its resolver (the
//!   owner never looks).
//! * `QUEUED(g) → FREE(g + 1)`: a blocking waiter's timeout, under the
//!   mutex, after unlinking its cell.
//!
//! # Orderings
//!
//! * The resolver's store is `Release` and the owner's load `Acquire`: the
//!   grant (and the slot's previous holder's work, which the resolver saw)
//!   happens-before the owner runs with its permit.
//! * The enqueuer's store is `Release`, read by its own thread or under the
//!   mutex; `Relaxed` would do, `Release` costs nothing on x86 and keeps the
//!   reasoning local.
//! * A claim and a cancel are CASes on the same word: exactly one wins. The
//!   cancel's CAS is `Relaxed` on success (the cell reaches the mutex
//!   holder through the cancelled stack's `Release` push) and `Acquire` on
//!   failure (the owner goes on to read the outcome).
//! * Both stacks (free and cancelled): a push writes the cell's link (`Relaxed`) and swings
//!   the head with a `Release` CAS; a pop loads the head with `Acquire`, so
//!   it reads the link the pusher wrote, and swings it with an `Acquire`
//!   CAS. Pops happen only under the mutex, one at a time, so the head a pop
//!   read can change only by pushes of other cells, never back to the same
//!   cell with another link (no ABA), and the pop needs no tag.
//!
//! # Storage
//!
//! Cells live in chunks that are never moved or freed while the gate
//! lives (`chunks.rs`): chunk 0 holds the `Q + N` cells reserved when the
//! gate is built, and chunk `k` twice as many as chunk `k - 1`, allocated
//! under the mutex
//! when every earlier cell is taken (only if rejected waiters have not
//! looked yet while the queue refilled, or after `set_limit` raised `N`).
//! Readers index them without the lock.

use crate::sync::{AtomicU32, AtomicU64, Ordering};

use super::chunks::Chunks;
use super::error::AdmitError;

/// "No cell" in the free stack.
pub(super) const NIL: u32 = u32::MAX;

const FREE: u64 = 0;
const QUEUED: u64 = 1;
const GRANTED: u64 = 2;
const REJECTED: u64 = 3;
const CLAIMED: u64 = 4;
const CANCELLED: u64 = 5;
const STATUS_MASK: u64 = 0xff;
const ERROR_SHIFT: u32 = 8;
const GEN_SHIFT: u32 = 32;

/// What a cell says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    /// On the free stack (or about to be).
    Free,
    /// Linked in the queue.
    Queued,
    /// Handed a slot its owner has not taken yet.
    Granted,
    /// Rejected; its owner has not looked yet.
    Rejected(AdmitError),
    /// Taken out of the queue by a resolver (under the mutex) that has not
    /// stored the outcome yet; its owner can no longer cancel.
    Claimed,
    /// Its owner left while it was queued; still linked until a mutex
    /// holder unlinks it.
    Cancelled,
}

impl Status {
    /// The outcome of a resolved cell, `None` while it is queued.
    pub(super) fn outcome(self) -> Option<Result<(), AdmitError>> {
        match self {
            Status::Granted => Some(Ok(())),
            Status::Rejected(e) => Some(Err(e)),
            Status::Queued | Status::Claimed => None,
            Status::Free | Status::Cancelled => {
                unreachable!("read the outcome of a waiter cell its owner left")
            }
        }
    }
}

pub(super) fn error_code(e: AdmitError) -> u64 {
    match e {
        AdmitError::AtCapacity => 0,
        AdmitError::QueueTimeout => 1,
        AdmitError::Closed => 2,
        AdmitError::Displaced => 3,
        AdmitError::TimedOut => 4,
    }
}

pub(super) fn error_of(code: u64) -> AdmitError {
    match code {
        0 => AdmitError::AtCapacity,
        1 => AdmitError::QueueTimeout,
        2 => AdmitError::Closed,
        3 => AdmitError::Displaced,
        _ => AdmitError::TimedOut,
    }
}

fn pack(gen: u32, status: Status) -> u64 {
    let low = match status {
        Status::Free => FREE,
        Status::Queued => QUEUED,
        Status::Granted => GRANTED,
        Status::Rejected(e) => REJECTED | error_code(e) << ERROR_SHIFT,
        Status::Claimed => CLAIMED,
        Status::Cancelled => CANCELLED,
    };
    u64::from(gen) << GEN_SHIFT | low
}

fn unpack(word: u64) -> (u32, Status) {
    let status = match word & STATUS_MASK {
        FREE => Status::Free,
        QUEUED => Status::Queued,
        GRANTED => Status::Granted,
        REJECTED => Status::Rejected(error_of((word >> ERROR_SHIFT) & 0xff)),
        CLAIMED => Status::Claimed,
        _ => Status::Cancelled,
    };
    ((word >> GEN_SHIFT) as u32, status)
}

/// One cell's atomics.
struct Slot {
    state: AtomicU64,
    /// The next cell down the free stack.
    next_free: AtomicU32,
    /// The next cell down the cancelled stack.
    next_cancelled: AtomicU32,
}

impl Slot {
    fn new() -> Self {
        Self {
            state: AtomicU64::new(pack(0, Status::Free)),
            next_free: AtomicU32::new(NIL),
            next_cancelled: AtomicU32::new(NIL),
        }
    }
}

/// The cells' state words and the free stack.
pub(super) struct Cells {
    /// The cells' atomics, by index (`chunks.rs`).
    slots: Chunks<Slot>,
    /// Cells handed out so far (the table's length); changed under the mutex.
    len: AtomicU32,
    /// Top of the free stack, or [`NIL`].
    free: AtomicU32,
    /// Top of the stack of cells whose owners cancelled them, or [`NIL`].
    cancelled: AtomicU32,
}

impl Cells {
    /// Storage with `reserve` cells allocated now.
    pub(super) fn new(reserve: usize) -> Self {
        Self {
            slots: Chunks::new(reserve, Slot::new),
            len: AtomicU32::new(0),
            free: AtomicU32::new(NIL),
            cancelled: AtomicU32::new(NIL),
        }
    }

    /// Makes sure cells `0..total` exist, so that taking them allocates
    /// nothing (a raised limit; under the mutex).
    pub(super) fn reserve(&self, total: usize) {
        self.slots.reserve(total);
    }

    #[inline]
    fn slot(&self, idx: u32) -> &Slot {
        self.slots.get(idx)
    }

    /// A free cell: popped from the free stack, or a new one. Call with the
    /// mutex held. `None` when every `u32` index is taken.
    pub(super) fn take(&self) -> Option<u32> {
        if let Some(idx) = self.pop(&self.free, |s| &s.next_free) {
            return Some(idx);
        }
        // Relaxed: changed only under the mutex, which we hold.
        let idx = self.len.load(Ordering::Relaxed);
        if idx == NIL {
            return None;
        }
        self.len.store(idx + 1, Ordering::Relaxed);
        Some(idx)
    }

    /// A cell whose owner cancelled it, to unlink and free. Call with the
    /// mutex held.
    pub(super) fn take_cancelled(&self) -> Option<u32> {
        self.pop(&self.cancelled, |s| &s.next_cancelled)
    }

    /// Pops the stack whose top is `top` and whose links are `link` (only
    /// under the mutex, one popper at a time; see the module docs).
    fn pop(&self, stack: &AtomicU32, link: impl Fn(&Slot) -> &AtomicU32) -> Option<u32> {
        // Acquire: pairs with a push's Release CAS, so the link of the cell
        // on top is the pusher's write.
        let mut top = stack.load(Ordering::Acquire);
        while top != NIL {
            // Relaxed: ordered by the Acquire above (see the module docs).
            let next = link(self.slot(top)).load(Ordering::Relaxed);
            // Acquire on both sides, as the load above; only pops under the
            // mutex change the top downwards, so no ABA.
            match stack.compare_exchange(top, next, Ordering::Acquire, Ordering::Acquire) {
                Ok(_) => return Some(top),
                Err(actual) => top = actual,
            }
        }
        None
    }

    /// Pushes `idx` on a stack, from any thread.
    fn push(&self, stack: &AtomicU32, link: &AtomicU32, idx: u32) {
        // Relaxed: a guess for the CAS.
        let mut top = stack.load(Ordering::Relaxed);
        loop {
            link.store(top, Ordering::Relaxed);
            // Release: the pop that takes this cell (Acquire) sees the link
            // and everything the pusher wrote before. Relaxed on failure: a
            // new guess only.
            match stack.compare_exchange_weak(top, idx, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(actual) => top = actual,
            }
        }
    }

    /// The cell's generation and status.
    #[inline]
    pub(super) fn load(&self, idx: u32) -> (u32, Status) {
        // Acquire: pairs with the resolver's Release store (module docs).
        unpack(self.slot(idx).state.load(Ordering::Acquire))
    }

    /// Marks a free cell queued; its generation, for callback tickets.
    pub(super) fn queue(&self, idx: u32) -> u32 {
        let slot = self.slot(idx);
        // Relaxed load: the cell is ours (taken under the mutex).
        let (gen, status) = unpack(slot.state.load(Ordering::Relaxed));
        debug_assert_eq!(status, Status::Free);
        // Release: see the module docs.
        slot.state
            .store(pack(gen, Status::Queued), Ordering::Release);
        gen
    }

    /// Takes a queued cell out of its owner's hands (under the mutex, before
    /// the state word counts its grant or rejection): false if the owner
    /// cancelled it first.
    pub(super) fn claim(&self, idx: u32) -> bool {
        let state = &self.slot(idx).state;
        // Relaxed load: a guess; the CAS decides.
        let (gen, status) = unpack(state.load(Ordering::Relaxed));
        if status != Status::Queued {
            debug_assert_eq!(status, Status::Cancelled);
            return false;
        }
        // Relaxed: the mutex orders what the resolver does around it, and the
        // outcome is published by `resolve`'s Release store.
        state
            .compare_exchange(
                pack(gen, Status::Queued),
                pack(gen, Status::Claimed),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Stores a claimed cell's outcome (under the mutex, after the state word
    /// counts it and the resolver took what it needs from the cell).
    pub(super) fn resolve(&self, idx: u32, outcome: Result<(), AdmitError>) {
        let slot = self.slot(idx);
        // Relaxed load: only the mutex holder changes a claimed cell.
        let (gen, status) = unpack(slot.state.load(Ordering::Relaxed));
        debug_assert_eq!(status, Status::Claimed);
        let status = match outcome {
            Ok(()) => Status::Granted,
            Err(e) => Status::Rejected(e),
        };
        // Release: the owner's Acquire load sees the grant and all before it.
        slot.state.store(pack(gen, status), Ordering::Release);
    }

    /// The owner's cancel of a cell of generation `gen`: true if it was
    /// queued (now cancelled, and on the cancelled stack for a mutex holder
    /// to unlink and free); false if a resolver claimed or resolved it first,
    /// or the generation is gone.
    pub(super) fn cancel(&self, idx: u32, gen: u32) -> bool {
        let won = self.mark_cancelled(idx, gen);
        if won {
            let slot = self.slot(idx);
            self.push(&self.cancelled, &slot.next_cancelled, idx);
        }
        won
    }

    /// Marks a queued cell of generation `gen` cancelled, without handing it
    /// to the cancelled stack: for a canceller that holds the mutex and
    /// unlinks and frees it itself. True if it was queued.
    pub(super) fn mark_cancelled(&self, idx: u32, gen: u32) -> bool {
        let slot = self.slot(idx);
        // Acquire on failure: the caller goes on to read the outcome.
        // Relaxed on success: the cell is handed over by the cancelled
        // stack's Release push, or by the mutex the caller holds.
        slot.state
            .compare_exchange(
                pack(gen, Status::Queued),
                pack(gen, Status::Cancelled),
                Ordering::Relaxed,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Frees a cell its holder is done with (its owner after taking the
    /// outcome, a mutex holder unlinking a cancelled one, a canceller under
    /// the mutex, or a callback's resolver) and pushes it on the free stack.
    pub(super) fn free(&self, idx: u32) {
        let slot = self.slot(idx);
        // Relaxed load: the caller owns the cell now.
        let (gen, status) = unpack(slot.state.load(Ordering::Relaxed));
        debug_assert_ne!(status, Status::Free, "freed a free waiter cell");
        // Relaxed: published by the push's Release CAS.
        slot.state
            .store(pack(gen.wrapping_add(1), Status::Free), Ordering::Relaxed);
        self.push(&self.free, &slot.next_free, idx);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn every_status_round_trips_through_the_word() {
        let errors = [
            AdmitError::AtCapacity,
            AdmitError::QueueTimeout,
            AdmitError::Closed,
            AdmitError::Displaced,
            AdmitError::TimedOut,
        ];
        let statuses = [
            Status::Free,
            Status::Queued,
            Status::Granted,
            Status::Claimed,
            Status::Cancelled,
        ]
        .into_iter()
        .chain(errors.map(Status::Rejected));
        for status in statuses {
            for gen in [0, 1, u32::MAX] {
                assert_eq!(unpack(pack(gen, status)), (gen, status));
            }
        }
    }

    #[test]
    fn cells_past_the_first_chunk_are_distinct_and_reused_after_free() {
        let cells = Cells::new(3); // a first chunk of 4
        let taken: Vec<u32> = (0..40).map(|_| cells.take().unwrap()).collect();
        assert_eq!(taken, (0..40).collect::<Vec<_>>());
        for &idx in &taken {
            let gen = cells.queue(idx);
            assert_eq!(gen, 0);
            assert!(cells.claim(idx));
            cells.resolve(idx, Err(AdmitError::Closed));
        }
        for &idx in &taken {
            assert_eq!(cells.load(idx), (0, Status::Rejected(AdmitError::Closed)));
            cells.free(idx);
        }
        cells.reserve(100); // chunks of 4, 8, 16, 32, 64: the last ends at 124
        assert!(cells.slots.has(4) && !cells.slots.has(5));
        // Last freed, first taken; with a new generation.
        assert_eq!(cells.take(), Some(39));
        assert_eq!(cells.queue(39), 1);
        assert_eq!(cells.take(), Some(38));
        assert_eq!(cells.take(), Some(37));
    }

    #[test]
    fn a_cancel_wins_only_over_a_queued_cell_of_its_generation() {
        let cells = Cells::new(4);
        let (a, b) = (cells.take().unwrap(), cells.take().unwrap());
        let (ga, gb) = (cells.queue(a), cells.queue(b));
        assert!(!cells.cancel(a, ga + 1), "another generation");
        assert!(cells.cancel(a, ga));
        assert!(!cells.cancel(a, ga), "cancelled once");
        assert!(!cells.claim(a), "a resolver finds it cancelled");
        assert!(cells.claim(b));
        assert!(!cells.cancel(b, gb), "claimed: too late");
        assert_eq!(cells.take_cancelled(), Some(a));
        assert_eq!(cells.take_cancelled(), None);
        cells.free(a);
        assert_eq!(cells.take(), Some(a));
    }
}
