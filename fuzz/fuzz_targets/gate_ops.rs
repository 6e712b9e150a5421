//! Admission gate operation sequences (admit as a future or a callback,
//! try-admit, release, cancel, poll, expire, set_limit, close, time) checked
//! step by step against the reference gate (`loadgate-testkit`, shared with
//! `core/tests/gate_model.rs`).
//!
//! Beyond the proptest version: limits and queues large enough that one
//! `close`, `expire` or `set_limit` resolves more waiters than the gate's
//! fixed wake batch (32) holds, bursts of admissions to get there, and
//! refused limits (0, above the maximum) that must change nothing, and up
//! to eight priority classes with their own queue limits, deadlines and
//! reserved slots (a reservation past a lowered limit included), and a
//! wait limit with first responses.
//!
//! After every step: the outcome, the stats, the callbacks fired (and their
//! order), the next deadline, and the permits held must match the reference.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

use loadgate::gate::{MAX_CLASSES, MAX_LIMIT};
use loadgate::{ClassConfig, ConfigError, GateConfig};
use loadgate_testkit::gate_pair::GatePair;
use loadgate_testkit::reference_gate::{Kind, Out};

#[derive(Debug)]
struct Setup {
    limit: u32,
    queue: u32,
    timeout_ms: Option<u64>,
    lifo: bool,
    /// The wait limit `W`, if any.
    wait: Option<u32>,
    /// Priority classes (empty: none): queue limit, deadline, reservation.
    classes: Vec<ClassConfig>,
}

impl<'a> Arbitrary<'a> for Setup {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let big = u.ratio(1u8, 4)?;
        let queue = if big {
            u.int_in_range(0..=48)?
        } else {
            u.int_in_range(0..=5)?
        };
        let limit = if big {
            u.int_in_range(1..=40)?
        } else {
            u.int_in_range(1..=4)?
        };
        Ok(Setup {
            limit,
            wait: if u.arbitrary()? {
                Some(u.int_in_range(1..=limit + 1)?)
            } else {
                None
            },
            queue,
            timeout_ms: if u.arbitrary()? {
                Some(u.int_in_range(1..=120)?)
            } else {
                None
            },
            lifo: u.arbitrary()?,
            classes: {
                let n = u.int_in_range(0..=MAX_CLASSES)?;
                let mut classes = Vec::with_capacity(n);
                for _ in 0..n {
                    classes.push(ClassConfig {
                        queue: u.int_in_range(0..=queue)?,
                        queue_timeout: if u.arbitrary()? {
                            Some(Duration::from_millis(u.int_in_range(1..=120)?))
                        } else {
                            None
                        },
                        reserved: u.int_in_range(0..=2)?,
                    });
                }
                classes
            },
        })
    }
}

#[derive(Debug, Arbitrary)]
enum Op {
    AdmitFuture(u8),
    AdmitCallback(u8),
    /// The two-step form: queued with nobody to tell until armed.
    AdmitPending(u8),
    Arm(u8),
    /// Several admissions in a row, each checked on its own.
    Burst {
        n: u8,
        callbacks: bool,
        priority: u8,
    },
    TryAdmit(u8),
    Release(u8),
    /// The first response of a held permit (with a wait limit).
    FirstResponse(u8),
    Cancel(u8),
    PollAll,
    Advance(u8),
    Expire,
    SetLimit(u8),
    /// Limits the gate must refuse: 0 and one past the maximum.
    SetBadLimit(bool),
    Close,
}

/// One step on both gates: both outcomes, or `None` when the step does
/// nothing (no permit to release, no waiter to cancel).
fn step(pair: &mut GatePair, op: &Op) -> Option<(Out, Out)> {
    Some(match *op {
        Op::AdmitFuture(p) => pair.admit(Kind::Future, p),
        Op::AdmitCallback(p) => pair.admit(Kind::Callback, p),
        Op::AdmitPending(p) => pair.admit(Kind::Pending, p),
        Op::Arm(k) => return pair.arm(usize::from(k)),
        Op::Burst {
            n,
            callbacks,
            priority,
        } => {
            let kind = if callbacks {
                Kind::Callback
            } else {
                Kind::Future
            };
            for _ in 0..n % 40 {
                let (real, expected) = pair.admit(kind, priority);
                assert_eq!(real, expected, "outcome within a burst");
                pair.check(&|| format!("{op:?}"));
            }
            (Out::Unit, Out::Unit)
        }
        Op::TryAdmit(p) => pair.try_admit(p),
        Op::Release(k) => return pair.release(usize::from(k)),
        Op::FirstResponse(k) => return pair.first_response(usize::from(k)),
        Op::Cancel(k) => return pair.cancel(usize::from(k)),
        Op::PollAll => pair.poll_all(),
        Op::Advance(ms) => pair.advance(u64::from(ms % 130)),
        Op::Expire => pair.expire(),
        Op::SetLimit(n) => pair.set_limit(u32::from(n % 48) + 1),
        Op::SetBadLimit(zero) => {
            let n = if zero { 0 } else { MAX_LIMIT + 1 };
            let got = pair.gate.set_limit(n);
            if zero {
                assert_eq!(got, Err(ConfigError::ZeroLimit));
            } else {
                assert!(got.is_err(), "limit {n} accepted");
            }
            (Out::Unit, Out::Unit)
        }
        Op::Close => pair.close(),
    })
}

fuzz_target!(|input: (Setup, Vec<Op>)| {
    let (setup, ops) = input;
    let mut config = GateConfig::new(setup.limit)
        .with_queue(setup.queue)
        .with_queue_timeout(setup.timeout_ms.map(Duration::from_millis))
        .with_adaptive_lifo(setup.lifo)
        .with_wait_limit(setup.wait);
    config.classes = setup.classes.clone();
    for c in &mut config.classes {
        c.reserved = c.reserved.min(setup.limit);
    }
    let mut pair = GatePair::with_config(config);
    for op in ops.iter().take(512) {
        if let Some((real, expected)) = step(&mut pair, op) {
            assert_eq!(real, expected, "outcome of {op:?} ({setup:?})");
            pair.check(&|| format!("after {op:?}"));
        }
    }
    // Wind down: every waiter resolves, every slot comes back.
    pair.finish();
});
