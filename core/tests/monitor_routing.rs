//! One test per rule of the frontend monitor's routing and what surrounds it:
//! docs/behaviour.md#busy-set-and-routing (selection, leases, bookings,
//! staleness), #metrics and the workers' registration.

mod support;

use support::monitor_fixture::{decode, monitor, spec, used, M};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use loadgate::monitor::DEFAULT_ENDPOINT;
use loadgate::thresholds::RankLoad;
use loadgate::{
    Clock, LoadReport, ManualClock, Monitor, MonitorConfig, Policy, ReportError, RouteError,
    Staleness, ThresholdError, WorkerError, WorkerSpec,
};

#[test]
fn select_errors_distinguish_overloaded_from_unavailable() {
    let (m, _) = monitor();
    assert_eq!(
        m.select(M, Policy::RoundRobin),
        Err(RouteError::Unavailable)
    );
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.add_worker(M, 2, spec(1, 100)).unwrap();
    m.set_thresholds(M, &decode(0.5)).unwrap();
    m.report(1, 0, &used(60)).unwrap();
    assert_eq!(m.select(M, Policy::RoundRobin), Ok(2));
    m.report(2, 0, &used(60)).unwrap();
    for policy in [Policy::RoundRobin, Policy::Random, Policy::PowerOfTwo] {
        let err = m.select(M, policy).unwrap_err();
        assert_eq!(err, RouteError::Overloaded);
        assert_eq!(err.to_string(), "All workers are busy, please retry later");
    }
    assert_eq!(
        m.select_at(M, Policy::RoundRobin, "chat/completions"),
        Err(RouteError::Overloaded)
    );
    m.remove_worker(1).unwrap();
    m.remove_worker(2).unwrap();
    let err = m.select(M, Policy::RoundRobin).unwrap_err();
    assert_eq!(err, RouteError::Unavailable);
    assert_eq!(err.to_string(), "No workers available");
    let text = m.metrics_text();
    assert!(
        text.contains(&format!(
        "dynamo_frontend_model_rejection_total{{model=\"llama\",endpoint=\"{DEFAULT_ENDPOINT}\"}} 3"
    )),
        "{text}"
    );
    assert!(text.contains(
        "dynamo_frontend_model_rejection_total{model=\"llama\",endpoint=\"chat/completions\"} 1"
    ));
    assert!(text.contains(
        "dynamo_frontend_model_rejection_by_reason_total{model=\"llama\",reason=\"no_workers\"} 1"
    ));
}

#[test]
fn a_route_selects_like_the_monitor_while_workers_come_and_go() {
    let (m, _) = monitor();
    assert_eq!(m.route("").unwrap_err(), WorkerError::EmptyModel);
    // A route to a model with no workers yet answers Unavailable.
    let route = m.route(M).unwrap();
    assert_eq!(route.model(), M);
    assert_eq!(
        route.select(Policy::RoundRobin),
        Err(RouteError::Unavailable)
    );
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.add_worker(M, 2, spec(1, 100)).unwrap();
    m.set_thresholds(M, &decode(0.5)).unwrap();
    m.report(1, 0, &used(60)).unwrap();
    for policy in [Policy::RoundRobin, Policy::Random, Policy::PowerOfTwo] {
        assert_eq!(route.select(policy), Ok(2));
    }
    m.mark_overloaded(2).unwrap();
    assert_eq!(route.select(Policy::Random), Err(RouteError::Overloaded));
    m.report(2, 0, &used(10)).unwrap();
    assert_eq!(route.select(Policy::PowerOfTwo), Ok(2));
    m.report(2, 0, &used(60)).unwrap();
    assert_eq!(
        route.select_at(Policy::RoundRobin, "chat/completions"),
        Err(RouteError::Overloaded)
    );
    // Removing every worker and adding one back: the same handle follows.
    m.remove_worker(1).unwrap();
    m.remove_worker(2).unwrap();
    assert_eq!(
        route.clone().select(Policy::RoundRobin),
        Err(RouteError::Unavailable)
    );
    m.add_worker(M, 3, spec(1, 100)).unwrap();
    assert_eq!(m.route(M).unwrap().select(Policy::RoundRobin), Ok(3));
    assert_eq!(route.select(Policy::Random), Ok(3));
    // Rejections through a route count on the model like Monitor::select's.
    let text = m.metrics_text();
    for line in [
        format!("dynamo_frontend_model_rejection_total{{model=\"llama\",endpoint=\"{DEFAULT_ENDPOINT}\"}} 1"),
        "dynamo_frontend_model_rejection_total{model=\"llama\",endpoint=\"chat/completions\"} 1".into(),
        "dynamo_frontend_model_rejection_by_reason_total{model=\"llama\",reason=\"no_workers\"} 2".into(),
    ] {
        assert!(text.contains(&line), "{line} in\n{text}");
    }
}

#[test]
fn random_is_uniform_over_eligible_workers_at_any_width() {
    // 5000 slots (wider than the one-pass path's 4096) and 300 (within it),
    // both with few free workers so that random probes are skipped.
    for (workers, free) in [
        (300u64, [7u64, 64, 130, 299]),
        (5000, [3, 2000, 4095, 4999]),
    ] {
        let config = MonitorConfig {
            limits: loadgate::Limits {
                max_workers_per_model: 5000,
                ..loadgate::Limits::default()
            },
            ..Default::default()
        };
        let m = Monitor::with_config(config, ManualClock::new()).unwrap();
        for id in 0..workers {
            m.add_worker(M, id, spec(1, 100)).unwrap();
        }
        m.set_thresholds(M, &decode(0.5)).unwrap();
        for id in (0..workers).filter(|id| !free.contains(id)) {
            m.report(id, 0, &used(90)).unwrap();
        }
        for policy in [Policy::Random, Policy::PowerOfTwo] {
            let c = counts(&m, policy, 4000);
            assert_eq!(c.keys().copied().collect::<Vec<_>>(), free.to_vec());
            assert!(
                c.values().all(|n| (800..1200).contains(n)),
                "{workers} workers, {policy:?}: {c:?}"
            );
        }
    }
}

#[test]
fn random_stays_uniform_while_the_busy_set_membership_and_leases_change() {
    // 200 workers, all busy but a few: random picks use the free list once
    // the busy set holds still, and every change must show in the picks.
    // (Power-of-two favours the less loaded of its two uniform draws, so
    // only the workers it reaches are checked.)
    let free = [5u64, 70, 133, 199];
    let m = decode_model(0..200, |id| !free.contains(&id));
    let uniform_over = |want: &[u64], what: &str| {
        for policy in [Policy::Random, Policy::PowerOfTwo] {
            let n = want.len() * 600;
            let c = counts(&m, policy, n);
            assert_eq!(
                c.keys().copied().collect::<Vec<_>>(),
                want,
                "{what}, {policy:?}"
            );
            assert!(
                policy != Policy::Random || c.values().all(|k| (450..750).contains(k)),
                "{what}, {policy:?}: {c:?}"
            );
        }
    };
    uniform_over(&free, "four free");
    m.report(70, 0, &used(10)).unwrap(); // already free: no change
    m.report(133, 0, &used(90)).unwrap();
    uniform_over(&[5, 70, 199], "one turned busy");
    m.report(100, 0, &used(10)).unwrap();
    uniform_over(&[5, 70, 100, 199], "one turned free");
    m.remove_worker(5).unwrap();
    uniform_over(&[70, 100, 199], "one removed");
    m.add_worker(M, 500, spec(1, 100)).unwrap();
    uniform_over(&[70, 100, 199, 500], "one added");
    m.mark_overloaded(199).unwrap();
    uniform_over(&[70, 100, 500], "one leased");
    for id in [70, 100, 500] {
        m.report(id, 0, &used(90)).unwrap();
    }
    assert_eq!(m.select(M, Policy::Random), Err(RouteError::Overloaded));
    assert_eq!(m.select(M, Policy::PowerOfTwo), Err(RouteError::Overloaded));
}

#[test]
fn min_cost_agrees_with_a_plain_filter_then_minimum() {
    // Random busy sets, leases and candidate lists (ties, NaN, unknown and
    // foreign ids) against the obvious definition: drop the ineligible, then
    // the lowest cost wins, NaN counts as +inf, and the first of equals wins.
    let m = decode_model(0..40, |_| false);
    m.add_worker("other", 40, spec(1, 100)).unwrap();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..500 {
        let busy_share = next() % 101;
        for id in 0..40 {
            let busy = next() % 100 < busy_share;
            m.report(id, 0, &used(if busy { 90 } else { 10 })).unwrap();
        }
        if round % 7 == 0 {
            m.mark_overloaded(next() % 40).unwrap();
        }
        let costs: Vec<(u64, f64)> = (0..next() % 30)
            .map(|_| {
                let id = next() % 45; // 40: other model; 41..45: unknown
                let cost = match next() % 10 {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    _ => (next() % 8) as f64 / 4.0,
                };
                (id, cost)
            })
            .collect();
        let eligible = |id: u64| id < 40 && m.check(id).is_ok();
        let mut want: Option<(u64, f64)> = None;
        for &(id, cost) in costs.iter().filter(|(id, _)| eligible(*id)) {
            let cost = if cost.is_nan() { f64::INFINITY } else { cost };
            if want.is_none_or(|(_, b)| cost < b) {
                want = Some((id, cost));
            }
        }
        let want = want.map(|(id, _)| id).ok_or(RouteError::Overloaded);
        assert_eq!(
            m.select_min_cost(M, costs.iter().copied()),
            want,
            "{costs:?}"
        );
    }
}

/// A monitor with one model of single-rank workers `ids` under a 50 % decode
/// threshold, the workers for which `busy` holds reported busy.
fn decode_model(ids: std::ops::Range<u64>, busy: impl Fn(u64) -> bool) -> Monitor {
    let (m, _) = monitor();
    for id in ids.clone() {
        m.add_worker(M, id, spec(1, 100)).unwrap();
    }
    m.set_thresholds(M, &decode(0.5)).unwrap();
    for id in ids.filter(|&id| busy(id)) {
        m.report(id, 0, &used(90)).unwrap();
    }
    m
}

fn counts(m: &Monitor, policy: Policy, n: usize) -> std::collections::BTreeMap<u64, usize> {
    let mut c = std::collections::BTreeMap::new();
    for _ in 0..n {
        *c.entry(m.select(M, policy).unwrap()).or_insert(0) += 1;
    }
    c
}

#[test]
fn round_robin_visits_every_eligible_worker_in_turn() {
    let m = decode_model(1000..1130, |id| (id - 1000) % 3 == 0);
    let c = counts(&m, Policy::RoundRobin, 86 * 10);
    assert_eq!(c.len(), 86, "every free worker, no busy one");
    assert!(
        c.iter().all(|(id, n)| (id - 1000) % 3 != 0 && *n == 10),
        "{c:?}"
    );
}

#[test]
fn random_picks_every_eligible_worker_and_never_a_busy_one() {
    let m = decode_model(0..100, |id| id < 95);
    let c = counts(&m, Policy::Random, 5000);
    assert_eq!(
        c.keys().copied().collect::<Vec<_>>(),
        vec![95, 96, 97, 98, 99]
    );
    assert!(
        c.values().all(|n| (700..1300).contains(n)),
        "roughly uniform: {c:?}"
    );
}

#[test]
fn power_of_two_prefers_the_less_loaded_worker() {
    let (m, _) = monitor();
    m.add_worker(M, 1, spec(1, 1000)).unwrap();
    m.add_worker(M, 2, spec(1, 1000)).unwrap();
    m.report(1, 0, &used(500)).unwrap();
    m.report(2, 0, &used(10)).unwrap();
    let c = counts(&m, Policy::PowerOfTwo, 1000);
    // Worker 1 wins only when both picks land on it (~1/4).
    assert!(c[&2] > 650, "{c:?}");
}

#[test]
fn min_cost_picks_the_cheapest_eligible_candidate() {
    let (m, _) = monitor();
    for id in 1..=4 {
        m.add_worker(M, id, spec(1, 100)).unwrap();
    }
    m.add_worker("other", 9, spec(1, 100)).unwrap();
    m.set_thresholds(M, &decode(0.5)).unwrap();
    m.report(1, 0, &used(90)).unwrap();
    let costs = [
        (1, 0.1),
        (2, f64::NAN),
        (3, 0.5),
        (4, 0.7),
        (9, 0.0),
        (77, 0.0),
    ];
    assert_eq!(
        m.select_min_cost(M, costs),
        Ok(3),
        "busy, foreign and unknown ids are skipped"
    );
    assert_eq!(
        m.select_min_cost(M, [(2, f64::NAN), (4, 0.7)]),
        Ok(4),
        "NaN ranks last"
    );
    assert_eq!(m.select_min_cost(M, [(2, f64::NAN)]), Ok(2));
    assert_eq!(
        m.select_min_cost(M, [(1, 0.0)]),
        Err(RouteError::Overloaded)
    );
    m.mark_overloaded(3).unwrap();
    assert_eq!(
        m.select_min_cost(M, [(3, 0.0), (4, 1.0)]),
        Ok(4),
        "leased workers are skipped"
    );
    assert_eq!(
        m.select_min_cost("nobody", [(1, 0.0)]),
        Err(RouteError::Unavailable)
    );
}

#[test]
fn check_refuses_busy_and_leased_pinned_workers() {
    let (m, _) = monitor();
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.add_worker(M, 2, spec(1, 100)).unwrap();
    m.set_thresholds(M, &decode(0.5)).unwrap();
    assert_eq!(m.check(1), Ok(()));
    m.report(1, 0, &used(90)).unwrap();
    let err = m.check(1).unwrap_err();
    assert_eq!(err, RouteError::WorkerOverloaded);
    assert_eq!(
        err.to_string(),
        "Selected worker is overloaded, please retry later"
    );
    m.mark_overloaded(2).unwrap();
    assert_eq!(
        m.check_at(2, "completions"),
        Err(RouteError::WorkerOverloaded)
    );
    assert_eq!(m.check(3), Err(RouteError::UnknownWorker(3)));
    assert!(m.metrics_text().contains("reason=\"worker_overloaded\"} 2"));
}

#[test]
fn a_lease_skips_the_worker_for_exactly_its_duration() {
    let (m, clock) = monitor();
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.add_worker(M, 2, spec(1, 100)).unwrap();
    m.mark_overloaded(1).unwrap();
    assert!(m.is_leased(1).unwrap());
    assert!(counts(&m, Policy::RoundRobin, 10).keys().eq([2].iter()));
    m.mark_overloaded(2).unwrap();
    assert_eq!(m.select(M, Policy::Random), Err(RouteError::Overloaded));
    clock.advance(Duration::from_millis(999));
    assert_eq!(m.select(M, Policy::RoundRobin), Err(RouteError::Overloaded));
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        counts(&m, Policy::RoundRobin, 10).len(),
        2,
        "the lease ends at exactly 1 s"
    );
    assert!(!m.is_leased(1).unwrap());
}

#[test]
fn marking_again_extends_the_lease() {
    let (m, clock) = monitor();
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.mark_overloaded(1).unwrap();
    clock.advance(Duration::from_millis(600));
    m.mark_overloaded(1).unwrap();
    clock.advance(Duration::from_millis(600));
    assert!(m.is_leased(1).unwrap());
    clock.advance(Duration::from_millis(400));
    assert!(!m.is_leased(1).unwrap());
}

#[test]
fn a_not_busy_report_ends_the_lease_early() {
    let (m, _) = monitor();
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.set_thresholds(M, &decode(0.5)).unwrap();
    m.report(1, 0, &used(90)).unwrap();
    m.mark_overloaded(1).unwrap();
    m.report(1, 0, &used(95)).unwrap();
    assert!(m.is_leased(1).unwrap(), "a busy report keeps the lease");
    m.report(1, 0, &used(10)).unwrap();
    assert!(!m.is_leased(1).unwrap());
    assert_eq!(m.select(M, Policy::RoundRobin), Ok(1));
}

/// A clock that counts how often it is read.
struct CountingClock(AtomicU64);
impl Clock for CountingClock {
    fn now_nanos(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst);
        0
    }
}

#[test]
fn no_clock_read_on_the_hot_path_while_no_lease_is_outstanding() {
    let clock = Arc::new(CountingClock(AtomicU64::new(0)));
    let m = Monitor::with_config(MonitorConfig::default(), clock.clone()).unwrap();
    for id in 0..3 {
        m.add_worker(M, id, spec(1, 100)).unwrap();
    }
    m.set_thresholds(M, &decode(0.5)).unwrap();
    let before = clock.0.load(Ordering::SeqCst);
    for policy in [Policy::RoundRobin, Policy::Random, Policy::PowerOfTwo] {
        m.select(M, policy).unwrap();
    }
    m.report(0, 0, &used(90)).unwrap();
    let _ = m.select(M, Policy::RoundRobin);
    let _ = m.check(0);
    m.select_min_cost(M, [(0, 1.0), (1, 2.0)]).unwrap();
    m.is_busy(1).unwrap();
    assert_eq!(clock.0.load(Ordering::SeqCst), before);
    m.mark_overloaded(1).unwrap();
    let marked = clock.0.load(Ordering::SeqCst);
    let _ = m.select(M, Policy::RoundRobin);
    let _ = m.select(M, Policy::RoundRobin);
    assert!(
        clock.0.load(Ordering::SeqCst) > marked,
        "with a lease out, select checks expiry"
    );
}

#[test]
fn bookings_feed_active_decode_blocks_until_released() {
    let (m, _) = monitor();
    m.add_worker(
        M,
        1,
        WorkerSpec {
            dp_size: 2,
            kv_total_blocks: Some(100),
            ..Default::default()
        },
    )
    .unwrap();
    m.set_thresholds(M, &decode(0.5)).unwrap();
    let mut a = m.book(1, 0, 30).unwrap();
    let b = m.book(1, 1, 60).unwrap();
    assert_eq!(m.rank_load(1, 0).unwrap().active_decode_blocks, 30);
    assert!(!m.is_busy(1).unwrap());
    a.add_output_blocks(25);
    assert_eq!(a.blocks(), 55);
    assert!(
        m.is_busy(1).unwrap(),
        "output blocks push both ranks over the line"
    );
    a.release();
    assert_eq!(m.rank_load(1, 0).unwrap().active_decode_blocks, 0);
    assert!(!m.is_busy(1).unwrap());
    drop(b);
    assert_eq!(m.rank_load(1, 1).unwrap().active_decode_blocks, 0);
    assert!(matches!(
        m.book(1, 2, 1),
        Err(ReportError::UndeclaredRank { .. })
    ));
    assert_eq!(m.book(5, 0, 1).unwrap_err(), ReportError::UnknownWorker(5));
}

#[test]
fn a_booking_on_a_removed_worker_is_harmless() {
    let (m, _) = monitor();
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.set_thresholds(M, &decode(0.5)).unwrap();
    let mut booking = m.book(1, 0, 90).unwrap();
    assert!(m.is_busy(1).unwrap());
    m.remove_worker(1).unwrap();
    m.add_worker(M, 2, spec(1, 100)).unwrap();
    booking.add_output_blocks(10);
    drop(booking);
    assert!(m.busy_workers(M).is_empty());
    assert_eq!(m.select(M, Policy::RoundRobin), Ok(2));
}

#[test]
fn staleness_keep_free_and_busy() {
    let (m, clock) = monitor();
    m.add_worker("keep", 1, spec(1, 100)).unwrap();
    m.add_worker("free", 2, spec(1, 100)).unwrap();
    m.add_worker("busy", 3, spec(1, 100)).unwrap();
    for (model, id) in [("keep", 1), ("free", 2), ("busy", 3)] {
        m.set_thresholds(model, &decode(0.5)).unwrap();
        m.report(id, 0, &used(90)).unwrap();
    }
    let s = Duration::from_secs(3);
    m.set_staleness("free", Staleness::Free, s).unwrap();
    m.set_staleness("busy", Staleness::Busy, s).unwrap();
    assert_eq!(
        m.set_staleness("none", Staleness::Busy, s),
        Err(ThresholdError::UnknownModel("none".into()))
    );
    m.report(3, 0, &used(10)).unwrap();
    m.sweep();
    clock.advance(Duration::from_millis(2999));
    m.sweep();
    assert_eq!(
        [m.is_busy(1), m.is_busy(2), m.is_busy(3)],
        [Ok(true), Ok(true), Ok(false)]
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(m.sweep(), 2);
    assert_eq!(
        [m.is_busy(1), m.is_busy(2), m.is_busy(3)],
        [Ok(true), Ok(false), Ok(true)]
    );
    // Switching between free and busy applies to stale ranks at once,
    // without waiting for a report or another stale mark.
    m.set_staleness("free", Staleness::Busy, s).unwrap();
    m.set_staleness("busy", Staleness::Free, s).unwrap();
    assert_eq!([m.is_busy(2), m.is_busy(3)], [Ok(true), Ok(false)]);
    m.set_staleness("free", Staleness::Free, s).unwrap();
    m.set_staleness("busy", Staleness::Busy, s).unwrap();
    assert_eq!([m.is_busy(2), m.is_busy(3)], [Ok(false), Ok(true)]);
    // A report makes the rank fresh again at once.
    m.report(2, 0, &used(95)).unwrap();
    m.report(3, 0, &used(5)).unwrap();
    assert_eq!([m.is_busy(2), m.is_busy(3)], [Ok(true), Ok(false)]);
    m.sweep();
    // Back to keep: stale marks are dropped on the next sweep.
    clock.advance(Duration::from_secs(10));
    m.sweep();
    assert_eq!(m.is_busy(2), Ok(false));
    m.set_staleness("free", Staleness::Keep, s).unwrap();
    assert_eq!(m.is_busy(2), Ok(true));
}

#[test]
fn adding_and_removing_workers_validates_input() {
    let clock = ManualClock::new();
    let m = Monitor::with_config(
        MonitorConfig {
            limits: loadgate::Limits {
                max_workers_per_model: 2,
                ..loadgate::Limits::default()
            },
            ..Default::default()
        },
        clock,
    )
    .unwrap();
    assert_eq!(
        m.add_worker("", 1, WorkerSpec::default()),
        Err(WorkerError::EmptyModel)
    );
    let bad = WorkerSpec {
        dp_start: u32::MAX,
        dp_size: 2,
        ..Default::default()
    };
    assert!(matches!(
        m.add_worker(M, 1, bad),
        Err(WorkerError::InvalidRanks { .. })
    ));
    m.add_worker(M, 1, WorkerSpec::default()).unwrap();
    assert_eq!(
        m.add_worker(M, 1, WorkerSpec::default()),
        Err(WorkerError::Duplicate(1))
    );
    m.add_worker(M, 2, WorkerSpec::default()).unwrap();
    let err = m.add_worker(M, 3, WorkerSpec::default()).unwrap_err();
    assert!(
        matches!(err, WorkerError::ModelFull { capacity: 2, .. }),
        "{err}"
    );
    assert_eq!(m.remove_worker(7), Err(WorkerError::Unknown(7)));
    m.remove_worker(1).unwrap();
    m.add_worker(M, 3, WorkerSpec::default()).unwrap();
    assert_eq!(m.workers(M), vec![3, 2], "the freed slot is reused");
    assert!(Monitor::with_config(
        MonitorConfig {
            metrics_prefix: "1x".into(),
            ..Default::default()
        },
        ManualClock::new()
    )
    .is_err());
    assert!(Monitor::with_config(
        MonitorConfig {
            lease: Duration::ZERO,
            ..Default::default()
        },
        ManualClock::new()
    )
    .is_err());
}

#[test]
fn removed_workers_leave_the_busy_set_and_the_metrics() {
    let (m, _) = monitor();
    m.add_worker(M, 1, spec(2, 100)).unwrap();
    m.add_worker(M, 2, spec(1, 100)).unwrap();
    m.set_thresholds(M, &decode(0.5)).unwrap();
    m.report(
        1,
        0,
        &LoadReport {
            kv_used_blocks: Some(90),
            active_prefill_tokens: Some(12),
            ..Default::default()
        },
    )
    .unwrap();
    m.report(1, 1, &used(90)).unwrap();
    let _b = m.book(1, 1, 4).unwrap();
    assert_eq!(m.busy_workers(M), vec![1]);
    let text = m.metrics_text();
    assert!(
        text.contains(
            "dynamo_frontend_worker_active_decode_blocks{dp_rank=\"1\",worker_id=\"1\",worker_type=\"decode\"} 4"
        ),
        "{text}"
    );
    assert!(text.contains(
        "dynamo_frontend_worker_active_prefill_tokens{dp_rank=\"0\",worker_id=\"1\",worker_type=\"decode\"} 12"
    ));
    assert!(
        !text.contains("active_prefill_tokens{dp_rank=\"1\",worker_id=\"1\""),
        "unreported prefill has no series"
    );
    assert!(text.contains("dynamo_frontend_model_busy_workers{model=\"llama\"} 1"));
    assert!(text.contains("dynamo_frontend_model_threshold_version{model=\"llama\"} 1"));
    m.remove_worker(1).unwrap();
    assert!(m.busy_workers(M).is_empty());
    let text = m.metrics_text();
    assert!(!text.contains("worker_id=\"1\""), "{text}");
    assert!(text.contains("worker_id=\"2\""));
    assert!(text.contains("dynamo_frontend_model_busy_workers{model=\"llama\"} 0"));
}

#[test]
fn the_metric_prefix_is_configurable() {
    let config = MonitorConfig {
        metrics_prefix: "edge".into(),
        ..Default::default()
    };
    let m = Monitor::with_config(config, ManualClock::new()).unwrap();
    m.add_worker(M, 1, WorkerSpec::default()).unwrap();
    let text = m.metrics_text();
    assert!(text.contains("# TYPE edge_frontend_model_rejection_total counter"));
    assert!(
        text.contains("edge_frontend_worker_active_decode_blocks{dp_rank=\"0\",worker_id=\"1\",worker_type=\"decode\"} 0")
    );
    assert!(!text.contains("dynamo_"));
}

#[test]
fn rank_load_reports_defaults_for_a_fresh_rank() {
    let (m, _) = monitor();
    m.add_worker(M, 1, WorkerSpec::default()).unwrap();
    assert_eq!(m.rank_load(1, 0).unwrap(), RankLoad::default());
}
