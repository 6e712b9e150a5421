//! Routing: `Route::select` and `Monitor::select` (every policy), `select_min_cost` and `check`
//! against the reference routing snapshot and the bitset floor, at 64, 1024
//! and 4096 workers with 0 %, 50 % and 99 % of them busy.

// criterion_group! generates public functions without docs.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use loadgate::Policy;
use loadgate_benches::fixture::{MonitorFixture, MODEL};

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
}

fn select(c: &mut Criterion) {
    for n in [64, 1024, 4096] {
        let mut fx = MonitorFixture::new(n, 1);
        for (k, (frac, label)) in [(0.0, "0pct"), (0.5, "50pct"), (0.99, "99pct")]
            .into_iter()
            .enumerate()
        {
            fx.set_busy_fraction(frac, 42 + k as u64);
            for (policy, pname) in [
                (Policy::RoundRobin, "round_robin"),
                (Policy::Random, "random"),
                (Policy::PowerOfTwo, "power_of_two"),
            ] {
                let mut g = c.benchmark_group(format!("select/{pname}/{n}w/{label}"));
                let route = fx.monitor.route(MODEL).unwrap();
                g.bench_function("loadgate", |b| {
                    b.iter(|| black_box(route.select(policy)).ok())
                });
                g.bench_function("loadgate_by_name", |b| {
                    b.iter(|| black_box(fx.monitor.select(MODEL, policy)).ok())
                });
                g.bench_function("reference", |b| {
                    b.iter(|| {
                        black_box(match policy {
                            Policy::RoundRobin => fx.router.select_round_robin(),
                            Policy::Random => fx.router.select_random(),
                            Policy::PowerOfTwo => fx.router.select_power_of_two(),
                        })
                        .ok()
                    })
                });
                g.bench_function("floor", |b| {
                    b.iter(|| {
                        black_box(match policy {
                            Policy::RoundRobin => fx.floor.pick_round_robin(),
                            Policy::Random => fx.floor.pick_random(),
                            Policy::PowerOfTwo => fx.floor.pick_power_of_two(),
                        })
                    })
                });
                g.finish();
            }
            let cands = fx.candidates(64, 7 + k as u64);
            let mut g = c.benchmark_group(format!("select_min_cost/64of{n}w/{label}"));
            g.bench_function("loadgate", |b| {
                b.iter(|| black_box(fx.monitor.select_min_cost(MODEL, cands.iter().copied())).ok())
            });
            g.bench_function("reference", |b| {
                b.iter(|| black_box(fx.router.select_min_cost(&cands)).ok())
            });
            g.finish();
        }
        fx.set_busy_fraction(0.5, 99);
        let i = fx.a_free_worker();
        let id = fx.ids[i];
        let mut g = c.benchmark_group(format!("check/{n}w"));
        g.bench_function("loadgate", |b| {
            b.iter(|| black_box(fx.monitor.check(id)).ok())
        });
        g.bench_function("reference", |b| {
            b.iter(|| black_box(fx.router.is_overloaded(id)))
        });
        g.bench_function("floor", |b| b.iter(|| black_box(fx.floor.is_busy(i))));
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = config();
    targets = select
}
criterion_main!(benches);
