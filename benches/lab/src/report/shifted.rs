//! The off-calibration cells and the engine against Dynamo's mocker.

use std::fmt::Write as _;
use std::path::Path;

use super::{cell_best, latency, ms, pct, plot_cells, table_of, Cells, Knobs};
use crate::matrix::{Matrix, Row};
use crate::shift::Shift;

/// The shift's short label for a plot's x axis.
fn short(shift: Shift) -> &'static str {
    match shift {
        Shift::LongOutputs => "LO",
        Shift::LongPrompts => "LP",
        Shift::SlowerEngine => "SE",
        Shift::SmallerKv => "KV",
        Shift::MixedFleet => "MF",
        Shift::SwitchToLongOutputs => "SW",
    }
}

/// Goodput as a share of the best any arm reached tuned on the cell.
fn of_best(m: &Matrix, r: &Row) -> Option<f64> {
    cell_best(m, &r.scenario)
        .filter(|(best, _)| *best > 0.0)
        .map(|(best, _)| r.measured.goodput_frac / best)
}

/// The plot of goodput against each cell's best, arm by arm.
pub(super) fn plots(m: &Matrix, dir: &Path) -> Result<(), String> {
    if !m.scenarios.iter().any(|s| s.group == "shifted") {
        return Ok(());
    }
    let cells = Cells {
        group: "shifted",
        label: &|s| format!("{} {}×", s.shift.map_or("", short), s.load),
        x_desc: "cell (LO long outputs, LP long prompts, SE slower engine, KV smaller KV cache, \
                 MF mixed fleet, SW chat then long outputs; × the cell's own C*)",
        width: 1100,
    };
    plot_cells(
        m,
        &dir.join("shifted.svg"),
        "Goodput / the best tuned on the cell (knobs tuned on the calibration)",
        &cells,
        |r| of_best(m, r),
        false,
    )
}

/// docs/overload.md's sections on the off-calibration cells and on the
/// engine against Dynamo's mocker.
pub(super) fn section(m: &Matrix) -> String {
    let mut s = String::new();
    if m.scenarios.iter().any(|s| s.group == "shifted") {
        s += "## Off the calibration: the workload and the hardware move\n\n\
              Users never tune on the workload they will face tomorrow. Each cell below moves the \
              workload or the fleet away from the calibration scenario; every arm runs it with its \
              knobs frozen as tuned there, and with its defaults. Each cell's loads are in units of \
              its own `C*` (arm (a)'s 99 % point on that cell's workload and fleet), and its run \
              drains long enough for an admitted long answer to finish. The reference is the best \
              goodput any arm reached when its candidates ran on that very cell.\n\n\
              ![goodput against the cell's best](overload/shifted.svg)\n\n\
              | cell | what moves | its `C*` (requests/s) |\n|---|---|---|\n";
        for (shift, c) in &m.shifted_capacity {
            let _ = writeln!(s, "| {} | {} | {c:.1} |", shift.name(), shift.describe());
        }
        s += "\nGoodput as a share of the cell's best tuned on it, each arm as tuned on the \
              calibration scenario; the last column is that best (as a fraction of the cell's `C*`) \
              and the arm that reached it:\n\n";
        s += &table_of(m, "shifted", "cell", Knobs::TunedAndBest, |r| {
            of_best(m, r).map_or("–".into(), pct)
        });
        s += "\nThe same with each design's defaults:\n\n";
        s += &table_of(m, "shifted", "cell", Knobs::Defaults, |r| {
            of_best(m, r).map_or("–".into(), pct)
        });
        s += "\nAdmitted p99 TTFT (ms), as tuned:\n\n";
        s += &table_of(m, "shifted", "cell", Knobs::Tuned, |r| {
            latency(r, |m| ms(m.ttft_ms.p99))
        });
        s += "\np99 time to a 529 beyond the attempt's own network trips (ms), as tuned:\n\n";
        s += &table_of(m, "shifted", "cell", Knobs::Tuned, |r| {
            if r.measured.reject_rate > 0.0 {
                ms(r.measured.reject_beyond_network_ms.p99)
            } else {
                "–".into()
            }
        });
        s += "\n";
    }
    s += "## The engine against Dynamo's mocker\n\n\
          The lab's engine takes its step time from Dynamo's mocker (the polynomial model the \
          `ai-dynamo` 1.6.1 wheel runs, from `aisimulate-core` 0.13.0: a prefill polynomial in the \
          step's new prompt tokens, paid once per step with any prefill, plus a decode polynomial in \
          the decoding requests' share of the KV capacity, the two added in a mixed step). \
          `benches/lab/tests/engine.rs` checks it against the replay step for step: one to nine \
          simultaneous 1024-token prompts give the replay's TTFT and first gap to the microsecond. \
          Below, the whole workload of Dynamo 1.6.1's offline replay \
          (`dynamo.replay.api.run_synthetic_trace_replay(1024, 256, 3000, num_workers=2, \
          request_rate=r, arrival_seed=s, sla_ttft_ms=1000, sla_itl_ms=50)`: 2 workers of the \
          mocker's default engine, Poisson, round-robin, nothing refused) against the lab's arm (a) \
          on the same workload with the mocker's default engine (`EngineConfig::mocker`: 256 \
          sequences, 8192 tokens a step, 16384 blocks of 64 tokens). Each figure is the mean over \
          ten arrival seeds (the replay's seeds 1 to 10; the lab's own generator with seeds 1 to \
          10); `C*` is the highest rate on a 0.5 requests/s grid at which every seed has at least \
          99 % of requests good. Dynamo's figures come from `benches/lab/dynamo/replay.py` (run in \
          a scratch environment with the wheels installed; Dynamo is no dependency of the lab); \
          the lab's from `cargo run --release -p loadgate-lab -- --dynamo-mocker`, in a few \
          seconds.\n\n";
    s += &mocker_table(&m.mocker);
    s += "\nAt 1.25 and 3 × one seed's share swings by a fifth either way in both (it turns on \
          which requests arrive just before the first ones finish), hence the means.\n\n";
    s
}
/// The engine against Dynamo's mocker, as a Markdown table: each figure of
/// Dynamo's replay, the lab's, and their ratio.
pub fn mocker_table(c: &crate::calibrate::Calibration) -> String {
    let d = &c.reference;
    let mut s = String::from(
        "| on the replay's workload | Dynamo 1.6.1 | the lab | lab / Dynamo |\n|---|---|---|---|\n",
    );
    let mut line = |what: String, dynamo: f64, lab: f64, fmt: &dyn Fn(f64) -> String| {
        let ratio = if dynamo > 0.0 {
            format!("{:.3}", lab / dynamo)
        } else {
            "–".into()
        };
        let _ = writeln!(s, "| {what} | {} | {} | {ratio} |", fmt(dynamo), fmt(lab));
    };
    line(
        "`C*` (≥ 99 % good), requests/s".into(),
        d.capacity,
        c.capacity,
        &|v| format!("{v:.1}"),
    );
    line(
        "p50 TTFT at 2 requests/s, ms".into(),
        d.p50_ttft_low_ms,
        c.p50_ttft_low_ms,
        &|v| format!("{v:.1}"),
    );
    for ((x, want), (_, got)) in d.good_at.iter().zip(&c.good_at) {
        line(
            format!(
                "good at {x} × Dynamo's `C*` ({:.1} requests/s)",
                x * d.capacity
            ),
            *want,
            *got,
            &pct,
        );
    }
    s
}
