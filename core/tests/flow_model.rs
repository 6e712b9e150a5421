//! The frontend queue against testkit's plain reference
//! (`loadgate_testkit::reference_flow`, driven by `flow_pair`): random
//! operation sequences (pushes with random tenants, priorities, sizes and
//! deadlines; pops; direct dispatches; output reports; settles; requests
//! put back; cancels;
//! time passing), every outcome, every shed and expired request, the
//! length, the tokens and every tenant's counter compared after each step.

use std::time::Duration;

use proptest::prelude::*;

use loadgate::flow::FlowConfig;
use loadgate_testkit::flow_pair::{FlowOp, FlowPair};

fn op() -> impl Strategy<Value = FlowOp> {
    prop_oneof![
        4 => (0..4u16, 0..10u8, 0..300u64, prop::option::of(0..300u64), prop::option::of(1..200u64))
            .prop_map(|(tenant, priority, prompt, max_tokens, deadline_ms)| FlowOp::Push {
                tenant, priority, prompt, max_tokens, deadline_ms
            }),
        3 => Just(FlowOp::Pop),
        1 => (0..4u16, 0..300u64).prop_map(|(tenant, prompt)| FlowOp::Direct { tenant, prompt }),
        2 => (any::<usize>(), 0..100u64).prop_map(|(pick, tokens)| FlowOp::Report { pick, tokens }),
        2 => (any::<usize>(), 0..400u64).prop_map(|(pick, tokens)| FlowOp::Settle { pick, tokens }),
        1 => any::<usize>().prop_map(|pick| FlowOp::Cancel { pick }),
        1 => any::<usize>().prop_map(|pick| FlowOp::Requeue { pick }),
        1 => (1..100u64).prop_map(|ms| FlowOp::Advance { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_queue_matches_the_reference(
        limit in 1..8u32,
        tokens in prop::option::of(100..1500u64),
        wp in 0.5f64..2.0,
        wq in 0.5f64..4.0,
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let config = FlowConfig {
            queue_tokens: tokens,
            deadline: Duration::from_millis(150),
            prompt_weight: wp,
            output_weight: wq,
            tenant_weights: vec![("t0".to_owned(), 2.0), ("t2".to_owned(), 0.5)],
            ..FlowConfig::new(limit)
        };
        let mut pair = FlowPair::new(config, 4);
        for (step, op) in ops.iter().enumerate() {
            if let Err(e) = pair.step(op) {
                prop_assert!(false, "step {}: {:?}: {}", step, op, e);
            }
        }
    }
}
