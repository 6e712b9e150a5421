//! The reference gate: a `VecDeque` and counters, no atomics, no
//! cleverness. [`crate::gate_pair::GatePair`] drives it beside the real gate
//! for the differential drivers (`core/tests/gate_model.rs`, the `gate_ops`
//! fuzz target), which compare the two after every operation.
//!
//! Times are nanoseconds of the manual clock; waiters are numbered by the
//! driver. With a wait limit `W`, every admission also takes a wait slot,
//! which a permit's first response (or its release) gives back. Priority
//! classes are one `VecDeque` each; class `k` may take a slot while
//! `running + above[k] < limit`, `above[k]` being the largest reservation
//! of a more important class.

use std::collections::{HashMap, VecDeque};

use loadgate::{AdmitError, ClassStats, GateConfig, GateStats, TryAdmitError};

/// How a request waits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// `admit_owned`, polled.
    Future,
    /// `admit_with_callback`.
    Callback,
    /// `admit_pending`: resolved like a future until armed (then a
    /// callback), never polled.
    Pending,
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
    /// An arm's answer: armed (`None`), or the outcome of a request
    /// resolved before it.
    Armed(Option<Result<(), AdmitError>>),
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
    /// Each class's queue limit.
    pub class_queue: Vec<u32>,
    /// Each class's queue timeout in nanoseconds.
    pub timeout: Vec<Option<u64>>,
    /// Each class's largest reservation of a more important class.
    pub above: Vec<u32>,
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
    /// Each class's queued waiters and their enqueue times.
    pub queue: Vec<VecDeque<(usize, u64)>>,
    /// Each waiter's class.
    pub class_of: HashMap<usize, usize>,
    /// Every waiter that queued and has not been polled or cancelled.
    pub waiters: HashMap<usize, (Kind, WState)>,
    /// Callbacks fired, in order, with their outcomes.
    pub fired: Vec<(usize, Result<(), AdmitError>)>,
    /// Waiters the driver still holds (futures and tickets), in admission
    /// order.
    pub pending: Vec<usize>,
    /// Counters (running, queued, limit and closed are filled in by
    /// [`Reference::stats`]; the classes' counters are summed there).
    pub stats: GateStats,
}

/// Nanoseconds of a configured duration, as the gate counts them.
fn nanos(d: std::time::Duration) -> u64 {
    (d.as_nanos() as u64).max(1)
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
        let config = GateConfig::new(limit)
            .with_queue(queue_limit)
            .with_wait_limit(wait_limit)
            .with_queue_timeout(timeout.map(std::time::Duration::from_nanos))
            .with_adaptive_lifo(lifo);
        Self::from_config(&config)
    }

    /// The gate `config` describes (the clock and metrics prefix aside).
    pub fn from_config(config: &GateConfig) -> Self {
        let classes = if config.classes.is_empty() {
            config.clone().with_classes(1).classes
        } else {
            config.classes.clone()
        };
        let mut above = Vec::new();
        let mut most = 0;
        for c in &classes {
            above.push(most);
            most = most.max(c.reserved);
        }
        let mut stats = GateStats {
            limit: config.limit,
            queue_limit: config.queue,
            wait_limit: config.wait_limit,
            class_count: classes.len(),
            ..GateStats::default()
        };
        for (k, c) in classes.iter().enumerate() {
            stats.classes[k].queue_limit = c.queue;
        }
        Self {
            limit: config.limit,
            queue_limit: config.queue,
            wait_limit: config.wait_limit,
            waiting: 0,
            held_waiting: 0,
            class_queue: classes.iter().map(|c| c.queue).collect(),
            timeout: classes.iter().map(|c| c.queue_timeout.map(nanos)).collect(),
            above,
            lifo: config.adaptive_lifo,
            lifo_next: false,
            closed: false,
            running: 0,
            held: 0,
            queue: vec![VecDeque::new(); classes.len()],
            class_of: HashMap::new(),
            waiters: HashMap::new(),
            fired: Vec::new(),
            pending: Vec::new(),
            stats,
        }
    }

    /// The class a priority names (past the last class, the last).
    pub fn class(&self, priority: u8) -> usize {
        (priority as usize).min(self.queue.len() - 1)
    }

    /// Waiters queued, all classes.
    fn queued(&self) -> usize {
        self.queue.iter().map(VecDeque::len).sum()
    }

    /// Whether class `k` may take a slot while `running` are held.
    fn room(&self, k: usize, running: u32) -> bool {
        running + self.above[k] < self.limit
    }

    /// The most important class with a waiter.
    fn first_class(&self) -> Option<usize> {
        self.queue.iter().position(|q| !q.is_empty())
    }

    /// What `AdmissionGate::stats` must say.
    pub fn stats(&self) -> GateStats {
        let mut s = self.stats;
        for (k, q) in self.queue.iter().enumerate() {
            s.classes[k].queued = q.len() as u32;
        }
        let sum = |f: fn(&ClassStats) -> u64| s.classes.iter().map(f).sum::<u64>();
        GateStats {
            running: self.running,
            queued: self.queued() as u32,
            waiting: self.waiting,
            limit: self.limit,
            closed: self.closed,
            rejected_at_capacity: sum(|c| c.rejected_at_capacity),
            expired: sum(|c| c.expired),
            rejected_closed: sum(|c| c.rejected_closed),
            displaced: sum(|c| c.displaced),
            ..s
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

    /// When the first head waiter times out.
    pub fn next_deadline(&self) -> Option<u64> {
        (0..self.queue.len())
            .filter_map(|k| Some(self.queue[k].front()?.1 + self.timeout[k]?))
            .min()
    }

    /// Tells a resolved waiter: a callback fires now (and holds its permit).
    pub fn resolve(&mut self, id: usize, outcome: Result<(), AdmitError>) {
        self.class_of.remove(&id);
        let entry = self.waiters.get_mut(&id).unwrap();
        match entry.0 {
            Kind::Future | Kind::Pending => {
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

    /// Times out every waiter whose deadline has come, class by class.
    pub fn expire_due(&mut self, now: u64) -> usize {
        if self.closed {
            return 0;
        }
        let mut n = 0;
        for k in 0..self.queue.len() {
            let Some(t) = self.timeout[k] else { continue };
            while let Some(&(id, at)) = self.queue[k].front() {
                if at + t > now {
                    break;
                }
                self.queue[k].pop_front();
                self.stats.classes[k].expired += 1;
                self.resolve(id, Err(AdmitError::QueueTimeout));
                n += 1;
            }
        }
        if n > 0 && self.lifo {
            self.lifo_next = true;
        }
        n
    }

    /// Hands a slot to the next waiter of class `k` (the newest after an
    /// expiry under adaptive LIFO, else the oldest).
    pub fn grant_one(&mut self, k: usize) {
        let (id, _) = if self.lifo_next {
            self.lifo_next = false;
            self.queue[k].pop_back().unwrap()
        } else {
            self.queue[k].pop_front().unwrap()
        };
        self.stats.admitted_queued += 1;
        self.take_wait();
        self.resolve(id, Ok(()));
    }

    /// An admission of priority `priority`; a queued waiter joins
    /// [`Reference::pending`].
    pub fn admit(&mut self, id: usize, kind: Kind, priority: u8, now: u64) -> Out {
        self.stats.received += 1;
        let out = self.admit_inner(id, kind, self.class(priority), now);
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

    /// Whether a request of class `k` is admitted at once: nobody of its
    /// class or a more important one waits, a slot is free within its share
    /// and a wait slot is free.
    fn direct(&self, k: usize) -> bool {
        self.queue[..=k].iter().all(VecDeque::is_empty)
            && self.room(k, self.running)
            && self.wait_free()
    }

    fn admit_inner(&mut self, id: usize, kind: Kind, k: usize, now: u64) -> Out {
        if self.closed {
            self.stats.classes[k].rejected_closed += 1;
            return Out::Rejected(AdmitError::Closed);
        }
        let mut expired = false;
        loop {
            if self.direct(k) {
                self.running += 1;
                self.take_wait();
                self.stats.admitted_direct += 1;
                return Out::Admitted;
            }
            let class_full = self.queue[k].len() as u32 >= self.class_queue[k];
            let whole_full = self.queued() as u32 >= self.queue_limit;
            let victim = (k + 1..self.queue.len())
                .rev()
                .find(|&j| !self.queue[j].is_empty())
                .filter(|_| whole_full);
            if class_full || (whole_full && victim.is_none()) {
                if !expired && self.class_queue[k] > 0 && self.expire_due(now) > 0 {
                    expired = true;
                    continue;
                }
                self.stats.classes[k].rejected_at_capacity += 1;
                return Out::Rejected(AdmitError::AtCapacity);
            }
            if let Some(j) = victim {
                let (vid, _) = self.queue[j].pop_back().unwrap();
                self.stats.classes[j].displaced += 1;
                self.resolve(vid, Err(AdmitError::Displaced));
            }
            self.queue[k].push_back((id, now));
            self.class_of.insert(id, k);
            self.waiters.insert(id, (kind, WState::Queued));
            return Out::Pending;
        }
    }

    /// `try_admit` of priority `priority`.
    pub fn try_admit(&mut self, priority: u8) -> Out {
        if self.closed {
            return Out::Try(Err(TryAdmitError::Closed));
        }
        if self.direct(self.class(priority)) {
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
        if self.queued() > 0 && !self.closed && self.wait_free() {
            self.expire_due(now);
            let freed = self.running - 1;
            if let Some(k) = self.first_class().filter(|&k| self.room(k, freed)) {
                self.grant_one(k);
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
        if self.queued() > 0 && !self.closed {
            self.expire_due(now);
            if let Some(k) = self.first_class().filter(|&k| self.room(k, self.running)) {
                self.grant_one(k);
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
                let k = self.class_of.remove(&id).unwrap();
                self.queue[k].retain(|&(q, _)| q != id);
                self.stats.cancelled += 1;
                Out::Cancelled(true)
            }
            WState::Granted => {
                assert_ne!(kind, Kind::Callback);
                self.release_slot(now, self.wait_limit.is_some());
                Out::Cancelled(false)
            }
            WState::Rejected(_) | WState::Fired => Out::Cancelled(false),
        }
    }

    /// Arms the `i`th unarmed pending waiter (in admission order): it
    /// becomes a callback if still queued, else gives its outcome (a grant
    /// is held) and leaves. Its id and the answer.
    pub fn arm_at(&mut self, i: usize) -> (usize, Out) {
        let id = self
            .pending
            .iter()
            .copied()
            .filter(|id| self.waiters[id].0 == Kind::Pending)
            .nth(i)
            .expect("an unarmed waiter");
        let state = self.waiters[&id].1;
        let out = match state {
            WState::Queued => {
                self.waiters.get_mut(&id).unwrap().0 = Kind::Callback;
                return (id, Out::Armed(None));
            }
            WState::Granted => {
                self.hold();
                Ok(())
            }
            WState::Rejected(e) => Err(e),
            WState::Fired => unreachable!("an unarmed waiter never fires"),
        };
        self.waiters.remove(&id);
        self.pending.retain(|&p| p != id);
        (id, Out::Armed(Some(out)))
    }

    /// How many pending waiters are not armed yet.
    pub fn unarmed(&self) -> usize {
        self.pending
            .iter()
            .filter(|id| self.waiters[id].0 == Kind::Pending)
            .count()
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
                (Kind::Callback, WState::Queued) | (Kind::Pending, _) => keep.push(id),
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
        self.limit = n;
        if self.closed {
            return;
        }
        self.expire_due(now);
        while self.wait_free() {
            let Some(k) = self.first_class().filter(|&k| self.room(k, self.running)) else {
                break;
            };
            self.grant_one(k);
            self.running += 1;
        }
    }

    /// `close`: every waiter is refused.
    pub fn close(&mut self) {
        self.closed = true;
        for k in 0..self.queue.len() {
            while let Some((id, _)) = self.queue[k].pop_front() {
                self.stats.classes[k].rejected_closed += 1;
                self.resolve(id, Err(AdmitError::Closed));
            }
        }
    }
}
