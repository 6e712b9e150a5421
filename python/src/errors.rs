//! Conversions at the boundary: argument checks that name the argument, and
//! core errors turned into Python exceptions.
//!
//! Rejections become the exception classes of `loadgate._errors` (plain
//! Python classes, because an abi3 build for CPython before 3.12 cannot
//! subclass `Exception` from Rust); unknown workers and models become
//! `KeyError`; bad arguments become `ValueError` or `TypeError` naming the
//! argument.

use std::fmt::Display;
use std::time::Duration;

use loadgate::gate::ConfigError;
use loadgate::{AdmitError, Policy, Reason, ReportError, RouteError, ThresholdError, WorkerError};
use pyo3::exceptions::{PyKeyError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyFloat, PyInt, PyString, PyType};

/// The `loadgate` exception class raised for `reason`.
pub fn rejection_class(py: Python<'_>, reason: Reason) -> PyResult<&Bound<'_, PyType>> {
    static OVERLOADED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    static UNAVAILABLE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    static WORKER_OVERLOADED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    static AT_CAPACITY: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    static QUEUE_TIMEOUT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    static CLOSED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    static DISPLACED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let (cell, name) = match reason {
        // A full frontend queue raises the overload class, its deadline the
        // queue-timeout class; `reason` tells them apart.
        Reason::AllWorkersBusy | Reason::QueueFull => (&OVERLOADED, "Overloaded"),
        Reason::NoWorkers => (&UNAVAILABLE, "Unavailable"),
        Reason::WorkerOverloaded => (&WORKER_OVERLOADED, "WorkerOverloaded"),
        Reason::WorkerAtCapacity => (&AT_CAPACITY, "AtCapacity"),
        Reason::QueueTimeout | Reason::QueueDeadline => (&QUEUE_TIMEOUT, "QueueTimeout"),
        Reason::Closed => (&CLOSED, "Closed"),
        Reason::Displaced => (&DISPLACED, "Displaced"),
    };
    cell.import(py, "loadgate._errors", name)
}

/// A new exception instance for a rejection, with the reason's message (or
/// `message`, when given).
pub fn rejection_value<'py>(
    py: Python<'py>,
    reason: Reason,
    message: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
    let cls = rejection_class(py, reason)?;
    match message {
        Some(m) => cls.call1((m,)),
        None => cls.call0(),
    }
}

/// The exception for a rejection, ready to raise.
pub fn rejection(py: Python<'_>, reason: Reason) -> PyErr {
    match rejection_value(py, reason, None) {
        Ok(value) => PyErr::from_value(value),
        Err(e) => e,
    }
}

/// The exception for a refused admission, with the core's message (a
/// blocking wait that ran out of time raises `QueueTimeout` saying so).
pub fn admit_value<'py>(py: Python<'py>, e: AdmitError) -> PyResult<Bound<'py, PyAny>> {
    let message = (e.message() != e.reason().message()).then(|| e.message());
    rejection_value(py, e.reason(), message)
}

/// [`admit_value`], ready to raise.
pub fn admit_error(py: Python<'_>, e: AdmitError) -> PyErr {
    match admit_value(py, e) {
        Ok(value) => PyErr::from_value(value),
        Err(err) => err,
    }
}

/// A routing error: a rejection, or `KeyError` for an unknown worker.
pub fn route_error(py: Python<'_>, e: RouteError) -> PyErr {
    match e.reason() {
        Some(reason) => rejection(py, reason),
        None => PyKeyError::new_err(e.to_string()),
    }
}

/// A refused report or booking: `KeyError` for an unknown worker,
/// `ConnectionError` for a reporter used across a fork, `WorkerOverloaded`
/// for a booking past a leased share, `ValueError` otherwise.
pub fn report_error(e: ReportError) -> PyErr {
    match e {
        ReportError::UnknownWorker(_) => PyKeyError::new_err(e.to_string()),
        ReportError::OtherProcess => pyo3::exceptions::PyConnectionError::new_err(e.to_string()),
        ReportError::NoShare { .. } => Python::attach(|py| {
            match rejection_value(py, Reason::WorkerOverloaded, Some(&e.to_string())) {
                Ok(value) => PyErr::from_value(value),
                Err(err) => err,
            }
        }),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// A refused worker change: `KeyError` for an unknown worker, `ValueError`
/// otherwise.
pub fn worker_error(e: WorkerError) -> PyErr {
    match e {
        WorkerError::Unknown(_) => PyKeyError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// A refused threshold change: `KeyError` for an unknown model, `ValueError`
/// otherwise (the message names the field).
pub fn threshold_error(e: ThresholdError) -> PyErr {
    match e {
        ThresholdError::UnknownModel(_) => PyKeyError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// A refused gate setting, worded with the Python argument names.
pub fn config_error(e: ConfigError) -> PyErr {
    let message = match e {
        ConfigError::ZeroLimit => "limit = 0 is invalid: must be at least 1".to_owned(),
        ConfigError::ZeroTimeout => {
            "queue_timeout must be longer than zero (use None to turn it off)".to_owned()
        }
        other => other.to_string(),
    };
    PyValueError::new_err(message)
}

/// `TypeError` for an argument of the wrong type.
fn wrong_type(name: &str, want: &str, obj: &Bound<'_, PyAny>) -> PyErr {
    let got = obj
        .get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string());
    PyTypeError::new_err(format!("{name} must be {want}, not {got}"))
}

/// `ValueError` naming the argument.
pub fn bad_value(name: &str, value: impl Display, want: &str) -> PyErr {
    PyValueError::new_err(format!("{name} = {value} is invalid: must be {want}"))
}

/// Whether `obj` is an integer (an `int` or anything with `__index__`).
pub fn is_integer(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<PyInt>()
        || (!obj.is_instance_of::<PyFloat>() && obj.hasattr("__index__").unwrap_or(false))
}

/// An unsigned integer argument.
#[inline]
pub fn u64_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    obj.extract::<u64>()
        .map_err(|_| int_error(obj, name, "an integer from 0 to 2**64 - 1"))
}

/// A 32-bit unsigned integer argument.
#[inline]
pub fn u32_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<u32> {
    obj.extract::<u32>()
        .map_err(|_| int_error(obj, name, "an integer from 0 to 2**32 - 1"))
}

/// An integer argument from `min` to `max`: `ValueError` naming it for an
/// integer out of range (never `OverflowError`), `TypeError` for anything
/// else.
pub fn ranged_arg(obj: &Bound<'_, PyAny>, name: &str, min: u64, max: u64) -> PyResult<u64> {
    obj.extract::<u64>()
        .ok()
        .filter(|v| (min..=max).contains(v))
        .ok_or_else(|| int_error(obj, name, &format!("an integer from {min} to {max}")))
}

/// The `priority` argument of an admission: a class number from 0 to 255
/// (0 the most important; core counts one past the gate's last class as
/// the last). Absent or `None`: 0.
#[inline]
pub fn priority_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<u8> {
    match obj {
        None => Ok(0),
        Some(o) if o.is_none() => Ok(0),
        Some(o) => o
            .extract::<u8>()
            .or_else(|_| ranged_arg(o, "priority", 0, u64::from(u8::MAX)).map(|v| v as u8)),
    }
}

/// An optional unsigned integer argument (`None` is absent).
#[inline]
pub fn opt_u64_arg(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<u64>> {
    match obj {
        Some(o) if !o.is_none() => u64_arg(o, name).map(Some),
        _ => Ok(None),
    }
}

#[cold]
fn int_error(obj: &Bound<'_, PyAny>, name: &str, want: &str) -> PyErr {
    if is_integer(obj) {
        let shown = obj
            .repr()
            .map_or_else(|_| "?".to_owned(), |r| r.to_string());
        bad_value(name, shown, want)
    } else {
        wrong_type(name, "an int", obj)
    }
}

/// A number argument (`int` or `float`).
pub fn f64_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<f64> {
    if obj.is_instance_of::<PyFloat>() || obj.is_instance_of::<PyInt>() {
        obj.extract::<f64>().map_err(|_| {
            bad_value(
                name,
                obj.repr()
                    .map_or_else(|_| "?".to_owned(), |r| r.to_string()),
                "a finite number",
            )
        })
    } else {
        obj.extract::<f64>()
            .map_err(|_| wrong_type(name, "a number", obj))
    }
}

/// An optional number argument (`None` is absent).
pub fn opt_f64_arg(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<f64>> {
    match obj {
        Some(o) if !o.is_none() => f64_arg(o, name).map(Some),
        _ => Ok(None),
    }
}

/// A duration in seconds: finite and above zero.
pub fn seconds_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Duration> {
    let secs = f64_arg(obj, name)?;
    let want = "a finite number of seconds > 0";
    if !(secs.is_finite() && secs > 0.0) {
        return Err(bad_value(name, secs, want));
    }
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(bad_value(name, secs, want)),
    }
}

/// An optional timeout in seconds: `None`, or finite and at least zero.
pub fn timeout_arg(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<Duration>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let secs = f64_arg(obj, name)?;
    let want = "None or a finite number of seconds >= 0";
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(bad_value(name, secs, want));
    }
    Duration::try_from_secs_f64(secs)
        .map(Some)
        .map_err(|_| bad_value(name, secs, want))
}

/// A `str` argument.
#[inline]
pub fn str_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<PyBackedStr> {
    match obj.cast::<PyString>() {
        Ok(s) => PyBackedStr::try_from(s.clone()),
        Err(_) => Err(wrong_type(name, "a str", obj)),
    }
}

/// A `str` argument borrowed without a copy, for hot paths: the UTF-8 form
/// CPython caches inside the string (`PyUnicode_AsUTF8AndSize`, in the
/// limited API since 3.10).
#[inline]
pub fn str_ref<'a>(obj: &'a Bound<'_, PyAny>, name: &str) -> PyResult<&'a str> {
    match obj.cast::<PyString>() {
        // Fails only for a str with lone surrogates (UnicodeEncodeError).
        Ok(s) => s.to_str(),
        Err(_) => Err(wrong_type(name, "a str", obj)),
    }
}

/// An optional `str` argument (`None` is absent).
#[inline]
pub fn opt_str_arg(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<PyBackedStr>> {
    match obj {
        Some(o) if !o.is_none() => str_arg(o, name).map(Some),
        _ => Ok(None),
    }
}

/// The `policy=` and `endpoint=` arguments of `select`: round-robin when
/// `policy` is absent or `None` (nothing parsed), and the endpoint borrowed
/// without a copy.
#[inline]
pub(crate) fn select_args<'a>(
    policy: Option<&Bound<'_, PyAny>>,
    endpoint: Option<&'a Bound<'_, PyAny>>,
) -> PyResult<(Policy, Option<&'a str>)> {
    let policy = match policy {
        None => Policy::RoundRobin,
        Some(p) => policy_arg(str_ref(p, "policy")?)?,
    };
    let endpoint = match endpoint.filter(|e| !e.is_none()) {
        None => None,
        Some(e) => Some(str_ref(e, "endpoint")?),
    };
    Ok((policy, endpoint))
}

fn policy_arg(name: &str) -> PyResult<Policy> {
    Policy::from_name(name).ok_or_else(|| {
        bad_value(
            "policy",
            format!("{name:?}"),
            "one of 'round_robin', 'random', 'power_of_two'",
        )
    })
}
