//! An SLO's say over the frontend queue (docs/behaviour.md, "SLO
//! admission"): a request that finds no worker free waits only if the
//! queue's measured drain predicts it is sent within its budget (the TTFT
//! target less the time from dispatch to first token seen); otherwise it
//! is refused at once, with the queue's predicted drain as its
//! `Retry-After`. Advisory, the same decisions are only counted. Routing
//! sends a request to the worker and rank with the most slack. On a manual
//! clock, with the host's maintenance.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use loadgate::flow::{FlowConfig, FlowRejection, FlowRequest};
use loadgate::monitor::{Dispatch, DispatchRequest, Dispatching, FlowControlConfig};
use loadgate::slo::Slo;
use loadgate::{
    LoadReport, Maintenance, ManualClock, Monitor, MonitorConfig, Policy, SloMode, WorkerSpec,
};
use support::slo_engine::{metric, BATCH};

const TTFT: f64 = 2.0;

/// `workers` workers of one rank on model "m" with an SLO of `TTFT` s and
/// 0.1 s in `mode`, and flow control (64 places, 60 s deadline) picking by
/// `policy`.
fn monitor(mode: SloMode, workers: u64, policy: Policy) -> (Monitor, std::sync::Arc<ManualClock>) {
    let clock = ManualClock::new();
    let config = MonitorConfig {
        maintenance: Maintenance::Manual,
        ..Default::default()
    };
    let m = Monitor::with_config(config, clock.clone()).unwrap();
    for id in 1..=workers {
        let spec = WorkerSpec {
            kv_total_blocks: Some(10_000),
            max_num_batched_tokens: Some(BATCH),
            ..Default::default()
        };
        m.add_worker("m", id, spec).unwrap();
    }
    let slo = Slo::from_secs(TTFT, 0.1).unwrap();
    m.set_slo("m", Some(slo), mode).unwrap();
    let flow = FlowControlConfig {
        queue: FlowConfig::new(64),
        policy,
    };
    m.set_flow_control("m", Some(&flow)).unwrap();
    (m, clock)
}

fn request() -> DispatchRequest<'static> {
    DispatchRequest::new(FlowRequest {
        prompt_tokens: 64,
        ..FlowRequest::new("")
    })
}

/// Polls a dispatch once: its outcome, or `None` while it waits.
fn poll(d: &mut Dispatching) -> Option<Result<Dispatch, FlowRejection>> {
    match Pin::new(d).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(outcome) => Some(outcome),
        Poll::Pending => None,
    }
}

/// The engine of worker `id` reports a request waiting for a seat: the
/// SLO holds the rank busy.
fn seat_wait(m: &Monitor, id: u64, waiting: u64) {
    let report = LoadReport {
        waiting_requests: Some(waiting),
        ..Default::default()
    };
    m.report(id, 0, &report).unwrap();
}

/// 101 requests of `priority` sent at once, 10 ms apart, with the
/// maintenance after each: those `ends` picks (by their order) released at
/// once, the others held, their prompts done, and returned. The queue
/// drains 101 in the second before now (the last sent); the bookings
/// that end after the maintenance's first sample are counted.
fn sent_over_a_second(
    m: &Monitor,
    clock: &ManualClock,
    priority: u8,
    ends: impl Fn(usize) -> bool,
) -> Vec<Dispatch> {
    let mut held = Vec::new();
    for i in 0..101 {
        if i > 0 {
            clock.advance(Duration::from_millis(10));
        }
        let request = DispatchRequest::new(FlowRequest {
            priority,
            ..request().flow
        });
        let mut d = m.dispatch("m", &request);
        let mut sent = poll(&mut d).expect("sent at once").expect("a free worker");
        if ends(i) {
            sent.complete(1);
        } else {
            sent.prefill_done();
            held.push(sent);
        }
        m.maintain();
    }
    held
}

/// The queue drains at a hundred a second, and as many bookings end.
fn drain_at_a_hundred_a_second(m: &Monitor, clock: &ManualClock, priority: u8) {
    sent_over_a_second(m, clock, priority, |_| true);
}

/// Requests whose first token comes 0.5 s after they are sent.
fn first_tokens_after_half_a_second(m: &Monitor, clock: &ManualClock) {
    for _ in 0..5 {
        let mut d = m.dispatch("m", &request());
        let mut d = poll(&mut d).expect("sent at once").expect("a free worker");
        clock.advance(Duration::from_millis(500));
        d.report_output(1);
    }
    m.maintain();
}

/// `n` requests dispatched now, each waiting or refused.
fn arrive(m: &Monitor, n: usize) -> Vec<Dispatching> {
    (0..n).map(|_| m.dispatch("m", &request())).collect()
}

// The numbers below: over a budget of 1 s the dispatches are 101 ± 10 a
// second and the bookings that ended 100 ± 10; taken two standard
// deviations low, the lesser is 80. A request with `k` ahead is predicted
// to wait (k + 1) / 80 s, and waits if twice that fits the budget: 40 may
// wait, the 41st may not.

#[test]
fn a_wait_predicted_past_the_budget_is_refused_at_once() {
    let (m, clock) = monitor(SloMode::Enforce, 1, Policy::RoundRobin);
    drain_at_a_hundred_a_second(&m, &clock, 0);
    seat_wait(&m, 1, 1);
    assert!(m.is_busy(1).unwrap(), "a seat wait holds the rank");
    // No first token seen yet: the budget is half the TTFT target, 1 s.
    let mut waiting = arrive(&m, 40);
    assert!(waiting.iter_mut().all(|d| poll(d).is_none()), "40 wait");
    // The 41st is refused now, not at a deadline.
    let mut late = m.dispatch("m", &request());
    let refused = poll(&mut late).expect("decided at once");
    assert_eq!(refused.unwrap_err(), FlowRejection::QueueDeadline);
    assert_eq!(m.slo_counts("m").unwrap().refused_late, 1);
    // Its Retry-After: the 40 waiting over the drain (100 a second),
    // rounded up to the second.
    assert_eq!(m.flow_retry_after("m"), Some(Duration::from_secs(1)));
    assert!(m
        .metrics_text()
        .contains("frontend_slo_refused_late_total{model=\"m\"} 1"));
    // The waiting ones' deadline is the budget, not the queue's 60 s.
    clock.advance(Duration::from_millis(999));
    m.maintain();
    assert!(waiting.iter_mut().all(|d| poll(d).is_none()), "in budget");
    clock.advance(Duration::from_millis(2));
    m.maintain();
    for d in &mut waiting {
        let outcome = poll(d).expect("refused at the budget");
        assert_eq!(outcome.unwrap_err(), FlowRejection::QueueDeadline);
    }
}

#[test]
fn a_drain_in_bursts_is_waited_for_through_its_pause() {
    let (m, clock) = monitor(SloMode::Enforce, 1, Policy::RoundRobin);
    // Bursts of 30 dispatches, 1.8 s apart, as when every rank holds long
    // answers and seats free together.
    for burst in 0..3 {
        if burst > 0 {
            clock.advance(Duration::from_millis(1800));
        }
        for _ in 0..30 {
            let mut d = m.dispatch("m", &request());
            poll(&mut d).expect("sent at once").unwrap().complete(1);
        }
    }
    seat_wait(&m, 1, 1);
    // Just after a burst, the second before holds 30 dispatches: by rate
    // alone, about 50 ms of wait. The pause ahead is 1.8 s, past the 1 s
    // budget: refused at once.
    let mut d = m.dispatch("m", &request());
    assert_eq!(
        poll(&mut d).expect("decided at once").unwrap_err(),
        FlowRejection::QueueDeadline
    );
    assert_eq!(m.slo_counts("m").unwrap().refused_late, 1);
}

#[test]
fn a_wait_is_predicted_by_the_rate_bookings_end_not_the_dispatches_while_ranks_were_free() {
    let (m, clock) = monitor(SloMode::Enforce, 1, Policy::RoundRobin);
    // The fleet filling: 101 sent at once over a second, as fast as the
    // queue would drain at a hundred a second, but only every other one
    // ends.
    let held = sent_over_a_second(&m, &clock, 0, |i| i % 2 == 0);
    seat_wait(&m, 1, 1);
    // By the dispatches 40 would wait (the tests above). Room frees at
    // 50 ± 7.1 a second (the first ended before the maintenance's first
    // sample), 35.9 taken low: 17 may wait, the 18th may not.
    let text = m.metrics_text();
    assert!(text.contains("frontend_slo_bookings_ended_per_second{model=\"m\"} 50\n"));
    let mut waiting = arrive(&m, 17);
    assert!(waiting.iter_mut().all(|d| poll(d).is_none()), "17 wait");
    let mut late = m.dispatch("m", &request());
    assert_eq!(
        poll(&mut late).expect("decided at once").unwrap_err(),
        FlowRejection::QueueDeadline
    );
    assert_eq!(m.slo_counts("m").unwrap().refused_late, 1);
    drop(held);
}

#[test]
fn the_ended_bookings_are_sampled_once_per_fit_period_however_often_the_maintenance_runs() {
    let (m, clock) = monitor(SloMode::Enforce, 1, Policy::RoundRobin);
    drain_at_a_hundred_a_second(&m, &clock, 0);
    let rate = |m: &Monitor| metric(m, "frontend_slo_bookings_ended_per_second{model=\"m\"}");
    let before = rate(&m);
    // Fifty more end at this instant, the maintenance kicked after each:
    // no walk over the ranks until a sampling period has passed.
    for _ in 0..50 {
        let mut d = m.dispatch("m", &request());
        poll(&mut d).expect("sent at once").unwrap().complete(1);
        m.maintain();
    }
    assert_eq!(rate(&m), before);
    clock.advance(loadgate::monitor::FIT_PERIOD);
    m.maintain();
    assert!(rate(&m) > before, "{} after {before}", rate(&m));
}

#[test]
fn before_two_bookings_end_only_a_request_with_none_ahead_waits() {
    let (m, clock) = monitor(SloMode::Enforce, 1, Policy::RoundRobin);
    // 101 sent over a second, none ended yet: the drain a wait will see
    // is not known.
    let held = sent_over_a_second(&m, &clock, 0, |_| false);
    seat_wait(&m, 1, 1);
    let mut first = m.dispatch("m", &request());
    assert!(poll(&mut first).is_none(), "none ahead: it waits");
    let mut second = m.dispatch("m", &request());
    assert_eq!(
        poll(&mut second).expect("decided at once").unwrap_err(),
        FlowRejection::QueueDeadline
    );
    assert_eq!(m.slo_counts("m").unwrap().refused_late, 1);
    drop(held);
}

#[test]
fn the_budget_is_the_target_less_the_first_tokens_seen() {
    let (m, clock) = monitor(SloMode::Enforce, 1, Policy::RoundRobin);
    // The budget is 2 - 0.5 = 1.5 s.
    first_tokens_after_half_a_second(&m, &clock);
    drain_at_a_hundred_a_second(&m, &clock, 0);
    seat_wait(&m, 1, 1);
    let mut waiting = m.dispatch("m", &request());
    assert!(poll(&mut waiting).is_none(), "it waits");
    // Past half the target (the budget before any first token), within
    // the learned budget: still waiting.
    clock.advance(Duration::from_millis(1400));
    m.maintain();
    assert!(poll(&mut waiting).is_none(), "still within its budget");
    // Capacity returns: it is sent.
    seat_wait(&m, 1, 0);
    m.maintain();
    assert!(poll(&mut waiting).expect("sent").is_ok());
}

#[test]
fn more_important_requests_taken_in_go_ahead_of_a_wait() {
    let (m, clock) = monitor(SloMode::Enforce, 1, Policy::RoundRobin);
    // Everything sent was of priority 0: band 0 is taken in as fast as
    // the queue drains.
    drain_at_a_hundred_a_second(&m, &clock, 0);
    seat_wait(&m, 1, 1);
    let less = DispatchRequest::new(FlowRequest {
        priority: 1,
        ..request().flow
    });
    let mut d = m.dispatch("m", &less);
    assert_eq!(
        poll(&mut d).expect("decided at once").unwrap_err(),
        FlowRejection::QueueDeadline,
        "band 0 takes the whole drain"
    );
    let mut d = m.dispatch("m", &request());
    assert!(poll(&mut d).is_none(), "band 0 itself may wait");
}

#[test]
fn advisory_counts_the_queue_decisions_and_refuses_none() {
    let (m, clock) = monitor(SloMode::Advisory, 1, Policy::RoundRobin);
    drain_at_a_hundred_a_second(&m, &clock, 0);
    // Advisory, the SLO marks nothing busy: a threshold does.
    let busy = loadgate::ThresholdUpdate {
        waiting_requests_threshold: Some(0),
        ..Default::default()
    };
    m.set_thresholds("m", &busy).unwrap();
    seat_wait(&m, 1, 1);
    assert!(m.is_busy(1).unwrap());
    let mut waiting = arrive(&m, 45);
    assert!(waiting.iter_mut().all(|d| poll(d).is_none()), "all wait");
    let counts = m.slo_counts("m").unwrap();
    assert_eq!(
        (counts.would_queue, counts.would_refuse, counts.refused_late),
        (40, 5, 0)
    );
    let text = m.metrics_text();
    assert!(text.contains("frontend_slo_would_queue_total{model=\"m\"} 40"));
}

#[test]
fn routing_sends_a_request_where_the_slo_sees_the_most_slack() {
    let (m, _clock) = monitor(SloMode::Enforce, 2, Policy::PowerOfTwo);
    seat_wait(&m, 1, 0);
    seat_wait(&m, 2, 0);
    // Worker 1 holds 200 blocks of context (2 % of its KV); worker 2 a
    // third of a step's prompt budget (682 tokens in 43 blocks). The load
    // score counts blocks; the SLO sees a third of a step ahead on 2.
    let _context = m.book_with_prefill(1, 0, 200, 0).unwrap();
    let _prompts = m.book_with_prefill(2, 0, 1, BATCH / 3).unwrap();
    // Power-of-two keeps the lower of two uniform picks (with
    // replacement): the favoured worker gets 3 in 4, about 300 of 400.
    let share_of = |m: &Monitor, worker: u64| {
        let sent = (0..400).filter(|_| {
            let mut d = m.dispatch("m", &request());
            let d = poll(&mut d).expect("at once").expect("a free worker");
            d.worker_id() == worker
        });
        sent.count()
    };
    let to_context = share_of(&m, 1);
    assert!(
        to_context > 240,
        "{to_context} of 400 where the SLO sees slack"
    );
    // Without an SLO, the load score decides, the other way.
    m.set_slo("m", None, SloMode::Enforce).unwrap();
    let to_prompts = share_of(&m, 2);
    assert!(to_prompts > 240, "{to_prompts} of 400 by the load score");
}
