//! The monitor's side of SLO admission (`crate::slo`): a model's SLO, what
//! its requests' streams (and scraped engines' token gaps) show of each
//! rank's engine, each rank's fitted step time, and the time to first
//! token and per output token it predicts for a new request there. The
//! verdict is `predict.rs`'s, the reservation `reserve.rs`'s, the queue's
//! decision `flow/late.rs`'s.
//!
//! # Observing
//!
//! With an SLO set for its model, a booking remembers when it was made;
//! [`Booking::first_token`](super::Booking::first_token) observes the
//! request's time to first token, and
//! [`Booking::tokens`](super::Booking::tokens) the gap since its last
//! token, which is one engine step of its rank under the load the rank
//! carries then (its booked prefill tokens, its bookings less the
//! requests its engine last reported waiting, its context tokens). The
//! hook pushes the observation into a bounded lock-free queue (crossbeam's
//! `ArrayQueue`, [`OBSERVATION_CAPACITY`], allocated when the first SLO is
//! set) and returns: it never waits, allocates or runs host code. A full
//! queue drops and counts. Without an SLO a hook reads one relaxed flag.
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
//! in its steps (booked, less those its engine reports waiting) and `K`
//! context tokens on it, and step time `t(P, R, K)` from the fit:
//!
//! * time to first token: the prefill ahead and its own, `Q + p` tokens,
//!   at `B` a step: `⌊(Q+p)/B⌋ · t(B, R, K) + t((Q+p) mod B, R, K)`;
//! * time per output token once admitted: `t(min(P̄, B), R + 1, K + p)`,
//!   where `P̄` is the prefill tokens the rank's observed steps carried, a
//!   running mean over about a hundred steps (`RankSlo::mean_prefill`): an
//!   answer's steps carry the prompts that keep coming while it streams,
//!   not the ones queued at this instant.
//!
//! # Deciding
//!
//! Each rank's publisher weighs, for the model's typical prompt, the
//! largest of: the rank's booked or reported KV blocks, reservations
//! included, over [`KV_LINE`](crate::slo::KV_LINE) of its cache; once its
//! fit has its first steps, trusted or not, each prediction over its
//! target, times one plus twice the fit's running error, else its booked
//! prefill over one step's budget (the time per output token also times
//! the rank's TPOT margin: 1, raised by each answer booked there that
//! streamed slower than the target, lowered by those that did not, so
//! that no more than [`TPOT_MISSES`] of them miss; `predict.rs`,
//! `answered`; and, once the fit is trusted, a full load where a typical
//! request would take the rank more than a [`FIT_REACH`]th past the load
//! the fit has seen, `predict.rs`, `beyond_reach`); and its seats
//! (`predict.rs`, `seats`).
//! The rank turns busy when that load passes 1 and free again under
//! `1 -` [`HYSTERESIS`](crate::slo::HYSTERESIS), but for the KV, which
//! lets it go once a typical request fits under its line again
//! (`predict.rs`, `kv_band`); the bookings when it last turned busy are
//! its line (`frontend_slo_line_requests`), and each turn is counted by
//! the term that weighed most (`frontend_slo_turned_busy_total`).

use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

use super::model::Model;
use super::observe::{
    BusyTerm, ModelSlo, Observation, Observations, RankSlo, Sample, SloMode, PREFILL_SMOOTH,
};
pub use super::observe::{FIT_PERIOD, OBSERVATION_CAPACITY};
use super::predict::{predict, step_load};
pub use super::predict::{
    Prediction, FIT_REACH, SEAT_PROBE, SEAT_PROBE_PERIOD, SEAT_PROBE_PERIODS, TPOT_MARGIN_MAX,
    TPOT_MARGIN_STEP, TPOT_MISSES,
};
use super::rank::Worker;
use super::registry::Registry;
use super::Monitor;
use crate::error::ThresholdError;
use crate::metrics;
use crate::slo::{Slo, StepFit, StepLoad};
use crate::sync::{lock, AtomicU64, Mutex, Ordering};

impl Worker {
    /// Whether the worker's model has an SLO, enforced or advisory.
    #[inline]
    pub(super) fn slo_on(&self) -> bool {
        self.model.slo.mode().is_some()
    }

    /// The load features of a step of rank index `rank` now.
    pub(super) fn step_load(&self, rank: usize) -> StepLoad {
        let r = &self.ranks[rank];
        step_load(&r.slo, &r.load())
    }

    /// A request's mean token gap of `seconds` over `steps` steps seen on
    /// rank index `rank` under `load`: `steps/R` of a step, as its `R`
    /// requests all saw those steps (at most one: a step weighs the same
    /// however many requests saw it and however they windowed it).
    pub(super) fn observe_step(&self, rank: usize, seconds: f64, load: StepLoad, steps: u64) {
        let share = (steps as f64 / load.running.max(1.0)).min(1.0);
        self.model.slo.observations.push(Observation {
            worker_id: self.id,
            rank,
            sample: Sample::Step {
                seconds,
                load,
                share,
            },
        });
    }

    /// A first token after `observed` seconds on rank index `rank`, where
    /// `predicted` was predicted at booking.
    pub(super) fn observe_first_token(
        self: &Arc<Self>,
        rank: usize,
        observed: f64,
        predicted: Option<f64>,
    ) {
        let predicted = predicted.unwrap_or(-1.0);
        self.model.slo.observations.push(Observation {
            worker_id: self.id,
            rank,
            sample: Sample::FirstToken {
                observed,
                predicted,
            },
        });
    }

    /// An answer of `output` tokens to `prompt` ended on rank index `rank`.
    pub(super) fn observe_answer(&self, rank: usize, prompt: u64, output: u64, tpot: f64) {
        self.model.slo.observations.push(Observation {
            worker_id: self.id,
            rank,
            sample: Sample::Answer {
                prompt,
                output,
                tpot,
            },
        });
    }

    /// The prediction for `prompt` tokens on rank index `rank`, if
    /// trusted.
    pub(super) fn predicted(&self, rank: usize, prompt: u64) -> Option<Prediction> {
        let r = &self.ranks[rank];
        Some(predict(&r.slo, &r.load(), prompt)).filter(|p| p.trusted)
    }
}

/// What a model's SLO decided, and would have decided while advisory
/// ([`Monitor::slo_counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SloCounts {
    /// Requests picked while advisory whose worker the SLO would admit.
    pub would_admit: u64,
    /// Requests that found no worker free while advisory and that the SLO
    /// would have let wait in the queue.
    pub would_queue: u64,
    /// Requests picked while advisory whose worker the SLO would refuse,
    /// and requests it would have refused a wait in the queue.
    pub would_refuse: u64,
    /// Requests refused at arrival, enforced, because their wait in the
    /// queue was predicted past their deadline or the TTFT target.
    pub refused_late: u64,
}

/// Smoothing of the time-to-first-token error.
const TTFT_SMOOTH: f64 = 0.05;
/// Smoothing of the typical prompt.
const PROMPT_SMOOTH: f64 = 0.02;
/// Longest time to first token observed, seconds; a longer one (a clock
/// that jumped, a request held by its client) is set aside.
const MAX_TTFT: f64 = 3600.0;

/// Moves the running mean in `cell` (`f64` bits) towards `x` by
/// [`TTFT_SMOOTH`]. Relaxed: only the maintenance writes it.
fn smooth(cell: &AtomicU64, x: f64) {
    let old = f64::from_bits(cell.load(Ordering::Relaxed));
    let new = old + TTFT_SMOOTH * (x - old);
    cell.store(new.to_bits(), Ordering::Relaxed);
}

impl ModelSlo {
    /// A time from dispatch to first token of `observed` seconds: into
    /// the running mean and deviation the queue's wait budget reads
    /// (`flow/late.rs`); the first sets the mean.
    fn observe_dispatch_ttft(&self, observed: f64) {
        let [mean, spread] = &self.dispatch_ttft;
        // Relaxed: only the maintenance writes them.
        let m = f64::from_bits(mean.load(Ordering::Relaxed));
        if m == 0.0 {
            mean.store(observed.to_bits(), Ordering::Relaxed);
            return;
        }
        smooth(spread, (observed - m).abs());
        smooth(mean, observed);
    }
}

impl RankSlo {
    /// A step observed to carry `prefill` prompt tokens, `share` of a
    /// step: into the rank's running mean (`mean_prefill`).
    fn observe_prefill(&self, prefill: f64, share: f64) {
        // Relaxed: only the maintenance writes it.
        let old = f64::from_bits(self.mean_prefill.load(Ordering::Relaxed));
        let new = old + PREFILL_SMOOTH * share * (prefill - old);
        self.mean_prefill.store(new.to_bits(), Ordering::Relaxed);
    }
}

/// Feeds every queued observation to its rank's fit and publishes the
/// ranks it changed; returns how many it took.
pub(super) fn fit(observations: &Observations, registry: &Registry) -> usize {
    let Some(queue) = observations.queue.get() else {
        return 0;
    };
    let mut n = 0;
    // Workers whose fit moved, re-evaluated once each at the end; models
    // whose answers' table moved, published once each.
    let mut moved: Vec<&Arc<Worker>> = Vec::new();
    let mut learned: Vec<&Arc<Worker>> = Vec::new();
    while let Some(o) = queue.pop() {
        n += 1;
        // A worker removed meanwhile: nothing to fit.
        let Some((worker, rank)) = registry
            .workers
            .get(&o.worker_id)
            .and_then(|w| Some((w, w.ranks.get(o.rank)?)))
        else {
            continue;
        };
        let slo = &rank.slo;
        match o.sample {
            Sample::Answer {
                prompt,
                output,
                tpot,
            } => {
                let m = &worker.model.slo;
                if let Some(t) = m.targets().filter(|_| tpot.is_finite() && tpot > 0.0) {
                    slo.answered(tpot, t.tpot);
                }
                lock(&m.outputs).observe(output);
                // Relaxed: only the maintenance writes it.
                let old = m.typical_prompt.load(Ordering::Relaxed) as f64;
                let new = if old == 0.0 {
                    prompt as f64
                } else {
                    old + PROMPT_SMOOTH * (prompt as f64 - old)
                };
                m.typical_prompt
                    .store(new.round() as u64, Ordering::Relaxed);
                if !learned.iter().any(|w| Arc::ptr_eq(&w.model, &worker.model)) {
                    learned.push(worker);
                }
            }
            Sample::Step {
                seconds,
                load,
                share,
            } => {
                let fit = slo.fit.get_or_init(|| Mutex::new(StepFit::new()));
                let mut fit = lock(fit);
                if fit.observe_share(&load, seconds, share).is_ok() {
                    slo.publish(&fit);
                    slo.observe_prefill(load.prefill_tokens, share);
                    if !moved.iter().any(|w| Arc::ptr_eq(w, worker)) {
                        moved.push(worker);
                    }
                }
            }
            Sample::FirstToken {
                observed,
                predicted,
            } if observed.is_finite() && observed > 0.0 && observed <= MAX_TTFT => {
                worker.model.slo.observe_dispatch_ttft(observed);
                if predicted >= 0.0 {
                    let e = ((predicted - observed).abs() / observed).min(1.0);
                    smooth(&slo.ttft_error, e);
                }
            }
            Sample::FirstToken { .. } => {}
        }
    }
    for w in learned {
        let peaks = lock(&w.model.slo.outputs).expected_peaks();
        w.model.slo.publish_outputs(&peaks);
    }
    // The verdicts follow the fit even while the load stands still.
    for w in moved {
        w.reevaluate();
    }
    n
}

/// Takes the bookings that ended on every rank of a model with an SLO
/// into the model's total, and publishes each such model's rate at `now`
/// over its queue's budget (`freed.rs`). The maintenance's, once per
/// [`FIT_PERIOD`] (`duty.rs`).
pub(super) fn sample_releases(registry: &Registry, now: u64) {
    for w in registry.workers.values().filter(|w| w.slo_on()) {
        // Relaxed: a count; one that ends meanwhile is taken next time.
        let ended: u64 = w
            .ranks
            .iter()
            .map(|r| r.slo.released.swap(0, Ordering::Relaxed))
            .sum();
        if ended > 0 {
            lock(&w.model.slo.releases).add(ended);
        }
    }
    let period = crate::clock::nanos(FIT_PERIOD);
    for m in registry.models.values().filter(|m| m.slo.mode().is_some()) {
        let rate = {
            let mut releases = lock(&m.slo.releases);
            releases.sample(now, period);
            releases.over(crate::clock::nanos(m.slo.queue_budget()))
        };
        let (r, v) = rate.map_or((f64::NAN, f64::NAN), |r| (r.per_second, r.variance));
        // Relaxed: values read whole each (`ModelSlo::freed`).
        m.slo.freed[0].store(r.to_bits(), Ordering::Relaxed);
        m.slo.freed[1].store(v.to_bits(), Ordering::Relaxed);
    }
}

impl Monitor {
    /// An engine's own mean token gap on rank `dp_rank` of worker
    /// `worker_id` since its last scrape (`crate::scrape`): one step of
    /// the rank under its load now, into its fit beside its requests'
    /// streams. Nothing without an SLO on the worker's model, or for an
    /// unknown worker or rank; the fit bounds and checks the value as any
    /// other observation.
    #[cfg(feature = "scrape")]
    pub(crate) fn observe_engine_gap(&self, worker_id: u64, dp_rank: u32, seconds: f64) {
        let reg = self.registry.load();
        let Some(w) = reg.workers.get(&worker_id) else {
            return;
        };
        let Some(i) = (dp_rank.checked_sub(w.dp_start))
            .map(|i| i as usize)
            .filter(|&i| i < w.ranks.len())
        else {
            return;
        };
        if w.slo_on() {
            let load = w.step_load(i);
            w.model.slo.observations.push(Observation {
                worker_id,
                rank: i,
                sample: Sample::Step {
                    seconds,
                    load,
                    share: 1.0,
                },
            });
        }
    }

    /// Sets (or with `None` clears) model `model`'s SLO. Its requests'
    /// streams are observed (`Booking::first_token`, `Booking::tokens`,
    /// `Booking::finish`), each rank's step time is fitted, each booking
    /// reserves the answer it expects (`reserve.rs`) and each rank gets the
    /// SLO's verdict (module docs), which in [`SloMode::Enforce`] marks it
    /// busy beside the static thresholds and in [`SloMode::Advisory`] is
    /// only counted and shown.
    pub fn set_slo(
        &self,
        model: &str,
        slo: Option<Slo>,
        mode: SloMode,
    ) -> Result<(), ThresholdError> {
        let reg = self.registry.load();
        let m = reg
            .models
            .get(model)
            .ok_or_else(|| ThresholdError::UnknownModel(model.to_owned()))?;
        self.store_slo(m, slo, mode);
        // Every worker's verdict under the new setting.
        for w in reg.workers.values().filter(|w| Arc::ptr_eq(&w.model, m)) {
            w.reevaluate();
        }
        Ok(())
    }

    /// Stores model `m`'s SLO (`set_slo`, and a new model's defaults) and
    /// starts what observes and fits it.
    pub(super) fn store_slo(&self, m: &Model, slo: Option<Slo>, mode: SloMode) {
        self.observations
            .queue
            .get_or_init(|| ArrayQueue::new(OBSERVATION_CAPACITY));
        let (ttft, tpot) = slo.map_or((0, 0), |s| {
            (
                crate::clock::nanos(s.ttft).max(1),
                crate::clock::nanos(s.tpot).max(1),
            )
        });
        let mode = match (slo, mode) {
            (None, _) => 0,
            (Some(_), SloMode::Enforce) => 1,
            (Some(_), SloMode::Advisory) => 2,
        };
        // Relaxed: settings; a booking racing the change may go unobserved.
        // Clearing leaves the targets, so no reader sees a mode without
        // them.
        if mode != 0 {
            m.slo.tpot.store(tpot, Ordering::Relaxed);
            m.slo.ttft.store(ttft, Ordering::Relaxed);
        }
        if m.slo.mode.swap(mode, Ordering::Relaxed) == 0 && mode != 0 {
            // The bookings that ended while no SLO was set are no part of
            // a rate (`freed.rs`).
            lock(&m.slo.releases).clear();
        }
        self.duty.start();
        self.duty.signal.raise();
    }

    /// Model `model`'s SLO and its mode, if set.
    pub fn slo(&self, model: &str) -> Option<(Slo, SloMode)> {
        let reg = self.registry.load();
        let m = reg.models.get(model)?;
        let mode = m.slo.mode()?;
        // Relaxed: settings.
        let ttft = m.slo.ttft.load(Ordering::Relaxed);
        let tpot = m.slo.tpot.load(Ordering::Relaxed);
        let slo = Slo {
            ttft: std::time::Duration::from_nanos(ttft),
            tpot: std::time::Duration::from_nanos(tpot),
        };
        Some((slo, mode))
    }

    /// What model `model`'s SLO decided, and would have decided while
    /// advisory, since the model was created (`None` for an unknown
    /// model).
    pub fn slo_counts(&self, model: &str) -> Option<SloCounts> {
        let reg = self.registry.load();
        let m = &reg.models.get(model)?.slo;
        // Relaxed: counters.
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Some(SloCounts {
            would_admit: n(&m.would_admit),
            would_queue: n(&m.would_queue),
            would_refuse: n(&m.would_refuse),
            refused_late: n(&m.refused_late),
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
        Ok(predict(&rank.slo, &rank.load(), prompt_tokens))
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
        // Relaxed: gauges.
        let step = f64::from_bits(rank.slo.step_error.load(Ordering::Relaxed));
        // Relaxed: a gauge.
        let ttft = f64::from_bits(rank.slo.ttft_error.load(Ordering::Relaxed));
        Ok((step, ttft))
    }

    /// Observations dropped because the queue was full.
    pub fn observations_lost(&self) -> u64 {
        self.observations.lost.load(Ordering::Relaxed)
    }
}

/// The SLO gauges of every rank whose model has an SLO, its models'
/// counters, and the observations lost (nothing when no model has one).
pub(super) fn render(workers: &[&Arc<Worker>], lost: u64, prefix: &str, out: &mut String) {
    let on: Vec<&&Arc<Worker>> = workers.iter().filter(|w| w.slo_on()).collect();
    if on.is_empty() {
        return;
    }
    let families: [(&str, &str, &str); 9] = [
        (
            "frontend_slo_predicted_ttft_seconds",
            "gauge",
            "Predicted time to first token of a one-token request on the rank now.",
        ),
        (
            "frontend_slo_predicted_tpot_seconds",
            "gauge",
            "Predicted time per output token on the rank with one more request.",
        ),
        (
            "frontend_slo_step_fit_trusted",
            "gauge",
            "Whether the rank's step-time fit has enough observations within its error (1) or not (0).",
        ),
        (
            "frontend_slo_step_fit_error",
            "gauge",
            "Running relative error of the rank's step-time fit (1 until observed).",
        ),
        (
            "frontend_slo_ttft_prediction_error",
            "gauge",
            "Running relative error of the rank's time-to-first-token predictions (1 until observed).",
        ),
        (
            "frontend_slo_tpot_margin",
            "gauge",
            "What the SLO's verdict multiplies the rank's predicted time per output token by: 1, raised by each of its answers that missed the TPOT target.",
        ),
        (
            "frontend_slo_verdict_busy",
            "gauge",
            "The SLO's verdict on the rank: busy (1) or free (0); it decides only when enforced.",
        ),
        (
            "frontend_slo_verdict_changes_total",
            "counter",
            "How often the SLO's verdict on the rank changed.",
        ),
        (
            "frontend_slo_line_requests",
            "gauge",
            "Requests booked on the rank when the SLO's verdict last turned busy: the limit it holds (0 before the first).",
        ),
    ];
    for (family, (name, kind, help)) in families.iter().enumerate() {
        metrics::header(out, prefix, name, kind, help);
        for w in &on {
            for (i, rank) in w.ranks.iter().enumerate() {
                let p = predict(&rank.slo, &rank.load(), 1);
                // Relaxed loads: gauges and counters.
                let value = match family {
                    0 => p.ttft,
                    1 => p.tpot,
                    2 => f64::from(u8::from(p.trusted)),
                    3 => f64::from_bits(rank.slo.step_error.load(Ordering::Relaxed)),
                    4 => f64::from_bits(rank.slo.ttft_error.load(Ordering::Relaxed)),
                    5 => f64::from_bits(rank.slo.tpot_margin.load(Ordering::Relaxed)),
                    6 => f64::from(u8::from(rank.slo.busy.load(Ordering::Relaxed))),
                    7 => rank.slo.flips.load(Ordering::Relaxed) as f64,
                    _ => rank.slo.line.load(Ordering::Relaxed) as f64,
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
    metrics::header(
        out,
        prefix,
        "frontend_slo_turned_busy_total",
        "counter",
        "How often the SLO's verdict on the rank turned busy, by the term that weighed most: kv, \
         time (a predicted time to first token or per output token), seats, or waiting (requests \
         its engine reported waiting, not all seated since).",
    );
    for w in &on {
        for (i, rank) in w.ranks.iter().enumerate() {
            let dp_rank = w.dp_start + i as u32;
            for term in BusyTerm::ALL {
                // Relaxed: a counter.
                let n = rank.slo.turned_busy[term as usize].load(Ordering::Relaxed);
                metrics::sample(
                    out,
                    prefix,
                    "frontend_slo_turned_busy_total",
                    &[
                        ("by", &term.label()),
                        ("dp_rank", &dp_rank),
                        ("worker_id", &w.id),
                    ],
                    n,
                );
            }
        }
    }
    let mut models: Vec<&ModelSlo> = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for w in &on {
        if !names.contains(&&*w.model.name) {
            names.push(&w.model.name);
            models.push(&w.model.slo);
        }
    }
    let model_families: [(&str, &str, &str); 5] = [
        (
            "frontend_slo_would_admit_total",
            "counter",
            "Requests picked while the SLO was advisory whose worker it would have admitted.",
        ),
        (
            "frontend_slo_would_queue_total",
            "counter",
            "Requests that found no worker free while the SLO was advisory that it would have let wait.",
        ),
        (
            "frontend_slo_would_refuse_total",
            "counter",
            "Requests picked or queued while the SLO was advisory that it would have refused.",
        ),
        (
            "frontend_slo_refused_late_total",
            "counter",
            "Requests refused at arrival because their wait in the queue was predicted too long.",
        ),
        (
            "frontend_slo_reserved_output_tokens",
            "gauge",
            "The answer tokens a new request's booking reserves: the most a new answer is expected to \
             hold at one moment (0 until enough answers ended).",
        ),
    ];
    for (family, (name, kind, help)) in model_families.iter().enumerate() {
        metrics::header(out, prefix, name, kind, help);
        for (m, model) in models.iter().zip(&names) {
            // Relaxed loads: counters and a gauge.
            let value = match family {
                0 => m.would_admit.load(Ordering::Relaxed),
                1 => m.would_queue.load(Ordering::Relaxed),
                2 => m.would_refuse.load(Ordering::Relaxed),
                3 => m.refused_late.load(Ordering::Relaxed),
                _ => m.output_peaks[0].load(Ordering::Relaxed),
            };
            metrics::sample(out, prefix, name, &[("model", model)], value);
        }
    }
    let name = "frontend_slo_bookings_ended_per_second";
    metrics::header(
        out,
        prefix,
        name,
        "gauge",
        "The rate the model's bookings ended over its queue's wait budget, as the maintenance last \
         sampled it (0 before two ended): a waiting request's wait is predicted from it where it is \
         less than the queue's dispatches.",
    );
    for (m, model) in models.iter().zip(&names) {
        let rate = m.freed().map_or(0.0, |r| r.per_second);
        metrics::sample(out, prefix, name, &[("model", model)], rate);
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
