//! The other frontends, as their messages left them, and how a message
//! moves what they add to this monitor's ranks.
//!
//! Per frontend: one entry per rank it books on ([`Shared`]: what it added
//! to the rank, on which worker), its queues, the order of its messages,
//! and whether it is `behind`: a message of it was missed, so the ranks
//! that message changed (and no later one did) may be stale until its
//! whole state arrives. A whole state replaces every entry; a change sets
//! the ranks it names, absolutely, so applying it twice or after a lost
//! one never counts a booking twice. An entry for a worker this monitor
//! does not know (yet) is kept unapplied and added once it is known
//! ([`retry`]).

use std::collections::HashMap;

use foldhash::fast::RandomState;

use super::wire::{QueueEntry, RankEntry};
use super::MAX_SHARED;
use crate::monitor::replicas::Shared;
use crate::monitor::Monitor;

/// What one frontend's bookings add, per rank.
pub(super) type Entries = HashMap<(u64, u32), Shared, RandomState>;

/// Another frontend.
pub(super) struct Peer {
    pub(super) instance: u64,
    pub(super) seq: u64,
    pub(super) last_heard: u64,
    pub(super) shared: Entries,
    /// Its queues, sorted by model.
    pub(super) queues: Vec<QueueEntry>,
    /// A message of it was missed: its whole state is awaited.
    pub(super) behind: bool,
    /// When this frontend last asked it for its whole state.
    pub(super) asked: Option<u64>,
}

impl Peer {
    pub(super) fn new(instance: u64) -> Self {
        Self {
            instance,
            seq: 0,
            last_heard: 0,
            shared: Entries::default(),
            queues: Vec::new(),
            behind: false,
            asked: None,
        }
    }

    /// Whether its whole state should be asked for at `now`: it is behind,
    /// and was not asked within `again` nanoseconds.
    pub(super) fn ask_due(&self, now: u64, again: u64) -> bool {
        self.behind && self.asked.is_none_or(|t| now.saturating_sub(t) >= again)
    }
}

/// Moves one rank from what `from` added to what `e` books (cut to
/// [`MAX_SHARED`]); what the rank then holds from the sync, `None` for
/// nothing.
fn shift(monitor: &Monitor, from: &Shared, e: &RankEntry) -> Option<Shared> {
    let to = (e.blocks.min(MAX_SHARED), e.prefill.min(MAX_SHARED));
    let now = monitor.shift_shared(e.worker_id, e.dp_rank, from, to);
    (to != (0, 0)).then(|| now.unwrap_or_else(|| Shared::unapplied(to.0, to.1)))
}

/// A whole state: every rank of `ranks` set, and every other rank of `old`
/// taken back. The last entry of a rank named twice wins.
pub(super) fn replace(monitor: &Monitor, mut old: Entries, ranks: &[RankEntry]) -> Entries {
    let mut shared = Entries::with_capacity_and_hasher(ranks.len(), RandomState::default());
    for e in ranks {
        let from = shared
            .remove(&e.key())
            .or_else(|| old.remove(&e.key()))
            .unwrap_or_default();
        if let Some(now) = shift(monitor, &from, e) {
            shared.insert(e.key(), now);
        }
    }
    unshare(monitor, old);
    shared
}

/// Changes: every rank of `ranks` set, the others untouched.
pub(super) fn apply(monitor: &Monitor, shared: &mut Entries, ranks: &[RankEntry]) {
    for e in ranks {
        let from = shared.remove(&e.key()).unwrap_or_default();
        if let Some(now) = shift(monitor, &from, e) {
            shared.insert(e.key(), now);
        }
    }
}

/// How many ranks `ranks` would add to `shared` (an upper bound: a rank
/// named twice counts twice).
pub(super) fn added(shared: &Entries, ranks: &[RankEntry]) -> usize {
    ranks
        .iter()
        .filter(|e| (e.blocks, e.prefill) != (0, 0) && !shared.contains_key(&e.key()))
        .count()
}

/// Takes what `shared` added out of every rank.
pub(super) fn unshare(monitor: &Monitor, shared: Entries) {
    for ((worker, rank), s) in shared {
        let _ = monitor.shift_shared(worker, rank, &s, (0, 0));
    }
}

/// Adds the entries not on a live worker (one unknown when they came, or
/// removed since) to the worker now registered under their id, if any.
pub(super) fn retry(monitor: &Monitor, shared: &mut Entries) {
    for (&(worker, rank), s) in shared.iter_mut().filter(|(_, s)| !s.applied()) {
        if let Some(now) = monitor.shift_shared(worker, rank, s, (s.blocks, s.prefill)) {
            *s = now;
        }
    }
}

/// Sorted by model, the last of a model named twice kept, empty ones left
/// out (as a change to empty removes one).
pub(super) fn sorted_queues(mut queues: Vec<QueueEntry>) -> Vec<QueueEntry> {
    queues.reverse();
    queues.sort_by(|a, b| a.model.cmp(&b.model)); // stable: the last first
    queues.dedup_by(|a, b| a.model == b.model);
    queues.retain(|q| (q.requests, q.tokens) != (0, 0));
    queues
}

/// Changes to the queues: each one named set, an empty one removed.
pub(super) fn merge_queues(queues: &mut Vec<QueueEntry>, changes: Vec<QueueEntry>) {
    for q in changes {
        match queues.binary_search_by(|x| x.model.cmp(&q.model)) {
            Ok(i) if q.requests == 0 && q.tokens == 0 => {
                queues.remove(i);
            }
            Ok(i) => queues[i] = q,
            Err(_) if q.requests == 0 && q.tokens == 0 => {}
            Err(i) => queues.insert(i, q),
        }
    }
}

/// How many queues `changes` would add to `queues` (an upper bound).
pub(super) fn queues_added(queues: &[QueueEntry], changes: &[QueueEntry]) -> usize {
    changes
        .iter()
        .filter(|q| {
            (q.requests, q.tokens) != (0, 0)
                && queues.binary_search_by(|x| x.model.cmp(&q.model)).is_err()
        })
        .count()
}
