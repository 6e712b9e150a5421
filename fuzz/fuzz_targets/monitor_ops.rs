//! Monitor operation sequences (add, remove, report, thresholds, select,
//! check, lease, bookings, time) checked step by step against the reference
//! monitor (`loadgate-testkit`, shared with
//! `core/tests/monitor_differential.rs`). Load values
//! range over all of `u64` and thresholds over all of `f64`, so rounding,
//! overflow and the refused-value paths are reached, which the proptest
//! version (small values) does not.
//!
//! After every step: the operation's result, every model's busy set and
//! worker list, every worker's busy flag, lease and per-rank load, and every
//! model's thresholds and version must match the reference.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use loadgate::{
    Booking, LoadReport, ManualClock, Monitor, MonitorConfig, Policy, ReportError, RouteError,
    ThresholdField, ThresholdUpdate, WorkerSpec,
};
use loadgate_testkit::reference_monitor::{RefBooking, RefUpdate, Reference};

/// Models by index; the last one is empty, which `add_worker` refuses.
const MODELS: [&str; 4] = ["a", "b", "c", ""];
const IDS: u64 = 10;
const CAPACITY: usize = 6;
const LEASE_MS: u64 = 1000;

/// A `u64` drawn mostly small, sometimes anywhere, sometimes at the edges
/// where `as f64` rounds and saturating arithmetic kicks in.
#[derive(Debug, Clone, Copy)]
struct Num(u64);

impl<'a> Arbitrary<'a> for Num {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Num(match u.arbitrary::<u8>()? {
            0..=191 => u64::from(u.int_in_range(0u8..=15)?),
            192..=223 => u.arbitrary()?,
            224..=231 => u64::MAX,
            232..=239 => u64::MAX - 1,
            240..=247 => 1 << 53,
            _ => (1 << 53) + 1,
        }))
    }
}

/// A threshold drawn mostly from tenths, sometimes from any bit pattern or
/// the special values validation has to refuse (or accept: `-0.0`, `1.0`).
#[derive(Debug, Clone, Copy)]
struct Real(f64);

impl<'a> Arbitrary<'a> for Real {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        const SPECIAL: [f64; 9] = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            -0.5,
            1.0,
            1.0 + f64::EPSILON,
            64.0,
            f64::MIN_POSITIVE,
        ];
        Ok(Real(match u.arbitrary::<u8>()? {
            0..=191 => f64::from(u.int_in_range(0u8..=30)?) / 10.0,
            192..=223 => f64::from_bits(u.arbitrary()?),
            n => SPECIAL[usize::from(n) % SPECIAL.len()],
        }))
    }
}

#[derive(Debug, Arbitrary)]
enum Op {
    Add {
        model: u8,
        id: u8,
        near_max_start: bool,
        dp_start: u8,
        dp_size: u8,
        total: Option<Num>,
        mnbt: Option<Num>,
        seats: Option<Num>,
    },
    Remove {
        id: u8,
    },
    Report {
        id: u8,
        rank: u8,
        decode: Option<Num>,
        used: Option<Num>,
        total: Option<Num>,
        prefill: Option<Num>,
        mnbt: Option<Num>,
        waiting: Option<Num>,
        seats: Option<Num>,
    },
    Set {
        model: u8,
        decode: Option<Real>,
        abs: Option<Num>,
        frac: Option<Real>,
        waiting: Option<Num>,
        clear: Vec<u8>,
    },
    Select {
        model: u8,
        /// Policy from the value mod 3; the top bit selects through a
        /// `Route` handle instead of by model name.
        policy: u8,
    },
    SelectMinCost {
        model: u8,
        costs: Vec<(u8, Real)>,
    },
    Check {
        id: u8,
    },
    Mark {
        id: u8,
    },
    Advance {
        ms: u16,
    },
    Book {
        id: u8,
        rank: u8,
        blocks: Num,
    },
    AddOutput {
        index: u8,
        blocks: Num,
    },
    Unbook {
        index: u8,
    },
}

/// A live booking and what the reference needs to undo it.
type Held = (Booking, RefBooking);

fn step(m: &Monitor, clock: &ManualClock, r: &mut Reference, held: &mut Vec<Held>, op: &Op) {
    match *op {
        Op::Add {
            model,
            id,
            near_max_start,
            dp_start,
            dp_size,
            total,
            mnbt,
            seats,
        } => {
            let model = usize::from(model) % MODELS.len();
            let id = u64::from(id) % IDS;
            let dp_start = if near_max_start {
                u32::MAX - u32::from(dp_start % 4)
            } else {
                u32::from(dp_start % 4)
            };
            let spec = WorkerSpec {
                dp_start,
                dp_size: u32::from(dp_size % 4),
                kv_total_blocks: total.map(|n| n.0),
                max_num_batched_tokens: mnbt.map(|n| n.0),
                max_num_seqs: seats.map(|n| n.0),
            };
            let got = m.add_worker(MODELS[model], id, spec);
            assert_eq!(got, r.add_worker(model, id, spec), "add_worker");
        }
        Op::Remove { id } => {
            let id = u64::from(id) % IDS;
            assert_eq!(m.remove_worker(id), r.remove_worker(id), "remove_worker");
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
            seats,
        } => {
            let id = u64::from(id) % IDS;
            let rank = u32::from(rank);
            let report = LoadReport {
                active_decode_blocks: decode.map(|n| n.0),
                kv_used_blocks: used.map(|n| n.0),
                kv_total_blocks: total.map(|n| n.0),
                active_prefill_tokens: prefill.map(|n| n.0),
                max_num_batched_tokens: mnbt.map(|n| n.0),
                waiting_requests: waiting.map(|n| n.0),
                max_num_seqs: seats.map(|n| n.0),
            };
            let got = m.report(id, rank, &report);
            let want = r.report(id, rank, &report);
            if let Err(ReportError::UndeclaredRank { .. }) = want {
                assert!(
                    matches!(got, Err(ReportError::UndeclaredRank { worker_id, dp_rank, .. })
                        if worker_id == id && dp_rank == rank),
                    "report to an undeclared rank: {got:?}"
                );
            }
            if let Err(ReportError::InvalidValue { .. }) = want {
                // u64::MAX marks "never reported" inside the monitor.
                assert!(
                    matches!(
                        got,
                        Err(ReportError::InvalidValue {
                            field: "active_prefill_tokens" | "waiting_requests",
                            value: u64::MAX
                        })
                    ),
                    "report of the reserved value: {got:?}"
                );
            }
            assert_eq!(got, want, "report");
        }
        Op::Set {
            model,
            decode,
            abs,
            frac,
            waiting,
            ref clear,
        } => {
            let model = usize::from(model) % 3;
            let name = MODELS[model];
            let mut clear_fields: Vec<ThresholdField> = Vec::new();
            for &i in clear.iter().take(ThresholdField::ALL.len()) {
                let f = ThresholdField::ALL[usize::from(i) % ThresholdField::ALL.len()];
                if !clear_fields.contains(&f) {
                    clear_fields.push(f);
                }
            }
            let (decode, abs, frac) = (decode.map(|x| x.0), abs.map(|n| n.0), frac.map(|x| x.0));
            let waiting = waiting.map(|n| n.0);
            let update = ThresholdUpdate {
                active_decode_blocks_threshold: decode,
                active_prefill_tokens_threshold: abs,
                active_prefill_tokens_threshold_frac: frac,
                waiting_requests_threshold: waiting,
                clear: clear_fields.iter().copied().collect(),
            };
            let got = m.set_thresholds(name, &update);
            match r.set_thresholds(model, decode, abs, frac, waiting, &clear_fields) {
                Err(e) => assert_eq!(got, Err(e)),
                Ok((cur, RefUpdate::Refused)) => {
                    assert!(got.is_err(), "{update:?} accepted");
                    assert_eq!(m.thresholds(name).unwrap().version, cur.version);
                }
                Ok((cur, RefUpdate::Unchanged)) => {
                    let got = got.expect("a valid update is accepted");
                    assert_eq!(got.version, cur.version, "an empty update is a read");
                }
                Ok((_, RefUpdate::Next(next))) => {
                    let got = got.expect("a valid update is accepted");
                    assert_eq!(got.version, next.version);
                }
            }
        }
        Op::Select { model, policy } => {
            let model = usize::from(model) % 3;
            let kind =
                [Policy::RoundRobin, Policy::Random, Policy::PowerOfTwo][usize::from(policy) % 3];
            let got = if policy & 0x80 != 0 {
                // Through a `Route` handle, which makes its model known.
                r.route(model);
                m.route(MODELS[model]).unwrap().select(kind)
            } else {
                m.select(MODELS[model], kind)
            };
            if let Err(why) = r.check_select(model, got) {
                panic!("{why}");
            }
        }
        Op::SelectMinCost { model, ref costs } => {
            let model = usize::from(model) % 3;
            let costs: Vec<(u64, f64)> = costs
                .iter()
                .take(16)
                .map(|&(id, c)| (u64::from(id) % (IDS + 2), c.0))
                .collect();
            let got = m.select_min_cost(MODELS[model], costs.iter().copied());
            let want = r.select_min_cost(model, &costs);
            assert_eq!(got, want, "select_min_cost over {costs:?}");
        }
        Op::Check { id } => {
            let id = u64::from(id) % IDS;
            assert_eq!(m.check(id), r.check(id), "check");
        }
        Op::Mark { id } => {
            let id = u64::from(id) % IDS;
            assert_eq!(m.mark_overloaded(id), r.mark_overloaded(id));
        }
        Op::Advance { ms } => {
            let ms = u64::from(ms % 2000);
            clock.advance(Duration::from_millis(ms));
            r.advance(ms);
        }
        Op::Book { id, rank, blocks } => {
            let id = u64::from(id) % IDS;
            let rank = u32::from(rank % 4);
            let got = m.book(id, rank, blocks.0);
            match r.book(id, rank, blocks.0) {
                None => assert!(got.is_err(), "booking on a missing rank: {got:?}"),
                Some(want) => {
                    let booking = got.expect("booking on a declared rank");
                    assert_eq!(booking.blocks(), blocks.0);
                    assert_eq!(booking.worker_id(), id);
                    held.push((booking, want));
                }
            }
        }
        Op::AddOutput { index, blocks } => {
            if held.is_empty() {
                return;
            }
            let i = usize::from(index) % held.len();
            let (booking, want) = &mut held[i];
            booking.add_output_blocks(blocks.0);
            r.add_output_blocks(want, blocks.0);
            assert_eq!(booking.blocks(), want.blocks, "booking count");
        }
        Op::Unbook { index } => {
            if held.is_empty() {
                return;
            }
            let (booking, want) = held.swap_remove(usize::from(index) % held.len());
            booking.release();
            r.release(want);
        }
    }
}

/// Everything observable must agree with the reference.
fn compare(m: &Monitor, r: &Reference, op: &Op) {
    assert_eq!(m.models(), r.model_names(), "models after {op:?}");
    for (i, name) in MODELS.iter().enumerate().take(3) {
        assert_eq!(
            m.busy_workers(name),
            r.busy_set(i),
            "busy set of {name:?} after {op:?}"
        );
        let mut ids = m.workers(name);
        ids.sort_unstable();
        assert_eq!(ids, r.workers_of(i), "workers of {name:?} after {op:?}");
        let t = m.thresholds(name);
        if r.known_models.contains(&i) {
            let want = r.thresholds.get(&i).copied().unwrap_or_default();
            let got = t.expect("a known model has thresholds");
            assert_eq!(
                got.version, want.version,
                "version of {name:?} after {op:?}"
            );
            let got_t = &got.thresholds;
            // Bit equality: -0.0 and NaN payloads must survive as given.
            assert_eq!(
                got_t.active_decode_blocks_threshold.map(f64::to_bits),
                want.decode.map(f64::to_bits),
                "decode threshold of {name:?} after {op:?}"
            );
            assert_eq!(got_t.active_prefill_tokens_threshold, want.abs);
            assert_eq!(
                got_t.active_prefill_tokens_threshold_frac.map(f64::to_bits),
                want.frac.map(f64::to_bits),
                "frac threshold of {name:?} after {op:?}"
            );
            assert_eq!(got_t.waiting_requests_threshold, want.waiting);
        } else {
            assert_eq!(t, None, "thresholds of unknown {name:?}");
        }
    }
    for id in 0..IDS {
        let Some(w) = r.workers.get(&id) else {
            assert_eq!(m.is_busy(id), Err(RouteError::UnknownWorker(id)));
            assert_eq!(m.is_leased(id), Err(RouteError::UnknownWorker(id)));
            continue;
        };
        assert_eq!(
            m.is_busy(id),
            Ok(r.busy(id)),
            "busy flag of {id} after {op:?}"
        );
        assert_eq!(
            m.is_leased(id),
            Ok(r.leased(id)),
            "lease of {id} after {op:?}"
        );
        for (i, rr) in w.ranks.iter().enumerate() {
            let rank = w.dp_start + i as u32;
            let l = m.rank_load(id, rank).expect("declared rank");
            assert_eq!(
                (
                    l.active_decode_blocks,
                    l.kv_used_blocks,
                    l.kv_total_blocks,
                    l.active_prefill_tokens,
                    l.max_num_batched_tokens,
                    l.waiting_requests
                ),
                (rr.decode, rr.used, rr.total, rr.prefill, rr.mnbt, rr.waiting),
                "load of {id}/{rank} after {op:?}"
            );
        }
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let clock = ManualClock::new();
    let config = MonitorConfig {
        lease: Duration::from_millis(LEASE_MS),
        limits: loadgate::Limits {
            max_workers_per_model: CAPACITY,
            ..loadgate::Limits::default()
        },
        ..Default::default()
    };
    let m = Monitor::with_config(config, clock.clone()).expect("valid config");
    let mut r = Reference::new(&MODELS, CAPACITY, LEASE_MS);
    let mut held: Vec<Held> = Vec::new();
    for op in ops.iter().take(256) {
        step(&m, &clock, &mut r, &mut held, op);
        compare(&m, &r, op);
    }
    // Releasing every booking leaves each rank at its reported decode value.
    drop(held);
});
