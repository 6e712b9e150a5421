//! The many-frontends section of docs/overload.md: four replicas of arms
//! (e) and (g) without booking sync, with shared sync and with leased sync,
//! against one frontend, their targets checked.

use super::{missed_list, ms, pct, target_rows, Target};
use crate::matrix::Matrix;
use crate::replicas::{ReplicaRow, Sharing, DEBOUNCE_S, REPLICAS, WORKERS};

fn find<'a>(
    m: &'a Matrix,
    design: &str,
    load: f64,
    frontends: u32,
    sync: Sharing,
) -> Option<&'a ReplicaRow> {
    m.replicas.iter().find(|r| {
        r.design == design && r.load == load && r.frontends == frontends && r.sync == sync
    })
}

fn mode(r: &ReplicaRow) -> String {
    match (r.frontends, r.sync) {
        (1, _) => "one frontend".into(),
        (n, Sharing::None) => format!("{n} frontends, no sync"),
        (n, Sharing::Shared) => format!("{n} frontends, shared sync"),
        (n, Sharing::Leased) => format!("{n} frontends, leased sync"),
    }
}

/// The goodput target of `design` with `sync`: four replicas keep 98 % of
/// one frontend's goodput at 3 × capacity, within the SLO.
fn target(m: &Matrix, design: &str, sync: Sharing) -> Option<Target> {
    let slo = m.conditions.slo.ttft_s * 1e3;
    let one = find(m, design, 3.0, 1, Sharing::None)?;
    let shared = find(m, design, 3.0, REPLICAS, sync)?;
    let of_one = |r: &ReplicaRow| r.measured.goodput_rps / one.measured.goodput_rps.max(1e-9);
    let letter = design;
    let (ratio, p99) = (of_one(shared), shared.measured.ttft_ms.p99);
    let met = ratio >= 0.98 && p99 <= slo;
    let how = if sync == Sharing::Leased {
        "leased"
    } else {
        "shared"
    };
    Some(Target {
        what: format!(
            "{letter}: {REPLICAS} frontends with {how} sync at 3 × capacity, goodput ≥ 98 % of \
             one frontend's, admitted p99 TTFT within the SLO"
        ),
        measured: format!("{}; p99 {} ms", pct(ratio), ms(p99)),
        met,
        why: (!met).then(|| {
            let one_p99 = ms(one.measured.ttft_ms.p99);
            let over = shared.over_admitted;
            match sync {
                Sharing::Leased if ratio < 0.98 => format!(
                    "the replicas' leases held all run (fenced {} times), and the refusals were \
                     queue deadlines ({}): a replica dispatches a request only if it fits whole \
                     within its own share of a worker's line, a quarter while all four are busy, \
                     where one frontend dispatches while a worker is at or below its whole line, \
                     so with the line split four ways a request at the head of a queue waits \
                     for room longer; the cost grows with the split: {} of one frontend's \
                     goodput with 2 leased replicas ({over:+} admissions against one frontend's \
                     with 4)",
                    shared.fenced,
                    pct(deadline_share(shared)),
                    find(m, design, 3.0, 2, Sharing::Leased)
                        .map_or("–".into(), |two| pct(of_one(two))),
                ),
                Sharing::Leased => format!(
                    "goodput met; the admitted p99 TTFT passes the SLO, where one frontend's \
                     was {one_p99} ms ({over:+} admissions against one frontend's)"
                ),
                _ => format!(
                    "goodput {}; one frontend's admitted p99 TTFT was {one_p99} ms; the \
                     replicas' views lag the others' bookings by up to a debounce interval and \
                     a transport delay, so a few more requests wait in a fuller engine ({over:+} \
                     admissions against one frontend's)",
                    if ratio >= 0.98 { "met" } else { "missed" },
                ),
            }
        }),
    })
}

/// The fraction of a run's refusals that were queue deadlines.
fn deadline_share(r: &ReplicaRow) -> f64 {
    let by = &r.measured.rejections_by;
    let all: u64 = by.values().sum();
    let deadline = by.get("frontend queue: deadline").copied().unwrap_or(0);
    deadline as f64 / all.max(1) as f64
}

/// Whether the runs without sync show the damage: for some design, four
/// replicas without sync lose goodput that sync wins back.
fn damage(m: &Matrix, designs: &[&str]) -> Target {
    let mut parts = Vec::new();
    let mut shown = false;
    for d in designs {
        let (Some(one), Some(none), Some(shared)) = (
            find(m, d, 3.0, 1, Sharing::None),
            find(m, d, 3.0, REPLICAS, Sharing::None),
            find(m, d, 3.0, REPLICAS, Sharing::Shared),
        ) else {
            continue;
        };
        let of_one = |r: &ReplicaRow| r.measured.goodput_rps / one.measured.goodput_rps.max(1e-9);
        shown |= of_one(none) < of_one(shared) - 0.01;
        parts.push(format!(
            "{d}: {} without sync, {} with (p99 {} / {} ms)",
            pct(of_one(none)),
            pct(of_one(shared)),
            ms(none.measured.ttft_ms.p99),
            ms(shared.measured.ttft_ms.p99)
        ));
    }
    Target {
        what: format!(
            "without sync, the same runs show the damage (goodput of one frontend's at 3 × \
             capacity, {REPLICAS} replicas)"
        ),
        measured: parts.join("; "),
        met: shown,
        why: (!shown).then(|| "no design lost goodput without sync".into()),
    }
}

/// Leased mode never over-admits: in no leased run did an admission leave
/// a rank past its line.
fn never_over(m: &Matrix) -> Target {
    let breaches = |sync: Sharing| -> u64 {
        m.replicas
            .iter()
            .filter(|r| r.frontends > 1 && r.sync == sync)
            .map(|r| r.line_breaches)
            .sum()
    };
    let leased = breaches(Sharing::Leased);
    Target {
        what: "leased sync never over-admits: no admission leaves a rank's admitted blocks past \
               its line, in any run"
            .into(),
        measured: format!(
            "{leased} breaches in the leased runs (shared sync {}, no sync {})",
            breaches(Sharing::Shared),
            breaches(Sharing::None)
        ),
        met: leased == 0,
        why: (leased > 0).then(|| "an admission passed the line in a leased run".into()),
    }
}

/// The section, in markdown.
pub(super) fn section(m: &Matrix) -> String {
    if m.replicas.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "## Many frontends, one fleet\n\n{WORKERS} workers behind one frontend or {REPLICAS} \
         replicas (a load balancer hands each request to the next), at 1.5 and 3 times the \
         fleet's capacity (taken as twice `C*`: each worker is an engine of its own). The designs \
         are arms (e) and (g) as tuned, and (g) without worker gates, where the frontends alone \
         decide. With sync the replicas share their bookings ([replicas.md](replicas.md)): a \
         message of what changed every {} ms at most, crossing the transport like the load \
         reports. \
         Over-admissions are the requests the replicas let into an engine beyond what one \
         frontend let in of the very same requests (negative: fewer). With worker gates, no \
         replica can push a worker past its N + Q, so sync changes little; without them, sync \
         is what holds the fleet to one frontend's decisions. With leased sync each replica \
         books only within its leased share of every worker's line (a lease of 200 ms here, so \
         a replica books nothing for the first 0.3 s of a run). A line breach is an admission \
         after which the blocks the replicas had admitted to a rank, and not let go, passed the \
         rank's line (the decode threshold times its KV blocks); leased sync is built to have \
         none.\n\n\
         | target | measured | |\n|---|---|---|\n",
        DEBOUNCE_S * 1e3
    );
    let mut designs: Vec<&str> = m.replicas.iter().map(|r| r.design).collect();
    designs.dedup();
    let mut ts: Vec<Target> = designs
        .iter()
        .filter_map(|d| target(m, d, Sharing::Shared))
        .collect();
    ts.push(damage(m, &designs));
    ts.push(never_over(m));
    ts.extend(designs.iter().filter_map(|d| target(m, d, Sharing::Leased)));
    let worst = m
        .replicas
        .iter()
        .filter(|r| r.sync != Sharing::None)
        .map(|r| r.sync_messages as f64 / r.sync_budget.max(1) as f64)
        .fold(0.0f64, f64::max);
    ts.push(Target {
        what: format!(
            "sync traffic: at most one message per frontend per debounce interval ({} ms)",
            DEBOUNCE_S * 1e3
        ),
        measured: format!("at most {} of that", pct(worst)),
        met: worst <= 1.0,
        why: (worst > 1.0).then(|| "more messages than debounce intervals".into()),
    });
    s += &target_rows(&ts);
    s += &missed_list(&ts);
    s += "\n| design | load | mode | goodput | admitted p99 TTFT (ms) | rejected | over-admissions | \
          line breaches (most blocks past) | sync messages (mean / largest bytes) |\n\
          |---|---|---|---|---|---|---|---|---|\n";
    for r in &m.replicas {
        let traffic = if r.sync != Sharing::None {
            format!(
                "{} ({:.0} / {})",
                r.sync_messages,
                r.sync_bytes as f64 / r.sync_messages.max(1) as f64,
                r.sync_max
            )
        } else {
            "–".into()
        };
        s += &format!(
            "| {} | {}× | {} | {} | {} | {} | {} | {} ({}) | {traffic} |\n",
            r.design,
            r.load,
            mode(r),
            pct(r.measured.goodput_frac),
            ms(r.measured.ttft_ms.p99),
            pct(r.measured.reject_rate),
            if r.frontends == 1 {
                "–".to_string()
            } else {
                format!("{:+}", r.over_admitted)
            },
            r.line_breaches,
            r.peak_over_line,
        );
    }
    s += "\n";
    s
}
