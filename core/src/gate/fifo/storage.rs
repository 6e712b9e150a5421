//! The queue's storage: segments of slots and waiter cells in chunks that
//! never move, their free stacks, the pool of cells a gate's classes share,
//! and how a queue finds, appends and recycles its segments.
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

use std::ops::Range;

use std::task::Waker;

use crate::sync::{fence, lock, spin_wait, AtomicU32, AtomicU64, Mutex, Ordering, UnsafeCell};

use super::words::*;
use super::{Chunks, Fifo, NIL, SEG};

pub(super) struct Segment {
    /// Id of this incarnation ([`FREE_ID`] in the pool).
    pub(super) id: AtomicU64,
    /// Link to the next segment, or [`end_of`] its own id.
    pub(super) next: AtomicU64,
    /// The next segment down the pool's stack.
    pub(super) next_free: AtomicU32,
    pub(super) slots: [AtomicU64; SEG],
}

impl Segment {
    pub(super) fn new() -> Self {
        Self {
            id: AtomicU64::new(FREE_ID),
            next: AtomicU64::new(end_of(FREE_ID)),
            next_free: AtomicU32::new(NIL),
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

pub(super) struct Waiter<T> {
    pub(super) state: AtomicU64,
    /// The waiter's position, written before its slot is installed.
    pub(super) place: AtomicU64,
    /// The queue it waits in (its pool's number for it), written with
    /// `place`: with a pool shared by several queues, a position alone does
    /// not tell a cell's current queue.
    pub(super) queue: AtomicU32,
    /// Clock time when it was enqueued, written with `place`.
    pub(super) enqueued_at: AtomicU64,
    /// The segment holding that position.
    pub(super) segment: AtomicU32,
    /// The next cell down the free stack.
    pub(super) next_free: AtomicU32,
    /// The owner's waker while the status word says [`WAKER`]: owned by
    /// the owner while the cell is queued without that flag, by whoever
    /// moves the cell out of `QUEUED` with it (`fifo/owner.rs`, "Wakers").
    waker: UnsafeCell<Option<Waker>>,
    /// What the caller keeps with each cell (whom to tell).
    pub(super) payload: T,
}

// SAFETY: `waker` is read and written only by the one thread that owns the
// slot, which the status word hands between the cell's owner and the thread
// that resolves it with Release/Acquire (`fifo/owner.rs`, "Wakers"); a `Waker` is
// `Send`. Every other field is atomic, or `T`, which must be `Sync`.
unsafe impl<T: Sync> Sync for Waiter<T> {}

impl<T> Waiter<T> {
    /// Puts `waker` in the cell, returning the one it held.
    ///
    /// # Safety
    /// The caller owns the waker slot: it is the cell's owner and the
    /// status word does not say [`WAKER`] (or the cell is not queued yet).
    pub(super) unsafe fn put_waker(&self, waker: Option<Waker>) -> Option<Waker> {
        // SAFETY: the caller owns the slot (contract): nobody else reads or
        // writes it until the status word hands it on.
        self.waker
            .with_mut(|w| unsafe { std::mem::replace(&mut *w, waker) })
    }

    /// Takes the waker out of the cell.
    ///
    /// # Safety
    /// The caller owns the waker slot: it moved the cell out of `QUEUED`
    /// from a word that said [`WAKER`] (reading that word with `Acquire`),
    /// or it is the owner and the word does not say it.
    pub(super) unsafe fn take_waker(&self) -> Option<Waker> {
        // SAFETY: as in `put_waker`.
        unsafe { self.put_waker(None) }
    }
}

impl<T: Default> Waiter<T> {
    pub(super) fn new() -> Self {
        Self {
            state: AtomicU64::new(waiter_word(0, Status::Free)),
            place: AtomicU64::new(0),
            queue: AtomicU32::new(0),
            enqueued_at: AtomicU64::new(0),
            segment: AtomicU32::new(0),
            next_free: AtomicU32::new(NIL),
            waker: UnsafeCell::default(),
            payload: T::default(),
        }
    }
}

/// A tagged Treiber stack of indices whose links live in the entries.
pub(super) struct Stack(AtomicU64);

impl Stack {
    pub(super) fn new() -> Self {
        Stack(AtomicU64::new(u64::from(NIL)))
    }

    pub(super) fn pop<'a>(&self, next_of: impl Fn(u32) -> &'a AtomicU32) -> Option<u32> {
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
    pub(super) fn len<'a>(&self, next_of: impl Fn(u32) -> &'a AtomicU32) -> usize {
        let mut n = 0;
        let mut top = self.0.load(Ordering::Acquire) as u32;
        while top != NIL {
            n += 1;
            top = next_of(top).load(Ordering::Relaxed);
        }
        n
    }

    /// Whether the stack is empty now.
    pub(super) fn is_empty(&self) -> bool {
        // Acquire: as a pop's first load.
        self.0.load(Ordering::Acquire) as u32 == NIL
    }

    /// Pushes the entries `range` at once, in index order from the top.
    pub(super) fn push_chain<'a>(&self, range: Range<u32>, next_of: impl Fn(u32) -> &'a AtomicU32) {
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

    pub(super) fn push(&self, link: &AtomicU32, idx: u32) {
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

/// Waiter cells and their free stack: one pool for every queue of a gate
/// (a cell serves one queue at a time, from its take to its free), so that
/// a gate with several classes reserves room for `Q + N` waiters once, not
/// once per class.
pub(in crate::gate) struct CellPool<T> {
    pub(super) waiters: Chunks<Waiter<T>>,
    pub(super) free: Stack,
    /// Held by growth: the chunks handed to the free stack.
    pub(super) grown: Mutex<usize>,
    /// The number the next queue on this pool gets.
    pub(super) queues: AtomicU32,
}

impl<T: Default> CellPool<T> {
    /// A pool with room for `cells` waiters at first (it grows when they
    /// are all taken: rejected waiters that have not looked keep theirs).
    pub(in crate::gate) fn new(cells: usize) -> Self {
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
    pub(in crate::gate) fn reserve(&self, cells: usize) {
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
    pub(super) fn take(&self) -> Option<(u32, u32)> {
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
    pub(super) fn free(&self, cell: u32) {
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
    pub(super) fn get(&self, cell: u32) -> &Waiter<T> {
        self.waiters.get(cell)
    }
}

/// Puts chunks of a storage, `made` of which are on its free stack
/// already, on the stack until it holds `want` entries or no more (under
/// the storage's growth lock).
pub(super) fn grow_to<'a, E>(
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
pub(super) fn grow<'a, E>(
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
    // ----- segments ---------------------------------------------------------------

    /// The segment of position `p`, starting from `hint` (read before `p`
    /// was taken), appending segments as needed and moving `advance`
    /// forward to it; `None` if it was unlinked (the position was skipped).
    pub(super) fn locate(&self, p: u64, hint: u64, advance: &AtomicU64) -> Option<u32> {
        let found = self.find(p, hint, true)?;
        self.move_forward(advance, found);
        Some(unlink(found).0)
    }

    /// [`locate`](Self::locate) for a scan: appends nothing and moves no
    /// hint.
    pub(super) fn locate_quiet(&self, p: u64, hint: u64) -> Option<u32> {
        self.find(p, hint, false).map(|l| unlink(l).0)
    }

    /// The link of position `p`'s segment; `None` if it is gone (or, when
    /// `append` is false, not made yet).
    pub(super) fn find(&self, p: u64, hint: u64, append: bool) -> Option<u64> {
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
    pub(super) fn restart_from(&self) -> u64 {
        // The sweep may still be on its way to the store below.
        spin_wait();
        // Acquire: pairs with the sweep's Release store.
        self.oldest.load(Ordering::Acquire)
    }

    /// Appends a segment after `s` (id `id`, the last one when we looked):
    /// its link, or `None` if another appender was first (or `s` is no
    /// longer segment `id`).
    pub(super) fn append(&self, s: &Segment, id: u64) -> Option<u64> {
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
    pub(super) fn incarnate(&self, idx: u32, id: u64) {
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
    pub(super) fn pop_segment(&self) -> u32 {
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
    pub(super) fn replenish_segments(&self) {
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
    pub(super) fn move_forward(&self, hint: &AtomicU64, to: u64) {
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
    pub(super) fn finish(&self, slot: &AtomicU64, tag: u32) {
        // Release: the sweep's Acquire read of the kind sees everything we
        // did with the slot (see the orderings).
        slot.store(slot_word(tag, DONE, 0), Ordering::Release);
    }

    /// Whether nobody will touch segment `s`'s slots again: each is `DONE`,
    /// or `SKIP` (which a resumer only reads, and checks the tag of).
    pub(super) fn finished(&self, s: &Segment, tag: u32) -> bool {
        s.slots.iter().all(|slot| {
            // Acquire: pairs with the finishing Release store (`finish`, or
            // a canceller's `SKIP` CAS).
            let word = slot.load(Ordering::Acquire);
            slot_tag(word) == tag && matches!(slot_kind(word), DONE | SKIP)
        })
    }

    /// Unlinks every finished segment but the last and returns it to the
    /// pool; the caller holds the sweep's lock.
    pub(super) fn sweep_locked(&self) {
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
    pub(super) fn step_over(&self, hint: &AtomicU64, from: u64, to: u64) {
        // Release: as in `move_forward`. Failure: the hint moved past on
        // its own (hints only move forward).
        let _ = hint.compare_exchange(from, to, Ordering::Release, Ordering::Relaxed);
    }

    /// Segments in the pool (for tests, at rest).
    #[cfg(test)]
    pub(super) fn pooled(&self) -> usize {
        self.free_segments.len(|i| &self.segments.get(i).next_free)
    }

    /// Cells on the free stack (for tests, at rest).
    #[cfg(test)]
    pub(super) fn free_cells(&self) -> usize {
        self.cells
            .free
            .len(|i| &self.cells.waiters.get(i).next_free)
    }

    /// Chunks of segments and of cells made so far (for tests).
    #[cfg(test)]
    pub(super) fn chunks_made(&self) -> (usize, usize) {
        (*lock(&self.sweep), *lock(&self.cells.grown))
    }
}
