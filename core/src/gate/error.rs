//! Why a request got no slot: the errors of the admission calls.

use std::ffi::CStr;
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
    /// A more important request took this one's place in the full queue
    /// (see [`GateConfig::classes`](super::GateConfig::classes)). A rejection.
    Displaced,
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
            AdmitError::Displaced => Reason::Displaced,
        }
    }
}

impl AdmitError {
    /// The message every binding gives: the reason's, or for `TimedOut`
    /// (the caller's own timeout, not the queue's) its own; a static
    /// NUL-terminated C string.
    pub const fn c_message(self) -> &'static CStr {
        match self {
            AdmitError::TimedOut => {
                c"timed out waiting for an engine slot; the request left the queue"
            }
            _ => self.reason().c_message(),
        }
    }

    /// The message (what `Display` writes).
    pub fn message(self) -> &'static str {
        self.c_message().to_str().unwrap_or_default()
    }
}

impl fmt::Display for AdmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
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

impl TryAdmitError {
    /// The message, as a static NUL-terminated C string.
    pub const fn c_message(self) -> &'static CStr {
        match self {
            TryAdmitError::WouldWait => c"no engine slot is free without waiting",
            TryAdmitError::Closed => Reason::Closed.c_message(),
        }
    }

    /// The message (what `Display` writes).
    pub fn message(self) -> &'static str {
        self.c_message().to_str().unwrap_or_default()
    }
}

impl fmt::Display for TryAdmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for TryAdmitError {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn admit_messages_are_the_reasons_but_the_callers_own_timeout() {
        assert_eq!(
            AdmitError::TimedOut.message(),
            "timed out waiting for an engine slot; the request left the queue"
        );
        for e in [
            AdmitError::AtCapacity,
            AdmitError::QueueTimeout,
            AdmitError::Closed,
            AdmitError::Displaced,
        ] {
            assert_eq!(e.message(), e.reason().message());
        }
        for e in [AdmitError::TimedOut, AdmitError::Closed] {
            assert_eq!(e.c_message().to_str(), Ok(e.message()));
            assert_eq!(e.to_string(), e.message());
        }
    }

    #[test]
    fn try_admit_messages_are_c_strings_too() {
        assert_eq!(
            TryAdmitError::WouldWait.message(),
            "no engine slot is free without waiting"
        );
        assert_eq!(TryAdmitError::Closed.message(), Reason::Closed.message());
        for e in [TryAdmitError::WouldWait, TryAdmitError::Closed] {
            assert_eq!(e.c_message().to_str(), Ok(e.message()));
            assert_eq!(e.to_string(), e.message());
        }
    }
}
