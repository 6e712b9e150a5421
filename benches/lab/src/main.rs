//! The overload lab's command: runs the whole matrix on a virtual clock and
//! writes docs/overload.md with its plots.
//!
//! ```text
//! cargo run --release -p loadgate-lab [-- --quick] [--json FILE] [--docs DIR] [--seed N]
//! ```
//!
//! The fleet and its signal lags can be changed from the command line
//! (`--help`); the defaults are what docs/overload.md reports.

use std::path::PathBuf;
use std::process::ExitCode;

use loadgate_lab::calibrate::run_calibration;
use loadgate_lab::matrix::{run_matrix, Options};
use loadgate_lab::report::{mocker_table, write_docs};
use loadgate_lab::sim::Conditions;

const USAGE: &str = "\
usage: loadgate-lab [--quick] [--json FILE] [--docs DIR] [--seed N] [--dynamo-mocker]
                    [--workers N] [--data-parallel-size N]
                    [--report-interval S] [--transport-delay S] [--net-delay S]

  --quick               CI's short mode: shorter runs, fewer loads and candidates
  --json FILE           every figure of the run, for scripts
  --docs DIR            where overload.md and its plots go (default: the repository's docs/)
  --seed N              seed of the evaluation workloads (default 1)
  --workers N           workers behind the frontend (default 4)
  --data-parallel-size N  ranks per worker (default 1)
  --report-interval S   seconds between a worker's load reports (default 0.1)
  --transport-delay S   publisher to subscriber, seconds (default 0.001)
  --net-delay S         frontend to worker, one way, seconds (default 0.0005)
  --dynamo-mocker       only the engine against Dynamo's mocker: its replay workload
                        (2 mocker-default workers, 3000 requests of 1024/256 tokens)";

/// Parses a number of `flag` within `lo..=hi`.
fn number(flag: &str, v: &str, lo: f64, hi: f64) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(x) if (lo..=hi).contains(&x) => Ok(x),
        _ => Err(format!(
            "{flag}: expected a number from {lo} to {hi}, got {v:?}"
        )),
    }
}

fn main() -> ExitCode {
    let mut options = Options {
        quick: false,
        seed: 1,
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
    };
    let mut conditions = Conditions::default();
    let mut json: Option<PathBuf> = None;
    let mut docs = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs"));
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        let parsed = match a.as_str() {
            "--quick" => {
                options.quick = true;
                Ok(())
            }
            "--dynamo-mocker" => {
                return match run_calibration(options.threads) {
                    Ok(c) => {
                        print!("{}", mocker_table(&c));
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("loadgate-lab: {e}");
                        ExitCode::FAILURE
                    }
                };
            }
            "--json" => value("--json").map(|v| json = Some(v.into())),
            "--docs" => value("--docs").map(|v| docs = v.into()),
            "--seed" => value("--seed").and_then(|v| {
                v.parse()
                    .map(|s| options.seed = s)
                    .map_err(|_| format!("--seed: not a number: {v}"))
            }),
            "--workers" => value("--workers")
                .and_then(|v| number(&a, &v, 1.0, 1024.0))
                .map(|n| conditions.workers = n as u32),
            "--data-parallel-size" => value("--data-parallel-size")
                .and_then(|v| number(&a, &v, 1.0, 64.0))
                .map(|n| conditions.dp_size = n as u32),
            "--report-interval" => value("--report-interval")
                .and_then(|v| number(&a, &v, 1e-3, 60.0))
                .map(|s| conditions.report_interval_s = s),
            "--transport-delay" => value("--transport-delay")
                .and_then(|v| number(&a, &v, 0.0, 60.0))
                .map(|s| conditions.transport_delay_s = s),
            "--net-delay" => value("--net-delay")
                .and_then(|v| number(&a, &v, 0.0, 10.0))
                .map(|s| conditions.net_delay_s = s),
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => Err(format!("unknown argument {other}")),
        };
        if let Err(e) = parsed {
            eprintln!("loadgate-lab: {e}");
            return ExitCode::from(2);
        }
    }
    let m = match run_matrix(options, conditions) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("loadgate-lab: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "C* = {:.1} req/s; {} simulations in {:.1} s",
        m.capacity, m.runs, m.wall_s
    );
    for r in m.rows.iter().filter(|r| r.group == "steady") {
        println!(
            "{:12} {:30}{:10} goodput {:6.1} %  admitted p99 TTFT {:8.0} ms  rejected {:5.1} %",
            r.scenario,
            r.arm.label(),
            if r.defaults { " defaults" } else { "" },
            100.0 * r.measured.goodput_frac,
            r.measured.ttft_ms.p99,
            100.0 * r.measured.reject_rate
        );
    }
    if let Err(e) = write_docs(&m, &docs) {
        eprintln!("loadgate-lab: {e}");
        return ExitCode::FAILURE;
    }
    println!("wrote {}", docs.join("overload.md").display());
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&m).expect("the matrix serializes");
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("loadgate-lab: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
