//! Threaded stress: reporters, a booking router and selectors hammer one
//! model at once; selections are always registered, eligible-at-some-point
//! workers of the model, and afterwards the busy set equals the busy rule
//! applied (by an independent implementation) to the final loads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use loadgate::{
    LoadReport, ManualClock, Monitor, MonitorConfig, Policy, RouteError, ThresholdUpdate,
    WorkerSpec,
};

const WORKERS: u64 = 24;
const RANKS: u32 = 2;
const TOTAL: u64 = 100;

fn final_busy(m: &Monitor, id: u64) -> bool {
    (0..RANKS).all(|rank| {
        let l = m.rank_load(id, rank).unwrap();
        let line = 0.5 * l.kv_total_blocks as f64;
        let decode = l.kv_total_blocks > 0
            && (l.kv_used_blocks as f64 > line || l.active_decode_blocks as f64 > line);
        let prefill = l.active_prefill_tokens.is_some_and(|p| p > 500);
        decode || prefill
    })
}

#[test]
fn busy_set_matches_the_final_loads_after_concurrent_updates() {
    let iterations: u64 = std::env::var("LOADGATE_STRESS_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let m = Arc::new(Monitor::with_config(MonitorConfig::default(), ManualClock::new()).unwrap());
    for id in 0..WORKERS {
        let spec = WorkerSpec {
            dp_size: RANKS,
            kv_total_blocks: Some(TOTAL),
            ..Default::default()
        };
        m.add_worker("m", id, spec).unwrap();
    }
    m.add_worker("other", 1000, WorkerSpec::default()).unwrap();
    let t = ThresholdUpdate {
        active_decode_blocks_threshold: Some(0.5),
        active_prefill_tokens_threshold: Some(500),
        ..Default::default()
    };
    m.set_thresholds("m", &t).unwrap();

    let start = Arc::new(Barrier::new(6));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for seed in 0..2u64 {
        let (m, start, t) = (m.clone(), start.clone(), t.clone());
        handles.push(thread::spawn(move || {
            start.wait();
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for i in 0..iterations {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let id = x % WORKERS;
                let rank = ((x >> 8) % u64::from(RANKS)) as u32;
                let report = if seed == 0 {
                    LoadReport {
                        kv_used_blocks: Some((x >> 16) % 101),
                        ..Default::default()
                    }
                } else {
                    LoadReport {
                        active_prefill_tokens: Some((x >> 16) % 1001),
                        ..Default::default()
                    }
                };
                m.report(id, rank, &report).unwrap();
                if i % 1000 == 0 {
                    m.set_thresholds("m", &t).unwrap();
                }
            }
        }));
    }
    {
        let (m, start) = (m.clone(), start.clone());
        handles.push(thread::spawn(move || {
            start.wait();
            let mut held = Vec::new();
            for i in 0..iterations {
                let id = i % WORKERS;
                held.push(m.book(id, (i % 2) as u32, 1 + i % 7).unwrap());
                if held.len() > 40 {
                    let mut b = held.swap_remove((i % 40) as usize);
                    b.add_output_blocks(i % 3);
                }
            }
        }));
    }
    for policy in [Policy::RoundRobin, Policy::Random, Policy::PowerOfTwo] {
        let (m, start, stop) = (m.clone(), start.clone(), stop.clone());
        handles.push(thread::spawn(move || {
            start.wait();
            let mut picks = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match m.select("m", policy) {
                    Ok(id) => assert!(id < WORKERS, "picked {id}, not a worker of the model"),
                    Err(e) => assert_eq!(e, RouteError::Overloaded),
                }
                picks += 1;
            }
            assert!(picks > 0);
        }));
    }
    let selectors = handles.split_off(3);
    for h in handles {
        h.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for h in selectors {
        h.join().unwrap();
    }

    let expected: Vec<u64> = (0..WORKERS).filter(|&id| final_busy(&m, id)).collect();
    assert_eq!(m.busy_workers("m"), expected);
    for id in 0..WORKERS {
        assert_eq!(m.is_busy(id).unwrap(), expected.contains(&id));
    }
    // Once the writers stop, every policy (random and power-of-two through
    // the free list built while they ran) picks only free workers, and each
    // free worker is reachable.
    for policy in [Policy::RoundRobin, Policy::Random, Policy::PowerOfTwo] {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..2000 {
            match m.select("m", policy) {
                Ok(id) => {
                    assert!(!expected.contains(&id), "{policy:?} picked busy {id}");
                    seen.insert(id);
                }
                Err(e) => {
                    assert_eq!(e, RouteError::Overloaded);
                    assert_eq!(expected.len() as u64, WORKERS);
                }
            }
        }
        if policy != Policy::PowerOfTwo {
            assert_eq!(
                seen.len() as u64,
                WORKERS - expected.len() as u64,
                "{policy:?}"
            );
        }
    }
    let text = m.metrics_text();
    assert!(
        text.contains(&format!(
            "dynamo_frontend_model_busy_workers{{model=\"m\"}} {}",
            expected.len()
        )),
        "{text}"
    );
}
