//! The frontend queue's case: a queued request dispatched the moment a
//! worker frees, against the Mutex gate's queued handoff (FIFO, one slot,
//! no tenants, no worker to pick and book), with the absolute target of
//! the flow-control issue.

use std::task::Poll;

use loadgate::flow::{FlowConfig, FlowRequest};
use loadgate::monitor::{Dispatch, DispatchRequest, FlowControlConfig};
use loadgate::{Monitor, Policy, ThresholdUpdate, WorkerSpec};
use loadgate_benches::baseline::admission::MutexGate;
use loadgate_benches::fixture::{noop_waker, poll_once};
use loadgate_benches::harness::interleave;

use crate::admission::mutex_handoff;
use crate::{each, Case, Run, FLOW_DISPATCH};

/// A request of `tenant` that fills the worker it is sent to.
fn request(tenant: &str) -> DispatchRequest<'_> {
    DispatchRequest {
        flow: FlowRequest {
            prompt_tokens: 100,
            max_tokens: Some(50),
            ..FlowRequest::new(tenant)
        },
        blocks: 60,
        queue: true,
    }
}

pub(crate) fn flow_cases(run: &mut Run) {
    let name = "flow: dispatch when a worker frees";
    run.measure(Case::hot(name, FLOW_DISPATCH), |budget| {
        // One worker of 100 blocks, busy at one request of 60: each op
        // queues a request (two tenants in turn, so the fair order is
        // computed), completes the one running, whose release kicks the
        // queue, and polls the queued one to its dispatch.
        let m = Monitor::new();
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
                holder = Some(sent(poll_once(&mut f, &waker)));
            }),
            each(|| mutex_handoff(&mg, &mut mg_holder, &waker)),
        ];
        interleave(budget, &mut sides)
    });
}
