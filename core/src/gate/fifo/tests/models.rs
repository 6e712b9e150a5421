//! Loom models of every race that matters.

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

/// Adaptive LIFO: a grant to the newest waiter races that waiter's own
/// cancel and a release to the oldest: each waiter is granted once or
/// leaves, both slots reach a live waiter or come back, and the counts end
/// exact.
#[test]
fn lifo_grant_release_and_cancel() {
    model(|| {
        let g = Arc::new(TestGate::new(2, 2));
        assert_eq!(g.admit(), Admit::Held);
        assert_eq!(g.admit(), Admit::Held);
        let a = queued(g.admit());
        let b = queued(g.admit());
        let lifo = {
            let g = Arc::clone(&g);
            thread::spawn(move || g.release_newest())
        };
        let canceller = {
            let g = Arc::clone(&g);
            thread::spawn(move || g.cancel(b.0, b.1))
        };
        g.release();
        lifo.join().unwrap();
        canceller.join().unwrap();
        // Two slots for at most two waiters: a is always granted. b left,
        // or was granted first and its cancel released the slot; either
        // way exactly one slot is held, by a.
        assert_eq!(wait(&g, a), Outcome::Granted);
        assert_eq!(g.counts(), (1, 0));
        g.release();
        assert_eq!(g.counts(), (0, 0));
    });
}

/// Adaptive LIFO: a grant to the newest waiter races a newcomer and the
/// only waiter's cancel: the promised slot goes to a live waiter in a
/// cell, is left for the newcomer, or comes back; never lost.
#[test]
fn lifo_grant_arrival_and_cancel() {
    model(|| {
        let g = Arc::new(TestGate::new(1, 2));
        assert_eq!(g.admit(), Admit::Held);
        let a = queued(g.admit());
        let lifo = {
            let g = Arc::clone(&g);
            thread::spawn(move || g.release_newest())
        };
        let canceller = {
            let g = Arc::clone(&g);
            thread::spawn(move || g.cancel(a.0, a.1))
        };
        let b = g.admit();
        lifo.join().unwrap();
        canceller.join().unwrap();
        let b_got = match b {
            Admit::Held => true,
            Admit::Queued(c, gen) => match g.poll(c, gen) {
                Some(Outcome::Granted) => true,
                // The slot reached b: directly, or through a's cancel,
                // which released the slot a was granted.
                None => panic!("b still waits after the slot was given back"),
                Some(o) => panic!("{o:?}"),
            },
            Admit::Rejected => false,
        };
        assert_eq!(g.counts(), (u32::from(b_got), 0));
        if b_got {
            g.release();
        }
        assert_eq!(g.counts(), (0, 0));
    });
}

/// Counts its wakes.
struct Wakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Wakes {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

fn counting_waker() -> (std::sync::Arc<Wakes>, std::task::Waker) {
    let w = std::sync::Arc::new(Wakes(std::sync::atomic::AtomicUsize::new(0)));
    (std::sync::Arc::clone(&w), std::task::Waker::from(w))
}

fn wakes(w: &Wakes) -> usize {
    w.0.load(std::sync::atomic::Ordering::Relaxed)
}

/// The owner swaps in another waker while a release grants the cell: the
/// grant wakes the waker the cell held when it took it (the new one if the
/// swap came first; none if the owner held it back, and then the owner
/// sees the grant), and no clone is lost or leaked.
#[test]
fn a_waker_swap_races_a_grant() {
    model(|| {
        let g = Arc::new(TestGate::new(1, 1));
        assert_eq!(g.admit(), Admit::Held);
        let (first, first_waker) = counting_waker();
        let (second, second_waker) = counting_waker();
        let a = queued(g.admit_with(Some(&first_waker)));
        let releaser = {
            let g = Arc::clone(&g);
            thread::spawn(move || g.release())
        };
        let swapped = g.fifo.register(a.0, &second_waker);
        releaser.join().unwrap();
        match swapped {
            // The swap came first: the grant woke the new waker.
            None => assert_eq!((wakes(&first), wakes(&second)), (0, 1)),
            // The grant came first: it woke the old waker, or, granting
            // while the owner held the cell's waker back, none (the owner
            // saw the grant itself).
            Some(Status::Granted) => assert!(wakes(&first) <= 1 && wakes(&second) == 0),
            Some(s) => panic!("{s:?}"),
        }
        assert_eq!(wait(&g, a), Outcome::Granted);
        assert_eq!(std::sync::Arc::strong_count(&first), 2);
        assert_eq!(std::sync::Arc::strong_count(&second), 2);
        g.release();
        assert_eq!(g.counts(), (0, 0));
    });
}

/// A rejection by another thread races the owner's cancel and a waker
/// swap: the waker the cell holds is woken at most once, by a rejection
/// (never by the owner's own cancel), and no clone is leaked.
#[test]
fn a_rejection_races_the_owners_cancel_and_swap() {
    model(|| {
        let g = Arc::new(TestGate::new(1, 1));
        assert_eq!(g.admit(), Admit::Held);
        let (first, first_waker) = counting_waker();
        let (second, second_waker) = counting_waker();
        let a = queued(g.admit_with(Some(&first_waker)));
        let rejecter = {
            let g = Arc::clone(&g);
            thread::spawn(move || g.reject_oldest(AdmitError::QueueTimeout))
        };
        let swapped = g.fifo.register(a.0, &second_waker);
        let left = g.cancel(a.0, a.1);
        let rejected = rejecter.join().unwrap();
        assert_ne!(left, rejected, "exactly one of the two ends it");
        // A rejection wakes the waker the cell held, unless the owner held
        // it back to swap (then it sees the rejection itself); a cancel
        // wakes nobody.
        let woken = wakes(&first) + wakes(&second);
        assert!(woken <= usize::from(rejected));
        if swapped.is_none() && rejected {
            assert_eq!(wakes(&second), 1);
        }
        assert_eq!(std::sync::Arc::strong_count(&first), 2);
        assert_eq!(std::sync::Arc::strong_count(&second), 2);
        g.release();
        assert_eq!(g.counts(), (0, 0));
    });
}
