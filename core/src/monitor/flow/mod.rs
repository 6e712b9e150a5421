//! Dispatch through a model's frontend queue: the monitor's side of flow
//! control (the queue itself is `crate::flow`).
//!
//! # Protocol
//!
//! A model with flow control holds a `FlowControl` (`control.rs`): its
//! queue and the tickets of the requests that wait, under one mutex, and
//! the count of requests waiting in an atomic.
//!
//! * **Arrival.** [`Monitor::dispatch`] (and its blocking and callback
//!   forms) takes the lock. If nothing waits it picks a free worker and
//!   books it at once. Otherwise, or if none is free, the request queues
//!   (or is refused). A request that queues into an empty queue publishes
//!   the count and then tries once more to pick: see "Kicks".
//! * **Kicks.** Capacity appears through the monitor's own calls: a
//!   publication that leaves a worker not busy (a report, a booking's
//!   release, new thresholds, a sweep), a lease that ends, a worker that
//!   joins. Each *kicks* the model's queue: if requests wait, it marks the
//!   queue and raises the monitor's signal (`signal.rs`). That is a fence,
//!   a load, a store, a swap and at most an unpark: a kick never takes a
//!   lock and never runs the waiting requests' code.
//! * **Dispatching.** The monitor's maintenance (`duty.rs`: its own thread,
//!   or the host's [`Monitor::maintain`]) takes the signal, then runs the
//!   *dispatch loop* of each kicked queue: expire due requests, then, while
//!   a request waits and a worker is free, book the next request in the
//!   queue's order and resolve its ticket. Wakers are woken and callbacks
//!   called after the lock is released, in batches, on the maintenance's
//!   thread: never nested in another request's call, never on a thread
//!   that reports load.
//! * **The pairing.** A kick that reads no waiting request while one is
//!   being queued: the kicker publishes its change, then (a `SeqCst`
//!   fence) reads the count; the arrival stores the count, then (a
//!   `SeqCst` fence) picks again. One of the two sees the other. A queue
//!   that already had requests needs no pairing: every kick sees them. A
//!   model without flow control skips the fence on a plain load of its
//!   `flow_on` flag; a kick that reads the flag a moment before it is
//!   first set is not paired, and the request queued then is dispatched by
//!   the next kick. Turn flow control on before traffic to avoid the
//!   window.
//! * **Outcomes.** A ticket's outcome goes to its callback at once (the
//!   ticket is freed), or waits in the ticket for its future's next poll.
//!   A request an arrival sheds (fair shedding, `crate::flow`) is resolved
//!   under the arrival's lock, and its notification handed to the
//!   maintenance to deliver.
//!
//! Deadlines are kept by the maintenance too: it wakes at the earliest
//! queue deadline, on the monitor's clock (an arrival whose deadline is
//! earlier than every other raises the signal, so that it sets its wake-up
//! again).
//!
//! # Files
//!
//! `control.rs`: the queue, its tickets and the dispatch loop, which knows
//! nothing of the monitor (it is handed a pick function); `future.rs`: the
//! handles ([`Dispatch`], [`Dispatching`], [`DispatchHandle`]);
//! `metrics.rs`: what a queue counts; this file: the monitor's API over
//! them and the pick that books a worker.

mod control;
mod future;
mod late;
mod metrics;
mod pick;
mod trampoline;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

pub(crate) use control::FlowControl;
use control::{After, Notify, State};
pub use future::{Dispatch, DispatchHandle, Dispatching};
use future::{Step, Waiting};
pub(crate) use metrics::render as render_metrics;
use pick::pick_and_book;
pub(super) use pick::run_queues;

use super::config::DEFAULT_BLOCK_TOKENS;
use super::model::Model;
use super::{Monitor, Policy};
use crate::error::ThresholdError;
use crate::flow::{FlowConfig, FlowConfigError, FlowRejection, FlowRequest, MAX_SHED};
use crate::sync::{fence, lock, Ordering};

/// One request to dispatch.
#[derive(Debug, Clone, Copy)]
pub struct DispatchRequest<'a> {
    /// Its tenant, priority, tokens and deadline.
    pub flow: FlowRequest<'a>,
    /// KV blocks to book on the worker it is sent to (the worker rank's
    /// router-side `active_decode_blocks`; its prompt tokens are booked as
    /// prefill too, until [`Dispatch::prefill_done`]). `None`: the prompt
    /// in blocks of [`DEFAULT_BLOCK_TOKENS`] tokens.
    pub blocks: Option<u64>,
    /// Whether it may wait when no worker is free; `false` refuses it at
    /// once with [`FlowRejection::AllWorkersBusy`].
    pub queue: bool,
}

impl<'a> DispatchRequest<'a> {
    /// A request of `flow` that may wait, booking its prompt's blocks.
    pub fn new(flow: FlowRequest<'a>) -> Self {
        Self {
            flow,
            blocks: None,
            queue: true,
        }
    }

    /// The KV blocks it books.
    fn blocks(&self) -> u64 {
        self.blocks
            .unwrap_or_else(|| self.flow.prompt_tokens.div_ceil(DEFAULT_BLOCK_TOKENS))
    }
}

/// How a model's requests are dispatched (`Monitor::set_flow_control`).
#[derive(Debug, Clone, PartialEq)]
pub struct FlowControlConfig {
    /// The queue.
    pub queue: FlowConfig,
    /// How a free worker is picked.
    pub policy: Policy,
}

/// Every flow-controlled model's queue, by model name: swapped whole when
/// one is turned on or off (a cold path), read without a lock. Shared with
/// the maintenance's thread.
pub(super) type Flows = ArcSwap<HashMap<Box<str>, Arc<FlowControl>, foldhash::fast::RandomState>>;

/// The callback form's callback ([`Monitor::dispatch_with_callback`]):
/// called exactly once, with the dispatch or why not.
pub type DispatchCallback = Box<dyn FnOnce(Result<Dispatch, FlowRejection>) + Send + 'static>;

impl Monitor {
    /// Turns flow control on for `model` with `config`, or off with `None`
    /// (requests waiting then are refused with
    /// [`FlowRejection::QueueFull`]). A new config starts a new queue: the
    /// requests waiting in the old one are refused the same way, and their
    /// callbacks run on this thread.
    pub fn set_flow_control(
        &self,
        model: &str,
        config: Option<&FlowControlConfig>,
    ) -> Result<(), FlowError> {
        let reg = self.registry.load();
        let m = reg
            .models
            .get(model)
            .ok_or_else(|| FlowError::Model(ThresholdError::UnknownModel(model.to_owned())))?;
        let new = config
            .map(|c| FlowControl::new(Arc::clone(m), &c.queue, c.policy))
            .transpose()
            .map_err(FlowError::Config)?
            .map(Arc::new);
        if new.is_some() {
            self.duty.start();
        }
        let old = {
            let _writer = lock(&self.writer);
            let mut next = HashMap::clone(&self.flows.load());
            let old = match &new {
                Some(flow) => next.insert(model.into(), Arc::clone(flow)),
                None => next.remove(model),
            };
            // Relaxed: a setting (module docs, "Protocol").
            m.flow_on.store(new.is_some(), Ordering::Relaxed);
            self.flows.store(Arc::new(next));
            old
        };
        if let Some(old) = old {
            old.close(FlowRejection::QueueFull);
        }
        match &new {
            Some(flow) => flow.publish_waiting(&lock(&flow.state)),
            // SeqCst: as `FlowControl::publish_waiting`.
            None => m.flow_waiting.store(0, Ordering::SeqCst),
        }
        Ok(())
    }

    /// Sends a request of `model` to a free worker, or waits in the model's
    /// queue for one (when the model has flow control and the request may
    /// wait). Without flow control, a request that finds no free worker is
    /// refused at once with [`FlowRejection::AllWorkersBusy`]. The future
    /// holds no borrow of the monitor.
    pub fn dispatch(&self, model: &str, request: &DispatchRequest<'_>) -> Dispatching {
        self.arrive(model, request, &mut None).into_future()
    }

    /// [`dispatch`](Self::dispatch), blocking this thread until the request
    /// is sent or refused, or `timeout` runs out (`None`: no limit of its
    /// own): then the request leaves the queue and
    /// [`FlowRejection::TimedOut`] is returned.
    pub fn dispatch_blocking(
        &self,
        model: &str,
        request: &DispatchRequest<'_>,
        timeout: Option<Duration>,
    ) -> Result<Dispatch, FlowRejection> {
        self.dispatch(model, request).wait(timeout)
    }

    /// [`dispatch`](Self::dispatch) with a callback instead of a future,
    /// for hosts that cannot poll one (C, an event loop). `callback` is
    /// called exactly once: on this thread, before this returns, when the
    /// request is sent or refused at once; otherwise on the monitor's
    /// maintenance thread (or in the host's [`Monitor::maintain`]), never
    /// on a thread that reports load. Callbacks never nest: one called
    /// while another runs on the same thread (a callback that dispatches
    /// again) runs right after it returns. It must be quick and must not
    /// block on the monitor; it may complete its dispatch or dispatch
    /// again. A callback that panics is caught and reported on stderr.
    pub fn dispatch_with_callback(
        &self,
        model: &str,
        request: &DispatchRequest<'_>,
        callback: DispatchCallback,
    ) -> DispatchHandle {
        let mut callback = Some(callback);
        let arrival = self.arrive(model, request, &mut callback);
        arrival.into_handle(callback)
    }

    /// Hands back a request a worker refused before it started (its gate
    /// was at capacity, or the request reached its deadline in the gate's
    /// queue): the refusing worker is put under its overload lease, the
    /// booking is released, and
    ///
    /// * with flow control on the model, the request goes back into the
    ///   model's queue at its original place in its band and tenant, with
    ///   what is left of its deadline; its tenant's charge is undone, so it
    ///   is charged once when it is sent again (refused with
    ///   [`FlowRejection::QueueDeadline`] if its deadline has passed);
    /// * without, it is routed once more to another free worker, at most
    ///   [`MonitorConfig::reroutes`](crate::MonitorConfig::reroutes) times
    ///   in its life (1 by default), and otherwise refused with
    ///   [`FlowRejection::AllWorkersBusy`] (529).
    ///
    /// The future is the same as [`dispatch`](Self::dispatch)'s. A dispatch
    /// made by another monitor, or of a model removed since, is refused
    /// with [`FlowRejection::NoWorkers`] (and completed).
    pub fn redispatch(&self, dispatch: Dispatch) -> Dispatching {
        self.arrive_again(dispatch, &mut None).into_future()
    }

    /// [`redispatch`](Self::redispatch) with a callback, as
    /// [`dispatch_with_callback`](Self::dispatch_with_callback).
    pub fn redispatch_with_callback(
        &self,
        dispatch: Dispatch,
        callback: DispatchCallback,
    ) -> DispatchHandle {
        let mut callback = Some(callback);
        let arrival = self.arrive_again(dispatch, &mut callback);
        arrival.into_handle(callback)
    }

    /// A request's arrival (module docs). `callback`, if given, is taken
    /// when the request queues, and left when it is decided at once.
    fn arrive(
        &self,
        model: &str,
        request: &DispatchRequest<'_>,
        callback: &mut Option<DispatchCallback>,
    ) -> Arrival {
        let Some(flow) = self.flows.load().get(model).cloned() else {
            let reg = self.registry.load();
            let Some(m) = reg.models.get(model) else {
                return Arrival::Ready(Err(FlowRejection::NoWorkers));
            };
            let outcome = self.send_now(m, self.config.routing, request, None);
            if let Err(why) = &outcome {
                control::count_refusal(m, *why);
            }
            return Arrival::Ready(outcome);
        };
        let m = &flow.model;
        // A request may wait: the maintenance must run in this process (a
        // forked child starts its own; a pid compare otherwise).
        self.duty.start();
        let mut st = lock(&flow.state);
        if st.closed {
            // Turned off a moment ago: refused as the requests waiting were.
            return Arrival::Ready(Err(FlowRejection::QueueFull));
        }
        let now = self.clock.now_nanos();
        let band = usize::from(request.flow.priority);
        let was_empty = st.queue.is_empty();
        if was_empty {
            match self.send_now(m, flow.policy, request, Some((&flow, &mut st, now))) {
                Err(FlowRejection::AllWorkersBusy | FlowRejection::NoWorkers) if request.queue => {}
                outcome => {
                    match &outcome {
                        Ok(_) => st.stats.sent_at_once(),
                        Err(why) => flow.refused(&mut st, *why, band),
                    }
                    return Arrival::Ready(outcome);
                }
            }
        }
        // Relaxed: a hint, as `Model::routable`. With no workers, only
        // `scale_up_limit` requests wait for one to join.
        let no_workers = m.workers.load(Ordering::Relaxed) == 0;
        let refused = if no_workers && (!request.queue || st.queue.len() >= flow.scale_up_limit) {
            Some(FlowRejection::NoWorkers)
        } else if !request.queue {
            Some(FlowRejection::AllWorkersBusy)
        } else {
            None
        };
        // With an SLO, it waits only if predicted to be sent in time
        // (`late.rs`).
        let mut asked = request.flow;
        let refused = refused.or_else(|| match late::decide(&m.slo, &st.queue, &asked, now)? {
            Ok(deadline) => {
                asked.deadline = Some(deadline);
                None
            }
            Err(why) => Some(why),
        });
        if let Some(why) = refused {
            flow.refused(&mut st, why, band);
            return Arrival::Ready(Err(why));
        }
        let ticket = (request.blocks(), request.flow.prompt_tokens, band);
        self.wait_in(&flow, st, ticket, was_empty, callback, |q, t, shed| {
            q.push(&asked, t, now, shed)
        })
    }

    /// A refused request's second arrival (`redispatch`).
    fn arrive_again(
        &self,
        mut dispatch: Dispatch,
        callback: &mut Option<DispatchCallback>,
    ) -> Arrival {
        // A dispatch of another monitor, or of a model removed since: not
        // this monitor's to route (its workers are not ours).
        let ours = self
            .registry
            .load()
            .models
            .get(&*dispatch.origin.model.name)
            .is_some_and(|m| Arc::ptr_eq(m, &dispatch.origin.model));
        if !ours {
            return Arrival::Ready(Err(FlowRejection::NoWorkers));
        }
        // The lease first, then the release: the refusing worker is not
        // picked again for it.
        let _ = self.mark_overloaded(dispatch.worker_id);
        dispatch.booking = None;
        let origin = &dispatch.origin;
        let (blocks, prefill) = (origin.blocks, origin.prefill);
        let Some((flow, reservation)) = dispatch.settle.take() else {
            let m = Arc::clone(&origin.model);
            let reroutes = origin.reroutes;
            drop(dispatch);
            let outcome = if reroutes >= self.config.reroutes {
                Err(FlowRejection::AllWorkersBusy)
            } else if m.workers.load(Ordering::Relaxed) == 0 {
                // Relaxed: as `Model::routable`.
                Err(FlowRejection::NoWorkers)
            } else {
                pick_and_book(
                    &self.registry,
                    &m,
                    &self.clock,
                    self.config.routing,
                    blocks,
                    prefill,
                )
                .map(|(worker_id, booking)| Dispatch {
                    worker_id,
                    booking,
                    settle: None,
                    origin: future::Origin {
                        model: Arc::clone(&m),
                        blocks,
                        prefill,
                        reroutes: reroutes + 1,
                    },
                    streamed: future::Streamed::Nothing,
                })
                .ok_or(FlowRejection::AllWorkersBusy)
            };
            if let Err(why) = &outcome {
                control::count_refusal(&m, *why);
            }
            return Arrival::Ready(outcome);
        };
        drop(dispatch);
        self.duty.start();
        let mut st = lock(&flow.state);
        let band = reservation.band();
        if st.closed {
            st.queue.settle(reservation, 0);
            return Arrival::Ready(Err(FlowRejection::QueueFull));
        }
        let now = self.clock.now_nanos();
        let was_empty = st.queue.is_empty();
        let ticket = (blocks, prefill, band);
        self.wait_in(&flow, st, ticket, was_empty, callback, |q, t, shed| {
            q.requeue(reservation, t, now, shed)
        })
    }

    /// The rest of a request's queueing, under the queue's lock `st`: a
    /// ticket for `(blocks, prefill, band)`, then `place` puts it into the
    /// queue (or refuses it), shedding through the function it is given.
    fn wait_in(
        &self,
        flow: &Arc<FlowControl>,
        mut st: crate::sync::MutexGuard<'_, State>,
        (blocks, prefill, band): (u64, u64, usize),
        was_empty: bool,
        callback: &mut Option<DispatchCallback>,
        place: impl FnOnce(
            &mut crate::flow::FlowQueue<u32>,
            u32,
            &mut dyn FnMut(u32),
        ) -> Result<crate::flow::QueueKey, (FlowRejection, u32)>,
    ) -> Arrival {
        let m = &*flow.model;
        let now = self.clock.now_nanos();
        let (t, gen) = FlowControl::ticket(&mut st, blocks, prefill, band, now);
        let mut shed = Shed::default();
        let earliest = st.queue.next_deadline();
        let pushed = place(&mut st.queue, t, &mut |v| shed.push(v));
        flow.shed(&mut st, shed.as_slice(), now);
        let key = match pushed {
            Ok(key) => key,
            Err((reason, _)) => {
                FlowControl::free_ticket(&mut st, t);
                flow.refused(&mut st, reason, band);
                return Arrival::Ready(Err(reason));
            }
        };
        let ticket = &mut st.tickets[t as usize];
        ticket.key = Some(key);
        if let Some(callback) = callback.take() {
            ticket.notify = Notify::Callback(Box::new(move |outcome, flow| {
                callback(outcome.map(|g| Dispatch::from_granted(g, flow)));
            }));
        }
        flow.publish_waiting(&st);
        // A deadline earlier than the maintenance knows of: it sets its
        // wake-up again.
        if st.queue.next_deadline() < earliest || earliest.is_none() {
            flow.wake_maintenance();
        }
        // The arrival's side of the pairing (module docs). Into an empty
        // queue this request is the head, and the only one the loop below
        // can send; its outcome is delivered here, off the lock.
        fence(Ordering::SeqCst);
        if was_empty {
            let mut own: After = After::default();
            flow.send_waiting(
                &mut st,
                &self.clock,
                now,
                &mut |blocks, prefill| {
                    pick_and_book(&self.registry, m, &self.clock, flow.policy, blocks, prefill)
                },
                &mut own,
            );
            drop(st);
            own.deliver(flow);
        } else {
            drop(st);
        }
        Arrival::Waiting(Waiting {
            flow: Arc::clone(flow),
            ticket: t,
            gen,
        })
    }

    /// Picks a free worker of `m` for `request` and books it; with flow
    /// control, charges its tenant.
    fn send_now(
        &self,
        m: &Arc<Model>,
        policy: Policy,
        request: &DispatchRequest<'_>,
        flow: Option<(&Arc<FlowControl>, &mut State, u64)>,
    ) -> Result<Dispatch, FlowRejection> {
        // Relaxed: as `Model::routable`.
        if m.workers.load(Ordering::Relaxed) == 0 {
            return Err(FlowRejection::NoWorkers);
        }
        let mut flow = flow;
        if let Some((_, st, _)) = &mut flow {
            // Before booking, so that nothing is booked for a refused
            // tenant (and no booking is dropped under the lock).
            st.queue.check_tenant(request.flow.tenant)?;
        }
        let (worker_id, booking) = pick_and_book(
            &self.registry,
            m,
            &self.clock,
            policy,
            request.blocks(),
            request.flow.prompt_tokens,
        )
        .ok_or(FlowRejection::AllWorkersBusy)?;
        let settle = match flow {
            Some((flow, st, now)) => {
                let r = st
                    .queue
                    .admit_direct(&request.flow, now)
                    .expect("the tenant was checked under the same lock");
                Some((Arc::clone(flow), r))
            }
            None => None,
        };
        Ok(Dispatch {
            worker_id,
            booking,
            settle,
            origin: future::Origin {
                model: Arc::clone(m),
                blocks: request.blocks(),
                prefill: request.flow.prompt_tokens,
                reroutes: 0,
            },
            streamed: future::Streamed::Nothing,
        })
    }

    /// How long a client refused by `model`'s queue should wait before
    /// trying again (`FlowQueue::retry_after`); `None` without flow
    /// control.
    pub fn flow_retry_after(&self, model: &str) -> Option<Duration> {
        let flow = self.flows.load().get(model).cloned()?;
        let retry = lock(&flow.state).queue.retry_after();
        Some(retry)
    }
}

/// What an arrival came to.
// A dispatch carries its booking inline: boxing it would allocate on
// every request's path.
#[allow(clippy::large_enum_variant)]
enum Arrival {
    Ready(Result<Dispatch, FlowRejection>),
    Waiting(Waiting),
}

impl Arrival {
    /// The future form.
    fn into_future(self) -> Dispatching {
        let step = match self {
            Arrival::Ready(outcome) => Step::Ready(outcome),
            Arrival::Waiting(w) => Step::Waiting(w),
        };
        Dispatching { step }
    }

    /// The callback form: `callback` (left when the outcome was decided at
    /// once) is called here with it.
    fn into_handle(self, callback: Option<DispatchCallback>) -> DispatchHandle {
        match self {
            Arrival::Ready(outcome) => {
                if let Some(callback) = callback {
                    trampoline::call(move || callback(outcome));
                }
                DispatchHandle { waiting: None }
            }
            Arrival::Waiting(w) => DispatchHandle { waiting: Some(w) },
        }
    }
}

/// The requests an arrival shed, without allocating.
struct Shed {
    tickets: [u32; MAX_SHED],
    len: usize,
}

impl Default for Shed {
    fn default() -> Self {
        Self {
            tickets: [0; MAX_SHED],
            len: 0,
        }
    }
}

impl Shed {
    fn push(&mut self, t: u32) {
        self.tickets[self.len] = t;
        self.len += 1;
    }

    fn as_slice(&self) -> &[u32] {
        &self.tickets[..self.len]
    }
}

/// A flow-control setting that was refused; nothing changed.
#[derive(Debug, Clone, PartialEq)]
pub enum FlowError {
    /// The model is unknown.
    Model(ThresholdError),
    /// The queue's settings are out of range.
    Config(FlowConfigError),
}

impl std::fmt::Display for FlowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Model(e) => e.fmt(f),
            Self::Config(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for FlowError {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::{LoadReport, Maintenance, ManualClock, MonitorConfig, ThresholdUpdate, WorkerSpec};

    fn used(n: u64) -> LoadReport {
        LoadReport {
            kv_used_blocks: Some(n),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_report_that_leaves_the_worker_free_kicks_the_queue() {
        let config = MonitorConfig {
            maintenance: Maintenance::Manual,
            ..MonitorConfig::default()
        };
        let m = Monitor::with_config(config, ManualClock::new()).unwrap();
        let spec = WorkerSpec {
            kv_total_blocks: Some(100),
            ..Default::default()
        };
        m.add_worker("m", 1, spec).unwrap();
        let decode = ThresholdUpdate {
            active_decode_blocks_threshold: Some(0.5),
            ..Default::default()
        };
        m.set_thresholds("m", &decode).unwrap();
        let flow = FlowControlConfig {
            queue: FlowConfig::new(8),
            policy: Policy::RoundRobin,
        };
        m.set_flow_control("m", Some(&flow)).unwrap();
        m.report(1, 0, &used(90)).unwrap();
        let request = DispatchRequest::new(FlowRequest::new("t"));
        let waiting = m.dispatch("m", &request);
        let queue = m.flows.load()["m"].clone();
        queue.take_kick();
        for busier in [95, 80, 60] {
            m.report(1, 0, &used(busier)).unwrap();
            assert!(
                !queue.take_kick(),
                "a report leaving it busy ({busier}) kicked"
            );
        }
        m.report(1, 0, &used(10)).unwrap();
        assert!(queue.take_kick(), "the report that freed it kicked");
        drop(waiting);
    }
}
