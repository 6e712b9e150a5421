//! The admission cases: the gate's direct, rejected, queued and contended
//! paths against the Mutex gate, tokio's semaphore and the gate's floor.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use loadgate::{
    AdmissionGate, Admit, AdmitError, GateConfig, MonotonicClock, OwnedPermit, Permit, SharedClock,
};
use loadgate_benches::baseline::admission::{
    ChannelAdmission, ChannelGate, ClassAdmission, ClassMutexGate, ClassWait, MutexAdmission,
    MutexGate, MutexPermit, WaitMutexGate, CLASSES,
};
use loadgate_benches::fixture::{block_on, noop_waker, poll_once};
use loadgate_benches::floor::GateFloor;
use loadgate_benches::harness::{
    contend, contend_per_op, interleave, record_one, Budget, Series, SharedSide, Side,
};
use loadgate_testkit::alloc::thread_allocations;
use tokio::sync::Semaphore;

use crate::{
    each, Case, Run, CLASS_HANDOFF, CLOCK, CONTENDED, DIRECT, HANDOFF_BLOCKING, HANDOFF_CALLBACK,
    HANDOFF_FUTURE, HANDOFF_THROUGHPUT, OVERSUBSCRIBED, REJECT, WAIT_CONTENDED, WAIT_DIRECT,
};

// ---------------------------------------------------------------------------
// Admission cases.

fn gate(limit: u32, queue: u32) -> AdmissionGate {
    AdmissionGate::new(GateConfig::new(limit).with_queue(queue)).expect("gate config")
}

/// A direct admission on a gate with a wait limit and its first response.
#[inline]
fn admit_and_respond(g: &AdmissionGate) -> Permit<'_> {
    let p = g.try_admit().expect("slot free");
    p.first_response();
    p
}

/// A gate with a wait limit.
fn wait_gate(limit: u32, wait: u32) -> AdmissionGate {
    AdmissionGate::new(
        GateConfig::new(limit)
            .with_queue(16)
            .with_wait_limit(Some(wait)),
    )
    .expect("gate config")
}

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime")
}

thread_local! {
    static CALLBACK_SLOT: Cell<Option<OwnedPermit>> = const { Cell::new(None) };
}

fn on_admitted(r: Result<OwnedPermit, AdmitError>) {
    CALLBACK_SLOT.set(Some(r.expect("queued request granted")));
}

/// The gate's clock (read through `dyn Clock`, as the gate reads it)
/// against `Instant::now`.
pub(crate) fn clock_cases(run: &mut Run) {
    run.measure(Case::hot("clock read", CLOCK), |budget| {
        let clock: SharedClock = black_box(MonotonicClock::shared());
        let mut sides = [each(|| clock.now_nanos()), each(Instant::now)];
        interleave(budget, &mut sides)
    });
}

pub(crate) fn admission_cases(run: &mut Run) {
    let waker = noop_waker();

    run.measure(Case::hot("admit + release, direct", DIRECT), |budget| {
        let g = gate(4, 16);
        let sem = Semaphore::new(4);
        let mg = MutexGate::new(4, 16);
        let rt = current_thread_runtime();
        let cg = ChannelGate::new(rt.handle(), 4, 16);
        let floor = GateFloor::new(4);
        let mut sides = [
            each(|| g.try_admit().expect("slot free")),
            each(|| sem.try_acquire().expect("slot free")),
            each(|| mg.try_admit().expect("slot free")),
            each(|| cg.admit()),
            each(|| floor.try_admit().expect("slot free")),
        ];
        interleave(budget, &mut sides)
    });

    run.measure(
        Case::hot("reject when full (N=1, Q=2 full)", REJECT),
        |budget| {
            let g = gate(1, 2);
            let _held = g.try_admit().expect("first slot");
            let mut q1 = g.admit();
            let mut q2 = g.admit();
            assert!(
                poll_once(&mut q1, &waker).is_pending() && poll_once(&mut q2, &waker).is_pending()
            );
            let sem = Semaphore::new(1);
            let _sem_held = sem.try_acquire().expect("first slot");
            let mg = MutexGate::new(1, 2);
            let MutexAdmission::Admitted(_mg_held) = mg.admit() else {
                panic!("first slot")
            };
            let (_m1, _m2) = (mg.admit(), mg.admit());
            let rt = current_thread_runtime();
            let cg = ChannelGate::new(rt.handle(), 1, 2);
            let ChannelAdmission::Admitted(_cg_held) = cg.admit() else {
                panic!("first slot")
            };
            let _c1 = cg.admit();
            rt.block_on(tokio::task::yield_now()); // the dispatcher takes one
            let _c2 = cg.admit();
            assert!(matches!(cg.admit(), ChannelAdmission::Rejected));
            assert!(matches!(mg.admit(), MutexAdmission::Rejected));
            let mut sides = [
                each(|| {
                    let mut f = g.admit();
                    let r = poll_once(&mut f, &waker);
                    debug_assert!(matches!(r, Poll::Ready(Err(AdmitError::AtCapacity))));
                    r.is_ready()
                }),
                each(|| sem.try_acquire().is_err()),
                each(|| matches!(mg.admit(), MutexAdmission::Rejected)),
                each(|| matches!(cg.admit(), ChannelAdmission::Rejected)),
            ];
            interleave(budget, &mut sides)
        },
    );

    let name = "queued admit + handoff, future";
    run.measure(Case::hot(name, HANDOFF_FUTURE), |budget| {
        let g = gate(1, 16);
        let mg = MutexGate::new(1, 16);
        let rt = current_thread_runtime();
        let cg = ChannelGate::new(rt.handle(), 1, 16);
        let mut lg_holder = Some(g.try_admit().expect("first slot"));
        let mut mg_holder = Some(mg.try_admit().expect("first slot"));
        let ChannelAdmission::Admitted(p) = cg.admit() else {
            panic!("first slot")
        };
        let mut cg_holder = Some(p);
        let mut sides = [
            each(|| {
                let mut f = g.admit();
                assert!(poll_once(&mut f, &waker).is_pending());
                drop(lg_holder.take());
                match poll_once(&mut f, &waker) {
                    Poll::Ready(Ok(p)) => lg_holder = Some(p),
                    _ => panic!("handoff"),
                }
            }),
            each(|| mutex_handoff(&mg, &mut mg_holder, &waker)),
            Side::new(|ops| {
                rt.block_on(async {
                    for _ in 0..ops {
                        let ChannelAdmission::Queued(rx) = cg.admit() else {
                            panic!("queues")
                        };
                        drop(cg_holder.take());
                        cg_holder = Some(rx.await.expect("handoff"));
                    }
                });
            }),
        ];
        interleave(budget, &mut sides)
    });

    let name = "queued admit + handoff, callback";
    run.measure(Case::hot(name, HANDOFF_CALLBACK), |budget| {
        let g = Arc::new(gate(1, 16));
        CALLBACK_SLOT.set(Some(g.try_admit_owned().expect("first slot")));
        let mg = MutexGate::new(1, 16);
        let mut mg_holder = Some(mg.try_admit().expect("first slot"));
        let series = interleave(
            budget,
            &mut [
                each(|| {
                    drop(g.admit_with_callback(Box::new(on_admitted)));
                    let holder = CALLBACK_SLOT.take().expect("holder");
                    drop(holder); // hands the slot to the callback
                    assert!(CALLBACK_SLOT.with(|s| {
                        let p = s.take();
                        let ok = p.is_some();
                        s.set(p);
                        ok
                    }));
                }),
                each(|| mutex_handoff(&mg, &mut mg_holder, &waker)),
            ],
        );
        drop(CALLBACK_SLOT.take());
        series
    });

    let name = "queued admit + handoff, blocking, 2 threads";
    run.measure(Case::hot(name, HANDOFF_BLOCKING), |budget| {
        let g = gate(1, 1);
        let mg = MutexGate::new(1, 1);
        let mut lg = Series::default();
        let mut mgs = Series::default();
        for round in 0..budget.rounds {
            for k in 0..2 {
                if (round + k) % 2 == 0 {
                    lg.merge(&lg_pingpong(&g, budget.per_round).0);
                } else {
                    mgs.merge(&mutex_pingpong(&mg, budget.per_round).0);
                }
            }
        }
        vec![lg, mgs]
    });

    let name = "handoff throughput, 2 threads (one holds, one waits)";
    run.measure(Case::contended(name, HANDOFF_THROUGHPUT), |budget| {
        let g = gate(1, 1);
        let mg = MutexGate::new(1, 1);
        let sem = Semaphore::new(1);
        // tokio's Semaphore does not count its waiters: each waiter counts
        // itself once its acquire is queued (first poll pending).
        let sem_waiting = AtomicU64::new(0);
        let mut out = vec![Series::default(), Series::default(), Series::default()];
        for round in 0..budget.rounds {
            for k in 0..out.len() {
                let i = (round + k) % out.len();
                let (series, wall) = match i {
                    0 => lg_pingpong(&g, budget.per_round),
                    1 => mutex_pingpong(&mg, budget.per_round),
                    _ => pingpong(
                        budget.per_round,
                        &|| sem.try_acquire().ok(),
                        &|| {
                            let mut acquire = pin!(sem.acquire());
                            let mut counted = false;
                            let permit = block_on(poll_fn(|cx| {
                                let r = acquire.as_mut().poll(cx);
                                if r.is_pending() && !counted {
                                    counted = true;
                                    sem_waiting.fetch_add(1, Ordering::AcqRel);
                                }
                                r
                            }))
                            .expect("semaphore open");
                            if counted {
                                sem_waiting.fetch_sub(1, Ordering::AcqRel);
                            }
                            permit
                        },
                        &|| sem_waiting.load(Ordering::Acquire) > 0,
                    ),
                };
                out[i].merge(&series);
                out[i].elapsed += wall;
            }
        }
        out
    });

    let name = "4-class handoff";
    run.measure(Case::hot(name, CLASS_HANDOFF), |budget| {
        // Each op is one handoff. Every fourth op first queues one waiter
        // per class, least important first; the four releases that follow
        // must hand the slot to classes 0, 1, 2, 3 in that order.
        let g = AdmissionGate::new(GateConfig::new(1).with_queue(16).with_classes(CLASSES))
            .expect("gate config");
        let cg = ClassMutexGate::new(1, 16);
        let mut lg_holder = Some(g.try_admit().expect("first slot"));
        let mut lg_waiters: [Option<Admit<'_>>; CLASSES] = Default::default();
        let mut lg_ops = 0usize;
        let ClassAdmission::Admitted(p) = cg.admit(0) else {
            panic!("first slot")
        };
        let mut cg_holder = Some(p);
        let mut cg_waiters: [Option<ClassWait<'_>>; CLASSES] = Default::default();
        let mut cg_ops = 0usize;
        let mut sides = [
            each(|| {
                let served = lg_ops % CLASSES;
                lg_ops += 1;
                if served == 0 {
                    for (c, w) in lg_waiters.iter_mut().enumerate().rev() {
                        let mut f = g.admit_at(c as u8);
                        assert!(poll_once(&mut f, &waker).is_pending());
                        *w = Some(f);
                    }
                }
                drop(lg_holder.take());
                let mut f = lg_waiters[served].take().expect("queued");
                match poll_once(&mut f, &waker) {
                    Poll::Ready(Ok(p)) => lg_holder = Some(p),
                    _ => panic!("the most important waiter gets the slot"),
                }
            }),
            each(|| {
                let served = cg_ops % CLASSES;
                cg_ops += 1;
                if served == 0 {
                    for (c, w) in cg_waiters.iter_mut().enumerate().rev() {
                        let ClassAdmission::Queued(mut f) = cg.admit(c) else {
                            panic!("queues")
                        };
                        assert!(poll_once(&mut f, &waker).is_pending());
                        *w = Some(f);
                    }
                }
                drop(cg_holder.take());
                let mut f = cg_waiters[served].take().expect("queued");
                match poll_once(&mut f, &waker) {
                    Poll::Ready(Some(p)) => cg_holder = Some(p),
                    _ => panic!("the most important waiter gets the slot"),
                }
            }),
        ];
        interleave(budget, &mut sides)
    });

    let name = "admit + first response + release, wait limit (W=4 of N=8)";
    run.measure(Case::hot(name, WAIT_DIRECT), |budget| {
        let g = wait_gate(8, 4);
        let mg = WaitMutexGate::new(8, 4, 16);
        let mut sides = [
            each(|| admit_and_respond(&g)),
            each(|| {
                let mut p = mg.try_admit().expect("slot free");
                p.first_response();
                p
            }),
        ];
        interleave(budget, &mut sides)
    });

    let name = "admit + first response + release, wait limit, 2 threads contending";
    run.measure(Case::contended(name, WAIT_CONTENDED), |budget| {
        let g = wait_gate(1024, 512);
        let mg = WaitMutexGate::new(1024, 512, 16);
        let lg_op = |ops: u64| {
            for _ in 0..ops {
                drop(black_box(admit_and_respond(&g)));
            }
        };
        let mg_op = |ops: u64| {
            for _ in 0..ops {
                let mut p = black_box(mg.try_admit().expect("slot free"));
                p.first_response();
                drop(p);
            }
        };
        let sides = [SharedSide::new(&lg_op), SharedSide::new(&mg_op)];
        contend(budget, 2, &sides)
    });

    let name = "admit + release, 2 threads contending";
    run.measure(Case::contended(name, CONTENDED), |budget| {
        contended_admit_release(budget, 2, false)
    });

    // More threads than cores: a thread is preempted now and then in the
    // middle of an operation. A preempted Mutex holder stalls every thread
    // that wants the lock until it runs again; a lock-free gate's threads
    // go on. Every operation timed on its own, for the tails.
    let name = "admit + release, 8 threads on 2 cores";
    run.measure(Case::contended(name, OVERSUBSCRIBED), |budget| {
        contended_admit_release(budget, 8, true)
    });
}

/// Direct admit + release by `threads` threads at once, on loadgate's gate,
/// tokio's `Semaphore` and the Mutex gate (each operation timed alone if
/// `per_op`).
fn contended_admit_release(budget: &Budget, threads: usize, per_op: bool) -> Vec<Series> {
    let g = gate(1024, 16);
    let sem = Semaphore::new(1024);
    let mg = MutexGate::new(1024, 16);
    let lg_op = |ops: u64| {
        for _ in 0..ops {
            drop(black_box(g.try_admit().expect("slot free")));
        }
    };
    let sem_op = |ops: u64| {
        for _ in 0..ops {
            drop(black_box(sem.try_acquire().expect("slot free")));
        }
    };
    let mg_op = |ops: u64| {
        for _ in 0..ops {
            drop(black_box(mg.try_admit().expect("slot free")));
        }
    };
    let sides = [
        SharedSide::new(&lg_op),
        SharedSide::new(&sem_op),
        SharedSide::new(&mg_op),
    ];
    if per_op {
        contend_per_op(budget, threads, &sides)
    } else {
        contend(budget, threads, &sides)
    }
}

/// One queued admission on the Mutex gate and its handoff: queue behind the
/// holder, release the holder, take the slot.
#[inline]
pub(crate) fn mutex_handoff<'g>(
    mg: &'g MutexGate,
    holder: &mut Option<MutexPermit<'g>>,
    waker: &Waker,
) {
    let MutexAdmission::Queued(mut w) = mg.admit() else {
        panic!("queues")
    };
    assert!(poll_once(&mut w, waker).is_pending());
    drop(holder.take());
    match poll_once(&mut w, waker) {
        Poll::Ready(Some(p)) => *holder = Some(p),
        _ => panic!("handoff"),
    }
}

/// [`pingpong`] on a loadgate gate of one slot, waiting blocked.
fn lg_pingpong(g: &AdmissionGate, duration: Duration) -> (Series, Duration) {
    pingpong(
        duration,
        &|| g.try_admit().ok(),
        &|| g.admit_blocking(None).expect("admitted"),
        &|| g.queued() > 0,
    )
}

/// [`pingpong`] on the Mutex gate of one slot, waiting in `blocking_recv`.
fn mutex_pingpong(mg: &MutexGate, duration: Duration) -> (Series, Duration) {
    pingpong(
        duration,
        &|| mg.try_admit(),
        &|| match mg.admit() {
            MutexAdmission::Admitted(p) => p,
            MutexAdmission::Queued(w) => w.wait().expect("handoff"),
            MutexAdmission::Rejected => panic!("queue of 1 was full"),
        },
        &|| mg.queued() > 0,
    )
}

/// Two threads hand one slot back and forth through the queue for
/// `duration`: the holder waits until the other thread is queued, stamps the
/// time and releases; the waiter records the time from that stamp to its
/// admission. Returns the handoff latencies and both threads' allocations
/// from each thread's first blocking admission on (a thread's first
/// blocking wait on loadgate makes the thread's waker, once for the
/// thread's life, as tokio's `block_on` makes its parker), and the wall time from the threads' start to their end (the handoffs'
/// throughput is the operation count over it).
fn pingpong<P>(
    duration: Duration,
    try_admit: &(dyn Fn() -> Option<P> + Sync),
    admit_blocking: &(dyn Fn() -> P + Sync),
    queued: &(dyn Fn() -> bool + Sync),
) -> (Series, Duration) {
    let base = Instant::now();
    let deadline = base + duration;
    let released = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let start = Barrier::new(3);
    let stamp = || base.elapsed().as_nanos() as u64;
    let body = |first: bool| {
        let mut s = Series::default();
        let mut held = None;
        if first {
            held = Some(try_admit().expect("a free slot"));
        }
        start.wait();
        let mut before = None;
        loop {
            if held.is_none() {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let p = admit_blocking();
                before.get_or_insert_with(thread_allocations);
                let waited = stamp().saturating_sub(released.load(Ordering::Acquire));
                record_one(&mut s, Duration::from_nanos(waited));
                held = Some(p);
            }
            if Instant::now() >= deadline {
                stop.store(true, Ordering::Release);
            }
            let mut spins = 0u32;
            while !queued() && !stop.load(Ordering::Acquire) {
                spins += 1;
                if spins % 64 == 0 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            released.store(stamp(), Ordering::Release);
            drop(held.take());
            if stop.load(Ordering::Acquire) {
                break;
            }
        }
        let now = thread_allocations();
        s.allocs = now - before.unwrap_or(now);
        s
    };
    let (a, b, wall) = std::thread::scope(|sc| {
        let a = sc.spawn(|| body(true));
        let b = sc.spawn(|| body(false));
        start.wait();
        let started = Instant::now();
        let (a, b) = (a.join().expect("thread"), b.join().expect("thread"));
        (a, b, started.elapsed())
    });
    let mut all = a;
    all.merge(&b);
    (all, wall)
}
