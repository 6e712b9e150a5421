//! loadgate: request rejection (load shedding) for LLM serving.
//!
//! Two halves share one crate:
//!
//! * the **frontend** half ([`Monitor`]) keeps a per-rank load table for every
//!   worker, decides which workers are busy by the thresholds of their model,
//!   publishes the busy set as an epoch-stamped bitset, and routes requests
//!   around busy workers, answering [`RouteError::Overloaded`] (HTTP 529) or
//!   [`RouteError::Unavailable`] (HTTP 503) when it cannot;
//! * the **worker** half ([`AdmissionGate`]) caps a worker's own concurrency at
//!   exactly `N` running plus `Q` queued, rejecting the rest with
//!   "Server overloaded: worker at capacity".
//!
//! Beside Dynamo, a monitor learns its workers and their capacities from
//! Dynamo's discovery store ([`discovery`]) and their load from Dynamo's
//! event plane ([`cluster`]).
//!
//! Hot paths (reporting load, booking, checking and selecting workers, and
//! the gate's direct admission, release, rejection, and a queued future's
//! poll and cancel) are lock-free and allocation-free, with or without
//! requests waiting in a frontend queue: a report or booking change that
//! frees a worker only raises the monitor's signal, and the monitor's
//! maintenance thread dispatches what waits (`monitor/duty.rs`). A gate
//! without adaptive LIFO (with or without priority classes or a wait limit)
//! queues without a lock too (enqueue, handoff to a waiter, cancel, expiry,
//! close); a gate with adaptive LIFO queues under a short mutex. Neither
//! allocates. Cold paths (adding workers, changing thresholds and limits,
//! rendering metrics) and dispatch through a frontend queue may lock and
//! allocate.
//!
//! # Unsafe code
//!
//! The crate denies `unsafe_code`; four places are allowed it, for things
//! safe Rust cannot say without a cost on the hot path: three in the gate —
//! the raw-pointer round trip of an owned permit through the C ABI
//! (`gate/permit.rs`), the callback a queued cell of the lock-free queue
//! holds (`gate/tell.rs`), and the waker it holds (`gate/fifo.rs` and
//! `gate/fifo/storage.rs`), each handed from its enqueuer to the one thread
//! that resolves the cell by the cell's status word — and the I/O runtime
//! shared by NATS, scraping and etcd (`runtime.rs`: the process's runtime
//! entry, leaked once and read through an `AtomicPtr`, so a forked child
//! can start its own without a lock). Every `unsafe` block carries a
//! `// SAFETY:` comment. The monitor, the cluster code and everything else
//! are safe Rust, checked by the compiler.

#![deny(unsafe_code)]

pub mod clock;
pub mod cluster;
mod counter;
pub mod discovery;
pub mod error;
pub mod flow;
mod fork;
pub mod gate;
pub mod http;
pub mod limits;
mod load;
pub mod metrics;
pub mod monitor;
#[cfg(any(feature = "nats", feature = "scrape", feature = "etcd"))]
#[allow(unsafe_code)] // the leaked runtime entry, read through an AtomicPtr
mod runtime;
#[cfg(feature = "scrape")]
pub mod scrape;
pub mod slo;
mod status;
mod sync;
pub mod thresholds;

pub use clock::{Clock, ManualClock, MonotonicClock, SharedClock};
pub use error::{Reason, ReportError, RouteError, ThresholdError, WorkerError};
pub use gate::{
    AdmissionGate, Admit, AdmitCallback, AdmitError, AdmitOwned, CallbackTicket, ClassConfig,
    ClassStats, ConfigError, GateConfig, GateStats, OwnedPermit, Pending, PendingAdmission, Permit,
    TryAdmitError,
};
pub use limits::Limits;
pub use load::{LoadReport, WorkerSpec};
pub use monitor::busy_set::BusySet;
pub use monitor::{
    Booking, Maintenance, Monitor, MonitorConfig, Policy, Route, SloMode, Staleness,
};
pub use thresholds::{ThresholdField, ThresholdFields, ThresholdUpdate, Thresholds};

#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
