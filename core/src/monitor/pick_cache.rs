//! A list of one model's free workers, so that a uniform random pick is one
//! index while the busy set holds still.
//!
//! Random and power-of-two routing must pick uniformly among the eligible
//! workers. While most workers are free a few random probes of the bitset
//! find one; when most are busy, an exact pick has to count every word of the
//! model. This cache keeps the eligible slots as a dense list, stamped with
//! the busy-set epoch and the membership epoch it was built at, so a router
//! that finds the stamps current picks with one random index.
//!
//! # Protocol
//!
//! The list is a sequence lock over atomics; nobody ever waits.
//!
//! * **Readers** load `seq` (`Acquire`), check it is even and that the stamps
//!   match the model's current epochs, read `len` and the picked slots
//!   (`Relaxed`), then `fence(Acquire)` and load `seq` again. An unchanged
//!   `seq` means no builder wrote while they read, so the slots belong to the
//!   stamped list. The router still checks that the slot is eligible now, so
//!   a change after the stamps were read costs a fallback, never a wrong
//!   answer.
//! * **Builders** are routers that just counted the whole model (a miss) at
//!   stable epochs. The first miss at an epoch pair only records it; the
//!   second rebuilds, so a model whose busy set changes between every two
//!   selects never pays for building a list nobody reads. A builder takes
//!   the list by moving `seq` from even to odd with a compare-exchange (a
//!   loser just leaves), issues `fence(Release)`, writes stamps, slots and
//!   `len` (`Relaxed`), and stores `seq + 2` with `Release`.
//!
//! Pairing: a reader that read any value a builder wrote synchronizes, through
//! the builder's release fence and its own acquire fence, with that builder's
//! odd `seq`, so its second load of `seq` cannot return the even value it
//! started with. A reader whose first load saw a builder's final even `seq`
//! sees everything that builder wrote.

use super::busy_set::BitIter;
use crate::sync::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// The epochs a list is valid for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// The model's busy-set epoch.
    pub(crate) busy: u64,
    /// The model's membership epoch.
    pub(crate) members: u64,
}

impl Stamp {
    /// One number per epoch pair, for remembering the last miss.
    fn key(self) -> u64 {
        self.busy ^ self.members.rotate_left(32)
    }
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct PickCache {
    /// Even: stable; odd: a builder is writing.
    seq: AtomicU64,
    busy: AtomicU64,
    members: AtomicU64,
    /// [`Stamp::key`] of the last miss.
    missed_at: AtomicU64,
    len: AtomicUsize,
    slots: Box<[AtomicU32]>,
}

/// No stamp matches a list never built.
const NEVER: u64 = u64::MAX;

impl PickCache {
    /// An empty cache for a model of `capacity` slots.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            seq: AtomicU64::new(0),
            busy: AtomicU64::new(NEVER),
            members: AtomicU64::new(NEVER),
            missed_at: AtomicU64::new(NEVER),
            len: AtomicUsize::new(0),
            slots: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// `K` slots drawn uniformly and independently from the list, if the list
    /// was built at `stamp` and is not empty; `None` means count instead.
    /// `random` maps a length to a uniform index below it.
    #[inline]
    pub(crate) fn pick<const K: usize>(
        &self,
        stamp: Stamp,
        mut random: impl FnMut(usize) -> usize,
    ) -> Option<[usize; K]> {
        // Acquire: pairs with the builder's final Release store of `seq`, so
        // an even value means that builder's list is visible.
        let seq = self.seq.load(Ordering::Acquire);
        // Relaxed stamp, length and slot loads: a torn read is caught by the
        // fence and the second `seq` load below, and then discarded.
        if seq & 1 == 1
            || self.busy.load(Ordering::Relaxed) != stamp.busy
            || self.members.load(Ordering::Relaxed) != stamp.members
        {
            return None;
        }
        let len = self.len.load(Ordering::Relaxed).min(self.slots.len());
        if len == 0 {
            return None;
        }
        let picks =
            std::array::from_fn(|_| self.slots[random(len)].load(Ordering::Relaxed) as usize);
        // Acquire fence: pairs with a builder's Release fence, so reading
        // anything it wrote makes its odd `seq` visible to the load below,
        // which therefore needs no ordering of its own.
        fence(Ordering::Acquire);
        (self.seq.load(Ordering::Relaxed) == seq).then_some(picks)
    }

    /// Offers the eligible words a router just counted at `stamp` (the
    /// epochs did not move while it counted, and no lease was out). Rebuilds
    /// the list on the second offer at the same stamp; see the module docs.
    pub(crate) fn offer(&self, stamp: Stamp, eligible: &[u64]) {
        let key = stamp.key();
        // Relaxed: a hint that only decides whether to rebuild; a lost
        // update costs one more miss.
        if self.missed_at.swap(key, Ordering::Relaxed) != key {
            return;
        }
        // Relaxed load and exchange: they only claim the list; the Release
        // fence after the claim orders it before the writes.
        let seq = self.seq.load(Ordering::Relaxed);
        if seq & 1 == 1
            || self
                .seq
                .compare_exchange(seq, seq + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        // Release fence: pairs with the readers' Acquire fence (module docs);
        // the Relaxed writes below are ordered after the odd `seq`.
        fence(Ordering::Release);
        self.busy.store(stamp.busy, Ordering::Relaxed);
        self.members.store(stamp.members, Ordering::Relaxed);
        let slots = eligible
            .iter()
            .enumerate()
            .flat_map(|(w, &word)| BitIter(word).map(move |b| w * 64 + b));
        let mut len = 0;
        for (cell, slot) in self.slots.iter().zip(slots) {
            cell.store(slot as u32, Ordering::Relaxed);
            len += 1;
        }
        self.len.store(len, Ordering::Relaxed);
        // Release: pairs with the readers' first Acquire load of `seq`.
        self.seq.store(seq + 2, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const AT: Stamp = Stamp {
        busy: 3,
        members: 7,
    };

    #[test]
    fn the_list_is_built_on_the_second_miss_at_the_same_epochs() {
        let cache = PickCache::new(128);
        let eligible = [0b1010u64, 1 << 63];
        cache.offer(AT, &eligible);
        assert_eq!(cache.pick::<1>(AT, |_| 0), None, "one miss only records");
        cache.offer(AT, &eligible);
        let mut seen: Vec<usize> = (0..3)
            .map(|i| cache.pick::<1>(AT, |_| i).unwrap()[0])
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, [1, 3, 127]);
        let moved = Stamp { busy: 4, ..AT };
        assert_eq!(cache.pick::<2>(moved, |_| 0), None, "stale stamps miss");
        cache.offer(moved, &[0, 0]);
        cache.offer(moved, &[0, 0]);
        assert_eq!(
            cache.pick::<1>(moved, |_| 0),
            None,
            "an empty list is a miss"
        );
    }

    #[test]
    fn misses_at_alternating_epochs_never_build() {
        let cache = PickCache::new(64);
        for busy in 0..10 {
            cache.offer(Stamp { busy, members: 1 }, &[1]);
        }
        assert_eq!(
            cache.pick::<1>(
                Stamp {
                    busy: 9,
                    members: 1
                },
                |_| 0
            ),
            None
        );
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// A reader racing two rebuilds never accepts slots from a list other
    /// than the one whose stamp it matched.
    #[test]
    fn a_reader_never_mixes_two_lists() {
        loom::model(|| {
            let cache = Arc::new(PickCache::new(2));
            let at = |busy| Stamp { busy, members: 0 };
            // The list at busy epoch 1 holds slot 0; the one at epoch 2, slot 1.
            cache.offer(at(1), &[0b01]);
            cache.offer(at(1), &[0b01]);
            let builder = {
                let cache = Arc::clone(&cache);
                loom::thread::spawn(move || {
                    cache.offer(at(2), &[0b10]);
                    cache.offer(at(2), &[0b10]);
                })
            };
            for busy in [1, 2] {
                if let Some([slot]) = cache.pick::<1>(at(busy), |_| 0) {
                    assert_eq!(slot as u64, busy - 1);
                }
            }
            builder.join().unwrap();
            assert_eq!(cache.pick::<1>(at(2), |_| 0), Some([1]));
        });
    }
}
