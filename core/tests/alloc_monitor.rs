//! Proves the monitor's hot paths allocate nothing, and neither does
//! dispatch through a model's queue (sent at once, queued, sent on a
//! release, cancelled, completed) once its tenants are known: a counting
//! global allocator (`loadgate-testkit`) in its own test binary, counting
//! only the measuring thread.

use loadgate::{
    LoadReport, ManualClock, Monitor, MonitorConfig, Policy, ThresholdUpdate, WorkerSpec,
};
use loadgate_testkit::alloc::{allocations, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

#[test]
fn hot_paths_allocate_nothing() {
    let m = Monitor::with_config(MonitorConfig::default(), ManualClock::new()).unwrap();
    for id in 0..200 {
        let spec = WorkerSpec {
            dp_size: 2,
            kv_total_blocks: Some(100),
            ..Default::default()
        };
        m.add_worker("m", id, spec).unwrap();
    }
    let decode = ThresholdUpdate {
        active_decode_blocks_threshold: Some(0.5),
        ..Default::default()
    };
    m.set_thresholds("m", &decode).unwrap();
    let low = LoadReport {
        kv_used_blocks: Some(10),
        ..Default::default()
    };
    let high = LoadReport {
        kv_used_blocks: Some(90),
        active_prefill_tokens: Some(5),
        ..Default::default()
    };
    for id in 0..100 {
        m.report(id, 0, &high).unwrap();
        m.report(id, 1, &high).unwrap();
    }
    // Warm up: the first registry load on a thread may allocate its slot,
    // and the first rejection on an endpoint adds its counter.
    m.select("m", Policy::RoundRobin).unwrap();
    let busy_only = Monitor::with_config(MonitorConfig::default(), ManualClock::new()).unwrap();
    busy_only
        .add_worker(
            "b",
            1,
            WorkerSpec {
                kv_total_blocks: Some(10),
                ..Default::default()
            },
        )
        .unwrap();
    busy_only.set_thresholds("b", &decode).unwrap();
    busy_only.report(1, 0, &high).unwrap();
    let _ = busy_only.select("b", Policy::RoundRobin);
    let _ = busy_only.check(1);

    let route = m.route("m").unwrap();
    let busy_route = busy_only.route("b").unwrap();
    let costs: Vec<(u64, f64)> = (0..64).map(|i| (i * 3, i as f64)).collect();
    let (n, ()) = allocations(|| {
        for round in 0..1000u64 {
            let id = 100 + round % 100;
            m.report(id, 0, &low).unwrap(); // no busy change
            m.report(5, 1, &low).unwrap(); // busy flip: busy -> free
            m.report(5, 1, &high).unwrap(); // busy flip: free -> busy
            assert!(m.is_busy(5).unwrap());
            for policy in [Policy::RoundRobin, Policy::Random, Policy::PowerOfTwo] {
                let picked = m.select("m", policy).unwrap();
                assert!(picked >= 100);
                assert!(route.select(policy).unwrap() >= 100);
            }
            m.select_min_cost("m", costs.iter().copied()).unwrap();
            m.check(id).unwrap();
            let mut booking = m.book(id, 0, 3).unwrap();
            booking.add_output_blocks(2);
            drop(booking);
            // Rejections: Overloaded and WorkerOverloaded.
            assert!(busy_only.select("b", Policy::RoundRobin).is_err());
            assert!(busy_route.select(Policy::PowerOfTwo).is_err());
            assert!(busy_only.check(1).is_err());
        }
    });
    assert_eq!(n, 0, "hot paths allocated {n} times");
}

/// A request of tenant `t` booking 60 of a worker's 100 blocks.
fn heavy(t: &str) -> loadgate::monitor::DispatchRequest<'_> {
    loadgate::monitor::DispatchRequest {
        flow: loadgate::flow::FlowRequest {
            prompt_tokens: 100,
            max_tokens: Some(50),
            ..loadgate::flow::FlowRequest::new(t)
        },
        blocks: Some(60),
        queue: true,
    }
}

#[test]
fn dispatch_queue_and_cancel_allocate_nothing_in_steady_state() {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }
    // The host's maintenance, so that every step runs on this thread.
    let config = MonitorConfig {
        maintenance: loadgate::Maintenance::Manual,
        ..MonitorConfig::default()
    };
    let m = Monitor::with_config(config, ManualClock::new()).unwrap();
    let spec = WorkerSpec {
        kv_total_blocks: Some(100),
        ..Default::default()
    };
    m.add_worker("m", 1, spec).unwrap();
    let decode = ThresholdUpdate {
        active_decode_blocks_threshold: Some(0.5),
        ..Default::default()
    };
    m.set_thresholds("m", &decode).unwrap();
    let flow = loadgate::monitor::FlowControlConfig {
        queue: loadgate::flow::FlowConfig::new(16),
        policy: Policy::RoundRobin,
    };
    m.set_flow_control("m", Some(&flow)).unwrap();
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    // One round: a direct dispatch that fills the worker, two requests that
    // queue, the first's release sending the second, a cancel of the third,
    // output reported and everything completed.
    let mut round = || {
        let first = match pin!(m.dispatch("m", &heavy("a"))).poll(&mut cx) {
            Poll::Ready(Ok(d)) => d,
            other => panic!("{:?}", other.map(|r| r.err())),
        };
        let mut second = pin!(m.dispatch("m", &heavy("b")));
        assert!(second.as_mut().poll(&mut cx).is_pending());
        let mut sent = {
            let mut third = pin!(m.dispatch("m", &heavy("c")));
            assert!(third.as_mut().poll(&mut cx).is_pending());
            first.complete(50);
            m.maintain();
            match second.as_mut().poll(&mut cx) {
                Poll::Ready(Ok(d)) => d,
                other => panic!("{:?}", other.map(|r| r.err())),
            }
            // The third leaves the queue here, cancelled.
        };
        sent.prefill_done();
        sent.report_output(20);
        sent.complete(40);
    };
    // Warm up: tenants named, tickets and thread-locals made.
    for _ in 0..4 {
        round();
    }
    let (n, ()) = allocations(|| {
        for _ in 0..1000 {
            round();
        }
    });
    assert_eq!(n, 0, "{n} allocations in 1000 rounds");
}

#[test]
fn announced_bookings_allocate_nothing() {
    use loadgate::cluster::{BookingAnnouncer, InProcessBus};
    use std::sync::Arc;
    let m = Arc::new(Monitor::with_config(MonitorConfig::default(), ManualClock::new()).unwrap());
    let spec = WorkerSpec {
        kv_total_blocks: Some(100),
        ..Default::default()
    };
    m.add_worker("m", 1, spec).unwrap();
    let kv = "namespace.dynamo.component.backend.endpoint.generate.kv_metrics";
    let announcer = BookingAnnouncer::new(m.clone(), kv).unwrap();
    drop(m.book(1, 0, 1).unwrap()); // the thread's first registry load
    let (n, ()) = allocations(|| {
        for _ in 0..1000 {
            let mut booking = m.book_with_prefill(1, 0, 3, 10).unwrap();
            booking.prefill_done();
            drop(booking);
        }
    });
    assert_eq!(n, 0, "announced bookings allocated {n} times");
    assert_eq!(announcer.flush(&InProcessBus::new()), 3002);
}

#[test]
fn observed_streams_allocate_nothing() {
    use std::time::Duration;
    let clock = ManualClock::new();
    let m = Monitor::with_config(MonitorConfig::default(), clock.clone()).unwrap();
    let spec = WorkerSpec {
        kv_total_blocks: Some(100),
        ..Default::default()
    };
    m.add_worker("m", 1, spec).unwrap();
    m.set_slo(
        "m",
        Some(loadgate::slo::Slo::from_secs(2.0, 0.1).unwrap()),
        loadgate::SloMode::Enforce,
    )
    .unwrap();
    drop(m.book(1, 0, 1).unwrap()); // the thread's first registry load
    let (n, ()) = allocations(|| {
        for _ in 0..1000 {
            let mut booking = m.book_with_prefill(1, 0, 3, 10).unwrap();
            booking.expect_output(Some(100));
            clock.advance(Duration::from_millis(20));
            booking.first_token();
            clock.advance(Duration::from_millis(5));
            booking.tokens(40);
            booking.finish(None);
        }
    });
    assert_eq!(n, 0, "observed streams allocated {n} times");
}
