//! The reference gate: a `VecDeque` and counters, no atomics, no
//! cleverness. `gate_model.rs` and the `gate_ops` fuzz target (which includes
//! this file by path) check the real gate against it after every operation.
#![allow(dead_code)] // each including binary uses a different subset

use std::collections::{HashMap, VecDeque};

use loadgate::{AdmitError, GateStats, TryAdmitError};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Future,
    Callback,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WState {
    Queued,
    Granted,
    Rejected(AdmitError),
    /// A callback that has been called.
    Fired,
}

/// What an operation returned, in a form both gates can produce.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    Unit,
    Admitted,
    Pending,
    Rejected(AdmitError),
    Try(Result<(), TryAdmitError>),
    Cancelled(bool),
    Expired(usize),
    Polled(Vec<(usize, Result<(), AdmitError>)>),
}

pub struct Reference {
    pub limit: u32,
    pub queue_limit: u32,
    pub timeout: Option<u64>,
    pub lifo: bool,
    pub lifo_next: bool,
    pub closed: bool,
    pub running: u32,
    pub held: usize,
    pub queue: VecDeque<(usize, u64)>,
    pub waiters: HashMap<usize, (Kind, WState)>,
    pub fired: Vec<(usize, Result<(), AdmitError>)>,
    pub stats: GateStats,
}

impl Reference {
    pub fn new(limit: u32, queue_limit: u32, timeout: Option<u64>, lifo: bool) -> Self {
        Self {
            limit,
            queue_limit,
            timeout,
            lifo,
            lifo_next: false,
            closed: false,
            running: 0,
            held: 0,
            queue: VecDeque::new(),
            waiters: HashMap::new(),
            fired: Vec::new(),
            stats: GateStats {
                limit,
                queue_limit,
                ..GateStats::default()
            },
        }
    }

    pub fn stats(&self) -> GateStats {
        GateStats {
            running: self.running,
            queued: self.queue.len() as u32,
            limit: self.limit,
            closed: self.closed,
            ..self.stats
        }
    }

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
                    self.held += 1;
                }
            }
        }
    }

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

    pub fn grant_one(&mut self) {
        let (id, _) = if self.lifo_next {
            self.lifo_next = false;
            self.queue.pop_back().unwrap()
        } else {
            self.queue.pop_front().unwrap()
        };
        self.stats.admitted_queued += 1;
        self.resolve(id, Ok(()));
    }

    pub fn admit(&mut self, id: usize, kind: Kind, now: u64) -> Out {
        let out = self.admit_inner(id, kind, now);
        if kind == Kind::Callback {
            match out {
                Out::Admitted => {
                    self.fired.push((id, Ok(())));
                    self.held += 1;
                }
                Out::Rejected(e) => self.fired.push((id, Err(e))),
                _ => {}
            }
        } else if out == Out::Admitted {
            self.held += 1;
        }
        out
    }

    pub fn admit_inner(&mut self, id: usize, kind: Kind, now: u64) -> Out {
        if self.closed {
            self.stats.rejected_closed += 1;
            return Out::Rejected(AdmitError::Closed);
        }
        if self.queue.is_empty() && self.running < self.limit {
            self.running += 1;
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

    pub fn try_admit(&mut self) -> Out {
        if self.closed {
            return Out::Try(Err(TryAdmitError::Closed));
        }
        if self.queue.is_empty() && self.running < self.limit {
            self.running += 1;
            self.held += 1;
            self.stats.admitted_direct += 1;
            return Out::Try(Ok(()));
        }
        Out::Try(Err(TryAdmitError::WouldWait))
    }

    /// A slot comes back (permit dropped, or a granted waiter cancelled).
    pub fn release_slot(&mut self, now: u64) {
        if !self.queue.is_empty() && !self.closed && self.running <= self.limit {
            self.expire_due(now);
            if !self.queue.is_empty() {
                self.grant_one();
                return;
            }
        }
        self.running -= 1;
    }

    pub fn release(&mut self, now: u64) {
        self.held -= 1;
        self.release_slot(now);
    }

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
                self.release_slot(now);
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
                self.held += 1;
                Ok(())
            }
            WState::Rejected(e) => Err(e),
            WState::Fired => unreachable!(),
        };
        self.waiters.remove(&id);
        Some(out)
    }

    pub fn set_limit(&mut self, n: u32, now: u64) {
        if !self.closed && !self.queue.is_empty() && self.running < n {
            self.expire_due(now);
            let want = (self.queue.len() as u32).min(n - self.running);
            for _ in 0..want {
                self.grant_one();
                self.running += 1;
            }
        }
        self.limit = n;
    }

    pub fn close(&mut self) {
        self.closed = true;
        while let Some((id, _)) = self.queue.pop_front() {
            self.stats.rejected_closed += 1;
            self.resolve(id, Err(AdmitError::Closed));
        }
    }
}
