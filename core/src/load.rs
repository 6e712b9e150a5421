//! The load data every component shares: how a worker is declared
//! ([`WorkerSpec`]) and one rank's load report ([`LoadReport`]).
//!
//! A leaf module: the wire format, the cluster publisher and subscriber, and
//! the monitor all import it, and it imports only the error types. A
//! declaration's sizes are checked by [`Limits::check_declaration`]; a
//! report's values by [`LoadReport::check`], once for every component.
//!
//! [`Limits::check_declaration`]: crate::Limits::check_declaration

use crate::error::ReportError;

/// Marks `active_prefill_tokens` as never reported, so no report may carry it.
pub(crate) const UNREPORTED: u64 = u64::MAX;

/// How a worker is declared: its ranks and known capacities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerSpec {
    /// First data-parallel rank.
    pub dp_start: u32,
    /// Number of ranks (0 is allowed: a worker with no ranks is never busy).
    pub dp_size: u32,
    /// KV cache capacity of every rank, if known.
    pub kv_total_blocks: Option<u64>,
    /// Prefill batch capacity of every rank, if known.
    pub max_num_batched_tokens: Option<u64>,
}

impl Default for WorkerSpec {
    fn default() -> Self {
        Self {
            dp_start: 0,
            dp_size: 1,
            kv_total_blocks: None,
            max_num_batched_tokens: None,
        }
    }
}

/// One load report for one rank: absent fields keep their value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoadReport {
    /// Router-side active decode blocks.
    pub active_decode_blocks: Option<u64>,
    /// KV cache blocks in use.
    pub kv_used_blocks: Option<u64>,
    /// KV cache capacity.
    pub kv_total_blocks: Option<u64>,
    /// Prefill tokens in flight.
    pub active_prefill_tokens: Option<u64>,
    /// Prefill batch capacity.
    pub max_num_batched_tokens: Option<u64>,
}

impl LoadReport {
    /// Refuses values no rank can hold: `active_prefill_tokens` of
    /// `u64::MAX` (the marker of a field never reported).
    #[inline]
    pub(crate) fn check(&self) -> Result<(), ReportError> {
        if self.active_prefill_tokens == Some(UNREPORTED) {
            return Err(ReportError::InvalidValue {
                field: "active_prefill_tokens",
                value: UNREPORTED,
            });
        }
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn only_the_unreported_marker_is_refused() {
        assert_eq!(LoadReport::default().check(), Ok(()));
        let most = LoadReport {
            active_prefill_tokens: Some(u64::MAX - 1),
            ..Default::default()
        };
        assert_eq!(most.check(), Ok(()));
        let marker = LoadReport {
            active_prefill_tokens: Some(u64::MAX),
            ..Default::default()
        };
        assert_eq!(
            marker.check(),
            Err(ReportError::InvalidValue {
                field: "active_prefill_tokens",
                value: u64::MAX
            })
        );
    }
}
