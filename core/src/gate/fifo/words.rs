//! The queue's packed words: a slot's, a link's (segment id and index) and
//! a waiter cell's (generation, status and error), with their encoders and
//! decoders.
//!
//! ```text
//! slot:    63..32 segment tag | 31..28 kind | 27..0 cell
//! link:    63..20 segment id  | 19..0 segment index
//! waiter:  63..32 generation  | 17 waker | 16 detached | 15..8 error code | 7..0 status
//! stack:   63..32 tag         | 31..0 index        (free segments, cells)
//! ```
//!
//! Slot kinds: `EMPTY`, `WAITING(cell)`, `PERMIT`, `PENDING(cell)`, `SKIP`,
//! `REFUSED`, `DONE`. Waiter statuses: `FREE`, `QUEUED`, `CANCELLING`,
//! `GRANTED`, `REJECTED(error)`, `CANCELLED`. The free stacks are Treiber
//! stacks whose top carries a tag bumped on every change (pops happen on
//! any thread, so the tag rules out ABA).
//!

use crate::gate::error::AdmitError;

// ----- slot words -------------------------------------------------------------

pub(super) const EMPTY: u64 = 0;
pub(super) const WAITING: u64 = 1;
pub(super) const PERMIT: u64 = 2;
pub(super) const PENDING: u64 = 3;
pub(super) const SKIP: u64 = 4;
pub(super) const REFUSED: u64 = 5;
pub(super) const DONE: u64 = 6;
pub(super) const KIND_SHIFT: u32 = 28;
pub(super) const CELL_MASK: u64 = (1 << KIND_SHIFT) - 1;

/// Most waiter cells a queue can have (a slot word holds the index).
pub(in crate::gate) const MAX_CELLS: usize = CELL_MASK as usize;

#[inline]
pub(super) fn slot_word(tag: u32, kind: u64, cell: u32) -> u64 {
    u64::from(tag) << 32 | kind << KIND_SHIFT | u64::from(cell)
}

#[inline]
pub(super) fn slot_tag(word: u64) -> u32 {
    (word >> 32) as u32
}

#[inline]
pub(super) fn slot_kind(word: u64) -> u64 {
    (word >> KIND_SHIFT) & 0xf
}

#[inline]
pub(super) fn slot_cell(word: u64) -> u32 {
    (word & CELL_MASK) as u32
}

/// The tag of the slots of segment `id`.
#[inline]
pub(super) fn tag_of(id: u64) -> u32 {
    id as u32
}

// ----- links ------------------------------------------------------------------

pub(super) const INDEX_BITS: u32 = 20;
pub(super) const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
/// The index of "no segment" in a link.
pub(super) const NO_INDEX: u32 = INDEX_MASK as u32;
/// The id of a segment in the pool.
pub(super) const FREE_ID: u64 = u64::MAX >> INDEX_BITS;

/// Most segments a queue can have (a link holds the index).
pub(super) const MAX_SEGMENTS: usize = NO_INDEX as usize;

#[inline]
pub(super) fn link(index: u32, id: u64) -> u64 {
    id << INDEX_BITS | u64::from(index)
}

#[inline]
pub(super) fn unlink(l: u64) -> (u32, u64) {
    ((l & INDEX_MASK) as u32, l >> INDEX_BITS)
}

/// The `next` of the last segment, which carries that segment's own id: an
/// appender's CAS on a segment that was recycled (and is the last again
/// under a new id) fails.
#[inline]
pub(super) fn end_of(id: u64) -> u64 {
    link(NO_INDEX, id)
}

#[inline]
pub(super) fn is_end(l: u64) -> bool {
    unlink(l).0 == NO_INDEX
}

// ----- waiter words -------------------------------------------------------------

pub(super) const FREE: u64 = 0;
pub(super) const QUEUED: u64 = 1;
pub(super) const CANCELLING: u64 = 2;
pub(super) const GRANTED: u64 = 3;
pub(super) const REJECTED: u64 = 4;
pub(super) const CANCELLED: u64 = 5;
/// The waiter's owner never looks at its cell: whoever resolves it frees
/// it (a callback's cell). Kept through every status change of one use.
pub(super) const DETACHED: u64 = 1 << 16;
/// The cell holds its owner's waker, which whoever moves the cell out of
/// `QUEUED` takes and wakes (`fifo/owner.rs`, "Wakers"). Cleared by that move.
pub(super) const WAKER: u64 = 1 << 17;
/// The status and error code: what a status change replaces.
pub(super) const STATUS_MASK: u64 = 0xffff;

/// What a waiter cell says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::gate) enum Status {
    /// Not in use.
    Free,
    /// Waiting for a slot.
    Queued,
    /// Being resolved (cancelled, rejected, or granted to a waiter whose
    /// waker the resolver takes first): its final status is a few
    /// instructions away, and no resumer can grant it.
    Cancelling,
    /// Holds a slot its owner has not taken yet.
    Granted,
    /// Rejected by another thread; its owner has not looked yet.
    Rejected(AdmitError),
    /// Its owner left the queue.
    Cancelled,
}

/// An error's code in a waiter word.
pub(super) fn error_code(e: AdmitError) -> u64 {
    match e {
        AdmitError::AtCapacity => 0,
        AdmitError::QueueTimeout => 1,
        AdmitError::Closed => 2,
        AdmitError::Displaced => 3,
        AdmitError::TimedOut => 4,
    }
}

/// The error a waiter word's code names.
pub(super) fn error_of(code: u64) -> AdmitError {
    match code {
        0 => AdmitError::AtCapacity,
        1 => AdmitError::QueueTimeout,
        2 => AdmitError::Closed,
        3 => AdmitError::Displaced,
        _ => AdmitError::TimedOut,
    }
}

pub(super) fn waiter_word(gen: u32, status: Status) -> u64 {
    let low = match status {
        Status::Free => FREE,
        Status::Queued => QUEUED,
        Status::Cancelling => CANCELLING,
        Status::Granted => GRANTED,
        Status::Rejected(e) => REJECTED | error_code(e) << 8,
        Status::Cancelled => CANCELLED,
    };
    u64::from(gen) << 32 | low
}

/// `word` with its status replaced (generation and flags kept).
pub(super) fn with_status(word: u64, status: Status) -> u64 {
    word & !STATUS_MASK | waiter_word(0, status)
}

pub(super) fn waiter_status(word: u64) -> (u32, Status) {
    let status = match word & 0xff {
        FREE => Status::Free,
        QUEUED => Status::Queued,
        CANCELLING => Status::Cancelling,
        GRANTED => Status::Granted,
        REJECTED => Status::Rejected(error_of((word >> 8) & 0xff)),
        _ => Status::Cancelled,
    };
    ((word >> 32) as u32, status)
}
