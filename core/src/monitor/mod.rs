//! The frontend monitor: load table, busy rule, busy set and router.
//!
//! A [`Monitor`] holds every worker of every model a frontend routes to.
//!
//! * **Load table.** Each worker owns one `Rank` per declared data-parallel
//!   rank, with one atomic per load field. A field has a single owner: a
//!   report of `kv_used_blocks` never touches `active_decode_blocks`, which
//!   the router's [`Booking`]s own. An absent field keeps its value; a present
//!   `0` overwrites.
//! * **Busy rule.** After any change the worker's busy state is recomputed
//!   from the latest inputs by [`Thresholds::rank_busy`] (all ranks busy ⇒
//!   worker busy) and published through a `Combiner`, so concurrent writers
//!   never publish a stale result and never wait for one another.
//! * **Busy set.** Each model numbers its workers with dense slots and keeps a
//!   [`BusySet`] plus a membership bitset and an overload-lease bitset.
//!   Routing ANDs the words together and picks a bit: no lock, no
//!   allocation, and no clock read unless a lease is outstanding. Random and
//!   power-of-two picks are uniform over the eligible workers: a few random
//!   probes while most are free, otherwise one index into a `PickCache`
//!   (the free workers listed at the current busy and membership epochs,
//!   rebuilt by a router that counted the model twice at the same epochs),
//!   and an exact count when neither answers.
//! * **Registry.** Worker and model lookup goes through an immutable snapshot
//!   swapped with `arc-swap` when workers come and go (the cold path), so
//!   lookups on the hot path are lock-free.
//!
//! # Files
//!
//! One algorithm or concern per file, lowest layer first:
//!
//! * `busy_set.rs`: epoch-stamped atomic bitsets ([`BusySet`]);
//! * `combine.rs`: combining publication (one publisher, writers never wait);
//! * `pick_cache.rs`: the sequence-locked list of free workers;
//! * `config.rs`: [`MonitorConfig`], [`Policy`], [`Staleness`], [`ThresholdState`];
//! * `model.rs`: a model's slots, bitsets, leases and counters;
//! * `rank.rs`: the load table (`Rank`, `Worker`) and the busy-rule publisher;
//! * `pick.rs`: the round-robin, random and power-of-two picks;
//! * `registry.rs`: the RCU registry, adding and removing workers;
//! * `defaults.rs`: the settings every model starts with;
//! * `route.rs`, `booking.rs`: the [`Route`] and [`Booking`] handles;
//! * `share.rs`, `replicas.rs`: this frontend's leased share, and the
//!   monitor's side of booking sync (`crate::cluster::replicas`);
//! * `observe.rs`, `slo.rs`: a model's SLO, its requests' streams observed
//!   (the queue and each rank's fit in `observe.rs`), each rank's step time
//!   fitted and the latencies it predicts (`crate::slo`); `freed.rs`: the
//!   rate its bookings end, the drain its queue's waits are predicted by;
//! * `outbox.rs`: its own bookings' events, for a publisher that announces
//!   them to the reference routers (`crate::cluster::announce`);
//! * `signal.rs`: how the hot paths tell the maintenance it has work;
//! * `flow/`: dispatch through a model's frontend queue (`crate::flow`):
//!   [`Monitor::dispatch`] and its blocking and callback forms, the kicks
//!   that say capacity appeared, and the [`Dispatch`] handle;
//! * `duty.rs`: the maintenance (dispatching what waits, queue deadlines,
//!   the staleness sweep, lease ends), on a thread of its own or the
//!   host's [`Monitor::maintain`];
//! * `metrics.rs`: counters and the Prometheus rendering;
//! * this file: the [`Monitor`] type and its hot paths and thresholds.
//!
//! # Orderings in this file
//!
//! The hot paths here only look up the registry snapshot and call into the
//! model and the worker; the orderings they rely on are explained in
//! `model.rs` (bitsets and slot data) and `rank.rs` (load fields). The
//! `Relaxed` accesses below are counters, hints re-checked against the
//! bitsets, or inputs released by a combiner registration that follows.
//!
//! [`BusySet`]: crate::BusySet
//! [`Thresholds::rank_busy`]: crate::Thresholds::rank_busy

pub(crate) mod booking;
pub(crate) mod busy_set;
mod combine;
pub(crate) mod config;
mod defaults;
mod duty;
mod flow;
mod freed;
mod metrics;
mod model;
mod observe;
pub(crate) mod outbox;
mod pick;
mod pick_cache;
mod predict;
mod rank;
mod registry;
pub(crate) mod replicas;
mod reserve;
mod route;
pub(crate) mod share;
pub(crate) mod signal;
mod slo;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

pub(crate) use booking::Owner;
pub use booking::{Booking, STEP_WINDOW};
pub use config::{
    Maintenance, MonitorConfig, MonitorConfigError, Policy, Staleness, ThresholdState,
    DEFAULT_BLOCK_TOKENS, DEFAULT_ENDPOINT, MAX_REROUTES,
};
pub use defaults::{
    ModelDefaults, ACTIVE_DECODE_BLOCKS_THRESHOLD_ENV, ACTIVE_PREFILL_TOKENS_THRESHOLD_ENV,
    ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC_ENV, SLO_ADVISORY_ENV, SLO_TPOT_ENV, SLO_TTFT_ENV,
};
pub use flow::{
    Dispatch, DispatchCallback, DispatchHandle, DispatchRequest, Dispatching, FlowControlConfig,
    FlowError,
};
pub use observe::SloMode;
pub use outbox::OUTBOX_CAPACITY;
pub use pick::seed_picks;
pub use route::Route;
pub use slo::{
    Prediction, SloCounts, FIT_PERIOD, FIT_REACH, OBSERVATION_CAPACITY, SEAT_PROBE,
    SEAT_PROBE_PERIOD, SEAT_PROBE_PERIODS, TPOT_MARGIN_MAX, TPOT_MARGIN_STEP, TPOT_MISSES,
};

use duty::Duty;
use model::Model;
use rank::{Rank, Worker};
use registry::Registry;

use crate::clock::{nanos, MonotonicClock, SharedClock};
use crate::error::{Reason, ReportError, RouteError, ThresholdError, WorkerError};
use crate::load::LoadReport;
use crate::sync::{lock, AtomicU64, Mutex, Ordering};
use crate::thresholds::{RankLoad, ThresholdUpdate};

/// The frontend's view of every worker's load, and its router.
///
/// All methods take `&self`; share the monitor between threads with an `Arc`.
/// Hot paths — [`report`](Self::report), [`is_busy`](Self::is_busy),
/// [`check`](Self::check), [`select`](Self::select),
/// [`select_min_cost`](Self::select_min_cost) and [`Booking`] updates — are
/// lock-free and allocation-free (after a thread's first call).
///
/// Ordering guarantee: once `report` (or a booking update) returns, any
/// `select` that starts afterwards sees the busy state computed from that
/// report or from a newer one — unless another thread is publishing that
/// worker at the same moment, in which case it sees it as soon as that
/// thread's publication lands. Threshold updates, removals and sweeps wait
/// for their publication before returning.
pub struct Monitor {
    /// Shared with the maintenance's thread (`duty.rs`).
    registry: Arc<ArcSwap<Registry>>,
    /// The flow-controlled models' queues (`flow/mod.rs`), shared with it
    /// too.
    flows: Arc<flow::Flows>,
    writer: Mutex<()>,
    clock: SharedClock,
    config: MonitorConfig,
    lease_nanos: u64,
    refused: [AtomicU64; 3],
    refused_workers: [AtomicU64; WorkerError::ADD_KINDS.len()],
    /// Its leased share of every rank, in booking sync's leased mode.
    pub(crate) share: Arc<share::Share>,
    /// Its own bookings' events, for a publisher (`outbox.rs`).
    pub(crate) outbox: Arc<outbox::Outbox>,
    /// What its requests' streams show, for the SLO fits (`slo.rs`).
    observations: Arc<observe::Observations>,
    /// Its maintenance (`duty.rs`).
    duty: Arc<Duty>,
    /// What new models start with (`defaults.rs`).
    defaults: Mutex<ModelDefaults>,
    /// Families other parts add to `metrics_text` (a booking sync's).
    pub(crate) more_families: crate::metrics::MoreFamilies,
    /// This monitor's engine scrapes, for `metrics_text`.
    #[cfg(feature = "scrape")]
    pub(crate) scrapes: crate::scrape::stats::Registered,
}

impl fmt::Debug for Monitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Monitor")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Default for Monitor {
    fn default() -> Self {
        Self::new()
    }
}

impl Monitor {
    /// A monitor with default settings on the monotonic clock.
    pub fn new() -> Self {
        Self::with_config(MonitorConfig::default(), MonotonicClock::shared())
            .expect("default config is valid")
    }

    /// A monitor with the given settings and clock.
    pub fn with_config(
        config: MonitorConfig,
        clock: SharedClock,
    ) -> Result<Self, MonitorConfigError> {
        config.validate()?;
        let registry = Arc::new(ArcSwap::from_pointee(Registry::default()));
        let background = config.maintenance == Maintenance::Background;
        let flows = Arc::new(flow::Flows::default());
        let observations = Arc::new(observe::Observations::new(clock.clone()));
        let duty = Duty::new(
            Arc::clone(&registry),
            Arc::clone(&flows),
            Arc::clone(&observations),
            clock.clone(),
            background,
        );
        if config.staleness != Staleness::Keep {
            duty.start();
        }
        Ok(Self {
            registry,
            flows,
            duty,
            defaults: Mutex::new(config.defaults.clone()),
            more_families: Default::default(),
            writer: Mutex::new(()),
            share: Arc::new(share::Share::new(clock.clone())),
            outbox: Arc::new(outbox::Outbox::new()),
            observations,
            clock,
            lease_nanos: nanos(config.lease),
            config,
            refused: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
            refused_workers: Default::default(),
            #[cfg(feature = "scrape")]
            scrapes: Default::default(),
        })
    }

    /// The settings this monitor was built with.
    pub fn config(&self) -> &MonitorConfig {
        &self.config
    }

    // -- load (hot path) ----------------------------------------------------

    /// Applies one load report to one rank and re-evaluates the worker.
    ///
    /// An absent field keeps its value; a present `0` overwrites. Reports for
    /// unknown workers, undeclared ranks or out-of-range values are refused,
    /// counted, and change nothing. A report that leaves the worker not busy
    /// ends its overload lease.
    #[inline]
    pub fn report(
        &self,
        worker_id: u64,
        dp_rank: u32,
        report: &LoadReport,
    ) -> Result<(), ReportError> {
        let reg = self.registry.load();
        let result = Self::rank_of(&reg, worker_id, dp_rank).and_then(|(worker, rank)| {
            report.check()?;
            rank.apply(report);
            worker.reevaluate();
            let model = &worker.model;
            // Relaxed hint: a lease set while this report lands ends at its
            // deadline or at the next report instead.
            // A publication that leaves the worker free kicks the model's
            // queue, and so does ending its lease (`flow/mod.rs`).
            if model.leases_out.load(Ordering::Relaxed) != 0 && !model.busy.contains(worker.slot) {
                model.end_lease(worker.slot);
            }
            Ok(())
        });
        if let Err(e) = &result {
            let i = ReportError::KINDS
                .iter()
                .position(|k| *k == e.kind())
                .unwrap_or(0);
            // Relaxed: a counter for metrics.
            self.refused[i].fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    #[inline]
    fn rank_of(
        reg: &Registry,
        worker_id: u64,
        dp_rank: u32,
    ) -> Result<(&Arc<Worker>, &Rank), ReportError> {
        let worker = reg
            .workers
            .get(&worker_id)
            .ok_or(ReportError::UnknownWorker(worker_id))?;
        Ok((worker, worker.rank(dp_rank)?))
    }

    /// The latest load of one rank.
    pub fn rank_load(&self, worker_id: u64, dp_rank: u32) -> Result<RankLoad, ReportError> {
        let reg = self.registry.load();
        Self::rank_of(&reg, worker_id, dp_rank).map(|(_, rank)| rank.load())
    }

    /// Books `blocks` KV blocks of a routed request on a worker rank (the
    /// router-side `active_decode_blocks`). Add generated output with
    /// [`Booking::add_output_blocks`]; the blocks are freed when the booking
    /// is released or dropped. In booking sync's leased mode
    /// (docs/replicas.md) a booking that does not fit this frontend's share
    /// of the rank is refused with [`ReportError::NoShare`].
    pub fn book(&self, worker_id: u64, dp_rank: u32, blocks: u64) -> Result<Booking, ReportError> {
        self.book_with_prefill(worker_id, dp_rank, blocks, 0)
    }

    /// [`book`](Self::book), and also books the request's `prefill_tokens`
    /// prompt tokens in the rank's `active_prefill_tokens` (the router-side
    /// prefill count, as Dynamo's frontend keeps it) until
    /// [`Booking::prefill_done`] or the booking's end. So the prefill
    /// thresholds work beside workers that do not report prefill tokens; a
    /// worker whose router books them must not report them too (a report
    /// overwrites the count). 0 books no prefill and leaves a rank that has
    /// not reported prefill tokens out of the prefill checks.
    pub fn book_with_prefill(
        &self,
        worker_id: u64,
        dp_rank: u32,
        blocks: u64,
        prefill_tokens: u64,
    ) -> Result<Booking, ReportError> {
        self.book_for(Owner::Own, worker_id, dp_rank, blocks, prefill_tokens)
    }

    /// [`book_with_prefill`](Self::book_with_prefill) for `owner`: another
    /// router's booking is never published as this frontend's own
    /// (`replicas.rs`).
    pub(crate) fn book_for(
        &self,
        owner: Owner,
        worker_id: u64,
        dp_rank: u32,
        blocks: u64,
        prefill_tokens: u64,
    ) -> Result<Booking, ReportError> {
        let reg = self.registry.load();
        let (worker, _) = Self::rank_of(&reg, worker_id, dp_rank)?;
        let rank_index = (dp_rank - worker.dp_start) as usize;
        Booking::new(worker.clone(), rank_index, owner, blocks, prefill_tokens)
    }

    // -- busy state (hot path) ---------------------------------------------

    /// Whether the worker is busy by its model's thresholds (leases aside).
    #[inline]
    pub fn is_busy(&self, worker_id: u64) -> Result<bool, RouteError> {
        let reg = self.registry.load();
        let w = reg
            .workers
            .get(&worker_id)
            .ok_or(RouteError::UnknownWorker(worker_id))?;
        Ok(w.model.busy.contains(w.slot))
    }

    /// Ids of `model`'s busy workers, ascending (empty for an unknown model).
    pub fn busy_workers(&self, model: &str) -> Vec<u64> {
        let reg = self.registry.load();
        let Some(m) = reg.models.get(model) else {
            return Vec::new();
        };
        let mut ids: Vec<u64> = m
            .busy
            .iter()
            .filter(|&s| m.members.contains(s))
            // Relaxed: ordered by the Acquire load of the member word.
            .map(|s| m.ids[s].load(Ordering::Relaxed))
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The busy-set epoch of `model` (number of busy-bit changes so far).
    pub fn busy_epoch(&self, model: &str) -> Option<u64> {
        self.registry
            .load()
            .models
            .get(model)
            .map(|m| m.busy.epoch())
    }

    // -- routing (hot path) -------------------------------------------------

    /// Picks a worker of `model` that is not busy and not under a lease.
    ///
    /// [`RouteError::Unavailable`] when the model has no workers,
    /// [`RouteError::Overloaded`] (counted under [`DEFAULT_ENDPOINT`]) when
    /// none is eligible.
    #[inline]
    pub fn select(&self, model: &str, policy: Policy) -> Result<u64, RouteError> {
        self.select_at(model, policy, DEFAULT_ENDPOINT)
    }

    /// [`select`](Self::select), counting a rejection under `endpoint`.
    #[inline]
    pub fn select_at(
        &self,
        model: &str,
        policy: Policy,
        endpoint: &str,
    ) -> Result<u64, RouteError> {
        match self.registry.load().models.get(model) {
            Some(m) => m.select(policy, &self.clock, endpoint),
            None => Err(RouteError::Unavailable),
        }
    }

    /// Picks the eligible worker of `model` with the lowest caller-given cost
    /// (for KV-overlap routers). Candidates that are unknown, of another
    /// model, busy or leased are skipped; NaN costs rank last; ties keep the
    /// first. Allocation-free: the costs are read straight from the iterator.
    #[inline]
    pub fn select_min_cost<I>(&self, model: &str, costs: I) -> Result<u64, RouteError>
    where
        I: IntoIterator<Item = (u64, f64)>,
    {
        let reg = self.registry.load();
        let m = Self::routable(&reg, model)?;
        let mut now = None;
        let mut best = None;
        // NaN until a candidate wins, so that no comparison skips the first.
        let mut best_cost = f64::NAN;
        for (id, cost) in costs {
            let cost = if cost.is_nan() { f64::INFINITY } else { cost };
            // Only a candidate that would win is looked up: with costs in
            // random order that is a handful of the candidates, not all.
            if cost >= best_cost {
                continue;
            }
            let Some(w) = reg.workers.get(&id) else {
                continue;
            };
            if !Arc::ptr_eq(&w.model, m)
                || m.busy.contains(w.slot)
                || m.lease_active(w.slot, &mut now, &self.clock)
            {
                continue;
            }
            best = Some((id, w.slot));
            best_cost = cost;
        }
        let (id, slot) = best.ok_or_else(|| m.overloaded(DEFAULT_ENDPOINT))?;
        m.count_advisory(slot);
        Ok(id)
    }

    /// Checks a pinned worker: [`RouteError::WorkerOverloaded`] (counted)
    /// when it is busy or under a lease.
    #[inline]
    pub fn check(&self, worker_id: u64) -> Result<(), RouteError> {
        self.check_at(worker_id, DEFAULT_ENDPOINT)
    }

    /// [`check`](Self::check), counting a rejection under `endpoint`.
    #[inline]
    pub fn check_at(&self, worker_id: u64, endpoint: &str) -> Result<(), RouteError> {
        let reg = self.registry.load();
        let w = reg
            .workers
            .get(&worker_id)
            .ok_or(RouteError::UnknownWorker(worker_id))?;
        let m = &w.model;
        if m.busy.contains(w.slot) || m.lease_active(w.slot, &mut None, &self.clock) {
            m.count_rejection(Reason::WorkerOverloaded, endpoint);
            return Err(RouteError::WorkerOverloaded);
        }
        Ok(())
    }

    #[inline]
    fn routable<'r>(reg: &'r Registry, model: &str) -> Result<&'r Arc<Model>, RouteError> {
        let m = reg.models.get(model).ok_or(RouteError::Unavailable)?;
        m.routable()?;
        Ok(m)
    }

    /// Marks a worker that refused with "Server overloaded: …": it is skipped
    /// for the lease time, or until its next report shows it not busy.
    /// Marking again extends the lease.
    pub fn mark_overloaded(&self, worker_id: u64) -> Result<(), RouteError> {
        let reg = self.registry.load();
        let w = reg
            .workers
            .get(&worker_id)
            .ok_or(RouteError::UnknownWorker(worker_id))?;
        let m = &w.model;
        let deadline = self.clock.now_nanos().saturating_add(self.lease_nanos);
        // Relaxed: the AcqRel in `set` orders the deadline store before the
        // bit, which readers load with Acquire before the deadline.
        m.lease_deadline[w.slot].store(deadline, Ordering::Relaxed);
        if m.leased.set(w.slot) {
            // Relaxed: a hint that lets routers skip the lease words.
            m.leases_out.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Whether the worker is under an unexpired overload lease.
    pub fn is_leased(&self, worker_id: u64) -> Result<bool, RouteError> {
        let reg = self.registry.load();
        let w = reg
            .workers
            .get(&worker_id)
            .ok_or(RouteError::UnknownWorker(worker_id))?;
        Ok(w.model.lease_active(w.slot, &mut None, &self.clock))
    }

    // -- thresholds and staleness (cold path) -------------------------------

    /// Validates and applies a threshold update to `model`, bumps its version
    /// and re-evaluates every worker of the model before returning. An empty
    /// update is a read. A refused update changes nothing.
    pub fn set_thresholds(
        &self,
        model: &str,
        update: &ThresholdUpdate,
    ) -> Result<ThresholdState, ThresholdError> {
        let reg = self.registry.load_full();
        let m = reg
            .models
            .get(model)
            .ok_or_else(|| ThresholdError::UnknownModel(model.to_owned()))?;
        let mut cold = lock(&m.cold);
        if update.is_empty() {
            return Ok(cold.thresholds);
        }
        let merged = cold.thresholds.thresholds.merged(update)?;
        cold.thresholds = ThresholdState {
            thresholds: merged,
            version: cold.thresholds.version + 1,
        };
        m.thresholds.store(&merged);
        for w in reg.workers.values().filter(|w| Arc::ptr_eq(&w.model, m)) {
            w.reevaluate_and_wait();
        }
        m.kick_flow();
        Ok(cold.thresholds)
    }

    /// The thresholds of `model`, or `None` for an unknown model.
    pub fn thresholds(&self, model: &str) -> Option<ThresholdState> {
        self.registry
            .load()
            .models
            .get(model)
            .map(|m| lock(&m.cold).thresholds)
    }

    /// Sets `model`'s staleness policy and re-sweeps. A change between
    /// `free` and `busy` applies at once to ranks that are already stale.
    pub fn set_staleness(
        &self,
        model: &str,
        policy: Staleness,
        stale_after: Duration,
    ) -> Result<(), ThresholdError> {
        if stale_after.is_zero() {
            return Err(ThresholdError::Invalid {
                field: "stale_after",
                value: format!("{stale_after:?}"),
                allowed: "longer than zero",
            });
        }
        let reg = self.registry.load();
        let m = reg
            .models
            .get(model)
            .ok_or_else(|| ThresholdError::UnknownModel(model.to_owned()))?;
        // Relaxed: settings read by the sweep below on this thread, and by
        // publications, to which its combiner registrations release them.
        m.stale_after.store(nanos(stale_after), Ordering::Relaxed);
        let old = Staleness::from_u64(m.staleness.swap(policy.to_u64(), Ordering::Relaxed));
        // The sweep re-evaluates workers whose stale marks change; a worker
        // whose ranks stay stale under the other policy must be
        // re-evaluated here. Relaxed `stale`: an input that
        // `reevaluate_and_wait` releases.
        if old != policy {
            for w in reg.workers.values().filter(|w| {
                Arc::ptr_eq(&w.model, m) && w.ranks.iter().any(|r| r.stale.load(Ordering::Relaxed))
            }) {
                w.reevaluate_and_wait();
            }
        }
        drop(reg);
        if policy != Staleness::Keep {
            self.duty.start();
        }
        self.sweep();
        Ok(())
    }
}
