//! The raw gate on the lock-free queues (`fifo.rs`, one per priority
//! class): every path of a gate with no adaptive LIFO. A gate with one
//! class and no wait limit counts its waiters in the state word alone (this
//! module); with several classes or a wait limit, each class also has its
//! own count (`classes.rs`, which gives that protocol), and the wait count
//! sits beside the word (`wait.rs`). Enqueue, handoff, cancel (of a future, a
//! callback ticket, a blocking wait that times out), queue-deadline expiry
//! and close take no lock; `set_limit` takes the gate's mutex only to
//! serialize with other `set_limit` calls. A queue's own cold paths lock
//! and allocate when its storage runs out (`fifo.rs`).
//!
//! # The count (one class)
//!
//! The state word's `queued` counts the waiters no slot is promised to yet;
//! `running` counts held slots, slots promised to a waiter on their way to
//! it included. A release is one `fetch_sub` of `running`. If it shows
//! waiters counted, the releaser then *promises* free slots to them: CAS
//! `running + 1, queued - 1` while a slot is free under the limit and the
//! gate is open, and [`Fifo::resume`] delivers each to the oldest waiter.
//! No arrival takes a free slot meanwhile, since a direct admission needs
//! `queued == 0`; a raised limit promises the same way. So invariant 4 of
//! the state word holds with "a slot on its way" counted in `running`.
//!
//! A waiter counts itself (CAS `queued + 1`, only when no slot is free to
//! it or others wait), then takes a cell and pushes it. Leaving (a cancel,
//! a timeout, a rejection) gives its place back through [`Places`]: one
//! read-modify-write of `queued`.
//!
//! # Orderings
//!
//! As in `raw.rs` for the word: a direct admission's CAS is `Acquire`, a
//! release's `fetch_sub` `Release` and here also `Acquire`, for the
//! classes' pairing (`classes.rs`; the same instruction on x86). A promise
//! is `AcqRel`: it passes the slot on through the queue, whose cell status
//! carries it to the waiter with `Release`/`Acquire` (`fifo.rs`). Counting
//! and giving back places are `AcqRel`, ordered with the promises as the
//! queue requires.
//!
//! # Close
//!
//! `close` sets `closed`, after which nothing is promised and nothing
//! queues, then rejects queued waiters from the head until the word shows
//! none counted: a waiter that counted itself before the close and has not
//! pushed yet is found on a later pass (close waits for that push, a few
//! instructions away).

use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use crate::sync::{lock, park, park_timeout, spin_wait, Ordering};

use super::callback::dispatch;
use super::config::MAX_CLASSES;
use super::error::AdmitError;
use super::fifo::{Places, Pushed, Status, Then, Told, MAX_CELLS};
use super::permit::OwnedPermit;
use super::raw::{is_due, Enqueued, RawGate};
use super::state::{Word, CLOSED, ONE_QUEUED, ONE_RUNNING};
use super::stats::bump;
use super::table::Waiter;
use super::tell::with_thread_waker;

/// The outcome a cell's status holds, if it holds one.
#[inline]
fn outcome(status: Status) -> Option<Result<(), AdmitError>> {
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
pub(super) fn waiter_id(class: usize, cell: u32) -> u32 {
    (class as u32) << CLASS_SHIFT | cell
}

/// The class and cell of a queued waiter's handle.
#[inline]
pub(super) fn split_id(id: u32) -> (usize, u32) {
    ((id >> CLASS_SHIFT) as usize, id & ((1 << CLASS_SHIFT) - 1))
}

/// Waiter cells a class's queue needs room for: its waiters (within the
/// gate's queue limit `queue` and the class's `class_queue`), and as many
/// granted ones not yet looking as the limit allows. The classes share one
/// pool of cells, sized for the whole queue (`class_queue = queue`); each
/// class's segments are sized for its own.
pub(super) fn queue_cells(queue: u32, class_queue: u32, limit: u32) -> usize {
    (queue.min(class_queue) as usize + limit as usize).max(1)
}

/// The count a leaving waiter of `class` gives its place back to: the word's
/// `queued` (one class), or its class's count and then the word's total
/// (several, `classes.rs`).
pub(super) struct Leaving<'a> {
    pub(super) gate: &'a RawGate,
    pub(super) class: usize,
}

impl Places for Leaving<'_> {
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

impl RawGate {
    /// Whether this gate queues on the lock-free queues (else in the table).
    #[inline(always)]
    pub(super) fn lock_free(&self) -> bool {
        !self.fifos.is_empty()
    }

    /// Whether this gate runs the counted protocol of `classes.rs`: on the
    /// lock-free queues with several classes or a wait limit.
    #[inline(always)]
    pub(super) fn runs_counted(&self) -> bool {
        !self.class_counts.is_empty()
    }

    /// The locked part of an admission, without a lock: admit directly,
    /// reject, or count the waiter and push its cell.
    pub(super) fn lf_enqueue(&self, class: usize, waiter: Waiter) -> Enqueued {
        if self.runs_counted() {
            return self.enqueue_counted(class, waiter);
        }
        // Acquire: as the first load of `enqueue`.
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            let w = Word(cur);
            if w.closed() {
                return Enqueued::Rejected(self.refuse_closed(class), waiter);
            }
            let new = if self.direct(class, w) {
                cur + ONE_RUNNING
            } else if w.queued() < self.queue_limit.min(self.classes.queue[class]) {
                cur + ONE_QUEUED
            } else if self.lf_expire_for(class) {
                // Acquire: as the first load.
                cur = self.state.load(Ordering::Acquire);
                continue;
            } else {
                return Enqueued::Rejected(AdmitError::AtCapacity, waiter);
            };
            match self.lf_commit(cur, new) {
                Ok(true) => return Enqueued::Direct(waiter),
                Ok(false) => break,
                Err(actual) => cur = actual,
            }
        }
        self.lf_push(class, waiter)
    }

    /// For an arrival of `class` that found no place: expires due waiters
    /// to make one (true: decide again), or counts its rejection (false). A
    /// class that never queues gains nothing from expiry.
    pub(super) fn lf_expire_for(&self, class: usize) -> bool {
        if self.deadlines && self.classes.queue[class] > 0 && self.lf_expire() > 0 {
            return true;
        }
        self.counters.class[class].rejected_capacity.add(1);
        false
    }

    /// Commits an arrival's decision made on word `cur`: `new` is `cur`
    /// with one more running (admitted directly, and counted so) or one
    /// more queued. `Ok(true)` if admitted, `Ok(false)` if counted queued,
    /// the word seen if it changed meanwhile.
    pub(super) fn lf_commit(&self, cur: u64, new: u64) -> Result<bool, u64> {
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
    pub(super) fn lf_push(&self, class: usize, waiter: Waiter) -> Enqueued {
        let fifo = &self.fifos[class];
        bump(&self.counters.enqueued, 1);
        let (cell, gen) = fifo
            .take_cell()
            .expect("waiter cells exceed the queue's indices");
        let tell = fifo.payload(cell);
        let detached = matches!(waiter, Waiter::Callback(..));
        match waiter {
            Waiter::Task(Some(waker)) => tell.register(&waker),
            Waiter::Thread => with_thread_waker(|w| tell.register(w)),
            Waiter::Callback(callback, gate) => tell.set_callback((callback, gate)),
            Waiter::Task(None) | Waiter::None => {}
        }
        match fifo.push(cell, self.clock.now_nanos(), detached) {
            Pushed::Queued => Enqueued::Queued(waiter_id(class, cell), gen),
            Pushed::Granted => {
                // A slot was left at our position: we hold it.
                bump(&self.counters.admitted_queued, 1);
                self.waits.record(0);
                tell.forget();
                let back = tell
                    .take_callback()
                    .map_or(Waiter::None, |(callback, gate)| {
                        Waiter::Callback(callback, gate)
                    });
                fifo.free_cell(cell);
                Enqueued::Direct(back)
            }
        }
    }

    /// Gives back one held slot: one `fetch_sub` that cannot fail (under
    /// contention, a load first would fetch the word's cache line twice).
    /// If waiters were counted, the freed slot is then handed on.
    #[inline]
    pub(super) fn lf_release(&self) {
        // Release: our use of the slot happens-before its next admission
        // (a direct admitter's Acquire CAS, or a promise's AcqRel).
        // Acquire: with classes, the handoff below must see the count of an
        // arrival whose read-modify-write of the word came before ours
        // (`classes.rs`, "Orderings"); on x86 the same instruction.
        let old = Word(self.state.fetch_sub(ONE_RUNNING, Ordering::AcqRel));
        debug_assert!(old.running() > 0, "release without a held slot");
        if old.queued() > 0 {
            self.lf_hand_on(false);
        }
    }

    /// Hands free slots to the counted waiters, oldest first (of the most
    /// important class, `classes.rs`), after expiring due ones: what a
    /// release that saw waiters, and a raised limit, leave to do. No
    /// arrival takes a free slot ahead of a waiter of its class or a more
    /// important one meanwhile: a direct admission needs `queued == 0`, or
    /// with classes nobody counted in those classes.
    #[inline(never)]
    pub(super) fn lf_hand_on(&self, always_expire: bool) {
        // Due waiters go first: on a limit change always, else if a slot
        // could be handed on at all (with every wait slot taken, the next
        // freed wait slot expires them).
        if self.deadlines && (always_expire || !self.waits_full()) {
            self.lf_expire();
        }
        if self.runs_counted() {
            return self.hand_on_counted();
        }
        while self.lf_promise_free_slot() {
            if self.lf_deliver() {
                // A leaving waiter refused it: free it again, and look
                // again. Release: as in `lf_release`.
                self.state.fetch_sub(ONE_RUNNING, Ordering::Release);
            }
        }
    }

    /// Promises a free slot to the counted waiters (`running + 1, queued -
    /// 1`) if someone is counted, a slot is free under the limit and the
    /// gate is open (one class).
    fn lf_promise_free_slot(&self) -> bool {
        // Acquire: a guess; the CAS orders.
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            let w = Word(cur);
            if w.queued() == 0 || w.running() >= w.limit() || w.closed() {
                return false;
            }
            // AcqRel: Acquire for the slot's last holder (as an admission),
            // Release as the queue asks of promises.
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

    /// Delivers a slot just promised to a waiter of `class`; true if it
    /// came back (a leaving waiter refused it: the caller holds it again).
    pub(super) fn lf_deliver_to(&self, class: usize) -> bool {
        match self.fifos[class].resume() {
            Then::Nothing => false,
            Then::Wake(told) => {
                self.lf_tell(class, told, Ok(()));
                false
            }
            Then::Release => true,
        }
    }

    /// [`lf_deliver_to`](Self::lf_deliver_to) the one class.
    fn lf_deliver(&self) -> bool {
        self.lf_deliver_to(0)
    }

    /// Does what an operation on `class`'s queue left to do.
    pub(super) fn lf_after(&self, class: usize, then: Then) {
        match then {
            Then::Nothing => {}
            Then::Wake(told) => self.lf_tell(class, told, Ok(())),
            Then::Release => self.lf_release_grant(self.wait_limit.is_some()),
        }
    }

    /// Tells a resolved waiter of `class`: wakes its task or thread, or
    /// calls its callback (freeing its cell first: see `tell.rs`).
    pub(super) fn lf_tell(&self, class: usize, told: Told, outcome: Result<(), AdmitError>) {
        let fifo = &self.fifos[class];
        if outcome.is_ok() {
            bump(&self.counters.admitted_queued, 1);
            self.waits
                .record(self.clock.now_nanos().saturating_sub(told.enqueued_at));
        }
        let tell = fifo.payload(told.cell);
        if !told.detached {
            tell.wake();
            return;
        }
        let detached = tell.take_callback();
        fifo.free_cell(told.cell);
        if let Some((callback, gate)) = detached {
            dispatch(callback, outcome.map(|()| OwnedPermit::new(gate)));
        }
    }

    /// A queued future's poll (waiter `id`): its outcome (the cell is
    /// freed), or `Pending` with its waker registered.
    pub(super) fn lf_poll(&self, id: u32, waker: &Waker) -> Poll<Result<(), AdmitError>> {
        let (class, cell) = split_id(id);
        let fifo = &self.fifos[class];
        if let Some(o) = outcome(fifo.status(cell).1) {
            fifo.free_cell(cell);
            return Poll::Ready(o);
        }
        // Again before every check (a late teller may have taken it; see
        // `tell.rs`), then check once more: a resolver that changed the
        // status before we registered has woken nobody.
        fifo.payload(cell).register(waker);
        if let Some(o) = outcome(fifo.status(cell).1) {
            fifo.free_cell(cell);
            return Poll::Ready(o);
        }
        Poll::Pending
    }

    /// Takes a non-detached waiter `id` of generation `gen` out of the
    /// queue for its owner (a dropped future, a blocking wait that gave
    /// up): true if it left; false if it had an outcome, which is taken (a
    /// grant is released) and its cell freed.
    pub(super) fn lf_cancel(&self, id: u32, gen: u32) -> bool {
        let (class, cell) = split_id(id);
        if self.lf_leave(class, cell, gen, None) {
            return true;
        }
        let fifo = &self.fifos[class];
        loop {
            match fifo.status(cell).1 {
                Status::Granted => {
                    fifo.free_cell(cell);
                    self.lf_release_grant(self.wait_limit.is_some());
                    return false;
                }
                Status::Rejected(_) => {
                    fifo.free_cell(cell);
                    return false;
                }
                // Another thread is rejecting it: a few instructions left.
                Status::Cancelling => spin_wait(),
                s => unreachable!("cancelled a cell it does not own ({s:?})"),
            }
        }
    }

    /// Takes its own non-detached cell of `class` out of the queue,
    /// cancelled (`reason` `None`) or rejected: true if it was queued (its
    /// cell is freed); false if it has an outcome or is being rejected.
    fn lf_leave(&self, class: usize, cell: u32, gen: u32, reason: Option<AdmitError>) -> bool {
        let fifo = &self.fifos[class];
        let Some(then) = fifo.leave(cell, gen, reason, &Leaving { gate: self, class }) else {
            return false;
        };
        fifo.payload(cell).forget();
        fifo.free_cell(cell);
        match reason {
            None => bump(&self.counters.cancelled, 1),
            Some(_) => bump(&self.counters.class[class].expired, 1),
        }
        self.lf_after(class, then);
        true
    }

    /// A callback ticket's cancel (waiter `id`): true if the request was
    /// still queued (its callback, dropped here, will not be called).
    pub(super) fn lf_cancel_callback(&self, id: u32, gen: u32) -> bool {
        let (class, cell) = split_id(id);
        let fifo = &self.fifos[class];
        let Some(then) = fifo.leave(cell, gen, None, &Leaving { gate: self, class }) else {
            return false;
        };
        let stale = fifo.payload(cell).take_callback();
        fifo.free_cell(cell);
        bump(&self.counters.cancelled, 1);
        self.lf_after(class, then);
        drop(stale);
        true
    }

    /// Whether callback request `id` is still queued.
    pub(super) fn lf_queued(&self, id: u32, gen: u32) -> bool {
        let (class, cell) = split_id(id);
        self.fifos[class].status(cell) == (gen, Status::Queued)
    }

    /// Rejects every due waiter from each class's head; how many.
    pub(super) fn lf_expire(&self) -> usize {
        let now = self.clock.now_nanos();
        let mut total = 0;
        for class in 0..self.classes.count {
            let Some(timeout) = self.classes.timeout[class] else {
                continue;
            };
            let n = self.lf_reject_from_head(class, AdmitError::QueueTimeout, |at| {
                is_due(at, timeout, now)
            });
            bump(&self.counters.class[class].expired, n as u64);
            total += n;
        }
        total
    }

    /// Rejects `class`'s queued waiters with `reason` from the oldest on
    /// while `due` says yes to their queue time; how many.
    fn lf_reject_from_head(
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
                self.lf_tell(class, told, Err(reason));
                self.lf_after(class, then);
            },
        )
    }

    /// When the first queued waiter is due, if one is queued in a class
    /// with a deadline.
    pub(super) fn lf_next_deadline(&self) -> Option<u64> {
        (0..self.classes.count)
            .filter_map(|class| {
                let timeout = self.classes.timeout[class]?;
                self.fifos[class]
                    .oldest_enqueued_at()
                    .map(|at| at.saturating_add(timeout))
            })
            .min()
    }

    /// Sets `closed` and rejects every queued waiter (module docs).
    pub(super) fn lf_close(&self) {
        // AcqRel: as any change of `closed`; ordered before the scans.
        self.state.fetch_or(CLOSED, Ordering::AcqRel);
        loop {
            for class in 0..self.classes.count {
                let n = self.lf_reject_from_head(class, AdmitError::Closed, |_| true);
                self.counters.closed(class, n as u64);
            }
            // Acquire: pairs with the counting CAS of a waiter still on its
            // way to its push.
            if Word(self.state.load(Ordering::Acquire)).queued() == 0 {
                return;
            }
            spin_wait();
        }
    }

    /// Sets the engine limit, then expires due waiters and hands the slots
    /// a raised limit frees to the waiters.
    pub(super) fn lf_set_limit(&self, limit: u32) {
        {
            // Serializes limit changes (cold path); the word itself is
            // changed by a CAS loop, as releases may move it meanwhile.
            let _serial = lock(&self.table);
            // Cold path: room for every waiter the new limit may leave
            // granted and not yet looking, and the queue behind them: the
            // cells the classes share, and each class's segments.
            self.fifos[0]
                .cells()
                .reserve(queue_cells(self.queue_limit, self.queue_limit, limit));
            for (class, fifo) in self.fifos.iter().enumerate() {
                fifo.reserve_segments(
                    queue_cells(self.queue_limit, self.classes.queue[class], limit),
                    limit as usize,
                );
            }
            self.update(|w| Word::new(w.running(), w.queued(), limit, w.closed()));
        }
        self.lf_hand_on(true);
    }

    /// A blocking waiter's wait from its push (waiter `id` of generation
    /// `gen`) until its outcome, its queue deadline or `give_up`.
    pub(super) fn lf_block(
        &self,
        (id, gen): (u32, u32),
        give_up: Option<Instant>,
    ) -> Result<(), AdmitError> {
        let (class, cell) = split_id(id);
        let fifo = &self.fifos[class];
        let tell = fifo.payload(cell);
        loop {
            // Again before every check: see `tell.rs`.
            with_thread_waker(|w| tell.register(w));
            if let Some(o) = outcome(fifo.status(cell).1) {
                fifo.free_cell(cell);
                return o;
            }
            let mut wait = None;
            if let Some(timeout) = self.classes.timeout[class] {
                let now = self.clock.now_nanos();
                let due = fifo.enqueued_at(cell).saturating_add(timeout);
                if now >= due {
                    self.lf_expire();
                    // Expiry stops at the first waiter not due; one ahead
                    // of us may have read the clock a moment later.
                    if self.lf_leave(class, cell, gen, Some(AdmitError::QueueTimeout)) {
                        return Err(AdmitError::QueueTimeout);
                    }
                    continue;
                }
                wait = Some(Duration::from_nanos(due - now));
            }
            if let Some(give_up) = give_up {
                let now = Instant::now();
                if now >= give_up {
                    if self.lf_leave(class, cell, gen, None) {
                        return Err(AdmitError::TimedOut);
                    }
                    // Resolved meanwhile (or being rejected): its outcome
                    // comes first.
                    spin_wait();
                    continue;
                }
                let left = give_up - now;
                wait = Some(wait.map_or(left, |w: Duration| w.min(left)));
            }
            match wait {
                None => park(),
                Some(d) => park_timeout(d),
            }
        }
    }
}
