//! The reference routers' bookings, held in the monitor as loadgate
//! bookings, so that a monitor beside Dynamo 1.6.1 routers counts the
//! blocks and prefill tokens they routed as they do.
//!
//! Each `AddRequest` from a router books its request's blocks and prefill
//! tokens on the worker rank ([`Monitor::book_with_prefill`]); a `Free`
//! releases everything, exactly as loadgate's own router bookings are
//! released. As a 1.6.1 router applies its replicas' events
//! (`apply_replica_event`), bookings are keyed by request alone, whoever
//! publishes a change: the first `AddRequest` of a request books it (a
//! repeat, from any router, is ignored), and a `MarkPrefillCompleted` or
//! `Free` applies when it names the worker and rank the request was booked
//! on. A change for a request this monitor does not hold (routed before the
//! subscription started) is ignored.
//!
//! **When a finished prefill stops counting.** A 1.6.1 router decides busy
//! (and shows its gauges) on the load it last *published* for each rank,
//! and it publishes a rank's load at its own `AddRequest`, `Free` and
//! `MarkPrefillCompleted` (the router's mark, at the first token it sees,
//! and only when it changes something). Its workers publish a
//! `MarkPrefillCompleted` of their own for every request (their worker id
//! as `router_id`); the router applies it without publishing, so when the
//! worker's mark comes first, the release shows only at the rank's next
//! publication, and the router's own mark, finding nothing to change, is
//! never sent. loadgate holds the same view: the mark of the router that
//! booked the request releases its prefill at once; any other mark releases
//! it at the rank's next `AddRequest`, `Free` or router mark that comes at
//! least [`HIDDEN_RELEASE_LAG`] after it (the router's own delay in
//! applying a replica's event: a release it has not yet applied is not in
//! what it publishes). Replayed against three recorded 1.6.1 runs (answers
//! of 20 tokens, 12 and 24 clients), this view agrees with every one of
//! the router's 529s outside 0.1 s transitions; releasing at the worker's
//! mark agreed with 55 to 82 % of them.
//!
//! Bounded: at most `max` bookings are held (more are refused and counted),
//! and a booking held longer than `ttl` is dropped, so a router that dies
//! without freeing its requests holds their load only that long.
//!
//! A monitor that announces its own bookings in the same format
//! (`announce.rs`) skips the events of its own router id, which it counts
//! already.
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

/// How long after a replica's `MarkPrefillCompleted` a router's
/// publication of the rank shows its release: the router applies a
/// replica's event about 1 to 3 ms after a NATS subscriber of its own
/// receives it (measured on loopback beside 1.6.1; module docs).
pub const HIDDEN_RELEASE_LAG: std::time::Duration = std::time::Duration::from_millis(3);

/// A router's booking of one request.
struct Held {
    booking: Booking,
    /// The worker and rank it was booked on.
    worker_id: u64,
    dp_rank: u32,
    /// The router that booked it.
    router_id: u64,
    /// Clock time it was booked at.
    booked_at: u64,
    /// Clock time another's mark released its prefill unseen (module docs).
    hidden_since: Option<u64>,
}

/// The held bookings, and per rank the requests whose prefill release is
/// not yet shown.
#[derive(Default)]
struct Table {
    held: HashMap<String, Held, RandomState>,
    hidden: HashMap<(u64, u32), Vec<String>, RandomState>,
}

impl Table {
    /// Shows the releases on `rank` hidden for at least the lag at `now`.
    fn publish(&mut self, rank: (u64, u32), now: u64, lag: u64) {
        let Some(waiting) = self.hidden.get_mut(&rank) else {
            return;
        };
        waiting.retain(|request| {
            let Some(h) = self.held.get_mut(request) else {
                return false;
            };
            match h.hidden_since {
                Some(since) if now.saturating_sub(since) >= lag => {
                    h.booking.prefill_done();
                    h.hidden_since = None;
                    false
                }
                Some(_) => true,
                None => false,
            }
        });
        if waiting.is_empty() {
            self.hidden.remove(&rank);
        }
    }
}

/// The bookings of every reference router a subscriber hears.
pub(super) struct RouterBookings {
    max: usize,
    ttl_nanos: u64,
    table: Mutex<Table>,
}

impl RouterBookings {
    pub(super) fn new(max: usize, ttl_nanos: u64) -> Self {
        Self {
            max,
            ttl_nanos,
            table: Mutex::new(Table::default()),
        }
    }

    /// Applies one change, at clock time `now`.
    pub(super) fn apply(
        &self,
        monitor: &Monitor,
        event: SequenceEvent,
        now: u64,
    ) -> Result<Applied, HandleError> {
        let own = monitor.outbox.router();
        if own != 0 && event.router_id == own {
            // This monitor's own bookings as it announced them
            // (`announce.rs`): counted already.
            return Ok(Applied::Ignored);
        }
        let key = event.request_id;
        let rank = (event.worker_id, event.dp_rank);
        let lag = crate::clock::nanos(HIDDEN_RELEASE_LAG);
        let mut table = lock(&self.table);
        let table = &mut *table;
        match event.change {
            SequenceChange::Add {
                blocks,
                prefill_tokens,
            } => {
                if table.held.contains_key(&key) {
                    return Ok(Applied::OutOfOrder);
                }
                if table.held.len() >= self.max {
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
                table.held.insert(
                    key,
                    Held {
                        booking,
                        worker_id: event.worker_id,
                        dp_rank: event.dp_rank,
                        router_id: event.router_id,
                        booked_at: now,
                        hidden_since: None,
                    },
                );
                table.publish(rank, now, lag);
                Ok(Applied::Report)
            }
            SequenceChange::PrefillDone => {
                let Some(h) = table.held.get_mut(&key) else {
                    return Ok(Applied::Ignored);
                };
                if (h.worker_id, h.dp_rank) != rank {
                    return Ok(Applied::Ignored);
                }
                if event.router_id == h.router_id {
                    // The booking router's own mark: published at once
                    // (with the rank's releases it has applied by now).
                    h.booking.prefill_done();
                    h.hidden_since = None;
                    table.publish(rank, now, lag);
                } else if h.hidden_since.is_none() && h.booking.prefill_tokens() > 0 {
                    h.hidden_since = Some(now);
                    table.hidden.entry(rank).or_default().push(key);
                }
                Ok(Applied::Report)
            }
            // Dropping the booking releases it.
            SequenceChange::Free => match table.held.get(&key) {
                Some(h) if (h.worker_id, h.dp_rank) == rank => {
                    table.held.remove(&key);
                    table.publish(rank, now, lag);
                    Ok(Applied::Report)
                }
                _ => Ok(Applied::Ignored),
            },
        }
    }

    /// Drops the bookings held longer than the ttl at clock time `now`;
    /// returns how many.
    pub(super) fn expire(&self, now: u64) -> usize {
        let mut table = lock(&self.table);
        let before = table.held.len();
        table
            .held
            .retain(|_, h| now.saturating_sub(h.booked_at) <= self.ttl_nanos);
        let Table { held, hidden } = &mut *table;
        hidden.retain(|_, requests| {
            requests.retain(|r| held.contains_key(r));
            !requests.is_empty()
        });
        before - table.held.len()
    }

    /// Bookings held now.
    pub(super) fn len(&self) -> usize {
        lock(&self.table).held.len()
    }
}
