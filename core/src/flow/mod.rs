//! Frontend flow control: when no eligible worker is free, a request may
//! wait in its model's queue instead of being refused at once, and the
//! queue is shared fairly between tenants by tokens.
//!
//! # Order
//!
//! Strict priority band first (priority 0 the most important; a priority
//! past the last of [`MAX_BANDS`] counts as the last), then tenants by
//! their virtual token counters (VTC, Sheng et al., OSDI 2024: the
//! backlogged tenant with the lowest counter goes next), then first in,
//! first out within a tenant. A tenant is charged `w_p` per prompt token
//! when its request is dispatched and `w_q` per output token as the
//! request reports them, divided by its weight; the output reserved for a
//! request in flight (its `max_tokens`, or the configured estimate) counts
//! towards its order until the request settles, and the counter itself
//! only ever holds actual tokens (`tenants.rs`). An idle tenant rejoins at
//! the lowest counter among the backlogged ones, so it cannot bank credit.
//!
//! # Fair shedding
//!
//! A full queue (its count, or its total of estimated tokens) turns away
//! the newest request of the *heaviest* tenant of the least important band
//! that has requests, if that band is not more important than the
//! arrival's: heaviness is a tenant's counter plus its waiting cost
//! (weighted like a charge), the arrival counted with its own tenant when
//! it is of that band. The arrival itself is refused if its tenant is the
//! heaviest (ties included), or if every waiting request is more important.
//! So a light tenant is not refused because a heavy one filled the queue.
//! The requests to turn away are planned first and the plan applied only
//! if the arrival then fits: an arrival never sheds and is refused too.
//!
//! # Bounds
//!
//! The queue's storage is reserved when it is built; the
//! tenant table is bounded by `max_tenants`, and forgets idle tenants to
//! make room without breaking the rejoin rule (`tenants.rs`). Token counts
//! and deadlines from input saturate instead of overflowing.

mod config;
mod drain;
mod queue;
mod tenants;

pub use config::{
    FlowConfig, FlowConfigError, DEFAULT_FLOW_DEADLINE, DEFAULT_MAX_TENANTS,
    DEFAULT_OUTPUT_ESTIMATE, MAX_BANDS, MAX_FLOW_DEADLINE, MAX_FLOW_QUEUE, MAX_TENANTS_CEILING,
    MAX_WEIGHT, MIN_WEIGHT,
};
// The queue itself is the monitor's: a host dispatches through
// `Monitor::dispatch` and its forms. It stays reachable, hidden, for
// loadgate's own differential tests and fuzz targets.
#[doc(hidden)]
pub use drain::Rate;
#[doc(hidden)]
pub use queue::{FlowQueue, MAX_SHED};

use std::fmt;
use std::time::Duration;

/// One request asking to be dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowRequest<'a> {
    /// Its tenant (`""`: the default tenant); at most 256 bytes.
    pub tenant: &'a str,
    /// Its priority: 0 the most important.
    pub priority: u8,
    /// Prompt tokens it brings (the uncached part, when the caller knows).
    pub prompt_tokens: u64,
    /// Most output tokens it may produce; `None`: the queue's estimate.
    pub max_tokens: Option<u64>,
    /// How long it may wait; `None`: the queue's default (at most
    /// [`MAX_FLOW_DEADLINE`]).
    pub deadline: Option<Duration>,
}

impl<'a> FlowRequest<'a> {
    /// A request of `tenant` with every other field at its default.
    pub fn new(tenant: &'a str) -> Self {
        Self {
            tenant,
            priority: 0,
            prompt_tokens: 0,
            max_tokens: None,
            deadline: None,
        }
    }
}

/// Why a request was not dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlowRejection {
    /// The queue was full and this request was the one turned away (on
    /// arrival, or later for a lighter tenant's request).
    QueueFull,
    /// The request waited until its deadline.
    QueueDeadline,
    /// The model has no workers.
    NoWorkers,
    /// No worker was free and the request asked not to wait.
    AllWorkersBusy,
    /// The tenant id is longer than 256 bytes.
    InvalidTenant,
    /// The caller's own timeout ran out first (a blocking dispatch); the
    /// request left the queue.
    TimedOut,
}

impl FlowRejection {
    /// The rejection reason a client is answered with (`None` for a bad
    /// tenant id, which is bad input, not a rejection).
    pub const fn reason(self) -> Option<crate::error::Reason> {
        use crate::error::Reason;
        match self {
            Self::QueueFull => Some(Reason::QueueFull),
            Self::QueueDeadline => Some(Reason::QueueDeadline),
            Self::NoWorkers => Some(Reason::NoWorkers),
            Self::AllWorkersBusy => Some(Reason::AllWorkersBusy),
            Self::InvalidTenant => None,
            Self::TimedOut => Some(Reason::QueueDeadline),
        }
    }

    /// The machine-readable name, e.g. `queue_full`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::QueueDeadline => "queue_deadline",
            Self::NoWorkers => "no_workers",
            Self::AllWorkersBusy => "all_workers_busy",
            Self::InvalidTenant => "invalid_tenant",
            Self::TimedOut => "timed_out",
        }
    }
}

impl fmt::Display for FlowRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::QueueFull => "the model's queue is full",
            Self::QueueDeadline => "the request waited in the model's queue until its deadline",
            Self::NoWorkers => "no worker serves the model",
            Self::AllWorkersBusy => "every worker of the model is busy",
            Self::InvalidTenant => "the tenant id is longer than 256 bytes",
            Self::TimedOut => "timed out waiting for a worker; the request left the queue",
        })
    }
}

impl std::error::Error for FlowRejection {}

/// A queued request's place, for `FlowQueue::cancel`; stale once the
/// request has left (a later cancel finds nothing).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QueueKey {
    index: u32,
    gen: u32,
}

/// What a dispatched request owes its tenant's counter until it settles
/// (`FlowQueue::report_output`, `FlowQueue::settle`). Settle every
/// reservation once: its tenant stays in the table until then.
#[doc(hidden)]
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a reservation is settled with FlowQueue::settle"]
pub struct Reservation {
    tenant: u32,
    /// Output tokens reserved.
    output: u64,
    /// Output tokens reported so far.
    reported: u64,
    /// Where the request stood in the queue, for `FlowQueue::requeue`:
    /// its band, arrival order, deadline (clock nanoseconds) and prompt.
    band: u8,
    seq: u64,
    deadline: u64,
    prompt: u64,
}

impl Reservation {
    /// Output tokens reserved at dispatch.
    pub fn reserved_output(&self) -> u64 {
        self.output
    }

    /// Output tokens reported so far.
    pub fn reported_output(&self) -> u64 {
        self.reported
    }

    /// Its priority band.
    pub fn band(&self) -> usize {
        usize::from(self.band)
    }
}
