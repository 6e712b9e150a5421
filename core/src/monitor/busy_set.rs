//! Epoch-stamped bitsets over dense worker slots.
//!
//! Each model numbers its workers with dense slot indices; a [`BusySet`] holds
//! one bit per slot (set = busy) plus an epoch that every change bumps.
//! Routers read it with plain atomic loads: no lock, no allocation, no waiting
//! for a writer, and a writer never waits for a reader.
//!
//! # Memory ordering, in plain words
//!
//! A writer first changes the bit, then bumps the epoch with `Release`. A
//! reader that loads the epoch with `Acquire` and then reads the bits sees at
//! least every change whose bump it observed, and possibly newer changes whose
//! bump is still in flight. [`BusySet::snapshot`] copies all words and retries
//! until the epoch did not move while copying, so the copy reflects exactly one
//! epoch unless a change is mid-flight, in which case it may already include
//! that change (never a torn word, never a lost change that was stamped).
//! Single-bit reads ([`BusySet::contains`]) are always current to the latest
//! completed change.
//!
//! # Layout
//!
//! Slot `s` is bit `s % 64` of word `s / 64`; the epoch is a plain count of
//! the changes made so far (64 bits, so it never wraps in practice).

use crate::sync::{AtomicU64, Ordering};

/// A fixed-size bitset of atomics; the building block of [`BusySet`].
#[derive(Debug)]
pub(crate) struct AtomicBits {
    words: Box<[AtomicU64]>,
}

impl AtomicBits {
    /// A bitset able to hold `bits` bits, all clear.
    pub(crate) fn new(bits: usize) -> Self {
        let words = bits.div_ceil(64).max(1);
        Self {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Number of bits this set can hold.
    pub(crate) fn capacity(&self) -> usize {
        self.words.len() * 64
    }

    /// Sets bit `i`; true if it was clear.
    #[inline]
    pub(crate) fn set(&self, i: usize) -> bool {
        let mask = 1u64 << (i % 64);
        // AcqRel: the bit change is ordered after everything this thread did
        // before (e.g. storing a lease deadline) and is one total order per word.
        self.words[i / 64].fetch_or(mask, Ordering::AcqRel) & mask == 0
    }

    /// Clears bit `i`; true if it was set.
    #[inline]
    pub(crate) fn clear(&self, i: usize) -> bool {
        let mask = 1u64 << (i % 64);
        // AcqRel: as in `set`.
        self.words[i / 64].fetch_and(!mask, Ordering::AcqRel) & mask != 0
    }

    /// Whether bit `i` is set.
    #[inline]
    pub(crate) fn contains(&self, i: usize) -> bool {
        self.word(i / 64) & (1u64 << (i % 64)) != 0
    }

    /// Word `w` (bits `64 * w .. 64 * w + 64`).
    #[inline]
    pub(crate) fn word(&self, w: usize) -> u64 {
        // Acquire: pairs with the AcqRel of `set`/`clear`, so data written
        // before a bit was set (e.g. a worker id) is visible to its reader.
        self.words[w].load(Ordering::Acquire)
    }

    /// Number of words.
    #[inline]
    pub(crate) fn words(&self) -> usize {
        self.words.len()
    }
}

/// An epoch-stamped bitset of busy worker slots. See the module docs for the
/// memory-ordering guarantee.
#[derive(Debug)]
pub struct BusySet {
    bits: AtomicBits,
    epoch: AtomicU64,
}

impl BusySet {
    /// A set for `slots` worker slots, all free, at epoch 0.
    pub fn new(slots: usize) -> Self {
        Self {
            bits: AtomicBits::new(slots),
            epoch: AtomicU64::new(0),
        }
    }

    /// Number of slots the set can hold (a multiple of 64).
    pub fn capacity(&self) -> usize {
        self.bits.capacity()
    }

    /// Marks `slot` busy; true (and the epoch bumped) if it was free.
    ///
    /// # Panics
    /// If `slot >= capacity()`.
    pub fn insert(&self, slot: usize) -> bool {
        let changed = self.bits.set(slot);
        if changed {
            // Release: a reader that sees the new epoch sees the bit change.
            self.epoch.fetch_add(1, Ordering::Release);
        }
        changed
    }

    /// Marks `slot` free; true (and the epoch bumped) if it was busy.
    ///
    /// # Panics
    /// If `slot >= capacity()`.
    pub fn remove(&self, slot: usize) -> bool {
        let changed = self.bits.clear(slot);
        if changed {
            // Release: as in `insert`.
            self.epoch.fetch_add(1, Ordering::Release);
        }
        changed
    }

    /// Whether `slot` is busy. Slots past the capacity are free.
    #[inline]
    pub fn contains(&self, slot: usize) -> bool {
        slot < self.capacity() && self.bits.contains(slot)
    }

    /// The epoch: the number of changes made so far.
    #[inline]
    pub fn epoch(&self) -> u64 {
        // Acquire: pairs with the Release bump in `insert`/`remove`, so the
        // bit changes an epoch counts are visible to whoever reads it.
        self.epoch.load(Ordering::Acquire)
    }

    /// Word `w` of the set: bit `b` is slot `64 * w + b`.
    #[inline]
    pub fn word(&self, w: usize) -> u64 {
        self.bits.word(w)
    }

    /// Number of 64-bit words.
    #[inline]
    pub fn words(&self) -> usize {
        self.bits.words()
    }

    /// Copies the words into `out` (up to its length) and returns the epoch
    /// they reflect; retries while a change lands mid-copy. Never allocates.
    pub fn snapshot(&self, out: &mut [u64]) -> u64 {
        loop {
            let before = self.epoch();
            for (w, slot) in out.iter_mut().enumerate().take(self.words()) {
                *slot = self.bits.word(w);
            }
            // Acquire on the word loads above orders them before this load.
            let after = self.epoch.load(Ordering::Acquire);
            if before == after {
                return before;
            }
            crate::sync::spin_wait();
        }
    }

    /// The number of busy slots (counts every word).
    pub fn count(&self) -> usize {
        (0..self.words())
            .map(|w| self.word(w).count_ones() as usize)
            .sum()
    }

    /// Busy slots in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.words()).flat_map(move |w| BitIter(self.word(w)).map(move |b| w * 64 + b))
    }
}

/// Iterates the set bits of one word, lowest first.
pub(crate) struct BitIter(pub(crate) u64);

impl Iterator for BitIter {
    type Item = usize;
    #[inline]
    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let b = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1;
        Some(b)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn changes_bump_the_epoch_once() {
        let set = BusySet::new(130);
        assert_eq!(set.capacity(), 192);
        assert!(set.insert(3));
        assert!(!set.insert(3));
        assert!(set.insert(129));
        assert_eq!(set.epoch(), 2);
        assert!(set.contains(3) && set.contains(129) && !set.contains(4));
        assert!(!set.contains(10_000));
        assert!(set.remove(3));
        assert!(!set.remove(3));
        assert_eq!(set.epoch(), 3);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![129]);
        let mut words = [0u64; 3];
        assert_eq!(set.snapshot(&mut words), 3);
        assert_eq!(words, [0, 0, 2]);
        assert_eq!(set.count(), 1);
    }
}
