//! The monitor tests' shared setup: a monitor on a manual clock and the
//! workers, reports and thresholds they build from.
#![allow(dead_code)] // each including binary uses a different subset

use std::sync::Arc;

use loadgate::{LoadReport, ManualClock, Monitor, MonitorConfig, ThresholdUpdate, WorkerSpec};

pub const M: &str = "llama";

pub fn monitor_with(clock: Arc<ManualClock>) -> Monitor {
    Monitor::with_config(MonitorConfig::default(), clock).unwrap()
}

pub fn monitor() -> (Monitor, Arc<ManualClock>) {
    let clock = ManualClock::new();
    (monitor_with(clock.clone()), clock)
}

pub fn spec(dp_size: u32, kv_total: u64) -> WorkerSpec {
    WorkerSpec {
        dp_size,
        kv_total_blocks: Some(kv_total),
        ..Default::default()
    }
}

pub fn decode(t: f64) -> ThresholdUpdate {
    ThresholdUpdate {
        active_decode_blocks_threshold: Some(t),
        ..Default::default()
    }
}

pub fn used(n: u64) -> LoadReport {
    LoadReport {
        kv_used_blocks: Some(n),
        ..Default::default()
    }
}

pub fn prefill(n: u64) -> LoadReport {
    LoadReport {
        active_prefill_tokens: Some(n),
        ..Default::default()
    }
}

pub fn waiting(n: u64) -> LoadReport {
    LoadReport {
        waiting_requests: Some(n),
        ..Default::default()
    }
}

pub fn waiting_threshold(n: u64) -> ThresholdUpdate {
    ThresholdUpdate {
        waiting_requests_threshold: Some(n),
        ..Default::default()
    }
}
