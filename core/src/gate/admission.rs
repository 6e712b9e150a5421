//! The public gate: [`AdmissionGate`], its documentation and its methods, a
//! thin layer over the raw gate (`raw.rs`) that holds the algorithm.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{MonotonicClock, SharedClock};

use super::callback::{self, AdmitCallback, CallbackTicket, QueuedCallback};
use super::config::{self, ConfigError, GateConfig};
use super::error::{AdmitError, TryAdmitError};
use super::future::{Admit, AdmitOwned};
use super::metrics;
use super::pending::{self, Pending};
use super::permit::{OwnedPermit, Permit};
use super::raw::RawGate;
use super::stats::GateStats;

/// A worker's admission gate: at most `N` requests run and at most `Q` wait,
/// at any instant, whatever the interleaving; the rest are rejected with
/// "Server overloaded: worker at capacity".
///
/// * A request is admitted directly only when a slot is free and nobody is
///   queued; otherwise it queues (FIFO) if the queue has room.
/// * A [`Permit`] holds a slot until dropped; its release hands the slot to
///   the oldest waiter.
/// * With a wait limit `W` ([`GateConfig::wait_limit`]), at most `W`
///   admitted requests are without their first response: admission needs a
///   wait slot too, and [`Permit::first_response`] frees it (handing it to
///   the oldest waiter if a request slot is free).
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
/// **Locking:** no path takes a lock but [`set_limit`](Self::set_limit):
/// admission, rejection, queueing, release and handoff, `first_response`,
/// cancel, blocking waits, expiry, displacement, adaptive LIFO and
/// [`close`](Self::close) run on atomics and the lock-free queues, with or
/// without priority classes or a wait limit. Admission, queueing and
/// handoff allocate nothing (the queues' storage is reserved when the gate
/// is built); raising the limit and rendering metrics may.
pub struct AdmissionGate {
    pub(super) raw: RawGate<QueuedCallback>,
    prefix: String,
}

impl AdmissionGate {
    /// A gate with the process's monotonic clock.
    pub fn new(config: GateConfig) -> Result<Self, ConfigError> {
        Self::with_clock(config, MonotonicClock::shared())
    }

    /// A gate reading time from `clock` (queue deadline, queue-wait times).
    pub fn with_clock(config: GateConfig, clock: SharedClock) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            raw: RawGate::new(&config, clock),
            prefix: config.metrics_prefix,
        })
    }

    // ----- admission -------------------------------------------------------

    /// Takes a slot only if one is free and nobody is waiting (of a more
    /// important class or the same); never queues. Failures are not counted
    /// as rejections. A request of class 0, the
    /// most important (see [`try_admit_at`](Self::try_admit_at)).
    #[inline(always)]
    pub fn try_admit(&self) -> Result<Permit<'_>, TryAdmitError> {
        self.try_admit_at(0)
    }

    /// [`try_admit`](Self::try_admit) for a request of priority class
    /// `priority` (0 the most important; past the gate's last class counts
    /// as the last): takes a slot if one is free within the class's share
    /// and nobody of this class or a more important one is waiting.
    // Always inlined: with the wait limit's out-of-line branch the compiler
    // stopped inlining it, which tripled the cost of a direct admit.
    #[inline(always)]
    pub fn try_admit_at(&self, priority: u8) -> Result<Permit<'_>, TryAdmitError> {
        let class = self.raw.class_of(priority);
        match self.raw.try_direct(class) {
            Ok(()) => {
                self.raw.counters.admitted_direct.add(1);
                Ok(Permit::new(self))
            }
            Err(w) if w.closed() => Err(TryAdmitError::Closed),
            Err(w)
                if self.raw.wait_limit.is_none()
                    && (w.queued() == 0 || self.raw.classes.count == 1) =>
            {
                Err(TryAdmitError::WouldWait)
            }
            // A gate with a wait limit reserves a wait slot first; a
            // request that may use a reserved slot while only less
            // important classes wait looks at the classes' counts.
            Err(w) => self.try_admit_slow(class, w),
        }
    }

    /// [`try_admit`](Self::try_admit) on a gate with a wait limit, or with
    /// classes while someone waits. Out of line and cold, so that
    /// `try_admit` stays small enough to inline into its callers.
    #[cold]
    #[inline(never)]
    fn try_admit_slow(
        &self,
        class: usize,
        seen: super::state::Word,
    ) -> Result<Permit<'_>, TryAdmitError> {
        if seen.closed() || !self.raw.classes.room(class, seen) {
            return Err(TryAdmitError::WouldWait);
        }
        match self.raw.try_direct_counted(class) {
            Ok(()) => {
                self.raw.counters.admitted_direct.add(1);
                Ok(Permit::new(self))
            }
            Err(w) if w.closed() => Err(TryAdmitError::Closed),
            Err(_) => Err(TryAdmitError::WouldWait),
        }
    }

    /// [`try_admit`](Self::try_admit) returning an [`OwnedPermit`].
    #[inline]
    pub fn try_admit_owned(self: &Arc<Self>) -> Result<OwnedPermit, TryAdmitError> {
        self.try_admit_owned_at(0)
    }

    /// [`try_admit_at`](Self::try_admit_at) returning an [`OwnedPermit`].
    #[inline]
    pub fn try_admit_owned_at(
        self: &Arc<Self>,
        priority: u8,
    ) -> Result<OwnedPermit, TryAdmitError> {
        self.try_admit_at(priority).map(|p| p.into_owned(self))
    }

    /// Waits for a slot as a future (see [`Admit`]); class 0.
    pub fn admit(&self) -> Admit<'_> {
        self.admit_at(0)
    }

    /// [`admit`](Self::admit) for a request of priority class `priority` (0
    /// the most important; past the gate's last class counts as the last).
    pub fn admit_at(&self, priority: u8) -> Admit<'_> {
        Admit::new(self, self.raw.class_of(priority))
    }

    /// Waits for a slot as a `'static` future (see [`AdmitOwned`]); class 0.
    pub fn admit_owned(self: &Arc<Self>) -> AdmitOwned {
        self.admit_owned_at(0)
    }

    /// [`admit_owned`](Self::admit_owned) for priority class `priority`.
    pub fn admit_owned_at(self: &Arc<Self>, priority: u8) -> AdmitOwned {
        AdmitOwned::new(Arc::clone(self), self.raw.class_of(priority))
    }

    /// Waits for a slot, blocking the thread, for at most `timeout` (`None`:
    /// as long as it takes). When the timeout runs out the request leaves the
    /// queue and [`AdmitError::TimedOut`] is returned. A queue deadline, if
    /// configured, is enforced by the waiting thread itself. Class 0.
    pub fn admit_blocking(&self, timeout: Option<Duration>) -> Result<Permit<'_>, AdmitError> {
        self.admit_blocking_at(0, timeout)
    }

    /// [`admit_blocking`](Self::admit_blocking) for priority class
    /// `priority`.
    pub fn admit_blocking_at(
        &self,
        priority: u8,
        timeout: Option<Duration>,
    ) -> Result<Permit<'_>, AdmitError> {
        self.raw
            .wait_blocking(self.raw.class_of(priority), timeout)
            .map(|()| Permit::new(self))
    }

    /// [`admit_blocking`](Self::admit_blocking) returning an [`OwnedPermit`].
    pub fn admit_blocking_owned(
        self: &Arc<Self>,
        timeout: Option<Duration>,
    ) -> Result<OwnedPermit, AdmitError> {
        self.admit_blocking_owned_at(0, timeout)
    }

    /// [`admit_blocking_at`](Self::admit_blocking_at) returning an
    /// [`OwnedPermit`].
    pub fn admit_blocking_owned_at(
        self: &Arc<Self>,
        priority: u8,
        timeout: Option<Duration>,
    ) -> Result<OwnedPermit, AdmitError> {
        self.raw
            .wait_blocking(self.raw.class_of(priority), timeout)
            .map(|()| OwnedPermit::new(Arc::clone(self)))
    }

    /// Asks for a slot and calls `callback` exactly once with the outcome:
    /// at once on this thread if the request is admitted or rejected
    /// straight away, otherwise later from the thread that hands it a slot,
    /// expires it or closes the gate. For engine loops and event loops that
    /// cannot poll a future (C++, Python asyncio). Class 0.
    ///
    /// The callback must be quick and must not panic; it may drop its permit
    /// or ask for another. While queued, the request holds a handle to the
    /// gate. The returned ticket can cancel the request while it waits.
    pub fn admit_with_callback(self: &Arc<Self>, callback: AdmitCallback) -> CallbackTicket {
        self.admit_with_callback_at(0, callback)
    }

    /// [`admit_with_callback`](Self::admit_with_callback) for priority class
    /// `priority`.
    pub fn admit_with_callback_at(
        self: &Arc<Self>,
        priority: u8,
        callback: AdmitCallback,
    ) -> CallbackTicket {
        callback::admit(self, self.raw.class_of(priority), callback)
    }

    /// Asks for a slot in two steps, for a caller whose waiter must exist
    /// before it can be told (an asyncio future): admitted or rejected at
    /// once ([`Pending::Ready`]), or queued with nobody to tell yet
    /// ([`Pending::Queued`]), whose [`PendingAdmission::arm`](super::PendingAdmission::arm) leaves the
    /// callback to call, or returns the outcome if the request was resolved
    /// meanwhile. The callback never runs before it is armed. Class 0.
    pub fn admit_pending(self: &Arc<Self>) -> Pending {
        self.admit_pending_at(0)
    }

    /// [`admit_pending`](Self::admit_pending) for priority class
    /// `priority`.
    pub fn admit_pending_at(self: &Arc<Self>, priority: u8) -> Pending {
        pending::admit(self, self.raw.class_of(priority))
    }

    /// How many priority classes the gate has (1 without classes).
    pub fn classes(&self) -> usize {
        self.raw.classes.count
    }

    // ----- control ---------------------------------------------------------

    /// Changes the engine limit `N` (1 to [`MAX_LIMIT`](super::MAX_LIMIT)).
    /// Raising it hands the new slots to waiters before returning; lowering
    /// it revokes nothing: running requests finish and the count drains down
    /// to the new limit.
    pub fn set_limit(&self, limit: u32) -> Result<(), ConfigError> {
        config::check_limit(limit)?;
        self.raw.set_limit(limit);
        Ok(())
    }

    /// Closes the gate: every queued request and every later admission gets
    /// [`AdmitError::Closed`]. Permits already held stay valid and release
    /// normally. Closing twice is harmless.
    pub fn close(&self) {
        self.raw.close();
    }

    /// Rejects every queued request whose deadline has come (queued at `t`,
    /// now `>= t + timeout`) with [`AdmitError::QueueTimeout`] and returns how
    /// many. A no-op without a queue deadline. Event loops call it at
    /// [`next_deadline`](Self::next_deadline).
    pub fn expire(&self) -> usize {
        self.raw.expire()
    }

    /// Clock time (nanoseconds, the gate's clock) at which the first waiter
    /// expires (the earliest of the classes' oldest waiters), or `None`
    /// without a deadline or without waiters.
    pub fn next_deadline(&self) -> Option<u64> {
        if !self.raw.deadlines {
            return None;
        }
        self.raw.next_deadline()
    }

    /// How long from now until [`next_deadline`](Self::next_deadline), by the
    /// gate's clock (zero if it has passed): what a host timer should sleep
    /// before calling [`expire`](Self::expire).
    pub fn time_to_next_deadline(&self) -> Option<Duration> {
        let at = self.next_deadline()?;
        Some(Duration::from_nanos(
            at.saturating_sub(self.raw.clock.now_nanos()),
        ))
    }

    // ----- observation -----------------------------------------------------

    /// Slots held now.
    pub fn running(&self) -> u32 {
        self.raw.word_relaxed().running()
    }

    /// Requests queued now.
    pub fn queued(&self) -> u32 {
        self.raw.word_relaxed().queued()
    }

    /// The engine limit `N`.
    pub fn limit(&self) -> u32 {
        self.raw.word_relaxed().limit()
    }

    /// The queue size `Q`.
    pub fn queue_limit(&self) -> u32 {
        self.raw.queue_limit
    }

    /// The wait limit `W`, if set.
    pub fn wait_limit(&self) -> Option<u32> {
        self.raw.wait_limit
    }

    /// Admitted requests without their first response now (0 without a
    /// wait limit).
    pub fn waiting(&self) -> u32 {
        self.raw.waiting()
    }

    /// The gate's queue deadline, if set (a gate with classes may set its
    /// own per class, see [`GateConfig::classes`]).
    pub fn queue_timeout(&self) -> Option<Duration> {
        self.raw.timeout.map(Duration::from_nanos)
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.raw.word_relaxed().closed()
    }

    /// The metric name prefix.
    pub fn metrics_prefix(&self) -> &str {
        &self.prefix
    }

    /// A snapshot of the gauges and counters.
    pub fn stats(&self) -> GateStats {
        self.raw.stats()
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
    /// waited; and the reference's newest family: the gauges
    /// `{prefix}_backend_admission_engine_request_count` (running),
    /// `{prefix}_backend_admission_engine_wait_count` (admitted without a
    /// first response; 0 without a wait limit) and
    /// `{prefix}_backend_admission_request_queue_count` (queued), and the
    /// counters `{prefix}_backend_admission_request_receive_total` (every
    /// admission attempt, see [`GateStats::received`]),
    /// `{prefix}_backend_admission_request_admit_total{source="direct"|"queue"}`,
    /// `{prefix}_backend_admission_rejection_total` and
    /// `{prefix}_backend_admission_cancellation_total`.
    pub fn metrics_text(&self) -> String {
        metrics::render(&self.stats(), &self.raw.waits, &self.prefix)
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
            .field("waiting", &s.waiting)
            .field("wait_limit", &s.wait_limit)
            .field("closed", &s.closed)
            .field("queue_timeout", &self.queue_timeout())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn time_to_next_deadline_counts_down_by_the_gate_clock() {
        let clock = ManualClock::new();
        let config = GateConfig::new(1)
            .with_queue(1)
            .with_queue_timeout(Some(Duration::from_millis(100)));
        let gate = Arc::new(AdmissionGate::with_clock(config, clock.clone()).unwrap());
        assert_eq!(gate.time_to_next_deadline(), None, "nobody is queued");
        let _held = gate.try_admit_owned().unwrap();
        let _ticket = gate.admit_with_callback(Box::new(|_| {}));
        assert_eq!(
            gate.time_to_next_deadline(),
            Some(Duration::from_millis(100))
        );
        clock.advance(Duration::from_millis(30));
        assert_eq!(
            gate.time_to_next_deadline(),
            Some(Duration::from_millis(70))
        );
        clock.advance(Duration::from_millis(500));
        assert_eq!(
            gate.time_to_next_deadline(),
            Some(Duration::ZERO),
            "a passed deadline is a wait of zero"
        );
        assert_eq!(gate.expire(), 1);
        assert_eq!(gate.time_to_next_deadline(), None);
    }

    #[test]
    fn time_to_next_deadline_is_none_without_a_deadline() {
        let clock = ManualClock::new();
        let gate = Arc::new(
            AdmissionGate::with_clock(GateConfig::new(1).with_queue(1), clock.clone()).unwrap(),
        );
        let _held = gate.try_admit_owned().unwrap();
        let _ticket = gate.admit_with_callback(Box::new(|_| {}));
        assert_eq!(gate.time_to_next_deadline(), None);
    }
}
