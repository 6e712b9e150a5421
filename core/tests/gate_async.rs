//! The gate's futures under tokio: waking, cancellation by drop, timeouts,
//! deadline expiry driven by a timer, and caps under many tasks.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loadgate::{AdmissionGate, AdmitError, GateConfig};

mod support;
use support::gates::gate;

/// Waits until `cond` holds, yielding to the runtime in between.
async fn until(cond: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("condition never held");
}

#[tokio::test]
async fn a_queued_task_is_woken_by_a_release() {
    let g = gate(1, 1);
    let p = g.admit_owned().await.unwrap();
    let g2 = g.clone();
    let task = tokio::spawn(async move { g2.admit_owned().await.map(drop) });
    until(|| g.queued() == 1).await;
    drop(p);
    task.await.unwrap().unwrap();
    assert_eq!(g.stats().admitted_queued, 1);
    assert_eq!(g.running(), 0);
}

#[tokio::test]
async fn dropping_a_queued_future_cancels_it() {
    let g = gate(1, 1);
    let p = g.admit().await.unwrap();
    let g2 = g.clone();
    let task = tokio::spawn(async move {
        let _p = g2.admit_owned().await;
        unreachable!("never granted");
    });
    until(|| g.queued() == 1).await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    let s = g.stats();
    assert_eq!((s.queued, s.cancelled, s.rejected_total()), (0, 1, 0));
    // The freed place takes a new waiter, which the release serves.
    let g3 = g.clone();
    let next = tokio::spawn(async move { g3.admit_owned().await.map(drop) });
    until(|| g.queued() == 1).await;
    drop(p);
    next.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_tokio_timeout_on_admit_cancels_cleanly() {
    let g = gate(1, 2);
    let _p = g.admit().await.unwrap();
    let r = tokio::time::timeout(Duration::from_millis(20), g.admit()).await;
    assert!(r.is_err(), "must time out while the slot is held");
    let s = g.stats();
    assert_eq!((s.queued, s.cancelled), (0, 1));
}

#[tokio::test]
async fn select_between_admit_and_shutdown() {
    let g = gate(1, 1);
    let _p = g.admit().await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tx.send(()).unwrap();
    tokio::select! {
        _ = g.admit() => panic!("slot is held"),
        _ = rx => {}
    }
    assert_eq!(g.queued(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_tasks_are_served_in_arrival_order() {
    let g = gate(1, 8);
    let p = g.admit_owned().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let g2 = g.clone();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let p = g2.admit_owned().await.unwrap();
            order.lock().unwrap().push(i);
            drop(p);
        }));
        // Each joins the queue before the next is spawned.
        until(|| g.queued() == i + 1).await;
    }
    drop(p);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..6).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_tasks_never_exceed_the_caps() {
    const N: u32 = 3;
    const Q: u32 = 5;
    let g = gate(N, Q);
    let running = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for t in 0..32u64 {
        let g = g.clone();
        let running = running.clone();
        tasks.push(tokio::spawn(async move {
            let mut ok = 0u32;
            for i in 0..200u64 {
                match g.admit_owned().await {
                    Ok(p) => {
                        let r = running.fetch_add(1, Ordering::SeqCst) + 1;
                        assert!(r <= N);
                        let s = g.stats();
                        assert!(s.running <= N && s.in_flight() <= N + Q, "{s:?}");
                        if (t + i) % 3 == 0 {
                            tokio::task::yield_now().await;
                        }
                        running.fetch_sub(1, Ordering::SeqCst);
                        drop(p);
                        ok += 1;
                    }
                    Err(e) => assert_eq!(e, AdmitError::AtCapacity),
                }
            }
            ok
        }));
    }
    let mut admitted = 0u64;
    for t in tasks {
        admitted += u64::from(t.await.unwrap());
    }
    let s = g.stats();
    assert_eq!((s.running, s.queued), (0, 0));
    assert_eq!(s.admitted_direct + s.admitted_queued, admitted);
    assert_eq!(admitted + s.rejected_at_capacity, 32 * 200);
}

#[tokio::test]
async fn a_timer_driven_by_next_deadline_expires_waiters() {
    let config = GateConfig::new(1)
        .with_queue(2)
        .with_queue_timeout(Some(Duration::from_millis(30)));
    let g = Arc::new(AdmissionGate::new(config).unwrap());
    let _p = g.admit_owned().await.unwrap();
    // The host's timer: sleep until the head's deadline, then expire.
    let ticker = {
        let g = g.clone();
        tokio::spawn(async move {
            while !g.is_closed() {
                match g.time_to_next_deadline() {
                    Some(wait) => {
                        tokio::time::sleep(wait).await;
                        g.expire();
                    }
                    None => tokio::time::sleep(Duration::from_millis(1)).await,
                }
            }
        })
    };
    let r = g.admit().await;
    assert_eq!(r.unwrap_err(), AdmitError::QueueTimeout);
    assert_eq!(g.stats().expired, 1);
    g.close();
    ticker.await.unwrap();
}

#[tokio::test]
async fn owned_permits_move_into_spawned_tasks() {
    let g = gate(2, 0);
    let p = g.admit_owned().await.unwrap();
    let h = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1)).await;
        p.release();
    });
    h.await.unwrap();
    assert_eq!(g.running(), 0);
}
