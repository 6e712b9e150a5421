//! A lock-free, cancellable FIFO of waiter cells: enqueue, handoff, a
//! waiter's own cancel and a rejection by another thread (queue deadline,
//! close, displacement) take no lock and allocate nothing. The one lock and
//! the only allocations are on the cold paths that refill its storage
//! (see "Storage").
//!
//! The queue of each priority class of a gate (`queue.rs` and
//! `classes.rs` drive it); the model checks and the threaded test at the
//! end also run it under a small counting gate of their own. Each cell carries a payload of the caller's
//! (whom to tell) and a *detached* flag for waiters whose owner never
//! looks (callbacks: the thread that resolves the cell frees it).
//!
//! # Algorithm
//!
//! The cancellable queue of Koval, Khalanskiy and Alistarh ("CQS", PLDI
//! 2023), with smart cancellation and asynchronous resumption, over a pool
//! of segments instead of a garbage collector.
//!
//! The caller keeps one count of the waiters no slot is promised to yet (the
//! gate's state word, `queued`). A waiter first counts itself there, then
//! takes a *position* (`enq.fetch_add`) and installs its cell in that
//! position's slot. A release that finds a waiter counted takes it off the
//! count in the same read-modify-write that keeps its slot (the slot is now
//! *promised*), then takes the next position (`deq.fetch_add`) and delivers
//! the slot there:
//!
//! * a slot whose waiter has not arrived yet gets the slot left in it
//!   (`PERMIT`); the waiter that takes that position finds it and never
//!   waits;
//! * a waiting cell is granted (its status CAS `QUEUED → GRANTED`);
//! * a cell being cancelled gets the slot left next to it (`PENDING`), for
//!   its canceller to pass on;
//! * a position whose waiter left and gave its place back (`SKIP`) is passed
//!   over: the resumer takes the next position;
//! * a position whose waiter left while every counted waiter was promised a
//!   slot (`REFUSED`) takes the slot back: the caller releases it again.
//!
//! A cancel (by the waiter, or a rejection by another thread) first claims
//! the cell (`QUEUED → CANCELLING`), so no resumer can grant it, then asks
//! the count to take one waiter off ([`Places::give_back`]): if the count
//! shows a waiter no slot is promised to, the cancel takes that place and
//! marks its position `SKIP`; if every counted waiter is promised a slot,
//! one of those slots is on its way to this position, and the cancel marks
//! it `REFUSED`. A slot already left at the cell (`PENDING`) is passed on to
//! the next position (place given back) or released (refused). Either way
//! every promised slot reaches exactly one live waiter or goes back, and the
//! count stays the number of live waiters no slot is promised to.
//!
//! # Storage
//!
//! Positions live in *segments* of [`SEG`] slots, taken from a pool.
//! Segments are linked in position order; a segment with id `k` holds
//! positions `k * SEG ..`. The two ends are found from hints (`head` for
//! resumers and scanners, `tail` for enqueuers), read before the position
//! is taken, so a hint never lies past the position's segment unless that
//! segment is gone. A segment whose every slot is *finished* (nobody will
//! touch it again) and that is not the last is unlinked and returned to
//! the pool by a sweep.
//!
//! Segments and waiter cells are stored in chunks that never move
//! (`chunks.rs`). Waiter cells come from a [`CellPool`] that several
//! queues may share (a gate's classes do: at most `Q` waiters and `N`
//! granted ones not yet looking in all, whatever their classes); a cell
//! serves one queue from its take to its free. The first chunks are made
//! with the pool and the queue: room for the waiters and, twice over, for
//! the segments their positions span. The locks (the queue's `sweep`, the
//! pool's `grown`) are taken only on the cold paths that refill an empty
//! free stack: a sweep when the segment pool is empty, and the next chunk
//! when a sweep frees nothing (every linked segment still holds a waiting
//! or otherwise unfinished slot) or when every cell is taken (rejected
//! waiters that have not looked yet keep theirs). Churn behind a waiter
//! stuck at the head reuses segments rather than growing them.
//!
//! Segments are reused while other threads may still hold their index, so
//! every reference carries the segment id it expects: links and hints pack
//! `(id, index)`, slot words carry the low 32 bits of their segment's id.
//! A traversal reads a segment's id before and after reading its link (a
//! seqlock: a recycler changes the id first, then the contents) and starts
//! again from the oldest linked segment when it changed; a CAS on a slot of
//! a recycled segment fails on the tag. A position whose segment is gone was
//! skipped (its slot finished as `SKIP`: every other way to finish a slot
//! involves the position's own resumer).
//!
//! # Words
//!
//! ```text
//! slot:    63..32 segment tag | 31..28 kind | 27..0 cell
//! link:    63..20 segment id  | 19..0 segment index
//! waiter:  63..32 generation  | 15..8 error code | 7..0 status
//! stack:   63..32 tag         | 31..0 index        (free segments, cells)
//! ```
//!
//! Slot kinds: `EMPTY`, `WAITING(cell)`, `PERMIT`, `PENDING(cell)`, `SKIP`,
//! `REFUSED`, `DONE`. Waiter statuses: `FREE`, `QUEUED`, `CANCELLING`,
//! `GRANTED`, `REJECTED(error)`, `CANCELLED`. The free stacks are Treiber
//! stacks whose top carries a tag bumped on every change (pops happen on
//! any thread, so the tag rules out ABA).
//!
//! # Orderings
//!
//! * A waiter's cell contents (its position, its queue's number, segment)
//!   are written before its slot is installed with a `Release` CAS;
//!   everyone who finds the cell through the slot loads it with `Acquire`.
//!   A cell found through a slot is the slot's waiter only if its position
//!   *and* queue number match: freed and taken again, a cell may wait at
//!   the same position of another queue of its pool. (A stale match is
//!   harmless either way: a grant or a cancel is a CAS on the status word
//!   with its generation.)
//! * A grant is a `Release` CAS on the waiter's status word (or a `Release`
//!   CAS leaving a `PERMIT`), read by the waiter with `Acquire`: the work of
//!   the slot's previous holder, which the releaser saw, happens-before the
//!   new holder runs.
//! * A canceller marks its slot (`AcqRel`: it may read a `PENDING` left with
//!   `Release`) before it stores the waiter's final status (`Release`), so a
//!   resumer that sees the final status (`Acquire`) finds the slot changed.
//! * Position counters are `Relaxed` read-modify-writes, ordered after the
//!   hint load (`Acquire`, pairing with the hint's `Release` CAS): a hint
//!   set by the holder of position `q` was set after `q` was taken, so a
//!   position taken after reading it is later than `q`.
//! * Segment recycling follows the seqlock rule: the new owner stores the
//!   new id, then a `Release` fence, then the contents; a reader loads the
//!   id (`Acquire`), the contents, an `Acquire` fence, and the id again.
//! * A slot's last toucher marks it finished with a `Release` store (or
//!   CAS); the sweep reads every slot's kind with `Acquire`, so every
//!   finisher's last access happens-before the recycling.

use std::ops::Range;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::sync::{fence, lock, spin_wait, AtomicU32, AtomicU64, Mutex, Ordering};

use super::chunks::Chunks;
use super::error::AdmitError;

/// Slots per segment (2 in loom models, so that they cross segments).
pub(super) const SEG: usize = if cfg!(loom) { 2 } else { 32 };

/// "No entry" in a free stack.
const NIL: u32 = u32::MAX;

// ----- slot words -------------------------------------------------------------

const EMPTY: u64 = 0;
const WAITING: u64 = 1;
const PERMIT: u64 = 2;
const PENDING: u64 = 3;
const SKIP: u64 = 4;
const REFUSED: u64 = 5;
const DONE: u64 = 6;
const KIND_SHIFT: u32 = 28;
const CELL_MASK: u64 = (1 << KIND_SHIFT) - 1;

/// Most waiter cells a queue can have (a slot word holds the index).
pub(super) const MAX_CELLS: usize = CELL_MASK as usize;

#[inline]
fn slot_word(tag: u32, kind: u64, cell: u32) -> u64 {
    u64::from(tag) << 32 | kind << KIND_SHIFT | u64::from(cell)
}

#[inline]
fn slot_tag(word: u64) -> u32 {
    (word >> 32) as u32
}

#[inline]
fn slot_kind(word: u64) -> u64 {
    (word >> KIND_SHIFT) & 0xf
}

#[inline]
fn slot_cell(word: u64) -> u32 {
    (word & CELL_MASK) as u32
}

/// The tag of the slots of segment `id`.
#[inline]
fn tag_of(id: u64) -> u32 {
    id as u32
}

// ----- links ------------------------------------------------------------------

const INDEX_BITS: u32 = 20;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
/// The index of "no segment" in a link.
const NO_INDEX: u32 = INDEX_MASK as u32;
/// The id of a segment in the pool.
const FREE_ID: u64 = u64::MAX >> INDEX_BITS;

/// Most segments a queue can have (a link holds the index).
const MAX_SEGMENTS: usize = NO_INDEX as usize;

#[inline]
fn link(index: u32, id: u64) -> u64 {
    id << INDEX_BITS | u64::from(index)
}

#[inline]
fn unlink(l: u64) -> (u32, u64) {
    ((l & INDEX_MASK) as u32, l >> INDEX_BITS)
}

/// The `next` of the last segment, which carries that segment's own id: an
/// appender's CAS on a segment that was recycled (and is the last again
/// under a new id) fails.
#[inline]
fn end_of(id: u64) -> u64 {
    link(NO_INDEX, id)
}

#[inline]
fn is_end(l: u64) -> bool {
    unlink(l).0 == NO_INDEX
}

// ----- waiter words -------------------------------------------------------------

const FREE: u64 = 0;
const QUEUED: u64 = 1;
const CANCELLING: u64 = 2;
const GRANTED: u64 = 3;
const REJECTED: u64 = 4;
const CANCELLED: u64 = 5;
/// The waiter's owner never looks at its cell: whoever resolves it frees
/// it (a callback's cell). Kept through every status change of one use.
const DETACHED: u64 = 1 << 16;
/// The status and error code: what a status change replaces.
const STATUS_MASK: u64 = 0xffff;

/// What a waiter cell says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    /// Not in use.
    Free,
    /// Waiting for a slot.
    Queued,
    /// Being cancelled or rejected; no resumer can grant it.
    Cancelling,
    /// Holds a slot its owner has not taken yet.
    Granted,
    /// Rejected by another thread; its owner has not looked yet.
    Rejected(AdmitError),
    /// Its owner left the queue.
    Cancelled,
}

/// An error's code in a waiter word.
fn error_code(e: AdmitError) -> u64 {
    match e {
        AdmitError::AtCapacity => 0,
        AdmitError::QueueTimeout => 1,
        AdmitError::Closed => 2,
        AdmitError::Displaced => 3,
        AdmitError::TimedOut => 4,
    }
}

/// The error a waiter word's code names.
fn error_of(code: u64) -> AdmitError {
    match code {
        0 => AdmitError::AtCapacity,
        1 => AdmitError::QueueTimeout,
        2 => AdmitError::Closed,
        3 => AdmitError::Displaced,
        _ => AdmitError::TimedOut,
    }
}

fn waiter_word(gen: u32, status: Status) -> u64 {
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
fn with_status(word: u64, status: Status) -> u64 {
    word & !STATUS_MASK | waiter_word(0, status)
}

fn waiter_status(word: u64) -> (u32, Status) {
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

// ----- storage ----------------------------------------------------------------

struct Segment {
    /// Id of this incarnation ([`FREE_ID`] in the pool).
    id: AtomicU64,
    /// Link to the next segment, or [`end_of`] its own id.
    next: AtomicU64,
    /// The next segment down the pool's stack.
    next_free: AtomicU32,
    slots: [AtomicU64; SEG],
}

impl Segment {
    fn new() -> Self {
        Self {
            id: AtomicU64::new(FREE_ID),
            next: AtomicU64::new(end_of(FREE_ID)),
            next_free: AtomicU32::new(NIL),
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

struct Waiter<T> {
    state: AtomicU64,
    /// The waiter's position, written before its slot is installed.
    place: AtomicU64,
    /// The queue it waits in (its pool's number for it), written with
    /// `place`: with a pool shared by several queues, a position alone does
    /// not tell a cell's current queue.
    queue: AtomicU32,
    /// Clock time when it was enqueued, written with `place`.
    enqueued_at: AtomicU64,
    /// The segment holding that position.
    segment: AtomicU32,
    /// The next cell down the free stack.
    next_free: AtomicU32,
    /// What the caller keeps with each cell (whom to tell).
    payload: T,
}

impl<T: Default> Waiter<T> {
    fn new() -> Self {
        Self {
            state: AtomicU64::new(waiter_word(0, Status::Free)),
            place: AtomicU64::new(0),
            queue: AtomicU32::new(0),
            enqueued_at: AtomicU64::new(0),
            segment: AtomicU32::new(0),
            next_free: AtomicU32::new(NIL),
            payload: T::default(),
        }
    }
}

/// A tagged Treiber stack of indices whose links live in the entries.
struct Stack(AtomicU64);

impl Stack {
    fn new() -> Self {
        Stack(AtomicU64::new(u64::from(NIL)))
    }

    fn pop<'a>(&self, next_of: impl Fn(u32) -> &'a AtomicU32) -> Option<u32> {
        // Acquire: pairs with the push's Release CAS, so the link read below
        // is the pusher's (or the CAS fails on a newer tag).
        let mut top = self.0.load(Ordering::Acquire);
        loop {
            let idx = top as u32;
            if idx == NIL {
                return None;
            }
            // Relaxed: ordered by the Acquire above; a stale link (the entry
            // was popped and pushed meanwhile) comes with an older tag.
            let next = next_of(idx).load(Ordering::Relaxed);
            let new = ((top >> 32) + 1) << 32 | u64::from(next);
            // Acquire: the popper owns the entry and reads what the pusher
            // wrote. Acquire on failure: the new top's link, as above.
            match self
                .0
                .compare_exchange_weak(top, new, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => return Some(idx),
                Err(actual) => top = actual,
            }
        }
    }

    /// Entries on the stack (for tests, at rest: nobody pushes or pops).
    #[cfg(test)]
    fn len<'a>(&self, next_of: impl Fn(u32) -> &'a AtomicU32) -> usize {
        let mut n = 0;
        let mut top = self.0.load(Ordering::Acquire) as u32;
        while top != NIL {
            n += 1;
            top = next_of(top).load(Ordering::Relaxed);
        }
        n
    }

    /// Whether the stack is empty now.
    fn is_empty(&self) -> bool {
        // Acquire: as a pop's first load.
        self.0.load(Ordering::Acquire) as u32 == NIL
    }

    /// Pushes the entries `range` at once, in index order from the top.
    fn push_chain<'a>(&self, range: Range<u32>, next_of: impl Fn(u32) -> &'a AtomicU32) {
        let Some(last) = range.end.checked_sub(1).filter(|&l| l >= range.start) else {
            return;
        };
        for i in range.start..last {
            // Relaxed: published by the Release CAS below.
            next_of(i).store(i + 1, Ordering::Relaxed);
        }
        // Relaxed: a guess for the CAS.
        let mut top = self.0.load(Ordering::Relaxed);
        loop {
            next_of(last).store(top as u32, Ordering::Relaxed);
            let new = ((top >> 32) + 1) << 32 | u64::from(range.start);
            // Release: as in `push`. Relaxed on failure: a new guess.
            match self
                .0
                .compare_exchange_weak(top, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(actual) => top = actual,
            }
        }
    }

    fn push(&self, link: &AtomicU32, idx: u32) {
        // Relaxed: a guess for the CAS.
        let mut top = self.0.load(Ordering::Relaxed);
        loop {
            link.store(top as u32, Ordering::Relaxed);
            let new = ((top >> 32) + 1) << 32 | u64::from(idx);
            // Release: the popper sees the link and everything written
            // before. Relaxed on failure: a new guess.
            match self
                .0
                .compare_exchange_weak(top, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(actual) => top = actual,
            }
        }
    }
}

/// What the queue asks of the count of waiters no slot is promised to.
pub(super) trait Places {
    /// A leaving waiter's decision, as one read-modify-write of the count:
    /// if it shows a waiter no slot is promised to, take one off and return
    /// true. False if every counted waiter is promised a slot (one of them
    /// is on its way to the leaving waiter, who refuses it).
    fn give_back(&self) -> bool;
}

/// A waiter cell resolved by another thread, whose owner must be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Told {
    pub(super) cell: u32,
    /// Pushed detached: the teller frees the cell (after taking what it
    /// needs from its payload); otherwise its owner does, perhaps already.
    pub(super) detached: bool,
    /// When the waiter was pushed (read before the cell could be freed).
    pub(super) enqueued_at: u64,
}

/// What the caller must do after a queue operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(super) enum Then {
    /// Nothing.
    Nothing,
    /// Tell this cell's owner it was granted.
    Wake(Told),
    /// A promised slot came back: release it again (which may promise it to
    /// the next waiter).
    Release,
}

/// Where an enqueued waiter stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pushed {
    /// Waiting in its slot.
    Queued,
    /// A slot was already left at its position: it holds it.
    Granted,
}

/// The queue: see the module docs. Each waiter cell carries a `T` of the
/// caller's.
pub(super) struct Fifo<T = ()> {
    segments: Chunks<Segment>,
    free_segments: Stack,
    /// The waiter cells, which the queues of a gate's classes share.
    cells: Arc<CellPool<T>>,
    /// This queue's number in its pool (see `Waiter::queue`).
    id: u32,
    /// Next position to enqueue at.
    enq: CachePadded<AtomicU64>,
    /// Next position to resume.
    deq: CachePadded<AtomicU64>,
    /// A linked segment at or before the next position to resume.
    head: CachePadded<AtomicU64>,
    /// A linked segment at or before the next position to enqueue at.
    tail: CachePadded<AtomicU64>,
    /// The oldest linked segment; changed only by a sweep.
    oldest: AtomicU64,
    /// Held by a sweep and by the segments' growth: the chunks of segments
    /// handed to the free stack.
    sweep: Mutex<usize>,
}

/// Waiter cells and their free stack: one pool for every queue of a gate
/// (a cell serves one queue at a time, from its take to its free), so that
/// a gate with several classes reserves room for `Q + N` waiters once, not
/// once per class.
pub(super) struct CellPool<T> {
    waiters: Chunks<Waiter<T>>,
    free: Stack,
    /// Held by growth: the chunks handed to the free stack.
    grown: Mutex<usize>,
    /// The number the next queue on this pool gets.
    queues: AtomicU32,
}

impl<T: Default> CellPool<T> {
    /// A pool with room for `cells` waiters at first (it grows when they
    /// are all taken: rejected waiters that have not looked keep theirs).
    pub(super) fn new(cells: usize) -> Self {
        assert!(
            (1..=MAX_CELLS).contains(&cells),
            "waiter cells out of range"
        );
        let pool = Self {
            waiters: Chunks::new(cells, Waiter::<T>::new),
            free: Stack::new(),
            grown: Mutex::new(1),
            queues: AtomicU32::new(0),
        };
        pool.free
            .push_chain(pool.waiters.range(0), |i| &pool.waiters.get(i).next_free);
        pool
    }

    /// Makes room now for `cells` waiters, so that taking them allocates
    /// nothing (cold: under the growth lock; a raised limit calls it).
    pub(super) fn reserve(&self, cells: usize) {
        let mut grown = lock(&self.grown);
        grow_to(
            &self.waiters,
            &mut grown,
            cells.min(MAX_CELLS),
            MAX_CELLS,
            &self.free,
            |i| &self.waiters.get(i).next_free,
        );
    }

    /// A free cell and its generation, or `None` when all are taken.
    fn take(&self) -> Option<(u32, u32)> {
        let cell = loop {
            if let Some(cell) = self.free.pop(|i| &self.waiters.get(i).next_free) {
                break cell;
            }
            // Cold: every cell is taken (rejected waiters have not looked).
            let mut grown = lock(&self.grown);
            if !self.free.is_empty() {
                continue; // freed or grown meanwhile
            }
            if !grow(&self.waiters, *grown, MAX_CELLS, &self.free, |i| {
                &self.waiters.get(i).next_free
            }) {
                return None;
            }
            *grown += 1;
        };
        // Relaxed: the pop's Acquire ordered the last owner's free.
        let (gen, status) = waiter_status(self.waiters.get(cell).state.load(Ordering::Relaxed));
        debug_assert_eq!(status, Status::Free);
        Some((cell, gen))
    }

    /// Gives back a cell its owner is done with.
    fn free(&self, cell: u32) {
        let w = self.waiters.get(cell);
        // Relaxed: the owner's own cell; published by the push's Release.
        let (gen, status) = waiter_status(w.state.load(Ordering::Relaxed));
        debug_assert!(!matches!(status, Status::Queued | Status::Cancelling));
        w.state.store(
            waiter_word(gen.wrapping_add(1), Status::Free),
            Ordering::Relaxed,
        );
        self.free.push(&w.next_free, cell);
    }

    #[inline]
    fn get(&self, cell: u32) -> &Waiter<T> {
        self.waiters.get(cell)
    }
}

/// Puts chunks of a storage, `made` of which are on its free stack
/// already, on the stack until it holds `want` entries or no more (under
/// the storage's growth lock).
fn grow_to<'a, E>(
    storage: &Chunks<E>,
    made: &mut usize,
    want: usize,
    max: usize,
    stack: &Stack,
    next_of: impl Fn(u32) -> &'a AtomicU32 + Copy,
) {
    while (storage.range(*made - 1).end as usize) < want
        && grow(storage, *made, max, stack, next_of)
    {
        *made += 1;
    }
}

/// Puts chunk `k` of a storage on its free stack (under its growth lock);
/// false if the storage has no more indices to give.
fn grow<'a, E>(
    storage: &Chunks<E>,
    k: usize,
    max: usize,
    stack: &Stack,
    next_of: impl Fn(u32) -> &'a AtomicU32,
) -> bool {
    let range = storage.range(k);
    if range.start as usize >= max {
        return false;
    }
    let range = range.start..range.end.min(max as u32);
    stack.push_chain(range, next_of);
    true
}

impl<T: Default> Fifo<T> {
    /// A queue with room for `cells` waiter cells at first, for a gate that
    /// promises at most `promised` slots at once (its engine limit). Both
    /// storages grow when they run out (under the sweep's lock): cells
    /// while rejected waiters have not looked, segments while unfinished
    /// slots pin more than a sweep can free.
    #[cfg(test)]
    pub(super) fn new(cells: usize, promised: usize) -> Self {
        Self::with_segments(cells, Self::segments_for(cells, promised))
    }

    /// A queue for up to `cells` waiters at once, taking its cells from
    /// `pool` (shared with other queues), for a gate that promises at most
    /// `promised` slots at once.
    pub(super) fn sharing(pool: Arc<CellPool<T>>, cells: usize, promised: usize) -> Self {
        Self::with_pool(pool, Self::segments_for(cells, promised))
    }

    /// Segments enough for `cells` waiters of a gate that promises at most
    /// `promised` slots at once: without cancellations the live positions
    /// are contiguous (waiting, slots left for waiters on their way, refused
    /// ones), spanning `(2 * cells + promised) / SEG` segments, plus the
    /// last one and one a resumer running ahead appended. Twice that, so
    /// that a sweep frees many at a time.
    fn segments_for(cells: usize, promised: usize) -> usize {
        2 * ((2 * cells + promised) / SEG + 2)
    }

    /// Makes room now for the segments `cells` waiters of a gate that
    /// promises at most `promised` slots at once span, so that using them
    /// allocates nothing (cold: under the sweep's lock; a raised limit
    /// calls it). The cells are the pool's ([`CellPool::reserve`]).
    pub(super) fn reserve_segments(&self, cells: usize, promised: usize) {
        let segments = Self::segments_for(cells, promised).min(MAX_SEGMENTS);
        let mut grown = lock(&self.sweep);
        grow_to(
            &self.segments,
            &mut grown,
            segments,
            MAX_SEGMENTS,
            &self.free_segments,
            |i| &self.segments.get(i).next_free,
        );
    }

    /// Whether cell `w` was pushed at position `p` of this queue (not at an
    /// earlier or later position, or in another queue sharing the pool).
    /// Relaxed: the caller read the cell's status or its slot with
    /// `Acquire`, after the push wrote both fields.
    #[inline]
    fn waits_at(&self, w: &Waiter<T>, p: u64) -> bool {
        w.place.load(Ordering::Relaxed) == p && w.queue.load(Ordering::Relaxed) == self.id
    }

    /// The pool this queue takes its cells from.
    pub(super) fn cells(&self) -> &CellPool<T> {
        &self.cells
    }

    /// A queue with room for `cells` waiter cells and `count` segments at
    /// first.
    #[cfg(test)]
    pub(super) fn with_segments(cells: usize, count: usize) -> Self {
        Self::with_pool(Arc::new(CellPool::new(cells)), count)
    }

    /// A queue with `count` segments at first, taking its cells from
    /// `pool`.
    fn with_pool(cells: Arc<CellPool<T>>, count: usize) -> Self {
        assert!((2..=MAX_SEGMENTS).contains(&count), "segments out of range");
        // Relaxed: a distinct number is all it needs (read by this queue
        // only, through cells it published).
        let id = cells.queues.fetch_add(1, Ordering::Relaxed);
        let fifo = Self {
            segments: Chunks::new(count, Segment::new),
            free_segments: Stack::new(),
            cells,
            id,
            enq: CachePadded::new(AtomicU64::new(0)),
            deq: CachePadded::new(AtomicU64::new(0)),
            head: CachePadded::new(AtomicU64::new(link(0, 0))),
            tail: CachePadded::new(AtomicU64::new(link(0, 0))),
            oldest: AtomicU64::new(link(0, 0)),
            sweep: Mutex::new(1),
        };
        // Segment 0 is the first linked; the rest of the first chunk goes
        // on the free stack.
        fifo.incarnate(0, 0);
        fifo.free_segments
            .push_chain(1..fifo.segments.range(0).end, |i| {
                &fifo.segments.get(i).next_free
            });
        fifo
    }

    // ----- waiter cells ---------------------------------------------------------

    /// A free waiter cell and its generation, or `None` when all are taken.
    pub(super) fn take_cell(&self) -> Option<(u32, u32)> {
        self.cells.take()
    }

    /// Gives back a cell its owner is done with (taken and never pushed, or
    /// resolved and its outcome taken).
    pub(super) fn free_cell(&self, cell: u32) {
        self.cells.free(cell);
    }

    /// The caller's part of a cell.
    #[inline]
    pub(super) fn payload(&self, cell: u32) -> &T {
        &self.cells.get(cell).payload
    }

    /// The clock time at which a cell was pushed (for its owner, or a
    /// teller of a granted cell, before the cell is freed).
    #[inline]
    pub(super) fn enqueued_at(&self, cell: u32) -> u64 {
        // Relaxed: written before the Release that made the cell queued,
        // which the caller has read.
        self.cells.get(cell).enqueued_at.load(Ordering::Relaxed)
    }

    /// A cell's generation and status.
    #[inline]
    pub(super) fn status(&self, cell: u32) -> (u32, Status) {
        // Acquire: pairs with a grant's or rejection's Release.
        waiter_status(self.cells.get(cell).state.load(Ordering::Acquire))
    }

    // ----- enqueue and resume ---------------------------------------------------

    /// Enqueues a taken cell at clock time `now`, after the caller counted
    /// its waiter; `detached` if its owner will never look (see [`Told`]).
    pub(super) fn push(&self, cell: u32, now: u64, detached: bool) -> Pushed {
        let w = self.cells.get(cell);
        // Relaxed: our own cell.
        let (gen, _) = waiter_status(w.state.load(Ordering::Relaxed));
        // Acquire: pairs with the hint's Release CAS (see the orderings).
        let hint = self.tail.load(Ordering::Acquire);
        // Relaxed: a ticket; ordered after the hint load by the Acquire.
        let p = self.enq.fetch_add(1, Ordering::Relaxed);
        let seg = self
            .locate(p, hint, &self.tail)
            .expect("a position's segment stays linked until its slot finishes");
        // Relaxed: published by the Release stores below.
        w.place.store(p, Ordering::Relaxed);
        w.queue.store(self.id, Ordering::Relaxed);
        w.enqueued_at.store(now, Ordering::Relaxed);
        w.segment.store(seg, Ordering::Relaxed);
        // Release: a resumer that reads this status (Acquire) also sees the
        // place, and everything the cell's last owner did before freeing it.
        let queued = waiter_word(gen, Status::Queued) | if detached { DETACHED } else { 0 };
        w.state.store(queued, Ordering::Release);
        let slot = &self.segments.get(seg).slots[p as usize % SEG];
        let tag = tag_of(p / SEG as u64);
        // Release: whoever finds the cell through the slot sees its place.
        // Acquire on failure: the PERMIT's Release (the slot's previous
        // holder's work happens-before ours).
        match slot.compare_exchange(
            slot_word(tag, EMPTY, 0),
            slot_word(tag, WAITING, cell),
            Ordering::Release,
            Ordering::Acquire,
        ) {
            Ok(_) => Pushed::Queued,
            Err(actual) => {
                debug_assert_eq!(slot_kind(actual), PERMIT);
                self.finish(slot, tag);
                w.state
                    .store(with_status(queued, Status::Granted), Ordering::Relaxed);
                Pushed::Granted
            }
        }
    }

    /// Delivers a slot the caller promised (it took one waiter off the
    /// count): to the oldest live waiter, or left for the one on its way.
    pub(super) fn resume(&self) -> Then {
        loop {
            // Acquire: see the orderings (as in `push`).
            let hint = self.head.load(Ordering::Acquire);
            // Relaxed: a ticket.
            let p = self.deq.fetch_add(1, Ordering::Relaxed);
            let Some(seg) = self.locate(p, hint, &self.head) else {
                continue; // its segment is gone: the position was skipped
            };
            if let Some(then) = self.resume_at(p, seg) {
                return then;
            }
        }
    }

    /// Delivers a promised slot at position `p`; `None` to go on to the next
    /// position.
    fn resume_at(&self, p: u64, seg: u32) -> Option<Then> {
        let slot = &self.segments.get(seg).slots[p as usize % SEG];
        let tag = tag_of(p / SEG as u64);
        // Acquire: pairs with the install's (or a canceller's) Release.
        let mut cur = slot.load(Ordering::Acquire);
        loop {
            if slot_tag(cur) != tag {
                return None; // recycled: the position was skipped
            }
            match slot_kind(cur) {
                EMPTY => {
                    // Release: the waiter that comes takes the slot with
                    // everything before. Acquire on failure: as the load.
                    match slot.compare_exchange(
                        cur,
                        slot_word(tag, PERMIT, 0),
                        Ordering::Release,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => return Some(Then::Nothing),
                        Err(actual) => cur = actual,
                    }
                }
                WAITING => {
                    let cell = slot_cell(cur);
                    let w = self.cells.get(cell);
                    // Acquire: a final status's Release (then the slot has
                    // changed too), or the install's ordering.
                    let word = w.state.load(Ordering::Acquire);
                    let (_, status) = waiter_status(word);
                    // Relaxed: written before the status we just read.
                    let ours = self.waits_at(w, p);
                    let enqueued_at = w.enqueued_at.load(Ordering::Relaxed);
                    match status {
                        Status::Queued if ours => {
                            // Release: the grant (see the orderings).
                            if w.state
                                .compare_exchange(
                                    word,
                                    with_status(word, Status::Granted),
                                    Ordering::Release,
                                    Ordering::Relaxed,
                                )
                                .is_ok()
                            {
                                self.finish(slot, tag);
                                return Some(Then::Wake(Told {
                                    cell,
                                    detached: word & DETACHED != 0,
                                    enqueued_at,
                                }));
                            }
                        }
                        Status::Cancelling if ours => {
                            // Release: the canceller that finds the slot
                            // here owns it (AcqRel on its side).
                            match slot.compare_exchange(
                                cur,
                                slot_word(tag, PENDING, cell),
                                Ordering::Release,
                                Ordering::Acquire,
                            ) {
                                Ok(_) => return Some(Then::Nothing),
                                Err(actual) => {
                                    cur = actual;
                                    continue;
                                }
                            }
                        }
                        // Resolved (or reused) meanwhile: its canceller has
                        // changed the slot, or is about to.
                        _ => spin_wait(),
                    }
                    // Acquire: as the first load.
                    cur = slot.load(Ordering::Acquire);
                }
                SKIP => return None,
                REFUSED => {
                    self.finish(slot, tag);
                    return Some(Then::Release);
                }
                kind => unreachable!("a resumer found slot kind {kind} at its own position"),
            }
        }
    }

    // ----- leaving ----------------------------------------------------------------

    /// Takes a queued cell of generation `gen` out of the queue: its owner's
    /// cancel (`reason` `None`: the cell ends `Cancelled`) or a rejection by
    /// another thread (the cell ends `Rejected(reason)`). `None` if it was
    /// not queued (granted, rejected or cancelled first); otherwise what the
    /// caller must do.
    pub(super) fn leave(
        &self,
        cell: u32,
        gen: u32,
        reason: Option<AdmitError>,
        places: &impl Places,
    ) -> Option<Then> {
        let end = reason.map_or(Status::Cancelled, Status::Rejected);
        self.leave_told(cell, gen, end, places)
            .map(|(then, _)| then)
    }

    /// Takes a queued cell out of the queue, ending it with status `end`
    /// (`Cancelled`, `Rejected` or `Granted`): see [`leave`](Self::leave).
    /// What the caller must do, and whom to tell.
    fn leave_told(
        &self,
        cell: u32,
        gen: u32,
        end: Status,
        places: &impl Places,
    ) -> Option<(Then, Told)> {
        let w = self.cells.get(cell);
        // Relaxed: a guess for the CAS, which orders.
        let word = w.state.load(Ordering::Relaxed);
        if waiter_status(word) != (gen, Status::Queued) {
            return None;
        }
        // Acquire: a third party reads the place the owner wrote (it found
        // the cell through the slot's Release, or reads it here).
        w.state
            .compare_exchange(
                word,
                with_status(word, Status::Cancelling),
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .ok()?;
        // Relaxed: ordered by the Acquire above.
        let p = w.place.load(Ordering::Relaxed);
        let seg = w.segment.load(Ordering::Relaxed);
        let slot = &self.segments.get(seg).slots[p as usize % SEG];
        let tag = tag_of(p / SEG as u64);
        let gave_back = places.give_back();
        let mark = if gave_back { SKIP } else { REFUSED };
        // AcqRel: Acquire for a PENDING's Release (the slot we now own);
        // Release, so that a resumer reading our final status finds it.
        let then = match slot.compare_exchange(
            slot_word(tag, WAITING, cell),
            slot_word(tag, mark, 0),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // A `SKIP` is finished; a `REFUSED` waits for its resumer.
            Ok(_) => Then::Nothing,
            Err(actual) => {
                debug_assert_eq!(slot_kind(actual), PENDING);
                self.finish(slot, tag);
                if gave_back {
                    // The slot promised here goes to the next waiter.
                    self.resume()
                } else {
                    Then::Release
                }
            }
        };
        let told = Told {
            cell,
            detached: word & DETACHED != 0,
            // Relaxed: ordered by the Acquire above; read before the final
            // status lets the owner free the cell.
            enqueued_at: w.enqueued_at.load(Ordering::Relaxed),
        };
        // Release: see the orderings (for a grant, also what a grant by a
        // resumer publishes).
        w.state.store(with_status(word, end), Ordering::Release);
        Some((then, told))
    }

    /// Grants a slot the caller holds for the counted waiters, without
    /// promising it, to the newest queued waiter (adaptive LIFO): the leave
    /// of [`reject_newest`](Self::reject_newest), ending in a grant. The
    /// waiter gives its place back through `places` as a cancel does; if
    /// every counted waiter was promised a slot already, one of those is on
    /// its way to this waiter, which refuses it (the resumer releases it).
    /// Who was granted and what the caller must do after; `None` if no cell
    /// waits (every counted waiter is on its way to its push, or leaving):
    /// the caller still holds its slot.
    pub(super) fn grant_newest(&self, places: &impl Places) -> Option<(Told, Then)> {
        loop {
            let (_, cell, gen) = self.newest_queued()?;
            if let Some((then, told)) = self.leave_told(cell, gen, Status::Granted, places) {
                return Some((told, then));
            }
            // Resolved meanwhile: the next newest.
        }
    }

    // ----- scanning ---------------------------------------------------------------

    /// The oldest queued cell at a position `from` or later: its position,
    /// cell and generation. A cell resolved meanwhile is left to whoever
    /// acts on it (a [`leave`](Self::leave) on it returns `None`).
    pub(super) fn next_queued(&self, from: u64) -> Option<(u64, u32, u32)> {
        // Acquire: see the orderings; the hint is read before `deq`.
        let hint = self.head.load(Ordering::Acquire);
        let mut p = from.max(self.deq.load(Ordering::Acquire));
        let end = self.enq.load(Ordering::Acquire);
        while p < end {
            let Some(seg) = self.locate_quiet(p, hint) else {
                p = (p / SEG as u64 + 1) * SEG as u64;
                continue;
            };
            if let Some((cell, gen)) = self.queued_at(p, seg) {
                return Some((p, cell, gen));
            }
            p += 1;
        }
        None
    }

    /// Rejects queued waiters from the oldest on with `reason`, while `due`
    /// says yes to their queue time, at most `max` of them: a queue
    /// deadline (`due` compares with the deadline; the scan stops at the
    /// first waiter not due, since later ones came later) or a close (`due`
    /// always true). Each rejected cell, and what the caller must do after
    /// its leaving, goes to `told`. How many were rejected.
    ///
    /// Enqueue times follow positions only as closely as the clock reads
    /// before taking a position do: a waiter due a moment before one ahead
    /// of it waits for the next call.
    pub(super) fn reject_from_head(
        &self,
        reason: AdmitError,
        due: impl Fn(u64) -> bool,
        max: usize,
        places: &impl Places,
        mut told: impl FnMut(Told, Then),
    ) -> usize {
        let mut n = 0;
        let mut from = 0;
        while n < max {
            let Some((p, cell, gen)) = self.next_queued(from) else {
                break;
            };
            from = p + 1;
            let w = self.cells.get(cell);
            // Relaxed: written before the Queued status `next_queued` read
            // with Acquire; checked against a reuse of the cell below.
            let at = w.enqueued_at.load(Ordering::Relaxed);
            if self.status(cell) != (gen, Status::Queued) {
                continue; // resolved meanwhile: `at` may be another's
            }
            if !due(at) {
                break;
            }
            if let Some((then, who)) = self.leave_told(cell, gen, Status::Rejected(reason), places)
            {
                n += 1;
                told(who, then);
            }
        }
        n
    }

    /// The newest queued cell: its position, cell and generation (as
    /// [`next_queued`](Self::next_queued), scanning from the newest
    /// position back). For displacement, which takes the newest waiter of
    /// a class.
    pub(super) fn newest_queued(&self) -> Option<(u64, u32, u32)> {
        // Acquire: see the orderings; the hint is read before `deq`.
        let hint = self.head.load(Ordering::Acquire);
        let first = self.deq.load(Ordering::Acquire);
        let mut p = self.enq.load(Ordering::Acquire);
        // The segment of the positions being scanned: one lookup each.
        let mut segment: Option<(u64, Option<u32>)> = None;
        while p > first {
            p -= 1;
            let k = p / SEG as u64;
            let seg = match segment {
                Some((at, seg)) if at == k => seg,
                _ => {
                    let seg = self.locate_quiet(p, hint);
                    segment = Some((k, seg));
                    seg
                }
            };
            let Some(seg) = seg else {
                // Gone: every position in it was skipped.
                p = k * SEG as u64;
                continue;
            };
            if let Some((cell, gen)) = self.queued_at(p, seg) {
                return Some((p, cell, gen));
            }
        }
        None
    }

    /// The cell queued at position `p` of segment `seg`, if one waits there.
    fn queued_at(&self, p: u64, seg: u32) -> Option<(u32, u32)> {
        let slot = &self.segments.get(seg).slots[p as usize % SEG];
        // Acquire: pairs with the install's Release.
        let word = slot.load(Ordering::Acquire);
        if slot_tag(word) != tag_of(p / SEG as u64) || slot_kind(word) != WAITING {
            return None;
        }
        let cell = slot_cell(word);
        let (gen, status) = self.status(cell);
        // Relaxed: written before the status we read.
        let here = self.waits_at(self.cells.get(cell), p);
        (status == Status::Queued && here).then_some((cell, gen))
    }

    /// Rejects the newest queued waiter with `reason` (displacement): who
    /// was told and what the caller must do after its leaving, or `None`
    /// if nobody waits.
    pub(super) fn reject_newest(
        &self,
        reason: AdmitError,
        places: &impl Places,
    ) -> Option<(Told, Then)> {
        loop {
            let (_, cell, gen) = self.newest_queued()?;
            if let Some((then, told)) = self.leave_told(cell, gen, Status::Rejected(reason), places)
            {
                return Some((told, then));
            }
            // Resolved meanwhile: the next newest.
        }
    }

    /// The queue time of the oldest queued waiter, if any.
    pub(super) fn oldest_enqueued_at(&self) -> Option<u64> {
        let mut from = 0;
        while let Some((p, cell, gen)) = self.next_queued(from) {
            // Relaxed: as in `reject_from_head`.
            let at = self.cells.get(cell).enqueued_at.load(Ordering::Relaxed);
            if self.status(cell) == (gen, Status::Queued) {
                return Some(at);
            }
            from = p + 1;
        }
        None
    }

    // ----- segments ---------------------------------------------------------------

    /// The segment of position `p`, starting from `hint` (read before `p`
    /// was taken), appending segments as needed and moving `advance`
    /// forward to it; `None` if it was unlinked (the position was skipped).
    fn locate(&self, p: u64, hint: u64, advance: &AtomicU64) -> Option<u32> {
        let found = self.find(p, hint, true)?;
        self.move_forward(advance, found);
        Some(unlink(found).0)
    }

    /// [`locate`](Self::locate) for a scan: appends nothing and moves no
    /// hint.
    fn locate_quiet(&self, p: u64, hint: u64) -> Option<u32> {
        self.find(p, hint, false).map(|l| unlink(l).0)
    }

    /// The link of position `p`'s segment; `None` if it is gone (or, when
    /// `append` is false, not made yet).
    fn find(&self, p: u64, hint: u64, append: bool) -> Option<u64> {
        let k = p / SEG as u64;
        let mut from = hint;
        'restart: loop {
            if unlink(from).1 > k {
                // A hint past the segment: start from the oldest.
                // Acquire: pairs with the sweep's Release store.
                from = self.oldest.load(Ordering::Acquire);
            }
            let mut cur = from;
            loop {
                let (idx, id) = unlink(cur);
                let s = self.segments.get(idx);
                // Acquire: the seqlock's first read.
                if s.id.load(Ordering::Acquire) != id {
                    from = self.restart_from();
                    continue 'restart;
                }
                if id >= k {
                    return (id == k).then_some(cur);
                }
                // Acquire: pairs with the append's Release CAS (the new
                // segment's contents) or the sweep's Release store.
                let mut next = s.next.load(Ordering::Acquire);
                // The seqlock's second read: `next` belongs to `id`.
                fence(Ordering::Acquire);
                if s.id.load(Ordering::Relaxed) != id {
                    from = self.restart_from();
                    continue 'restart;
                }
                if is_end(next) {
                    if !append {
                        return None;
                    }
                    match self.append(s, id) {
                        Some(new) => next = new,
                        // Another appender won: read `s` again (it may have
                        // been recycled since we checked it).
                        None => continue,
                    }
                }
                cur = next;
            }
        }
    }

    /// Where a traversal whose segment was recycled starts again: the oldest
    /// linked segment, which the sweep that recycled ours has moved past it.
    fn restart_from(&self) -> u64 {
        // The sweep may still be on its way to the store below.
        spin_wait();
        // Acquire: pairs with the sweep's Release store.
        self.oldest.load(Ordering::Acquire)
    }

    /// Appends a segment after `s` (id `id`, the last one when we looked):
    /// its link, or `None` if another appender was first (or `s` is no
    /// longer segment `id`).
    fn append(&self, s: &Segment, id: u64) -> Option<u64> {
        let idx = self.pop_segment();
        self.incarnate(idx, id + 1);
        let new = link(idx, id + 1);
        // Release: publishes the new segment's contents. Relaxed on failure:
        // the caller reads `s` again.
        match s
            .next
            .compare_exchange(end_of(id), new, Ordering::Release, Ordering::Relaxed)
        {
            Ok(_) => Some(new),
            Err(_) => {
                // Never published: straight back to the pool.
                self.segments.get(idx).id.store(FREE_ID, Ordering::Relaxed);
                self.free_segments
                    .push(&self.segments.get(idx).next_free, idx);
                None
            }
        }
    }

    /// Makes pooled segment `idx` segment `id`: the id first, then the
    /// contents (the seqlock's write side).
    fn incarnate(&self, idx: u32, id: u64) {
        let s = self.segments.get(idx);
        s.id.store(id, Ordering::Relaxed);
        fence(Ordering::Release);
        s.next.store(end_of(id), Ordering::Relaxed);
        let tag = tag_of(id);
        for slot in &s.slots {
            slot.store(slot_word(tag, EMPTY, 0), Ordering::Relaxed);
        }
    }

    /// A segment from the pool, sweeping finished ones into it when empty.
    fn pop_segment(&self) -> u32 {
        loop {
            if let Some(idx) = self.free_segments.pop(|i| &self.segments.get(i).next_free) {
                return idx;
            }
            self.replenish_segments();
        }
    }

    /// Cold: the pool is empty. Sweeps finished segments back into it, or,
    /// if every linked segment still holds an unfinished slot, puts the
    /// next chunk of storage on it.
    #[cold]
    fn replenish_segments(&self) {
        let mut grown = lock(&self.sweep);
        if !self.free_segments.is_empty() {
            return; // swept or grown meanwhile
        }
        self.sweep_locked();
        if !self.free_segments.is_empty() {
            return;
        }
        if grow(
            &self.segments,
            *grown,
            MAX_SEGMENTS,
            &self.free_segments,
            |i| &self.segments.get(i).next_free,
        ) {
            *grown += 1;
        } else {
            // Every index is in use: wait for racing appenders to give back
            // the ones they popped.
            drop(grown);
            spin_wait();
        }
    }

    /// Moves `hint` forward to `to` (never back).
    fn move_forward(&self, hint: &AtomicU64, to: u64) {
        // Relaxed: a guess for the CAS.
        let mut cur = hint.load(Ordering::Relaxed);
        while unlink(cur).1 < unlink(to).1 {
            // Release: pairs with the Acquire loads of the hint (see the
            // orderings). Relaxed on failure: a new guess.
            match hint.compare_exchange_weak(cur, to, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Marks a slot finished (`DONE`): its last toucher's last access.
    #[inline]
    fn finish(&self, slot: &AtomicU64, tag: u32) {
        // Release: the sweep's Acquire read of the kind sees everything we
        // did with the slot (see the orderings).
        slot.store(slot_word(tag, DONE, 0), Ordering::Release);
    }

    /// Whether nobody will touch segment `s`'s slots again: each is `DONE`,
    /// or `SKIP` (which a resumer only reads, and checks the tag of).
    fn finished(&self, s: &Segment, tag: u32) -> bool {
        s.slots.iter().all(|slot| {
            // Acquire: pairs with the finishing Release store (`finish`, or
            // a canceller's `SKIP` CAS).
            let word = slot.load(Ordering::Acquire);
            slot_tag(word) == tag && matches!(slot_kind(word), DONE | SKIP)
        })
    }

    /// Unlinks every finished segment but the last and returns it to the
    /// pool; the caller holds the sweep's lock.
    fn sweep_locked(&self) {
        let mut prev: Option<u32> = None;
        // Relaxed: only sweeps change it, and we hold the lock.
        let mut cur = self.oldest.load(Ordering::Relaxed);
        loop {
            let (idx, _) = unlink(cur);
            let s = self.segments.get(idx);
            // Acquire: pairs with the append's Release CAS.
            let next = s.next.load(Ordering::Acquire);
            if is_end(next) {
                return;
            }
            if self.finished(s, tag_of(unlink(cur).1)) {
                // Hints off it first (they only move forward), then out of
                // the list, then into the pool with a new id.
                self.step_over(&self.head, cur, next);
                self.step_over(&self.tail, cur, next);
                // Release: a traversal that reads the new link sees the
                // segment after it.
                match prev {
                    None => self.oldest.store(next, Ordering::Release),
                    Some(p) => self.segments.get(p).next.store(next, Ordering::Release),
                }
                s.id.store(FREE_ID, Ordering::Relaxed);
                self.free_segments.push(&s.next_free, idx);
            } else {
                prev = Some(idx);
            }
            cur = next;
        }
    }

    /// Moves `hint` from `from` to `to` if it is still at `from`.
    fn step_over(&self, hint: &AtomicU64, from: u64, to: u64) {
        // Release: as in `move_forward`. Failure: the hint moved past on
        // its own (hints only move forward).
        let _ = hint.compare_exchange(from, to, Ordering::Release, Ordering::Relaxed);
    }

    /// Segments in the pool (for tests, at rest).
    #[cfg(test)]
    fn pooled(&self) -> usize {
        self.free_segments.len(|i| &self.segments.get(i).next_free)
    }

    /// Cells on the free stack (for tests, at rest).
    #[cfg(test)]
    fn free_cells(&self) -> usize {
        self.cells
            .free
            .len(|i| &self.cells.waiters.get(i).next_free)
    }

    /// Chunks of segments and of cells made so far (for tests).
    #[cfg(test)]
    fn chunks_made(&self) -> (usize, usize) {
        (*lock(&self.sweep), *lock(&self.cells.grown))
    }
}

#[cfg(test)]
mod tests;
