//! Why a request got no slot: the errors of the admission calls.

use std::fmt;

use crate::error::Reason;

/// Why a request got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AdmitError {
    /// Every slot is taken and the queue is full ("Server overloaded: worker
    /// at capacity"). A rejection.
    AtCapacity,
    /// The request waited in the queue past the queue deadline. A rejection.
    QueueTimeout,
    /// The gate is closed. A rejection.
    Closed,
    /// The caller's own timeout (of a blocking wait) ran out first; the request
    /// left the queue as a cancellation, not a rejection.
    TimedOut,
}

impl AdmitError {
    /// The rejection reason to report (`TimedOut` reports as a queue timeout).
    pub const fn reason(self) -> Reason {
        match self {
            AdmitError::AtCapacity => Reason::WorkerAtCapacity,
            AdmitError::QueueTimeout | AdmitError::TimedOut => Reason::QueueTimeout,
            AdmitError::Closed => Reason::Closed,
        }
    }
}

impl fmt::Display for AdmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason().message())
    }
}

impl std::error::Error for AdmitError {}

/// Why [`AdmissionGate::try_admit`](super::AdmissionGate::try_admit) returned
/// no permit. Neither is counted as a rejection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TryAdmitError {
    /// No slot is free, or others are already waiting: admitting would mean
    /// waiting (or being rejected if the queue is full).
    WouldWait,
    /// The gate is closed.
    Closed,
}

impl fmt::Display for TryAdmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryAdmitError::WouldWait => f.write_str("no engine slot is free without waiting"),
            TryAdmitError::Closed => f.write_str(Reason::Closed.message()),
        }
    }
}

impl std::error::Error for TryAdmitError {}
