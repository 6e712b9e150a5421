//! Load reports across machines.
//!
//! Workers run a [`Publisher`]: `report` merges a rank's new load into a
//! pending state and returns at once; a background thread sends every changed
//! rank as a [`LoadMessage`] (coalescing reports that arrive while it sends)
//! and re-sends every rank about once a second as a heartbeat, so a frontend
//! that joins late learns each worker, its model, ranks and capacities.
//!
//! Frontends run a [`Subscriber`]: it decodes each payload, registers a worker
//! in its [`Monitor`] on the first message, applies reports, drops messages
//! whose sequence number is not newer than the last one applied, and removes
//! a worker silent for `expire_after` (three heartbeats by default). Because
//! every frontend applies the same messages to the same busy rule, all
//! frontends converge on the same busy set; thresholds stay local to each
//! frontend.
//!
//! Messages travel over a [`Transport`]: [`InProcessBus`] (the embedded
//! default) or, with the `nats` feature, `nats::NatsTransport` (NATS core
//! pub/sub). Subjects are `{prefix}.{namespace}.load.{worker_id}`.
//!
//! Files: `transport.rs` (subjects, the [`Transport`] trait, the in-process
//! bus), `publisher.rs` (worker side), `subscriber.rs` (frontend side; its
//! outcomes in `subscriber/outcome.rs`), `bookings.rs` (the reference
//! routers' bookings a subscriber holds), `announce.rs` (this monitor's own
//! bookings published for those routers), `wire.rs` (the message format;
//! `wire/dynamo.rs` the reference's event-plane envelope,
//! `wire/forward_pass.rs` and `wire/sequences.rs` the topics it carries)
//! `nats.rs` (the NATS transport), and `replicas.rs` (booking sync between
//! frontend replicas; its snapshot format in `replicas/wire.rs`).
//!
//! A frontend and a worker over the embedded bus:
//!
//! ```rust
//! use std::sync::Arc;
//!
//! use loadgate::cluster::{InProcessBus, Publisher, PublisherConfig, Subjects};
//! use loadgate::cluster::{Subscriber, SubscriberConfig};
//! use loadgate::{LoadReport, Monitor, MonotonicClock};
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // With the `nats` feature: loadgate::cluster::nats::NatsTransport::connect(url)?
//!     let bus = Arc::new(InProcessBus::new());
//!     let subjects = Subjects::new("prod")?;
//!
//!     // Frontend: learns workers from their first message, drops them after 3 s of silence.
//!     let monitor = Arc::new(Monitor::new());
//!     let clock = MonotonicClock::shared();
//!     let subscriber = Subscriber::new(monitor.clone(), SubscriberConfig::default(), clock)?;
//!     let _attached = subscriber.attach(&*bus, &subjects)?;
//!
//!     // Worker: `report` returns at once; a thread sends changes and a heartbeat every second.
//!     let publisher = Publisher::spawn(PublisherConfig::new(7, "llama"), bus, &subjects)?;
//!     publisher.report(0, &LoadReport { kv_used_blocks: Some(950), ..Default::default() })?;
//!     Ok(())
//! }
//! ```
//!
//! [`LoadMessage`]: wire::LoadMessage
//! [`Monitor`]: crate::Monitor

use std::fmt;
use std::sync::{Mutex, MutexGuard};

mod announce;
pub use announce::{AnnounceAttached, AnnounceStats, BookingAnnouncer, DEFAULT_ANNOUNCE_INTERVAL};
mod bookings;
pub use bookings::HIDDEN_RELEASE_LAG;
mod publisher;
pub mod replicas;
mod subscriber;
mod transport;
pub mod wire;

#[cfg(feature = "nats")]
pub mod nats;

pub use publisher::{Publisher, PublisherConfig, WireFormat, DEFAULT_HEARTBEAT};
pub use subscriber::{
    Applied, Attached, HandleError, Subscriber, SubscriberConfig, SubscriberStats,
    MAX_SEQUENCE_PAYLOAD,
};
pub use transport::{
    dynamo_kv_metrics_subject, subject_matches, Handler, InProcessBus, Subjects, Subscription,
    Transport, DEFAULT_PREFIX, MAX_TOKEN_LEN,
};

/// A cluster setup or transport failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterError {
    /// A subject prefix or namespace that is not a plain NATS token.
    InvalidSubject(String),
    /// A setting out of range.
    InvalidConfig(String),
    /// The transport failed (connect, subscribe or publish).
    Transport(String),
}

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterError::InvalidSubject(s) => write!(f, "invalid subject token: {s}"),
            ClusterError::InvalidConfig(s) => write!(f, "invalid setting: {s}"),
            ClusterError::Transport(s) => write!(f, "transport error: {s}"),
        }
    }
}

impl std::error::Error for ClusterError {}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
