//! The monitor's side of SLO admission (`crate::slo`), advisory: a model's
//! SLO, what its requests' streams show of each rank's engine, each rank's
//! fitted step time, and the time to first token and per output token it
//! predicts for a new request there.
//!
//! # Observing
//!
//! With an SLO set for its model, a booking remembers when it was made;
//! [`Booking::first_token`](super::Booking::first_token) observes the
//! request's time to first token, and
//! [`Booking::tokens`](super::Booking::tokens) the gap since its last
//! token, which is one engine step of its rank under the load the rank
//! carries then (its booked prefill tokens, its bookings, its context
//! tokens). The hook pushes the observation into a bounded lock-free queue
//! (crossbeam's `ArrayQueue`, [`OBSERVATION_CAPACITY`], allocated when the
//! first SLO is set) and returns: it never waits, allocates or runs host
//! code. A full queue drops and counts. Without an SLO a hook reads one
//! relaxed flag.
//!
//! # Fitting
//!
//! The maintenance drains the queue every [`FIT_PERIOD`] while any model
//! has an SLO, feeds each rank's [`StepFit`] (one per rank, allocated at its
//! first observation, a few hundred bytes) and publishes the rank's
//! coefficients and whether they are trusted into the rank's atomics. A
//! reader may see coefficients of two consecutive fits mixed; each is a
//! fitted value, so the mix is a prediction between the two.
//!
//! # Predicting
//!
//! For a request of `p` prompt tokens on a rank whose booked prefill is
//! `Q` tokens, whose batch budget is `B` tokens a step, with `R` requests
//! and `K` context tokens on it, and step time `t(P, R, K)` from the fit:
//!
//! * time to first token: the prefill ahead and its own, `Q + p` tokens,
//!   at `B` a step: `⌊(Q+p)/B⌋ · t(B, R, K) + t((Q+p) mod B, R, K)`;
//! * time per output token once admitted: `t(min(Q, B), R + 1, K + p)`.

use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

use super::observe::{Observation, Observations, Sample};
pub use super::observe::{FIT_PERIOD, OBSERVATION_CAPACITY};
use super::rank::{Rank, Worker};
use super::registry::Registry;
use super::Monitor;
use crate::error::ThresholdError;
use crate::metrics;
use crate::slo::{Slo, StepFit, StepLoad};
use crate::sync::{lock, Mutex, Ordering};
use crate::thresholds::DEFAULT_BLOCK_TOKENS;

/// A prediction for a new request on one rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// Time to its first token, seconds.
    pub ttft: f64,
    /// Time per output token once admitted, seconds.
    pub tpot: f64,
    /// Whether the rank's fit is trusted (enough observations, within its
    /// error); an untrusted one is shown, never acted on.
    pub trusted: bool,
}

/// The load features of `rank` now.
fn step_load(rank: &Rank) -> StepLoad {
    let l = rank.load();
    let blocks = l.active_decode_blocks.max(l.kv_used_blocks);
    StepLoad {
        prefill_tokens: l.active_prefill_tokens.unwrap_or(0) as f64,
        // Relaxed: a count read for a feature.
        running: rank.slo.bookings.load(Ordering::Relaxed) as f64,
        kv_tokens: blocks.saturating_mul(DEFAULT_BLOCK_TOKENS) as f64,
    }
}

/// The prediction for `prompt` tokens on `rank` (module docs).
fn predict(rank: &Rank, prompt: u64) -> Prediction {
    let c = rank.slo.coefficients();
    let now = step_load(rank);
    let batch = (rank.load().max_num_batched_tokens.max(1)) as f64;
    let step =
        |prefill: f64, running: f64, kv: f64| c[0] + c[1] * prefill + c[2] * running + c[3] * kv;
    let total = now.prefill_tokens + prompt as f64;
    let full = (total / batch).floor();
    let ttft = full * step(batch, now.running, now.kv_tokens)
        + step(total - full * batch, now.running, now.kv_tokens);
    let tpot = step(
        now.prefill_tokens.min(batch),
        now.running + 1.0,
        now.kv_tokens + prompt as f64,
    );
    Prediction {
        ttft,
        tpot,
        // Relaxed: a flag published beside the coefficients.
        trusted: rank.slo.trusted.load(Ordering::Relaxed),
    }
}

impl Worker {
    /// Whether the worker's model has an SLO. Relaxed: a setting.
    #[inline]
    pub(super) fn slo_on(&self) -> bool {
        self.model.slo_ttft.load(Ordering::Relaxed) != 0
    }

    /// A step of `seconds` seen on rank index `rank`, under its load now.
    pub(super) fn observe_step(self: &Arc<Self>, rank: usize, seconds: f64) {
        let load = step_load(&self.ranks[rank]);
        self.model.observations.push(Observation {
            worker_id: self.id,
            rank,
            sample: Sample::Step { seconds, load },
        });
    }

    /// A first token after `observed` seconds on rank index `rank`, where
    /// `predicted` was predicted at booking.
    pub(super) fn observe_first_token(
        self: &Arc<Self>,
        rank: usize,
        observed: f64,
        predicted: f64,
    ) {
        self.model.observations.push(Observation {
            worker_id: self.id,
            rank,
            sample: Sample::FirstToken {
                observed,
                predicted,
            },
        });
    }

    /// The time to first token predicted for `prompt` tokens on rank index
    /// `rank`, if its fit is trusted (else negative).
    pub(super) fn predicted_ttft(&self, rank: usize, prompt: u64) -> f64 {
        let p = predict(&self.ranks[rank], prompt);
        if p.trusted {
            p.ttft
        } else {
            -1.0
        }
    }
}

/// Smoothing of the time-to-first-token error.
const TTFT_SMOOTH: f64 = 0.05;

/// Feeds every queued observation to its rank's fit and publishes the
/// ranks it changed; returns how many it took.
pub(super) fn fit(observations: &Observations, registry: &Registry) -> usize {
    let Some(queue) = observations.queue.get() else {
        return 0;
    };
    let mut n = 0;
    while let Some(o) = queue.pop() {
        n += 1;
        // A worker removed meanwhile: nothing to fit.
        let Some(rank) = registry
            .workers
            .get(&o.worker_id)
            .and_then(|w| w.ranks.get(o.rank))
        else {
            continue;
        };
        let slo = &rank.slo;
        match o.sample {
            Sample::Step { seconds, load } => {
                let fit = slo.fit.get_or_init(|| Mutex::new(StepFit::new()));
                let mut fit = lock(fit);
                if fit.observe(&load, seconds).is_ok() {
                    for (c, v) in slo.coefficients.iter().zip(fit.coefficients()) {
                        // Relaxed: each a value whole (module docs).
                        c.store(v.to_bits(), Ordering::Relaxed);
                    }
                    slo.trusted.store(fit.trusted(), Ordering::Relaxed);
                }
            }
            Sample::FirstToken {
                observed,
                predicted,
            } if predicted >= 0.0 && observed.is_finite() && observed > 0.0 => {
                let e = ((predicted - observed).abs() / observed).min(1.0);
                // Relaxed: only the maintenance writes it.
                let old = f64::from_bits(slo.ttft_error.load(Ordering::Relaxed));
                let new = old + TTFT_SMOOTH * (e - old);
                slo.ttft_error.store(new.to_bits(), Ordering::Relaxed);
            }
            Sample::FirstToken { .. } => {}
        }
    }
    n
}

impl Monitor {
    /// Sets (or with `None` clears) model `model`'s SLO. For now advisory:
    /// its requests' streams are observed (`Booking::first_token`,
    /// `Booking::tokens`), each rank's step time is fitted, and
    /// [`predict`](Self::predict) and the metrics show what the SLO
    /// admission would see; the static thresholds still decide.
    pub fn set_slo(&self, model: &str, slo: Option<Slo>) -> Result<(), ThresholdError> {
        let reg = self.registry.load();
        let m = reg
            .models
            .get(model)
            .ok_or_else(|| ThresholdError::UnknownModel(model.to_owned()))?;
        self.observations
            .queue
            .get_or_init(|| ArrayQueue::new(OBSERVATION_CAPACITY));
        let (ttft, tpot) = slo.map_or((0, 0), |s| {
            (
                crate::clock::nanos(s.ttft).max(1),
                crate::clock::nanos(s.tpot).max(1),
            )
        });
        // Relaxed: settings; a booking racing the change may go unobserved.
        m.slo_tpot.store(tpot, Ordering::Relaxed);
        m.slo_ttft.store(ttft, Ordering::Relaxed);
        self.duty.start();
        self.duty.signal.raise();
        Ok(())
    }

    /// Model `model`'s SLO, if set.
    pub fn slo(&self, model: &str) -> Option<Slo> {
        let reg = self.registry.load();
        let m = reg.models.get(model)?;
        // Relaxed: settings.
        let ttft = m.slo_ttft.load(Ordering::Relaxed);
        let tpot = m.slo_tpot.load(Ordering::Relaxed);
        (ttft != 0).then(|| Slo {
            ttft: std::time::Duration::from_nanos(ttft),
            tpot: std::time::Duration::from_nanos(tpot),
        })
    }

    /// What the rank's fit predicts for a new request of `prompt_tokens`
    /// there now (module docs).
    pub fn predict(
        &self,
        worker_id: u64,
        dp_rank: u32,
        prompt_tokens: u64,
    ) -> Result<Prediction, crate::ReportError> {
        let reg = self.registry.load();
        let (_, rank) = Self::rank_of(&reg, worker_id, dp_rank)?;
        Ok(predict(rank, prompt_tokens))
    }

    /// The running relative error of rank `dp_rank` of `worker_id`'s
    /// step-time fit and of its time-to-first-token predictions (1 until
    /// observed).
    pub fn prediction_errors(
        &self,
        worker_id: u64,
        dp_rank: u32,
    ) -> Result<(f64, f64), crate::ReportError> {
        let reg = self.registry.load();
        let (_, rank) = Self::rank_of(&reg, worker_id, dp_rank)?;
        let step = rank.slo.fit.get().map_or(1.0, |f| lock(f).relative_error());
        // Relaxed: a gauge.
        let ttft = f64::from_bits(rank.slo.ttft_error.load(Ordering::Relaxed));
        Ok((step, ttft))
    }

    /// Observations dropped because the queue was full.
    pub fn observations_lost(&self) -> u64 {
        self.observations.lost.load(Ordering::Relaxed)
    }
}

/// The SLO gauges of every rank whose model has an SLO, and the
/// observations lost (nothing when no model has one).
pub(super) fn render(workers: &[&Arc<Worker>], lost: u64, prefix: &str, out: &mut String) {
    let on: Vec<&&Arc<Worker>> = workers.iter().filter(|w| w.slo_on()).collect();
    if on.is_empty() {
        return;
    }
    let families: [(&str, &str); 5] = [
        (
            "frontend_slo_predicted_ttft_seconds",
            "Predicted time to first token of a one-token request on the rank now.",
        ),
        (
            "frontend_slo_predicted_tpot_seconds",
            "Predicted time per output token on the rank with one more request.",
        ),
        (
            "frontend_slo_step_fit_trusted",
            "Whether the rank's step-time fit has enough observations within its error (1) or not (0).",
        ),
        (
            "frontend_slo_step_fit_error",
            "Running relative error of the rank's step-time fit (1 until observed).",
        ),
        (
            "frontend_slo_ttft_prediction_error",
            "Running relative error of the rank's time-to-first-token predictions (1 until observed).",
        ),
    ];
    for (family, (name, help)) in families.iter().enumerate() {
        metrics::header(out, prefix, name, "gauge", help);
        for w in &on {
            for (i, rank) in w.ranks.iter().enumerate() {
                let p = predict(rank, 1);
                let value = match family {
                    0 => p.ttft,
                    1 => p.tpot,
                    2 => f64::from(u8::from(p.trusted)),
                    3 => rank.slo.fit.get().map_or(1.0, |f| lock(f).relative_error()),
                    // Relaxed: a gauge.
                    _ => f64::from_bits(rank.slo.ttft_error.load(Ordering::Relaxed)),
                };
                let dp_rank = w.dp_start + i as u32;
                metrics::sample(
                    out,
                    prefix,
                    name,
                    &[("dp_rank", &dp_rank), ("worker_id", &w.id)],
                    value,
                );
            }
        }
    }
    let name = "frontend_slo_observations_lost_total";
    metrics::header(
        out,
        prefix,
        name,
        "counter",
        "Observations of requests' streams dropped because the queue was full.",
    );
    metrics::sample(out, prefix, name, &[], lost);
}
