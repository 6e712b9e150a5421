//! Scanning a queue for its waiters: the oldest and newest queued cells,
//! and the rejections made from either end (a queue deadline and close from
//! the oldest, displacement from the newest).

use crate::sync::Ordering;

use super::words::*;
use super::{AdmitError, Fifo, Places, Then, Told, SEG};

impl<T: Default> Fifo<T> {
    /// The oldest queued cell at a position `from` or later: its position,
    /// cell and generation. A cell resolved meanwhile is left to whoever
    /// acts on it (a [`leave`](Self::leave) on it returns `None`).
    pub(in crate::gate) fn next_queued(&self, from: u64) -> Option<(u64, u32, u32)> {
        // Acquire: see the orderings; the hint is read before `deq`.
        let hint = self.head.load(Ordering::Acquire);
        let mut p = from.max(self.deq.load(Ordering::Acquire));
        let end = self.enq.load(Ordering::Acquire);
        while p < end {
            let Some(seg) = self.locate_quiet(p, hint) else {
                p = (p / SEG as u64 + 1) * SEG as u64;
                continue;
            };
            if let Some((cell, gen)) = self.queued_at(p, seg) {
                return Some((p, cell, gen));
            }
            p += 1;
        }
        None
    }

    /// Rejects queued waiters from the oldest on with `reason`, while `due`
    /// says yes to their queue time, at most `max` of them: a queue
    /// deadline (`due` compares with the deadline; the scan stops at the
    /// first waiter not due, since later ones came later) or a close (`due`
    /// always true). Each rejected cell, and what the caller must do after
    /// its leaving, goes to `told`. How many were rejected.
    ///
    /// Enqueue times follow positions only as closely as the clock reads
    /// before taking a position do: a waiter due a moment before one ahead
    /// of it waits for the next call.
    pub(in crate::gate) fn reject_from_head(
        &self,
        reason: AdmitError,
        due: impl Fn(u64) -> bool,
        max: usize,
        places: &impl Places,
        mut told: impl FnMut(Told, Then),
    ) -> usize {
        let mut n = 0;
        let mut from = 0;
        while n < max {
            let Some((p, cell, gen)) = self.next_queued(from) else {
                break;
            };
            from = p + 1;
            let w = self.cells.get(cell);
            // Relaxed: written before the Queued status `next_queued` read
            // with Acquire; checked against a reuse of the cell below.
            let at = w.enqueued_at.load(Ordering::Relaxed);
            if self.status(cell) != (gen, Status::Queued) {
                continue; // resolved meanwhile: `at` may be another's
            }
            if !due(at) {
                break;
            }
            if let Some((then, who)) = self.leave_told(cell, gen, Status::Rejected(reason), places)
            {
                n += 1;
                told(who, then);
            }
        }
        n
    }

    /// The newest queued cell: its position, cell and generation (as
    /// [`next_queued`](Self::next_queued), scanning from the newest
    /// position back). For displacement, which takes the newest waiter of
    /// a class.
    pub(in crate::gate) fn newest_queued(&self) -> Option<(u64, u32, u32)> {
        // Acquire: see the orderings; the hint is read before `deq`.
        let hint = self.head.load(Ordering::Acquire);
        let first = self.deq.load(Ordering::Acquire);
        let mut p = self.enq.load(Ordering::Acquire);
        // The segment of the positions being scanned: one lookup each.
        let mut segment: Option<(u64, Option<u32>)> = None;
        while p > first {
            p -= 1;
            let k = p / SEG as u64;
            let seg = match segment {
                Some((at, seg)) if at == k => seg,
                _ => {
                    let seg = self.locate_quiet(p, hint);
                    segment = Some((k, seg));
                    seg
                }
            };
            let Some(seg) = seg else {
                // Gone: every position in it was skipped.
                p = k * SEG as u64;
                continue;
            };
            if let Some((cell, gen)) = self.queued_at(p, seg) {
                return Some((p, cell, gen));
            }
        }
        None
    }

    /// The cell queued at position `p` of segment `seg`, if one waits there.
    fn queued_at(&self, p: u64, seg: u32) -> Option<(u32, u32)> {
        let slot = &self.segments.get(seg).slots[p as usize % SEG];
        // Acquire: pairs with the install's Release.
        let word = slot.load(Ordering::Acquire);
        if slot_tag(word) != tag_of(p / SEG as u64) || slot_kind(word) != WAITING {
            return None;
        }
        let cell = slot_cell(word);
        let (gen, status) = self.status(cell);
        // Relaxed: written before the status we read.
        let here = self.waits_at(self.cells.get(cell), p);
        (status == Status::Queued && here).then_some((cell, gen))
    }

    /// Rejects the newest queued waiter with `reason` (displacement): who
    /// was told and what the caller must do after its leaving, or `None`
    /// if nobody waits.
    pub(in crate::gate) fn reject_newest(
        &self,
        reason: AdmitError,
        places: &impl Places,
    ) -> Option<(Told, Then)> {
        loop {
            let (_, cell, gen) = self.newest_queued()?;
            if let Some((then, told)) = self.leave_told(cell, gen, Status::Rejected(reason), places)
            {
                return Some((told, then));
            }
            // Resolved meanwhile: the next newest.
        }
    }

    /// The queue time of the oldest queued waiter, if any.
    pub(in crate::gate) fn oldest_enqueued_at(&self) -> Option<u64> {
        let mut from = 0;
        while let Some((p, cell, gen)) = self.next_queued(from) {
            // Relaxed: as in `reject_from_head`.
            let at = self.cells.get(cell).enqueued_at.load(Ordering::Relaxed);
            if self.status(cell) == (gen, Status::Queued) {
                return Some(at);
            }
            from = p + 1;
        }
        None
    }
}
