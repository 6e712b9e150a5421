//! The measuring loop of `compare`: interleaved rounds, per-op latencies in
//! hdrhistogram, and per-thread allocation counts.
//!
//! # What a sample is
//!
//! Operations of a few nanoseconds are shorter than a clock read (which
//! costs about 100 ns on some virtual machines), so a sample times a *batch*
//! of consecutive operations and records the batch time divided by the batch
//! size as one per-op latency. The batch is sized
//! per design so that a sample lasts about [`SAMPLE_TARGET`]; anything slower
//! than that is timed one operation per sample. Percentiles are therefore
//! over batch means for the fastest operations, and exact per-op latencies
//! for the slow ones.
//!
//! # Interleaving
//!
//! Every case runs its designs in rounds: round `r` runs each design for
//! `per_round`, in an order rotated by `r`, so that noise from the rest of
//! the machine lands on all of them alike. All rounds of all designs run in
//! one process, on the same fixtures.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use loadgate_testkit::alloc::thread_allocations;

/// How long one sample should last.
pub const SAMPLE_TARGET: Duration = Duration::from_micros(10);

/// Picoseconds per nanosecond: histograms record picoseconds so that batch
/// means keep sub-nanosecond resolution.
const PS: u64 = 1000;

/// How much time a case gets.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Rounds per case.
    pub rounds: usize,
    /// Time each design runs per round.
    pub per_round: Duration,
}

/// A fresh latency histogram (1 ps to 100 s, 3 significant digits).
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000_000, 3).expect("valid histogram bounds")
}

/// One design's measurements in one case.
#[derive(Debug, Clone)]
pub struct Series {
    /// Per-op latencies, picoseconds.
    pub hist: Histogram<u64>,
    /// Operations measured.
    pub ops: u64,
    /// Wall time the measured operations took (summed over rounds).
    pub elapsed: Duration,
    /// Allocations made by the measuring thread(s) while measuring.
    pub allocs: u64,
    /// On-CPU time of the measuring threads while measuring, where the OS
    /// reports it (Linux); zero elsewhere.
    pub on_cpu: Duration,
    /// Every sample timed one operation (no batch means): its tail
    /// percentiles are per-operation latencies.
    pub per_op: bool,
}

impl Default for Series {
    fn default() -> Self {
        Self {
            hist: histogram(),
            ops: 0,
            elapsed: Duration::ZERO,
            allocs: 0,
            on_cpu: Duration::ZERO,
            per_op: false,
        }
    }
}

impl Series {
    /// Median latency, nanoseconds.
    pub fn p50(&self) -> f64 {
        self.hist.value_at_quantile(0.5) as f64 / PS as f64
    }

    /// 99th-percentile latency, nanoseconds.
    pub fn p99(&self) -> f64 {
        self.hist.value_at_quantile(0.99) as f64 / PS as f64
    }

    /// 99.9th-percentile latency, nanoseconds.
    pub fn p999(&self) -> f64 {
        self.hist.value_at_quantile(0.999) as f64 / PS as f64
    }

    /// Operations per second over the measured wall time.
    pub fn throughput(&self) -> f64 {
        if self.elapsed.is_zero() {
            0.0
        } else {
            self.ops as f64 / self.elapsed.as_secs_f64()
        }
    }

    /// Allocations per measured operation.
    pub fn allocs_per_op(&self) -> f64 {
        if self.ops == 0 {
            0.0
        } else {
            self.allocs as f64 / self.ops as f64
        }
    }

    fn record(&mut self, elapsed: Duration, ops: u64) {
        let ps = (elapsed.as_nanos() as u64).saturating_mul(PS) / ops.max(1);
        self.hist.saturating_record(ps.max(1));
    }

    /// Adds another series' measurements to this one.
    pub fn merge(&mut self, other: &Series) {
        self.hist.add(&other.hist).expect("same histogram bounds");
        self.ops += other.ops;
        self.allocs += other.allocs;
        self.on_cpu += other.on_cpu;
        self.per_op |= other.per_op;
    }

    /// How many threads were on a CPU on average while measuring (on-CPU
    /// time over wall time); `None` where the OS does not report it.
    pub fn threads_on_cpu(&self) -> Option<f64> {
        (!self.on_cpu.is_zero() && !self.elapsed.is_zero())
            .then(|| self.on_cpu.as_secs_f64() / self.elapsed.as_secs_f64())
    }
}

/// A design measured on the calling thread: `run(n)` performs `n`
/// operations.
pub struct Side<'a> {
    run: Box<dyn FnMut(u64) + 'a>,
}

impl<'a> Side<'a> {
    /// A design whose `run(n)` performs `n` operations.
    pub fn new(run: impl FnMut(u64) + 'a) -> Self {
        Self { run: Box::new(run) }
    }
}

/// Times `run(n)` for growing `n` and returns a batch size that makes one
/// sample last about [`SAMPLE_TARGET`].
fn calibrate(run: &mut dyn FnMut(u64)) -> u64 {
    run(16); // warm caches, lazy thread-locals and first-use allocations
    let mut n = 1u64;
    loop {
        let t = Instant::now();
        run(n);
        let dt = t.elapsed();
        if dt >= Duration::from_micros(50) || n >= 1 << 16 {
            let per_op = dt.as_nanos().max(1) as u64 / n;
            return (SAMPLE_TARGET.as_nanos() as u64 / per_op.max(1)).clamp(1, 1 << 14);
        }
        n *= 2;
    }
}

/// Runs every design of one case in interleaved rounds on this thread.
pub fn interleave(budget: &Budget, sides: &mut [Side<'_>]) -> Vec<Series> {
    let batches: Vec<u64> = sides.iter_mut().map(|s| calibrate(&mut s.run)).collect();
    let mut out = vec![Series::default(); sides.len()];
    for round in 0..budget.rounds {
        for k in 0..sides.len() {
            let i = (round + k) % sides.len();
            let (side, series, batch) = (&mut sides[i], &mut out[i], batches[i]);
            let before = thread_allocations();
            let start = Instant::now();
            let deadline = start + budget.per_round;
            loop {
                let t = Instant::now();
                (side.run)(batch);
                let now = Instant::now();
                series.record(now - t, batch);
                series.ops += batch;
                if now >= deadline {
                    series.elapsed += now - start;
                    break;
                }
            }
            series.allocs += thread_allocations() - before;
        }
    }
    out
}

/// This thread's on-CPU time so far (Linux `schedstat`), if known.
fn thread_cpu_time() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace()
        .next()?
        .parse()
        .ok()
        .map(Duration::from_nanos)
}

/// A design run by several threads at once: `op(n)` performs `n`
/// operations and may be called from any of them.
pub struct SharedSide<'a> {
    op: &'a (dyn Fn(u64) + Sync),
}

impl<'a> SharedSide<'a> {
    /// A design whose `op(n)` performs `n` operations.
    pub fn new(op: &'a (dyn Fn(u64) + Sync)) -> Self {
        Self { op }
    }
}

/// Runs every design with `threads` threads at once, in interleaved rounds.
/// Each series holds all threads' latencies; its throughput is the total
/// operation count over the round wall time.
pub fn contend(budget: &Budget, threads: usize, sides: &[SharedSide<'_>]) -> Vec<Series> {
    contend_with(budget, threads, sides, false)
}

/// [`contend`], timing every operation on its own, so that the tail
/// percentiles are per-operation latencies (a thread preempted in the
/// middle of one shows there); each sample carries a clock read's cost.
pub fn contend_per_op(budget: &Budget, threads: usize, sides: &[SharedSide<'_>]) -> Vec<Series> {
    contend_with(budget, threads, sides, true)
}

fn contend_with(
    budget: &Budget,
    threads: usize,
    sides: &[SharedSide<'_>],
    per_op: bool,
) -> Vec<Series> {
    let mut out = vec![Series::default(); sides.len()];
    for round in 0..budget.rounds {
        for k in 0..sides.len() {
            let i = (round + k) % sides.len();
            let op = sides[i].op;
            let barrier = Barrier::new(threads + 1);
            let stop = AtomicBool::new(false);
            let (series, wall) = std::thread::scope(|s| {
                let workers: Vec<_> = (0..threads)
                    .map(|_| {
                        s.spawn(|| {
                            let mut mine = Series {
                                per_op,
                                ..Series::default()
                            };
                            let batch = if per_op {
                                op(16); // first-use work, not measured
                                1
                            } else {
                                calibrate(&mut |n| op(n))
                            };
                            barrier.wait();
                            let cpu_before = thread_cpu_time();
                            let before = thread_allocations();
                            while !stop.load(Ordering::Relaxed) {
                                let t = Instant::now();
                                op(batch);
                                mine.record(t.elapsed(), batch);
                                mine.ops += batch;
                            }
                            mine.allocs = thread_allocations() - before;
                            if let (Some(a), Some(b)) = (cpu_before, thread_cpu_time()) {
                                mine.on_cpu = b.saturating_sub(a);
                            }
                            mine
                        })
                    })
                    .collect();
                barrier.wait();
                let start = Instant::now();
                std::thread::sleep(budget.per_round);
                stop.store(true, Ordering::Relaxed);
                let mut all = Series::default();
                for w in workers {
                    all.merge(&w.join().expect("bench thread"));
                }
                (all, start.elapsed())
            });
            out[i].merge(&series);
            out[i].elapsed += wall;
        }
    }
    out
}

/// A reader measured while a writer thread runs flat out.
pub struct UnderWrites<'a> {
    /// Performs `n` read operations (measured).
    pub read: Box<dyn FnMut(u64) + 'a>,
    /// Performs one write (runs on its own thread until told to stop).
    pub write: Box<dyn FnMut() + Send + 'a>,
}

/// Runs each design's reader on this thread while its writer runs on
/// another, in interleaved rounds. Returns the readers' series (their
/// allocation count includes the writer's) and the writers' operation counts.
pub fn under_writes(budget: &Budget, sides: &mut [UnderWrites<'_>]) -> Vec<(Series, u64)> {
    let batches: Vec<u64> = sides.iter_mut().map(|s| calibrate(&mut s.read)).collect();
    let mut out = vec![(Series::default(), 0u64); sides.len()];
    for round in 0..budget.rounds {
        for k in 0..sides.len() {
            let i = (round + k) % sides.len();
            let side = &mut sides[i];
            let (read, write) = (&mut side.read, &mut side.write);
            let stop = AtomicBool::new(false);
            let writes = AtomicU64::new(0);
            let writer_allocs = AtomicU64::new(0);
            let started = Barrier::new(2);
            let series = &mut out[i].0;
            std::thread::scope(|s| {
                s.spawn(|| {
                    for _ in 0..16 {
                        write(); // first-use work of a new thread, not counted
                    }
                    started.wait();
                    let before = thread_allocations();
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        write();
                        n += 1;
                    }
                    writer_allocs.store(thread_allocations() - before, Ordering::Relaxed);
                    writes.store(n, Ordering::Relaxed);
                });
                started.wait();
                let before = thread_allocations();
                let start = Instant::now();
                let deadline = start + budget.per_round;
                loop {
                    let t = Instant::now();
                    read(batches[i]);
                    let now = Instant::now();
                    series.record(now - t, batches[i]);
                    series.ops += batches[i];
                    if now >= deadline {
                        series.elapsed += now - start;
                        break;
                    }
                }
                series.allocs += thread_allocations() - before;
                stop.store(true, Ordering::Relaxed);
            });
            out[i].0.allocs += writer_allocs.load(Ordering::Relaxed);
            out[i].1 += writes.load(Ordering::Relaxed);
        }
    }
    out
}

/// Records one externally timed latency (for cases that time across
/// threads).
pub fn record_one(series: &mut Series, elapsed: Duration) {
    series.record(elapsed, 1);
    series.ops += 1;
    series.elapsed += elapsed;
}
