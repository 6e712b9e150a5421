//! Dispatch through a model's queue (docs/flow-control.md): a free worker
//! at once, a wait in the queue's order otherwise, dispatch the moment
//! capacity appears (a booking released, a report, a worker joining, new
//! thresholds), cancel by drop, deadlines, no workers, and the opt-out. The
//! futures are polled by hand on a manual clock; the monitor's own
//! maintenance thread sends what waits, and a test waits for a future's
//! outcome (never for time). A threaded test runs many at once.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use loadgate::flow::{FlowConfig, FlowRejection, FlowRequest};
use loadgate::monitor::{Dispatch, DispatchRequest, Dispatching, FlowControlConfig};
use loadgate::{Monitor, Policy};
use support::monitor_fixture::{decode, monitor, spec, used, M};

/// A waker that counts its wakes and unparks the test's thread.
struct Count {
    wakes: AtomicUsize,
    thread: std::thread::Thread,
}

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.thread.unpark();
    }
}

struct Polled {
    fut: Pin<Box<Dispatching>>,
    wakes: Arc<Count>,
}

impl Polled {
    fn poll(&mut self) -> Poll<Result<Dispatch, FlowRejection>> {
        let waker = Waker::from(self.wakes.clone());
        self.fut.as_mut().poll(&mut Context::from_waker(&waker))
    }

    fn pending(&mut self) {
        assert!(self.poll().is_pending(), "should wait");
    }

    /// The outcome, once the maintenance decided it: a future left
    /// without a wake for 30 s fails (a lost wakeup).
    fn outcome(&mut self) -> Result<Dispatch, FlowRejection> {
        loop {
            let seen = self.wakes.wakes.load(Ordering::SeqCst);
            if let Poll::Ready(outcome) = self.poll() {
                return outcome;
            }
            let since = std::time::Instant::now();
            while self.wakes.wakes.load(Ordering::SeqCst) == seen {
                assert!(
                    since.elapsed() < Duration::from_secs(30),
                    "a waiting dispatch was never woken"
                );
                std::thread::park_timeout(Duration::from_millis(100));
            }
        }
    }

    fn sent(&mut self) -> Dispatch {
        match self.outcome() {
            Ok(d) => d,
            Err(e) => panic!("expected a dispatch, got {e:?}"),
        }
    }

    fn refused(&mut self) -> FlowRejection {
        match self.outcome() {
            Err(e) => e,
            Ok(d) => panic!("expected a refusal, got {d:?}"),
        }
    }
}

fn request(tenant: &str, blocks: u64) -> DispatchRequest<'_> {
    DispatchRequest {
        flow: FlowRequest {
            prompt_tokens: 32,
            max_tokens: Some(16),
            ..FlowRequest::new(tenant)
        },
        blocks: Some(blocks),
        queue: true,
    }
}

fn start(m: &Monitor, r: &DispatchRequest<'_>) -> Polled {
    Polled {
        fut: Box::pin(m.dispatch(M, r)),
        wakes: Arc::new(Count {
            wakes: AtomicUsize::new(0),
            thread: std::thread::current(),
        }),
    }
}

/// One worker (id 1) of 100 KV blocks, busy above half of them, with flow
/// control on.
fn fleet(queue: FlowConfig) -> (Monitor, Arc<loadgate::ManualClock>) {
    let (m, clock) = monitor();
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.set_thresholds(M, &decode(0.5)).unwrap();
    let config = FlowControlConfig {
        queue,
        policy: Policy::RoundRobin,
    };
    m.set_flow_control(M, Some(&config)).unwrap();
    (m, clock)
}

fn blocks_on(m: &Monitor, worker: u64) -> u64 {
    m.rank_load(worker, 0).unwrap().active_decode_blocks
}

#[test]
fn a_free_worker_is_sent_at_once_and_booked() {
    let (m, _) = fleet(FlowConfig::new(8));
    let mut a = start(&m, &request("a", 10));
    let d = a.sent();
    assert_eq!(d.worker_id(), 1);
    assert_eq!(blocks_on(&m, 1), 10);
    assert_eq!(m.rank_load(1, 0).unwrap().active_prefill_tokens, Some(32));
    d.complete(16);
    assert_eq!(blocks_on(&m, 1), 0);
}

#[test]
fn a_dispatch_books_its_output_on_the_rank_it_names() {
    let (m, _) = monitor();
    // Ranks 4 and 5 of worker 2; rank 4 already holds a booking, so the
    // dispatch goes to the less loaded rank 5.
    let spec = loadgate::WorkerSpec {
        dp_start: 4,
        ..spec(2, 100)
    };
    m.add_worker(M, 2, spec).unwrap();
    let config = FlowControlConfig {
        queue: FlowConfig::new(8),
        policy: Policy::RoundRobin,
    };
    m.set_flow_control(M, Some(&config)).unwrap();
    let held = m.book(2, 4, 7).unwrap();
    let mut d = start(&m, &request("a", 3)).sent();
    assert_eq!(d.dp_rank(), 5);
    d.add_output_blocks(2);
    assert_eq!(m.rank_load(2, 5).unwrap().active_decode_blocks, 5);
    assert_eq!(m.rank_load(2, 4).unwrap().active_decode_blocks, 7);
    drop(d);
    assert_eq!(m.rank_load(2, 5).unwrap().active_decode_blocks, 0);
    drop(held);
}

#[test]
fn requests_wait_and_go_in_order_when_a_booking_is_released() {
    let (m, _) = fleet(FlowConfig::new(8));
    // 60 of 100 blocks: one request makes the worker busy.
    let first = start(&m, &request("a", 60)).sent();
    let mut b = start(&m, &request("b", 60));
    let mut c = start(&m, &request("c", 60));
    b.pending();
    c.pending();
    assert!(m.is_busy(1).unwrap());
    // Releasing the booking kicks the queue: the maintenance sends b, the
    // older, and c waits on.
    drop(first);
    let second = b.sent();
    assert_eq!(blocks_on(&m, 1), 60);
    m.maintain();
    c.pending();
    drop(second);
    drop(c.sent());
}

#[test]
fn a_report_that_frees_the_worker_dispatches_the_next() {
    let (m, _) = fleet(FlowConfig::new(8));
    m.report(1, 0, &used(90)).unwrap();
    let mut a = start(&m, &request("a", 1));
    a.pending();
    m.report(1, 0, &used(10)).unwrap();
    assert_eq!(a.sent().worker_id(), 1);
}

#[test]
fn a_finished_prefill_dispatches_the_next() {
    let (m, _) = fleet(FlowConfig::new(8));
    // Busy above 40 prefill tokens: one request's 32 plus the next's.
    let prefill = loadgate::ThresholdUpdate {
        active_prefill_tokens_threshold: Some(40),
        ..Default::default()
    };
    m.set_thresholds(M, &prefill).unwrap();
    let mut a = start(&m, &request("a", 1)).sent();
    let mut b = start(&m, &request("b", 1)).sent();
    let mut c = start(&m, &request("c", 1));
    c.pending();
    a.prefill_done();
    let _c = c.sent();
    b.prefill_done();
}

#[test]
fn a_joining_worker_and_new_thresholds_take_waiting_requests() {
    let (m, _) = fleet(FlowConfig::new(8));
    m.report(1, 0, &used(90)).unwrap();
    let mut a = start(&m, &request("a", 60));
    let mut b = start(&m, &request("b", 60));
    a.pending();
    b.pending();
    // Worker 2 joins and takes a (its 60 blocks make it busy too).
    m.add_worker(M, 2, spec(1, 100)).unwrap();
    let on_2 = a.sent();
    assert_eq!(on_2.worker_id(), 2);
    m.maintain();
    b.pending();
    // Both turn free under a higher threshold (90 and 60 of 100 blocks).
    m.set_thresholds(M, &decode(0.95)).unwrap();
    drop(b.sent());
}

#[test]
fn a_dropped_request_leaves_the_queue() {
    let (m, _) = fleet(FlowConfig::new(8));
    m.report(1, 0, &used(90)).unwrap();
    let mut a = start(&m, &request("a", 1));
    let mut b = start(&m, &request("b", 1));
    a.pending();
    b.pending();
    drop(b);
    m.maintain();
    a.pending();
    m.report(1, 0, &used(0)).unwrap();
    assert_eq!(a.sent().worker_id(), 1);
    // Nothing of b is left: a later request goes at once.
    let mut c = start(&m, &request("c", 1));
    drop(c.sent());
}

#[test]
fn a_request_waits_until_its_deadline() {
    let queue = FlowConfig {
        deadline: Duration::from_millis(100),
        ..FlowConfig::new(8)
    };
    let (m, clock) = fleet(queue);
    m.report(1, 0, &used(90)).unwrap();
    let mut a = start(&m, &request("a", 1));
    a.pending();
    assert_eq!(m.maintain(), Some(100_000_000), "due at its deadline");
    clock.advance(Duration::from_millis(99));
    m.maintain();
    a.pending();
    // The maintenance follows the clock: nobody calls it here.
    clock.advance(Duration::from_millis(1));
    assert_eq!(a.refused(), FlowRejection::QueueDeadline);
    assert_eq!(m.maintain(), None, "nothing left to do");
}

#[test]
fn the_last_worker_leaving_refuses_the_waiting_requests() {
    let (m, _) = fleet(FlowConfig::new(8));
    m.report(1, 0, &used(90)).unwrap();
    let mut a = start(&m, &request("a", 1));
    a.pending();
    m.remove_worker(1).unwrap();
    assert_eq!(a.refused(), FlowRejection::NoWorkers);
    assert_eq!(
        start(&m, &request("b", 1)).refused(),
        FlowRejection::NoWorkers
    );
}

#[test]
fn with_a_scale_up_limit_requests_wait_for_a_worker_to_join() {
    let queue = FlowConfig {
        scale_up_limit: 2,
        deadline: Duration::from_secs(30),
        ..FlowConfig::new(8)
    };
    let (m, clock) = fleet(queue);
    m.report(1, 0, &used(90)).unwrap();
    let mut a = start(&m, &request("a", 1));
    a.pending();
    // The last worker leaves: the waiting request stays.
    m.remove_worker(1).unwrap();
    a.pending();
    let mut b = start(&m, &request("b", 1));
    b.pending();
    // Two wait for scale-up: the third is refused, as is one that would
    // not wait.
    assert_eq!(
        start(&m, &request("c", 1)).refused(),
        FlowRejection::NoWorkers
    );
    let mut now = request("d", 1);
    now.queue = false;
    assert_eq!(start(&m, &now).refused(), FlowRejection::NoWorkers);
    // Their deadlines still hold.
    clock.advance(Duration::from_secs(10));
    m.maintain();
    a.pending();
    // A worker joins: both go to it, in order.
    m.add_worker(M, 7, spec(1, 100)).unwrap();
    let (da, db) = (a.sent(), b.sent());
    assert_eq!((da.worker_id(), db.worker_id()), (7, 7));
    // With a worker again, the queue's own limit applies.
    m.report(7, 0, &used(90)).unwrap();
    let mut waiting: Vec<_> = (0..8).map(|_| start(&m, &request("e", 1))).collect();
    for w in &mut waiting {
        w.pending();
    }
}

#[test]
fn a_scale_up_limit_is_at_most_the_queue_limit() {
    let (m, _) = monitor();
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    let config = FlowControlConfig {
        queue: FlowConfig {
            scale_up_limit: 9,
            ..FlowConfig::new(8)
        },
        policy: Policy::RoundRobin,
    };
    let e = m.set_flow_control(M, Some(&config)).unwrap_err();
    assert!(e.to_string().contains("scale_up_limit"), "{e}");
}

#[test]
fn an_opt_out_or_a_model_without_a_queue_is_refused_at_once() {
    let (m, _) = fleet(FlowConfig::new(8));
    let failures = |m: &Monitor| {
        let text = m.metrics_text();
        let line = text
            .lines()
            .find(|l| l.contains("failures_total{class=\"CapacityExhausted\",reason=\"capacity.pool_exhausted\"}"))
            .map(str::to_owned);
        line.and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    m.report(1, 0, &used(90)).unwrap();
    let never = DispatchRequest {
        queue: false,
        ..request("a", 1)
    };
    assert_eq!(start(&m, &never).refused(), FlowRejection::AllWorkersBusy);
    assert_eq!(failures(&m), 1, "counted as select counts");
    m.set_flow_control(M, None).unwrap();
    assert_eq!(
        start(&m, &request("a", 1)).refused(),
        FlowRejection::AllWorkersBusy
    );
    assert_eq!(failures(&m), 2, "without a queue too");
    m.report(1, 0, &used(0)).unwrap();
    assert_eq!(start(&m, &request("a", 1)).sent().worker_id(), 1);
}

#[test]
fn turning_the_queue_off_refuses_what_waits() {
    let (m, _) = fleet(FlowConfig::new(8));
    m.report(1, 0, &used(90)).unwrap();
    let mut a = start(&m, &request("a", 1));
    a.pending();
    m.set_flow_control(M, None).unwrap();
    assert_eq!(a.refused(), FlowRejection::QueueFull);
}

#[test]
fn a_full_queue_sheds_the_heavy_tenant_for_a_light_one() {
    let (m, _) = fleet(FlowConfig::new(2));
    m.report(1, 0, &used(90)).unwrap();
    let mut h1 = start(&m, &request("heavy", 1));
    let mut h2 = start(&m, &request("heavy", 1));
    h1.pending();
    h2.pending();
    let mut light = start(&m, &request("light", 1));
    light.pending();
    assert_eq!(h2.refused(), FlowRejection::QueueFull);
    m.report(1, 0, &used(0)).unwrap();
    // The worker frees: h1 (the older, same counters) goes first.
    drop(h1.sent());
    drop(light.sent());
}

#[test]
fn many_threads_dispatching_at_once_never_exceed_the_capacity() {
    // Two workers, each busy at one booking of 60 blocks: at most two
    // requests run; 8 threads × 50 requests all get through.
    let (m, _) = fleet(FlowConfig::new(64));
    m.add_worker(M, 2, spec(1, 100)).unwrap();
    let m = Arc::new(m);
    let running = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let (m, running) = (m.clone(), running.clone());
            std::thread::spawn(move || {
                let tenant = format!("t{i}");
                for _ in 0..50 {
                    let d = block_on(m.dispatch(M, &request(&tenant, 60))).unwrap();
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(now <= 2, "{now} running on two workers");
                    running.fetch_sub(1, Ordering::SeqCst);
                    d.complete(1);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(blocks_on(&m, 1) + blocks_on(&m, 2), 0);
}

/// Runs a future on this thread, parking between polls until it is woken;
/// a future left without a wake for 30 s fails (a lost wakeup).
fn block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark {
        thread: std::thread::Thread,
        woken: std::sync::atomic::AtomicBool,
    }
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.woken.store(true, Ordering::SeqCst);
            self.thread.unpark();
        }
    }
    let unpark = Arc::new(Unpark {
        thread: std::thread::current(),
        woken: false.into(),
    });
    let waker = Waker::from(unpark.clone());
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut Context::from_waker(&waker)) {
            return v;
        }
        let since = std::time::Instant::now();
        while !unpark.woken.swap(false, Ordering::SeqCst) {
            assert!(
                since.elapsed() < Duration::from_secs(30),
                "a waiting dispatch was never woken"
            );
            std::thread::park_timeout(Duration::from_millis(100));
        }
    }
}

#[test]
fn the_queue_is_counted_in_the_metrics() {
    let (m, clock) = fleet(FlowConfig::new(2));
    let first = start(&m, &request("a", 60)).sent();
    let mut b = start(&m, &request("b", 60));
    b.pending();
    let mut c = start(&m, &request("c", 60));
    c.pending();
    // Full: d, less important than everything waiting, is refused.
    let low = DispatchRequest {
        flow: FlowRequest {
            priority: 3,
            ..request("d", 60).flow
        },
        ..request("d", 60)
    };
    assert_eq!(start(&m, &low).refused(), FlowRejection::QueueFull);
    clock.advance(Duration::from_millis(30));
    drop(first);
    let second = b.sent();
    let text = m.metrics_text();
    for line in [
        "dynamo_frontend_queue_requests{model=\"llama\"} 1",
        "dynamo_frontend_queue_dispatched_total{model=\"llama\",path=\"direct\"} 1",
        "dynamo_frontend_queue_dispatched_total{model=\"llama\",path=\"queued\"} 1",
        "dynamo_frontend_queue_rejection_total{model=\"llama\",reason=\"queue_full\",priority=\"3\"} 1",
        "dynamo_frontend_queue_rejection_total{model=\"llama\",reason=\"queue_full\",priority=\"0\"} 0",
        "dynamo_frontend_queue_wait_seconds_bucket{model=\"llama\",le=\"0.025\"} 0",
        "dynamo_frontend_queue_wait_seconds_bucket{model=\"llama\",le=\"0.05\"} 1",
        "dynamo_frontend_queue_wait_seconds_count{model=\"llama\"} 1",
        "dynamo_frontend_queue_tenant_requests{model=\"llama\",tenant=\"c\"} 1",
        // Counted as `select` counts its refusals, too.
        "dynamo_frontend_failures_total{class=\"CapacityExhausted\",reason=\"capacity.pool_exhausted\"} 1",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    drop(second);
    drop(c.sent());
    // Many tenants: only the top ten are shown.
    for i in 0..30 {
        let t = format!("t{i}");
        drop(start(&m, &request(&t, 1)).sent());
    }
    let text = m.metrics_text();
    let shown = text
        .lines()
        .filter(|l| l.starts_with("dynamo_frontend_queue_tenant_service{"))
        .count();
    assert_eq!(shown, 10);
}

#[test]
fn a_worker_that_declared_no_ranks_takes_a_request_and_books_nothing() {
    // A worker with no ranks is never busy: a dispatch sends to it and has
    // nothing to book there.
    let (m, _) = monitor();
    m.add_worker(M, 1, spec(0, 100)).unwrap();
    let config = FlowControlConfig {
        queue: FlowConfig::new(8),
        policy: Policy::RoundRobin,
    };
    m.set_flow_control(M, Some(&config)).unwrap();
    let mut d = start(&m, &request("a", 5)).sent();
    assert_eq!((d.worker_id(), d.dp_rank()), (1, 0));
    d.add_output_blocks(3);
    d.prefill_done();
    d.complete(1);
    m.set_flow_control(M, None).unwrap();
    drop(start(&m, &request("a", 5)).sent());
}
