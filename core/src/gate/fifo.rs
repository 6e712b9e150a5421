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
//! # Wakers
//!
//! A waiter that is not detached leaves its waker in its cell, and the cell's
//! status word hands it between the owner and the one thread that resolves
//! the cell (`fifo/owner.rs`, "Wakers").
//!
//! # Storage and words
//!
//! Positions live in segments of [`SEG`] slots, linked in position order
//! and reused through a pool; waiter cells come from a [`CellPool`] that a
//! gate's classes share. `fifo/storage.rs` gives the storage and how
//! segments are found, appended and recycled; `fifo/words.rs` the packed
//! words of slots, links and waiter cells.
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

use std::sync::Arc;
use std::task::Waker;

use crossbeam_utils::CachePadded;

use crate::sync::{lock, spin_wait, AtomicU64, Mutex, Ordering};

use super::chunks::Chunks;
use super::error::AdmitError;

mod owner;
mod scan;
mod storage;
mod words;

pub(super) use storage::CellPool;
use storage::{grow_to, Segment, Stack, Waiter};
use words::*;
pub(super) use words::{Status, MAX_CELLS};

/// Slots per segment (2 in loom models, so that they cross segments).
pub(super) const SEG: usize = if cfg!(loom) { 2 } else { 32 };

/// "No entry" in a free stack.
const NIL: u32 = u32::MAX;

/// What the queue asks of the count of waiters no slot is promised to.
pub(super) trait Places {
    /// A leaving waiter's decision, as one read-modify-write of the count:
    /// if it shows a waiter no slot is promised to, take one off and return
    /// true. False if every counted waiter is promised a slot (one of them
    /// is on its way to the leaving waiter, who refuses it).
    fn give_back(&self) -> bool;
}

/// A waiter cell resolved by another thread, whose owner must be told.
#[derive(Debug)]
pub(super) struct Told {
    pub(super) cell: u32,
    /// Pushed detached: the teller frees the cell (after taking what it
    /// needs from its payload); otherwise its owner does, perhaps already.
    pub(super) detached: bool,
    /// When the waiter was pushed (read before the cell could be freed).
    pub(super) enqueued_at: u64,
    /// The owner's waker, taken out of the cell before its final status
    /// (`fifo/owner.rs`, "Wakers"): wake it.
    pub(super) waker: Option<Waker>,
}

/// Equal when they tell the same cell, the same way, the same waker.
impl PartialEq for Told {
    fn eq(&self, other: &Self) -> bool {
        let same_waker = match (&self.waker, &other.waker) {
            (None, None) => true,
            (Some(a), Some(b)) => a.will_wake(b),
            _ => false,
        };
        (self.cell, self.detached, self.enqueued_at)
            == (other.cell, other.detached, other.enqueued_at)
            && same_waker
    }
}

/// What the caller must do after a queue operation.
#[derive(Debug, PartialEq)]
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

    // ----- enqueue and resume ---------------------------------------------------

    /// Enqueues a taken cell at clock time `now`, after the caller counted
    /// its waiter; `detached` if its owner will never look (see [`Told`]),
    /// else with the `waker` its resolver wakes (`fifo/owner.rs`, "Wakers").
    pub(super) fn push(
        &self,
        cell: u32,
        now: u64,
        detached: bool,
        waker: Option<&Waker>,
    ) -> Pushed {
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
        let mut queued = waiter_word(gen, Status::Queued) | if detached { DETACHED } else { 0 };
        if let Some(waker) = waker {
            // SAFETY: a cell not queued yet: its owner owns the slot.
            let stale = unsafe { w.put_waker(Some(waker.clone())) };
            debug_assert!(stale.is_none(), "a free cell held a waker");
            queued |= WAKER;
        }
        // Release: a resumer that reads this status (Acquire) also sees the
        // place, the waker, and everything the cell's last owner did before
        // freeing it.
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
                // Nobody found the cell (its slot was never installed): its
                // waker is still the owner's.
                // SAFETY: as above.
                drop(unsafe { w.take_waker() });
                w.state.store(
                    with_status(queued & !WAKER, Status::Granted),
                    Ordering::Relaxed,
                );
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
                            if let Some((detached, waker)) = self.grant(w, word) {
                                self.finish(slot, tag);
                                return Some(Then::Wake(Told {
                                    cell,
                                    detached,
                                    enqueued_at,
                                    waker,
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

    /// Grants cell `w`, whose status word the resumer read as `word`
    /// (queued): `None` if it left meanwhile (a leave claimed it); else
    /// whether it is detached, and the waker to wake, taken out before the
    /// final status lets the owner free the cell (`fifo/owner.rs`, "Wakers").
    fn grant(&self, w: &Waiter<T>, word: u64) -> Option<(bool, Option<Waker>)> {
        // Release: the grant (see the orderings).
        if word & WAKER == 0
            && w.state
                .compare_exchange(
                    word,
                    with_status(word, Status::Granted),
                    Ordering::Release,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some((word & DETACHED != 0, None));
        }
        let (word, waker) = self.claim(w, word)?;
        // Release: the grant (see the orderings).
        w.state.store(
            with_status(word & !WAKER, Status::Granted),
            Ordering::Release,
        );
        Some((word & DETACHED != 0, waker))
    }

    /// Moves cell `w` out of `QUEUED` (its status word read `word`) into
    /// `CANCELLING`, so that no resumer can grant it and nobody else can
    /// claim it. `None` if it left `QUEUED` meanwhile; else the word it
    /// claimed (its owner may have changed a flag since `word`: swapped its
    /// waker, or armed its callback) and the waker the cell held, now ours
    /// (`fifo/owner.rs`, "Wakers").
    fn claim(&self, w: &Waiter<T>, mut word: u64) -> Option<(u64, Option<Waker>)> {
        loop {
            // Acquire: the place and the waker the owner wrote (a third
            // party found the cell through the slot's Release, or reads it
            // here), and what it left in the payload.
            match w.state.compare_exchange(
                word,
                with_status(word & !WAKER, Status::Cancelling),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) if waiter_status(actual) == waiter_status(word) => word = actual,
                Err(_) => return None,
            }
        }
        // SAFETY: we moved the cell out of `QUEUED`; if the word said
        // `WAKER`, the slot is ours (`fifo/owner.rs`, "Wakers").
        let waker = (word & WAKER != 0)
            .then(|| unsafe { w.take_waker() })
            .flatten();
        Some((word, waker))
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
        let (word, waker) = self.claim(w, word)?;
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
            waker,
        };
        // Release: see the orderings (for a grant, also what a grant by a
        // resumer publishes).
        w.state
            .store(with_status(word & !WAKER, end), Ordering::Release);
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
}

#[cfg(test)]
mod tests;
