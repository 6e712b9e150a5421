//! The monitor's maintenance: the work no hot path does and no user has to
//! call for.
//!
//! * dispatching the requests that wait in a model's queue when a kick
//!   says capacity may have appeared (`flow/mod.rs`, "Protocol"), and
//!   delivering their outcomes;
//! * refusing queued requests at their deadlines;
//! * the sweep: marking ranks that stopped reporting stale (for models
//!   whose staleness policy is not `keep`), and ending overload leases
//!   at their deadlines;
//! * fitting each rank's step time to what its requests' streams showed,
//!   every `FIT_PERIOD` while a model has an SLO, and sampling the rate
//!   its bookings end (`slo.rs`, `freed.rs`).
//!
//! With [`Maintenance::Background`] (the default) a thread of the
//! monitor's own does it, started by the first setting that needs it
//! (flow control, a staleness policy) and ended when the monitor is
//! dropped. It sleeps until the signal (`signal.rs`) is raised or its next
//! deadline comes, on the monitor's clock: a clock moved by hand
//! (`ManualClock`) wakes it at every move. A monitor used in a process
//! forked from the one that made it starts a new thread there (`fork()`
//! copies no thread). With [`Maintenance::Manual`] nothing runs by itself:
//! the host calls [`Monitor::maintain`] (a simulation that owns time).
//!
//! [`Maintenance::Background`]: super::Maintenance::Background
//! [`Maintenance::Manual`]: super::Maintenance::Manual

use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::busy_set::BitIter;
use super::flow::Flows;
use super::observe::Observations;
use super::registry::Registry;
use super::signal::Signal;
use super::{Monitor, Staleness};
use crate::clock::SharedClock;
use crate::sync::{lock, park, park_timeout, AtomicU32, AtomicU64, Mutex, Ordering};

/// Sweeps for staleness come at a quarter of the shortest `stale_after`,
/// within these bounds.
const SWEEP_PERIOD_MIN: Duration = Duration::from_millis(1);
const SWEEP_PERIOD_MAX: Duration = Duration::from_secs(1);

/// What the maintenance works on, shared with its thread.
pub(super) struct Duty {
    registry: Arc<ArcSwap<Registry>>,
    flows: Arc<Flows>,
    observations: Arc<Observations>,
    clock: SharedClock,
    pub(super) signal: Arc<Signal>,
    /// Clock time of the next staleness sweep.
    next_sweep: AtomicU64,
    /// Clock time the ended bookings are next sampled, while a model has
    /// an SLO.
    next_sample: AtomicU64,
    /// Whether a thread runs it.
    background: bool,
    /// The process whose thread runs it (0: none yet); starts are
    /// serialized by `starting`.
    started: AtomicU32,
    starting: Mutex<()>,
}

impl Duty {
    pub(super) fn new(
        registry: Arc<ArcSwap<Registry>>,
        flows: Arc<Flows>,
        observations: Arc<Observations>,
        clock: SharedClock,
        background: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            registry,
            flows,
            observations,
            clock,
            signal: Arc::new(Signal::new()),
            next_sweep: AtomicU64::new(0),
            next_sample: AtomicU64::new(0),
            background,
            started: AtomicU32::new(0),
            starting: Mutex::new(()),
        })
    }

    /// Starts the thread, unless it runs in this process already or the
    /// maintenance is the host's.
    pub(super) fn start(self: &Arc<Self>) {
        if !self.background {
            return;
        }
        let pid = std::process::id();
        // Acquire: pairs with the Release below (the thread is set up).
        if self.started.load(Ordering::Acquire) == pid {
            return;
        }
        let _starting = lock(&self.starting);
        let before = self.started.load(Ordering::Acquire);
        if before == pid {
            return;
        }
        if before == 0 {
            self.clock
                .wake_on_advance(Waker::from(Arc::clone(&self.signal)));
        }
        let duty = Arc::clone(self);
        // A thread that cannot be started now is tried again at the next
        // setting or queued request.
        if crate::sync::spawn("loadgate-monitor", move || duty.run()) {
            self.started.store(pid, Ordering::Release);
        }
    }

    /// The thread's loop (module docs).
    fn run(&self) {
        self.signal.set_thread(crate::sync::current_thread());
        while !self.signal.is_stopped() {
            self.signal.take();
            let next = self.cycle();
            if self.signal.is_stopped() || self.signal.is_raised() {
                continue;
            }
            match next.filter(|_| self.clock.real_time()) {
                Some(at) => {
                    let wait = at.saturating_sub(self.clock.now_nanos());
                    park_timeout(Duration::from_nanos(wait));
                }
                None => park(),
            }
        }
    }

    /// One round: the sweep if it is due, then the queues that were
    /// kicked or reached a deadline. The clock time of the next round's
    /// own work, if any.
    pub(super) fn cycle(&self) -> Option<u64> {
        let now = self.clock.now_nanos();
        let period = self.sweep_period();
        // Relaxed: only the maintenance reads and writes it.
        let due = self.next_sweep.load(Ordering::Relaxed);
        let staleness_due = period.is_some() && now >= due;
        if staleness_due || self.next_lease().is_some_and(|d| d <= now) {
            self.sweep();
        }
        if let Some(p) = period.filter(|_| staleness_due) {
            self.next_sweep
                .store(now.saturating_add(p), Ordering::Relaxed);
        }
        let queues = super::flow::run_queues(&self.flows, &self.registry, &self.clock);
        let sweep = period.map(|_| self.next_sweep.load(Ordering::Relaxed));
        min(min(min(queues, sweep), self.next_lease()), self.fit(now))
    }

    /// Fits what the requests' streams showed, and, while any model has
    /// an SLO, samples the bookings that ended once per `FIT_PERIOD` (the
    /// walk over every rank is not every cycle's: cycles follow kicks);
    /// the clock time of the next sample (`slo.rs`).
    fn fit(&self, now: u64) -> Option<u64> {
        let reg = self.registry.load();
        // Relaxed: a setting.
        let on = reg.models.values().any(|m| m.slo.mode().is_some());
        super::slo::fit(&self.observations, &reg);
        if !on {
            return None;
        }
        // Relaxed: only the maintenance reads and writes it.
        let mut next = self.next_sample.load(Ordering::Relaxed);
        if now >= next {
            super::slo::sample_releases(&reg, now);
            next = now.saturating_add(crate::clock::nanos(super::slo::FIT_PERIOD));
            self.next_sample.store(next, Ordering::Relaxed);
        }
        Some(next)
    }

    /// How often staleness needs a sweep: `None` when every model keeps
    /// silent ranks' values.
    fn sweep_period(&self) -> Option<u64> {
        let reg = self.registry.load();
        reg.models
            .values()
            .filter(|m| m.staleness() != Staleness::Keep)
            // Relaxed: a setting (`Monitor::set_staleness`).
            .map(|m| m.stale_after.load(Ordering::Relaxed) / 4)
            .min()
            .map(|p| {
                p.clamp(
                    crate::clock::nanos(SWEEP_PERIOD_MIN),
                    crate::clock::nanos(SWEEP_PERIOD_MAX),
                )
            })
    }

    /// The earliest deadline of a lease still set, in any model.
    fn next_lease(&self) -> Option<u64> {
        let reg = self.registry.load();
        let mut next = None;
        // Relaxed hint: a lease set meanwhile is seen at the next round,
        // which its own kick (if it ends) or a sweep brings.
        for m in reg
            .models
            .values()
            .filter(|m| m.leases_out.load(Ordering::Relaxed) != 0)
        {
            for w in 0..m.words_in_use() {
                for b in BitIter(m.leased.word(w)) {
                    // Relaxed: ordered by the Acquire load of the lease word.
                    let d = m.lease_deadline[w * 64 + b].load(Ordering::Relaxed);
                    next = min(next, Some(d));
                }
            }
        }
        next
    }

    /// The sweep (`Monitor::sweep`): how many workers were re-evaluated.
    pub(super) fn sweep(&self) -> usize {
        let now = self.clock.now_nanos();
        let reg = self.registry.load_full();
        let mut changed_workers = 0;
        for w in reg.workers.values() {
            let m = &w.model;
            let policy = m.staleness();
            // Relaxed: a setting (see `set_staleness`).
            let after = m.stale_after.load(Ordering::Relaxed);
            let mut changed = false;
            for rank in w.ranks.iter() {
                // Relaxed `seen` and `last_seen`: flags for the sweep that
                // order nothing; a report racing this swap is seen next time.
                let stale = if rank.seen.swap(false, Ordering::Relaxed) {
                    rank.last_seen.store(now, Ordering::Relaxed);
                    false
                } else {
                    policy != Staleness::Keep
                        && now.saturating_sub(rank.last_seen.load(Ordering::Relaxed)) >= after
                };
                // Relaxed: an input released by `reevaluate_and_wait` below.
                if rank.stale.swap(stale, Ordering::Relaxed) != stale {
                    changed = true;
                }
            }
            if changed {
                w.reevaluate_and_wait();
                changed_workers += 1;
            }
        }
        for m in reg
            .models
            .values()
            // Relaxed hint: a lease set meanwhile is swept next time.
            .filter(|m| m.leases_out.load(Ordering::Relaxed) != 0)
        {
            for w in 0..m.words_in_use() {
                for b in BitIter(m.leased.word(w)) {
                    let slot = w * 64 + b;
                    // Relaxed: ordered by the Acquire load of the lease word.
                    let deadline = m.lease_deadline[slot].load(Ordering::Relaxed);
                    if deadline <= now {
                        // Ending it kicks the model's queue.
                        m.end_lease(slot);
                    }
                }
            }
        }
        changed_workers
    }
}

/// The earlier of two optional times.
fn min(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Monitor {
    /// Does the monitor's maintenance now, on this thread (module docs):
    /// dispatches what waits where workers are free, refuses what reached
    /// its deadline, sweeps for staleness and ends expired leases. With
    /// [`Maintenance::Manual`](super::Maintenance::Manual) the host calls
    /// it after each change and at the time it returns; with the default
    /// background maintenance there is no need to (it is harmless).
    /// Returns the clock time (nanoseconds) at which the maintenance next
    /// has work of its own (a deadline, a sweep), if any.
    pub fn maintain(&self) -> Option<u64> {
        self.duty.cycle()
    }

    /// Marks ranks silent for `stale_after` as stale (for models whose
    /// policy is not `keep`), un-marks ranks that reported, re-evaluates
    /// the workers whose state changed, and ends expired leases, now. The
    /// maintenance sweeps by itself at a quarter of `stale_after` (at least
    /// every second); a rank is stale once it missed reports for
    /// `stale_after` plus at most that period. Returns the number of
    /// workers re-evaluated.
    pub fn sweep(&self) -> usize {
        self.duty.sweep()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.duty.signal.stop();
    }
}
