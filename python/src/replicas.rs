//! `Monitor.sync_bookings`: booking sync between frontend replicas over
//! NATS (`loadgate::cluster::replicas`, docs/replicas.md), and the handle
//! it returns.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use loadgate::cluster::replicas::{
    BookingSync as CoreSync, BookingSyncConfig, SyncAttached, SyncMode,
};
use loadgate::cluster::Transport;
use loadgate::MonotonicClock;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::cluster::{cluster_error, connect, namespace_arg, subjects, NatsArgs};
use crate::errors::{seconds_arg, str_arg, u32_arg};
use crate::monitor::Monitor;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[pymethods]
impl Monitor {
    /// Shares this frontend's bookings with the other frontend replicas of
    /// `namespace` on the NATS server at `url`, and adds theirs to this
    /// monitor (docs/replicas.md): `frontend_id` names this replica (unique,
    /// one NATS token); what changed goes out at most every `debounce`
    /// seconds, an empty message every `heartbeat` seconds when nothing
    /// did, and the whole state on a join, when a replica that missed a
    /// message asks, and every `snapshot_every` seconds; a replica silent
    /// for `expire_after` seconds is forgotten;
    /// `max_frontends` bounds the replicas tracked and `max_entries` the
    /// rank entries kept over all of them. `mode` is `"shared"` (see the
    /// others' bookings and book by the busy rule on the total) or
    /// `"leased"` (book only within a leased share of every rank's line,
    /// so the frontends together never book past it; a booking past the
    /// share raises `WorkerOverloaded`, and a new frontend books nothing
    /// for its first one and a half `lease` seconds).
    /// Takes the same authentication and TLS arguments as
    /// `subscribe_nats`. Returns a `BookingSync` whose `close()` stops it.
    /// Raises `ValueError` for a bad argument and `ConnectionError` when the
    /// server cannot be reached.
    #[pyo3(
        signature = (url, namespace = None, *, frontend_id, mode = None, lease = None, debounce = None, heartbeat = None, snapshot_every = None, expire_after = None, max_frontends = None, max_entries = None, user = None, password = None, token = None, credentials = None, tls_ca = None, tls_cert = None, tls_key = None, connect_timeout = None),
        text_signature = "($self, url, namespace='default', *, frontend_id, mode='shared', lease=1.0, debounce=0.002, heartbeat=1.0, snapshot_every=10.0, expire_after=3.0, max_frontends=64, max_entries=262144, user=None, password=None, token=None, credentials=None, tls_ca=None, tls_cert=None, tls_key=None, connect_timeout=2.0)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn sync_bookings(
        &self,
        py: Python<'_>,
        url: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
        frontend_id: &Bound<'_, PyAny>,
        mode: Option<&Bound<'_, PyAny>>,
        lease: Option<&Bound<'_, PyAny>>,
        debounce: Option<&Bound<'_, PyAny>>,
        heartbeat: Option<&Bound<'_, PyAny>>,
        snapshot_every: Option<&Bound<'_, PyAny>>,
        expire_after: Option<&Bound<'_, PyAny>>,
        max_frontends: Option<&Bound<'_, PyAny>>,
        max_entries: Option<&Bound<'_, PyAny>>,
        user: Option<&Bound<'_, PyAny>>,
        password: Option<&Bound<'_, PyAny>>,
        token: Option<&Bound<'_, PyAny>>,
        credentials: Option<&Bound<'_, PyAny>>,
        tls_ca: Option<&Bound<'_, PyAny>>,
        tls_cert: Option<&Bound<'_, PyAny>>,
        tls_key: Option<&Bound<'_, PyAny>>,
        connect_timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<BookingSync> {
        let auth = NatsArgs {
            user,
            password,
            token,
            credentials,
            tls_ca,
            tls_cert,
            tls_key,
            connect_timeout,
        };
        let options = auth.options()?;
        let mut config = BookingSyncConfig::new(str_arg(frontend_id, "frontend_id")?.to_string());
        if let Some(m) = mode.filter(|m| !m.is_none()) {
            config.mode = match &*str_arg(m, "mode")? {
                "shared" => SyncMode::Shared,
                "leased" => SyncMode::Leased,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "mode = {other:?} is invalid: must be 'shared' or 'leased'"
                    )))
                }
            };
        }
        if let Some(l) = lease.filter(|l| !l.is_none()) {
            config.lease = seconds_arg(l, "lease")?;
        }
        if let Some(d) = debounce.filter(|d| !d.is_none()) {
            config.debounce = seconds_arg(d, "debounce")?;
        }
        if let Some(h) = heartbeat.filter(|h| !h.is_none()) {
            config.heartbeat = seconds_arg(h, "heartbeat")?;
        }
        if let Some(e) = snapshot_every.filter(|e| !e.is_none()) {
            config.snapshot_every = seconds_arg(e, "snapshot_every")?;
        }
        config.expire_after = match expire_after.filter(|e| !e.is_none()) {
            Some(e) => seconds_arg(e, "expire_after")?,
            None => 3 * config.heartbeat,
        };
        if let Some(n) = max_frontends.filter(|n| !n.is_none()) {
            config.max_frontends = u32_arg(n, "max_frontends")? as usize;
        }
        if let Some(n) = max_entries.filter(|n| !n.is_none()) {
            config.max_entries = u32_arg(n, "max_entries")? as usize;
        }
        let subjects = subjects(&namespace_arg(namespace)?)?;
        let sync = CoreSync::new(
            self.inner.clone(),
            &subjects,
            config,
            MonotonicClock::shared(),
        )
        .map_err(cluster_error)?;
        let transport: Arc<dyn Transport> = Arc::new(connect(py, url, &options)?);
        let attached = py
            .detach(|| sync.attach(transport, &subjects))
            .map_err(cluster_error)?;
        Ok(BookingSync {
            sync,
            attached: Mutex::new(Some(attached)),
        })
    }
}

/// This frontend's booking sync with the other replicas
/// (`Monitor.sync_bookings`); `close()` (or leaving its `with` block)
/// stops it, and the others forget this frontend after `expire_after`.
#[pyclass(frozen, module = "loadgate")]
pub struct BookingSync {
    sync: Arc<CoreSync>,
    attached: Mutex<Option<SyncAttached>>,
}

#[pymethods]
impl BookingSync {
    /// This frontend's id.
    #[getter]
    fn frontend_id(&self) -> String {
        self.sync.frontend_id().to_owned()
    }

    /// Stops sending and receiving; calling it again does nothing. The
    /// bookings learned from the others stay until they are forgotten. In
    /// leased mode the monitor books nothing more once its lease has run
    /// out.
    fn close(&self, py: Python<'_>) {
        let attached = lock(&self.attached).take();
        if attached.is_some() {
            py.detach(move || drop(attached));
        }
    }

    /// Counts so far: `sent` (messages), `snapshots_sent` (of them, whole
    /// states), `bytes_sent`, `received`, `bytes_received`, `gaps` (others'
    /// messages missed), `out_of_order`, `resyncs` (whole states asked of
    /// the others after a gap), `refused` (oversized, malformed, spoofed,
    /// too many frontends, entries or queues), `expired` (frontends
    /// forgotten after their silence), `frontends` (tracked now), `behind`
    /// (of them, those whose whole state is awaited), `last_size` (bytes
    /// of the last message sent); in leased mode also `share_ppm` (the share of every rank's
    /// line this frontend uses, in parts per million), `claim_ppm` (the
    /// share it claims) and `fenced` (times its lease ran out while it held
    /// a share).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.sync.stats();
        let d = PyDict::new(py);
        d.set_item("sent", s.sent)?;
        d.set_item("snapshots_sent", s.snapshots_sent)?;
        d.set_item("bytes_sent", s.bytes_sent)?;
        d.set_item("received", s.received)?;
        d.set_item("bytes_received", s.bytes_received)?;
        d.set_item("gaps", s.gaps)?;
        d.set_item("out_of_order", s.out_of_order)?;
        d.set_item("resyncs", s.resyncs)?;
        d.set_item("refused", s.refused)?;
        d.set_item("expired", s.expired)?;
        d.set_item("frontends", s.frontends)?;
        d.set_item("behind", s.behind)?;
        d.set_item("last_size", s.last_size)?;
        d.set_item("share_ppm", s.share)?;
        d.set_item("claim_ppm", s.claim)?;
        d.set_item("fenced", s.fenced)?;
        Ok(d)
    }

    /// The other frontends' queues: `(frontend, model, requests, tokens)`.
    fn remote_queues(&self) -> Vec<(String, String, u32, u64)> {
        self.sync
            .remote_queues()
            .into_iter()
            .map(|(f, q)| (f, q.model, q.requests, q.tokens))
            .collect()
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
        let state = if lock(&self.attached).is_none() {
            "closed"
        } else {
            "open"
        };
        format!(
            "<loadgate.BookingSync {:?} {state}>",
            self.sync.frontend_id()
        )
    }
}
