//! The frontend monitor: load table, busy rule, busy set and router.
//!
//! A [`Monitor`] holds every worker of every model a frontend routes to.
//!
//! * **Load table.** Each worker owns one [`Rank`] per declared data-parallel
//!   rank, with one atomic per load field. A field has a single owner: a
//!   report of `kv_used_blocks` never touches `active_decode_blocks`, which
//!   the router's [`Booking`]s own. An absent field keeps its value; a present
//!   `0` overwrites.
//! * **Busy rule.** After any change the worker's busy state is recomputed
//!   from the latest inputs by [`Thresholds::rank_busy`] (all ranks busy ⇒
//!   worker busy) and published through a [`Combiner`], so concurrent writers
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

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;

use crate::busy_set::{AtomicBits, BitIter, BusySet};
use crate::clock::{nanos, MonotonicClock, SharedClock};
use crate::combine::Combiner;
use crate::error::{Reason, ReportError, RouteError, ThresholdError, WorkerError};
use crate::limits::Limits;
use crate::load::{LoadReport, WorkerSpec, UNREPORTED};
use crate::metrics;
use crate::pick_cache::{PickCache, Stamp};
use crate::sync::{lock, AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering};
use crate::thresholds::{RankLoad, ThresholdUpdate, Thresholds, DEFAULT_MAX_NUM_BATCHED_TOKENS};

/// Endpoint label used when the caller names none.
pub const DEFAULT_ENDPOINT: &str = "generate";

/// Routing policy for [`Monitor::select`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Each eligible worker in turn (approximate under concurrent selects).
    #[default]
    RoundRobin,
    /// Uniformly random among eligible workers.
    Random,
    /// Two random eligible workers; the less loaded one wins.
    PowerOfTwo,
}

impl Policy {
    /// Parses `round_robin`, `random` or `power_of_two` (also `p2c`).
    pub fn from_name(name: &str) -> Option<Policy> {
        match name {
            "round_robin" => Some(Policy::RoundRobin),
            "random" => Some(Policy::Random),
            "power_of_two" | "p2c" => Some(Policy::PowerOfTwo),
            _ => None,
        }
    }
}

/// What a rank that stopped reporting counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Staleness {
    /// Keep its last values (the reference behaviour).
    #[default]
    Keep,
    /// Count it as free once silent for `stale_after`.
    Free,
    /// Count it as busy once silent for `stale_after`.
    Busy,
}

impl Staleness {
    /// Parses `keep`, `free` or `busy`.
    pub fn from_name(name: &str) -> Option<Staleness> {
        match name {
            "keep" => Some(Staleness::Keep),
            "free" => Some(Staleness::Free),
            "busy" => Some(Staleness::Busy),
            _ => None,
        }
    }

    fn to_u64(self) -> u64 {
        self as u64
    }

    fn from_u64(v: u64) -> Staleness {
        match v {
            1 => Staleness::Free,
            2 => Staleness::Busy,
            _ => Staleness::Keep,
        }
    }
}

/// Monitor settings.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// How long a worker that refused with "Server overloaded" is skipped.
    pub lease: Duration,
    /// Default staleness policy of new models.
    pub staleness: Staleness,
    /// Silence after which a rank is stale.
    pub stale_after: Duration,
    /// Bounds on models, workers, ranks and names (see [`Limits`]).
    pub limits: Limits,
    /// Metric name prefix.
    pub metrics_prefix: String,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(1),
            staleness: Staleness::Keep,
            stale_after: Duration::from_secs(3),
            limits: Limits::default(),
            metrics_prefix: metrics::DEFAULT_PREFIX.to_owned(),
        }
    }
}

/// A monitor setting that was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorConfigError {
    /// The setting.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl fmt::Display for MonitorConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid monitor setting {}: {}",
            self.field, self.problem
        )
    }
}

impl std::error::Error for MonitorConfigError {}

/// A model's thresholds and the version of the last update.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ThresholdState {
    /// The thresholds in force.
    pub thresholds: Thresholds,
    /// Bumped by every update; 0 before the first.
    pub version: u64,
}

// ---------------------------------------------------------------------------
// Hashing: worker ids and model names come from the network, so the maps are
// keyed with foldhash's per-process random seed (fast, and not predictable by
// a publisher choosing ids that collide).

type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

// ---------------------------------------------------------------------------
// Load table.

/// The load fields of one rank; each field is written by its own source.
#[derive(Debug)]
struct Rank {
    active_decode_blocks: AtomicU64,
    kv_used_blocks: AtomicU64,
    kv_total_blocks: AtomicU64,
    active_prefill_tokens: AtomicU64,
    max_num_batched_tokens: AtomicU64,
    /// Set by every report; cleared by the staleness sweep.
    seen: AtomicBool,
    /// Whether the sweep found this rank silent for `stale_after`.
    stale: AtomicBool,
    /// Clock time of the sweep that last saw a report (or of the add).
    last_seen: AtomicU64,
}

impl Rank {
    fn new(spec: &WorkerSpec, now: u64) -> Self {
        Self {
            active_decode_blocks: AtomicU64::new(0),
            kv_used_blocks: AtomicU64::new(0),
            kv_total_blocks: AtomicU64::new(spec.kv_total_blocks.unwrap_or(0)),
            active_prefill_tokens: AtomicU64::new(UNREPORTED),
            max_num_batched_tokens: AtomicU64::new(
                spec.max_num_batched_tokens
                    .unwrap_or(DEFAULT_MAX_NUM_BATCHED_TOKENS),
            ),
            seen: AtomicBool::new(false),
            stale: AtomicBool::new(false),
            last_seen: AtomicU64::new(now),
        }
    }

    // Relaxed loads and stores throughout: inputs are published to the
    // evaluating thread by the Combiner's AcqRel registration.
    #[inline]
    fn load(&self) -> RankLoad {
        let prefill = self.active_prefill_tokens.load(Ordering::Relaxed);
        RankLoad {
            active_decode_blocks: self.active_decode_blocks.load(Ordering::Relaxed),
            kv_used_blocks: self.kv_used_blocks.load(Ordering::Relaxed),
            kv_total_blocks: self.kv_total_blocks.load(Ordering::Relaxed),
            active_prefill_tokens: (prefill != UNREPORTED).then_some(prefill),
            max_num_batched_tokens: self.max_num_batched_tokens.load(Ordering::Relaxed),
        }
    }

    #[inline]
    fn apply(&self, r: &LoadReport) {
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
        self.seen.store(true, Ordering::Relaxed);
        if self.stale.load(Ordering::Relaxed) {
            self.stale.store(false, Ordering::Relaxed);
        }
    }
}

/// One registered worker.
#[derive(Debug)]
struct Worker {
    id: u64,
    model: Arc<Model>,
    slot: usize,
    dp_start: u32,
    ranks: Box<[Rank]>,
    combiner: Combiner,
    /// Busy state as last published (written only by the publisher).
    busy: AtomicBool,
    /// Set once by `remove_worker`; a removed worker publishes nothing.
    removed: AtomicBool,
}

impl Worker {
    #[inline]
    fn rank(&self, dp_rank: u32) -> Result<&Rank, ReportError> {
        dp_rank
            .checked_sub(self.dp_start)
            .and_then(|i| self.ranks.get(i as usize))
            .ok_or(ReportError::UndeclaredRank {
                worker_id: self.id,
                dp_rank,
                dp_start: self.dp_start,
                dp_size: self.ranks.len() as u32,
            })
    }

    /// Recomputes the busy bit from the latest inputs; runs only inside the
    /// worker's combiner, so only one thread at a time publishes.
    fn publish(&self) {
        let model = &*self.model;
        let busy = if self.removed.load(Ordering::Relaxed) {
            false
        } else {
            let thresholds = model.thresholds.load();
            let staleness = model.staleness();
            let mut all_busy = !self.ranks.is_empty();
            let mut load = 0u64;
            for rank in self.ranks.iter() {
                let l = rank.load();
                load = load
                    .saturating_add(l.active_decode_blocks.max(l.kv_used_blocks))
                    .saturating_add(l.active_prefill_tokens.unwrap_or(0) / 16);
                let rank_busy = match (staleness, rank.stale.load(Ordering::Relaxed)) {
                    (Staleness::Free, true) => false,
                    (Staleness::Busy, true) => true,
                    _ => thresholds.rank_busy(&l),
                };
                all_busy &= rank_busy;
            }
            model.load[self.slot].store(load, Ordering::Relaxed);
            all_busy
        };
        if busy != self.busy.load(Ordering::Relaxed) {
            self.busy.store(busy, Ordering::Relaxed);
            if busy {
                model.busy.insert(self.slot);
                model.busy_workers.fetch_add(1, Ordering::Relaxed);
            } else {
                model.busy.remove(self.slot);
                model.busy_workers.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    #[inline]
    fn reevaluate(&self) {
        self.combiner.run(|| self.publish());
    }

    fn reevaluate_and_wait(&self) {
        self.combiner.run_and_wait(|| self.publish());
    }
}

// ---------------------------------------------------------------------------
// Models.

/// Thresholds as the hot path reads them: one atomic per field. A `None`
/// decode or fraction is stored as NaN bits; a `None` absolute threshold as
/// `u64::MAX`, which never trips (`tokens > u64::MAX` is impossible).
/// Readers may see a mix of old and new fields while an update lands; the
/// update re-evaluates every worker afterwards, so no mix survives it.
#[derive(Debug)]
struct HotThresholds {
    decode: AtomicU64,
    prefill: AtomicU64,
    prefill_frac: AtomicU64,
}

impl HotThresholds {
    fn new() -> Self {
        let none = f64::NAN.to_bits();
        Self {
            decode: AtomicU64::new(none),
            prefill: AtomicU64::new(u64::MAX),
            prefill_frac: AtomicU64::new(none),
        }
    }

    fn store(&self, t: &Thresholds) {
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
    }

    #[inline]
    fn load(&self) -> Thresholds {
        let float =
            |a: &AtomicU64| Some(f64::from_bits(a.load(Ordering::Relaxed))).filter(|v| !v.is_nan());
        let prefill = self.prefill.load(Ordering::Relaxed);
        Thresholds {
            active_decode_blocks_threshold: float(&self.decode),
            active_prefill_tokens_threshold: (prefill != u64::MAX).then_some(prefill),
            active_prefill_tokens_threshold_frac: float(&self.prefill_frac),
        }
    }
}

/// Rejection counter for one `(model, endpoint)` pair.
#[derive(Debug)]
struct EndpointCounter {
    endpoint: Box<str>,
    count: AtomicU64,
}

/// Cold-path state of a model, behind its mutex.
#[derive(Debug)]
struct ModelCold {
    /// Slots freed by removed workers, reused lowest first.
    free: BTreeSet<usize>,
    /// Slots never used yet start here.
    next: usize,
    thresholds: ThresholdState,
}

/// A model's slots, bitsets and counters.
#[derive(Debug)]
struct Model {
    name: Box<str>,
    members: AtomicBits,
    busy: BusySet,
    /// Bumped after every change to `members`.
    members_epoch: AtomicU64,
    /// The free workers listed at the current epochs, for uniform picks
    /// when most workers are busy.
    free_list: PickCache,
    leased: AtomicBits,
    ids: Box<[AtomicU64]>,
    load: Box<[AtomicU64]>,
    lease_deadline: Box<[AtomicU64]>,
    leases_out: AtomicUsize,
    words_in_use: AtomicUsize,
    cursor: CachePadded<AtomicUsize>,
    workers: AtomicUsize,
    busy_workers: AtomicUsize,
    thresholds: HotThresholds,
    staleness: AtomicU64,
    stale_after: AtomicU64,
    endpoints: ArcSwap<Vec<Arc<EndpointCounter>>>,
    rejected: [AtomicU64; 3],
    cold: Mutex<ModelCold>,
}

/// Indices into `Model::rejected`.
const REJECTED_REASONS: [Reason; 3] = [
    Reason::AllWorkersBusy,
    Reason::WorkerOverloaded,
    Reason::NoWorkers,
];

impl Model {
    fn new(name: &str, config: &MonitorConfig) -> Self {
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
        }
    }

    #[inline]
    fn staleness(&self) -> Staleness {
        Staleness::from_u64(self.staleness.load(Ordering::Relaxed))
    }

    fn capacity(&self) -> usize {
        self.ids.len()
    }

    /// Counts a rejection of `reason` (and, for overloads, under `endpoint`).
    fn count_rejection(&self, reason: Reason, endpoint: &str) {
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

    /// Ends the lease on `slot` if one is set.
    #[inline]
    fn end_lease(&self, slot: usize) {
        if self.leased.clear(slot) {
            self.leases_out.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether `slot` is under a lease that has not expired; ends an expired one.
    #[inline]
    fn lease_active(&self, slot: usize, now: &mut Option<u64>, clock: &SharedClock) -> bool {
        if self.leases_out.load(Ordering::Relaxed) == 0 || !self.leased.contains(slot) {
            return false;
        }
        let t = *now.get_or_insert_with(|| clock.now_nanos());
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
    fn eligible(&self, w: usize, now: &mut Option<u64>, clock: &SharedClock) -> u64 {
        let bits = self.members.word(w) & !self.busy.word(w);
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
    fn words_in_use(&self) -> usize {
        self.words_in_use.load(Ordering::Acquire)
    }

    /// Round-robin: the first eligible slot at or after the cursor, cyclically.
    #[inline]
    fn pick_round_robin(&self, clock: &SharedClock) -> Option<usize> {
        let words = self.words_in_use();
        // The cursor is at most `words * 64` (one past a slot): wrap without
        // a division.
        let start = self.cursor.load(Ordering::Relaxed);
        let start = if start >= words * 64 { 0 } else { start };
        let (sw, sb) = (start / 64, start % 64);
        let mut now = None;
        let first = self.eligible(sw, &mut now, clock);
        let found = if first & (!0u64 << sb) != 0 {
            Some(sw * 64 + (first & (!0u64 << sb)).trailing_zeros() as usize)
        } else {
            (sw + 1..words)
                .chain(0..sw)
                .find_map(|w| {
                    let e = self.eligible(w, &mut now, clock);
                    (e != 0).then(|| w * 64 + e.trailing_zeros() as usize)
                })
                .or_else(|| (first != 0).then(|| sw * 64 + first.trailing_zeros() as usize))
        };
        if let Some(slot) = found {
            self.cursor.store(slot + 1, Ordering::Relaxed);
        }
        found
    }

    /// Whether at most half the workers are busy, so that a random probe
    /// usually hits an eligible one.
    #[inline]
    fn mostly_free(&self) -> bool {
        self.busy_workers.load(Ordering::Relaxed) * 2 <= self.workers.load(Ordering::Relaxed)
    }

    /// A few random probes for an eligible slot while most workers are free.
    #[inline]
    fn probe(&self, now: &mut Option<u64>, clock: &SharedClock) -> Option<usize> {
        if !self.mostly_free() {
            return None;
        }
        let span = self.words_in_use() as u64 * 64;
        (0..4).find_map(|_| {
            let slot = below(next_random(), span) as usize;
            (self.eligible(slot / 64, now, clock) >> (slot % 64) & 1 == 1).then_some(slot)
        })
    }

    /// Uniform random: the free list if it is current, else probes while
    /// most workers are free, else an exact pick (which may build the list).
    #[inline]
    fn pick_random(&self, clock: &SharedClock) -> Option<usize> {
        let mut now = None;
        self.listed::<1>(&mut now, clock)
            .map(|[a]| a)
            .or_else(|| self.probe(&mut now, clock))
            .or_else(|| self.uniform_pair(&mut now, clock).map(|(a, _)| a))
    }

    /// The model's current epochs.
    #[inline]
    fn stamp(&self) -> Stamp {
        Stamp {
            busy: self.busy.epoch(),
            members: self.members_epoch.load(Ordering::Acquire),
        }
    }

    /// `K` uniform picks from the free list, if it is current and every
    /// pick is still eligible. A pick that is not (leased, or changed since
    /// the list was built) returns `None` for an exact pick: the two together
    /// stay uniform over the eligible workers.
    #[inline]
    fn listed<const K: usize>(
        &self,
        now: &mut Option<u64>,
        clock: &SharedClock,
    ) -> Option<[usize; K]> {
        let picks = self.free_list.pick::<K>(self.stamp(), |len| {
            below(next_random(), len as u64) as usize
        })?;
        picks
            .iter()
            .all(|&s| self.eligible(s / 64, now, clock) >> (s % 64) & 1 == 1)
            .then_some(picks)
    }

    /// Two independent uniform picks among the eligible slots. Up to
    /// [`STACK_WORDS`] words (4096 slots) this is one pass: the eligible
    /// words are kept on the stack, counted, and indexed twice.
    #[inline]
    fn uniform_pair(&self, now: &mut Option<u64>, clock: &SharedClock) -> Option<(usize, usize)> {
        let words = self.words_in_use();
        if words > STACK_WORDS {
            let a = self.uniform_two_pass(now, clock)?;
            return Some((a, self.uniform_two_pass(now, clock).unwrap_or(a)));
        }
        // `upto[w]`: eligible slots in words `0..=w` (non-decreasing).
        let mut eligible = [0u64; STACK_WORDS];
        let mut upto = [0u32; STACK_WORDS];
        let mut total = 0u32;
        let before = self.stamp();
        let unleased = self.leases_out.load(Ordering::Relaxed) == 0;
        for w in 0..words {
            let e = self.eligible(w, now, clock);
            if e != 0 {
                eligible[w] = e;
                total += e.count_ones();
            }
            upto[w] = total;
        }
        if total == 0 {
            return None;
        }
        // A count at epochs that held still, with no lease hiding a worker,
        // may become the free list.
        if unleased && self.leases_out.load(Ordering::Relaxed) == 0 && self.stamp() == before {
            self.free_list.offer(before, &eligible[..words]);
        }
        let upto = &upto[..words];
        let nth = |k: u32| {
            let w = upto.partition_point(|&c| c <= k);
            let before = if w == 0 { 0 } else { upto[w - 1] };
            w * 64 + nth_set_bit(eligible[w], k - before)
        };
        let total = u64::from(total);
        Some((
            nth(below(next_random(), total) as u32),
            nth(below(next_random(), total) as u32),
        ))
    }

    /// A uniform pick for models wider than [`STACK_WORDS`]: count, then walk.
    fn uniform_two_pass(&self, now: &mut Option<u64>, clock: &SharedClock) -> Option<usize> {
        let words = self.words_in_use();
        let total: u64 = (0..words)
            .map(|w| u64::from(self.eligible(w, now, clock).count_ones()))
            .sum();
        if total == 0 {
            return None;
        }
        let mut k = below(next_random(), total);
        for w in 0..words {
            let e = self.eligible(w, now, clock);
            let c = u64::from(e.count_ones());
            if k < c {
                return Some(w * 64 + nth_set_bit(e, k as u32));
            }
            k -= c;
        }
        // The set changed between the two passes; fall back to any eligible.
        self.pick_round_robin(clock)
    }

    #[inline]
    fn pick(&self, policy: Policy, clock: &SharedClock) -> Option<usize> {
        match policy {
            Policy::RoundRobin => self.pick_round_robin(clock),
            Policy::Random => self.pick_random(clock),
            Policy::PowerOfTwo => {
                let mut now = None;
                let (a, b) = match self.listed::<2>(&mut now, clock) {
                    Some([a, b]) => (a, b),
                    None => match (self.probe(&mut now, clock), self.probe(&mut now, clock)) {
                        (Some(a), Some(b)) => (a, b),
                        _ => self.uniform_pair(&mut now, clock)?,
                    },
                };
                let load = |s: usize| self.load[s].load(Ordering::Relaxed);
                Some(if load(b) < load(a) { b } else { a })
            }
        }
    }

    /// Picks a worker by `policy`: [`RouteError::Unavailable`] (counted)
    /// with no workers, [`RouteError::Overloaded`] (counted under
    /// `endpoint`) when none is eligible.
    #[inline]
    fn select(
        &self,
        policy: Policy,
        clock: &SharedClock,
        endpoint: &str,
    ) -> Result<u64, RouteError> {
        self.routable()?;
        match self.pick(policy, clock) {
            Some(slot) => Ok(self.ids[slot].load(Ordering::Relaxed)),
            None => Err(self.overloaded(endpoint)),
        }
    }

    /// [`RouteError::Unavailable`] (counted) when the model has no workers.
    #[inline]
    fn routable(&self) -> Result<(), RouteError> {
        if self.workers.load(Ordering::Relaxed) == 0 {
            self.count_rejection(Reason::NoWorkers, "");
            return Err(RouteError::Unavailable);
        }
        Ok(())
    }

    #[cold]
    fn overloaded(&self, endpoint: &str) -> RouteError {
        self.count_rejection(Reason::AllWorkersBusy, endpoint);
        RouteError::Overloaded
    }
}

/// Models up to this many bitset words (4096 slots) pick uniformly in one pass.
const STACK_WORDS: usize = 64;

/// Maps a random `r` uniformly onto `0..n` with a multiply, not a division.
#[inline]
fn below(r: u64, n: u64) -> u64 {
    ((u128::from(r) * u128::from(n)) >> 64) as u64
}

/// Position of the `n`-th (0-based) set bit of `word`; `n < word.count_ones()`.
#[inline]
fn nth_set_bit(mut word: u64, n: u32) -> usize {
    for _ in 0..n {
        word &= word - 1;
    }
    word.trailing_zeros() as usize
}

/// A per-thread xorshift64* generator; no allocation, no shared state.
#[inline]
fn next_random() -> u64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = const { Cell::new(0) };
    }
    STATE.with(|s| {
        let mut x = s.get();
        if x == 0 {
            // Seed from the thread-local's address and a global counter.
            static SEEDS: std::sync::atomic::AtomicU64 =
                std::sync::atomic::AtomicU64::new(0x9E37_79B9_7F4A_7C15);
            let seed = SEEDS.fetch_add(0x9E37_79B9_7F4A_7C15, std::sync::atomic::Ordering::Relaxed);
            x = (seed ^ (s as *const Cell<u64> as u64)).wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1;
        }
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

// ---------------------------------------------------------------------------
// The monitor.

#[derive(Debug, Default, Clone)]
struct Registry {
    workers: FastMap<u64, Arc<Worker>>,
    models: FastMap<Box<str>, Arc<Model>>,
    /// Ranks over all workers (bounded by `Limits::max_ranks`).
    ranks: usize,
}

/// Refused-report reasons, in metrics order.
const REFUSED_KINDS: [&str; 3] = ["unknown_worker", "undeclared_rank", "invalid_value"];

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
    registry: ArcSwap<Registry>,
    writer: Mutex<()>,
    clock: SharedClock,
    config: MonitorConfig,
    lease_nanos: u64,
    refused: [AtomicU64; 3],
    refused_workers: [AtomicU64; WorkerError::ADD_KINDS.len()],
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
        let err = |field, problem: &str| MonitorConfigError {
            field,
            problem: problem.to_owned(),
        };
        if let Some((field, problem)) = config.limits.invalid_field() {
            return Err(err(field, problem));
        }
        if config.lease.is_zero() {
            return Err(err("lease", "must be longer than zero"));
        }
        if config.stale_after.is_zero() {
            return Err(err("stale_after", "must be longer than zero"));
        }
        if !metrics::valid_prefix(&config.metrics_prefix) {
            return Err(err("metrics_prefix", "must match [a-zA-Z_:][a-zA-Z0-9_:]*"));
        }
        Ok(Self {
            registry: ArcSwap::from_pointee(Registry::default()),
            writer: Mutex::new(()),
            clock,
            lease_nanos: nanos(config.lease),
            config,
            refused: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
            refused_workers: Default::default(),
        })
    }

    /// The settings this monitor was built with.
    pub fn config(&self) -> &MonitorConfig {
        &self.config
    }

    // -- workers (cold path) ------------------------------------------------

    /// Registers a worker of `model` with ranks `dp_start..dp_start + dp_size`.
    /// The model is created on its first worker and keeps its thresholds
    /// when its workers come and go.
    ///
    /// Every size is checked against the configured [`Limits`] before
    /// anything is allocated. When `max_models` is reached, a model with no
    /// workers, no settings of its own (thresholds never set, staleness as
    /// configured) and no [`Route`] handle is dropped to make room; if there
    /// is none, the new model is refused.
    ///
    /// Refusals are counted by reason (`frontend_worker_registrations_refused_total`).
    pub fn add_worker(
        &self,
        model: &str,
        worker_id: u64,
        spec: WorkerSpec,
    ) -> Result<(), WorkerError> {
        let result = self.try_add_worker(model, worker_id, spec);
        if let Err(e) = &result {
            if let Some(i) = WorkerError::ADD_KINDS.iter().position(|k| *k == e.kind()) {
                self.refused_workers[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    fn try_add_worker(
        &self,
        model: &str,
        worker_id: u64,
        spec: WorkerSpec,
    ) -> Result<(), WorkerError> {
        let limits = &self.config.limits;
        limits.check_declaration(model, spec.dp_start, spec.dp_size)?;
        let _writer = lock(&self.writer);
        let current = self.registry.load_full();
        if current.workers.contains_key(&worker_id) {
            return Err(WorkerError::Duplicate(worker_id));
        }
        if current.workers.len() >= limits.max_workers {
            return Err(WorkerError::TooManyWorkers {
                limit: limits.max_workers,
            });
        }
        let ranks_after = current.ranks + spec.dp_size as usize;
        if ranks_after > limits.max_ranks {
            return Err(WorkerError::RankBudget {
                dp_size: spec.dp_size,
                limit: limits.max_ranks,
            });
        }
        let mut evict = None;
        let (model, new_model) = match current.models.get(model) {
            Some(m) => (m.clone(), false),
            None => {
                if current.models.len() >= limits.max_models {
                    evict = Some(self.evictable_model(&current).ok_or(
                        WorkerError::TooManyModels {
                            limit: limits.max_models,
                        },
                    )?);
                }
                (Arc::new(Model::new(model, &self.config)), true)
            }
        };
        let slot = {
            let mut cold = lock(&model.cold);
            if let Some(slot) = cold.free.pop_first() {
                slot
            } else if cold.next < model.capacity() {
                cold.next += 1;
                cold.next - 1
            } else {
                return Err(WorkerError::ModelFull {
                    model: model.name.to_string(),
                    capacity: model.capacity(),
                });
            }
        };
        let now = self.clock.now_nanos();
        let worker = Arc::new(Worker {
            id: worker_id,
            model: model.clone(),
            slot,
            dp_start: spec.dp_start,
            ranks: (0..spec.dp_size).map(|_| Rank::new(&spec, now)).collect(),
            combiner: Combiner::new(),
            busy: AtomicBool::new(false),
            removed: AtomicBool::new(false),
        });
        // The slot is fresh or was fully released by `remove_worker`.
        model.ids[slot].store(worker_id, Ordering::Relaxed);
        model.load[slot].store(0, Ordering::Relaxed);
        model.end_lease(slot);
        model
            .words_in_use
            .fetch_max(slot / 64 + 1, Ordering::AcqRel);
        let mut next = (*current).clone();
        next.workers.insert(worker_id, worker.clone());
        next.ranks = ranks_after;
        if let Some(name) = evict {
            next.models.remove(&name);
        }
        if new_model {
            next.models.insert(model.name.clone(), model.clone());
        }
        self.registry.store(Arc::new(next));
        // AcqRel in `set`: a router that sees the bit sees the id stored above.
        model.members.set(slot);
        model.members_epoch.fetch_add(1, Ordering::Release);
        model.workers.fetch_add(1, Ordering::Relaxed);
        // A busy-when-stale model or preset capacities can already decide.
        worker.reevaluate_and_wait();
        Ok(())
    }

    /// A model that can be dropped to make room for a new one: no workers,
    /// thresholds never set, the configured staleness, and no reference
    /// outside the registry (no worker, no [`Route`]). Called with the
    /// writer lock held, so no worker can join it meanwhile; a reader that
    /// holds a registry snapshot only makes the count higher, so the check
    /// errs on the side of keeping a model.
    fn evictable_model(&self, reg: &Registry) -> Option<Box<str>> {
        reg.models
            .iter()
            .find(|(_, m)| {
                Arc::strong_count(m) == 1
                    && m.workers.load(Ordering::Relaxed) == 0
                    && m.staleness() == self.config.staleness
                    && m.stale_after.load(Ordering::Relaxed) == nanos(self.config.stale_after)
                    && lock(&m.cold).thresholds.version == 0
            })
            .map(|(name, _)| name.clone())
    }

    /// Unregisters a worker: it leaves the busy set and the metrics at once.
    /// Outstanding [`Booking`]s on it become no-ops.
    pub fn remove_worker(&self, worker_id: u64) -> Result<(), WorkerError> {
        let _writer = lock(&self.writer);
        let current = self.registry.load_full();
        let Some(worker) = current.workers.get(&worker_id).cloned() else {
            return Err(WorkerError::Unknown(worker_id));
        };
        let model = &worker.model;
        model.members.clear(worker.slot);
        model.members_epoch.fetch_add(1, Ordering::Release);
        model.workers.fetch_sub(1, Ordering::Relaxed);
        worker.removed.store(true, Ordering::Relaxed);
        // Publishes "not busy" and clears the bit before the slot is reused.
        worker.reevaluate_and_wait();
        model.end_lease(worker.slot);
        let mut next = (*current).clone();
        next.workers.remove(&worker_id);
        next.ranks -= worker.ranks.len();
        self.registry.store(Arc::new(next));
        lock(&model.cold).free.insert(worker.slot);
        Ok(())
    }

    /// Ids of `model`'s workers, in slot order (empty for an unknown model).
    pub fn workers(&self, model: &str) -> Vec<u64> {
        let reg = self.registry.load();
        let Some(m) = reg.models.get(model) else {
            return Vec::new();
        };
        let mut ids: Vec<(usize, u64)> = reg
            .workers
            .values()
            .filter(|w| Arc::ptr_eq(&w.model, m))
            .map(|w| (w.slot, w.id))
            .collect();
        ids.sort_unstable();
        ids.into_iter().map(|(_, id)| id).collect()
    }

    /// Every model this monitor knows, sorted.
    pub fn models(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .registry
            .load()
            .models
            .keys()
            .map(|k| k.to_string())
            .collect();
        names.sort_unstable();
        names
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
            if model.leases_out.load(Ordering::Relaxed) != 0 && !model.busy.contains(worker.slot) {
                model.end_lease(worker.slot);
            }
            Ok(())
        });
        if let Err(e) = &result {
            let i = REFUSED_KINDS
                .iter()
                .position(|k| *k == e.kind())
                .unwrap_or(0);
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
    /// is released or dropped.
    pub fn book(&self, worker_id: u64, dp_rank: u32, blocks: u64) -> Result<Booking, ReportError> {
        let reg = self.registry.load();
        let (worker, rank) = Self::rank_of(&reg, worker_id, dp_rank)?;
        let rank_index = (dp_rank - worker.dp_start) as usize;
        add_saturating(&rank.active_decode_blocks, blocks);
        worker.reevaluate();
        Ok(Booking {
            worker: worker.clone(),
            rank: rank_index,
            blocks,
        })
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

    /// A routing handle for `model`: [`select`](Self::select) without the
    /// model lookup, for frontends that route to a known model on every
    /// request. Creates the model (with no workers, so `select` answers
    /// Unavailable) if it is new; models are never removed, so the handle
    /// stays valid while workers come and go.
    pub fn route(&self, model: &str) -> Result<Route, WorkerError> {
        if model.is_empty() {
            return Err(WorkerError::EmptyModel);
        }
        let found = self.registry.load().models.get(model).cloned();
        let model = match found {
            Some(m) => m,
            None => {
                let _writer = lock(&self.writer);
                let current = self.registry.load_full();
                match current.models.get(model) {
                    Some(m) => m.clone(),
                    None => {
                        let m = Arc::new(Model::new(model, &self.config));
                        let mut next = (*current).clone();
                        next.models.insert(m.name.clone(), m.clone());
                        self.registry.store(Arc::new(next));
                        m
                    }
                }
            }
        };
        Ok(Route {
            model,
            clock: self.clock.clone(),
        })
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
            best = Some(id);
            best_cost = cost;
        }
        best.ok_or_else(|| m.overloaded(DEFAULT_ENDPOINT))
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
        m.lease_deadline[w.slot].store(deadline, Ordering::Relaxed);
        // AcqRel in `set` orders the deadline store before the bit.
        if m.leased.set(w.slot) {
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

    /// Sets `model`'s staleness policy and re-sweeps.
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
        m.stale_after.store(nanos(stale_after), Ordering::Relaxed);
        m.staleness.store(policy.to_u64(), Ordering::Relaxed);
        drop(reg);
        self.sweep();
        Ok(())
    }

    /// The off-hot-path sweep: marks ranks silent for `stale_after` as stale
    /// (for models whose policy is not `keep`), un-marks ranks that reported,
    /// re-evaluates the workers whose state changed, and ends expired leases.
    /// Call it periodically (e.g. every few hundred milliseconds); a rank is
    /// stale once it missed reports for `stale_after` plus at most one period.
    /// Returns the number of workers re-evaluated.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_nanos();
        let reg = self.registry.load_full();
        let mut changed_workers = 0;
        for w in reg.workers.values() {
            let m = &w.model;
            let policy = m.staleness();
            let after = m.stale_after.load(Ordering::Relaxed);
            let mut changed = false;
            for rank in w.ranks.iter() {
                let stale = if rank.seen.swap(false, Ordering::Relaxed) {
                    rank.last_seen.store(now, Ordering::Relaxed);
                    false
                } else {
                    policy != Staleness::Keep
                        && now.saturating_sub(rank.last_seen.load(Ordering::Relaxed)) >= after
                };
                if rank.stale.swap(stale, Ordering::Relaxed) != stale {
                    changed = true;
                }
            }
            if changed {
                w.reevaluate_and_wait();
                changed_workers += 1;
            }
        }
        for m in reg
            .models
            .values()
            .filter(|m| m.leases_out.load(Ordering::Relaxed) != 0)
        {
            for w in 0..m.words_in_use() {
                for b in BitIter(m.leased.word(w)) {
                    let slot = w * 64 + b;
                    if m.lease_deadline[slot].load(Ordering::Relaxed) <= now {
                        m.end_lease(slot);
                    }
                }
            }
        }
        changed_workers
    }

    // -- metrics (cold path) ------------------------------------------------

    /// Load reports refused so far, by reason (`unknown_worker`,
    /// `undeclared_rank`, `invalid_value`).
    pub fn refused_reports(&self) -> [(&'static str, u64); 3] {
        std::array::from_fn(|i| (REFUSED_KINDS[i], self.refused[i].load(Ordering::Relaxed)))
    }

    /// Registrations [`add_worker`](Self::add_worker) refused so far, by
    /// reason ([`WorkerError::ADD_KINDS`], zeros included).
    pub fn refused_registrations(&self) -> [(&'static str, u64); WorkerError::ADD_KINDS.len()] {
        std::array::from_fn(|i| {
            (
                WorkerError::ADD_KINDS[i],
                self.refused_workers[i].load(Ordering::Relaxed),
            )
        })
    }

    /// Rejections counted for `model`: `(reason, count)` for
    /// `all_workers_busy`, `worker_overloaded` and `no_workers`.
    pub fn rejections(&self, model: &str) -> Vec<(Reason, u64)> {
        let reg = self.registry.load();
        let Some(m) = reg.models.get(model) else {
            return Vec::new();
        };
        REJECTED_REASONS
            .iter()
            .zip(&m.rejected)
            .map(|(r, c)| (*r, c.load(Ordering::Relaxed)))
            .collect()
    }

    /// The frontend metrics in Prometheus text format.
    pub fn metrics_text(&self) -> String {
        let p = self.config.metrics_prefix.as_str();
        let reg = self.registry.load_full();
        let mut models: Vec<&Arc<Model>> = reg.models.values().collect();
        models.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let mut workers: Vec<&Arc<Worker>> = reg.workers.values().collect();
        workers.sort_unstable_by_key(|w| w.id);
        let mut out = String::new();

        metrics::header(
            &mut out,
            p,
            "frontend_model_rejection_total",
            "counter",
            "Requests rejected because the model's eligible workers were busy.",
        );
        for m in &models {
            let endpoints = m.endpoints.load();
            let mut endpoints: Vec<&Arc<EndpointCounter>> = endpoints.iter().collect();
            endpoints.sort_unstable_by(|a, b| a.endpoint.cmp(&b.endpoint));
            for c in endpoints {
                metrics::sample(
                    &mut out,
                    p,
                    "frontend_model_rejection_total",
                    &[("model", &m.name), ("endpoint", &c.endpoint)],
                    c.count.load(Ordering::Relaxed),
                );
            }
        }
        metrics::header(
            &mut out,
            p,
            "frontend_model_rejection_by_reason_total",
            "counter",
            "Routing rejections by reason.",
        );
        for m in &models {
            for (r, c) in REJECTED_REASONS.iter().zip(&m.rejected) {
                metrics::sample(
                    &mut out,
                    p,
                    "frontend_model_rejection_by_reason_total",
                    &[("model", &m.name), ("reason", &r.as_str())],
                    c.load(Ordering::Relaxed),
                );
            }
        }
        for (name, help, field) in [
            (
                "frontend_worker_active_decode_blocks",
                "Latest active decode blocks per worker rank.",
                0,
            ),
            (
                "frontend_worker_active_prefill_tokens",
                "Latest active prefill tokens per worker rank.",
                1,
            ),
        ] {
            metrics::header(&mut out, p, name, "gauge", help);
            for w in &workers {
                for (i, rank) in w.ranks.iter().enumerate() {
                    let l = rank.load();
                    let value = if field == 0 {
                        Some(l.active_decode_blocks)
                    } else {
                        l.active_prefill_tokens
                    };
                    if let Some(v) = value {
                        let dp_rank = w.dp_start + i as u32;
                        metrics::sample(
                            &mut out,
                            p,
                            name,
                            &[("worker_id", &w.id), ("dp_rank", &dp_rank)],
                            v,
                        );
                    }
                }
            }
        }
        for (name, help, kind) in [
            (
                "frontend_model_workers",
                "Registered workers per model.",
                "gauge",
            ),
            (
                "frontend_model_busy_workers",
                "Busy workers per model.",
                "gauge",
            ),
            (
                "frontend_model_threshold_version",
                "Version of the model's busy thresholds.",
                "gauge",
            ),
        ] {
            metrics::header(&mut out, p, name, kind, help);
            for m in &models {
                let v = match name {
                    "frontend_model_workers" => m.workers.load(Ordering::Relaxed) as u64,
                    "frontend_model_busy_workers" => m.busy_workers.load(Ordering::Relaxed) as u64,
                    _ => lock(&m.cold).thresholds.version,
                };
                metrics::sample(&mut out, p, name, &[("model", &m.name)], v);
            }
        }
        metrics::header(
            &mut out,
            p,
            "frontend_load_reports_refused_total",
            "counter",
            "Load reports refused, by reason.",
        );
        for (kind, count) in self.refused_reports() {
            metrics::sample(
                &mut out,
                p,
                "frontend_load_reports_refused_total",
                &[("reason", &kind)],
                count,
            );
        }
        let name = "frontend_worker_registrations_refused_total";
        metrics::header(
            &mut out,
            p,
            name,
            "counter",
            "Worker registrations refused, by reason.",
        );
        for (kind, count) in self.refused_registrations() {
            metrics::sample(&mut out, p, name, &[("reason", &kind)], count);
        }
        out
    }
}

/// A routing handle for one model, from [`Monitor::route`]: `select` reads
/// the model's bitsets directly, with no registry guard and no name lookup.
/// Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct Route {
    model: Arc<Model>,
    clock: SharedClock,
}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route")
            .field("model", &self.model.name)
            .finish_non_exhaustive()
    }
}

impl Route {
    /// The model this handle routes to.
    pub fn model(&self) -> &str {
        &self.model.name
    }

    /// [`Monitor::select`] for this handle's model.
    #[inline]
    pub fn select(&self, policy: Policy) -> Result<u64, RouteError> {
        self.model.select(policy, &self.clock, DEFAULT_ENDPOINT)
    }

    /// [`Monitor::select_at`] for this handle's model.
    #[inline]
    pub fn select_at(&self, policy: Policy, endpoint: &str) -> Result<u64, RouteError> {
        self.model.select(policy, &self.clock, endpoint)
    }
}

/// Adds to a counter, saturating at `u64::MAX - 1`.
#[inline]
fn add_saturating(a: &AtomicU64, n: u64) {
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_add(n))
    });
}

/// Subtracts from a counter, stopping at zero (a report may have lowered it).
#[inline]
fn sub_saturating(a: &AtomicU64, n: u64) {
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(n))
    });
}

/// A request's KV blocks booked on a worker rank by the router; counted in
/// that rank's `active_decode_blocks` until released or dropped.
#[derive(Debug)]
pub struct Booking {
    worker: Arc<Worker>,
    rank: usize,
    blocks: u64,
}

impl Booking {
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
