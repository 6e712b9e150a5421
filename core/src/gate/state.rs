//! The gate's state word: `running`, `queued`, `limit` and `closed` packed
//! into one `AtomicU64`, so that the direct-admit and release fast paths are a
//! single CAS that sees all four at once.
//!
//! # Bit layout
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
//! # Invariants
//!
//! At every value the word takes:
//! 1. `queued <= Q`, and `running <= max(limit ever set)` (never above `N`
//!    unless the limit was just lowered; lowering revokes nothing).
//! 2. `limit` and `closed` change only under the mutex; `queued` rises only
//!    under it, and falls under it or by a lock-free cancel. `queued` counts
//!    the live waiters: the linked cells but those cancelled (which stay
//!    linked until a mutex holder unlinks them), give or take a cancel
//!    between its cell's CAS and its `queued - 1`.
//! 3. `running` rises without the mutex only while `queued == 0` (the
//!    direct-admit CAS requires it in the value it swaps), so while
//!    `queued > 0` only the mutex holder raises it. It falls without the
//!    mutex at any time: a release is one `fetch_sub`.
//! 4. `queued > 0` implies `running >= limit` or `closed`: a slot is never
//!    left idle while someone waits. The one window: a release whose
//!    `fetch_sub` saw `queued > 0` has freed its slot and is on its way to
//!    the mutex to hand it to the oldest waiter; until then no arrival can
//!    take the slot ahead of the waiters (a direct admission needs
//!    `queued == 0`, and one under the mutex needs nobody of its class or a
//!    more important one queued). (A `set_limit` that grants more waiters
//!    than one batch raises `limit` first and grants batch by batch; the
//!    same rule keeps its slots for the waiters between batches.)

const FIELD_BITS: u32 = 21;
const FIELD_MASK: u64 = (1 << FIELD_BITS) - 1;
const QUEUED_SHIFT: u32 = FIELD_BITS;
const LIMIT_SHIFT: u32 = 2 * FIELD_BITS;

/// The `closed` bit.
pub(super) const CLOSED: u64 = 1 << 63;
/// One unit of `running`, to add to or subtract from a raw word.
pub(super) const ONE_RUNNING: u64 = 1;
/// One unit of `queued`, to add to or subtract from a raw word.
pub(super) const ONE_QUEUED: u64 = 1 << QUEUED_SHIFT;

/// A decoded state word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Word(pub(super) u64);

impl Word {
    pub(super) fn new(running: u32, queued: u32, limit: u32, closed: bool) -> Self {
        debug_assert!(u64::from(running.max(queued).max(limit)) <= FIELD_MASK);
        Word(
            u64::from(running)
                | u64::from(queued) << QUEUED_SHIFT
                | u64::from(limit) << LIMIT_SHIFT
                | if closed { CLOSED } else { 0 },
        )
    }
    #[inline]
    pub(super) fn running(self) -> u32 {
        (self.0 & FIELD_MASK) as u32
    }
    #[inline]
    pub(super) fn queued(self) -> u32 {
        ((self.0 >> QUEUED_SHIFT) & FIELD_MASK) as u32
    }
    #[inline]
    pub(super) fn limit(self) -> u32 {
        ((self.0 >> LIMIT_SHIFT) & FIELD_MASK) as u32
    }
    #[inline]
    pub(super) fn closed(self) -> bool {
        self.0 & CLOSED != 0
    }
}
