//! The raw gate's paths through its queues (`fifo.rs`, one per priority
//! class): enqueue, handoff, a future's poll, cancel (of a future, a
//! callback ticket, a blocking wait that gives up), rejection from the head
//! (queue deadline, close) and adaptive LIFO. None takes a lock; a queue's
//! own cold paths lock and allocate when its storage runs out (`fifo.rs`).
//!
//! A gate with one class and no wait limit counts its waiters in the state
//! word alone (this module); with several classes or a wait limit, each
//! class also has its own count (`classes.rs`, which gives that protocol),
//! and the wait count sits beside the word (`wait.rs`).
//!
//! # The count (one class)
//!
//! The state word's `queued` counts the waiters no slot is promised to yet;
//! `running` counts held slots, slots promised to a waiter on their way to
//! it included. A release is one `fetch_sub` of `running`. If it shows
//! waiters counted, the releaser then *promises* free slots to them: CAS
//! `running + 1, queued - 1` while a slot is free under the limit and the
//! gate is open, and delivers each through the queue (below). No arrival
//! takes a free slot meanwhile, since a direct admission needs
//! `queued == 0`; a raised limit promises the same way. So invariant 4 of
//! the state word holds with "a slot on its way" counted in `running`.
//!
//! A waiter counts itself (CAS `queued + 1`, only when no slot is free to
//! it or others wait), then takes a cell and pushes it. Leaving (a cancel,
//! a timeout, a rejection) gives its place back through [`Places`]: one
//! read-modify-write of `queued`.
//!
//! # Adaptive LIFO
//!
//! On a gate with adaptive LIFO whose last expiry has not been followed by
//! a handoff yet, the next slot goes to the newest waiter in a cell. The
//! handoff *reserves* the slot (CAS `running + 1` while a slot is free and
//! waiters are counted) instead of promising it, then makes the leave that
//! displacement makes from the newest end (`Fifo::grant_newest`), ending
//! in a grant: the waiter gives its place back as a cancel does, or, if
//! every counted waiter was promised a slot already, refuses the one on its
//! way (its resumer releases it). A promise would not do: a cancel that
//! found the count at 0 expects the promised slot at its own position, in
//! order. If no cell waits, the reservation is given back and the slot is
//! promised in order.
//!
//! # Orderings
//!
//! A promise is `AcqRel`: Acquire for the slot's last holder (as an
//! admission), Release as it passes the slot on through the queue, whose
//! cell status carries it to the waiter with `Release`/`Acquire`
//! (`fifo.rs`). Counting and giving back places are `AcqRel`, ordered with
//! the promises as the queue requires.

use std::task::{Poll, Waker};

use crate::sync::{spin_wait, Ordering};

use super::config::MAX_CLASSES;
use super::error::AdmitError;
use super::fifo::{Places, Pushed, Status, Then, Told, MAX_CELLS};
use super::raw::RawGate;
use super::state::{Word, ONE_QUEUED, ONE_RUNNING};
use super::stats::bump;
use super::tell::{with_thread_waker, Detached};

/// The outcome a cell's status holds, if it holds one.
#[inline]
pub(super) fn outcome(status: Status) -> Option<Result<(), AdmitError>> {
    match status {
        Status::Granted => Some(Ok(())),
        Status::Rejected(e) => Some(Err(e)),
        _ => None,
    }
}

/// Where a queued waiter's handle keeps its class: above its cell.
const CLASS_SHIFT: u32 = 28;

const _: () = assert!(MAX_CELLS < 1 << CLASS_SHIFT && MAX_CLASSES <= 8);

/// A queued waiter's handle: its class and its cell in that class's queue.
#[inline]
fn waiter_id(class: usize, cell: u32) -> u32 {
    (class as u32) << CLASS_SHIFT | cell
}

/// The class and cell of a queued waiter's handle.
#[inline]
pub(super) fn split_id(id: u32) -> (usize, u32) {
    ((id >> CLASS_SHIFT) as usize, id & ((1 << CLASS_SHIFT) - 1))
}

/// Whom a waiter's cell tells when it is resolved.
pub(super) enum Waiter<'a, D> {
    /// A future: its task's waker (left in the cell: `fifo/owner.rs`, "Wakers").
    Task(&'a Waker),
    /// A blocked thread: this thread.
    Thread,
    /// A callback, detached (its owner never looks at the cell).
    Callback(D),
    /// Nobody to tell yet: the owner arms a callback later ([`RawGate::arm`]),
    /// or cancels.
    Later,
}

impl<D> Waiter<'_, D> {
    /// The callback, for a waiter that did not queue after all.
    pub(super) fn into_detached(self) -> Option<D> {
        match self {
            Waiter::Callback(d) => Some(d),
            Waiter::Task(_) | Waiter::Thread | Waiter::Later => None,
        }
    }
}

/// Which waker a queued cell holds: `Waker::will_wake`'s comparison (data
/// pointer and vtable), kept as plain numbers by the cell's owner. Sound as
/// an identity: while the cell holds a clone of that waker, its data stays
/// alive, so no other waker can have the same pointer meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct WakerId(usize, usize);

impl WakerId {
    pub(super) fn of(waker: &Waker) -> Self {
        WakerId(waker.data() as usize, waker.vtable() as *const _ as usize)
    }
}

/// Outcome of the slow part of an admission; hands a callback back when the
/// request did not queue, so that the caller calls it.
pub(super) enum Enqueued<D> {
    Direct(Option<D>),
    Rejected(AdmitError, Option<D>),
    /// Queued: the waiter's handle and its cell's generation.
    Queued(u32, u32),
}

/// The count a leaving waiter of `class` gives its place back to: the word's
/// `queued` (one class), or its class's count and then the word's total
/// (several, `classes.rs`).
pub(super) struct Leaving<'a, D> {
    pub(super) gate: &'a RawGate<D>,
    pub(super) class: usize,
}

impl<D: Detached> Places for Leaving<'_, D> {
    fn give_back(&self) -> bool {
        if self.gate.runs_counted() {
            return self.gate.give_back_counted(self.class);
        }
        let state = &self.gate.state;
        // Acquire: the first guess; the CAS orders.
        let mut cur = state.load(Ordering::Acquire);
        loop {
            let w = Word(cur);
            // With nobody counted, the same value, as a read-modify-write:
            // ordered with the promises that took the count to 0.
            let new = if w.queued() > 0 {
                cur - ONE_QUEUED
            } else {
                cur
            };
            // AcqRel: see the module docs. Acquire on failure: a new guess.
            match state.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return new != cur,
                Err(actual) => cur = actual,
            }
        }
    }
}

impl<D: Detached> RawGate<D> {
    /// Whether this gate runs the counted protocol of `classes.rs`: several
    /// classes or a wait limit.
    #[inline(always)]
    pub(super) fn runs_counted(&self) -> bool {
        !self.class_counts.is_empty()
    }

    /// The slow part of an admission: admit directly, reject, or count the
    /// waiter and push its cell.
    pub(super) fn enqueue(&self, class: usize, waiter: Waiter<'_, D>) -> Enqueued<D> {
        if self.runs_counted() {
            return self.enqueue_counted(class, waiter);
        }
        // Acquire: pairs with a release's Release (a slot freed is seen, and
        // its holder's work happens-before ours).
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            let w = Word(cur);
            if w.closed() {
                return Enqueued::Rejected(self.refuse_closed(class), waiter.into_detached());
            }
            let new = if self.direct(class, w) {
                cur + ONE_RUNNING
            } else if w.queued() < self.queue_limit.min(self.classes.queue[class]) {
                cur + ONE_QUEUED
            } else if self.expire_for(class) {
                // Acquire: as the first load.
                cur = self.state.load(Ordering::Acquire);
                continue;
            } else {
                return Enqueued::Rejected(AdmitError::AtCapacity, waiter.into_detached());
            };
            match self.commit(cur, new) {
                Ok(true) => return Enqueued::Direct(waiter.into_detached()),
                Ok(false) => break,
                Err(actual) => cur = actual,
            }
        }
        self.push(class, waiter)
    }

    /// For an arrival of `class` that found no place: expires due waiters
    /// to make one (true: decide again), or counts its rejection (false). A
    /// class that never queues gains nothing from expiry.
    pub(super) fn expire_for(&self, class: usize) -> bool {
        if self.deadlines && self.classes.queue[class] > 0 && self.expire() > 0 {
            return true;
        }
        self.counters.class[class].rejected_capacity.add(1);
        false
    }

    /// Commits an arrival's decision made on word `cur`: `new` is `cur`
    /// with one more running (admitted directly, and counted so) or one
    /// more queued. `Ok(true)` if admitted, `Ok(false)` if counted queued,
    /// the word seen if it changed meanwhile.
    pub(super) fn commit(&self, cur: u64, new: u64) -> Result<bool, u64> {
        // AcqRel: Acquire as a direct admission; Release and Acquire as the
        // queue asks of counting (module docs). Acquire on failure: a new
        // guess, as the first load.
        self.state
            .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)?;
        let direct = new == cur + ONE_RUNNING;
        if direct {
            self.counters.admitted_direct.add(1);
        }
        Ok(direct)
    }

    /// Pushes a counted waiter of `class` into its class's queue: queued
    /// there, or admitted at once when a slot was already left at its
    /// position.
    pub(super) fn push(&self, class: usize, waiter: Waiter<'_, D>) -> Enqueued<D> {
        let fifo = &self.fifos[class];
        let (cell, gen) = fifo
            .take_cell()
            .expect("waiter cells exceed the queue's indices");
        let tell = fifo.payload(cell);
        let now = self.clock.now_nanos();
        let pushed = match waiter {
            Waiter::Task(waker) => fifo.push(cell, now, false, Some(waker)),
            Waiter::Thread => with_thread_waker(|w| fifo.push(cell, now, false, Some(w))),
            Waiter::Callback(d) => {
                tell.set_callback(d);
                fifo.push(cell, now, true, None)
            }
            Waiter::Later => fifo.push(cell, now, false, None),
        };
        match pushed {
            Pushed::Queued => Enqueued::Queued(waiter_id(class, cell), gen),
            Pushed::Granted => {
                // A slot was left at our position: we hold it.
                self.counters.admitted_queued.add(1);
                self.waits.record(0);
                let back = tell.take_callback();
                fifo.free_cell(cell);
                Enqueued::Direct(back)
            }
        }
    }

    /// Hands free slots to the counted waiters, oldest first (of the most
    /// important class, `classes.rs`), after expiring due ones: what a
    /// release that saw waiters, and a raised limit, leave to do. No
    /// arrival takes a free slot ahead of a waiter of its class or a more
    /// important one meanwhile: a direct admission needs `queued == 0`, or
    /// with classes nobody counted in those classes.
    #[inline(never)]
    pub(super) fn hand_on(&self, always_expire: bool) {
        // Due waiters go first: on a limit change always, else if a slot
        // could be handed on at all (with every wait slot taken, the next
        // freed wait slot expires them).
        if self.deadlines && (always_expire || !self.waits_full()) {
            self.expire();
        }
        if self.runs_counted() {
            return self.hand_on_counted();
        }
        loop {
            if self.lifo_pending() {
                let free = |w: Word| w.queued() > 0 && w.running() < w.limit() && !w.closed();
                if self.take_slot_while(free).is_err() {
                    return;
                }
                if self.lifo_grant(0) {
                    continue;
                }
                // Nobody in a cell: give the reservation back and promise in
                // order. AcqRel: a freeing write, as a release.
                self.state.fetch_sub(ONE_RUNNING, Ordering::AcqRel);
            }
            if !self.promise_free_slot() {
                return;
            }
            if self.deliver(0) {
                // A leaving waiter refused it: free it again, and look
                // again. Release: as in `release`.
                self.state.fetch_sub(ONE_RUNNING, Ordering::Release);
            }
        }
    }

    /// Promises a free slot to the counted waiters (`running + 1, queued -
    /// 1`) if someone is counted, a slot is free under the limit and the
    /// gate is open (one class).
    fn promise_free_slot(&self) -> bool {
        // Acquire: a guess; the CAS orders.
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            let w = Word(cur);
            if w.queued() == 0 || w.running() >= w.limit() || w.closed() {
                return false;
            }
            // AcqRel: see the module docs.
            match self.state.compare_exchange(
                cur,
                cur + ONE_RUNNING - ONE_QUEUED,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Delivers a slot just promised to a waiter of `class`, the oldest;
    /// true if it came back (a leaving waiter refused it: the caller holds
    /// it again).
    pub(super) fn deliver(&self, class: usize) -> bool {
        match self.fifos[class].resume() {
            Then::Nothing => false,
            Then::Wake(told) => {
                self.tell(class, told, Ok(()));
                false
            }
            Then::Release => true,
        }
    }

    /// Whether the next handoff is adaptive LIFO's (module docs).
    #[inline]
    pub(super) fn lifo_pending(&self) -> bool {
        // Relaxed: a choice of waiter (`RawGate::lifo_next`).
        self.lifo && self.lifo_next.load(Ordering::Relaxed)
    }

    /// Adaptive LIFO's handoff (module docs), taking its turn: the slot the
    /// caller reserved for `class` (and the wait slot, with a wait limit)
    /// goes to its newest waiter in a cell. False if none waits: the caller
    /// still holds what it reserved.
    pub(super) fn lifo_grant(&self, class: usize) -> bool {
        // Relaxed: as in `lifo_pending`.
        self.lifo_next.store(false, Ordering::Relaxed);
        let Some((granted, then)) = self.fifos[class].grant_newest(&Leaving { gate: self, class })
        else {
            return false;
        };
        self.tell(class, granted, Ok(()));
        self.after(class, then);
        true
    }

    /// Does what an operation on `class`'s queue left to do.
    pub(super) fn after(&self, class: usize, then: Then) {
        match then {
            Then::Nothing => {}
            Then::Wake(told) => self.tell(class, told, Ok(())),
            Then::Release => self.release_held(self.wait_limit.is_some()),
        }
    }

    /// Tells a resolved waiter of `class`: wakes its task or thread, or
    /// calls its callback (freeing its cell first: see `tell.rs`).
    pub(super) fn tell(&self, class: usize, told: Told, outcome: Result<(), AdmitError>) {
        let fifo = &self.fifos[class];
        if outcome.is_ok() {
            self.counters.admitted_queued.add(1);
            self.waits
                .record(self.clock.now_nanos().saturating_sub(told.enqueued_at));
        }
        if !told.detached {
            if let Some(waker) = told.waker {
                waker.wake();
            }
            return;
        }
        let detached = fifo.payload(told.cell).take_callback();
        fifo.free_cell(told.cell);
        if let Some(detached) = detached {
            detached.resolve(outcome);
        }
    }

    /// A queued future's poll (waiter `id`): its outcome (the cell is
    /// freed), or `Pending`. The cell holds the waker `registered` names;
    /// another is swapped in (`fifo/owner.rs`, "Wakers"). Out of line: inlined
    /// into the futures' poll, its register pressure taxed their first poll.
    #[inline(never)]
    pub(super) fn poll(
        &self,
        id: u32,
        registered: &mut WakerId,
        waker: &Waker,
    ) -> Poll<Result<(), AdmitError>> {
        let (class, cell) = split_id(id);
        let fifo = &self.fifos[class];
        let status = match fifo.settled(cell) {
            Status::Queued if *registered == WakerId::of(waker) => return Poll::Pending,
            Status::Queued => match fifo.register(cell, waker) {
                None => {
                    *registered = WakerId::of(waker);
                    return Poll::Pending;
                }
                Some(status) => status,
            },
            status => status,
        };
        let o = outcome(status).expect("a queued cell's owner finds it queued or resolved");
        fifo.free_cell(cell);
        Poll::Ready(o)
    }

    /// Takes a non-detached waiter `id` of generation `gen` out of the
    /// queue for its owner (a dropped future, a blocking wait that gave
    /// up): true if it left; false if it had an outcome, which is taken (a
    /// grant is released) and its cell freed.
    pub(super) fn cancel(&self, id: u32, gen: u32) -> bool {
        let (class, cell) = split_id(id);
        if self.leave(class, cell, gen, None) {
            return true;
        }
        let fifo = &self.fifos[class];
        loop {
            match fifo.status(cell).1 {
                Status::Granted => {
                    fifo.free_cell(cell);
                    self.release_held(self.wait_limit.is_some());
                    return false;
                }
                Status::Rejected(_) => {
                    fifo.free_cell(cell);
                    return false;
                }
                // Another thread is resolving it: a few instructions left.
                Status::Cancelling => spin_wait(),
                s => unreachable!("cancelled a cell it does not own ({s:?})"),
            }
        }
    }

    /// Takes its own non-detached cell of `class` out of the queue,
    /// cancelled (`reason` `None`) or rejected: true if it was queued (its
    /// cell is freed); false if it has an outcome or is being resolved.
    pub(super) fn leave(
        &self,
        class: usize,
        cell: u32,
        gen: u32,
        reason: Option<AdmitError>,
    ) -> bool {
        let fifo = &self.fifos[class];
        // The waker the leave takes out of the cell is our own: dropped.
        let Some(then) = fifo.leave(cell, gen, reason, &Leaving { gate: self, class }) else {
            return false;
        };
        fifo.free_cell(cell);
        match reason {
            None => bump(&self.counters.cancelled, 1),
            Some(_) => self.expired(class, 1),
        }
        self.after(class, then);
        true
    }

    /// A callback ticket's cancel (waiter `id`): true if the request was
    /// still queued (its callback, dropped here, will not be called).
    pub(super) fn cancel_callback(&self, id: u32, gen: u32) -> bool {
        let (class, cell) = split_id(id);
        let fifo = &self.fifos[class];
        let Some(then) = fifo.leave(cell, gen, None, &Leaving { gate: self, class }) else {
            return false;
        };
        let stale = fifo.payload(cell).take_callback();
        fifo.free_cell(cell);
        bump(&self.counters.cancelled, 1);
        self.after(class, then);
        drop(stale);
        true
    }

    /// Leaves `detached` in the cell of queued waiter `id` (pushed as
    /// [`Waiter::Later`]) and makes it detached, so that whoever resolves it
    /// tells `detached` (`fifo.rs`, `Fifo::detach`). If it was resolved
    /// first, its outcome (the cell is freed, a grant is the caller's slot)
    /// and `detached` back.
    pub(super) fn arm(
        &self,
        id: u32,
        gen: u32,
        detached: D,
    ) -> Result<(), (Result<(), AdmitError>, D)> {
        let (class, cell) = split_id(id);
        let fifo = &self.fifos[class];
        let tell = fifo.payload(cell);
        tell.set_callback(detached);
        match fifo.detach(cell, gen) {
            Ok(()) => Ok(()),
            Err(status) => {
                let detached = tell
                    .take_callback()
                    .expect("a cell not detached keeps its owner's callback");
                fifo.free_cell(cell);
                let o = outcome(status).expect("a queued cell's owner finds it resolved");
                Err((o, detached))
            }
        }
    }

    /// Whether callback request `id` is still queued.
    pub(super) fn is_queued(&self, id: u32, gen: u32) -> bool {
        let (class, cell) = split_id(id);
        self.fifos[class].status(cell) == (gen, Status::Queued)
    }

    /// Rejects `class`'s queued waiters with `reason` from the oldest on
    /// while `due` says yes to their queue time; how many.
    pub(super) fn reject_from_head(
        &self,
        class: usize,
        reason: AdmitError,
        due: impl Fn(u64) -> bool,
    ) -> usize {
        self.fifos[class].reject_from_head(
            reason,
            due,
            usize::MAX,
            &Leaving { gate: self, class },
            |told, then| {
                self.tell(class, told, Err(reason));
                self.after(class, then);
            },
        )
    }
}
