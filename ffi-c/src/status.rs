//! `lg_status`, its text and HTTP mapping, and the conversions from every
//! core error.

use std::ffi::{c_char, c_int, CStr};

use loadgate_core::cluster::ClusterError;
use loadgate_core::error::{Reason, ReportError, RouteError, ThresholdError, WorkerError};
use loadgate_core::gate::{AdmitError, ConfigError, TryAdmitError};
use loadgate_core::monitor::MonitorConfigError;

use crate::ffi::{boundary, Error};

pub use crate::status_code::lg_status;

use lg_status::*;

impl lg_status {
    const ALL: [lg_status; 19] = [
        LG_OK,
        LG_OVERLOADED,
        LG_UNAVAILABLE,
        LG_WORKER_OVERLOADED,
        LG_AT_CAPACITY,
        LG_QUEUE_TIMEOUT,
        LG_CLOSED,
        LG_WOULD_WAIT,
        LG_TIMED_OUT,
        LG_DISPLACED,
        LG_QUEUE_FULL,
        LG_QUEUE_DEADLINE,
        LG_INVALID_ARGUMENT,
        LG_NOT_FOUND,
        LG_BUFFER_TOO_SMALL,
        LG_ALREADY_EXISTS,
        LG_MODEL_FULL,
        LG_TRANSPORT_ERROR,
        LG_PANIC,
    ];

    /// The status with this numeric value, if any.
    pub(crate) fn from_int(value: c_int) -> Option<lg_status> {
        Self::ALL.into_iter().find(|s| *s as c_int == value)
    }

    /// The rejection reason a frontend reports for this status.
    pub(crate) const fn reason(self) -> Option<Reason> {
        match self {
            LG_OVERLOADED => Some(Reason::AllWorkersBusy),
            LG_UNAVAILABLE => Some(Reason::NoWorkers),
            LG_WORKER_OVERLOADED => Some(Reason::WorkerOverloaded),
            LG_AT_CAPACITY | LG_WOULD_WAIT => Some(Reason::WorkerAtCapacity),
            LG_QUEUE_TIMEOUT | LG_TIMED_OUT => Some(Reason::QueueTimeout),
            LG_CLOSED => Some(Reason::Closed),
            LG_DISPLACED => Some(Reason::Displaced),
            LG_QUEUE_FULL => Some(Reason::QueueFull),
            LG_QUEUE_DEADLINE => Some(Reason::QueueDeadline),
            _ => None,
        }
    }

    /// A static description: for a rejection, the message the client is
    /// sent, from core.
    const fn text(self) -> &'static CStr {
        match self {
            LG_OK => c"ok",
            LG_OVERLOADED | LG_UNAVAILABLE | LG_WORKER_OVERLOADED | LG_AT_CAPACITY
            | LG_QUEUE_TIMEOUT | LG_CLOSED | LG_DISPLACED | LG_QUEUE_FULL | LG_QUEUE_DEADLINE => {
                match self.reason() {
                    Some(reason) => reason.c_message(),
                    None => c"",
                }
            }
            LG_WOULD_WAIT => TryAdmitError::WouldWait.c_message(),
            LG_TIMED_OUT => AdmitError::TimedOut.c_message(),
            LG_INVALID_ARGUMENT => c"invalid argument",
            LG_NOT_FOUND => c"not found",
            LG_BUFFER_TOO_SMALL => c"buffer too small",
            LG_ALREADY_EXISTS => c"already exists",
            LG_MODEL_FULL => c"model is full",
            LG_TRANSPORT_ERROR => c"transport error",
            LG_PANIC => c"internal error (panic)",
        }
    }

    /// The HTTP status a frontend answers with.
    fn http(self) -> u16 {
        match self {
            LG_OK => 200,
            LG_INVALID_ARGUMENT => 400,
            LG_NOT_FOUND => 404,
            LG_ALREADY_EXISTS | LG_MODEL_FULL => 409,
            LG_BUFFER_TOO_SMALL | LG_TRANSPORT_ERROR | LG_PANIC => 500,
            other => other.reason().map_or(500, Reason::http_status),
        }
    }
}

impl From<RouteError> for Error {
    #[inline]
    fn from(e: RouteError) -> Self {
        match e {
            RouteError::Overloaded => Error::fixed(LG_OVERLOADED, LG_OVERLOADED.message()),
            RouteError::Unavailable => Error::fixed(LG_UNAVAILABLE, LG_UNAVAILABLE.message()),
            RouteError::WorkerOverloaded => {
                Error::fixed(LG_WORKER_OVERLOADED, LG_WORKER_OVERLOADED.message())
            }
            e @ RouteError::UnknownWorker(_) => Error::new(LG_NOT_FOUND, e),
        }
    }
}

impl From<ReportError> for Error {
    fn from(e: ReportError) -> Self {
        let status = match e {
            ReportError::UnknownWorker(_) | ReportError::UndeclaredRank { .. } => LG_NOT_FOUND,
            ReportError::InvalidValue { .. } => LG_INVALID_ARGUMENT,
            ReportError::OtherProcess => LG_TRANSPORT_ERROR,
            ReportError::NoShare { .. } => LG_WORKER_OVERLOADED,
        };
        Error::new(status, e)
    }
}

impl From<WorkerError> for Error {
    fn from(e: WorkerError) -> Self {
        let status = match e {
            WorkerError::Duplicate(_) => LG_ALREADY_EXISTS,
            WorkerError::ModelFull { .. } => LG_MODEL_FULL,
            WorkerError::Unknown(_) => LG_NOT_FOUND,
            // Bad declarations and exceeded limits (names, ranks, models,
            // workers).
            _ => LG_INVALID_ARGUMENT,
        };
        Error::new(status, e)
    }
}

impl From<ThresholdError> for Error {
    fn from(e: ThresholdError) -> Self {
        let status = match e {
            ThresholdError::UnknownModel(_) => LG_NOT_FOUND,
            _ => LG_INVALID_ARGUMENT,
        };
        Error::new(status, e)
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::invalid(e)
    }
}

impl From<MonitorConfigError> for Error {
    fn from(e: MonitorConfigError) -> Self {
        Error::invalid(e)
    }
}

impl From<ClusterError> for Error {
    fn from(e: ClusterError) -> Self {
        let status = match e {
            ClusterError::InvalidSubject(_) | ClusterError::InvalidConfig(_) => LG_INVALID_ARGUMENT,
            ClusterError::Transport(_) => LG_TRANSPORT_ERROR,
        };
        Error::new(status, e)
    }
}

impl From<AdmitError> for Error {
    #[inline]
    fn from(e: AdmitError) -> Self {
        let status = admit_status(e);
        Error::fixed(status, status.message())
    }
}

impl From<TryAdmitError> for Error {
    #[inline]
    fn from(e: TryAdmitError) -> Self {
        let status = match e {
            TryAdmitError::WouldWait => LG_WOULD_WAIT,
            TryAdmitError::Closed => LG_CLOSED,
        };
        Error::fixed(status, status.message())
    }
}

impl lg_status {
    /// The description as a Rust string.
    pub(crate) fn message(self) -> &'static str {
        self.text().to_str().unwrap_or_default()
    }
}

/// The status of a refused admission.
pub(crate) const fn admit_status(e: AdmitError) -> lg_status {
    match e {
        AdmitError::AtCapacity => LG_AT_CAPACITY,
        AdmitError::QueueTimeout => LG_QUEUE_TIMEOUT,
        AdmitError::Closed => LG_CLOSED,
        AdmitError::TimedOut => LG_TIMED_OUT,
        AdmitError::Displaced => LG_DISPLACED,
    }
}

/// A short description of a status, as a static NUL-terminated string; for
/// rejections it is the message the client is sent ("All workers are busy,
/// please retry later", ...).
///
/// `status` is an lg_status value; any other value gives "unknown status".
/// Ownership: the string is static; do not free it.
/// Thread safety: any thread. Blocking: never.
#[no_mangle]
pub extern "C" fn lg_status_str(status: c_int) -> *const c_char {
    boundary(c"unknown status".as_ptr(), || {
        lg_status::from_int(status)
            .map_or(c"unknown status", lg_status::text)
            .as_ptr()
    })
}

/// The HTTP status a frontend should answer with for `status`: 200 for
/// LG_OK; the overload status for LG_OVERLOADED, LG_WORKER_OVERLOADED,
/// LG_AT_CAPACITY, LG_QUEUE_TIMEOUT, LG_DISPLACED, LG_QUEUE_FULL,
/// LG_QUEUE_DEADLINE, LG_WOULD_WAIT and LG_TIMED_OUT (529
/// unless DYN_HTTP_OVERLOAD_STATUS_CODE names another valid code, read once
/// per process); 503 for LG_UNAVAILABLE and LG_CLOSED; 400 for
/// LG_INVALID_ARGUMENT; 404 for LG_NOT_FOUND; 409 for LG_ALREADY_EXISTS and
/// LG_MODEL_FULL; 500 for anything else (LG_TRANSPORT_ERROR included).
///
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (the first call reads the
/// environment).
#[no_mangle]
pub extern "C" fn lg_status_http(status: c_int) -> u16 {
    boundary(500, || {
        lg_status::from_int(status).map_or(500, lg_status::http)
    })
}

/// The machine-readable rejection reason of `status` (all_workers_busy,
/// no_workers, worker_overloaded, worker_at_capacity, queue_timeout,
/// closed, displaced), as sent in the x-loadgate-reason header; NULL when `status` is
/// not a rejection.
///
/// Ownership: the string is static; do not free it.
/// Thread safety: any thread. Blocking: never.
#[no_mangle]
pub extern "C" fn lg_status_reason(status: c_int) -> *const c_char {
    boundary(std::ptr::null(), || {
        lg_status::from_int(status)
            .and_then(lg_status::reason)
            .map_or(std::ptr::null(), |r| r.c_name().as_ptr())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_text_and_an_http_code() {
        for s in lg_status::ALL {
            assert!(!s.message().is_empty());
            assert_eq!(lg_status::from_int(s as c_int), Some(s));
            // SAFETY: lg_status_str returns a static C string.
            let text = unsafe { CStr::from_ptr(lg_status_str(s as c_int)) };
            assert_eq!(text.to_str().unwrap(), s.message());
        }
        assert_eq!(lg_status::from_int(12345), None);
        assert_eq!(lg_status_http(12345), 500);
        assert!(lg_status_reason(12345).is_null());
        assert_eq!(lg_status_http(LG_UNAVAILABLE as c_int), 503);
        assert_eq!(lg_status_http(LG_NOT_FOUND as c_int), 404);
    }

    #[test]
    fn cluster_errors_map_to_statuses() {
        for (e, want) in [
            (
                ClusterError::InvalidSubject("a.b".into()),
                LG_INVALID_ARGUMENT,
            ),
            (ClusterError::InvalidConfig("x".into()), LG_INVALID_ARGUMENT),
            (
                ClusterError::Transport("refused".into()),
                LG_TRANSPORT_ERROR,
            ),
        ] {
            assert_eq!(Error::from(e).status, want);
        }
        assert_eq!(lg_status_http(LG_TRANSPORT_ERROR as c_int), 500);
        assert!(lg_status_reason(LG_TRANSPORT_ERROR as c_int).is_null());
    }

    #[test]
    fn rejection_texts_match_core() {
        for (s, r) in [
            (LG_OVERLOADED, Reason::AllWorkersBusy),
            (LG_UNAVAILABLE, Reason::NoWorkers),
            (LG_WORKER_OVERLOADED, Reason::WorkerOverloaded),
            (LG_AT_CAPACITY, Reason::WorkerAtCapacity),
            (LG_QUEUE_TIMEOUT, Reason::QueueTimeout),
            (LG_CLOSED, Reason::Closed),
            (LG_DISPLACED, Reason::Displaced),
            (LG_QUEUE_FULL, Reason::QueueFull),
            (LG_QUEUE_DEADLINE, Reason::QueueDeadline),
        ] {
            assert_eq!(s.message(), r.message());
            assert_eq!(s.reason(), Some(r));
            assert_eq!(s.http(), r.http_status());
            // SAFETY: lg_status_reason returns a static C string here.
            let name = unsafe { CStr::from_ptr(lg_status_reason(s as c_int)) };
            assert_eq!(name.to_str().unwrap(), r.as_str());
        }
    }
}
