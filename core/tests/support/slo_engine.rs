//! A known engine for the SLO tests: its step time, and streams on rank 0
//! of worker 1 whose token gaps are its steps under the rank's load.
#![allow(dead_code)] // only the SLO tests use it

use std::time::Duration;

use loadgate::slo::Slo;
use loadgate::{Booking, Maintenance, ManualClock, Monitor, MonitorConfig, WorkerSpec};

/// The engine's batch budget, tokens a step.
pub const BATCH: u64 = 2048;

/// The engine: 5 ms a step, 20 µs a prefill token, 100 µs a request, 0.1 µs
/// a context token.
pub fn step(prefill: f64, running: f64, kv: f64) -> f64 {
    0.005 + 2e-5 * prefill + 1e-4 * running + 1e-7 * kv
}

/// Runs `steps` engine steps on rank 0 of worker 1 with a changing set of
/// requests: each step takes the engine's time under the rank's load then,
/// and gives every request on the rank a token. Returns the prefill tokens
/// its steps carried, on average over the last half of them.
pub fn serve(m: &Monitor, clock: &ManualClock, steps: usize) -> f64 {
    serve_with(m, clock, steps, false)
}

/// [`serve`], each run of 32 steps taking 0.3 or 1.7 times the engine's
/// time at random: a fit of it is right on average and each prediction
/// 70 % off or more.
pub fn serve_noisy(m: &Monitor, clock: &ManualClock, steps: usize) -> f64 {
    serve_with(m, clock, steps, true)
}

fn serve_with(m: &Monitor, clock: &ManualClock, steps: usize, noisy: bool) -> f64 {
    let mut live: Vec<(Booking, bool)> = Vec::new();
    let mut prefill = 0.0;
    let mut seed = 17u64;
    for i in 0..steps {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        // Requests come and go: between 1 and 40 on the rank.
        if live.len() < 40 && (live.len() < 2 || seed % 3 == 0) {
            let prompt = 16 + seed % 1500;
            let b = m.book_with_prefill(1, 0, prompt / 16, prompt).unwrap();
            live.push((b, false));
        } else if live.len() > 1 && seed % 5 == 0 {
            live.swap_remove((seed as usize / 7) % live.len());
        }
        let load = m.rank_load(1, 0).unwrap();
        let prompts = load.active_prefill_tokens.unwrap_or(0).min(BATCH) as f64;
        if i >= steps / 2 {
            prefill += prompts;
        }
        let gap = step(
            prompts,
            live.len() as f64,
            (load.active_decode_blocks * 16) as f64,
        );
        // In runs of 32 steps, so that no window of observed steps averages
        // it out.
        let run = ((i / 32) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 63;
        let jitter = match (noisy, run) {
            (false, _) => 1.0,
            (true, 0) => 0.3,
            (true, _) => 1.7,
        };
        clock.advance(Duration::from_secs_f64(gap * jitter));
        for (b, started) in &mut live {
            if *started {
                b.tokens(1);
            } else {
                b.first_token();
                *started = true;
            }
        }
        if i % 16 == 0 {
            m.maintain();
        }
    }
    m.maintain();
    prefill / (steps - steps / 2).max(1) as f64
}

/// A monitor on a manual clock with worker 1 of model "m": one rank of
/// `kv_total_blocks` blocks and the engine's batch budget.
pub fn monitor(kv_total_blocks: u64) -> (Monitor, std::sync::Arc<ManualClock>) {
    monitor_of(kv_total_blocks, None)
}

/// [`monitor`]'s, its engine declaring `max_num_seqs`.
pub fn monitor_of(
    kv_total_blocks: u64,
    max_num_seqs: Option<u64>,
) -> (Monitor, std::sync::Arc<ManualClock>) {
    monitor_with(WorkerSpec {
        kv_total_blocks: Some(kv_total_blocks),
        max_num_batched_tokens: Some(BATCH),
        max_num_seqs,
        ..Default::default()
    })
}

/// A monitor on a manual clock, maintained by hand, with worker 1 of
/// model "m" as `spec` says.
pub fn monitor_with(spec: WorkerSpec) -> (Monitor, std::sync::Arc<ManualClock>) {
    let clock = ManualClock::new();
    let config = MonitorConfig {
        maintenance: Maintenance::Manual,
        ..Default::default()
    };
    let m = Monitor::with_config(config, clock.clone()).unwrap();
    m.add_worker("m", 1, spec).unwrap();
    (m, clock)
}

/// An SLO of `ttft` and `tpot` seconds.
pub fn slo(ttft: f64, tpot: f64) -> Option<Slo> {
    Some(Slo::from_secs(ttft, tpot).unwrap())
}

/// How often the verdict on worker 1's rank 0 turned busy by `term`
/// (`frontend_slo_turned_busy_total`).
pub fn turned_busy(m: &Monitor, term: &str) -> u64 {
    let prefix = format!(
        "dynamo_frontend_slo_turned_busy_total{{by=\"{term}\",dp_rank=\"0\",worker_id=\"1\"}} "
    );
    m.metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
        .unwrap()
}

/// The value of the sample `series` (its name and labels, as the text
/// shows them) in `m`'s metrics.
pub fn metric(m: &Monitor, series: &str) -> f64 {
    let prefix = format!("dynamo_{series} ");
    m.metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or_else(|| panic!("no {series}"))
}
