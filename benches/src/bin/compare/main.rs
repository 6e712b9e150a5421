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

use std::hint::black_box;
use std::time::{Duration, Instant};

use loadgate_benches::harness::{Budget, Series, Side};
use loadgate_testkit::alloc::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

mod admission;
mod flow;
mod monitor;
mod rows;

use admission::{admission_cases, clock_cases};
use flow::flow_cases;
use monitor::{monitor_cases, routing_cases, slo_cases};
use rows::{machine, read_block, table, write_block, Compared, Row, Target};

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
const BOOK_LEASED: &[Design] = &[("loadgate without leased mode", Target::None)];
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
const FLOW_DISPATCH: &[Design] = &[("Mutex gate + oneshot", Target::Under(10_000.0))];
/// An SLO costs a select at most a fifth more (its verdicts are made where
/// the busy bits are, off the select path).
const SLO_SELECT: &[Design] = &[("the same select without an SLO", Target::WithinOf(1.2))];
/// An advisory SLO counts each pick's would-be decision (one atomic add):
/// shown.
const SLO_SELECT_ADVISORY: &[Design] = &[("the same select without an SLO", Target::None)];
/// Requests waiting cost a report or a booking nothing.
const WITH_QUEUE: &[Design] = &[("the same monitor without a queue", Target::WithinOf(1.1))];
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
    slo_cases(&mut run);
    slo_cases(&mut run);
    monitor_cases(&mut run);
    clock_cases(&mut run);
    admission_cases(&mut run);
    flow_cases(&mut run);

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
