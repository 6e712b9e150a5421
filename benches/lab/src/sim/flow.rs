//! The frontend queue of arms (g) and (h): each attempt is a
//! [`Monitor::dispatch`] future, polled when its waker fires. The monitors
//! run with the host's maintenance (`Maintenance::Manual`): after each
//! event the loop calls [`Monitor::maintain`], which dispatches what the
//! event's kicks (reports, released bookings, sweeps) made room for, and
//! sets an event at the time it returns (the queue's next deadline), as
//! the monitor's own thread would wake.
//!
//! A waker only notes its request's id; the loop polls the noted futures
//! (which may note more) and maintains again until nothing moves, so every
//! dispatch happens at the virtual instant the capacity appeared.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use loadgate::flow::{FlowRejection, FlowRequest};
use loadgate::monitor::{Dispatch, DispatchRequest};

use super::{ns, Ev, Sim, Stage, MODEL};

/// Ids of the requests whose dispatch futures were woken.
pub(super) type Woken = Arc<Mutex<Vec<u32>>>;

struct Note {
    id: u32,
    woken: Woken,
}

impl Wake for Note {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.lock().expect("woken").push(self.id);
    }
}

impl Sim<'_> {
    /// Attempt `attempt` of request `id` asks the monitor for a worker:
    /// sent at once, queued, or refused.
    pub(super) fn dispatch_flow(&mut self, id: u32, attempt: u32) {
        let monitor = self
            .monitor_of(id)
            .expect("a queue arm has a monitor")
            .clone();
        let knobs = self.arm.flow.expect("a queue arm");
        let now = self.now;
        let r = &mut self.reqs[id as usize];
        let spec = r.spec;
        // A worker's refusal brings the attempt back with the time it has
        // waited already taken from its deadline.
        if r.hops == 0 {
            r.queued_since = now;
        }
        let left = ns(knobs.deadline_s).saturating_sub(now - r.queued_since);
        if left == 0 {
            r.stage = Stage::Backoff;
            let retry_after = monitor.flow_retry_after(MODEL).map(|d| d.as_secs_f64());
            self.at(
                now,
                Ev::Heard(id, attempt, retry_after, "frontend queue: deadline"),
            );
            return;
        }
        let fair = knobs.fair;
        let tenant = if fair {
            format!("tenant-{}", spec.tenant)
        } else {
            String::new()
        };
        let request = DispatchRequest {
            flow: FlowRequest {
                tenant: &tenant,
                priority: spec.priority,
                prompt_tokens: u64::from(spec.prompt),
                max_tokens: None,
                deadline: Some(std::time::Duration::from_nanos(left)),
            },
            blocks: Some(u64::from(spec.prompt.div_ceil(self.c.engine.block_size))),
            queue: true,
        };
        r.stage = Stage::Waiting;
        r.waiting = Some((attempt, monitor.dispatch(MODEL, &request)));
        self.poll_flow(id);
    }

    /// Polls request `id`'s dispatch future, if it has one, and acts on its
    /// outcome.
    pub(super) fn poll_flow(&mut self, id: u32) {
        let r = &mut self.reqs[id as usize];
        let Some((attempt, fut)) = r.waiting.as_mut() else {
            return;
        };
        let waker = Waker::from(Arc::new(Note {
            id,
            woken: self.woken.clone(),
        }));
        let Poll::Ready(outcome) = Pin::new(fut).poll(&mut Context::from_waker(&waker)) else {
            return;
        };
        let attempt = *attempt;
        r.waiting = None;
        match outcome {
            Ok(d) => self.sent(id, d),
            Err(why) => {
                let (retry_after, why) = match why {
                    FlowRejection::QueueFull => (self.arm.retry_after_s, "frontend queue: full"),
                    FlowRejection::QueueDeadline => (
                        self.monitor_of(id)
                            .and_then(|m| m.flow_retry_after(MODEL))
                            .map(|d| d.as_secs_f64()),
                        "frontend queue: deadline",
                    ),
                    FlowRejection::NoWorkers => (self.arm.retry_after_s, "frontend: no workers"),
                    _ => (self.arm.retry_after_s, "frontend: all workers busy"),
                };
                self.reqs[id as usize].stage = Stage::Backoff;
                self.at(self.now, Ev::Heard(id, attempt, retry_after, why));
            }
        }
    }

    /// The monitor sent request `id` to a worker.
    fn sent(&mut self, id: u32, d: Dispatch) {
        let spec = self.reqs[id as usize].spec;
        let blocks = u64::from(spec.prompt.div_ceil(self.c.engine.block_size));
        self.admitted(id, d.worker_id() as u32, d.dp_rank(), blocks);
        let r = &mut self.reqs[id as usize];
        r.worker = d.worker_id() as u32;
        r.rank = d.dp_rank();
        r.hops += 1;
        r.stage = Stage::Travelling;
        r.dispatch = Some(d);
        let attempt = r.attempt;
        self.at(self.now + ns(self.c.net_delay_s), Ev::AtWorker(id, attempt));
    }

    /// After each event of a queue arm: maintains every monitor and polls
    /// every woken dispatch until nothing moves, then sets the expiry
    /// event for the monitors' next deadline.
    pub(super) fn flow_after(&mut self) {
        let mut next;
        loop {
            next = self
                .fronts
                .iter()
                .filter_map(|f| f.monitor.maintain())
                .min();
            let woken = std::mem::take(&mut *self.woken.lock().expect("woken"));
            if woken.is_empty() {
                break;
            }
            for id in woken {
                self.poll_flow(id);
            }
        }
        if let Some(at) = next {
            if self.flow_expire_at.is_none_or(|t| at < t) {
                self.flow_expire_at = Some(at);
                self.at(at.max(self.now), Ev::FlowExpire);
            }
        }
    }

    /// The queue's deadline timer: the maintenance that follows each event
    /// (`flow_after`) refuses what reached its deadline.
    pub(super) fn flow_expire(&mut self) {
        self.flow_expire_at = None;
    }
}
