//! Exact statistics counters that hot paths bump without a locked
//! instruction.
//!
//! A shared `fetch_add` is a locked read-modify-write, and when two threads
//! admit at once it also moves the counter's cache line between their cores
//! on every event. [`ThreadCounter`] instead gives each thread its own padded
//! cell: the thread is the cell's only writer, so a plain load and store
//! count exactly, and reading the counter sums the cells.
//!
//! Cells are handed out per thread from a process-wide set of [`CELLS`]
//! indices: a thread claims the lowest free index on first use and gives it
//! back when it exits. The claim (`Acquire`) pairs with the release
//! (`Release`), so a thread that inherits an index sees the last value the
//! previous owner stored and the cell keeps a single writer at every moment.
//! While every index is taken, further threads share one extra cell with
//! `fetch_add`.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// Threads that count with a plain store at once; the rest share a cell.
pub(crate) const CELLS: usize = 64;

/// Indices held by live threads, one bit each.
static TAKEN: AtomicU64 = AtomicU64::new(0);

/// This thread's index; given back when the thread exits.
struct Claim(Option<usize>);

impl Claim {
    fn take() -> Self {
        let mut taken = TAKEN.load(Ordering::Relaxed);
        loop {
            if taken == u64::MAX {
                return Claim(None);
            }
            let i = (!taken).trailing_zeros() as usize;
            match TAKEN.compare_exchange_weak(
                taken,
                taken | 1 << i,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Claim(Some(i)),
                Err(actual) => taken = actual,
            }
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            // Release: the next owner of the index sees our last store.
            TAKEN.fetch_and(!(1 << i), Ordering::Release);
        }
    }
}

thread_local! {
    static CLAIM: Claim = Claim::take();
}

/// This thread's cell index, or `None` to use the shared cell (every index
/// taken, or the thread is exiting).
#[inline]
fn cell_index() -> Option<usize> {
    CLAIM.try_with(|c| c.0).ok().flatten()
}

/// `K` exact counters bumped together (a histogram's buckets and sum):
/// each thread's cell holds all `K`, so one bump of several costs one cell
/// lookup and no locked instruction. See the module docs.
pub(crate) struct ThreadCounters<const K: usize> {
    /// `CELLS` per-thread cells, then the shared one.
    cells: Box<[CachePadded<[AtomicU64; K]>]>,
}

impl<const K: usize> ThreadCounters<K> {
    pub(crate) fn new() -> Self {
        Self {
            cells: (0..=CELLS)
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    /// Adds `n` to counter `k` for each `(k, n)` of `adds`.
    #[inline]
    pub(crate) fn add(&self, adds: &[(usize, u64)]) {
        match cell_index() {
            Some(i) => {
                let cell = &self.cells[i];
                for &(k, n) in adds {
                    // This thread is the cell's only writer (module docs).
                    cell[k].store(
                        cell[k].load(Ordering::Relaxed).wrapping_add(n),
                        Ordering::Relaxed,
                    );
                }
            }
            None => {
                for &(k, n) in adds {
                    self.cells[CELLS][k].fetch_add(n, Ordering::Relaxed);
                }
            }
        }
    }

    /// Counter `k`'s total so far: exact once the adding threads have
    /// stopped, and never more than what was added.
    pub(crate) fn get(&self, k: usize) -> u64 {
        self.cells.iter().fold(0u64, |sum, c| {
            sum.wrapping_add(c[k].load(Ordering::Relaxed))
        })
    }
}

/// One exact counter (see the module docs).
pub(crate) struct ThreadCounter(ThreadCounters<1>);

impl ThreadCounter {
    pub(crate) fn new() -> Self {
        Self(ThreadCounters::new())
    }

    /// Adds `n`.
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.0.add(&[(0, n)]);
    }

    /// The total so far: exact once the adding threads have stopped, and
    /// never more than what was added.
    pub(crate) fn get(&self) -> u64 {
        self.0.get(0)
    }
}

impl Default for ThreadCounter {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn counts_exactly_across_more_threads_than_cells_and_thread_churn() {
        let counter = Arc::new(ThreadCounter::new());
        // Three waves of 2 * CELLS threads: some share the extra cell, and
        // later waves inherit the indices of threads that exited.
        for wave in 0..3u64 {
            let threads: Vec<_> = (0..2 * CELLS as u64)
                .map(|t| {
                    let counter = Arc::clone(&counter);
                    std::thread::spawn(move || {
                        for _ in 0..1000 {
                            counter.add(1 + (t + wave) % 3);
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
        }
        let want: u64 = (0..3u64)
            .flat_map(|wave| (0..2 * CELLS as u64).map(move |t| 1000 * (1 + (t + wave) % 3)))
            .sum();
        assert_eq!(counter.get(), want);
    }
}
