//! The pick policies: which eligible slot of a model a router takes.
//!
//! # Algorithms
//!
//! * **Round-robin** scans the eligible words cyclically from a shared
//!   cursor and stores the slot after the one it took. Concurrent routers
//!   may take the same slot (the policy is documented as approximate).
//! * **Random** must be uniform over the eligible workers. In order of cost:
//!   one index into the `PickCache` if it was built at the model's
//!   current epochs and the picked slot is still eligible; else up to four
//!   random probes of the bitsets while at most half the workers are busy;
//!   else an exact pick that counts the eligible bits of every word and
//!   indexes the `k`-th (and offers its count to the cache). Each stage
//!   either returns a uniform pick or passes, so the result stays uniform.
//! * **Power-of-two** draws two picks the same way and keeps the one whose
//!   worker carries less load.
//!
//! Random numbers come from a per-thread xorshift64* generator, mapped onto
//! a range with a multiply instead of a division.
//!
//! # Orderings
//!
//! Routers read the bitsets through [`Model::eligible`] (Acquire word
//! loads; see `model.rs`). The cursor, the counts behind the mostly-free
//! test, `leases_out` and the per-slot load are `Relaxed` hints: each is
//! either re-checked against the bitsets or only skews a choice between
//! workers that are all eligible.

use super::config::Policy;
use super::model::Model;
use crate::clock::SharedClock;
use crate::sync::Ordering;

/// Models up to this many bitset words (4096 slots) pick uniformly in one pass.
const STACK_WORDS: usize = 64;

impl Model {
    /// Picks an eligible slot by `policy`, or `None` if there is none.
    #[inline]
    pub(super) fn pick(&self, policy: Policy, clock: &SharedClock) -> Option<usize> {
        match policy {
            Policy::RoundRobin => self.pick_round_robin(clock),
            Policy::Random => self.pick_random(clock),
            Policy::PowerOfTwo => {
                let mut now = None;
                let (a, b) = match self.listed::<2>(&mut now, clock) {
                    Some([a, b]) => (a, b),
                    None => match (self.probe(&mut now, clock), self.probe(&mut now, clock)) {
                        (Some(a), Some(b)) => (a, b),
                        _ => self.uniform_pair(&mut now, clock)?,
                    },
                };
                // Relaxed: a hint; a load a moment old only skews the choice
                // between two eligible workers.
                let load = |s: usize| self.load[s].load(Ordering::Relaxed);
                Some(if load(b) < load(a) { b } else { a })
            }
        }
    }

    /// Round-robin: the first eligible slot at or after the cursor, cyclically.
    #[inline]
    fn pick_round_robin(&self, clock: &SharedClock) -> Option<usize> {
        let words = self.words_in_use();
        // The cursor is at most `words * 64` (one past a slot): wrap without
        // a division. Relaxed: a hint where to start; racing routers may
        // start at the same slot.
        let start = self.cursor.load(Ordering::Relaxed);
        let start = if start >= words * 64 { 0 } else { start };
        let (sw, sb) = (start / 64, start % 64);
        let mut now = None;
        let first = self.eligible(sw, &mut now, clock);
        let found = if first & (!0u64 << sb) != 0 {
            Some(sw * 64 + (first & (!0u64 << sb)).trailing_zeros() as usize)
        } else {
            (sw + 1..words)
                .chain(0..sw)
                .find_map(|w| {
                    let e = self.eligible(w, &mut now, clock);
                    (e != 0).then(|| w * 64 + e.trailing_zeros() as usize)
                })
                .or_else(|| (first != 0).then(|| sw * 64 + first.trailing_zeros() as usize))
        };
        if let Some(slot) = found {
            // Relaxed: as the load above.
            self.cursor.store(slot + 1, Ordering::Relaxed);
        }
        found
    }

    /// Whether at most half the workers are busy, so that a random probe
    /// usually hits an eligible one. Relaxed counts: a wrong guess only
    /// costs probes, each of which is checked against the bitsets.
    #[inline]
    fn mostly_free(&self) -> bool {
        self.busy_workers.load(Ordering::Relaxed) * 2 <= self.workers.load(Ordering::Relaxed)
    }

    /// A few random probes for an eligible slot while most workers are free.
    #[inline]
    fn probe(&self, now: &mut Option<u64>, clock: &SharedClock) -> Option<usize> {
        if !self.mostly_free() {
            return None;
        }
        let span = self.words_in_use() as u64 * 64;
        (0..4).find_map(|_| {
            let slot = below(next_random(), span) as usize;
            (self.eligible(slot / 64, now, clock) >> (slot % 64) & 1 == 1).then_some(slot)
        })
    }

    /// Uniform random: the free list if it is current, else probes while
    /// most workers are free, else an exact pick (which may build the list).
    #[inline]
    fn pick_random(&self, clock: &SharedClock) -> Option<usize> {
        let mut now = None;
        self.listed::<1>(&mut now, clock)
            .map(|[a]| a)
            .or_else(|| self.probe(&mut now, clock))
            .or_else(|| self.uniform_pair(&mut now, clock).map(|(a, _)| a))
    }

    /// `K` uniform picks from the free list, if it is current and every
    /// pick is still eligible. A pick that is not (leased, or changed since
    /// the list was built) returns `None` for an exact pick: the two together
    /// stay uniform over the eligible workers.
    #[inline]
    fn listed<const K: usize>(
        &self,
        now: &mut Option<u64>,
        clock: &SharedClock,
    ) -> Option<[usize; K]> {
        let picks = self.free_list.pick::<K>(self.stamp(), |len| {
            below(next_random(), len as u64) as usize
        })?;
        picks
            .iter()
            .all(|&s| self.eligible(s / 64, now, clock) >> (s % 64) & 1 == 1)
            .then_some(picks)
    }

    /// Two independent uniform picks among the eligible slots. Up to
    /// [`STACK_WORDS`] words (4096 slots) this is one pass: the eligible
    /// words are kept on the stack, counted, and indexed twice.
    #[inline]
    fn uniform_pair(&self, now: &mut Option<u64>, clock: &SharedClock) -> Option<(usize, usize)> {
        let words = self.words_in_use();
        if words > STACK_WORDS {
            let a = self.uniform_two_pass(now, clock)?;
            return Some((a, self.uniform_two_pass(now, clock).unwrap_or(a)));
        }
        // `upto[w]`: eligible slots in words `0..=w` (non-decreasing).
        let mut eligible = [0u64; STACK_WORDS];
        let mut upto = [0u32; STACK_WORDS];
        let mut total = 0u32;
        let before = self.stamp();
        // Relaxed hint: a lease that races the count at worst keeps one
        // worker out of the cached list until the epochs move, and every
        // listed pick is re-checked.
        let unleased = self.leases_out.load(Ordering::Relaxed) == 0;
        for w in 0..words {
            let e = self.eligible(w, now, clock);
            if e != 0 {
                eligible[w] = e;
                total += e.count_ones();
            }
            upto[w] = total;
        }
        if total == 0 {
            return None;
        }
        // A count at epochs that held still, with no lease hiding a worker,
        // may become the free list. Relaxed: as above.
        if unleased && self.leases_out.load(Ordering::Relaxed) == 0 && self.stamp() == before {
            self.free_list.offer(before, &eligible[..words]);
        }
        let upto = &upto[..words];
        let nth = |k: u32| {
            let w = upto.partition_point(|&c| c <= k);
            let before = if w == 0 { 0 } else { upto[w - 1] };
            w * 64 + nth_set_bit(eligible[w], k - before)
        };
        let total = u64::from(total);
        Some((
            nth(below(next_random(), total) as u32),
            nth(below(next_random(), total) as u32),
        ))
    }

    /// A uniform pick for models wider than [`STACK_WORDS`]: count, then walk.
    fn uniform_two_pass(&self, now: &mut Option<u64>, clock: &SharedClock) -> Option<usize> {
        let words = self.words_in_use();
        let total: u64 = (0..words)
            .map(|w| u64::from(self.eligible(w, now, clock).count_ones()))
            .sum();
        if total == 0 {
            return None;
        }
        let mut k = below(next_random(), total);
        for w in 0..words {
            let e = self.eligible(w, now, clock);
            let c = u64::from(e.count_ones());
            if k < c {
                return Some(w * 64 + nth_set_bit(e, k as u32));
            }
            k -= c;
        }
        // The set changed between the two passes; fall back to any eligible.
        self.pick_round_robin(clock)
    }
}

/// Maps a random `r` uniformly onto `0..n` with a multiply, not a division.
#[inline]
fn below(r: u64, n: u64) -> u64 {
    ((u128::from(r) * u128::from(n)) >> 64) as u64
}

/// Position of the `n`-th (0-based) set bit of `word`; `n < word.count_ones()`.
#[inline]
fn nth_set_bit(mut word: u64, n: u32) -> usize {
    for _ in 0..n {
        word &= word - 1;
    }
    word.trailing_zeros() as usize
}

std::thread_local! {
    /// This thread's pick generator; 0 until it is first used or seeded.
    static STATE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Seeds this thread's pick generator: the random and power-of-two picks
/// this thread makes afterwards are a function of `seed` and the monitors'
/// state, so a simulation on one thread repeats itself. Without it, each
/// thread's generator starts from a seed of its own.
pub fn seed_picks(seed: u64) {
    // Any seed but 0, which marks an unseeded generator.
    STATE.with(|s| s.set(seed.wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1));
}

/// A per-thread xorshift64* generator; no allocation, no shared state.
#[inline]
fn next_random() -> u64 {
    use std::cell::Cell;
    STATE.with(|s: &Cell<u64>| {
        let mut x = s.get();
        if x == 0 {
            // Seed from the thread-local's address and a global counter. A
            // plain std atomic, Relaxed: it hands out distinct seeds and
            // orders nothing, so it needs no loom model.
            static SEEDS: std::sync::atomic::AtomicU64 =
                std::sync::atomic::AtomicU64::new(0x9E37_79B9_7F4A_7C15);
            let seed = SEEDS.fetch_add(0x9E37_79B9_7F4A_7C15, std::sync::atomic::Ordering::Relaxed);
            x = (seed ^ (s as *const Cell<u64> as u64)).wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1;
        }
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}
