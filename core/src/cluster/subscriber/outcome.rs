//! What a subscriber makes of each payload: [`Applied`] or a
//! [`HandleError`], each refusal counted under its reason, and the
//! subscriber's counters.

use std::fmt;

use crate::cluster::wire::WireError;
use crate::error::{ReportError, WorkerError};

/// What happened to one payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// A report for a known worker was applied.
    Report,
    /// The first message of a worker (or of a restarted one) registered it
    /// and was applied.
    Announced,
    /// Not newer than the last message applied for the worker: dropped.
    OutOfOrder,
    /// Queued for the attached subscriber's registration thread.
    Queued,
    /// A change to a reference router's booking this subscriber does not
    /// hold (a request routed before the subscription started, or a change
    /// naming another rank): nothing to change.
    Ignored,
}

/// Why a payload was not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandleError {
    /// Longer than [`SubscriberConfig::max_payload`](super::SubscriberConfig::max_payload); not read.
    Oversized {
        /// Its length in bytes.
        len: usize,
        /// The configured maximum.
        limit: usize,
    },
    /// The payload did not decode.
    Wire(WireError),
    /// The payload's worker id is not the one its subject names.
    Spoofed {
        /// The subject it arrived on.
        subject: String,
        /// The worker id it carries.
        worker_id: u64,
    },
    /// The monitor refused the report.
    Report(ReportError),
    /// The monitor refused to register the worker.
    Worker(WorkerError),
    /// The registration queue was full; the worker's next heartbeat
    /// announces it again.
    Backlog,
    /// A reference router's booking arrived while the subscriber already
    /// holds its maximum of them.
    BookingsFull {
        /// The configured maximum.
        limit: usize,
    },
}

impl HandleError {
    /// Stable name of the refusal, used as the `reason` label.
    pub fn kind(&self) -> &'static str {
        match self {
            HandleError::Oversized { .. } => "oversized",
            HandleError::Wire(e) => e.kind(),
            HandleError::Spoofed { .. } => "spoofed",
            HandleError::Report(e) => e.kind(),
            HandleError::Worker(e) => e.kind(),
            HandleError::Backlog => "backlog",
            HandleError::BookingsFull { .. } => "bookings_full",
        }
    }
}

impl fmt::Display for HandleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandleError::Oversized { len, limit } => write!(
                f,
                "load message of {len} bytes is too large: at most {limit} bytes (max_payload)"
            ),
            HandleError::Wire(e) => e.fmt(f),
            HandleError::Spoofed { subject, worker_id } => write!(
                f,
                "load message for worker {worker_id} arrived on subject {subject:?}, \
                 which belongs to another worker"
            ),
            HandleError::Report(e) => e.fmt(f),
            HandleError::Worker(e) => e.fmt(f),
            HandleError::Backlog => f.write_str(
                "registration queue full: announcement dropped until the next heartbeat",
            ),
            HandleError::BookingsFull { limit } => write!(
                f,
                "router booking refused: {limit} held already (router_bookings_max)"
            ),
        }
    }
}

impl std::error::Error for HandleError {}

/// How many refusal reasons a subscriber counts.
pub(super) const REFUSAL_COUNT: usize =
    4 + WireError::KINDS.len() + ReportError::KINDS.len() + WorkerError::ADD_KINDS.len();

/// Every refusal reason, in metrics order: [`HandleError::kind`] of each
/// variant, with the wire, report and registration kinds taken from their
/// error types.
pub(super) fn refusal_reasons() -> impl Iterator<Item = &'static str> {
    std::iter::once("oversized")
        .chain(WireError::KINDS)
        .chain(["spoofed"])
        .chain(ReportError::KINDS)
        .chain(WorkerError::ADD_KINDS)
        .chain(["backlog", "bookings_full"])
}

/// Counters of a subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SubscriberStats {
    /// Reports applied to known workers.
    pub applied: u64,
    /// Workers registered from their first message.
    pub announced: u64,
    /// Messages dropped as out of order.
    pub out_of_order: u64,
    /// Payloads that were not read: too large, malformed, unknown version
    /// or invalid.
    pub malformed: u64,
    /// Decoded messages refused: spoofed senders, limits, the monitor's
    /// refusals and announcements dropped from a full queue.
    pub refused: u64,
    /// Workers removed after going silent.
    pub expired: u64,
}

pub(super) const STAT_NAMES: [&str; 6] = [
    "applied",
    "announced",
    "out_of_order",
    "malformed",
    "refused",
    "expired",
];

/// Indices into `Subscriber::counters`.
pub(super) const APPLIED: usize = 0;
pub(super) const ANNOUNCED: usize = 1;
pub(super) const OUT_OF_ORDER: usize = 2;
pub(super) const MALFORMED: usize = 3;
pub(super) const REFUSED: usize = 4;
pub(super) const EXPIRED: usize = 5;
