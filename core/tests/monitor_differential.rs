//! Randomized differential test: random operation sequences applied to the
//! monitor and to a deliberately simple reference (HashMap + HashSet, busy
//! rule written out again in `loadgate-testkit`'s reference monitor, shared
//! with the `monitor_ops` fuzz target) must give the same busy sets, leases,
//! versions and errors after every step.

use std::time::Duration;

use loadgate::{
    LoadReport, ManualClock, Monitor, MonitorConfig, Policy, ThresholdField, ThresholdUpdate,
    WorkerSpec,
};
use loadgate_testkit::reference_monitor::{RefUpdate, Reference};
use proptest::prelude::*;

const MODELS: [&str; 3] = ["a", "b", "c"];
const LEASE_MS: u64 = 1000;
const CAPACITY: usize = 6;

#[derive(Debug, Clone)]
enum Op {
    Add {
        model: usize,
        id: u64,
        dp_start: u32,
        dp_size: u32,
        total: Option<u64>,
    },
    Remove {
        id: u64,
    },
    Report {
        id: u64,
        rank: u32,
        decode: Option<u64>,
        used: Option<u64>,
        total: Option<u64>,
        prefill: Option<u64>,
        mnbt: Option<u64>,
        waiting: Option<u64>,
    },
    Set {
        model: usize,
        decode: Option<f64>,
        abs: Option<u64>,
        frac: Option<f64>,
        waiting: Option<u64>,
        clear: Vec<usize>,
    },
    Select {
        model: usize,
        policy: usize,
        /// Through a `Route` handle rather than `Monitor::select`.
        via_route: bool,
    },
    Check {
        id: u64,
    },
    Mark {
        id: u64,
    },
    Advance {
        ms: u64,
    },
    Book {
        id: u64,
        rank: u32,
        blocks: u64,
    },
    Unbook {
        index: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let id = 0u64..10;
    let small = || proptest::option::of(0u64..12);
    prop_oneof![
        3 => (0usize..3, id.clone(), 0u32..3, 0u32..3, proptest::option::of(0u64..12))
            .prop_map(|(model, id, dp_start, dp_size, total)| Op::Add { model, id, dp_start, dp_size, total }),
        1 => id.clone().prop_map(|id| Op::Remove { id }),
        8 => (id.clone(), 0u32..5, small(), small(), small(), small(), small(), small())
            .prop_map(|(id, rank, decode, used, total, prefill, mnbt, waiting)| Op::Report { id, rank, decode, used, total, prefill, mnbt, waiting }),
        2 => (
            0usize..3,
            proptest::option::of(prop_oneof![(0u32..=10).prop_map(|v| v as f64 / 10.0), Just(f64::NAN), Just(-0.5), Just(1.5), Just(f64::INFINITY)]),
            proptest::option::of(0u64..10),
            proptest::option::of(prop_oneof![(0u32..30).prop_map(|v| v as f64 / 10.0), Just(f64::NAN), Just(-1.0)]),
            proptest::option::of(0u64..10),
            proptest::collection::vec(0usize..5, 0..2),
        )
            .prop_map(|(model, decode, abs, frac, waiting, clear)| Op::Set { model, decode, abs, frac, waiting, clear }),
        4 => (0usize..3, 0usize..3, any::<bool>()).prop_map(|(model, policy, via_route)| {
            Op::Select {
                model,
                policy,
                via_route,
            }
        }),
        2 => id.clone().prop_map(|id| Op::Check { id }),
        2 => id.clone().prop_map(|id| Op::Mark { id }),
        2 => (0u64..1500).prop_map(|ms| Op::Advance { ms }),
        2 => (id, 0u32..4, 0u64..8).prop_map(|(id, rank, blocks)| Op::Book { id, rank, blocks }),
        1 => (0usize..8).prop_map(|index| Op::Unbook { index }),
    ]
}

fn field_name(i: usize) -> String {
    ThresholdField::ALL
        .get(i)
        .map_or("bogus".to_owned(), |f| f.name().to_owned())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let config = MonitorConfig {
        lease: Duration::from_millis(LEASE_MS),
        limits: loadgate::Limits {
            max_workers_per_model: CAPACITY,
            ..loadgate::Limits::default()
        },
        ..Default::default()
    };
    let m = Monitor::with_config(config, clock.clone()).unwrap();
    let mut r = Reference::new(&MODELS, CAPACITY, LEASE_MS);
    let mut bookings = Vec::new();

    for op in ops {
        match op.clone() {
            Op::Add {
                model,
                id,
                dp_start,
                dp_size,
                total,
            } => {
                let spec = WorkerSpec {
                    dp_start,
                    dp_size,
                    kv_total_blocks: total,
                    max_num_batched_tokens: None,
                    max_num_seqs: None,
                };
                prop_assert_eq!(
                    m.add_worker(MODELS[model], id, spec),
                    r.add_worker(model, id, spec)
                );
            }
            Op::Remove { id } => {
                prop_assert_eq!(m.remove_worker(id), r.remove_worker(id));
            }
            Op::Report {
                id,
                rank,
                decode,
                used,
                total,
                prefill,
                mnbt,
                waiting,
            } => {
                let report = LoadReport {
                    active_decode_blocks: decode,
                    kv_used_blocks: used,
                    kv_total_blocks: total,
                    active_prefill_tokens: prefill,
                    max_num_batched_tokens: mnbt,
                    waiting_requests: waiting,
                    max_num_seqs: None,
                };
                prop_assert_eq!(m.report(id, rank, &report), r.report(id, rank, &report));
            }
            Op::Set {
                model,
                decode,
                abs,
                frac,
                waiting,
                clear,
            } => {
                let names: Vec<String> = clear.iter().map(|&i| field_name(i)).collect();
                let parsed: Result<Vec<ThresholdField>, _> =
                    names.iter().map(|n| ThresholdField::from_name(n)).collect();
                let Ok(clear_fields) = parsed else { continue };
                let update = ThresholdUpdate {
                    active_decode_blocks_threshold: decode,
                    active_prefill_tokens_threshold: abs,
                    active_prefill_tokens_threshold_frac: frac,
                    waiting_requests_threshold: waiting,
                    clear: clear_fields.iter().copied().collect(),
                };
                let got = m.set_thresholds(MODELS[model], &update);
                let next = match r.set_thresholds(model, decode, abs, frac, waiting, &clear_fields)
                {
                    Err(e) => {
                        prop_assert_eq!(got, Err(e));
                        continue;
                    }
                    Ok((_, RefUpdate::Next(next))) => next,
                    Ok((cur, RefUpdate::Refused)) => {
                        prop_assert!(got.is_err(), "{:?} accepted", update);
                        prop_assert_eq!(m.thresholds(MODELS[model]).unwrap().version, cur.version);
                        continue;
                    }
                    Ok((cur, RefUpdate::Unchanged)) => {
                        prop_assert_eq!(got.unwrap().version, cur.version);
                        continue;
                    }
                };
                let got = got.unwrap();
                prop_assert_eq!(got.version, next.version);
                prop_assert_eq!(got.thresholds.active_decode_blocks_threshold, next.decode);
                prop_assert_eq!(got.thresholds.active_prefill_tokens_threshold, next.abs);
                prop_assert_eq!(
                    got.thresholds.active_prefill_tokens_threshold_frac,
                    next.frac
                );
                prop_assert_eq!(got.thresholds.waiting_requests_threshold, next.waiting);
            }
            Op::Select {
                model,
                policy,
                via_route,
            } => {
                let policy = [Policy::RoundRobin, Policy::Random, Policy::PowerOfTwo][policy];
                let got = if via_route {
                    // A route makes its model known (thresholds can be set).
                    r.route(model);
                    m.route(MODELS[model]).unwrap().select(policy)
                } else {
                    m.select(MODELS[model], policy)
                };
                if let Err(why) = r.check_select(model, got) {
                    prop_assert!(false, "{}", why);
                }
            }
            Op::Check { id } => prop_assert_eq!(m.check(id), r.check(id)),
            Op::Mark { id } => prop_assert_eq!(m.mark_overloaded(id), r.mark_overloaded(id)),
            Op::Advance { ms } => {
                clock.advance(Duration::from_millis(ms));
                r.advance(ms);
            }
            Op::Book { id, rank, blocks } => {
                let got = m.book(id, rank, blocks);
                match r.book(id, rank, blocks) {
                    None => prop_assert!(got.is_err()),
                    Some(want) => bookings.push((got.unwrap(), want)),
                }
            }
            Op::Unbook { index } => {
                if index < bookings.len() {
                    let (booking, want) = bookings.swap_remove(index);
                    drop(booking);
                    r.release(want);
                }
            }
        }
        for (i, name) in MODELS.iter().enumerate() {
            prop_assert_eq!(
                m.busy_workers(name),
                r.busy_set(i),
                "busy set of {} after {:?}",
                name,
                op
            );
        }
        for id in 0..10 {
            if r.workers.contains_key(&id) {
                prop_assert_eq!(
                    m.is_leased(id),
                    Ok(r.leased(id)),
                    "lease of {} after {:?}",
                    id,
                    op
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
    #[test]
    fn monitor_matches_the_reference(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops)?;
    }
}
