//! The overload lab's command: runs the whole matrix on a virtual clock and
//! writes docs/overload.md with its plots.
//!
//! ```text
//! cargo run --release -p loadgate-lab [-- --quick] [--json FILE] [--docs DIR] [--seed N]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use loadgate_lab::matrix::{run_matrix, Options};
use loadgate_lab::report::write_docs;
use loadgate_lab::sim::Conditions;

fn main() -> ExitCode {
    let mut options = Options {
        quick: false,
        seed: 1,
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
    };
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
            "--json" => value("--json").map(|v| json = Some(v.into())),
            "--docs" => value("--docs").map(|v| docs = v.into()),
            "--seed" => value("--seed").and_then(|v| {
                v.parse()
                    .map(|s| options.seed = s)
                    .map_err(|_| format!("--seed: not a number: {v}"))
            }),
            "-h" | "--help" => {
                println!("usage: loadgate-lab [--quick] [--json FILE] [--docs DIR] [--seed N]");
                return ExitCode::SUCCESS;
            }
            other => Err(format!("unknown argument {other}")),
        };
        if let Err(e) = parsed {
            eprintln!("loadgate-lab: {e}");
            return ExitCode::from(2);
        }
    }
    let m = match run_matrix(options, Conditions::default()) {
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
            "{:12} {:32} goodput {:6.1} %  admitted p99 TTFT {:8.0} ms  rejected {:5.1} %",
            r.scenario,
            r.arm.label(),
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
