//! Storage that grows in chunks that never move: an entry keeps its address
//! for the life of the storage, so readers index it without a lock while a
//! writer (under a lock) adds chunks.
//!
//! Chunk 0 holds `first` entries (a power of two), chunk `k` twice as many
//! as chunk `k - 1`, from index `first * (2^k - 1)`: 32 chunks hold every
//! `u32` index below `u32::MAX` (kept for "none") whatever the first
//! chunk's size. A chunk is allocated on
//! first use (`OnceLock`), so a reader that reaches an index always finds
//! its chunk.

use std::ops::Range;
use std::sync::OnceLock;

/// Enough chunks for every `u32` index below `u32::MAX`.
const CHUNKS: usize = 32;

/// See the module docs.
pub(super) struct Chunks<T> {
    /// Chunk 0, where nearly every index lands: reached without the
    /// `OnceLock`.
    first: Box<[T]>,
    /// Chunks 1 and on (entry 0 unused).
    chunks: [OnceLock<Box<[T]>>; CHUNKS],
    /// Entries in chunk 0: `1 << shift`.
    shift: u32,
    /// Makes a fresh entry.
    make: fn() -> T,
}

impl<T> Chunks<T> {
    /// Storage whose first chunk (allocated now) holds at least `first`
    /// entries.
    pub(super) fn new(first: usize, make: fn() -> T) -> Self {
        let shift = first.max(1).next_power_of_two().trailing_zeros().min(31);
        Self {
            first: (0..1usize << shift).map(|_| make()).collect(),
            chunks: [const { OnceLock::new() }; CHUNKS],
            shift,
            make,
        }
    }

    /// Chunk `k`, allocated on first use.
    pub(super) fn chunk(&self, k: usize) -> &[T] {
        if k == 0 {
            return &self.first;
        }
        self.chunks[k].get_or_init(|| {
            (0..1usize << (self.shift as usize + k))
                .map(|_| (self.make)())
                .collect()
        })
    }

    /// The indices chunk `k` holds (cut at `u32::MAX`).
    pub(super) fn range(&self, k: usize) -> Range<u32> {
        let start = ((1u64 << k) - 1) << self.shift;
        let end = ((1u64 << (k + 1)) - 1) << self.shift;
        let clamp = |i: u64| u32::try_from(i).unwrap_or(u32::MAX);
        clamp(start)..clamp(end)
    }

    /// The chunk and offset of index `idx`.
    #[inline]
    pub(super) fn locate(&self, idx: u32) -> (usize, usize) {
        // Chunk k starts at first * (2^k - 1): k = log2(idx / first + 1).
        let q = (u64::from(idx) >> self.shift) + 1;
        let k = (u64::BITS - 1 - q.leading_zeros()) as usize;
        let start = ((1u64 << k) - 1) << self.shift;
        (k, (u64::from(idx) - start) as usize)
    }

    /// Entry `idx` (its chunk is allocated if it was not).
    #[inline]
    pub(super) fn get(&self, idx: u32) -> &T {
        match self.first.get(idx as usize) {
            Some(entry) => entry,
            None => self.get_later(idx),
        }
    }

    #[cold]
    #[inline(never)]
    fn get_later(&self, idx: u32) -> &T {
        let (k, offset) = self.locate(idx);
        &self.chunk(k)[offset]
    }

    /// Whether chunk `k` is allocated.
    #[cfg(test)]
    pub(super) fn has(&self, k: usize) -> bool {
        k == 0 || self.chunks[k].get().is_some()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn chunks_double_and_indices_map_onto_them_in_order() {
        let c = Chunks::new(3, || 0u8); // a first chunk of 4
        assert_eq!(c.range(0), 0..4);
        assert_eq!(c.range(1), 4..12);
        assert_eq!(c.range(2), 12..28);
        for (idx, want) in [
            (0, (0, 0)),
            (3, (0, 3)),
            (4, (1, 0)),
            (11, (1, 7)),
            (12, (2, 0)),
        ] {
            assert_eq!(c.locate(idx), want);
        }
        assert!(c.has(0) && !c.has(1));
        let _ = c.get(100); // chunks of 4, 8, 16, 32, 64: the last ends at 124
        assert!(c.has(4) && !c.has(5));
        let _ = c.get(200);
        assert!(c.has(5));
        // The last index below `u32::MAX` (which callers keep for "none")
        // fits, from the smallest first chunk.
        let (k, _) = Chunks::new(1, || 0u8).locate(u32::MAX - 1);
        assert_eq!(k, CHUNKS - 1);
    }
}
