//! The frontend queue's section of docs/overload.md: arms (g) and (h)
//! against arm (e) on bursty arrivals, the tenants' fairness and the light
//! tenants served alone, and priority inversions, each target checked.

use super::{missed_list, ms, pct, row, target_rows, Target};
use crate::arm::ArmKind;
use crate::matrix::Matrix;

/// The targets of arms (g) and (h).
fn targets(m: &Matrix) -> Vec<Target> {
    let slo = m.conditions.slo.ttft_s * 1e3;
    let mut out = Vec::new();
    for load in [1.2, 2.0] {
        let name = format!("bursty {load}x");
        let (Some(e), Some(g)) = (
            row(m, &name, ArmKind::Loadgate),
            row(m, &name, ArmKind::Queue),
        ) else {
            continue;
        };
        let (ge, gg) = (e.measured.goodput_frac, g.measured.goodput_frac);
        let p99 = g.measured.ttft_ms.p99;
        let met = gg > ge && p99 <= slo;
        out.push(Target {
            what: format!(
                "bursty arrivals at {load} × `C*`: (g)'s goodput above (e)'s, admitted p99 TTFT \
                 within the SLO ({} ms)",
                ms(slo)
            ),
            measured: format!("{} against {}; p99 {} ms", pct(gg), pct(ge), ms(p99)),
            met,
            why: (!met).then(|| {
                format!(
                    "(g) turned away {} ({}) where (e) turned away {}",
                    pct(g.measured.reject_rate),
                    super::reasons(&g.measured),
                    pct(e.measured.reject_rate)
                )
            }),
        });
    }
    if let Some(h) = m
        .rows
        .iter()
        .find(|r| r.group == "tenants" && r.arm == ArmKind::FairQueue && !r.defaults)
    {
        let jain = h.jain.unwrap_or(0.0);
        let others: Vec<String> = [ArmKind::Loadgate, ArmKind::Queue]
            .into_iter()
            .filter_map(|k| {
                m.rows
                    .iter()
                    .find(|r| r.group == "tenants" && r.arm == k && !r.defaults)
            })
            .map(|r| format!("{} {:.3}", super::letter(r.arm), r.jain.unwrap_or(0.0)))
            .collect();
        out.push(Target {
            what: format!("{}: (h)'s Jain's index ≥ 0.95", h.scenario),
            measured: format!("{jain:.3} ({})", others.join(", ")),
            met: jain >= 0.95,
            why: (jain < 0.95).then(|| {
                format!(
                    "the tenants' goodput was {}",
                    tenant_goodputs(m, ArmKind::FairQueue)
                )
            }),
        });
        let worst = m
            .alone
            .iter()
            .filter(|a| a.arm == ArmKind::FairQueue)
            .map(|a| (a.tenant, a.shared_rps / a.alone_rps.max(1e-9)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((tenant, ratio)) = worst {
            out.push(Target {
                what: "the light tenants' goodput beside the heavy one ≥ 95 % of theirs alone (h)"
                    .into(),
                measured: format!("worst {} (tenant {tenant})", pct(ratio)),
                met: ratio >= 0.95,
                why: (ratio < 0.95).then(|| {
                    format!(
                        "tenant {tenant} kept {} of its goodput alone; the tenants' goodput was {}",
                        pct(ratio),
                        tenant_goodputs(m, ArmKind::FairQueue)
                    )
                }),
            });
        }
        out.push(Target {
            what: format!("{}: zero priority inversions (h)", h.scenario),
            measured: h.measured.inversions.to_string(),
            met: h.measured.inversions == 0,
            why: (h.measured.inversions > 0).then(|| {
                format!(
                    "{} rejections of class 0 came within 100 ms of a class-1 request entering an engine ({})",
                    h.measured.inversions,
                    super::reasons(&h.measured)
                )
            }),
        });
    }
    out
}

fn tenant_goodputs(m: &Matrix, arm: ArmKind) -> String {
    m.rows
        .iter()
        .find(|r| r.group == "tenants" && r.arm == arm && !r.defaults)
        .map_or("–".into(), |r| {
            (0..r.measured.tenants.len())
                .map(|t| format!("{:.1}", r.measured.tenant_goodput_rps(t)))
                .collect::<Vec<_>>()
                .join(" : ")
        })
}

/// The section, in markdown.
pub(super) fn section(m: &Matrix) -> String {
    let mut s = String::from(
        "## Arms (g) and (h): the frontend queue's targets\n\n| target | measured | |\n|---|---|---|\n",
    );
    let ts = targets(m);
    s += &target_rows(&ts);
    s += &missed_list(&ts);
    s += "\nThe light tenants of the tenants scenario, each run again with only its own requests \
          (goodput, requests/s):\n\n| arm | tenant | alone | beside the others | kept |\n|---|---|---|---|---|\n";
    for a in &m.alone {
        s += &format!(
            "| {} | {} | {:.1} | {:.1} | {} |\n",
            a.arm.label(),
            a.tenant,
            a.alone_rps,
            a.shared_rps,
            pct(a.shared_rps / a.alone_rps.max(1e-9))
        );
    }
    s += "\nHow the queue arms use the queue: every request goes through `Monitor::dispatch`, which \
          sends it at once when a worker is free by the frontend thresholds and otherwise queues it; \
          the monitors' maintenance (`Monitor::maintain`, run after every event and at the time it \
          returns, as the monitor's own thread would wake) sends what waits at the virtual instant \
          a report, a released booking or a lease's end shows room, and refuses what waited its \
          deadline. A worker gate's refusal of a request that never started goes back to the monitor \
          (`Monitor::redispatch`), which puts it back into the queue at its place with what is left \
          of its deadline, so the queue, not a worker, decides who is turned away: by band, then (in \
          (h)) by tenant. The queue picks free workers round robin. Arms (g) and (h) each had their \
          own search of the same budget over arm (e)'s knobs and the queue's limit and deadline, on \
          the calibration scenario (one tenant). The queue spends part of the TTFT SLO waiting, so \
          (g) and (h) run closer to the SLO at p99 than (e), which refuses at once.";
    let gate_queue = m
        .tuned
        .iter()
        .find(|t| t.arm.kind == ArmKind::Queue)
        .and_then(|t| t.arm.gate)
        .map(|g| g.queue);
    if gate_queue == Some(0) {
        s += " The search chose worker gates without a queue: a worker refuses at once what it \
              cannot start, and waiting happens only in the frontend queue, whose order is by \
              band and tenant, where a worker's FIFO queue would hand a light tenant's request \
              the same wait as everyone's.";
    }
    s += "\n\n";
    s
}
