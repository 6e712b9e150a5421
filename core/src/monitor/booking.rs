//! [`Booking`]: a routed request's KV blocks, counted in its rank's
//! `active_decode_blocks` until released, and its prompt tokens, counted in
//! the rank's `active_prefill_tokens` until its prefill is done.
//!
//! The router owns those fields (reports never carry them for a worker
//! whose router books; Dynamo 1.6.1's workers leave both nil, and its
//! frontend books them the same way). A booking adds to them and subtracts
//! from them with saturating `fetch_update`s, then registers the change
//! with the worker's combiner exactly like a report (see `rank.rs` for why
//! `Relaxed` is enough). A rank's `active_prefill_tokens` starts unreported
//! (the prefill checks skip it); the first prefill booking makes it
//! reported, from zero. A booking on a removed worker changes a rank nobody
//! reads.

use std::sync::Arc;

use super::rank::{add_saturating, sub_saturating, Worker};
use crate::load::UNREPORTED;
use crate::sync::{AtomicU64, Ordering};

/// A request's KV blocks (and prompt tokens) booked on a worker rank by the
/// router; the blocks count in that rank's `active_decode_blocks` until the
/// booking is released or dropped, the prompt tokens in its
/// `active_prefill_tokens` until [`prefill_done`](Booking::prefill_done),
/// release or drop.
#[derive(Debug)]
pub struct Booking {
    worker: Arc<Worker>,
    rank: usize,
    blocks: u64,
    prefill: u64,
}

/// Adds `n` booked prefill tokens; an unreported field starts from zero.
fn add_prefill(a: &AtomicU64, n: u64) {
    // Relaxed, as `add_saturating` (`rank.rs`). The sum stops below the
    // unreported marker.
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(if v == UNREPORTED {
            n.min(UNREPORTED - 1)
        } else {
            v.saturating_add(n).min(UNREPORTED - 1)
        })
    });
}

/// Subtracts `n` booked prefill tokens, stopping at zero; an unreported
/// field stays so.
fn sub_prefill(a: &AtomicU64, n: u64) {
    // Relaxed, as `sub_saturating` (`rank.rs`).
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        (v != UNREPORTED).then(|| v.saturating_sub(n))
    });
}

impl Booking {
    /// Books `blocks` and `prefill` prompt tokens on rank index `rank` of
    /// `worker` and re-evaluates it.
    pub(super) fn new(worker: Arc<Worker>, rank: usize, blocks: u64, prefill: u64) -> Self {
        add_saturating(&worker.ranks[rank].active_decode_blocks, blocks);
        if prefill != 0 {
            add_prefill(&worker.ranks[rank].active_prefill_tokens, prefill);
        }
        worker.reevaluate();
        Self {
            worker,
            rank,
            blocks,
            prefill,
        }
    }

    /// The request's prefill is done (its first token came): its prompt
    /// tokens stop counting in `active_prefill_tokens`; the blocks stay
    /// booked. Calling it again does nothing.
    pub fn prefill_done(&mut self) {
        if self.prefill != 0 {
            sub_prefill(
                &self.worker.ranks[self.rank].active_prefill_tokens,
                self.prefill,
            );
            self.prefill = 0;
            self.worker.reevaluate();
        }
    }

    /// Prompt tokens still booked (0 once the prefill is done).
    pub fn prefill_tokens(&self) -> u64 {
        self.prefill
    }

    /// Adds `n` generated output blocks to the booking.
    pub fn add_output_blocks(&mut self, n: u64) {
        if n == 0 || self.blocks == u64::MAX {
            return;
        }
        let n = n.min(u64::MAX - self.blocks);
        self.blocks += n;
        add_saturating(&self.worker.ranks[self.rank].active_decode_blocks, n);
        self.worker.reevaluate();
    }

    /// Blocks currently booked.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// The worker this booking is on.
    pub fn worker_id(&self) -> u64 {
        self.worker.id
    }

    /// The data-parallel rank this booking is on.
    pub fn dp_rank(&self) -> u32 {
        self.worker.dp_start + self.rank as u32
    }

    /// Frees the booked blocks and prompt tokens (same as dropping the
    /// booking).
    pub fn release(self) {}
}

impl Drop for Booking {
    fn drop(&mut self) {
        let rank = &self.worker.ranks[self.rank];
        if self.prefill != 0 {
            sub_prefill(&rank.active_prefill_tokens, self.prefill);
        }
        if self.blocks != 0 {
            sub_saturating(&rank.active_decode_blocks, self.blocks);
        }
        if self.prefill != 0 || self.blocks != 0 {
            self.worker.reevaluate();
            self.worker.model.kick_flow();
        }
    }
}
