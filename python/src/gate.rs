//! `loadgate.AdmissionGate`, `loadgate.Permit` and `loadgate.Admission`: the
//! worker half.
//!
//! # asyncio without polling
//!
//! `gate.admit()` returns an [`Admission`]: a native object that speaks the
//! coroutine protocol (`send`, `throw`, `close`, `__await__`, `__next__`) and
//! is registered as a `collections.abc.Coroutine`, so `await`,
//! `asyncio.create_task`, `ensure_future`, `gather`, `wait_for` and
//! `TaskGroup` all take it, without a Python frame per admission.
//!
//! Its first step asks the core in two steps
//! ([`loadgate::AdmissionGate::admit_pending_at`]): admitted or refused at
//! once, it returns the permit or raises; queued, it makes an asyncio future
//! and arms the request with a callback that settles it
//! ([`loadgate::PendingAdmission::arm`]), unless the request was resolved
//! meanwhile, whose outcome the arm returns instead. Only a request that
//! queues touches the event loop, and the core never calls the callback
//! before the arm, so the binding keeps no state for an early outcome. The
//! callback runs once, on whichever thread granted, expired or closed the
//! request:
//!
//! * on the loop's own thread (a release, `set_limit`, `close` or `expire`
//!   called from a task), it settles the future directly;
//! * on any other thread, it hands the outcome to the loop with
//!   `loop.call_soon_threadsafe`.
//!
//! Cancelling the awaiting task cancels the future and throws
//! `CancelledError` into the admission, which cancels the core ticket: the
//! queue place is free at once, and the request counts as cancelled, not
//! rejected. `throw()` of any other exception, `close()` and garbage
//! collection of a queued admission do the same. If the ticket was already
//! granted, the permit is in the future or on its way to it, and is
//! released (at once, or when it arrives and finds the future cancelled).
//!
//! Queue deadlines are driven by one `loop.call_later` timer per gate and
//! event loop, set by the core's
//! [`loadgate::AdmissionGate::time_to_next_deadline`] (the earliest deadline
//! of any priority class); it calls [`loadgate::AdmissionGate::expire`] and
//! is set again while admissions of that loop are queued. A gate on a
//! `ManualClock` sets no timer (the loop's timers run in real time): tests
//! advance the clock and call `expire()`. No thread is started.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use loadgate::gate::MAX_CLASSES;
use loadgate::{
    AdmitError, CallbackTicket, ClassConfig, GateConfig, OwnedPermit, Pending, Reason, SharedClock,
    TryAdmitError,
};
use pyo3::exceptions::{
    PyBaseException, PyRuntimeError, PyStopIteration, PyTypeError, PyValueError,
};
use pyo3::ffi;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyString, PyTuple, PyType};
use pyo3::PyTraverseError;

use crate::clock::clock_arg;
use crate::errors::{
    admit_error, admit_value, config_error, is_integer, opt_str_arg, priority_arg, ranged_arg,
    rejection, seconds_arg, timeout_arg, u32_arg,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A worker's admission gate: at most `limit` requests run and at most
/// `queue` wait; the rest are rejected with `AtCapacity`.
///
/// `classes` gives the gate priority classes, class 0 the most important
/// (1 to 8; without it the gate has one class): an int `n` for `n` classes
/// that may each fill the whole queue, with the gate's `queue_timeout` and
/// no reserved slots, or a sequence of `PriorityClass`, one per class. A
/// freed slot goes to the oldest waiter of the most important class that
/// has one (and may use the slot); an arrival that finds the whole queue
/// full displaces the newest waiter of the least important class below its
/// own, which raises `Displaced`. A request names its class with the
/// `priority` argument of `admit`, `try_admit` and `admit_blocking` (0 to
/// 255; a priority past the last class counts as the last).
///
/// Queue deadlines and queue-wait times read real time, or the
/// `ManualClock` given as `clock=`. asyncio waiters' deadlines are driven by
/// an event-loop timer; on a manual clock there is none: advance the clock
/// and call `expire()`.
#[pyclass(frozen, module = "loadgate")]
pub struct AdmissionGate {
    inner: Arc<loadgate::AdmissionGate>,
    /// What the gate's admissions and deadline timers share.
    shared: Arc<Shared>,
}

impl AdmissionGate {
    fn build(config: GateConfig, clock: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let (clock, manual): (SharedClock, bool) = clock_arg(clock)?;
        let inner =
            Arc::new(loadgate::AdmissionGate::with_clock(config, clock).map_err(config_error)?);
        Ok(Self {
            shared: Arc::new(Shared {
                core: Arc::clone(&inner),
                real_time: !manual,
                loops: Mutex::new(Vec::new()),
            }),
            inner,
        })
    }
}

/// What an `AdmissionGate` shares with its admissions and their event
/// loops' deadline timers.
struct Shared {
    core: Arc<loadgate::AdmissionGate>,
    /// Whether the gate reads real time, so that event-loop timers can
    /// drive its queue deadlines.
    real_time: bool,
    /// The deadline timer of each event loop with queued admissions.
    loops: Mutex<Vec<LoopTimer>>,
}

/// One event loop's deadline timer for one gate.
struct LoopTimer {
    event_loop: Py<PyAny>,
    /// Queued admissions of this loop counted in (by `Shared::join`).
    waiters: usize,
    /// The pending `call_later` handle, its serial number and the gate-clock
    /// time (nanoseconds) it was set for.
    armed: Option<(Py<PyAny>, u64, u64)>,
    /// The serial number of the last timer set.
    serial: u64,
}

/// The shortest timer set: one that fired a hair before the deadline finds
/// nothing to expire and is set again, at least this much later.
const MIN_TIMER: Duration = Duration::from_micros(100);

/// Cancels a `call_later` handle; a failure is reported, not raised.
fn cancel_handle(py: Python<'_>, handle: &Py<PyAny>) {
    if let Err(e) = handle.bind(py).call_method0(intern!(py, "cancel")) {
        e.write_unraisable(py, None);
    }
}

impl Shared {
    fn position(loops: &[LoopTimer], event_loop: *mut pyo3::ffi::PyObject) -> Option<usize> {
        loops
            .iter()
            .position(|l| l.event_loop.as_ptr() == event_loop)
    }

    /// An admission queued on `event_loop` (on its thread): if a queue
    /// deadline is pending, counts the admission in and makes sure the
    /// loop's timer fires by the gate's next deadline. Returns whether it
    /// was counted in; then it must [`leave`](Self::leave).
    fn join(self: &Arc<Self>, py: Python<'_>, event_loop: &Bound<'_, PyAny>) -> PyResult<bool> {
        if !self.real_time {
            return Ok(false);
        }
        let Some(at) = self.core.next_deadline() else {
            return Ok(false);
        };
        let stale = {
            let mut loops = lock(&self.loops);
            let i = match Self::position(&loops, event_loop.as_ptr()) {
                Some(i) => i,
                None => {
                    loops.push(LoopTimer {
                        event_loop: event_loop.clone().unbind(),
                        waiters: 0,
                        armed: None,
                        serial: 0,
                    });
                    loops.len() - 1
                }
            };
            let entry = &mut loops[i];
            entry.waiters += 1;
            if entry.armed.as_ref().is_some_and(|a| a.2 <= at) {
                return Ok(true);
            }
            entry.armed.take()
        };
        // Python is called only with the lock released.
        if let Some((handle, _, _)) = stale {
            cancel_handle(py, &handle);
        }
        match self.arm(py, event_loop) {
            Ok(()) => Ok(true),
            Err(e) => {
                self.leave(Some(py), event_loop.as_unbound());
                Err(e)
            }
        }
    }

    /// Sets `event_loop`'s timer by the core's `time_to_next_deadline`, if
    /// a waiter has a deadline.
    fn arm(self: &Arc<Self>, py: Python<'_>, event_loop: &Bound<'_, PyAny>) -> PyResult<()> {
        let (Some(at), Some(wait)) = (self.core.next_deadline(), self.core.time_to_next_deadline())
        else {
            return Ok(());
        };
        let serial = {
            let mut loops = lock(&self.loops);
            let Some(i) = Self::position(&loops, event_loop.as_ptr()) else {
                return Ok(()); // nobody of this loop waits any more
            };
            loops[i].serial += 1;
            loops[i].serial
        };
        let timer = DeadlineTimer {
            gate: Arc::clone(self),
            event_loop: event_loop.clone().unbind(),
            serial,
        };
        let handle = event_loop
            .call_method1(
                intern!(py, "call_later"),
                (wait.max(MIN_TIMER).as_secs_f64(), timer),
            )?
            .unbind();
        let unused = {
            let mut loops = lock(&self.loops);
            match Self::position(&loops, event_loop.as_ptr()) {
                Some(i) if loops[i].serial == serial => {
                    loops[i].armed.replace((handle, serial, at)).map(|a| a.0)
                }
                // Everyone left, or another timer was set, meanwhile.
                _ => Some(handle),
            }
        };
        if let Some(handle) = unused {
            cancel_handle(py, &handle);
        }
        Ok(())
    }

    /// Timer number `serial` of `event_loop` fired: expires the due
    /// waiters, and sets the timer again while admissions of the loop wait.
    fn fire(
        self: &Arc<Self>,
        py: Python<'_>,
        event_loop: &Bound<'_, PyAny>,
        serial: u64,
    ) -> PyResult<()> {
        let (again, fired, gone) = {
            let mut loops = lock(&self.loops);
            match Self::position(&loops, event_loop.as_ptr()) {
                Some(i) => {
                    let current = loops[i].armed.as_ref().is_some_and(|a| a.1 == serial);
                    let fired = if current { loops[i].armed.take() } else { None };
                    let gone = (loops[i].waiters == 0 && loops[i].armed.is_none())
                        .then(|| loops.swap_remove(i));
                    (current && gone.is_none(), fired, gone)
                }
                None => (false, None, None),
            }
        };
        drop((fired, gone));
        self.core.expire();
        if again {
            self.arm(py, event_loop)?;
        }
        Ok(())
    }

    /// A counted-in admission of `event_loop` is done. When it was the
    /// last, the loop's entry goes and its timer is cancelled (given `py`;
    /// without, it is left to fire on nothing).
    fn leave(&self, py: Option<Python<'_>>, event_loop: &Py<PyAny>) {
        let gone = {
            let mut loops = lock(&self.loops);
            let Some(i) = Self::position(&loops, event_loop.as_ptr()) else {
                return;
            };
            loops[i].waiters = loops[i].waiters.saturating_sub(1);
            (loops[i].waiters == 0).then(|| loops.swap_remove(i))
        };
        if let (Some(py), Some(LoopTimer { armed: Some(a), .. })) = (py, &gone) {
            cancel_handle(py, &a.0);
        }
    }
}

/// `call_later` target: an event loop's deadline timer for one gate.
#[pyclass(frozen, module = "loadgate", name = "_DeadlineTimer")]
pub struct DeadlineTimer {
    gate: Arc<Shared>,
    event_loop: Py<PyAny>,
    serial: u64,
}

#[pymethods]
impl DeadlineTimer {
    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        self.gate.fire(py, self.event_loop.bind(py), self.serial)
    }
}

/// One priority class of an `AdmissionGate` (its `classes` argument), the
/// core's `ClassConfig` with the gate's settings as defaults:
///
/// * `queue`: how many requests of the class may wait, at most the gate's
///   `queue`; `None` (default): the whole queue; 0: the class never waits
///   (it is admitted when a slot is free for it and rejected otherwise).
/// * `queue_timeout`: seconds its requests may wait before `QueueTimeout`;
///   `None` (default): the gate's `queue_timeout` (no deadline when the gate
///   has none). To mix classes with and without a deadline, leave the
///   gate's unset and give each class its own.
/// * `reserved`: the last `reserved` of the gate's `limit` slots go only to
///   this class and more important ones (at most `limit`; default 0).
#[pyclass(frozen, eq, hash, module = "loadgate")]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PriorityClass {
    queue: Option<u32>,
    queue_timeout: Option<Duration>,
    reserved: u32,
}

impl PriorityClass {
    /// The core class, `default` (the class `GateConfig::with_classes`
    /// makes) supplying what is `None`.
    fn config(&self, default: ClassConfig) -> ClassConfig {
        ClassConfig {
            queue: self.queue.unwrap_or(default.queue),
            queue_timeout: self.queue_timeout.or(default.queue_timeout),
            reserved: self.reserved,
        }
    }
}

#[pymethods]
impl PriorityClass {
    #[new]
    #[pyo3(
        signature = (*, queue = None, queue_timeout = None, reserved = None),
        text_signature = "(*, queue=None, queue_timeout=None, reserved=0)"
    )]
    fn new(
        queue: Option<&Bound<'_, PyAny>>,
        queue_timeout: Option<&Bound<'_, PyAny>>,
        reserved: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(Self {
            queue: queue
                .filter(|q| !q.is_none())
                .map(|q| u32_arg(q, "queue"))
                .transpose()?,
            queue_timeout: queue_timeout
                .filter(|t| !t.is_none())
                .map(|t| seconds_arg(t, "queue_timeout"))
                .transpose()?,
            reserved: reserved.map_or(Ok(0), |r| u32_arg(r, "reserved"))?,
        })
    }

    /// How many of the class may wait, or `None` for the gate's whole queue.
    #[getter]
    fn queue(&self) -> Option<u32> {
        self.queue
    }

    /// The class's queue deadline in seconds, or `None` for the gate's.
    #[getter]
    fn queue_timeout(&self) -> Option<f64> {
        self.queue_timeout.map(|d| d.as_secs_f64())
    }

    /// Slots reserved for this class and more important ones.
    #[getter]
    fn reserved(&self) -> u32 {
        self.reserved
    }

    fn __repr__(&self) -> String {
        let show = |v: Option<String>| v.unwrap_or_else(|| "None".to_owned());
        format!(
            "PriorityClass(queue={}, queue_timeout={}, reserved={})",
            show(self.queue.map(|q| q.to_string())),
            show(self.queue_timeout.map(|d| format!("{:?}", d.as_secs_f64()))),
            self.reserved
        )
    }
}

/// Applies the `classes` argument to `config` (whose queue size and
/// deadline are set: the classes copy them by default).
fn with_classes_arg(
    config: GateConfig,
    classes: Option<&Bound<'_, PyAny>>,
) -> PyResult<GateConfig> {
    let Some(obj) = classes.filter(|c| !c.is_none()) else {
        return Ok(config);
    };
    let want = "an int or a sequence of loadgate.PriorityClass";
    let max = MAX_CLASSES as u64;
    if is_integer(obj) {
        let n = ranged_arg(obj, "classes", 1, max)?;
        return Ok(config.with_classes(n as usize));
    }
    let not_a_sequence = || {
        let got = obj
            .get_type()
            .name()
            .map_or_else(|_| "?".to_owned(), |n| n.to_string());
        PyTypeError::new_err(format!("classes must be {want}, not {got}"))
    };
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(not_a_sequence());
    }
    let iter = obj.try_iter().map_err(|_| not_a_sequence())?;
    let mut given = Vec::new();
    // Reads one past the most a gate may have, never an endless iterator.
    for item in iter.take(MAX_CLASSES + 1) {
        let item = item?;
        let class = item.cast::<PriorityClass>().map_err(|_| {
            let got = item
                .get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string());
            PyTypeError::new_err(format!(
                "classes[{}] must be a loadgate.PriorityClass, not {got}",
                given.len()
            ))
        })?;
        given.push(*class.get());
    }
    if given.is_empty() || given.len() > MAX_CLASSES {
        let count = if given.is_empty() {
            "no entries".to_owned()
        } else {
            format!("more than {MAX_CLASSES} entries")
        };
        return Err(PyValueError::new_err(format!(
            "classes has {count}: a gate has 1 to {MAX_CLASSES} priority classes"
        )));
    }
    let mut config = config.with_classes(given.len());
    for (index, class) in given.iter().enumerate() {
        let default = config.classes[index];
        config = config.with_class(index, class.config(default));
    }
    Ok(config)
}

fn bool_arg(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<bool> {
    match obj {
        None => Ok(false),
        Some(o) => o
            .cast::<PyBool>()
            .map(|b| b.is_true())
            .map_err(|_| PyTypeError::new_err(format!("{name} must be a bool"))),
    }
}

#[pymethods]
impl AdmissionGate {
    #[new]
    #[pyo3(
        signature = (limit, queue = None, *, wait_limit = None, queue_timeout = None, adaptive_lifo = None, metrics_prefix = None, classes = None, clock = None),
        text_signature = "(limit, queue=16, *, wait_limit=None, queue_timeout=None, adaptive_lifo=False, metrics_prefix='dynamo', classes=None, clock=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        limit: &Bound<'_, PyAny>,
        queue: Option<&Bound<'_, PyAny>>,
        wait_limit: Option<&Bound<'_, PyAny>>,
        queue_timeout: Option<&Bound<'_, PyAny>>,
        adaptive_lifo: Option<&Bound<'_, PyAny>>,
        metrics_prefix: Option<&Bound<'_, PyAny>>,
        classes: Option<&Bound<'_, PyAny>>,
        clock: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut config = GateConfig::new(u32_arg(limit, "limit")?);
        if let Some(q) = queue {
            config.queue = u32_arg(q, "queue")?;
        }
        if let Some(w) = wait_limit.filter(|w| !w.is_none()) {
            config.wait_limit = Some(u32_arg(w, "wait_limit")?);
        }
        if let Some(t) = queue_timeout.filter(|t| !t.is_none()) {
            config.queue_timeout = Some(seconds_arg(t, "queue_timeout")?);
        }
        config.adaptive_lifo = bool_arg(adaptive_lifo, "adaptive_lifo")?;
        if let Some(p) = opt_str_arg(metrics_prefix, "metrics_prefix")? {
            config.metrics_prefix = p.to_string();
        }
        Self::build(with_classes_arg(config, classes)?, clock)
    }

    /// A gate configured from the environment: the engine request limit
    /// `limit`, or when it is `None` the variable
    /// `DYN_BACKEND_ADMISSION_ENGINE_REQUEST_LIMIT` (older name
    /// `DYN_ENGINE_REQUEST_LIMIT`); the queue size from
    /// `DYN_BACKEND_ADMISSION_REQUEST_QUEUE_LIMIT` (older name
    /// `DYN_DYNAMO_REQUEST_QUEUE_LIMIT`; default 16, 0 = no queue) and the
    /// queue deadline from `DYN_DYNAMO_REQUEST_QUEUE_TIMEOUT_MS` (off when
    /// unset) and the wait limit from `DYN_BACKEND_ADMISSION_ENGINE_WAIT_LIMIT`
    /// (none when unset). The newer name wins; an invalid value of either raises
    /// `ValueError` naming the variable, and so does a missing limit.
    /// `classes` is as for the constructor (the classes copy the queue size
    /// and deadline read from the environment), and so is `clock`.
    #[classmethod]
    #[pyo3(signature = (limit = None, *, classes = None, clock = None))]
    fn from_env(
        _cls: &Bound<'_, PyType>,
        limit: Option<&Bound<'_, PyAny>>,
        classes: Option<&Bound<'_, PyAny>>,
        clock: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let config = match limit.filter(|l| !l.is_none()) {
            Some(limit) => GateConfig::from_env(u32_arg(limit, "limit")?),
            None => GateConfig::from_env_all(),
        }
        .map_err(config_error)?;
        Self::build(with_classes_arg(config, classes)?, clock)
    }

    /// Takes a slot only if one is free now within the share of class
    /// `priority` and nobody of that class or a more important one is
    /// waiting; `None` otherwise. Raises `Closed` on a closed gate.
    #[pyo3(signature = (*, priority = None), text_signature = "(self, *, priority=0)")]
    fn try_admit(
        &self,
        py: Python<'_>,
        priority: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Permit>> {
        let priority = priority_arg(priority)?;
        match self.inner.try_admit_owned_at(priority) {
            Ok(p) => Ok(Some(Permit::new(p))),
            Err(TryAdmitError::WouldWait) => Ok(None),
            Err(TryAdmitError::Closed) => Err(rejection(py, Reason::Closed)),
        }
    }

    /// A coroutine admitting a request of class `priority`: `permit = await
    /// gate.admit()`, `async with gate.admit() as permit:`, or
    /// `asyncio.create_task(gate.admit())` and the like. Returns a `Permit`,
    /// or raises `AtCapacity`, `QueueTimeout`, `Displaced` or `Closed`.
    #[pyo3(signature = (*, priority = None), text_signature = "(self, *, priority=0)")]
    fn admit(&self, priority: Option<&Bound<'_, PyAny>>) -> PyResult<Admission> {
        let priority = priority_arg(priority)?;
        Ok(Admission {
            gate: Arc::clone(&self.shared),
            priority,
            entered: AtomicBool::new(false),
            state: Mutex::new(State {
                step: Step::New,
                permit: None,
            }),
        })
    }

    /// Waits for a slot for a request of class `priority`, blocking this
    /// thread (the GIL is released while it waits), for at most `timeout`
    /// seconds (`None`: as long as it takes). Raises `AtCapacity`,
    /// `QueueTimeout` (deadline or `timeout` reached), `Displaced` or
    /// `Closed`.
    #[pyo3(
        signature = (timeout = None, *, priority = None),
        text_signature = "(self, timeout=None, *, priority=0)"
    )]
    fn admit_blocking(
        &self,
        py: Python<'_>,
        timeout: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Permit> {
        let timeout = timeout_arg(timeout, "timeout")?;
        let priority = priority_arg(priority)?;
        // A free slot needs no wait, so no GIL round trip.
        match self.inner.try_admit_owned_at(priority) {
            Ok(p) => return Ok(Permit::new(p)),
            Err(TryAdmitError::Closed) => return Err(rejection(py, Reason::Closed)),
            Err(TryAdmitError::WouldWait) => {}
        }
        let gate = Arc::clone(&self.inner);
        py.detach(move || gate.admit_blocking_owned_at(priority, timeout))
            .map(Permit::new)
            .map_err(|e| admit_error(py, e))
    }

    /// Changes the engine limit: raising it admits waiters at once; lowering
    /// it revokes no running permit.
    fn set_limit(&self, limit: &Bound<'_, PyAny>) -> PyResult<()> {
        let limit = u32_arg(limit, "limit")?;
        self.inner.set_limit(limit).map_err(config_error)
    }

    /// Rejects every waiter and every later admission with `Closed`. Permits
    /// already held stay valid.
    fn close(&self) {
        self.inner.close();
    }

    /// Rejects the waiters whose queue deadline has come; returns how many.
    fn expire(&self) -> usize {
        self.inner.expire()
    }

    /// Engine slots `N`.
    #[getter]
    fn limit(&self) -> u32 {
        self.inner.limit()
    }

    /// Queue size `Q`.
    #[getter]
    fn queue_limit(&self) -> u32 {
        self.inner.queue_limit()
    }

    /// Wait limit `W` (admitted requests without their first response), or
    /// `None`.
    #[getter]
    fn wait_limit(&self) -> Option<u32> {
        self.inner.wait_limit()
    }

    /// Admitted requests without their first response now (0 without a
    /// wait limit).
    #[getter]
    fn waiting(&self) -> u32 {
        self.inner.waiting()
    }

    /// Slots held now.
    #[getter]
    fn running(&self) -> u32 {
        self.inner.running()
    }

    /// Requests waiting now.
    #[getter]
    fn queued(&self) -> u32 {
        self.inner.queued()
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// The gate's queue deadline in seconds, or `None` (the classes' own
    /// may differ; this is what they copy by default).
    #[getter]
    fn queue_timeout(&self) -> Option<f64> {
        self.inner.queue_timeout().map(|d| d.as_secs_f64())
    }

    /// How many priority classes the gate has (1 without classes).
    #[getter]
    fn classes(&self) -> usize {
        self.inner.classes()
    }

    /// A snapshot of the gauges and counters, with `classes`: one dict per
    /// priority class (class 0 first) of its `queued`, `queue_limit`,
    /// `rejected_at_capacity`, `expired`, `rejected_closed` and `displaced`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("running", s.running)?;
        d.set_item("queued", s.queued)?;
        d.set_item("limit", s.limit)?;
        d.set_item("queue_limit", s.queue_limit)?;
        d.set_item("waiting", s.waiting)?;
        d.set_item("wait_limit", s.wait_limit)?;
        d.set_item("closed", s.closed)?;
        d.set_item("received", s.received)?;
        d.set_item("admitted_direct", s.admitted_direct)?;
        d.set_item("admitted_queued", s.admitted_queued)?;
        d.set_item("rejected_at_capacity", s.rejected_at_capacity)?;
        d.set_item("rejected_closed", s.rejected_closed)?;
        d.set_item("expired", s.expired)?;
        d.set_item("cancelled", s.cancelled)?;
        d.set_item("displaced", s.displaced)?;
        let classes = PyList::empty(py);
        for c in s.classes() {
            let cd = PyDict::new(py);
            cd.set_item("queued", c.queued)?;
            cd.set_item("queue_limit", c.queue_limit)?;
            cd.set_item("rejected_at_capacity", c.rejected_at_capacity)?;
            cd.set_item("expired", c.expired)?;
            cd.set_item("rejected_closed", c.rejected_closed)?;
            cd.set_item("displaced", c.displaced)?;
            classes.append(cd)?;
        }
        d.set_item("classes", classes)?;
        Ok(d)
    }

    /// The worker metrics in Prometheus text format.
    fn metrics_text(&self) -> String {
        self.inner.metrics_text()
    }

    fn __repr__(&self) -> String {
        let s = self.inner.stats();
        let classes = match s.class_count {
            1 => String::new(),
            n => format!(" classes={n}"),
        };
        format!(
            "<loadgate.AdmissionGate limit={} queue_limit={}{classes} running={} queued={}{}>",
            s.limit,
            s.queue_limit,
            s.running,
            s.queued,
            if s.closed { " closed" } else { "" }
        )
    }
}

/// A held engine slot. `release()` gives it back (idempotent); so do
/// leaving a `with` block and garbage collection.
#[pyclass(frozen, freelist = 64, module = "loadgate")]
pub struct Permit {
    inner: Mutex<Option<OwnedPermit>>,
}

impl Permit {
    fn new(p: OwnedPermit) -> Self {
        Self {
            inner: Mutex::new(Some(p)),
        }
    }

    fn take(&self) -> Option<OwnedPermit> {
        lock(&self.inner).take()
    }
}

#[pymethods]
impl Permit {
    /// Gives the slot back (to the oldest waiter, if any). Calling it again
    /// does nothing.
    fn release(&self) {
        drop(self.take());
    }

    /// Marks the request's first response: on a gate with a wait limit,
    /// gives back the wait slot (to the oldest waiter, if a request slot is
    /// free too); the request slot stays held until `release()`.
    /// Idempotent, from any thread; a no-op after `release()` or on a gate
    /// without a wait limit.
    fn first_response(&self) {
        if let Some(p) = lock(&self.inner).as_ref() {
            p.first_response();
        }
    }

    /// Whether the slot was given back.
    #[getter]
    fn released(&self) -> bool {
        lock(&self.inner).is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, PyTuple>) -> bool {
        self.release();
        false
    }

    fn __repr__(&self) -> String {
        if self.released() {
            "<loadgate.Permit released>".to_owned()
        } else {
            "<loadgate.Permit held>".to_owned()
        }
    }
}

/// `asyncio.get_running_loop()`.
fn running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    GET_RUNNING_LOOP
        .import(py, "asyncio", "get_running_loop")?
        .call0()
}

/// `event_loop.create_future()`. On asyncio's own loops (exactly
/// `asyncio.SelectorEventLoop` or `ProactorEventLoop`, whose method is
/// `BaseEventLoop.create_future`: `return futures.Future(loop=self)`), the
/// same future is made here, without that method's Python frame; any other
/// loop (uvloop, or a subclass, which may override the method) is asked.
fn new_future<'py>(event_loop: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    static STOCK: PyOnceLock<(Vec<Py<PyAny>>, Py<PyAny>)> = PyOnceLock::new();
    let py = event_loop.py();
    let (stock_loops, future) = STOCK.get_or_try_init(py, || -> PyResult<_> {
        let asyncio = py.import("asyncio")?;
        let mut loops = Vec::new();
        for name in ["SelectorEventLoop", "ProactorEventLoop"] {
            if let Ok(class) = asyncio.getattr(name) {
                loops.push(class.unbind());
            }
        }
        Ok((loops, asyncio.getattr("Future")?.unbind()))
    })?;
    let class = event_loop.get_type();
    if !stock_loops.iter().any(|stock| class.is(stock)) {
        return event_loop.call_method0(intern!(py, "create_future"));
    }
    let kwargs = PyDict::new(py);
    kwargs.set_item(intern!(py, "loop"), event_loop)?;
    future.bind(py).call((), Some(&kwargs))
}

/// What a finished admission gives: a permit or the refusal.
type Outcome = Result<OwnedPermit, AdmitError>;

/// A pending admission, `gate.admit()`: a coroutine (it implements the
/// coroutine protocol and is a `collections.abc.Coroutine`) that returns a
/// `Permit`. Await it once, run it as a task, or use it with `async with`
/// (the permit is released when the block ends).
#[pyclass(frozen, freelist = 64, module = "loadgate")]
pub struct Admission {
    gate: Arc<Shared>,
    /// The request's priority class.
    priority: u8,
    /// Set by `__aenter__`: the permit is kept for `__aexit__`.
    entered: AtomicBool,
    state: Mutex<State>,
}

struct State {
    step: Step,
    /// The permit, kept for `__aexit__`.
    permit: Option<Py<Permit>>,
}

/// Where the coroutine is.
enum Step {
    /// Not started.
    New,
    /// Queued: suspended on `Queued::fut`.
    Queued(Queued),
    /// Returned, raised or closed.
    Done,
}

/// A queued admission's loop-side state.
struct Queued {
    /// The asyncio future the core callback settles.
    fut: Py<PyAny>,
    ticket: CallbackTicket,
    /// The event loop whose deadline timer counted this admission in.
    timed: Option<Py<PyAny>>,
}

/// Where a queued admission's outcome goes: its future, on its loop, whose
/// thread is `thread`. The core calls the armed callback at most once, and
/// never before `arm` returned (`loadgate::PendingAdmission::arm`), so the
/// future always exists by then.
struct Target {
    fut: Py<PyAny>,
    event_loop: Py<PyAny>,
    thread: u64,
}

/// The calling thread's number, unique in the process: cheaper to read than
/// `thread::current().id()`, which clones a reference-counted handle.
fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static NUMBER: Cell<u64> = const { Cell::new(0) });
    NUMBER.with(|n| {
        if n.get() == 0 {
            n.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        n.get()
    })
}

/// Routes an outcome to its future: directly on the loop's thread, through
/// `call_soon_threadsafe` from any other.
fn deliver_to(py: Python<'_>, target: &Target, outcome: Outcome) {
    let Target {
        fut,
        event_loop,
        thread,
    } = target;
    let (value, ok) = match outcome {
        Ok(p) => match Bound::new(py, Permit::new(p)) {
            Ok(p) => (p.into_any(), true),
            Err(e) => return e.write_unraisable(py, None),
        },
        Err(e) => match admit_value(py, e) {
            Ok(v) => (v, false),
            Err(e) => return e.write_unraisable(py, None),
        },
    };
    if thread_number() == *thread {
        settle(py, fut.bind(py), &value, ok);
        return;
    }
    let handed = Bound::new(
        py,
        Settle {
            fut: fut.clone_ref(py),
        },
    )
    .and_then(|settle| {
        event_loop.bind(py).call_method1(
            intern!(py, "call_soon_threadsafe"),
            (settle, value.clone(), ok),
        )
    });
    if handed.is_err() {
        // The loop is closed: nobody will take the slot.
        release_value(&value, ok);
    }
}

/// What a step of an [`Admission`] gives when it does not raise.
enum Stepped<'py> {
    /// Suspended: the future to wait on.
    Yield(Bound<'py, PyAny>),
    /// Finished: the permit the coroutine returns.
    Return(Bound<'py, PyAny>),
}

impl<'py> Stepped<'py> {
    /// As `send()` gives it: the future yielded, or `StopIteration(permit)`
    /// raised.
    fn into_send(self) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Stepped::Yield(fut) => Ok(fut),
            Stepped::Return(permit) => {
                let py = permit.py();
                // A ready instance: cheaper to raise than a lazily built one.
                let stop = py.get_type::<PyStopIteration>().call1((permit,))?;
                Err(PyErr::from_value(stop))
            }
        }
    }

    /// As `__next__` gives it: the future yielded, or `None` (the slot
    /// returns NULL) with `StopIteration(permit)` set here. `__next__` is
    /// `tp_iternext`, through which `await` and asyncio's tasks step the
    /// coroutine, and NULL with `StopIteration` set is how CPython's own
    /// generators return a value there. Set as a type and a value, it is
    /// not normalized before Python 3.12: the interpreter takes the value
    /// without building the exception (PyO3's error path would build it).
    fn into_next(self) -> Option<Bound<'py, PyAny>> {
        match self {
            Stepped::Yield(fut) => Some(fut),
            Stepped::Return(permit) => {
                // SAFETY: the thread is attached (`permit` is bound to it);
                // both pointers are valid and `PyErr_SetObject` takes its
                // own references. The permit is never a tuple or an
                // exception, which the call would read as arguments.
                unsafe { ffi::PyErr_SetObject(ffi::PyExc_StopIteration, permit.as_ptr()) };
                None
            }
        }
    }
}

impl Admission {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Takes the step, leaving `Done` (the caller puts back what goes on).
    fn take_step(&self) -> Step {
        std::mem::replace(&mut self.state().step, Step::Done)
    }

    /// One step of the coroutine: the future to wait on or the permit, or
    /// the refusal.
    fn step<'py>(&self, py: Python<'py>) -> PyResult<Stepped<'py>> {
        match self.take_step() {
            Step::New => self.start(py),
            Step::Queued(q) => self.resume(py, q),
            Step::Done => Err(PyRuntimeError::new_err(
                "this admission was already awaited; call gate.admit() again",
            )),
        }
    }

    /// The first step: admitted or refused at once, or queued.
    fn start<'py>(&self, py: Python<'py>) -> PyResult<Stepped<'py>> {
        let pending = match self.gate.core.admit_pending_at(self.priority) {
            Pending::Ready(outcome) => return self.finish(py, outcome),
            Pending::Queued(pending) => pending,
        };
        // Queued: wait for the outcome on the running loop. Without one (or
        // without a future), `pending` is dropped: the request leaves the
        // queue, or gives back the slot it was granted meanwhile.
        let event_loop = running_loop(py)?;
        let fut = new_future(&event_loop)?;
        fut.setattr(intern!(py, "_asyncio_future_blocking"), true)?;
        let target = Target {
            fut: fut.clone().unbind(),
            event_loop: event_loop.clone().unbind(),
            thread: thread_number(),
        };
        let armed = pending.arm(Box::new(move |outcome| {
            Python::attach(|py| deliver_to(py, &target, outcome));
        }));
        let ticket = match armed {
            Ok(ticket) => ticket,
            // Resolved before the arm: no need for the loop after all.
            Err(outcome) => return self.finish(py, outcome),
        };
        let mut queued = Queued {
            fut: fut.clone().unbind(),
            ticket,
            timed: None,
        };
        match self.gate.join(py, &event_loop) {
            Ok(timed) => queued.timed = timed.then(|| event_loop.unbind()),
            Err(e) => {
                self.abandon(py, queued);
                return Err(e);
            }
        }
        self.state().step = Step::Queued(queued);
        Ok(Stepped::Yield(fut))
    }

    /// A later step: the future is done (the awaiting task was woken), so
    /// return its permit or raise its refusal.
    fn resume<'py>(&self, py: Python<'py>, q: Queued) -> PyResult<Stepped<'py>> {
        let fut = q.fut.bind(py).clone();
        // `result()` first: `done()` is asked only when it raises.
        let err = match fut.call_method0(intern!(py, "result")) {
            Ok(permit) => {
                if let Some(event_loop) = &q.timed {
                    self.gate.leave(Some(py), event_loop);
                }
                return Ok(self.returned(permit));
            }
            Err(e) => e,
        };
        let done = fut
            .call_method0(intern!(py, "done"))
            .and_then(|d| d.is_truthy());
        if let Ok(false) = done {
            // Stepped before the outcome came (not by an asyncio task, which
            // waits for the future): wait on it again.
            if let Err(e) = fut.setattr(intern!(py, "_asyncio_future_blocking"), true) {
                self.abandon(py, q);
                return Err(e);
            }
            self.state().step = Step::Queued(q);
            return Ok(Stepped::Yield(fut));
        }
        // A refusal, or the future was cancelled (then the request leaves
        // the queue).
        self.abandon(py, q);
        Err(err)
    }

    /// The coroutine's end for an outcome: the permit or the refusal.
    fn finish<'py>(&self, py: Python<'py>, outcome: Outcome) -> PyResult<Stepped<'py>> {
        match outcome {
            Ok(p) => Ok(self.returned(Bound::new(py, Permit::new(p))?.into_any())),
            Err(e) => Err(admit_error(py, e)),
        }
    }

    /// The permit returned; it is kept for `__aexit__` inside `async with`.
    fn returned<'py>(&self, permit: Bound<'py, PyAny>) -> Stepped<'py> {
        if self.entered.load(Ordering::Relaxed) {
            self.state().permit = permit.cast::<Permit>().ok().map(|p| p.clone().unbind());
        }
        Stepped::Return(permit)
    }

    /// Ends a queued admission that is collected without being finished
    /// (its task was destroyed, or its loop closed), calling no Python: it
    /// leaves the queue; a permit already in its future is released with
    /// the future.
    fn forget(&self, step: Step) {
        if let Step::Queued(q) = step {
            q.ticket.cancel();
            if let Some(event_loop) = &q.timed {
                self.gate.leave(None, event_loop);
            }
        }
    }

    /// Ends a queued admission that will not take its outcome: it leaves
    /// the queue if still there; a permit already granted is released (now
    /// if it is in the future, on arrival if it is on its way).
    fn abandon(&self, py: Python<'_>, q: Queued) {
        if !q.ticket.cancel() {
            let fut = q.fut.bind(py);
            let done = fut
                .call_method0(intern!(py, "done"))
                .and_then(|d| d.is_truthy())
                .unwrap_or(false);
            if done {
                release_unclaimed(py, fut);
            } else {
                // On its way from another thread: `settle` finds the future
                // done and releases it. (Fails only on a closed loop.)
                let _ = fut.call_method0(intern!(py, "cancel"));
            }
        }
        if let Some(event_loop) = &q.timed {
            self.gate.leave(Some(py), event_loop);
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        let step = std::mem::replace(&mut state.step, Step::Done);
        self.forget(step);
    }
}

/// The exception `throw(typ, val, tb)` raises, as a generator's `throw`
/// builds it.
fn thrown(
    py: Python<'_>,
    typ: &Bound<'_, PyAny>,
    val: Option<&Bound<'_, PyAny>>,
    tb: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyErr> {
    let val = val.filter(|v| !v.is_none());
    let exc = if typ.is_instance_of::<PyBaseException>() {
        if val.is_some() {
            return Err(PyTypeError::new_err(
                "instance exception may not have a separate value",
            ));
        }
        typ.clone()
    } else {
        let class = typ
            .cast::<PyType>()
            .ok()
            .filter(|t| t.is_subclass_of::<PyBaseException>().unwrap_or(false));
        let Some(class) = class else {
            let got = typ
                .get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string());
            return Err(PyTypeError::new_err(format!(
                "exceptions must be classes or instances deriving from BaseException, not {got}"
            )));
        };
        match val {
            None => class.call0()?,
            Some(v) if v.is_instance(class)? => v.clone(),
            Some(v) => match v.cast::<PyTuple>() {
                Ok(args) => class.call1(args)?,
                Err(_) => class.call1((v,))?,
            },
        }
    };
    if let Some(tb) = tb.filter(|t| !t.is_none()) {
        exc.call_method1(intern!(py, "with_traceback"), (tb,))?;
    }
    Ok(PyErr::from_value(exc))
}

#[pymethods]
impl Admission {
    fn __await__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// A queued admission is in a cycle (its task holds it, it holds its
    /// future, whose callback holds the task): the collector must see it,
    /// so that an abandoned one (its loop closed with the task pending) is
    /// collected and leaves the queue.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // Never blocks: the state lock is only taken with the GIL held.
        let Ok(st) = self.state.try_lock() else {
            return Ok(());
        };
        if let Step::Queued(q) = &st.step {
            visit.call(&q.fut)?;
            visit.call(&q.timed)?;
        }
        visit.call(&st.permit)?;
        Ok(())
    }

    fn __clear__(&self) {
        let (step, permit) = {
            let mut st = self.state();
            (
                std::mem::replace(&mut st.step, Step::Done),
                st.permit.take(),
            )
        };
        self.forget(step);
        drop(permit);
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        Ok(self.step(py)?.into_next())
    }

    /// Resumes the coroutine; as for any coroutine, only `None` may be sent
    /// to start it.
    #[pyo3(signature = (value, /))]
    fn send<'py>(&self, py: Python<'py>, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        if !value.is_none() && matches!(self.state().step, Step::New) {
            return Err(PyTypeError::new_err(
                "can't send non-None value to a just-started coroutine",
            ));
        }
        self.step(py)?.into_send()
    }

    /// Raises the exception in the coroutine, which ends it: a queued
    /// request leaves the queue (cancelled, not refused), and a permit
    /// already granted is released.
    #[pyo3(signature = (typ, val = None, tb = None, /))]
    fn throw(
        &self,
        py: Python<'_>,
        typ: &Bound<'_, PyAny>,
        val: Option<&Bound<'_, PyAny>>,
        tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let err = thrown(py, typ, val, tb)?;
        if let Step::Queued(q) = self.take_step() {
            self.abandon(py, q);
        }
        Err(err)
    }

    /// Ends the coroutine: a queued request leaves the queue, and a permit
    /// already granted is released.
    fn close(&self, py: Python<'_>) {
        if let Step::Queued(q) = self.take_step() {
            self.abandon(py, q);
        }
    }

    /// The future the coroutine waits on, while queued.
    #[getter]
    fn cr_await(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        match &self.state().step {
            Step::Queued(q) => Some(q.fut.clone_ref(py)),
            _ => None,
        }
    }

    #[getter(__name__)]
    fn name(&self) -> &'static str {
        "admit"
    }

    #[getter(__qualname__)]
    fn qualname(&self) -> &'static str {
        "AdmissionGate.admit"
    }

    fn __aenter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf.get().entered.store(true, Ordering::Relaxed);
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __aexit__(&self, _exc: &Bound<'_, PyTuple>) -> Ready {
        let permit = self.state().permit.take();
        if let Some(p) = permit {
            p.get().release();
        }
        Ready
    }

    fn __repr__(&self) -> String {
        let state = match self.state().step {
            Step::New => "not awaited",
            Step::Queued(_) => "queued",
            Step::Done => "done",
        };
        format!("<loadgate.Admission {state}>")
    }
}

/// An awaitable that is already done (what `__aexit__` returns).
#[pyclass(frozen, module = "loadgate", name = "_Ready")]
pub struct Ready;

#[pymethods]
impl Ready {
    fn __await__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self) -> Option<bool> {
        None
    }
}

/// Gives back the slot of a permit nobody will receive.
fn release_value(value: &Bound<'_, PyAny>, ok: bool) {
    if ok {
        if let Ok(p) = value.cast::<Permit>() {
            p.get().release();
        }
    }
}

/// Releases a permit a done future holds that will never be taken.
fn release_unclaimed(py: Python<'_>, fut: &Bound<'_, PyAny>) {
    let holds_permit = || -> PyResult<Option<Bound<'_, PyAny>>> {
        if fut.call_method0(intern!(py, "cancelled"))?.is_truthy()?
            || !fut.call_method0(intern!(py, "exception"))?.is_none()
        {
            return Ok(None);
        }
        fut.call_method0(intern!(py, "result")).map(Some)
    };
    if let Ok(Some(value)) = holds_permit() {
        release_value(&value, true);
    }
}

/// Sets the future's result or exception; if it is already done (or its
/// loop closed), a permit is released instead.
fn settle(py: Python<'_>, fut: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>, ok: bool) {
    let method = if ok {
        intern!(py, "set_result")
    } else {
        intern!(py, "set_exception")
    };
    if call_method_with(fut, method, value).is_err() {
        // The future was cancelled (`InvalidStateError`), or the loop was
        // closed under it.
        release_value(value, ok);
    }
}

/// `obj.name(arg)` through `PyObject_CallMethodObjArgs`, which builds no
/// bound method and no argument tuple (PyO3's `call_method1` builds both).
fn call_method_with<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
    arg: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: the thread is attached (the arguments are bound to it); the
    // pointers are valid for the call, and the list ends with NULL.
    unsafe {
        let result = ffi::PyObject_CallMethodObjArgs(
            obj.as_ptr(),
            name.as_ptr(),
            arg.as_ptr(),
            std::ptr::null_mut::<ffi::PyObject>(),
        );
        Bound::from_owned_ptr_or_err(obj.py(), result)
    }
}

/// `call_soon_threadsafe` target that settles a future on its loop.
#[pyclass(frozen, module = "loadgate", name = "_Settle")]
pub struct Settle {
    fut: Py<PyAny>,
}

#[pymethods]
impl Settle {
    fn __call__(&self, py: Python<'_>, value: &Bound<'_, PyAny>, ok: bool) {
        settle(py, self.fut.bind(py), value, ok);
    }
}
