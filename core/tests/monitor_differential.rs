//! Randomized differential test: random operation sequences applied to the
//! monitor and to a deliberately simple reference (HashMap + HashSet, busy
//! rule written out again in `support/reference_monitor.rs`) must give the
//! same busy sets, leases, versions and errors after every step.

use std::time::Duration;

use loadgate::{
    LoadReport, ManualClock, Monitor, MonitorConfig, Policy, ReportError, RouteError,
    ThresholdError, ThresholdField, ThresholdUpdate, WorkerError, WorkerSpec,
};
use proptest::prelude::*;

// The reference lives in its own file so the fuzz target can share it; an
// inline `support` module picks up only that file, not the NATS helpers.
mod support {
    pub mod reference_monitor;
}
use support::reference_monitor::{RefRank, RefUpdate, RefWorker, Reference};

const MODELS: [&str; 3] = ["a", "b", "c"];
const LEASE_MS: u64 = 1000;

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
    },
    Set {
        model: usize,
        decode: Option<f64>,
        abs: Option<u64>,
        frac: Option<f64>,
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
        8 => (id.clone(), 0u32..5, small(), small(), small(), small(), small())
            .prop_map(|(id, rank, decode, used, total, prefill, mnbt)| Op::Report { id, rank, decode, used, total, prefill, mnbt }),
        2 => (
            0usize..3,
            proptest::option::of(prop_oneof![(0u32..=10).prop_map(|v| v as f64 / 10.0), Just(f64::NAN), Just(-0.5), Just(1.5), Just(f64::INFINITY)]),
            proptest::option::of(0u64..10),
            proptest::option::of(prop_oneof![(0u32..30).prop_map(|v| v as f64 / 10.0), Just(f64::NAN), Just(-1.0)]),
            proptest::collection::vec(0usize..4, 0..2),
        )
            .prop_map(|(model, decode, abs, frac, clear)| Op::Set { model, decode, abs, frac, clear }),
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
            max_workers_per_model: 6,
            ..loadgate::Limits::default()
        },
        ..Default::default()
    };
    let m = Monitor::with_config(config, clock.clone()).unwrap();
    let mut r = Reference::default();
    let mut bookings: Vec<(loadgate::Booking, u64, u32, u64, u64)> = Vec::new();

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
                };
                let got = m.add_worker(MODELS[model], id, spec);
                let full = r.workers.values().filter(|w| w.model == model).count() >= 6;
                let want = if r.workers.contains_key(&id) {
                    Err(WorkerError::Duplicate(id))
                } else if full {
                    Err(WorkerError::ModelFull {
                        model: MODELS[model].into(),
                        capacity: 6,
                    })
                } else {
                    r.generations += 1;
                    let rank = RefRank {
                        total: total.unwrap_or(0),
                        mnbt: 10_000_000,
                        ..Default::default()
                    };
                    r.workers.insert(
                        id,
                        RefWorker {
                            model,
                            dp_start,
                            ranks: vec![rank; dp_size as usize],
                            lease_until: None,
                            generation: r.generations,
                        },
                    );
                    r.known_models.insert(model);
                    Ok(())
                };
                prop_assert_eq!(got, want);
            }
            Op::Remove { id } => {
                let want = r
                    .workers
                    .remove(&id)
                    .map(|_| ())
                    .ok_or(WorkerError::Unknown(id));
                prop_assert_eq!(m.remove_worker(id), want);
            }
            Op::Report {
                id,
                rank,
                decode,
                used,
                total,
                prefill,
                mnbt,
            } => {
                let report = LoadReport {
                    active_decode_blocks: decode,
                    kv_used_blocks: used,
                    kv_total_blocks: total,
                    active_prefill_tokens: prefill,
                    max_num_batched_tokens: mnbt,
                };
                let got = m.report(id, rank, &report);
                match r.workers.get_mut(&id) {
                    None => prop_assert_eq!(got, Err(ReportError::UnknownWorker(id))),
                    Some(w) => match rank
                        .checked_sub(w.dp_start)
                        .and_then(|i| w.ranks.get_mut(i as usize))
                    {
                        None => prop_assert!(
                            matches!(got, Err(ReportError::UndeclaredRank { .. })),
                            "{:?}",
                            got
                        ),
                        Some(rr) => {
                            prop_assert_eq!(got, Ok(()));
                            if let Some(v) = decode {
                                rr.decode = v
                            }
                            if let Some(v) = used {
                                rr.used = v
                            }
                            if let Some(v) = total {
                                rr.total = v
                            }
                            if let Some(v) = prefill {
                                rr.prefill = Some(v)
                            }
                            if let Some(v) = mnbt {
                                rr.mnbt = v
                            }
                            if !r.busy(id) {
                                r.workers.get_mut(&id).unwrap().lease_until = None;
                            }
                        }
                    },
                }
            }
            Op::Set {
                model,
                decode,
                abs,
                frac,
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
                    clear: clear_fields.clone(),
                };
                let got = m.set_thresholds(MODELS[model], &update);
                if !r.known_models.contains(&model) {
                    prop_assert_eq!(got, Err(ThresholdError::UnknownModel(MODELS[model].into())));
                    continue;
                }
                let cur = r.thresholds.get(&model).copied().unwrap_or_default();
                let next = match cur.apply(decode, abs, frac, &clear_fields) {
                    RefUpdate::Refused => {
                        prop_assert!(got.is_err(), "{:?} accepted", update);
                        prop_assert_eq!(m.thresholds(MODELS[model]).unwrap().version, cur.version);
                        continue;
                    }
                    RefUpdate::Unchanged => {
                        prop_assert_eq!(got.unwrap().version, cur.version);
                        continue;
                    }
                    RefUpdate::Next(next) => next,
                };
                r.thresholds.insert(model, next);
                let got = got.unwrap();
                prop_assert_eq!(got.version, next.version);
                prop_assert_eq!(got.thresholds.active_decode_blocks_threshold, next.decode);
                prop_assert_eq!(got.thresholds.active_prefill_tokens_threshold, next.abs);
                prop_assert_eq!(
                    got.thresholds.active_prefill_tokens_threshold_frac,
                    next.frac
                );
            }
            Op::Select {
                model,
                policy,
                via_route,
            } => {
                let policy = [Policy::RoundRobin, Policy::Random, Policy::PowerOfTwo][policy];
                let got = if via_route {
                    // A route makes its model known (thresholds can be set).
                    r.known_models.insert(model);
                    m.route(MODELS[model]).unwrap().select(policy)
                } else {
                    m.select(MODELS[model], policy)
                };
                if let Err(why) = r.check_select(model, got) {
                    prop_assert!(false, "{}", why);
                }
            }
            Op::Check { id } => {
                let got = m.check(id);
                let want = if !r.workers.contains_key(&id) {
                    Err(RouteError::UnknownWorker(id))
                } else if r.busy(id) || r.leased(id) {
                    Err(RouteError::WorkerOverloaded)
                } else {
                    Ok(())
                };
                prop_assert_eq!(got, want);
            }
            Op::Mark { id } => {
                let got = m.mark_overloaded(id);
                match r.workers.get_mut(&id) {
                    None => prop_assert_eq!(got, Err(RouteError::UnknownWorker(id))),
                    Some(w) => {
                        prop_assert_eq!(got, Ok(()));
                        w.lease_until = Some(r.now_ms + LEASE_MS);
                    }
                }
            }
            Op::Advance { ms } => {
                clock.advance(Duration::from_millis(ms));
                r.now_ms += ms;
            }
            Op::Book { id, rank, blocks } => {
                let got = m.book(id, rank, blocks);
                match r.workers.get_mut(&id) {
                    None => prop_assert!(got.is_err()),
                    Some(w) => match rank
                        .checked_sub(w.dp_start)
                        .and_then(|i| w.ranks.get_mut(i as usize))
                    {
                        None => prop_assert!(got.is_err()),
                        Some(rr) => {
                            rr.decode = rr.decode.saturating_add(blocks);
                            bookings.push((got.unwrap(), id, rank, blocks, w.generation));
                        }
                    },
                }
            }
            Op::Unbook { index } => {
                if index < bookings.len() {
                    let (booking, id, rank, blocks, generation) = bookings.swap_remove(index);
                    drop(booking);
                    if let Some(w) = r
                        .workers
                        .get_mut(&id)
                        .filter(|w| w.generation == generation)
                    {
                        let i = (rank - w.dp_start) as usize;
                        w.ranks[i].decode = w.ranks[i].decode.saturating_sub(blocks);
                    }
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
