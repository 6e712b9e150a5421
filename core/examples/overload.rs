//! A deterministic walk through frontend load shedding.
//!
//! Four workers of one model, two data-parallel ranks each, 1000 KV blocks per
//! rank. Load rises, peaks, and falls; halfway through an operator raises the
//! decode threshold. Each phase routes 100 requests round-robin and prints
//! which workers were busy, where requests went, and how many were answered
//! 529 (all workers busy) or 503 (no workers at all).
//!
//! Run with `cargo run --release --example overload`.

use std::time::Duration;

use loadgate::http::{error_response, ErrorStyle};
use loadgate::{
    LoadReport, ManualClock, Monitor, MonitorConfig, Policy, RouteError, ThresholdUpdate,
    WorkerSpec,
};

const MODEL: &str = "llama-3-70b";
const WORKERS: [u64; 4] = [101, 102, 103, 104];
const KV_BLOCKS: u64 = 1000;
const REQUESTS_PER_PHASE: usize = 100;

/// One phase: a name, each worker's KV use per rank (in percent), and an
/// optional decode threshold set at the start of the phase.
struct Phase {
    name: &'static str,
    kv_percent: [[u64; 2]; 4],
    threshold: Option<f64>,
    /// A worker that answers "Server overloaded" at the start of the phase.
    refuses: Option<u64>,
    remove_all: bool,
}

fn main() {
    let clock = ManualClock::new();
    let monitor =
        Monitor::with_config(MonitorConfig::default(), clock.clone()).expect("valid config");
    for id in WORKERS {
        let spec = WorkerSpec {
            dp_start: 0,
            dp_size: 2,
            kv_total_blocks: Some(KV_BLOCKS),
            ..Default::default()
        };
        monitor.add_worker(MODEL, id, spec).expect("new worker");
    }

    let phases = [
        Phase {
            name: "quiet",
            kv_percent: [[20, 30], [25, 10], [15, 15], [30, 20]],
            threshold: Some(0.85),
            refuses: None,
            remove_all: false,
        },
        Phase {
            name: "rising",
            kv_percent: [[90, 60], [88, 91], [50, 70], [86, 87]],
            threshold: None,
            refuses: None,
            remove_all: false,
        },
        Phase {
            name: "peak",
            kv_percent: [[95, 92], [96, 93], [90, 89], [99, 97]],
            threshold: None,
            refuses: None,
            remove_all: false,
        },
        Phase {
            name: "raise to 0.95",
            kv_percent: [[95, 92], [96, 93], [90, 89], [99, 97]],
            threshold: Some(0.95),
            refuses: None,
            remove_all: false,
        },
        Phase {
            name: "falling",
            kv_percent: [[60, 40], [70, 75], [30, 20], [96, 91]],
            threshold: None,
            refuses: None,
            remove_all: false,
        },
        Phase {
            name: "103 refuses",
            kv_percent: [[60, 40], [70, 75], [30, 20], [96, 91]],
            threshold: None,
            refuses: Some(103),
            remove_all: false,
        },
        Phase {
            name: "lease over",
            kv_percent: [[60, 40], [70, 75], [30, 20], [96, 91]],
            threshold: None,
            refuses: None,
            remove_all: false,
        },
        Phase {
            name: "drained",
            kv_percent: [[0, 0]; 4],
            threshold: None,
            refuses: None,
            remove_all: true,
        },
    ];

    println!(
        "loadgate: frontend load shedding, {} workers x 2 ranks, {KV_BLOCKS} KV blocks per rank",
        WORKERS.len()
    );
    println!("A rank is busy when its KV use is above threshold x capacity; a worker is busy when all its ranks are.");
    println!("Each phase routes {REQUESTS_PER_PHASE} requests round-robin, 10 ms apart; 'ver' is the threshold version.\n");
    println!(
        "{:<14} {:>4} {:<27} {:<16} {:<21} {:>5} {:>5}",
        "phase", "ver", "kv use % (rank0/rank1)", "busy", "selected 101..104", "529", "503"
    );
    println!("{}", "-".repeat(98));

    let mut first_529 = None;
    let mut first_503 = None;
    for phase in &phases {
        if let Some(t) = phase.threshold {
            let update = ThresholdUpdate {
                active_decode_blocks_threshold: Some(t),
                ..Default::default()
            };
            monitor
                .set_thresholds(MODEL, &update)
                .expect("valid threshold");
        }
        if let Some(id) = phase.refuses {
            // The worker's own admission gate said "Server overloaded": skip it
            // for the lease (1 s) or until it reports that it is not busy.
            monitor.mark_overloaded(id).expect("registered worker");
        }
        if phase.remove_all {
            for id in WORKERS {
                monitor.remove_worker(id).expect("registered worker");
            }
        } else if phase.refuses.is_none() {
            for (id, ranks) in WORKERS.iter().zip(phase.kv_percent) {
                for (rank, percent) in ranks.iter().enumerate() {
                    let report = LoadReport {
                        kv_used_blocks: Some(percent * KV_BLOCKS / 100),
                        ..Default::default()
                    };
                    monitor
                        .report(*id, rank as u32, &report)
                        .expect("declared rank");
                }
            }
        }

        let mut selected = [0usize; 4];
        let (mut overloaded, mut unavailable) = (0, 0);
        for _ in 0..REQUESTS_PER_PHASE {
            match monitor.select(MODEL, Policy::RoundRobin) {
                Ok(id) => selected[WORKERS.iter().position(|w| *w == id).expect("known id")] += 1,
                Err(e @ RouteError::Overloaded) => {
                    overloaded += 1;
                    first_529.get_or_insert(e);
                }
                Err(e @ RouteError::Unavailable) => {
                    unavailable += 1;
                    first_503.get_or_insert(e);
                }
                Err(e) => panic!("unexpected routing error: {e}"),
            }
            clock.advance(Duration::from_millis(10));
        }

        let busy = monitor.busy_workers(MODEL);
        let loads = phase
            .kv_percent
            .iter()
            .map(|[a, b]| format!("{a}/{b}"))
            .collect::<Vec<_>>()
            .join(" ");
        let busy = if busy.is_empty() {
            "-".to_owned()
        } else {
            busy.iter()
                .map(|id| id.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let version = monitor.thresholds(MODEL).map_or(0, |s| s.version);
        println!(
            "{:<14} {:>4} {:<27} {:<16} {:<21} {:>5} {:>5}",
            phase.name,
            version,
            if phase.remove_all {
                "(workers removed)".to_owned()
            } else {
                loads
            },
            busy,
            format!("{:?}", selected),
            overloaded,
            unavailable
        );
    }

    println!("\nWhat a client saw:");
    for err in [first_529, first_503].into_iter().flatten() {
        let reason = err.reason().expect("a rejection");
        let response = error_response(reason, ErrorStyle::Dynamo, Duration::from_secs(1));
        let headers: Vec<String> = response
            .headers
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        println!(
            "  HTTP {}  {}  {}",
            response.status,
            headers.join("  "),
            response.body
        );
    }
    println!("\nFrontend metrics after the run (excerpt):");
    for line in monitor
        .metrics_text()
        .lines()
        .filter(|l| l.contains("rejection") && !l.starts_with('#'))
    {
        println!("  {line}");
    }
}
