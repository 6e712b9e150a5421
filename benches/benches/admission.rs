//! Worker admission: direct admit and release, reject when full, queued
//! admit and handoff (future, callback, blocking across two threads) and two
//! threads contending, against tokio's `Semaphore` and the two reference
//! gates.

// criterion_group! generates public functions without docs.
#![allow(missing_docs)]

use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::task::Poll;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use loadgate::{AdmissionGate, AdmitError, GateConfig, OwnedPermit};
use loadgate_benches::baseline::admission::{
    ChannelAdmission, ChannelGate, MutexAdmission, MutexGate,
};
use loadgate_benches::fixture::{noop_waker, poll_once};
use tokio::sync::Semaphore;

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
}

fn gate(limit: u32, queue: u32) -> AdmissionGate {
    AdmissionGate::new(GateConfig::new(limit).with_queue(queue)).expect("gate config")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
}

fn direct(c: &mut Criterion) {
    let g = gate(4, 16);
    let sem = Semaphore::new(4);
    let mg = MutexGate::new(4, 16);
    let rt = runtime();
    let cg = ChannelGate::new(rt.handle(), 4, 16);
    let mut grp = c.benchmark_group("admit_release/direct");
    grp.bench_function("loadgate", |b| b.iter(|| drop(black_box(g.try_admit()))));
    grp.bench_function("tokio_semaphore", |b| {
        b.iter(|| drop(black_box(sem.try_acquire())))
    });
    grp.bench_function("mutex_gate", |b| b.iter(|| drop(black_box(mg.try_admit()))));
    grp.bench_function("semaphore_channel", |b| {
        b.iter(|| drop(black_box(cg.admit())))
    });
    grp.finish();
}

fn reject(c: &mut Criterion) {
    let waker = noop_waker();
    let g = gate(1, 2);
    let _held = g.try_admit().expect("slot");
    let (mut q1, mut q2) = (g.admit(), g.admit());
    assert!(poll_once(&mut q1, &waker).is_pending() && poll_once(&mut q2, &waker).is_pending());
    let mg = MutexGate::new(1, 2);
    let _mg_held = mg.try_admit().expect("slot");
    let (_m1, _m2) = (mg.admit(), mg.admit());
    let sem = Semaphore::new(1);
    let _sem_held = sem.try_acquire().expect("slot");
    let mut grp = c.benchmark_group("reject_full");
    grp.bench_function("loadgate", |b| {
        b.iter(|| {
            let mut f = g.admit();
            black_box(matches!(
                poll_once(&mut f, &waker),
                Poll::Ready(Err(AdmitError::AtCapacity))
            ))
        })
    });
    grp.bench_function("tokio_semaphore", |b| {
        b.iter(|| black_box(sem.try_acquire().is_err()))
    });
    grp.bench_function("mutex_gate", |b| {
        b.iter(|| black_box(matches!(mg.admit(), MutexAdmission::Rejected)))
    });
    grp.finish();
}

thread_local! {
    static SLOT: Cell<Option<OwnedPermit>> = const { Cell::new(None) };
}

fn granted(r: Result<OwnedPermit, AdmitError>) {
    SLOT.set(r.ok());
}

fn handoff(c: &mut Criterion) {
    let waker = noop_waker();
    let g = gate(1, 16);
    let mg = MutexGate::new(1, 16);
    let mut grp = c.benchmark_group("queued_handoff");

    let mut holder = Some(g.try_admit().expect("slot"));
    grp.bench_function("loadgate_future", |b| {
        b.iter(|| {
            let mut f = g.admit();
            assert!(poll_once(&mut f, &waker).is_pending());
            drop(holder.take());
            match poll_once(&mut f, &waker) {
                Poll::Ready(Ok(p)) => holder = Some(p),
                _ => panic!("handoff"),
            }
        })
    });
    drop(holder);

    let shared = Arc::new(gate(1, 16));
    SLOT.set(Some(shared.try_admit_owned().expect("slot")));
    grp.bench_function("loadgate_callback", |b| {
        b.iter(|| {
            drop(shared.admit_with_callback(Box::new(granted)));
            drop(SLOT.take());
        })
    });
    drop(SLOT.take());

    let mut mholder = Some(mg.try_admit().expect("slot"));
    grp.bench_function("mutex_gate_oneshot", |b| {
        b.iter(|| {
            let MutexAdmission::Queued(mut w) = mg.admit() else {
                panic!("queues")
            };
            assert!(poll_once(&mut w, &waker).is_pending());
            drop(mholder.take());
            match poll_once(&mut w, &waker) {
                Poll::Ready(Some(p)) => mholder = Some(p),
                _ => panic!("handoff"),
            }
        })
    });
    drop(mholder);

    let rt = runtime();
    let cg = ChannelGate::new(rt.handle(), 1, 16);
    let ChannelAdmission::Admitted(p) = cg.admit() else {
        panic!("slot")
    };
    let mut cholder = Some(p);
    grp.bench_function("semaphore_channel_dispatcher", |b| {
        b.iter(|| {
            rt.block_on(async {
                let ChannelAdmission::Queued(rx) = cg.admit() else {
                    panic!("queues")
                };
                drop(cholder.take());
                cholder = Some(rx.await.expect("handoff"));
            })
        })
    });
    grp.finish();
}

/// `iters` handoffs of one slot between two threads through the queue.
fn pingpong<P>(
    iters: u64,
    try_admit: &(dyn Fn() -> Option<P> + Sync),
    admit_blocking: &(dyn Fn() -> P + Sync),
    queued: &(dyn Fn() -> bool + Sync),
) -> Duration {
    let done = std::sync::atomic::AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let start = Barrier::new(2);
    let body = |first: bool| {
        let mut held = if first { try_admit() } else { None };
        start.wait();
        loop {
            if held.is_none() {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                held = Some(admit_blocking());
                if done.fetch_add(1, Ordering::AcqRel) + 1 >= iters {
                    stop.store(true, Ordering::Release);
                }
            }
            // Yield now and then: a holder that only spins can keep the
            // thread it waits for off its CPU for a whole scheduler slice.
            let mut spins = 0u32;
            while !queued() && !stop.load(Ordering::Acquire) {
                spins += 1;
                if spins % 64 == 0 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            drop(held.take());
            if stop.load(Ordering::Acquire) {
                return;
            }
        }
    };
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| body(true));
        s.spawn(|| body(false));
    });
    t.elapsed()
}

fn blocking(c: &mut Criterion) {
    let g = gate(1, 1);
    let mg = MutexGate::new(1, 1);
    let mut grp = c.benchmark_group("queued_handoff_blocking_2_threads");
    grp.bench_function("loadgate", |b| {
        b.iter_custom(|iters| {
            pingpong(
                iters,
                &|| g.try_admit().ok(),
                &|| g.admit_blocking(None).expect("admitted"),
                &|| g.queued() > 0,
            )
        })
    });
    grp.bench_function("mutex_gate_blocking_recv", |b| {
        b.iter_custom(|iters| {
            pingpong(
                iters,
                &|| mg.try_admit(),
                &|| match mg.admit() {
                    MutexAdmission::Admitted(p) => p,
                    MutexAdmission::Queued(w) => w.wait().expect("handoff"),
                    MutexAdmission::Rejected => panic!("queue full"),
                },
                &|| mg.queued() > 0,
            )
        })
    });
    grp.finish();
}

/// Wall time for two threads to do `iters` admit + release pairs between
/// them (so time per iteration is the inverse of the throughput).
fn two_threads(iters: u64, op: &(dyn Fn() + Sync)) -> Duration {
    let start = Barrier::new(3);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                start.wait();
                for _ in 0..iters / 2 {
                    op();
                }
            });
        }
        start.wait();
        let t = Instant::now();
        // The scope joins both threads before returning.
        t
    })
    .elapsed()
}

fn contended(c: &mut Criterion) {
    let g = gate(1024, 16);
    let sem = Semaphore::new(1024);
    let mg = MutexGate::new(1024, 16);
    let mut grp = c.benchmark_group("admit_release/2_threads_contending");
    grp.bench_function("loadgate", |b| {
        b.iter_custom(|iters| two_threads(iters, &|| drop(black_box(g.try_admit()))))
    });
    grp.bench_function("tokio_semaphore", |b| {
        b.iter_custom(|iters| two_threads(iters, &|| drop(black_box(sem.try_acquire()))))
    });
    grp.bench_function("mutex_gate", |b| {
        b.iter_custom(|iters| two_threads(iters, &|| drop(black_box(mg.try_admit()))))
    });
    grp.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = direct, reject, handoff, blocking, contended
}
criterion_main!(benches);
