//! Helpers shared by the integration tests.
pub mod etcd_server;
pub mod gates;
pub mod monitor_fixture;
pub mod nats_server;
pub mod polling;
pub mod recorded;

use std::time::{Duration, Instant};

/// Waits for `cond`, failing after 30 s (a limit for hangs, not a timing).
#[allow(dead_code)] // not every including binary waits
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
