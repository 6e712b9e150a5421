//! The monitor's own maintenance (docs/flow-control.md, "Who dispatches"):
//! what waits is dispatched on the maintenance's thread, never on a thread
//! that reports load or inside another request's call; a burst of grants
//! runs no deeper on any stack than one; queue deadlines, staleness and
//! lease ends act with no call from the user, on the monitor's clock; the
//! thread ends with the monitor. Tests wait for conditions, never for time.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loadgate::flow::{FlowConfig, FlowRejection, FlowRequest};
use loadgate::monitor::{DispatchRequest, FlowControlConfig};
use loadgate::{Maintenance, Monitor, MonitorConfig, Policy, Staleness};
use support::monitor_fixture::{decode, monitor, spec, used, M};
use support::wait_for as wait_until;

fn request(blocks: u64) -> DispatchRequest<'static> {
    DispatchRequest {
        flow: FlowRequest {
            prompt_tokens: 0,
            max_tokens: Some(1),
            ..FlowRequest::new("t")
        },
        blocks: Some(blocks),
        queue: true,
    }
}

/// A callback that completes its dispatch and counts it, and the count.
fn counted() -> (Arc<AtomicUsize>, loadgate::monitor::DispatchCallback) {
    let sent = Arc::new(AtomicUsize::new(0));
    let s = sent.clone();
    let callback = Box::new(
        move |o: Result<loadgate::monitor::Dispatch, FlowRejection>| {
            drop(o.expect("sent"));
            s.fetch_add(1, Ordering::SeqCst);
        },
    );
    (sent, callback)
}

/// One worker of `kv` blocks busy above half of them, busy now (90 %
/// used), with a queue of `limit` requests.
fn busy_fleet(kv: u64, limit: u32) -> (Arc<Monitor>, Arc<loadgate::ManualClock>) {
    let (m, clock) = monitor();
    busy(&m, kv, limit);
    (Arc::new(m), clock)
}

/// Makes `m` one worker of `kv` blocks, busy as in [`busy_fleet`].
fn busy(m: &Monitor, kv: u64, limit: u32) {
    m.add_worker(M, 1, spec(1, kv)).unwrap();
    m.set_thresholds(M, &decode(0.5)).unwrap();
    let config = FlowControlConfig {
        queue: FlowConfig::new(limit),
        policy: Policy::RoundRobin,
    };
    m.set_flow_control(M, Some(&config)).unwrap();
    m.report(1, 0, &used(kv * 9 / 10)).unwrap();
}

fn thread_name() -> String {
    std::thread::current().name().unwrap_or("").to_owned()
}

#[test]
fn a_report_never_runs_a_waiting_requests_code() {
    let (m, _) = busy_fleet(100, 64);
    let ran_on: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut handles = Vec::new();
    for _ in 0..10 {
        let ran_on = ran_on.clone();
        handles.push(m.dispatch_with_callback(
            M,
            &request(0),
            Box::new(move |outcome| {
                assert!(outcome.is_ok());
                ran_on.lock().unwrap().push(thread_name());
            }),
        ));
    }
    assert!(handles.iter().all(|h| h.is_waiting()));
    assert!(ran_on.lock().unwrap().is_empty(), "no callback ran yet");
    let reporter = {
        let m = m.clone();
        std::thread::Builder::new()
            .name("reporter".into())
            .spawn(move || m.report(1, 0, &used(0)).unwrap())
            .unwrap()
    };
    reporter.join().unwrap();
    wait_until("every waiting request is sent", || {
        ran_on.lock().unwrap().len() == 10
    });
    for name in ran_on.lock().unwrap().iter() {
        assert_eq!(name, "loadgate-monitor", "a callback ran on {name:?}");
    }
}

/// Releases `n` waiting callback requests with `free`, called on a thread
/// with a 256 KiB stack; each callback completes its dispatch at once.
fn release_a_burst(n: u32, free: impl FnOnce(&Monitor) + Send + 'static) {
    let (m, _) = busy_fleet(u64::from(n) * 10, n);
    let done = Arc::new(AtomicUsize::new(0));
    let depth = Arc::new(AtomicUsize::new(0));
    let deepest = Arc::new(AtomicUsize::new(0));
    for _ in 0..n {
        let (done, depth, deepest) = (done.clone(), depth.clone(), deepest.clone());
        let handle = m.dispatch_with_callback(
            M,
            &request(1),
            Box::new(move |outcome| {
                let d = depth.fetch_add(1, Ordering::SeqCst) + 1;
                deepest.fetch_max(d, Ordering::SeqCst);
                drop(outcome.expect("sent"));
                depth.fetch_sub(1, Ordering::SeqCst);
                done.fetch_add(1, Ordering::SeqCst);
            }),
        );
        assert!(handle.is_waiting());
    }
    let freer = {
        let m = m.clone();
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || free(&m))
            .unwrap()
    };
    freer.join().expect("the freeing call returned");
    wait_until("every request is sent and completed", || {
        done.load(Ordering::SeqCst) == n as usize
    });
    assert_eq!(deepest.load(Ordering::SeqCst), 1, "no callback nested");
    assert_eq!(m.rank_load(1, 0).unwrap().active_decode_blocks, 0);
}

#[test]
fn twenty_thousand_waiting_requests_released_by_one_report() {
    release_a_burst(20_000, |m| m.report(1, 0, &used(0)).unwrap());
}

#[test]
fn twenty_thousand_waiting_requests_released_by_one_threshold_raise() {
    release_a_burst(20_000, |m| {
        m.set_thresholds(M, &decode(1.0)).unwrap();
    });
}

#[test]
fn a_queue_deadline_acts_when_the_clock_moves() {
    let (m, clock) = busy_fleet(100, 8);
    let refused: Arc<Mutex<Option<FlowRejection>>> = Arc::default();
    let r = refused.clone();
    let mut req = request(1);
    req.flow.deadline = Some(Duration::from_millis(50));
    let _handle = m.dispatch_with_callback(
        M,
        &req,
        Box::new(move |outcome| *r.lock().unwrap() = outcome.err()),
    );
    clock.advance(Duration::from_millis(50));
    wait_until("the request is refused at its deadline", || {
        refused.lock().unwrap().is_some()
    });
    assert_eq!(*refused.lock().unwrap(), Some(FlowRejection::QueueDeadline));
}

#[test]
fn a_queue_deadline_acts_on_real_time() {
    let m = Arc::new(Monitor::new());
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.set_thresholds(M, &decode(0.5)).unwrap();
    let config = FlowControlConfig {
        queue: FlowConfig::new(8),
        policy: Policy::RoundRobin,
    };
    m.set_flow_control(M, Some(&config)).unwrap();
    m.report(1, 0, &used(90)).unwrap();
    // The first waits a minute; the second's own deadline is earlier, and
    // the maintenance, asleep until the first's, wakes for it.
    let first = m.dispatch(M, &request(1));
    let mut req = request(1);
    req.flow.deadline = Some(Duration::from_millis(20));
    let e = m
        .dispatch_blocking(M, &req, Some(Duration::from_secs(30)))
        .unwrap_err();
    assert_eq!(e, FlowRejection::QueueDeadline);
    drop(first);
}

#[test]
fn staleness_acts_with_no_sweep_call() {
    let (m, clock) = monitor();
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.set_staleness(M, Staleness::Busy, Duration::from_secs(3))
        .unwrap();
    m.report(1, 0, &used(0)).unwrap();
    assert!(!m.is_busy(1).unwrap());
    clock.advance(Duration::from_secs(3));
    m.maintain();
    clock.advance(Duration::from_secs(3));
    wait_until("the silent worker counts as busy", || m.is_busy(1).unwrap());
    m.report(1, 0, &used(0)).unwrap();
    clock.advance(Duration::from_secs(1));
    wait_until("a report makes it fresh again", || !m.is_busy(1).unwrap());
}

#[test]
fn a_lease_that_ends_sends_what_waits() {
    let (m, clock) = monitor();
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    let config = FlowControlConfig {
        queue: FlowConfig::new(8),
        policy: Policy::RoundRobin,
    };
    m.set_flow_control(M, Some(&config)).unwrap();
    m.mark_overloaded(1).unwrap();
    let (sent, callback) = counted();
    let handle = m.dispatch_with_callback(M, &request(1), callback);
    assert!(handle.is_waiting(), "the only worker is under its lease");
    clock.advance(m.config().lease);
    wait_until("the request is sent when the lease ends", || {
        sent.load(Ordering::SeqCst) == 1
    });
}

#[test]
fn a_blocking_dispatch_times_out_and_leaves_the_queue() {
    let (m, _) = busy_fleet(100, 8);
    let e = m
        .dispatch_blocking(M, &request(1), Some(Duration::from_millis(1)))
        .unwrap_err();
    assert_eq!(e, FlowRejection::TimedOut);
    m.report(1, 0, &used(0)).unwrap();
    // Nothing of it is left: the worker holds no booking of its.
    m.maintain();
    assert_eq!(m.rank_load(1, 0).unwrap().active_decode_blocks, 0);
    let blocked = {
        let m = m.clone();
        std::thread::spawn(move || m.dispatch_blocking(M, &request(1), None))
    };
    let d = blocked.join().unwrap().expect("a free worker");
    assert_eq!(d.worker_id(), 1);
}

#[test]
fn a_blocking_dispatch_waits_for_the_report_that_frees_a_worker() {
    let (m, _) = busy_fleet(100, 8);
    let blocked = {
        let m = m.clone();
        std::thread::spawn(move || m.dispatch_blocking(M, &request(1), None))
    };
    wait_until("the request waits", || {
        m.metrics_text()
            .contains("dynamo_frontend_queue_requests{model=\"llama\"} 1")
    });
    m.report(1, 0, &used(0)).unwrap();
    assert_eq!(blocked.join().unwrap().unwrap().worker_id(), 1);
}

#[test]
fn a_cancelled_callback_is_never_called() {
    let (m, _) = busy_fleet(100, 8);
    let called = Arc::new(AtomicUsize::new(0));
    let c = called.clone();
    let handle = m.dispatch_with_callback(
        M,
        &request(1),
        Box::new(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
        }),
    );
    assert!(handle.cancel());
    assert!(!handle.is_waiting());
    assert!(!handle.cancel(), "once");
    // A later request is the only one sent.
    let (sent, callback) = counted();
    let _later = m.dispatch_with_callback(M, &request(1), callback);
    m.report(1, 0, &used(0)).unwrap();
    wait_until("the later request is sent", || {
        sent.load(Ordering::SeqCst) == 1
    });
    assert_eq!(called.load(Ordering::SeqCst), 0);
}

#[test]
fn with_manual_maintenance_nothing_moves_between_the_hosts_calls() {
    let config = MonitorConfig {
        maintenance: Maintenance::Manual,
        ..MonitorConfig::default()
    };
    let m = Monitor::with_config(config, loadgate::ManualClock::new()).unwrap();
    busy(&m, 100, 8);
    let (sent, callback) = counted();
    let handle = m.dispatch_with_callback(M, &request(1), callback);
    m.report(1, 0, &used(0)).unwrap();
    assert!(handle.is_waiting(), "no maintenance ran");
    assert_eq!(m.maintain(), None, "sent: nothing left to do");
    assert_eq!(sent.load(Ordering::SeqCst), 1, "sent on this thread");
}

#[test]
fn a_loop_that_sends_one_request_sees_its_booking_before_the_next() {
    // The release that frees the worker is still publishing on this thread
    // while the maintenance books the next request: the loop must count
    // that booking before it picks for the one after, or both are sent to
    // a worker with room for one.
    for _ in 0..300 {
        let (m, _) = monitor();
        m.add_worker(M, 1, spec(1, 100)).unwrap();
        m.set_thresholds(M, &decode(0.5)).unwrap();
        let config = FlowControlConfig {
            queue: FlowConfig::new(8),
            policy: Policy::RoundRobin,
        };
        m.set_flow_control(M, Some(&config)).unwrap();
        let first = m.dispatch_blocking(M, &request(60), None).unwrap();
        let sent = Arc::new(AtomicUsize::new(0));
        let held: Arc<Mutex<Vec<loadgate::monitor::Dispatch>>> = Arc::default();
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (sent, held) = (sent.clone(), held.clone());
                m.dispatch_with_callback(
                    M,
                    &request(60),
                    Box::new(move |o| {
                        held.lock().unwrap().push(o.unwrap());
                        sent.fetch_add(1, Ordering::SeqCst);
                    }),
                )
            })
            .collect();
        drop(first);
        wait_until("one waiting request is sent", || {
            sent.load(Ordering::SeqCst) >= 1
        });
        m.maintain();
        assert_eq!(sent.load(Ordering::SeqCst), 1, "two sent to room for one");
        assert!(handles.iter().filter(|h| h.is_waiting()).count() == 1);
        held.lock().unwrap().clear();
        wait_until("the other is sent", || sent.load(Ordering::SeqCst) == 2);
        held.lock().unwrap().clear();
    }
}

/// A callback that completes its dispatch and dispatches again, answered at
/// once each time: the next callback waits for the running one to return.
fn chain(
    m: Arc<Monitor>,
    left: Arc<AtomicUsize>,
    depth: Arc<AtomicUsize>,
    deepest: Arc<AtomicUsize>,
) {
    let m2 = m.clone();
    let handle = m.dispatch_with_callback(
        M,
        &request(1),
        Box::new(move |outcome| {
            let d = depth.fetch_add(1, Ordering::SeqCst) + 1;
            deepest.fetch_max(d, Ordering::SeqCst);
            drop(outcome.expect("a free worker"));
            if left.fetch_sub(1, Ordering::SeqCst) > 1 {
                chain(m2, left, depth.clone(), deepest);
            }
            depth.fetch_sub(1, Ordering::SeqCst);
        }),
    );
    assert!(!handle.is_waiting());
}

#[test]
fn callbacks_that_dispatch_again_never_nest() {
    let (m, _) = monitor();
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.set_thresholds(M, &decode(0.5)).unwrap();
    let m = Arc::new(m);
    let left = Arc::new(AtomicUsize::new(20_000));
    let (depth, deepest) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let runner = {
        let (m, left, depth, deepest) = (m.clone(), left.clone(), depth.clone(), deepest.clone());
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || chain(m, left, depth, deepest))
            .unwrap()
    };
    runner.join().expect("no stack overflow");
    assert_eq!(left.load(Ordering::SeqCst), 0, "every link ran");
    assert_eq!(deepest.load(Ordering::SeqCst), 1, "none nested");
    assert_eq!(m.rank_load(1, 0).unwrap().active_decode_blocks, 0);
}
