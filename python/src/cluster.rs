//! `loadgate.Reporter` and `loadgate.Subscription`: load reports across
//! machines over NATS, as thin shells over core's `loadgate::cluster`.
//!
//! A worker's `Reporter` merges each rank's load and returns at once; core's
//! publisher thread sends the changes and re-sends every rank on each
//! heartbeat. `Monitor.subscribe_nats` attaches a core subscriber that
//! registers workers on their first message, applies their reports and
//! removes those silent for `expire_after`. Both connect on construction;
//! the process's NATS runtime (one thread) starts on the first connection,
//! never at import.
//!
//! Both take the same keyword-only authentication and TLS arguments
//! (`user`, `password`, `token`, `credentials`, `tls_ca`, `tls_cert`,
//! `tls_key`), turned into core's `NatsOptions`: a bad combination is a
//! `ValueError` naming the arguments, found before connecting; refused
//! credentials and failed TLS handshakes are `ConnectionError`s saying so.
//!
//! Closing (or garbage collection) stops the threads and drops the
//! connection. Core never calls back into Python, so those threads never
//! need the GIL; blocking steps (connecting, joining a thread) release it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use loadgate::cluster::nats::{NatsOptions, NatsTransport};
use loadgate::cluster::{
    dynamo_kv_metrics_subject, AnnounceAttached, Attached, BookingAnnouncer, ClusterError,
    Publisher, PublisherConfig, Subjects, Subscriber, SubscriberConfig, Transport, WireFormat,
    DEFAULT_ANNOUNCE_INTERVAL, DEFAULT_HEARTBEAT,
};
use loadgate::{LoadReport, MonotonicClock};
use pyo3::exceptions::{PyConnectionError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::{
    opt_str_arg, opt_u64_arg, report_error, seconds_arg, str_arg, u32_arg, u64_arg,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The `namespace` argument (default `"default"`).
pub(crate) fn namespace_arg(namespace: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
    namespace.map_or(Ok("default".to_owned()), |n| {
        Ok(str_arg(n, "namespace")?.to_string())
    })
}

/// The `dynamo=(component, endpoint)` argument: the reference worker
/// endpoint whose subject a subscription follows or a reporter publishes on.
fn dynamo_arg(dynamo: Option<&Bound<'_, PyAny>>) -> PyResult<Option<(String, String)>> {
    let Some(value) = dynamo.filter(|d| !d.is_none()) else {
        return Ok(None);
    };
    let pair: (Bound<'_, PyAny>, Bound<'_, PyAny>) = value.extract().map_err(|_| {
        PyTypeError::new_err("dynamo must be a (component, endpoint) pair of strings")
    })?;
    Ok(Some((
        str_arg(&pair.0, "dynamo component")?.to_string(),
        str_arg(&pair.1, "dynamo endpoint")?.to_string(),
    )))
}

/// The subjects of `namespace`; `ValueError` naming it when it is not a
/// plain NATS token.
pub(crate) fn subjects(namespace: &str) -> PyResult<Subjects> {
    Subjects::new(namespace).map_err(|e| match e {
        ClusterError::InvalidSubject(_) => PyValueError::new_err(format!(
            "namespace = {namespace:?} is invalid: must be a non-empty NATS token without \
             whitespace, '.', '*' or '>'"
        )),
        other => cluster_error(other),
    })
}

/// A core cluster error: `ValueError` for a setting, `ConnectionError`
/// for the transport.
pub(crate) fn cluster_error(e: ClusterError) -> PyErr {
    match e {
        ClusterError::InvalidSubject(_) | ClusterError::InvalidConfig(_) => {
            PyValueError::new_err(e.to_string())
        }
        ClusterError::Transport(why) => PyConnectionError::new_err(why),
    }
}

/// The authentication and TLS keyword arguments of `Reporter` and
/// `Monitor.subscribe_nats`, as given.
pub struct NatsArgs<'a, 'py> {
    /// `user`: a str.
    pub user: Option<&'a Bound<'py, PyAny>>,
    /// `password`: a str.
    pub password: Option<&'a Bound<'py, PyAny>>,
    /// `token`: a str.
    pub token: Option<&'a Bound<'py, PyAny>>,
    /// `credentials`: the path of a `.creds` file.
    pub credentials: Option<&'a Bound<'py, PyAny>>,
    /// `tls_ca`: the path of a PEM file of CA certificates.
    pub tls_ca: Option<&'a Bound<'py, PyAny>>,
    /// `tls_cert`: the path of a PEM client certificate chain.
    pub tls_cert: Option<&'a Bound<'py, PyAny>>,
    /// `tls_key`: the path of the client certificate's PEM private key.
    pub tls_key: Option<&'a Bound<'py, PyAny>>,
    /// `connect_timeout`: seconds, finite and above zero; `None` is 2 s.
    pub connect_timeout: Option<&'a Bound<'py, PyAny>>,
}

/// A path argument: a str or an `os.PathLike`; `None` is absent.
fn opt_path_arg(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<PathBuf>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => o.extract::<PathBuf>().map(Some).map_err(|_| {
            let got = o
                .get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string());
            PyTypeError::new_err(format!("{name} must be a str or os.PathLike, not {got}"))
        }),
    }
}

impl NatsArgs<'_, '_> {
    /// Core's options; `TypeError` naming an argument of the wrong type.
    /// Combinations and files are checked by core when connecting.
    pub(crate) fn options(&self) -> PyResult<NatsOptions> {
        let text = |v: Option<&Bound<'_, PyAny>>, name: &str| -> PyResult<Option<String>> {
            Ok(opt_str_arg(v, name)?.map(|s| s.to_string()))
        };
        Ok(NatsOptions {
            user: text(self.user, "user")?,
            password: text(self.password, "password")?,
            token: text(self.token, "token")?,
            credentials: opt_path_arg(self.credentials, "credentials")?,
            tls_ca: opt_path_arg(self.tls_ca, "tls_ca")?,
            tls_cert: opt_path_arg(self.tls_cert, "tls_cert")?,
            tls_key: opt_path_arg(self.tls_key, "tls_key")?,
            connect_timeout: self
                .connect_timeout
                .filter(|t| !t.is_none())
                .map(|t| seconds_arg(t, "connect_timeout"))
                .transpose()?,
            subscription_capacity: None,
        })
    }
}

/// Connects to `url` with `options`, the GIL released; `ValueError` for a
/// malformed URL or bad options, `ConnectionError` naming the URL when the
/// server cannot be reached, refuses the credentials or fails the TLS
/// handshake.
pub(crate) fn connect(
    py: Python<'_>,
    url: &Bound<'_, PyAny>,
    options: &NatsOptions,
) -> PyResult<NatsTransport> {
    let url = str_arg(url, "url")?;
    let target = url.to_string();
    py.detach(move || NatsTransport::connect_with(&target, options))
        .map_err(|e| match e {
            ClusterError::Transport(why) => {
                let why = why.strip_prefix("cannot connect to NATS: ").unwrap_or(&why);
                PyConnectionError::new_err(format!(
                    "cannot connect to the NATS server at {:?}: {why}",
                    &*url
                ))
            }
            other => cluster_error(other),
        })
}

/// What `subscribe_nats` keeps alive; fields drop in order (detach first,
/// then the announcer's last events, then the connection).
struct Attachment {
    _attached: Attached,
    announcing: Option<(Arc<BookingAnnouncer>, AnnounceAttached)>,
    _transport: NatsTransport,
}

/// Subscribes `monitor` to the load reports of `namespace` on the NATS
/// server at `url` (`Monitor.subscribe_nats`), announcing its own bookings
/// to the `dynamo` endpoint's routers if `announce`.
#[allow(clippy::too_many_arguments)]
pub fn subscribe_nats(
    py: Python<'_>,
    monitor: &Arc<loadgate::Monitor>,
    url: &Bound<'_, PyAny>,
    namespace: Option<&Bound<'_, PyAny>>,
    expire_after: Option<&Bound<'_, PyAny>>,
    dynamo: Option<&Bound<'_, PyAny>>,
    auth: &NatsArgs<'_, '_>,
    announce: bool,
) -> PyResult<Subscription> {
    let options = auth.options()?;
    let namespace = namespace_arg(namespace)?;
    let subjects = subjects(&namespace)?;
    let mut config = SubscriberConfig::default();
    if let Some(after) = expire_after {
        config.expire_after = seconds_arg(after, "expire_after")?;
    }
    if let Some((component, endpoint)) = dynamo_arg(dynamo)? {
        config.active_load_subject = Some(
            dynamo_kv_metrics_subject(&namespace, &component, &endpoint)
                .map_err(|e| PyValueError::new_err(format!("dynamo: {e}")))?,
        );
    }
    let announcer = match (&config.active_load_subject, announce) {
        (_, false) => None,
        (None, true) => {
            return Err(PyValueError::new_err(
                "announce_bookings=True needs dynamo=(component, endpoint): the endpoint whose routers count them",
            ))
        }
        (Some(subject), true) => Some(
            BookingAnnouncer::new(monitor.clone(), subject)
                .map_err(|e| PyValueError::new_err(format!("announce_bookings: {e}")))?,
        ),
    };
    let subscriber = Subscriber::new(monitor.clone(), config, MonotonicClock::shared())
        .map_err(cluster_error)?;
    let transport = connect(py, url, &options)?;
    let attached = py
        .detach(|| subscriber.attach(&transport, &subjects))
        .map_err(cluster_error)?;
    let announcing = match announcer {
        Some(a) => {
            let on: Arc<dyn Transport> = Arc::new(transport.clone());
            let thread = a
                .attach(on, DEFAULT_ANNOUNCE_INTERVAL)
                .map_err(cluster_error)?;
            Some((a, thread))
        }
        None => None,
    };
    Ok(Subscription {
        subscriber,
        attachment: Mutex::new(Some(Attachment {
            _attached: attached,
            announcing,
            _transport: transport,
        })),
    })
}

/// A monitor's subscription to the load reports of one NATS namespace;
/// `close()` (or leaving its `with` block) detaches. The workers it
/// registered stay in the monitor until removed.
#[pyclass(frozen, module = "loadgate")]
pub struct Subscription {
    subscriber: Arc<Subscriber>,
    attachment: Mutex<Option<Attachment>>,
}

#[pymethods]
impl Subscription {
    /// Detaches from the server and stops expiring workers; calling it again
    /// does nothing.
    fn close(&self, py: Python<'_>) {
        let attachment = lock(&self.attachment).take();
        if attachment.is_some() {
            py.detach(move || drop(attachment));
        }
    }

    /// Message counters so far: `applied` (reports applied to known
    /// workers), `announced` (workers registered from their first message),
    /// `out_of_order`, `malformed` (not read: too large, not decodable),
    /// `refused` (decoded but refused: a spoofed sender, a limit, the
    /// monitor), `expired` (workers removed after going silent) and
    /// `router_bookings` (bookings of Dynamo's routers held now, from the
    /// `active_sequences_events` of a `dynamo=` endpoint), and with
    /// `announce_bookings=True` while open `bookings_announced` (events of
    /// this monitor's own bookings published there) and `announce_lost`
    /// (dropped: queue full or publication failed).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.subscriber.stats();
        let d = PyDict::new(py);
        d.set_item("applied", s.applied)?;
        d.set_item("announced", s.announced)?;
        d.set_item("out_of_order", s.out_of_order)?;
        d.set_item("malformed", s.malformed)?;
        d.set_item("refused", s.refused)?;
        d.set_item("expired", s.expired)?;
        d.set_item("router_bookings", self.subscriber.router_bookings())?;
        let announced = lock(&self.attachment)
            .as_ref()
            .and_then(|a| a.announcing.as_ref().map(|(a, _)| a.stats()))
            .unwrap_or_default();
        d.set_item("bookings_announced", announced.published)?;
        d.set_item("announce_lost", announced.lost)?;
        Ok(d)
    }

    /// The router id this monitor's bookings are announced as
    /// (`announce_bookings=True`), else `None`; its own events with this id
    /// are not counted again.
    #[getter]
    fn router_id(&self) -> Option<u64> {
        lock(&self.attachment)
            .as_ref()
            .and_then(|a| a.announcing.as_ref().map(|(a, _)| a.router_id()))
    }

    /// Messages not applied so far, by reason (every reason, zeros
    /// included): `oversized`, `malformed`, `spoofed`, `too_many_ranks`,
    /// `name_too_long`, `too_many_models`, `backlog`, ... (docs/limits.md).
    fn refusals<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (reason, n) in self.subscriber.refusals() {
            d.set_item(reason, n)?;
        }
        Ok(d)
    }

    /// The counters in Prometheus text format, under the monitor's metrics
    /// prefix: messages by outcome and refusals by reason.
    fn metrics_text(&self) -> String {
        self.subscriber.metrics_text()
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
        let state = if lock(&self.attachment).is_none() {
            "closed"
        } else {
            "open"
        };
        format!("<loadgate.Subscription {state}>")
    }
}

/// A worker's load reporter over NATS: `report()` merges a rank's load and
/// returns at once; a background thread sends changes as they come and
/// every rank once per `heartbeat` (which announces the worker, its model,
/// ranks and capacities to frontends that join late). With
/// `dynamo=(component, endpoint)` it publishes the reference system's
/// event-plane envelope on that endpoint's subject in `namespace` instead,
/// so a reference frontend reads this worker. Construction raises
/// `ValueError` for a bad argument (malformed URL, empty model, bad
/// namespace, conflicting or unreadable authentication and TLS arguments)
/// and `ConnectionError` when the server cannot be reached, refuses the
/// credentials or fails the TLS handshake within `connect_timeout` seconds
/// (2 by default).
#[pyclass(frozen, module = "loadgate")]
pub struct Reporter {
    worker_id: u64,
    model: String,
    publisher: Mutex<Option<Publisher>>,
}

#[pymethods]
impl Reporter {
    #[new]
    #[pyo3(
        signature = (url, worker_id, model, *, namespace = None, dp_size = None, dp_start = None, kv_total_blocks = None, max_num_batched_tokens = None, max_num_seqs = None, heartbeat = None, dynamo = None, user = None, password = None, token = None, credentials = None, tls_ca = None, tls_cert = None, tls_key = None, connect_timeout = None),
        text_signature = "(url, worker_id, model, *, namespace='default', dp_size=1, dp_start=0, kv_total_blocks=None, max_num_batched_tokens=None, max_num_seqs=None, heartbeat=1.0, dynamo=None, user=None, password=None, token=None, credentials=None, tls_ca=None, tls_cert=None, tls_key=None, connect_timeout=2.0)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        url: &Bound<'_, PyAny>,
        worker_id: &Bound<'_, PyAny>,
        model: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
        dp_size: Option<&Bound<'_, PyAny>>,
        dp_start: Option<&Bound<'_, PyAny>>,
        kv_total_blocks: Option<&Bound<'_, PyAny>>,
        max_num_batched_tokens: Option<&Bound<'_, PyAny>>,
        max_num_seqs: Option<&Bound<'_, PyAny>>,
        heartbeat: Option<&Bound<'_, PyAny>>,
        dynamo: Option<&Bound<'_, PyAny>>,
        user: Option<&Bound<'_, PyAny>>,
        password: Option<&Bound<'_, PyAny>>,
        token: Option<&Bound<'_, PyAny>>,
        credentials: Option<&Bound<'_, PyAny>>,
        tls_ca: Option<&Bound<'_, PyAny>>,
        tls_cert: Option<&Bound<'_, PyAny>>,
        tls_key: Option<&Bound<'_, PyAny>>,
        connect_timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let options = NatsArgs {
            user,
            password,
            token,
            credentials,
            tls_ca,
            tls_cert,
            tls_key,
            connect_timeout,
        }
        .options()?;
        let worker_id = u64_arg(worker_id, "worker_id")?;
        let model = str_arg(model, "model")?.to_string();
        let namespace = namespace_arg(namespace)?;
        let subjects = subjects(&namespace)?;
        let format = match dynamo_arg(dynamo)? {
            None => WireFormat::Loadgate,
            Some((component, endpoint)) => WireFormat::Dynamo {
                namespace,
                component,
                endpoint,
            },
        };
        let config = PublisherConfig {
            format,
            dp_start: dp_start.map_or(Ok(0), |v| u32_arg(v, "dp_start"))?,
            dp_size: dp_size.map_or(Ok(1), |v| u32_arg(v, "dp_size"))?,
            kv_total_blocks: opt_u64_arg(kv_total_blocks, "kv_total_blocks")?,
            max_num_batched_tokens: opt_u64_arg(max_num_batched_tokens, "max_num_batched_tokens")?,
            max_num_seqs: opt_u64_arg(max_num_seqs, "max_num_seqs")?,
            heartbeat: heartbeat.map_or(Ok(DEFAULT_HEARTBEAT), |h| seconds_arg(h, "heartbeat"))?,
            ..PublisherConfig::new(worker_id, model.clone())
        };
        // Refuse bad settings before connecting.
        config.validate().map_err(cluster_error)?;
        let transport: Arc<NatsTransport> = Arc::new(connect(py, url, &options)?);
        let publisher = Publisher::spawn(config, transport, &subjects).map_err(cluster_error)?;
        Ok(Self {
            worker_id,
            model,
            publisher: Mutex::new(Some(publisher)),
        })
    }

    /// Merges one rank's new load (absent (`None`) fields keep their value,
    /// a present 0 overwrites) and returns at once; the change is sent by
    /// the reporter's thread.
    #[pyo3(
        signature = (dp_rank = None, *, active_decode_blocks = None, kv_used_blocks = None, active_prefill_tokens = None, kv_total_blocks = None, max_num_batched_tokens = None, waiting_requests = None, max_num_seqs = None),
        text_signature = "($self, dp_rank=0, *, active_decode_blocks=None, kv_used_blocks=None, active_prefill_tokens=None, kv_total_blocks=None, max_num_batched_tokens=None, waiting_requests=None, max_num_seqs=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn report(
        &self,
        dp_rank: Option<&Bound<'_, PyAny>>,
        active_decode_blocks: Option<&Bound<'_, PyAny>>,
        kv_used_blocks: Option<&Bound<'_, PyAny>>,
        active_prefill_tokens: Option<&Bound<'_, PyAny>>,
        kv_total_blocks: Option<&Bound<'_, PyAny>>,
        max_num_batched_tokens: Option<&Bound<'_, PyAny>>,
        waiting_requests: Option<&Bound<'_, PyAny>>,
        max_num_seqs: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let rank = dp_rank.map_or(Ok(0), |r| u32_arg(r, "dp_rank"))?;
        let report = LoadReport {
            active_decode_blocks: opt_u64_arg(active_decode_blocks, "active_decode_blocks")?,
            kv_used_blocks: opt_u64_arg(kv_used_blocks, "kv_used_blocks")?,
            kv_total_blocks: opt_u64_arg(kv_total_blocks, "kv_total_blocks")?,
            active_prefill_tokens: opt_u64_arg(active_prefill_tokens, "active_prefill_tokens")?,
            max_num_batched_tokens: opt_u64_arg(max_num_batched_tokens, "max_num_batched_tokens")?,
            waiting_requests: opt_u64_arg(waiting_requests, "waiting_requests")?,
            max_num_seqs: opt_u64_arg(max_num_seqs, "max_num_seqs")?,
        };
        match lock(&self.publisher).as_ref() {
            Some(p) => p.report(rank, &report).map_err(report_error),
            None => Err(PyRuntimeError::new_err("the reporter is closed")),
        }
    }

    /// Hands the reports not sent yet to the connection, stops the
    /// reporter's thread and disconnects; calling it again does nothing.
    /// Frontends remove the worker once it has been silent for their
    /// `expire_after`.
    fn close(&self, py: Python<'_>) {
        let publisher = lock(&self.publisher).take();
        if let Some(p) = publisher {
            py.detach(move || {
                p.flush();
                drop(p);
            });
        }
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
        let state = if lock(&self.publisher).is_none() {
            " closed"
        } else {
            ""
        };
        format!(
            "<loadgate.Reporter worker_id={} model={:?}{state}>",
            self.worker_id, self.model
        )
    }
}

#[pymethods]
impl crate::monitor::Monitor {
    /// Subscribes this monitor to the load reports workers publish with
    /// `loadgate.Reporter` under `namespace` on the NATS server at `url`:
    /// workers are registered on their first message, their reports are
    /// applied, and a worker silent for `expire_after` seconds is removed.
    /// `dynamo=(component, endpoint)` also follows the reference system's
    /// load events of that endpoint in `namespace`
    /// (`namespace.{namespace}.component.{component}.endpoint.{endpoint}.kv_metrics`,
    /// `"*"` for any component or endpoint), its `forward-pass-metrics`
    /// (liveness and queue depth) and its routers' bookings
    /// (`active_sequences_events`, published by routers run with
    /// `--router-replica-sync`); those carry no declaration, so their
    /// workers must be added with `add_worker` or learned with
    /// `discover_dynamo` (reports for others are refused and counted).
    /// `announce_bookings=True` (with `dynamo=`) publishes this monitor's
    /// own bookings there as a router of that endpoint does, so Dynamo's
    /// routers count them in their busy decisions (docs/dynamo.md).
    /// `user` and `password`, `token` or `credentials` (a `.creds` file)
    /// authenticate; `tls_ca` (a PEM CA file) and `tls_cert` with `tls_key`
    /// (a client certificate) set up TLS, as for `Reporter`;
    /// `connect_timeout` (seconds) bounds connecting in all. Raises
    /// `ValueError` for a malformed URL or namespace or a bad combination of
    /// those arguments, and `ConnectionError` when the server cannot be
    /// reached, refuses the credentials or fails the TLS handshake.
    #[pyo3(
        signature = (url, namespace = None, *, expire_after = None, dynamo = None, announce_bookings = false, user = None, password = None, token = None, credentials = None, tls_ca = None, tls_cert = None, tls_key = None, connect_timeout = None),
        text_signature = "($self, url, namespace='default', *, expire_after=3.0, dynamo=None, announce_bookings=False, user=None, password=None, token=None, credentials=None, tls_ca=None, tls_cert=None, tls_key=None, connect_timeout=2.0)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn subscribe_nats(
        &self,
        py: Python<'_>,
        url: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
        expire_after: Option<&Bound<'_, PyAny>>,
        dynamo: Option<&Bound<'_, PyAny>>,
        announce_bookings: bool,
        user: Option<&Bound<'_, PyAny>>,
        password: Option<&Bound<'_, PyAny>>,
        token: Option<&Bound<'_, PyAny>>,
        credentials: Option<&Bound<'_, PyAny>>,
        tls_ca: Option<&Bound<'_, PyAny>>,
        tls_cert: Option<&Bound<'_, PyAny>>,
        tls_key: Option<&Bound<'_, PyAny>>,
        connect_timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Subscription> {
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
        let (monitor, announce) = (&self.inner, announce_bookings);
        subscribe_nats(
            py,
            monitor,
            url,
            namespace,
            expire_after,
            dynamo,
            &auth,
            announce,
        )
    }
}
