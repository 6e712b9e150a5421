//! The raw gate on the lock-free queue (`fifo.rs`): every path of a gate
//! with one class, no adaptive LIFO and no wait limit. Enqueue, handoff,
//! cancel (of a future, a callback ticket, a blocking wait that times out),
//! queue-deadline expiry and close take no lock; `set_limit` takes the
//! gate's mutex only to serialize with other `set_limit` calls. The queue's
//! own cold paths lock and allocate when its storage runs out (`fifo.rs`).
//!
//! # The count
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
//! release's `fetch_sub` `Release` (a promise `AcqRel`: it passes the slot on through
//! the queue, whose cell status carries it to the waiter with
//! `Release`/`Acquire`, see `fifo.rs`). Counting and giving back places
//! are `AcqRel`, ordered with the promises as the queue requires.
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
use super::error::AdmitError;
use super::fifo::{Fifo, Places, Pushed, Status, Then, Told};
use super::permit::OwnedPermit;
use super::raw::{is_due, Enqueued, RawGate};
use super::state::{Word, CLOSED, ONE_QUEUED, ONE_RUNNING};
use super::stats::bump;
use super::table::Waiter;
use super::tell::{with_thread_waker, Tell};

/// The outcome a cell's status holds, if it holds one.
#[inline]
fn outcome(status: Status) -> Option<Result<(), AdmitError>> {
    match status {
        Status::Granted => Some(Ok(())),
        Status::Rejected(e) => Some(Err(e)),
        _ => None,
    }
}

impl Places for RawGate {
    fn give_back(&self) -> bool {
        // Acquire: the first guess; the CAS orders.
        let mut cur = self.state.load(Ordering::Acquire);
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
            match self
                .state
                .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return new != cur,
                Err(actual) => cur = actual,
            }
        }
    }
}

impl RawGate {
    /// The locked part of an admission, without a lock: admit directly,
    /// reject, or count the waiter and push its cell.
    pub(super) fn lf_enqueue(&self, fifo: &Fifo<Tell>, class: usize, waiter: Waiter) -> Enqueued {
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
            } else if self.deadlines && self.lf_expire(fifo) > 0 {
                // Acquire: as the first load.
                cur = self.state.load(Ordering::Acquire);
                continue;
            } else {
                self.counters.class[class].rejected_capacity.add(1);
                return Enqueued::Rejected(AdmitError::AtCapacity, waiter);
            };
            // AcqRel: Acquire as a direct admission; Release and Acquire as
            // the queue asks of counting (module docs). Acquire on failure:
            // a new guess, as the first load.
            match self
                .state
                .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if new == cur + ONE_RUNNING => {
                    self.counters.admitted_direct.add(1);
                    return Enqueued::Direct(waiter);
                }
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
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
            Pushed::Queued => Enqueued::Queued(cell, gen),
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
    pub(super) fn lf_release(&self, fifo: &Fifo<Tell>) {
        // Release: our use of the slot happens-before its next admission
        // (a direct admitter's Acquire CAS, or a promise's AcqRel).
        let old = Word(self.state.fetch_sub(ONE_RUNNING, Ordering::Release));
        debug_assert!(old.running() > 0, "release without a held slot");
        if old.queued() > 0 {
            self.lf_hand_on(fifo);
        }
    }

    /// Hands free slots to the counted waiters, oldest first, after
    /// expiring due ones: what a release that saw waiters, and a raised
    /// limit, leave to do. No arrival takes a free slot meanwhile: a direct
    /// admission needs `queued == 0`.
    #[inline(never)]
    fn lf_hand_on(&self, fifo: &Fifo<Tell>) {
        if self.deadlines {
            self.lf_expire(fifo);
        }
        while self.lf_promise_free_slot() {
            if self.lf_deliver(fifo) {
                // A leaving waiter refused it: free it again, and look
                // again. Release: as in `lf_release`.
                self.state.fetch_sub(ONE_RUNNING, Ordering::Release);
            }
        }
    }

    /// Promises a free slot to the counted waiters (`running + 1, queued -
    /// 1`) if someone is counted, a slot is free under the limit and the
    /// gate is open.
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

    /// Delivers a slot just promised; true if it came back (a leaving
    /// waiter refused it: the caller holds it again).
    fn lf_deliver(&self, fifo: &Fifo<Tell>) -> bool {
        match fifo.resume() {
            Then::Nothing => false,
            Then::Wake(told) => {
                self.lf_tell(fifo, told, Ok(()));
                false
            }
            Then::Release => true,
        }
    }

    /// Does what a queue operation left to do.
    fn lf_after(&self, fifo: &Fifo<Tell>, then: Then) {
        match then {
            Then::Nothing => {}
            Then::Wake(told) => self.lf_tell(fifo, told, Ok(())),
            Then::Release => self.lf_release(fifo),
        }
    }

    /// Tells a resolved waiter: wakes its task or thread, or calls its
    /// callback (freeing its cell first: see `tell.rs`).
    fn lf_tell(&self, fifo: &Fifo<Tell>, told: Told, outcome: Result<(), AdmitError>) {
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

    /// A queued future's poll: its outcome (the cell is freed), or
    /// `Pending` with its waker registered.
    pub(super) fn lf_poll(
        &self,
        fifo: &Fifo<Tell>,
        cell: u32,
        waker: &Waker,
    ) -> Poll<Result<(), AdmitError>> {
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

    /// Takes a non-detached cell of generation `gen` out of the queue for
    /// its owner (a dropped future, a blocking wait that gave up): true if
    /// it left; false if it had an outcome, which is taken (a grant is
    /// released) and its cell freed.
    pub(super) fn lf_cancel(&self, fifo: &Fifo<Tell>, cell: u32, gen: u32) -> bool {
        if self.lf_leave(fifo, cell, gen, None) {
            return true;
        }
        loop {
            match fifo.status(cell).1 {
                Status::Granted => {
                    fifo.free_cell(cell);
                    self.lf_release(fifo);
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

    /// Takes its own non-detached cell out of the queue, cancelled
    /// (`reason` `None`) or rejected: true if it was queued (its cell is
    /// freed); false if it has an outcome or is being rejected.
    fn lf_leave(&self, fifo: &Fifo<Tell>, cell: u32, gen: u32, reason: Option<AdmitError>) -> bool {
        let Some(then) = fifo.leave(cell, gen, reason, self) else {
            return false;
        };
        fifo.payload(cell).forget();
        fifo.free_cell(cell);
        match reason {
            None => bump(&self.counters.cancelled, 1),
            Some(_) => bump(&self.counters.class[0].expired, 1),
        }
        self.lf_after(fifo, then);
        true
    }

    /// A callback ticket's cancel: true if the request was still queued (its
    /// callback, dropped here, will not be called).
    pub(super) fn lf_cancel_callback(&self, fifo: &Fifo<Tell>, cell: u32, gen: u32) -> bool {
        let Some(then) = fifo.leave(cell, gen, None, self) else {
            return false;
        };
        let stale = fifo.payload(cell).take_callback();
        fifo.free_cell(cell);
        bump(&self.counters.cancelled, 1);
        self.lf_after(fifo, then);
        drop(stale);
        true
    }

    /// Rejects every due waiter from the head; how many.
    pub(super) fn lf_expire(&self, fifo: &Fifo<Tell>) -> usize {
        let Some(timeout) = self.classes.timeout[0] else {
            return 0;
        };
        let now = self.clock.now_nanos();
        let n = fifo.reject_from_head(
            AdmitError::QueueTimeout,
            |at| is_due(at, timeout, now),
            usize::MAX,
            self,
            |told, then| {
                self.lf_tell(fifo, told, Err(AdmitError::QueueTimeout));
                self.lf_after(fifo, then);
            },
        );
        bump(&self.counters.class[0].expired, n as u64);
        n
    }

    /// When the oldest queued waiter is due, if one is queued and the gate
    /// has a deadline.
    pub(super) fn lf_next_deadline(&self, fifo: &Fifo<Tell>) -> Option<u64> {
        let timeout = self.classes.timeout[0]?;
        fifo.oldest_enqueued_at()
            .map(|at| at.saturating_add(timeout))
    }

    /// Sets `closed` and rejects every queued waiter (module docs).
    pub(super) fn lf_close(&self, fifo: &Fifo<Tell>) {
        // AcqRel: as any change of `closed`; ordered before the scans.
        self.state.fetch_or(CLOSED, Ordering::AcqRel);
        loop {
            let n = fifo.reject_from_head(
                AdmitError::Closed,
                |_| true,
                usize::MAX,
                self,
                |told, then| {
                    self.lf_tell(fifo, told, Err(AdmitError::Closed));
                    self.lf_after(fifo, then);
                },
            );
            self.counters.closed(0, n as u64);
            // Acquire: pairs with the counting CAS of a waiter still on its
            // way to its push.
            if Word(self.state.load(Ordering::Acquire)).queued() == 0 {
                return;
            }
            spin_wait();
        }
    }

    /// Sets the engine limit, then expires due waiters and hands the slots
    /// a raised limit frees to the oldest waiters.
    pub(super) fn lf_set_limit(&self, fifo: &Fifo<Tell>, limit: u32) {
        {
            // Serializes limit changes (cold path); the word itself is
            // changed by a CAS loop, as releases may move it meanwhile.
            let _serial = lock(&self.table);
            // Cold path: room for every waiter the new limit may leave
            // granted and not yet looking, and the queue behind them.
            fifo.reserve(self.queue_limit as usize + limit as usize, limit as usize);
            self.update(|w| Word::new(w.running(), w.queued(), limit, w.closed()));
        }
        self.lf_hand_on(fifo);
    }

    /// A blocking waiter's wait from its push (cell `cell` of generation
    /// `gen`) until its outcome, its queue deadline or `give_up`.
    pub(super) fn lf_block(
        &self,
        fifo: &Fifo<Tell>,
        class: usize,
        (cell, gen): (u32, u32),
        give_up: Option<Instant>,
    ) -> Result<(), AdmitError> {
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
                    self.lf_expire(fifo);
                    // Expiry stops at the first waiter not due; one ahead
                    // of us may have read the clock a moment later.
                    if self.lf_leave(fifo, cell, gen, Some(AdmitError::QueueTimeout)) {
                        return Err(AdmitError::QueueTimeout);
                    }
                    continue;
                }
                wait = Some(Duration::from_nanos(due - now));
            }
            if let Some(give_up) = give_up {
                let now = Instant::now();
                if now >= give_up {
                    if self.lf_leave(fifo, cell, gen, None) {
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
