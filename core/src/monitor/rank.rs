//! The load table: one [`Rank`] of atomics per declared data-parallel rank,
//! and the [`Worker`] that owns them and publishes its busy bit.
//!
//! # Algorithm
//!
//! Each load field is one `AtomicU64` with a single source: reports write
//! the fields they carry, [`Booking`](super::Booking)s add to and subtract
//! from `active_decode_blocks`, the sweep writes the staleness flags. A
//! writer stores its field, then registers the change with the worker's
//! [`Combiner`]; the combiner's publisher re-reads every rank, applies the
//! busy rule ([`Thresholds::rank_busy`]; all ranks busy ⇒ worker busy) and
//! flips the worker's bit in the model's busy set if the answer changed.
//!
//! # Orderings
//!
//! Every field access here is `Relaxed`: the combiner's registration
//! (`fetch_add(AcqRel)` in [`Combiner::run`]) is the release that carries a
//! writer's stores to whichever thread publishes, and only one thread
//! publishes at a time. The busy set itself orders what routers read.
//!
//! [`Thresholds::rank_busy`]: crate::Thresholds::rank_busy

use std::sync::Arc;

use super::combine::Combiner;
use super::config::Staleness;
use super::model::Model;
use super::observe::{RankSlo, SloMode};
use crate::error::ReportError;
use crate::load::{rank_index, LoadReport, WorkerSpec, UNREPORTED};
use crate::sync::{fence, AtomicBool, AtomicU64, Ordering};
use crate::thresholds::{RankLoad, DEFAULT_MAX_NUM_BATCHED_TOKENS};

/// The load fields of one rank; each field is written by its own source.
#[derive(Debug)]
pub(super) struct Rank {
    pub(super) active_decode_blocks: AtomicU64,
    kv_used_blocks: AtomicU64,
    kv_total_blocks: AtomicU64,
    pub(super) active_prefill_tokens: AtomicU64,
    max_num_batched_tokens: AtomicU64,
    /// `UNREPORTED` until the first report that carries it.
    waiting_requests: AtomicU64,
    /// Set by every report; cleared by the staleness sweep.
    pub(super) seen: AtomicBool,
    /// Whether the sweep found this rank silent for `stale_after`.
    pub(super) stale: AtomicBool,
    /// Clock time of the sweep that last saw a report (or of the add).
    pub(super) last_seen: AtomicU64,
    /// This monitor's own bookings on the rank, blocks and prefill tokens:
    /// what booking sync publishes (`replicas.rs`). Only bookings write
    /// them; reports and the other frontends' snapshots never do.
    pub(super) own_blocks: AtomicU64,
    pub(super) own_prefill: AtomicU64,
    /// Its bookings' count, step-time fit and predictions (`slo.rs`).
    pub(super) slo: RankSlo,
}

impl Rank {
    pub(super) fn new(spec: &WorkerSpec, now: u64) -> Self {
        Self {
            active_decode_blocks: AtomicU64::new(0),
            kv_used_blocks: AtomicU64::new(0),
            kv_total_blocks: AtomicU64::new(spec.kv_total_blocks.unwrap_or(0)),
            active_prefill_tokens: AtomicU64::new(UNREPORTED),
            max_num_batched_tokens: AtomicU64::new(
                spec.max_num_batched_tokens
                    .unwrap_or(DEFAULT_MAX_NUM_BATCHED_TOKENS),
            ),
            waiting_requests: AtomicU64::new(UNREPORTED),
            seen: AtomicBool::new(false),
            stale: AtomicBool::new(false),
            last_seen: AtomicU64::new(now),
            own_blocks: AtomicU64::new(0),
            own_prefill: AtomicU64::new(0),
            slo: RankSlo::new(spec.max_num_seqs.unwrap_or(0)),
        }
    }

    /// The rank's line under thresholds `t` (`Thresholds::decode_line`).
    #[inline]
    pub(super) fn line(&self, t: &crate::thresholds::Thresholds) -> u64 {
        // Relaxed: as `load`.
        t.decode_line(self.kv_total_blocks.load(Ordering::Relaxed))
    }

    /// The rank's latest load. Relaxed loads: the publisher's combiner
    /// registration already made the inputs visible (module docs); metrics
    /// and `rank_load` read a value that may be a moment old.
    #[inline]
    pub(super) fn load(&self) -> RankLoad {
        let prefill = self.active_prefill_tokens.load(Ordering::Relaxed);
        let waiting = self.waiting_requests.load(Ordering::Relaxed);
        RankLoad {
            active_decode_blocks: self.active_decode_blocks.load(Ordering::Relaxed),
            kv_used_blocks: self.kv_used_blocks.load(Ordering::Relaxed),
            kv_total_blocks: self.kv_total_blocks.load(Ordering::Relaxed),
            active_prefill_tokens: (prefill != UNREPORTED).then_some(prefill),
            max_num_batched_tokens: self.max_num_batched_tokens.load(Ordering::Relaxed),
            waiting_requests: (waiting != UNREPORTED).then_some(waiting),
        }
    }

    /// Stores the fields `r` carries. Relaxed stores: the caller registers
    /// with the worker's combiner next, which releases them (module docs).
    #[inline]
    pub(super) fn apply(&self, r: &LoadReport) {
        let store = |field: &AtomicU64, v: Option<u64>| {
            if let Some(v) = v {
                field.store(v, Ordering::Relaxed);
            }
        };
        store(&self.active_decode_blocks, r.active_decode_blocks);
        store(&self.kv_used_blocks, r.kv_used_blocks);
        store(&self.kv_total_blocks, r.kv_total_blocks);
        store(&self.active_prefill_tokens, r.active_prefill_tokens);
        store(&self.max_num_batched_tokens, r.max_num_batched_tokens);
        store(&self.waiting_requests, r.waiting_requests);
        store(&self.slo.engine_seats, r.max_num_seqs);
        // Relaxed: `seen` is a flag for the next sweep, which orders nothing
        // by it; a report racing the sweep is seen by the one after.
        self.seen.store(true, Ordering::Relaxed);
        // Relaxed: an input of the SLO's seats, released by the combiner.
        self.slo.reported.store(true, Ordering::Relaxed);
        // Relaxed: an input of the busy rule, released by the combiner.
        if self.stale.load(Ordering::Relaxed) {
            self.stale.store(false, Ordering::Relaxed);
        }
    }
}

/// The SLO load's fixed point in a worker's routing load (`publish`).
const PRESSURE_SCALE: f64 = 1e6;

/// One registered worker.
#[derive(Debug)]
pub(super) struct Worker {
    pub(super) id: u64,
    pub(super) model: Arc<Model>,
    pub(super) slot: usize,
    pub(super) dp_start: u32,
    pub(super) ranks: Box<[Rank]>,
    pub(super) combiner: Combiner,
    /// Busy state as last published (written only by the publisher).
    pub(super) busy: AtomicBool,
    /// Set once by `remove_worker`; a removed worker publishes nothing.
    pub(super) removed: AtomicBool,
    /// The own bookings of some rank changed since booking sync last read
    /// them (`mark_own_changed`).
    pub(super) own_changed: AtomicBool,
}

impl Worker {
    #[inline]
    pub(super) fn rank(&self, dp_rank: u32) -> Result<&Rank, ReportError> {
        let i = rank_index(self.id, self.dp_start, self.ranks.len() as u32, dp_rank)?;
        Ok(&self.ranks[i as usize])
    }

    /// Recomputes the busy bit from the latest inputs; runs only inside the
    /// worker's combiner, so only one thread at a time publishes.
    fn publish(&self) {
        let model = &*self.model;
        // Relaxed: stored before `remove_worker`'s combiner registration,
        // which releases it to this publisher.
        let busy = if self.removed.load(Ordering::Relaxed) {
            model.slo.verdicts.clear(self.slot);
            false
        } else {
            let thresholds = model.thresholds.load();
            let staleness = model.staleness();
            let slo = model.slo.targets();
            let mut all_busy = !self.ranks.is_empty();
            // Whether the SLO's verdict is busy on every rank (`slo.rs`).
            let mut slo_busy = all_busy;
            let mut load = 0u64;
            // The least SLO load of its ranks, enforced: what routing
            // compares instead (the most slack).
            let mut pressure = f64::INFINITY;
            for rank in self.ranks.iter() {
                let l = rank.load();
                load = load.saturating_add(l.load_score());
                // Relaxed: an input, released by the combiner (module docs).
                let rank_busy = match (staleness, rank.stale.load(Ordering::Relaxed)) {
                    (Staleness::Free, true) => false,
                    (Staleness::Busy, true) => true,
                    _ => {
                        let fixed = thresholds.rank_busy(&l) || self.share_full(rank, &thresholds);
                        match &slo {
                            Some(t) => {
                                let v = super::predict::verdict(
                                    &rank.slo,
                                    &l,
                                    t,
                                    &model.slo.observations,
                                );
                                slo_busy &= v;
                                pressure = pressure.min(rank.slo.pressure());
                                fixed || (v && t.mode == SloMode::Enforce)
                            }
                            None => fixed,
                        }
                    }
                };
                all_busy &= rank_busy;
            }
            if slo.is_some() && slo_busy != model.slo.verdicts.contains(self.slot) {
                if slo_busy {
                    model.slo.verdicts.set(self.slot);
                } else {
                    model.slo.verdicts.clear(self.slot);
                }
            }
            if slo.is_some_and(|t| t.mode == SloMode::Enforce) {
                load = (pressure * PRESSURE_SCALE) as u64;
            }
            // Relaxed: a hint power-of-two routing compares; a value a
            // moment old only skews one choice between two free workers.
            model.load[self.slot].store(load, Ordering::Relaxed);
            all_busy
        };
        // Relaxed: only publishers touch `busy`, and successive publishers
        // are ordered by the combiner's AcqRel exchange.
        if busy != self.busy.load(Ordering::Relaxed) {
            self.busy.store(busy, Ordering::Relaxed);
            // Relaxed `busy_workers`: a count for metrics and for the
            // mostly-free heuristic, whose every probe is re-checked.
            if busy {
                model.busy.insert(self.slot);
                model.busy_workers.fetch_add(1, Ordering::Relaxed);
            } else {
                model.busy.remove(self.slot);
                model.busy_workers.fetch_sub(1, Ordering::Relaxed);
            }
        }
        // Published free: capacity may have appeared for the model's queue
        // (`flow/mod.rs`, "Protocol"). Only the publisher knows the result,
        // so the kick is made here, whichever change led to it.
        if !busy {
            model.kick_flow();
        }
    }

    /// The least loaded rank index (`RankLoad::load_score`; with an
    /// enforced SLO, the one with the most slack), where a request sent to
    /// this worker is booked.
    pub(super) fn least_loaded_rank(&self) -> usize {
        let ranks = 0..self.ranks.len();
        let least = if self.model.slo.mode() == Some(SloMode::Enforce) {
            ranks.min_by(|&a, &b| {
                let p = |i: usize| self.ranks[i].slo.pressure();
                p(a).total_cmp(&p(b))
            })
        } else {
            ranks.min_by_key(|&i| self.ranks[i].load().load_score())
        };
        least.unwrap_or(0)
    }

    /// Whether this frontend's own bookings fill its leased share of `rank`
    /// (`share.rs`; never out of leased mode).
    #[inline]
    fn share_full(&self, rank: &Rank, t: &crate::thresholds::Thresholds) -> bool {
        self.model
            .share
            .busy_cap(|| rank.line(t))
            .is_some_and(|cap| {
                // Relaxed: an input, released by the combiner (module docs).
                rank.own_blocks.load(Ordering::Relaxed) >= cap
            })
    }

    /// Marks the worker's own bookings changed, after a rank's counters
    /// moved, for booking sync's next read (`Monitor::own_changes`).
    ///
    /// The store-buffering pairing of `share.rs`: here the counters are
    /// written, then a `SeqCst` fence, then the mark read; the reader
    /// clears the mark, then a `SeqCst` fence, then reads the counters. So
    /// either the reader that cleared the mark reads this change, or this
    /// sees the mark cleared and sets it again (release) for the next
    /// reader, whose clearing swap (acquire) then sees the counters. The
    /// loom model in `monitor/replicas.rs` fails without the fences. Costs
    /// one relaxed load when no sync reads the marks.
    #[inline]
    pub(super) fn mark_own_changed(&self) {
        // A change racing the switch-on is read at the latest by the
        // sync's next whole state (`snapshot_every`).
        if !self.model.share.changes_tracked() {
            return;
        }
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence; the store releases the counters.
        if !self.own_changed.load(Ordering::Relaxed) {
            self.own_changed.store(true, Ordering::Release);
        }
    }

    /// Registers a change and returns; some thread publishes it.
    #[inline]
    pub(super) fn reevaluate(&self) {
        self.combiner.run(|| self.publish());
    }

    /// Registers a change and returns once a publication covering it landed.
    pub(super) fn reevaluate_and_wait(&self) {
        self.combiner.run_and_wait(|| self.publish());
    }
}

/// Adds to a counter, saturating. Relaxed: the caller
/// registers with the worker's combiner next, which releases the new value.
#[inline]
pub(super) fn add_saturating(a: &AtomicU64, n: u64) {
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_add(n))
    });
}

/// Subtracts from a counter, stopping at zero (a report may have lowered
/// it). Relaxed, as in [`add_saturating`].
#[inline]
pub(super) fn sub_saturating(a: &AtomicU64, n: u64) {
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(n))
    });
}
