//! The frontend decision of every arm with a monitor: each attempt is a
//! [`Monitor::dispatch`] future, and a worker's refusal of a request it
//! never started is handed back with [`Monitor::redispatch`] (the monitor
//! leases the refusing worker, then routes the request again or puts it
//! back into its queue). The lab decides nothing itself: which worker and
//! rank, what is booked, whether a request waits, goes again or is refused
//! are the monitor's answers, made with the arm's settings.
//!
//! The monitors run with the host's maintenance (`Maintenance::Manual`):
//! after each event of a queue arm the loop calls [`Monitor::maintain`],
//! which dispatches what the event's kicks (reports, released bookings,
//! sweeps) made room for, and sets an event at the time it returns (the
//! queue's next deadline), as the monitor's own thread would wake.
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

use super::{ns, Ev, Sim, Stage, MODEL, QUEUE_DEADLINE};

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
    /// sent at once, queued (queue arms), or refused. An arm that does not
    /// book asks for a worker with nothing to book.
    pub(super) fn dispatch_monitor(&mut self, id: u32, attempt: u32) {
        let monitor = self.monitor_of(id).expect("a monitor arm").clone();
        let spec = self.reqs[id as usize].spec;
        let blocks = self.prompt_blocks(id);
        let fair = self.arm.flow.is_some_and(|f| f.fair);
        let tenant = if fair {
            format!("tenant-{}", spec.tenant)
        } else {
            String::new()
        };
        let book = self.arm.book;
        let request = DispatchRequest {
            flow: FlowRequest {
                tenant: &tenant,
                priority: spec.priority,
                prompt_tokens: if book { u64::from(spec.prompt) } else { 0 },
                max_tokens: None,
                deadline: self
                    .arm
                    .flow
                    .map(|f| std::time::Duration::from_secs_f64(f.deadline_s)),
            },
            blocks: Some(if book { blocks } else { 0 }),
            queue: self.arm.flow.is_some(),
        };
        let r = &mut self.reqs[id as usize];
        r.stage = Stage::Waiting;
        r.waiting = Some((attempt, monitor.dispatch(MODEL, &request)));
        self.poll_flow(id);
    }

    /// The KV blocks of request `id`'s prompt.
    fn prompt_blocks(&self, id: u32) -> u64 {
        let prompt = self.reqs[id as usize].spec.prompt;
        u64::from(prompt.div_ceil(self.c.engine.block_size))
    }

    /// A worker's refusal of attempt `attempt` of request `id` is back at
    /// the frontend: its dispatch goes back to the monitor.
    pub(super) fn redispatch(&mut self, id: u32, attempt: u32) {
        let r = &mut self.reqs[id as usize];
        if r.stage != Stage::Travelling || r.attempt != attempt {
            return;
        }
        let Some(d) = r.dispatch.take() else { return };
        let monitor = self.monitor_of(id).expect("a monitor arm").clone();
        self.let_go(id);
        let r = &mut self.reqs[id as usize];
        r.stage = Stage::Waiting;
        r.waiting = Some((attempt, monitor.redispatch(d)));
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
        let refused_by = r.refused_by.take();
        match outcome {
            Ok(d) => self.sent(id, d),
            Err(why) => {
                let (retry_after, why) = match why {
                    // Refused again after a worker's refusal (no reroute
                    // left, or no other worker free): the worker's reason.
                    FlowRejection::AllWorkersBusy if refused_by.is_some() => {
                        (self.arm.retry_after_s, refused_by.unwrap_or_default())
                    }
                    FlowRejection::QueueFull => (self.arm.retry_after_s, "frontend queue: full"),
                    FlowRejection::QueueDeadline => (
                        self.monitor_of(id)
                            .and_then(|m| m.flow_retry_after(MODEL))
                            .map(|d| d.as_secs_f64()),
                        QUEUE_DEADLINE,
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
        let blocks = if self.arm.book {
            self.prompt_blocks(id)
        } else {
            0
        };
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
