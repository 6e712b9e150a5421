//! This monitor's own bookings as they happen (booked, prefill done,
//! released), for a publisher that announces them to routers of the
//! reference design (`crate::cluster::announce`: Dynamo's
//! `active_sequences_events`).
//!
//! Off until a publisher starts it: a booking then reads one relaxed flag.
//! On, a new own booking takes an id from a counter and pushes its event
//! into a bounded lock-free queue (crossbeam's `ArrayQueue`, allocated once,
//! at the first start); its prefill-done and its release push theirs under
//! the same id. The publisher's thread drains the queue. Nothing on the
//! booking's path waits, allocates or runs host code.
//!
//! A full queue drops the event and counts it. A dropped booking is never
//! announced (its later events are not pushed); a dropped release leaves
//! the routers counting the booking until their own expiry. A release is
//! pushed even after the publisher stopped, so that a publisher started
//! again frees what the last one announced (the queue holds them until
//! then, or drops and counts them when full).

use std::sync::OnceLock;

use crossbeam_queue::ArrayQueue;

use crate::sync::{AtomicBool, AtomicU64, Ordering};

/// Events the queue holds (about 40 bytes each) before it drops them.
pub const OUTBOX_CAPACITY: usize = 65_536;

/// One change to one of this monitor's own bookings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnEvent {
    /// The booking, numbered from 1 by this monitor.
    pub id: u64,
    /// The worker it is on.
    pub worker_id: u64,
    /// Its rank.
    pub dp_rank: u32,
    /// What changed.
    pub change: OwnChange,
}

/// What an [`OwnEvent`] says of its booking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnChange {
    /// Made, with its blocks and prompt tokens.
    Booked {
        /// KV blocks.
        blocks: u64,
        /// Prompt tokens still to prefill.
        prefill_tokens: u64,
    },
    /// Its prefill is done.
    PrefillDone,
    /// Released.
    Released,
}

/// The monitor's queue of own-booking events (module docs).
pub(crate) struct Outbox {
    on: AtomicBool,
    router: AtomicU64,
    next: AtomicU64,
    lost: AtomicU64,
    queue: OnceLock<ArrayQueue<OwnEvent>>,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("on", &self.on.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Outbox {
    pub(crate) fn new() -> Self {
        Self {
            on: AtomicBool::new(false),
            router: AtomicU64::new(0),
            next: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            queue: OnceLock::new(),
        }
    }

    /// Starts queueing new bookings, announced as router `router_id`
    /// unless an earlier start chose one (a monitor keeps one router id for
    /// its life, so that its reader always knows its own events): the
    /// router id in use, or `None` if a publisher is already on.
    pub(crate) fn start(&self, router_id: u64) -> Option<u64> {
        self.queue.get_or_init(|| ArrayQueue::new(OUTBOX_CAPACITY));
        // SeqCst: one publisher at a time.
        self.on
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .ok()?;
        let _ =
            self.router
                .compare_exchange(0, router_id.max(1), Ordering::SeqCst, Ordering::SeqCst);
        Some(self.router())
    }

    /// The router id its events are announced as (0 before any start).
    pub(crate) fn router(&self) -> u64 {
        self.router.load(Ordering::SeqCst)
    }

    /// Stops queueing new bookings (releases of announced ones still are).
    pub(crate) fn stop(&self) {
        self.on.store(false, Ordering::SeqCst);
    }

    /// A new own booking: its id, or 0 when it is not announced (off, or
    /// the queue was full).
    #[inline]
    pub(crate) fn booked(&self, worker_id: u64, dp_rank: u32, blocks: u64, prefill: u64) -> u64 {
        // Relaxed: a booking racing the switch-on may go unannounced.
        if !self.on.load(Ordering::Relaxed) {
            return 0;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let change = OwnChange::Booked {
            blocks,
            prefill_tokens: prefill,
        };
        if self.push(OwnEvent {
            id,
            worker_id,
            dp_rank,
            change,
        }) {
            id
        } else {
            0
        }
    }

    /// A change to announced booking `id` (prefill done or released).
    #[inline]
    pub(crate) fn changed(&self, id: u64, worker_id: u64, dp_rank: u32, change: OwnChange) {
        self.push(OwnEvent {
            id,
            worker_id,
            dp_rank,
            change,
        });
    }

    fn push(&self, event: OwnEvent) -> bool {
        let pushed = self.queue.get().is_some_and(|q| q.push(event).is_ok());
        if !pushed {
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
        pushed
    }

    /// Takes the next queued event.
    pub(crate) fn pop(&self) -> Option<OwnEvent> {
        self.queue.get()?.pop()
    }

    /// Events dropped so far because the queue was full.
    pub(crate) fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}
