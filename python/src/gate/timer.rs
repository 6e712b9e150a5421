//! Queue deadlines of asyncio admissions.
//!
//! Queue deadlines are driven by one `loop.call_later` timer per gate and
//! event loop, set by the core's
//! [`loadgate::AdmissionGate::time_to_next_deadline`] (the earliest deadline
//! of any priority class); it calls [`loadgate::AdmissionGate::expire`] and
//! is set again while admissions of that loop are queued. A gate on a
//! `ManualClock` sets no timer (the loop's timers run in real time): tests
//! advance the clock and call `expire()`. No thread is started.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::intern;
use pyo3::prelude::*;

use super::lock;

/// What an `AdmissionGate` shares with its admissions and their event
/// loops' deadline timers.
pub(super) struct Shared {
    pub(super) core: Arc<loadgate::AdmissionGate>,
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
    pub(super) fn new(core: Arc<loadgate::AdmissionGate>, real_time: bool) -> Self {
        Self {
            core,
            real_time,
            loops: Mutex::new(Vec::new()),
        }
    }

    fn position(loops: &[LoopTimer], event_loop: *mut pyo3::ffi::PyObject) -> Option<usize> {
        loops
            .iter()
            .position(|l| l.event_loop.as_ptr() == event_loop)
    }

    /// An admission queued on `event_loop` (on its thread): if a queue
    /// deadline is pending, counts the admission in and makes sure the
    /// loop's timer fires by the gate's next deadline. Returns whether it
    /// was counted in; then it must [`leave`](Self::leave).
    pub(super) fn join(
        self: &Arc<Self>,
        py: Python<'_>,
        event_loop: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
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
    pub(super) fn arm(
        self: &Arc<Self>,
        py: Python<'_>,
        event_loop: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
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
    pub(super) fn leave(&self, py: Option<Python<'_>>, event_loop: &Py<PyAny>) {
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
