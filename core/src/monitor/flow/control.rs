//! A model's dispatcher: its queue, the tickets of the requests that wait,
//! and the dispatch loop that sends them to free workers (the protocol is
//! in `flow/mod.rs`).
//!
//! This layer knows nothing of the monitor: it holds its model (whose
//! atomics the kicks read), and the loop is handed a function that picks a
//! free worker and books it.

use std::sync::Arc;
use std::task::Waker;

use super::metrics::{FlowStats, Snapshot, TOP_TENANTS};
use crate::clock::SharedClock;
use crate::error::Reason;
use crate::flow::{FlowConfig, FlowConfigError, FlowQueue, FlowRejection, Reservation, MAX_SHED};
use crate::monitor::booking::Booking;
use crate::monitor::config::{Policy, DEFAULT_ENDPOINT};
use crate::monitor::model::Model;
use crate::sync::{Mutex, Ordering};

/// Notifications gathered under the lock and delivered after it: at most
/// this many per pass of the loop.
const BATCH: usize = 16;

/// A request's callback (the callback form): called once, off the lock,
/// with its outcome and its model's dispatcher.
pub(crate) type Callback =
    Box<dyn FnOnce(Result<Granted, FlowRejection>, &Arc<FlowControl>) + Send + 'static>;

/// A model's queue and its tickets (module docs).
pub(crate) struct FlowControl {
    pub(super) state: Mutex<State>,
    /// Its model: the worker count, the pick, and the atomics a kick reads
    /// (`Model::kick_flow`).
    pub(super) model: Arc<Model>,
    pub(super) policy: Policy,
    /// Requests that may wait while the model has no workers.
    pub(super) scale_up_limit: u32,
    /// Made from the monitor's defaults when its model was created (such a
    /// model may be evicted while nothing waits).
    pub(crate) from_defaults: bool,
}

pub(crate) struct State {
    pub(super) queue: FlowQueue<u32>,
    pub(super) tickets: Vec<Ticket>,
    free: Vec<u32>,
    /// Notifications owed by a call that is not the maintenance's (a
    /// request shed by an arrival): delivered by the next loop.
    owed: Vec<Note>,
    /// Turned off or replaced: an arrival that found this queue a moment
    /// before is refused as the waiting requests were.
    pub(super) closed: bool,
    /// Requests refused at their deadline, in all.
    pub(super) expired: u64,
    pub(super) stats: FlowStats,
}

/// Who hears of a queued request's outcome.
#[derive(Default)]
pub(super) enum Notify {
    /// Nobody yet (a future not polled since it queued).
    #[default]
    Nobody,
    /// A future's waker: the outcome waits in the ticket for its poll.
    Waker(Waker),
    /// A callback, called with the outcome; the ticket is freed at once.
    Callback(Callback),
}

/// One queued request's ticket: what to book, and its outcome once
/// resolved.
#[derive(Default)]
pub(super) struct Ticket {
    pub(super) gen: u32,
    pub(super) key: Option<crate::flow::QueueKey>,
    pub(super) notify: Notify,
    blocks: u64,
    prefill: u64,
    /// Its priority band and when it queued, for the statistics.
    pub(super) band: usize,
    queued_at: u64,
    pub(super) outcome: Option<Result<Granted, FlowRejection>>,
}

/// A dispatch made for a queued request, not delivered yet.
pub(crate) struct Granted {
    pub(super) worker_id: u64,
    /// `None` for a worker that declared no ranks (nothing to book).
    pub(super) booking: Option<Booking>,
    pub(super) reservation: Reservation,
    /// What it booked, should it be sent again.
    pub(super) blocks: u64,
    pub(super) prefill: u64,
}

/// One notification to deliver off the lock.
// A dispatch carries its booking inline: boxing it would allocate on
// every request's path.
#[allow(clippy::large_enum_variant)]
pub(super) enum Note {
    Wake(Waker),
    Call(Callback, Result<Granted, FlowRejection>),
}

/// At most `N` notifications to deliver once the lock is released: a pass
/// of the loop stops at [`BATCH`]; an arrival's shedding holds up to
/// `MAX_SHED` (`FlowControl::shed`). Kept on the stack, so its size is
/// what the thread that gathers it must spare.
pub(super) struct After<const N: usize = BATCH> {
    notes: [Option<Note>; N],
    len: usize,
}

impl<const N: usize> Default for After<N> {
    fn default() -> Self {
        Self {
            notes: std::array::from_fn(|_| None),
            len: 0,
        }
    }
}

impl<const N: usize> After<N> {
    fn push(&mut self, note: Note) {
        self.notes[self.len] = Some(note);
        self.len += 1;
    }

    fn full(&self) -> bool {
        self.len >= N
    }

    /// Delivers the notifications, on this thread: wakers are woken, and
    /// callbacks called through the trampoline (never nested).
    pub(super) fn deliver(self, flow: &Arc<FlowControl>) {
        for note in self.notes.into_iter().flatten() {
            match note {
                Note::Wake(w) => w.wake(),
                Note::Call(callback, outcome) => {
                    let flow = Arc::clone(flow);
                    super::trampoline::call(move || callback(outcome, &flow));
                }
            }
        }
    }
}

impl std::fmt::Debug for FlowControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowControl")
            .field("model", &self.model.name)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl FlowControl {
    pub(crate) fn new(
        model: Arc<Model>,
        queue: &FlowConfig,
        policy: Policy,
    ) -> Result<Self, FlowConfigError> {
        Ok(Self {
            state: Mutex::new(State {
                queue: FlowQueue::new(queue)?,
                tickets: Vec::new(),
                free: Vec::new(),
                owed: Vec::new(),
                closed: false,
                expired: 0,
                stats: FlowStats::default(),
            }),
            model,
            policy,
            scale_up_limit: queue.scale_up_limit,
            from_defaults: false,
        })
    }

    /// Asks the maintenance to run this queue's loop.
    pub(super) fn wake_maintenance(&self) {
        self.model.wake_flow();
    }

    /// Takes the queue's kick: whether it was kicked since the last take.
    pub(super) fn take_kick(&self) -> bool {
        self.model.flow_kicked.swap(false, Ordering::AcqRel)
    }

    /// Resolves ticket `t` with `outcome` at clock time `now`: the outcome
    /// goes to its callback (freeing the ticket) or waits in it for its
    /// future, whose waker is woken.
    pub(super) fn resolve<const N: usize>(
        &self,
        st: &mut State,
        t: u32,
        outcome: Result<Granted, FlowRejection>,
        now: u64,
        after: &mut After<N>,
    ) {
        let (band, queued_at) = {
            let ticket = &st.tickets[t as usize];
            (ticket.band, ticket.queued_at)
        };
        match &outcome {
            Ok(_) => st.stats.sent_from_queue(now.saturating_sub(queued_at)),
            Err(why) => self.refused(st, *why, band),
        }
        let ticket = &mut st.tickets[t as usize];
        ticket.key = None;
        match std::mem::take(&mut ticket.notify) {
            Notify::Callback(callback) => {
                Self::free_ticket(st, t);
                after.push(Note::Call(callback, outcome));
            }
            Notify::Waker(waker) => {
                ticket.outcome = Some(outcome);
                after.push(Note::Wake(waker));
            }
            Notify::Nobody => ticket.outcome = Some(outcome),
        }
    }

    /// Counts a refusal of priority band `band`: in the queue's own
    /// families, and in the model's rejections, which `select` counts in
    /// (`frontend_failures_total`: a queue's refusals as the pool's
    /// exhaustion, as without a queue).
    pub(super) fn refused(&self, st: &mut State, why: FlowRejection, band: usize) {
        st.stats.refused(why, band);
        count_refusal(&self.model, why);
    }

    /// Refuses the requests an arrival shed (tickets `shed`) and hands
    /// their notifications to the maintenance, which delivers them: a
    /// caller's thread never runs another request's callback. Not inlined:
    /// its batch of notifications lives on the stack only while it runs.
    #[inline(never)]
    pub(super) fn shed(&self, st: &mut State, shed: &[u32], now: u64) {
        if shed.is_empty() {
            return;
        }
        let mut after = After::<MAX_SHED>::default();
        for &t in shed {
            self.resolve(st, t, Err(FlowRejection::QueueFull), now, &mut after);
        }
        st.owed.extend(after.notes.into_iter().flatten());
        self.wake_maintenance();
    }

    /// The dispatch loop, at clock time `now`: delivers what is owed,
    /// expires due requests, then, while a request waits and `book` finds
    /// a free worker for it, sends the next request in the queue's order.
    /// Stops early when `after` is full; whether it did (or owes more).
    pub(super) fn run(
        &self,
        st: &mut State,
        clock: &SharedClock,
        now: u64,
        book: &mut dyn FnMut(u64, u64) -> Option<(u64, Option<Booking>)>,
        after: &mut After,
    ) -> bool {
        while !after.full() {
            let Some(note) = st.owed.pop() else { break };
            after.push(note);
        }
        while !after.full() {
            let Some(t) = st.queue.expire_one(now) else {
                break;
            };
            st.expired += 1;
            self.resolve(st, t, Err(FlowRejection::QueueDeadline), now, after);
        }
        self.send_waiting(st, clock, now, book, after);
        after.full() || !st.owed.is_empty()
    }

    /// The loop's last part: while a request waits and `book` finds a free
    /// worker for it, sends the next request in the queue's order (refused
    /// with `NoWorkers` while the model has none, unless it may wait for
    /// scale-up). A request sent counts its wait to the `clock`'s time once
    /// booked: the room may have come after `now` was read.
    pub(super) fn send_waiting(
        &self,
        st: &mut State,
        clock: &SharedClock,
        now: u64,
        book: &mut dyn FnMut(u64, u64) -> Option<(u64, Option<Booking>)>,
        after: &mut After,
    ) {
        while !after.full() {
            let Some(&t) = st.queue.peek() else { break };
            // Relaxed: a hint; a worker joining kicks the queue.
            if self.model.workers.load(Ordering::Relaxed) == 0 {
                if self.scale_up_limit > 0 {
                    // Waiting for a worker to join, whose kick runs this.
                    break;
                }
                let key = st.tickets[t as usize]
                    .key
                    .expect("a queued ticket has its key");
                st.queue.cancel(key);
                self.resolve(st, t, Err(FlowRejection::NoWorkers), now, after);
                continue;
            }
            let (blocks, prefill) = (
                st.tickets[t as usize].blocks,
                st.tickets[t as usize].prefill,
            );
            let Some((worker_id, booking)) = book(blocks, prefill) else {
                // Nothing free (or no room in this frontend's leased
                // share): wait for a kick.
                break;
            };
            let sent_at = clock.now_nanos().max(now);
            let (payload, reservation) = st.queue.pop(sent_at).expect("the peeked request");
            debug_assert_eq!(payload, t);
            let granted = Granted {
                worker_id,
                booking,
                reservation,
                blocks,
                prefill,
            };
            self.resolve(st, t, Ok(granted), sent_at, after);
        }
        self.publish_waiting(st);
    }

    /// Publishes the number of requests waiting, for kicks.
    pub(super) fn publish_waiting(&self, st: &State) {
        // SeqCst: the arrival's side of the pairing (`flow/mod.rs`).
        self.model
            .flow_waiting
            .store(st.queue.len(), Ordering::SeqCst);
    }

    /// What the queue shows at scrape time (`metrics.rs`).
    pub(crate) fn snapshot(&self) -> Snapshot {
        let st = crate::sync::lock(&self.state);
        Snapshot {
            requests: st.queue.len(),
            tokens: st.queue.tokens(),
            stats: st.stats.clone(),
            top: st.queue.top_tenants(TOP_TENANTS),
        }
    }

    /// Requests and estimated tokens waiting.
    pub(crate) fn totals(&self) -> (u32, u128) {
        let st = crate::sync::lock(&self.state);
        (st.queue.len(), st.queue.tokens())
    }

    /// A ticket for a request about to queue: its index and generation.
    pub(super) fn ticket(
        st: &mut State,
        blocks: u64,
        prefill: u64,
        band: usize,
        now: u64,
    ) -> (u32, u32) {
        let t = st.free.pop().unwrap_or_else(|| {
            st.tickets.push(Ticket::default());
            (st.tickets.len() - 1) as u32
        });
        let ticket = &mut st.tickets[t as usize];
        ticket.blocks = blocks;
        ticket.prefill = prefill;
        ticket.band = band;
        ticket.queued_at = now;
        (t, ticket.gen)
    }

    pub(super) fn free_ticket(st: &mut State, t: u32) {
        let ticket = &mut st.tickets[t as usize];
        ticket.gen = ticket.gen.wrapping_add(1);
        ticket.key = None;
        ticket.notify = Notify::Nobody;
        ticket.outcome = None;
        st.free.push(t);
    }

    /// Refuses every request that waits with `why` (the queue was turned
    /// off or replaced), delivering the outcomes on this thread; later
    /// arrivals are refused too. The model's waiting count is the next
    /// queue's to publish.
    pub(crate) fn close(self: &Arc<Self>, why: FlowRejection) {
        let mut refused = Vec::new();
        let mut st = crate::sync::lock(&self.state);
        st.closed = true;
        st.queue.expire(u64::MAX, |t| refused.push(t));
        let owed = std::mem::take(&mut st.owed);
        let mut after: After = After::default();
        for t in refused {
            self.resolve(&mut st, t, Err(why), 0, &mut after);
            if after.full() {
                drop(st);
                std::mem::take(&mut after).deliver(self);
                st = crate::sync::lock(&self.state);
            }
        }
        drop(st);
        after.deliver(self);
        for note in owed {
            let mut one: After = After::default();
            one.push(note);
            one.deliver(self);
        }
    }
}

/// Counts a dispatch's refusal in `model`'s rejections, as `select` counts
/// its own, under the default endpoint; bad input and a caller's own
/// timeout are not refusals of the fleet.
pub(super) fn count_refusal(model: &Model, why: FlowRejection) {
    let reason = match why {
        FlowRejection::NoWorkers => Reason::NoWorkers,
        FlowRejection::AllWorkersBusy | FlowRejection::QueueFull | FlowRejection::QueueDeadline => {
            Reason::AllWorkersBusy
        }
        FlowRejection::InvalidTenant | FlowRejection::TimedOut => return,
    };
    model.count_rejection(reason, DEFAULT_ENDPOINT);
}
