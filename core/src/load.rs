//! The load data every component shares: how a worker is declared
//! ([`WorkerSpec`]) and one rank's load report ([`LoadReport`]).
//!
//! A leaf module: the wire format, the cluster publisher and subscriber, and
//! the monitor all import it, and it imports only the error types. The
//! rules on this data are written here once for every component: a
//! declaration's shape ([`check_model`], [`check_ranks`], which
//! [`Limits::check_declaration`] and the wire decoder both apply), a rank's
//! place among the declared ones ([`rank_index`], for the monitor, the
//! publisher and the wire decoder), and a report's values
//! ([`LoadReport::check`]).
//!
//! [`Limits::check_declaration`]: crate::Limits::check_declaration

use crate::error::{ReportError, WorkerError};

/// Marks `active_prefill_tokens` and `waiting_requests` as never reported,
/// so no report may carry it.
pub(crate) const UNREPORTED: u64 = u64::MAX;

/// Refuses an empty model name.
#[inline]
pub(crate) fn check_model(model: &str) -> Result<(), WorkerError> {
    if model.is_empty() {
        return Err(WorkerError::EmptyModel);
    }
    Ok(())
}

/// The end of ranks `dp_start..dp_start + dp_size`, refused when it
/// overflows `u32`.
#[inline]
pub(crate) fn check_ranks(dp_start: u32, dp_size: u32) -> Result<u32, WorkerError> {
    dp_start
        .checked_add(dp_size)
        .ok_or(WorkerError::InvalidRanks { dp_start, dp_size })
}

/// The index of `dp_rank` among worker `worker_id`'s ranks
/// `dp_start..dp_start + dp_size`, or [`ReportError::UndeclaredRank`] when
/// it is not one of them.
#[inline]
pub(crate) fn rank_index(
    worker_id: u64,
    dp_start: u32,
    dp_size: u32,
    dp_rank: u32,
) -> Result<u32, ReportError> {
    dp_rank
        .checked_sub(dp_start)
        .filter(|i| *i < dp_size)
        .ok_or(ReportError::UndeclaredRank {
            worker_id,
            dp_rank,
            dp_start,
            dp_size,
        })
}

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
    /// Requests every rank runs at once at most (the engine's
    /// `max_num_seqs`), if known; 0 is taken as not known.
    pub max_num_seqs: Option<u64>,
}

impl Default for WorkerSpec {
    fn default() -> Self {
        Self {
            dp_start: 0,
            dp_size: 1,
            kv_total_blocks: None,
            max_num_batched_tokens: None,
            max_num_seqs: None,
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
    /// Requests waiting in the engine's queue (not yet scheduled).
    pub waiting_requests: Option<u64>,
    /// Requests the engine runs at once at most (its `max_num_seqs`); 0 is
    /// taken as not known.
    pub max_num_seqs: Option<u64>,
}

impl LoadReport {
    /// Refuses values no rank can hold: `active_prefill_tokens` or
    /// `waiting_requests` of `u64::MAX` (the marker of a field never
    /// reported).
    #[inline]
    pub(crate) fn check(&self) -> Result<(), ReportError> {
        if self.active_prefill_tokens == Some(UNREPORTED) {
            return Err(ReportError::InvalidValue {
                field: "active_prefill_tokens",
                value: UNREPORTED,
            });
        }
        if self.waiting_requests == Some(UNREPORTED) {
            return Err(ReportError::InvalidValue {
                field: "waiting_requests",
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
        let waiting = |w| LoadReport {
            waiting_requests: Some(w),
            ..Default::default()
        };
        assert_eq!(waiting(u64::MAX - 1).check(), Ok(()));
        assert_eq!(
            waiting(u64::MAX).check(),
            Err(ReportError::InvalidValue {
                field: "waiting_requests",
                value: u64::MAX
            })
        );
    }

    #[test]
    fn a_declaration_needs_a_model_and_ranks_that_fit() {
        assert_eq!(check_model("m"), Ok(()));
        assert_eq!(check_model(""), Err(WorkerError::EmptyModel));
        assert_eq!(check_ranks(2, 3), Ok(5));
        assert_eq!(check_ranks(u32::MAX, 0), Ok(u32::MAX));
        assert_eq!(
            check_ranks(u32::MAX, 1),
            Err(WorkerError::InvalidRanks {
                dp_start: u32::MAX,
                dp_size: 1
            })
        );
    }

    #[test]
    fn only_declared_ranks_have_an_index() {
        assert_eq!(rank_index(7, 2, 3, 2), Ok(0));
        assert_eq!(rank_index(7, 2, 3, 4), Ok(2));
        for dp_rank in [0, 1, 5, u32::MAX] {
            assert_eq!(
                rank_index(7, 2, 3, dp_rank),
                Err(ReportError::UndeclaredRank {
                    worker_id: 7,
                    dp_rank,
                    dp_start: 2,
                    dp_size: 3
                })
            );
        }
        assert!(rank_index(7, 0, 0, 0).is_err(), "no ranks, no index");
        assert_eq!(rank_index(7, u32::MAX - 1, 1, u32::MAX - 1), Ok(0));
    }
}
