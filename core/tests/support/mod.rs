//! Helpers shared by the integration tests.
pub mod etcd_server;
pub mod gates;
pub mod monitor_fixture;
#[cfg(feature = "nats")]
pub mod nats_auth;
pub mod nats_server;
pub mod polling;
pub mod recorded;
pub mod rng;
pub mod slo_engine;

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

/// A transport that keeps what is published, for a test to deliver itself.
#[derive(Default)]
#[allow(dead_code)] // not every including binary delivers
pub struct Outbox(
    std::sync::Mutex<Vec<(String, Vec<u8>)>>,
    std::sync::atomic::AtomicU64,
);

impl loadgate::cluster::Transport for Outbox {
    fn publish(
        &self,
        subject: &str,
        payload: Vec<u8>,
    ) -> Result<(), loadgate::cluster::ClusterError> {
        self.0.lock().unwrap().push((subject.to_owned(), payload));
        Ok(())
    }

    fn subscribe(
        &self,
        _: &str,
        _: loadgate::cluster::Handler,
    ) -> Result<loadgate::cluster::Subscription, loadgate::cluster::ClusterError> {
        unreachable!("the test delivers")
    }

    fn interruptions(&self) -> u64 {
        self.1.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Outbox {
    /// Everything published since the last call.
    #[allow(dead_code)] // not every including binary delivers
    pub fn take(&self) -> Vec<(String, Vec<u8>)> {
        std::mem::take(&mut self.0.lock().unwrap())
    }

    /// Reports that messages may have been lost (`Transport::interruptions`).
    #[allow(dead_code)] // not every including binary interrupts
    pub fn interrupt(&self) {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}
