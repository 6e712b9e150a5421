//! `lg_gate`: the worker admission gate (N running + Q queued).

use std::ffi::{c_char, c_void};
use std::sync::Arc;
use std::time::Duration;

use loadgate_core::gate::{
    AdmissionGate, ClassConfig, ClassStats, GateConfig, DEFAULT_QUEUE_LIMIT, MAX_CLASSES,
};

use crate::ffi::{boundary, guard, input, optional_string, slice, Error, Out, TextBuf};
use crate::permit::{lg_admit_callback, lg_permit, CallbackTarget};
use crate::status::lg_status;
use crate::ticket::lg_ticket;

/// "Wait as long as it takes" for lg_gate_admit(), and "no deadline" from
/// lg_gate_next_deadline().
pub const LG_TIMEOUT_INFINITE: u64 = u64::MAX;

/// Most priority classes a gate has (lg_gate_config.class_count), and the
/// length of lg_gate_stats.classes.
pub const LG_MAX_CLASSES: usize = 8;

// The header's constant is a literal (cbindgen cannot read core's).
const _: () = assert!(LG_MAX_CLASSES == MAX_CLASSES);

/// A worker's admission gate: at most N requests run and at most Q wait, at
/// any instant; the rest are rejected with "Server overloaded: worker at
/// capacity". Opaque; create with lg_gate_new() or lg_gate_from_env(), free
/// with lg_gate_free().
///
/// Every function taking a `const lg_gate *` may be called from any number
/// of threads at once. Permits and queued asynchronous requests keep the
/// gate's state alive, so the handle may be freed before they are done.
pub struct lg_gate {
    gate: Arc<AdmissionGate>,
}

/// Gate settings. Fill with lg_gate_config_default(), then change fields.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_gate_config {
    /// Engine slots N: how many requests may run at once (1 to 2097151).
    pub limit: u32,
    /// Queue size Q: how many requests may wait (0 to 2097151; default 16).
    pub queue: u32,
    /// Queue deadline in milliseconds: a waiter queued this long is rejected
    /// with LG_QUEUE_TIMEOUT. 0 turns it off (the default).
    pub queue_timeout_ms: u64,
    /// After a deadline expiry, hand the next freed slot to the newest
    /// waiter instead of the oldest (once). Default false.
    pub adaptive_lifo: bool,
    /// Metric name prefix, not NUL-terminated; NULL (with length 0) for the
    /// default "dynamo". Copied.
    pub metrics_prefix: *const c_char,
    /// Length of metrics_prefix in bytes.
    pub metrics_prefix_len: usize,
    /// Wait limit W: at most W admitted requests without their first
    /// response (lg_permit_first_response()); admission needs a request
    /// slot and a wait slot. 1 to 2097151; 0 means no wait limit (the
    /// default).
    pub wait_limit: u32,
    /// Priority classes, class 0 the most important: class_count entries
    /// (at most LG_MAX_CLASSES), copied by lg_gate_new(). NULL (with
    /// class_count 0, the default) for none: the gate without classes.
    ///
    /// queue bounds the whole queue and each class has its own limit within
    /// it. A freed slot goes to the oldest waiter of the most important
    /// class that has one (and may use the slot, see lg_gate_class.reserved).
    /// An arrival that finds the whole queue full, its own class not full,
    /// displaces the newest waiter of the least important class less
    /// important than its own, which is rejected with LG_DISPLACED. With
    /// classes, each class's queue_timeout_ms applies to its waiters and the
    /// gate's queue_timeout_ms is not used.
    pub classes: *const lg_gate_class,
    /// Number of entries in classes (0 to LG_MAX_CLASSES; 0 = no classes).
    pub class_count: usize,
}

/// One priority class of a gate (see lg_gate_config.classes). A zeroed
/// struct is a class that never waits, without deadline or reserved slots.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_gate_class {
    /// How many requests of this class may wait: at most the gate's queue
    /// size. 0: the class never waits (sheddable traffic); it is admitted
    /// only when a slot is free for it and rejected otherwise.
    pub queue: u32,
    /// Queue deadline of this class's waiters in milliseconds (rejected with
    /// LG_QUEUE_TIMEOUT). 0: none, they wait as long as it takes.
    pub queue_timeout_ms: u64,
    /// Reserved slots: the last `reserved` of the gate's limit slots go only
    /// to this class and more important ones, so class k may run while
    /// fewer than limit - r requests run, r being the largest reservation
    /// of a class more important than k. At most the limit (checked by
    /// lg_gate_new(); a later lg_gate_set_limit() below it leaves the less
    /// important classes no slot until the limit rises again).
    pub reserved: u32,
}

impl lg_gate_class {
    fn core_class(&self) -> ClassConfig {
        ClassConfig {
            queue: self.queue,
            queue_timeout: timeout_ms(self.queue_timeout_ms),
            reserved: self.reserved,
        }
    }
}

/// A queue deadline in milliseconds, 0 for none.
fn timeout_ms(ms: u64) -> Option<Duration> {
    (ms != 0).then(|| Duration::from_millis(ms))
}

/// One priority class's part of an lg_gate_stats.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_gate_class_stats {
    /// Requests of this class waiting in the queue.
    pub queued: u32,
    /// How many of this class may wait.
    pub queue_limit: u32,
    /// Requests of this class rejected because no slot was free for it and
    /// it could not queue.
    pub rejected_at_capacity: u64,
    /// Requests of this class rejected because they waited past its queue
    /// deadline.
    pub expired: u64,
    /// Requests of this class rejected because the gate was closed.
    pub rejected_closed: u64,
    /// Requests of this class that lost their place in the full queue to a
    /// more important arrival (LG_DISPLACED).
    pub displaced: u64,
}

impl From<ClassStats> for lg_gate_class_stats {
    fn from(c: ClassStats) -> Self {
        Self {
            queued: c.queued,
            queue_limit: c.queue_limit,
            rejected_at_capacity: c.rejected_at_capacity,
            expired: c.expired,
            rejected_closed: c.rejected_closed,
            displaced: c.displaced,
        }
    }
}

/// A snapshot of a gate's gauges and counters. The gauges (running,
/// queued, limit, closed, and with a wait limit or classes also waiting and
/// the classes' queued) are mutually consistent; the counters may be a
/// moment apart from them. The totals (rejected_at_capacity, expired,
/// rejected_closed, displaced) are the sums over the classes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_gate_stats {
    /// Slots held (including slots granted to waiters not yet told).
    pub running: u32,
    /// Requests waiting in the queue.
    pub queued: u32,
    /// Engine slots N.
    pub limit: u32,
    /// Queue size Q.
    pub queue_limit: u32,
    /// Whether the gate is closed.
    pub closed: bool,
    /// Requests admitted without waiting.
    pub admitted_direct: u64,
    /// Requests admitted after waiting in the queue.
    pub admitted_queued: u64,
    /// Requests rejected because slots and queue were full.
    pub rejected_at_capacity: u64,
    /// Requests rejected because the gate was closed.
    pub rejected_closed: u64,
    /// Requests rejected because they waited past the queue deadline.
    pub expired: u64,
    /// Requests that left the queue before getting a slot (cancelled or
    /// timed out); not rejections.
    pub cancelled: u64,
    /// Admitted requests without their first response yet (always 0 without
    /// a wait limit).
    pub waiting: u32,
    /// Wait limit W, or 0 for none.
    pub wait_limit: u32,
    /// Requests rejected because they lost their place in the full queue to
    /// a more important arrival (LG_DISPLACED).
    pub displaced: u64,
    /// How many priority classes the gate has (1 without classes: the whole
    /// queue is class 0).
    pub class_count: usize,
    /// Each class's share, in its first class_count entries (the rest are
    /// zero).
    pub classes: [lg_gate_class_stats; LG_MAX_CLASSES],
}

impl lg_gate {
    fn build(config: GateConfig) -> Result<*mut lg_gate, Error> {
        let gate = AdmissionGate::new(config)?;
        Ok(Box::into_raw(Box::new(lg_gate {
            gate: Arc::new(gate),
        })))
    }
}

/// Fills `out` with the default settings for `limit` engine slots: queue 16,
/// no deadline, FIFO, prefix "dynamo", no wait limit, no priority classes.
/// The limit is checked by lg_gate_new().
///
/// Errors: LG_INVALID_ARGUMENT (NULL out).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never.
///
/// # Safety
/// `out` is NULL or valid for writes of an lg_gate_config.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_config_default(limit: u32, out: *mut lg_gate_config) -> lg_status {
    guard(|| {
        let out = Out::new(out, "out")?;
        let config = lg_gate_config {
            limit,
            queue: DEFAULT_QUEUE_LIMIT,
            queue_timeout_ms: 0,
            adaptive_lifo: false,
            metrics_prefix: std::ptr::null(),
            metrics_prefix_len: 0,
            wait_limit: 0,
            classes: std::ptr::null(),
            class_count: 0,
        };
        // SAFETY: `out` is writable (contract).
        unsafe { out.write(config) };
        Ok(())
    })
}

/// Creates a gate.
///
/// Errors: LG_INVALID_ARGUMENT (NULL config or out_gate, limit 0 or above
/// 2097151, queue or wait_limit above 2097151, metrics prefix not matching
/// [a-zA-Z_:][a-zA-Z0-9_:]*, NULL classes with class_count > 0, class_count
/// above LG_MAX_CLASSES, a class's queue above the gate's queue or its
/// reserved above the limit; the message names the class and field).
/// Ownership: on LG_OK *out_gate owns a new gate; free it with
/// lg_gate_free(). The config and its classes are copied.
/// Thread safety: any thread. Blocking: never (allocates N + Q waiter
/// cells up front).
///
/// # Safety
/// `config` is NULL or points to a valid lg_gate_config whose metrics_prefix
/// is NULL or valid for metrics_prefix_len bytes and whose classes is NULL
/// or valid for class_count lg_gate_class; `out_gate` is NULL or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_new(
    config: *const lg_gate_config,
    out_gate: *mut *mut lg_gate,
) -> lg_status {
    guard(|| {
        // SAFETY: `config` is NULL or valid (contract).
        let c = unsafe { input(config, "config") }?;
        let out = Out::new(out_gate, "out_gate")?;
        // SAFETY: NULL or valid for class_count classes (contract).
        let classes = unsafe { slice(c.classes, c.class_count, "classes") }?;
        let mut config = GateConfig::new(c.limit)
            .with_queue(c.queue)
            .with_queue_timeout(timeout_ms(c.queue_timeout_ms))
            .with_adaptive_lifo(c.adaptive_lifo)
            .with_wait_limit((c.wait_limit != 0).then_some(c.wait_limit));
        // Checked (count and values) by the gate's constructor.
        config.classes = classes.iter().map(lg_gate_class::core_class).collect();
        // SAFETY: NULL or valid for metrics_prefix_len bytes (contract).
        let prefix =
            unsafe { optional_string(c.metrics_prefix, c.metrics_prefix_len, "metrics_prefix") }?;
        if let Some(p) = prefix {
            config = config.with_metrics_prefix(p);
        }
        let handle = lg_gate::build(config)?;
        // SAFETY: `out_gate` is writable (contract).
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Creates a gate with `limit` engine slots (the --engine-request-limit
/// equivalent) and the queue size, deadline and wait limit read from
/// DYN_DYNAMO_REQUEST_QUEUE_LIMIT (default 16),
/// DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS (unset: off) and
/// DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT (unset: none). Call it only when
/// an engine limit is configured.
///
/// Errors: LG_INVALID_ARGUMENT (NULL out_gate, bad limit, a variable that is
/// set but empty or malformed; the message names it). Never a silent
/// fallback.
/// Ownership: as lg_gate_new().
/// Thread safety: any thread (reads the environment). Blocking: never.
///
/// # Safety
/// `out_gate` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_from_env(limit: u32, out_gate: *mut *mut lg_gate) -> lg_status {
    guard(|| {
        let out = Out::new(out_gate, "out_gate")?;
        let handle = lg_gate::build(GateConfig::from_env(limit)?)?;
        // SAFETY: `out_gate` is writable (contract).
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Frees a gate handle. NULL is a no-op. This does not close the gate:
/// permits already handed out stay valid, and queued asynchronous requests
/// still get their callback (close the gate first to reject them).
///
/// Ownership: takes `gate`.
/// Thread safety: no other thread may be using this handle (for instance
/// blocked in lg_gate_admit()).
/// Blocking: never.
///
/// # Safety
/// `gate` is NULL or was returned by lg_gate_new()/lg_gate_from_env() and
/// not freed yet.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_free(gate: *mut lg_gate) {
    boundary((), || {
        if !gate.is_null() {
            // SAFETY: a live handle given up by the caller (contract).
            drop(unsafe { Box::from_raw(gate) });
        }
    })
}

/// Takes a slot only if one is free and nobody is queued; never waits and
/// never queues. The request is of priority class 0, the most important
/// (see lg_gate_try_admit_at()).
///
/// Errors: LG_WOULD_WAIT (no free slot, or others are waiting; not counted
/// as a rejection), LG_CLOSED, LG_INVALID_ARGUMENT (NULL gate or
/// out_permit).
/// Ownership: on LG_OK *out_permit owns the slot; release it with
/// lg_permit_release() exactly once, from any thread.
/// Thread safety: any thread. Blocking: never (lock-free; allocates the
/// permit handle).
///
/// # Safety
/// `gate` is NULL or a live gate; `out_permit` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_try_admit(
    gate: *const lg_gate,
    out_permit: *mut *mut lg_permit,
) -> lg_status {
    // SAFETY: forwarded contract.
    unsafe { try_admit(gate, 0, out_permit) }
}

/// lg_gate_try_admit() for a request of priority class `priority` (0 the
/// most important; a priority past the gate's last class counts as the
/// last): takes a slot only if one is free within the class's share (see
/// lg_gate_class.reserved) and no request of this class or a more
/// important one is waiting; never waits and never queues.
///
/// Errors: LG_WOULD_WAIT (no slot free for this class, or requests of this
/// class or a more important one are waiting; not counted as a rejection),
/// LG_CLOSED, LG_INVALID_ARGUMENT (NULL gate or out_permit).
/// Ownership: on LG_OK *out_permit owns the slot; release it with
/// lg_permit_release() exactly once, from any thread.
/// Thread safety: any thread. Blocking: never (lock-free).
///
/// # Safety
/// `gate` is NULL or a live gate; `out_permit` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_try_admit_at(
    gate: *const lg_gate,
    priority: u8,
    out_permit: *mut *mut lg_permit,
) -> lg_status {
    // SAFETY: forwarded contract.
    unsafe { try_admit(gate, priority, out_permit) }
}

/// lg_gate_try_admit_at(): the body of both try-admit calls.
///
/// # Safety
/// As lg_gate_try_admit().
#[inline(always)]
unsafe fn try_admit(
    gate: *const lg_gate,
    priority: u8,
    out_permit: *mut *mut lg_permit,
) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        let out = Out::new(out_permit, "out_permit")?;
        let permit = g.gate.try_admit_owned_at(priority)?;
        // SAFETY: `out_permit` is writable (contract).
        unsafe { out.write(lg_permit::into_raw(permit)) };
        Ok(())
    })
}

/// Asks for a slot and blocks the calling thread until it is granted, the
/// request is rejected, or `timeout_ms` passes (LG_TIMEOUT_INFINITE: no
/// limit). Admits at once when a slot is free and nobody waits; queues
/// (FIFO) when the queue has room; else rejects. The request is of
/// priority class 0, the most important (see lg_gate_admit_at()).
///
/// Errors: LG_AT_CAPACITY (slots and queue full), LG_QUEUE_TIMEOUT (waited
/// past the gate's queue deadline), LG_CLOSED (closed before or while
/// waiting), LG_TIMED_OUT (timeout_ms ran out first; the request left the
/// queue as a cancellation), LG_INVALID_ARGUMENT (NULL gate or out_permit).
/// Ownership: on LG_OK *out_permit owns the slot; release it with
/// lg_permit_release() exactly once, from any thread.
/// Thread safety: any thread. Blocking: yes, up to timeout_ms (and up to
/// the queue deadline); the handle must stay alive meanwhile.
///
/// # Safety
/// `gate` is NULL or a live gate; `out_permit` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_admit(
    gate: *const lg_gate,
    timeout_ms: u64,
    out_permit: *mut *mut lg_permit,
) -> lg_status {
    // SAFETY: forwarded contract.
    unsafe { admit(gate, 0, timeout_ms, out_permit) }
}

/// lg_gate_admit() for a request of priority class `priority` (0 the most
/// important; a priority past the gate's last class counts as the last).
/// Admits at once when a slot is free within the class's share and no
/// request of this class or a more important one waits; queues when the
/// class's queue has room and so has the whole queue, or when the whole
/// queue is full but holds a waiter of a less important class, which is
/// displaced (LG_DISPLACED); else rejects. Waiters are served most
/// important class first, FIFO within a class.
///
/// Errors: LG_AT_CAPACITY (no slot for the class and no place in the
/// queue), LG_QUEUE_TIMEOUT (waited past the class's queue deadline),
/// LG_DISPLACED (while waiting, gave its place in the full queue to a more
/// important arrival; never for class 0), LG_CLOSED (closed before or while
/// waiting), LG_TIMED_OUT (timeout_ms ran out first; the request left the
/// queue as a cancellation), LG_INVALID_ARGUMENT (NULL gate or out_permit).
/// Ownership: on LG_OK *out_permit owns the slot; release it with
/// lg_permit_release() exactly once, from any thread.
/// Thread safety: any thread. Blocking: yes, up to timeout_ms (and up to
/// the class's queue deadline); the handle must stay alive meanwhile.
///
/// # Safety
/// `gate` is NULL or a live gate; `out_permit` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_admit_at(
    gate: *const lg_gate,
    priority: u8,
    timeout_ms: u64,
    out_permit: *mut *mut lg_permit,
) -> lg_status {
    // SAFETY: forwarded contract.
    unsafe { admit(gate, priority, timeout_ms, out_permit) }
}

/// lg_gate_admit_at(): the body of both blocking admits.
///
/// # Safety
/// As lg_gate_admit().
unsafe fn admit(
    gate: *const lg_gate,
    priority: u8,
    timeout_ms: u64,
    out_permit: *mut *mut lg_permit,
) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        let out = Out::new(out_permit, "out_permit")?;
        let timeout =
            (timeout_ms != LG_TIMEOUT_INFINITE).then(|| Duration::from_millis(timeout_ms));
        let permit = g.gate.admit_blocking_owned_at(priority, timeout)?;
        // SAFETY: `out_permit` is writable (contract).
        unsafe { out.write(lg_permit::into_raw(permit)) };
        Ok(())
    })
}

/// Asks for a slot without blocking and calls `callback(user_data, status,
/// permit)` exactly once with the outcome: LG_OK with a permit, or
/// LG_AT_CAPACITY, LG_QUEUE_TIMEOUT or LG_CLOSED with a NULL permit. The
/// callback runs at once on this thread if the request is admitted or
/// rejected straight away; otherwise later, on the thread that releases a
/// permit, calls lg_gate_set_limit(), lg_gate_expire() or lg_gate_close(),
/// or another admit that finds the queue's head past its deadline. The only
/// way it is not called is a successful lg_ticket_cancel(). The request is
/// of priority class 0, the most important (see lg_gate_admit_async_at()).
///
/// The callback must be quick, must not throw or unwind, and must not
/// block on the gate; it may release its permit at once or ask for another
/// slot. With a queue deadline, call lg_gate_expire() when
/// lg_gate_next_deadline() says so, or expired requests are told only when
/// the queue next moves.
///
/// `out_ticket` (may be NULL) receives a ticket that can cancel the request
/// while it waits. The callback may already have run (on this or another
/// thread) by the time this function returns.
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate or callback); then the callback
/// is never called. Rejections are reported through the callback, not the
/// return value.
/// Ownership: the permit passed to the callback belongs to the callback's
/// owner: release it with lg_permit_release() exactly once, from any thread.
/// On LG_OK *out_ticket owns a ticket; free it with lg_ticket_free().
/// `user_data` is passed through untouched and must stay valid until the
/// callback has run or the request was cancelled.
/// Thread safety: any thread; `user_data` must be usable from the thread
/// the callback runs on. Blocking: never (lock-free; allocates the
/// callback's box).
///
/// # Safety
/// `gate` is NULL or a live gate; `callback` is NULL or a function that is
/// safe to call with `user_data` from any thread; `out_ticket` is NULL or
/// valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_admit_async(
    gate: *const lg_gate,
    callback: lg_admit_callback,
    user_data: *mut c_void,
    out_ticket: *mut *mut lg_ticket,
) -> lg_status {
    // SAFETY: forwarded contract.
    unsafe { admit_async(gate, 0, callback, user_data, out_ticket) }
}

/// lg_gate_admit_async() for a request of priority class `priority` (0 the
/// most important; a priority past the gate's last class counts as the
/// last), admitted, queued or rejected as lg_gate_admit_at() describes.
/// The callback gets LG_OK with a permit, or LG_AT_CAPACITY,
/// LG_QUEUE_TIMEOUT, LG_DISPLACED (the request waited in the full queue and
/// a more important arrival took its place; never for class 0) or
/// LG_CLOSED with a NULL permit. A displaced request's callback runs on the
/// thread of the admit call that displaced it; otherwise the callback runs
/// where lg_gate_admit_async() says, under the same rules.
///
/// `out_ticket` (may be NULL) receives a ticket that can cancel the request
/// while it waits. The callback may already have run (on this or another
/// thread) by the time this function returns.
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate or callback); then the callback
/// is never called. Rejections are reported through the callback, not the
/// return value.
/// Ownership: as lg_gate_admit_async(): the permit passed to the callback
/// belongs to the callback's owner (release it with lg_permit_release()
/// exactly once); on LG_OK *out_ticket owns a ticket (free it with
/// lg_ticket_free()); `user_data` must stay valid until the callback has
/// run or the request was cancelled.
/// Thread safety: any thread; `user_data` must be usable from the thread
/// the callback runs on. Blocking: never (lock-free; runs the callback of
/// a request it displaces on this thread; allocates the callback's box).
///
/// # Safety
/// `gate` is NULL or a live gate; `callback` is NULL or a function that is
/// safe to call with `user_data` from any thread; `out_ticket` is NULL or
/// valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_admit_async_at(
    gate: *const lg_gate,
    priority: u8,
    callback: lg_admit_callback,
    user_data: *mut c_void,
    out_ticket: *mut *mut lg_ticket,
) -> lg_status {
    // SAFETY: forwarded contract.
    unsafe { admit_async(gate, priority, callback, user_data, out_ticket) }
}

/// lg_gate_admit_async_at(): the body of both asynchronous admits.
///
/// # Safety
/// As lg_gate_admit_async().
unsafe fn admit_async(
    gate: *const lg_gate,
    priority: u8,
    callback: lg_admit_callback,
    user_data: *mut c_void,
    out_ticket: *mut *mut lg_ticket,
) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        let callback = callback.ok_or_else(|| Error::invalid("callback must not be NULL"))?;
        let out = Out::optional(out_ticket, "out_ticket")?;
        // SAFETY: the callback may be called with `user_data` from any thread
        // (contract).
        let target = unsafe { CallbackTarget::new(callback, user_data) };
        let ticket = g
            .gate
            .admit_with_callback_at(priority, Box::new(move |outcome| target.call(outcome)));
        if let Some(out) = out {
            // SAFETY: `out_ticket` is writable (contract).
            unsafe { out.write(lg_ticket::into_raw(ticket)) };
        }
        Ok(())
    })
}

/// How many priority classes the gate has: its lg_gate_config.class_count,
/// or 1 for a gate without classes (whose whole queue is class 0).
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate or out_classes).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free).
///
/// # Safety
/// `gate` is NULL or a live gate; `out_classes` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_classes(
    gate: *const lg_gate,
    out_classes: *mut usize,
) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        let out = Out::new(out_classes, "out_classes")?;
        // SAFETY: `out_classes` is writable (contract).
        unsafe { out.write(g.gate.classes()) };
        Ok(())
    })
}

/// Changes the engine limit N (1 to 2097151). Raising it hands the new
/// slots to waiters before returning (their callbacks run on this thread);
/// lowering it revokes nothing: running requests finish and the count
/// drains down.
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate, limit 0 or too large).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: takes the gate's limit lock
/// briefly (only limit changes take it); runs asynchronous callbacks of
/// granted waiters.
///
/// # Safety
/// `gate` is NULL or a live gate.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_set_limit(gate: *const lg_gate, limit: u32) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        g.gate.set_limit(limit)?;
        Ok(())
    })
}

/// Closes the gate: every queued request and every later admission gets
/// LG_CLOSED. Permits already held stay valid. Closing twice is harmless.
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free; it may wait a
/// few instructions for an arrival on its way into the queue); wakes
/// blocked waiters and runs the callbacks of queued asynchronous requests
/// on this thread.
///
/// # Safety
/// `gate` is NULL or a live gate.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_close(gate: *const lg_gate) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        g.gate.close();
        Ok(())
    })
}

/// Rejects every queued request past the queue deadline (on a gate with
/// classes, its class's) with LG_QUEUE_TIMEOUT. A no-op without a
/// deadline. `out_expired` (may be NULL) receives how many were rejected.
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free); runs the
/// callbacks of expired asynchronous requests on this thread.
///
/// # Safety
/// `gate` is NULL or a live gate; `out_expired` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_expire(
    gate: *const lg_gate,
    out_expired: *mut usize,
) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        let out = Out::optional(out_expired, "out_expired")?;
        let n = g.gate.expire();
        if let Some(out) = out {
            // SAFETY: `out_expired` is writable (contract).
            unsafe { out.write(n) };
        }
        Ok(())
    })
}

/// How long, in nanoseconds from now, until the next queued request passes
/// the queue deadline (on a gate with classes, its class's; 0 if one
/// already has): the time at which an event loop should call
/// lg_gate_expire(). LG_TIMEOUT_INFINITE when there is no deadline or
/// nobody is queued.
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate or out_wait_ns).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free).
///
/// # Safety
/// `gate` is NULL or a live gate; `out_wait_ns` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_next_deadline(
    gate: *const lg_gate,
    out_wait_ns: *mut u64,
) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        let out = Out::new(out_wait_ns, "out_wait_ns")?;
        let wait = g
            .gate
            .time_to_next_deadline()
            .map_or(LG_TIMEOUT_INFINITE, |d| {
                u64::try_from(d.as_nanos()).unwrap_or(LG_TIMEOUT_INFINITE)
            });
        // SAFETY: `out_wait_ns` is writable (contract).
        unsafe { out.write(wait) };
        Ok(())
    })
}

/// A snapshot of the gate's gauges and counters.
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate or out_stats).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free).
///
/// # Safety
/// `gate` is NULL or a live gate; `out_stats` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_get_stats(
    gate: *const lg_gate,
    out_stats: *mut lg_gate_stats,
) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        let out = Out::new(out_stats, "out_stats")?;
        let s = g.gate.stats();
        let stats = lg_gate_stats {
            running: s.running,
            queued: s.queued,
            limit: s.limit,
            queue_limit: s.queue_limit,
            closed: s.closed,
            admitted_direct: s.admitted_direct,
            admitted_queued: s.admitted_queued,
            rejected_at_capacity: s.rejected_at_capacity,
            rejected_closed: s.rejected_closed,
            expired: s.expired,
            cancelled: s.cancelled,
            waiting: s.waiting,
            wait_limit: s.wait_limit.unwrap_or(0),
            displaced: s.displaced,
            class_count: s.class_count,
            // Core zeroes the entries past class_count.
            classes: s.classes.map(lg_gate_class_stats::from),
        };
        // SAFETY: `out_stats` is writable (contract).
        unsafe { out.write(stats) };
        Ok(())
    })
}

/// Writes the worker metrics (Prometheus text format:
/// dynamo_rejection_request_total, dynamo_engine_request,
/// dynamo_request_queue, ..., the queue-wait histogram and the
/// dynamo_backend_admission_* family) into `buf` with
/// snprintf semantics, as lg_monitor_metrics() does.
///
/// Errors: LG_INVALID_ARGUMENT (NULL gate or out_needed, NULL buf with
/// buf_len > 0), LG_BUFFER_TOO_SMALL.
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (lock-free); allocates
/// (cold path).
///
/// # Safety
/// `gate` is NULL or a live gate; `buf` is NULL or valid for writes of
/// `buf_len` bytes; `out_needed` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_gate_metrics(
    gate: *const lg_gate,
    buf: *mut c_char,
    buf_len: usize,
    out_needed: *mut usize,
) -> lg_status {
    guard(|| {
        // SAFETY: `gate` is NULL or live (contract).
        let g = unsafe { input(gate, "gate") }?;
        let text = TextBuf::new(buf, buf_len, out_needed)?;
        let metrics = g.gate.metrics_text();
        // SAFETY: `buf` and `out_needed` are writable (contract).
        unsafe { text.write(metrics.as_bytes()) }
    })
}
