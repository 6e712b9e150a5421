//! Priority classes on the lock-free queues: one [`Fifo`](super::fifo::Fifo)
//! per class, each with its own count, behind the state word's total. The
//! paths shared with a one-class gate (a poll, a cancel, expiry, close)
//! are in `queue.rs`; this module gives the counting, admission and
//! handoff that classes change.
//!
//! # The counts
//!
//! * The word's `queued` is the **total**: waiters of every class no slot
//!   is promised to yet. It alone enforces `Q`, and a direct admission
//!   with `queued == 0` still takes one CAS.
//! * Each class `k` has a **count** `c[k]` of its own waiters no slot is
//!   promised to: the count of `k`'s queue in the cancellable-queue
//!   protocol (`fifo.rs`). A promise to `k` takes one off `c[k]` before
//!   resuming `k`'s queue; a leaving waiter of `k` takes one off `c[k]` or,
//!   if it is 0, refuses the slot on its way.
//! * The total rises before a count does (an arrival: total, then its
//!   class) and falls after (a promise, a leave: the class, then the
//!   total), so `total >= Σ c[k]` at every instant.
//!
//! # Admission of class `j`
//!
//! Direct when a slot is free within `j`'s share and nobody is counted in a
//! class `<= j` (no barging within a class or past a more important one).
//! A less important waiter's handoff may be on its way to the same slot:
//! the arrival may take it first, as it would have been handed the slot
//! had it queued just before the release. Otherwise the arrival queues:
//! total `+ 1` (CAS, bounded by `Q`), then `c[j] + 1` (CAS, bounded by
//! `j`'s queue limit; a loss of the race for the class's last place gives
//! the total back), then its push, then a handoff attempt (below): a slot
//! freed while it was on its way is found by one of the two.
//!
//! With the whole queue full, an arrival *displaces* the newest waiter of
//! the least important counted class below its own: that waiter leaves
//! its queue rejected (`Displaced`) and its place passes to the arrival
//! without touching the total (the victim's leave takes one off its
//! class's count only). If a promise had taken that class's last count
//! first, the victim refuses the slot on its way, the total already fell
//! with the promise, and the arrival counts itself again from the top.
//!
//! A full total is not always a full queue: a place may be between its two
//! counts (an arrival counting itself; a promise or a leave taking one
//! off). An arrival that would be refused for a full queue while the
//! counts add up to less than the total waits for that place to settle (a
//! few instructions away) and decides again: refusing it on a place about
//! to come free, or not displacing for it, would match no order of the
//! two operations.
//!
//! # Handoff
//!
//! A releaser that saw waiters, an arrival after its push and a raised
//! limit run the same loop: find the most important class with a counted
//! waiter; *reserve* a slot for it (CAS `running + 1` while the gate is
//! open and the class has room; reserving first keeps concurrent handoffs
//! from promising one slot twice); take one off its count; take one off
//! the total; resume its queue. If the count was taken meanwhile (a leave,
//! another handoff), the reservation is given back and the loop looks
//! again.
//!
//! # Passing a slot
//!
//! A release on a gate with classes and no wait limit first tries to pass
//! its slot on without freeing it: it reads the word (waiters, open), finds
//! the most important counted class, checks that class's room as if the
//! slot were free, takes one off its count and then the total, and resumes
//! its queue. `running` never changes, so no arrival can take the slot in
//! between, and the release needs neither the freeing `fetch_sub` nor the
//! reservation's CAS: the release is linearized at its read of the counts,
//! as a handoff is. If no class can take it, or the count was taken
//! meanwhile, the slot is freed and handed on as above; if the waiter
//! refuses it on its way out, likewise. A freed slot is what an arrival's
//! pairing (below) must not miss; a passed slot is never free. With a
//! wait limit the handoff also needs a wait slot, and takes the general
//! path.
//!
//! # Orderings
//!
//! Counts and the total change by `AcqRel` read-modify-writes, as the queue
//! asks of counting (`queue.rs`). One pairing spans two locations: a
//! slot freed (a release, a refused slot, an undone reservation: each a
//! read-modify-write of the word, then a read of the counts) while an
//! arrival counts itself (a read-modify-write of its class's count, then a
//! read of the word). Plain loads after each would let both miss the
//! other. So the arrival reads the word with a read-modify-write
//! (`fetch_add(0)`, `AcqRel`), and every freeing write of the word is
//! `AcqRel`: the word's modification order puts one before the other. If
//! the arrival's comes first, the freer's write reads from it and
//! synchronizes with it, so the freer's reads of the counts see the
//! arrival's count; otherwise the arrival's read sees the slot freed. A
//! loom model fails without it. (Fences would do as well, but cost a full
//! barrier on the release path.)

use std::cell::Cell;

use crate::sync::{spin_wait, Ordering};

use super::config::MAX_CLASSES;
use super::error::AdmitError;
use super::fifo::Places;
use super::queue::{Enqueued, Waiter};
use super::raw::RawGate;
use super::state::{Word, ONE_QUEUED, ONE_RUNNING};
use super::stats::bump;
use super::tell::Detached;

/// The count a displaced waiter of `class` gives its place back to: its
/// class's count only, so that the place passes to the arrival that
/// displaced it. Records whether it did.
struct Displacing<'a, D> {
    gate: &'a RawGate<D>,
    class: usize,
    passed: Cell<bool>,
}

impl<D: Detached> Places for Displacing<'_, D> {
    fn give_back(&self) -> bool {
        let passed = self.gate.take_counted(self.class);
        self.passed.set(passed);
        passed
    }
}

impl<D: Detached> RawGate<D> {
    /// Class `class`'s count of waiters no slot is promised to.
    #[inline]
    pub(super) fn counted(&self, class: usize) -> u32 {
        // Acquire: pairs with the count's AcqRel changes.
        self.class_counts[class].load(Ordering::Acquire)
    }

    /// The most important class with a counted waiter.
    #[inline]
    fn first_counted(&self) -> Option<usize> {
        (0..self.classes.count).find(|&k| self.counted(k) > 0)
    }

    /// Takes one off `class`'s count if it is above 0.
    pub(super) fn take_counted(&self, class: usize) -> bool {
        // AcqRel: see the module docs. Acquire for each new guess.
        self.class_counts[class]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1))
            .is_ok()
    }

    /// Adds one to `class`'s count if it is below the class's queue limit.
    fn count_in(&self, class: usize) -> bool {
        let limit = self.classes.queue[class];
        // AcqRel: see the module docs. Acquire for each new guess.
        self.class_counts[class]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                (c < limit).then_some(c + 1)
            })
            .is_ok()
    }

    /// A leaving waiter of `class` gives its place back (see [`Places`]):
    /// its class's count, then the total.
    pub(super) fn give_back_counted(&self, class: usize) -> bool {
        if !self.take_counted(class) {
            return false;
        }
        // AcqRel: as every change of the counts (module docs).
        self.state.fetch_sub(ONE_QUEUED, Ordering::AcqRel);
        true
    }

    /// Whether a request of `class` may take a slot at once in word `w`
    /// (module docs): open, room in its share, and nobody counted in its
    /// class or a more important one.
    #[inline]
    pub(super) fn direct_counted(&self, class: usize, w: Word) -> bool {
        !w.closed()
            && self.classes.room(class, w)
            && (w.queued() == 0 || self.first_counted().is_none_or(|k| k > class))
    }

    /// The word and the classes' counts at one instant, from a first read of
    /// the word: `queued` is the counts' sum (the word's total also holds
    /// places between an arrival's two counts), so the gauges add up. The
    /// counts are read between two reads of the word and kept if it did not
    /// change: a count changes without the word only by finishing an
    /// operation that changed the word first (an arrival) or starting one
    /// that changes it after (a promise, a leave), so their sum is then
    /// within the total. After 64 tries that each saw the word change, the
    /// word's total and the last counts, each at most the total.
    pub(super) fn counted_snapshot(&self, mut word: Word) -> (Word, [u32; MAX_CLASSES]) {
        let mut counts = [0; MAX_CLASSES];
        for _ in 0..64 {
            for (k, c) in counts.iter_mut().take(self.classes.count).enumerate() {
                *c = self.counted(k);
            }
            // Acquire: as the first read.
            let again = Word(self.state.load(Ordering::Acquire));
            let sum: u32 = counts.iter().sum();
            if again == word && sum <= word.queued() {
                let w = Word::new(word.running(), sum, word.limit(), word.closed());
                return (w, counts);
            }
            word = again;
        }
        for c in &mut counts {
            *c = (*c).min(word.queued());
        }
        (word, counts)
    }

    /// The classes' counts added up.
    fn all_counted(&self) -> u32 {
        (0..self.classes.count).map(|k| self.counted(k)).sum()
    }

    /// `try_admit` of `class` while someone waits: CAS `running + 1` while
    /// admission is direct; the word seen otherwise.
    pub(super) fn try_direct_counted(&self, class: usize) -> Result<(), Word> {
        let mut wait_held = false;
        if !self.hold_wait(&mut wait_held) {
            // Acquire: as the first load of `take_slot_while`.
            return Err(Word(self.state.load(Ordering::Acquire)));
        }
        self.take_slot_while(|w| self.direct_counted(class, w))
            .inspect_err(|_| self.unhold_wait(&mut wait_held))
    }

    /// The slow part of an admission of `class` on a gate that runs the
    /// counted protocol (module docs).
    pub(super) fn enqueue_counted(&self, class: usize, waiter: Waiter<'_, D>) -> Enqueued<D> {
        // Acquire: as the first load of `enqueue`.
        let mut cur = self.state.load(Ordering::Acquire);
        // Whether we hold a wait slot for a direct admission (`wait.rs`).
        let mut wait_held = false;
        loop {
            let w = Word(cur);
            let direct = self.direct_counted(class, w) && self.hold_wait(&mut wait_held);
            if !direct {
                self.unhold_wait(&mut wait_held);
            }
            if w.closed() {
                return Enqueued::Rejected(self.refuse_closed(class), waiter.into_detached());
            }
            let class_room = self.counted(class) < self.classes.queue[class];
            let new = if direct {
                cur + ONE_RUNNING
            } else if class_room && w.queued() < self.queue_limit {
                cur + ONE_QUEUED
            } else if let Some(victim) = (class + 1..self.classes.count)
                .rev()
                .find(|&k| class_room && self.counted(k) > 0)
            {
                if self.displace(victim) {
                    break; // its place is ours
                }
                // Its class's last waiter was promised a slot, or is still
                // on its way to its push: look again.
                spin_wait();
                // Acquire: as the first load.
                cur = self.state.load(Ordering::Acquire);
                continue;
            } else if class_room && self.all_counted() < w.queued() {
                // A place between its two counts (module docs).
                spin_wait();
                // Acquire: as the first load.
                cur = self.state.load(Ordering::Acquire);
                continue;
            } else if self.expire_for(class) {
                // Acquire: as the first load.
                cur = self.state.load(Ordering::Acquire);
                continue;
            } else {
                return Enqueued::Rejected(AdmitError::AtCapacity, waiter.into_detached());
            };
            match self.commit(cur, new) {
                Ok(true) => return Enqueued::Direct(waiter.into_detached()),
                Ok(false) => break,
                Err(actual) => cur = actual,
            }
        }
        // A place in the total is ours: now one in the class.
        if !self.count_in(class) {
            // Another arrival of the class took its last place meanwhile.
            // AcqRel: as every change of the total.
            self.state.fetch_sub(ONE_QUEUED, Ordering::AcqRel);
            self.counters.class[class].rejected_capacity.add(1);
            return Enqueued::Rejected(AdmitError::AtCapacity, waiter.into_detached());
        }
        let step = self.push(class, waiter);
        if let Enqueued::Queued(..) = step {
            // The arrival's side of the pairing in the module docs: a
            // read-modify-write of the word after its count. AcqRel: see
            // there.
            self.state.fetch_add(0, Ordering::AcqRel);
            self.hand_on_counted();
        }
        step
    }

    /// Displaces the newest waiter of class `victim` for an arrival: true if
    /// its place passed to the arrival (module docs).
    fn displace(&self, victim: usize) -> bool {
        let places = Displacing {
            gate: self,
            class: victim,
            passed: Cell::new(false),
        };
        let Some((told, then)) = self.fifos[victim].reject_newest(AdmitError::Displaced, &places)
        else {
            return false;
        };
        bump(&self.counters.class[victim].displaced, 1);
        self.tell(victim, told, Err(AdmitError::Displaced));
        self.after(victim, then);
        places.passed.get()
    }

    /// A release's slot passed straight to the most important counted
    /// waiter (module docs, "Passing a slot"): true if it went, false if
    /// the caller is to free it.
    pub(super) fn pass_slot(&self) -> bool {
        // Acquire: a guess, as the first load of a handoff; no write of the
        // word follows it unless the slot is freed after all.
        let w = Word(self.state.load(Ordering::Acquire));
        if w.queued() == 0 || w.closed() {
            return false;
        }
        if self.deadlines {
            // Due waiters go first, as in every handoff.
            self.expire();
        }
        if self.lifo_pending() {
            // An expiry's turn for the newest waiter: the general path.
            return false;
        }
        let Some(class) = self.first_counted() else {
            return false;
        };
        // Room for the class once this slot is free, and its count.
        if !self.classes.room(class, Word(w.0 - ONE_RUNNING)) || !self.take_counted(class) {
            return false;
        }
        // AcqRel: as every change of the total.
        self.state.fetch_sub(ONE_QUEUED, Ordering::AcqRel);
        if self.deliver(class) {
            // A leaving waiter refused it: the slot is free after all.
            self.free_slot();
        }
        true
    }

    /// Reserves a slot for class `class`: CAS `running + 1` while the gate
    /// is open and the class has room.
    fn reserve_slot(&self, class: usize) -> bool {
        self.take_slot_while(|w| !w.closed() && self.classes.room(class, w))
            .is_ok()
    }

    /// Hands free slots to the most important classes' oldest waiters
    /// (module docs, "Handoff").
    pub(super) fn hand_on_counted(&self) {
        loop {
            // Every way into this loop is a freeing AcqRel write of the
            // word (a release, a raised limit, an arrival's read-modify-
            // write) or one of the loop's own below: see the module docs.
            let Some(class) = self.first_counted() else {
                return;
            };
            if !self.reserve_slot(class) {
                return;
            }
            if !self.reserve_wait() {
                // Every wait slot taken (`wait.rs`): whoever frees one
                // hands on, unless one came free meanwhile.
                if self.undo_for_waits() {
                    continue;
                }
                return;
            }
            if self.lifo_pending() && self.lifo_grant(class) {
                continue;
            }
            if !self.take_counted(class) {
                // Taken meanwhile: give the reservations back, look again.
                // AcqRel: a freeing write (module docs).
                let _ = self.drop_wait();
                self.state.fetch_sub(ONE_RUNNING, Ordering::AcqRel);
                continue;
            }
            // AcqRel: as every change of the total.
            self.state.fetch_sub(ONE_QUEUED, Ordering::AcqRel);
            if self.deliver(class) {
                // A leaving waiter refused it. AcqRel: a freeing write.
                let _ = self.drop_wait();
                self.state.fetch_sub(ONE_RUNNING, Ordering::AcqRel);
            }
        }
    }
}
