//! `loadgate.PriorityClass` and the gate's `classes` argument.

use std::time::Duration;

use loadgate::gate::MAX_CLASSES;
use loadgate::{ClassConfig, GateConfig};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use crate::errors::{is_integer, ranged_arg, seconds_arg, u32_arg};

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
pub(super) fn with_classes_arg(
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
