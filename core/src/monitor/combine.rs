//! Combining publication: many writers, one publisher at a time.
//!
//! Several threads change a worker's load (its own reports, the router's
//! bookings, a threshold update) and each change must end with the worker's
//! busy bit recomputed from the *latest* inputs. Letting every writer publish
//! races (a stale result can land last); a lock would make writers wait. A
//! [`Combiner`] does neither: the first writer becomes the publisher and keeps
//! re-publishing until no new change arrived while it worked; later writers
//! just register their change and return at once.
//!
//! # The state word
//!
//! ```text
//!  63                32 31                 0
//! +--------------------+--------------------+
//! |     generation     |      pending       |
//! +--------------------+--------------------+
//! ```
//!
//! * `pending`: changes registered since the current publisher last
//!   published (0 = nobody is publishing).
//! * `generation`: bumped each time a publisher retires; waiters use it to
//!   know that a publication covering their change has completed.
//!
//! # Why it is correct
//!
//! A writer stores its inputs, then registers with `fetch_add(1, AcqRel)`.
//! If `pending` was 0 it is the publisher: it publishes, then tries to retire
//! with `compare_exchange(seen, pending = 0, generation + 1)`. The exchange
//! fails if anyone registered since `seen` was read; the failure returns the
//! new word with `Acquire`, which makes that writer's inputs (stored before its
//! `Release` increment) visible, and the publisher publishes again. So the
//! last publication always starts after the last registered change was
//! visible: the published result is never older than the latest input.
//! Only the publisher writes published state, so publications never race.

use crate::sync::{AtomicU64, Ordering};

const PENDING: u64 = 0xFFFF_FFFF;
const GENERATION_ONE: u64 = 1 << 32;

/// Serializes publication of derived state while letting writers return
/// without waiting. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Combiner {
    state: AtomicU64,
}

impl Combiner {
    /// A combiner with no publisher.
    pub(crate) fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
        }
    }

    /// Registers a change made before this call; `publish` runs here (possibly
    /// several times) unless another thread is publishing, in which case that
    /// thread publishes on this change's behalf and this call returns at once.
    /// `publish` must be the same computation whichever thread runs it.
    #[inline]
    pub(crate) fn run(&self, publish: impl FnMut()) {
        // AcqRel: Release publishes this thread's inputs to the publisher;
        // Acquire makes earlier writers' inputs visible if we publish.
        let prev = self.state.fetch_add(1, Ordering::AcqRel);
        if prev & PENDING == 0 {
            self.publish_until_quiet(prev + 1, publish);
        }
    }

    /// Like [`run`](Self::run), but returns only after a publication that saw
    /// this change has completed. For cold paths (threshold updates, removal,
    /// sweeps) that promise their effect before returning.
    pub(crate) fn run_and_wait(&self, publish: impl FnMut()) {
        // AcqRel: as in `run`.
        let prev = self.state.fetch_add(1, Ordering::AcqRel);
        if prev & PENDING == 0 {
            self.publish_until_quiet(prev + 1, publish);
            return;
        }
        // The current publisher retires only with a word that includes our
        // increment, after publishing with our change visible; retiring bumps
        // the generation. Acquire pairs with its AcqRel exchange.
        let generation = prev & !PENDING;
        while self.state.load(Ordering::Acquire) & !PENDING == generation {
            crate::sync::spin_wait();
        }
    }

    fn publish_until_quiet(&self, mut seen: u64, mut publish: impl FnMut()) {
        loop {
            publish();
            let retired = (seen & !PENDING).wrapping_add(GENERATION_ONE);
            // AcqRel on success: our publication happens-before any waiter that
            // sees the new generation. Acquire on failure: see the module docs.
            match self
                .state
                .compare_exchange(seen, retired, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(now) => seen = now,
            }
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicU64 as LoomU64;
    use loom::sync::Arc;

    /// Two writers and one waiting writer change an input; afterwards the
    /// published value equals the last input, and the waiter saw its own
    /// input published before it returned.
    #[test]
    fn last_publication_reflects_latest_input() {
        loom::model(|| {
            let c = Arc::new(Combiner::new());
            let input = Arc::new(LoomU64::new(0));
            let published = Arc::new(LoomU64::new(0));
            let publish = {
                let (input, published) = (input.clone(), published.clone());
                move || published.store(input.load(Ordering::Relaxed), Ordering::Relaxed)
            };
            let handles: Vec<_> = (1..=2u64)
                .map(|v| {
                    let (c, input, mut publish) = (c.clone(), input.clone(), publish.clone());
                    loom::thread::spawn(move || {
                        input.fetch_max(v, Ordering::Relaxed);
                        c.run(&mut publish);
                    })
                })
                .collect();
            input.fetch_max(3, Ordering::Relaxed);
            let mut p = publish.clone();
            c.run_and_wait(&mut p);
            assert_eq!(
                published.load(Ordering::Relaxed),
                3,
                "waiter returned before its change was published"
            );
            for h in handles {
                h.join().unwrap();
            }
            assert_eq!(published.load(Ordering::Relaxed), 3);
            assert_eq!(c.state.load(Ordering::Relaxed) & PENDING, 0);
        });
    }
}
