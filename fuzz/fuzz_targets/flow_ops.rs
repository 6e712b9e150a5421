//! Frontend queue operation sequences (pushes, pops, direct dispatches,
//! output reports, settles, requests put back, cancels, time passing) through
//! `loadgate_testkit::flow_pair`: against the reference queue step by step,
//! or, with a tenant table smaller than the tenant ids in play (a flood of
//! invented ids), against the queue's invariants alone.
//!
//! Beyond the proptest version: any token counts and deadlines (`u64::MAX`
//! included), weights at both ends of their range, token bounds from 1 to
//! unbounded, queues up to 256 and up to 1000 tenant ids.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

use loadgate::flow::{FlowConfig, MAX_WEIGHT, MIN_WEIGHT};
use loadgate_testkit::flow_pair::{FlowOp, FlowPair};

#[derive(Debug)]
struct Setup {
    config: FlowConfig,
    tenants: u16,
}

fn weight(u: &mut Unstructured<'_>) -> arbitrary::Result<f64> {
    Ok(*u.choose(&[MIN_WEIGHT, 0.5, 1.0, 2.0, 3.7, MAX_WEIGHT])?)
}

impl<'a> Arbitrary<'a> for Setup {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let tenants = if u.ratio(1u8, 4)? {
            u.int_in_range(1..=1000)?
        } else {
            u.int_in_range(1..=6)?
        };
        let mut config = FlowConfig::new(u.int_in_range(1..=256)?);
        config.queue_tokens = if u.arbitrary()? {
            Some(u.int_in_range(1..=u64::MAX)?)
        } else {
            None
        };
        config.deadline = Duration::from_millis(u.int_in_range(1..=5000)?);
        config.prompt_weight = weight(u)?;
        config.output_weight = weight(u)?;
        config.output_estimate = u.arbitrary()?;
        config.max_tenants = u.int_in_range(1..=64)?;
        for t in 0..u.int_in_range(0..=3u16)? {
            config.tenant_weights.push((format!("t{t}"), weight(u)?));
        }
        config.tenant_weights.truncate(config.max_tenants);
        Ok(Setup { config, tenants })
    }
}

#[derive(Debug)]
struct Op(FlowOp);

impl<'a> Arbitrary<'a> for Op {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let size = |u: &mut Unstructured<'a>| -> arbitrary::Result<u64> {
            if u.ratio(1u8, 8)? {
                u.arbitrary()
            } else {
                u.int_in_range(0..=4000)
            }
        };
        Ok(Op(match u.int_in_range(0..=9u8)? {
            0..=3 => FlowOp::Push {
                tenant: u.arbitrary()?,
                priority: u.arbitrary()?,
                prompt: size(u)?,
                max_tokens: if u.arbitrary()? { Some(size(u)?) } else { None },
                deadline_ms: if u.arbitrary()? {
                    Some(u.arbitrary()?)
                } else {
                    None
                },
            },
            4 | 5 => FlowOp::Pop,
            6 => FlowOp::Direct {
                tenant: u.arbitrary()?,
                prompt: size(u)?,
            },
            7 => FlowOp::Report {
                pick: u.arbitrary()?,
                tokens: size(u)?,
            },
            8 => FlowOp::Settle {
                pick: u.arbitrary()?,
                tokens: size(u)?,
            },
            _ => {
                let pick = u.arbitrary()?;
                if u.arbitrary()? {
                    FlowOp::Cancel { pick }
                } else if u.arbitrary()? {
                    FlowOp::Requeue { pick }
                } else {
                    FlowOp::Advance {
                        ms: u.int_in_range(0..=u64::from(u32::MAX))?,
                    }
                }
            }
        }))
    }
}

fuzz_target!(|input: (Setup, Vec<Op>)| {
    let (setup, ops) = input;
    // A bounded table is checked against its invariants; otherwise every
    // tenant fits and the reference runs too.
    let mut config = setup.config;
    if usize::from(setup.tenants) <= 64 && config.max_tenants < usize::from(setup.tenants) {
        config.max_tenants = usize::from(setup.tenants);
    }
    let mut pair = FlowPair::new(config, setup.tenants);
    for (step, Op(op)) in ops.iter().enumerate() {
        if let Err(e) = pair.step(op) {
            panic!("step {step}: {op:?}: {e}");
        }
    }
});
