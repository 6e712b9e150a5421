//! The subscriber's refusal reasons, each counted under its own name.

use super::*;
use crate::cluster::wire::WireError;

#[test]
fn every_refusal_reason_is_counted_under_its_own_name() {
    let reasons: Vec<&str> = refusal_reasons().collect();
    assert_eq!(reasons.len(), REFUSAL_COUNT);
    let mut unique = reasons.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), reasons.len(), "{reasons:?}");
    for e in [
        HandleError::Oversized { len: 2, limit: 1 },
        HandleError::Spoofed {
            subject: "s".into(),
            worker_id: 1,
        },
        HandleError::Backlog,
        HandleError::BookingsFull { limit: 1 },
        HandleError::Wire(WireError::Invalid(String::new())),
        HandleError::Report(ReportError::UnknownWorker(1)),
        HandleError::Worker(WorkerError::RankBudget {
            dp_size: 1,
            limit: 1,
        }),
    ] {
        assert!(reasons.contains(&e.kind()), "{e}");
    }
}
