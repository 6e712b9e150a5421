//! Sequential tests: the order, the storage bound, each operation alone.

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
fn a_lifo_grant_takes_the_newest_live_waiter_and_the_oldest_keeps_its_turn() {
    let g = TestGate::new(1, 3);
    assert_eq!(g.admit(), Admit::Held);
    let a = queued(g.admit());
    let b = queued(g.admit());
    let c = queued(g.admit());
    assert!(g.cancel(c.0, c.1));
    // c left: the newest live waiter is b.
    g.release_newest();
    assert_eq!(g.poll(b.0, b.1), Some(Outcome::Granted));
    assert_eq!(g.counts(), (1, 1));
    // b's position is skipped: the next slot goes to a, and the queue
    // stays exact for newcomers.
    let d = queued(g.admit());
    g.release();
    assert_eq!(g.poll(a.0, a.1), Some(Outcome::Granted));
    assert_eq!(g.poll(d.0, d.1), None);
    g.release();
    assert_eq!(g.poll(d.0, d.1), Some(Outcome::Granted));
    g.release();
    assert_eq!(g.counts(), (0, 0));
}

#[test]
fn a_lifo_grant_with_nobody_in_a_cell_is_delivered_in_order() {
    let g = TestGate::new(1, 2);
    assert_eq!(g.admit(), Admit::Held);
    let a = queued(g.admit());
    assert!(g.cancel(a.0, a.1));
    assert!(g.fifo.grant_newest(&g).is_none());
    g.release_newest();
    assert_eq!(g.counts(), (0, 0));
    assert_eq!(g.admit(), Admit::Held);
    g.release();
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
    assert_eq!(g.fifo.push(cell, 0, false, None), Pushed::Granted);
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
        assert_eq!(g.fifo.push(cell, t, detached, None), Pushed::Queued);
        cells.push((cell, gen));
    }
    // A grant tells the first; a rejection by another thread the second.
    g.word.fetch_sub(ONE_QUEUED, Ordering::AcqRel);
    let told = Told {
        cell: cells[0].0,
        detached: true,
        enqueued_at: 3,
        waker: None,
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
        waker: None,
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
    assert_eq!(g.fifo.push(cell, 9, false, None), Pushed::Queued);
    g.word.fetch_sub(ONE_QUEUED, Ordering::AcqRel);
    let told = Told {
        cell,
        detached: false,
        enqueued_at: 9,
        waker: None,
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

/// Counts its wakes.
struct Wakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

fn counting_waker() -> (Arc<Wakes>, std::task::Waker) {
    let w = Arc::new(Wakes(std::sync::atomic::AtomicUsize::new(0)));
    (Arc::clone(&w), std::task::Waker::from(w))
}

/// Counts a waiter and pushes it with `waker`.
fn push_with(g: &TestGate, waker: &std::task::Waker) -> (u32, u32) {
    g.word.fetch_add(ONE_QUEUED, Ordering::AcqRel);
    let (cell, gen) = g.fifo.take_cell().unwrap();
    assert_eq!(g.fifo.push(cell, 0, false, Some(waker)), Pushed::Queued);
    (cell, gen)
}

#[test]
fn the_resolver_takes_the_waker_the_cell_holds_and_the_owner_can_swap_it() {
    let g = TestGate::new(1, 3);
    assert_eq!(g.admit(), Admit::Held);
    let (first, first_waker) = counting_waker();
    let (second, second_waker) = counting_waker();
    let a = push_with(&g, &first_waker);
    // The owner polls with another waker: the cell swaps it in and drops
    // its clone of the first.
    assert_eq!(Arc::strong_count(&first), 3);
    assert_eq!(g.fifo.register(a.0, &second_waker), None);
    assert_eq!(Arc::strong_count(&first), 2);
    // The grant takes the second waker out of the cell; the teller wakes it.
    g.word.fetch_sub(ONE_QUEUED, Ordering::AcqRel);
    let Then::Wake(told) = g.fifo.resume() else {
        panic!("a grant")
    };
    assert!(told
        .waker
        .as_ref()
        .is_some_and(|w| w.will_wake(&second_waker)));
    told.waker.unwrap().wake();
    assert_eq!(g.fifo.status(a.0), (a.1, Status::Granted));
    assert_eq!(g.fifo.register(a.0, &first_waker), Some(Status::Granted));
    g.fifo.free_cell(a.0);
    assert_eq!(first.0.load(Ordering::Relaxed), 0);
    assert_eq!(second.0.load(Ordering::Relaxed), 1);
    assert_eq!(Arc::strong_count(&second), 2, "the cell kept no clone");

    // A rejection by another thread hands the waker over too; the owner's
    // own cancel takes it back without waking it.
    let b = push_with(&g, &first_waker);
    let c = push_with(&g, &second_waker);
    let mut told = Vec::new();
    assert_eq!(
        g.fifo
            .reject_from_head(AdmitError::Closed, |_| true, 1, &g, |who, _| told.push(who)),
        1
    );
    assert!(told[0]
        .waker
        .as_ref()
        .is_some_and(|w| w.will_wake(&first_waker)));
    assert!(g.cancel(c.0, c.1));
    assert_eq!(
        Arc::strong_count(&second),
        2,
        "the cancel dropped the clone"
    );
    assert_eq!(second.0.load(Ordering::Relaxed), 1, "and woke nobody");
    drop(told);
    assert_eq!(
        g.poll(b.0, b.1),
        Some(Outcome::Rejected(AdmitError::Closed))
    );
    assert_eq!(Arc::strong_count(&first), 2);
}
