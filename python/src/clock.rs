//! `loadgate.ManualClock`: core's [`loadgate::ManualClock`], for tests and
//! simulations that drive time by hand.

use std::sync::Arc;
use std::time::Duration;

use loadgate::{Clock, MonotonicClock, SharedClock};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::errors::{bad_value, f64_arg};

/// A clock that moves only when told to: pass it as `clock=` to `Monitor`
/// or `AdmissionGate`, and overload leases, staleness and queue deadlines
/// follow it instead of real time. It starts at 0 seconds; `advance(s)`
/// moves it forward, `now()` reads it. One clock may drive several objects.
///
/// An `AdmissionGate` on a manual clock arms no event-loop timer for its
/// queue deadlines (the loop's timers run in real time): advance the clock,
/// then call `gate.expire()` to reject the waiters whose deadline has come.
/// Threads blocked in `admit_blocking` are woken by that `expire()` too.
#[pyclass(frozen, module = "loadgate")]
pub struct ManualClock {
    inner: Arc<loadgate::ManualClock>,
}

#[pymethods]
impl ManualClock {
    #[new]
    fn new() -> Self {
        Self {
            inner: loadgate::ManualClock::new(),
        }
    }

    /// Moves time forward by `seconds` (a finite number >= 0).
    fn advance(&self, seconds: &Bound<'_, PyAny>) -> PyResult<()> {
        let secs = f64_arg(seconds, "seconds")?;
        let want = "a finite number of seconds >= 0";
        if !(secs.is_finite() && secs >= 0.0) {
            return Err(bad_value("seconds", secs, want));
        }
        let by = Duration::try_from_secs_f64(secs).map_err(|_| bad_value("seconds", secs, want))?;
        self.inner.advance(by);
        Ok(())
    }

    /// The time in seconds since the clock was made (as far as it was
    /// advanced).
    fn now(&self) -> f64 {
        Duration::from_nanos(self.inner.now_nanos()).as_secs_f64()
    }

    fn __repr__(&self) -> String {
        format!("<loadgate.ManualClock now={:?}>", self.now())
    }
}

/// The clock a `clock=` argument names: the process's monotonic clock when
/// absent or `None`, else a `ManualClock`'s. The flag says whether it is
/// manual.
pub fn clock_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<(SharedClock, bool)> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok((MonotonicClock::shared(), false));
    };
    match obj.cast::<ManualClock>() {
        Ok(clock) => {
            let shared: SharedClock = clock.get().inner.clone();
            Ok((shared, true))
        }
        Err(_) => {
            let got = obj
                .get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string());
            Err(PyTypeError::new_err(format!(
                "clock must be None or a loadgate.ManualClock, not {got}"
            )))
        }
    }
}
