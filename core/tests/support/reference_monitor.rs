//! The reference monitor: plain maps and the busy rule written out again,
//! recomputing everything on demand. `monitor_differential.rs` and the
//! `monitor_ops` fuzz target (which includes this file by path) check the
//! real monitor against it after every operation.
#![allow(dead_code)] // each including binary uses a different subset

use std::collections::{BTreeSet, HashMap};

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
}
