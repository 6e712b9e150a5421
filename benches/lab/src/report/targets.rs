//! Arm (e)'s targets: each with what it asks, what was measured, met or
//! not, and a miss explained from the run's own figures.

use super::{ms, pct, reasons, row, secs};
use crate::arm::ArmKind;
use crate::matrix::{Matrix, Row};

/// One target of arm (e): what it asks, what was measured, met or not.
pub(super) struct Target {
    pub(super) what: String,
    pub(super) measured: String,
    pub(super) met: bool,
    pub(super) why: Option<String>,
}

/// A targets table's rows, one per target: what, measured, met or not.
pub(super) fn target_rows(ts: &[Target]) -> String {
    ts.iter()
        .map(|t| {
            let verdict = if t.met { "met" } else { "**missed**" };
            format!("| {} | {} | {verdict} |\n", t.what, t.measured)
        })
        .collect()
}

/// The missed targets of `ts`, each with why.
pub(super) fn missed_list(ts: &[Target]) -> String {
    ts.iter()
        .filter(|t| !t.met)
        .map(|t| {
            let why = t.why.clone().unwrap_or_default();
            format!("\n- **{}** is missed: {why}.\n", t.what)
        })
        .collect()
}

pub(super) fn targets(m: &Matrix) -> Vec<Target> {
    let e = ArmKind::Loadgate;
    let mut out = Vec::new();
    let slo = m.conditions.slo.ttft_s * 1e3;
    for (load, want) in [(2.0, 0.95), (4.0, 0.90), (10.0, 0.80)] {
        let name = format!("steady {load}x");
        if let Some(r) = row(m, &name, e) {
            let g = r.measured.goodput_frac;
            let bucket =
                row(m, &name, ArmKind::TokenBucket).map_or(0.0, |o| o.measured.reject_rate);
            out.push(Target {
                what: format!("goodput at {load} × `C*` ≥ {}", pct(want)),
                measured: pct(g),
                met: g >= want,
                why: (g < want).then(|| format!(
                    "its admitted requests met the SLOs {} of the time, so the loss is in admission: it turned away {} of \
                     offered requests where the token bucket at `C*` turned away {} ({}). The frontend decides on reports up to one \
                     interval old: it finds every worker busy for a moment while one is about to free a slot, and a \
                     worker's gate refuses when that worker is full although another has room{}. Arm (g), the same with \
                     loadgate's frontend queue, which sends a request the moment a worker has room, reached {} here",
                    pct(r.measured.attainment_admitted), pct(r.measured.reject_rate), pct(bucket),
                    reasons(&r.measured),
                    match m.tuned.iter().find(|t| t.arm.kind == e).map_or(0, |t| t.arm.reroute) {
                        0 => " (the frontend answers that refusal with a 529)".to_string(),
                        n => format!(" (the frontend routes a refused request {n} more time{}, then answers 529)", if n == 1 { "" } else { "s" }),
                    },
                    row(m, &name, ArmKind::Queue).map_or("–".into(), |g| pct(g.measured.goodput_frac)))),
            });
        }
    }
    let worst = m
        .rows
        .iter()
        .filter(|r| r.arm == e && !r.defaults && matches!(r.group, "steady" | "bursty"))
        .max_by(|a, b| a.measured.ttft_ms.p99.total_cmp(&b.measured.ttft_ms.p99));
    if let Some(r) = worst {
        let v = r.measured.ttft_ms.p99;
        out.push(Target {
            what: format!(
                "admitted p99 TTFT within the SLO ({}) at every load",
                ms(slo)
            ),
            measured: format!("worst {} ms ({})", ms(v), r.scenario),
            met: v <= slo,
            why: (v > slo)
                .then(|| format!("in {} the admitted p99 TTFT was {} ms", r.scenario, ms(v))),
        });
    }
    let worst = m
        .rows
        .iter()
        .filter(|r| {
            r.arm == e && !r.defaults && r.group == "steady" && r.measured.reject_rate > 0.0
        })
        .max_by(|a, b| {
            let beyond = |r: &Row| r.measured.reject_beyond_network_ms.p99;
            beyond(a).total_cmp(&beyond(b))
        });
    if let Some(r) = worst {
        let beyond = r.measured.reject_beyond_network_ms.p99;
        let deadline = r
            .measured
            .rejections_by
            .get("worker gate: queue deadline")
            .copied()
            .unwrap_or(0);
        let all: u64 = r.measured.rejections_by.values().sum();
        out.push(Target {
            what: "p99 time to a 529 under 1 ms beyond the network delay (each attempt's own trips \
                   between frontend and workers)"
                .into(),
            measured: format!("worst {} ms beyond ({})", ms(beyond), r.scenario),
            met: beyond < 1.0,
            why: (beyond >= 1.0).then(|| format!(
                "in {}, {} of the rejections came from the worker gate's queue deadline, after the request \
                 had waited its deadline in the queue; every other rejection was heard within its network \
                 time. The tuning kept a queue (Q > 0) because it raised goodput; a queue that hands a \
                 request to whichever worker frees first (frontend flow control), with a deadline set from \
                 the measured drain rate rather than a fixed one, would answer the hopeless ones at once",
                r.scenario, pct(deadline as f64 / all.max(1) as f64))),
        });
    }
    let mean = row(m, "steady 1x", e).map_or(0.0, |r| r.measured.mean_duration_s);
    if let Some(r) = m
        .rows
        .iter()
        .find(|r| r.arm == e && !r.defaults && r.group == "step")
    {
        let met = r.settle_s.is_some_and(|s| s <= mean);
        out.push(Target {
            what: format!("settles within one mean request duration ({mean:.1} s) after the 1.4 × step"),
            measured: secs(r.settle_s),
            met,
            why: (!met).then(|| format!(
                "goodput is counted when requests complete, so a change shows only as the requests in flight at the step finish; the settling rule also needs ten seconds in a row within 10 % of the final level, which a one-second bin of about {:.0} completions misses by chance alone", m.capacity)),
        });
    }
    for r in m
        .rows
        .iter()
        .filter(|r| r.arm == e && !r.defaults && r.group == "spike")
    {
        let met = r.recover_s.is_some_and(|s| s <= 2.0 * mean);
        out.push(Target {
            what: format!("back to 95 % of `min(offered, C*)` within two mean request durations ({:.1} s) after the spike, {}", 2.0 * mean, r.scenario.split(", ").nth(1).unwrap_or("")),
            measured: secs(r.recover_s),
            met,
            why: (!met).then(|| "the clients' retries kept the offered load above capacity after the spike".into()),
        });
    }
    if let (Some(a), Some(x)) = (
        row(m, "steady 0.5x", ArmKind::NoControl),
        row(m, "steady 0.5x", e),
    ) {
        let added50 = x.measured.ttft_ms.p50 / a.measured.ttft_ms.p50 - 1.0;
        let added99 = x.measured.ttft_ms.p99 / a.measured.ttft_ms.p99 - 1.0;
        let met = added50 <= 0.01 && added99 <= 0.01;
        out.push(Target {
            what: "at most 1 % added TTFT at 0.5 × (against arm (a))".into(),
            measured: format!("p50 {:+.1} %, p99 {:+.1} %", 100.0 * added50, 100.0 * added99),
            met,
            why: (!met).then(|| format!(
                "nothing is rejected at 0.5 ×; the difference is routing: arm (e) uses {} routing, which balances KV blocks, while TTFT follows the prefill queue that round-robin spreads evenly; a prefill-aware pick (router-side prefill bookings) would close it", m.tuned.iter().find(|t| t.arm.kind == e).map_or("", |t| t.arm.policy))),
        });
    }
    out
}
