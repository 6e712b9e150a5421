//! A booking sync's settings, their defaults and their bounds.

use std::time::Duration;

use super::super::transport::check_token;
use super::super::{ClusterError, DEFAULT_HEARTBEAT};

/// Default [`BookingSyncConfig::lease`].
pub const DEFAULT_LEASE: Duration = Duration::from_secs(1);
/// Default [`BookingSyncConfig::debounce`].
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(2);
/// Default [`BookingSyncConfig::snapshot_every`].
pub const DEFAULT_SNAPSHOT_EVERY: Duration = Duration::from_secs(10);
/// Default [`BookingSyncConfig::max_frontends`].
pub const DEFAULT_MAX_FRONTENDS: usize = 64;
/// Default [`BookingSyncConfig::max_entries`].
pub const DEFAULT_MAX_ENTRIES: usize = 1 << 18;
/// Largest [`BookingSyncConfig::max_frontends`].
pub const MAX_FRONTENDS: usize = 4096;
/// Most queues one other frontend's messages may leave held (one per
/// flow-controlled model of its).
pub const MAX_QUEUES: usize = 1024;
/// Most blocks or prefill tokens one frontend's messages add to a rank;
/// more is cut to it, so that the others' bookings summed never saturate a
/// rank's count (at most [`MAX_FRONTENDS`] of them) and leave it exact when
/// they go.
pub const MAX_SHARED: u64 = 1 << 48;
/// Default [`BookingSyncConfig::max_payload`]: a rank entry takes about 20
/// bytes, so 1 MiB holds a whole state of over 40,000 booked ranks.
pub const DEFAULT_SNAPSHOT_MAX_PAYLOAD: usize = 1 << 20;

/// How the frontends share the workers (docs/replicas.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// Each frontend sees the others' bookings and books by the busy rule
    /// on the total: over-admission bounded by what the others book within
    /// the sync delay.
    #[default]
    Shared,
    /// Each frontend books only within its leased share of every rank's
    /// line, and the shares in use never sum past the line: no
    /// over-admission.
    Leased,
}

/// One frontend's sync settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BookingSyncConfig {
    /// This frontend's id: one NATS token, unique among the frontends.
    pub frontend_id: String,
    /// Shared (default) or leased.
    pub mode: SyncMode,
    /// Leased mode: how long a share outlives the last echo of this
    /// frontend (default 1 s); snapshots go out at least every quarter
    /// lease, and a new frontend waits one and a half leases before it
    /// claims. At least four debounce intervals, at most half of
    /// `expire_after`.
    pub lease: Duration,
    /// At most one message per interval (default 2 ms): what changed in
    /// it goes out at the next tick.
    pub debounce: Duration,
    /// With nothing changed, an empty message goes out this often (default
    /// 1 s): it keeps this frontend alive in the others' view, and shows
    /// them a lost message by its sequence number.
    pub heartbeat: Duration,
    /// The whole state goes out this often (default 10 s), besides on a
    /// join and when a frontend that missed a message asks; at least
    /// `heartbeat`.
    pub snapshot_every: Duration,
    /// A frontend silent this long is forgotten (default 3 s).
    pub expire_after: Duration,
    /// Most other frontends tracked (default 64).
    pub max_frontends: usize,
    /// Longest message read (default 1 MiB); longer ones are refused
    /// unread.
    pub max_payload: usize,
    /// Most rank entries kept over every other frontend (default 262,144:
    /// about 16 MiB), whether their workers are known here or not; a
    /// message that would pass it is refused.
    pub max_entries: usize,
}

impl BookingSyncConfig {
    /// Settings for frontend `frontend_id`, every other one at its default.
    pub fn new(frontend_id: impl Into<String>) -> Self {
        Self {
            frontend_id: frontend_id.into(),
            mode: SyncMode::Shared,
            lease: DEFAULT_LEASE,
            debounce: DEFAULT_DEBOUNCE,
            heartbeat: DEFAULT_HEARTBEAT,
            snapshot_every: DEFAULT_SNAPSHOT_EVERY,
            expire_after: 3 * DEFAULT_HEARTBEAT,
            max_frontends: DEFAULT_MAX_FRONTENDS,
            max_payload: DEFAULT_SNAPSHOT_MAX_PAYLOAD,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }

    pub(super) fn validate(&self) -> Result<(), ClusterError> {
        check_token(&self.frontend_id, "frontend_id")?;
        let invalid = |s: &str| Err(ClusterError::InvalidConfig(s.into()));
        if self.debounce.is_zero() || self.heartbeat < self.debounce {
            return invalid("debounce must be positive and heartbeat at least debounce");
        }
        if self.snapshot_every < self.heartbeat {
            return invalid("snapshot_every must be at least heartbeat");
        }
        if self.expire_after <= self.heartbeat {
            return invalid("expire_after must be longer than heartbeat");
        }
        if !(1..=MAX_FRONTENDS).contains(&self.max_frontends) {
            return invalid("max_frontends must be from 1 to 4096");
        }
        if self.max_payload == 0 || self.max_entries == 0 {
            return invalid("max_payload and max_entries must be at least 1");
        }
        if self.mode == SyncMode::Leased
            && (self.lease < 4 * self.debounce || self.expire_after < 2 * self.lease)
        {
            return invalid(
                "leased mode: lease must be at least four debounce intervals and at most half \
                 of expire_after",
            );
        }
        Ok(())
    }
}
