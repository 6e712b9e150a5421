//! The routing and monitor cases: route selection, load reports, busy-set
//! operations and thresholds, against the reference monitor.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use loadgate::{BusySet, LoadReport, Policy, ThresholdUpdate};
use loadgate_benches::baseline::monitor::{RefLoad, RefThresholds};
use loadgate_benches::fixture::{free_kv, MonitorFixture, BUSY_KV, MODEL};
use loadgate_benches::harness::{interleave, under_writes, Side, UnderWrites};

use crate::{
    each, Case, Run, BOOK, BOOK_LEASED, BUSY_CONTAINS, BUSY_INSERT_REMOVE, BUSY_SNAPSHOT, CHECK,
    FLIP, MIN_COST, REPORT, SELECT, SLO_SELECT, SLO_SELECT_ADVISORY, THRESHOLD, UNDER_WRITES,
};

// ---------------------------------------------------------------------------
// Routing cases.

const SIZES: [usize; 3] = [64, 1024, 4096];
const FRACTIONS: [(f64, &str); 3] = [(0.0, "0%"), (0.5, "50%"), (0.99, "99%")];

pub(crate) fn routing_cases(run: &mut Run) {
    if !run.wants_any("select") && !run.wants_any("check") {
        return;
    }
    for &n in &SIZES {
        let mut fx = MonitorFixture::new(n, 1);
        for (k, &(frac, label)) in FRACTIONS.iter().enumerate() {
            fx.set_busy_fraction(frac, 42 + k as u64);
            for (policy, pname) in [
                (Policy::RoundRobin, "round-robin"),
                (Policy::Random, "random"),
                (Policy::PowerOfTwo, "power-of-two"),
            ] {
                let name = format!("select {pname}, {n} workers, {label} busy");
                let (m, r, f) = (&fx.monitor, &fx.router, &fx.floor);
                run.measure(Case::hot(name, SELECT), |budget| {
                    // A frontend routes through a `Route` handle; selecting
                    // by model name (one registry guard and hash lookup more)
                    // is shown beside it.
                    let route = m.route(MODEL).unwrap();
                    assert!(route.select(policy).is_ok() && m.select(MODEL, policy).is_ok());
                    let mut sides = [
                        each(|| route.select(policy).ok()),
                        each(|| match policy {
                            Policy::RoundRobin => r.select_round_robin().ok(),
                            Policy::Random => r.select_random().ok(),
                            Policy::PowerOfTwo => r.select_power_of_two().ok(),
                        }),
                        each(|| match policy {
                            Policy::RoundRobin => f.pick_round_robin(),
                            Policy::Random => f.pick_random(),
                            Policy::PowerOfTwo => f.pick_power_of_two(),
                        }),
                        each(|| m.select(MODEL, policy).ok()),
                    ];
                    interleave(budget, &mut sides)
                });
            }
            let name = format!("select min-cost of 64, {n} workers, {label} busy");
            run.measure(Case::hot(name, MIN_COST), |budget| {
                let cands = fx.candidates(64, 7 + k as u64);
                let (m, r) = (&fx.monitor, &fx.router);
                assert_eq!(
                    m.select_min_cost(MODEL, cands.iter().copied()).ok(),
                    r.select_min_cost(&cands).ok(),
                    "loadgate and the reference pick the same worker"
                );
                let mut sides = [
                    each(|| m.select_min_cost(MODEL, cands.iter().copied()).ok()),
                    each(|| r.select_min_cost(&cands).ok()),
                ];
                interleave(budget, &mut sides)
            });
        }
        let name = format!("check pinned worker, {n} workers");
        run.measure(Case::hot(name, CHECK), |budget| {
            fx.set_busy_fraction(0.5, 99);
            let i = fx.a_free_worker();
            let id = fx.ids[i];
            let (m, r, f) = (&fx.monitor, &fx.router, &fx.floor);
            let mut sides = [
                each(|| m.check(id).is_ok()),
                each(|| r.is_overloaded(id)),
                each(|| f.is_busy(i)),
            ];
            interleave(budget, &mut sides)
        });
    }
}

/// A select on a model with an SLO (advisory: each pick also counts what
/// the SLO would decide; enforced: its verdicts are in the busy bits)
/// against the same select on a twin fleet without one.
pub(crate) fn slo_cases(run: &mut Run) {
    if !run.wants_any("select") {
        return;
    }
    let n = 1024;
    for (mode, label, designs) in [
        (loadgate::SloMode::Enforce, "enforced", SLO_SELECT),
        (loadgate::SloMode::Advisory, "advisory", SLO_SELECT_ADVISORY),
    ] {
        let mut with = MonitorFixture::new(n, 1);
        let mut without = MonitorFixture::new(n, 1);
        with.set_busy_fraction(0.5, 5);
        without.set_busy_fraction(0.5, 5);
        let slo = loadgate::slo::Slo::from_secs(2.0, 0.1).unwrap();
        with.monitor.set_slo(MODEL, Some(slo), mode).unwrap();
        for (policy, pname) in [
            (Policy::Random, "random"),
            (Policy::PowerOfTwo, "power-of-two"),
        ] {
            let name = format!("select {pname} with an SLO ({label}), {n} workers, 50% busy");
            run.measure(Case::hot(name, designs), |budget| {
                let (a, b) = (
                    with.monitor.route(MODEL).unwrap(),
                    without.monitor.route(MODEL).unwrap(),
                );
                assert!(a.select(policy).is_ok() && b.select(policy).is_ok());
                let mut sides = [
                    each(|| a.select(policy).ok()),
                    each(|| b.select(policy).ok()),
                ];
                interleave(budget, &mut sides)
            });
        }
    }
}

// ---------------------------------------------------------------------------
// Monitor cases.

fn report(kv: u64) -> LoadReport {
    LoadReport {
        kv_used_blocks: Some(kv),
        ..Default::default()
    }
}

fn ref_load(kv: u64) -> RefLoad {
    RefLoad {
        kv_used_blocks: Some(kv),
        ..Default::default()
    }
}

pub(crate) fn monitor_cases(run: &mut Run) {
    if run.wants_any("report") || run.wants_any("book") {
        for &n in &[64usize, 1024] {
            let mut fx = MonitorFixture::new(n, 1);
            fx.set_busy_fraction(0.5, 5);
            let free: Vec<usize> = (0..n).filter(|&i| !fx.is_busy(i)).take(16).collect();
            let targets: Vec<(u64, u64)> = free.iter().map(|&i| (fx.ids[i], free_kv(i))).collect();

            let name = format!("report, no busy change, {n} workers");
            run.measure(Case::hot(name, REPORT), |budget| {
                let MonitorFixture { monitor, task, .. } = &mut fx;
                let (mut a, mut b) = (0usize, 0usize);
                let mut sides = [
                    each(|| {
                        let (id, kv) = targets[a % targets.len()];
                        a += 1;
                        black_box(monitor.report(id, 0, &report(kv + (a & 1) as u64)).is_ok());
                    }),
                    each(|| {
                        let (id, kv) = targets[b % targets.len()];
                        b += 1;
                        black_box(task.on_event(id, 0, &ref_load(kv + (b & 1) as u64)).is_ok());
                    }),
                ];
                interleave(budget, &mut sides)
            });

            let name = format!("report, busy flip (publish), {n} workers, 50% busy");
            run.measure(Case::hot(name, FLIP[usize::from(n >= 1024)]), |budget| {
                let (id, kv) = targets[0];
                let MonitorFixture { monitor, task, .. } = &mut fx;
                let (mut a, mut b) = (false, false);
                let series = interleave(
                    budget,
                    &mut [
                        each(|| {
                            a = !a;
                            let kv = if a { BUSY_KV } else { kv };
                            black_box(monitor.report(id, 0, &report(kv)).is_ok());
                        }),
                        each(|| {
                            b = !b;
                            let kv = if b { BUSY_KV } else { kv };
                            black_box(task.on_event(id, 0, &ref_load(kv)).is_ok());
                        }),
                    ],
                );
                fx.report_all(free[0], kv);
                series
            });

            let name = format!("book + release blocks, {n} workers");
            run.measure(Case::hot(name, BOOK), |budget| {
                let (id, _) = targets[1];
                let MonitorFixture { monitor, task, .. } = &mut fx;
                let book = |blocks| RefLoad {
                    active_decode_blocks: Some(blocks),
                    ..Default::default()
                };
                let mut sides = [
                    each(|| monitor.book(id, 0, 4).expect("book").blocks()),
                    each(|| {
                        black_box(task.on_event(id, 0, &book(4)).is_ok());
                        black_box(task.on_event(id, 0, &book(0)).is_ok());
                    }),
                ];
                interleave(budget, &mut sides)
            });
        }
    }

    if run.wants_any("book") {
        leased_book_case(run);
    }
    busy_set_cases(run);

    let name = "threshold update, 4096 workers × 8 ranks";
    run.measure(Case::cold(name, THRESHOLD), |budget| {
        let mut fx = MonitorFixture::new(4096, 8);
        // Half the workers sit between the two thresholds: each update flips them.
        for i in (0..fx.n).step_by(2) {
            fx.report_all(i, 850);
        }
        let probe = fx.ids[1];
        let MonitorFixture { monitor, task, .. } = &mut fx;
        let (mut a, mut b) = (false, false);
        let mut sides = [
            each(|| {
                a = !a;
                let update = ThresholdUpdate {
                    active_decode_blocks_threshold: Some(if a { 0.8 } else { 0.9 }),
                    ..Default::default()
                };
                black_box(monitor.set_thresholds(MODEL, &update).is_ok());
            }),
            each(|| {
                b = !b;
                task.shared().update_thresholds(&RefThresholds {
                    active_decode_blocks_threshold: Some(if b { 0.8 } else { 0.9 }),
                    ..Default::default()
                });
                // The reference re-evaluates on the next event.
                black_box(task.on_event(probe, 0, &ref_load(free_kv(1))).is_ok());
            }),
        ];
        interleave(budget, &mut sides)
    });

    let name = "select round-robin while 1 writer reports, 1024 workers (allocs: reader + writer)";
    run.measure(Case::hot(name, UNDER_WRITES), |budget| {
        let mut fx = MonitorFixture::new(1024, 1);
        fx.set_busy_fraction(0.5, 11);
        let flippers: Vec<(u64, u64)> = (0..fx.n)
            .filter(|&i| !fx.is_busy(i))
            .take(8)
            .map(|i| (fx.ids[i], free_kv(i)))
            .collect();
        let MonitorFixture {
            monitor,
            task,
            router,
            ..
        } = &mut fx;
        let monitor = &*monitor;
        let route = monitor.route(MODEL).unwrap();
        let router = router.clone();
        // Each writer flips the next flipper, busy then free.
        let flip = |k: usize| {
            let (id, kv) = flippers[k % flippers.len()];
            let busy = (k / flippers.len()) % 2 == 0;
            (id, if busy { BUSY_KV } else { kv })
        };
        let (mut a, mut b) = (0usize, 0usize);
        let mut sides = [
            UnderWrites {
                read: Box::new(|ops| {
                    for _ in 0..ops {
                        black_box(route.select(Policy::RoundRobin).ok());
                    }
                }),
                write: Box::new(|| {
                    let (id, kv) = flip(a);
                    a += 1;
                    let _ = monitor.report(id, 0, &report(kv));
                }),
            },
            UnderWrites {
                read: Box::new(|ops| {
                    for _ in 0..ops {
                        black_box(router.select_round_robin().ok());
                    }
                }),
                write: Box::new(|| {
                    let (id, kv) = flip(b);
                    b += 1;
                    let _ = task.on_event(id, 0, &ref_load(kv));
                }),
            },
        ];
        let measured = under_writes(budget, &mut sides);
        eprintln!(
            "  writer ops during the reader's rounds: loadgate {}, reference {}",
            measured[0].1, measured[1].1
        );
        measured.into_iter().map(|(series, _)| series).collect()
    });
}

/// `BusySet` on its own, against bare atomics doing the same bit work.
pub(crate) fn busy_set_cases(run: &mut Run) {
    let set = BusySet::new(4096);
    let bare: Vec<AtomicU64> = (0..64).map(|_| AtomicU64::new(0)).collect();
    for s in (0..4096).step_by(3) {
        set.insert(s);
        bare[s / 64].fetch_or(1 << (s % 64), Ordering::Relaxed);
    }
    run.measure(
        Case::hot("busy set: contains, 4096 slots", BUSY_CONTAINS),
        |budget| {
            let lg = Side::new(|ops| {
                for i in 0..ops {
                    black_box(set.contains(black_box((i as usize * 61) & 4095)));
                }
            });
            let floor = Side::new(|ops| {
                for i in 0..ops {
                    let s = black_box((i as usize * 61) & 4095);
                    black_box(bare[s / 64].load(Ordering::Acquire) >> (s % 64) & 1 == 1);
                }
            });
            let mut sides = [lg, floor];
            interleave(budget, &mut sides)
        },
    );
    run.measure(
        Case::hot(
            "busy set: insert + remove (epoch bumped twice)",
            BUSY_INSERT_REMOVE,
        ),
        |budget| {
            let lg = each(|| {
                black_box(set.insert(1000));
                black_box(set.remove(1000));
            });
            let floor = each(|| {
                black_box(bare[15].fetch_or(1 << 40, Ordering::AcqRel));
                black_box(bare[15].fetch_and(!(1 << 40), Ordering::AcqRel));
            });
            let mut sides = [lg, floor];
            interleave(budget, &mut sides)
        },
    );
    run.measure(
        Case::hot("busy set: snapshot, 4096 slots", BUSY_SNAPSHOT),
        |budget| {
            let mut words = vec![0u64; set.words()];
            let mut copy = vec![0u64; bare.len()];
            let lg = each(|| set.snapshot(&mut words));
            let floor = each(|| {
                for (c, w) in copy.iter_mut().zip(&bare) {
                    *c = w.load(Ordering::Acquire);
                }
                black_box(&copy);
            });
            let mut sides = [lg, floor];
            interleave(budget, &mut sides)
        },
    );
}

/// Booking in leased mode (docs/replicas.md) against booking without it,
/// on 64 workers: a lone frontend whose sync runs on its own thread over
/// the in-process bus, once it holds the whole line.
fn leased_book_case(run: &mut Run) {
    use loadgate::cluster::replicas::{BookingSync, BookingSyncConfig, SyncMode};
    use loadgate::cluster::{InProcessBus, Subjects, Transport};
    use loadgate::{Monitor, MonotonicClock, WorkerSpec};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let n = 64u64;
    let make = || {
        let m = Arc::new(Monitor::new());
        for id in 1..=n {
            let spec = WorkerSpec {
                kv_total_blocks: Some(1 << 20),
                ..Default::default()
            };
            m.add_worker(MODEL, id, spec).expect("a worker");
        }
        m
    };
    let (leased, plain) = (make(), make());
    let subjects = Subjects::new("bench").expect("subjects");
    let mut config = BookingSyncConfig::new("bench");
    config.mode = SyncMode::Leased;
    config.lease = Duration::from_millis(20);
    let sync = BookingSync::new(leased.clone(), &subjects, config, MonotonicClock::shared())
        .expect("a sync");
    let bus: Arc<dyn Transport> = Arc::new(InProcessBus::new());
    let _attached = sync.attach(bus, &subjects).expect("attached");
    let start = Instant::now();
    while sync.stats().share < 1_000_000 {
        assert!(start.elapsed() < Duration::from_secs(30), "never joined");
        std::thread::sleep(Duration::from_millis(2));
    }
    let name = format!("book + release blocks, leased share, {n} workers");
    run.measure(Case::hot(name, BOOK_LEASED), |budget| {
        let mut sides = [
            each(|| leased.book(7, 0, 4).expect("book").blocks()),
            each(|| plain.book(7, 0, 4).expect("book").blocks()),
        ];
        interleave(budget, &mut sides)
    });
}
