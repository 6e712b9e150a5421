//! The queue under a small counting gate: `running` and `queued` in one
//! word, as in the gate's state word, with at most `limit` running and
//! `queue` counted waiters. Sequential tests pin down the order and the
//! storage bound, a threaded test races every operation, and loom models
//! check every interleaving of the races that matter.

use super::*;

use crate::sync::AtomicU64;

const ONE_QUEUED: u64 = 1 << 32;

/// `running` (low half) and `queued` (high half).
fn split(w: u64) -> (u32, u32) {
    (w as u32, (w >> 32) as u32)
}

struct TestGate {
    word: AtomicU64,
    /// The clock the test sets; read at each enqueue.
    now: AtomicU64,
    limit: u32,
    queue: u32,
    fifo: Fifo,
}

/// A request's standing after `admit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admit {
    /// Holds a slot.
    Held,
    /// Waits in cell `.0` of generation `.1`.
    Queued(u32, u32),
    Rejected,
}

/// A queued request's outcome, once it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Granted,
    Rejected(AdmitError),
}

impl Places for TestGate {
    fn give_back(&self) -> bool {
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            if split(cur).1 == 0 {
                // The same value, as a read-modify-write: ordered with the
                // releases that promise slots.
                match self
                    .word
                    .compare_exchange(cur, cur, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => return false,
                    Err(actual) => cur = actual,
                }
                continue;
            }
            match self.word.compare_exchange(
                cur,
                cur - ONE_QUEUED,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }
}

/// Wakes the waker a resolved cell held, if any.
fn wake(told: Told) {
    if let Some(waker) = told.waker {
        waker.wake();
    }
}

impl TestGate {
    fn new(limit: u32, queue: u32) -> Self {
        Self::with_cells(limit, queue, (queue + limit) as usize + 4)
    }

    /// A gate whose requests hold up to `cells` cells (queued, or resolved
    /// and not yet polled).
    fn with_cells(limit: u32, queue: u32, cells: usize) -> Self {
        Self {
            word: AtomicU64::new(0),
            now: AtomicU64::new(0),
            limit,
            queue,
            fifo: Fifo::new(cells, limit as usize),
        }
    }

    /// A gate whose queue has only `segments` segments, so that it sweeps
    /// and reuses them after a few positions.
    #[cfg(loom)]
    fn with_segments(limit: u32, queue: u32, segments: usize) -> Self {
        Self {
            word: AtomicU64::new(0),
            now: AtomicU64::new(0),
            limit,
            queue,
            fifo: Fifo::with_segments((queue + limit) as usize + 1, segments),
        }
    }

    fn admit(&self) -> Admit {
        self.admit_with(None)
    }

    /// [`admit`](Self::admit) leaving `waker` in the cell if it queues.
    fn admit_with(&self, waker: Option<&std::task::Waker>) -> Admit {
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            let (running, queued) = split(cur);
            let new = if queued == 0 && running < self.limit {
                cur + 1
            } else if queued < self.queue {
                cur + ONE_QUEUED
            } else {
                return Admit::Rejected;
            };
            match self
                .word
                .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if new == cur + 1 => return Admit::Held,
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
        let (cell, gen) = self.fifo.take_cell().expect("cells for every waiter");
        match self
            .fifo
            .push(cell, self.now.load(Ordering::Relaxed), false, waker)
        {
            Pushed::Queued => Admit::Queued(cell, gen),
            Pushed::Granted => {
                self.fifo.free_cell(cell);
                Admit::Held
            }
        }
    }

    /// Gives back a held slot: to the oldest waiter, or free.
    fn release(&self) {
        self.release_to(false);
    }

    /// Gives back a held slot: to the newest waiter (adaptive LIFO), or
    /// free.
    fn release_newest(&self) {
        self.release_to(true);
    }

    /// Gives back a held slot: to the oldest waiter (or the newest, which
    /// it hands its slot to as it is, without a promise), or free.
    fn release_to(&self, newest: bool) {
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            let (running, queued) = split(cur);
            assert!(running > 0, "release without a held slot");
            if newest && queued > 0 && running <= self.limit {
                if let Some((granted, then)) = self.fifo.grant_newest(self) {
                    wake(granted);
                    self.after(then);
                    return;
                }
                // Nobody waits in a cell: deliver in order.
                cur = self.word.load(Ordering::Acquire);
                if split(cur).1 > 0 {
                    return self.release();
                }
                continue;
            }
            let promise = queued > 0 && running <= self.limit;
            let new = if promise { cur - ONE_QUEUED } else { cur - 1 };
            match self
                .word
                .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if !promise => return,
                Ok(_) => match self.fifo.resume() {
                    Then::Release => cur = self.word.load(Ordering::Acquire),
                    then => return self.after(then),
                },
                Err(actual) => cur = actual,
            }
        }
    }

    /// Does what a queue operation left to do: wakes a granted waiter, or
    /// releases a slot that came back.
    fn after(&self, then: Then) {
        match then {
            Then::Nothing => {}
            Then::Wake(told) => wake(told),
            Then::Release => self.release(),
        }
    }

    /// The outcome of a queued request, if it has one (its cell is freed;
    /// a granted request now holds its slot).
    fn poll(&self, cell: u32, gen: u32) -> Option<Outcome> {
        let (g, status) = self.fifo.status(cell);
        assert_eq!(g, gen, "polled a cell it does not own");
        let outcome = match status {
            Status::Granted => Outcome::Granted,
            Status::Rejected(e) => Outcome::Rejected(e),
            Status::Queued | Status::Cancelling => return None,
            s => panic!("a queued request's cell says {s:?}"),
        };
        self.fifo.free_cell(cell);
        Some(outcome)
    }

    /// The owner gives up a queued request: true if it left the queue;
    /// false if it had an outcome (a grant is released).
    fn cancel(&self, cell: u32, gen: u32) -> bool {
        match self.fifo.leave(cell, gen, None, self) {
            Some(then) => {
                self.fifo.free_cell(cell);
                self.after(then);
                true
            }
            None => {
                let outcome = loop {
                    if let Some(o) = self.poll(cell, gen) {
                        break o;
                    }
                    // Another thread is rejecting it.
                    spin_wait();
                };
                if outcome == Outcome::Granted {
                    self.release();
                }
                false
            }
        }
    }

    /// Rejects the oldest queued request with `reason` (as a queue deadline
    /// would): whether one was.
    fn reject_oldest(&self, reason: AdmitError) -> bool {
        self.reject(reason, |_| true, 1) == 1
    }

    /// Rejects the newest queued request as displaced: whether one was.
    fn displace(&self) -> bool {
        match self.fifo.reject_newest(AdmitError::Displaced, self) {
            Some((told, then)) => {
                wake(told);
                self.after(then);
                true
            }
            None => false,
        }
    }

    /// Rejects up to `max` requests from the oldest on while `due`.
    fn reject(&self, reason: AdmitError, due: impl Fn(u64) -> bool, max: usize) -> usize {
        let mut thens = Vec::new();
        let n = self
            .fifo
            .reject_from_head(reason, due, max, self, |told, then| {
                wake(told);
                thens.push(then);
            });
        for then in thens {
            self.after(then);
        }
        n
    }

    fn counts(&self) -> (u32, u32) {
        split(self.word.load(Ordering::Acquire))
    }
}

#[cfg(not(loom))]
mod differential;
#[cfg(loom)]
mod models;
#[cfg(not(loom))]
mod sequential;
#[cfg(not(loom))]
mod threaded;
