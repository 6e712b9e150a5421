//! The emulator against Dynamo's own mocker: Dynamo 1.6.1's offline replay
//! workload, run through the lab's engine with the mocker's default engine
//! ([`EngineConfig::mocker`]) and no admission control, beside the figures
//! the replay itself gives ([`DYNAMO`]).
//!
//! The replay (`dynamo.replay.api.run_synthetic_trace_replay` in the
//! `ai-dynamo` 1.6.1 wheel; `benches/lab/dynamo/replay.py` runs it where
//! Dynamo is installed) routes 3000 requests of 1024 prompt and 256 output
//! tokens, Poisson, round-robin to 2 workers that queue everything, and
//! counts a request good when its TTFT is at most 1 s and its mean
//! inter-token gap at most 50 ms. The lab does the same with its arm (a):
//! fixed lengths, one class, clients that never give up, every request
//! waited for. Dynamo is not a dependency of the lab or its tests; its
//! figures are recorded here with how they were made.

use serde::Serialize;

use crate::arm::{Arm, ArmKind};
use crate::engine::EngineConfig;
use crate::matrix::parallel;
use crate::record::Slo;
use crate::sim::{run, Conditions};
use crate::workload::{Client, LengthClass, WorkloadSpec};

/// Requests per run, as the replay's `request_count`.
const REQUESTS: usize = 3000;

/// What Dynamo 1.6.1's replay measured on this workload (2 workers, 3000
/// requests, arrival seeds 1 to 10; `benches/lab/dynamo/replay.py`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Reference {
    /// The highest rate (on a grid of 0.5 requests/s) at which at least 99 %
    /// of requests were good, for every seed, requests/s.
    pub capacity: f64,
    /// Median TTFT at 2 requests/s, ms, the mean over the seeds.
    pub p50_ttft_low_ms: f64,
    /// Share of requests good at 1.25, 2 and 3 × `capacity`, the mean over
    /// the seeds (the share at one seed swings by a fifth either way at
    /// 1.25 and 3 ×: it turns on which requests arrive just before the
    /// first ones finish).
    pub good_at: [(f64, f64); 3],
}

/// Dynamo 1.6.1's figures (docs/overload.md, "The engine against Dynamo's
/// mocker").
pub const DYNAMO: Reference = Reference {
    capacity: 42.0,
    p50_ttft_low_ms: 40.51,
    good_at: [(1.25, 0.1992), (2.0, 0.1707), (3.0, 0.0968)],
};

/// The lab's figures on the same workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Calibration {
    /// Dynamo's, for the comparison.
    pub reference: Reference,
    /// The lab's `C*` by the same rule (at least 99 % good for every seed,
    /// on a grid of 0.5 requests/s), requests/s.
    pub capacity: f64,
    /// Arrival seeds (the lab's own generator: the same count, not the
    /// same arrivals).
    pub seeds: Vec<u64>,
    /// Median TTFT at 2 requests/s, ms, the mean over the seeds.
    pub p50_ttft_low_ms: f64,
    /// Share of requests good at 1.25, 2 and 3 × Dynamo's capacity (the
    /// same offered rates), the mean over the seeds.
    pub good_at: Vec<(f64, f64)>,
    /// Simulations run.
    pub runs: usize,
}

/// The replay's workload at `rate` with arrival seed `seed`.
fn workload(rate: f64, seed: u64) -> WorkloadSpec {
    let fixed = LengthClass {
        weight: 1.0,
        prompt_median: 1024.0,
        prompt_sigma: 0.0,
        prompt_max: 1024,
        output_median: 256.0,
        output_sigma: 0.0,
        output_max: 256,
    };
    let mut w = WorkloadSpec::steady(rate, 10.0 * REQUESTS as f64 / rate, seed);
    w.lengths = vec![fixed];
    w.priorities = vec![1.0];
    w.max_requests = Some(REQUESTS);
    w.client = Client {
        timeout_s: 1e6,
        ..Client::default()
    };
    w
}

/// The replay's fleet: 2 workers of the mocker's engine, nothing in front;
/// every request counts and is waited for.
fn conditions() -> Conditions {
    Conditions {
        workers: 2,
        dp_size: 1,
        engine: EngineConfig::mocker(),
        slo: Slo {
            ttft_s: 1.0,
            tpot_s: 0.05,
        },
        warmup_s: 0.0,
        drain_s: 4000.0,
        ..Conditions::default()
    }
}

/// The share of requests good at `rate`, and their median TTFT (ms).
fn good(rate: f64, seed: u64) -> Result<(f64, f64), String> {
    let w = workload(rate, seed);
    let reqs = w.generate();
    let m = run(
        &Arm::base(ArmKind::NoControl),
        &w,
        &reqs,
        &conditions(),
        rate,
    )?
    .measured;
    Ok((m.attainment_offered, m.ttft_ms.p50))
}

/// Runs the comparison on `threads` threads.
pub fn run_calibration(threads: usize) -> Result<Calibration, String> {
    let seeds: Vec<u64> = (1..=10).collect();
    let mut runs = 0;
    // Every seed at `rate`: (share good, median TTFT).
    let mut at = |rate: f64| -> Result<Vec<(f64, f64)>, String> {
        let results = parallel(threads, seeds.clone(), |&s| good(rate, s));
        runs += results.len();
        results.into_iter().collect()
    };
    // C*: the rule of the replay's figure, on the same grid.
    let mut capacity = 0.0;
    let mut rate = 30.0;
    while rate <= 60.0 {
        if at(rate)?.iter().all(|(g, _)| *g >= 0.99) {
            capacity = rate;
        }
        rate += 0.5;
    }
    let mean = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
        v.iter().map(f).sum::<f64>() / v.len().max(1) as f64
    };
    let low = at(2.0)?;
    let mut good_at = Vec::new();
    for (x, _) in DYNAMO.good_at {
        good_at.push((x, mean(&at(x * DYNAMO.capacity)?, |r| r.0)));
    }
    Ok(Calibration {
        reference: DYNAMO,
        capacity,
        p50_ttft_low_ms: mean(&low, |r| r.1),
        seeds,
        good_at,
        runs,
    })
}
