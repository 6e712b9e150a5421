//! What a booking sync's received message did, why one was refused, and
//! what a sync has done so far.

use std::fmt;

use crate::cluster::wire::WireError;

/// What a received message did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncApplied {
    /// Applied: this frontend's view of the sender is its state as of
    /// the message.
    Applied,
    /// Applied, but a message of the sender was missed (or it is heard
    /// for the first time by a change): ranks it changed last may be
    /// stale until its whole state comes, which this frontend asks for.
    Behind,
    /// This frontend's own message, come back: ignored.
    Own,
    /// Not newer than the last applied from its frontend: dropped.
    OutOfOrder,
}

/// Why a received message was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncError {
    /// Longer than `max_payload`.
    Oversized {
        /// Its length.
        len: usize,
        /// The bound.
        limit: usize,
    },
    /// Not a booking sync message.
    Wire(WireError),
    /// Its frontend is not its subject's.
    Spoofed {
        /// The subject it came on.
        subject: String,
        /// The frontend it names.
        frontend: String,
    },
    /// A new frontend beyond `max_frontends`.
    TooManyFrontends {
        /// The bound.
        limit: usize,
    },
    /// More rank entries, over every other frontend, than `max_entries`.
    TooManyEntries {
        /// The bound.
        limit: usize,
    },
    /// More queues of one frontend than [`MAX_QUEUES`](super::MAX_QUEUES).
    TooManyQueues {
        /// The bound.
        limit: usize,
    },
}

impl fmt::Display for SyncError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Oversized { len, limit } => {
                write!(f, "booking sync message of {len} bytes: at most {limit}")
            }
            Self::Wire(e) => write!(f, "booking sync message: {e}"),
            Self::Spoofed { subject, frontend } => write!(
                f,
                "booking sync message of frontend {frontend:?} on subject {subject:?}"
            ),
            Self::TooManyFrontends { limit } => {
                write!(f, "booking sync message of a new frontend beyond {limit}")
            }
            Self::TooManyEntries { limit } => write!(
                f,
                "booking sync message beyond {limit} rank entries over every frontend"
            ),
            Self::TooManyQueues { limit } => write!(
                f,
                "booking sync message beyond {limit} queues of one frontend"
            ),
        }
    }
}

impl std::error::Error for SyncError {}

/// What a sync has done so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SyncStats {
    /// Messages sent.
    pub sent: u64,
    /// Of them, whole states (joins, repairs asked for, `snapshot_every`).
    pub snapshots_sent: u64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Others' messages applied.
    pub received: u64,
    /// Bytes of the others' messages applied.
    pub bytes_received: u64,
    /// Others' messages missed, by their sequence numbers.
    pub gaps: u64,
    /// Others' messages dropped as not newer.
    pub out_of_order: u64,
    /// Whole states asked of the others after a gap.
    pub resyncs: u64,
    /// Payloads refused (oversized, malformed, spoofed, too many
    /// frontends, entries or queues).
    pub refused: u64,
    /// Frontends forgotten after their silence.
    pub expired: u64,
    /// Other frontends tracked now.
    pub frontends: usize,
    /// Of them, those whose whole state is awaited after a gap.
    pub behind: usize,
    /// Bytes of the last message sent.
    pub last_size: usize,
    /// Leased mode: the share of every rank's line this frontend uses now,
    /// in parts per million.
    pub share: u32,
    /// Leased mode: the share it claims (above `share` while a raise is
    /// being confirmed).
    pub claim: u32,
    /// Leased mode: times its lease ran out while it held a share.
    pub fenced: u64,
}
