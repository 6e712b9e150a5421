//! `compare`: runs each loadgate hot path and the reference designs it
//! replaces, interleaved in one process, and prints one table: per-op p50
//! and p99 from hdrhistogram, allocations per op, the ratio, and the target
//! from the benchmarks issue with whether this run met it.
//!
//! Exits non-zero if a loadgate hot path allocated while it was measured
//! (counting global allocator). Timings never fail the run.
//!
//! ```text
//! cargo run --release -p loadgate-benches --bin compare            # full run
//! cargo run --release -p loadgate-benches --bin compare -- --quick # CI
//! cargo run --release -p loadgate-benches --bin compare -- --filter select
//! ```

use std::cell::Cell;
use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::task::Poll;
use std::time::{Duration, Instant};

use loadgate::{
    AdmissionGate, AdmitError, BusySet, GateConfig, LoadReport, OwnedPermit, Policy,
    ThresholdUpdate,
};
use loadgate_benches::baseline::admission::{
    ChannelAdmission, ChannelGate, MutexAdmission, MutexGate,
};
use loadgate_benches::baseline::monitor::{RefLoad, RefThresholds};
use loadgate_benches::fixture::{free_kv, noop_waker, poll_once, MonitorFixture, BUSY_KV, MODEL};
use loadgate_testkit::alloc::{thread_allocations, CountingAlloc};
use loadgate_benches::harness::{
    contend, interleave, record_one, under_writes, Budget, Series, SharedSide, Side, UnderWrites,
};
use tokio::sync::Semaphore;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

// ---------------------------------------------------------------------------
// Rows and targets.

/// What the issue asks of a comparison.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// No target: shown for information.
    None,
    /// loadgate's p50 at least this many times lower than the design's.
    Faster(f64),
    /// loadgate's p50 at most this many times the floor's.
    WithinOf(f64),
    /// loadgate's throughput at least this many times the design's.
    Throughput(f64),
}

struct Compared {
    design: &'static str,
    series: Series,
    target: Target,
}

struct Row {
    case: String,
    /// Whether the loadgate side is a hot path that must not allocate.
    hot: bool,
    /// Whether the case compares throughput (several threads).
    throughput: bool,
    loadgate: Series,
    others: Vec<Compared>,
}

impl Compared {
    /// The ratio shown, and whether the target was met.
    fn ratio(&self, lg: &Series, throughput: bool) -> (String, Option<bool>) {
        let faster = self.series.p50() / lg.p50().max(1e-3);
        match self.target {
            Target::WithinOf(x) => {
                let r = lg.p50() / self.series.p50().max(1e-3);
                (format!("{r:.2}× floor"), Some(r <= x))
            }
            Target::Throughput(x) => {
                let r = lg.throughput() / self.series.throughput().max(1e-9);
                (format!("{r:.2}× throughput"), Some(r >= x))
            }
            Target::Faster(x) => (format!("{faster:.2}× faster"), Some(faster >= x)),
            Target::None if throughput => {
                let r = lg.throughput() / self.series.throughput().max(1e-9);
                (format!("{r:.2}× throughput"), None)
            }
            Target::None => (format!("{faster:.2}× faster"), None),
        }
    }

    fn target_text(&self) -> String {
        match self.target {
            Target::None => "—".into(),
            Target::Faster(x) => format!("≥ {x}× faster"),
            Target::WithinOf(x) => format!("≤ {x}× floor"),
            Target::Throughput(x) => format!("≥ {x}× throughput"),
        }
    }
}

fn ns(v: f64) -> String {
    if v >= 100_000.0 {
        format!("{:.0} µs", v / 1000.0)
    } else if v >= 10_000.0 {
        format!("{:.1} µs", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0} ns")
    } else {
        format!("{v:.1} ns")
    }
}

fn allocs(s: &Series) -> String {
    let a = s.allocs_per_op();
    if s.allocs == 0 {
        "0".into()
    } else if a >= 0.1 {
        format!("{a:.1}")
    } else {
        format!("{} in {}", s.allocs, s.ops)
    }
}

fn latency_cells(s: &Series, throughput: bool) -> (String, String) {
    if throughput {
        let on_cpu = s
            .threads_on_cpu()
            .map_or(String::new(), |t| format!(", {t:.1} threads on CPU"));
        (
            format!("{} ({:.1} M/s{on_cpu})", ns(s.p50()), s.throughput() / 1e6),
            ns(s.p99()),
        )
    } else {
        (ns(s.p50()), ns(s.p99()))
    }
}

// ---------------------------------------------------------------------------
// Command line.

struct Opts {
    quick: bool,
    filter: Option<String>,
    rounds: Option<usize>,
    round_ms: Option<u64>,
}

/// Mean cost of one `Instant::now()`: the gate reads the clock twice per
/// queued request, so this explains much of the queued rows.
fn clock_read_nanos() -> f64 {
    const READS: u32 = 200_000;
    let start = Instant::now();
    for _ in 0..READS {
        black_box(Instant::now());
    }
    start.elapsed().as_nanos() as f64 / f64::from(READS)
}

fn parse_args() -> Opts {
    let mut opts = Opts {
        quick: false,
        filter: None,
        rounds: None,
        round_ms: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => opts.quick = true,
            "--filter" => opts.filter = args.next(),
            "--rounds" => opts.rounds = args.next().and_then(|v| v.parse().ok()),
            "--round-ms" => opts.round_ms = args.next().and_then(|v| v.parse().ok()),
            "-h" | "--help" => {
                println!(
                    "usage: compare [--quick] [--filter SUBSTRING] [--rounds N] [--round-ms MS]\n\
                     Runs loadgate's hot paths and the reference designs interleaved and\n\
                     prints p50/p99 per op, allocations per op and ratios. --quick is the\n\
                     short CI mode. Exits 1 if a loadgate hot path allocated."
                );
                std::process::exit(0);
            }
            // `cargo bench` passes `--bench`; ignore it and anything unknown.
            _ => {}
        }
    }
    opts
}

struct Run {
    budget: Budget,
    filter: Option<String>,
    rows: Vec<Row>,
}

impl Run {
    fn wants(&self, case: &str) -> bool {
        self.filter.as_deref().is_none_or(|f| case.contains(f))
    }

    fn wants_any(&self, prefix: &str) -> bool {
        self.filter
            .as_deref()
            .is_none_or(|f| prefix.contains(f) || f.contains(prefix))
    }

    fn push(&mut self, row: Row) {
        eprintln!("  measured {}", row.case);
        self.rows.push(row);
    }
}

// ---------------------------------------------------------------------------
// Routing cases.

const SIZES: [usize; 3] = [64, 1024, 4096];
const FRACTIONS: [(f64, &str); 3] = [(0.0, "0%"), (0.5, "50%"), (0.99, "99%")];

fn routing_cases(run: &mut Run) {
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
                let case = format!("select {pname}, {n} workers, {label} busy");
                if !run.wants(&case) {
                    continue;
                }
                let (m, r, f) = (&fx.monitor, &fx.router, &fx.floor);
                // A frontend routes through a `Route` handle; selecting by
                // model name (one registry guard and hash lookup more) is
                // shown beside it.
                let route = m.route(MODEL).unwrap();
                assert!(route.select(policy).is_ok() && m.select(MODEL, policy).is_ok());
                let mut sides = [
                    Side::new(|ops| {
                        for _ in 0..ops {
                            black_box(route.select(policy).ok());
                        }
                    }),
                    Side::new(|ops| {
                        for _ in 0..ops {
                            black_box(match policy {
                                Policy::RoundRobin => r.select_round_robin(),
                                Policy::Random => r.select_random(),
                                Policy::PowerOfTwo => r.select_power_of_two(),
                            })
                            .ok();
                        }
                    }),
                    Side::new(|ops| {
                        for _ in 0..ops {
                            black_box(match policy {
                                Policy::RoundRobin => f.pick_round_robin(),
                                Policy::Random => f.pick_random(),
                                Policy::PowerOfTwo => f.pick_power_of_two(),
                            });
                        }
                    }),
                    Side::new(|ops| {
                        for _ in 0..ops {
                            black_box(m.select(MODEL, policy).ok());
                        }
                    }),
                ];
                let mut s = interleave(&run.budget, &mut sides).into_iter();
                let (lg, reference, floor, by_name) = (
                    s.next().unwrap(),
                    s.next().unwrap(),
                    s.next().unwrap(),
                    s.next().unwrap(),
                );
                run.push(Row {
                    case,
                    hot: true,
                    throughput: false,
                    loadgate: lg,
                    others: vec![
                        Compared {
                            design: "reference routing",
                            series: reference,
                            target: Target::Faster(2.0),
                        },
                        Compared {
                            design: "bitset floor",
                            series: floor,
                            target: Target::WithinOf(2.0),
                        },
                        Compared {
                            design: "loadgate by model name (Monitor::select)",
                            series: by_name,
                            target: Target::None,
                        },
                    ],
                });
            }
            let case = format!("select min-cost of 64, {n} workers, {label} busy");
            if run.wants(&case) {
                let cands = fx.candidates(64, 7 + k as u64);
                let (m, r) = (&fx.monitor, &fx.router);
                assert_eq!(
                    m.select_min_cost(MODEL, cands.iter().copied()).ok(),
                    r.select_min_cost(&cands).ok(),
                    "loadgate and the reference pick the same worker"
                );
                let mut sides = [
                    Side::new(|ops| {
                        for _ in 0..ops {
                            black_box(m.select_min_cost(MODEL, cands.iter().copied()).ok());
                        }
                    }),
                    Side::new(|ops| {
                        for _ in 0..ops {
                            black_box(r.select_min_cost(&cands).ok());
                        }
                    }),
                ];
                let mut s = interleave(&run.budget, &mut sides).into_iter();
                let (lg, reference) = (s.next().unwrap(), s.next().unwrap());
                run.push(Row {
                    case,
                    hot: true,
                    throughput: false,
                    loadgate: lg,
                    others: vec![Compared {
                        design: "reference KV path",
                        series: reference,
                        target: Target::Faster(10.0),
                    }],
                });
            }
        }
        let case = format!("check pinned worker, {n} workers");
        if run.wants(&case) {
            fx.set_busy_fraction(0.5, 99);
            let i = fx.a_free_worker();
            let id = fx.ids[i];
            let (m, r, f) = (&fx.monitor, &fx.router, &fx.floor);
            let mut sides = [
                Side::new(|ops| {
                    for _ in 0..ops {
                        black_box(m.check(id).is_ok());
                    }
                }),
                Side::new(|ops| {
                    for _ in 0..ops {
                        black_box(r.is_overloaded(id));
                    }
                }),
                Side::new(|ops| {
                    for _ in 0..ops {
                        black_box(f.is_busy(i));
                    }
                }),
            ];
            let mut s = interleave(&run.budget, &mut sides).into_iter();
            let (lg, reference, floor) = (s.next().unwrap(), s.next().unwrap(), s.next().unwrap());
            run.push(Row {
                case,
                hot: true,
                throughput: false,
                loadgate: lg,
                others: vec![
                    Compared {
                        design: "reference busy-set lookup",
                        series: reference,
                        target: Target::None,
                    },
                    Compared {
                        design: "bare AtomicU64 bit test",
                        series: floor,
                        target: Target::None,
                    },
                ],
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

fn monitor_cases(run: &mut Run) {
    if run.wants_any("report") || run.wants_any("book") {
        for &n in &[64usize, 1024] {
            let mut fx = MonitorFixture::new(n, 1);
            fx.set_busy_fraction(0.5, 5);
            let free: Vec<usize> = (0..n).filter(|&i| !fx.is_busy(i)).take(16).collect();
            let targets: Vec<(u64, u64)> = free.iter().map(|&i| (fx.ids[i], free_kv(i))).collect();

            let case = format!("report, no busy change, {n} workers");
            if run.wants(&case) {
                let MonitorFixture { monitor, task, .. } = &mut fx;
                let (mut a, mut b) = (0usize, 0usize);
                let mut sides = [
                    Side::new(|ops| {
                        for _ in 0..ops {
                            let (id, kv) = targets[a % targets.len()];
                            a += 1;
                            black_box(monitor.report(id, 0, &report(kv + (a & 1) as u64)).is_ok());
                        }
                    }),
                    Side::new(|ops| {
                        for _ in 0..ops {
                            let (id, kv) = targets[b % targets.len()];
                            b += 1;
                            black_box(task.on_event(id, 0, &ref_load(kv + (b & 1) as u64)).is_ok());
                        }
                    }),
                ];
                let mut s = interleave(&run.budget, &mut sides).into_iter();
                let (lg, reference) = (s.next().unwrap(), s.next().unwrap());
                run.push(Row {
                    case,
                    hot: true,
                    throughput: false,
                    loadgate: lg,
                    others: vec![Compared {
                        design: "reference monitor",
                        series: reference,
                        target: Target::Faster(4.0),
                    }],
                });
            }

            let case = format!("report, busy flip (publish), {n} workers, 50% busy");
            if run.wants(&case) {
                let (id, kv) = targets[0];
                let MonitorFixture { monitor, task, .. } = &mut fx;
                let (mut a, mut b) = (false, false);
                let mut sides = [
                    Side::new(|ops| {
                        for _ in 0..ops {
                            a = !a;
                            black_box(
                                monitor
                                    .report(id, 0, &report(if a { BUSY_KV } else { kv }))
                                    .is_ok(),
                            );
                        }
                    }),
                    Side::new(|ops| {
                        for _ in 0..ops {
                            b = !b;
                            black_box(
                                task.on_event(id, 0, &ref_load(if b { BUSY_KV } else { kv }))
                                    .is_ok(),
                            );
                        }
                    }),
                ];
                let mut s = interleave(&run.budget, &mut sides).into_iter();
                let (lg, reference) = (s.next().unwrap(), s.next().unwrap());
                drop(sides);
                fx.report_all(free[0], kv);
                run.push(Row {
                    case,
                    hot: true,
                    throughput: false,
                    loadgate: lg,
                    others: vec![Compared {
                        design: "reference monitor + snapshot rebuild",
                        series: reference,
                        target: Target::Faster(if n >= 1024 { 20.0 } else { 4.0 }),
                    }],
                });
            }

            let case = format!("book + release blocks, {n} workers");
            if run.wants(&case) {
                let (id, _) = targets[1];
                let MonitorFixture { monitor, task, .. } = &mut fx;
                let mut sides = [
                    Side::new(|ops| {
                        for _ in 0..ops {
                            black_box(monitor.book(id, 0, 4).expect("book").blocks());
                        }
                    }),
                    Side::new(|ops| {
                        for _ in 0..ops {
                            let book = |blocks| RefLoad {
                                active_decode_blocks: Some(blocks),
                                ..Default::default()
                            };
                            black_box(task.on_event(id, 0, &book(4)).is_ok());
                            black_box(task.on_event(id, 0, &book(0)).is_ok());
                        }
                    }),
                ];
                let mut s = interleave(&run.budget, &mut sides).into_iter();
                let (lg, reference) = (s.next().unwrap(), s.next().unwrap());
                run.push(Row {
                    case,
                    hot: true,
                    throughput: false,
                    loadgate: lg,
                    others: vec![Compared {
                        design: "reference monitor, 2 events",
                        series: reference,
                        target: Target::None,
                    }],
                });
            }
        }
    }

    busy_set_cases(run);

    let case = "threshold update, 4096 workers × 8 ranks".to_string();
    if run.wants(&case) {
        let mut fx = MonitorFixture::new(4096, 8);
        // Half the workers sit between the two thresholds: each update flips them.
        for i in (0..fx.n).step_by(2) {
            fx.report_all(i, 850);
        }
        let probe = fx.ids[1];
        let MonitorFixture { monitor, task, .. } = &mut fx;
        let (mut a, mut b) = (false, false);
        let mut sides = [
            Side::new(|ops| {
                for _ in 0..ops {
                    a = !a;
                    let t = if a { 0.8 } else { 0.9 };
                    let update = ThresholdUpdate {
                        active_decode_blocks_threshold: Some(t),
                        ..Default::default()
                    };
                    black_box(monitor.set_thresholds(MODEL, &update).is_ok());
                }
            }),
            Side::new(|ops| {
                for _ in 0..ops {
                    b = !b;
                    let t = if b { 0.8 } else { 0.9 };
                    task.shared().update_thresholds(&RefThresholds {
                        active_decode_blocks_threshold: Some(t),
                        ..Default::default()
                    });
                    // The reference re-evaluates on the next event.
                    black_box(task.on_event(probe, 0, &ref_load(free_kv(1))).is_ok());
                }
            }),
        ];
        let mut s = interleave(&run.budget, &mut sides).into_iter();
        let (lg, reference) = (s.next().unwrap(), s.next().unwrap());
        run.push(Row {
            case,
            hot: false,
            throughput: false,
            loadgate: lg,
            others: vec![Compared {
                design: "reference: store + next event's full re-evaluation",
                series: reference,
                target: Target::None,
            }],
        });
    }

    let case = "select round-robin while 1 writer reports, 1024 workers (allocs: reader + writer)"
        .to_string();
    if run.wants(&case) {
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
        let (mut a, mut b) = (0usize, 0usize);
        let flippers = &flippers;
        let mut sides = [
            UnderWrites {
                read: Box::new(|ops| {
                    for _ in 0..ops {
                        black_box(route.select(Policy::RoundRobin).ok());
                    }
                }),
                write: Box::new(move || {
                    let (id, kv) = flippers[a % flippers.len()];
                    let busy = (a / flippers.len()) % 2 == 0;
                    a += 1;
                    let _ = monitor.report(id, 0, &report(if busy { BUSY_KV } else { kv }));
                }),
            },
            UnderWrites {
                read: Box::new(|ops| {
                    for _ in 0..ops {
                        black_box(router.select_round_robin().ok());
                    }
                }),
                write: Box::new(move || {
                    let (id, kv) = flippers[b % flippers.len()];
                    let busy = (b / flippers.len()) % 2 == 0;
                    b += 1;
                    let _ = task.on_event(id, 0, &ref_load(if busy { BUSY_KV } else { kv }));
                }),
            },
        ];
        let mut s = under_writes(&run.budget, &mut sides).into_iter();
        let ((lg, lg_writes), (reference, ref_writes)) = (s.next().unwrap(), s.next().unwrap());
        eprintln!(
            "  writer ops during the reader's rounds: loadgate {lg_writes}, reference {ref_writes}"
        );
        run.push(Row {
            case,
            hot: true,
            throughput: false,
            loadgate: lg,
            others: vec![Compared {
                design: "reference routing under monitor writes",
                series: reference,
                target: Target::None,
            }],
        });
    }
}

/// `BusySet` on its own, against bare atomics doing the same bit work.
fn busy_set_cases(run: &mut Run) {
    let set = BusySet::new(4096);
    let bare: Vec<AtomicU64> = (0..64).map(|_| AtomicU64::new(0)).collect();
    for s in (0..4096).step_by(3) {
        set.insert(s);
        bare[s / 64].fetch_or(1 << (s % 64), Ordering::Relaxed);
    }
    let case = "busy set: contains, 4096 slots".to_string();
    if run.wants(&case) {
        let mut sides = [
            Side::new(|ops| {
                for i in 0..ops {
                    black_box(set.contains(black_box((i as usize * 61) & 4095)));
                }
            }),
            Side::new(|ops| {
                for i in 0..ops {
                    let s = black_box((i as usize * 61) & 4095);
                    black_box(bare[s / 64].load(Ordering::Acquire) >> (s % 64) & 1 == 1);
                }
            }),
        ];
        let mut s = interleave(&run.budget, &mut sides).into_iter();
        let (lg, floor) = (s.next().unwrap(), s.next().unwrap());
        run.push(Row {
            case,
            hot: true,
            throughput: false,
            loadgate: lg,
            others: vec![Compared {
                design: "bare AtomicU64 bit test",
                series: floor,
                target: Target::None,
            }],
        });
    }
    let case = "busy set: insert + remove (epoch bumped twice)".to_string();
    if run.wants(&case) {
        let mut sides = [
            Side::new(|ops| {
                for _ in 0..ops {
                    black_box(set.insert(1000));
                    black_box(set.remove(1000));
                }
            }),
            Side::new(|ops| {
                for _ in 0..ops {
                    black_box(bare[15].fetch_or(1 << 40, Ordering::AcqRel));
                    black_box(bare[15].fetch_and(!(1 << 40), Ordering::AcqRel));
                }
            }),
        ];
        let mut s = interleave(&run.budget, &mut sides).into_iter();
        let (lg, floor) = (s.next().unwrap(), s.next().unwrap());
        run.push(Row {
            case,
            hot: true,
            throughput: false,
            loadgate: lg,
            others: vec![Compared {
                design: "bare fetch_or + fetch_and",
                series: floor,
                target: Target::None,
            }],
        });
    }
    let case = "busy set: snapshot, 4096 slots".to_string();
    if run.wants(&case) {
        let mut words = vec![0u64; set.words()];
        let mut copy = vec![0u64; bare.len()];
        let mut sides = [
            Side::new(|ops| {
                for _ in 0..ops {
                    black_box(set.snapshot(&mut words));
                }
            }),
            Side::new(|ops| {
                for _ in 0..ops {
                    for (c, w) in copy.iter_mut().zip(&bare) {
                        *c = w.load(Ordering::Acquire);
                    }
                    black_box(&copy);
                }
            }),
        ];
        let mut s = interleave(&run.budget, &mut sides).into_iter();
        let (lg, floor) = (s.next().unwrap(), s.next().unwrap());
        run.push(Row {
            case,
            hot: true,
            throughput: false,
            loadgate: lg,
            others: vec![Compared {
                design: "bare copy of 64 atomic words",
                series: floor,
                target: Target::None,
            }],
        });
    }
}

// ---------------------------------------------------------------------------
// Admission cases.

fn gate(limit: u32, queue: u32) -> AdmissionGate {
    AdmissionGate::new(GateConfig::new(limit).with_queue(queue)).expect("gate config")
}

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime")
}

thread_local! {
    static CALLBACK_SLOT: Cell<Option<OwnedPermit>> = const { Cell::new(None) };
}

fn on_admitted(r: Result<OwnedPermit, AdmitError>) {
    CALLBACK_SLOT.set(Some(r.expect("queued request granted")));
}

fn admission_cases(run: &mut Run) {
    let waker = noop_waker();

    let case = "admit + release, direct".to_string();
    if run.wants(&case) {
        let g = gate(4, 16);
        let sem = Semaphore::new(4);
        let mg = MutexGate::new(4, 16);
        let rt = current_thread_runtime();
        let cg = ChannelGate::new(rt.handle(), 4, 16);
        let mut sides = [
            Side::new(|ops| {
                for _ in 0..ops {
                    drop(black_box(g.try_admit().expect("slot free")));
                }
            }),
            Side::new(|ops| {
                for _ in 0..ops {
                    drop(black_box(sem.try_acquire().expect("slot free")));
                }
            }),
            Side::new(|ops| {
                for _ in 0..ops {
                    drop(black_box(mg.try_admit().expect("slot free")));
                }
            }),
            Side::new(|ops| {
                for _ in 0..ops {
                    drop(black_box(cg.admit()));
                }
            }),
        ];
        let mut s = interleave(&run.budget, &mut sides).into_iter();
        let lg = s.next().unwrap();
        run.push(Row {
            case,
            hot: true,
            throughput: false,
            loadgate: lg,
            others: vec![
                Compared {
                    design: "tokio Semaphore try_acquire",
                    series: s.next().unwrap(),
                    target: Target::Faster(2.0),
                },
                Compared {
                    design: "Mutex gate (newest reference)",
                    series: s.next().unwrap(),
                    target: Target::Faster(2.0),
                },
                Compared {
                    design: "Semaphore + channel (first reference)",
                    series: s.next().unwrap(),
                    target: Target::None,
                },
            ],
        });
    }

    let case = "reject when full (N=1, Q=2 full)".to_string();
    if run.wants(&case) {
        let g = gate(1, 2);
        let _held = g.try_admit().expect("first slot");
        let mut q1 = g.admit();
        let mut q2 = g.admit();
        assert!(poll_once(&mut q1, &waker).is_pending() && poll_once(&mut q2, &waker).is_pending());
        let sem = Semaphore::new(1);
        let _sem_held = sem.try_acquire().expect("first slot");
        let mg = MutexGate::new(1, 2);
        let MutexAdmission::Admitted(_mg_held) = mg.admit() else {
            panic!("first slot")
        };
        let (_m1, _m2) = (mg.admit(), mg.admit());
        let rt = current_thread_runtime();
        let cg = ChannelGate::new(rt.handle(), 1, 2);
        let ChannelAdmission::Admitted(_cg_held) = cg.admit() else {
            panic!("first slot")
        };
        let _c1 = cg.admit();
        rt.block_on(tokio::task::yield_now()); // the dispatcher takes one
        let _c2 = cg.admit();
        assert!(matches!(cg.admit(), ChannelAdmission::Rejected));
        assert!(matches!(mg.admit(), MutexAdmission::Rejected));
        let mut sides = [
            Side::new(|ops| {
                for _ in 0..ops {
                    let mut f = g.admit();
                    let r = poll_once(&mut f, &waker);
                    debug_assert!(matches!(r, Poll::Ready(Err(AdmitError::AtCapacity))));
                    black_box(r.is_ready());
                }
            }),
            Side::new(|ops| {
                for _ in 0..ops {
                    black_box(sem.try_acquire().is_err());
                }
            }),
            Side::new(|ops| {
                for _ in 0..ops {
                    black_box(matches!(mg.admit(), MutexAdmission::Rejected));
                }
            }),
            Side::new(|ops| {
                for _ in 0..ops {
                    black_box(matches!(cg.admit(), ChannelAdmission::Rejected));
                }
            }),
        ];
        let mut s = interleave(&run.budget, &mut sides).into_iter();
        let lg = s.next().unwrap();
        run.push(Row {
            case,
            hot: true,
            throughput: false,
            loadgate: lg,
            others: vec![
                Compared {
                    design: "tokio Semaphore try_acquire (no queue)",
                    series: s.next().unwrap(),
                    target: Target::None,
                },
                Compared {
                    design: "Mutex gate (newest reference)",
                    series: s.next().unwrap(),
                    target: Target::None,
                },
                Compared {
                    design: "Semaphore + channel (first reference)",
                    series: s.next().unwrap(),
                    target: Target::None,
                },
            ],
        });
    }

    let case = "queued admit + handoff, future".to_string();
    if run.wants(&case) {
        let g = gate(1, 16);
        let mg = MutexGate::new(1, 16);
        let rt = current_thread_runtime();
        let cg = ChannelGate::new(rt.handle(), 1, 16);
        let mut lg_holder = Some(g.try_admit().expect("first slot"));
        let mut mg_holder = Some(mg.try_admit().expect("first slot"));
        let ChannelAdmission::Admitted(p) = cg.admit() else {
            panic!("first slot")
        };
        let mut cg_holder = Some(p);
        let mut sides = [
            Side::new(|ops| {
                for _ in 0..ops {
                    let mut f = g.admit();
                    assert!(poll_once(&mut f, &waker).is_pending());
                    drop(lg_holder.take());
                    match poll_once(&mut f, &waker) {
                        Poll::Ready(Ok(p)) => lg_holder = Some(p),
                        _ => panic!("handoff"),
                    }
                }
            }),
            Side::new(|ops| {
                for _ in 0..ops {
                    let MutexAdmission::Queued(mut w) = mg.admit() else {
                        panic!("queues")
                    };
                    assert!(poll_once(&mut w, &waker).is_pending());
                    drop(mg_holder.take());
                    match poll_once(&mut w, &waker) {
                        Poll::Ready(Some(p)) => mg_holder = Some(p),
                        _ => panic!("handoff"),
                    }
                }
            }),
            Side::new(|ops| {
                rt.block_on(async {
                    for _ in 0..ops {
                        let ChannelAdmission::Queued(rx) = cg.admit() else {
                            panic!("queues")
                        };
                        drop(cg_holder.take());
                        cg_holder = Some(rx.await.expect("handoff"));
                    }
                });
            }),
        ];
        let mut s = interleave(&run.budget, &mut sides).into_iter();
        let lg = s.next().unwrap();
        run.push(Row {
            case,
            hot: true,
            throughput: false,
            loadgate: lg,
            others: vec![
                Compared {
                    design: "Mutex gate + oneshot",
                    series: s.next().unwrap(),
                    target: Target::Faster(3.0),
                },
                Compared {
                    design: "Semaphore + channel + dispatcher task",
                    series: s.next().unwrap(),
                    target: Target::None,
                },
            ],
        });
    }

    let case = "queued admit + handoff, callback".to_string();
    if run.wants(&case) {
        let g = Arc::new(gate(1, 16));
        CALLBACK_SLOT.set(Some(g.try_admit_owned().expect("first slot")));
        let mg = MutexGate::new(1, 16);
        let mut mg_holder = Some(mg.try_admit().expect("first slot"));
        let mut sides = [
            Side::new(|ops| {
                for _ in 0..ops {
                    drop(g.admit_with_callback(Box::new(on_admitted)));
                    let holder = CALLBACK_SLOT.take().expect("holder");
                    drop(holder); // hands the slot to the callback
                    assert!(CALLBACK_SLOT.with(|s| {
                        let p = s.take();
                        let ok = p.is_some();
                        s.set(p);
                        ok
                    }));
                }
            }),
            Side::new(|ops| {
                for _ in 0..ops {
                    let MutexAdmission::Queued(mut w) = mg.admit() else {
                        panic!("queues")
                    };
                    assert!(poll_once(&mut w, &waker).is_pending());
                    drop(mg_holder.take());
                    match poll_once(&mut w, &waker) {
                        Poll::Ready(Some(p)) => mg_holder = Some(p),
                        _ => panic!("handoff"),
                    }
                }
            }),
        ];
        let mut s = interleave(&run.budget, &mut sides).into_iter();
        let lg = s.next().unwrap();
        drop(CALLBACK_SLOT.take());
        run.push(Row {
            case,
            hot: true,
            throughput: false,
            loadgate: lg,
            others: vec![Compared {
                design: "Mutex gate + oneshot",
                series: s.next().unwrap(),
                target: Target::Faster(3.0),
            }],
        });
    }

    let case = "queued admit + handoff, blocking, 2 threads".to_string();
    if run.wants(&case) {
        let g = gate(1, 1);
        let mg = MutexGate::new(1, 1);
        let mut lg = Series::default();
        let mut mgs = Series::default();
        for round in 0..run.budget.rounds {
            for k in 0..2 {
                if (round + k) % 2 == 0 {
                    lg.merge(&pingpong(
                        run.budget.per_round,
                        &|| g.try_admit().ok(),
                        &|| g.admit_blocking(None).expect("admitted"),
                        &|| g.queued() > 0,
                    ));
                } else {
                    mgs.merge(&pingpong(
                        run.budget.per_round,
                        &|| mg.try_admit(),
                        &|| match mg.admit() {
                            MutexAdmission::Admitted(p) => p,
                            MutexAdmission::Queued(w) => w.wait().expect("handoff"),
                            MutexAdmission::Rejected => panic!("queue of 1 was full"),
                        },
                        &|| mg.queued() > 0,
                    ));
                }
            }
        }
        run.push(Row {
            case,
            hot: true,
            throughput: false,
            loadgate: lg,
            others: vec![Compared {
                design: "Mutex gate + oneshot blocking_recv",
                series: mgs,
                target: Target::Faster(3.0),
            }],
        });
    }

    let case = "admit + release, 2 threads contending".to_string();
    if run.wants(&case) {
        let g = gate(1024, 16);
        let sem = Semaphore::new(1024);
        let mg = MutexGate::new(1024, 16);
        let lg_op = |ops: u64| {
            for _ in 0..ops {
                drop(black_box(g.try_admit().expect("slot free")));
            }
        };
        let sem_op = |ops: u64| {
            for _ in 0..ops {
                drop(black_box(sem.try_acquire().expect("slot free")));
            }
        };
        let mg_op = |ops: u64| {
            for _ in 0..ops {
                drop(black_box(mg.try_admit().expect("slot free")));
            }
        };
        let sides = [
            SharedSide::new(&lg_op),
            SharedSide::new(&sem_op),
            SharedSide::new(&mg_op),
        ];
        let mut s = contend(&run.budget, 2, &sides).into_iter();
        let lg = s.next().unwrap();
        run.push(Row {
            case,
            hot: true,
            throughput: true,
            loadgate: lg,
            others: vec![
                Compared {
                    design: "tokio Semaphore try_acquire",
                    series: s.next().unwrap(),
                    target: Target::Throughput(2.0),
                },
                Compared {
                    design: "Mutex gate (newest reference)",
                    series: s.next().unwrap(),
                    target: Target::None,
                },
            ],
        });
    }
}

/// Two threads hand one slot back and forth through the queue for
/// `duration`: the holder waits until the other thread is queued, stamps the
/// time and releases; the waiter records the time from that stamp to its
/// admission. Returns the handoff latencies and both threads' allocations.
fn pingpong<P>(
    duration: Duration,
    try_admit: &(dyn Fn() -> Option<P> + Sync),
    admit_blocking: &(dyn Fn() -> P + Sync),
    queued: &(dyn Fn() -> bool + Sync),
) -> Series {
    let base = Instant::now();
    let deadline = base + duration;
    let released = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let start = Barrier::new(2);
    let stamp = || base.elapsed().as_nanos() as u64;
    let body = |first: bool| {
        let mut s = Series::default();
        let mut held = None;
        if first {
            held = Some(try_admit().expect("a free slot"));
        }
        start.wait();
        let before = thread_allocations();
        loop {
            if held.is_none() {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let p = admit_blocking();
                let waited = stamp().saturating_sub(released.load(Ordering::Acquire));
                record_one(&mut s, Duration::from_nanos(waited));
                held = Some(p);
            }
            if Instant::now() >= deadline {
                stop.store(true, Ordering::Release);
            }
            let mut spins = 0u32;
            while !queued() && !stop.load(Ordering::Acquire) {
                spins += 1;
                if spins % 64 == 0 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            released.store(stamp(), Ordering::Release);
            drop(held.take());
            if stop.load(Ordering::Acquire) {
                break;
            }
        }
        s.allocs = thread_allocations() - before;
        s
    };
    let (a, b) = std::thread::scope(|sc| {
        let a = sc.spawn(|| body(true));
        let b = sc.spawn(|| body(false));
        (a.join().expect("thread"), b.join().expect("thread"))
    });
    let mut all = a;
    all.merge(&b);
    all
}

// ---------------------------------------------------------------------------
// Output.

fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into());
    format!("{model}, {cpus} CPUs, load average {load} at start")
}

fn print_table(rows: &[Row]) -> (usize, usize, Vec<String>) {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| case | design | p50 | p99 | allocs/op | loadgate vs design | target | met |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---|:---:|");
    let (mut met, mut total) = (0, 0);
    let mut alloc_failures = Vec::new();
    for row in rows {
        let (p50, p99) = latency_cells(&row.loadgate, row.throughput);
        let _ = writeln!(
            out,
            "| {} | **loadgate** | **{p50}** | **{p99}** | {} | | | |",
            row.case,
            allocs(&row.loadgate)
        );
        if row.hot && row.loadgate.allocs > 0 {
            alloc_failures.push(format!(
                "{}: {} allocations in {} ops",
                row.case, row.loadgate.allocs, row.loadgate.ops
            ));
        }
        for o in &row.others {
            let (p50, p99) = latency_cells(&o.series, row.throughput);
            let (ratio, ok) = o.ratio(&row.loadgate, row.throughput);
            let mark = match ok {
                Some(true) => {
                    met += 1;
                    total += 1;
                    "yes"
                }
                Some(false) => {
                    total += 1;
                    "**no**"
                }
                None => "",
            };
            let _ = writeln!(
                out,
                "| | {} | {p50} | {p99} | {} | {ratio} | {} | {mark} |",
                o.design,
                allocs(&o.series),
                o.target_text()
            );
        }
    }
    print!("{out}");
    (met, total, alloc_failures)
}

fn main() {
    let opts = parse_args();
    let mut budget = if opts.quick {
        Budget {
            rounds: 3,
            per_round: Duration::from_millis(4),
        }
    } else {
        Budget {
            rounds: 10,
            per_round: Duration::from_millis(40),
        }
    };
    budget.rounds = opts.rounds.unwrap_or(budget.rounds).max(1);
    if let Some(ms) = opts.round_ms {
        budget.per_round = Duration::from_millis(ms);
    }
    let started = Instant::now();
    let header = machine();
    let clock_read = clock_read_nanos();
    eprintln!(
        "compare: {} mode, {} rounds × {:?} per design per case",
        if opts.quick { "quick" } else { "full" },
        budget.rounds,
        budget.per_round
    );
    let mut run = Run {
        budget,
        filter: opts.filter,
        rows: Vec::new(),
    };
    routing_cases(&mut run);
    monitor_cases(&mut run);
    admission_cases(&mut run);

    println!(
        "loadgate compare ({} mode) on {header}; os {}; one clock read (Instant::now) {clock_read:.1} ns",
        if opts.quick { "quick" } else { "full" },
        std::env::consts::OS
    );
    println!(
        "p50/p99: per-op latency (batch means for sub-10 µs ops); ratios are p50 over p50, \
         or throughput over throughput for the contended case.\n"
    );
    let (met, total, alloc_failures) = print_table(&run.rows);
    println!(
        "\ntargets met: {met} of {total}; {} cases in {:.1} s",
        run.rows.len(),
        started.elapsed().as_secs_f64()
    );
    if alloc_failures.is_empty() {
        println!("loadgate hot paths allocated nothing while measured");
    } else {
        println!("loadgate hot paths ALLOCATED:");
        for f in &alloc_failures {
            println!("  {f}");
        }
        std::process::exit(1);
    }
}
