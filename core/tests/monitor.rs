//! One test per rule of the frontend monitor's load model and busy rule:
//! docs/behaviour.md#load-model, #busy-rule and #bad-input-and-limits
//! (routing, leases, bookings, staleness and metrics are in
//! `monitor_routing.rs`).

mod support;

use support::monitor_fixture::{
    decode, monitor, prefill, spec, used, waiting, waiting_threshold, M,
};

use loadgate::monitor::ThresholdState;
use loadgate::{
    LoadReport, Policy, ReportError, ThresholdError, ThresholdField, ThresholdUpdate, WorkerSpec,
};

#[test]
fn absent_fields_keep_and_present_zero_overwrites() {
    let (m, _) = monitor();
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.report(
        1,
        0,
        &LoadReport {
            kv_used_blocks: Some(40),
            active_prefill_tokens: Some(7),
            ..Default::default()
        },
    )
    .unwrap();
    m.report(
        1,
        0,
        &LoadReport {
            active_decode_blocks: Some(3),
            ..Default::default()
        },
    )
    .unwrap();
    let l = m.rank_load(1, 0).unwrap();
    assert_eq!(
        (
            l.kv_used_blocks,
            l.active_decode_blocks,
            l.active_prefill_tokens
        ),
        (40, 3, Some(7))
    );
    assert_eq!(l.kv_total_blocks, 100);
    m.report(
        1,
        0,
        &LoadReport {
            kv_used_blocks: Some(0),
            active_prefill_tokens: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    let l = m.rank_load(1, 0).unwrap();
    assert_eq!(
        (
            l.kv_used_blocks,
            l.active_decode_blocks,
            l.active_prefill_tokens
        ),
        (0, 3, Some(0))
    );
}

#[test]
fn a_report_of_one_field_never_overwrites_another() {
    let (m, _) = monitor();
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    let _booking = m.book(1, 0, 60).unwrap();
    m.report(1, 0, &used(10)).unwrap();
    assert_eq!(m.rank_load(1, 0).unwrap().active_decode_blocks, 60);
    m.set_thresholds(M, &decode(0.5)).unwrap();
    assert!(
        m.is_busy(1).unwrap(),
        "router-side decode blocks still count after a kv_used report"
    );
}

#[test]
fn bad_reports_are_refused_counted_and_change_nothing() {
    let (m, _) = monitor();
    m.add_worker(
        M,
        1,
        WorkerSpec {
            dp_start: 2,
            dp_size: 2,
            ..Default::default()
        },
    )
    .unwrap();
    m.report(1, 2, &used(5)).unwrap();
    assert_eq!(m.report(9, 0, &used(1)), Err(ReportError::UnknownWorker(9)));
    let err = m.report(1, 4, &used(1)).unwrap_err();
    assert_eq!(
        err,
        ReportError::UndeclaredRank {
            worker_id: 1,
            dp_rank: 4,
            dp_start: 2,
            dp_size: 2
        }
    );
    assert!(err.to_string().contains("2..4"), "{err}");
    assert!(m.report(1, 1, &used(1)).is_err());
    let err = m
        .report(
            1,
            2,
            &LoadReport {
                kv_used_blocks: Some(9),
                ..prefill(u64::MAX)
            },
        )
        .unwrap_err();
    assert!(matches!(
        err,
        ReportError::InvalidValue {
            field: "active_prefill_tokens",
            ..
        }
    ));
    assert_eq!(
        m.rank_load(1, 2).unwrap().kv_used_blocks,
        5,
        "a refused report applies nothing"
    );
    assert_eq!(
        m.refused_reports(),
        [
            ("unknown_worker", 1),
            ("undeclared_rank", 2),
            ("invalid_value", 1)
        ]
    );
    let text = m.metrics_text();
    assert!(
        text.contains("dynamo_frontend_load_reports_refused_total{reason=\"undeclared_rank\"} 2"),
        "{text}"
    );
}

#[test]
fn nothing_is_busy_until_a_threshold_is_set() {
    let (m, _) = monitor();
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.report(
        1,
        0,
        &LoadReport {
            kv_used_blocks: Some(100),
            active_prefill_tokens: Some(1 << 40),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!m.is_busy(1).unwrap());
    assert_eq!(m.select(M, Policy::RoundRobin), Ok(1));
}

#[test]
fn decode_check_is_strict_on_both_signals_with_latch() {
    let (m, _) = monitor();
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.set_thresholds(M, &decode(0.5)).unwrap();
    m.report(1, 0, &used(50)).unwrap();
    assert!(!m.is_busy(1).unwrap(), "50 is not above 0.5 * 100");
    m.report(1, 0, &used(51)).unwrap();
    assert!(m.is_busy(1).unwrap());
    // The router's view goes high while kv_used drops: still busy.
    let booking = m.book(1, 0, 70).unwrap();
    m.report(1, 0, &used(0)).unwrap();
    assert!(
        m.is_busy(1).unwrap(),
        "cleared only when both signals are at or below the line"
    );
    drop(booking);
    assert!(!m.is_busy(1).unwrap());
}

#[test]
fn zero_or_unknown_kv_total_never_trips_decode() {
    let (m, _) = monitor();
    m.add_worker(M, 1, WorkerSpec::default()).unwrap();
    m.set_thresholds(M, &decode(0.0)).unwrap();
    m.report(1, 0, &used(1_000_000)).unwrap();
    assert!(!m.is_busy(1).unwrap(), "unknown kv_total");
    m.report(
        1,
        0,
        &LoadReport {
            kv_total_blocks: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!m.is_busy(1).unwrap(), "kv_total 0");
    m.report(
        1,
        0,
        &LoadReport {
            kv_total_blocks: Some(10),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(m.is_busy(1).unwrap());
}

#[test]
fn prefill_checks_apply_only_to_ranks_that_reported_prefill() {
    let (m, _) = monitor();
    m.add_worker(M, 1, spec(2, 100)).unwrap();
    m.set_thresholds(
        M,
        &ThresholdUpdate {
            active_prefill_tokens_threshold: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    m.report(1, 0, &prefill(1)).unwrap();
    assert!(
        !m.is_busy(1).unwrap(),
        "rank 1 never reported prefill, so it is free"
    );
    m.report(1, 1, &prefill(0)).unwrap();
    assert!(!m.is_busy(1).unwrap(), "0 is not above 0");
    m.report(1, 1, &prefill(1)).unwrap();
    assert!(m.is_busy(1).unwrap());
}

#[test]
fn waiting_requests_check_applies_only_to_ranks_that_reported_them() {
    let (m, _) = monitor();
    m.add_worker(M, 1, spec(2, 100)).unwrap();
    m.set_thresholds(M, &waiting_threshold(4)).unwrap();
    m.report(1, 0, &waiting(9)).unwrap();
    assert!(
        !m.is_busy(1).unwrap(),
        "rank 1 never reported waiting requests, so it is free"
    );
    m.report(1, 1, &waiting(4)).unwrap();
    assert!(!m.is_busy(1).unwrap(), "4 is not above 4");
    m.report(1, 1, &waiting(5)).unwrap();
    assert!(m.is_busy(1).unwrap());
    // Independent of the other checks: other fields never clear it ...
    m.report(1, 1, &used(0)).unwrap();
    m.report(1, 1, &prefill(0)).unwrap();
    assert!(m.is_busy(1).unwrap());
    // ... and an absent field keeps the value, a present 0 overwrites.
    m.report(1, 1, &LoadReport::default()).unwrap();
    assert_eq!(m.rank_load(1, 1).unwrap().waiting_requests, Some(5));
    m.report(1, 1, &waiting(0)).unwrap();
    assert!(!m.is_busy(1).unwrap());
    assert_eq!(m.rank_load(1, 0).unwrap().waiting_requests, Some(9));
}

#[test]
fn waiting_requests_threshold_is_versioned_clearable_and_effective_at_once() {
    let (m, _) = monitor();
    for id in 0..4 {
        m.add_worker(M, id, spec(1, 100)).unwrap();
        m.report(id, 0, &waiting(id * 10)).unwrap();
    }
    assert!(m.busy_workers(M).is_empty(), "no threshold, nothing busy");
    let state = m.set_thresholds(M, &waiting_threshold(15)).unwrap();
    assert_eq!(state.version, 1);
    assert_eq!(state.thresholds.waiting_requests_threshold, Some(15));
    assert_eq!(
        m.busy_workers(M),
        vec![2, 3],
        "re-evaluated before returning"
    );
    // Merged: setting another field keeps it.
    m.set_thresholds(M, &decode(0.9)).unwrap();
    let t = m.thresholds(M).unwrap();
    assert_eq!(t.version, 2);
    assert_eq!(t.thresholds.waiting_requests_threshold, Some(15));
    assert_eq!(m.busy_workers(M), vec![2, 3]);
    // u64::MAX is a legal threshold that never trips.
    m.set_thresholds(M, &waiting_threshold(u64::MAX)).unwrap();
    assert!(m.busy_workers(M).is_empty());
    assert_eq!(
        m.thresholds(M)
            .unwrap()
            .thresholds
            .waiting_requests_threshold,
        Some(u64::MAX)
    );
    m.set_thresholds(M, &waiting_threshold(0)).unwrap();
    assert_eq!(m.busy_workers(M), vec![1, 2, 3]);
    let cleared = m
        .set_thresholds(
            M,
            &ThresholdUpdate {
                clear: ThresholdField::WaitingRequests.into(),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(cleared.thresholds.waiting_requests_threshold, None);
    assert_eq!(cleared.thresholds.active_decode_blocks_threshold, Some(0.9));
    assert_eq!(cleared.version, 5);
    assert!(m.busy_workers(M).is_empty());
    // Setting and clearing it at once is refused and changes nothing.
    let both = ThresholdUpdate {
        waiting_requests_threshold: Some(1),
        clear: ThresholdField::WaitingRequests.into(),
        ..Default::default()
    };
    assert_eq!(
        m.set_thresholds(M, &both),
        Err(ThresholdError::SetAndClear("waiting_requests_threshold"))
    );
    assert_eq!(m.thresholds(M).unwrap().version, 5);
}

#[test]
fn waiting_requests_have_a_gauge_and_refuse_the_reserved_value() {
    let (m, _) = monitor();
    m.add_worker(M, 1, spec(2, 100)).unwrap();
    m.report(1, 1, &waiting(7)).unwrap();
    let text = m.metrics_text();
    assert!(text.contains("# TYPE dynamo_frontend_worker_waiting_requests gauge"));
    assert!(
        text.contains("dynamo_frontend_worker_waiting_requests{dp_rank=\"1\",worker_id=\"1\",worker_type=\"decode\"} 7"),
        "{text}"
    );
    assert!(
        !text.contains("waiting_requests{dp_rank=\"0\",worker_id=\"1\""),
        "unreported waiting requests have no series"
    );
    assert_eq!(
        m.report(1, 1, &waiting(u64::MAX)),
        Err(ReportError::InvalidValue {
            field: "waiting_requests",
            value: u64::MAX
        })
    );
    assert_eq!(m.rank_load(1, 1).unwrap().waiting_requests, Some(7));
}

#[test]
fn fractional_prefill_defaults_max_batched_tokens_to_ten_million() {
    let (m, _) = monitor();
    m.add_worker(M, 1, WorkerSpec::default()).unwrap();
    m.add_worker(
        M,
        2,
        WorkerSpec {
            max_num_batched_tokens: Some(100),
            ..Default::default()
        },
    )
    .unwrap();
    m.set_thresholds(
        M,
        &ThresholdUpdate {
            active_prefill_tokens_threshold_frac: Some(0.5),
            ..Default::default()
        },
    )
    .unwrap();
    m.report(1, 0, &prefill(5_000_000)).unwrap();
    assert!(!m.is_busy(1).unwrap());
    m.report(1, 0, &prefill(5_000_001)).unwrap();
    assert!(m.is_busy(1).unwrap());
    m.report(2, 0, &prefill(50)).unwrap();
    assert!(!m.is_busy(2).unwrap());
    m.report(2, 0, &prefill(51)).unwrap();
    assert!(m.is_busy(2).unwrap());
    // A fraction above 1 is legal.
    m.set_thresholds(
        M,
        &ThresholdUpdate {
            active_prefill_tokens_threshold_frac: Some(64.0),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!m.is_busy(2).unwrap());
    m.report(2, 0, &prefill(6401)).unwrap();
    assert!(m.is_busy(2).unwrap());
}

#[test]
fn a_worker_is_busy_only_when_all_declared_ranks_are() {
    let (m, _) = monitor();
    m.add_worker(
        M,
        1,
        WorkerSpec {
            dp_start: 4,
            dp_size: 2,
            kv_total_blocks: Some(10),
            ..Default::default()
        },
    )
    .unwrap();
    m.set_thresholds(M, &decode(0.5)).unwrap();
    m.report(1, 4, &used(9)).unwrap();
    assert!(
        !m.is_busy(1).unwrap(),
        "rank 5 has not reported: it is free"
    );
    m.report(1, 5, &used(9)).unwrap();
    assert!(m.is_busy(1).unwrap());
    m.report(1, 5, &used(1)).unwrap();
    assert!(!m.is_busy(1).unwrap());
}

#[test]
fn a_worker_with_no_ranks_is_free() {
    let (m, _) = monitor();
    m.add_worker(
        M,
        1,
        WorkerSpec {
            dp_size: 0,
            ..Default::default()
        },
    )
    .unwrap();
    m.set_thresholds(M, &decode(0.0)).unwrap();
    assert!(!m.is_busy(1).unwrap());
    assert!(matches!(
        m.report(1, 0, &used(1)),
        Err(ReportError::UndeclaredRank { .. })
    ));
    assert_eq!(m.select(M, Policy::RoundRobin), Ok(1));
}

#[test]
fn threshold_updates_validate_merge_clear_and_bump_the_version() {
    let (m, _) = monitor();
    assert_eq!(
        m.set_thresholds(M, &decode(0.5)),
        Err(ThresholdError::UnknownModel(M.into()))
    );
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    assert_eq!(m.thresholds(M), Some(ThresholdState::default()));
    let s = m.set_thresholds(M, &decode(0.5)).unwrap();
    assert_eq!(s.version, 1);
    let s = m
        .set_thresholds(
            M,
            &ThresholdUpdate {
                active_prefill_tokens_threshold: Some(10),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(s.version, 2);
    assert_eq!(
        s.thresholds.active_decode_blocks_threshold,
        Some(0.5),
        "merge keeps unnamed fields"
    );
    assert_eq!(s.thresholds.active_prefill_tokens_threshold, Some(10));
    for bad in [f64::NAN, f64::INFINITY, -0.5, 1.5] {
        let err = m.set_thresholds(M, &decode(bad)).unwrap_err();
        assert!(
            err.to_string().contains("active_decode_blocks_threshold"),
            "{err}"
        );
    }
    for bad in [f64::NAN, f64::NEG_INFINITY, -1.0] {
        let up = ThresholdUpdate {
            active_prefill_tokens_threshold_frac: Some(bad),
            ..Default::default()
        };
        assert!(m.set_thresholds(M, &up).is_err());
    }
    assert_eq!(
        m.thresholds(M).unwrap().version,
        2,
        "refused updates change nothing"
    );
    let s = m
        .set_thresholds(
            M,
            &ThresholdUpdate {
                clear: ThresholdField::ActiveDecodeBlocks.into(),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(s.thresholds.active_decode_blocks_threshold, None);
    assert_eq!(s.version, 3);
    assert_eq!(
        m.set_thresholds(M, &ThresholdUpdate::default())
            .unwrap()
            .version,
        3,
        "empty update is a read"
    );
}

#[test]
fn thresholds_take_effect_before_the_update_returns() {
    let (m, _) = monitor();
    for id in 0..5 {
        m.add_worker(M, id, spec(2, 100)).unwrap();
        m.report(id, 0, &used(80)).unwrap();
        m.report(id, 1, &used(if id < 3 { 80 } else { 10 }))
            .unwrap();
    }
    assert!(m.busy_workers(M).is_empty());
    let epoch = m.busy_epoch(M).unwrap();
    m.set_thresholds(M, &decode(0.5)).unwrap();
    assert_eq!(m.busy_workers(M), vec![0, 1, 2]);
    assert_eq!(
        m.busy_epoch(M).unwrap(),
        epoch + 3,
        "each flip bumps the epoch"
    );
    m.set_thresholds(M, &decode(0.9)).unwrap();
    assert!(m.busy_workers(M).is_empty());
}

#[test]
fn thresholds_are_per_model() {
    let (m, _) = monitor();
    m.add_worker("a", 1, spec(1, 100)).unwrap();
    m.add_worker("b", 2, spec(1, 100)).unwrap();
    m.report(1, 0, &used(90)).unwrap();
    m.report(2, 0, &used(90)).unwrap();
    m.set_thresholds("a", &decode(0.5)).unwrap();
    assert!(m.is_busy(1).unwrap());
    assert!(!m.is_busy(2).unwrap());
    assert_eq!(m.thresholds("b").unwrap().version, 0);
}
