//! What this frontend has told the others, and what changed since.
//!
//! A change message needs the ranks whose own bookings moved since the
//! last message. Bookings mark the ranks they change
//! (`Monitor::own_changes`), so a tick reads one flag per worker and the
//! ranks of the workers marked, and compares them with what it sent: its
//! cost grows with the changes, not with the fleet. A whole state reads
//! every rank. When workers come or go (the monitor's workers generation
//! moves), every rank sent is read again, so a rank that left is sent as
//! zero.

use std::collections::HashMap;

use foldhash::fast::RandomState;

use super::wire::{QueueEntry, RankEntry};
use crate::monitor::replicas::RankTotals;
use crate::monitor::Monitor;

/// What the messages sent so far add up to.
pub(super) struct Sent {
    /// Every rank with own bookings: (blocks, prefill tokens).
    ranks: HashMap<(u64, u32), (u64, u64), RandomState>,
    pub(super) queues: Vec<QueueEntry>,
    /// When the last message went, and the last whole state.
    pub(super) at: u64,
    pub(super) whole_at: u64,
    /// The monitor's workers generation as of the last message.
    generation: u64,
}

fn entry(t: &RankTotals) -> RankEntry {
    RankEntry {
        worker_id: t.worker_id,
        dp_rank: t.dp_rank,
        blocks: t.blocks,
        prefill: t.prefill,
    }
}

impl Sent {
    /// The whole state now, sorted, and what it adds up to; `buffer` is
    /// scratch space.
    pub(super) fn whole(
        monitor: &Monitor,
        queues: Vec<QueueEntry>,
        now: u64,
        buffer: &mut Vec<RankTotals>,
    ) -> (Vec<RankEntry>, Self) {
        let generation = monitor.workers_generation();
        // The marks are covered by the reading below.
        buffer.clear();
        monitor.own_changes(buffer);
        buffer.clear();
        monitor.own_bookings(buffer);
        let mut ranks: Vec<RankEntry> = buffer.iter().map(entry).collect();
        ranks.sort_unstable_by_key(RankEntry::key);
        let sent = Self {
            ranks: ranks
                .iter()
                .map(|e| (e.key(), (e.blocks, e.prefill)))
                .collect(),
            queues,
            at: now,
            whole_at: now,
            generation,
        };
        (ranks, sent)
    }

    /// Every rank whose own bookings differ from what was sent, with its
    /// totals now (zero for one with none left), sorted; they count as
    /// sent from here on.
    pub(super) fn changes(
        &mut self,
        monitor: &Monitor,
        buffer: &mut Vec<RankTotals>,
    ) -> Vec<RankEntry> {
        buffer.clear();
        monitor.own_changes(buffer);
        let generation = monitor.workers_generation();
        if generation != self.generation {
            self.generation = generation;
            buffer.extend(self.ranks.keys().map(|&(worker_id, dp_rank)| {
                let (blocks, prefill) = monitor.own_booked(worker_id, dp_rank);
                RankTotals {
                    worker_id,
                    dp_rank,
                    blocks,
                    prefill,
                }
            }));
        }
        let mut out = Vec::new();
        for t in buffer.iter() {
            let key = (t.worker_id, t.dp_rank);
            let now = (t.blocks, t.prefill);
            if self.ranks.get(&key).copied().unwrap_or_default() == now {
                continue;
            }
            if now == (0, 0) {
                self.ranks.remove(&key);
            } else {
                self.ranks.insert(key, now);
            }
            out.push(entry(t));
        }
        out.sort_unstable_by_key(RankEntry::key);
        out
    }
}
