//! [`Booking`]: a routed request's KV blocks, counted in its rank's
//! `active_decode_blocks` until released.
//!
//! The router owns that field (reports never carry it for a worker whose
//! router books). A booking adds to it and subtracts from it with
//! saturating `fetch_update`s, then registers the change with the worker's
//! combiner exactly like a report (see `rank.rs` for why `Relaxed` is
//! enough). A booking on a removed worker changes a rank nobody reads.

use std::sync::Arc;

use super::rank::{add_saturating, sub_saturating, Worker};

/// A request's KV blocks booked on a worker rank by the router; counted in
/// that rank's `active_decode_blocks` until released or dropped.
#[derive(Debug)]
pub struct Booking {
    worker: Arc<Worker>,
    rank: usize,
    blocks: u64,
}

impl Booking {
    /// Books `blocks` on rank index `rank` of `worker` and re-evaluates it.
    pub(super) fn new(worker: Arc<Worker>, rank: usize, blocks: u64) -> Self {
        add_saturating(&worker.ranks[rank].active_decode_blocks, blocks);
        worker.reevaluate();
        Self {
            worker,
            rank,
            blocks,
        }
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

    /// Frees the booked blocks (same as dropping the booking).
    pub fn release(self) {}
}

impl Drop for Booking {
    fn drop(&mut self) {
        if self.blocks != 0 {
            sub_saturating(
                &self.worker.ranks[self.rank].active_decode_blocks,
                self.blocks,
            );
            self.worker.reevaluate();
        }
    }
}
