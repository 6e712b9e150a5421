//! Monitor writes and the busy set: `report` without and with a busy flip,
//! `book` + release, a threshold update over 4096 workers × 8 ranks, and the
//! `BusySet` primitives, against the reference monitor (which rebuilds the
//! routing snapshot on every busy change).

// criterion_group! generates public functions without docs.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use loadgate::{BusySet, LoadReport, ThresholdUpdate};
use loadgate_benches::baseline::monitor::{RefLoad, RefThresholds};
use loadgate_benches::fixture::{free_kv, MonitorFixture, BUSY_KV, MODEL};

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
}

fn kv(v: u64) -> LoadReport {
    LoadReport {
        kv_used_blocks: Some(v),
        ..Default::default()
    }
}

fn ref_kv(v: u64) -> RefLoad {
    RefLoad {
        kv_used_blocks: Some(v),
        ..Default::default()
    }
}

fn report(c: &mut Criterion) {
    for n in [64, 1024] {
        let mut fx = MonitorFixture::new(n, 1);
        fx.set_busy_fraction(0.5, 5);
        let i = fx.a_free_worker();
        let (id, free) = (fx.ids[i], free_kv(i));
        let MonitorFixture { monitor, task, .. } = &mut fx;

        let mut g = c.benchmark_group(format!("report_no_change/{n}w"));
        let mut x = 0u64;
        g.bench_function("loadgate", |b| {
            b.iter(|| {
                x ^= 1;
                black_box(monitor.report(id, 0, &kv(free + x))).ok()
            })
        });
        g.bench_function("reference", |b| {
            b.iter(|| {
                x ^= 1;
                black_box(task.on_event(id, 0, &ref_kv(free + x))).ok()
            })
        });
        g.finish();

        let mut g = c.benchmark_group(format!("report_busy_flip/{n}w"));
        let mut busy = false;
        g.bench_function("loadgate", |b| {
            b.iter(|| {
                busy = !busy;
                black_box(monitor.report(id, 0, &kv(if busy { BUSY_KV } else { free }))).ok()
            })
        });
        g.bench_function("reference", |b| {
            b.iter(|| {
                busy = !busy;
                black_box(task.on_event(id, 0, &ref_kv(if busy { BUSY_KV } else { free }))).ok()
            })
        });
        g.finish();

        let mut g = c.benchmark_group(format!("book_release/{n}w"));
        g.bench_function("loadgate", |b| {
            b.iter(|| black_box(monitor.book(id, 0, 4).map(|bk| bk.blocks())).ok())
        });
        g.bench_function("reference_2_events", |b| {
            b.iter(|| {
                let book = |v| RefLoad {
                    active_decode_blocks: Some(v),
                    ..Default::default()
                };
                black_box(task.on_event(id, 0, &book(4))).ok();
                black_box(task.on_event(id, 0, &book(0))).ok()
            })
        });
        g.finish();
    }
}

fn thresholds(c: &mut Criterion) {
    let mut fx = MonitorFixture::new(4096, 8);
    for i in (0..fx.n).step_by(2) {
        fx.report_all(i, 850);
    }
    let probe = fx.ids[1];
    let MonitorFixture { monitor, task, .. } = &mut fx;
    let mut g = c.benchmark_group("threshold_update/4096w_x_8ranks");
    g.sample_size(10);
    let mut low = false;
    g.bench_function("loadgate", |b| {
        b.iter(|| {
            low = !low;
            let update = ThresholdUpdate {
                active_decode_blocks_threshold: Some(if low { 0.8 } else { 0.9 }),
                ..Default::default()
            };
            black_box(monitor.set_thresholds(MODEL, &update)).ok()
        })
    });
    g.bench_function("reference_store_and_next_event", |b| {
        b.iter(|| {
            low = !low;
            task.shared().update_thresholds(&RefThresholds {
                active_decode_blocks_threshold: Some(if low { 0.8 } else { 0.9 }),
                ..Default::default()
            });
            black_box(task.on_event(probe, 0, &ref_kv(free_kv(1)))).ok()
        })
    });
    g.finish();
}

fn busy_set(c: &mut Criterion) {
    let set = BusySet::new(4096);
    for s in (0..4096).step_by(3) {
        set.insert(s);
    }
    let mut g = c.benchmark_group("busy_set/4096");
    g.bench_function("insert_remove", |b| {
        b.iter(|| {
            black_box(set.insert(1000));
            black_box(set.remove(1000))
        })
    });
    g.bench_function("contains", |b| {
        b.iter(|| black_box(set.contains(black_box(2001))))
    });
    let mut words = vec![0u64; set.words()];
    g.bench_function("snapshot", |b| {
        b.iter(|| black_box(set.snapshot(&mut words)))
    });
    g.bench_function("count", |b| b.iter(|| black_box(set.count())));
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = report, thresholds, busy_set
}
criterion_main!(benches);
