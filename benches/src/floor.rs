//! Floors: the least work any busy-aware router can do.
//!
//! * [`BitFloor::is_busy`]: one bare `AtomicU64` load and a bit test.
//! * [`BitFloor::pick_round_robin`] and friends: AND-NOT of a membership word
//!   and a busy word, then trailing-zeros, scanning from a cursor (or a random
//!   slot) to the first eligible bit. No registry lookup, no model name, no
//!   leases, no epoch: just the bitset. The random pick is the first eligible
//!   slot at or after a random slot (cheaper than uniform, hence a floor).
//! * [`GateFloor`]: the least an exact admission gate can do, one
//!   `compare_exchange` on an `AtomicU64` count to take a slot and one
//!   `fetch_sub` to give it back. No queue, no classes, no counters.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::rng;

/// A bare bitset router over `n` slots.
#[derive(Debug)]
pub struct BitFloor {
    members: Box<[AtomicU64]>,
    busy: Box<[AtomicU64]>,
    ids: Box<[u64]>,
    loads: Box<[AtomicU64]>,
    cursor: AtomicUsize,
}

impl BitFloor {
    /// Slots `0..ids.len()` hold `ids`, all free.
    pub fn new(ids: &[u64]) -> Self {
        let words = ids.len().div_ceil(64).max(1);
        let word = |i: usize| {
            let lo = i * 64;
            let hi = ids.len().min(lo + 64);
            if hi <= lo {
                0
            } else if hi - lo == 64 {
                !0
            } else {
                (1u64 << (hi - lo)) - 1
            }
        };
        Self {
            members: (0..words).map(|i| AtomicU64::new(word(i))).collect(),
            busy: (0..words).map(|_| AtomicU64::new(0)).collect(),
            ids: ids.into(),
            loads: ids.iter().map(|_| AtomicU64::new(0)).collect(),
            cursor: AtomicUsize::new(0),
        }
    }

    /// Marks `slot` busy or free.
    pub fn set_busy(&self, slot: usize, busy: bool) {
        let mask = 1u64 << (slot % 64);
        if busy {
            self.busy[slot / 64].fetch_or(mask, Ordering::Release);
        } else {
            self.busy[slot / 64].fetch_and(!mask, Ordering::Release);
        }
    }

    /// Sets the load the power-of-two pick compares.
    pub fn set_load(&self, slot: usize, load: u64) {
        self.loads[slot].store(load, Ordering::Relaxed);
    }

    /// The bare bit test.
    #[inline]
    pub fn is_busy(&self, slot: usize) -> bool {
        self.busy[slot / 64].load(Ordering::Acquire) >> (slot % 64) & 1 == 1
    }

    #[inline]
    fn eligible(&self, w: usize) -> u64 {
        self.members[w].load(Ordering::Acquire) & !self.busy[w].load(Ordering::Acquire)
    }

    /// First eligible slot at or after `start`, cyclically.
    #[inline]
    fn pick_from(&self, start: usize) -> Option<usize> {
        let words = self.members.len();
        let (sw, sb) = (start / 64, start % 64);
        let first = self.eligible(sw) & (!0u64 << sb);
        if first != 0 {
            return Some(sw * 64 + first.trailing_zeros() as usize);
        }
        for i in 1..=words {
            let w = if sw + i >= words {
                sw + i - words
            } else {
                sw + i
            };
            let e = self.eligible(w);
            if e != 0 {
                return Some(w * 64 + e.trailing_zeros() as usize);
            }
        }
        None
    }

    /// Round-robin: the first eligible slot at or after the cursor.
    #[inline]
    pub fn pick_round_robin(&self) -> Option<u64> {
        let mut start = self.cursor.load(Ordering::Relaxed);
        if start >= self.ids.len() {
            start = 0;
        }
        let slot = self.pick_from(start)?;
        self.cursor.store(slot + 1, Ordering::Relaxed);
        Some(self.ids[slot])
    }

    #[inline]
    fn random_slot(&self) -> Option<usize> {
        self.pick_from((rng::next() % self.ids.len() as u64) as usize)
    }

    /// The first eligible slot at or after a random slot.
    #[inline]
    pub fn pick_random(&self) -> Option<u64> {
        self.random_slot().map(|s| self.ids[s])
    }

    /// Two random picks; the less loaded wins.
    #[inline]
    pub fn pick_power_of_two(&self) -> Option<u64> {
        let a = self.random_slot()?;
        let b = self.random_slot().unwrap_or(a);
        let load = |s: usize| self.loads[s].load(Ordering::Relaxed);
        Some(self.ids[if load(b) < load(a) { b } else { a }])
    }
}

/// A bare counting gate of `limit` slots: the floor of an exact gate's
/// direct admit and release.
#[derive(Debug)]
pub struct GateFloor {
    running: AtomicU64,
    limit: u64,
}

/// A slot of a [`GateFloor`], given back on drop.
#[derive(Debug)]
pub struct FloorSlot<'a> {
    running: &'a AtomicU64,
}

impl Drop for FloorSlot<'_> {
    #[inline]
    fn drop(&mut self) {
        self.running.fetch_sub(1, Ordering::Release);
    }
}

impl GateFloor {
    /// `limit` slots, all free.
    pub fn new(limit: u64) -> Self {
        Self {
            running: AtomicU64::new(0),
            limit,
        }
    }

    /// Takes a slot if one is free: one load and one `compare_exchange`
    /// when uncontended (a lost race retries).
    #[inline]
    pub fn try_admit(&self) -> Option<FloorSlot<'_>> {
        let mut cur = self.running.load(Ordering::Relaxed);
        loop {
            if cur >= self.limit {
                return None;
            }
            match self
                .running
                .compare_exchange(cur, cur + 1, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => {
                    return Some(FloorSlot {
                        running: &self.running,
                    })
                }
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_floor_is_exact() {
        let g = GateFloor::new(2);
        let a = g.try_admit().expect("first slot");
        let _b = g.try_admit().expect("second slot");
        assert!(g.try_admit().is_none());
        drop(a);
        assert!(g.try_admit().is_some());
    }

    #[test]
    fn picks_only_free_members() {
        let ids: Vec<u64> = (100..170).collect();
        let f = BitFloor::new(&ids);
        for s in 0..70 {
            f.set_busy(s, s != 65);
        }
        for _ in 0..5 {
            assert_eq!(f.pick_round_robin(), Some(165));
            assert_eq!(f.pick_random(), Some(165));
            assert_eq!(f.pick_power_of_two(), Some(165));
        }
        assert!(f.is_busy(3) && !f.is_busy(65));
        f.set_busy(65, true);
        assert_eq!(f.pick_round_robin(), None);
    }
}
