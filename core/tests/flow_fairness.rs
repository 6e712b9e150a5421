//! The fairness bound of the frontend queue (docs/flow-control.md,
//! "Fairness bound"), checked on random systems: tenants kept backlogged,
//! a fleet of `C` slots, requests of random prompt and output sizes whose
//! output is reported in random steps and settled at random times.
//!
//! For two tenants backlogged over an interval, the difference of their
//! weighted service (the counters: actual tokens, weighted) over it stays
//! within `2·(A + 2R)`: `A = (w_p·L_in + w_q·O) / w` is the most one
//! dispatch charges and reserves, `R = w_q·F / w` the most output one tenant
//! has reserved in flight at once (`F` tokens), `w` the smaller tenant
//! weight.

use proptest::prelude::*;

use loadgate::flow::{FlowConfig, FlowQueue, FlowRequest, Reservation};

const TENANTS: [&str; 3] = ["t0", "t1", "t2"];

/// A request's sizes: prompt, max_tokens, the output it will produce.
type Sizes = (u64, u64, u64);

struct Running {
    tenant: usize,
    reservation: Reservation,
    output: u64,
}

/// Steps of the simulation: 0 dispatch, 1 report output, 2 settle.
#[derive(Debug, Clone)]
struct System {
    prompt_weight: f64,
    output_weight: f64,
    weights: Vec<f64>,
    slots: usize,
    /// Sizes drawn for each new request, in turn.
    sizes: Vec<Sizes>,
    /// (action, pick) per step.
    steps: Vec<(u8, usize)>,
    longest_prompt: u64,
    longest_output: u64,
}

fn system() -> impl Strategy<Value = System> {
    (
        2..=3usize,
        1..=2000u64,
        1..=2000u64,
        (0.5f64..2.0, 0.5f64..4.0),
        1..=8usize,
    )
        .prop_flat_map(|(tenants, l_in, o, (wp, wq), slots)| {
            (
                prop::collection::vec(prop::sample::select(vec![0.5, 1.0, 2.0]), tenants),
                prop::collection::vec((0..=l_in, 0..=o, 0..=100u64), 400),
                prop::collection::vec((0..3u8, any::<usize>()), 600),
            )
                .prop_map(move |(weights, raw, steps)| System {
                    prompt_weight: wp,
                    output_weight: wq,
                    weights,
                    slots,
                    // The output produced is a share of max_tokens.
                    sizes: raw
                        .into_iter()
                        .map(|(p, m, share)| (p, m, m * share / 100))
                        .collect(),
                    steps,
                    longest_prompt: l_in,
                    longest_output: o,
                })
        })
}

fn run(s: &System) -> Result<(), TestCaseError> {
    let n = s.weights.len();
    let config = FlowConfig {
        prompt_weight: s.prompt_weight,
        output_weight: s.output_weight,
        tenant_weights: (0..n)
            .map(|t| (TENANTS[t].to_owned(), s.weights[t]))
            .collect(),
        ..FlowConfig::new(1024)
    };
    let mut q: FlowQueue<(usize, u64)> = FlowQueue::new(&config).unwrap();
    let mut sizes = s.sizes.iter().cycle();
    let mut queue_one = |q: &mut FlowQueue<(usize, u64)>, t: usize| {
        let &(prompt, max_tokens, output) = sizes.next().unwrap();
        let r = FlowRequest {
            prompt_tokens: prompt,
            max_tokens: Some(max_tokens),
            ..FlowRequest::new(TENANTS[t])
        };
        q.push(&r, (t, output), 0, |_| panic!("nothing is shed"))
            .map_err(|(e, _)| e)
            .unwrap();
    };
    // Every tenant backlogged from the start, two requests each.
    for t in 0..n {
        queue_one(&mut q, t);
        queue_one(&mut q, t);
    }
    let mut running: Vec<Running> = Vec::new();
    // Each tenant's output reserved in flight and not reported, at most.
    let mut in_flight_most = vec![0u64; n];
    // Per pair, the least and most difference of counters seen.
    let mut spread = vec![vec![(f64::INFINITY, f64::NEG_INFINITY); n]; n];
    let counter = |q: &FlowQueue<(usize, u64)>, t: usize| q.counter(TENANTS[t]).unwrap();
    for &(action, pick) in &s.steps {
        match action {
            0 if running.len() < s.slots => {
                let ((tenant, output), reservation) = q.pop(0).unwrap();
                running.push(Running {
                    tenant,
                    reservation,
                    output,
                });
                // Keep the tenant backlogged.
                queue_one(&mut q, tenant);
            }
            1 if !running.is_empty() => {
                let i = pick % running.len();
                let r = &mut running[i];
                let left = r.output - r.reservation.reported_output();
                let step = (pick as u64 % 64).min(left);
                q.report_output(&mut r.reservation, step);
            }
            2 if !running.is_empty() => {
                let r = running.swap_remove(pick % running.len());
                q.settle(r.reservation, r.output);
            }
            _ => {}
        }
        for (t, most) in in_flight_most.iter_mut().enumerate() {
            let reserved: u64 = running
                .iter()
                .filter(|r| r.tenant == t)
                .map(|r| {
                    let res = &r.reservation;
                    res.reserved_output() - res.reported_output().min(res.reserved_output())
                })
                .sum();
            *most = (*most).max(reserved);
        }
        for (f, row) in spread.iter_mut().enumerate() {
            for (g, (lo, hi)) in row.iter_mut().enumerate() {
                let d = counter(&q, f) - counter(&q, g);
                *lo = lo.min(d);
                *hi = hi.max(d);
            }
        }
    }
    let (wp, wq) = (s.prompt_weight, s.output_weight);
    for f in 0..n {
        for g in 0..n {
            let w = s.weights[f].min(s.weights[g]);
            let a = (wp * s.longest_prompt as f64 + wq * s.longest_output as f64) / w;
            let r = wq * in_flight_most[f].max(in_flight_most[g]) as f64 / w;
            let bound = 2.0 * (a + 2.0 * r);
            let (lo, hi) = spread[f][g];
            prop_assert!(
                hi - lo <= bound + 1e-6 * bound.max(1.0),
                "tenants {f} and {g}: service difference moved by {} > bound {bound} \
                 (A {a}, R {r})",
                hi - lo
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn backlogged_tenants_stay_within_the_fairness_bound(s in system()) {
        run(&s)?;
    }
}

/// A request of 100 prompt tokens and no output.
fn hundred(tenant: &str) -> FlowRequest<'_> {
    FlowRequest {
        prompt_tokens: 100,
        max_tokens: Some(0),
        ..FlowRequest::new(tenant)
    }
}

/// Weights take effect: with one tenant of weight 2 and one of weight
/// 1 sending the same requests, their raw token service splits 2 : 1.
#[test]
fn weights_split_the_service() {
    let config = FlowConfig {
        tenant_weights: vec![("t0".into(), 2.0)],
        ..FlowConfig::new(64)
    };
    let mut q: FlowQueue<usize> = FlowQueue::new(&config).unwrap();
    let mut served = [0u64; 2];
    for (t, name) in TENANTS.iter().take(2).enumerate() {
        for _ in 0..4 {
            q.push(&hundred(name), t, 0, drop).unwrap();
        }
    }
    for _ in 0..300 {
        let (t, r) = q.pop(0).unwrap();
        q.settle(r, 0);
        served[t] += 100;
        q.push(&hundred(TENANTS[t]), t, 0, drop).unwrap();
    }
    assert_eq!(served[0], 2 * served[1]);
}
