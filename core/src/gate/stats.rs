//! The gate's statistics: the public snapshot ([`GateStats`]) and the
//! counters behind it.

use std::sync::atomic::{AtomicU64 as StatCounter, Ordering};

use crate::counter::ThreadCounter;
use crate::error::Reason;

use super::state::Word;

/// A snapshot of a gate's state and counters.
///
/// The gauges (`running`, `queued`, `limit`, `closed`) come from one atomic
/// read of the state word, so they are mutually consistent; `waiting` and
/// the counters are read one by one and may be a moment apart from them.
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
    /// Admitted requests that have not produced their first response yet
    /// (each holds a wait slot); always 0 without a wait limit.
    pub waiting: u32,
    /// The wait limit `W`, if set.
    pub wait_limit: Option<u32>,
    /// Whether the gate is closed.
    pub closed: bool,
    /// Admission attempts: every `admit*` call and every successful
    /// `try_admit*` (a `try_admit` that would wait neither queues nor is
    /// rejected, so it is not counted). Each attempt is admitted directly,
    /// rejected at once, or queued, so at rest `received` equals admitted +
    /// rejected + cancelled + queued.
    pub received: u64,
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

/// Statistics counters: plain `std` atomics, not the loom shim's, because
/// they order nothing (every access is `Relaxed`) and so need no model
/// checking.
#[derive(Default)]
pub(super) struct Counters {
    /// Bumped on every direct admission and every lock-free rejection, the
    /// hottest paths: per-thread cells instead of a shared locked add.
    pub(super) admitted_direct: ThreadCounter,
    pub(super) rejected_capacity: ThreadCounter,
    pub(super) admitted_queued: StatCounter,
    pub(super) rejected_closed: StatCounter,
    pub(super) expired: StatCounter,
    pub(super) cancelled: StatCounter,
    /// Requests that joined the queue.
    pub(super) enqueued: StatCounter,
    /// Requests rejected on arrival because the gate was closed (a part of
    /// `rejected_closed`, which also counts queued requests `close` refused).
    pub(super) closed_on_arrival: StatCounter,
}

impl Counters {
    /// A snapshot: the gauges from the state word `w` (and the wait count
    /// `waiting` of a gate with wait limit `wait_limit`), then the counters
    /// one by one.
    pub(super) fn snapshot(
        &self,
        w: Word,
        queue_limit: u32,
        waiting: u32,
        wait_limit: Option<u32>,
    ) -> GateStats {
        // Relaxed: statistics, read for display; they order nothing.
        let get = |x: &StatCounter| x.load(Ordering::Relaxed);
        let admitted_direct = self.admitted_direct.get();
        let rejected_at_capacity = self.rejected_capacity.get();
        // Every arrival is admitted directly, rejected at once (at capacity
        // or closed) or queued: a sum of monotonic counters, so it never
        // goes down between two snapshots.
        let received = admitted_direct
            + rejected_at_capacity
            + get(&self.closed_on_arrival)
            + get(&self.enqueued);
        GateStats {
            running: w.running(),
            queued: w.queued(),
            limit: w.limit(),
            queue_limit,
            waiting,
            wait_limit,
            closed: w.closed(),
            received,
            admitted_direct,
            admitted_queued: get(&self.admitted_queued),
            rejected_at_capacity,
            rejected_closed: get(&self.rejected_closed),
            expired: get(&self.expired),
            cancelled: get(&self.cancelled),
        }
    }
}

/// Adds `n` to a shared statistics counter.
#[inline]
pub(super) fn bump(counter: &StatCounter, n: u64) {
    // Relaxed: a statistic; it orders nothing.
    counter.fetch_add(n, Ordering::Relaxed);
}
