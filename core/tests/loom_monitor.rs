//! Loom model: concurrent reports, bookings and selects on one model's busy set.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p loadgate --release --test loom_monitor`
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;

use loadgate::{
    LoadReport, ManualClock, Monitor, MonitorConfig, Policy, RouteError, ThresholdUpdate,
    WorkerSpec,
};

fn monitor() -> Arc<Monitor> {
    let config = MonitorConfig {
        limits: loadgate::Limits {
            max_workers_per_model: 64,
            ..loadgate::Limits::default()
        },
        ..Default::default()
    };
    let m = Monitor::with_config(config, ManualClock::new()).unwrap();
    let spec = WorkerSpec {
        kv_total_blocks: Some(100),
        ..Default::default()
    };
    m.add_worker("m", 1, spec).unwrap();
    m.add_worker("m", 2, spec).unwrap();
    // No report here carries prefill tokens, so the prefill line matters
    // only to the ranks the prefill model books.
    let thresholds = ThresholdUpdate {
        active_decode_blocks_threshold: Some(0.5),
        active_prefill_tokens_threshold: Some(50),
        ..Default::default()
    };
    m.set_thresholds("m", &thresholds).unwrap();
    m.report(2, 0, &used(90)).unwrap();
    Arc::new(m)
}

fn used(n: u64) -> LoadReport {
    LoadReport {
        kv_used_blocks: Some(n),
        ..Default::default()
    }
}

/// A reporter and the router's booking race on worker 1 while a router
/// selects. Selection only ever returns a free worker (or Overloaded while
/// worker 1 is momentarily busy), and the final busy bit matches the final
/// load whatever the interleaving.
#[test]
fn reports_bookings_and_select_agree_on_the_final_busy_set() {
    loom::model(|| {
        let m = monitor();
        let reporter = {
            let m = m.clone();
            thread::spawn(move || {
                m.report(1, 0, &used(90)).unwrap();
                m.report(1, 0, &used(10)).unwrap();
            })
        };
        let router = {
            let m = m.clone();
            thread::spawn(move || {
                let booking = m.book(1, 0, 70).unwrap();
                drop(booking);
            })
        };
        match m.select("m", Policy::RoundRobin) {
            Ok(id) => assert_eq!(id, 1, "worker 2 is busy throughout"),
            Err(e) => assert_eq!(e, RouteError::Overloaded),
        }
        reporter.join().unwrap();
        router.join().unwrap();
        assert!(!m.is_busy(1).unwrap(), "final load: kv_used 10, no booking");
        assert!(m.is_busy(2).unwrap());
        assert_eq!(m.busy_workers("m"), vec![2]);
    });
}

/// Two routers book prefill on one rank while one of them marks its
/// prefill done: whatever the interleaving, the published busy bit
/// matches the final count (one request's prompt, under the line).
#[test]
fn prefill_bookings_and_prefill_done_agree_on_the_final_busy_bit() {
    loom::model(|| {
        let m = monitor();
        let first = {
            let m = m.clone();
            thread::spawn(move || {
                let mut b = m.book_with_prefill(1, 0, 0, 40).unwrap();
                b.prefill_done();
                b
            })
        };
        let second = {
            let m = m.clone();
            thread::spawn(move || m.book_with_prefill(1, 0, 0, 40).unwrap())
        };
        let first = first.join().unwrap();
        let second = second.join().unwrap();
        assert_eq!(m.rank_load(1, 0).unwrap().active_prefill_tokens, Some(40));
        assert!(!m.is_busy(1).unwrap(), "40 is not above 50");
        drop((first, second));
    });
}

/// Two reporters end with different final values on two fields of one
/// rank; the published state reflects both final values.
#[test]
fn concurrent_field_owners_never_publish_a_stale_result() {
    loom::model(|| {
        let m = monitor();
        let a = {
            let m = m.clone();
            thread::spawn(move || m.report(1, 0, &used(80)).unwrap())
        };
        let b = {
            let m = m.clone();
            thread::spawn(move || {
                m.report(
                    1,
                    0,
                    &LoadReport {
                        active_decode_blocks: Some(20),
                        ..Default::default()
                    },
                )
                .unwrap()
            })
        };
        a.join().unwrap();
        b.join().unwrap();
        assert!(
            m.is_busy(1).unwrap(),
            "kv_used 80 > 50 whatever order the reports landed in"
        );
    });
}
