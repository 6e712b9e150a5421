//! The maintenance thread's life (`monitor/duty.rs`): a monitor that needs
//! no maintenance starts none; the first setting that needs it starts one;
//! dropping the monitor ends it. One test in its own binary, so that the
//! threads it counts are its own.
#![cfg(target_os = "linux")]

mod support;

use loadgate::flow::FlowConfig;
use loadgate::monitor::FlowControlConfig;
use loadgate::Policy;
use support::monitor_fixture::{monitor, spec, M};
use support::wait_for;

/// Threads of this process named as the maintenance's (Linux cuts a
/// thread's name to 15 bytes).
fn maintenance_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end() == "loadgate-monito")
        .count()
}

#[test]
fn the_maintenance_thread_starts_when_needed_and_ends_with_its_monitor() {
    let (m, _) = monitor();
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    // Spawning is synchronous: a thread started by now would be listed
    // once it named itself, which the next wait shows.
    let config = FlowControlConfig {
        queue: FlowConfig::new(8),
        policy: Policy::RoundRobin,
    };
    let (plain, _) = monitor();
    plain.add_worker(M, 1, spec(1, 100)).unwrap();
    m.set_flow_control(M, Some(&config)).unwrap();
    wait_for("the maintenance thread runs", || maintenance_threads() == 1);
    // Turning it on again, or on another model, starts no second thread.
    m.set_flow_control(M, Some(&config)).unwrap();
    m.set_flow_control(M, None).unwrap();
    m.set_flow_control(M, Some(&config)).unwrap();
    plain.set_flow_control(M, Some(&config)).unwrap();
    wait_for("one thread per monitor", || maintenance_threads() == 2);
    drop(m);
    wait_for("the dropped monitor's thread ends", || {
        maintenance_threads() == 1
    });
    drop(plain);
    wait_for("no maintenance thread is left", || {
        maintenance_threads() == 0
    });
}
