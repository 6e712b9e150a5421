//! Differential test: random operation sequences run against the gate and
//! against a deliberately simple reference gate (a `VecDeque` per priority
//! class and counters, no atomics, no cleverness), with and without a wait
//! limit, with one class or several (own queue limits, deadlines and
//! reserved slots), admitting through futures, callbacks and the two-step
//! form (armed before or after the request is resolved). Outcomes, callback
//! firings, deadlines, stats and which held permits still wait for their
//! first response must be identical after every operation.

use std::time::Duration;

use loadgate::{ClassConfig, GateConfig};
use loadgate_testkit::gate_pair::GatePair;
use loadgate_testkit::reference_gate::Kind;
use proptest::prelude::*;

// ----- the driver ------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    AdmitFuture(u8),
    AdmitCallback(u8),
    AdmitPending(u8),
    Arm(usize),
    TryAdmit(u8),
    Release(usize),
    FirstResponse(usize),
    Cancel(usize),
    PollAll,
    Advance(u64),
    Expire,
    SetLimit(u32),
    Close,
}

/// A priority: mostly within the gate's classes, sometimes past them.
fn priority() -> impl Strategy<Value = u8> {
    prop_oneof![8 => 0u8..4, 1 => any::<u8>()]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => priority().prop_map(Op::AdmitFuture),
        4 => priority().prop_map(Op::AdmitCallback),
        3 => priority().prop_map(Op::AdmitPending),
        3 => any::<usize>().prop_map(Op::Arm),
        2 => priority().prop_map(Op::TryAdmit),
        6 => any::<usize>().prop_map(Op::Release),
        4 => any::<usize>().prop_map(Op::FirstResponse),
        3 => any::<usize>().prop_map(Op::Cancel),
        4 => Just(Op::PollAll),
        3 => prop_oneof![Just(5u64), Just(10), Just(20), 0u64..80].prop_map(Op::Advance),
        2 => Just(Op::Expire),
        2 => (1u32..6).prop_map(Op::SetLimit),
        1 => Just(Op::Close),
    ]
}

fn run(config: GateConfig, ops: &[Op]) {
    let shape = format!("{config:?}");
    let mut pair = GatePair::with_config(config);
    for (step, op) in ops.iter().enumerate() {
        let outcomes = match *op {
            Op::AdmitFuture(p) => Some(pair.admit(Kind::Future, p)),
            Op::AdmitCallback(p) => Some(pair.admit(Kind::Callback, p)),
            Op::AdmitPending(p) => Some(pair.admit(Kind::Pending, p)),
            Op::Arm(k) => pair.arm(k),
            Op::TryAdmit(p) => Some(pair.try_admit(p)),
            Op::Release(k) => pair.release(k),
            Op::FirstResponse(k) => pair.first_response(k),
            Op::Cancel(k) => pair.cancel(k),
            Op::PollAll => Some(pair.poll_all()),
            Op::Advance(ms) => Some(pair.advance(ms)),
            Op::Expire => Some(pair.expire()),
            Op::SetLimit(n) => Some(pair.set_limit(n)),
            Op::Close => Some(pair.close()),
        };
        // Nothing to release or cancel: the step does nothing.
        let Some((real, expected)) = outcomes else {
            continue;
        };
        let ctx = || format!("step {step} {op:?} ({shape})");
        assert_eq!(real, expected, "outcome, {}", ctx());
        pair.check(&ctx);
    }
    // Wind down: every waiter resolves, every slot comes back.
    pair.finish();
}

fn gate(
    limit: u32,
    queue: u32,
    wait: Option<u32>,
    timeout_ms: Option<u64>,
    lifo: bool,
) -> GateConfig {
    GateConfig::new(limit)
        .with_queue(queue)
        .with_wait_limit(wait)
        .with_queue_timeout(timeout_ms.map(Duration::from_millis))
        .with_adaptive_lifo(lifo)
}

/// Up to four classes, each with a queue limit within `queue`, its own
/// deadline or none, and a reservation within `limit`.
fn classes(limit: u32, queue: u32) -> impl Strategy<Value = Vec<ClassConfig>> {
    let class = (
        0..=queue,
        prop_oneof![Just(None), Just(Some(10u64)), (1u64..120).prop_map(Some)],
        0..=limit,
    )
        .prop_map(|(queue, timeout, reserved)| ClassConfig {
            queue,
            queue_timeout: timeout.map(Duration::from_millis),
            reserved,
        });
    proptest::collection::vec(class, 1..=4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn gate_matches_the_reference(
        limit in 1u32..4,
        queue in 0u32..5,
        timeout in prop_oneof![Just(None), Just(Some(10)), Just(Some(20)), Just(Some(50)), (1u64..120).prop_map(Some)],
        lifo in any::<bool>(),
        wait in prop_oneof![Just(None), (1u32..4).prop_map(Some)],
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run(gate(limit, queue, wait, timeout, lifo), &ops);
    }

    #[test]
    fn gate_with_classes_on_the_lock_free_queues_matches_the_reference(
        (limit, queue, classes) in (1u32..5, 0u32..6).prop_flat_map(|(n, q)| (Just(n), Just(q), classes(n, q))),
        ops in proptest::collection::vec(op(), 1..150),
    ) {
        // No adaptive LIFO, no wait limit: one lock-free queue per class.
        let mut config = gate(limit, queue, None, None, false);
        config.classes = classes;
        run(config, &ops);
    }

    #[test]
    fn gate_with_classes_matches_the_reference(
        (limit, queue, classes) in (1u32..5, 0u32..6).prop_flat_map(|(n, q)| (Just(n), Just(q), classes(n, q))),
        lifo in any::<bool>(),
        wait in prop_oneof![3 => Just(None), 1 => (1u32..4).prop_map(Some)],
        ops in proptest::collection::vec(op(), 1..150),
    ) {
        let mut config = gate(limit, queue, wait, None, lifo);
        config.classes = classes;
        run(config, &ops);
    }
}

#[test]
fn reference_scenario_with_every_operation() {
    use Op::*;
    let ops = [
        AdmitFuture(0),
        AdmitCallback(0),
        AdmitFuture(0),
        Advance(60),
        AdmitCallback(0),
        Advance(50),
        Expire,
        SetLimit(3),
        PollAll,
        Cancel(0),
        FirstResponse(0),
        Release(0),
        TryAdmit(0),
        AdmitFuture(0),
        AdmitFuture(0),
        SetLimit(1),
        Release(1),
        Release(0),
        PollAll,
        Close,
        AdmitFuture(0),
        PollAll,
    ];
    for lifo in [false, true] {
        run(gate(1, 2, None, Some(100), lifo), &ops);
        run(gate(2, 0, None, None, lifo), &ops);
        run(gate(2, 2, Some(1), Some(100), lifo), &ops);
        run(gate(3, 1, Some(2), None, lifo), &ops);
    }
}

#[test]
fn reference_scenario_with_classes() {
    use Op::*;
    // Three classes over N = 2, Q = 3: class 0 may use the reserved slot,
    // class 2 never queues.
    let config = GateConfig::new(2)
        .with_queue(3)
        .with_classes(3)
        .with_class(
            0,
            ClassConfig {
                queue: 3,
                queue_timeout: None,
                reserved: 1,
            },
        )
        .with_class(
            1,
            ClassConfig {
                queue: 3,
                queue_timeout: Some(Duration::from_millis(30)),
                reserved: 0,
            },
        )
        .with_class(
            2,
            ClassConfig {
                queue: 0,
                queue_timeout: None,
                reserved: 0,
            },
        );
    let ops = [
        AdmitFuture(1),   // direct: 1 of the 1 slot class 1 may use
        AdmitFuture(2),   // rejected: class 2's share is full and it never queues
        AdmitFuture(1),   // queued
        AdmitCallback(1), // queued
        AdmitFuture(0),   // direct: the reserved slot
        AdmitFuture(1),   // queued: the queue is now full
        AdmitFuture(0),   // displaces the newest class-1 waiter
        TryAdmit(0),      // would wait
        Release(0),       // hands the slot to the class-0 waiter
        PollAll,
        Advance(40),
        Expire, // the class-1 waiters time out
        PollAll,
        Release(0),
        Release(0),
        AdmitFuture(7), // past the last class: class 2, direct
        Close,
        PollAll,
    ];
    run(config, &ops);
}
