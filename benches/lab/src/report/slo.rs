//! Arm (i)'s section of docs/overload.md: loadgate given only the SLO,
//! untuned, in every cell, against the best any other arm reached when
//! tuned on that very cell, with its prediction errors and how often its
//! verdicts changed.

use super::{missed_list, ms, pct, row, target_rows, Target};
use crate::arm::ArmKind;
use crate::matrix::{Matrix, Row};
use crate::record::BUSY_TERMS;
use crate::shift::Shift;

/// The best goodput another arm reached on `scenario` (tuned there, or as
/// it ran without knobs), and which.
fn others_best(m: &Matrix, scenario: &str) -> Option<(f64, ArmKind)> {
    super::cell_best_but(m, scenario, Some(ArmKind::Slo))
}

/// What turned (i)'s ranks busy in a run: each term's share of the turns,
/// the largest first (those under 1 % left out).
fn busy_terms(r: &Row) -> String {
    let Some(slo) = r.measured.slo else {
        return String::new();
    };
    let total = slo.turned_busy.iter().sum::<u64>().max(1) as f64;
    let mut terms: Vec<(&str, f64)> = BUSY_TERMS
        .iter()
        .zip(slo.turned_busy)
        .map(|(t, n)| (*t, n as f64 / total))
        .filter(|(_, x)| *x >= 0.01)
        .collect();
    terms.sort_by(|a, b| b.1.total_cmp(&a.1));
    let terms: Vec<String> = terms
        .iter()
        .map(|(t, x)| format!("{t} {}", pct(*x)))
        .collect();
    terms.join(", ")
}

/// Arm (i)'s rows, scenario by scenario.
fn rows(m: &Matrix) -> Vec<&Row> {
    m.rows
        .iter()
        .filter(|r| r.arm == ArmKind::Slo && !r.defaults)
        .collect()
}

/// The targets of arm (i).
fn targets(m: &Matrix) -> Vec<Target> {
    let rows = rows(m);
    let mut out = Vec::new();
    let Some(worst) = rows
        .iter()
        .filter_map(|r| Some((r, r.measured.goodput_frac / others_best(m, &r.scenario)?.0)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
    else {
        return out;
    };
    out.push(Target {
        what: "goodput ≥ 97 % of the best any other arm reached tuned on the cell, in every cell"
            .into(),
        measured: format!("worst {} ({})", pct(worst.1), worst.0.scenario),
        met: worst.1 >= 0.97,
        why: (worst.1 < 0.97).then(|| {
            let below: Vec<String> = rows
                .iter()
                .filter_map(|r| {
                    let (best, arm) = others_best(m, &r.scenario)?;
                    let x = r.measured.goodput_frac / best;
                    (x < 0.97).then(|| {
                        format!(
                            "{} {} of {}'s (busy by {})",
                            r.scenario,
                            pct(x),
                            super::letter(arm),
                            busy_terms(r)
                        )
                    })
                })
                .collect();
            format!(
                "below in {} of {} cells: {}",
                below.len(),
                rows.len(),
                below.join("; ")
            )
        }),
    });
    let static_worst = rows
        .iter()
        .filter_map(|r| {
            let e = row(m, &r.scenario, ArmKind::Loadgate)?;
            Some((r, r.measured.goodput_frac - e.measured.goodput_frac))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((r, d)) = static_worst {
        out.push(Target {
            what: "never below arm (e) as tuned on the calibration scenario".into(),
            measured: format!("worst {:+.1} points of `C*` ({})", d * 100.0, r.scenario),
            met: d >= 0.0,
            why: (d < 0.0).then(|| {
                format!(
                    "in {}, (i) turned away {} (busy by {})",
                    r.scenario,
                    super::reasons(&r.measured),
                    busy_terms(r)
                )
            }),
        });
    }
    for (load, floor) in [(2.0, 0.90), (10.0, 0.85)] {
        if let Some(r) = rows
            .iter()
            .find(|r| r.scenario == format!("long outputs {load}x"))
        {
            let g = r.measured.goodput_frac;
            out.push(Target {
                what: format!(
                    "long outputs at {load} × the cell's `C*`: goodput ≥ {}",
                    pct(floor)
                ),
                measured: pct(g),
                met: g >= floor,
                why: (g < floor)
                    .then(|| format!("(i) turned away {}", pct(r.measured.reject_rate))),
            });
        }
    }
    if let Some(r) = rows.iter().min_by(|a, b| {
        a.measured
            .attainment_admitted
            .total_cmp(&b.measured.attainment_admitted)
    }) {
        let a = r.measured.attainment_admitted;
        out.push(Target {
            what: "admitted SLO attainment ≥ 99 % in every cell".into(),
            measured: format!("worst {} ({})", pct(a), r.scenario),
            met: a >= 0.99,
            why: (a < 0.99).then(|| {
                format!(
                    "in {}, admitted p99 TTFT {} ms and TPOT {} ms",
                    r.scenario,
                    ms(r.measured.ttft_ms.p99),
                    ms(r.measured.tpot_ms.p99)
                )
            }),
        });
    }
    if let Some(r) = rows.iter().max_by(|a, b| {
        a.measured
            .reject_beyond_network_ms
            .p99
            .total_cmp(&b.measured.reject_beyond_network_ms.p99)
    }) {
        let t = r.measured.reject_beyond_network_ms.p99;
        out.push(Target {
            what: "p99 time to a 529 under 1 ms beyond the network trips, in every cell".into(),
            measured: format!("worst {t:.2} ms ({})", r.scenario),
            met: t < 1.0,
            why: (t >= 1.0).then(|| format!("in {}: {}", r.scenario, super::reasons(&r.measured))),
        });
    }
    if let Some((r, f)) = rows
        .iter()
        .filter_map(|r| Some((r, r.measured.slo?.flips_per_worker_minute)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
    {
        out.push(Target {
            what: "a worker's verdict changes at most about once per 10 s (6 a minute)".into(),
            measured: format!("worst {f:.0} a minute ({})", r.scenario),
            met: f <= 6.0,
            why: (f > 6.0).then(|| {
                "the verdict is the gate at the rank's line, like any concurrency limit: at \
                 capacity each finished request frees room that the next admission takes, and \
                 each is a change; the hysteresis (10 % below the line, one typical request below \
                 the KV line) keeps a single prompt's width from flapping, not a full engine's \
                 turnover. The line itself holds still \
                 (next rows)"
                    .into()
            }),
        });
    }
    let line = |r: &&Row| r.measured.slo.map(|f| f.line);
    if let Some((r, f)) = rows
        .iter()
        .filter(|r| r.group == "steady" && r.load > 1.0)
        .filter_map(|r| Some((r, line(r)?)))
        .max_by(|a, b| a.1.cv.total_cmp(&b.1.cv))
    {
        out.push(Target {
            what:
                "no oscillation at steady overload: each worker's line (the requests booked when \
                   its verdict turns busy) within a 5 % coefficient of variation over the last \
                   quarter of the arrivals"
                    .into(),
            measured: format!("worst {} ({})", pct(f.cv), r.scenario),
            met: f.cv <= 0.05,
            why: (f.cv > 0.05).then(|| format!("in {}: the line still moved", r.scenario)),
        });
    }
    if let Some((r, f)) = rows
        .iter()
        .filter(|r| r.scenario.starts_with(Shift::SwitchToLongOutputs.name()))
        .filter_map(|r| Some((r, line(r)?)))
        .max_by(|a, b| a.1.settle_s.total_cmp(&b.1.settle_s))
    {
        out.push(Target {
            what: "after the workload's switch, every worker's line within 10 % of where it ends \
                   in about 10 s"
                .into(),
            measured: format!("worst {:.0} s ({})", f.settle_s, r.scenario),
            met: f.settle_s <= 10.0,
            why: (f.settle_s > 10.0).then(|| {
                format!(
                    "in {}: the engines were still filling with long answers",
                    r.scenario
                )
            }),
        });
    }
    out
}

/// The section, in markdown.
pub(super) fn section(m: &Matrix) -> String {
    let rows = rows(m);
    if rows.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "## Arm (i): loadgate given only the SLO\n\n\
         Arm (i) is `Monitor::set_slo` with the run's SLO and nothing else to tune: no threshold or \
         gate, flow control on at its defaults. Each rank's step time is fitted from the token gaps the \
         frontend sees, each answer's KV is reserved from the lengths answers had, and a rank is busy \
         while its predicted time to first token or per output token, with the fit's error as \
         headroom (and the latter times a margin the rank's answers that streamed slower than the \
         target raise, so that one in 200 misses), misses the SLO, or while requests its engine reported waiting for a seat have not \
         all been seated (as many of its bookings have ended since), or while its bookings pass \
         the seats its reports showed (and, between reports, its bookings' first tokens), never \
         more than the engine's own (the workers declare \
         their `max_num_seqs`, as a Dynamo worker's card does) and those until any are learned, by \
         more than a probe (a 64th of their geometric mean with the engine's per tenth of a second \
         between reports, up to an eighth, never past the engine's seats). \
         Power-of-two routing compares the two picks' slack. A request no rank can take waits in \
         the frontend queue only if twice its predicted wait (the requests ahead over the drain \
         measured over the budget, the lesser of the queue's dispatches and the bookings that \
         ended, less what more important requests take, and no less than what remains of the \
         dispatches' longest recent pause) fits the TTFT target less the time to first \
         token seen after dispatch; otherwise it hears 529 at once \
         ([behaviour.md](behaviour.md#slo-admission)).\n\n| target | measured | |\n|---|---|---|\n",
    );
    let ts = targets(m);
    s += &target_rows(&ts);
    s += &missed_list(&ts);
    s += "\nEvery cell: (i)'s goodput (share of the cell's `C*`), the best any other arm reached \
          tuned on the cell, arm (e) as tuned on the calibration scenario, (i)'s admitted SLO \
          attainment, |predicted − observed| time to first token and per output token (median / \
          p90, ms, over the admitted requests with a trusted prediction, and their share), its \
          verdict changes per worker per minute, what turned the ranks busy (each term's share \
          of the turns, `frontend_slo_turned_busy_total`: the KV, a predicted time, the learned \
          seats, or requests the engine reported waiting), and its line: the highest worker's \
          level (mean over the last quarter of the arrivals, requests), the largest coefficient \
          of variation about it, and the seconds from the start (or the switch) until every line \
          stayed within 10 % of its level.\n\n\
          | cell | (i) | best other | (e) | attainment | TTFT error | TPOT error | predicted | changes | turned busy by | line | CV | settles |\n\
          |---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for r in rows {
        let best = others_best(m, &r.scenario).map_or("–".into(), |(g, k)| {
            format!("{} {}", pct(g), super::letter(k))
        });
        let e = row(m, &r.scenario, ArmKind::Loadgate)
            .map_or("–".into(), |e| pct(e.measured.goodput_frac));
        let f = r.measured.slo.unwrap_or_default();
        s += &format!(
            "| {} | {} | {best} | {e} | {} | {} / {} | {} / {} | {} | {:.0} | {} | {:.0} | {} | {:.0} s |\n",
            r.scenario,
            pct(r.measured.goodput_frac),
            pct(r.measured.attainment_admitted),
            ms(f.ttft_error_ms.0),
            ms(f.ttft_error_ms.1),
            ms(f.tpot_error_ms.0),
            ms(f.tpot_error_ms.1),
            pct(f.predicted_share),
            f.flips_per_worker_minute,
            busy_terms(r),
            f.line.level,
            pct(f.line.cv),
            f.line.settle_s,
        );
    }
    s + "\n"
}
