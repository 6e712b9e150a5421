//! The status every fallible call returns ([`lg_status`]): its values
//! only, so that the panic boundary (`ffi.rs`) and the status functions
//! (`status.rs`) both build on it.

/// The result of every fallible loadgate call.
///
/// LG_OK is 0; every other value is far from errno values. Rejections (the
/// request should be answered with the overload status or 503) come first,
/// then caller and environment errors, then LG_PANIC.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub enum lg_status {
    /// Success.
    LG_OK = 0,
    /// Workers are registered for the model but none is eligible (all busy
    /// or under an overload lease). Answer the overload status (529).
    LG_OVERLOADED = 7001,
    /// No worker is registered for the model. Answer 503.
    LG_UNAVAILABLE = 7002,
    /// The pinned worker is busy or under an overload lease; retry on
    /// another worker. Answer the overload status (529).
    LG_WORKER_OVERLOADED = 7003,
    /// Every engine slot is taken and the queue is full ("Server overloaded:
    /// worker at capacity"). Answer the overload status (529).
    LG_AT_CAPACITY = 7004,
    /// The request waited in the gate's queue past the queue deadline.
    /// Answer the overload status (529).
    LG_QUEUE_TIMEOUT = 7005,
    /// The admission gate is closed. Answer 503.
    LG_CLOSED = 7006,
    /// lg_gate_try_admit(): no slot is free without waiting (not counted as
    /// a rejection). Answer the overload status if the request is refused.
    LG_WOULD_WAIT = 7007,
    /// lg_gate_admit(): the caller's own timeout ran out first; the request
    /// left the queue as a cancellation. Answer the overload status if the
    /// request is refused.
    LG_TIMED_OUT = 7008,
    /// The request waited in the gate's full queue and gave its place to a
    /// more important request (a higher priority class). Answer the overload
    /// status (529).
    LG_DISPLACED = 7009,
    /// The model's frontend queue was full and this request was the one
    /// turned away (lg_monitor_dispatch()). Answer the overload status
    /// (529).
    LG_QUEUE_FULL = 7010,
    /// The request waited in the model's frontend queue until its deadline.
    /// Answer the overload status (529).
    LG_QUEUE_DEADLINE = 7011,
    /// An argument was NULL, out of range, of a bad length or not UTF-8, or
    /// a value was refused (for instance a NaN threshold).
    LG_INVALID_ARGUMENT = 7101,
    /// The worker, rank or model is not registered.
    LG_NOT_FOUND = 7102,
    /// The caller's buffer is too small; the needed length was written.
    LG_BUFFER_TOO_SMALL = 7103,
    /// A worker with this id is already registered.
    LG_ALREADY_EXISTS = 7104,
    /// The model already holds the configured maximum number of workers.
    LG_MODEL_FULL = 7105,
    /// The message transport failed: the NATS server could not be reached,
    /// or a background thread could not start.
    LG_TRANSPORT_ERROR = 7106,
    /// An internal error (a Rust panic) was caught at the boundary. The
    /// objects involved should be freed and not used again.
    LG_PANIC = 7201,
}
