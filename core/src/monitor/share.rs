//! A frontend's leased share of every rank's line (booking sync's leased
//! mode, `cluster::replicas`, docs/replicas.md).
//!
//! In leased mode each frontend may book at most `used` parts per million
//! of every rank's line (`Thresholds::decode_line`), and only while its
//! lease holds: the sync keeps both in one [`Share`] word, and a new
//! booking reserves its blocks against them in one compare-and-swap on the
//! rank's own-booking counter (`booking.rs`), so concurrent bookings of one
//! frontend never pass its share. The busy rule also counts a rank whose
//! own bookings fill the share as busy, so routing skips it; the booking's
//! own check is what makes the cap exact. Without leased mode the word is
//! zero and a booking reads nothing more.
//!
//! # Orderings
//!
//! A frontend may publish a lower claim only once no booking can pass it.
//! A booking adds its blocks to the rank's own counter, then reads the
//! word, and takes the blocks back if they do not fit ([`Share::reserve`]);
//! the sync stores the lower word, then reads every own counter
//! (`Monitor::apply_share`). Both sides put a `SeqCst` fence between their
//! write and their read, so of a booking and a lowering that race, one
//! sees the other (the store-buffer pattern): either the booking reads the
//! lower word, or the sync counts its blocks and keeps its claim above
//! them. The loom model below fails without the fences.

use crate::clock::SharedClock;
use crate::sync::{fence, AtomicBool, AtomicU64, Ordering};

/// One million: shares are parts per million of a rank's line.
pub(crate) const WHOLE: u32 = 1_000_000;

const LEASED: u64 = 1 << 63;
const USED_SHIFT: u32 = 43;
const DEADLINE_BITS: u64 = (1 << USED_SHIFT) - 1;
/// Deadlines are kept in units of 2^20 ns (about a millisecond), rounded
/// down, so the check never lets a lease run past its deadline.
const UNIT_SHIFT: u32 = 20;

/// A frontend's share and lease, in one word: the leased flag, the share
/// in parts per million, and the deadline of the lease.
pub(crate) struct Share {
    word: AtomicU64,
    /// Bookings refused for want of room, for the sync to ask for more.
    refused: AtomicU64,
    /// A booking sync reads which ranks' own bookings changed: bookings
    /// mark them (`Worker::mark_own_changed`).
    tracked: AtomicBool,
    clock: SharedClock,
}

impl std::fmt::Debug for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Share")
            .field("used", &self.used())
            .finish_non_exhaustive()
    }
}

impl Share {
    pub(crate) fn new(clock: SharedClock) -> Self {
        Self {
            word: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            tracked: AtomicBool::new(false),
            clock,
        }
    }

    /// Bookings mark the ranks whose own bookings they change from now on.
    pub(crate) fn track_changes(&self) {
        self.tracked.store(true, Ordering::SeqCst);
    }

    /// Whether bookings mark the ranks they change. Relaxed: a flag set
    /// once, before the sync's first read.
    #[inline]
    pub(crate) fn changes_tracked(&self) -> bool {
        self.tracked.load(Ordering::Relaxed)
    }

    /// Sets the share to `used` parts per million until clock time
    /// `deadline` (`u64::MAX`: no deadline); leased mode on.
    pub(crate) fn set(&self, used: u32, deadline: u64) {
        let units = (deadline >> UNIT_SHIFT).min(DEADLINE_BITS);
        let word = LEASED | (u64::from(used.min(WHOLE)) << USED_SHIFT) | units;
        // SeqCst store, then a SeqCst fence before the sync reads the own
        // bookings: see the module docs.
        self.word.store(word, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Leaves leased mode: bookings are no longer capped.
    pub(crate) fn leave(&self) {
        // SeqCst: as `set`.
        self.word.store(0, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// What this frontend may book of a rank whose line is `line`, now:
    /// `None` out of leased mode, `Some(0)` once the lease ran out.
    #[inline]
    pub(crate) fn cap(&self, line: u64) -> Option<u64> {
        // SeqCst: see the module docs.
        let word = self.word.load(Ordering::SeqCst);
        if word & LEASED == 0 {
            return None;
        }
        let units = word & DEADLINE_BITS;
        if units != DEADLINE_BITS && self.clock.now_nanos() >> UNIT_SHIFT >= units {
            return Some(0);
        }
        Some(of_line(word, line))
    }

    /// [`cap`](Self::cap) without the lease's deadline, for the busy rule
    /// (which runs on changes, not on time; the sync re-evaluates every
    /// worker when it fences). `line` is computed only in leased mode.
    #[inline]
    pub(crate) fn busy_cap(&self, line: impl FnOnce() -> u64) -> Option<u64> {
        // Relaxed: an input of the busy rule, released by the combiner.
        let word = self.word.load(Ordering::Relaxed);
        (word & LEASED != 0).then(|| of_line(word, line()))
    }

    /// Whether this frontend books under a leased share.
    #[inline]
    pub(crate) fn is_leased(&self) -> bool {
        self.busy_cap(|| 0).is_some()
    }

    /// Reserves `blocks` more of a rank whose line is `line()` in `own`,
    /// its own-booking counter, if they fit this frontend's cap; otherwise
    /// changes nothing and returns the cap. Out of leased mode, only adds
    /// (and computes no line).
    #[inline]
    pub(crate) fn reserve(
        &self,
        own: &AtomicU64,
        blocks: u64,
        line: impl FnOnce() -> u64,
    ) -> Result<(), u64> {
        let add = |a: &AtomicU64, n: u64| {
            // SeqCst, add then read: see the module docs.
            a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_add(n))
            })
            .unwrap_or_default()
        };
        if self.busy_cap(|| 0).is_none() {
            add(own, blocks);
            return Ok(());
        }
        let line = line();
        // Relaxed: a count the sync reads now and then.
        let refuse = |cap: u64| {
            self.refused.fetch_add(1, Ordering::Relaxed);
            Err(cap)
        };
        if blocks > line {
            return refuse(self.cap(line).unwrap_or(0));
        }
        let before = add(own, blocks);
        // The booking's side of the pairing (module docs).
        fence(Ordering::SeqCst);
        match self.cap(line) {
            Some(cap) if before.saturating_add(blocks) > cap => {
                let _ = own.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                    Some(v.saturating_sub(blocks))
                });
                refuse(cap)
            }
            _ => Ok(()),
        }
    }

    /// Bookings refused for want of room so far.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The share in parts per million, if leased.
    pub(crate) fn used(&self) -> Option<u32> {
        let word = self.word.load(Ordering::SeqCst);
        (word & LEASED != 0).then_some(((word & !LEASED) >> USED_SHIFT) as u32)
    }
}

/// `used` parts per million of `line`, rounded down: shares that sum to at
/// most a million never book more than the line between them.
fn of_line(word: u64, line: u64) -> u64 {
    let used = (word & !LEASED) >> USED_SHIFT;
    (u128::from(line) * u128::from(used) / u128::from(WHOLE)) as u64
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn a_share_caps_until_its_deadline() {
        let clock = ManualClock::new();
        let share = Share::new(clock.clone());
        assert_eq!(share.cap(1000), None);
        share.set(250_000, 5_000_000_000);
        assert_eq!(share.cap(1000), Some(250));
        assert_eq!(share.cap(7), Some(1));
        clock.set_nanos(4_990_000_000);
        assert_eq!(share.cap(1000), Some(250));
        clock.set_nanos(5_000_000_000);
        assert_eq!(share.cap(1000), Some(0));
        assert_eq!(share.busy_cap(|| 1000), Some(250));
        share.set(WHOLE, u64::MAX);
        clock.set_nanos(u64::MAX / 2);
        assert_eq!(share.cap(u64::MAX), Some(u64::MAX));
    }
}

/// Loom model of the pairing in the module docs: a booking that races a
/// lowering of the share either fits the lower share or is counted by the
/// read after the lowering's store. Without the fences the model finds
/// the booking that slips past both.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::clock::ManualClock;
    use loom::sync::Arc;

    #[test]
    fn a_booking_racing_a_lower_share_fits_it_or_is_counted() {
        loom::model(|| {
            let share = Arc::new(Share::new(ManualClock::new()));
            share.set(WHOLE, u64::MAX);
            let own = Arc::new(AtomicU64::new(0));
            let (s, o) = (share.clone(), own.clone());
            let booking = loom::thread::spawn(move || s.reserve(&o, 10, || 10).is_ok());
            // The sync lowers the share to nothing, then reads the bookings.
            share.set(0, u64::MAX);
            let counted = own.load(Ordering::SeqCst);
            let booked = booking.join().unwrap();
            assert!(
                !booked || counted == 10,
                "a booking passed a share of 0 unseen"
            );
        });
    }
}
