//! A worker's refusal handed back to the monitor (`Monitor::redispatch`,
//! docs/flow-control.md): without flow control the request is routed once
//! more to another free worker, at most `MonitorConfig::reroutes` times,
//! with the refusing worker under its lease; with flow control it goes back
//! into its queue at its original place with its original deadline. On a
//! manual clock with the host's maintenance, so every outcome is decided
//! by the calls the test makes.

mod support;

use std::task::Poll;
use std::time::Duration;

use loadgate::flow::{FlowConfig, FlowRejection, FlowRequest};
use loadgate::monitor::{Dispatch, DispatchRequest, Dispatching, FlowControlConfig};
use loadgate::{Maintenance, ManualClock, Monitor, MonitorConfig, Policy};
use support::monitor_fixture::{decode, spec, used, M};
use support::polling::poll;

fn fleet(workers: u64, reroutes: u32) -> (Monitor, std::sync::Arc<ManualClock>) {
    let clock = ManualClock::new();
    let config = MonitorConfig {
        maintenance: Maintenance::Manual,
        reroutes,
        ..MonitorConfig::default()
    };
    let m = Monitor::with_config(config, clock.clone()).unwrap();
    for w in 1..=workers {
        m.add_worker(M, w, spec(1, 100)).unwrap();
    }
    // Busy above 50 of 100 blocks: one request of 60 fills a worker.
    m.set_thresholds(M, &decode(0.5)).unwrap();
    (m, clock)
}

fn request(tenant: &str, blocks: u64) -> DispatchRequest<'_> {
    DispatchRequest {
        flow: FlowRequest {
            prompt_tokens: 16,
            deadline: Some(Duration::from_secs(1)),
            ..FlowRequest::new(tenant)
        },
        blocks: Some(blocks),
        queue: true,
    }
}

fn ready(f: &mut Dispatching) -> Result<Dispatch, FlowRejection> {
    match poll(f) {
        Poll::Ready(outcome) => outcome,
        Poll::Pending => panic!("expected an outcome, the request waits"),
    }
}

fn booked(m: &Monitor, worker: u64) -> u64 {
    m.rank_load(worker, 0).unwrap().active_decode_blocks
}

#[test]
fn without_a_queue_a_refused_request_goes_to_another_worker_once() {
    let (m, _) = fleet(3, 1);
    let first = ready(&mut m.dispatch(M, &request("", 10))).unwrap();
    let refuser = first.worker_id();
    let second = ready(&mut m.redispatch(first)).unwrap();
    assert_ne!(second.worker_id(), refuser, "routed back to the refuser");
    assert!(m.is_leased(refuser).unwrap(), "the refuser is not leased");
    assert_eq!(booked(&m, refuser), 0, "the refuser keeps the booking");
    assert_eq!(booked(&m, second.worker_id()), 10);
    // One reroute in its life: the second refusal is the client's 529.
    let other = second.worker_id();
    let third = m.redispatch(second);
    assert_eq!(
        ready(&mut { third }).unwrap_err(),
        FlowRejection::AllWorkersBusy
    );
    assert!(m.is_leased(other).unwrap());
    assert_eq!((1..=3).map(|w| booked(&m, w)).sum::<u64>(), 0);
}

#[test]
fn with_no_reroutes_a_refusal_is_answered_at_once() {
    let (m, _) = fleet(2, 0);
    let first = ready(&mut m.dispatch(M, &request("", 10))).unwrap();
    let refuser = first.worker_id();
    let again = ready(&mut m.redispatch(first)).unwrap_err();
    assert_eq!(again, FlowRejection::AllWorkersBusy);
    assert!(m.is_leased(refuser).unwrap());
    assert_eq!(booked(&m, 1) + booked(&m, 2), 0);
}

#[test]
fn without_a_free_worker_a_refusal_is_refused() {
    let (m, _) = fleet(2, 1);
    m.report(2, 0, &used(90)).unwrap();
    let first = ready(&mut m.dispatch(M, &request("", 10))).unwrap();
    assert_eq!(first.worker_id(), 1);
    let again = ready(&mut m.redispatch(first)).unwrap_err();
    assert_eq!(again, FlowRejection::AllWorkersBusy);
    assert_eq!(booked(&m, 1), 0);
}

#[test]
fn the_configured_policy_routes_the_first_try_and_the_reroute() {
    let clock = ManualClock::new();
    let config = MonitorConfig {
        maintenance: Maintenance::Manual,
        routing: Policy::PowerOfTwo,
        ..MonitorConfig::default()
    };
    let m = Monitor::with_config(config, clock).unwrap();
    for w in 1..=2 {
        m.add_worker(M, w, spec(1, 100)).unwrap();
    }
    // Power of two keeps the emptier worker of its two draws: three times
    // in four, where round-robin would alternate. The seed makes the
    // draws repeat.
    loadgate::monitor::seed_picks(7);
    m.report(1, 0, &used(40)).unwrap();
    let mut emptier = 0;
    for _ in 0..200 {
        let d = ready(&mut m.dispatch(M, &request("", 1))).unwrap();
        emptier += u32::from(d.worker_id() == 2);
        d.complete(0);
    }
    assert!(emptier > 120, "{emptier} of 200 to the emptier worker");
    let picks = |seed| {
        loadgate::monitor::seed_picks(seed);
        (0..50)
            .map(|_| {
                ready(&mut m.dispatch(M, &request("", 1)))
                    .unwrap()
                    .worker_id()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(picks(11), picks(11), "a seed repeats its picks");
}

fn queued_fleet() -> (Monitor, std::sync::Arc<ManualClock>) {
    let (m, clock) = fleet(1, 1);
    let flow = FlowControlConfig {
        queue: FlowConfig::new(8),
        policy: Policy::RoundRobin,
    };
    m.set_flow_control(M, Some(&flow)).unwrap();
    (m, clock)
}

#[test]
fn with_a_queue_a_refused_request_goes_back_to_its_place() {
    let (m, _) = queued_fleet();
    let sent = ready(&mut m.dispatch(M, &request("a", 60))).unwrap();
    // Two later requests of its tenant, one of another: all wait.
    let mut later: Vec<Dispatching> = ["a", "a", "b"]
        .into_iter()
        .map(|t| m.dispatch(M, &request(t, 60)))
        .collect();
    for f in &mut later {
        assert!(poll(f).is_pending());
    }
    let mut back = m.redispatch(sent);
    assert!(poll(&mut back).is_pending(), "sent back while leased");
    assert_eq!(booked(&m, 1), 0);
    // The worker's next report ends its lease and kicks the queue: the
    // refused request goes first, ahead of its tenant's later ones.
    m.report(1, 0, &used(0)).unwrap();
    m.maintain();
    let again = ready(&mut back).unwrap();
    assert_eq!(again.worker_id(), 1);
    for f in &mut later {
        assert!(poll(f).is_pending(), "a later request overtook it");
    }
    assert_eq!(booked(&m, 1), 60);
    drop(again);
    m.maintain();
    assert!(ready(&mut later[0]).is_ok(), "the tenant's next is next");
}

#[test]
fn with_a_queue_a_refused_request_keeps_its_deadline() {
    let (m, clock) = queued_fleet();
    let sent = ready(&mut m.dispatch(M, &request("a", 60))).unwrap();
    clock.advance(Duration::from_millis(600));
    let mut back = m.redispatch(sent);
    assert!(poll(&mut back).is_pending());
    // 400 ms of its 1 s were left.
    clock.advance(Duration::from_millis(399));
    m.maintain();
    assert!(poll(&mut back).is_pending(), "expired early");
    clock.advance(Duration::from_millis(1));
    m.maintain();
    assert_eq!(ready(&mut back).unwrap_err(), FlowRejection::QueueDeadline);
}

#[test]
fn a_refusal_after_the_deadline_is_answered_at_once() {
    let (m, clock) = queued_fleet();
    let sent = ready(&mut m.dispatch(M, &request("a", 60))).unwrap();
    clock.advance(Duration::from_secs(2));
    let refused = ready(&mut m.redispatch(sent)).unwrap_err();
    assert_eq!(refused, FlowRejection::QueueDeadline);
    assert_eq!(booked(&m, 1), 0);
}

#[test]
fn a_refusal_on_a_closed_queue_is_refused() {
    let (m, _) = queued_fleet();
    let sent = ready(&mut m.dispatch(M, &request("a", 60))).unwrap();
    m.set_flow_control(M, None).unwrap();
    // Turned off: refused as the requests that waited were.
    let refused = ready(&mut m.redispatch(sent)).unwrap_err();
    assert_eq!(refused, FlowRejection::QueueFull);
}

#[test]
fn the_callback_form_hands_back_too() {
    let (m, _) = fleet(2, 1);
    let first = ready(&mut m.dispatch(M, &request("", 10))).unwrap();
    let refuser = first.worker_id();
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = m.redispatch_with_callback(
        first,
        Box::new(move |outcome| tx.send(outcome.map(|d| d.worker_id())).unwrap()),
    );
    assert!(!handle.is_waiting());
    let worker = rx.try_recv().expect("decided at once").unwrap();
    assert_ne!(worker, refuser);
}

#[test]
fn another_monitors_dispatch_is_refused_not_routed() {
    let (a, _) = fleet(2, 1);
    let (b, _) = fleet(2, 1);
    let d = ready(&mut a.dispatch(M, &request("", 10))).unwrap();
    let worker = d.worker_id();
    let refused = ready(&mut b.redispatch(d)).unwrap_err();
    assert_eq!(refused, FlowRejection::NoWorkers);
    assert!(!b.is_leased(worker).unwrap(), "b leased a worker of a's");
    assert_eq!(booked(&a, worker), 0, "the dispatch was not completed");
}
