//! The raw gate: the state word, the queues (one per priority class) and
//! the settings the algorithm reads, with its fast paths (direct admission,
//! rejection, release) and its control (`set_limit`, `close`, expiry).
//! [`AdmissionGate`](super::AdmissionGate) is a thin public layer over
//! [`RawGate`]. The queue paths are in `queue.rs`, the classes' counts in
//! `classes.rs`, the wait count in `wait.rs`, the blocking wait in
//! `blocking.rs`.
//!
//! # Orderings
//!
//! * Direct admit CAS: `Acquire` on success, so everything the previous
//!   holder of the slot did before its release happens-before the new holder
//!   runs. Failure and the first load are `Relaxed`: the value is only a CAS
//!   guess or a reason to reject, and rejecting publishes nothing.
//! * Release `fetch_sub`: `Release`, pairing with the admit's `Acquire`, and
//!   `Acquire` for the classes' pairing (`classes.rs`; the same instruction
//!   on x86). A slot handed to a waiter is published by the queue: a promise
//!   (`AcqRel`) passes it on, and the waiter's cell status carries it with
//!   `Release`/`Acquire` (`fifo.rs`).
//! * Counting a waiter, promising it a slot and giving its place back are
//!   `AcqRel` read-modify-writes, ordered as the queue requires
//!   (`queue.rs`).
//! * Statistics counters are `Relaxed`: they order nothing.

use std::sync::atomic::AtomicBool as HintFlag;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::clock::SharedClock;
use crate::sync::{lock, AtomicU32, AtomicU64, Mutex, Ordering};

use super::config::{GateConfig, MAX_CLASSES};
use super::error::AdmitError;
use super::fifo::{CellPool, Fifo};
use super::state::{Word, CLOSED, ONE_RUNNING};
use super::stats::{bump, Counters, GateStats, Gauges};
use super::tell::{Detached, Tell};
use super::waits::Waits;

/// A waiter queued at `enqueued_at` is due once `now` reaches its deadline;
/// exactly at the deadline counts.
#[inline]
pub(super) fn is_due(enqueued_at: u64, timeout: u64, now: u64) -> bool {
    enqueued_at.saturating_add(timeout) <= now
}

/// Waiter cells a class's queue needs room for: its waiters (within the
/// gate's queue limit `queue` and the class's `class_queue`), and as many
/// granted ones not yet looking as the limit allows. The classes share one
/// pool of cells, sized for the whole queue (`class_queue = queue`); each
/// class's segments are sized for its own.
fn queue_cells(queue: u32, class_queue: u32, limit: u32) -> usize {
    (queue.min(class_queue) as usize + limit as usize).max(1)
}

/// Outcome of the inlined part of an admission.
pub(super) enum Fast {
    Admitted,
    Rejected(AdmitError),
    Slow,
}

/// The priority classes' settings, in the arrays' first `count` entries.
pub(super) struct Classes {
    pub(super) count: usize,
    /// Each class's queue limit.
    pub(super) queue: [u32; MAX_CLASSES],
    /// Each class's queue deadline in clock nanoseconds (at least 1).
    pub(super) timeout: [Option<u64>; MAX_CLASSES],
    /// For each class, the largest reservation of a more important class:
    /// the class may take a slot while `running + above < limit`.
    pub(super) above: [u32; MAX_CLASSES],
}

impl Classes {
    fn new(config: &GateConfig) -> Self {
        let classes = config.effective_classes();
        let mut c = Classes {
            count: classes.len(),
            queue: [0; MAX_CLASSES],
            timeout: [None; MAX_CLASSES],
            above: [0; MAX_CLASSES],
        };
        let mut above = 0;
        for (k, class) in classes.iter().enumerate() {
            c.queue[k] = class.queue;
            c.timeout[k] = class.queue_timeout.map(|d| crate::clock::nanos(d).max(1));
            c.above[k] = above;
            above = above.max(class.reserved);
        }
        c
    }

    /// Whether class `k` may take a slot in word `w`: a slot is free within
    /// its share of the limit.
    #[inline(always)]
    pub(super) fn room(&self, k: usize, w: Word) -> bool {
        u64::from(w.running()) + u64::from(self.above[k]) < u64::from(w.limit())
    }
}

/// The state word and the wait count: one cache line, since an admission,
/// a first response and a release of a gate with a wait limit change both,
/// one after the other. Dereferences to the word.
#[repr(C)]
pub(super) struct StateLine {
    word: AtomicU64,
    /// Admitted requests holding a wait slot (0 without a wait limit;
    /// `wait.rs`).
    pub(super) waiting: AtomicU32,
}

impl std::ops::Deref for StateLine {
    type Target = AtomicU64;

    #[inline(always)]
    fn deref(&self) -> &AtomicU64 {
        &self.word
    }
}

/// The state word, the queues and the settings the algorithm reads. `D` is
/// what a detached waiter (a callback) leaves in its cell (`tell.rs`): the
/// public layer's, which this layer never names.
pub(super) struct RawGate<D> {
    /// The packed state word (see `state.rs`), on its own cache line with
    /// the wait count.
    pub(super) state: CachePadded<StateLine>,
    pub(super) counters: CachePadded<Counters>,
    /// The lock-free queues, one per class (`fifo.rs`), sharing one pool of
    /// waiter cells.
    pub(super) fifos: Box<[Fifo<Tell<D>>]>,
    /// With several classes or a wait limit, each class's count of waiters
    /// no slot is promised to yet (`classes.rs`); empty otherwise.
    pub(super) class_counts: Box<[CachePadded<AtomicU32>]>,
    /// The queue-wait histogram.
    pub(super) waits: Waits,
    /// Serializes `set_limit` calls (and the storage they reserve).
    limit_changes: Mutex<()>,
    pub(super) queue_limit: u32,
    pub(super) classes: Classes,
    /// Whether any class has a queue deadline.
    pub(super) deadlines: bool,
    /// The wait limit `W`, if set (`wait.rs`).
    pub(super) wait_limit: Option<u32>,
    /// Whether a release passes its slot to a counted waiter without
    /// freeing it: several classes and no wait limit (`classes.rs`).
    pub(super) passes_slots: bool,
    /// The gate's queue deadline in clock nanoseconds (at least 1), if set
    /// (what the classes copy by default).
    pub(super) timeout: Option<u64>,
    /// Adaptive LIFO: after an expiry, the next slot handed on goes to the
    /// newest waiter (`queue.rs`).
    pub(super) lifo: bool,
    /// Adaptive LIFO's turn: set by an expiry, taken by the next handoff. A
    /// plain `std` atomic: it picks which waiter a slot goes to, and orders
    /// nothing (the queue's own words do).
    pub(super) lifo_next: HintFlag,
    pub(super) clock: SharedClock,
}

impl<D: Detached> RawGate<D> {
    /// The gate `config` describes; the caller has checked it.
    pub(super) fn new(config: &GateConfig, clock: SharedClock) -> Self {
        let (limit, queue) = (config.limit, config.queue);
        let classes = Classes::new(config);
        // One pool of cells for every class: at most `Q` queued and `N`
        // granted ones not yet looking, whatever their classes.
        let pool = Arc::new(CellPool::new(queue_cells(queue, queue, limit)));
        let fifos = (0..classes.count)
            .map(|k| {
                let cells = queue_cells(queue, classes.queue[k], limit);
                Fifo::sharing(Arc::clone(&pool), cells, limit as usize)
            })
            .collect();
        let counted = classes.count > 1 || config.wait_limit.is_some();
        let class_counts = (0..if counted { classes.count } else { 0 })
            .map(|_| CachePadded::new(AtomicU32::new(0)))
            .collect();
        Self {
            state: CachePadded::new(StateLine {
                word: AtomicU64::new(Word::new(0, 0, limit, false).0),
                waiting: AtomicU32::new(0),
            }),
            counters: CachePadded::new(Counters::new(classes.count)),
            fifos,
            class_counts,
            waits: Waits::new(),
            limit_changes: Mutex::new(()),
            queue_limit: queue,
            deadlines: classes.timeout.iter().any(Option::is_some),
            passes_slots: classes.count > 1 && config.wait_limit.is_none(),
            classes,
            wait_limit: config.wait_limit,
            timeout: config.queue_timeout.map(|d| crate::clock::nanos(d).max(1)),
            lifo: config.adaptive_lifo,
            lifo_next: HintFlag::new(false),
            clock,
        }
    }

    /// The state word, for a gauge.
    #[inline]
    pub(super) fn word_relaxed(&self) -> Word {
        // Relaxed: a gauge read for display; the caller orders nothing on it.
        Word(self.state.load(Ordering::Relaxed))
    }

    /// A snapshot of the gauges and counters.
    pub(super) fn stats(&self) -> GateStats {
        // Acquire, pairing with the word's Release/AcqRel writes: what the
        // last writer did before is visible. The counters read after it are
        // Relaxed and may still be a moment apart from the gauges.
        let mut word = Word(self.state.load(Ordering::Acquire));
        let mut class_queued = [0; MAX_CLASSES];
        if self.runs_counted() {
            (word, class_queued) = self.counted_snapshot(word);
        } else {
            class_queued[0] = word.queued();
        }
        self.counters.snapshot(Gauges {
            word,
            queue_limit: self.queue_limit,
            // Relaxed: 0 without a wait limit. A wait slot is taken before
            // and given back before its request slot, so a count read a
            // moment from the word may run ahead of `running`: it is capped
            // there (a moment's spread, as between the counters).
            waiting: self
                .state
                .waiting
                .load(Ordering::Relaxed)
                .min(word.running()),
            wait_limit: self.wait_limit,
            class_queued,
            class_queue: self.classes.queue,
            enqueued: self.fifos.iter().map(Fifo::pushed).sum(),
        })
    }

    // ----- fast paths ------------------------------------------------------

    /// Whether a request of `class` may be admitted at once in word `w`:
    /// open, nobody queued, a slot free within the class's share.
    #[inline(always)]
    pub(super) fn direct(&self, class: usize, w: Word) -> bool {
        !w.closed() && w.queued() == 0 && self.classes.room(class, w)
    }

    /// The class a priority names: past the last class, the last.
    #[inline(always)]
    pub(super) fn class_of(&self, priority: u8) -> usize {
        (priority as usize).min(self.classes.count - 1)
    }

    /// CAS `running + 1` while admission of `class` is direct; the word seen
    /// otherwise. A gate with a wait limit never admits here (a word that is
    /// `direct` comes back as `Err`): it reserves a wait slot first
    /// (`wait.rs`), out of this inlined path.
    #[inline(always)] // the direct-admit hot path; see `try_admit`
    pub(super) fn try_direct(&self, class: usize) -> Result<(), Word> {
        // Relaxed: only a guess for the CAS, or a reason to refuse.
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            let w = Word(cur);
            if !self.direct(class, w) || self.wait_limit.is_some() {
                return Err(w);
            }
            // Acquire on success, pairing with the Release write that freed
            // the slot: its last holder's work happens-before ours. Relaxed
            // on failure: a new guess only.
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

    /// Direct admit or reject at once; `Slow` when it must queue (or, with
    /// a wait limit, may be admitted after reserving a wait slot).
    ///
    /// Rejected at once when no slot is free for the class and it could not
    /// queue: its class never queues, or the whole queue is full and the
    /// class is the least important (it can displace nobody), and no waiter
    /// is due (an expiry would make room).
    #[inline(always)]
    pub(super) fn admit_fast(&self, class: usize) -> Fast {
        match self.try_direct(class) {
            Ok(()) => {
                self.counters.admitted_direct.add(1);
                Fast::Admitted
            }
            Err(w) if w.closed() => Fast::Rejected(self.refuse_closed(class)),
            // No slot in the class's share: none could be taken whatever
            // the wait count or the other classes' waiters.
            Err(w)
                if !self.classes.room(class, w)
                    && (self.classes.queue[class] == 0
                        || (w.queued() >= self.queue_limit
                            && class + 1 == self.classes.count
                            && !self.head_is_due())) =>
            {
                self.counters.class[class].rejected_capacity.add(1);
                Fast::Rejected(AdmitError::AtCapacity)
            }
            Err(_) => Fast::Slow,
        }
    }

    /// Counts an arrival of `class` that a closed gate refuses.
    pub(super) fn refuse_closed(&self, class: usize) -> AdmitError {
        self.counters.closed(class, 1);
        bump(&self.counters.closed_on_arrival, 1);
        AdmitError::Closed
    }

    /// Whether a queued waiter is due (then the slow path expires it before
    /// deciding to reject).
    #[inline]
    fn head_is_due(&self) -> bool {
        self.deadlines
            && self
                .next_deadline()
                .is_some_and(|d| self.clock.now_nanos() >= d)
    }

    /// Gives back one held slot. With classes and no wait limit, it passes
    /// straight to the most important counted waiter when that waiter's
    /// class has room for it (`classes.rs`, "Passing a slot"). Otherwise
    /// one `fetch_sub` that cannot fail (under contention, a load first
    /// would fetch the word's cache line twice); if waiters were counted,
    /// the freed slot is then handed on.
    #[inline]
    pub(super) fn release(&self) {
        if self.passes_slots && self.pass_slot() {
            return;
        }
        self.free_slot();
    }

    /// Frees one held slot and hands it on if waiters were counted.
    #[inline]
    pub(super) fn free_slot(&self) {
        // Release: our use of the slot happens-before its next admission
        // (a direct admitter's Acquire CAS, or a promise's AcqRel).
        // Acquire: with classes, the handoff below must see the count of an
        // arrival whose read-modify-write of the word came before ours
        // (`classes.rs`, "Orderings"); on x86 the same instruction.
        let old = Word(self.state.fetch_sub(ONE_RUNNING, Ordering::AcqRel));
        debug_assert!(old.running() > 0, "release without a held slot");
        if old.queued() > 0 {
            self.hand_on(false);
        }
    }

    /// CAS `running + 1` while `ok` says yes to the word; the word that
    /// said no otherwise. AcqRel: Acquire as an admission (the slot's last
    /// holder's work happens-before ours); Release as a promise of a slot to
    /// the queues. Acquire on failure and for the first read: a new guess
    /// that pairs the same way.
    pub(super) fn take_slot_while(&self, ok: impl Fn(Word) -> bool) -> Result<(), Word> {
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            let w = Word(cur);
            if !ok(w) {
                return Err(w);
            }
            match self.state.compare_exchange(
                cur,
                cur + ONE_RUNNING,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    // ----- control ---------------------------------------------------------

    /// Sets the engine limit (already checked), then expires due waiters
    /// and hands the slots a raised limit frees to the waiters.
    pub(super) fn set_limit(&self, limit: u32) {
        {
            let _serial = lock(&self.limit_changes);
            // Cold path: room for every waiter the new limit may leave
            // granted and not yet looking, and the queue behind them: the
            // cells the classes share, and each class's segments.
            self.fifos[0]
                .cells()
                .reserve(queue_cells(self.queue_limit, self.queue_limit, limit));
            for (class, fifo) in self.fifos.iter().enumerate() {
                fifo.reserve_segments(
                    queue_cells(self.queue_limit, self.classes.queue[class], limit),
                    limit as usize,
                );
            }
            // A CAS loop: releases and arrivals move the word meanwhile.
            // Acquire (load and failure): a guess; AcqRel: Release publishes
            // the slots a raised limit frees to admitters (their Acquire).
            let mut cur = self.state.load(Ordering::Acquire);
            loop {
                let w = Word(cur);
                let new = Word::new(w.running(), w.queued(), limit, w.closed()).0;
                match self
                    .state
                    .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => break,
                    Err(actual) => cur = actual,
                }
            }
        }
        self.hand_on(true);
    }

    /// Sets `closed`, after which nothing is promised and nothing queues,
    /// then rejects queued waiters from the head until the word shows none
    /// counted: a waiter that counted itself before the close and has not
    /// pushed yet is found on a later pass (close waits for that push, a
    /// few instructions away).
    pub(super) fn close(&self) {
        // AcqRel: as any change of `closed`; ordered before the scans.
        self.state.fetch_or(CLOSED, Ordering::AcqRel);
        loop {
            for class in 0..self.classes.count {
                let n = self.reject_from_head(class, AdmitError::Closed, |_| true);
                self.counters.closed(class, n as u64);
            }
            // Acquire: pairs with the counting CAS of a waiter still on its
            // way to its push.
            if Word(self.state.load(Ordering::Acquire)).queued() == 0 {
                return;
            }
            crate::sync::spin_wait();
        }
    }

    /// Rejects every due waiter from each class's head; how many.
    pub(super) fn expire(&self) -> usize {
        if !self.deadlines {
            return 0;
        }
        let now = self.clock.now_nanos();
        let mut total = 0;
        for class in 0..self.classes.count {
            let Some(timeout) = self.classes.timeout[class] else {
                continue;
            };
            let n = self.reject_from_head(class, AdmitError::QueueTimeout, |at| {
                is_due(at, timeout, now)
            });
            self.expired(class, n);
            total += n;
        }
        total
    }

    /// Counts `n` waiters of `class` that expired; with adaptive LIFO, the
    /// next slot handed on goes to the newest waiter.
    pub(super) fn expired(&self, class: usize, n: usize) {
        if n > 0 {
            bump(&self.counters.class[class].expired, n as u64);
            if self.lifo {
                // Relaxed: a choice of waiter, ordering nothing (field docs).
                self.lifo_next.store(true, Ordering::Relaxed);
            }
        }
    }

    /// When the first queued waiter is due, if one is queued in a class
    /// with a deadline.
    pub(super) fn next_deadline(&self) -> Option<u64> {
        (0..self.classes.count)
            .filter_map(|class| {
                let timeout = self.classes.timeout[class]?;
                self.fifos[class]
                    .oldest_enqueued_at()
                    .map(|at| at.saturating_add(timeout))
            })
            .min()
    }
}
