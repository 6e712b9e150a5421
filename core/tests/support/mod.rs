//! Helpers shared by the integration tests.
pub mod etcd_server;
pub mod gates;
pub mod monitor_fixture;
pub mod nats_server;
pub mod polling;
pub mod recorded;
