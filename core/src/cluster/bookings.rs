//! The reference routers' bookings, held in the monitor as loadgate
//! bookings, so that a monitor beside Dynamo 1.6.1 routers counts the
//! blocks and prefill tokens they routed as they do.
//!
//! Each `AddRequest` from a router books its request's blocks and prefill
//! tokens on the worker rank ([`Monitor::book_with_prefill`]); a
//! `MarkPrefillCompleted` releases the prefill tokens and a `Free` releases
//! the rest, exactly as loadgate's own router bookings are released. As a
//! 1.6.1 router applies its replicas' events (`apply_replica_event`),
//! bookings are keyed by request alone, whoever publishes a change: the
//! first `AddRequest` of a request books it (a repeat, from any router, is
//! ignored), and a `MarkPrefillCompleted` or `Free` from any router or
//! worker applies when it names the worker and rank the request was booked
//! on. Workers publish a `MarkPrefillCompleted` of their own for every
//! request (with their worker id as `router_id`), while a router's own mark
//! can be missing (it publishes none when the worker's came first), so the
//! worker's mark is what ends most prefills. A change for a request this
//! monitor does not hold (routed before the subscription started) is
//! ignored.
//!
//! Bounded: at most `max` bookings are held (more are refused and counted),
//! and a booking held longer than `ttl` is dropped, so a router that dies
//! without freeing its requests holds their load only that long.
//!
//! Differences from the router's own count: loadgate counts each request's
//! full blocks, where the router counts a block shared by two requests on
//! one rank once (shared prefixes over-count here, never under-count).

use std::collections::HashMap;
use std::sync::Mutex;

use foldhash::fast::RandomState;

use super::lock;
use super::subscriber::outcome::{Applied, HandleError};
use super::wire::{SequenceChange, SequenceEvent};
use crate::monitor::{Booking, Monitor, Owner};

/// A router's booking of one request.
struct Held {
    booking: Booking,
    /// The worker and rank it was booked on.
    worker_id: u64,
    dp_rank: u32,
    /// Clock time it was booked at.
    booked_at: u64,
}

/// The bookings of every reference router a subscriber hears.
pub(super) struct RouterBookings {
    max: usize,
    ttl_nanos: u64,
    held: Mutex<HashMap<String, Held, RandomState>>,
}

impl RouterBookings {
    pub(super) fn new(max: usize, ttl_nanos: u64) -> Self {
        Self {
            max,
            ttl_nanos,
            held: Mutex::new(HashMap::default()),
        }
    }

    /// Applies one change, at clock time `now`.
    pub(super) fn apply(
        &self,
        monitor: &Monitor,
        event: SequenceEvent,
        now: u64,
    ) -> Result<Applied, HandleError> {
        let key = event.request_id;
        let mut held = lock(&self.held);
        let on_its_rank = |h: &Held| (h.worker_id, h.dp_rank) == (event.worker_id, event.dp_rank);
        match event.change {
            SequenceChange::Add {
                blocks,
                prefill_tokens,
            } => {
                if held.contains_key(&key) {
                    return Ok(Applied::OutOfOrder);
                }
                if held.len() >= self.max {
                    return Err(HandleError::BookingsFull { limit: self.max });
                }
                // Another router's: never published as this frontend's
                // own (`replicas.rs`).
                let booking = monitor
                    .book_for(
                        Owner::Shared,
                        event.worker_id,
                        event.dp_rank,
                        blocks,
                        prefill_tokens,
                    )
                    .map_err(HandleError::Report)?;
                held.insert(
                    key,
                    Held {
                        booking,
                        worker_id: event.worker_id,
                        dp_rank: event.dp_rank,
                        booked_at: now,
                    },
                );
                Ok(Applied::Report)
            }
            SequenceChange::PrefillDone => match held.get_mut(&key) {
                Some(h) if on_its_rank(h) => {
                    h.booking.prefill_done();
                    Ok(Applied::Report)
                }
                _ => Ok(Applied::Ignored),
            },
            // Dropping the booking releases it.
            SequenceChange::Free => match held.get(&key) {
                Some(h) if on_its_rank(h) => {
                    held.remove(&key);
                    Ok(Applied::Report)
                }
                _ => Ok(Applied::Ignored),
            },
        }
    }

    /// Drops the bookings held longer than the ttl at clock time `now`;
    /// returns how many.
    pub(super) fn expire(&self, now: u64) -> usize {
        let mut held = lock(&self.held);
        let before = held.len();
        held.retain(|_, h| now.saturating_sub(h.booked_at) <= self.ttl_nanos);
        before - held.len()
    }

    /// Bookings held now.
    pub(super) fn len(&self) -> usize {
        lock(&self.held).len()
    }
}
