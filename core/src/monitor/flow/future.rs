//! The handles of a dispatch: [`Dispatch`] (a request sent to a worker),
//! [`Dispatching`] (the future of one that may wait) and
//! [`DispatchHandle`] (one waiting with a callback).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use super::control::{FlowControl, Granted, Notify};
use crate::flow::{FlowRejection, Reservation};
use crate::monitor::booking::Booking;
use crate::monitor::model::Model;
use crate::sync::lock;

/// A request sent to a worker: its worker and booking, and what its tenant
/// owes until it completes. Dropping it completes it with the output
/// reported so far.
///
/// `Send` and `Sync`: complete it from any thread.
///
/// ```
/// fn send_sync<T: Send + Sync>() {}
/// send_sync::<loadgate::monitor::Dispatch>();
///
/// fn once(d: loadgate::monitor::Dispatch) {
///     d.complete(0);
/// }
/// ```
///
/// It is not `Clone`: a request completes once.
///
/// ```compile_fail,E0599
/// fn twice(d: loadgate::monitor::Dispatch) {
///     let copy = d.clone();
///     d.complete(0);
///     copy.complete(0);
/// }
/// ```
#[must_use = "dropping a dispatch completes it at once"]
pub struct Dispatch {
    pub(super) worker_id: u64,
    pub(super) booking: Option<Booking>,
    pub(super) settle: Option<(Arc<FlowControl>, Reservation)>,
    pub(super) origin: Origin,
    /// What streams its booking: the host's reported tokens, or (while the
    /// host reports none) the response's chunks a middleware saw.
    pub(super) streamed: Streamed,
}

/// What streams a dispatch's booking (`Dispatch::report_output`,
/// `Dispatch::chunk`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Streamed {
    /// Nothing yet.
    #[default]
    Nothing,
    /// The host's reported output tokens.
    Reports,
    /// The response's chunks, one token each.
    Chunks,
}

/// What a dispatch needs to be sent again after a worker refused it
/// (`Monitor::redispatch`).
pub(super) struct Origin {
    pub(super) model: Arc<Model>,
    pub(super) blocks: u64,
    pub(super) prefill: u64,
    /// Times it was routed again without a queue.
    pub(super) reroutes: u32,
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
            booking: g.booking,
            settle: Some((Arc::clone(flow), g.reservation)),
            origin: Origin {
                model: Arc::clone(&flow.model),
                blocks: g.blocks,
                prefill: g.prefill,
                reroutes: 0,
            },
            streamed: Streamed::Nothing,
        }
    }

    /// The model it is a request of.
    pub fn model(&self) -> &str {
        &self.origin.model.name
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

    /// `tokens` more output tokens, the first included: charged to its
    /// tenant at once, and streamed through its booking (the first as
    /// [`Booking::first_token`], the rest as [`Booking::tokens`]), which
    /// settles its reservation and, with an SLO, observes the stream.
    pub fn report_output(&mut self, tokens: u64) {
        if tokens == 0 {
            return;
        }
        if let Some((flow, r)) = &mut self.settle {
            lock(&flow.state).queue.report_output(r, tokens);
        }
        if self.streamed != Streamed::Chunks {
            self.streamed = Streamed::Reports;
            self.stream(tokens);
        }
    }

    /// One chunk of its streamed response went out (an HTTP middleware's
    /// view): while the host reports no output, each chunk streams its
    /// booking as one token, the first as its first token. Once the host
    /// reports output, chunks are left alone (and if chunks came first,
    /// the reports only charge the tenant).
    pub fn chunk(&mut self) {
        if self.streamed != Streamed::Reports {
            self.streamed = Streamed::Chunks;
            self.stream(1);
        }
    }

    /// `tokens` more through its booking: the first as its first token.
    fn stream(&mut self, tokens: u64) {
        if let Some(b) = &mut self.booking {
            let rest = if b.output_tokens() == 0 {
                b.first_token();
                tokens - 1
            } else {
                tokens
            };
            b.tokens(rest);
        }
    }

    /// What the SLO's fit predicted for it when it was booked (as
    /// [`Booking::prediction`]).
    pub fn prediction(&self) -> Option<crate::monitor::Prediction> {
        self.booking.as_ref().and_then(Booking::prediction)
    }

    /// Reserves KV for its answer, up to `max_tokens` tokens (as
    /// [`Booking::expect_output`]).
    pub fn expect_output(&mut self, max_tokens: Option<u64>) {
        if let Some(b) = &mut self.booking {
            b.expect_output(max_tokens);
        }
    }

    /// Output tokens reported so far.
    pub fn reported_output(&self) -> u64 {
        self.settle.as_ref().map_or(0, |(_, r)| r.reported_output())
    }

    /// The request finished with `output_tokens` in all: its tenant is
    /// charged what was not reported yet, its reservation released, and its
    /// booking freed, its answer's length learned (as
    /// [`Booking::finish`]; 0: as many as streamed through it).
    pub fn complete(mut self, output_tokens: u64) {
        self.finish(output_tokens);
        if let Some(b) = self.booking.take() {
            b.finish((output_tokens > 0).then_some(output_tokens));
        }
    }

    fn finish(&mut self, output_tokens: u64) {
        if let Some((flow, r)) = self.settle.take() {
            lock(&flow.state).queue.settle(r, output_tokens);
        }
    }
}

impl Drop for Dispatch {
    fn drop(&mut self) {
        let reported = self.reported_output();
        self.finish(reported);
        // Dropping the booking frees its blocks (and kicks the queue when
        // that leaves its worker free).
        self.booking = None;
    }
}

/// [`Monitor::dispatch`](crate::Monitor::dispatch)'s future: a
/// [`Dispatch`], or why not. The monitor's maintenance sends a waiting
/// request and wakes the future's task; dropping the future gives the
/// request up.
///
/// `Send` and `Sync`: a multi-threaded runtime may move the task. It
/// holds no borrow of the monitor.
///
/// ```
/// fn send_sync_unpin<T: Send + Sync + Unpin + 'static>() {}
/// send_sync_unpin::<loadgate::monitor::Dispatching>();
/// ```
///
/// It is not `Clone`: a wait is given up once.
///
/// ```compile_fail,E0599
/// fn twice(waiting: loadgate::monitor::Dispatching) {
///     let copy = waiting.clone();
///     drop((waiting, copy));
/// }
/// ```
#[must_use = "a dispatch that is not awaited is cancelled when dropped"]
pub struct Dispatching {
    pub(super) step: Step,
}

impl std::fmt::Debug for Dispatching {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.step {
            Step::Ready(_) => "ready",
            Step::Waiting(_) => "waiting",
            Step::Done => "done",
        };
        f.debug_struct("Dispatching")
            .field("state", &state)
            .finish()
    }
}

// A dispatch carries its booking inline: boxing it would allocate on
// every request's path.
#[allow(clippy::large_enum_variant)]
pub(super) enum Step {
    Ready(Result<Dispatch, FlowRejection>),
    Waiting(Waiting),
    Done,
}

/// A request waiting in a queue: its dispatcher, ticket and the ticket's
/// generation (a ticket is reused once freed).
pub(super) struct Waiting {
    pub(super) flow: Arc<FlowControl>,
    pub(super) ticket: u32,
    pub(super) gen: u32,
}

impl Waiting {
    /// Gives the request up: it leaves the queue, or the dispatch made for
    /// it meanwhile is completed. Whether it was still waiting (for a
    /// callback: whether the callback will never be called).
    pub(super) fn cancel(&self) -> bool {
        let (was_queued, granted) = {
            let mut st = lock(&self.flow.state);
            let t = &mut st.tickets[self.ticket as usize];
            if t.gen != self.gen {
                // Resolved and delivered to its callback already.
                return false;
            }
            let key = t.key.take();
            let outcome = t.outcome.take();
            if let Some(key) = key {
                st.queue.cancel(key);
            }
            FlowControl::free_ticket(&mut st, self.ticket);
            self.flow.publish_waiting(&st);
            (key.is_some(), outcome.and_then(Result::ok))
        };
        // A dispatch made for it and never collected is completed, off the
        // lock.
        if let Some(g) = granted {
            drop(Dispatch::from_granted(g, &self.flow));
        }
        was_queued
    }
}

impl Dispatching {
    /// Blocks this thread until the request is sent or refused, or
    /// `timeout` runs out (`None`: no limit of its own): then the request
    /// leaves the queue and [`FlowRejection::TimedOut`] is returned.
    pub fn wait(mut self, timeout: Option<Duration>) -> Result<Dispatch, FlowRejection> {
        /// Unparks the blocked thread.
        struct Unpark(std::thread::Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let give_up = timeout.and_then(|d| Instant::now().checked_add(d));
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(outcome) = Pin::new(&mut self).poll(&mut cx) {
                return outcome;
            }
            match give_up {
                None => std::thread::park(),
                Some(at) => {
                    let now = Instant::now();
                    if now >= at {
                        // Dropping the future gives the request up.
                        return Err(FlowRejection::TimedOut);
                    }
                    std::thread::park_timeout(at - now);
                }
            }
        }
    }
}

impl Future for Dispatching {
    type Output = Result<Dispatch, FlowRejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let w = match std::mem::replace(&mut this.step, Step::Done) {
            Step::Ready(outcome) => return Poll::Ready(outcome),
            Step::Done => panic!("Dispatching polled after it finished"),
            Step::Waiting(w) => w,
        };
        let outcome = {
            let mut st = lock(&w.flow.state);
            let t = &mut st.tickets[w.ticket as usize];
            debug_assert_eq!(t.gen, w.gen);
            match t.outcome.take() {
                Some(outcome) => {
                    FlowControl::free_ticket(&mut st, w.ticket);
                    Some(outcome)
                }
                None => {
                    match &mut t.notify {
                        Notify::Waker(old) if old.will_wake(cx.waker()) => {}
                        n => *n = Notify::Waker(cx.waker().clone()),
                    }
                    None
                }
            }
        };
        match outcome {
            Some(outcome) => Poll::Ready(outcome.map(|g| Dispatch::from_granted(g, &w.flow))),
            None => {
                this.step = Step::Waiting(w);
                Poll::Pending
            }
        }
    }
}

impl Drop for Dispatching {
    fn drop(&mut self) {
        if let Step::Waiting(w) = std::mem::replace(&mut self.step, Step::Done) {
            w.cancel();
        }
    }
}

/// A request waiting with a callback
/// ([`Monitor::dispatch_with_callback`](crate::Monitor::dispatch_with_callback)).
/// Dropping the handle does not cancel the request: its callback is still
/// called exactly once.
#[derive(Debug)]
pub struct DispatchHandle {
    pub(super) waiting: Option<Waiting>,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("ticket", &self.ticket)
            .finish_non_exhaustive()
    }
}

impl DispatchHandle {
    /// Takes the request out of the queue if it still waits: then its
    /// callback is dropped without being called, and `true` is returned.
    /// `false` when its outcome was decided (its callback has run, runs, or
    /// will run with it).
    pub fn cancel(&self) -> bool {
        self.waiting.as_ref().is_some_and(Waiting::cancel)
    }

    /// Whether the request still waits in the queue.
    pub fn is_waiting(&self) -> bool {
        self.waiting.as_ref().is_some_and(|w| {
            let st = lock(&w.flow.state);
            let t = &st.tickets[w.ticket as usize];
            t.gen == w.gen && t.key.is_some()
        })
    }
}
