//! The reference gate: a `VecDeque` and counters, no atomics, no
//! cleverness. [`crate::gate_pair::GatePair`] drives it beside the real gate
//! for the differential drivers (`core/tests/gate_model.rs`, the `gate_ops`
//! fuzz target), which compare the two after every operation.
//!
//! Times are nanoseconds of the manual clock; waiters are numbered by the
//! driver. With a wait limit `W`, every admission also takes a wait slot,
//! which a permit's first response (or its release) gives back.

use std::collections::{HashMap, VecDeque};

use loadgate::{AdmitError, GateStats, TryAdmitError};

/// How a request waits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// `admit_owned`, polled.
    Future,
    /// `admit_with_callback`.
    Callback,
}

/// Where a waiter stands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WState {
    /// In the queue.
    Queued,
    /// Granted a slot, not yet polled.
    Granted,
    /// Refused, not yet polled.
    Rejected(AdmitError),
    /// A callback that has been called.
    Fired,
}

/// What an operation returned, in a form both gates can produce.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    /// Nothing to compare.
    Unit,
    /// Admitted at once.
    Admitted,
    /// Queued.
    Pending,
    /// Refused at once.
    Rejected(AdmitError),
    /// `try_admit`'s answer.
    Try(Result<(), TryAdmitError>),
    /// Whether a cancel withdrew a queued request.
    Cancelled(bool),
    /// Waiters an `expire` timed out.
    Expired(usize),
    /// The future waiters a poll found resolved, in pending order.
    Polled(Vec<(usize, Result<(), AdmitError>)>),
}

/// The reference gate.
#[derive(Debug)]
pub struct Reference {
    /// Slots.
    pub limit: u32,
    /// Queue places.
    pub queue_limit: u32,
    /// Wait slots `W`, if limited.
    pub wait_limit: Option<u32>,
    /// Wait slots taken: admitted requests without a first response.
    pub waiting: u32,
    /// Permits the driver holds that still hold a wait slot.
    pub held_waiting: usize,
    /// Queue timeout in nanoseconds.
    pub timeout: Option<u64>,
    /// Adaptive LIFO configured.
    pub lifo: bool,
    /// The next grant goes to the newest waiter (after an expiry).
    pub lifo_next: bool,
    /// Closed.
    pub closed: bool,
    /// Slots taken.
    pub running: u32,
    /// Permits the driver holds (including callbacks').
    pub held: usize,
    /// Queued waiters and their enqueue times.
    pub queue: VecDeque<(usize, u64)>,
    /// Every waiter that queued and has not been polled or cancelled.
    pub waiters: HashMap<usize, (Kind, WState)>,
    /// Callbacks fired, in order, with their outcomes.
    pub fired: Vec<(usize, Result<(), AdmitError>)>,
    /// Waiters the driver still holds (futures and tickets), in admission
    /// order.
    pub pending: Vec<usize>,
    /// Counters (running, queued, limit and closed are filled in by
    /// [`Reference::stats`]).
    pub stats: GateStats,
}

impl Reference {
    /// A gate of `limit` slots and `queue_limit` queue places.
    pub fn new(limit: u32, queue_limit: u32, timeout: Option<u64>, lifo: bool) -> Self {
        Self::with_wait_limit(limit, queue_limit, None, timeout, lifo)
    }

    /// A gate of `limit` slots, `queue_limit` queue places and `wait_limit`
    /// wait slots.
    pub fn with_wait_limit(
        limit: u32,
        queue_limit: u32,
        wait_limit: Option<u32>,
        timeout: Option<u64>,
        lifo: bool,
    ) -> Self {
        Self {
            limit,
            queue_limit,
            wait_limit,
            waiting: 0,
            held_waiting: 0,
            timeout,
            lifo,
            lifo_next: false,
            closed: false,
            running: 0,
            held: 0,
            queue: VecDeque::new(),
            waiters: HashMap::new(),
            fired: Vec::new(),
            pending: Vec::new(),
            stats: GateStats {
                limit,
                queue_limit,
                wait_limit,
                ..GateStats::default()
            },
        }
    }

    /// What `AdmissionGate::stats` must say.
    pub fn stats(&self) -> GateStats {
        GateStats {
            running: self.running,
            queued: self.queue.len() as u32,
            waiting: self.waiting,
            limit: self.limit,
            closed: self.closed,
            ..self.stats
        }
    }

    /// Whether a wait slot is free (always without a wait limit).
    pub fn wait_free(&self) -> bool {
        self.wait_limit.is_none_or(|w| self.waiting < w)
    }

    /// A new admission takes a wait slot (with a wait limit); the driver's
    /// new permit holds it.
    fn take_wait(&mut self) {
        if self.wait_limit.is_some() {
            self.waiting += 1;
        }
    }

    /// The driver takes a permit.
    fn hold(&mut self) {
        self.held += 1;
        if self.wait_limit.is_some() {
            self.held_waiting += 1;
        }
    }

    /// When the oldest waiter times out.
    pub fn next_deadline(&self) -> Option<u64> {
        let t = self.timeout?;
        self.queue.front().map(|&(_, at)| at + t)
    }

    /// Tells a resolved waiter: a callback fires now (and holds its permit).
    pub fn resolve(&mut self, id: usize, outcome: Result<(), AdmitError>) {
        let entry = self.waiters.get_mut(&id).unwrap();
        match entry.0 {
            Kind::Future => {
                entry.1 = match outcome {
                    Ok(()) => WState::Granted,
                    Err(e) => WState::Rejected(e),
                }
            }
            Kind::Callback => {
                entry.1 = WState::Fired;
                self.fired.push((id, outcome));
                if outcome.is_ok() {
                    self.hold();
                }
            }
        }
    }

    /// Times out every waiter whose deadline has come.
    pub fn expire_due(&mut self, now: u64) -> usize {
        let Some(t) = self.timeout else { return 0 };
        if self.closed {
            return 0;
        }
        let mut n = 0;
        while let Some(&(id, at)) = self.queue.front() {
            if at + t > now {
                break;
            }
            self.queue.pop_front();
            self.stats.expired += 1;
            self.resolve(id, Err(AdmitError::QueueTimeout));
            n += 1;
        }
        if n > 0 && self.lifo {
            self.lifo_next = true;
        }
        n
    }

    /// Hands a slot to the next waiter (the newest after an expiry under
    /// adaptive LIFO, else the oldest).
    pub fn grant_one(&mut self) {
        let (id, _) = if self.lifo_next {
            self.lifo_next = false;
            self.queue.pop_back().unwrap()
        } else {
            self.queue.pop_front().unwrap()
        };
        self.stats.admitted_queued += 1;
        self.take_wait();
        self.resolve(id, Ok(()));
    }

    /// An admission; a queued waiter joins [`Reference::pending`].
    pub fn admit(&mut self, id: usize, kind: Kind, now: u64) -> Out {
        self.stats.received += 1;
        let out = self.admit_inner(id, kind, now);
        if out == Out::Pending {
            self.pending.push(id);
        }
        if kind == Kind::Callback {
            match out {
                Out::Admitted => {
                    self.fired.push((id, Ok(())));
                    self.hold();
                }
                Out::Rejected(e) => self.fired.push((id, Err(e))),
                _ => {}
            }
        } else if out == Out::Admitted {
            self.hold();
        }
        out
    }

    fn admit_inner(&mut self, id: usize, kind: Kind, now: u64) -> Out {
        if self.closed {
            self.stats.rejected_closed += 1;
            return Out::Rejected(AdmitError::Closed);
        }
        if self.queue.is_empty() && self.running < self.limit && self.wait_free() {
            self.running += 1;
            self.take_wait();
            self.stats.admitted_direct += 1;
            return Out::Admitted;
        }
        if self.queue.len() as u32 >= self.queue_limit {
            self.expire_due(now);
            if self.queue.len() as u32 >= self.queue_limit {
                self.stats.rejected_at_capacity += 1;
                return Out::Rejected(AdmitError::AtCapacity);
            }
        }
        self.queue.push_back((id, now));
        self.waiters.insert(id, (kind, WState::Queued));
        Out::Pending
    }

    /// `try_admit`.
    pub fn try_admit(&mut self) -> Out {
        if self.closed {
            return Out::Try(Err(TryAdmitError::Closed));
        }
        if self.queue.is_empty() && self.running < self.limit && self.wait_free() {
            self.running += 1;
            self.take_wait();
            self.hold();
            self.stats.admitted_direct += 1;
            self.stats.received += 1;
            return Out::Try(Ok(()));
        }
        Out::Try(Err(TryAdmitError::WouldWait))
    }

    /// A slot comes back (permit dropped, or a granted waiter cancelled),
    /// with its wait slot if `wait`. The oldest waiter gets it if it can
    /// have a wait slot too.
    pub fn release_slot(&mut self, now: u64, wait: bool) {
        if wait {
            self.waiting -= 1;
        }
        if !self.queue.is_empty() && !self.closed && self.running <= self.limit && self.wait_free()
        {
            self.expire_due(now);
            if !self.queue.is_empty() {
                self.grant_one();
                return;
            }
        }
        self.running -= 1;
    }

    /// The driver drops a permit, which still holds a wait slot if
    /// `waiting`.
    pub fn release(&mut self, now: u64, waiting: bool) {
        self.held -= 1;
        if waiting {
            self.held_waiting -= 1;
        }
        self.release_slot(now, waiting);
    }

    /// The first response of a permit the driver holds that still holds a
    /// wait slot: the wait slot goes to the oldest waiter if a request slot
    /// is free too.
    pub fn first_response(&mut self, now: u64) {
        self.held_waiting -= 1;
        self.waiting -= 1;
        if !self.queue.is_empty() && !self.closed && self.running < self.limit {
            self.expire_due(now);
            if !self.queue.is_empty() {
                self.grant_one();
                self.running += 1;
            }
        }
    }

    /// The driver cancels the `i`th pending waiter (drops its future,
    /// cancels its ticket): its id and the outcome.
    pub fn cancel_at(&mut self, i: usize, now: u64) -> (usize, Out) {
        let id = self.pending.remove(i);
        (id, self.cancel(id, now))
    }

    /// Cancels a waiter.
    pub fn cancel(&mut self, id: usize, now: u64) -> Out {
        let (kind, state) = self.waiters.remove(&id).unwrap();
        match state {
            WState::Queued => {
                self.queue.retain(|&(q, _)| q != id);
                self.stats.cancelled += 1;
                Out::Cancelled(true)
            }
            WState::Granted => {
                assert_eq!(kind, Kind::Future);
                self.release_slot(now, self.wait_limit.is_some());
                Out::Cancelled(false)
            }
            WState::Rejected(_) | WState::Fired => Out::Cancelled(false),
        }
    }

    /// Polls a future waiter: its outcome if resolved.
    pub fn poll(&mut self, id: usize) -> Option<Result<(), AdmitError>> {
        let state = self.waiters[&id].1;
        let out = match state {
            WState::Queued => return None,
            WState::Granted => {
                self.hold();
                Ok(())
            }
            WState::Rejected(e) => Err(e),
            WState::Fired => unreachable!(),
        };
        self.waiters.remove(&id);
        Some(out)
    }

    /// Polls every pending waiter: futures that resolved leave the pending
    /// list with their outcome, callbacks that fired leave it silently.
    pub fn poll_all(&mut self) -> Out {
        let mut polled = Vec::new();
        let mut keep = Vec::new();
        for id in std::mem::take(&mut self.pending) {
            match self.waiters[&id] {
                (Kind::Future, _) => match self.poll(id) {
                    Some(r) => polled.push((id, r)),
                    None => keep.push(id),
                },
                (Kind::Callback, WState::Queued) => keep.push(id),
                (Kind::Callback, _) => {
                    self.waiters.remove(&id);
                }
            }
        }
        self.pending = keep;
        Out::Polled(polled)
    }

    /// `set_limit` (a valid one).
    pub fn set_limit(&mut self, n: u32, now: u64) {
        if !self.closed && !self.queue.is_empty() && self.running < n {
            self.expire_due(now);
            let free_waits = self.wait_limit.map_or(u32::MAX, |w| w - self.waiting);
            let want = (self.queue.len() as u32)
                .min(n - self.running)
                .min(free_waits);
            for _ in 0..want {
                self.grant_one();
                self.running += 1;
            }
        }
        self.limit = n;
    }

    /// `close`: every waiter is refused.
    pub fn close(&mut self) {
        self.closed = true;
        while let Some((id, _)) = self.queue.pop_front() {
            self.stats.rejected_closed += 1;
            self.resolve(id, Err(AdmitError::Closed));
        }
    }
}
