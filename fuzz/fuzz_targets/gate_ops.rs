//! Admission gate operation sequences (admit as a future or a callback,
//! try-admit, release, cancel, poll, expire, set_limit, close, time) checked
//! step by step against the reference gate that `core/tests/gate_model.rs`
//! also uses.
//!
//! Beyond the proptest version: limits and queues large enough that one
//! `close`, `expire` or `set_limit` resolves more waiters than the gate's
//! fixed wake batch (32) holds, bursts of admissions to get there, and
//! refused limits (0, above the maximum) that must change nothing.
//!
//! After every step: the outcome, the stats, the callbacks fired (and their
//! order), the next deadline, and the permits held must match the reference.
#![no_main]

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use loadgate::gate::MAX_LIMIT;
use loadgate::{
    AdmissionGate, AdmitError, AdmitOwned, CallbackTicket, Clock, ConfigError, GateConfig,
    ManualClock, OwnedPermit,
};

#[path = "../../core/tests/support/reference_gate.rs"]
mod reference_gate;
use reference_gate::{Kind, Out, Reference, WState};

#[derive(Debug)]
struct Setup {
    limit: u32,
    queue: u32,
    timeout_ms: Option<u64>,
    lifo: bool,
}

impl<'a> Arbitrary<'a> for Setup {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let big = u.ratio(1u8, 4)?;
        let queue = if big {
            u.int_in_range(0..=48)?
        } else {
            u.int_in_range(0..=5)?
        };
        Ok(Setup {
            limit: if big {
                u.int_in_range(1..=40)?
            } else {
                u.int_in_range(1..=4)?
            },
            queue,
            timeout_ms: if u.arbitrary()? {
                Some(u.int_in_range(1..=120)?)
            } else {
                None
            },
            lifo: u.arbitrary()?,
        })
    }
}

#[derive(Debug, Arbitrary)]
enum Op {
    AdmitFuture,
    AdmitCallback,
    /// Several admissions in a row, each checked on its own.
    Burst {
        n: u8,
        callbacks: bool,
    },
    TryAdmit,
    Release(u8),
    Cancel(u8),
    PollAll,
    Advance(u8),
    Expire,
    SetLimit(u8),
    /// Limits the gate must refuse: 0 and one past the maximum.
    SetBadLimit(bool),
    Close,
}

enum Pending {
    Future(AdmitOwned),
    Callback(CallbackTicket),
}

type Fired = Arc<Mutex<Vec<(usize, Result<(), AdmitError>)>>>;

struct Driver {
    gate: Arc<AdmissionGate>,
    clock: Arc<ManualClock>,
    model: Reference,
    fired: Fired,
    cb_permits: Arc<Mutex<Vec<OwnedPermit>>>,
    held: Vec<OwnedPermit>,
    pending: Vec<(usize, Pending)>,
    model_pending: Vec<usize>,
    next_id: usize,
}

impl Driver {
    fn new(s: &Setup) -> Self {
        let clock = ManualClock::new();
        let config = GateConfig::new(s.limit)
            .with_queue(s.queue)
            .with_queue_timeout(s.timeout_ms.map(Duration::from_millis))
            .with_adaptive_lifo(s.lifo);
        let gate = AdmissionGate::with_clock(config, clock.clone()).expect("valid config");
        Driver {
            gate: Arc::new(gate),
            clock,
            model: Reference::new(
                s.limit,
                s.queue,
                s.timeout_ms.map(|ms| ms * 1_000_000),
                s.lifo,
            ),
            fired: Arc::default(),
            cb_permits: Arc::default(),
            held: Vec::new(),
            pending: Vec::new(),
            model_pending: Vec::new(),
            next_id: 0,
        }
    }

    fn admit(&mut self, kind: Kind, cx: &mut Context<'_>) -> (Out, Out) {
        let now = self.clock.now_nanos();
        let id = self.next_id;
        self.next_id += 1;
        let real = match kind {
            Kind::Future => {
                let mut f = self.gate.admit_owned();
                match Pin::new(&mut f).poll(cx) {
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
            Kind::Callback => {
                let log = self.fired.clone();
                let permits = self.cb_permits.clone();
                let ticket = self.gate.admit_with_callback(Box::new(move |r| {
                    log.lock()
                        .unwrap()
                        .push((id, r.as_ref().map(|_| ()).map_err(|e| *e)));
                    if let Ok(p) = r {
                        permits.lock().unwrap().push(p);
                    }
                }));
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
        let expected = self.model.admit(id, kind, now);
        if expected == Out::Pending {
            self.model_pending.push(id);
        }
        (real, expected)
    }

    fn step(&mut self, op: &Op, cx: &mut Context<'_>) -> Option<(Out, Out)> {
        let now = self.clock.now_nanos();
        Some(match *op {
            Op::AdmitFuture => self.admit(Kind::Future, cx),
            Op::AdmitCallback => self.admit(Kind::Callback, cx),
            Op::Burst { n, callbacks } => {
                let kind = if callbacks {
                    Kind::Callback
                } else {
                    Kind::Future
                };
                for _ in 0..n % 40 {
                    let (real, expected) = self.admit(kind, cx);
                    assert_eq!(real, expected, "outcome within a burst");
                    self.check(op);
                }
                (Out::Unit, Out::Unit)
            }
            Op::TryAdmit => {
                let real = match self.gate.try_admit_owned() {
                    Ok(p) => {
                        self.held.push(p);
                        Out::Try(Ok(()))
                    }
                    Err(e) => Out::Try(Err(e)),
                };
                (real, self.model.try_admit())
            }
            Op::Release(k) => {
                if self.held.is_empty() {
                    return None;
                }
                let i = usize::from(k) % self.held.len();
                drop(self.held.swap_remove(i));
                self.model.release(now);
                (Out::Unit, Out::Unit)
            }
            Op::Cancel(k) => {
                if self.pending.is_empty() {
                    return None;
                }
                let i = usize::from(k) % self.pending.len();
                let (id, p) = self.pending.remove(i);
                assert_eq!(self.model_pending.remove(i), id);
                let real = match p {
                    Pending::Future(f) => {
                        let before = self.gate.stats().cancelled;
                        drop(f);
                        Out::Cancelled(self.gate.stats().cancelled > before)
                    }
                    Pending::Callback(t) => Out::Cancelled(t.cancel()),
                };
                (real, self.model.cancel(id, now))
            }
            Op::PollAll => {
                let mut real = Vec::new();
                let mut keep = Vec::new();
                for (id, p) in self.pending.drain(..) {
                    match p {
                        Pending::Future(mut f) => match Pin::new(&mut f).poll(cx) {
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
                    }
                }
                self.pending = keep;
                let mut expected = Vec::new();
                let mut model_keep = Vec::new();
                for id in std::mem::take(&mut self.model_pending) {
                    match self.model.waiters[&id] {
                        (Kind::Future, _) => match self.model.poll(id) {
                            Some(r) => expected.push((id, r)),
                            None => model_keep.push(id),
                        },
                        (Kind::Callback, WState::Queued) => model_keep.push(id),
                        (Kind::Callback, _) => {
                            self.model.waiters.remove(&id);
                        }
                    }
                }
                self.model_pending = model_keep;
                (Out::Polled(real), Out::Polled(expected))
            }
            Op::Advance(ms) => {
                self.clock
                    .advance(Duration::from_millis(u64::from(ms % 130)));
                (Out::Unit, Out::Unit)
            }
            Op::Expire => (
                Out::Expired(self.gate.expire()),
                Out::Expired(self.model.expire_due(now)),
            ),
            Op::SetLimit(n) => {
                let n = u32::from(n % 48) + 1;
                self.gate.set_limit(n).expect("a limit in range");
                self.model.set_limit(n, now);
                (Out::Unit, Out::Unit)
            }
            Op::SetBadLimit(zero) => {
                let n = if zero { 0 } else { MAX_LIMIT + 1 };
                let got = self.gate.set_limit(n);
                if zero {
                    assert_eq!(got, Err(ConfigError::ZeroLimit));
                } else {
                    assert!(got.is_err(), "limit {n} accepted");
                }
                (Out::Unit, Out::Unit)
            }
            Op::Close => {
                self.gate.close();
                self.model.close();
                (Out::Unit, Out::Unit)
            }
        })
    }

    fn check(&mut self, op: &Op) {
        self.held.append(&mut self.cb_permits.lock().unwrap());
        assert_eq!(self.gate.stats(), self.model.stats(), "stats after {op:?}");
        assert_eq!(
            *self.fired.lock().unwrap(),
            self.model.fired,
            "callbacks after {op:?}"
        );
        assert_eq!(
            self.gate.next_deadline(),
            self.model.next_deadline(),
            "deadline after {op:?}"
        );
        assert_eq!(
            self.held.len(),
            self.model.held,
            "held permits after {op:?}"
        );
        assert_eq!(
            self.pending.len(),
            self.model_pending.len(),
            "pending after {op:?}"
        );
    }
}

fuzz_target!(|input: (Setup, Vec<Op>)| {
    let (setup, ops) = input;
    let mut d = Driver::new(&setup);
    let mut cx = Context::from_waker(Waker::noop());
    for op in ops.iter().take(512) {
        if let Some((real, expected)) = d.step(op, &mut cx) {
            assert_eq!(real, expected, "outcome of {op:?} ({setup:?})");
            d.check(op);
        }
    }
    // Wind down: every waiter resolves, every slot comes back.
    d.gate.close();
    drop(std::mem::take(&mut d.pending));
    d.held.append(&mut d.cb_permits.lock().unwrap());
    drop(std::mem::take(&mut d.held));
    drop(std::mem::take(&mut *d.cb_permits.lock().unwrap()));
    let s = d.gate.stats();
    assert_eq!((s.running, s.queued), (0, 0), "final state {s:?}");
});
