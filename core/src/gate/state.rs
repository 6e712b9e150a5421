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
//! `running` counts held slots, including slots promised to waiters and on
//! their way to them; `queued` counts the waiters no slot is promised to
//! yet; `limit` is `N`.
//!
//! # Invariants
//!
//! At every value the word takes:
//! 1. `queued <= Q`, and `running <= max(limit ever set)` (never above `N`
//!    unless the limit was just lowered; lowering revokes nothing).
//! 2. `limit` changes only in `set_limit` (serialized by its mutex);
//!    `closed` is set once, by `close`, and never cleared.
//! 3. `queued` rises by an arrival's CAS, only when no slot is free to it or
//!    others wait; it falls by a promise (`running + 1, queued - 1` in one
//!    CAS) or by a leaving waiter giving its place back (`queue.rs`). With
//!    several classes or a wait limit it is the classes' total, at least
//!    the sum of their counts (`classes.rs`).
//! 4. `running` rises by a direct admission only while nobody is queued
//!    (with classes: nobody of the class or a more important one), and by a
//!    promise; it falls at any time: a release is one `fetch_sub`.
//! 5. `queued > 0` implies no slot is free to the waiting classes
//!    (`running >= limit` within their shares), or every wait slot is
//!    taken, or `closed`: a slot is never left idle while someone waits. The one
//!    window: a release (or a raised limit, or a first response) that saw
//!    `queued > 0` has freed its slot and is about to promise it; no arrival
//!    takes the slot meanwhile, since a direct admission needs nobody
//!    queued ahead of it.

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
