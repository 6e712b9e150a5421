//! The reference monitor: plain maps and the busy rule written out again,
//! recomputing everything on demand. `monitor_differential.rs` and the
//! `monitor_ops` fuzz target (which includes this file by path) check the
//! real monitor against it after every operation.
#![allow(dead_code)] // each including binary uses a different subset

use std::collections::{BTreeSet, HashMap};

use loadgate::{RouteError, ThresholdField};

#[derive(Debug, Clone, Default)]
pub struct RefRank {
    pub decode: u64,
    pub used: u64,
    pub total: u64,
    pub prefill: Option<u64>,
    pub mnbt: u64,
}

#[derive(Debug, Clone)]
pub struct RefWorker {
    pub model: usize,
    pub dp_start: u32,
    pub ranks: Vec<RefRank>,
    pub lease_until: Option<u64>,
    pub generation: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RefThresholds {
    pub decode: Option<f64>,
    pub abs: Option<u64>,
    pub frac: Option<f64>,
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
        clear: &[ThresholdField],
    ) -> RefUpdate {
        let bad_decode = decode.is_some_and(|t| !(t.is_finite() && (0.0..=1.0).contains(&t)));
        let bad_frac = frac.is_some_and(|f| !(f.is_finite() && f >= 0.0));
        let conflict = clear.iter().any(|f| match f {
            ThresholdField::ActiveDecodeBlocks => decode.is_some(),
            ThresholdField::ActivePrefillTokens => abs.is_some(),
            ThresholdField::ActivePrefillTokensFrac => frac.is_some(),
        });
        if bad_decode || bad_frac || conflict {
            return RefUpdate::Refused;
        }
        if decode.is_none() && abs.is_none() && frac.is_none() && clear.is_empty() {
            return RefUpdate::Unchanged;
        }
        let mut next = self;
        for f in clear {
            match f {
                ThresholdField::ActiveDecodeBlocks => next.decode = None,
                ThresholdField::ActivePrefillTokens => next.abs = None,
                ThresholdField::ActivePrefillTokensFrac => next.frac = None,
            }
        }
        next.decode = decode.or(next.decode);
        next.abs = abs.or(next.abs);
        next.frac = frac.or(next.frac);
        next.version += 1;
        RefUpdate::Next(next)
    }
}

/// The reference: plain maps, recomputing everything on demand.
#[derive(Debug, Default)]
pub struct Reference {
    pub workers: HashMap<u64, RefWorker>,
    pub known_models: BTreeSet<usize>,
    pub thresholds: HashMap<usize, RefThresholds>,
    pub now_ms: u64,
    pub generations: u64,
}

impl Reference {
    pub fn rank_busy(t: &RefThresholds, r: &RefRank) -> bool {
        let decode = t.decode.is_some_and(|t| {
            r.total != 0 && {
                let line = t * r.total as f64;
                r.used as f64 > line || r.decode as f64 > line
            }
        });
        let abs = matches!((t.abs, r.prefill), (Some(n), Some(p)) if p > n);
        let frac = matches!((t.frac, r.prefill), (Some(f), Some(p)) if p as f64 > (f * r.mnbt as f64).floor());
        decode || abs || frac
    }

    pub fn busy(&self, id: u64) -> bool {
        let w = &self.workers[&id];
        let t = self.thresholds.get(&w.model).copied().unwrap_or_default();
        !w.ranks.is_empty() && w.ranks.iter().all(|r| Self::rank_busy(&t, r))
    }

    pub fn leased(&self, id: u64) -> bool {
        self.workers[&id]
            .lease_until
            .is_some_and(|until| self.now_ms < until)
    }

    pub fn eligible(&self, model: usize) -> BTreeSet<u64> {
        self.workers
            .iter()
            .filter(|(id, w)| w.model == model && !self.busy(**id) && !self.leased(**id))
            .map(|(id, _)| *id)
            .collect()
    }

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

    pub fn has_workers(&self, model: usize) -> bool {
        self.workers.values().any(|w| w.model == model)
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
}
