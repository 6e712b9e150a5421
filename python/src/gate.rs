//! `loadgate.AdmissionGate`, `loadgate.Permit` and `loadgate.Admission`: the
//! worker half.
//!
//! The asyncio bridge is in `admission.rs` (the coroutine `gate.admit()`
//! returns) and `timer.rs` (queue deadlines on event-loop timers);
//! `classes.rs` reads the `classes` argument.

mod admission;
mod classes;
mod timer;

use classes::with_classes_arg;
use timer::Shared;

pub use admission::Admission;
pub use classes::PriorityClass;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use loadgate::{GateConfig, OwnedPermit, Reason, SharedClock, TryAdmitError};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyTuple, PyType};

use crate::clock::clock_arg;
use crate::errors::{
    admit_error, config_error, opt_str_arg, priority_arg, rejection, seconds_arg, timeout_arg,
    u32_arg,
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
            shared: Arc::new(Shared::new(Arc::clone(&inner), !manual)),
            inner,
        })
    }
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
        Ok(Admission::new(Arc::clone(&self.shared), priority))
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
