//! What booking sync between frontend replicas (`cluster::replicas`) reads
//! and writes in a monitor: every rank's router-side totals, the other
//! frontends' bookings added to them, and each flow-controlled model's
//! queue totals.
//!
//! The other frontends' bookings go into the same router-owned fields as
//! this frontend's own (`active_decode_blocks`, `active_prefill_tokens`),
//! so the busy rule, routing and metrics see one total with no change on
//! their paths. What the sync publishes is each rank's own bookings,
//! counted apart by the bookings themselves (`Rank::own_blocks`,
//! `own_prefill`): a report that overwrites the router fields, or the
//! others' bookings in them, never reach it. The sync remembers what it
//! added per rank ([`Shared`]), with the worker it was added to: a worker
//! removed and registered again starts from its own bookings, and nothing
//! the old one held is taken from the new one.
//!
//! In leased mode the sync also reads how much of its share this frontend
//! uses and sets the share (`share.rs`).

use std::sync::{Arc, Weak};

use super::booking::{shift, Owner};
use super::rank::Worker;
use super::share::WHOLE;
use super::Monitor;
use crate::sync::{fence, Ordering};

/// This monitor's own bookings on one rank.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RankTotals {
    pub(crate) worker_id: u64,
    pub(crate) dp_rank: u32,
    /// Booked KV blocks.
    pub(crate) blocks: u64,
    /// Booked prefill tokens.
    pub(crate) prefill: u64,
}

/// Bookings the sync added to one rank: blocks and prefill tokens, on the
/// worker they were added to.
#[derive(Debug, Clone, Default)]
pub(crate) struct Shared {
    pub(crate) blocks: u64,
    pub(crate) prefill: u64,
    worker: Weak<Worker>,
}

impl Shared {
    /// What another frontend books on a rank this monitor does not hold
    /// (yet): kept, and added once the worker is known.
    pub(crate) fn unapplied(blocks: u64, prefill: u64) -> Self {
        Self {
            blocks,
            prefill,
            worker: Weak::new(),
        }
    }

    /// Whether it is on a worker still alive (not one unknown, or removed
    /// since).
    pub(crate) fn applied(&self) -> bool {
        self.worker.strong_count() > 0
    }
}

/// One flow-controlled model's queue: requests and estimated tokens
/// waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueTotals {
    pub(crate) model: String,
    pub(crate) requests: u32,
    pub(crate) tokens: u64,
}

impl Monitor {
    /// Appends this monitor's own bookings on every rank that has any to
    /// `out`.
    pub(crate) fn own_bookings(&self, out: &mut Vec<RankTotals>) {
        let reg = self.registry.load();
        for worker in reg.workers.values() {
            for (i, rank) in worker.ranks.iter().enumerate() {
                // Relaxed: a snapshot of counters, ordered by nothing.
                let blocks = rank.own_blocks.load(Ordering::Relaxed);
                let prefill = rank.own_prefill.load(Ordering::Relaxed);
                if blocks != 0 || prefill != 0 {
                    out.push(RankTotals {
                        worker_id: worker.id,
                        dp_rank: worker.dp_start + i as u32,
                        blocks,
                        prefill,
                    });
                }
            }
        }
    }

    /// From now on bookings mark the ranks whose own bookings they
    /// change, for [`own_changes`](Self::own_changes).
    pub(crate) fn track_own_changes(&self) {
        self.share.track_changes();
    }

    /// Appends to `out` the own bookings (zero included) of every rank of
    /// every worker whose own bookings changed since the last call, and
    /// clears their marks: the pairing is in `Worker::mark_own_changed`.
    /// Reads one flag per worker, and the ranks of the workers marked.
    pub(crate) fn own_changes(&self, out: &mut Vec<RankTotals>) {
        let reg = self.registry.load();
        for worker in reg.workers.values() {
            // Relaxed: a look before the swap that orders.
            if !worker.own_changed.load(Ordering::Relaxed)
                || !worker.own_changed.swap(false, Ordering::AcqRel)
            {
                continue;
            }
            fence(Ordering::SeqCst);
            for (i, rank) in worker.ranks.iter().enumerate() {
                out.push(RankTotals {
                    worker_id: worker.id,
                    dp_rank: worker.dp_start + i as u32,
                    // Relaxed: after the fence (above).
                    blocks: rank.own_blocks.load(Ordering::Relaxed),
                    prefill: rank.own_prefill.load(Ordering::Relaxed),
                });
            }
        }
    }

    /// This monitor's own bookings on rank `dp_rank` of `worker_id` now
    /// ((0, 0) for a worker or rank it does not hold).
    pub(crate) fn own_booked(&self, worker_id: u64, dp_rank: u32) -> (u64, u64) {
        let reg = self.registry.load();
        let Some(worker) = reg.workers.get(&worker_id) else {
            return (0, 0);
        };
        match worker.rank(dp_rank) {
            // Relaxed: a snapshot of counters, as `own_bookings`.
            Ok(r) => (
                r.own_blocks.load(Ordering::Relaxed),
                r.own_prefill.load(Ordering::Relaxed),
            ),
            Err(_) => (0, 0),
        }
    }

    /// The generation of the set of workers and models: one more after any
    /// worker is added or removed.
    pub(crate) fn workers_generation(&self) -> u64 {
        self.registry.load().generation
    }

    /// Moves what the sync added to rank `dp_rank` of `worker_id` from
    /// `from` to `to` (blocks, prefill tokens); what it returns is what the
    /// rank then holds from the sync. Nothing is added to a worker this
    /// monitor does not know, or to an undeclared rank: the result is then
    /// `None`.
    pub(crate) fn shift_shared(
        &self,
        worker_id: u64,
        dp_rank: u32,
        from: &Shared,
        to: (u64, u64),
    ) -> Option<Shared> {
        let reg = self.registry.load();
        let worker = reg.workers.get(&worker_id)?;
        let i = dp_rank.checked_sub(worker.dp_start)? as usize;
        if i >= worker.ranks.len() {
            return None;
        }
        let held = if from.worker.ptr_eq(&Arc::downgrade(worker)) {
            (from.blocks, from.prefill)
        } else {
            (0, 0)
        };
        shift(worker, i, Owner::Shared, held, to);
        Some(Shared {
            blocks: to.0,
            prefill: to.1,
            worker: Arc::downgrade(worker),
        })
    }

    /// The most of any rank's line that this monitor's own bookings hold,
    /// in parts per million rounded up (a million for bookings on a rank
    /// whose line is unknown).
    pub(crate) fn share_usage(&self) -> u32 {
        let reg = self.registry.load();
        let mut most = 0u32;
        for worker in reg.workers.values() {
            let t = worker.model.thresholds.load();
            for rank in worker.ranks.iter() {
                // SeqCst: the sync's read after its store (`share.rs`).
                let own = rank.own_blocks.load(Ordering::SeqCst);
                if own == 0 {
                    continue;
                }
                let line = u128::from(rank.line(&t));
                let ppm = if line == 0 {
                    WHOLE
                } else {
                    (u128::from(own) * u128::from(WHOLE))
                        .div_ceil(line)
                        .min(u128::from(WHOLE)) as u32
                };
                most = most.max(ppm);
            }
        }
        most
    }

    /// Sets this frontend's leased share to `used` parts per million until
    /// clock time `deadline`, and returns what its own bookings hold once
    /// it is set (`share_usage`): a booking that raced the change either
    /// fits the new share or is counted there (`share.rs`, "Orderings").
    /// Every worker is re-evaluated when the share changed, and the queues
    /// are kicked when it grew.
    pub(crate) fn apply_share(&self, used: u32, deadline: u64) -> u32 {
        let before = self.share.used();
        self.share.set(used, deadline);
        let usage = self.share_usage();
        if before != Some(used) {
            let reg = self.registry.load();
            for worker in reg.workers.values() {
                worker.reevaluate_and_wait();
            }
            if before.is_none_or(|b| used > b) {
                for model in reg.models.values() {
                    model.kick_flow();
                }
            }
        }
        usage
    }

    /// Leaves leased mode (its booking sync is gone): bookings are no
    /// longer capped; every worker is re-evaluated and the queues kicked.
    pub(crate) fn leave_share(&self) {
        if self.share.used().is_none() {
            return;
        }
        self.share.leave();
        let reg = self.registry.load();
        for worker in reg.workers.values() {
            worker.reevaluate_and_wait();
        }
        for model in reg.models.values() {
            model.kick_flow();
        }
    }

    /// Every flow-controlled model's queue totals.
    pub(crate) fn queue_totals(&self) -> Vec<QueueTotals> {
        self.flows
            .load()
            .iter()
            .map(|(model, flow)| {
                let (requests, tokens) = flow.totals();
                QueueTotals {
                    model: model.to_string(),
                    requests,
                    tokens: u64::try_from(tokens).unwrap_or(u64::MAX),
                }
            })
            .collect()
    }
}

/// Loom model of what booking sync does to a rank beside the frontend's
/// own traffic: a peer's change (and its undoing) applied while a request
/// books and releases on the same rank. What a tick reads as this
/// frontend's own never holds the peer's blocks, and the counters and the
/// busy bit end exact whatever the interleaving.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::{MonitorConfig, ThresholdUpdate, WorkerSpec};
    use loom::sync::Arc;

    #[test]
    fn a_peers_change_beside_a_booking_keeps_own_and_shared_apart() {
        loom::model(|| {
            let m = Monitor::with_config(MonitorConfig::default(), ManualClock::new()).unwrap();
            let spec = WorkerSpec {
                kv_total_blocks: Some(100),
                ..Default::default()
            };
            m.add_worker("m", 1, spec).unwrap();
            let line = ThresholdUpdate {
                active_decode_blocks_threshold: Some(0.5),
                ..Default::default()
            };
            m.set_thresholds("m", &line).unwrap();
            let m = Arc::new(m);
            let front = m.clone();
            let request = loom::thread::spawn(move || {
                let held = front.book(1, 0, 30).unwrap();
                drop(front.book(1, 0, 5).unwrap());
                held
            });
            // The sync: a peer's 25 blocks, then what a tick reads, then
            // the peer's release.
            let shared = m.shift_shared(1, 0, &Shared::default(), (25, 0)).unwrap();
            let mut own = Vec::new();
            m.own_bookings(&mut own);
            let blocks: Vec<u64> = own.iter().map(|t| t.blocks).collect();
            assert!(
                [&[][..], &[30], &[35]].contains(&blocks.as_slice()),
                "a tick read {blocks:?}"
            );
            m.shift_shared(1, 0, &shared, (0, 0)).unwrap();
            let held = request.join().unwrap();
            let load = m.rank_load(1, 0).unwrap();
            assert_eq!(load.active_decode_blocks, 30);
            assert!(!m.is_busy(1).unwrap(), "30 of a line of 50");
            drop(held);
            assert_eq!(m.rank_load(1, 0).unwrap().active_decode_blocks, 0);
        });
    }

    /// The marks by which a tick reads only the workers whose own bookings
    /// changed (`Worker::mark_own_changed`): a booking racing a tick is
    /// read by that tick or marked for the next, so the last totals read
    /// are the rank's. Without the fences the model finds the change that
    /// neither reads.
    #[test]
    fn a_booking_racing_a_tick_is_read_by_it_or_by_the_next() {
        loom::model(|| {
            let m = Monitor::with_config(MonitorConfig::default(), ManualClock::new()).unwrap();
            let spec = WorkerSpec {
                dp_size: 2,
                kv_total_blocks: Some(100),
                ..Default::default()
            };
            m.add_worker("m", 1, spec).unwrap();
            m.track_own_changes();
            let early = m.book(1, 1, 7).unwrap();
            let m = Arc::new(m);
            let front = m.clone();
            let request = loom::thread::spawn(move || front.book(1, 0, 30).unwrap());
            let mut read = std::collections::HashMap::new();
            let mut tick = |read: &mut std::collections::HashMap<u32, u64>| {
                let mut out = Vec::new();
                m.own_changes(&mut out);
                for t in out {
                    read.insert(t.dp_rank, t.blocks);
                }
            };
            tick(&mut read);
            let held = request.join().unwrap();
            tick(&mut read);
            assert_eq!(read.get(&0), Some(&30), "rank 0's booking never read");
            assert_eq!(read.get(&1), Some(&7));
            drop((held, early));
        });
    }
}
