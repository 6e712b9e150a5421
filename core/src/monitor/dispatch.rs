//! [`Dispatch`] and [`Monitor::dispatch`]'s future: the handle of a request
//! sent to a worker, and the wait for one (`flow.rs`, "Protocol").

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::flow::{After, FlowControl, Granted};
use super::model::Model;
use super::{Booking, Monitor};
use crate::flow::{FlowRejection, Reservation};
use crate::sync::lock;

/// A request sent to a worker: its worker and booking, and what its tenant
/// owes until it completes. Dropping it completes it with the output
/// reported so far.
#[must_use = "dropping a dispatch completes it at once"]
pub struct Dispatch {
    pub(super) worker_id: u64,
    pub(super) booking: Option<Booking>,
    pub(super) settle: Option<(Arc<FlowControl>, Reservation)>,
}

impl std::fmt::Debug for Dispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatch")
            .field("worker_id", &self.worker_id)
            .finish_non_exhaustive()
    }
}

impl Dispatch {
    pub(super) fn from_granted(g: Granted, flow: &Arc<FlowControl>) -> Self {
        Self {
            worker_id: g.worker_id,
            booking: Some(g.booking),
            settle: Some((Arc::clone(flow), g.reservation)),
        }
    }

    /// The worker it was sent to.
    pub fn worker_id(&self) -> u64 {
        self.worker_id
    }

    /// The data-parallel rank of the worker it was booked on (the least
    /// loaded by booked blocks when it was sent).
    pub fn dp_rank(&self) -> u32 {
        self.booking.as_ref().map_or(0, Booking::dp_rank)
    }

    /// Its prefill is done (the first token came): its prompt tokens stop
    /// counting on the worker.
    pub fn prefill_done(&mut self) {
        if let Some(b) = &mut self.booking {
            b.prefill_done();
        }
    }

    /// `n` more KV blocks of generated output, booked on its worker (as
    /// [`Booking::add_output_blocks`]).
    pub fn add_output_blocks(&mut self, n: u64) {
        if let Some(b) = &mut self.booking {
            b.add_output_blocks(n);
        }
    }

    /// `tokens` more output tokens: charged to its tenant at once.
    pub fn report_output(&mut self, tokens: u64) {
        if let Some((flow, r)) = &mut self.settle {
            lock(&flow.state).queue.report_output(r, tokens);
        }
    }

    /// Output tokens reported so far.
    pub fn reported_output(&self) -> u64 {
        self.settle.as_ref().map_or(0, |(_, r)| r.reported_output())
    }

    /// The request finished with `output_tokens` in all: its tenant is
    /// charged what was not reported yet, its reservation released, and its
    /// booking freed.
    pub fn complete(mut self, output_tokens: u64) {
        self.finish(output_tokens);
    }

    fn finish(&mut self, output_tokens: u64) {
        if let Some((flow, r)) = self.settle.take() {
            lock(&flow.state).queue.settle(r, output_tokens);
        }
        // Dropping the booking frees its blocks and kicks the queue.
        self.booking = None;
    }
}

impl Drop for Dispatch {
    fn drop(&mut self) {
        let reported = self.reported_output();
        self.finish(reported);
    }
}

/// [`Monitor::dispatch`]'s future: a [`Dispatch`], or why not.
#[must_use = "a dispatch that is not awaited is cancelled when dropped"]
pub struct Dispatching<'a> {
    pub(super) monitor: MonitorRef<'a>,
    pub(super) step: Step,
}

/// The monitor a [`Dispatching`] runs the dispatch loop on: borrowed
/// ([`Monitor::dispatch`]) or shared ([`Monitor::dispatch_shared`]).
pub(super) enum MonitorRef<'a> {
    Borrowed(&'a Monitor),
    Shared(Arc<Monitor>),
}

impl std::ops::Deref for MonitorRef<'_> {
    type Target = Monitor;

    fn deref(&self) -> &Monitor {
        match self {
            Self::Borrowed(m) => m,
            Self::Shared(m) => m,
        }
    }
}

pub(super) enum Step {
    Ready(Result<Dispatch, FlowRejection>),
    Waiting {
        model: Arc<Model>,
        flow: Arc<FlowControl>,
        ticket: u32,
        gen: u32,
    },
    Done,
}

impl Future for Dispatching<'_> {
    type Output = Result<Dispatch, FlowRejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let monitor = &*this.monitor;
        let (model, flow, ticket) = match std::mem::replace(&mut this.step, Step::Done) {
            Step::Ready(outcome) => return Poll::Ready(outcome),
            Step::Done => panic!("Dispatching polled after it finished"),
            Step::Waiting {
                model,
                flow,
                ticket,
                gen,
            } => {
                this.step = Step::Waiting {
                    model: Arc::clone(&model),
                    flow: Arc::clone(&flow),
                    ticket,
                    gen,
                };
                (model, flow, ticket)
            }
        };
        loop {
            // A kick before this follows its change (`flow.rs`, "Protocol").
            lock(&flow.dispatcher).kicked = false;
            let mut after = After::default();
            let outcome = {
                let mut st = lock(&flow.state);
                let now = monitor.clock.now_nanos();
                while flow.run(monitor, &model, &mut st, now, &mut after) {
                    drop(st);
                    std::mem::take(&mut after).run();
                    st = lock(&flow.state);
                }
                let t = &mut st.tickets[ticket as usize];
                match t.outcome.take() {
                    Some(outcome) => {
                        FlowControl::free_ticket(&mut st, ticket);
                        Some(outcome)
                    }
                    None => {
                        if !t.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                            t.waker = Some(cx.waker().clone());
                        }
                        None
                    }
                }
            };
            after.run();
            if let Some(outcome) = outcome {
                this.step = Step::Done;
                flow.hand_over();
                return Poll::Ready(outcome.map(|g| Dispatch::from_granted(g, &flow)));
            }
            let mut d = lock(&flow.dispatcher);
            if !std::mem::take(&mut d.kicked) {
                d.waker = Some(cx.waker().clone());
                return Poll::Pending;
            }
        }
    }
}

impl Drop for Dispatching<'_> {
    fn drop(&mut self) {
        let Step::Waiting {
            model,
            flow,
            ticket,
            gen,
        } = std::mem::replace(&mut self.step, Step::Done)
        else {
            return;
        };
        let granted = {
            let mut st = lock(&flow.state);
            let t = &mut st.tickets[ticket as usize];
            debug_assert_eq!(t.gen, gen);
            let key = t.key.take();
            let outcome = t.outcome.take();
            if let Some(key) = key {
                st.queue.cancel(key);
            }
            FlowControl::free_ticket(&mut st, ticket);
            flow.publish_waiting(&model, &st);
            outcome.and_then(Result::ok)
        };
        // A dispatch made for it and never collected is completed, outside
        // the lock (its booking's release kicks the queue).
        if let Some(g) = granted {
            drop(Dispatch::from_granted(g, &flow));
        }
        flow.hand_over();
    }
}
