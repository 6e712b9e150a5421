//! Differential test: random operation sequences run against the gate and
//! against a deliberately simple reference gate (a `VecDeque` and counters,
//! no atomics, no cleverness), with and without a wait limit. Outcomes,
//! callback firings, deadlines, stats and which held permits still wait for
//! their first response must be identical after every operation.

use loadgate_testkit::gate_pair::GatePair;
use loadgate_testkit::reference_gate::Kind;
use proptest::prelude::*;

// ----- the driver ------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    AdmitFuture,
    AdmitCallback,
    TryAdmit,
    Release(usize),
    FirstResponse(usize),
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
        4 => any::<usize>().prop_map(Op::FirstResponse),
        3 => any::<usize>().prop_map(Op::Cancel),
        4 => Just(Op::PollAll),
        3 => prop_oneof![Just(5u64), Just(10), Just(20), 0u64..80].prop_map(Op::Advance),
        2 => Just(Op::Expire),
        2 => (1u32..6).prop_map(Op::SetLimit),
        1 => Just(Op::Close),
    ]
}

fn run(limit: u32, queue: u32, wait: Option<u32>, timeout_ms: Option<u64>, lifo: bool, ops: &[Op]) {
    let mut pair = GatePair::with_wait_limit(limit, queue, wait, timeout_ms, lifo);
    for (step, op) in ops.iter().enumerate() {
        let outcomes = match *op {
            Op::AdmitFuture => Some(pair.admit(Kind::Future)),
            Op::AdmitCallback => Some(pair.admit(Kind::Callback)),
            Op::TryAdmit => Some(pair.try_admit()),
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
        let ctx = || {
            format!(
                "step {step} {op:?} (N={limit} Q={queue} W={wait:?} T={timeout_ms:?} lifo={lifo})"
            )
        };
        assert_eq!(real, expected, "outcome, {}", ctx());
        pair.check(&ctx);
    }
    // Wind down: every waiter resolves, every slot comes back.
    pair.finish();
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
        run(limit, queue, wait, timeout, lifo, &ops);
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
        FirstResponse(0),
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
        run(1, 2, None, Some(100), lifo, &ops);
        run(2, 0, None, None, lifo, &ops);
        run(2, 2, Some(1), Some(100), lifo, &ops);
        run(3, 1, Some(2), None, lifo, &ops);
    }
}
