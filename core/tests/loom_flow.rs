//! Loom models of dispatch through a model's queue (`monitor/flow/mod.rs`,
//! "Protocol").
//!
//! The monitors run with the host's maintenance (`Maintenance::Manual`),
//! which runs only the queues that were kicked (or reached a deadline). So
//! each model ends with one `maintain()` after its threads joined: a kick
//! lost between an arrival and the report that freed a worker leaves the
//! request unresolved there, and the model fails. The maintenance
//! thread's own wake-up (raise, take, park) is the `Signal` model in
//! `loom_signal.rs`.
//!
//! Modelled: a queued request racing the report that frees its worker, a
//! request a worker refused going back into the queue (`redispatch`)
//! racing the report that ends the lease,
//! its own cancel racing the maintenance that sends it, its deadline
//! racing the report, two requests and a release, a request waiting for
//! scale-up racing the worker that joins. A model also fails if a booking
//! is left behind, or a request is both sent and refused.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p loadgate
//! --release --test loom_flow`
#![cfg(loom)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc as StdArc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use loom::sync::Arc;
use loom::thread;

use loadgate::flow::{FlowConfig, FlowRejection, FlowRequest};
use loadgate::monitor::{Dispatch, DispatchRequest, Dispatching, FlowControlConfig};

use loadgate::{
    LoadReport, Maintenance, ManualClock, Monitor, MonitorConfig, Policy, ThresholdUpdate,
    WorkerSpec,
};

/// One worker of 100 blocks, busy above half, busy now (90 used), with a
/// queue whose requests wait 10 ms; the host's maintenance.
fn monitor() -> (Arc<Monitor>, StdArc<ManualClock>) {
    let config = MonitorConfig {
        limits: loadgate::Limits {
            max_workers_per_model: 64,
            ..loadgate::Limits::default()
        },
        maintenance: Maintenance::Manual,
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
        blocks: Some(blocks),
        queue: true,
    }
}

/// Polls a dispatch once.
fn poll(fut: &mut Pin<Box<Dispatching>>) -> Poll<Result<Dispatch, FlowRejection>> {
    fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

/// A request that arrives (and waits, or is sent at once).
fn arrive(m: &Monitor, blocks: u64) -> Pin<Box<Dispatching>> {
    Box::pin(m.dispatch("m", &request(blocks)))
}

/// The outcome a request has after the host's maintenance ran once: it
/// must have one.
fn decided(m: &Monitor, fut: &mut Pin<Box<Dispatching>>) -> Result<Dispatch, FlowRejection> {
    m.maintain();
    match poll(fut) {
        Poll::Ready(outcome) => outcome,
        Poll::Pending => panic!("a kick was lost: the request still waits"),
    }
}

fn blocks(m: &Monitor) -> u64 {
    m.rank_load(1, 0).unwrap().active_decode_blocks
}

#[test]
fn a_queued_request_races_the_report_that_frees_its_worker() {
    model(|| {
        let (m, _) = monitor();
        let m1 = m.clone();
        let waiter = big(move || arrive(&m1, 10));
        m.report(1, 0, &used(0)).unwrap();
        let mut fut = waiter.join().unwrap();
        let d = decided(&m, &mut fut).expect("sent once the worker is free");
        assert_eq!(d.worker_id(), 1);
        drop(d);
        assert_eq!(blocks(&m), 0, "its booking is released");
    });
}

#[test]
fn a_request_put_back_races_the_report_that_ends_its_lease() {
    model(|| {
        let (m, clock) = monitor();
        m.report(1, 0, &used(0)).unwrap();
        let sent = poll(&mut arrive(&m, 10));
        let Poll::Ready(Ok(d)) = sent else {
            panic!("a free worker takes it at once")
        };
        // The worker refused it; its next report (free) races the request
        // going back into the queue. A report after the lease ends it and
        // kicks the queue; one before leaves the lease to run out, and its
        // end kicks the queue.
        let m1 = m.clone();
        let back = big(move || Box::pin(m1.redispatch(d)));
        m.report(1, 0, &used(0)).unwrap();
        let mut fut = back.join().unwrap();
        m.maintain();
        match poll(&mut fut) {
            Poll::Ready(outcome) => {
                let d = outcome.expect("sent again once the lease ended");
                assert_eq!(d.worker_id(), 1);
                assert_eq!(blocks(&m), 10, "booked once");
            }
            Poll::Pending => {
                // Only a lease the report did not end may hold it back.
                assert!(m.is_leased(1).unwrap(), "a kick was lost: free and waiting");
                clock.advance(Duration::from_secs(1));
                let refused = decided(&m, &mut fut).unwrap_err();
                assert_eq!(refused, FlowRejection::QueueDeadline);
            }
        }
        assert_eq!(blocks(&m), 0);
    });
}

#[test]
fn a_cancel_races_the_maintenance_that_sends_it() {
    model(|| {
        let (m, _) = monitor();
        let mut fut = arrive(&m, 10);
        assert!(poll(&mut fut).is_pending());
        m.report(1, 0, &used(0)).unwrap();
        let m1 = m.clone();
        let maintenance = big(move || {
            m1.maintain();
        });
        // The client leaves: sent meanwhile or not, nothing is left.
        drop(fut);
        maintenance.join().unwrap();
        assert_eq!(blocks(&m), 0, "no booking left behind");
        let mut next = arrive(&m, 10);
        let d = decided(&m, &mut next).expect("the worker is free for the next");
        assert_eq!(d.worker_id(), 1);
    });
}

#[test]
fn a_deadline_races_the_report_that_frees_its_worker() {
    model(|| {
        let (m, clock) = monitor();
        let mut fut = arrive(&m, 10);
        assert!(poll(&mut fut).is_pending());
        clock.advance(Duration::from_millis(10));
        let m1 = m.clone();
        let maintenance = big(move || {
            m1.maintain();
        });
        m.report(1, 0, &used(0)).unwrap();
        maintenance.join().unwrap();
        // Sent or refused at its deadline: exactly one.
        match decided(&m, &mut fut) {
            Ok(d) => drop(d),
            Err(e) => assert_eq!(e, FlowRejection::QueueDeadline),
        }
        assert_eq!(blocks(&m), 0);
    });
}

#[test]
fn two_waiting_requests_and_a_release_serve_both() {
    model(|| {
        let (m, _) = monitor();
        // 60 blocks: one request makes the worker busy again.
        let m1 = m.clone();
        let second = big(move || arrive(&m1, 60));
        let mut first = arrive(&m, 60);
        m.report(1, 0, &used(0)).unwrap();
        let mut second = second.join().unwrap();
        // One is sent; its release sends the other.
        m.maintain();
        let (sent, mut other) = match poll(&mut first) {
            Poll::Ready(d) => (d.unwrap(), second),
            Poll::Pending => (decided(&m, &mut second).unwrap(), first),
        };
        drop(sent);
        drop(decided(&m, &mut other).unwrap());
        assert_eq!(blocks(&m), 0);
    });
}

#[test]
fn a_request_waiting_for_scale_up_races_the_worker_that_joins() {
    model(|| {
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
        let waiter = big(move || arrive(&m1, 10));
        let spec = WorkerSpec {
            kv_total_blocks: Some(100),
            ..Default::default()
        };
        m.add_worker("m", 2, spec).unwrap();
        let mut fut = waiter.join().unwrap();
        let d = decided(&m, &mut fut).expect("sent once a worker joins");
        assert_eq!(d.worker_id(), 2);
        drop(d);
        assert_eq!(m.rank_load(2, 0).unwrap().active_decode_blocks, 0);
    });
}

/// A thread of the model with a real thread's stack: loom runs each on a
/// 32 KiB coroutine, less than a dispatch through the maintenance takes.
fn big<F: FnOnce() -> T + Send + 'static, T: Send + 'static>(f: F) -> thread::JoinHandle<T> {
    thread::Builder::new().stack_size(1 << 20).spawn(f).unwrap()
}

/// `loom::model` with the model's body on a [`big`] thread.
fn model<F: Fn() + Send + Sync + 'static>(f: F) {
    let f = std::sync::Arc::new(f);
    loom::model(move || {
        let f = f.clone();
        big(move || f()).join().unwrap();
    });
}
