//! The raw gate: the state word and the waiter table, and the algorithm that
//! keeps them in step. [`AdmissionGate`](super::AdmissionGate) is a thin
//! public layer over [`RawGate`].
//!
//! Which paths run on the state word alone and which take the mutex is
//! listed in the gate's module docs (`mod.rs`). Below, the methods under
//! "lock-free paths" (and the gauges) touch only atomics; those under
//! "locked paths" and "control" run with `table` locked or lock it.
//!
//! # Orderings
//!
//! * Direct admit CAS: `Acquire` on success, so everything the previous
//!   holder of the slot did before its release happens-before the new holder
//!   runs. Failure and the first load are `Relaxed`: the value is only a CAS
//!   guess or a reason to reject, and rejecting publishes nothing.
//! * Release `fetch_sub`: `Release`, pairing with the admit's `Acquire`.
//!   When it saw waiters, the mutex orders the handoff that follows.
//! * Under the mutex, loads are `Acquire` and every read-modify-write is
//!   `AcqRel`: a slot freed under the lock (release with no waiter left) is
//!   published to lock-free admitters, and the lock holder sees slots freed
//!   lock-free. A slot handed to a waiter is published by its cell's state
//!   word: the resolver fixes the state word, then stores the outcome with
//!   `Release`; the waiter loads it with `Acquire` (`cell.rs`).
//! * A lock-free cancel's `queued - 1` is `Release`, like any lock-free write
//!   of the word; its cell reaches the mutex holders through the cancelled
//!   stack (`cell.rs`), and it marks the head-deadline hint stale
//!   (`Release`, read by `next_deadline` with `Acquire`, which recomputes
//!   the hint under the mutex).
//! * Statistics counters are `Relaxed`: they order nothing.
//! * The head-deadline hint is written under the mutex (`Release`) and read
//!   by the reject path and `next_deadline` (`Acquire`); a stale read only
//!   delays an expiry to the next event, because whatever the hint leads to
//!   (an expiry) is decided again under the mutex.

use std::sync::atomic::AtomicU64 as HintWord;
use std::sync::Arc;
use std::task::{Poll, Waker};

use crossbeam_utils::CachePadded;

use crate::clock::SharedClock;
use crate::sync::{lock, AtomicBool, AtomicU32, AtomicU64, Condvar, Mutex, MutexGuard, Ordering};

use super::cell::{Cells, Status};
use super::config::{GateConfig, MAX_CLASSES};
use super::error::AdmitError;
use super::fifo::{CellPool, Fifo};
use super::future::WakerId;
use super::lockfree::queue_cells;
use super::state::{Word, CLOSED, ONE_QUEUED, ONE_RUNNING};
use super::stats::{bump, Counters, GateStats, Gauges};
use super::table::{Table, Waiter, NIL};
use super::tell::Tell;
use super::waits::Waits;
use super::wake::{Wake, WakeList, WAKE_BATCH};

/// "No waiter queued" in the head-deadline hint.
const NO_DEADLINE: u64 = u64::MAX;

/// Most condition variables a gate keeps; blocking waiters beyond that share
/// them (a shared one is notified with `notify_all`, so sharing only costs
/// spurious wakeups).
const MAX_CONDVARS: usize = 4096;

/// A waiter queued at `enqueued_at` is due once `now` reaches its deadline;
/// exactly at the deadline counts.
#[inline]
pub(super) fn is_due(enqueued_at: u64, timeout: u64, now: u64) -> bool {
    enqueued_at.saturating_add(timeout) <= now
}

/// Cells claimed under the mutex whose outcomes are stored after the state
/// word is fixed: at most what the wake list has room for.
struct Claimed {
    idx: [u32; WAKE_BATCH],
    len: usize,
    room: usize,
}

impl Claimed {
    fn new(wakes: &WakeList) -> Self {
        Self {
            idx: [NIL; WAKE_BATCH],
            len: 0,
            room: wakes.room(),
        }
    }

    fn is_full(&self) -> bool {
        self.len == self.room
    }

    fn push(&mut self, idx: u32) {
        self.idx[self.len] = idx;
        self.len += 1;
    }

    fn as_slice(&self) -> &[u32] {
        &self.idx[..self.len]
    }
}

/// Outcome of the lock-free part of an admission.
pub(super) enum Fast {
    Admitted,
    Rejected(AdmitError),
    Slow,
}

/// Outcome of the locked part of an admission; hands the waiter back when it
/// was not queued, so the caller can use or drop it after unlocking.
pub(super) enum Enqueued {
    Direct(Waiter),
    Rejected(AdmitError, Waiter),
    Queued(u32, u32),
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
    /// Admitted requests holding a wait slot (0 without a wait limit):
    /// changed lock-free on the lock-free queues, under the mutex on the
    /// table (`wait.rs`).
    pub(super) waiting: AtomicU32,
}

impl std::ops::Deref for StateLine {
    type Target = AtomicU64;

    #[inline(always)]
    fn deref(&self) -> &AtomicU64 {
        &self.word
    }
}

/// The state word, the waiter table and the settings the algorithm reads.
pub(super) struct RawGate {
    /// The packed state word (see `state.rs`), on its own cache line with
    /// the wait count.
    pub(super) state: CachePadded<StateLine>,
    pub(super) counters: CachePadded<Counters>,
    /// Clock time at which the head waiter expires, or [`NO_DEADLINE`]. A
    /// plain `std` atomic: a hint whose every use is re-checked under the
    /// mutex, so it carries no ordering the model checker must explore.
    head_deadline: HintWord,
    /// Set by a lock-free cancel (it cannot recompute the hint): the next
    /// `next_deadline` recomputes it under the mutex.
    head_stale: AtomicBool,
    /// The lock-free queues, one per class, for a gate with no adaptive
    /// LIFO (`lockfree.rs`); the table's mutex then only serializes
    /// `set_limit`. Empty for a gate that queues in the table.
    pub(super) fifos: Box<[Fifo<Tell>]>,
    /// On the lock-free queues with several classes or a wait limit, each
    /// class's count of waiters no slot is promised to yet (`classes.rs`);
    /// empty otherwise.
    pub(super) class_counts: Box<[CachePadded<AtomicU32>]>,
    /// The queue-wait histogram.
    pub(super) waits: Waits,
    pub(super) table: Mutex<Table>,
    /// Each waiter cell's status, and the free cells (`cell.rs`).
    pub(super) cells: Cells,
    pub(super) condvars: Box<[Condvar]>,
    pub(super) queue_limit: u32,
    pub(super) classes: Classes,
    /// Whether any class has a queue deadline.
    pub(super) deadlines: bool,
    /// The wait limit `W`, if set (`wait.rs`).
    pub(super) wait_limit: Option<u32>,
    /// The gate's queue deadline in clock nanoseconds (at least 1), if set
    /// (what the classes copy by default).
    pub(super) timeout: Option<u64>,
    adaptive_lifo: bool,
    pub(super) clock: SharedClock,
}

impl RawGate {
    /// The gate `config` describes; the caller has checked it.
    pub(super) fn new(config: &GateConfig, clock: SharedClock) -> Self {
        let (limit, queue) = (config.limit, config.queue);
        let classes = Classes::new(config);
        let lock_free = !config.adaptive_lifo;
        // One pool of cells for every class: at most `Q` queued and `N`
        // granted ones not yet looking, whatever their classes.
        let fifos = if lock_free {
            let pool = Arc::new(CellPool::new(queue_cells(queue, queue, limit)));
            (0..classes.count)
                .map(|k| {
                    let cells = queue_cells(queue, classes.queue[k], limit);
                    Fifo::sharing(Arc::clone(&pool), cells, limit as usize)
                })
                .collect()
        } else {
            Box::default()
        };
        let counted = classes.count > 1 || config.wait_limit.is_some();
        let class_counts = (0..if lock_free && counted {
            classes.count
        } else {
            0
        })
            .map(|_| CachePadded::new(AtomicU32::new(0)))
            .collect();
        // The table's cells, for a gate that queues there.
        let capacity = if lock_free {
            0
        } else {
            queue as usize + limit as usize
        };
        let condvars = (0..capacity.clamp(1, MAX_CONDVARS))
            .map(|_| Condvar::new())
            .collect();
        Self {
            state: CachePadded::new(StateLine {
                word: AtomicU64::new(Word::new(0, 0, limit, false).0),
                waiting: AtomicU32::new(0),
            }),
            counters: CachePadded::new(Counters::new(classes.count)),
            head_deadline: HintWord::new(NO_DEADLINE),
            head_stale: AtomicBool::new(false),
            fifos,
            class_counts,
            waits: Waits::new(),
            table: Mutex::new(Table::new(capacity)),
            cells: Cells::new(capacity),
            condvars,
            queue_limit: queue,
            deadlines: classes.timeout.iter().any(Option::is_some),
            classes,
            wait_limit: config.wait_limit,
            timeout: config.queue_timeout.map(|d| crate::clock::nanos(d).max(1)),
            adaptive_lifo: config.adaptive_lifo,
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
        //
        // On the table, with a wait limit, the word and the wait count are
        // read under the mutex, where the count changes: a consistent pair
        // (`waiting <= running`), because a permit holding a wait slot is
        // released only under the mutex too. The classes' queue lengths
        // live in the table, so a gate with classes reads them under the
        // mutex too, once cancelled cells are unlinked. On the lock-free
        // queues nothing here locks (the wait count is capped below).
        let mut wakes = WakeList::new();
        let t = (!self.lock_free() && (self.wait_limit.is_some() || self.classes.count > 1))
            .then(|| self.drained(lock(&self.table), &mut wakes));
        let mut word = Word(self.state.load(Ordering::Acquire));
        let mut class_queued = [0; MAX_CLASSES];
        match &t {
            Some(t) => class_queued = t.len,
            None if self.runs_counted() => {
                (word, class_queued) = self.counted_snapshot(word);
            }
            None => class_queued[0] = word.queued(),
        }
        let stats = self.counters.snapshot(Gauges {
            word,
            queue_limit: self.queue_limit,
            // Relaxed: under the mutex that orders it, or 0 without a wait
            // limit. On the lock-free queues a wait slot is taken before
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
        });
        drop(t);
        wakes.run(self);
        stats
    }

    // ----- lock-free paths -------------------------------------------------

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
    /// `direct` comes back as `Err`): its wait count lives under the mutex.
    #[inline(always)] // the direct-admit hot path; see `try_admit`
    pub(super) fn try_direct(&self, class: usize) -> Result<(), Word> {
        // Relaxed: only a guess for the CAS, or a reason to refuse.
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            let w = Word(cur);
            if !self.direct(class, w) || self.wait_limit.is_some() {
                return Err(w);
            }
            // Acquire on success, pairing with the Release (fast) or AcqRel
            // (locked) write that freed the slot: its last holder's work
            // happens-before ours. Relaxed on failure: a new guess only.
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
    ///
    /// Rejected without the lock when no slot is free for the class and it
    /// could not queue: its class never queues, or the whole queue is full
    /// and the class is the least important (it can displace nobody).
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
                            && !self.head_due_hint())) =>
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

    /// Whether the head waiter may be due (then the slow path expires it
    /// before deciding to reject).
    #[inline]
    fn head_due_hint(&self) -> bool {
        if !self.deadlines {
            return false;
        }
        let due = if self.lock_free() {
            self.lf_next_deadline()
        } else {
            // Acquire, pairing with the Release in `sync_head`; the slow path
            // re-checks under the mutex, so a stale value costs only a delay.
            Some(self.head_deadline.load(Ordering::Acquire)).filter(|&d| d != NO_DEADLINE)
        };
        due.is_some_and(|d| self.clock.now_nanos() >= d)
    }

    /// Gives back one slot: one `fetch_sub`, whatever the queue. If someone
    /// was queued, the slot is then handed on: through the lock-free queue
    /// ([`lf_release`](Self::lf_release)), or under the mutex
    /// ([`grant_waiting`](Self::grant_waiting)).
    #[inline]
    pub(super) fn release_slot(&self) {
        if self.lock_free() {
            return self.lf_release();
        }
        // Release, pairing with the next admitter's Acquire (direct CAS, or a
        // load under the mutex): our use of the slot happens-before its next
        // admit. An unconditional subtraction, not a CAS loop: under
        // contention a CAS would fail and retry, and what the old value says
        // about the queue is only a reason to take the mutex, which orders
        // the rest.
        let old = Word(self.state.fetch_sub(ONE_RUNNING, Ordering::Release));
        debug_assert!(old.running() > 0, "release without a held slot");
        if old.queued() > 0 {
            // The slot is free while someone waits (invariant 4 waits for
            // us): no direct admission can take it (`queued > 0`), and we
            // now hand it to the oldest waiter of the first class with room.
            self.grant_waiting(false);
        }
    }

    /// The head-deadline hint, or `None` when nobody is queued.
    pub(super) fn next_deadline(&self) -> Option<u64> {
        if self.lock_free() {
            return self.lf_next_deadline();
        }
        // Acquire, pairing with the Release in `cancelled`: the cells it
        // cancelled are seen as such.
        if self.deadlines && self.head_stale.swap(false, Ordering::Acquire) {
            let mut wakes = WakeList::new();
            let mut t = self.drained(lock(&self.table), &mut wakes);
            for k in 0..self.classes.count {
                self.purge(&mut t, k, false);
            }
            self.sync_head(&t);
            drop(t);
            wakes.run(self);
        }
        // Acquire, pairing with the Release in `sync_head`; the caller acts
        // on it only through `expire`, which re-checks under the mutex.
        let d = self.head_deadline.load(Ordering::Acquire);
        (d != NO_DEADLINE).then_some(d)
    }

    // ----- locked paths ----------------------------------------------------

    /// CAS loop for changes under the mutex (`running` may still move
    /// lock-free while `queued == 0`).
    pub(super) fn update(&self, f: impl Fn(Word) -> Word) {
        // Acquire (load and CAS failure): sees slots freed lock-free, pairing
        // with the fast release's Release.
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            let new = f(Word(cur)).0;
            // AcqRel: Acquire as above; Release publishes slots this change
            // frees to lock-free admitters (their Acquire CAS).
            match self
                .state
                .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// CAS `running + 1` while `ok` says yes to the word; the word that
    /// said no otherwise. AcqRel: Acquire as an admission (the slot's last
    /// holder's work happens-before ours); Release as every write under
    /// the mutex, and as a promise of a slot to the lock-free queues.
    /// Acquire on failure and for the first read: a new guess that pairs
    /// the same way.
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

    /// The locked part of an admission of `class`.
    pub(super) fn enqueue(&self, class: usize, waiter: Waiter, wakes: &mut WakeList) -> Enqueued {
        if self.lock_free() {
            return self.lf_enqueue(class, waiter);
        }
        // The queue lengths below count only live waiters once the
        // cancelled cells are unlinked.
        let mut t = self.drained(lock(&self.table), wakes);
        // Acquire: pairs with the fast release's Release (a slot freed
        // lock-free is seen, and its holder's work happens-before ours).
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            let w = Word(cur);
            if w.closed() {
                return Enqueued::Rejected(self.refuse_closed(class), waiter);
            }
            // Nobody of this class or a more important one waits (a slot
            // `set_limit` has not handed out yet is theirs, not ours).
            let first = self.first_in_line(&mut t, class);
            if first && self.classes.room(class, w) && self.wait_free() {
                // AcqRel on success: Acquire as for a direct admit; Release
                // is the rule for every RMW under the mutex. Acquire on
                // failure: the next guess pairs like the load above.
                match self.state.compare_exchange(
                    cur,
                    cur + ONE_RUNNING,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        self.take_wait();
                        self.counters.admitted_direct.add(1);
                        return Enqueued::Direct(waiter);
                    }
                    Err(actual) => {
                        cur = actual;
                        continue;
                    }
                }
            }
            let class_full = t.len[class] >= self.classes.queue[class];
            let victim = if w.queued() >= self.queue_limit {
                // The whole queue is full: the newest waiter of the least
                // important class below this one gives up its place.
                (class + 1..self.classes.count).rev().find(|&k| {
                    self.purge(&mut t, k, true);
                    t.tail[k] != NIL
                })
            } else {
                None
            };
            if class_full || (w.queued() >= self.queue_limit && victim.is_none()) {
                let now = self.clock.now_nanos();
                // (A class that never queues gains nothing from expiry; it
                // is rejected as on the lock-free path.)
                if self.deadlines && self.classes.queue[class] > 0 && self.head_is_due(&mut t, now)
                {
                    // Make room by expiring every due waiter, one wake
                    // batch at a time: waiters are told outside the lock.
                    loop {
                        if wakes.is_full() {
                            drop(t);
                            wakes.run(self);
                            t = lock(&self.table);
                        }
                        self.expire_locked(&mut t, now, wakes);
                        if !self.head_is_due(&mut t, now) {
                            break;
                        }
                    }
                    // Acquire: as the first load of this loop.
                    cur = self.state.load(Ordering::Acquire);
                    continue;
                }
                self.counters.class[class].rejected_capacity.add(1);
                return Enqueued::Rejected(AdmitError::AtCapacity, waiter);
            }
            if let Some(k) = victim {
                if wakes.is_full() {
                    drop(t);
                    wakes.run(self);
                    t = lock(&self.table);
                    // Acquire: as the first load of this loop.
                    cur = self.state.load(Ordering::Acquire);
                    continue;
                }
                // The place passes from the victim to us: `queued` is
                // unchanged, so the word is not written.
                let idx = t.tail[k];
                let claimed = self.cells.claim(idx);
                t.unlink(idx);
                if !claimed {
                    // Its owner cancelled it just now: look again.
                    // Acquire: as the first load of this loop.
                    cur = self.state.load(Ordering::Acquire);
                    continue;
                }
                let now = self.clock.now_nanos();
                self.resolve(&mut t, idx, Err(AdmitError::Displaced), now, wakes);
                bump(&self.counters.class[k].displaced, 1);
                bump(&self.counters.enqueued, 1);
                let (idx, gen) = self.link(&mut t, class, now, waiter);
                self.sync_head(&t);
                return Enqueued::Queued(idx, gen);
            }
            // CAS, not fetch_add: `running` may move lock-free while queued
            // is 0, and we queue only if no slot is free. AcqRel / Acquire:
            // the rule for RMWs under the mutex (a lost race re-reads a slot
            // freed lock-free with Acquire, pairing with its Release).
            match self.state.compare_exchange(
                cur,
                cur + ONE_QUEUED,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    bump(&self.counters.enqueued, 1);
                    let now = self.clock.now_nanos();
                    let (idx, gen) = self.link(&mut t, class, now, waiter);
                    if t.head[class] == idx {
                        self.sync_head(&t);
                    }
                    return Enqueued::Queued(idx, gen);
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Gives back a permit's slot and the wait slot it still holds (a gate
    /// with a wait limit), under the mutex: both go to the next waiter
    /// together, or back to the gate.
    #[cold]
    #[inline(never)]
    pub(super) fn release_with_wait(&self) {
        self.in_batches(|t, wakes| self.release_with_wait_locked(t, wakes));
    }

    /// Runs `batch` with the mutex held until it returns true (done), telling
    /// the waiters each run resolved after unlocking: one wake batch per
    /// hold of the lock.
    pub(super) fn in_batches(&self, mut batch: impl FnMut(&mut Table, &mut WakeList) -> bool) {
        loop {
            let mut wakes = WakeList::new();
            let mut t = lock(&self.table);
            let done = batch(&mut t, &mut wakes);
            drop(t);
            wakes.run(self);
            if done {
                return;
            }
        }
    }

    /// Hands the slot and the wait slot to the next live waiter, or gives
    /// them back. False when the wake list filled with expired waiters first
    /// (call again; nothing was given back yet).
    fn release_with_wait_locked(&self, t: &mut Table, wakes: &mut WakeList) -> bool {
        // Acquire: the rule for loads under the mutex (pairs with the
        // lock-free release's Release).
        let w = Word(self.state.load(Ordering::Acquire));
        debug_assert!(w.running() > 0, "release without a held slot");
        if w.queued() > 0 && !w.closed() {
            let now = self.clock.now_nanos();
            if self.deadlines {
                self.expire_locked(t, now, wakes);
                if self.head_is_due(t, now) {
                    return false;
                }
            }
            // The most important class with a waiter, if the slot freed
            // (`running - 1`) is within its share. (`running` may only fall
            // meanwhile: a lock-free release; never rise while `queued > 0`.)
            let freed = Word(w.0 - ONE_RUNNING);
            if let Some(class) = self.live_class(t).filter(|&k| self.classes.room(k, freed)) {
                if wakes.is_full() {
                    return false;
                }
                let Some(idx) = self.claim_next(t, class) else {
                    return false; // cancelled meanwhile: look again
                };
                // The slot and the wait slot move to the waiter: `running`
                // and the wait count unchanged. AcqRel: the rule for RMWs
                // under the mutex. The word first (see `grant`).
                self.state.fetch_sub(ONE_QUEUED, Ordering::AcqRel);
                self.grant(t, idx, now, wakes);
                self.sync_head(t);
                return true;
            }
        }
        self.put_wait();
        // AcqRel: the Release half publishes the slot to lock-free admitters
        // (pairing with their Acquire CAS). Waiters that could not take it
        // (no room in their class's share) stay queued, as they would have.
        self.state.fetch_sub(ONE_RUNNING, Ordering::AcqRel);
        true
    }

    /// Claims and unlinks the next live waiter of `class` (oldest, or newest
    /// once after an expiry with adaptive LIFO), skipping cells whose owners
    /// cancelled them; `None` if it has none left.
    pub(super) fn claim_next(&self, t: &mut Table, class: usize) -> Option<u32> {
        let idx = self.claim_end(t, class, t.lifo_next);
        if idx.is_some() {
            t.lifo_next = false;
        }
        idx
    }

    /// Claims and unlinks the live waiter at the head (or tail) of `class`'s
    /// list, skipping cells whose owners cancelled them.
    fn claim_end(&self, t: &mut Table, class: usize, from_tail: bool) -> Option<u32> {
        loop {
            self.purge(t, class, from_tail);
            let idx = if from_tail {
                t.tail[class]
            } else {
                t.head[class]
            };
            if idx == NIL {
                return None;
            }
            let claimed = self.cells.claim(idx);
            t.unlink(idx);
            if claimed {
                return Some(idx);
            }
        }
    }

    /// Grants a claimed, unlinked waiter its slot. The caller fixes the word
    /// *before*: once the cell says granted, its owner may run and release
    /// the slot without the mutex, and that release must find the slot
    /// counted in `running`.
    pub(super) fn grant(&self, t: &mut Table, idx: u32, now: u64, wakes: &mut WakeList) {
        self.resolve(t, idx, Ok(()), now, wakes);
        bump(&self.counters.admitted_queued, 1);
    }

    /// Unlinks the cancelled cells at the head (or tail) of `class`'s list;
    /// the cancelled stack frees them. So the list's end is a live waiter
    /// or nothing.
    pub(super) fn purge(&self, t: &mut Table, class: usize, from_tail: bool) {
        loop {
            let idx = if from_tail {
                t.tail[class]
            } else {
                t.head[class]
            };
            if idx == NIL || self.cells.load(idx).1 != Status::Cancelled {
                return;
            }
            t.unlink(idx);
        }
    }

    /// The most important class with a live waiter.
    pub(super) fn live_class(&self, t: &mut Table) -> Option<usize> {
        (0..self.classes.count).find(|&k| {
            self.purge(t, k, false);
            t.head[k] != NIL
        })
    }

    /// Whether nobody of `class` or a more important one waits (a slot a
    /// waiter is owed is theirs, not a newcomer's).
    pub(super) fn first_in_line(&self, t: &mut Table, class: usize) -> bool {
        (0..=class).all(|k| {
            self.purge(t, k, false);
            t.head[k] == NIL
        })
    }

    /// The table with every cancelled cell unlinked and freed (so that the
    /// lists and their lengths hold only live waiters), telling the wake
    /// list to drop what the cells held, one batch at a time.
    pub(super) fn drained<'a>(
        &'a self,
        mut t: MutexGuard<'a, Table>,
        wakes: &mut WakeList,
    ) -> MutexGuard<'a, Table> {
        while let Some(idx) = self.cells.take_cancelled() {
            if t.cells[idx as usize].linked {
                t.unlink(idx);
            }
            let waiter = t.take_waiter(idx);
            self.cells.free(idx);
            if !matches!(waiter, Waiter::None | Waiter::Task(None)) {
                if wakes.is_full() {
                    drop(t);
                    wakes.run(self);
                    t = lock(&self.table);
                }
                wakes.push(Wake::Discard(waiter));
            }
        }
        t
    }

    /// Takes a free cell and links it at the tail of `class`'s queue, as
    /// queued; its index and generation.
    pub(super) fn link(&self, t: &mut Table, class: usize, now: u64, waiter: Waiter) -> (u32, u32) {
        let idx = self.cells.take().expect("waiter cells exceed u32 indices");
        let gen = self.cells.queue(idx);
        t.push_back(idx, class, now, waiter);
        (idx, gen)
    }

    /// Marks a claimed, unlinked waiter granted or rejected and lists whom to
    /// tell. A callback's cell is freed at once (its owner never looks).
    pub(super) fn resolve(
        &self,
        t: &mut Table,
        idx: u32,
        outcome: Result<(), AdmitError>,
        now: u64,
        wakes: &mut WakeList,
    ) {
        if outcome.is_ok() {
            let waited = now.saturating_sub(t.cells[idx as usize].enqueued_at);
            self.waits.record(waited);
        }
        // Everything we need from the cell first: once it says resolved, its
        // owner may free it.
        let waiter = t.take_waiter(idx);
        self.cells.resolve(idx, outcome);
        match waiter {
            Waiter::Task(Some(waker)) => wakes.push(Wake::Task(waker)),
            Waiter::Thread => wakes.push(Wake::Thread(idx as usize % self.condvars.len())),
            Waiter::Callback(callback, gate) => {
                self.cells.free(idx);
                wakes.push(Wake::Callback {
                    callback,
                    gate,
                    outcome,
                });
            }
            Waiter::Task(None) | Waiter::None => {}
        }
    }

    /// Rejects due waiters from each class's head, as many as the wake list
    /// holds.
    pub(super) fn expire_locked(&self, t: &mut Table, now: u64, wakes: &mut WakeList) -> u32 {
        // Acquire: the rule for loads under the mutex (`closed` itself only
        // changes under it).
        if !self.deadlines || Word(self.state.load(Ordering::Acquire)).closed() {
            return 0;
        }
        let mut due = Claimed::new(wakes);
        for class in 0..self.classes.count {
            let Some(timeout) = self.classes.timeout[class] else {
                continue;
            };
            let before = due.len;
            while !due.is_full() {
                self.purge(t, class, false);
                let idx = t.head[class];
                if idx == NIL || !is_due(t.cells[idx as usize].enqueued_at, timeout, now) {
                    break;
                }
                let claimed = self.cells.claim(idx);
                t.unlink(idx);
                if claimed {
                    due.push(idx);
                }
            }
            bump(
                &self.counters.class[class].expired,
                (due.len - before) as u64,
            );
        }
        let n = due.len as u32;
        if n > 0 {
            // The word first, then the outcomes (as for a grant): an owner
            // that sees its rejection finds its place already given back.
            // An RMW: lock-free releases and cancels may change the word
            // meanwhile. AcqRel: the rule for RMWs under the mutex.
            self.state
                .fetch_sub(u64::from(n) * ONE_QUEUED, Ordering::AcqRel);
            for &idx in due.as_slice() {
                self.resolve(t, idx, Err(AdmitError::QueueTimeout), now, wakes);
            }
            if self.adaptive_lifo {
                t.lifo_next = true;
            }
            self.sync_head(t);
        }
        n
    }

    /// The clock time at which the head waiter of `class` is due, if it has
    /// one and a deadline.
    fn head_deadline_of(&self, t: &Table, class: usize) -> Option<u64> {
        let timeout = self.classes.timeout[class]?;
        let head = t.head[class];
        (head != NIL).then(|| t.cells[head as usize].enqueued_at.saturating_add(timeout))
    }

    /// Whether a class's head waiter is past its deadline (and the gate is
    /// open). Unlinks cancelled heads first: their deadlines do not count.
    pub(super) fn head_is_due(&self, t: &mut Table, now: u64) -> bool {
        self.deadlines
            && (0..self.classes.count).any(|k| {
                self.purge(t, k, false);
                self.head_deadline_of(t, k).is_some_and(|d| d <= now)
            })
            // Acquire: the rule for loads under the mutex.
            && !Word(self.state.load(Ordering::Acquire)).closed()
    }

    /// Publishes the earliest deadline of the classes' head waiters for the
    /// lock-free reject path.
    pub(super) fn sync_head(&self, t: &Table) {
        if self.deadlines {
            let d = (0..self.classes.count)
                .filter_map(|k| self.head_deadline_of(t, k))
                .min()
                .unwrap_or(NO_DEADLINE);
            // Release, pairing with the Acquire in `head_due_hint` and
            // `next_deadline`.
            self.head_deadline.store(d, Ordering::Release);
        }
    }

    /// A queued future's poll, without the mutex unless its waker changed:
    /// its outcome (the cell is freed), or `Pending`. `registered` names the
    /// waker the cell holds; a different one is swapped in under the mutex.
    /// Out of line: inlined into the futures' poll, its register pressure
    /// taxed their first poll, the direct admission and the rejection.
    #[inline(never)]
    pub(super) fn poll_cell(
        &self,
        idx: u32,
        registered: &mut WakerId,
        waker: &Waker,
    ) -> Poll<Result<(), AdmitError>> {
        if self.lock_free() {
            return self.lf_poll(idx, waker);
        }
        if let Some(outcome) = self.cells.load(idx).1.outcome() {
            self.cells.free(idx);
            return Poll::Ready(outcome);
        }
        let id = WakerId::of(waker);
        if *registered == id {
            // The cell's waker wakes this task: a resolver that has not
            // stored the outcome yet will wake it after it does.
            return Poll::Pending;
        }
        let mut t = lock(&self.table);
        // Under the mutex no resolver runs, so the status read now holds
        // until we unlock.
        if let Some(outcome) = self.cells.load(idx).1.outcome() {
            drop(t);
            self.cells.free(idx);
            return Poll::Ready(outcome);
        }
        let stale = match &mut t.cells[idx as usize].waiter {
            Waiter::Task(slot) => slot.replace(waker.clone()),
            _ => None,
        };
        drop(t);
        drop(stale); // a waker's drop may run executor code: unlocked
        *registered = id;
        Poll::Pending
    }

    /// A future gives up its cell, without the mutex: leaves the queue (its
    /// cell is cancelled and its place given back at once; a later mutex
    /// holder unlinks and frees the cell), or passes on a slot it was
    /// granted but never took. The one wait: a cell a resolver has claimed
    /// but not resolved yet, whose outcome the mutex holder is about to
    /// store; the cancel takes the mutex once to let it finish.
    pub(super) fn cancel_cell(&self, idx: u32, gen: u32) {
        if self.lock_free() {
            self.lf_cancel(idx, gen);
            return;
        }
        loop {
            let (gen, status) = self.cells.load(idx);
            match status {
                Status::Queued => {
                    if self.cells.cancel(idx, gen) {
                        self.cancelled();
                        return;
                    }
                }
                Status::Claimed => drop(lock(&self.table)),
                Status::Granted => {
                    self.cells.free(idx);
                    // A granted waiter holds a wait slot too when the gate
                    // has a wait limit.
                    self.release_held(self.wait_limit.is_some());
                    return;
                }
                Status::Rejected(_) => {
                    self.cells.free(idx);
                    return;
                }
                Status::Free | Status::Cancelled => {
                    unreachable!("cancelled a cell it does not own")
                }
            }
        }
    }

    /// A waiter that cancelled its cell gives back its place in the queue.
    fn cancelled(&self) {
        // Release: nothing to publish but the count; a plain RMW, as any
        // lock-free change of the word. (The cell itself was handed to the
        // mutex holders by the cancelled stack's Release push.)
        self.state.fetch_sub(ONE_QUEUED, Ordering::Release);
        bump(&self.counters.cancelled, 1);
        if self.deadlines {
            // Release, pairing with `next_deadline`'s Acquire.
            self.head_stale.store(true, Ordering::Release);
        }
    }

    /// Unlinks a queued waiter that gives up under the mutex (a callback
    /// ticket's cancel, a blocking wait's own timeout).
    pub(super) fn unqueue_locked(&self, t: &mut Table, idx: u32) {
        t.unlink(idx);
        // An RMW: lock-free releases may lower `running` meanwhile.
        // AcqRel: the rule for RMWs under the mutex.
        self.state.fetch_sub(ONE_QUEUED, Ordering::AcqRel);
        bump(&self.counters.cancelled, 1);
        self.sync_head(t);
    }

    /// A callback ticket's cancel: true if the request was still queued
    /// (its callback will not be called). Under the mutex, unlike a
    /// future's: the callback holds a handle to the gate, a cycle that must
    /// end with the cancel, not with whichever operation next drains the
    /// cancelled stack (a gate nobody uses again would never be dropped).
    pub(super) fn cancel_callback(&self, idx: u32, gen: u32) -> bool {
        if self.lock_free() {
            return self.lf_cancel_callback(idx, gen);
        }
        let mut t = lock(&self.table);
        if !self.cells.mark_cancelled(idx, gen) {
            return false;
        }
        self.unqueue_locked(&mut t, idx);
        let stale = t.take_waiter(idx);
        self.cells.free(idx);
        drop(t);
        drop(stale); // the callback and its gate handle: dropped unlocked
        true
    }

    /// Whether a callback request is still queued (no lock).
    pub(super) fn callback_queued(&self, idx: u32, gen: u32) -> bool {
        if self.lock_free() {
            return self.lf_queued(idx, gen);
        }
        self.cells.load(idx) == (gen, Status::Queued)
    }

    /// Notifies the condition variable of blocked waiters (after unlocking).
    pub(super) fn notify_thread(&self, cv: usize) {
        self.condvars[cv].notify_all();
    }

    // ----- control ---------------------------------------------------------

    /// Sets the engine limit (already checked), granting the slots it frees
    /// to waiters (see [`grant_waiting`](Self::grant_waiting)).
    pub(super) fn set_limit(&self, limit: u32) {
        if self.lock_free() {
            return self.lf_set_limit(limit);
        }
        {
            let mut t = lock(&self.table);
            if t.cells.capacity() < self.queue_limit as usize + limit as usize {
                // Cold path: room for every waiter that may be granted at once.
                t.reserve_total(self.queue_limit as usize + limit as usize);
                self.cells
                    .reserve(self.queue_limit as usize + limit as usize);
            }
            self.update(|w| Word::new(w.running(), w.queued(), limit, w.closed()));
        }
        self.grant_waiting(true);
    }

    /// Hands free slots to waiters, most important class first, one wake
    /// batch at a time, after expiring due waiters: what a release that
    /// found someone queued, and a raised limit, leave to do. A release
    /// expires only if a wait slot is free (a handoff could follow), a
    /// new limit always (`always_expire`). Between
    /// batches, waiters still owed a slot keep it from arrivals: a direct
    /// admission under the mutex checks that nobody of its class or a more
    /// important one waits, and a lock-free one that nobody waits at all.
    #[cold]
    #[inline(never)]
    pub(super) fn grant_waiting(&self, always_expire: bool) {
        self.in_batches(|t, wakes| {
            let now = self.clock.now_nanos();
            let expire = self.deadlines && (always_expire || self.wait_free());
            if expire {
                self.expire_locked(t, now, wakes);
                if self.head_is_due(t, now) {
                    return false; // the wake list filled: another batch
                }
            }
            let done = loop {
                // Acquire: the rule for loads under the mutex.
                let w = Word(self.state.load(Ordering::Acquire));
                if w.closed() || !self.wait_free() {
                    break true;
                }
                let Some(class) = self.live_class(t).filter(|&k| self.classes.room(k, w)) else {
                    break true;
                };
                if wakes.is_full() {
                    break false;
                }
                let Some(idx) = self.claim_next(t, class) else {
                    continue; // cancelled meanwhile: look again
                };
                // A CAS loop: `running` may fall meanwhile (a lock-free
                // release), never rise (`queued > 0`), so the room seen
                // above is still there. The word first (see `grant`).
                self.update(|w| Word::new(w.running() + 1, w.queued() - 1, w.limit(), w.closed()));
                self.take_wait();
                self.grant(t, idx, now, wakes);
            };
            self.sync_head(t);
            done
        });
    }

    /// Sets `closed` and rejects every queued waiter, one wake batch at a
    /// time.
    pub(super) fn close(&self) {
        if self.lock_free() {
            return self.lf_close();
        }
        self.in_batches(|t, wakes| {
            // AcqRel: the rule for RMWs under the mutex.
            self.state.fetch_or(CLOSED, Ordering::AcqRel);
            let mut refused = Claimed::new(wakes);
            while !refused.is_full() {
                let Some(class) = self.live_class(t) else {
                    break;
                };
                if let Some(idx) = self.claim_end(t, class, false) {
                    self.counters.closed(class, 1);
                    refused.push(idx);
                }
            }
            if refused.len > 0 {
                // The word first, then the outcomes (see `expire_locked`).
                // AcqRel: the rule for RMWs under the mutex.
                self.state
                    .fetch_sub(refused.len as u64 * ONE_QUEUED, Ordering::AcqRel);
                for &idx in refused.as_slice() {
                    self.resolve(t, idx, Err(AdmitError::Closed), 0, wakes);
                }
            }
            self.sync_head(t);
            self.live_class(t).is_none()
        });
    }

    /// Rejects every due waiter, one wake batch at a time; how many.
    pub(super) fn expire(&self) -> usize {
        if !self.deadlines {
            return 0;
        }
        if self.lock_free() {
            return self.lf_expire();
        }
        let mut total = 0;
        self.in_batches(|t, wakes| {
            let now = self.clock.now_nanos();
            total += self.expire_locked(t, now, wakes) as usize;
            !self.head_is_due(t, now)
        });
        total
    }
}
