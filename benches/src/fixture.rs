//! Fixtures shared by the criterion benches and `compare`: a loadgate
//! [`Monitor`], the reference monitor and router, and the bitset floor, all
//! holding the same workers with the same busy set.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use loadgate::{LoadReport, Monitor, ThresholdUpdate, WorkerSpec};

use crate::baseline::monitor::{RefLoad, RefMonitor, RefMonitorTask, RefThresholds};
use crate::baseline::routing::RefRouter;
use crate::floor::BitFloor;
use crate::rng::Seeded;

/// The model every fixture worker serves.
pub const MODEL: &str = "bench-model";
/// KV capacity of every rank.
pub const KV_TOTAL: u64 = 1000;
/// The decode threshold: busy above 900 of 1000 blocks.
pub const DECODE_THRESHOLD: f64 = 0.9;
/// `kv_used_blocks` of a busy rank.
pub const BUSY_KV: u64 = 950;
/// Base `kv_used_blocks` of a free rank (plus a per-worker offset below 50).
pub const FREE_KV: u64 = 100;

/// Worker ids: sparse, as real ids are.
pub fn worker_id(i: usize) -> u64 {
    1_000_003 + 7 * i as u64
}

/// Free-rank load of worker `i` (distinct, so power-of-two has a choice).
pub fn free_kv(i: usize) -> u64 {
    FREE_KV + (i % 50) as u64
}

/// The same workers in loadgate, in the reference design, and in the floor.
pub struct MonitorFixture {
    /// Worker count.
    pub n: usize,
    /// Ranks per worker.
    pub dp_size: u32,
    /// Worker ids; worker `i` has slot `i` everywhere.
    pub ids: Vec<u64>,
    /// loadgate.
    pub monitor: Monitor,
    /// The reference monitor's event loop.
    pub task: RefMonitorTask,
    /// The reference router the monitor publishes to.
    pub router: Arc<RefRouter>,
    /// The bitset floor.
    pub floor: BitFloor,
    busy: Vec<bool>,
}

impl MonitorFixture {
    /// `n` workers with `dp_size` ranks each, all free, decode threshold set.
    pub fn new(n: usize, dp_size: u32) -> Self {
        let ids: Vec<u64> = (0..n).map(worker_id).collect();
        let monitor = Monitor::new();
        let spec = WorkerSpec {
            dp_size,
            kv_total_blocks: Some(KV_TOTAL),
            ..Default::default()
        };
        for &id in &ids {
            monitor.add_worker(MODEL, id, spec).expect("add worker");
        }
        monitor
            .set_thresholds(
                MODEL,
                &ThresholdUpdate {
                    active_decode_blocks_threshold: Some(DECODE_THRESHOLD),
                    ..Default::default()
                },
            )
            .expect("set thresholds");
        let router = Arc::new(RefRouter::new(&ids));
        let shared = RefMonitor::new(
            router.clone(),
            RefThresholds {
                active_decode_blocks_threshold: Some(DECODE_THRESHOLD),
                ..Default::default()
            },
        );
        let mut task = RefMonitorTask::new(shared);
        for &id in &ids {
            task.add_worker(id, 0, dp_size, Some(KV_TOTAL), None);
        }
        let floor = BitFloor::new(&ids);
        let mut f = Self {
            n,
            dp_size,
            ids,
            monitor,
            task,
            router,
            floor,
            busy: vec![false; n],
        };
        for i in 0..n {
            f.report_all(i, free_kv(i));
        }
        f
    }

    /// Reports `kv_used` on every rank of worker `i`, to loadgate and to the
    /// reference; updates the floor and the power-of-two loads.
    pub fn report_all(&mut self, i: usize, kv_used: u64) {
        let id = self.ids[i];
        for rank in 0..self.dp_size {
            self.monitor
                .report(
                    id,
                    rank,
                    &LoadReport {
                        kv_used_blocks: Some(kv_used),
                        ..Default::default()
                    },
                )
                .expect("report");
            self.task
                .on_event(
                    id,
                    rank,
                    &RefLoad {
                        kv_used_blocks: Some(kv_used),
                        ..Default::default()
                    },
                )
                .expect("reference event");
        }
        let busy = kv_used as f64 > DECODE_THRESHOLD * KV_TOTAL as f64;
        self.busy[i] = busy;
        self.floor.set_busy(i, busy);
        self.floor.set_load(i, kv_used);
        self.router.set_occupancy(id, kv_used);
    }

    /// Makes `round(frac * n)` workers busy (a seeded random choice, at least
    /// one worker left free) and the rest free.
    pub fn set_busy_fraction(&mut self, frac: f64, seed: u64) {
        let want = ((frac * self.n as f64).round() as usize).min(self.n - 1);
        let mut order: Vec<usize> = (0..self.n).collect();
        Seeded::new(seed).shuffle(&mut order);
        let mut target = vec![false; self.n];
        for &i in &order[..want] {
            target[i] = true;
        }
        for (i, &busy) in target.iter().enumerate() {
            if self.busy[i] != busy {
                self.report_all(i, if busy { BUSY_KV } else { free_kv(i) });
            }
        }
        assert_eq!(self.busy_count(), want);
        assert_eq!(self.monitor.busy_workers(MODEL).len(), want);
        assert_eq!(self.task.busy_count(), want);
        assert_eq!(self.router.free_count(), self.n - want);
    }

    /// Busy workers now.
    pub fn busy_count(&self) -> usize {
        self.busy.iter().filter(|b| **b).count()
    }

    /// Whether worker `i` is busy.
    pub fn is_busy(&self, i: usize) -> bool {
        self.busy[i]
    }

    /// Index of some free worker.
    pub fn a_free_worker(&self) -> usize {
        self.busy.iter().position(|b| !b).expect("a free worker")
    }

    /// `k` distinct candidate workers with random costs, as a KV router
    /// would pass them.
    pub fn candidates(&self, k: usize, seed: u64) -> Vec<(u64, f64)> {
        let mut rng = Seeded::new(seed);
        let mut order: Vec<usize> = (0..self.n).collect();
        rng.shuffle(&mut order);
        order
            .iter()
            .take(k)
            .map(|&i| (self.ids[i], (rng.next() % 10_000) as f64 / 100.0))
            .collect()
    }
}

struct NoopWake;

impl Wake for NoopWake {
    fn wake(self: Arc<Self>) {}
    fn wake_by_ref(self: &Arc<Self>) {}
}

/// A waker that does nothing (the benches poll by hand).
pub fn noop_waker() -> Waker {
    Waker::from(Arc::new(NoopWake))
}

/// Wakes the thread that created it.
struct ThreadWake(std::thread::Thread);

impl Wake for ThreadWake {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

thread_local! {
    static THREAD_WAKER: Waker = Waker::from(Arc::new(ThreadWake(std::thread::current())));
}

/// Runs `fut` to completion on this thread, parking it while the future is
/// pending (a waker that unparks the thread, built once per thread): the
/// least an executor can do to wait for one future.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    THREAD_WAKER.with(|waker| {
        let mut cx = Context::from_waker(waker);
        loop {
            if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
                return out;
            }
            std::thread::park();
        }
    })
}

/// Polls `fut` once with `waker`.
#[inline]
pub fn poll_once<F: Future + Unpin>(fut: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(fut).poll(&mut Context::from_waker(waker))
}
