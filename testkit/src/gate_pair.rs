//! The real admission gate and the reference gate driven side by side: one
//! method per operation, applying it to both and returning both outcomes
//! (real, expected), and [`GatePair::check`] comparing everything else that
//! is observable. The differential drivers (`core/tests/gate_model.rs`, the
//! `gate_ops` fuzz target) only choose operations and compare outcomes.
//!
//! Futures are polled with a no-op waker: the driver polls them itself.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use loadgate::{
    AdmissionGate, AdmitCallback, AdmitError, AdmitOwned, CallbackTicket, Clock, GateConfig,
    ManualClock, OwnedPermit, PendingAdmission,
};

use crate::reference_gate::{Kind, Out, Reference};

/// A waiter the driver holds on the real gate.
enum Pending {
    Future(AdmitOwned),
    Callback(CallbackTicket),
    /// Queued by `admit_pending`, not armed yet.
    Unarmed(PendingAdmission),
}

/// Callbacks fired on the real gate, in order.
type Fired = Arc<Mutex<Vec<(usize, Result<(), AdmitError>)>>>;

/// The real gate (on a manual clock) and the reference gate, and what the
/// driver holds on each.
pub struct GatePair {
    /// The gate under test.
    pub gate: Arc<AdmissionGate>,
    /// Its clock.
    pub clock: Arc<ManualClock>,
    /// The reference gate.
    pub model: Reference,
    fired: Fired,
    cb_permits: Arc<Mutex<Vec<OwnedPermit>>>,
    held: Vec<OwnedPermit>,
    pending: Vec<(usize, Pending)>,
    next_id: usize,
}

impl GatePair {
    /// Both gates with `limit` slots, `queue` places, a queue timeout in
    /// milliseconds and adaptive LIFO or not. Panics on a configuration the
    /// gate refuses.
    pub fn new(limit: u32, queue: u32, timeout_ms: Option<u64>, lifo: bool) -> Self {
        Self::with_wait_limit(limit, queue, None, timeout_ms, lifo)
    }

    /// As [`GatePair::new`], with a wait limit.
    pub fn with_wait_limit(
        limit: u32,
        queue: u32,
        wait_limit: Option<u32>,
        timeout_ms: Option<u64>,
        lifo: bool,
    ) -> Self {
        Self::with_config(
            GateConfig::new(limit)
                .with_wait_limit(wait_limit)
                .with_queue(queue)
                .with_queue_timeout(timeout_ms.map(Duration::from_millis))
                .with_adaptive_lifo(lifo),
        )
    }

    /// Both gates as `config` describes them (priority classes included).
    /// Panics on a configuration the gate refuses.
    pub fn with_config(config: GateConfig) -> Self {
        let clock = ManualClock::new();
        let model = Reference::from_config(&config);
        let gate = AdmissionGate::with_clock(config, clock.clone()).expect("valid config");
        GatePair {
            gate: Arc::new(gate),
            clock,
            model,
            fired: Arc::default(),
            cb_permits: Arc::default(),
            held: Vec::new(),
            pending: Vec::new(),
            next_id: 0,
        }
    }

    fn now(&self) -> u64 {
        self.clock.now_nanos()
    }

    /// `admit_owned_at` (polled once) or `admit_with_callback_at`, at
    /// priority `priority`.
    pub fn admit(&mut self, kind: Kind, priority: u8) -> (Out, Out) {
        let now = self.now();
        let id = self.next_id;
        self.next_id += 1;
        let real = match kind {
            Kind::Future => {
                let mut f = self.gate.admit_owned_at(priority);
                match Pin::new(&mut f).poll(&mut Context::from_waker(Waker::noop())) {
                    Poll::Ready(Ok(p)) => {
                        self.held.push(p);
                        Out::Admitted
                    }
                    Poll::Ready(Err(e)) => Out::Rejected(e),
                    Poll::Pending => {
                        self.pending.push((id, Pending::Future(f)));
                        Out::Pending
                    }
                }
            }
            Kind::Pending => match self.gate.admit_pending_at(priority) {
                loadgate::Pending::Ready(Ok(p)) => {
                    self.held.push(p);
                    Out::Admitted
                }
                loadgate::Pending::Ready(Err(e)) => Out::Rejected(e),
                loadgate::Pending::Queued(q) => {
                    self.pending.push((id, Pending::Unarmed(q)));
                    Out::Pending
                }
            },
            Kind::Callback => {
                let ticket = self
                    .gate
                    .admit_with_callback_at(priority, self.recording(id));
                if ticket.is_queued() {
                    self.pending.push((id, Pending::Callback(ticket)));
                    Out::Pending
                } else {
                    match self.fired.lock().unwrap().last() {
                        Some(&(fid, Ok(()))) if fid == id => Out::Admitted,
                        Some(&(fid, Err(e))) if fid == id => Out::Rejected(e),
                        other => panic!("callback {id} neither queued nor fired: {other:?}"),
                    }
                }
            }
        };
        (real, self.model.admit(id, kind, priority, now))
    }

    /// A callback for waiter `id` that logs its outcome and keeps its permit.
    fn recording(&self, id: usize) -> AdmitCallback {
        let log = self.fired.clone();
        let permits = self.cb_permits.clone();
        Box::new(move |r| {
            log.lock()
                .unwrap()
                .push((id, r.as_ref().map(|_| ()).map_err(|e| *e)));
            if let Ok(p) = r {
                permits.lock().unwrap().push(p);
            }
        })
    }

    /// Arms the `k`th unarmed waiter (modulo their number) with a recording
    /// callback; `None` when none is unarmed.
    pub fn arm(&mut self, k: usize) -> Option<(Out, Out)> {
        let unarmed: Vec<usize> = (0..self.pending.len())
            .filter(|&i| matches!(self.pending[i].1, Pending::Unarmed(_)))
            .collect();
        if unarmed.is_empty() {
            return None;
        }
        let j = k % unarmed.len();
        let i = unarmed[j];
        let (id, Pending::Unarmed(q)) = self.pending.remove(i) else {
            unreachable!("an unarmed waiter")
        };
        let real = match q.arm(self.recording(id)) {
            Ok(ticket) => {
                self.pending.insert(i, (id, Pending::Callback(ticket)));
                Out::Armed(None)
            }
            Err(outcome) => {
                let o = outcome.as_ref().map(|_| ()).map_err(|e| *e);
                if let Ok(p) = outcome {
                    self.held.push(p);
                }
                Out::Armed(Some(o))
            }
        };
        let (model_id, expected) = self.model.arm_at(j);
        assert_eq!(model_id, id, "both gates arm the same waiter");
        Some((real, expected))
    }

    /// `try_admit_owned_at`.
    pub fn try_admit(&mut self, priority: u8) -> (Out, Out) {
        let real = match self.gate.try_admit_owned_at(priority) {
            Ok(p) => {
                self.held.push(p);
                Out::Try(Ok(()))
            }
            Err(e) => Out::Try(Err(e)),
        };
        (real, self.model.try_admit(priority))
    }

    /// Drops the `k`th held permit (modulo their number); `None` when none
    /// is held.
    pub fn release(&mut self, k: usize) -> Option<(Out, Out)> {
        if self.held.is_empty() {
            return None;
        }
        let now = self.now();
        let permit = self.held.swap_remove(k % self.held.len());
        // Which permit it is (still waiting or not) is the driver's choice;
        // that the gate's flags agree with the model's count is checked by
        // `check`.
        let waiting = permit.is_waiting();
        drop(permit);
        self.model.release(now, waiting);
        Some((Out::Unit, Out::Unit))
    }

    /// The first response of the `k`th held permit (modulo their number),
    /// a no-op on both sides for a permit that already responded (or on a
    /// gate without a wait limit); `None` when none is held.
    pub fn first_response(&mut self, k: usize) -> Option<(Out, Out)> {
        if self.held.is_empty() {
            return None;
        }
        let now = self.now();
        let i = k % self.held.len();
        let waiting = self.held[i].is_waiting();
        self.held[i].first_response();
        if waiting {
            self.model.first_response(now);
        }
        Some((Out::Unit, Out::Unit))
    }

    /// Cancels the `k`th pending waiter (modulo their number): drops its
    /// future or cancels its ticket. `None` when nothing is pending.
    pub fn cancel(&mut self, k: usize) -> Option<(Out, Out)> {
        if self.pending.is_empty() {
            return None;
        }
        let now = self.now();
        let i = k % self.pending.len();
        let (id, p) = self.pending.remove(i);
        let before = self.gate.stats().cancelled;
        let real = match p {
            Pending::Future(f) => {
                drop(f);
                Out::Cancelled(self.gate.stats().cancelled > before)
            }
            Pending::Unarmed(q) => {
                drop(q);
                Out::Cancelled(self.gate.stats().cancelled > before)
            }
            Pending::Callback(t) => Out::Cancelled(t.cancel()),
        };
        let (model_id, expected) = self.model.cancel_at(i, now);
        assert_eq!(model_id, id, "both gates cancel the same waiter");
        Some((real, expected))
    }

    /// Polls every pending future; callbacks that fired leave the pending
    /// list.
    pub fn poll_all(&mut self) -> (Out, Out) {
        let mut cx = Context::from_waker(Waker::noop());
        let mut real = Vec::new();
        let mut keep = Vec::new();
        for (id, p) in self.pending.drain(..) {
            match p {
                Pending::Future(mut f) => match Pin::new(&mut f).poll(&mut cx) {
                    Poll::Ready(r) => {
                        real.push((id, r.as_ref().map(|_| ()).map_err(|e| *e)));
                        if let Ok(p) = r {
                            self.held.push(p);
                        }
                    }
                    Poll::Pending => keep.push((id, Pending::Future(f))),
                },
                Pending::Callback(t) => {
                    if t.is_queued() {
                        keep.push((id, Pending::Callback(t)));
                    }
                }
                unarmed @ Pending::Unarmed(_) => keep.push((id, unarmed)),
            }
        }
        self.pending = keep;
        (Out::Polled(real), self.model.poll_all())
    }

    /// The clock moves on.
    pub fn advance(&mut self, ms: u64) -> (Out, Out) {
        self.clock.advance(Duration::from_millis(ms));
        (Out::Unit, Out::Unit)
    }

    /// `expire`.
    pub fn expire(&mut self) -> (Out, Out) {
        let now = self.now();
        (
            Out::Expired(self.gate.expire()),
            Out::Expired(self.model.expire_due(now)),
        )
    }

    /// `set_limit` with a limit the gate accepts.
    pub fn set_limit(&mut self, n: u32) -> (Out, Out) {
        let now = self.now();
        self.gate.set_limit(n).expect("a limit in range");
        self.model.set_limit(n, now);
        (Out::Unit, Out::Unit)
    }

    /// `close`.
    pub fn close(&mut self) -> (Out, Out) {
        self.gate.close();
        self.model.close();
        (Out::Unit, Out::Unit)
    }

    /// Everything observable besides the outcome must agree: stats, the
    /// callbacks fired and their order, the next deadline, the permits held
    /// and the waiters pending. `ctx` names the step in a failure.
    pub fn check(&mut self, ctx: &dyn Fn() -> String) {
        self.held.append(&mut self.cb_permits.lock().unwrap());
        assert_eq!(self.gate.stats(), self.model.stats(), "stats, {}", ctx());
        assert_eq!(
            *self.fired.lock().unwrap(),
            self.model.fired,
            "callbacks, {}",
            ctx()
        );
        assert_eq!(
            self.gate.next_deadline(),
            self.model.next_deadline(),
            "deadline, {}",
            ctx()
        );
        assert_eq!(self.held.len(), self.model.held, "held permits, {}", ctx());
        assert_eq!(
            self.held.iter().filter(|p| p.is_waiting()).count(),
            self.model.held_waiting,
            "held permits still waiting, {}",
            ctx()
        );
        assert_eq!(
            self.pending.len(),
            self.model.pending.len(),
            "pending, {}",
            ctx()
        );
    }

    /// Winds down: closes the gate, drops every waiter and permit, and
    /// checks that every slot came back.
    pub fn finish(mut self) {
        self.gate.close();
        drop(std::mem::take(&mut self.pending));
        self.held.append(&mut self.cb_permits.lock().unwrap());
        drop(std::mem::take(&mut self.held));
        drop(std::mem::take(&mut *self.cb_permits.lock().unwrap()));
        let s = self.gate.stats();
        assert_eq!((s.running, s.queued), (0, 0), "final state {s:?}");
    }
}
