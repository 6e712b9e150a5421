//! Gates the admission tests build again and again.
#![allow(dead_code)] // each including binary uses a different subset

use std::sync::Arc;
use std::time::Duration;

use loadgate::{AdmissionGate, GateConfig, ManualClock};

/// A gate of `limit` slots and a queue of `queue`, on real time.
pub fn gate(limit: u32, queue: u32) -> Arc<AdmissionGate> {
    Arc::new(AdmissionGate::new(GateConfig::new(limit).with_queue(queue)).unwrap())
}

/// A gate with a queue deadline of `ms` (adaptive LIFO when `lifo`), on a
/// manual clock, and the clock.
pub fn timed_gate(
    limit: u32,
    queue: u32,
    ms: u64,
    lifo: bool,
) -> (Arc<AdmissionGate>, Arc<ManualClock>) {
    let clock = ManualClock::new();
    let config = GateConfig::new(limit)
        .with_queue(queue)
        .with_queue_timeout(Some(Duration::from_millis(ms)))
        .with_adaptive_lifo(lifo);
    (
        Arc::new(AdmissionGate::with_clock(config, clock.clone()).unwrap()),
        clock,
    )
}
