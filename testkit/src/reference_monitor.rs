//! The reference monitor: plain maps and the busy rule written out again,
//! recomputing everything on demand. Each operation of the real monitor has
//! a method here that applies it and returns what the real monitor must
//! answer, so a differential driver (`core/tests/monitor_differential.rs`,
//! the `monitor_ops` fuzz target) only generates operations and compares.
//!
//! Models are indices into the names given to [`Reference::new`].

use std::collections::{BTreeSet, HashMap};

use loadgate::{
    LoadReport, ReportError, RouteError, ThresholdError, ThresholdField, WorkerError, WorkerSpec,
};

/// `max_num_batched_tokens` of a rank that has neither declared nor reported
/// one (the monitor's default).
pub const DEFAULT_MNBT: u64 = 10_000_000;

/// One rank's load, as last reported.
#[derive(Debug, Clone, Default)]
pub struct RefRank {
    /// `active_decode_blocks` (reported, plus bookings).
    pub decode: u64,
    /// `kv_used_blocks`.
    pub used: u64,
    /// `kv_total_blocks`.
    pub total: u64,
    /// `active_prefill_tokens`, `None` until reported.
    pub prefill: Option<u64>,
    /// `max_num_batched_tokens`.
    pub mnbt: u64,
    /// `waiting_requests`, `None` until reported.
    pub waiting: Option<u64>,
}

/// A registered worker.
#[derive(Debug, Clone)]
pub struct RefWorker {
    /// Its model's index.
    pub model: usize,
    /// First declared rank.
    pub dp_start: u32,
    /// The declared ranks, from `dp_start` on.
    pub ranks: Vec<RefRank>,
    /// Lease end in milliseconds of reference time, if marked overloaded.
    pub lease_until: Option<u64>,
    /// Which registration this is: a booking on an earlier one of the same
    /// id touches nothing when released.
    pub generation: u64,
}

/// A model's thresholds and version.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RefThresholds {
    /// `active_decode_blocks_threshold`.
    pub decode: Option<f64>,
    /// `active_prefill_tokens_threshold`.
    pub abs: Option<u64>,
    /// `active_prefill_tokens_threshold_frac`.
    pub frac: Option<f64>,
    /// `waiting_requests_threshold`.
    pub waiting: Option<u64>,
    /// Bumped by every update that changes something.
    pub version: u64,
}

/// What a threshold update does, by the rules written out again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RefUpdate {
    /// A value out of range, or a field both set and cleared: refused,
    /// nothing changes.
    Refused,
    /// Nothing to set or clear: a read, the version stays.
    Unchanged,
    /// The merged thresholds, one version later.
    Next(RefThresholds),
}

impl RefThresholds {
    /// Applies an update: cleared fields first, then set fields overwrite.
    pub fn apply(
        self,
        decode: Option<f64>,
        abs: Option<u64>,
        frac: Option<f64>,
        waiting: Option<u64>,
        clear: &[ThresholdField],
    ) -> RefUpdate {
        let bad_decode = decode.is_some_and(|t| !(t.is_finite() && (0.0..=1.0).contains(&t)));
        let bad_frac = frac.is_some_and(|f| !(f.is_finite() && f >= 0.0));
        let conflict = clear.iter().any(|f| match f {
            ThresholdField::ActiveDecodeBlocks => decode.is_some(),
            ThresholdField::ActivePrefillTokens => abs.is_some(),
            ThresholdField::ActivePrefillTokensFrac => frac.is_some(),
            ThresholdField::WaitingRequests => waiting.is_some(),
        });
        if bad_decode || bad_frac || conflict {
            return RefUpdate::Refused;
        }
        if decode.is_none()
            && abs.is_none()
            && frac.is_none()
            && waiting.is_none()
            && clear.is_empty()
        {
            return RefUpdate::Unchanged;
        }
        let mut next = self;
        for f in clear {
            match f {
                ThresholdField::ActiveDecodeBlocks => next.decode = None,
                ThresholdField::ActivePrefillTokens => next.abs = None,
                ThresholdField::ActivePrefillTokensFrac => next.frac = None,
                ThresholdField::WaitingRequests => next.waiting = None,
            }
        }
        next.decode = decode.or(next.decode);
        next.abs = abs.or(next.abs);
        next.frac = frac.or(next.frac);
        next.waiting = waiting.or(next.waiting);
        next.version += 1;
        RefUpdate::Next(next)
    }
}

/// A booking as the reference sees it: what releasing it gives back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RefBooking {
    /// The worker.
    pub id: u64,
    /// The rank's index among the worker's declared ranks.
    pub rank_index: usize,
    /// Blocks held (saturating, as the booking's own count).
    pub blocks: u64,
    /// The registration it was made on.
    pub generation: u64,
}

/// The reference: plain maps, recomputing everything on demand.
#[derive(Debug)]
pub struct Reference {
    /// Model names by index.
    pub models: Vec<String>,
    /// Workers a model may hold (`Limits::max_workers_per_model`).
    pub capacity: usize,
    /// Lease length of `mark_overloaded`, in milliseconds.
    pub lease_ms: u64,
    /// Registered workers by id.
    pub workers: HashMap<u64, RefWorker>,
    /// Models the monitor knows (a worker was added, or a route taken).
    pub known_models: BTreeSet<usize>,
    /// Thresholds of the models that have been set.
    pub thresholds: HashMap<usize, RefThresholds>,
    /// Reference time in milliseconds (the manual clock's).
    pub now_ms: u64,
    /// Registrations so far.
    pub generations: u64,
}

impl Reference {
    /// An empty monitor over the named models.
    pub fn new(models: &[&str], capacity: usize, lease_ms: u64) -> Self {
        Reference {
            models: models.iter().map(|&m| m.to_owned()).collect(),
            capacity,
            lease_ms,
            workers: HashMap::new(),
            known_models: BTreeSet::new(),
            thresholds: HashMap::new(),
            now_ms: 0,
            generations: 0,
        }
    }

    // ----- the busy rule ----------------------------------------------------

    /// Whether one rank is over any threshold.
    pub fn rank_busy(t: &RefThresholds, r: &RefRank) -> bool {
        let decode = t.decode.is_some_and(|t| {
            r.total != 0 && {
                let line = t * r.total as f64;
                r.used as f64 > line || r.decode as f64 > line
            }
        });
        let abs = matches!((t.abs, r.prefill), (Some(n), Some(p)) if p > n);
        let frac = matches!((t.frac, r.prefill), (Some(f), Some(p)) if p as f64 > (f * r.mnbt as f64).floor());
        let waiting = matches!((t.waiting, r.waiting), (Some(n), Some(w)) if w > n);
        decode || abs || frac || waiting
    }

    /// A worker is busy when it has ranks and every one is busy.
    pub fn busy(&self, id: u64) -> bool {
        let w = &self.workers[&id];
        let t = self.thresholds.get(&w.model).copied().unwrap_or_default();
        !w.ranks.is_empty() && w.ranks.iter().all(|r| Self::rank_busy(&t, r))
    }

    /// Whether a worker's overload lease is running.
    pub fn leased(&self, id: u64) -> bool {
        self.workers[&id]
            .lease_until
            .is_some_and(|until| self.now_ms < until)
    }

    /// The workers of `model` a select may pick.
    pub fn eligible(&self, model: usize) -> BTreeSet<u64> {
        self.workers
            .iter()
            .filter(|(id, w)| w.model == model && !self.busy(**id) && !self.leased(**id))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The busy workers of `model`, sorted.
    pub fn busy_set(&self, model: usize) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .workers
            .iter()
            .filter(|(id, w)| w.model == model && self.busy(**id))
            .map(|(id, _)| *id)
            .collect();
        v.sort_unstable();
        v
    }

    /// The workers of `model`, sorted.
    pub fn workers_of(&self, model: usize) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .workers
            .iter()
            .filter(|(_, w)| w.model == model)
            .map(|(id, _)| *id)
            .collect();
        v.sort_unstable();
        v
    }

    /// The known models' names, sorted.
    pub fn model_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .known_models
            .iter()
            .map(|&i| self.models[i].clone())
            .collect();
        v.sort_unstable();
        v
    }

    /// Whether `model` has any worker.
    pub fn has_workers(&self, model: usize) -> bool {
        self.workers.values().any(|w| w.model == model)
    }

    /// A declared rank of a registered worker.
    pub fn rank_mut(&mut self, id: u64, rank: u32) -> Option<&mut RefRank> {
        let w = self.workers.get_mut(&id)?;
        let i = rank.checked_sub(w.dp_start)?;
        w.ranks.get_mut(i as usize)
    }

    // ----- operations -------------------------------------------------------

    /// `add_worker`: registers the worker, or the error the monitor must
    /// give.
    pub fn add_worker(
        &mut self,
        model: usize,
        id: u64,
        spec: WorkerSpec,
    ) -> Result<(), WorkerError> {
        let name = &self.models[model];
        let WorkerSpec {
            dp_start, dp_size, ..
        } = spec;
        if name.is_empty() {
            return Err(WorkerError::EmptyModel);
        }
        if dp_start.checked_add(dp_size).is_none() {
            return Err(WorkerError::InvalidRanks { dp_start, dp_size });
        }
        if self.workers.contains_key(&id) {
            return Err(WorkerError::Duplicate(id));
        }
        if self.workers.values().filter(|w| w.model == model).count() >= self.capacity {
            return Err(WorkerError::ModelFull {
                model: name.clone(),
                capacity: self.capacity,
            });
        }
        self.generations += 1;
        let rank = RefRank {
            total: spec.kv_total_blocks.unwrap_or(0),
            mnbt: spec.max_num_batched_tokens.unwrap_or(DEFAULT_MNBT),
            ..Default::default()
        };
        self.workers.insert(
            id,
            RefWorker {
                model,
                dp_start,
                ranks: vec![rank; dp_size as usize],
                lease_until: None,
                generation: self.generations,
            },
        );
        self.known_models.insert(model);
        Ok(())
    }

    /// `remove_worker`.
    pub fn remove_worker(&mut self, id: u64) -> Result<(), WorkerError> {
        self.workers
            .remove(&id)
            .map(|_| ())
            .ok_or(WorkerError::Unknown(id))
    }

    /// `report`: applies the given fields to the rank; a report that leaves
    /// the worker free ends its lease.
    pub fn report(&mut self, id: u64, rank: u32, report: &LoadReport) -> Result<(), ReportError> {
        let Some(w) = self.workers.get(&id) else {
            return Err(ReportError::UnknownWorker(id));
        };
        let (dp_start, dp_size) = (w.dp_start, w.ranks.len() as u32);
        let Some(rr) = self.rank_mut(id, rank) else {
            return Err(ReportError::UndeclaredRank {
                worker_id: id,
                dp_rank: rank,
                dp_start,
                dp_size,
            });
        };
        // u64::MAX marks "never reported" inside the monitor.
        for (field, value) in [
            ("active_prefill_tokens", report.active_prefill_tokens),
            ("waiting_requests", report.waiting_requests),
        ] {
            if value == Some(u64::MAX) {
                return Err(ReportError::InvalidValue {
                    field,
                    value: u64::MAX,
                });
            }
        }
        if let Some(v) = report.active_decode_blocks {
            rr.decode = v;
        }
        if let Some(v) = report.kv_used_blocks {
            rr.used = v;
        }
        if let Some(v) = report.kv_total_blocks {
            rr.total = v;
        }
        if let Some(v) = report.active_prefill_tokens {
            rr.prefill = Some(v);
        }
        if let Some(v) = report.max_num_batched_tokens {
            rr.mnbt = v;
        }
        if let Some(v) = report.waiting_requests {
            rr.waiting = Some(v);
        }
        if !self.busy(id) {
            self.workers.get_mut(&id).unwrap().lease_until = None;
        }
        Ok(())
    }

    /// `set_thresholds`: the model's thresholds before the update and what
    /// the update does (applied when it is [`RefUpdate::Next`]), or the
    /// unknown-model error.
    pub fn set_thresholds(
        &mut self,
        model: usize,
        decode: Option<f64>,
        abs: Option<u64>,
        frac: Option<f64>,
        waiting: Option<u64>,
        clear: &[ThresholdField],
    ) -> Result<(RefThresholds, RefUpdate), ThresholdError> {
        if !self.known_models.contains(&model) {
            return Err(ThresholdError::UnknownModel(self.models[model].clone()));
        }
        let cur = self.thresholds.get(&model).copied().unwrap_or_default();
        let update = cur.apply(decode, abs, frac, waiting, clear);
        if let RefUpdate::Next(next) = update {
            self.thresholds.insert(model, next);
        }
        Ok((cur, update))
    }

    /// `route`: taking a route makes its model known.
    pub fn route(&mut self, model: usize) {
        self.known_models.insert(model);
    }

    /// Whether `got` is a correct answer of `select` on `model` (any eligible
    /// worker; Unavailable without workers; Overloaded with none eligible),
    /// or why not.
    pub fn check_select(&self, model: usize, got: Result<u64, RouteError>) -> Result<(), String> {
        let eligible = self.eligible(model);
        let ok = match got {
            Ok(id) => eligible.contains(&id),
            Err(RouteError::Unavailable) => !self.has_workers(model),
            Err(RouteError::Overloaded) => self.has_workers(model) && eligible.is_empty(),
            Err(_) => false,
        };
        if ok {
            Ok(())
        } else {
            Err(format!("select answered {got:?}; eligible {eligible:?}"))
        }
    }

    /// `select_min_cost`: the first eligible candidate of least cost (NaN
    /// counts as infinite).
    pub fn select_min_cost(&self, model: usize, costs: &[(u64, f64)]) -> Result<u64, RouteError> {
        if !self.has_workers(model) {
            return Err(RouteError::Unavailable);
        }
        let eligible = self.eligible(model);
        let mut best: Option<(u64, f64)> = None;
        for &(id, cost) in costs {
            let cost = if cost.is_nan() { f64::INFINITY } else { cost };
            if eligible.contains(&id) && best.is_none_or(|(_, b)| cost < b) {
                best = Some((id, cost));
            }
        }
        best.map(|(id, _)| id).ok_or(RouteError::Overloaded)
    }

    /// `check`: a pinned request may go to the worker.
    pub fn check(&self, id: u64) -> Result<(), RouteError> {
        if !self.workers.contains_key(&id) {
            Err(RouteError::UnknownWorker(id))
        } else if self.busy(id) || self.leased(id) {
            Err(RouteError::WorkerOverloaded)
        } else {
            Ok(())
        }
    }

    /// `mark_overloaded`: starts (or restarts) the worker's lease.
    pub fn mark_overloaded(&mut self, id: u64) -> Result<(), RouteError> {
        let until = self.now_ms + self.lease_ms;
        let w = self
            .workers
            .get_mut(&id)
            .ok_or(RouteError::UnknownWorker(id))?;
        w.lease_until = Some(until);
        Ok(())
    }

    /// The clock moves on.
    pub fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
    }

    /// `book`: adds the blocks to the rank's decode load; `None` where the
    /// monitor must refuse (unknown worker, undeclared rank).
    pub fn book(&mut self, id: u64, rank: u32, blocks: u64) -> Option<RefBooking> {
        let (dp_start, generation) = self.workers.get(&id).map(|w| (w.dp_start, w.generation))?;
        let rr = self.rank_mut(id, rank)?;
        rr.decode = rr.decode.saturating_add(blocks);
        Some(RefBooking {
            id,
            rank_index: (rank - dp_start) as usize,
            blocks,
            generation,
        })
    }

    /// `Booking::add_output_blocks`: the booking's count saturates, and the
    /// rank gains what the booking gained (if the registration still
    /// stands).
    pub fn add_output_blocks(&mut self, b: &mut RefBooking, blocks: u64) {
        let n = blocks.min(u64::MAX - b.blocks);
        b.blocks += n;
        if let Some(rr) = self.booked_rank(b) {
            rr.decode = rr.decode.saturating_add(n);
        }
    }

    /// Releasing a booking gives its blocks back (if the registration still
    /// stands).
    pub fn release(&mut self, b: RefBooking) {
        if let Some(rr) = self.booked_rank(&b) {
            rr.decode = rr.decode.saturating_sub(b.blocks);
        }
    }

    fn booked_rank(&mut self, b: &RefBooking) -> Option<&mut RefRank> {
        let w = self
            .workers
            .get_mut(&b.id)
            .filter(|w| w.generation == b.generation)?;
        Some(&mut w.ranks[b.rank_index])
    }
}
