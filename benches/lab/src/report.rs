//! docs/overload.md, its SVG plots, and `--json`: the matrix as tables and
//! pictures, with arm (e)'s targets checked and each miss explained from
//! the run's own figures.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use crate::arm::ArmKind;
use crate::matrix::{Matrix, Row};

mod flow;
mod replicas;
mod shifted;
mod slo;
mod targets;

pub use shifted::mocker_table;
use targets::{missed_list, target_rows, targets, Target};

/// Arm `arm` as tuned on `scenario`.
fn row<'a>(m: &'a Matrix, scenario: &str, arm: ArmKind) -> Option<&'a Row> {
    m.rows
        .iter()
        .find(|r| r.scenario == scenario && r.arm == arm && !r.defaults)
}

/// Arm `arm` with its defaults on `scenario` (the arms without knobs: as
/// they are).
fn defaults_row<'a>(m: &'a Matrix, scenario: &str, arm: ArmKind) -> Option<&'a Row> {
    m.rows
        .iter()
        .find(|r| r.scenario == scenario && r.arm == arm && r.defaults)
        .or_else(|| {
            let tunable = ArmKind::TUNABLE.contains(&arm);
            (!tunable).then(|| row(m, scenario, arm)).flatten()
        })
}

/// The best goodput any arm reached on `scenario` when tuned there (arms
/// without knobs as they ran), and which arm.
fn cell_best(m: &Matrix, scenario: &str) -> Option<(f64, ArmKind)> {
    cell_best_but(m, scenario, None)
}

/// [`cell_best`] leaving out arm `but` (the best any *other* arm reached).
fn cell_best_but(m: &Matrix, scenario: &str, but: Option<ArmKind>) -> Option<(f64, ArmKind)> {
    let tuned_there = m
        .cell_best
        .iter()
        .filter(|c| c.scenario == scenario)
        .map(|c| (c.goodput_frac, c.arm));
    let fixed = m
        .rows
        .iter()
        .filter(|r| r.scenario == scenario && !ArmKind::TUNABLE.contains(&r.arm))
        .filter(|r| Some(r.arm) != but)
        .map(|r| (r.measured.goodput_frac, r.arm));
    tuned_there.chain(fixed).max_by(|a, b| a.0.total_cmp(&b.0))
}

fn letter(k: ArmKind) -> &'static str {
    &k.label()[..3]
}

/// Which rows a table shows.
#[derive(Clone, Copy, PartialEq)]
enum Knobs {
    /// The arms as tuned.
    Tuned,
    /// The arms as tuned, and a last column with the scenario's best
    /// goodput when tuned on it.
    TunedAndBest,
    /// The arms with their defaults.
    Defaults,
}

/// A table: one line per scenario of `group`, one column per arm.
fn table(m: &Matrix, group: &str, head: &str, cell: impl Fn(&Row) -> String) -> String {
    table_of(m, group, head, Knobs::Tuned, cell)
}

/// [`table`] of the rows `knobs` names.
fn table_of(
    m: &Matrix,
    group: &str,
    head: &str,
    knobs: Knobs,
    cell: impl Fn(&Row) -> String,
) -> String {
    let mut s = format!("| {head} |");
    for k in ArmKind::ALL {
        let _ = write!(s, " {} |", letter(k));
    }
    let best = knobs == Knobs::TunedAndBest;
    if best {
        s.push_str(" best tuned on the cell |");
    }
    s.push_str("\n|---|");
    s.push_str(&"---|".repeat(ArmKind::ALL.len() + usize::from(best)));
    s.push('\n');
    for sc in m.scenarios.iter().filter(|s| s.group == group) {
        let _ = write!(s, "| {} |", sc.name);
        for k in ArmKind::ALL {
            let r = match knobs {
                Knobs::Defaults => defaults_row(m, &sc.name, k),
                _ => row(m, &sc.name, k),
            };
            let c = r.map_or("–".into(), &cell);
            let _ = write!(s, " {c} |");
        }
        if best {
            let c = cell_best(m, &sc.name)
                .map_or("–".into(), |(g, k)| format!("{} {}", pct(g), letter(k)));
            let _ = write!(s, " {c} |");
        }
        s.push('\n');
    }
    s
}

/// Rejected attempts by where and why, as shares of offered requests.
fn reasons(m: &crate::record::Measured) -> String {
    let offered = m.accounting.offered.max(1) as f64;
    let parts: Vec<String> = m
        .rejections_by
        .iter()
        .map(|(k, v)| format!("{k}: {}", pct(*v as f64 / offered)))
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join("; ")
    }
}

/// A latency cell, or "–" for a run that completed nothing.
fn latency(r: &Row, cell: impl Fn(&crate::record::Measured) -> String) -> String {
    if r.measured.accounting.completed == 0 {
        "–".into()
    } else {
        cell(&r.measured)
    }
}

fn pct(x: f64) -> String {
    format!("{:.1} %", 100.0 * x)
}

fn ms(x: f64) -> String {
    if x >= 10_000.0 {
        format!("{:.0} s", x / 1000.0)
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

fn secs(x: Option<f64>) -> String {
    x.map_or("never".into(), |v| format!("{v:.0} s"))
}

/// Writes docs/overload.md and the plots into `docs`.
pub fn write_docs(m: &Matrix, docs: &Path) -> Result<(), String> {
    let dir = docs.join("overload");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    plot_load(
        m,
        &dir.join("goodput.svg"),
        "Goodput (fraction of C*)",
        |r| Some(r.measured.goodput_frac),
        false,
    )?;
    plot_load(
        m,
        &dir.join("ttft.svg"),
        "Admitted p99 TTFT (ms)",
        // An arm that completed nothing has no TTFT to plot.
        |r| (r.measured.accounting.completed > 0).then_some(r.measured.ttft_ms.p99),
        true,
    )?;
    plot_spike(m, &dir.join("spike.svg"))?;
    shifted::plots(m, &dir)?;
    let text = markdown(m);
    let path = docs.join("overload.md");
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// One colour per arm, in `ArmKind::ALL`'s order.
const COLORS: [RGBColor; ArmKind::ALL.len()] = [
    RGBColor(120, 120, 120),
    RGBColor(170, 110, 40),
    RGBColor(60, 110, 200),
    RGBColor(150, 70, 170),
    RGBColor(200, 30, 30),
    RGBColor(30, 150, 60),
    RGBColor(240, 140, 0),
    RGBColor(0, 160, 170),
    RGBColor(20, 20, 20),
];

/// The cells of a plot: a group's scenarios, evenly spaced along x, each
/// labelled.
struct Cells<'a> {
    group: &'a str,
    label: &'a dyn Fn(&crate::scenario::Scenario) -> String,
    x_desc: &'a str,
    width: u32,
}

/// The steady loads, labelled with their value.
fn steady_cells() -> Cells<'static> {
    Cells {
        group: "steady",
        label: &|s| format!("{}×", s.load),
        x_desc: "offered load (× C*)",
        width: 720,
    }
}

fn plot_load(
    m: &Matrix,
    path: &Path,
    y_label: &str,
    value: impl Fn(&Row) -> Option<f64>,
    log: bool,
) -> Result<(), String> {
    plot_cells(m, path, y_label, &steady_cells(), value, log)
}

fn plot_cells(
    m: &Matrix,
    path: &Path,
    y_label: &str,
    cells: &Cells<'_>,
    value: impl Fn(&Row) -> Option<f64>,
    log: bool,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let root = SVGBackend::new(path, (cells.width, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let names: Vec<(&str, String)> = m
        .scenarios
        .iter()
        .filter(|s| s.group == cells.group)
        .map(|s| (s.name.as_str(), (cells.label)(s)))
        .collect();
    let at = |name: &str| names.iter().position(|n| n.0 == name).unwrap_or(0) as f64;
    let steady: Vec<&Row> = m
        .rows
        .iter()
        .filter(|r| r.group == cells.group && !r.defaults)
        .collect();
    let ymax = steady
        .iter()
        .filter_map(|r| value(r))
        .fold(1.0f64, f64::max)
        * 1.15;
    let series = |k: ArmKind| -> Vec<(f64, f64)> {
        steady
            .iter()
            .filter(|r| r.arm == k)
            .filter_map(|r| value(r).map(|v| (at(&r.scenario), v)))
            .collect()
    };
    let x_range = -0.3f64..(names.len() as f64 - 0.7);
    let label = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            names.get(i as usize).map_or(String::new(), |n| n.1.clone())
        } else {
            String::new()
        }
    };
    let mut builder = ChartBuilder::on(&root);
    builder
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .caption(y_label, ("sans-serif", 18));
    macro_rules! draw {
        ($chart:expr) => {{
            let mut c = $chart;
            c.configure_mesh()
                .x_labels(names.len())
                .x_label_formatter(&label)
                .light_line_style(WHITE)
                .x_desc(cells.x_desc)
                .y_desc(y_label)
                .draw()
                .map_err(|e| err(&e))?;
            for (i, k) in ArmKind::ALL.into_iter().enumerate() {
                let color = COLORS[i];
                c.draw_series(LineSeries::new(series(k), color.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(k.label())
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2))
                    });
                c.draw_series(
                    series(k)
                        .into_iter()
                        .map(|p| Circle::new(p, 3, color.filled())),
                )
                .map_err(|e| err(&e))?;
            }
            c.configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(SeriesLabelPosition::LowerRight)
                .draw()
                .map_err(|e| err(&e))?;
        }};
    }
    if log {
        draw!(builder
            .build_cartesian_2d(x_range, (10.0f64..ymax).log_scale())
            .map_err(|e| err(&e))?);
    } else {
        draw!(builder
            .build_cartesian_2d(x_range, 0.0f64..ymax)
            .map_err(|e| err(&e))?);
    }
    root.present().map_err(|e| err(&e))
}

fn plot_spike(m: &Matrix, path: &Path) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let Some(sc) = m.scenarios.iter().find(|s| s.group == "spike") else {
        return Ok(());
    };
    let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut c = ChartBuilder::on(&root)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .caption(
            format!("Goodput over time: {}", sc.name),
            ("sans-serif", 16),
        )
        .build_cartesian_2d(0.0f64..sc.duration_s, 0.0f64..1.4f64)
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .x_desc("time (s)")
        .y_desc("goodput (fraction of C*), 5 s average")
        .draw()
        .map_err(|e| err(&e))?;
    for (i, k) in ArmKind::ALL.into_iter().enumerate() {
        let Some(r) = row(m, &sc.name, k) else {
            continue;
        };
        let g = &r.measured.series_goodput;
        let pts: Vec<(f64, f64)> = (0..g.len().min((sc.duration_s / r.measured.bin_s) as usize))
            .map(|j| {
                let (lo, hi) = (j.saturating_sub(2), (j + 3).min(g.len()));
                let avg = g[lo..hi].iter().sum::<f64>() / (hi - lo) as f64;
                (j as f64 * r.measured.bin_s, avg / m.capacity)
            })
            .collect();
        let color = COLORS[i];
        c.draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(k.label())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

fn markdown(m: &Matrix) -> String {
    let c = &m.conditions;
    let e = &c.engine;
    let mut s = String::new();
    let mut w = |t: String| s.push_str(&t);
    w(format!(
        "# Overload: what loadgate is worth to a fleet\n\n\
         Generated by `cargo run --release -p loadgate-lab{}` ({} simulations, {:.0} s of wall time on {} threads); \
         every figure below is from that one run. `--json FILE` writes them all for scripts.\n\n\
         The lab drives loadgate's own code (its `Monitor`, router bookings, `AdmissionGate`, `Publisher` and \
         `Subscriber`) on a virtual clock against emulated continuous-batching engines, with one seeded, open-loop \
         workload, and runs the designs users run today beside it on the very same requests.\n\n",
        if m.options.quick { " -- --quick" } else { "" },
        m.runs,
        m.wall_s,
        m.options.threads
    ));
    if m.options.quick {
        w("**Quick mode** (CI): shorter runs, fewer loads and tuning candidates; the figures are \
           noisier than a full run's.\n\n"
            .into());
    }
    w("![goodput against offered load](overload/goodput.svg)\n\n\
       ![admitted p99 TTFT against offered load](overload/ttft.svg)\n\n\
       ![goodput through the spike](overload/spike.svg)\n\n"
        .into());

    w("## Arm (e)'s targets\n\n| target | measured | |\n|---|---|---|\n".into());
    let ts = targets(m);
    w(target_rows(&ts));
    w("\n".into());
    let missed: Vec<_> = ts.iter().filter(|t| !t.met).collect();
    if !missed.is_empty() {
        w("### Why the missed targets are missed\n\n".into());
        for t in missed {
            w(format!(
                "- **{}**: {}.\n",
                t.what,
                t.why.clone().unwrap_or_default()
            ));
        }
        w("\n".into());
    }

    w(flow::section(m));
    w(slo::section(m));
    w(shifted::section(m));
    w(replicas::section(m));
    w(format!(
        "## Conditions\n\n\
         **Fleet.** {} workers of {} data-parallel rank{}, one frontend. `C*` (the highest Poisson rate at which \
         arm (a) meets the SLOs for 99 % of requests, found by bisection) is **{:.1} requests/s**.\n\n\
         **Engine** (each rank, `src/engine.rs`): vLLM's scheduler: a FIFO waiting queue, a running batch of at most \
         `max_num_seqs`, a per-step token budget with chunked prefill, KV blocks with preemption by recompute. \
         Its waiting count is what its last step's scheduling left, as vLLM's scheduler stats are: a request \
         that arrives during a step shows only if the next step cannot take it.\n\n\
         | parameter | value | source |\n|---|---|---|\n\
         | `max_num_seqs` | {} | Dynamo mocker default (`python -m dynamo.mocker --help`, ai-dynamo 1.6.1) |\n\
         | `max_num_batched_tokens` | {} | Dynamo mocker default; vLLM's default for online serving on H100-class GPUs |\n\
         | `block_size` | {} | vLLM's default |\n\
         | KV blocks | {} ({} tokens) | Llama-3.1-8B on one 80 GB H100: 16 GB of bf16 weights, 90 % memory use, 128 KiB of KV per token (32 layers × 8 KV heads × 128 × 2 × 2 bytes) |\n\
         | step time | `prefill(T) + decode(K)` ms | Dynamo's mocker's polynomial model, as the `ai-dynamo` 1.6.1 wheel runs it (`aisimulate-core` 0.13.0, `engine/common/perf_model.rs`): `T` new prompt tokens in the step, `K` the context tokens of the requests decoding in it |\n\
         | `prefill(T)` | {:.4e}·T² + {:.4e}·T + {:.3} ms, once per step with any prefill | the mocker's prefill polynomial |\n\
         | `decode(K)` | max({}, {:.2}·u² + {:.2}·u + {:.2}) ms, u = K / KV capacity (at most 1) | the mocker's decode polynomial |\n\n**Workload** (`src/workload.rs`): open loop, each request timed from its intended send time. Poisson \
         arrivals (gamma with burstiness 0.25 in the bursty rows, as vLLM's `bench serve --burstiness`). Lengths: 90 % \
         chat (lognormal prompts, median 500 tokens, σ 0.8, at most 4096; outputs median 200, σ 0.7, at most 1024: \
         ShareGPT-shaped) and 10 % long prompts (median 4000, σ 0.3; outputs median 150). A quarter of requests are \
         priority class 0, the rest class 1. Clients give up {} s after their first send without a first token \
         and cancel; in the spike rows they retry up to 3 times (the SRE book's cap) at once, after `Retry-After` \
         (or the `openai` client's backoff, 0.5 s doubling with jitter, when there is none), or with the SRE book's \
         adaptive throttling (K = 2, a two-minute window).\n\n\
         **SLOs**: TTFT ≤ {} s and TPOT ≤ {} ms, MLPerf Inference's server-scenario limits for Llama-3.1-8B: what \
         a chat user tolerates before the first word and while reading.\n\n\
         **Signals**: each worker publishes its load every {} s through a transport that takes {} ms; the frontend \
         and workers are {} ms apart; the frontend sweeps for stale ranks every {} s. The stale rows change the \
         report interval (and the transport delay, to half of it).\n\n\
         **Metrics** follow vLLM's `bench serve`: TTFT, TPOT = (E2E − TTFT)/(output − 1), ITL, E2E. Goodput counts \
         requests that met both SLOs per second, over **offered** requests: a rejected or cancelled request counts \
         against it. For goodput TTFT runs from the first send, so retries' time counts; the admitted percentiles \
         run from the admitted attempt's send. Only requests first sent after a {} s warm-up and before the end of \
         arrivals count. Every run checks offered = completed + rejected + cancelled + in flight.\n\n",
        c.workers,
        c.dp_size,
        if c.dp_size == 1 { "" } else { "s" },
        m.capacity,
        e.max_num_seqs,
        e.max_num_batched_tokens,
        e.block_size,
        e.num_gpu_blocks,
        u64::from(e.num_gpu_blocks) * u64::from(e.block_size),
        e.step.prefill_ms[2],
        e.step.prefill_ms[1],
        e.step.prefill_ms[0],
        e.step.decode_floor_ms,
        e.step.decode_ms[2],
        e.step.decode_ms[1],
        e.step.decode_ms[0],
        crate::workload::Client::default().timeout_s,
        c.slo.ttft_s,
        c.slo.tpot_s * 1e3,
        c.report_interval_s,
        c.transport_delay_s * 1e3,
        c.net_delay_s * 1e3,
        c.sweep_interval_s,
        c.warmup_s,
    ));

    w(format!(
        "## The arms, as tuned\n\n\
         Every tunable arm had the same search: a budget of **{} candidates**, its defaults first and the rest \
         drawn with a fixed seed from the design's own knob space (the whole space where it is smaller), run on \
         the calibration scenario alone ({}: Poisson, a seed of its own; no evaluation cell has that shape). The \
         highest goodput won (in steps of 0.5 % of `C*`; ties went to the lower admitted p99 TTFT, then the \
         faster 529), and the winner is frozen for every scenario. No baseline is tuned down: each gets the same \
         search. Every scenario also runs each design with its defaults, and the same candidates once more on \
         that scenario, for the reference column \"best tuned on the cell\".\n\n\
         | arm | knobs as tuned | candidates / space | calibration goodput, tuned / defaults |\n|---|---|---|---|\n",
        m.budget, m.calibration.name,
    ));
    for t in &m.tuned {
        let (cands, goodput) = if t.candidates == 0 {
            ("no knobs".to_string(), "–".to_string())
        } else {
            (
                format!("{} / {}", t.candidates, t.space),
                format!("{} / {}", pct(t.goodput_frac), pct(t.defaults_frac)),
            )
        };
        w(format!(
            "| {} | {} | {cands} | {goodput} |\n",
            t.arm.kind.label(),
            t.arm.knobs(),
        ));
    }
    w(
        "\nThe defaults: what a user who installs a design and tunes nothing runs.\n\n\
       | arm | defaults |\n|---|---|\n"
            .into(),
    );
    for k in ArmKind::TUNABLE {
        w(format!(
            "| {} | {} |\n",
            k.label(),
            crate::arm::Arm::base(k).knobs()
        ));
    }
    w("\nWhat each arm is:\n\n".into());
    for k in ArmKind::ALL {
        w(format!("- **{}**: {}\n", k.label(), k.describe()));
    }
    w("\n".into());

    w("## Steady load\n\nGoodput, as a fraction of `C*`, each arm as tuned, and the best any arm reached \
       when tuned on that very load:\n\n"
        .into());
    w(table_of(m, "steady", "load", Knobs::TunedAndBest, |r| {
        pct(r.measured.goodput_frac)
    }));
    w("\nGoodput with each design's defaults (untuned):\n\n".into());
    w(table_of(m, "steady", "load", Knobs::Defaults, |r| {
        pct(r.measured.goodput_frac)
    }));
    w("\nAdmitted p99 TTFT with the defaults (ms):\n\n".into());
    w(table_of(m, "steady", "load", Knobs::Defaults, |r| {
        latency(r, |m| ms(m.ttft_ms.p99))
    }));
    w("\nAdmitted p99 TTFT (ms):\n\n".into());
    w(table(m, "steady", "load", |r| {
        latency(r, |m| ms(m.ttft_ms.p99))
    }));
    w("\nAdmitted TTFT p50 / p99.9 (ms):\n\n".into());
    w(table(m, "steady", "load", |r| {
        latency(r, |m| {
            format!("{} / {}", ms(m.ttft_ms.p50), ms(m.ttft_ms.p999))
        })
    }));
    w("\nAdmitted TPOT p50 / p99 / p99.9 (ms):\n\n".into());
    w(table(m, "steady", "load", |r| {
        latency(r, |m| {
            let t = m.tpot_ms;
            format!("{} / {} / {}", ms(t.p50), ms(t.p99), ms(t.p999))
        })
    }));
    w(
        "\np99 inter-token latency / median end-to-end latency of completed requests (ms):\n\n"
            .into(),
    );
    w(table(m, "steady", "load", |r| {
        latency(r, |m| {
            format!("{} / {}", ms(m.itl_ms.p99), ms(m.e2e_ms.p50))
        })
    }));
    w("\nSLO attainment over offered / over admitted requests:\n\n".into());
    w(table(m, "steady", "load", |r| {
        format!(
            "{} / {}",
            pct(r.measured.attainment_offered),
            pct(r.measured.attainment_admitted)
        )
    }));
    w("\nRejected / cancelled:\n\n".into());
    w(table(m, "steady", "load", |r| {
        format!(
            "{} / {}",
            pct(r.measured.reject_rate),
            pct(r.measured.cancel_rate)
        )
    }));
    w(
        "\np99 time to a 529, in all / beyond the attempt's own network trips (ms; the frontend \
       answers at once, a worker's refusal takes a round trip):\n\n"
            .into(),
    );
    w(table(m, "steady", "load", |r| {
        if r.measured.reject_rate > 0.0 {
            format!(
                "{} / {}",
                ms(r.measured.time_to_reject_ms.p99),
                ms(r.measured.reject_beyond_network_ms.p99)
            )
        } else {
            "–".into()
        }
    }));
    w(
        "\nWhere requests were turned away (rejected attempts as a share of offered requests):\n\n"
            .into(),
    );
    w(table(m, "steady", "load", |r| reasons(&r.measured)));
    w("\nPriority inversions (a rejection while a less important request entered an engine in the last 100 ms; a client's own local throttling is not counted):\n\n".into());
    w(table(m, "steady", "load", |r| {
        r.measured.inversions.to_string()
    }));
    w("\nEngine waste: preemptions / tokens thrown away (preemption and abort), as a share of tokens computed:\n\n".into());
    w(table(m, "steady", "load", |r| {
        let share = r.measured.wasted_tokens as f64 / r.measured.computed_tokens.max(1) as f64;
        format!("{} / {}", r.measured.preemptions, pct(share))
    }));

    w(
        "\n## Bursty arrivals (gamma, burstiness 0.25)\n\nGoodput / admitted p99 TTFT (ms):\n\n"
            .into(),
    );
    w(table_of(
        m,
        "bursty",
        "scenario",
        Knobs::TunedAndBest,
        |r| {
            format!(
                "{} / {}",
                pct(r.measured.goodput_frac),
                ms(r.measured.ttft_ms.p99)
            )
        },
    ));
    w("\nWith the defaults:\n\n".into());
    w(table_of(m, "bursty", "scenario", Knobs::Defaults, |r| {
        format!(
            "{} / {}",
            pct(r.measured.goodput_frac),
            ms(r.measured.ttft_ms.p99)
        )
    }));
    w("\n## A step and a spike\n\nGoodput / settling after the step (smoothed goodput within 10 % of its final \
       level for ten seconds, admitted p99 TTFT within the SLO) / recovery (smoothed goodput at 95 % of \
       `min(offered, C*)`), measured from the step, or from the end of the spike:\n\n"
        .into());
    w(table_of(m, "step", "scenario", Knobs::TunedAndBest, |r| {
        format!(
            "{} / {} / {}",
            pct(r.measured.goodput_frac),
            secs(r.settle_s),
            secs(r.recover_s)
        )
    }));
    w(table_of(m, "spike", "scenario", Knobs::TunedAndBest, |r| {
        format!(
            "{} / {} / {}",
            pct(r.measured.goodput_frac),
            secs(r.settle_s),
            secs(r.recover_s)
        )
    })
    .split_once('\n')
    .map(|(_, rest)| rest.split_once('\n').map_or("", |(_, r)| r).to_string())
    .unwrap_or_default());
    w("\nAttempts per offered request in the spike rows:\n\n".into());
    w(table(m, "spike", "scenario", |r| {
        format!("{:.2}", r.measured.attempts_per_request)
    }));
    w("\n## Stale signals (2 × `C*`)\n\nGoodput / admitted p99 TTFT (ms):\n\n".into());
    w(table_of(m, "stale", "scenario", Knobs::TunedAndBest, |r| {
        format!(
            "{} / {}",
            pct(r.measured.goodput_frac),
            ms(r.measured.ttft_ms.p99)
        )
    }));
    w("\n## Tenants (2 × `C*`, one tenant sending ten times the others)\n\n\
       Jain's index over served tokens relative to demand capped at a max-min fair share / each tenant's goodput \
       (requests/s):\n\n"
        .into());
    w(table_of(
        m,
        "tenants",
        "scenario",
        Knobs::TunedAndBest,
        |r| {
            let per: Vec<String> = (0..r.measured.tenants.len())
                .map(|t| format!("{:.1}", r.measured.tenant_goodput_rps(t)))
                .collect();
            format!("{:.3} / {}", r.jain.unwrap_or(0.0), per.join(" : "))
        },
    ));

    w("\n## The same engine over HTTP\n\n\
       `cargo run --release -p loadgate-lab --bin engine -- --model NAME --port P` serves the emulator over \
       real HTTP: OpenAI-compatible `/v1/chat/completions` and `/v1/completions` (streamed or not) with the \
       step-time model's timing in real time, and vLLM-format `/metrics` (`vllm:num_requests_running`, \
       `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` per rank, `vllm:cache_config_info`, `vllm:inter_token_latency_seconds`). Every \
       engine parameter is a flag named as vLLM and Dynamo's mocker name it (`--max-num-seqs`, \
       `--max-num-batched-tokens`, `--block-size`, `--num-gpu-blocks-override`, `--data-parallel-size`, \
       `--speedup-ratio`); `--nats URL --namespace NS` publishes each rank's load with loadgate's `Publisher` \
       (`--dynamo-endpoint COMP.ENDP` for Dynamo's event-plane envelope). So loadgate's scrape, NATS and \
       Python frontends can be tried against engines that queue and slow down as real ones do. \
       `python/tests/test_lab_engine.py` runs three of them behind a frontend built from loadgate's Python \
       pieces (a scraping `Monitor`, `select`, an httpx proxy, the ASGI middleware) at three times their \
       measured capacity, open loop, and checks the accounting, that every 529 carries `Retry-After` and \
       that no admitted stream was cut; it prints goodput and admitted TTFT. \
       `python/tests/test_lab_engine_slo.py` runs four (two at half speed) behind `FlowMiddleware` at \
       three times their capacity with one answer in four five times longer, once given only the SLO \
       and once with a static threshold, checks the same and that the SLO frontend learned from the \
       streams it proxied, and prints both frontends' goodput and admitted p99 TTFT.\n"
        .into());
    w("\n## What the lab does not model\n\n\
       - **The engines are emulated**: Dynamo's mocker's step time and vLLM's scheduler, with no \
       prefix caching (the workload's prompts share no prefix), speculative decoding, CUDA graphs or \
       interference between data-parallel ranks. Its KV shape is an 8B model on one 80 GB GPU.\n\
       - **The network** is a fixed delay each way, with no loss and no reordering.\n\
       - **Dynamo's design**: its thresholds are set once before traffic, so 1.6.1's lazy \
       re-evaluation of a changed threshold never arises; its router's bookings count at once, \
       where 1.6.1's frontend hears its own router's load through its event plane.\n\
       - **llm-d**: only the saturation detector, not its scorers or prefix-aware routing.\n\
       - **The fleet** serves one model, with no autoscaling and no failures beyond the stale-signal \
       rows; every worker of a cell is alike but in the mixed-fleet cells.\n\
       - **Clients** are open loop; they give up after 10 s without a first token and retry only \
       as each scenario says.\n"
        .into());
    let total: u64 = m.rows.iter().map(|r| r.measured.accounting.offered).sum();
    w(format!(
        "\n## Accounting\n\nEvery one of the {} rows balanced offered = completed + rejected + cancelled + in flight \
         ({} requests in all); the run fails otherwise.\n\n\
         `C*` bisection (rate, arm (a)'s SLO attainment): {}.\n",
        m.rows.len(),
        total,
        m.capacity_probes
            .iter()
            .map(|(r, a)| format!("{r:.1}: {}", pct(*a)))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    s
}
