//! The frontend queue against testkit's plain reference
//! (`loadgate_testkit::reference_flow`): random operation sequences (push
//! with random tenants, priorities, sizes and deadlines; pop; direct
//! dispatch; output reports; settles; cancels; time passing) on both, every
//! outcome, every shed and expired request, the length, the tokens and
//! every tenant's counter compared after each step.

use std::time::Duration;

use proptest::prelude::*;

use loadgate::flow::{
    FlowConfig, FlowQueue, FlowRequest, QueueKey, Reservation, MAX_BANDS, MAX_SHED,
};
use loadgate_testkit::reference_flow::{RefConfig, RefReservation, ReferenceFlow};

const TENANTS: [&str; 4] = ["a", "b", "c", "d"];

#[derive(Debug, Clone)]
enum Op {
    Push {
        tenant: usize,
        priority: u8,
        prompt: u64,
        max_tokens: Option<u64>,
        deadline_ms: Option<u64>,
    },
    Pop,
    Direct {
        tenant: usize,
        prompt: u64,
    },
    Report {
        pick: usize,
        tokens: u64,
    },
    Settle {
        pick: usize,
        tokens: u64,
    },
    Cancel {
        pick: usize,
    },
    Advance {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..4usize, 0..10u8, 0..300u64, prop::option::of(0..300u64), prop::option::of(1..200u64))
            .prop_map(|(tenant, priority, prompt, max_tokens, deadline_ms)| Op::Push {
                tenant, priority, prompt, max_tokens, deadline_ms
            }),
        3 => Just(Op::Pop),
        1 => (0..4usize, 0..300u64).prop_map(|(tenant, prompt)| Op::Direct { tenant, prompt }),
        2 => (any::<usize>(), 0..100u64).prop_map(|(pick, tokens)| Op::Report { pick, tokens }),
        2 => (any::<usize>(), 0..400u64).prop_map(|(pick, tokens)| Op::Settle { pick, tokens }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        1 => (1..100u64).prop_map(|ms| Op::Advance { ms }),
    ]
}

fn config() -> impl Strategy<Value = (u32, Option<u64>, f64, f64)> {
    (
        1..8u32,
        prop::option::of(100..1500u64),
        0.5f64..2.0,
        0.5f64..4.0,
    )
}

const MS: u64 = 1_000_000;

fn run(limit: u32, tokens: Option<u64>, wp: f64, wq: f64, ops: &[Op]) -> Result<(), TestCaseError> {
    let weights = vec![("a".to_owned(), 2.0), ("c".to_owned(), 0.5)];
    let flow = FlowConfig {
        queue_tokens: tokens,
        deadline: Duration::from_millis(150),
        prompt_weight: wp,
        output_weight: wq,
        tenant_weights: weights.clone(),
        ..FlowConfig::new(limit)
    };
    let mut q: FlowQueue<u32> = FlowQueue::new(&flow).unwrap();
    let mut r = ReferenceFlow::new(RefConfig {
        limit: limit as usize,
        token_limit: tokens.map(u128::from),
        deadline: 150 * MS,
        wp,
        wq,
        estimate: flow.output_estimate,
        max_shed: MAX_SHED,
        bands: MAX_BANDS,
        weights,
    });
    let mut now = 0u64;
    let mut next_id = 0u32;
    let mut keys: Vec<(u32, QueueKey)> = Vec::new();
    let mut running: Vec<(Reservation, RefReservation)> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let ctx = || format!("step {step}: {op:?}");
        match *op {
            Op::Push {
                tenant,
                priority,
                prompt,
                max_tokens,
                deadline_ms,
            } => {
                let id = next_id;
                next_id += 1;
                let req = FlowRequest {
                    tenant: TENANTS[tenant],
                    priority,
                    prompt_tokens: prompt,
                    max_tokens,
                    deadline: deadline_ms.map(Duration::from_millis),
                };
                let mut shed = Vec::new();
                let got = q.push(&req, id, now, |v| shed.push(v));
                let want = r.push(
                    id,
                    TENANTS[tenant],
                    priority,
                    prompt,
                    max_tokens,
                    deadline_ms.map(|d| d * MS),
                    now,
                );
                match (got, want) {
                    (Ok(key), Some(mut want_shed)) => {
                        shed.sort_unstable();
                        want_shed.sort_unstable();
                        prop_assert_eq!(&shed, &want_shed, "shed, {}", ctx());
                        keys.retain(|(i, _)| !shed.contains(i));
                        keys.push((id, key));
                    }
                    (Err((_, v)), None) => prop_assert_eq!(v, id),
                    (got, want) => prop_assert!(
                        false,
                        "push: {:?} vs {:?}, {}",
                        got.map(|_| ()),
                        want,
                        ctx()
                    ),
                }
            }
            Op::Pop => {
                let got = q.pop(now);
                let want = r.pop();
                prop_assert_eq!(
                    got.as_ref().map(|g| g.0),
                    want.as_ref().map(|w| w.0),
                    "pop, {}",
                    ctx()
                );
                if let (Some((id, g)), Some((_, w))) = (got, want) {
                    keys.retain(|(i, _)| *i != id);
                    running.push((g, w));
                }
            }
            Op::Direct { tenant, prompt } => {
                let req = FlowRequest {
                    prompt_tokens: prompt,
                    ..FlowRequest::new(TENANTS[tenant])
                };
                let g = q.admit_direct(&req, now).unwrap();
                let w = r.admit_direct(TENANTS[tenant], prompt, None);
                running.push((g, w));
            }
            Op::Report { pick, tokens } if !running.is_empty() => {
                let i = pick % running.len();
                let (g, w) = &mut running[i];
                q.report_output(g, tokens);
                r.report_output(w, tokens);
            }
            Op::Settle { pick, tokens } if !running.is_empty() => {
                let (g, w) = running.swap_remove(pick % running.len());
                q.settle(g, tokens);
                r.settle(w, tokens);
            }
            Op::Cancel { pick } if !keys.is_empty() => {
                let (id, key) = keys.swap_remove(pick % keys.len());
                prop_assert_eq!(q.cancel(key), Some(id), "cancel, {}", ctx());
                prop_assert!(r.cancel(id));
            }
            Op::Advance { ms } => {
                now += ms * MS;
                let mut got = Vec::new();
                q.expire(now, |v| got.push(v));
                got.sort_unstable();
                let mut want = r.expire(now);
                want.sort_unstable();
                prop_assert_eq!(&got, &want, "expired, {}", ctx());
                keys.retain(|(i, _)| !got.contains(i));
            }
            _ => {}
        }
        prop_assert_eq!(q.len() as usize, r.len(), "len, {}", ctx());
        prop_assert_eq!(q.tokens(), r.tokens(), "tokens, {}", ctx());
        for t in TENANTS {
            prop_assert_eq!(q.counter(t), r.counter(t), "counter of {}, {}", t, ctx());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_queue_matches_the_reference(
        (limit, tokens, wp, wq) in config(),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        run(limit, tokens, wp, wq, &ops)?;
    }
}
