//! The gate's statistics: the public snapshot ([`GateStats`]) and the
//! counters behind it.

use std::sync::atomic::{AtomicU64 as StatCounter, Ordering};

use crate::counter::ThreadCounter;
use crate::error::Reason;

use super::config::MAX_CLASSES;
use super::state::Word;

/// One priority class's part of a [`GateStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClassStats {
    /// Requests of this class waiting in the queue.
    pub queued: u32,
    /// How many of this class may wait.
    pub queue_limit: u32,
    /// Requests of this class rejected because no slot was free for it and
    /// it could not queue.
    pub rejected_at_capacity: u64,
    /// Requests of this class rejected because they waited past its queue
    /// deadline.
    pub expired: u64,
    /// Requests of this class rejected because the gate was closed.
    pub rejected_closed: u64,
    /// Requests of this class that lost their place in the full queue to a
    /// more important arrival.
    pub displaced: u64,
}

impl ClassStats {
    /// All rejections of this class.
    pub fn rejected_total(&self) -> u64 {
        self.rejected_at_capacity + self.expired + self.rejected_closed + self.displaced
    }
}

/// A snapshot of a gate's state and counters.
///
/// The gauges (`running`, `queued`, `limit`, `closed`) come from one atomic
/// read of the state word, so they are mutually consistent. With priority
/// classes (or a wait limit), the classes' `queued` are read between two
/// reads of the state word that agree, and `queued` is their sum: they add
/// up, and `running + queued` stays within `N + Q`; an arrival a few
/// instructions from counting itself in its class shows in neither yet.
/// (Should the word change on each of 64 tries, `queued` is the word's and
/// each class's is at most it.) `waiting` is read a moment after the word
/// and capped at `running`. The counters are read one by one and may be a
/// moment apart from the gauges.
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
    /// Requests that lost their place in the full queue to a more important
    /// arrival.
    pub displaced: u64,
    /// How many priority classes the gate has (1 without classes).
    pub class_count: usize,
    /// Each class's share, in its first `class_count` entries.
    pub classes: [ClassStats; MAX_CLASSES],
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
            Reason::Displaced => self.displaced,
            _ => 0,
        }
    }

    /// All rejections.
    pub fn rejected_total(&self) -> u64 {
        self.rejected_at_capacity + self.expired + self.rejected_closed + self.displaced
    }

    /// The classes' shares.
    pub fn classes(&self) -> &[ClassStats] {
        &self.classes[..self.class_count]
    }
}

/// One class's counters.
#[derive(Default)]
pub(super) struct ClassCounters {
    /// Bumped by lock-free rejections, a hot path: per-thread cells instead
    /// of a shared locked add.
    pub(super) rejected_capacity: ThreadCounter,
    pub(super) rejected_closed: StatCounter,
    pub(super) expired: StatCounter,
    pub(super) displaced: StatCounter,
}

/// Statistics counters: plain `std` atomics, not the loom shim's, because
/// they order nothing (every access is `Relaxed`) and so need no model
/// checking.
pub(super) struct Counters {
    /// Bumped on every direct admission, the hottest path: per-thread cells
    /// instead of a shared locked add.
    pub(super) admitted_direct: ThreadCounter,
    /// Each class's rejections (allocated with the gate).
    pub(super) class: Box<[ClassCounters]>,
    /// Bumped by every handoff to a waiter: per-thread cells too.
    pub(super) admitted_queued: ThreadCounter,
    pub(super) cancelled: StatCounter,
    /// Requests rejected on arrival because the gate was closed (a part of
    /// `rejected_closed`, which also counts queued requests `close` refused).
    pub(super) closed_on_arrival: StatCounter,
}

/// The gauges a snapshot starts from, read together.
pub(super) struct Gauges {
    /// The state word.
    pub(super) word: Word,
    /// The whole queue's limit `Q`.
    pub(super) queue_limit: u32,
    /// The wait count, and the wait limit.
    pub(super) waiting: u32,
    pub(super) wait_limit: Option<u32>,
    /// Each class's queued waiters, and its queue limit.
    pub(super) class_queued: [u32; MAX_CLASSES],
    pub(super) class_queue: [u32; MAX_CLASSES],
    /// Requests that joined the queue: the positions the queues handed out
    /// (every push takes one), so counting them costs nothing.
    pub(super) enqueued: u64,
}

impl Counters {
    /// Counters for a gate of `classes` classes.
    pub(super) fn new(classes: usize) -> Self {
        Self {
            admitted_direct: ThreadCounter::default(),
            class: (0..classes).map(|_| ClassCounters::default()).collect(),
            admitted_queued: ThreadCounter::default(),
            cancelled: StatCounter::default(),
            closed_on_arrival: StatCounter::default(),
        }
    }

    /// Counts `n` requests of `class` rejected because the gate is closed.
    pub(super) fn closed(&self, class: usize, n: u64) {
        bump(&self.class[class].rejected_closed, n);
    }

    /// A snapshot: the gauges `g`, then the counters one by one.
    pub(super) fn snapshot(&self, g: Gauges) -> GateStats {
        // Relaxed: statistics, read for display; they order nothing.
        let get = |x: &StatCounter| x.load(Ordering::Relaxed);
        let admitted_direct = self.admitted_direct.get();
        let mut classes = [ClassStats::default(); MAX_CLASSES];
        for (k, (c, out)) in self.class.iter().zip(&mut classes).enumerate() {
            *out = ClassStats {
                queued: g.class_queued[k],
                queue_limit: g.class_queue[k],
                rejected_at_capacity: c.rejected_capacity.get(),
                expired: get(&c.expired),
                rejected_closed: get(&c.rejected_closed),
                displaced: get(&c.displaced),
            };
        }
        let sum = |f: fn(&ClassStats) -> u64| classes.iter().map(f).sum::<u64>();
        let rejected_at_capacity = sum(|c| c.rejected_at_capacity);
        let w = g.word;
        // Every arrival is admitted directly, rejected at once (at capacity
        // or closed) or queued: a sum of monotonic counters, so it never
        // goes down between two snapshots.
        let received =
            admitted_direct + rejected_at_capacity + get(&self.closed_on_arrival) + g.enqueued;
        GateStats {
            running: w.running(),
            queued: w.queued(),
            limit: w.limit(),
            queue_limit: g.queue_limit,
            waiting: g.waiting,
            wait_limit: g.wait_limit,
            closed: w.closed(),
            received,
            admitted_direct,
            admitted_queued: self.admitted_queued.get(),
            rejected_at_capacity,
            rejected_closed: sum(|c| c.rejected_closed),
            expired: sum(|c| c.expired),
            cancelled: get(&self.cancelled),
            displaced: sum(|c| c.displaced),
            class_count: self.class.len(),
            classes,
        }
    }
}

/// Adds `n` to a shared statistics counter.
#[inline]
pub(super) fn bump(counter: &StatCounter, n: u64) {
    // Relaxed: a statistic; it orders nothing.
    counter.fetch_add(n, Ordering::Relaxed);
}
