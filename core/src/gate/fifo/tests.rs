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
            .push(cell, self.now.load(Ordering::Relaxed), false)
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
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            let (running, queued) = split(cur);
            assert!(running > 0, "release without a held slot");
            let promise = queued > 0 && running <= self.limit;
            let new = if promise { cur - ONE_QUEUED } else { cur - 1 };
            match self
                .word
                .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if !promise => return,
                Ok(_) => match self.fifo.resume() {
                    Then::Release => cur = self.word.load(Ordering::Acquire),
                    Then::Nothing | Then::Wake(_) => return,
                },
                Err(actual) => cur = actual,
            }
        }
    }

    fn after(&self, then: Then) {
        if then == Then::Release {
            self.release();
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
            Some((_, then)) => {
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
            .reject_from_head(reason, due, max, self, |_, then| thens.push(then));
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
mod sequential {
    use super::*;

    fn queued(a: Admit) -> (u32, u32) {
        match a {
            Admit::Queued(c, g) => (c, g),
            other => panic!("expected to queue, got {other:?}"),
        }
    }

    #[test]
    fn waiters_are_granted_in_order_and_cancelled_ones_are_passed_over() {
        let g = TestGate::new(1, 3);
        assert_eq!(g.admit(), Admit::Held);
        let a = queued(g.admit());
        let b = queued(g.admit());
        let c = queued(g.admit());
        assert_eq!(g.admit(), Admit::Rejected, "queue full");
        assert!(g.cancel(b.0, b.1));
        assert_eq!(g.counts(), (1, 2));
        g.release();
        assert_eq!(g.poll(a.0, a.1), Some(Outcome::Granted));
        assert_eq!(g.poll(c.0, c.1), None);
        g.release();
        assert_eq!(g.poll(c.0, c.1), Some(Outcome::Granted));
        g.release();
        assert_eq!(g.counts(), (0, 0));
        assert_eq!(g.admit(), Admit::Held);
    }

    #[test]
    fn a_rejection_by_another_thread_takes_the_oldest_and_frees_its_place() {
        let g = TestGate::new(1, 2);
        assert_eq!(g.admit(), Admit::Held);
        let a = queued(g.admit());
        let b = queued(g.admit());
        assert!(g.reject_oldest(AdmitError::QueueTimeout));
        assert_eq!(g.counts(), (1, 1));
        assert_eq!(
            g.poll(a.0, a.1),
            Some(Outcome::Rejected(AdmitError::QueueTimeout))
        );
        let c = queued(g.admit());
        g.release();
        assert_eq!(g.poll(b.0, b.1), Some(Outcome::Granted));
        assert!(g.cancel(c.0, c.1));
        g.release();
        assert_eq!(g.counts(), (0, 0));
        assert!(!g.reject_oldest(AdmitError::QueueTimeout));
    }

    #[test]
    fn a_refused_slot_goes_back_and_on_to_the_next_waiter() {
        let g = TestGate::new(1, 3);
        assert_eq!(g.admit(), Admit::Held);
        let a = queued(g.admit());
        let b = queued(g.admit());
        // A release promises a slot (queued 2 -> 1) but has not delivered
        // it yet; then both waiters leave: the first finds a waiter no slot
        // is promised to and gives its place back, the second finds every
        // counted waiter promised a slot and refuses the one on its way.
        g.word.fetch_sub(ONE_QUEUED, Ordering::AcqRel);
        assert!(g.cancel(a.0, a.1));
        assert_eq!(g.counts(), (1, 0));
        assert!(g.cancel(b.0, b.1));
        assert_eq!(g.counts(), (1, 0));
        // A newcomer is counted behind them.
        let c = queued(g.admit());
        assert_eq!(g.counts(), (1, 1));
        // The promised slot arrives: a's position is passed over, b's
        // refuses it and it comes back; released again, it goes to c.
        assert_eq!(g.fifo.resume(), Then::Release);
        g.release();
        assert_eq!(g.poll(c.0, c.1), Some(Outcome::Granted));
        assert_eq!(g.counts(), (1, 0));
        g.release();
        assert_eq!(g.counts(), (0, 0));
    }

    #[test]
    fn a_slot_promised_before_its_waiter_arrives_waits_for_it() {
        let g = TestGate::new(1, 1);
        assert_eq!(g.admit(), Admit::Held);
        // Count a waiter, then deliver a slot before it takes its position.
        g.word.fetch_add(ONE_QUEUED, Ordering::AcqRel);
        g.word.fetch_sub(ONE_QUEUED, Ordering::AcqRel);
        assert_eq!(g.fifo.resume(), Then::Nothing);
        let (cell, _) = g.fifo.take_cell().unwrap();
        assert_eq!(g.fifo.push(cell, 0, false), Pushed::Granted);
        g.fifo.free_cell(cell);
    }

    #[test]
    fn a_teller_learns_whether_the_cell_is_detached_and_when_it_was_pushed() {
        let g = TestGate::new(1, 2);
        assert_eq!(g.admit(), Admit::Held);
        let mut cells = Vec::new();
        for (t, detached) in [(3, true), (7, false)] {
            g.word.fetch_add(ONE_QUEUED, Ordering::AcqRel);
            let (cell, gen) = g.fifo.take_cell().unwrap();
            assert_eq!(g.fifo.push(cell, t, detached), Pushed::Queued);
            cells.push((cell, gen));
        }
        // A grant tells the first; a rejection by another thread the second.
        g.word.fetch_sub(ONE_QUEUED, Ordering::AcqRel);
        let told = Told {
            cell: cells[0].0,
            detached: true,
            enqueued_at: 3,
        };
        assert_eq!(g.fifo.resume(), Then::Wake(told));
        let mut rejected = Vec::new();
        let n = g.fifo.reject_from_head(
            AdmitError::Closed,
            |_| true,
            usize::MAX,
            &g,
            |who, then| rejected.push((who, then)),
        );
        assert_eq!(n, 1);
        let told = Told {
            cell: cells[1].0,
            detached: false,
            enqueued_at: 7,
        };
        assert_eq!(rejected, [(told, Then::Nothing)]);
        assert_eq!(
            g.fifo.status(cells[1].0),
            (cells[1].1, Status::Rejected(AdmitError::Closed))
        );
        g.fifo.free_cell(cells[1].0);
        g.fifo.free_cell(cells[0].0);
        // The flag lasts one use: the cell's next owner is not detached.
        g.word.fetch_add(ONE_QUEUED, Ordering::AcqRel);
        let (cell, _) = g.fifo.take_cell().unwrap();
        assert_eq!(cell, cells[0].0, "the free stack hands back the last freed");
        assert_eq!(g.fifo.push(cell, 9, false), Pushed::Queued);
        g.word.fetch_sub(ONE_QUEUED, Ordering::AcqRel);
        let told = Told {
            cell,
            detached: false,
            enqueued_at: 9,
        };
        assert_eq!(g.fifo.resume(), Then::Wake(told));
        assert_eq!(g.poll(cell, g.fifo.status(cell).0), Some(Outcome::Granted));
    }

    #[test]
    fn displacement_takes_the_newest_live_waiter_across_segments() {
        // More waiters than a segment holds, the newest two cancelled: the
        // newest live one goes, then the one before it, and the head keeps
        // its turn.
        let n = SEG as u32 + 5;
        let g = TestGate::new(1, n);
        assert_eq!(g.admit(), Admit::Held);
        let ws: Vec<_> = (0..n).map(|_| queued(g.admit())).collect();
        let last = ws.len() - 1;
        assert!(g.cancel(ws[last].0, ws[last].1));
        assert!(g.cancel(ws[last - 1].0, ws[last - 1].1));
        assert!(g.displace());
        let displaced = Some(Outcome::Rejected(AdmitError::Displaced));
        assert_eq!(g.poll(ws[last - 2].0, ws[last - 2].1), displaced);
        assert!(g.displace());
        assert_eq!(g.poll(ws[last - 3].0, ws[last - 3].1), displaced);
        assert_eq!(g.counts(), (1, n - 4));
        g.release();
        assert_eq!(g.poll(ws[0].0, ws[0].1), Some(Outcome::Granted));
        // Displace everyone else, newest first, then nobody is left.
        for w in ws[1..=last - 4].iter().rev() {
            assert!(g.displace());
            assert_eq!(g.poll(w.0, w.1), displaced);
        }
        assert!(!g.displace());
        assert_eq!(g.counts(), (1, 0));
        g.release();
        assert_eq!(g.counts(), (0, 0));
    }

    #[test]
    fn expiry_takes_due_waiters_from_the_head_and_stops_at_the_first_not_due() {
        let g = TestGate::new(1, 4);
        assert_eq!(g.admit(), Admit::Held);
        let mut ws = Vec::new();
        for t in [0, 5, 10, 15] {
            g.now.store(t, Ordering::Relaxed);
            ws.push(queued(g.admit()));
        }
        // The second waiter leaves on its own: expiry passes over it.
        assert!(g.cancel(ws[1].0, ws[1].1));
        assert_eq!(g.fifo.oldest_enqueued_at(), Some(0));
        let timeout = 10;
        let due = |now: u64| move |at: u64| crate::gate::raw::is_due(at, timeout, now);
        assert_eq!(g.reject(AdmitError::QueueTimeout, due(9), 8), 0);
        // Exactly at the deadline counts.
        assert_eq!(g.reject(AdmitError::QueueTimeout, due(10), 8), 1);
        assert_eq!(g.fifo.oldest_enqueued_at(), Some(10));
        assert_eq!(g.reject(AdmitError::QueueTimeout, due(24), 8), 1);
        assert_eq!(g.counts(), (1, 1));
        let timed_out = Some(Outcome::Rejected(AdmitError::QueueTimeout));
        assert_eq!(g.poll(ws[0].0, ws[0].1), timed_out);
        assert_eq!(g.poll(ws[2].0, ws[2].1), timed_out);
        g.release();
        assert_eq!(g.poll(ws[3].0, ws[3].1), Some(Outcome::Granted));
        assert_eq!(g.fifo.oldest_enqueued_at(), None);
        g.release();
        assert_eq!(g.counts(), (0, 0));
    }

    #[test]
    fn closing_rejects_every_waiter_in_batches() {
        let g = TestGate::new(1, 5);
        assert_eq!(g.admit(), Admit::Held);
        let ws: Vec<_> = (0..5).map(|_| queued(g.admit())).collect();
        assert_eq!(g.reject(AdmitError::Closed, |_| true, 2), 2);
        assert_eq!(g.counts(), (1, 3));
        assert_eq!(g.reject(AdmitError::Closed, |_| true, 8), 3);
        assert_eq!(g.counts(), (1, 0));
        for w in ws {
            assert_eq!(
                g.poll(w.0, w.1),
                Some(Outcome::Rejected(AdmitError::Closed))
            );
        }
        g.release();
        assert_eq!(g.counts(), (0, 0));
    }

    /// Rejected waiters that have not looked keep their cells, and one
    /// that is stuck pins its segment: both storages grow, and everything
    /// still works.
    #[test]
    fn storage_grows_when_cells_or_segments_run_out() {
        let g = TestGate::with_cells(1, 2, 1);
        assert_eq!(g.fifo.chunks_made(), (1, 1));
        assert_eq!(g.admit(), Admit::Held);
        let mut unpolled = Vec::new();
        for _ in 0..40 {
            unpolled.push(queued(g.admit()));
            assert!(g.reject_oldest(AdmitError::QueueTimeout));
        }
        let (segments, cells) = g.fifo.chunks_made();
        assert!(cells > 1, "cells grew");
        let head = queued(g.admit());
        for _ in 0..50 * SEG {
            let b = queued(g.admit());
            assert!(g.cancel(b.0, b.1));
        }
        assert_eq!(g.fifo.chunks_made().1, cells, "cancelled cells are reused");
        assert!(g.fifo.chunks_made().0 >= segments);
        for (c, gen) in unpolled {
            let rejected = Outcome::Rejected(AdmitError::QueueTimeout);
            assert_eq!(g.poll(c, gen), Some(rejected));
        }
        g.release();
        assert_eq!(g.poll(head.0, head.1), Some(Outcome::Granted));
        g.release();
        assert_eq!(g.counts(), (0, 0));
    }

    /// The trap of a fixed ring: one waiter stuck at the head while others
    /// come and go behind it. Segments of cancelled positions are swept back
    /// into the pool, so storage stays bounded and the waiter keeps its
    /// place.
    #[test]
    fn churn_behind_a_stuck_head_reuses_storage() {
        let g = TestGate::new(1, 2);
        let pool = g.fifo.segments.range(0).len();
        assert_eq!(g.admit(), Admit::Held);
        let head = queued(g.admit());
        for _ in 0..100 * pool {
            let b = queued(g.admit());
            assert!(g.cancel(b.0, b.1));
        }
        assert!(g.fifo.pooled() > 0);
        assert_eq!(
            g.fifo.chunks_made().0,
            1,
            "sweeps sufficed: no more storage"
        );
        assert_eq!(g.counts(), (1, 1));
        g.release();
        assert_eq!(g.poll(head.0, head.1), Some(Outcome::Granted));
        let b = queued(g.admit());
        g.release();
        assert_eq!(g.poll(b.0, b.1), Some(Outcome::Granted));
        g.release();
        assert_eq!(g.counts(), (0, 0));
    }

    /// Long runs through many segments: every waiter granted once, in order.
    #[test]
    fn a_long_queue_is_served_in_order_across_segments() {
        let g = TestGate::new(1, 64);
        assert_eq!(g.admit(), Admit::Held);
        for _round in 0..50 {
            let waiters: Vec<_> = (0..64).map(|_| queued(g.admit())).collect();
            for (i, w) in waiters.iter().enumerate() {
                g.release();
                assert_eq!(g.poll(w.0, w.1), Some(Outcome::Granted));
                for later in &waiters[i + 1..] {
                    assert_eq!(g.fifo.status(later.0).1, Status::Queued);
                }
            }
        }
        g.release();
        assert_eq!(g.counts(), (0, 0));
    }
}

/// Random sequences on one thread against a plain reference (a counter and
/// a `VecDeque`): every admission, grant, cancel, rejection from the head
/// and displacement of the newest agrees, step by step.
#[cfg(not(loom))]
#[test]
fn random_sequences_match_a_plain_reference() {
    use std::collections::VecDeque;

    for seed in 1..=300u64 {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut next = move |n: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n as u64) as usize
        };
        let (limit, queue) = (1 + next(3) as u32, next(5) as u32);
        let g = TestGate::new(limit, queue);
        // The reference: slots held, and the waiters in order.
        let mut running = 0u32;
        let mut waiters: VecDeque<(u32, u32)> = VecDeque::new();
        for step in 0..2_000 {
            let ctx = format!("seed {seed} step {step}");
            match next(5) {
                0 => {
                    let expect = if waiters.is_empty() && running < limit {
                        running += 1;
                        "held"
                    } else if (waiters.len() as u32) < queue {
                        "queued"
                    } else {
                        "rejected"
                    };
                    match g.admit() {
                        Admit::Held => assert_eq!(expect, "held", "{ctx}"),
                        Admit::Queued(c, gen) => {
                            assert_eq!(expect, "queued", "{ctx}");
                            waiters.push_back((c, gen));
                        }
                        Admit::Rejected => assert_eq!(expect, "rejected", "{ctx}"),
                    }
                }
                1 if running > 0 => {
                    g.release();
                    match waiters.pop_front() {
                        Some((c, gen)) => {
                            assert_eq!(g.poll(c, gen), Some(Outcome::Granted), "{ctx}");
                        }
                        None => running -= 1,
                    }
                }
                2 if !waiters.is_empty() => {
                    let (c, gen) = waiters.remove(next(waiters.len())).unwrap();
                    assert!(g.cancel(c, gen), "{ctx}");
                }
                3 => {
                    let oldest = waiters.pop_front();
                    assert_eq!(g.reject_oldest(AdmitError::QueueTimeout), oldest.is_some());
                    if let Some((c, gen)) = oldest {
                        let rejected = Outcome::Rejected(AdmitError::QueueTimeout);
                        assert_eq!(g.poll(c, gen), Some(rejected), "{ctx}");
                    }
                }
                4 => {
                    let newest = waiters.pop_back();
                    assert_eq!(g.displace(), newest.is_some(), "{ctx}");
                    if let Some((c, gen)) = newest {
                        let displaced = Outcome::Rejected(AdmitError::Displaced);
                        assert_eq!(g.poll(c, gen), Some(displaced), "{ctx}");
                    }
                }
                _ => {}
            }
            for &(c, gen) in &waiters {
                assert_eq!(g.fifo.status(c), (gen, Status::Queued), "{ctx}");
            }
            assert_eq!(g.counts(), (running, waiters.len() as u32), "{ctx}");
        }
    }
}

/// Every operation raced on real threads, with invariants checked at every
/// step and at the end.
#[cfg(not(loom))]
#[test]
fn threads_racing_every_operation_keep_the_counts_exact() {
    use std::sync::atomic::AtomicUsize;

    const LIMIT: u32 = 2;
    const QUEUE: u32 = 3;
    const THREADS: usize = 4;
    const OPS: usize = 250_000;
    // Rejected requests keep their cells until their thread polls: the
    // cells grow from 8 while the threads race.
    let g = TestGate::with_cells(LIMIT, QUEUE, 8);
    let holders = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (g, holders) = (&g, &holders);
            s.spawn(move || {
                // xorshift: any spread of operations will do.
                let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ (t as u64 + 1);
                let mut next = move |n: usize| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed % n as u64) as usize
                };
                let mut held = 0u32;
                let mut waiting: Vec<(u32, u32)> = Vec::new();
                let check = |g: &TestGate| {
                    let (running, queued) = g.counts();
                    assert!(running <= LIMIT, "{running} running");
                    assert!(queued <= QUEUE, "{queued} queued");
                };
                for _ in 0..OPS {
                    match next(11) {
                        0..=3 => match g.admit() {
                            Admit::Held => held += 1,
                            Admit::Queued(c, gen) => waiting.push((c, gen)),
                            Admit::Rejected => {}
                        },
                        4..=5 if held > 0 => {
                            held -= 1;
                            g.release();
                        }
                        6 if !waiting.is_empty() => {
                            let (c, gen) = waiting.swap_remove(next(waiting.len()));
                            g.cancel(c, gen);
                        }
                        7 => {
                            g.reject(AdmitError::QueueTimeout, |_| true, 2);
                        }
                        8 => {
                            g.displace();
                        }
                        _ => waiting.retain(|&(c, gen)| match g.poll(c, gen) {
                            None => true,
                            Some(Outcome::Granted) => {
                                held += 1;
                                false
                            }
                            Some(Outcome::Rejected(_)) => false,
                        }),
                    }
                    check(g);
                }
                // Wind down: leave the queue, give back every slot.
                for (c, gen) in waiting {
                    g.cancel(c, gen);
                }
                for _ in 0..held {
                    g.release();
                }
                holders.fetch_add(held as usize, Ordering::Relaxed);
            });
        }
    });
    assert_eq!(g.counts(), (0, 0), "slots or places lost");
    // Every cell came back, and every slot is free.
    let made: usize = (0..g.fifo.chunks_made().1)
        .map(|k| g.fifo.cells.waiters.range(k).len())
        .sum();
    assert_eq!(g.fifo.free_cells(), made, "waiter cells leaked");
    for _ in 0..LIMIT {
        assert_eq!(g.admit(), Admit::Held);
    }
}

#[cfg(loom)]
mod models {
    use super::*;

    use loom::sync::Arc;
    use loom::thread;

    /// Runs a model with room for the queue's setup (a few hundred atomic
    /// operations before the threads start).
    fn model(f: impl Fn() + Send + Sync + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.max_branches = 100_000;
        builder.check(f);
    }

    /// Polls until the request has an outcome.
    fn wait(g: &TestGate, (cell, gen): (u32, u32)) -> Outcome {
        loop {
            if let Some(o) = g.poll(cell, gen) {
                return o;
            }
            thread::yield_now();
        }
    }

    fn queued(a: Admit) -> (u32, u32) {
        match a {
            Admit::Queued(c, g) => (c, g),
            other => panic!("expected to queue, got {other:?}"),
        }
    }

    /// A release races a waiter's cancel and a newcomer: the slot goes to
    /// exactly one live waiter or comes back, and the counts end exact.
    #[test]
    fn release_cancel_and_arrival() {
        model(|| {
            let g = Arc::new(TestGate::new(1, 2));
            assert_eq!(g.admit(), Admit::Held);
            let a = queued(g.admit());
            let releaser = {
                let g = Arc::clone(&g);
                thread::spawn(move || g.release())
            };
            let canceller = {
                let g = Arc::clone(&g);
                thread::spawn(move || g.cancel(a.0, a.1))
            };
            let b = g.admit();
            releaser.join().unwrap();
            canceller.join().unwrap();
            let b_got = match b {
                Admit::Held => true,
                Admit::Queued(c, gen) => match g.poll(c, gen) {
                    Some(Outcome::Granted) => true,
                    // Every slot given back went to b if it was queued.
                    None => panic!("b still waits after the slot was given back"),
                    Some(o) => panic!("{o:?}"),
                },
                Admit::Rejected => false,
            };
            let (running, queued) = g.counts();
            assert_eq!(queued, 0);
            // One slot: held by b, or by a (cancel came too late and gave
            // it back: then free), or free.
            assert_eq!(running, u32::from(b_got));
            if b_got {
                g.release();
            }
            assert_eq!(g.counts(), (0, 0));
        });
    }

    /// A displacement races a release and the newest waiter's own cancel:
    /// the newest live waiter is displaced or granted, never both, and the
    /// slot is neither lost nor duplicated.
    #[test]
    fn displacement_release_and_cancel() {
        model(|| {
            let g = Arc::new(TestGate::new(1, 2));
            assert_eq!(g.admit(), Admit::Held);
            let a = queued(g.admit());
            let b = queued(g.admit());
            let releaser = {
                let g = Arc::clone(&g);
                thread::spawn(move || g.release())
            };
            let canceller = {
                let g = Arc::clone(&g);
                thread::spawn(move || g.cancel(b.0, b.1))
            };
            let displaced = g.displace();
            releaser.join().unwrap();
            let b_left = canceller.join().unwrap();
            // a was the oldest: granted by the release, unless displaced
            // because b had left first.
            let a_out = wait(&g, a);
            match a_out {
                Outcome::Granted => g.release(),
                Outcome::Rejected(e) => {
                    assert_eq!(e, AdmitError::Displaced);
                    assert!(b_left, "a displaced while b, newer, waited");
                }
            }
            assert!(displaced || b_left || a_out == Outcome::Granted);
            assert_eq!(g.counts(), (0, 0));
        });
    }

    /// Two waiters cancel while a release delivers: the promised slot is
    /// skipped past one, refused by the other, or granted; never lost.
    #[test]
    fn two_cancels_and_a_release() {
        model(|| {
            let g = Arc::new(TestGate::new(1, 2));
            assert_eq!(g.admit(), Admit::Held);
            let a = queued(g.admit());
            let b = queued(g.admit());
            let ta = {
                let g = Arc::clone(&g);
                thread::spawn(move || g.cancel(a.0, a.1))
            };
            let tb = {
                let g = Arc::clone(&g);
                thread::spawn(move || g.cancel(b.0, b.1))
            };
            g.release();
            ta.join().unwrap();
            tb.join().unwrap();
            assert_eq!(g.counts(), (0, 0));
        });
    }

    /// A rejection by another thread (a queue deadline) races a release
    /// and the waiter itself.
    #[test]
    fn rejection_release_and_waiter() {
        model(|| {
            let g = Arc::new(TestGate::new(1, 1));
            assert_eq!(g.admit(), Admit::Held);
            let a = queued(g.admit());
            let rejecter = {
                let g = Arc::clone(&g);
                thread::spawn(move || {
                    g.reject_oldest(AdmitError::QueueTimeout);
                })
            };
            let releaser = {
                let g = Arc::clone(&g);
                thread::spawn(move || g.release())
            };
            let outcome = wait(&g, a);
            rejecter.join().unwrap();
            releaser.join().unwrap();
            match outcome {
                Outcome::Granted => {
                    assert_eq!(g.counts(), (1, 0));
                    g.release();
                }
                Outcome::Rejected(e) => assert_eq!(e, AdmitError::QueueTimeout),
            }
            assert_eq!(g.counts(), (0, 0));
        });
    }

    /// Segments are swept and reused while a release runs through them:
    /// with two slots a segment and two segments in all, position 4 needs
    /// segment 0 back, and the release's hint still names it.
    #[test]
    fn segments_are_reused_under_a_racing_release() {
        model(|| {
            let g = Arc::new(TestGate::with_segments(1, 1, 2));
            assert_eq!(g.admit(), Admit::Held);
            // Positions 0..3 come and go: segments 0 and 1 finish.
            for _ in 0..4 {
                let a = queued(g.admit());
                assert!(g.cancel(a.0, a.1));
            }
            let releaser = {
                let g = Arc::clone(&g);
                thread::spawn(move || g.release())
            };
            // Positions 4 and on need recycled segments.
            let got = match g.admit() {
                Admit::Held => true,
                Admit::Queued(c, gen) => wait(&g, (c, gen)) == Outcome::Granted,
                Admit::Rejected => false,
            };
            releaser.join().unwrap();
            assert!(got, "one slot, one waiter at most: it gets the slot");
            g.release();
            assert_eq!(g.counts(), (0, 0));
            let b = g.admit();
            assert_eq!(b, Admit::Held);
            g.release();
            // Reused: the first sweep always frees segment 0. When the
            // main thread and the release both append at once, the second
            // sweep finds segment 1 still last (the first appender holds the
            // segment it popped) and one more chunk is made.
            assert!(g.fifo.chunks_made().0 <= 2, "{:?}", g.fifo.chunks_made());
        });
    }

    /// Two rejecters (an event loop's timer and a release, both expiring)
    /// race a waiter's own cancel: each waiter ends exactly one way and its
    /// place is given back once.
    #[test]
    fn two_rejecters_and_a_cancel() {
        model(|| {
            let g = Arc::new(TestGate::new(1, 2));
            assert_eq!(g.admit(), Admit::Held);
            let a = queued(g.admit());
            let b = queued(g.admit());
            let rejecters: Vec<_> = (0..2)
                .map(|_| {
                    let g = Arc::clone(&g);
                    thread::spawn(move || g.reject(AdmitError::QueueTimeout, |_| true, 1))
                })
                .collect();
            let a_left = g.cancel(a.0, a.1);
            let rejected: usize = rejecters.into_iter().map(|t| t.join().unwrap()).sum();
            let b_rejected = match g.poll(b.0, b.1) {
                Some(Outcome::Rejected(AdmitError::QueueTimeout)) => true,
                None => {
                    assert!(g.cancel(b.0, b.1));
                    false
                }
                other => panic!("b: {other:?}"),
            };
            // a left on its own or was rejected (then its cancel found it
            // resolved); every rejection is one of the two.
            assert_eq!(rejected, usize::from(!a_left) + usize::from(b_rejected));
            assert_eq!(g.counts(), (1, 0));
            g.release();
            assert_eq!(g.counts(), (0, 0));
        });
    }

    /// A waiter arrives while a release promises a slot: the slot is left
    /// for it if it has not taken its position yet.
    #[test]
    fn arrival_and_release_cross_a_segment() {
        model(|| {
            let g = Arc::new(TestGate::new(1, 2));
            assert_eq!(g.admit(), Admit::Held);
            // Fill the first segment, so positions cross into the next.
            let a = queued(g.admit());
            assert!(g.cancel(a.0, a.1));
            let arriving = {
                let g = Arc::clone(&g);
                thread::spawn(move || {
                    let b = g.admit();
                    match b {
                        Admit::Held => true,
                        Admit::Queued(c, gen) => wait(&g, (c, gen)) == Outcome::Granted,
                        Admit::Rejected => false,
                    }
                })
            };
            g.release();
            let got = arriving.join().unwrap();
            assert_eq!(g.counts(), (u32::from(got), 0));
            if got {
                g.release();
            }
            assert_eq!(g.counts(), (0, 0));
        });
    }
}
