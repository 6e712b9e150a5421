//! `compare`: runs each loadgate hot path and the reference designs it
//! replaces, interleaved in one process, and prints one table: per-op p50
//! and p99 from hdrhistogram, allocations per op, the ratio, and the target
//! from the benchmarks issue with whether this run met it.
//!
//! Exits non-zero if a loadgate hot path allocated while it was measured
//! (counting global allocator). Timings never fail the run.
//!
//! Each case is one call of `Run::measure`: its name, its designs (the case
//! table below: names and targets), and a closure that sets the case up and
//! returns the measured series. `--write FILE` puts the table into the block
//! between the `compare` markers of a Markdown file and keeps the rest.
//!
//! ```text
//! cargo run --release -p loadgate-benches --bin compare            # full run
//! cargo run --release -p loadgate-benches --bin compare -- --quick # CI
//! cargo run --release -p loadgate-benches --bin compare -- --filter select
//! cargo run --release -p loadgate-benches --bin compare -- --write docs/performance.md
//! ```

use std::cell::Cell;
use std::fmt::Write as _;
use std::future::{poll_fn, Future};
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use loadgate::{
    AdmissionGate, Admit, AdmitError, BusySet, GateConfig, LoadReport, MonotonicClock, OwnedPermit,
    Permit, Policy, SharedClock, ThresholdUpdate,
};
use loadgate_benches::baseline::admission::{
    ChannelAdmission, ChannelGate, ClassAdmission, ClassMutexGate, ClassWait, MutexAdmission,
    MutexGate, MutexPermit, WaitMutexGate, CLASSES,
};
use loadgate_benches::baseline::monitor::{RefLoad, RefThresholds};
use loadgate_benches::fixture::{
    block_on, free_kv, noop_waker, poll_once, MonitorFixture, BUSY_KV, MODEL,
};
use loadgate_benches::floor::GateFloor;
use loadgate_benches::harness::{
    contend, contend_per_op, interleave, record_one, under_writes, Budget, Series, SharedSide,
    Side, UnderWrites,
};
use loadgate_testkit::alloc::{thread_allocations, CountingAlloc};
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
    /// loadgate's p50 at least this many times lower than the design's, or
    /// close enough to the case's floor (its [`Target::Floor`] design).
    FasterOrFloor(f64),
    /// The case's floor: loadgate's p50 at most this many times the
    /// floor's meets every `FasterOrFloor` target of the case. Judged
    /// through those rows, not on its own.
    Floor(f64),
    /// loadgate's throughput at least this many times the design's.
    Throughput(f64),
}

struct Compared {
    design: &'static str,
    series: Series,
    target: Target,
}

struct Row {
    case: Case,
    loadgate: Series,
    others: Vec<Compared>,
}

/// loadgate's p50 over the floor's.
fn floor_ratio(lg: &Series, floor: &Series) -> f64 {
    lg.p50() / floor.p50().max(1e-3)
}

impl Compared {
    /// The ratio shown, and whether the target was met. `floor` is the
    /// case's [`Target::Floor`] design and its bound, if it has one.
    fn ratio(
        &self,
        lg: &Series,
        throughput: bool,
        floor: Option<(&Series, f64)>,
    ) -> (String, Option<bool>) {
        let faster = self.series.p50() / lg.p50().max(1e-3);
        match self.target {
            Target::WithinOf(x) => {
                let r = floor_ratio(lg, &self.series);
                (format!("{r:.2}× floor"), Some(r <= x))
            }
            Target::Floor(_) => {
                let r = floor_ratio(lg, &self.series);
                (format!("{r:.2}× floor"), None)
            }
            Target::FasterOrFloor(x) => match floor {
                Some((f, bound)) => {
                    let r = floor_ratio(lg, f);
                    (
                        format!("{faster:.2}× faster, {r:.2}× floor"),
                        Some(faster >= x || r <= bound),
                    )
                }
                None => (format!("{faster:.2}× faster"), Some(faster >= x)),
            },
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

    fn target_text(&self, floor: Option<(&Series, f64)>) -> String {
        match self.target {
            Target::None => "—".into(),
            Target::Faster(x) => format!("≥ {x}× faster"),
            Target::FasterOrFloor(x) => match floor {
                Some((_, bound)) => format!("≥ {x}× faster or ≤ {bound}× floor"),
                None => format!("≥ {x}× faster"),
            },
            Target::WithinOf(x) => format!("≤ {x}× floor"),
            Target::Floor(x) => format!("≤ {x}× floor meets the rows above"),
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
        let rate = s.throughput();
        let rate = if rate >= 1e6 {
            format!("{:.1} M/s", rate / 1e6)
        } else {
            format!("{:.0} k/s", rate / 1e3)
        };
        let p99 = if s.per_op {
            format!("{} (p99.9 {})", ns(s.p99()), ns(s.p999()))
        } else {
            ns(s.p99())
        };
        (format!("{} ({rate}{on_cpu})", ns(s.p50())), p99)
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
    /// A Markdown file whose generated block (between [`BEGIN`] and
    /// [`END`]) gets the run's table.
    write: Option<String>,
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
        write: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => opts.quick = true,
            "--filter" => opts.filter = args.next(),
            "--rounds" => opts.rounds = args.next().and_then(|v| v.parse().ok()),
            "--round-ms" => opts.round_ms = args.next().and_then(|v| v.parse().ok()),
            "--write" => opts.write = args.next(),
            "-h" | "--help" => {
                println!(
                    "usage: compare [--quick] [--filter SUBSTRING] [--rounds N] [--round-ms MS]\n\
                     \x20              [--write FILE.md]\n\
                     Runs loadgate's hot paths and the reference designs interleaved and\n\
                     prints p50/p99 per op, allocations per op and ratios. --quick is the\n\
                     short CI mode. --write replaces the block between the compare markers\n\
                     of a Markdown file (docs/performance.md) with this run's table.\n\
                     Exits 1 if a loadgate hot path allocated (and then writes nothing)."
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

    /// Measures one case unless the filter leaves it out. `measure` sets the
    /// case up and returns loadgate's series followed by one per design, in
    /// the order of `case.designs`.
    fn measure(&mut self, case: Case, measure: impl FnOnce(&Budget) -> Vec<Series>) {
        if !self.wants(&case.name) {
            return;
        }
        let mut series = measure(&self.budget).into_iter();
        let loadgate = series.next().expect("loadgate's series");
        let others: Vec<Compared> = case
            .designs
            .iter()
            .map(|&(design, target)| Compared {
                design,
                target,
                series: series.next().expect("one series per design"),
            })
            .collect();
        assert!(series.next().is_none(), "{}: a series too many", case.name);
        eprintln!("  measured {}", case.name);
        self.rows.push(Row {
            case,
            loadgate,
            others,
        });
    }
}

// ---------------------------------------------------------------------------
// The case table: the designs each case compares loadgate with, in the order
// its measurement returns them (after loadgate's own series), with the
// targets of the benchmarks issue. Names stay fixed so that runs compare.

/// A design loadgate is compared with, and the target for the comparison.
type Design = (&'static str, Target);

const SELECT: &[Design] = &[
    ("reference routing", Target::Faster(2.0)),
    ("bitset floor", Target::WithinOf(2.0)),
    ("loadgate by model name (Monitor::select)", Target::None),
];
const MIN_COST: &[Design] = &[("reference KV path", Target::Faster(10.0))];
const CHECK: &[Design] = &[
    ("reference busy-set lookup", Target::None),
    ("bare AtomicU64 bit test", Target::None),
];
const REPORT: &[Design] = &[("reference monitor", Target::Faster(4.0))];
/// The busy flip's target grows with the snapshot the reference rebuilds.
const FLIP: [&[Design]; 2] = [
    &[("reference monitor + snapshot rebuild", Target::Faster(4.0))],
    &[("reference monitor + snapshot rebuild", Target::Faster(20.0))],
];
const BOOK: &[Design] = &[("reference monitor, 2 events", Target::None)];
const BUSY_CONTAINS: &[Design] = &[("bare AtomicU64 bit test", Target::None)];
const BUSY_INSERT_REMOVE: &[Design] = &[("bare fetch_or + fetch_and", Target::None)];
const BUSY_SNAPSHOT: &[Design] = &[("bare copy of 64 atomic words", Target::None)];
const THRESHOLD: &[Design] = &[(
    "reference: store + next event's full re-evaluation",
    Target::None,
)];
const UNDER_WRITES: &[Design] = &[("reference routing under monitor writes", Target::None)];
const CLOCK: &[Design] = &[("std Instant::now", Target::None)];
/// 2× faster than both references, or within 1.15× of the floor.
const DIRECT: &[Design] = &[
    ("tokio Semaphore try_acquire", Target::FasterOrFloor(2.0)),
    ("Mutex gate (newest reference)", Target::FasterOrFloor(2.0)),
    ("Semaphore + channel (first reference)", Target::None),
    ("floor: CAS + fetch_sub on one atomic", Target::Floor(1.15)),
];
const REJECT: &[Design] = &[
    ("tokio Semaphore try_acquire (no queue)", Target::None),
    ("Mutex gate (newest reference)", Target::Faster(1.0)),
    ("Semaphore + channel (first reference)", Target::None),
];
const HANDOFF_FUTURE: &[Design] = &[
    ("Mutex gate + oneshot", Target::Faster(0.67)),
    ("Semaphore + channel + dispatcher task", Target::None),
];
const HANDOFF_CALLBACK: &[Design] = &[("Mutex gate + oneshot", Target::Faster(0.67))];
const HANDOFF_BLOCKING: &[Design] = &[("Mutex gate + oneshot blocking_recv", Target::Faster(3.0))];
const HANDOFF_THROUGHPUT: &[Design] = &[
    (
        "Mutex gate + oneshot blocking_recv",
        Target::Throughput(2.0),
    ),
    ("tokio Semaphore acquire, thread parked", Target::None),
];
const CLASS_HANDOFF: &[Design] = &[("Mutex + four VecDeques", Target::Faster(0.67))];
const WAIT_DIRECT: &[Design] = &[(
    "Mutex gate with wait limit (newest reference)",
    Target::Faster(0.9),
)];
const WAIT_CONTENDED: &[Design] = &[(
    "Mutex gate with wait limit (newest reference)",
    Target::None,
)];
/// No target: reported as it comes out (where the lock-free design should
/// win; p99 and p99.9 per operation beside the throughput).
const OVERSUBSCRIBED: &[Design] = &[
    ("tokio Semaphore try_acquire", Target::None),
    ("Mutex gate (newest reference)", Target::None),
];
const CONTENDED: &[Design] = &[
    ("tokio Semaphore try_acquire", Target::Throughput(2.0)),
    ("Mutex gate (newest reference)", Target::Throughput(1.5)),
];

/// One row of the table: the case's name, its designs, and how loadgate's
/// side is judged.
struct Case {
    name: String,
    designs: &'static [Design],
    /// Whether loadgate's side is a hot path that must not allocate.
    hot: bool,
    /// Whether the case compares throughput (several threads).
    throughput: bool,
}

impl Case {
    /// A hot path, timed per operation.
    fn hot(name: impl Into<String>, designs: &'static [Design]) -> Self {
        Case {
            name: name.into(),
            designs,
            hot: true,
            throughput: false,
        }
    }

    /// Not a hot path: allocations are shown, never fail the run.
    fn cold(name: impl Into<String>, designs: &'static [Design]) -> Self {
        Case {
            hot: false,
            ..Case::hot(name, designs)
        }
    }

    /// Compared by throughput over several threads.
    fn contended(name: impl Into<String>, designs: &'static [Design]) -> Self {
        Case {
            throughput: true,
            ..Case::hot(name, designs)
        }
    }
}

/// A design measured on this thread whose every operation is one call of
/// `op`, its result kept from the optimizer (`black_box`) and then dropped.
fn each<'a, R>(mut op: impl FnMut() -> R + 'a) -> Side<'a> {
    Side::new(move |ops| {
        for _ in 0..ops {
            black_box(op());
        }
    })
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
fn busy_set_cases(run: &mut Run) {
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

// ---------------------------------------------------------------------------
// Admission cases.

fn gate(limit: u32, queue: u32) -> AdmissionGate {
    AdmissionGate::new(GateConfig::new(limit).with_queue(queue)).expect("gate config")
}

/// A direct admission on a gate with a wait limit and its first response.
#[inline]
fn admit_and_respond(g: &AdmissionGate) -> Permit<'_> {
    let p = g.try_admit().expect("slot free");
    p.first_response();
    p
}

/// A gate with a wait limit.
fn wait_gate(limit: u32, wait: u32) -> AdmissionGate {
    AdmissionGate::new(
        GateConfig::new(limit)
            .with_queue(16)
            .with_wait_limit(Some(wait)),
    )
    .expect("gate config")
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

/// The gate's clock (read through `dyn Clock`, as the gate reads it)
/// against `Instant::now`.
fn clock_cases(run: &mut Run) {
    run.measure(Case::hot("clock read", CLOCK), |budget| {
        let clock: SharedClock = black_box(MonotonicClock::shared());
        let mut sides = [each(|| clock.now_nanos()), each(Instant::now)];
        interleave(budget, &mut sides)
    });
}

fn admission_cases(run: &mut Run) {
    let waker = noop_waker();

    run.measure(Case::hot("admit + release, direct", DIRECT), |budget| {
        let g = gate(4, 16);
        let sem = Semaphore::new(4);
        let mg = MutexGate::new(4, 16);
        let rt = current_thread_runtime();
        let cg = ChannelGate::new(rt.handle(), 4, 16);
        let floor = GateFloor::new(4);
        let mut sides = [
            each(|| g.try_admit().expect("slot free")),
            each(|| sem.try_acquire().expect("slot free")),
            each(|| mg.try_admit().expect("slot free")),
            each(|| cg.admit()),
            each(|| floor.try_admit().expect("slot free")),
        ];
        interleave(budget, &mut sides)
    });

    run.measure(
        Case::hot("reject when full (N=1, Q=2 full)", REJECT),
        |budget| {
            let g = gate(1, 2);
            let _held = g.try_admit().expect("first slot");
            let mut q1 = g.admit();
            let mut q2 = g.admit();
            assert!(
                poll_once(&mut q1, &waker).is_pending() && poll_once(&mut q2, &waker).is_pending()
            );
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
                each(|| {
                    let mut f = g.admit();
                    let r = poll_once(&mut f, &waker);
                    debug_assert!(matches!(r, Poll::Ready(Err(AdmitError::AtCapacity))));
                    r.is_ready()
                }),
                each(|| sem.try_acquire().is_err()),
                each(|| matches!(mg.admit(), MutexAdmission::Rejected)),
                each(|| matches!(cg.admit(), ChannelAdmission::Rejected)),
            ];
            interleave(budget, &mut sides)
        },
    );

    let name = "queued admit + handoff, future";
    run.measure(Case::hot(name, HANDOFF_FUTURE), |budget| {
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
            each(|| {
                let mut f = g.admit();
                assert!(poll_once(&mut f, &waker).is_pending());
                drop(lg_holder.take());
                match poll_once(&mut f, &waker) {
                    Poll::Ready(Ok(p)) => lg_holder = Some(p),
                    _ => panic!("handoff"),
                }
            }),
            each(|| mutex_handoff(&mg, &mut mg_holder, &waker)),
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
        interleave(budget, &mut sides)
    });

    let name = "queued admit + handoff, callback";
    run.measure(Case::hot(name, HANDOFF_CALLBACK), |budget| {
        let g = Arc::new(gate(1, 16));
        CALLBACK_SLOT.set(Some(g.try_admit_owned().expect("first slot")));
        let mg = MutexGate::new(1, 16);
        let mut mg_holder = Some(mg.try_admit().expect("first slot"));
        let series = interleave(
            budget,
            &mut [
                each(|| {
                    drop(g.admit_with_callback(Box::new(on_admitted)));
                    let holder = CALLBACK_SLOT.take().expect("holder");
                    drop(holder); // hands the slot to the callback
                    assert!(CALLBACK_SLOT.with(|s| {
                        let p = s.take();
                        let ok = p.is_some();
                        s.set(p);
                        ok
                    }));
                }),
                each(|| mutex_handoff(&mg, &mut mg_holder, &waker)),
            ],
        );
        drop(CALLBACK_SLOT.take());
        series
    });

    let name = "queued admit + handoff, blocking, 2 threads";
    run.measure(Case::hot(name, HANDOFF_BLOCKING), |budget| {
        let g = gate(1, 1);
        let mg = MutexGate::new(1, 1);
        let mut lg = Series::default();
        let mut mgs = Series::default();
        for round in 0..budget.rounds {
            for k in 0..2 {
                if (round + k) % 2 == 0 {
                    lg.merge(&lg_pingpong(&g, budget.per_round).0);
                } else {
                    mgs.merge(&mutex_pingpong(&mg, budget.per_round).0);
                }
            }
        }
        vec![lg, mgs]
    });

    let name = "handoff throughput, 2 threads (one holds, one waits)";
    run.measure(Case::contended(name, HANDOFF_THROUGHPUT), |budget| {
        let g = gate(1, 1);
        let mg = MutexGate::new(1, 1);
        let sem = Semaphore::new(1);
        // tokio's Semaphore does not count its waiters: each waiter counts
        // itself once its acquire is queued (first poll pending).
        let sem_waiting = AtomicU64::new(0);
        let mut out = vec![Series::default(), Series::default(), Series::default()];
        for round in 0..budget.rounds {
            for k in 0..out.len() {
                let i = (round + k) % out.len();
                let (series, wall) = match i {
                    0 => lg_pingpong(&g, budget.per_round),
                    1 => mutex_pingpong(&mg, budget.per_round),
                    _ => pingpong(
                        budget.per_round,
                        &|| sem.try_acquire().ok(),
                        &|| {
                            let mut acquire = pin!(sem.acquire());
                            let mut counted = false;
                            let permit = block_on(poll_fn(|cx| {
                                let r = acquire.as_mut().poll(cx);
                                if r.is_pending() && !counted {
                                    counted = true;
                                    sem_waiting.fetch_add(1, Ordering::AcqRel);
                                }
                                r
                            }))
                            .expect("semaphore open");
                            if counted {
                                sem_waiting.fetch_sub(1, Ordering::AcqRel);
                            }
                            permit
                        },
                        &|| sem_waiting.load(Ordering::Acquire) > 0,
                    ),
                };
                out[i].merge(&series);
                out[i].elapsed += wall;
            }
        }
        out
    });

    let name = "4-class handoff";
    run.measure(Case::hot(name, CLASS_HANDOFF), |budget| {
        // Each op is one handoff. Every fourth op first queues one waiter
        // per class, least important first; the four releases that follow
        // must hand the slot to classes 0, 1, 2, 3 in that order.
        let g = AdmissionGate::new(GateConfig::new(1).with_queue(16).with_classes(CLASSES))
            .expect("gate config");
        let cg = ClassMutexGate::new(1, 16);
        let mut lg_holder = Some(g.try_admit().expect("first slot"));
        let mut lg_waiters: [Option<Admit<'_>>; CLASSES] = Default::default();
        let mut lg_ops = 0usize;
        let ClassAdmission::Admitted(p) = cg.admit(0) else {
            panic!("first slot")
        };
        let mut cg_holder = Some(p);
        let mut cg_waiters: [Option<ClassWait<'_>>; CLASSES] = Default::default();
        let mut cg_ops = 0usize;
        let mut sides = [
            each(|| {
                let served = lg_ops % CLASSES;
                lg_ops += 1;
                if served == 0 {
                    for (c, w) in lg_waiters.iter_mut().enumerate().rev() {
                        let mut f = g.admit_at(c as u8);
                        assert!(poll_once(&mut f, &waker).is_pending());
                        *w = Some(f);
                    }
                }
                drop(lg_holder.take());
                let mut f = lg_waiters[served].take().expect("queued");
                match poll_once(&mut f, &waker) {
                    Poll::Ready(Ok(p)) => lg_holder = Some(p),
                    _ => panic!("the most important waiter gets the slot"),
                }
            }),
            each(|| {
                let served = cg_ops % CLASSES;
                cg_ops += 1;
                if served == 0 {
                    for (c, w) in cg_waiters.iter_mut().enumerate().rev() {
                        let ClassAdmission::Queued(mut f) = cg.admit(c) else {
                            panic!("queues")
                        };
                        assert!(poll_once(&mut f, &waker).is_pending());
                        *w = Some(f);
                    }
                }
                drop(cg_holder.take());
                let mut f = cg_waiters[served].take().expect("queued");
                match poll_once(&mut f, &waker) {
                    Poll::Ready(Some(p)) => cg_holder = Some(p),
                    _ => panic!("the most important waiter gets the slot"),
                }
            }),
        ];
        interleave(budget, &mut sides)
    });

    let name = "admit + first response + release, wait limit (W=4 of N=8)";
    run.measure(Case::hot(name, WAIT_DIRECT), |budget| {
        let g = wait_gate(8, 4);
        let mg = WaitMutexGate::new(8, 4, 16);
        let mut sides = [
            each(|| admit_and_respond(&g)),
            each(|| {
                let mut p = mg.try_admit().expect("slot free");
                p.first_response();
                p
            }),
        ];
        interleave(budget, &mut sides)
    });

    let name = "admit + first response + release, wait limit, 2 threads contending";
    run.measure(Case::contended(name, WAIT_CONTENDED), |budget| {
        let g = wait_gate(1024, 512);
        let mg = WaitMutexGate::new(1024, 512, 16);
        let lg_op = |ops: u64| {
            for _ in 0..ops {
                drop(black_box(admit_and_respond(&g)));
            }
        };
        let mg_op = |ops: u64| {
            for _ in 0..ops {
                let mut p = black_box(mg.try_admit().expect("slot free"));
                p.first_response();
                drop(p);
            }
        };
        let sides = [SharedSide::new(&lg_op), SharedSide::new(&mg_op)];
        contend(budget, 2, &sides)
    });

    let name = "admit + release, 2 threads contending";
    run.measure(Case::contended(name, CONTENDED), |budget| {
        contended_admit_release(budget, 2, false)
    });

    // More threads than cores: a thread is preempted now and then in the
    // middle of an operation. A preempted Mutex holder stalls every thread
    // that wants the lock until it runs again; a lock-free gate's threads
    // go on. Every operation timed on its own, for the tails.
    let name = "admit + release, 8 threads on 2 cores";
    run.measure(Case::contended(name, OVERSUBSCRIBED), |budget| {
        contended_admit_release(budget, 8, true)
    });
}

/// Direct admit + release by `threads` threads at once, on loadgate's gate,
/// tokio's `Semaphore` and the Mutex gate (each operation timed alone if
/// `per_op`).
fn contended_admit_release(budget: &Budget, threads: usize, per_op: bool) -> Vec<Series> {
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
    if per_op {
        contend_per_op(budget, threads, &sides)
    } else {
        contend(budget, threads, &sides)
    }
}

/// One queued admission on the Mutex gate and its handoff: queue behind the
/// holder, release the holder, take the slot.
#[inline]
fn mutex_handoff<'g>(mg: &'g MutexGate, holder: &mut Option<MutexPermit<'g>>, waker: &Waker) {
    let MutexAdmission::Queued(mut w) = mg.admit() else {
        panic!("queues")
    };
    assert!(poll_once(&mut w, waker).is_pending());
    drop(holder.take());
    match poll_once(&mut w, waker) {
        Poll::Ready(Some(p)) => *holder = Some(p),
        _ => panic!("handoff"),
    }
}

/// [`pingpong`] on a loadgate gate of one slot, waiting blocked.
fn lg_pingpong(g: &AdmissionGate, duration: Duration) -> (Series, Duration) {
    pingpong(
        duration,
        &|| g.try_admit().ok(),
        &|| g.admit_blocking(None).expect("admitted"),
        &|| g.queued() > 0,
    )
}

/// [`pingpong`] on the Mutex gate of one slot, waiting in `blocking_recv`.
fn mutex_pingpong(mg: &MutexGate, duration: Duration) -> (Series, Duration) {
    pingpong(
        duration,
        &|| mg.try_admit(),
        &|| match mg.admit() {
            MutexAdmission::Admitted(p) => p,
            MutexAdmission::Queued(w) => w.wait().expect("handoff"),
            MutexAdmission::Rejected => panic!("queue of 1 was full"),
        },
        &|| mg.queued() > 0,
    )
}

/// Two threads hand one slot back and forth through the queue for
/// `duration`: the holder waits until the other thread is queued, stamps the
/// time and releases; the waiter records the time from that stamp to its
/// admission. Returns the handoff latencies and both threads' allocations
/// from each thread's first blocking admission on (a thread's first
/// blocking wait on loadgate makes the thread's waker, once for the
/// thread's life, as tokio's `block_on` makes its parker), and the wall time from the threads' start to their end (the handoffs'
/// throughput is the operation count over it).
fn pingpong<P>(
    duration: Duration,
    try_admit: &(dyn Fn() -> Option<P> + Sync),
    admit_blocking: &(dyn Fn() -> P + Sync),
    queued: &(dyn Fn() -> bool + Sync),
) -> (Series, Duration) {
    let base = Instant::now();
    let deadline = base + duration;
    let released = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let start = Barrier::new(3);
    let stamp = || base.elapsed().as_nanos() as u64;
    let body = |first: bool| {
        let mut s = Series::default();
        let mut held = None;
        if first {
            held = Some(try_admit().expect("a free slot"));
        }
        start.wait();
        let mut before = None;
        loop {
            if held.is_none() {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let p = admit_blocking();
                before.get_or_insert_with(thread_allocations);
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
        let now = thread_allocations();
        s.allocs = now - before.unwrap_or(now);
        s
    };
    let (a, b, wall) = std::thread::scope(|sc| {
        let a = sc.spawn(|| body(true));
        let b = sc.spawn(|| body(false));
        start.wait();
        let started = Instant::now();
        let (a, b) = (a.join().expect("thread"), b.join().expect("thread"));
        (a, b, started.elapsed())
    });
    let mut all = a;
    all.merge(&b);
    (all, wall)
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

/// The Markdown table, with the targets met, the targets set and the hot
/// paths that allocated.
fn table(rows: &[Row]) -> (String, usize, usize, Vec<String>) {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| case | design | p50 | p99 | allocs/op | loadgate vs design | target | met |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---|:---:|");
    let (mut met, mut total) = (0, 0);
    let mut alloc_failures = Vec::new();
    for row in rows {
        let throughput = row.case.throughput;
        let (p50, p99) = latency_cells(&row.loadgate, throughput);
        let _ = writeln!(
            out,
            "| {} | **loadgate** | **{p50}** | **{p99}** | {} | | | |",
            row.case.name,
            allocs(&row.loadgate)
        );
        if row.case.hot && row.loadgate.allocs > 0 {
            alloc_failures.push(format!(
                "{}: {} allocations in {} ops",
                row.case.name, row.loadgate.allocs, row.loadgate.ops
            ));
        }
        let floor = row.others.iter().find_map(|o| match o.target {
            Target::Floor(bound) => Some((&o.series, bound)),
            _ => None,
        });
        for o in &row.others {
            let (p50, p99) = latency_cells(&o.series, throughput);
            let (ratio, ok) = o.ratio(&row.loadgate, throughput, floor);
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
                o.target_text(floor)
            );
        }
    }
    (out, met, total, alloc_failures)
}

/// The markers around the generated block of a Markdown file; everything
/// outside them is kept as written.
const BEGIN: &str = "<!-- compare: begin -->";
const END: &str = "<!-- compare: end -->";

/// The file at `path` and where its generated block's contents start and
/// end.
fn read_block(path: &str) -> Result<(String, usize, usize), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))?;
    match (text.find(BEGIN), text.find(END)) {
        (Some(begin), Some(end)) if begin < end => Ok((text, begin + BEGIN.len(), end)),
        _ => Err(format!(
            "{path} has no `{BEGIN}` ... `{END}` block for the table"
        )),
    }
}

/// Replaces the generated block of `path` with `block`.
fn write_block(path: &str, block: &str) -> Result<(), String> {
    let (text, start, end) = read_block(path)?;
    let updated = format!("{}\n{block}{}", &text[..start], &text[end..]);
    std::fs::write(path, updated).map_err(|e| format!("writing {path}: {e}"))
}

fn main() {
    let opts = parse_args();
    if opts.write.is_some() && opts.filter.is_some() {
        eprintln!("compare: --write records the whole table; leave out --filter");
        std::process::exit(2);
    }
    // Fail before measuring, not after.
    if let Some(Err(e)) = opts.write.as_deref().map(read_block) {
        eprintln!("compare: {e}");
        std::process::exit(2);
    }
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
    let mode = if opts.quick { "quick" } else { "full" };
    eprintln!(
        "compare: {mode} mode, {} rounds × {:?} per design per case",
        budget.rounds, budget.per_round
    );
    let mut run = Run {
        budget,
        filter: opts.filter,
        rows: Vec::new(),
    };
    routing_cases(&mut run);
    monitor_cases(&mut run);
    clock_cases(&mut run);
    admission_cases(&mut run);

    let intro = format!(
        "loadgate compare ({mode} mode, {} rounds × {:?}) on {header}; os {}; one clock read \
         (Instant::now) {clock_read:.1} ns",
        run.budget.rounds,
        run.budget.per_round,
        std::env::consts::OS
    );
    println!("{intro}");
    println!(
        "p50/p99: per-op latency (batch means for sub-10 µs ops); ratios are p50 over p50, \
         or throughput over throughput for the cases run on two threads.\n"
    );
    let (table, met, total, alloc_failures) = table(&run.rows);
    print!("{table}");
    println!(
        "\ntargets met: {met} of {total}; {} cases in {:.1} s",
        run.rows.len(),
        started.elapsed().as_secs_f64()
    );
    if !alloc_failures.is_empty() {
        println!("loadgate hot paths ALLOCATED:");
        for f in &alloc_failures {
            println!("  {f}");
        }
        std::process::exit(1);
    }
    println!("loadgate hot paths allocated nothing while measured");
    if let Some(path) = opts.write {
        let block = format!(
            "<!-- Written by `compare --write`; edit the text outside the markers only. -->\n\
             {intro}. Targets met: {met} of {total}; loadgate hot paths allocated nothing \
             while measured.\n\n{table}"
        );
        if let Err(e) = write_block(&path, &block) {
            eprintln!("compare: {e}");
            std::process::exit(2);
        }
        eprintln!("compare: wrote the table to {path}");
    }
}
