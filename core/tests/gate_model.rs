//! Differential test: random operation sequences run against the gate and
//! against a deliberately simple reference gate (a `VecDeque` and counters,
//! no atomics, no cleverness). Outcomes, callback firings, deadlines and
//! stats must be identical after every operation.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use loadgate::{
    AdmissionGate, AdmitError, AdmitOwned, CallbackTicket, Clock, GateConfig, ManualClock,
    OwnedPermit,
};
use proptest::prelude::*;

// The reference gate lives in its own file so the fuzz target can share it;
// an inline `support` module picks up only that file.
mod support {
    pub mod reference_gate;
}
use support::reference_gate::{Kind, Out, Reference, WState};

// ----- the driver ------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    AdmitFuture,
    AdmitCallback,
    TryAdmit,
    Release(usize),
    Cancel(usize),
    PollAll,
    Advance(u64),
    Expire,
    SetLimit(u32),
    Close,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => Just(Op::AdmitFuture),
        4 => Just(Op::AdmitCallback),
        2 => Just(Op::TryAdmit),
        6 => any::<usize>().prop_map(Op::Release),
        3 => any::<usize>().prop_map(Op::Cancel),
        4 => Just(Op::PollAll),
        3 => prop_oneof![Just(5u64), Just(10), Just(20), 0u64..80].prop_map(Op::Advance),
        2 => Just(Op::Expire),
        2 => (1u32..6).prop_map(Op::SetLimit),
        1 => Just(Op::Close),
    ]
}

struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

enum Pending {
    Future(AdmitOwned),
    Callback(CallbackTicket),
}

type Fired = Arc<Mutex<Vec<(usize, Result<(), AdmitError>)>>>;

fn run(limit: u32, queue: u32, timeout_ms: Option<u64>, lifo: bool, ops: &[Op]) {
    let clock = ManualClock::new();
    let config = GateConfig::new(limit)
        .with_queue(queue)
        .with_queue_timeout(timeout_ms.map(Duration::from_millis))
        .with_adaptive_lifo(lifo);
    let gate = Arc::new(AdmissionGate::with_clock(config, clock.clone()).unwrap());
    let mut model = Reference::new(limit, queue, timeout_ms.map(|ms| ms * 1_000_000), lifo);
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    let fired: Fired = Arc::default();
    let cb_permits: Arc<Mutex<Vec<OwnedPermit>>> = Arc::default();
    let mut held: Vec<OwnedPermit> = Vec::new();
    let mut pending: Vec<(usize, Pending)> = Vec::new();
    let mut model_pending: Vec<usize> = Vec::new();
    let mut next_id = 0usize;

    for (step, op) in ops.iter().enumerate() {
        let now = clock.now_nanos();
        let (real, expected) = match op {
            Op::AdmitFuture => {
                let id = next_id;
                next_id += 1;
                let mut f = gate.admit_owned();
                let real = match Pin::new(&mut f).poll(&mut cx) {
                    Poll::Ready(Ok(p)) => {
                        held.push(p);
                        Out::Admitted
                    }
                    Poll::Ready(Err(e)) => Out::Rejected(e),
                    Poll::Pending => {
                        pending.push((id, Pending::Future(f)));
                        Out::Pending
                    }
                };
                let expected = model.admit(id, Kind::Future, now);
                if expected == Out::Pending {
                    model_pending.push(id);
                }
                (real, expected)
            }
            Op::AdmitCallback => {
                let id = next_id;
                next_id += 1;
                let log = fired.clone();
                let permits = cb_permits.clone();
                let ticket = gate.admit_with_callback(Box::new(move |r| {
                    log.lock()
                        .unwrap()
                        .push((id, r.as_ref().map(|_| ()).map_err(|e| *e)));
                    if let Ok(p) = r {
                        permits.lock().unwrap().push(p);
                    }
                }));
                let real = if ticket.is_queued() {
                    pending.push((id, Pending::Callback(ticket)));
                    Out::Pending
                } else {
                    match fired.lock().unwrap().last() {
                        Some(&(fid, Ok(()))) if fid == id => Out::Admitted,
                        Some(&(fid, Err(e))) if fid == id => Out::Rejected(e),
                        other => panic!("callback {id} neither queued nor fired: {other:?}"),
                    }
                };
                let expected = model.admit(id, Kind::Callback, now);
                if expected == Out::Pending {
                    model_pending.push(id);
                }
                (real, expected)
            }
            Op::TryAdmit => {
                let real = match gate.try_admit_owned() {
                    Ok(p) => {
                        held.push(p);
                        Out::Try(Ok(()))
                    }
                    Err(e) => Out::Try(Err(e)),
                };
                (real, model.try_admit())
            }
            Op::Release(k) => {
                if held.is_empty() {
                    continue;
                }
                let p = held.swap_remove(k % held.len());
                drop(p);
                model.release(now);
                (Out::Unit, Out::Unit)
            }
            Op::Cancel(k) => {
                if pending.is_empty() {
                    continue;
                }
                let i = k % pending.len();
                let (id, p) = pending.remove(i);
                assert_eq!(model_pending.remove(i), id);
                let real = match p {
                    Pending::Future(f) => {
                        let before = gate.stats().cancelled;
                        drop(f);
                        Out::Cancelled(gate.stats().cancelled > before)
                    }
                    Pending::Callback(t) => Out::Cancelled(t.cancel()),
                };
                (real, model.cancel(id, now))
            }
            Op::PollAll => {
                let mut real = Vec::new();
                let mut keep = Vec::new();
                for (id, p) in pending.drain(..) {
                    match p {
                        Pending::Future(mut f) => match Pin::new(&mut f).poll(&mut cx) {
                            Poll::Ready(r) => {
                                real.push((id, r.as_ref().map(|_| ()).map_err(|e| *e)));
                                if let Ok(p) = r {
                                    held.push(p);
                                }
                            }
                            Poll::Pending => keep.push((id, Pending::Future(f))),
                        },
                        Pending::Callback(t) => {
                            // A callback that fired leaves the pending list.
                            if t.is_queued() {
                                keep.push((id, Pending::Callback(t)));
                            }
                        }
                    }
                }
                pending = keep;
                let mut expected = Vec::new();
                let mut model_keep = Vec::new();
                for id in model_pending.drain(..) {
                    match model.waiters[&id] {
                        (Kind::Future, _) => match model.poll(id) {
                            Some(r) => expected.push((id, r)),
                            None => model_keep.push(id),
                        },
                        (Kind::Callback, WState::Queued) => model_keep.push(id),
                        (Kind::Callback, _) => {
                            model.waiters.remove(&id);
                        }
                    }
                }
                model_pending = model_keep;
                (Out::Polled(real), Out::Polled(expected))
            }
            Op::Advance(ms) => {
                clock.advance(Duration::from_millis(*ms));
                (Out::Unit, Out::Unit)
            }
            Op::Expire => (
                Out::Expired(gate.expire()),
                Out::Expired(model.expire_due(now)),
            ),
            Op::SetLimit(n) => {
                gate.set_limit(*n).unwrap();
                model.set_limit(*n, now);
                (Out::Unit, Out::Unit)
            }
            Op::Close => {
                gate.close();
                model.close();
                (Out::Unit, Out::Unit)
            }
        };
        held.append(&mut cb_permits.lock().unwrap());
        let ctx =
            || format!("step {step} {op:?} (N={limit} Q={queue} T={timeout_ms:?} lifo={lifo})");
        assert_eq!(real, expected, "outcome, {}", ctx());
        assert_eq!(gate.stats(), model.stats(), "stats, {}", ctx());
        assert_eq!(*fired.lock().unwrap(), model.fired, "callbacks, {}", ctx());
        assert_eq!(
            gate.next_deadline(),
            model.next_deadline(),
            "deadline, {}",
            ctx()
        );
        assert_eq!(held.len(), model.held, "held permits, {}", ctx());
        assert_eq!(pending.len(), model_pending.len(), "pending, {}", ctx());
    }

    // Wind down: every waiter resolves, every slot comes back.
    gate.close();
    drop(pending);
    held.append(&mut cb_permits.lock().unwrap());
    drop(held);
    held = std::mem::take(&mut cb_permits.lock().unwrap());
    drop(held);
    let s = gate.stats();
    assert_eq!((s.running, s.queued), (0, 0), "final state {s:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn gate_matches_the_reference(
        limit in 1u32..4,
        queue in 0u32..5,
        timeout in prop_oneof![Just(None), Just(Some(10)), Just(Some(20)), Just(Some(50)), (1u64..120).prop_map(Some)],
        lifo in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run(limit, queue, timeout, lifo, &ops);
    }
}

#[test]
fn reference_scenario_with_every_operation() {
    use Op::*;
    let ops = [
        AdmitFuture,
        AdmitCallback,
        AdmitFuture,
        Advance(60),
        AdmitCallback,
        Advance(50),
        Expire,
        SetLimit(3),
        PollAll,
        Cancel(0),
        Release(0),
        TryAdmit,
        AdmitFuture,
        AdmitFuture,
        SetLimit(1),
        Release(1),
        Release(0),
        PollAll,
        Close,
        AdmitFuture,
        PollAll,
    ];
    for lifo in [false, true] {
        run(1, 2, Some(100), lifo, &ops);
        run(2, 0, None, lifo, &ops);
    }
}
