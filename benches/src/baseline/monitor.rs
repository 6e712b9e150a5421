//! Reference monitor: per-worker load maps in a `DashMap`, re-evaluated per
//! event by one monitor task.
//!
//! This models the reference system's worker monitor: a
//! `DashMap<u64, WorkerLoadState>` where each load field is its own
//! `HashMap<u32, u64>` keyed by data-parallel rank, thresholds behind an
//! `RwLock` that every event reads (and clones), and a busy decision
//! re-evaluated for the reporting worker on every event. The worker-level
//! check walks the declared ranks, which the reference clones out of the
//! worker state on every evaluation. When the busy set changes, the monitor
//! turns its `HashSet` into a `Vec` and hands it to the router, which
//! rebuilds its snapshot ([`RefRouter::set_overloaded`]).
//!
//! A threshold update only stores the new values; the next event notices the
//! change and re-evaluates every worker (the reference does not re-evaluate
//! when the update is made).
//!
//! The event loop is one task in the reference, so its private state
//! (known workers, known ranks, the busy tracker, the last thresholds seen)
//! is owned by [`RefMonitorTask`] and needs no lock; the shared parts are in
//! [`RefMonitor`].

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use dashmap::DashMap;

use super::routing::RefRouter;

/// `max_num_batched_tokens` when the worker did not say (the reference's).
const DEFAULT_MAX_TOKENS: u64 = 10_000_000;

/// The three thresholds; `None` disables a check.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RefThresholds {
    /// Decode threshold, a fraction of `kv_total_blocks`.
    pub active_decode_blocks_threshold: Option<f64>,
    /// Absolute prefill threshold.
    pub active_prefill_tokens_threshold: Option<u64>,
    /// Prefill threshold as a fraction of `max_num_batched_tokens`.
    pub active_prefill_tokens_threshold_frac: Option<f64>,
}

impl RefThresholds {
    fn is_configured(&self) -> bool {
        self.active_decode_blocks_threshold.is_some()
            || self.active_prefill_tokens_threshold.is_some()
            || self.active_prefill_tokens_threshold_frac.is_some()
    }
}

/// One load event for one rank (the reference's `ActiveLoad`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefLoad {
    /// Router-side active decode blocks.
    pub active_decode_blocks: Option<u64>,
    /// Prefill tokens in flight.
    pub active_prefill_tokens: Option<u64>,
    /// KV cache blocks in use.
    pub kv_used_blocks: Option<u64>,
}

#[derive(Debug, Clone)]
struct Latch {
    latched: bool,
    kv_used_cleared: bool,
    active_decode_cleared: bool,
}

impl Default for Latch {
    fn default() -> Self {
        Self {
            latched: false,
            kv_used_cleared: true,
            active_decode_cleared: true,
        }
    }
}

/// One worker's load, one map per field keyed by rank.
#[derive(Debug, Clone, Default)]
struct WorkerLoadState {
    active_decode_blocks: HashMap<u32, u64>,
    kv_used_blocks: HashMap<u32, u64>,
    kv_total_blocks: HashMap<u32, u64>,
    active_prefill_tokens: HashMap<u32, u64>,
    max_num_batched_tokens: HashMap<u32, u64>,
    declared_dp_ranks: Option<HashSet<u32>>,
    decode_latches: HashMap<u32, Latch>,
}

fn decode_over(used: u64, total: u64, t: f64) -> bool {
    total > 0 && (used as f64) > t * total as f64
}

impl WorkerLoadState {
    fn declare(&mut self, dp_start: u32, dp_size: u32, kv_total: Option<u64>, max: Option<u64>) {
        let ranks: HashSet<u32> = (dp_start..dp_start + dp_size).collect();
        self.kv_total_blocks.clear();
        self.max_num_batched_tokens.clear();
        for &r in &ranks {
            if let Some(t) = kv_total {
                self.kv_total_blocks.insert(r, t);
            }
            if let Some(m) = max {
                self.max_num_batched_tokens.insert(r, m);
            }
        }
        self.declared_dp_ranks = Some(ranks);
    }

    fn accepts_dp_rank(&self, dp_rank: u32) -> bool {
        self.declared_dp_ranks
            .as_ref()
            .is_none_or(|d| d.contains(&dp_rank))
    }

    fn update_latch(&mut self, rank: u32, active: Option<u64>, used: Option<u64>, t: f64) {
        let Some(&total) = self.kv_total_blocks.get(&rank) else {
            return;
        };
        if total == 0 {
            return;
        }
        let active_over = active.is_some_and(|v| decode_over(v, total, t));
        let used_over = used.is_some_and(|v| decode_over(v, total, t));
        let latch = self.decode_latches.entry(rank).or_default();
        if active_over || used_over {
            latch.latched = true;
        }
        if let Some(v) = active {
            latch.active_decode_cleared = !decode_over(v, total, t);
        }
        if let Some(v) = used {
            latch.kv_used_cleared = !decode_over(v, total, t);
        }
        if latch.latched && latch.kv_used_cleared && latch.active_decode_cleared {
            latch.latched = false;
        }
    }

    fn apply(&mut self, rank: u32, load: &RefLoad, decode_threshold: Option<f64>) {
        if let Some(v) = load.active_decode_blocks {
            self.active_decode_blocks.insert(rank, v);
        }
        if let Some(v) = load.kv_used_blocks {
            self.kv_used_blocks.insert(rank, v);
        }
        if let Some(v) = load.active_prefill_tokens {
            self.active_prefill_tokens.insert(rank, v);
        }
        if let Some(t) = decode_threshold {
            self.update_latch(rank, load.active_decode_blocks, load.kv_used_blocks, t);
        }
    }

    fn current_decode_over(&self, rank: u32, t: f64) -> bool {
        let Some(&total) = self.kv_total_blocks.get(&rank) else {
            return false;
        };
        self.kv_used_blocks
            .get(&rank)
            .is_some_and(|&v| decode_over(v, total, t))
            || self
                .active_decode_blocks
                .get(&rank)
                .is_some_and(|&v| decode_over(v, total, t))
    }

    fn is_overloaded(&self, cfg: &RefThresholds) -> bool {
        if !cfg.is_configured() {
            return false;
        }
        // The reference clones the declared rank set on every evaluation.
        let ranks = self.declared_dp_ranks.clone().unwrap_or_else(|| {
            self.active_decode_blocks
                .keys()
                .chain(self.kv_used_blocks.keys())
                .chain(self.decode_latches.keys())
                .chain(self.active_prefill_tokens.keys())
                .copied()
                .collect()
        });
        if ranks.is_empty() {
            return false;
        }
        ranks.iter().all(|&rank| {
            if let Some(&tokens) = self.active_prefill_tokens.get(&rank) {
                if cfg
                    .active_prefill_tokens_threshold
                    .is_some_and(|n| tokens > n)
                {
                    return true;
                }
                if let Some(frac) = cfg.active_prefill_tokens_threshold_frac {
                    let max = self
                        .max_num_batched_tokens
                        .get(&rank)
                        .copied()
                        .unwrap_or(DEFAULT_MAX_TOKENS);
                    if tokens > (frac * max as f64) as u64 {
                        return true;
                    }
                }
            }
            if let Some(t) = cfg.active_decode_blocks_threshold {
                let over = self
                    .decode_latches
                    .get(&rank)
                    .map(|l| l.latched)
                    .unwrap_or_else(|| self.current_decode_over(rank, t));
                if over {
                    return true;
                }
            }
            false
        })
    }
}

/// The monitor's shared state: load maps, thresholds, and the router it
/// publishes to.
#[derive(Debug)]
pub struct RefMonitor {
    states: DashMap<u64, WorkerLoadState>,
    thresholds: RwLock<RefThresholds>,
    router: Arc<RefRouter>,
}

impl RefMonitor {
    /// A monitor publishing to `router`, with `thresholds`.
    pub fn new(router: Arc<RefRouter>, thresholds: RefThresholds) -> Arc<Self> {
        Arc::new(Self {
            states: DashMap::new(),
            thresholds: RwLock::new(thresholds),
            router,
        })
    }

    /// The router this monitor publishes to.
    pub fn router(&self) -> &Arc<RefRouter> {
        &self.router
    }

    /// The reference's threshold update: merges the given fields and returns.
    /// Workers are re-evaluated by the next event.
    pub fn update_thresholds(&self, update: &RefThresholds) {
        let mut t = self.thresholds.write().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = update.active_decode_blocks_threshold {
            t.active_decode_blocks_threshold = Some(v);
        }
        if let Some(v) = update.active_prefill_tokens_threshold {
            t.active_prefill_tokens_threshold = Some(v);
        }
        if let Some(v) = update.active_prefill_tokens_threshold_frac {
            t.active_prefill_tokens_threshold_frac = Some(v);
        }
    }

    fn thresholds(&self) -> RefThresholds {
        *self.thresholds.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// The monitor's event loop: owns the task-private state.
#[derive(Debug)]
pub struct RefMonitorTask {
    shared: Arc<RefMonitor>,
    known_workers: HashSet<u64>,
    known_worker_dp_ranks: HashMap<u64, HashSet<u32>>,
    overloaded: HashSet<u64>,
    last_thresholds: RefThresholds,
}

/// An event the reference monitor dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefEventError {
    /// The worker is not known.
    UnknownWorker,
    /// The rank is outside the worker's declared ranks.
    UndeclaredRank,
}

impl RefMonitorTask {
    /// The event loop of `shared`.
    pub fn new(shared: Arc<RefMonitor>) -> Self {
        let last_thresholds = shared.thresholds();
        Self {
            shared,
            known_workers: HashSet::new(),
            known_worker_dp_ranks: HashMap::new(),
            overloaded: HashSet::new(),
            last_thresholds,
        }
    }

    /// The shared state.
    pub fn shared(&self) -> &Arc<RefMonitor> {
        &self.shared
    }

    /// Discovery: a worker with ranks `dp_start..dp_start + dp_size`.
    pub fn add_worker(
        &mut self,
        id: u64,
        dp_start: u32,
        dp_size: u32,
        kv_total_blocks: Option<u64>,
        max_num_batched_tokens: Option<u64>,
    ) {
        self.known_workers.insert(id);
        self.shared.states.entry(id).or_default().declare(
            dp_start,
            dp_size,
            kv_total_blocks,
            max_num_batched_tokens,
        );
    }

    /// Handles one load event, as the reference's monitor task does.
    pub fn on_event(&mut self, id: u64, dp_rank: u32, load: &RefLoad) -> Result<(), RefEventError> {
        if !self.known_workers.contains(&id) {
            return Err(RefEventError::UnknownWorker);
        }
        if self
            .shared
            .states
            .get(&id)
            .is_some_and(|s| !s.accepts_dp_rank(dp_rank))
        {
            return Err(RefEventError::UndeclaredRank);
        }
        self.known_worker_dp_ranks
            .entry(id)
            .or_default()
            .insert(dp_rank);
        let cfg = self.shared.thresholds();
        let thresholds_changed = cfg != self.last_thresholds;
        let worker_overloaded = {
            let mut state = self.shared.states.entry(id).or_default();
            state.apply(dp_rank, load, cfg.active_decode_blocks_threshold);
            state.is_overloaded(&cfg)
        };
        let changed = if thresholds_changed {
            self.last_thresholds = cfg;
            let all: HashSet<u64> = self
                .shared
                .states
                .iter()
                .filter_map(|e| e.value().is_overloaded(&cfg).then_some(*e.key()))
                .collect();
            if all == self.overloaded {
                false
            } else {
                self.overloaded = all;
                true
            }
        } else if worker_overloaded {
            self.overloaded.insert(id)
        } else {
            self.overloaded.remove(&id)
        };
        if changed {
            let ids: Vec<u64> = self.overloaded.iter().copied().collect();
            self.shared.router.set_overloaded(&ids);
        }
        Ok(())
    }

    /// Number of workers the monitor counts as busy.
    pub fn busy_count(&self) -> usize {
        self.overloaded.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_when_all_ranks_are_and_published_to_the_router() {
        let router = Arc::new(RefRouter::new(&[1, 2]));
        let shared = RefMonitor::new(
            router.clone(),
            RefThresholds {
                active_decode_blocks_threshold: Some(0.9),
                ..Default::default()
            },
        );
        let mut task = RefMonitorTask::new(shared.clone());
        task.add_worker(1, 0, 2, Some(100), None);
        task.add_worker(2, 0, 1, Some(100), None);
        let high = RefLoad {
            kv_used_blocks: Some(95),
            ..Default::default()
        };
        task.on_event(1, 0, &high).unwrap();
        assert_eq!(task.busy_count(), 0, "one of two ranks busy: worker free");
        task.on_event(1, 1, &high).unwrap();
        assert_eq!(task.busy_count(), 1);
        assert_eq!(router.free_count(), 1);
        assert_eq!(router.select_round_robin(), Ok(2));
        assert_eq!(
            task.on_event(1, 5, &high),
            Err(RefEventError::UndeclaredRank)
        );
        assert_eq!(
            task.on_event(9, 0, &high),
            Err(RefEventError::UnknownWorker)
        );
        // A raised threshold takes effect at the next event, not before.
        shared.update_thresholds(&RefThresholds {
            active_decode_blocks_threshold: Some(0.99),
            ..Default::default()
        });
        assert_eq!(task.busy_count(), 1);
        task.on_event(1, 0, &high).unwrap();
        assert_eq!(task.busy_count(), 0);
        assert_eq!(router.free_count(), 2);
    }
}
