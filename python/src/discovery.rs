//! `loadgate.Discovery`: a frontend learning Dynamo's workers from its
//! discovery store (`Monitor.discover_dynamo`), a thin shell over core's
//! `loadgate::discovery`. The watcher runs on a thread of core's that never
//! calls into Python, so it never needs the GIL.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use loadgate::discovery::{default_file_kv_path, DiscoveryConfig, FileDiscovery};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::{opt_str_arg, seconds_arg, str_arg};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The arguments of `Monitor.discover_dynamo`.
pub struct DiscoverArgs<'a, 'py> {
    pub namespace: Option<&'a Bound<'py, PyAny>>,
    pub backend: Option<&'a Bound<'py, PyAny>>,
    pub path: Option<&'a Bound<'py, PyAny>>,
    pub component: Option<&'a Bound<'py, PyAny>>,
    pub endpoint: Option<&'a Bound<'py, PyAny>>,
    pub interval: Option<&'a Bound<'py, PyAny>>,
    pub ttl: Option<&'a Bound<'py, PyAny>>,
}

/// Starts a watcher for `Monitor.discover_dynamo`.
pub fn start(monitor: &Arc<loadgate::Monitor>, args: &DiscoverArgs<'_, '_>) -> PyResult<Discovery> {
    let backend = opt_str_arg(args.backend, "backend")?;
    match backend.as_deref() {
        None | Some("file") => {}
        Some(other) => {
            return Err(PyValueError::new_err(format!(
                "backend = '{other}' is invalid: must be 'file' (Dynamo's file discovery \
                 backend, DYN_FILE_KV)"
            )))
        }
    }
    let mut config = DiscoveryConfig::default();
    if let Some(ns) = opt_str_arg(args.namespace, "namespace")? {
        if ns.is_empty() {
            return Err(PyValueError::new_err("namespace must not be empty"));
        }
        config.namespace = ns.to_string();
    }
    config.component = opt_str_arg(args.component, "component")?.map(|c| c.to_string());
    config.endpoint = opt_str_arg(args.endpoint, "endpoint")?.map(|e| e.to_string());
    if let Some(i) = args.interval {
        config.interval = seconds_arg(i, "interval")?;
        if config.interval.is_zero() {
            return Err(PyValueError::new_err(
                "interval = 0 is invalid: must be a positive number of seconds",
            ));
        }
    }
    if let Some(t) = args.ttl {
        config.ttl = if t.is_none() {
            None
        } else {
            Some(seconds_arg(t, "ttl")?)
        };
    }
    let path = match args.path {
        None => default_file_kv_path(),
        Some(p) if p.is_none() => default_file_kv_path(),
        Some(p) => match p.extract::<PathBuf>() {
            Ok(path) => path,
            Err(_) => PathBuf::from(&*str_arg(p, "path")?),
        },
    };
    let watcher = FileDiscovery::start(monitor.clone(), &path, config).map_err(|e| {
        PyOSError::new_err(format!("starting discovery of {}: {e}", path.display()))
    })?;
    Ok(Discovery {
        path,
        inner: Mutex::new(Some(watcher)),
    })
}

/// Dynamo's discovery store watched for workers, started by
/// `Monitor.discover_dynamo`. `close()` (or leaving its `with` block, or
/// garbage collection) stops watching and removes the workers it
/// registered.
#[pyclass(frozen, module = "loadgate")]
pub struct Discovery {
    path: PathBuf,
    inner: Mutex<Option<FileDiscovery>>,
}

#[pymethods]
impl Discovery {
    /// Stops watching and removes the workers it registered; calling it
    /// again does nothing.
    fn close(&self) {
        let watcher = lock(&self.inner).take();
        drop(watcher);
    }

    /// What the watcher has done: `scans`, `scan_errors`, `workers` (now
    /// registered), `workers_added`, `workers_removed`, `skipped` (records of
    /// other namespaces, components or endpoints), `refused` (by reason:
    /// `too_large`, `malformed`, `mismatched`, `over_limit`,
    /// `registration`) and `last_error`. All zero once closed.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = lock(&self.inner)
            .as_ref()
            .map(FileDiscovery::stats)
            .unwrap_or_default();
        let d = PyDict::new(py);
        d.set_item("scans", s.scans)?;
        d.set_item("scan_errors", s.scan_errors)?;
        d.set_item("workers", s.workers)?;
        d.set_item("workers_added", s.workers_added)?;
        d.set_item("workers_removed", s.workers_removed)?;
        d.set_item("skipped", s.skipped)?;
        let refused = PyDict::new(py);
        refused.set_item("too_large", s.refused_too_large)?;
        refused.set_item("malformed", s.refused_malformed)?;
        refused.set_item("mismatched", s.refused_mismatched)?;
        refused.set_item("over_limit", s.refused_over_limit)?;
        refused.set_item("registration", s.refused_registration)?;
        d.set_item("refused", refused)?;
        d.set_item("last_error", s.last_error)?;
        Ok(d)
    }

    /// The store's directory.
    #[getter]
    fn path(&self) -> String {
        self.path.to_string_lossy().into_owned()
    }

    /// Whether the watcher has been closed.
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
        let state = if self.closed() { "closed" } else { "open" };
        format!("<loadgate.Discovery path={:?} {state}>", self.path)
    }
}
