//! The whole matrix: find `C*`, tune every arm by one procedure, then run
//! every scenario for every arm on the same seeded workloads.
//!
//! * `C*` is the highest Poisson rate at which arm (a) meets the SLOs for at
//!   least 99 % of offered requests (bisection).
//! * Tuning: every tunable arm gets the same budget of candidates
//!   ([`Arm::search`]: its defaults, then a seeded draw from its own knob
//!   space), run on the calibration scenario alone (Poisson load stepping
//!   through 1.5, 3 and 6 × `C*`, a seed of its own; no evaluation cell has
//!   that shape); the candidate with the highest goodput wins (in steps of
//!   0.5 % of `C*`; ties: lower admitted p99 TTFT, then lower p99 time to a
//!   529) and is frozen for every scenario.
//! * Every scenario runs every arm twice: as tuned, and with its defaults
//!   (what a user who tunes nothing gets).
//! * The reference of each scenario is the best goodput any arm reached
//!   when its same candidates were run on that very scenario (tuned on the
//!   cell, an oracle of tuning; arms without knobs count as they are).
//! * Runs are independent and deterministic; two threads take them in turn
//!   and the results keep the matrix's order.

use std::cmp::Reverse;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

use crate::arm::{Arm, ArmKind};
use crate::record::Measured;
use crate::replicas::{run_replicas, ReplicaRow};
use crate::scenario::{calibration, scenarios, Scenario};
use crate::shift::Shift;
use crate::sim::{run, Conditions};
use crate::workload::{RequestSpec, WorkloadSpec};

/// How much to run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Options {
    /// CI's short mode: shorter runs, fewer loads and candidates.
    pub quick: bool,
    /// Seed of the evaluation workloads.
    pub seed: u64,
    /// Threads running simulations.
    pub threads: usize,
}

/// One arm on one scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// The scenario's name.
    pub scenario: String,
    /// Its group.
    pub group: &'static str,
    /// Its load in units of `C*`.
    pub load: f64,
    /// The arm.
    pub arm: ArmKind,
    /// With the design's defaults rather than its knobs as tuned.
    pub defaults: bool,
    /// Every figure.
    pub measured: Measured,
    /// Seconds from the change until the smoothed goodput stays within 10 %
    /// of its final level for ten seconds with admitted p99 TTFT within the
    /// SLO; `None`: never within the run.
    pub settle_s: Option<f64>,
    /// Seconds from the change until the smoothed goodput reaches 95 % of
    /// `min(offered, C*)`; `None`: never within the run.
    pub recover_s: Option<f64>,
    /// Jain's index over the tenants' served tokens, relative to their
    /// demand capped at a max-min fair share.
    pub jain: Option<f64>,
}

/// A tuned arm.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tuned {
    /// The winner.
    pub arm: Arm,
    /// Its goodput on the calibration scenario, fraction of `C*`.
    pub goodput_frac: f64,
    /// Its defaults' goodput there.
    pub defaults_frac: f64,
    /// Candidates tried.
    pub candidates: usize,
    /// Candidates in the design's whole knob space.
    pub space: usize,
}

/// The best an arm did on one scenario when its candidates ran there.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CellBest {
    /// The scenario's name.
    pub scenario: String,
    /// The arm.
    pub arm: ArmKind,
    /// Its best goodput there, fraction of `C*`.
    pub goodput_frac: f64,
    /// The knobs that reached it.
    pub knobs: String,
}

/// A light tenant of the tenants scenario, served alone and with the others.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Alone {
    /// The arm.
    pub arm: ArmKind,
    /// The tenant's index.
    pub tenant: usize,
    /// Its goodput with only its own requests offered, requests/s.
    pub alone_rps: f64,
    /// Its goodput beside the others, requests/s.
    pub shared_rps: f64,
}

/// Everything the matrix measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Matrix {
    /// How it was run.
    pub options: Options,
    /// The fleet and signal conditions (the stale scenarios change two).
    pub conditions: Conditions,
    /// `C*`, requests per second.
    pub capacity: f64,
    /// Bisection probes of `C*`: (rate, SLO attainment of arm (a)).
    pub capacity_probes: Vec<(f64, f64)>,
    /// Each shift's own `C*`, requests/s.
    pub shifted_capacity: Vec<(Shift, f64)>,
    /// The engine against Dynamo's mocker, on its replay workload.
    pub mocker: crate::calibrate::Calibration,
    /// The calibration scenario the arms were tuned on.
    pub calibration: Scenario,
    /// Candidates per tunable arm.
    pub budget: usize,
    /// Each arm as tuned.
    pub tuned: Vec<Tuned>,
    /// Each tunable arm's best on each scenario, tuned there.
    pub cell_best: Vec<CellBest>,
    /// The scenarios.
    pub scenarios: Vec<Scenario>,
    /// Every run, scenario by scenario, arm by arm: as tuned, then with the
    /// defaults.
    pub rows: Vec<Row>,
    /// The light tenants of the tenants scenario run alone, for arms (e),
    /// (g) and (h).
    pub alone: Vec<Alone>,
    /// Many frontends in front of one fleet (`replicas.rs`).
    pub replicas: Vec<ReplicaRow>,
    /// Simulations run, tuning included.
    pub runs: usize,
    /// Wall time, seconds.
    pub wall_s: f64,
}

/// Runs `jobs` on `threads` threads and returns the results in order.
pub(crate) fn parallel<T: Sync, R: Send>(
    threads: usize,
    jobs: Vec<T>,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<R>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let r = f(job);
                out.lock().expect("results")[i] = Some(r);
            });
        }
    });
    out.into_inner()
        .expect("results")
        .into_iter()
        .map(|r| r.expect("every job ran"))
        .collect()
}

/// The best of `measured`: the highest goodput, in steps of half a percent
/// of `C*` (finer is the workload's noise); then the lower admitted p99
/// TTFT; then the lower p99 time to a 529. The first wins a tie.
fn best(measured: &[Measured]) -> Option<(usize, &Measured)> {
    let key = |m: &Measured| {
        (
            Reverse((m.goodput_frac * 200.0).floor() as i64),
            m.ttft_ms.p99.round() as i64,
            m.time_to_reject_ms.p99.round() as i64,
        )
    };
    measured.iter().enumerate().min_by_key(|(_, m)| key(m))
}

/// A five-bin moving average of the goodput series.
fn smoothed(m: &Measured, i: usize) -> f64 {
    let n = m.series_goodput.len();
    let (lo, hi) = (i.saturating_sub(2), (i + 3).min(n));
    m.series_goodput[lo..hi].iter().sum::<f64>() / (hi - lo) as f64
}

/// Settling after a change: the first time from which the smoothed goodput
/// stays within 10 % of its final level (the mean of the second half of
/// the time left) for ten seconds, every bin's admitted p99 TTFT within the
/// SLO.
fn settle(m: &Measured, scenario: &Scenario, slo_ttft_ms: f64) -> Option<f64> {
    let from = scenario.change_at_s?;
    let bins = m.series_goodput.len();
    let idx = |t: f64| ((t / m.bin_s) as usize).min(bins);
    let (a, b) = (idx(from), idx(scenario.duration_s));
    let tail = &m.series_goodput[(a + b) / 2..b];
    let level = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
    let ok = |i: usize| {
        (smoothed(m, i) - level).abs() <= 0.1 * level && m.series_ttft_p99_ms[i] <= slo_ttft_ms
    };
    let hold = idx(10.0).max(1);
    (a..b.saturating_sub(hold))
        .find(|&i| (i..i + hold).all(ok))
        .map(|i| (i as f64 * m.bin_s - from).max(0.0))
}

/// Recovery after a change: the first time the smoothed goodput reaches 95 %
/// of what an oracle could serve, `min(offered, C*)`.
fn recover(m: &Measured, scenario: &Scenario, capacity: f64) -> Option<f64> {
    let from = scenario.change_at_s?;
    let bins = m.series_goodput.len();
    let idx = |t: f64| ((t / m.bin_s) as usize).min(bins);
    let target = 0.95 * capacity * scenario.profile.last().map_or(0.0, |p| p.1.min(1.0));
    (idx(from)..idx(scenario.duration_s))
        .find(|&i| smoothed(m, i) >= target)
        .map(|i| (i as f64 * m.bin_s - from).max(0.0))
}

/// Jain's index of served tokens relative to demand capped at a max-min
/// fair share of what was served in all.
pub fn jain(m: &Measured) -> Option<f64> {
    if m.tenants.len() < 2 {
        return None;
    }
    let total: f64 = m.tenants.iter().map(|t| t.served_tokens as f64).sum();
    let mut demand: Vec<(usize, f64)> = m
        .tenants
        .iter()
        .map(|t| t.demand_tokens as f64)
        .enumerate()
        .collect();
    demand.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut fair = vec![0.0; demand.len()];
    let mut left = total;
    for (k, &(i, d)) in demand.iter().enumerate() {
        let share = left / (demand.len() - k) as f64;
        fair[i] = d.min(share);
        left -= fair[i];
    }
    let x: Vec<f64> = m
        .tenants
        .iter()
        .zip(&fair)
        .map(|(t, f)| {
            if *f > 0.0 {
                t.served_tokens as f64 / f
            } else {
                1.0
            }
        })
        .collect();
    let sum: f64 = x.iter().sum();
    let sq: f64 = x.iter().map(|v| v * v).sum();
    Some(sum * sum / (x.len() as f64 * sq))
}

/// `C*` of the base fleet and workload, or of `shift`'s: the highest
/// Poisson rate at which arm (a) meets the SLOs for at least 99 % of
/// offered requests, by bisection from a bracket that holds; and the probes
/// (rate, attainment).
fn find_capacity(
    base: &Conditions,
    shift: Option<Shift>,
    options: Options,
) -> Result<(f64, Vec<(f64, f64)>), String> {
    let probe_s = if options.quick { 20.0 } else { 60.0 };
    let none = Arm::base(ArmKind::NoControl);
    let mut conditions = *base;
    if let Some(s) = shift {
        s.apply_conditions(&mut conditions);
    }
    let attainment = |rate: f64| -> Result<f64, String> {
        let mut w = WorkloadSpec::steady(rate, probe_s, options.seed ^ 0xC0FFEE);
        if let Some(s) = shift {
            s.apply_workload(&mut w);
        }
        let reqs = w.generate();
        Ok(run(&none, &w, &reqs, &conditions, rate)?
            .measured
            .attainment_offered)
    };
    let mut probes = Vec::new();
    let (mut lo, mut hi) = (0.25f64, 16.0f64);
    loop {
        let a = attainment(hi)?;
        probes.push((hi, a));
        if a < 0.99 {
            break;
        }
        lo = hi;
        hi *= 2.0;
        if hi > 1e6 {
            return Err("the fleet met the SLOs at every rate tried".into());
        }
    }
    for _ in 0..if options.quick { 7 } else { 10 } {
        let mid = (lo + hi) / 2.0;
        let a = attainment(mid)?;
        probes.push((mid, a));
        if a >= 0.99 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok((lo, probes))
}

/// Runs the matrix.
pub fn run_matrix(options: Options, conditions: Conditions) -> Result<Matrix, String> {
    let started = Instant::now();
    let mut runs = 0;
    let (capacity, probes) = find_capacity(&conditions, None, options)?;
    runs += probes.len();
    let mut shifted_capacity = Vec::new();
    let shifts: Vec<Shift> = scenarios(options.quick)
        .iter()
        .filter_map(|s| s.shift)
        .fold(Vec::new(), |mut v, s| {
            if !v.contains(&s) {
                v.push(s);
            }
            v
        });
    for shift in shifts {
        let (c, p) = find_capacity(&conditions, Some(shift), options)?;
        runs += p.len();
        shifted_capacity.push((shift, c));
    }
    let capacity_of = |s: &Scenario| {
        s.shift
            .and_then(|x| shifted_capacity.iter().find(|(k, _)| *k == x))
            .map_or(capacity, |(_, c)| *c)
    };

    // Tuning on the calibration scenario, the same budget for every arm.
    let budget = if options.quick { 4 } else { 16 };
    let calibration = calibration(options.quick);
    let calib = calibration.workload(capacity, options.seed ^ 0x7E57);
    let calib_reqs = calib.generate();
    let with_rate = |mut arm: Arm| {
        if arm.kind == ArmKind::TokenBucket {
            arm.bucket_rate = Some(capacity);
        }
        arm
    };
    let candidates: Vec<(ArmKind, Vec<Arm>)> = ArmKind::TUNABLE
        .iter()
        .map(|&k| (k, Arm::search(k, budget, options.seed ^ 0x5EA7C4)))
        .collect();
    let jobs: Vec<&Arm> = candidates.iter().flat_map(|(_, c)| c).collect();
    let results = parallel(options.threads, jobs, |arm| {
        run(arm, &calib, &calib_reqs, &conditions, capacity).map(|r| r.measured)
    });
    runs += results.len();
    let mut results = results.into_iter();
    let mut tuned = Vec::new();
    for kind in ArmKind::ALL {
        let Some((_, grid)) = candidates.iter().find(|(k, _)| *k == kind) else {
            // No knobs: as it is.
            tuned.push(Tuned {
                arm: with_rate(Arm::base(kind)),
                goodput_frac: f64::NAN,
                defaults_frac: f64::NAN,
                candidates: 0,
                space: 0,
            });
            continue;
        };
        let measured = results
            .by_ref()
            .take(grid.len())
            .collect::<Result<Vec<_>, _>>()?;
        let (i, m) = best(&measured).ok_or("an empty search")?;
        tuned.push(Tuned {
            arm: grid[i].clone(),
            goodput_frac: m.goodput_frac,
            defaults_frac: measured[0].goodput_frac,
            candidates: grid.len(),
            space: Arm::space(kind).len(),
        });
    }

    // Every scenario, every arm as tuned and with its defaults, same
    // workload per scenario; then every tunable arm's candidates on every
    // scenario, for the reference.
    let scenarios = scenarios(options.quick);
    let workloads: Vec<_> = scenarios
        .iter()
        .map(|s| {
            let w = s.workload(capacity_of(s), options.seed);
            let reqs = w.generate();
            (w, reqs)
        })
        .collect();
    let mut jobs = Vec::new();
    for s in 0..scenarios.len() {
        for t in &tuned {
            jobs.push((s, t.arm.clone(), false));
        }
        for t in tuned.iter().filter(|t| t.candidates > 0) {
            jobs.push((s, with_rate(Arm::base(t.arm.kind)), true));
        }
    }
    runs += jobs.len();
    let slo_ttft_ms = conditions.slo.ttft_s * 1e3;
    let results = parallel(options.threads, jobs, |(s, arm, defaults)| {
        let scenario = &scenarios[*s];
        let (w, reqs) = &workloads[*s];
        let c = scenario.conditions(&conditions);
        let capacity = capacity_of(scenario);
        // The token bucket admits at this cell's own `C*`.
        let arm = &Arm {
            bucket_rate: arm.bucket_rate.map(|_| capacity),
            ..arm.clone()
        };
        run(arm, w, reqs, &c, capacity).map(|r| Row {
            scenario: scenario.name.clone(),
            group: scenario.group,
            load: scenario.load,
            arm: arm.kind,
            defaults: *defaults,
            settle_s: settle(&r.measured, scenario, slo_ttft_ms),
            recover_s: recover(&r.measured, scenario, capacity),
            jain: jain(&r.measured),
            measured: r.measured,
        })
    });
    let rows = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    let mut jobs = Vec::new();
    for s in 0..scenarios.len() {
        for (_, grid) in &candidates {
            for arm in grid {
                jobs.push((s, arm));
            }
        }
    }
    runs += jobs.len();
    let results = parallel(options.threads, jobs, |(s, arm)| {
        let (w, reqs) = &workloads[*s];
        let c = scenarios[*s].conditions(&conditions);
        run(arm, w, reqs, &c, capacity_of(&scenarios[*s])).map(|r| r.measured)
    });
    let mut results = results.into_iter();
    let mut cell_best = Vec::new();
    for scenario in &scenarios {
        for (kind, grid) in &candidates {
            let measured = results
                .by_ref()
                .take(grid.len())
                .collect::<Result<Vec<_>, _>>()?;
            let (i, m) = best(&measured).ok_or("an empty search")?;
            cell_best.push(CellBest {
                scenario: scenario.name.clone(),
                arm: *kind,
                goodput_frac: m.goodput_frac,
                knobs: grid[i].knobs(),
            });
        }
    }
    let alone = light_tenants_alone(
        &scenarios,
        &workloads,
        &tuned,
        &rows,
        &conditions,
        capacity,
        options,
    )?;
    runs += alone.len();
    let arm = |k: ArmKind| {
        tuned
            .iter()
            .find(|t| t.arm.kind == k)
            .map(|t| t.arm.clone())
            .ok_or("every arm is tuned")
    };
    let queue = arm(ArmKind::Queue)?;
    let designs = [
        ("(e)", arm(ArmKind::Loadgate)?),
        ("(g)", queue.clone()),
        (
            "(g), no worker gates",
            Arm {
                gate: None,
                ..queue
            },
        ),
    ];
    let replicas = run_replicas(&designs, capacity, &conditions, options)?;
    runs += replicas.len();
    let mocker = crate::calibrate::run_calibration(options.threads)?;
    runs += mocker.runs;
    Ok(Matrix {
        options,
        conditions,
        capacity,
        capacity_probes: probes,
        shifted_capacity,
        mocker,
        calibration,
        budget,
        tuned,
        cell_best,
        scenarios,
        rows,
        alone,
        replicas,
        runs,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// Runs every light tenant of the tenants scenario (all but the first, the
/// heavy one) with only its own requests, for arms (e), (g) and (h).
fn light_tenants_alone(
    scenarios: &[Scenario],
    workloads: &[(WorkloadSpec, Vec<RequestSpec>)],
    tuned: &[Tuned],
    rows: &[Row],
    conditions: &Conditions,
    capacity: f64,
    options: Options,
) -> Result<Vec<Alone>, String> {
    let Some(s) = scenarios.iter().position(|s| s.group == "tenants") else {
        return Ok(Vec::new());
    };
    let (w, reqs) = &workloads[s];
    let mut jobs = Vec::new();
    for kind in [ArmKind::Loadgate, ArmKind::Queue, ArmKind::FairQueue] {
        let Some(t) = tuned.iter().find(|t| t.arm.kind == kind) else {
            continue;
        };
        for tenant in 1..w.tenants.len() {
            jobs.push((t.arm.clone(), tenant));
        }
    }
    let c = scenarios[s].conditions(conditions);
    let results = parallel(options.threads, jobs, |(arm, tenant)| {
        let own: Vec<RequestSpec> = reqs
            .iter()
            .filter(|r| usize::from(r.tenant) == *tenant)
            .copied()
            .collect();
        let shared = rows
            .iter()
            .find(|r| r.group == "tenants" && r.arm == arm.kind && !r.defaults)
            .map_or(0.0, |r| r.measured.tenant_goodput_rps(*tenant));
        run(arm, w, &own, &c, capacity).map(|r| Alone {
            arm: arm.kind,
            tenant: *tenant,
            alone_rps: r.measured.tenant_goodput_rps(*tenant),
            shared_rps: shared,
        })
    });
    results.into_iter().collect()
}
