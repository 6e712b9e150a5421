//! `loadgate.Discovery`: a frontend learning Dynamo's workers from its
//! discovery store (`Monitor.discover_dynamo`), a thin shell over core's
//! `loadgate::discovery`. The watcher runs on a thread of core's that never
//! calls into Python, so it never needs the GIL.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use loadgate::discovery::etcd::{default_endpoints, EtcdDiscovery, EtcdError, EtcdOptions};
use loadgate::discovery::{
    default_file_kv_path, Discovery as CoreDiscovery, DiscoveryConfig, FileDiscovery,
};
use pyo3::exceptions::{PyConnectionError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyString;
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
    pub endpoints: Option<&'a Bound<'py, PyAny>>,
    pub user: Option<&'a Bound<'py, PyAny>>,
    pub password: Option<&'a Bound<'py, PyAny>>,
    pub connect_timeout: Option<&'a Bound<'py, PyAny>>,
}

/// Starts a watcher for `Monitor.discover_dynamo`.
pub fn start(
    py: Python<'_>,
    monitor: &Arc<loadgate::Monitor>,
    args: &DiscoverArgs<'_, '_>,
) -> PyResult<Discovery> {
    let backend = opt_str_arg(args.backend, "backend")?;
    let etcd = match backend.as_deref() {
        None | Some("file") => false,
        Some("etcd") => true,
        Some(other) => {
            return Err(PyValueError::new_err(format!(
                "backend = '{other}' is invalid: must be 'file' (DYN_FILE_KV) or 'etcd'"
            )))
        }
    };
    let config = config(args)?;
    if !etcd {
        for (given, name) in [
            (args.endpoints, "endpoints"),
            (args.user, "user"),
            (args.password, "password"),
            (args.connect_timeout, "connect_timeout"),
        ] {
            if given.is_some_and(|v| !v.is_none()) {
                return Err(PyValueError::new_err(format!(
                    "{name} is for backend='etcd', not the file backend"
                )));
            }
        }
        let path = match args.path {
            Some(p) if !p.is_none() => match p.extract::<PathBuf>() {
                Ok(path) => path,
                Err(_) => PathBuf::from(&*str_arg(p, "path")?),
            },
            _ => default_file_kv_path(),
        };
        let watcher = FileDiscovery::start(monitor.clone(), &path, config).map_err(|e| {
            PyOSError::new_err(format!("starting discovery of {}: {e}", path.display()))
        })?;
        return Ok(Discovery::new(
            path.to_string_lossy().into_owned(),
            CoreDiscovery::File(watcher),
        ));
    }
    if args.path.is_some_and(|p| !p.is_none()) {
        return Err(PyValueError::new_err(
            "path is for backend='file', not etcd; give endpoints",
        ));
    }
    let endpoints = match args.endpoints {
        Some(e) if !e.is_none() => endpoints_arg(e)?,
        _ => default_endpoints(),
    };
    let user = opt_str_arg(args.user, "user")?;
    let password = opt_str_arg(args.password, "password")?;
    let mut options = EtcdOptions::default()
        .with_credentials(user.as_deref(), password.as_deref())
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    if let Some(t) = args.connect_timeout {
        options.timeout = seconds_arg(t, "connect_timeout")?;
    }
    let monitor = monitor.clone();
    let shown = endpoints.join(",");
    let watcher = py
        .detach(move || EtcdDiscovery::start(monitor, &endpoints, config, options))
        .map_err(|e| match e {
            EtcdError::Connect(_) => PyConnectionError::new_err(e.to_string()),
            EtcdError::NoEndpoints | EtcdError::HalfCredentials => {
                PyValueError::new_err(e.to_string())
            }
        })?;
    Ok(Discovery::new(shown, CoreDiscovery::Etcd(watcher)))
}

/// The settings both backends share.
fn config(args: &DiscoverArgs<'_, '_>) -> PyResult<DiscoveryConfig> {
    let namespace = opt_str_arg(args.namespace, "namespace")?;
    let component = opt_str_arg(args.component, "component")?;
    let endpoint = opt_str_arg(args.endpoint, "endpoint")?;
    let mut config = DiscoveryConfig::for_endpoints(
        namespace.as_deref(),
        component.as_deref(),
        endpoint.as_deref(),
    )
    .map_err(|e| PyValueError::new_err(e.to_string()))?;
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
    Ok(config)
}

/// `endpoints`: one URL, or a sequence of them.
fn endpoints_arg(value: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let list: Vec<String> = if value.is_instance_of::<PyString>() {
        vec![str_arg(value, "endpoints")?.to_string()]
    } else {
        value
            .try_iter()
            .map_err(|_| {
                pyo3::exceptions::PyTypeError::new_err(
                    "endpoints must be a str or a sequence of str",
                )
            })?
            .map(|e| e.and_then(|e| Ok(str_arg(&e, "endpoints")?.to_string())))
            .collect::<PyResult<_>>()?
    };
    // Empty ones are refused by core, before anything connects.
    Ok(list)
}

/// Dynamo's discovery store watched for workers, started by
/// `Monitor.discover_dynamo`. `close()` (or leaving its `with` block, or
/// garbage collection) stops watching and removes the workers it
/// registered.
#[pyclass(frozen, module = "loadgate")]
pub struct Discovery {
    source: String,
    inner: Mutex<Option<CoreDiscovery>>,
}

impl Discovery {
    fn new(source: String, watcher: CoreDiscovery) -> Self {
        Self {
            source,
            inner: Mutex::new(Some(watcher)),
        }
    }
}

#[pymethods]
impl Discovery {
    /// Stops watching and removes the workers it registered; calling it
    /// again does nothing.
    fn close(&self, py: Python<'_>) {
        let watcher = lock(&self.inner).take();
        py.detach(move || drop(watcher));
    }

    /// What the watcher has done: `scans` (listings of the store),
    /// `scan_errors` (failed listings; for etcd, lost connections too),
    /// `workers` (now registered), `workers_added`, `workers_removed`,
    /// `skipped` (records of other namespaces, components or endpoints),
    /// `refused` (by reason:
    /// `too_large`, `malformed`, `mismatched`, `over_limit`,
    /// `registration`) and `last_error`. All zero once closed.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = lock(&self.inner)
            .as_ref()
            .map(CoreDiscovery::stats)
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

    /// Where it reads: the file backend's directory, or etcd's endpoints
    /// (comma-separated).
    #[getter]
    fn source(&self) -> String {
        self.source.clone()
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
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { "closed" } else { "open" };
        format!("<loadgate.Discovery source={:?} {state}>", self.source)
    }
}
