//! The Rust side of the C-vs-Rust timing (see `ffi-c/bench/timing.c`): the
//! same setup and the same two hot paths, called on the core crate
//! directly, printed as "name ns" lines (thread CPU time per call, as the C
//! program measures it).
//!
//! * `select`: `Monitor::select` (round robin) on a model of 8 workers, 2 busy;
//! * `try_admit+release`: `AdmissionGate::try_admit_owned` and dropping the
//!   permit (the calls `lg_gate_try_admit`/`lg_permit_release` make);
//! * `try_admit+release(borrowed)`: `try_admit` with a borrowed permit, the
//!   cheapest Rust form, for reference.
//!
//! Run: `cargo run --release -p loadgate-ffi --example timing [iterations
//! [select|admit|borrowed]]`,
//! or `ffi-c/bench/run.sh` for both sides and the ratios.

use std::hint::black_box;
use std::sync::Arc;

use loadgate_core::{
    AdmissionGate, GateConfig, LoadReport, Monitor, Policy, ThresholdUpdate, WorkerSpec,
};

const RUNS: usize = 7;

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
}

/// Linux's `CLOCK_THREAD_CPUTIME_ID`.
const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

/// CPU time of this thread in nanoseconds, like the C program's `now_ns`.
fn thread_cpu_ns() -> f64 {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec (two 64-bit fields on the
    // 64-bit Linux targets this example is for).
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

fn best(iters: u64, mut f: impl FnMut()) -> f64 {
    (0..RUNS)
        .map(|_| {
            let t = thread_cpu_ns();
            for _ in 0..iters {
                f();
            }
            (thread_cpu_ns() - t) / iters as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let iters: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let only = std::env::args().nth(2).unwrap_or_default();
    let all = only.is_empty();
    let (do_select, do_admit, do_borrowed) = (
        all || only == "select",
        all || only == "admit",
        all || only == "borrowed",
    );

    let monitor = Monitor::new();
    let spec = WorkerSpec {
        dp_size: 2,
        kv_total_blocks: Some(1000),
        ..WorkerSpec::default()
    };
    for id in 1..=8 {
        monitor.add_worker("llama", id, spec).expect("add_worker");
    }
    let update = ThresholdUpdate {
        active_decode_blocks_threshold: Some(0.9),
        ..ThresholdUpdate::default()
    };
    monitor
        .set_thresholds("llama", &update)
        .expect("set_thresholds");
    let busy = LoadReport {
        kv_used_blocks: Some(950),
        ..LoadReport::default()
    };
    for id in 3..=4 {
        monitor.report(id, 0, &busy).expect("report");
        monitor.report(id, 1, &busy).expect("report");
    }
    let gate = Arc::new(AdmissionGate::new(GateConfig::new(4)).expect("gate"));

    // Interleaved like the C program: select, then admit, per run.
    let mut select = f64::INFINITY;
    let mut owned = f64::INFINITY;
    let mut borrowed = f64::INFINITY;
    for _ in 0..RUNS {
        if do_select {
            select = select.min(best(iters / RUNS as u64 + 1, || {
                let _ = black_box(monitor.select(black_box("llama"), Policy::RoundRobin));
            }));
        }
        if do_admit {
            owned = owned.min(best(iters / RUNS as u64 + 1, || {
                drop(black_box(gate.try_admit_owned()));
            }));
        }
        if do_borrowed {
            borrowed = borrowed.min(best(iters / RUNS as u64 + 1, || {
                drop(black_box(gate.try_admit()));
            }));
        }
    }
    if do_select {
        println!("select {select:.2}");
    }
    if do_admit {
        println!("try_admit+release {owned:.2}");
    }
    if do_borrowed {
        println!("try_admit+release(borrowed) {borrowed:.2}");
    }
}
