//! Loom models of dispatch through a model's queue (`monitor/flow.rs`,
//! "Protocol"): a queued request racing the report that frees its worker,
//! its own cancel, its deadline, and a second request; a request waiting
//! for scale-up racing the worker that joins. A model fails if a
//! waiting future is never woken (loom reports the deadlock), if a booking
//! is left behind, or if a request is both dispatched and refused.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p loadgate
//! --release --test loom_flow`
#![cfg(loom)]

#[path = "support/loom_gate.rs"]
mod models;

use std::future::Future;
use std::sync::Arc as StdArc;
use std::task::{Context, Waker};
use std::time::Duration;

use loom::sync::Arc;
use loom::thread;

use loadgate::flow::{FlowConfig, FlowRejection, FlowRequest};
use loadgate::monitor::{DispatchRequest, FlowControlConfig};
use models::Noop;

use loadgate::{
    LoadReport, ManualClock, Monitor, MonitorConfig, Policy, ThresholdUpdate, WorkerSpec,
};

/// One worker of 100 blocks, busy above half, busy now (90 used), with a
/// queue whose requests wait 10 ms.
fn monitor() -> (Arc<Monitor>, StdArc<ManualClock>) {
    let config = MonitorConfig {
        limits: loadgate::Limits {
            max_workers_per_model: 64,
            ..loadgate::Limits::default()
        },
        ..Default::default()
    };
    let clock = ManualClock::new();
    let m = Monitor::with_config(config, clock.clone()).unwrap();
    let spec = WorkerSpec {
        kv_total_blocks: Some(100),
        ..Default::default()
    };
    m.add_worker("m", 1, spec).unwrap();
    let thresholds = ThresholdUpdate {
        active_decode_blocks_threshold: Some(0.5),
        ..Default::default()
    };
    m.set_thresholds("m", &thresholds).unwrap();
    let flow = FlowControlConfig {
        queue: FlowConfig {
            deadline: Duration::from_millis(10),
            ..FlowConfig::new(4)
        },
        policy: Policy::RoundRobin,
    };
    m.set_flow_control("m", Some(&flow)).unwrap();
    m.report(1, 0, &used(90)).unwrap();
    (Arc::new(m), clock)
}

fn used(n: u64) -> LoadReport {
    LoadReport {
        kv_used_blocks: Some(n),
        ..Default::default()
    }
}

fn request(blocks: u64) -> DispatchRequest<'static> {
    DispatchRequest {
        flow: FlowRequest {
            prompt_tokens: 0,
            max_tokens: Some(1),
            ..FlowRequest::new("t")
        },
        blocks,
        queue: true,
    }
}

/// Runs a future on this loom thread until it is woken. The wake is kept
/// in a flag besides the thread's unpark: loom forgets an unpark when the
/// thread then blocks on a mutex, which a std thread does not.
fn block_on<F: Future>(f: F) -> F::Output {
    struct Flag(std::sync::atomic::AtomicBool, thread::Thread);
    impl std::task::Wake for Flag {
        fn wake(self: StdArc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            self.1.unpark();
        }
    }
    let flag = StdArc::new(Flag(false.into(), thread::current()));
    let waker = Waker::from(flag.clone());
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut Context::from_waker(&waker)) {
            return v;
        }
        while !flag.0.swap(false, std::sync::atomic::Ordering::SeqCst) {
            thread::park();
        }
    }
}

/// A request polled once on this thread, so that it waits in the queue.
fn queued(m: &Monitor) -> std::pin::Pin<Box<loadgate::monitor::Dispatching<'_>>> {
    let mut fut = Box::pin(m.dispatch("m", &request(10)));
    let waker = Waker::from(StdArc::new(Noop));
    assert!(fut
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    fut
}

fn blocks(m: &Monitor) -> u64 {
    m.rank_load(1, 0).unwrap().active_decode_blocks
}

#[test]
fn a_queued_request_races_the_report_that_frees_its_worker() {
    loom::model(|| {
        let (m, _) = monitor();
        let m1 = m.clone();
        let waiter = thread::spawn(move || {
            let d = block_on(m1.dispatch("m", &request(10)))
                .expect("dispatched once the worker is free");
            assert_eq!(d.worker_id(), 1);
        });
        m.report(1, 0, &used(0)).unwrap();
        waiter.join().unwrap();
        assert_eq!(blocks(&m), 0, "its booking is released");
    });
}

#[test]
fn a_cancel_races_the_report_that_frees_its_worker() {
    loom::model(|| {
        let (m, _) = monitor();
        let fut = queued(&m);
        let m1 = m.clone();
        let reporter = thread::spawn(move || m1.report(1, 0, &used(0)).unwrap());
        // The client leaves: dispatched meanwhile or not, nothing is left.
        drop(fut);
        reporter.join().unwrap();
        assert_eq!(blocks(&m), 0, "no booking left behind");
        let d = block_on(m.dispatch("m", &request(10))).unwrap();
        assert_eq!(d.worker_id(), 1, "the worker is free for the next");
    });
}

#[test]
fn a_deadline_races_the_report_that_frees_its_worker() {
    loom::model(|| {
        let (m, clock) = monitor();
        let fut = queued(&m);
        clock.advance(Duration::from_millis(10));
        let m1 = m.clone();
        let timer = thread::spawn(move || m1.expire_flow());
        m.report(1, 0, &used(0)).unwrap();
        let expired = timer.join().unwrap();
        // Dispatched or refused at its deadline: exactly one.
        let outcome = block_on(fut);
        match outcome {
            Ok(d) => {
                assert_eq!(expired, 0);
                drop(d);
            }
            Err(e) => assert_eq!(e, FlowRejection::QueueDeadline),
        }
        assert_eq!(blocks(&m), 0);
    });
}

#[test]
fn two_waiting_requests_and_a_release_serve_both() {
    loom::model(|| {
        let (m, _) = monitor();
        // 60 blocks: one request makes the worker busy again.
        let m1 = m.clone();
        let first = thread::spawn(move || {
            let d = block_on(m1.dispatch("m", &request(60))).unwrap();
            drop(d);
        });
        let m2 = m.clone();
        let second = thread::spawn(move || {
            let d = block_on(m2.dispatch("m", &request(60))).unwrap();
            drop(d);
        });
        m.report(1, 0, &used(0)).unwrap();
        first.join().unwrap();
        second.join().unwrap();
        assert_eq!(blocks(&m), 0);
    });
}

#[test]
fn a_request_waiting_for_scale_up_races_the_worker_that_joins() {
    loom::model(|| {
        let (m, _) = monitor();
        let flow = FlowControlConfig {
            queue: FlowConfig {
                scale_up_limit: 1,
                ..FlowConfig::new(4)
            },
            policy: Policy::RoundRobin,
        };
        m.set_flow_control("m", Some(&flow)).unwrap();
        m.remove_worker(1).unwrap();
        let m1 = m.clone();
        let waiter = thread::spawn(move || {
            let d =
                block_on(m1.dispatch("m", &request(10))).expect("dispatched once a worker joins");
            assert_eq!(d.worker_id(), 2);
        });
        let spec = WorkerSpec {
            kv_total_blocks: Some(100),
            ..Default::default()
        };
        m.add_worker("m", 2, spec).unwrap();
        waiter.join().unwrap();
        assert_eq!(m.rank_load(2, 0).unwrap().active_decode_blocks, 0);
    });
}
