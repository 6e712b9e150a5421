//! The worker admission gate's configuration and what it reports, against
//! docs/behaviour.md: its environment variables and bad configurations
//! (#environment-variables, #bad-input-and-limits), its statistics and
//! metric names (#metrics), its errors' reasons and texts, and its handles.
//! The admission rules themselves are in `gate_spec.rs`.

use std::time::Duration;

use loadgate::gate::{MAX_CLASSES, MAX_LIMIT, MAX_QUEUE, QUEUE_LIMIT_ENV, QUEUE_TIMEOUT_ENV};
mod support;
use support::gates::{gate, timed_gate};
use support::polling::{granted, poll, queued, rejected};

use loadgate::{
    AdmissionGate, AdmitError, ClassStats, ConfigError, GateConfig, GateStats, OwnedPermit, Reason,
    TryAdmitError,
};

// ----- environment-variables and bad-input-and-limits: configuration ------

fn lookup(q: Option<&str>, t: Option<&str>) -> Result<GateConfig, ConfigError> {
    GateConfig::from_lookup(4, |name| match name {
        QUEUE_LIMIT_ENV => q.map(str::to_owned),
        QUEUE_TIMEOUT_ENV => t.map(str::to_owned),
        _ => None,
    })
}

#[test]
fn env_queue_limit_table() {
    let ok = |v: Option<&str>, q: u32| {
        let c = lookup(v, None).unwrap();
        assert_eq!(
            (c.limit, c.queue, c.queue_timeout),
            (4, q, None),
            "value {v:?}"
        );
    };
    ok(None, 16);
    ok(Some("0"), 0);
    ok(Some("1"), 1);
    ok(Some("2"), 2);
    ok(Some(" 7 "), 7);
    ok(Some("\t12\n"), 12);
    ok(Some("2097151"), MAX_QUEUE);
    for bad in [
        "",
        "  ",
        "abc",
        "-1",
        "+3",
        "1.5",
        "0x10",
        "2097152",
        "99999999999999999999999",
    ] {
        let e = lookup(Some(bad), None).unwrap_err();
        let text = e.to_string();
        assert!(text.contains(QUEUE_LIMIT_ENV), "{text}");
        assert!(text.contains(&format!("{bad:?}")), "{text}");
        assert!(matches!(
            e,
            ConfigError::InvalidEnv {
                var: QUEUE_LIMIT_ENV,
                ..
            }
        ));
    }
}

#[test]
fn env_queue_timeout_table() {
    assert_eq!(lookup(None, None).unwrap().queue_timeout, None);
    assert_eq!(
        lookup(None, Some("250")).unwrap().queue_timeout,
        Some(Duration::from_millis(250))
    );
    assert_eq!(
        lookup(None, Some(" 1 ")).unwrap().queue_timeout,
        Some(Duration::from_millis(1))
    );
    for bad in ["0", "abc", "", "-5", "1.5", "99999999999999999999999"] {
        let e = lookup(None, Some(bad)).unwrap_err();
        assert!(e.to_string().contains(QUEUE_TIMEOUT_ENV), "{e}");
        assert!(matches!(
            e,
            ConfigError::InvalidEnv {
                var: QUEUE_TIMEOUT_ENV,
                ..
            }
        ));
    }
    let c = lookup(Some("3"), Some("40")).unwrap();
    assert_eq!(
        (c.queue, c.queue_timeout),
        (3, Some(Duration::from_millis(40)))
    );
}

#[test]
fn from_env_reads_the_process_environment() {
    // The only test in this binary that touches these variables.
    std::env::set_var(QUEUE_LIMIT_ENV, " 5 ");
    std::env::set_var(QUEUE_TIMEOUT_ENV, "75");
    let c = GateConfig::from_env(3).unwrap();
    assert_eq!(
        (c.limit, c.queue, c.queue_timeout),
        (3, 5, Some(Duration::from_millis(75)))
    );
    std::env::set_var(QUEUE_LIMIT_ENV, "many");
    assert!(GateConfig::from_env(3).is_err());
    std::env::remove_var(QUEUE_LIMIT_ENV);
    std::env::remove_var(QUEUE_TIMEOUT_ENV);
    let c = GateConfig::from_env(3).unwrap();
    assert_eq!((c.queue, c.queue_timeout), (16, None));
}

#[test]
fn bad_configurations_are_refused_with_clear_errors() {
    let build = |c: GateConfig| AdmissionGate::new(c).map(|_| ()).unwrap_err();
    assert_eq!(build(GateConfig::new(0)), ConfigError::ZeroLimit);
    assert!(build(GateConfig::new(0)).to_string().contains("at least 1"));
    assert!(lookup(None, None).is_ok());
    assert_eq!(
        GateConfig::from_lookup(0, |_| None).unwrap_err(),
        ConfigError::ZeroLimit
    );
    let e = build(GateConfig::new(MAX_LIMIT + 1));
    assert!(e.to_string().contains("limit = 2097152"), "{e}");
    let e = build(GateConfig::new(1).with_queue(MAX_QUEUE + 1));
    assert!(e.to_string().contains("queue = 2097152"), "{e}");
    let e = build(GateConfig::new(1).with_queue_timeout(Some(Duration::ZERO)));
    assert_eq!(e, ConfigError::ZeroTimeout);
    let e = build(GateConfig::new(1).with_metrics_prefix("bad-prefix"));
    assert!(e.to_string().contains("bad-prefix"), "{e}");
    assert!(AdmissionGate::new(GateConfig::new(MAX_LIMIT).with_queue(0)).is_ok());
}

// ----- stats and metrics ---------------------------------------------------

#[test]
fn stats_count_every_outcome() {
    let (g, clock) = timed_gate(1, 2, 10, false);
    let p = g.try_admit_owned().unwrap();
    let w1 = queued(&g);
    let mut w2 = queued(&g);
    let mut full = g.admit_owned();
    assert_eq!(rejected(&mut full), AdmitError::AtCapacity);
    drop(w1);
    clock.advance(Duration::from_millis(10));
    assert_eq!(g.expire(), 1);
    assert_eq!(rejected(&mut w2), AdmitError::QueueTimeout);
    let mut w3 = queued(&g);
    drop(p);
    let p = granted(&mut w3);
    g.close();
    assert!(g.try_admit().is_err());
    let mut late = g.admit_owned();
    assert_eq!(rejected(&mut late), AdmitError::Closed);
    drop(p);
    assert_eq!(
        g.stats(),
        GateStats {
            running: 0,
            queued: 0,
            limit: 1,
            queue_limit: 2,
            waiting: 0,
            wait_limit: None,
            closed: true,
            received: 6,
            admitted_direct: 1,
            admitted_queued: 1,
            rejected_at_capacity: 1,
            rejected_closed: 1,
            expired: 1,
            cancelled: 1,
            displaced: 0,
            class_count: 1,
            classes: {
                let mut classes = [ClassStats::default(); MAX_CLASSES];
                classes[0] = ClassStats {
                    queued: 0,
                    queue_limit: 2,
                    rejected_at_capacity: 1,
                    expired: 1,
                    rejected_closed: 1,
                    displaced: 0,
                };
                classes
            },
        }
    );
    assert_eq!(g.stats().rejected_total(), 3);
}

#[test]
fn metrics_text_has_the_reference_names() {
    let (g, clock) = timed_gate(2, 1, 1000, false);
    let a = g.try_admit_owned().unwrap();
    let b = g.try_admit_owned().unwrap();
    let mut w = queued(&g);
    let mut r = g.admit_owned();
    assert!(poll(&mut r).is_ready());
    clock.advance(Duration::from_millis(3));
    drop(a);
    let c = granted(&mut w);
    let text = g.metrics_text();
    for line in [
        "# TYPE dynamo_rejection_request_total counter",
        "dynamo_rejection_request_total 1",
        "# TYPE dynamo_engine_request gauge",
        "dynamo_engine_request 2",
        "# TYPE dynamo_request_queue gauge",
        "dynamo_request_queue 0",
        "dynamo_engine_request_limit 2",
        "dynamo_request_queue_limit 1",
        "dynamo_request_admitted_total{path=\"direct\"} 2",
        "dynamo_request_admitted_total{path=\"queued\"} 1",
        "dynamo_request_rejection_by_reason_total{reason=\"worker_at_capacity\"} 1",
        "dynamo_request_rejection_by_reason_total{reason=\"queue_timeout\"} 0",
        "dynamo_request_rejection_by_reason_total{reason=\"closed\"} 0",
        "dynamo_request_cancelled_total 0",
        "dynamo_request_queue_expired_total 0",
        "# TYPE dynamo_request_queue_wait_seconds histogram",
        "dynamo_request_queue_wait_seconds_bucket{le=\"0.001\"} 0",
        "dynamo_request_queue_wait_seconds_bucket{le=\"0.005\"} 1",
        "dynamo_request_queue_wait_seconds_bucket{le=\"+Inf\"} 1",
        "dynamo_request_queue_wait_seconds_sum 0.003",
        "dynamo_request_queue_wait_seconds_count 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    drop((b, c));
    let custom = AdmissionGate::new(GateConfig::new(1).with_metrics_prefix("worker")).unwrap();
    assert_eq!(custom.metrics_prefix(), "worker");
    let text = custom.metrics_text();
    assert!(text.contains("worker_rejection_request_total 0"));
    assert!(text.contains("worker_engine_request 0"));
    assert!(text.contains("worker_request_queue 0"));
    assert!(!text.contains("dynamo_"));
}

#[test]
fn errors_map_to_reasons_and_messages() {
    for (e, reason) in [
        (AdmitError::AtCapacity, Reason::WorkerAtCapacity),
        (AdmitError::QueueTimeout, Reason::QueueTimeout),
        (AdmitError::Closed, Reason::Closed),
        (AdmitError::Displaced, Reason::Displaced),
    ] {
        assert_eq!(e.reason(), reason);
        assert_eq!(e.to_string(), reason.message());
    }
    // The caller's own timeout reports as a queue timeout, with its own
    // text (the one every binding gives).
    assert_eq!(AdmitError::TimedOut.reason(), Reason::QueueTimeout);
    assert_eq!(
        AdmitError::TimedOut.to_string(),
        "timed out waiting for an engine slot; the request left the queue"
    );
    assert_eq!(TryAdmitError::Closed.to_string(), Reason::Closed.message());
    assert!(!TryAdmitError::WouldWait.to_string().is_empty());
}

#[test]
fn try_admit_never_queues_and_is_never_counted_as_a_rejection() {
    let g = gate(1, 4);
    let p = g.try_admit().unwrap();
    for _ in 0..10 {
        assert_eq!(g.try_admit().unwrap_err(), TryAdmitError::WouldWait);
    }
    let s = g.stats();
    assert_eq!((s.queued, s.rejected_total(), s.admitted_direct), (0, 0, 1));
    drop(p);
}

#[test]
fn gate_debug_shows_the_state() {
    let g = gate(3, 1);
    let _p = g.try_admit().unwrap();
    let text = format!("{g:?}");
    assert!(
        text.contains("running: 1") && text.contains("limit: 3"),
        "{text}"
    );
}

#[test]
fn handles_are_send_and_sync_where_it_matters() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<AdmissionGate>();
    send_sync::<loadgate::Permit<'static>>();
    send_sync::<OwnedPermit>();
    send_sync::<loadgate::CallbackTicket>();
    send::<loadgate::Admit<'static>>();
    send::<loadgate::AdmitOwned>();
    fn unpin<T: Unpin>() {}
    unpin::<loadgate::Admit<'static>>();
    unpin::<loadgate::AdmitOwned>();
}

#[test]
fn operations_on_long_queues_resolve_every_waiter() {
    // More waiters than one batch of wakeups: set_limit, close and expire
    // work through the whole queue.
    let g = gate(1, 100);
    let p = g.try_admit_owned().unwrap();
    let mut w: Vec<_> = (0..100).map(|_| queued(&g)).collect();
    g.set_limit(81).unwrap();
    let s = g.stats();
    assert_eq!((s.running, s.queued, s.limit), (81, 20, 81));
    let permits: Vec<_> = w.iter_mut().take(80).map(granted).collect();
    g.close();
    for f in w.iter_mut().skip(80) {
        assert_eq!(rejected(f), AdmitError::Closed);
    }
    drop((p, permits));
    assert_eq!(g.stats().running, 0);

    let (g, clock) = timed_gate(1, 100, 10, false);
    let p = g.try_admit_owned().unwrap();
    let mut w: Vec<_> = (0..100).map(|_| queued(&g)).collect();
    clock.advance(Duration::from_millis(10));
    assert_eq!(g.expire(), 100);
    for f in &mut w {
        assert_eq!(rejected(f), AdmitError::QueueTimeout);
    }
    // A release with 100 due waiters expires them all, then serves the live one.
    let mut w: Vec<_> = (0..99).map(|_| queued(&g)).collect();
    clock.advance(Duration::from_millis(10));
    let mut live = queued(&g);
    drop(p);
    for f in &mut w {
        assert_eq!(rejected(f), AdmitError::QueueTimeout);
    }
    drop(granted(&mut live));
    let s = g.stats();
    assert_eq!((s.running, s.queued, s.expired), (0, 0, 199));
}
