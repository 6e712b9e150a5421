//! Waiter cells' outcomes, readable without the gate's mutex.
//!
//! Each waiter cell (see `table.rs`) has an atomic *state word* here, so
//! that a queued future's poll, a callback ticket's `is_queued` and the
//! drop of a waiter that was already resolved read it without the lock,
//! and a *free stack* of cells, to which an owner gives its cell back
//! without the lock once it has taken its outcome.
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
//! Status: `FREE`, `QUEUED`, `GRANTED`, `REJECTED` (with the error code).
//! The generation is bumped each time the cell is freed, so a callback
//! ticket naming an older generation knows its request is gone.
//!
//! Transitions, and who makes them:
//!
//! * `FREE(g) → QUEUED(g)`: an enqueuer, under the mutex, on a cell it took
//!   from the free stack.
//! * `QUEUED(g) → GRANTED(g) | REJECTED(g, e)`: a resolver under the mutex,
//!   after it unlinked the cell and took everything it needs from it (the
//!   waker, the queue time). After this store the resolver never touches
//!   the cell again, so the owner may free it at once.
//! * `GRANTED | REJECTED → FREE(g + 1)`: the cell's owner, once it has
//!   taken the outcome, with or without the mutex; then it pushes the cell
//!   on the free stack. A callback's cell is freed by its resolver (the
//!   owner never looks).
//! * `QUEUED(g) → FREE(g + 1)`: a cancellation, under the mutex, after
//!   unlinking the cell.
//!
//! # Orderings
//!
//! * The resolver's store is `Release` and the owner's load `Acquire`: the
//!   grant (and the slot's previous holder's work, which the resolver saw)
//!   happens-before the owner runs with its permit.
//! * The enqueuer's store is `Release`, read by its own thread or under the
//!   mutex; `Relaxed` would do, `Release` costs nothing on x86 and keeps the
//!   reasoning local.
//! * The free stack: a push writes the cell's link (`Relaxed`) and swings
//!   the head with a `Release` CAS; a pop loads the head with `Acquire`, so
//!   it reads the link the pusher wrote, and swings it with an `Acquire`
//!   CAS. Pops happen only under the mutex, one at a time, so the head a pop
//!   read can change only by pushes of other cells, never back to the same
//!   cell with another link (no ABA), and the pop needs no tag.
//!
//! # Storage
//!
//! Cells live in chunks that are never moved or freed while the gate
//! lives: chunk 0 holds the `Q + N` cells reserved when the gate is built,
//! and chunk `k` twice as many as chunk `k - 1`, allocated under the mutex
//! when every earlier cell is taken (only if rejected waiters have not
//! looked yet while the queue refilled, or after `set_limit` raised `N`).
//! Readers index them without the lock.

use std::sync::OnceLock;

use crate::sync::{AtomicU32, AtomicU64, Ordering};

use super::error::AdmitError;

/// "No cell" in the free stack.
pub(super) const NIL: u32 = u32::MAX;

const FREE: u64 = 0;
const QUEUED: u64 = 1;
const GRANTED: u64 = 2;
const REJECTED: u64 = 3;
const STATUS_MASK: u64 = 0xff;
const ERROR_SHIFT: u32 = 8;
const GEN_SHIFT: u32 = 32;

/// Chunks: enough for `u32` cells from any first chunk size.
const CHUNKS: usize = 32;

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
}

impl Status {
    /// The outcome of a resolved cell, `None` while it is queued.
    pub(super) fn outcome(self) -> Option<Result<(), AdmitError>> {
        match self {
            Status::Granted => Some(Ok(())),
            Status::Rejected(e) => Some(Err(e)),
            Status::Queued => None,
            Status::Free => unreachable!("read the outcome of a free waiter cell"),
        }
    }
}

fn error_code(e: AdmitError) -> u64 {
    match e {
        AdmitError::AtCapacity => 0,
        AdmitError::QueueTimeout => 1,
        AdmitError::Closed => 2,
        AdmitError::Displaced => 3,
        AdmitError::TimedOut => 4,
    }
}

fn error_of(code: u64) -> AdmitError {
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
    };
    u64::from(gen) << GEN_SHIFT | low
}

fn unpack(word: u64) -> (u32, Status) {
    let status = match word & STATUS_MASK {
        FREE => Status::Free,
        QUEUED => Status::Queued,
        GRANTED => Status::Granted,
        _ => Status::Rejected(error_of((word >> ERROR_SHIFT) & 0xff)),
    };
    ((word >> GEN_SHIFT) as u32, status)
}

/// One cell's atomics.
struct Slot {
    state: AtomicU64,
    /// The next cell down the free stack.
    next_free: AtomicU32,
}

impl Slot {
    fn new() -> Self {
        Self {
            state: AtomicU64::new(pack(0, Status::Free)),
            next_free: AtomicU32::new(NIL),
        }
    }
}

/// The cells' state words and the free stack.
pub(super) struct Cells {
    /// Chunk `k` holds `first << k` cells (`first = 1 << shift`), from
    /// index `first * (2^k - 1)`.
    chunks: [OnceLock<Box<[Slot]>>; CHUNKS],
    /// Cells in chunk 0: `1 << shift`.
    shift: u32,
    /// Cells handed out so far (the table's length); changed under the mutex.
    len: AtomicU32,
    /// Top of the free stack, or [`NIL`].
    free: AtomicU32,
}

impl Cells {
    /// Storage with `reserve` cells allocated now.
    pub(super) fn new(reserve: usize) -> Self {
        let shift = reserve.max(1).next_power_of_two().trailing_zeros().min(31);
        let cells = Self {
            chunks: [const { OnceLock::new() }; CHUNKS],
            shift,
            len: AtomicU32::new(0),
            free: AtomicU32::new(NIL),
        };
        cells.chunk(0);
        cells
    }

    /// Chunk `k`, allocated on first use (under the mutex: only a new cell's
    /// index reaches a chunk that does not exist yet).
    fn chunk(&self, k: usize) -> &[Slot] {
        self.chunks[k].get_or_init(|| {
            (0..1usize << (self.shift as usize + k))
                .map(|_| Slot::new())
                .collect()
        })
    }

    /// Makes sure cells `0..total` exist, so that taking them allocates
    /// nothing (a raised limit; under the mutex).
    pub(super) fn reserve(&self, total: usize) {
        if let Some(last) = total.checked_sub(1).and_then(|i| u32::try_from(i).ok()) {
            for k in 0..=self.chunk_of(last).0 {
                self.chunk(k);
            }
        }
    }

    #[inline]
    fn chunk_of(&self, idx: u32) -> (usize, usize) {
        // Chunk k starts at first * (2^k - 1): k = log2(idx / first + 1).
        let q = (u64::from(idx) >> self.shift) + 1;
        let k = (u64::BITS - 1 - q.leading_zeros()) as usize;
        let start = ((1u64 << k) - 1) << self.shift;
        (k, (u64::from(idx) - start) as usize)
    }

    #[inline]
    fn slot(&self, idx: u32) -> &Slot {
        let (k, offset) = self.chunk_of(idx);
        &self.chunk(k)[offset]
    }

    /// A free cell: popped from the free stack, or a new one. Call with the
    /// mutex held. `None` when every `u32` index is taken.
    pub(super) fn take(&self) -> Option<u32> {
        // Acquire: pairs with a push's Release CAS, so `next_free` of the
        // cell on top is the pusher's write.
        let mut top = self.free.load(Ordering::Acquire);
        while top != NIL {
            // Relaxed: ordered by the Acquire above (see the module docs).
            let next = self.slot(top).next_free.load(Ordering::Relaxed);
            // Acquire on both sides, as the load above; only pops under the
            // mutex change the head downwards, so no ABA.
            match self
                .free
                .compare_exchange(top, next, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => return Some(top),
                Err(actual) => top = actual,
            }
        }
        // Relaxed: changed only under the mutex, which we hold.
        let idx = self.len.load(Ordering::Relaxed);
        if idx == NIL {
            return None;
        }
        self.len.store(idx + 1, Ordering::Relaxed);
        Some(idx)
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

    /// Resolves a queued cell (under the mutex, after unlinking it and
    /// taking what the resolver needs from it).
    pub(super) fn resolve(&self, idx: u32, outcome: Result<(), AdmitError>) {
        let slot = self.slot(idx);
        // Relaxed load: only the mutex holder changes a queued cell.
        let (gen, status) = unpack(slot.state.load(Ordering::Relaxed));
        debug_assert_eq!(status, Status::Queued);
        let status = match outcome {
            Ok(()) => Status::Granted,
            Err(e) => Status::Rejected(e),
        };
        // Release: the owner's Acquire load sees the grant and all before it.
        slot.state.store(pack(gen, status), Ordering::Release);
    }

    /// Frees a cell its holder is done with (its owner after taking the
    /// outcome, a canceller under the mutex, or a callback's resolver) and
    /// pushes it on the free stack.
    pub(super) fn free(&self, idx: u32) {
        let slot = self.slot(idx);
        // Relaxed load: the caller owns the cell now.
        let (gen, status) = unpack(slot.state.load(Ordering::Relaxed));
        debug_assert_ne!(status, Status::Free, "freed a free waiter cell");
        // Relaxed: published by the push's Release CAS below.
        slot.state
            .store(pack(gen.wrapping_add(1), Status::Free), Ordering::Relaxed);
        // Relaxed: a guess for the CAS.
        let mut top = self.free.load(Ordering::Relaxed);
        loop {
            slot.next_free.store(top, Ordering::Relaxed);
            // Release: the pop that takes this cell (Acquire) sees the link
            // and the freed state. Relaxed on failure: a new guess only.
            match self
                .free
                .compare_exchange_weak(top, idx, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(actual) => top = actual,
            }
        }
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
        let statuses = [Status::Free, Status::Queued, Status::Granted]
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
            cells.resolve(idx, Err(AdmitError::Closed));
        }
        for &idx in &taken {
            assert_eq!(cells.load(idx), (0, Status::Rejected(AdmitError::Closed)));
            cells.free(idx);
        }
        cells.reserve(100); // chunks of 4, 8, 16, 32, 64: the last ends at 124
        assert!(cells.chunks[4].get().is_some() && cells.chunks[5].get().is_none());
        // Last freed, first taken; with a new generation.
        assert_eq!(cells.take(), Some(39));
        assert_eq!(cells.queue(39), 1);
        assert_eq!(cells.take(), Some(38));
        assert_eq!(cells.take(), Some(37));
    }
}
