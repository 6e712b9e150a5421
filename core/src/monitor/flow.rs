//! Dispatch through a model's frontend queue: the monitor's side of flow
//! control (the queue itself is `crate::flow`).
//!
//! # Protocol
//!
//! A model with flow control holds a [`FlowControl`]: its queue and the
//! tickets of the requests that wait (or were resolved and not collected
//! yet), under one mutex, beside the waker of one waiting request's future,
//! the *dispatcher*.
//!
//! * [`Monitor::dispatch`] takes the lock and expires due requests. If
//!   nothing waits, it picks a free worker and books it at once; if none is
//!   free it queues the request (or refuses it), then runs the *dispatch
//!   loop*: while a request waits and a worker is free, the next request in
//!   the queue's order is booked on it and its ticket resolved.
//! * Capacity appears through the monitor's own calls: a report, a
//!   booking's release, a worker joining, new thresholds, a sweep ending a
//!   lease. Each ends with a *kick*: if requests wait, it takes the
//!   dispatcher's waker and wakes it, whose poll runs the loop, or, with no
//!   waker there, sets `kicked`. Both sit under a small mutex of their own,
//!   never held with the queue's, so a kick may come from any call, even
//!   one the loop makes.
//! * A waiting future's poll clears `kicked`, runs the loop, and collects
//!   its own outcome, or registers as the dispatcher and sleeps, unless a
//!   kick came meanwhile (`kicked`, seen under the same mutex): then it
//!   runs the loop again. A kick either finds the waker or is seen there,
//!   and the loop after it follows the kicker's change (the mutex orders
//!   them).
//! * A kick that reads no waiting request while a request is being queued:
//!   the kicker publishes its change, then (a `SeqCst` fence) reads the
//!   count; the arrival stores the count, then (a `SeqCst` fence) picks.
//!   One of the two sees the other. A model without flow control skips
//!   the fence on a plain load of its `flow_on` flag; a kick that reads the
//!   flag a moment before it is first set is not paired, and the request
//!   queued then is dispatched by the next kick, or by the host's
//!   [`Monitor::expire_flow`] timer, which runs the loop too. Turn flow
//!   control on before traffic to avoid the window.
//!
//! Wakers are woken after the lock is released (the host's waker may take
//! locks of its own, as Python's does), and a resolved request's booking is
//! dropped outside it too.
//!
//! Deadlines are checked whenever the loop runs; between kicks, the host
//! drives them: [`Monitor::expire_flow`] at [`Monitor::next_flow_deadline`],
//! as for the gate.

use std::sync::Arc;
use std::task::Waker;

use super::dispatch::{Dispatch, Dispatching, MonitorRef, Step};
use super::flow_stats::FlowStats;
use super::model::Model;
use super::{Booking, Monitor, Policy};
use crate::error::{ReportError, ThresholdError};
use crate::flow::{
    FlowConfig, FlowConfigError, FlowQueue, FlowRejection, FlowRequest, QueueKey, Reservation,
    MAX_SHED,
};
use crate::sync::{fence, lock, AtomicU32, Mutex, Ordering};

/// One request to dispatch.
#[derive(Debug, Clone, Copy)]
pub struct DispatchRequest<'a> {
    /// Its tenant, priority, tokens and deadline.
    pub flow: FlowRequest<'a>,
    /// KV blocks to book on the worker it is sent to (the worker rank's
    /// router-side `active_decode_blocks`; its prompt tokens are booked as
    /// prefill too, until [`Dispatch::prefill_done`]).
    pub blocks: u64,
    /// Whether it may wait when no worker is free; `false` refuses it at
    /// once with [`FlowRejection::AllWorkersBusy`].
    pub queue: bool,
}

/// How a model's requests are dispatched (`Monitor::set_flow_control`).
#[derive(Debug, Clone, PartialEq)]
pub struct FlowControlConfig {
    /// The queue.
    pub queue: FlowConfig,
    /// How a free worker is picked.
    pub policy: Policy,
}

/// Wakers to wake once the lock is released: at most this many per pass.
const WAKE_BATCH: usize = 16;
/// Workers tried for one request before it waits, when this frontend's
/// leased share has no room on the ones routing found free (`share.rs`).
const NO_SHARE_TRIES: u32 = 4;

/// A model's queue, its tickets and its dispatcher (module docs).
pub(crate) struct FlowControl {
    pub(super) state: Mutex<State>,
    policy: Policy,
    /// Requests that may wait while the model has no workers.
    scale_up_limit: u32,
    /// Requests waiting, for kicks, which take no lock.
    waiting: AtomicU32,
    /// The dispatcher's waker, and whether a kick found none (module docs).
    pub(super) dispatcher: Mutex<Dispatcher>,
}

pub(super) struct State {
    pub(super) queue: FlowQueue<u32>,
    pub(super) tickets: Vec<Ticket>,
    free: Vec<u32>,
    /// Requests refused at their deadline, in all.
    expired: u64,
    pub(super) stats: FlowStats,
}

/// One queued request's ticket: what to book, and its outcome once
/// resolved.
#[derive(Default)]
pub(super) struct Ticket {
    pub(super) gen: u32,
    pub(super) key: Option<QueueKey>,
    pub(super) waker: Option<Waker>,
    blocks: u64,
    prefill: u64,
    /// Its priority band and when it queued, for the statistics.
    band: usize,
    queued_at: u64,
    pub(super) outcome: Option<Result<Granted, FlowRejection>>,
}

/// The dispatcher's waker, and whether a kick came while there was none.
#[derive(Default)]
pub(super) struct Dispatcher {
    pub(super) waker: Option<Waker>,
    pub(super) kicked: bool,
}

/// A dispatch made for a queued request, not collected yet.
pub(super) struct Granted {
    pub(super) worker_id: u64,
    pub(super) booking: Booking,
    pub(super) reservation: Reservation,
}

/// Wakers to wake once the lock is released: a pass of the loop stops at
/// [`WAKE_BATCH`], and an arrival may shed up to `MAX_SHED` more.
pub(super) struct After {
    wake: [Option<Waker>; WAKE_BATCH + MAX_SHED],
    woken: usize,
}

impl Default for After {
    fn default() -> Self {
        Self {
            wake: std::array::from_fn(|_| None),
            woken: 0,
        }
    }
}

impl After {
    fn wake(&mut self, waker: Option<Waker>) {
        if let Some(w) = waker {
            self.wake[self.woken] = Some(w);
            self.woken += 1;
        }
    }

    fn full(&self) -> bool {
        self.woken >= WAKE_BATCH
    }

    pub(super) fn run(self) {
        self.wake.into_iter().flatten().for_each(Waker::wake);
    }
}

impl std::fmt::Debug for FlowControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowControl")
            .field("policy", &self.policy)
            .field("waiting", &self.waiting)
            .finish_non_exhaustive()
    }
}

impl FlowControl {
    fn new(config: &FlowControlConfig) -> Result<Self, FlowConfigError> {
        Ok(Self {
            state: Mutex::new(State {
                queue: FlowQueue::new(&config.queue)?,
                tickets: Vec::new(),
                free: Vec::new(),
                expired: 0,
                stats: FlowStats::default(),
            }),
            policy: config.policy,
            scale_up_limit: config.queue.scale_up_limit,
            waiting: AtomicU32::new(0),
            dispatcher: Mutex::new(Dispatcher::default()),
        })
    }

    /// Capacity may have appeared (module docs): wake the dispatcher.
    pub(super) fn kick(&self) {
        // SeqCst: the kicker's side of the pairing in the module docs.
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) == 0 {
            return;
        }
        let waker = {
            let mut d = lock(&self.dispatcher);
            d.kicked = d.waker.is_none();
            d.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// A waiting future finished or left, and may have been the
    /// dispatcher: the next request's future is woken, to take the role.
    pub(super) fn hand_over(&self) {
        let waker = {
            let mut st = lock(&self.state);
            match st.queue.peek() {
                Some(&t) => st.tickets[t as usize].waker.take(),
                None => None,
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Resolves ticket `t` with `outcome` at clock time `now`.
    fn resolve(
        st: &mut State,
        t: u32,
        outcome: Result<Granted, FlowRejection>,
        now: u64,
        after: &mut After,
    ) {
        let ticket = &mut st.tickets[t as usize];
        match &outcome {
            Ok(_) => st
                .stats
                .sent_from_queue(now.saturating_sub(ticket.queued_at)),
            Err(why) => st.stats.refused(*why, ticket.band),
        }
        ticket.key = None;
        ticket.outcome = Some(outcome);
        after.wake(ticket.waker.take());
    }

    /// The dispatch loop (module docs), at clock time `now`: expires due
    /// requests, then dispatches while a request waits and a worker is
    /// free. Stops early when `after` is full; whether it did.
    pub(super) fn run(
        &self,
        monitor: &Monitor,
        model: &Model,
        st: &mut State,
        now: u64,
        after: &mut After,
    ) -> bool {
        while !after.full() {
            let Some(t) = st.queue.expire_one(now) else {
                break;
            };
            st.expired += 1;
            Self::resolve(st, t, Err(FlowRejection::QueueDeadline), now, after);
        }
        while !after.full() {
            let Some(&t) = st.queue.peek() else { break };
            // Relaxed: as `Model::routable`.
            if model.workers.load(Ordering::Relaxed) == 0 {
                if self.scale_up_limit > 0 {
                    // Waiting for a worker to join, whose kick runs this.
                    break;
                }
                st.queue.cancel(
                    st.tickets[t as usize]
                        .key
                        .expect("a queued ticket has its key"),
                );
                Self::resolve(st, t, Err(FlowRejection::NoWorkers), now, after);
                continue;
            }
            let ticket = &st.tickets[t as usize];
            let Some((worker_id, booking)) =
                monitor.pick_and_book(model, self.policy, ticket.blocks, ticket.prefill)
            else {
                // Nothing free (or no room in this frontend's leased
                // share): wait for a kick.
                break;
            };
            let (payload, reservation) = st.queue.pop(now).expect("the peeked request");
            debug_assert_eq!(payload, t);
            let granted = Granted {
                worker_id,
                booking,
                reservation,
            };
            Self::resolve(st, t, Ok(granted), now, after);
        }
        self.publish_waiting(model, st);
        after.full()
    }

    pub(super) fn publish_waiting(&self, model: &Model, st: &State) {
        let n = st.queue.len();
        // SeqCst: the arrival's side of the pairing in the module docs.
        self.waiting.store(n, Ordering::SeqCst);
        model.flow_waiting.store(n, Ordering::SeqCst);
    }

    /// A ticket for a request about to queue.
    fn ticket(st: &mut State, request: &DispatchRequest<'_>, now: u64) -> (u32, u32) {
        let t = st.free.pop().unwrap_or_else(|| {
            st.tickets.push(Ticket::default());
            (st.tickets.len() - 1) as u32
        });
        let ticket = &mut st.tickets[t as usize];
        ticket.blocks = request.blocks;
        ticket.prefill = request.flow.prompt_tokens;
        ticket.band = usize::from(request.flow.priority);
        ticket.queued_at = now;
        (t, ticket.gen)
    }

    pub(super) fn free_ticket(st: &mut State, t: u32) {
        let ticket = &mut st.tickets[t as usize];
        ticket.gen = ticket.gen.wrapping_add(1);
        ticket.key = None;
        ticket.waker = None;
        ticket.outcome = None;
        st.free.push(t);
    }
}

impl Monitor {
    /// Turns flow control on for `model` with `config`, or off with `None`
    /// (requests waiting then are refused with
    /// [`FlowRejection::QueueFull`]). A new config starts a new queue: the
    /// requests waiting in the old one are refused the same way.
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
            .map(FlowControl::new)
            .transpose()
            .map_err(FlowError::Config)?
            .map(Arc::new);
        // Relaxed: a setting (module docs, "Protocol").
        m.flow_on.store(new.is_some(), Ordering::Relaxed);
        let old = m.flow.swap(new);
        if let Some(old) = old {
            let mut after = After::default();
            let mut st = lock(&old.state);
            let mut refused = Vec::new();
            st.queue.expire(u64::MAX, |t| refused.push(t));
            for t in refused {
                FlowControl::resolve(&mut st, t, Err(FlowRejection::QueueFull), 0, &mut after);
                if after.full() {
                    drop(st);
                    std::mem::take(&mut after).run();
                    st = lock(&old.state);
                }
            }
            old.waiting.store(0, Ordering::SeqCst);
            drop(st);
            after.run();
        }
        m.flow_waiting.store(0, Ordering::SeqCst);
        Ok(())
    }

    /// Sends a request of `model` to a free worker, or waits in the model's
    /// queue for one (when the model has flow control and the request may
    /// wait). Without flow control, a request that finds no free worker is
    /// refused at once with [`FlowRejection::AllWorkersBusy`].
    pub fn dispatch(&self, model: &str, request: &DispatchRequest<'_>) -> Dispatching<'_> {
        Dispatching {
            monitor: MonitorRef::Borrowed(self),
            step: self.dispatch_step(model, request),
        }
    }

    /// [`dispatch`](Self::dispatch) on a shared monitor: a future that
    /// keeps the monitor alive instead of borrowing it (for bindings).
    pub fn dispatch_shared(
        self: &Arc<Self>,
        model: &str,
        request: &DispatchRequest<'_>,
    ) -> Dispatching<'static> {
        Dispatching {
            monitor: MonitorRef::Shared(Arc::clone(self)),
            step: self.dispatch_step(model, request),
        }
    }

    fn dispatch_step(&self, model: &str, request: &DispatchRequest<'_>) -> Step {
        let reg = self.registry.load();
        let Some(m) = reg.models.get(model) else {
            return Step::Ready(Err(FlowRejection::NoWorkers));
        };
        let Some(flow) = m.flow.load_full() else {
            return Step::Ready(self.send_now(m, Policy::RoundRobin, request, None));
        };
        let mut after = After::default();
        let mut st = lock(&flow.state);
        let now = self.clock.now_nanos();
        flow.run(self, m, &mut st, now, &mut after);
        let band = usize::from(request.flow.priority);
        if st.queue.is_empty() {
            let direct = self.send_now(m, flow.policy, request, Some((&flow, &mut st, now)));
            match direct {
                Err(FlowRejection::AllWorkersBusy | FlowRejection::NoWorkers) if request.queue => {}
                outcome => {
                    match &outcome {
                        Ok(_) => st.stats.sent_at_once(),
                        Err(why) => st.stats.refused(*why, band),
                    }
                    drop(st);
                    after.run();
                    return Step::Ready(outcome);
                }
            }
        }
        // Relaxed: as `Model::routable`. With no workers, only
        // `scale_up_limit` requests wait for one to join.
        let no_workers = m.workers.load(Ordering::Relaxed) == 0;
        let refused = if no_workers && (!request.queue || st.queue.len() >= flow.scale_up_limit) {
            Some(FlowRejection::NoWorkers)
        } else if !request.queue {
            Some(FlowRejection::AllWorkersBusy)
        } else {
            None
        };
        if let Some(why) = refused {
            st.stats.refused(why, band);
            drop(st);
            after.run();
            return Step::Ready(Err(why));
        }
        let (t, gen) = FlowControl::ticket(&mut st, request, now);
        let mut shed = [0u32; MAX_SHED];
        let mut n = 0;
        let pushed = st.queue.push(&request.flow, t, now, |v| {
            shed[n] = v;
            n += 1;
        });
        for &v in &shed[..n] {
            FlowControl::resolve(&mut st, v, Err(FlowRejection::QueueFull), now, &mut after);
        }
        let step = match pushed {
            Ok(key) => {
                st.tickets[t as usize].key = Some(key);
                flow.publish_waiting(m, &st);
                // SeqCst fence: the arrival's side (module docs); then the
                // loop picks.
                fence(Ordering::SeqCst);
                flow.run(self, m, &mut st, now, &mut after);
                Step::Waiting {
                    model: Arc::clone(m),
                    flow: Arc::clone(&flow),
                    ticket: t,
                    gen,
                }
            }
            Err((reason, _)) => {
                FlowControl::free_ticket(&mut st, t);
                st.stats.refused(reason, band);
                Step::Ready(Err(reason))
            }
        };
        drop(st);
        after.run();
        step
    }

    /// Picks a free worker of `m` for `request` and books it; with flow
    /// control, charges its tenant.
    fn send_now(
        &self,
        m: &Model,
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
        let (worker_id, booking) = self
            .pick_and_book(m, policy, request.blocks, request.flow.prompt_tokens)
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
            booking: Some(booking),
            settle,
        })
    }

    /// Picks a free worker of `m` by `policy` and books `blocks` and
    /// `prefill` tokens on its least loaded rank: the worker and its
    /// booking, or `None` when no worker is free. A worker removed since
    /// the pick is picked again; one where this frontend's leased share has
    /// no room for the request (`share.rs`) is passed over, and after a few
    /// such the request is left to wait (a release or a larger share kicks
    /// the queue).
    fn pick_and_book(
        &self,
        m: &Model,
        policy: Policy,
        blocks: u64,
        prefill: u64,
    ) -> Option<(u64, Booking)> {
        let mut no_share = 0;
        loop {
            let slot = m.pick(policy, &self.clock)?;
            // Relaxed: as in `Model::select`.
            let worker_id = m.ids[slot].load(Ordering::Relaxed);
            match self.book_least_loaded(worker_id, blocks, prefill) {
                Ok(booking) => return Some((worker_id, booking)),
                Err(ReportError::NoShare { .. }) if no_share < NO_SHARE_TRIES => no_share += 1,
                Err(ReportError::NoShare { .. }) => return None,
                Err(_) => {}
            }
        }
    }

    /// Books `blocks` and `prefill` tokens on the least loaded rank of
    /// `worker_id`.
    fn book_least_loaded(
        &self,
        worker_id: u64,
        blocks: u64,
        prefill: u64,
    ) -> Result<Booking, ReportError> {
        let reg = self.registry.load();
        let worker = reg
            .workers
            .get(&worker_id)
            .ok_or(ReportError::UnknownWorker(worker_id))?;
        let rank = (0..worker.ranks.len())
            .min_by_key(|&i| worker.ranks[i].load().active_decode_blocks)
            .unwrap_or(0);
        Booking::new(worker.clone(), rank, super::Owner::Own, blocks, prefill)
    }

    /// Refuses every queued request whose deadline has passed, in every
    /// model; how many.
    pub fn expire_flow(&self) -> usize {
        let now = self.clock.now_nanos();
        let reg = self.registry.load();
        let mut n = 0;
        for m in reg.models.values() {
            let Some(flow) = m.flow.load_full() else {
                continue;
            };
            let mut after = After::default();
            let mut st = lock(&flow.state);
            let before = st.expired;
            while flow.run(self, m, &mut st, now, &mut after) {
                drop(st);
                std::mem::take(&mut after).run();
                st = lock(&flow.state);
            }
            n += (st.expired - before) as usize;
            drop(st);
            after.run();
        }
        n
    }

    /// How long a client refused by `model`'s queue should wait before
    /// trying again (`FlowQueue::retry_after`); `None` without flow
    /// control.
    pub fn flow_retry_after(&self, model: &str) -> Option<std::time::Duration> {
        let flow = self.registry.load().models.get(model)?.flow.load_full()?;
        let retry = lock(&flow.state).queue.retry_after();
        Some(retry)
    }

    /// The earliest deadline of a queued request, in any model (clock
    /// nanoseconds): when a host timer should call
    /// [`expire_flow`](Self::expire_flow).
    pub fn next_flow_deadline(&self) -> Option<u64> {
        let reg = self.registry.load();
        reg.models
            .values()
            .filter_map(|m| m.flow.load_full())
            .filter_map(|f| lock(&f.state).queue.next_deadline())
            .min()
    }
}

impl Monitor {
    /// How long from now until [`next_flow_deadline`](Self::next_flow_deadline),
    /// by the monitor's clock (zero if it has passed): what a host timer
    /// should sleep before calling [`expire_flow`](Self::expire_flow).
    pub fn time_to_next_flow_deadline(&self) -> Option<std::time::Duration> {
        let at = self.next_flow_deadline()?;
        let now = self.clock.now_nanos();
        Some(std::time::Duration::from_nanos(at.saturating_sub(now)))
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
