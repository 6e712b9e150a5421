//! A model's slots and bitsets: membership, the busy set, overload leases,
//! the hot copy of its thresholds and its rejection counters.
//!
//! # Layout
//!
//! Each worker of a model holds a dense slot `s` below the model's capacity
//! (`Limits::max_workers_per_model`). Three bitsets share one layout, bit
//! `s % 64` of word `s / 64`:
//!
//! * `members`: the slot holds a registered worker;
//! * `busy` ([`BusySet`]): the worker is busy by the thresholds;
//! * `leased`: the worker refused with "Server overloaded" and is skipped
//!   until `lease_deadline[s]` (clock nanoseconds) or its next free report.
//!
//! A worker is *eligible* when `members & !busy & !leased` (a lease past its
//! deadline is ended by the reader that finds it). Per-slot arrays hold the
//! worker id (`ids`), the load power-of-two compares (`load`) and the lease
//! deadline. `words_in_use` bounds the words a router scans.
//!
//! # Orderings
//!
//! A slot's data is stored `Relaxed` and then published by setting its bit
//! (`fetch_or(AcqRel)` in `AtomicBits::set`); routers read a bitset word
//! with `Acquire` before reading the slot's data, so the id of a member and
//! the deadline of a lease are visible once the bit is. `members_epoch` is
//! bumped with `Release` after every membership change and read with
//! `Acquire` in [`Model::stamp`], like the busy set's epoch. Counters
//! (`workers`, `busy_workers`, `leases_out`, rejections) are `Relaxed`: they
//! feed metrics and fast-path hints, never the answer itself.

use std::collections::BTreeSet;
use std::sync::Arc;

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;

use super::busy_set::{AtomicBits, BitIter, BusySet};
use super::config::{MonitorConfig, Policy, Staleness, ThresholdState};
use super::observe::{ModelSlo, Observations, SloMode};
use super::outbox::Outbox;
use super::pick_cache::{PickCache, Stamp};
use super::share::Share;
use super::signal::Signal;
use crate::clock::{nanos, SharedClock};
use crate::error::{Reason, RouteError};
use crate::sync::{lock, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Mutex, Ordering};
use crate::thresholds::Thresholds;

/// Thresholds as the hot path reads them: one atomic per field. A `None`
/// decode or fraction is stored as NaN bits; a `None` absolute or
/// waiting-requests threshold as `u64::MAX`, which never trips
/// (`tokens > u64::MAX` is impossible).
/// Readers may see a mix of old and new fields while an update lands; the
/// update re-evaluates every worker afterwards, so no mix survives it. That
/// re-evaluation's combiner registration releases the stores, so every
/// access here is `Relaxed`.
#[derive(Debug)]
pub(super) struct HotThresholds {
    decode: AtomicU64,
    prefill: AtomicU64,
    prefill_frac: AtomicU64,
    waiting: AtomicU64,
}

impl HotThresholds {
    fn new() -> Self {
        let none = f64::NAN.to_bits();
        Self {
            decode: AtomicU64::new(none),
            prefill: AtomicU64::new(u64::MAX),
            prefill_frac: AtomicU64::new(none),
            waiting: AtomicU64::new(u64::MAX),
        }
    }

    pub(super) fn store(&self, t: &Thresholds) {
        let bits = |v: Option<f64>| v.unwrap_or(f64::NAN).to_bits();
        self.decode
            .store(bits(t.active_decode_blocks_threshold), Ordering::Relaxed);
        self.prefill.store(
            t.active_prefill_tokens_threshold.unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.prefill_frac.store(
            bits(t.active_prefill_tokens_threshold_frac),
            Ordering::Relaxed,
        );
        self.waiting.store(
            t.waiting_requests_threshold.unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    #[inline]
    pub(super) fn load(&self) -> Thresholds {
        let float =
            |a: &AtomicU64| Some(f64::from_bits(a.load(Ordering::Relaxed))).filter(|v| !v.is_nan());
        let prefill = self.prefill.load(Ordering::Relaxed);
        let waiting = self.waiting.load(Ordering::Relaxed);
        Thresholds {
            active_decode_blocks_threshold: float(&self.decode),
            active_prefill_tokens_threshold: (prefill != u64::MAX).then_some(prefill),
            active_prefill_tokens_threshold_frac: float(&self.prefill_frac),
            waiting_requests_threshold: (waiting != u64::MAX).then_some(waiting),
        }
    }
}

/// Rejection counter for one `(model, endpoint)` pair.
#[derive(Debug)]
pub(super) struct EndpointCounter {
    pub(super) endpoint: Box<str>,
    pub(super) count: AtomicU64,
}

/// Cold-path state of a model, behind its mutex.
#[derive(Debug)]
pub(super) struct ModelCold {
    /// Slots freed by removed workers, reused lowest first.
    pub(super) free: BTreeSet<usize>,
    /// Slots never used yet start here.
    pub(super) next: usize,
    pub(super) thresholds: ThresholdState,
}

/// A model's slots, bitsets and counters (see the module docs).
#[derive(Debug)]
pub(super) struct Model {
    pub(super) name: Box<str>,
    pub(super) members: AtomicBits,
    pub(super) busy: BusySet,
    /// Bumped after every change to `members`.
    pub(super) members_epoch: AtomicU64,
    /// The free workers listed at the current epochs, for uniform picks
    /// when most workers are busy.
    pub(super) free_list: PickCache,
    pub(super) leased: AtomicBits,
    pub(super) ids: Box<[AtomicU64]>,
    pub(super) load: Box<[AtomicU64]>,
    pub(super) lease_deadline: Box<[AtomicU64]>,
    pub(super) leases_out: AtomicUsize,
    pub(super) words_in_use: AtomicUsize,
    pub(super) cursor: CachePadded<AtomicUsize>,
    pub(super) workers: AtomicUsize,
    pub(super) busy_workers: AtomicUsize,
    pub(super) thresholds: HotThresholds,
    pub(super) staleness: AtomicU64,
    pub(super) stale_after: AtomicU64,
    pub(super) endpoints: ArcSwap<Vec<Arc<EndpointCounter>>>,
    pub(super) rejected: [AtomicU64; 3],
    pub(super) cold: Mutex<ModelCold>,
    /// Whether flow control is on, so that a kick costs one plain load
    /// without it (the queue itself is the monitor's, `flow/mod.rs`).
    pub(super) flow_on: AtomicBool,
    /// Requests waiting in its queue: what a kick reads.
    pub(super) flow_waiting: AtomicU32,
    /// Kicked since the maintenance last ran its queue's loop.
    pub(super) flow_kicked: AtomicBool,
    /// The monitor's maintenance, which runs the loop (`signal.rs`).
    pub(super) signal: Arc<Signal>,
    /// The monitor's leased share (`share.rs`).
    pub(super) share: Arc<Share>,
    /// The monitor's own-booking events (`outbox.rs`).
    pub(super) outbox: Arc<Outbox>,
    /// Its SLO and what its requests taught it (`slo.rs`).
    pub(super) slo: ModelSlo,
}

/// Indices into `Model::rejected`.
pub(super) const REJECTED_REASONS: [Reason; 3] = [
    Reason::AllWorkersBusy,
    Reason::WorkerOverloaded,
    Reason::NoWorkers,
];

impl Model {
    pub(super) fn new(
        name: &str,
        config: &MonitorConfig,
        share: &Arc<Share>,
        (outbox, observations): (&Arc<Outbox>, &Arc<Observations>),
        signal: &Arc<Signal>,
    ) -> Self {
        let cap = config.limits.max_workers_per_model;
        let atomics = || (0..cap).map(|_| AtomicU64::new(0)).collect::<Box<[_]>>();
        Self {
            name: name.into(),
            members: AtomicBits::new(cap),
            busy: BusySet::new(cap),
            members_epoch: AtomicU64::new(0),
            free_list: PickCache::new(cap),
            leased: AtomicBits::new(cap),
            ids: atomics(),
            load: atomics(),
            lease_deadline: atomics(),
            leases_out: AtomicUsize::new(0),
            words_in_use: AtomicUsize::new(1),
            cursor: CachePadded::new(AtomicUsize::new(0)),
            workers: AtomicUsize::new(0),
            busy_workers: AtomicUsize::new(0),
            thresholds: HotThresholds::new(),
            staleness: AtomicU64::new(config.staleness.to_u64()),
            stale_after: AtomicU64::new(nanos(config.stale_after)),
            endpoints: ArcSwap::from_pointee(Vec::new()),
            rejected: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
            cold: Mutex::new(ModelCold {
                free: BTreeSet::new(),
                next: 0,
                thresholds: ThresholdState::default(),
            }),
            flow_on: AtomicBool::new(false),
            flow_waiting: AtomicU32::new(0),
            flow_kicked: AtomicBool::new(false),
            signal: Arc::clone(signal),
            share: share.clone(),
            outbox: outbox.clone(),
            slo: ModelSlo::new(observations, cap),
        }
    }

    /// Capacity may have appeared: kicks the model's queue (`flow/mod.rs`,
    /// "Protocol"): if requests wait, marks it and raises the maintenance's
    /// signal. Without flow control, one load; with it and nothing
    /// waiting, a fence and a load. Never a lock, never host code.
    #[inline]
    pub(super) fn kick_flow(&self) {
        // Relaxed: a setting; see `flow/mod.rs`, "Protocol", for the
        // moment it is turned on.
        if !self.flow_on.load(Ordering::Relaxed) {
            return;
        }
        // SeqCst, after the caller's change was published: the kicker's
        // side of the pairing.
        crate::sync::fence(Ordering::SeqCst);
        if self.flow_waiting.load(Ordering::SeqCst) != 0 {
            self.wake_flow();
        }
    }

    /// Asks the maintenance to run the queue's loop.
    pub(super) fn wake_flow(&self) {
        // Release: the maintenance's swap acquires what preceded the kick.
        self.flow_kicked.store(true, Ordering::Release);
        self.signal.raise();
    }

    /// The staleness policy. Relaxed: a setting; `set_staleness` re-sweeps
    /// after storing it, and publications read it under the combiner.
    #[inline]
    pub(super) fn staleness(&self) -> Staleness {
        Staleness::from_u64(self.staleness.load(Ordering::Relaxed))
    }

    pub(super) fn capacity(&self) -> usize {
        self.ids.len()
    }

    /// Counts a rejection of `reason` (and, for overloads, under `endpoint`).
    /// Relaxed increments: the counters order nothing.
    pub(super) fn count_rejection(&self, reason: Reason, endpoint: &str) {
        let i = REJECTED_REASONS
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.rejected[i].fetch_add(1, Ordering::Relaxed);
        if reason == Reason::NoWorkers {
            return;
        }
        let list = self.endpoints.load();
        if let Some(c) = list.iter().find(|c| &*c.endpoint == endpoint) {
            c.count.fetch_add(1, Ordering::Relaxed);
            return;
        }
        drop(list);
        // First rejection on this endpoint: the cold path adds a counter.
        let _cold = lock(&self.cold);
        let current = self.endpoints.load_full();
        if let Some(c) = current.iter().find(|c| &*c.endpoint == endpoint) {
            c.count.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut next = (*current).clone();
        next.push(Arc::new(EndpointCounter {
            endpoint: endpoint.into(),
            count: AtomicU64::new(1),
        }));
        self.endpoints.store(Arc::new(next));
    }

    /// Ends the lease on `slot` if one is set, and kicks the queue: the
    /// worker may be free now.
    #[inline]
    pub(super) fn end_lease(&self, slot: usize) {
        if self.leased.clear(slot) {
            // Relaxed: `leases_out` is a hint that lets routers skip the
            // lease words; the bit itself is the truth.
            self.leases_out.fetch_sub(1, Ordering::Relaxed);
            self.kick_flow();
        }
    }

    /// Whether `slot` is under a lease that has not expired; ends an expired one.
    #[inline]
    pub(super) fn lease_active(
        &self,
        slot: usize,
        now: &mut Option<u64>,
        clock: &SharedClock,
    ) -> bool {
        // Relaxed hint: a router that reads 0 while a lease is being set
        // routes as it would have just before the mark.
        if self.leases_out.load(Ordering::Relaxed) == 0 || !self.leased.contains(slot) {
            return false;
        }
        let t = *now.get_or_insert_with(|| clock.now_nanos());
        // Relaxed: stored before the lease bit, which `contains` just read
        // with Acquire (module docs).
        if self.lease_deadline[slot].load(Ordering::Relaxed) <= t {
            self.end_lease(slot);
            false
        } else {
            true
        }
    }

    /// Workers of word `w` that are registered, not busy and not leased.
    /// Reads the clock only if a lease overlaps the candidates.
    #[inline]
    pub(super) fn eligible(&self, w: usize, now: &mut Option<u64>, clock: &SharedClock) -> u64 {
        let bits = self.members.word(w) & !self.busy.word(w);
        // Relaxed hint, as in `lease_active`.
        if self.leases_out.load(Ordering::Relaxed) == 0 || bits == 0 {
            bits
        } else {
            self.unleased(w, bits, now, clock)
        }
    }

    /// `bits` of word `w` without the slots under an unexpired lease; ends
    /// expired leases.
    #[inline(never)]
    fn unleased(&self, w: usize, mut bits: u64, now: &mut Option<u64>, clock: &SharedClock) -> u64 {
        let leased = self.leased.word(w) & bits;
        if leased != 0 {
            let t = *now.get_or_insert_with(|| clock.now_nanos());
            for b in BitIter(leased) {
                let slot = w * 64 + b;
                // Relaxed: ordered by the Acquire load of the lease word.
                if self.lease_deadline[slot].load(Ordering::Relaxed) <= t {
                    self.end_lease(slot);
                } else {
                    bits &= !(1u64 << b);
                }
            }
        }
        bits
    }

    #[inline]
    pub(super) fn words_in_use(&self) -> usize {
        // Acquire: pairs with the AcqRel `fetch_max` in `add_worker`, so a
        // router scanning a new word sees the slot data stored before it.
        self.words_in_use.load(Ordering::Acquire)
    }

    /// The model's current epochs.
    #[inline]
    pub(super) fn stamp(&self) -> Stamp {
        Stamp {
            busy: self.busy.epoch(),
            // Acquire: pairs with the Release bump after each membership
            // change, so a matching stamp means the change is visible.
            members: self.members_epoch.load(Ordering::Acquire),
        }
    }

    /// Picks a worker by `policy`: [`RouteError::Unavailable`] (counted)
    /// with no workers, [`RouteError::Overloaded`] (counted under
    /// `endpoint`) when none is eligible.
    #[inline]
    pub(super) fn select(
        &self,
        policy: Policy,
        clock: &SharedClock,
        endpoint: &str,
    ) -> Result<u64, RouteError> {
        self.routable()?;
        match self.pick(policy, clock) {
            Some(slot) => {
                self.count_advisory(slot);
                // Relaxed: the id was stored before the member bit that the
                // pick read with Acquire (module docs).
                Ok(self.ids[slot].load(Ordering::Relaxed))
            }
            None => Err(self.overloaded(endpoint)),
        }
    }

    /// [`RouteError::Unavailable`] (counted) when the model has no workers.
    #[inline]
    pub(super) fn routable(&self) -> Result<(), RouteError> {
        // Relaxed: a select racing the first add may answer Unavailable, as
        // if it had run a moment earlier.
        if self.workers.load(Ordering::Relaxed) == 0 {
            self.count_rejection(Reason::NoWorkers, "");
            return Err(RouteError::Unavailable);
        }
        Ok(())
    }

    #[cold]
    pub(super) fn overloaded(&self, endpoint: &str) -> RouteError {
        self.count_rejection(Reason::AllWorkersBusy, endpoint);
        if self.slo.mode() == Some(SloMode::Advisory) {
            // The SLO would admit it if some worker's verdict is free.
            let free = (0..self.words_in_use())
                .any(|w| self.members.word(w) & !self.slo.verdicts.word(w) != 0);
            self.slo.count_would(!free);
        }
        RouteError::Overloaded
    }

    /// With an advisory SLO, counts what its verdict on `slot`, picked by
    /// the static thresholds, would have decided (`slo.rs`): one relaxed
    /// load without.
    #[inline]
    pub(super) fn count_advisory(&self, slot: usize) {
        if self.slo.mode() == Some(SloMode::Advisory) {
            self.slo.count_would(self.slo.verdicts.contains(slot));
        }
    }
}
