//! Every error loadgate returns, and the rejection reasons they map to.
//!
//! A rejection (an error a client sees as 529 or 503) carries a [`Reason`]: a
//! stable machine-readable name, the message the reference system uses, and
//! whether it is an overload (answered with the overload status, 529 by
//! default) or an unavailability (503). Errors from bad input name what was
//! wrong and never change stored state.

use std::ffi::CStr;
use std::fmt;

/// Why a request was rejected; stable names for headers, metrics and bindings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Workers are registered for the model but none is eligible.
    AllWorkersBusy,
    /// No worker is registered for the model.
    NoWorkers,
    /// A pinned worker is busy or under an overload lease.
    WorkerOverloaded,
    /// The worker's engine slots and queue are full.
    WorkerAtCapacity,
    /// The request waited in the worker's queue past the deadline.
    QueueTimeout,
    /// The worker's admission gate is closed.
    Closed,
    /// A queued request gave its place to a more important one that arrived
    /// while the worker's queue was full.
    Displaced,
    /// The model's frontend queue was full, and this request was the one
    /// turned away (`crate::flow`).
    QueueFull,
    /// The request waited in the model's frontend queue until its deadline.
    QueueDeadline,
}

impl Reason {
    /// Every reason, in a stable order (for metrics).
    pub const ALL: [Reason; 9] = [
        Reason::AllWorkersBusy,
        Reason::NoWorkers,
        Reason::WorkerOverloaded,
        Reason::WorkerAtCapacity,
        Reason::QueueTimeout,
        Reason::Closed,
        Reason::Displaced,
        Reason::QueueFull,
        Reason::QueueDeadline,
    ];

    /// Parses a machine-readable name.
    pub fn from_name(name: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// True when the client should get the overload status (529 by default);
    /// false when it should get 503.
    pub const fn is_overload(self) -> bool {
        !matches!(self, Reason::NoWorkers | Reason::Closed)
    }

    /// The HTTP status to answer with, using the process's overload status.
    pub fn http_status(self) -> u16 {
        if self.is_overload() {
            crate::status::overload_status()
        } else {
            503
        }
    }
}

/// The one table of the reasons' texts: each row names a variant, its
/// machine-readable name and its human message (as the reference system
/// words it). The `&str` accessors and the NUL-terminated `&CStr` ones the
/// C ABI hands out are generated from the same literals, so no binding keeps
/// a copy.
macro_rules! reason_texts {
    ($($variant:ident => $name:literal, $message:literal;)+) => {
        impl Reason {
            /// The machine-readable name, e.g. `all_workers_busy`.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$variant => $name,)+
                }
            }

            /// [`as_str`](Self::as_str) as a static NUL-terminated C string.
            pub const fn c_name(self) -> &'static CStr {
                match self {
                    $(Reason::$variant => const { c_text(concat!($name, "\0")) },)+
                }
            }

            /// The human message, as the reference system words it.
            pub const fn message(self) -> &'static str {
                match self {
                    $(Reason::$variant => $message,)+
                }
            }

            /// [`message`](Self::message) as a static NUL-terminated C string.
            pub const fn c_message(self) -> &'static CStr {
                match self {
                    $(Reason::$variant => const { c_text(concat!($message, "\0")) },)+
                }
            }
        }
    };
}

reason_texts! {
    AllWorkersBusy => "all_workers_busy", "All workers are busy, please retry later";
    NoWorkers => "no_workers", "No workers available";
    WorkerOverloaded => "worker_overloaded", "Selected worker is overloaded, please retry later";
    WorkerAtCapacity => "worker_at_capacity", "Server overloaded: worker at capacity";
    QueueTimeout => "queue_timeout",
        "Server overloaded: request rejected after exceeding the backend admission queue delay";
    Closed => "closed", "Service is shutting down: admission gate closed";
    Displaced => "displaced",
        "Server overloaded: request displaced from the queue by a more important request";
    QueueFull => "queue_full", "Server overloaded: the model's request queue is full";
    QueueDeadline => "queue_deadline",
        "Server overloaded: request waited in the model's queue until its deadline";
}

/// A NUL-terminated literal as a C string; evaluated at compile time by its
/// callers, so a literal with an inner NUL does not build.
const fn c_text(text: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(text.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("a C text holds exactly one NUL, at its end"),
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

/// A routing decision that found no worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    /// Workers are registered but none is eligible (busy or leased).
    Overloaded,
    /// No worker is registered for the model.
    Unavailable,
    /// The pinned worker is busy or under an overload lease.
    WorkerOverloaded,
    /// The pinned worker is not registered.
    UnknownWorker(u64),
}

impl RouteError {
    /// The rejection reason, or `None` for [`RouteError::UnknownWorker`]
    /// (a caller error, not a rejection).
    pub const fn reason(&self) -> Option<Reason> {
        match self {
            RouteError::Overloaded => Some(Reason::AllWorkersBusy),
            RouteError::Unavailable => Some(Reason::NoWorkers),
            RouteError::WorkerOverloaded => Some(Reason::WorkerOverloaded),
            RouteError::UnknownWorker(_) => None,
        }
    }
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteError::UnknownWorker(id) => write!(f, "unknown worker {id}"),
            other => f.write_str(other.reason().map_or("", Reason::message)),
        }
    }
}

impl std::error::Error for RouteError {}

/// A load report, booking or worker call that was refused; nothing was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportError {
    /// No worker with this id is registered.
    UnknownWorker(u64),
    /// The rank is outside the worker's declared `dp_start..dp_start + dp_size`.
    UndeclaredRank {
        /// The worker.
        worker_id: u64,
        /// The rank given.
        dp_rank: u32,
        /// First declared rank.
        dp_start: u32,
        /// Number of declared ranks.
        dp_size: u32,
    },
    /// A field carried a value outside its range.
    InvalidValue {
        /// The field name.
        field: &'static str,
        /// The value given.
        value: u64,
    },
    /// Booking sync's leased mode (docs/replicas.md): this frontend's share
    /// of the rank has no room for the booking (or its lease ran out).
    NoShare {
        /// The worker.
        worker_id: u64,
        /// The rank.
        dp_rank: u32,
        /// The blocks asked for.
        blocks: u64,
        /// What this frontend may book on the rank now, in all.
        cap: u64,
    },
    /// A publisher's report in a forked child of the process that started
    /// it: its connection and sending thread stayed in the parent, so the
    /// report could never be sent. Start a new publisher in this process.
    /// (Only a publisher refuses this way; it is not in
    /// [`KINDS`](Self::KINDS).)
    OtherProcess,
}

impl ReportError {
    /// Every [`kind`](Self::kind), in metrics order.
    pub const KINDS: [&'static str; 3] = ["unknown_worker", "undeclared_rank", "invalid_value"];

    /// Stable name, used as a metrics label.
    pub const fn kind(&self) -> &'static str {
        match self {
            ReportError::UnknownWorker(_) => "unknown_worker",
            ReportError::UndeclaredRank { .. } => "undeclared_rank",
            ReportError::InvalidValue { .. } => "invalid_value",
            ReportError::NoShare { .. } => "no_share",
            ReportError::OtherProcess => "other_process",
        }
    }
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportError::UnknownWorker(id) => write!(f, "unknown worker {id}"),
            ReportError::UndeclaredRank {
                worker_id,
                dp_rank,
                dp_start,
                dp_size,
            } => write!(
                f,
                "worker {worker_id} has no dp_rank {dp_rank} (declared ranks {dp_start}..{})",
                u64::from(*dp_start) + u64::from(*dp_size)
            ),
            ReportError::InvalidValue { field, value } => {
                write!(
                    f,
                    "{field} = {value} is out of range (must be below {})",
                    u64::MAX
                )
            }
            ReportError::NoShare {
                worker_id,
                dp_rank,
                blocks,
                cap,
            } => write!(
                f,
                "worker {worker_id} rank {dp_rank}: {blocks} blocks do not fit this frontend's \
                 leased share ({cap} blocks in all)"
            ),
            ReportError::OtherProcess => f.write_str(
                "this reporter was started before the process forked and cannot send from the \
                 forked child; start a new one in this process",
            ),
        }
    }
}

impl std::error::Error for ReportError {}

/// A threshold update that was refused; the stored thresholds are unchanged.
#[derive(Debug, Clone, PartialEq)]
pub enum ThresholdError {
    /// No worker of this model was ever registered.
    UnknownModel(String),
    /// A value outside the field's allowed range.
    Invalid {
        /// The field name.
        field: &'static str,
        /// The value given, as text.
        value: String,
        /// The allowed range, as text.
        allowed: &'static str,
    },
    /// `clear` named a field that does not exist.
    UnknownField(String),
    /// The same field was both set and cleared.
    SetAndClear(&'static str),
}

impl fmt::Display for ThresholdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThresholdError::UnknownModel(m) => write!(f, "unknown model {m:?}"),
            ThresholdError::Invalid {
                field,
                value,
                allowed,
            } => {
                write!(f, "{field} = {value} is invalid: must be {allowed}")
            }
            ThresholdError::UnknownField(name) => write!(
                f,
                "unknown threshold field {name:?} (expected one of active_decode_blocks_threshold, \
                 active_prefill_tokens_threshold, active_prefill_tokens_threshold_frac, \
                 waiting_requests_threshold)"
            ),
            ThresholdError::SetAndClear(field) => {
                write!(f, "{field} is both set and cleared in one update")
            }
        }
    }
}

impl std::error::Error for ThresholdError {}

/// Adding a worker was refused; nothing was registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerError {
    /// A worker with this id is already registered.
    Duplicate(u64),
    /// `dp_start + dp_size` overflows `u32`.
    InvalidRanks {
        /// First rank given.
        dp_start: u32,
        /// Number of ranks given.
        dp_size: u32,
    },
    /// The model already holds the configured maximum number of workers.
    ModelFull {
        /// The model.
        model: String,
        /// The configured maximum.
        capacity: usize,
    },
    /// No worker with this id is registered.
    Unknown(u64),
    /// The model name is empty.
    EmptyModel,
    /// The model name is longer than [`Limits::max_name_len`](crate::limits::Limits).
    NameTooLong {
        /// Its length in bytes.
        len: usize,
        /// The configured maximum.
        limit: usize,
    },
    /// More ranks than [`Limits::max_ranks_per_worker`](crate::limits::Limits).
    TooManyRanks {
        /// Number of ranks given.
        dp_size: u32,
        /// The configured maximum.
        limit: u32,
    },
    /// A new model while the monitor holds [`Limits::max_models`](crate::limits::Limits)
    /// models, none of which can be dropped.
    TooManyModels {
        /// The configured maximum.
        limit: usize,
    },
    /// The monitor holds [`Limits::max_workers`](crate::limits::Limits) workers.
    TooManyWorkers {
        /// The configured maximum.
        limit: usize,
    },
    /// The worker's ranks would take the monitor past
    /// [`Limits::max_ranks`](crate::limits::Limits).
    RankBudget {
        /// Number of ranks given.
        dp_size: u32,
        /// The configured maximum over all workers.
        limit: usize,
    },
}

impl WorkerError {
    /// Every [`kind`](Self::kind) `add_worker` can refuse with, in metrics
    /// order.
    pub const ADD_KINDS: [&'static str; 9] = [
        "duplicate",
        "invalid_ranks",
        "model_full",
        "empty_model",
        "name_too_long",
        "too_many_ranks",
        "too_many_models",
        "too_many_workers",
        "rank_budget",
    ];

    /// Stable name, used as a metrics label.
    pub const fn kind(&self) -> &'static str {
        match self {
            WorkerError::Duplicate(_) => "duplicate",
            WorkerError::InvalidRanks { .. } => "invalid_ranks",
            WorkerError::ModelFull { .. } => "model_full",
            WorkerError::Unknown(_) => "unknown_worker",
            WorkerError::EmptyModel => "empty_model",
            WorkerError::NameTooLong { .. } => "name_too_long",
            WorkerError::TooManyRanks { .. } => "too_many_ranks",
            WorkerError::TooManyModels { .. } => "too_many_models",
            WorkerError::TooManyWorkers { .. } => "too_many_workers",
            WorkerError::RankBudget { .. } => "rank_budget",
        }
    }
}

impl fmt::Display for WorkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerError::Duplicate(id) => write!(f, "worker {id} is already registered"),
            WorkerError::InvalidRanks { dp_start, dp_size } => write!(
                f,
                "invalid ranks dp_start={dp_start} dp_size={dp_size}: dp_start + dp_size overflows u32"
            ),
            WorkerError::ModelFull { model, capacity } => {
                write!(f, "model {model:?} already has the maximum of {capacity} workers")
            }
            WorkerError::Unknown(id) => write!(f, "unknown worker {id}"),
            WorkerError::EmptyModel => f.write_str("model must not be empty"),
            WorkerError::NameTooLong { len, limit } => write!(
                f,
                "model name of {len} bytes is too long: at most {limit} bytes (max_name_len)"
            ),
            WorkerError::TooManyRanks { dp_size, limit } => write!(
                f,
                "dp_size {dp_size} is too large: at most {limit} ranks per worker (max_ranks_per_worker)"
            ),
            WorkerError::TooManyModels { limit } => write!(
                f,
                "the monitor already holds the maximum of {limit} models (max_models)"
            ),
            WorkerError::TooManyWorkers { limit } => write!(
                f,
                "the monitor already holds the maximum of {limit} workers (max_workers)"
            ),
            WorkerError::RankBudget { dp_size, limit } => write!(
                f,
                "{dp_size} more ranks would exceed the monitor's maximum of {limit} ranks (max_ranks)"
            ),
        }
    }
}

impl std::error::Error for WorkerError {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_texts_as_c_strings() {
        for r in Reason::ALL {
            assert_eq!(r.c_name().to_str(), Ok(r.as_str()));
            assert_eq!(r.c_message().to_str(), Ok(r.message()));
            assert_eq!(Reason::from_name(r.as_str()), Some(r));
        }
        assert_eq!(Reason::AllWorkersBusy.as_str(), "all_workers_busy");
        assert_eq!(
            Reason::WorkerAtCapacity.c_message(),
            c"Server overloaded: worker at capacity"
        );
        assert_eq!(Reason::from_name("nope"), None);
    }
}
