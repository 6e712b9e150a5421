//! Worker admission gate: exactly `N` running and `Q` queued, FIFO,
//! cancel-safe, with a lock-free direct path.
//!
//! # Algorithm
//!
//! The gate is a counting semaphore whose fast paths are one CAS on a packed
//! state word and whose waiters live in a table allocated with the gate.
//!
//! * **Direct admit** (lock-free): if the gate is open, nobody is queued and
//!   `running < limit`, CAS `running + 1`. Checking `queued == 0` in the same
//!   word is what forbids barging: a newcomer never takes a slot a waiter is
//!   owed.
//! * **Reject** (lock-free): if it cannot admit directly and `queued >= Q`, the
//!   request is rejected without touching the lock (unless a queue deadline
//!   is due, in which case the slow path expires the head first).
//! * **Enqueue** (slow path): under the table mutex, re-read the word; admit
//!   directly, reject, or CAS `queued + 1` and link a cell at the tail of an
//!   intrusive FIFO list. Cells come from a free list over a `Vec` reserved
//!   for `Q + N` cells when the gate is built, so queueing allocates nothing.
//! * **Release** (lock-free when `queued == 0`): CAS `running - 1`. Otherwise,
//!   under the mutex, hand the slot straight to the oldest waiter:
//!   `queued - 1` with `running` unchanged, cell marked granted. If a lowered
//!   limit left `running > limit`, just `running - 1`.
//! * **Cancel**: a waiter still queued is unlinked (`queued - 1`); a waiter
//!   already granted releases its slot through the release path, which hands
//!   it on. Both happen under the mutex, so a cancel racing a handoff sees
//!   exactly one of the two states and no slot is lost or duplicated.
//!
//! Waiters are told (waker woken, condition variable notified, callback
//! called) only after the mutex is released; a fixed-size list on the stack
//! carries them out of the critical section.
//!
//! # The state word
//!
//! One `AtomicU64`, alone on its cache line:
//!
//! ```text
//!  63     62..42        41..21          20..0
//! +------+-------------+---------------+---------------+
//! |closed| limit (21b) | queued (21b)  | running (21b) |
//! +------+-------------+---------------+---------------+
//! ```
//!
//! `running` counts held slots, including slots granted to waiters that have
//! not picked them up yet; `queued` counts linked cells; `limit` is `N`.
//!
//! Invariants, at every value the word takes:
//! 1. `queued <= Q`, and `running <= max(limit ever set)` (never above `N`
//!    unless the limit was just lowered; lowering revokes nothing).
//! 2. `queued`, `limit` and `closed` change only under the mutex, and
//!    `queued` always equals the length of the linked list when the mutex is
//!    taken.
//! 3. `running` changes without the mutex only while `queued == 0` (both fast
//!    paths require it in the value they CAS). So while `queued > 0`, the
//!    mutex holder owns the whole word.
//! 4. `queued > 0` implies `running >= limit` or `closed`: a slot is never
//!    left idle while someone waits. (A `set_limit` that grants more waiters
//!    than one batch raises `limit` step by step, together with the grants.)
//!
//! Cells: the table reserves `Q + N` cells (more after `set_limit` raises
//! `N`). A cell is owned by its waiter from enqueue until the waiter takes
//! its outcome (a callback's cell is freed as soon as it is resolved). At
//! most `Q` cells are queued and at most `N` granted-but-not-taken, so the
//! table grows only if futures or threads that were *rejected* have not yet
//! looked while the queue refilled behind them; never in steady state.
//!
//! # Orderings
//!
//! * Direct admit CAS: `Acquire` on success, so everything the previous
//!   holder of the slot did before its release happens-before the new holder
//!   runs. Failure and the first load are `Relaxed`: the value is only a CAS
//!   guess or a reason to reject, and rejecting publishes nothing.
//! * Fast release CAS: `Release`, pairing with the admit's `Acquire`.
//! * Under the mutex, loads are `Acquire` and every read-modify-write is
//!   `AcqRel`: a slot freed under the lock (release with no waiter left) is
//!   published to lock-free admitters, and the lock holder sees slots freed
//!   lock-free. A slot handed to a waiter is published by the mutex itself:
//!   the releaser marks the cell under the lock, the waiter reads it under
//!   the lock.
//! * Statistics counters are `Relaxed`: they order nothing.
//! * The head-deadline hint is written under the mutex (`Release`) and read
//!   by the reject path and [`AdmissionGate::next_deadline`] (`Acquire`); a
//!   stale read only delays an expiry to the next event.
//!
//! # Queue deadline
//!
//! With a deadline set, a waiter queued at `t` is rejected with
//! [`AdmitError::QueueTimeout`] once the clock reads `t + timeout` or later.
//! Expiry is checked from the head (the oldest) whenever the queue moves: on
//! release with waiters, on admit into a full queue, on `set_limit`; by a
//! blocking waiter when its own wait reaches the deadline; and by
//! [`AdmissionGate::expire`], which an event loop can call at
//! [`AdmissionGate::next_deadline`].

mod config;
mod table;
mod wait;

use std::fmt::{self, Write as _};
use std::sync::atomic::AtomicU64 as StatCounter;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::clock::{nanos, MonotonicClock, SharedClock};
use crate::counter::ThreadCounter;
use crate::error::Reason;
use crate::metrics;
use crate::sync::{lock, AtomicU64, Condvar, Mutex, Ordering};

use table::{Status, Table, Waiter, NIL};
use wait::{dispatch, Wake, WakeList};

pub use config::{
    ConfigError, GateConfig, DEFAULT_QUEUE_LIMIT, MAX_LIMIT, MAX_QUEUE, QUEUE_LIMIT_ENV,
    QUEUE_TIMEOUT_ENV,
};
pub use wait::{Admit, AdmitCallback, AdmitOwned, CallbackTicket, OwnedPermit, Permit};

const FIELD_BITS: u32 = 21;
const FIELD_MASK: u64 = (1 << FIELD_BITS) - 1;
const QUEUED_SHIFT: u32 = FIELD_BITS;
const LIMIT_SHIFT: u32 = 2 * FIELD_BITS;
const CLOSED: u64 = 1 << 63;
const ONE_RUNNING: u64 = 1;
const ONE_QUEUED: u64 = 1 << QUEUED_SHIFT;

/// "No waiter queued" in the head-deadline hint.
const NO_DEADLINE: u64 = u64::MAX;

/// Most condition variables a gate keeps; blocking waiters beyond that share
/// them (a shared one is notified with `notify_all`, so sharing only costs
/// spurious wakeups).
const MAX_CONDVARS: usize = 4096;

/// A decoded state word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Word(u64);

impl Word {
    fn new(running: u32, queued: u32, limit: u32, closed: bool) -> Self {
        debug_assert!(u64::from(running.max(queued).max(limit)) <= FIELD_MASK);
        Word(
            u64::from(running)
                | u64::from(queued) << QUEUED_SHIFT
                | u64::from(limit) << LIMIT_SHIFT
                | if closed { CLOSED } else { 0 },
        )
    }
    #[inline]
    fn running(self) -> u32 {
        (self.0 & FIELD_MASK) as u32
    }
    #[inline]
    fn queued(self) -> u32 {
        ((self.0 >> QUEUED_SHIFT) & FIELD_MASK) as u32
    }
    #[inline]
    fn limit(self) -> u32 {
        ((self.0 >> LIMIT_SHIFT) & FIELD_MASK) as u32
    }
    #[inline]
    fn closed(self) -> bool {
        self.0 & CLOSED != 0
    }
    /// Open, nobody queued, a slot free.
    #[inline]
    fn direct(self) -> bool {
        !self.closed() && self.queued() == 0 && self.running() < self.limit()
    }
}

/// Why a request got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AdmitError {
    /// Every slot is taken and the queue is full ("Server overloaded: worker
    /// at capacity"). A rejection.
    AtCapacity,
    /// The request waited in the queue past the queue deadline. A rejection.
    QueueTimeout,
    /// The gate is closed. A rejection.
    Closed,
    /// The caller's own timeout (of a blocking wait) ran out first; the request
    /// left the queue as a cancellation, not a rejection.
    TimedOut,
}

impl AdmitError {
    /// The rejection reason to report (`TimedOut` reports as a queue timeout).
    pub const fn reason(self) -> Reason {
        match self {
            AdmitError::AtCapacity => Reason::WorkerAtCapacity,
            AdmitError::QueueTimeout | AdmitError::TimedOut => Reason::QueueTimeout,
            AdmitError::Closed => Reason::Closed,
        }
    }
}

impl fmt::Display for AdmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason().message())
    }
}

impl std::error::Error for AdmitError {}

/// Why [`AdmissionGate::try_admit`] returned no permit. Neither is counted as
/// a rejection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TryAdmitError {
    /// No slot is free, or others are already waiting: admitting would mean
    /// waiting (or being rejected if the queue is full).
    WouldWait,
    /// The gate is closed.
    Closed,
}

impl fmt::Display for TryAdmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryAdmitError::WouldWait => f.write_str("no engine slot is free without waiting"),
            TryAdmitError::Closed => f.write_str(Reason::Closed.message()),
        }
    }
}

impl std::error::Error for TryAdmitError {}

/// A snapshot of a gate's state and counters.
///
/// The gauges (`running`, `queued`, `limit`, `closed`) come from one atomic
/// read of the state word, so they are mutually consistent; the counters are
/// read one by one and may be a moment apart from the gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GateStats {
    /// Slots held, including slots granted to waiters that have not picked
    /// them up yet.
    pub running: u32,
    /// Requests waiting in the queue.
    pub queued: u32,
    /// Engine slots `N`.
    pub limit: u32,
    /// Queue size `Q`.
    pub queue_limit: u32,
    /// Whether the gate is closed.
    pub closed: bool,
    /// Requests admitted without waiting.
    pub admitted_direct: u64,
    /// Requests admitted after waiting in the queue.
    pub admitted_queued: u64,
    /// Requests rejected because slots and queue were full.
    pub rejected_at_capacity: u64,
    /// Requests rejected because the gate was closed (queued ones included).
    pub rejected_closed: u64,
    /// Requests rejected because they waited past the queue deadline.
    pub expired: u64,
    /// Requests that left the queue before getting a slot (future dropped,
    /// ticket cancelled, blocking wait timed out). Not rejections.
    pub cancelled: u64,
}

impl GateStats {
    /// Requests in flight: running plus queued.
    pub fn in_flight(&self) -> u32 {
        self.running + self.queued
    }

    /// Rejections for one reason (0 for reasons the gate never gives).
    pub fn rejected(&self, reason: Reason) -> u64 {
        match reason {
            Reason::WorkerAtCapacity => self.rejected_at_capacity,
            Reason::QueueTimeout => self.expired,
            Reason::Closed => self.rejected_closed,
            _ => 0,
        }
    }

    /// All rejections.
    pub fn rejected_total(&self) -> u64 {
        self.rejected_at_capacity + self.expired + self.rejected_closed
    }
}

/// Statistics counters; plain atomics, not model-checked (they order nothing).
#[derive(Default)]
struct Counters {
    /// Bumped on every direct admission and every lock-free rejection, the
    /// hottest paths: per-thread cells instead of a shared locked add.
    admitted_direct: ThreadCounter,
    rejected_capacity: ThreadCounter,
    admitted_queued: StatCounter,
    rejected_closed: StatCounter,
    expired: StatCounter,
    cancelled: StatCounter,
}

/// A waiter queued at `enqueued_at` is due once `now` reaches its deadline;
/// exactly at the deadline counts.
#[inline]
fn is_due(enqueued_at: u64, timeout: u64, now: u64) -> bool {
    enqueued_at.saturating_add(timeout) <= now
}

#[inline]
fn bump(counter: &StatCounter, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// Outcome of the lock-free part of an admission.
enum Fast {
    Admitted,
    Rejected(AdmitError),
    Slow,
}

/// Outcome of the locked part of an admission; hands the waiter back when it
/// was not queued, so the caller can use or drop it after unlocking.
enum Enqueued {
    Direct(Waiter),
    Rejected(AdmitError, Waiter),
    Queued(u32, u32),
}

/// A worker's admission gate: at most `N` requests run and at most `Q` wait,
/// at any instant, whatever the interleaving; the rest are rejected with
/// "Server overloaded: worker at capacity".
///
/// * A request is admitted directly only when a slot is free and nobody is
///   queued; otherwise it queues (FIFO) if the queue has room.
/// * A [`Permit`] holds a slot until dropped; its release hands the slot to
///   the oldest waiter.
/// * Waiting works as a future ([`admit`](Self::admit),
///   [`admit_owned`](Self::admit_owned)), as a blocking call with a timeout
///   ([`admit_blocking`](Self::admit_blocking)), or with a callback
///   ([`admit_with_callback`](Self::admit_with_callback)).
///
/// **Memory ordering:** releasing a permit happens-before the admission that
/// reuses its slot, whether that admission is direct or a queued waiter that
/// the release handed the slot to. Writes a request made while holding its
/// slot are therefore visible to the request that gets the slot next.
///
/// Direct admission, release with nobody waiting, and rejection take no lock
/// and allocate nothing; queueing and handoff take a short mutex and
/// allocate nothing.
pub struct AdmissionGate {
    state: CachePadded<AtomicU64>,
    counters: CachePadded<Counters>,
    /// Clock time at which the head waiter expires, or [`NO_DEADLINE`].
    head_deadline: StatCounter,
    table: Mutex<Table>,
    condvars: Box<[Condvar]>,
    queue_limit: u32,
    timeout: Option<u64>,
    adaptive_lifo: bool,
    prefix: String,
    clock: SharedClock,
}

impl AdmissionGate {
    /// A gate with the process's monotonic clock.
    pub fn new(config: GateConfig) -> Result<Self, ConfigError> {
        Self::with_clock(config, MonotonicClock::shared())
    }

    /// A gate reading time from `clock` (queue deadline, queue-wait times).
    pub fn with_clock(config: GateConfig, clock: SharedClock) -> Result<Self, ConfigError> {
        config.validate()?;
        let capacity = config.queue as usize + config.limit as usize;
        let condvars = (0..capacity.clamp(1, MAX_CONDVARS))
            .map(|_| Condvar::new())
            .collect();
        Ok(Self {
            state: CachePadded::new(AtomicU64::new(Word::new(0, 0, config.limit, false).0)),
            counters: CachePadded::new(Counters::default()),
            head_deadline: StatCounter::new(NO_DEADLINE),
            table: Mutex::new(Table::new(capacity)),
            condvars,
            queue_limit: config.queue,
            timeout: config.queue_timeout.map(|d| nanos(d).max(1)),
            adaptive_lifo: config.adaptive_lifo,
            prefix: config.metrics_prefix,
            clock,
        })
    }

    // ----- admission -------------------------------------------------------

    /// Takes a slot only if one is free and nobody is waiting; never queues.
    /// Failures are not counted as rejections.
    #[inline]
    pub fn try_admit(&self) -> Result<Permit<'_>, TryAdmitError> {
        match self.try_direct() {
            Ok(()) => {
                self.counters.admitted_direct.add(1);
                Ok(Permit::new(self))
            }
            Err(w) if w.closed() => Err(TryAdmitError::Closed),
            Err(_) => Err(TryAdmitError::WouldWait),
        }
    }

    /// [`try_admit`](Self::try_admit) returning an [`OwnedPermit`].
    #[inline]
    pub fn try_admit_owned(self: &Arc<Self>) -> Result<OwnedPermit, TryAdmitError> {
        self.try_admit().map(|p| p.into_owned(self))
    }

    /// Waits for a slot as a future (see [`Admit`]).
    pub fn admit(&self) -> Admit<'_> {
        Admit::new(self)
    }

    /// Waits for a slot as a `'static` future (see [`AdmitOwned`]).
    pub fn admit_owned(self: &Arc<Self>) -> AdmitOwned {
        AdmitOwned::new(Arc::clone(self))
    }

    /// Waits for a slot, blocking the thread, for at most `timeout` (`None`:
    /// as long as it takes). When the timeout runs out the request leaves the
    /// queue and [`AdmitError::TimedOut`] is returned. A queue deadline, if
    /// configured, is enforced by the waiting thread itself.
    pub fn admit_blocking(&self, timeout: Option<Duration>) -> Result<Permit<'_>, AdmitError> {
        self.wait_blocking(timeout).map(|()| Permit::new(self))
    }

    /// [`admit_blocking`](Self::admit_blocking) returning an [`OwnedPermit`].
    pub fn admit_blocking_owned(
        self: &Arc<Self>,
        timeout: Option<Duration>,
    ) -> Result<OwnedPermit, AdmitError> {
        self.wait_blocking(timeout)
            .map(|()| OwnedPermit::new(Arc::clone(self)))
    }

    /// Asks for a slot and calls `callback` exactly once with the outcome:
    /// at once on this thread if the request is admitted or rejected
    /// straight away, otherwise later from the thread that hands it a slot,
    /// expires it or closes the gate. For engine loops and event loops that
    /// cannot poll a future (C++, Python asyncio).
    ///
    /// The callback must be quick and must not panic; it may drop its permit
    /// or ask for another. While queued, the request holds a handle to the
    /// gate. The returned ticket can cancel the request while it waits.
    pub fn admit_with_callback(self: &Arc<Self>, callback: AdmitCallback) -> CallbackTicket {
        let outcome = match self.admit_fast() {
            Fast::Admitted => Ok(()),
            Fast::Rejected(e) => Err(e),
            Fast::Slow => {
                let waiter = Waiter::Callback(callback, Arc::clone(self));
                let mut wakes = WakeList::new();
                let step = self.enqueue(waiter, &mut wakes);
                wakes.run(self);
                let (outcome, back) = match step {
                    Enqueued::Queued(idx, gen) => {
                        return CallbackTicket::new(Arc::clone(self), Some((idx, gen)));
                    }
                    Enqueued::Direct(w) => (Ok(()), w),
                    Enqueued::Rejected(e, w) => (Err(e), w),
                };
                if let Waiter::Callback(callback, gate) = back {
                    dispatch(callback, outcome.map(|()| OwnedPermit::new(gate)));
                }
                return CallbackTicket::new(Arc::clone(self), None);
            }
        };
        dispatch(
            callback,
            outcome.map(|()| OwnedPermit::new(Arc::clone(self))),
        );
        CallbackTicket::new(Arc::clone(self), None)
    }

    // ----- control ---------------------------------------------------------

    /// Changes the engine limit `N` (1 to [`MAX_LIMIT`]). Raising it hands the
    /// new slots to waiters before returning; lowering it revokes nothing:
    /// running requests finish and the count drains down to the new limit.
    pub fn set_limit(&self, limit: u32) -> Result<(), ConfigError> {
        config::check_limit(limit)?;
        loop {
            let mut wakes = WakeList::new();
            let mut t = lock(&self.table);
            if t.cells.capacity() < self.queue_limit as usize + limit as usize {
                // Cold path: room for every waiter that may be granted at once.
                t.reserve_total(self.queue_limit as usize + limit as usize);
            }
            let now = self.clock.now_nanos();
            let w = Word(self.state.load(Ordering::Acquire));
            let mut done = true;
            let mut granted = 0u32;
            if !w.closed() && w.queued() > 0 && w.running() < limit {
                if self.timeout.is_some() {
                    self.expire_locked(&mut t, now, &mut wakes);
                }
                if self.head_is_due(&t, now) {
                    done = false; // the wake list filled up; next batch
                } else {
                    let w = Word(self.state.load(Ordering::Acquire));
                    let want = w.queued().min(limit - w.running());
                    granted = want.min(wakes.room() as u32);
                    for _ in 0..granted {
                        self.grant_one(&mut t, now, &mut wakes);
                    }
                    done = granted == want;
                }
            }
            // While more waiters remain to be granted, the limit is raised
            // only as far as the grants made (keeping invariant 4).
            self.update(|w| {
                let target = if done { limit } else { w.running() + granted };
                Word::new(
                    w.running() + granted,
                    w.queued() - granted,
                    target,
                    w.closed(),
                )
            });
            self.sync_head(&t);
            drop(t);
            wakes.run(self);
            if done {
                return Ok(());
            }
        }
    }

    /// Closes the gate: every queued request and every later admission gets
    /// [`AdmitError::Closed`]. Permits already held stay valid and release
    /// normally. Closing twice is harmless.
    pub fn close(&self) {
        loop {
            let mut wakes = WakeList::new();
            let mut t = lock(&self.table);
            self.state.fetch_or(CLOSED, Ordering::AcqRel);
            let mut n = 0u32;
            while t.head != NIL && !wakes.is_full() {
                let idx = t.head;
                t.unlink(idx);
                self.resolve(&mut t, idx, Err(AdmitError::Closed), 0, &mut wakes);
                n += 1;
            }
            if n > 0 {
                self.state
                    .fetch_sub(u64::from(n) * ONE_QUEUED, Ordering::AcqRel);
                bump(&self.counters.rejected_closed, u64::from(n));
            }
            let done = t.head == NIL;
            self.sync_head(&t);
            drop(t);
            wakes.run(self);
            if done {
                return;
            }
        }
    }

    /// Rejects every queued request whose deadline has come (queued at `t`,
    /// now `>= t + timeout`) with [`AdmitError::QueueTimeout`] and returns how
    /// many. A no-op without a queue deadline. Event loops call it at
    /// [`next_deadline`](Self::next_deadline).
    pub fn expire(&self) -> usize {
        if self.timeout.is_none() {
            return 0;
        }
        let mut total = 0;
        loop {
            let mut wakes = WakeList::new();
            let mut t = lock(&self.table);
            let now = self.clock.now_nanos();
            total += self.expire_locked(&mut t, now, &mut wakes) as usize;
            let more = self.head_is_due(&t, now);
            drop(t);
            wakes.run(self);
            if !more {
                return total;
            }
        }
    }

    /// Clock time (nanoseconds, the gate's clock) at which the oldest waiter
    /// expires, or `None` without a deadline or without waiters.
    pub fn next_deadline(&self) -> Option<u64> {
        self.timeout?;
        let d = self.head_deadline.load(Ordering::Acquire);
        (d != NO_DEADLINE).then_some(d)
    }

    /// How long from now until [`next_deadline`](Self::next_deadline), by the
    /// gate's clock (zero if it has passed): what a host timer should sleep
    /// before calling [`expire`](Self::expire).
    pub fn time_to_next_deadline(&self) -> Option<Duration> {
        let at = self.next_deadline()?;
        Some(Duration::from_nanos(
            at.saturating_sub(self.clock.now_nanos()),
        ))
    }

    // ----- observation -----------------------------------------------------

    /// Slots held now.
    pub fn running(&self) -> u32 {
        Word(self.state.load(Ordering::Relaxed)).running()
    }

    /// Requests queued now.
    pub fn queued(&self) -> u32 {
        Word(self.state.load(Ordering::Relaxed)).queued()
    }

    /// The engine limit `N`.
    pub fn limit(&self) -> u32 {
        Word(self.state.load(Ordering::Relaxed)).limit()
    }

    /// The queue size `Q`.
    pub fn queue_limit(&self) -> u32 {
        self.queue_limit
    }

    /// The queue deadline, if set.
    pub fn queue_timeout(&self) -> Option<Duration> {
        self.timeout.map(Duration::from_nanos)
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        Word(self.state.load(Ordering::Relaxed)).closed()
    }

    /// The metric name prefix.
    pub fn metrics_prefix(&self) -> &str {
        &self.prefix
    }

    /// A snapshot of the gauges and counters.
    pub fn stats(&self) -> GateStats {
        let w = Word(self.state.load(Ordering::Acquire));
        let c = &self.counters;
        let get = |x: &StatCounter| x.load(Ordering::Relaxed);
        GateStats {
            running: w.running(),
            queued: w.queued(),
            limit: w.limit(),
            queue_limit: self.queue_limit,
            closed: w.closed(),
            admitted_direct: c.admitted_direct.get(),
            admitted_queued: get(&c.admitted_queued),
            rejected_at_capacity: c.rejected_capacity.get(),
            rejected_closed: get(&c.rejected_closed),
            expired: get(&c.expired),
            cancelled: get(&c.cancelled),
        }
    }

    /// The worker metrics in Prometheus text format:
    /// `{prefix}_rejection_request_total` (all rejections),
    /// `{prefix}_engine_request` (running), `{prefix}_request_queue`
    /// (queued), `{prefix}_engine_request_limit`,
    /// `{prefix}_request_queue_limit`, `{prefix}_request_admitted_total{path}`,
    /// `{prefix}_request_rejection_by_reason_total{reason}`,
    /// `{prefix}_request_cancelled_total`,
    /// `{prefix}_request_queue_expired_total` and the histogram
    /// `{prefix}_request_queue_wait_seconds` of how long admitted waiters
    /// waited.
    pub fn metrics_text(&self) -> String {
        let s = self.stats();
        let p = self.prefix.as_str();
        let mut out = String::with_capacity(2048);
        metrics::header(
            &mut out,
            p,
            "rejection_request_total",
            "counter",
            "Requests rejected by the worker admission gate.",
        );
        metrics::sample(
            &mut out,
            p,
            "rejection_request_total",
            &[],
            s.rejected_total(),
        );
        metrics::header(
            &mut out,
            p,
            "engine_request",
            "gauge",
            "Requests holding an engine slot.",
        );
        metrics::sample(&mut out, p, "engine_request", &[], s.running);
        metrics::header(
            &mut out,
            p,
            "request_queue",
            "gauge",
            "Requests waiting for a slot.",
        );
        metrics::sample(&mut out, p, "request_queue", &[], s.queued);
        metrics::header(
            &mut out,
            p,
            "engine_request_limit",
            "gauge",
            "Engine slots (N).",
        );
        metrics::sample(&mut out, p, "engine_request_limit", &[], s.limit);
        metrics::header(
            &mut out,
            p,
            "request_queue_limit",
            "gauge",
            "Queue size (Q).",
        );
        metrics::sample(&mut out, p, "request_queue_limit", &[], s.queue_limit);
        let name = "request_admitted_total";
        metrics::header(&mut out, p, name, "counter", "Requests admitted, by path.");
        metrics::sample(&mut out, p, name, &[("path", &"direct")], s.admitted_direct);
        metrics::sample(&mut out, p, name, &[("path", &"queued")], s.admitted_queued);
        let name = "request_rejection_by_reason_total";
        metrics::header(
            &mut out,
            p,
            name,
            "counter",
            "Requests rejected, by reason.",
        );
        for reason in [
            Reason::WorkerAtCapacity,
            Reason::QueueTimeout,
            Reason::Closed,
        ] {
            metrics::sample(
                &mut out,
                p,
                name,
                &[("reason", &reason.as_str())],
                s.rejected(reason),
            );
        }
        let name = "request_cancelled_total";
        metrics::header(
            &mut out,
            p,
            name,
            "counter",
            "Requests that left the queue unserved.",
        );
        metrics::sample(&mut out, p, name, &[], s.cancelled);
        let name = "request_queue_expired_total";
        metrics::header(
            &mut out,
            p,
            name,
            "counter",
            "Requests rejected by the queue deadline.",
        );
        metrics::sample(&mut out, p, name, &[], s.expired);
        self.render_wait_histogram(&mut out);
        out
    }

    fn render_wait_histogram(&self, out: &mut String) {
        const BUCKETS: [f64; 16] = [
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0, 60.0,
        ];
        let (counts, total, sum_nanos) = {
            let t = lock(&self.table);
            let counts = BUCKETS.map(|le| t.wait_hist.count_between(0, (le * 1e9) as u64));
            (counts, t.wait_hist.len(), t.wait_sum_nanos)
        };
        let p = self.prefix.as_str();
        let name = "request_queue_wait_seconds";
        metrics::header(
            out,
            p,
            name,
            "histogram",
            "Time admitted requests spent queued.",
        );
        let bucket = format!("{name}_bucket");
        let mut le = String::new();
        for (bound, count) in BUCKETS.iter().zip(counts) {
            le.clear();
            let _ = write!(le, "{bound}");
            metrics::sample(out, p, &bucket, &[("le", &le)], count);
        }
        metrics::sample(out, p, &bucket, &[("le", &"+Inf")], total);
        metrics::sample(out, p, &format!("{name}_sum"), &[], sum_nanos as f64 / 1e9);
        metrics::sample(out, p, &format!("{name}_count"), &[], total);
    }

    // ----- lock-free paths -------------------------------------------------

    /// CAS `running + 1` while admission is direct; the word seen otherwise.
    #[inline]
    fn try_direct(&self) -> Result<(), Word> {
        // Relaxed: only a guess for the CAS, or a reason to refuse.
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            let w = Word(cur);
            if !w.direct() {
                return Err(w);
            }
            // Acquire: the last release of this slot happens-before us.
            match self.state.compare_exchange_weak(
                cur,
                cur + ONE_RUNNING,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Direct admit or lock-free reject; `Slow` when it must queue.
    #[inline]
    fn admit_fast(&self) -> Fast {
        match self.try_direct() {
            Ok(()) => {
                self.counters.admitted_direct.add(1);
                Fast::Admitted
            }
            Err(w) if w.closed() => {
                bump(&self.counters.rejected_closed, 1);
                Fast::Rejected(AdmitError::Closed)
            }
            Err(w) if w.queued() >= self.queue_limit && !self.head_due_hint() => {
                self.counters.rejected_capacity.add(1);
                Fast::Rejected(AdmitError::AtCapacity)
            }
            Err(_) => Fast::Slow,
        }
    }

    /// Whether the head waiter may be due (then the slow path expires it
    /// before deciding to reject).
    #[inline]
    fn head_due_hint(&self) -> bool {
        self.timeout.is_some() && {
            let d = self.head_deadline.load(Ordering::Acquire);
            d != NO_DEADLINE && self.clock.now_nanos() >= d
        }
    }

    /// Gives back one slot.
    #[inline]
    fn release_slot(&self) {
        let mut cur = self.state.load(Ordering::Relaxed);
        while Word(cur).queued() == 0 {
            debug_assert!(Word(cur).running() > 0, "release without a held slot");
            // Release: our use of the slot happens-before its next admit.
            match self.state.compare_exchange_weak(
                cur,
                cur - ONE_RUNNING,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
        self.release_slow();
    }

    // ----- locked paths ----------------------------------------------------

    /// CAS loop for changes under the mutex (`running` may still move
    /// lock-free while `queued == 0`).
    fn update(&self, f: impl Fn(Word) -> Word) {
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            let new = f(Word(cur)).0;
            match self
                .state
                .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// The locked part of an admission.
    fn enqueue(&self, waiter: Waiter, wakes: &mut WakeList) -> Enqueued {
        let mut t = lock(&self.table);
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            let w = Word(cur);
            if w.closed() {
                bump(&self.counters.rejected_closed, 1);
                return Enqueued::Rejected(AdmitError::Closed, waiter);
            }
            if w.direct() {
                match self.state.compare_exchange(
                    cur,
                    cur + ONE_RUNNING,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        self.counters.admitted_direct.add(1);
                        return Enqueued::Direct(waiter);
                    }
                    Err(actual) => {
                        cur = actual;
                        continue;
                    }
                }
            }
            if w.queued() >= self.queue_limit {
                if self.timeout.is_some() {
                    let now = self.clock.now_nanos();
                    if self.head_is_due(&t, now) {
                        // Make room by expiring every due waiter, one wake
                        // batch at a time: waiters are told outside the lock.
                        loop {
                            if wakes.is_full() {
                                drop(t);
                                wakes.run(self);
                                t = lock(&self.table);
                            }
                            self.expire_locked(&mut t, now, wakes);
                            if !self.head_is_due(&t, now) {
                                break;
                            }
                        }
                        cur = self.state.load(Ordering::Acquire);
                        continue;
                    }
                }
                self.counters.rejected_capacity.add(1);
                return Enqueued::Rejected(AdmitError::AtCapacity, waiter);
            }
            // CAS, not fetch_add: `running` may move lock-free while queued
            // is 0, and we queue only if no slot is free.
            match self.state.compare_exchange(
                cur,
                cur + ONE_QUEUED,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    let now = self.clock.now_nanos();
                    let (idx, gen) = t.push_back(now, waiter);
                    if t.head == idx {
                        self.sync_head(&t);
                    }
                    return Enqueued::Queued(idx, gen);
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Release when waiters may be queued.
    #[cold]
    fn release_slow(&self) {
        loop {
            let mut wakes = WakeList::new();
            let mut t = lock(&self.table);
            let done = self.release_locked(&mut t, &mut wakes);
            drop(t);
            wakes.run(self);
            if done {
                return;
            }
        }
    }

    /// Hands the slot to the next live waiter, or gives it back. False when
    /// the wake list filled with expired waiters first (call again).
    fn release_locked(&self, t: &mut Table, wakes: &mut WakeList) -> bool {
        let w = Word(self.state.load(Ordering::Acquire));
        debug_assert!(w.running() > 0, "release without a held slot");
        if w.queued() > 0 && !w.closed() && w.running() <= w.limit() {
            let now = self.clock.now_nanos();
            if self.timeout.is_some() {
                self.expire_locked(t, now, wakes);
                if self.head_is_due(t, now) {
                    return false;
                }
            }
            if t.head != NIL {
                if wakes.is_full() {
                    return false;
                }
                self.grant_one(t, now, wakes);
                // The slot moves to the waiter: running unchanged. With
                // queued > 0 nobody else writes the word (invariant 3).
                self.state.fetch_sub(ONE_QUEUED, Ordering::AcqRel);
                self.sync_head(t);
                return true;
            }
        }
        // AcqRel: publishes the slot to lock-free admitters.
        self.state.fetch_sub(ONE_RUNNING, Ordering::AcqRel);
        true
    }

    /// Unlinks the next waiter (oldest, or newest once after an expiry with
    /// adaptive LIFO) and grants it a slot. The caller fixes the word.
    fn grant_one(&self, t: &mut Table, now: u64, wakes: &mut WakeList) {
        let idx = if t.lifo_next {
            t.lifo_next = false;
            t.tail
        } else {
            t.head
        };
        debug_assert_ne!(idx, NIL);
        t.unlink(idx);
        self.resolve(t, idx, Ok(()), now, wakes);
        bump(&self.counters.admitted_queued, 1);
    }

    /// Marks an unlinked waiter granted or rejected and lists whom to tell.
    /// A callback's cell is freed at once (its owner never looks again).
    fn resolve(
        &self,
        t: &mut Table,
        idx: u32,
        outcome: Result<(), AdmitError>,
        now: u64,
        wakes: &mut WakeList,
    ) {
        let cell = &mut t.cells[idx as usize];
        if outcome.is_ok() {
            let waited = now.saturating_sub(cell.enqueued_at);
            t.record_wait(waited);
        }
        let cell = &mut t.cells[idx as usize];
        cell.status = match outcome {
            Ok(()) => Status::Granted,
            Err(e) => Status::Rejected(e),
        };
        match std::mem::replace(&mut cell.waiter, Waiter::None) {
            Waiter::Task(Some(waker)) => wakes.push(Wake::Task(waker)),
            Waiter::Thread => wakes.push(Wake::Thread(idx as usize % self.condvars.len())),
            Waiter::Callback(callback, gate) => {
                t.release_cell(idx);
                wakes.push(Wake::Callback {
                    callback,
                    gate,
                    outcome,
                });
            }
            Waiter::Task(None) | Waiter::None => {}
        }
    }

    /// Rejects due waiters from the head, as many as the wake list holds.
    fn expire_locked(&self, t: &mut Table, now: u64, wakes: &mut WakeList) -> u32 {
        let Some(timeout) = self.timeout else {
            return 0;
        };
        if Word(self.state.load(Ordering::Acquire)).closed() {
            return 0;
        }
        let mut n = 0u32;
        while t.head != NIL && !wakes.is_full() {
            let idx = t.head;
            if !is_due(t.cells[idx as usize].enqueued_at, timeout, now) {
                break;
            }
            t.unlink(idx);
            self.resolve(t, idx, Err(AdmitError::QueueTimeout), now, wakes);
            n += 1;
        }
        if n > 0 {
            // queued > 0 until this RMW: nobody else writes the word.
            self.state
                .fetch_sub(u64::from(n) * ONE_QUEUED, Ordering::AcqRel);
            bump(&self.counters.expired, u64::from(n));
            if self.adaptive_lifo {
                t.lifo_next = true;
            }
            self.sync_head(t);
        }
        n
    }

    /// Whether the head waiter is past its deadline (and the gate is open).
    fn head_is_due(&self, t: &Table, now: u64) -> bool {
        match self.timeout {
            Some(timeout) if t.head != NIL => {
                is_due(t.cells[t.head as usize].enqueued_at, timeout, now)
                    && !Word(self.state.load(Ordering::Acquire)).closed()
            }
            _ => false,
        }
    }

    /// Publishes the head waiter's deadline for the lock-free reject path.
    fn sync_head(&self, t: &Table) {
        if let Some(timeout) = self.timeout {
            let d = if t.head == NIL {
                NO_DEADLINE
            } else {
                t.cells[t.head as usize].enqueued_at.saturating_add(timeout)
            };
            self.head_deadline.store(d, Ordering::Release);
        }
    }

    /// A queued future's poll: its outcome, or `Pending` with its waker kept.
    fn poll_cell(&self, idx: u32, waker: &Waker) -> Poll<Result<(), AdmitError>> {
        let mut t = lock(&self.table);
        let cell = &mut t.cells[idx as usize];
        let outcome = match cell.status {
            Status::Queued => {
                let mut stale = None;
                if let Waiter::Task(slot) = &mut cell.waiter {
                    if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
                        stale = slot.replace(waker.clone());
                    }
                }
                drop(t);
                drop(stale); // a waker's drop may run executor code: unlocked
                return Poll::Pending;
            }
            Status::Granted => Ok(()),
            Status::Rejected(e) => Err(e),
            Status::Free => unreachable!("polled a free waiter cell"),
        };
        let stale = t.release_cell(idx);
        drop(t);
        drop(stale);
        Poll::Ready(outcome)
    }

    /// A future or blocked thread gives up its cell: leaves the queue, or
    /// passes on a slot it was granted but never took.
    fn cancel_cell(&self, idx: u32) {
        let mut t = lock(&self.table);
        let status = t.cells[idx as usize].status;
        if status == Status::Queued {
            self.unqueue_locked(&mut t, idx);
        }
        let stale = t.release_cell(idx);
        drop(t);
        drop(stale);
        if status == Status::Granted {
            self.release_slot();
        }
    }

    /// Unlinks a queued waiter that gives up (a cancellation).
    fn unqueue_locked(&self, t: &mut Table, idx: u32) {
        t.unlink(idx);
        // queued > 0 until this RMW: nobody else writes the word.
        self.state.fetch_sub(ONE_QUEUED, Ordering::AcqRel);
        bump(&self.counters.cancelled, 1);
        self.sync_head(t);
    }

    /// A callback ticket's cancel: true if the request was still queued.
    fn cancel_callback(&self, idx: u32, gen: u32) -> bool {
        let mut t = lock(&self.table);
        let cell = &t.cells[idx as usize];
        if cell.gen != gen || cell.status != Status::Queued {
            return false;
        }
        self.unqueue_locked(&mut t, idx);
        let stale = t.release_cell(idx);
        drop(t);
        drop(stale); // the callback and its gate handle: dropped unlocked
        true
    }

    /// Whether a callback request is still queued.
    fn callback_queued(&self, idx: u32, gen: u32) -> bool {
        let t = lock(&self.table);
        let cell = &t.cells[idx as usize];
        cell.gen == gen && cell.status == Status::Queued
    }

    /// Notifies the condition variable of blocked waiters (after unlocking).
    fn notify_thread(&self, cv: usize) {
        self.condvars[cv].notify_all();
    }

    /// The blocking wait.
    fn wait_blocking(&self, timeout: Option<Duration>) -> Result<(), AdmitError> {
        match self.admit_fast() {
            Fast::Admitted => return Ok(()),
            Fast::Rejected(e) => return Err(e),
            Fast::Slow => {}
        }
        let give_up = timeout.and_then(|d| Instant::now().checked_add(d));
        let mut wakes = WakeList::new();
        let step = self.enqueue(Waiter::Thread, &mut wakes);
        wakes.run(self);
        let idx = match step {
            Enqueued::Direct(_) => return Ok(()),
            Enqueued::Rejected(e, _) => return Err(e),
            Enqueued::Queued(idx, _) => idx,
        };
        let cv = &self.condvars[idx as usize % self.condvars.len()];
        let mut t = lock(&self.table);
        loop {
            match t.cells[idx as usize].status {
                Status::Queued => {}
                Status::Granted => {
                    t.release_cell(idx);
                    return Ok(());
                }
                Status::Rejected(e) => {
                    t.release_cell(idx);
                    return Err(e);
                }
                Status::Free => unreachable!("blocked on a free waiter cell"),
            }
            let mut wait = None;
            let closed = Word(self.state.load(Ordering::Acquire)).closed();
            if let Some(deadline) = self.timeout.filter(|_| !closed) {
                // (Once closed, close() rejects us and notifies.)
                let now = self.clock.now_nanos();
                let due = t.cells[idx as usize].enqueued_at.saturating_add(deadline);
                if now >= due {
                    // Everyone ahead of us is older, so due too: expire from
                    // the head until our own cell is reached.
                    let mut wakes = WakeList::new();
                    self.expire_locked(&mut t, now, &mut wakes);
                    drop(t);
                    wakes.run(self);
                    t = lock(&self.table);
                    continue;
                }
                wait = Some(Duration::from_nanos(due - now));
            }
            if let Some(give_up) = give_up {
                let now = Instant::now();
                if now >= give_up {
                    self.unqueue_locked(&mut t, idx);
                    t.release_cell(idx);
                    return Err(AdmitError::TimedOut);
                }
                let left = give_up - now;
                wait = Some(wait.map_or(left, |w: Duration| w.min(left)));
            }
            t = match wait {
                None => crate::sync::wait(cv, t),
                Some(d) => crate::sync::wait_timeout(cv, t, d),
            };
        }
    }
}

impl fmt::Debug for AdmissionGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.stats();
        f.debug_struct("AdmissionGate")
            .field("running", &s.running)
            .field("queued", &s.queued)
            .field("limit", &s.limit)
            .field("queue_limit", &s.queue_limit)
            .field("closed", &s.closed)
            .field("queue_timeout", &self.queue_timeout())
            .finish_non_exhaustive()
    }
}
