//! The frontend queue's cases: a queued request dispatched the moment a
//! worker frees, against the Mutex gate's queued handoff (FIFO, one slot,
//! no tenants, no worker to pick and book), with the absolute target of
//! the flow-control issue; and what requests waiting in a queue cost a
//! report and a booking (nothing: against the same monitor without one).

use std::hint::black_box;
use std::task::Poll;

use loadgate::flow::{FlowConfig, FlowRequest};
use loadgate::monitor::{Dispatch, DispatchRequest, FlowControlConfig};
use loadgate::{
    LoadReport, Maintenance, Monitor, MonitorConfig, MonotonicClock, Policy, ThresholdUpdate,
    WorkerSpec,
};
use loadgate_benches::baseline::admission::MutexGate;
use loadgate_benches::fixture::{noop_waker, poll_once};
use loadgate_benches::harness::interleave;

use crate::admission::mutex_handoff;
use crate::{each, Case, Run, FLOW_DISPATCH, WITH_QUEUE};

/// A request of `tenant` that fills the worker it is sent to.
fn request(tenant: &str) -> DispatchRequest<'_> {
    DispatchRequest {
        flow: FlowRequest {
            prompt_tokens: 100,
            max_tokens: Some(50),
            ..FlowRequest::new(tenant)
        },
        blocks: Some(60),
        queue: true,
    }
}

pub(crate) fn flow_cases(run: &mut Run) {
    let name = "flow: dispatch when a worker frees";
    run.measure(Case::hot(name, FLOW_DISPATCH), |budget| {
        // One worker of 100 blocks, busy at one request of 60: each op
        // queues a request (two tenants in turn, so the fair order is
        // computed), completes the one running, whose release kicks the
        // queue, runs the maintenance that sends the queued one (on this
        // thread, so that its work is measured, not a thread's wake-up),
        // and polls it to its dispatch.
        let m = one_worker(Maintenance::Manual);
        let flow = FlowControlConfig {
            queue: FlowConfig::new(64),
            policy: Policy::RoundRobin,
        };
        m.set_flow_control("m", Some(&flow)).expect("flow control");
        let waker = noop_waker();
        let sent = |d: Poll<Result<Dispatch, _>>| match d {
            Poll::Ready(Ok(d)) => d,
            _ => panic!("dispatched"),
        };
        let mut holder = Some(sent(poll_once(&mut m.dispatch("m", &request("a")), &waker)));
        let mg = MutexGate::new(1, 16);
        let mut mg_holder = Some(mg.try_admit().expect("first slot"));
        let mut turn = 0usize;
        let mut sides = [
            each(|| {
                turn += 1;
                let tenant = ["a", "b"][turn % 2];
                let mut f = m.dispatch("m", &request(tenant));
                assert!(poll_once(&mut f, &waker).is_pending());
                if let Some(d) = holder.take() {
                    d.complete(50);
                }
                m.maintain();
                holder = Some(sent(poll_once(&mut f, &waker)));
            }),
            each(|| mutex_handoff(&mg, &mut mg_holder, &waker)),
        ];
        interleave(budget, &mut sides)
    });
    waiting_cases(run);
}

/// A monitor of model "m" with one worker of 100 blocks, busy above half
/// of them, maintained by `maintenance`.
fn one_worker(maintenance: Maintenance) -> Monitor {
    let config = MonitorConfig {
        maintenance,
        ..MonitorConfig::default()
    };
    let m = Monitor::with_config(config, MonotonicClock::shared()).expect("a monitor");
    let spec = WorkerSpec {
        kv_total_blocks: Some(100),
        ..Default::default()
    };
    m.add_worker("m", 1, spec).expect("worker");
    let decode = ThresholdUpdate {
        active_decode_blocks_threshold: Some(0.5),
        ..Default::default()
    };
    m.set_thresholds("m", &decode).expect("thresholds");
    m
}

/// A monitor of one busy worker (90 of 100 blocks, busy above half), with
/// `waiting` requests waiting in its queue (none: no flow control).
fn busy_monitor(waiting: u32) -> (Monitor, Vec<loadgate::monitor::DispatchHandle>) {
    let m = one_worker(Maintenance::Background);
    m.report(1, 0, &used(90)).expect("report");
    let mut handles = Vec::new();
    if waiting > 0 {
        let flow = FlowControlConfig {
            queue: FlowConfig::new(waiting),
            policy: Policy::RoundRobin,
        };
        m.set_flow_control("m", Some(&flow)).expect("flow control");
        for _ in 0..waiting {
            let h = m.dispatch_with_callback("m", &request("a"), Box::new(drop));
            assert!(h.is_waiting());
            handles.push(h);
        }
    }
    (m, handles)
}

fn used(n: u64) -> LoadReport {
    LoadReport {
        kv_used_blocks: Some(n),
        ..Default::default()
    }
}

/// A report and a booking on a busy worker while 500 requests wait,
/// against the same without a queue: the waiting requests must cost them
/// nothing (they kick only a publication that frees a worker).
fn waiting_cases(run: &mut Run) {
    let (queued, _handles) = busy_monitor(500);
    let (plain, _) = busy_monitor(0);
    let name = "report, busy worker, 500 requests waiting";
    run.measure(Case::hot(name, WITH_QUEUE), |budget| {
        let (mut a, mut b) = (0u64, 0u64);
        let mut sides = [
            each(|| {
                a += 1;
                black_box(queued.report(1, 0, &used(90 + (a & 1))).is_ok());
            }),
            each(|| {
                b += 1;
                black_box(plain.report(1, 0, &used(90 + (b & 1))).is_ok());
            }),
        ];
        interleave(budget, &mut sides)
    });
    let name = "book + release on a busy worker, 500 requests waiting";
    run.measure(Case::hot(name, WITH_QUEUE), |budget| {
        let mut sides = [
            each(|| queued.book(1, 0, 4).expect("book").blocks()),
            each(|| plain.book(1, 0, 4).expect("book").blocks()),
        ];
        interleave(budget, &mut sides)
    });
}
