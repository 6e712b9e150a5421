//! `loadgate.Scrape`: a frontend polling a stock vLLM or SGLang worker's
//! `/metrics` (`Monitor.scrape`), a thin shell over core's
//! `loadgate::scrape`. The scrape runs on core's I/O thread, which never
//! calls into Python, so it never needs the GIL.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use loadgate::scrape::{Engine, Scrape as CoreScrape, ScrapeConfig, ERROR_KINDS};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::{opt_str_arg, opt_u64_arg, seconds_arg, str_arg, u64_arg};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts a scrape for `Monitor.scrape`.
#[allow(clippy::too_many_arguments)]
pub fn start(
    monitor: &Arc<loadgate::Monitor>,
    model: Option<&Bound<'_, PyAny>>,
    worker_id: &Bound<'_, PyAny>,
    url: &Bound<'_, PyAny>,
    engine: Option<&Bound<'_, PyAny>>,
    interval: Option<&Bound<'_, PyAny>>,
    timeout: Option<&Bound<'_, PyAny>>,
    max_num_seqs: Option<&Bound<'_, PyAny>>,
) -> PyResult<Scrape> {
    let model = opt_str_arg(model, "model")?;
    let worker_id = u64_arg(worker_id, "worker_id")?;
    let url = str_arg(url, "url")?;
    let engine = match engine {
        None => Engine::Vllm,
        Some(e) => {
            let name = str_arg(e, "engine")?;
            Engine::from_name(&name).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "engine must be 'vllm' or 'sglang', not {:?}",
                    &*name
                ))
            })?
        }
    };
    let mut config = ScrapeConfig::new(engine);
    if let Some(i) = interval {
        config.interval = seconds_arg(i, "interval")?;
    }
    if let Some(t) = timeout {
        config.timeout = seconds_arg(t, "timeout")?;
    }
    config.max_num_seqs = opt_u64_arg(max_num_seqs, "max_num_seqs")?;
    let scrape = CoreScrape::start(monitor.clone(), model.as_deref(), worker_id, &url, config)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(Scrape {
        inner: Mutex::new(Some(scrape)),
    })
}

/// One worker's engine scrape, started by `Monitor.scrape`. `close()` (or
/// leaving its `with` block, or garbage collection) stops it and removes
/// the worker it registered.
#[pyclass(frozen, module = "loadgate")]
pub struct Scrape {
    inner: Mutex<Option<CoreScrape>>,
}

#[pymethods]
impl Scrape {
    /// Stops scraping and removes the worker; calling it again does nothing.
    fn close(&self) {
        let scrape = lock(&self.inner).take();
        drop(scrape);
    }

    /// What the scrape has done: `scrapes` (applied), `errors` (failed),
    /// `errors_by_kind` (`connect`, `timeout`, `http`, `too_large`,
    /// `malformed`, `missing`, `too_many_ranks`, `refused`), `connections`
    /// (opened), `registered`, `last_latency` and `total_latency` (seconds)
    /// and `last_error` (`None` or why the last failed scrape failed).
    /// All zero once closed.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = lock(&self.inner)
            .as_ref()
            .map(CoreScrape::stats)
            .unwrap_or_default();
        let d = PyDict::new(py);
        d.set_item("scrapes", s.scrapes)?;
        d.set_item("errors", s.errors)?;
        let kinds = PyDict::new(py);
        for (k, n) in ERROR_KINDS.iter().zip(s.errors_by_kind) {
            kinds.set_item(k, n)?;
        }
        d.set_item("errors_by_kind", kinds)?;
        d.set_item("connections", s.connections)?;
        d.set_item("registered", s.registered)?;
        d.set_item("last_latency", s.last_latency.as_secs_f64())?;
        d.set_item("total_latency", s.total_latency.as_secs_f64())?;
        d.set_item("last_error", s.last_error)?;
        Ok(d)
    }

    /// Whether the scrape has been closed.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.inner).is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        match lock(&self.inner).as_ref() {
            Some(s) => format!("<loadgate.Scrape worker_id={} open>", s.worker_id()),
            None => "<loadgate.Scrape closed>".to_owned(),
        }
    }
}
