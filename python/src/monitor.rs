//! `loadgate.Monitor`: the frontend half.

use std::sync::Arc;

use loadgate::http::{serve_busy_threshold, BusyThresholdRequest};
use loadgate::monitor::ThresholdState;
use loadgate::{
    LoadReport, MonitorConfig, Staleness, ThresholdFields, ThresholdUpdate, WorkerSpec,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PyBytes, PyDict, PyString};

use crate::booking::Booking;
use crate::clock::clock_arg;
use crate::control::ControlAuth;
use crate::errors::{
    bad_value, f64_arg, opt_f64_arg, opt_str_arg, opt_u64_arg, report_error, route_error,
    seconds_arg, select_args, str_arg, str_ref, threshold_error, u32_arg, u64_arg, worker_error,
};
use crate::route::Route;

/// The frontend's view of every worker's load, and its router.
///
/// Every method may be called from any thread. `report`, `is_busy`, `check`,
/// `select`, `select_min_cost` and `Route.select` are lock-free in the core
/// and keep the GIL (they never wait).
///
/// Overload leases and staleness read real time, or the `ManualClock`
/// given as `clock=` (for tests: `clock.advance(s)` ends a lease or makes
/// a worker stale without sleeping).
#[pyclass(frozen, module = "loadgate")]
pub struct Monitor {
    // Shared with the subscribers `subscribe_nats` attaches.
    pub(crate) inner: Arc<loadgate::Monitor>,
}

fn staleness_arg(name: &str) -> PyResult<Staleness> {
    Staleness::from_name(name).ok_or_else(|| {
        bad_value(
            "staleness",
            format!("{name:?}"),
            "one of 'keep', 'free', 'busy'",
        )
    })
}

/// `{model, four thresholds, version}`, as `/busy_threshold` echoes it.
fn threshold_dict<'py>(
    py: Python<'py>,
    model: &str,
    state: &ThresholdState,
) -> PyResult<Bound<'py, PyDict>> {
    let t = &state.thresholds;
    let d = PyDict::new(py);
    d.set_item("model", model)?;
    d.set_item(
        "active_decode_blocks_threshold",
        t.active_decode_blocks_threshold,
    )?;
    d.set_item(
        "active_prefill_tokens_threshold",
        t.active_prefill_tokens_threshold,
    )?;
    d.set_item(
        "active_prefill_tokens_threshold_frac",
        t.active_prefill_tokens_threshold_frac,
    )?;
    d.set_item("waiting_requests_threshold", t.waiting_requests_threshold)?;
    d.set_item("version", state.version)?;
    Ok(d)
}

/// A control endpoint's answer: (status, headers, body).
pub(crate) type ControlAnswer<'py> = (u16, Vec<(&'static str, &'static str)>, Bound<'py, PyBytes>);

/// A control endpoint's request from Python: (method, content type, body,
/// authorization).
pub(crate) type ControlRequest<'a, 'py> = (
    &'a Bound<'py, PyAny>,
    Option<&'a Bound<'py, PyAny>>,
    &'a Bound<'py, PyAny>,
    Option<&'a Bound<'py, PyAny>>,
);

impl Monitor {
    /// Serves one request of a control endpoint (`/busy_threshold`,
    /// `/slo`) with core's handler `serve`.
    pub(crate) fn serve_control<'py>(
        &self,
        py: Python<'py>,
        serve: fn(
            &loadgate::Monitor,
            Option<&loadgate::http::ControlAuth>,
            &BusyThresholdRequest<'_>,
        ) -> loadgate::http::BusyThresholdResponse,
        (method, content_type, body, authorization): ControlRequest<'_, 'py>,
        auth: Option<&Bound<'py, ControlAuth>>,
    ) -> PyResult<ControlAnswer<'py>> {
        let method = str_arg(method, "method")?;
        let content_type = opt_str_arg(content_type, "content_type")?;
        let authorization = opt_str_arg(authorization, "authorization")?;
        let body = body
            .cast::<PyBytes>()
            .map_err(|_| PyTypeError::new_err("body must be bytes"))?;
        let request = BusyThresholdRequest {
            method: &method,
            content_type: content_type.as_deref(),
            authorization: authorization.as_deref(),
            body: body.as_bytes(),
        };
        let auth = auth.map(|a| &a.get().inner);
        let response = serve(&self.inner, auth, &request);
        let body = PyBytes::new(py, response.body.as_bytes());
        Ok((response.status, response.headers, body))
    }
}

#[pymethods]
impl Monitor {
    #[new]
    #[pyo3(
        signature = (*, lease_seconds = None, staleness = None, stale_after = None, metrics_prefix = None, max_models = None, max_workers = None, max_workers_per_model = None, max_ranks_per_worker = None, max_ranks = None, max_name_len = None, clock = None, maintenance = None, dynamo_env = false, routing = None, reroutes = None),
        text_signature = "(*, lease_seconds=1.0, staleness='keep', stale_after=3.0, metrics_prefix='dynamo', max_models=256, max_workers=16384, max_workers_per_model=4096, max_ranks_per_worker=1024, max_ranks=65536, max_name_len=256, clock=None, maintenance='background', dynamo_env=False, routing='round_robin', reroutes=1)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        lease_seconds: Option<&Bound<'_, PyAny>>,
        staleness: Option<&Bound<'_, PyAny>>,
        stale_after: Option<&Bound<'_, PyAny>>,
        metrics_prefix: Option<&Bound<'_, PyAny>>,
        max_models: Option<&Bound<'_, PyAny>>,
        max_workers: Option<&Bound<'_, PyAny>>,
        max_workers_per_model: Option<&Bound<'_, PyAny>>,
        max_ranks_per_worker: Option<&Bound<'_, PyAny>>,
        max_ranks: Option<&Bound<'_, PyAny>>,
        max_name_len: Option<&Bound<'_, PyAny>>,
        clock: Option<&Bound<'_, PyAny>>,
        maintenance: Option<&Bound<'_, PyAny>>,
        dynamo_env: bool,
        routing: Option<&Bound<'_, PyAny>>,
        reroutes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut config = MonitorConfig::default();
        (config.routing, _) = crate::errors::select_args(routing.filter(|p| !p.is_none()), None)?;
        if let Some(n) = reroutes.filter(|n| !n.is_none()) {
            config.reroutes = u32_arg(n, "reroutes")?;
        }
        if dynamo_env {
            config.defaults = loadgate::monitor::ModelDefaults::from_env()
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
        }
        if let Some(name) = opt_str_arg(maintenance, "maintenance")? {
            config.maintenance = loadgate::Maintenance::from_name(&name).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "maintenance must be 'background' or 'manual', not {name:?}"
                ))
            })?;
        }
        let l = &mut config.limits;
        for (slot, arg, name) in [
            (&mut l.max_models, max_models, "max_models"),
            (&mut l.max_workers, max_workers, "max_workers"),
            (
                &mut l.max_workers_per_model,
                max_workers_per_model,
                "max_workers_per_model",
            ),
            (&mut l.max_ranks, max_ranks, "max_ranks"),
            (&mut l.max_name_len, max_name_len, "max_name_len"),
        ] {
            if let Some(v) = arg {
                *slot = usize::try_from(u64_arg(v, name)?).unwrap_or(usize::MAX);
            }
        }
        if let Some(v) = max_ranks_per_worker {
            l.max_ranks_per_worker = u32_arg(v, "max_ranks_per_worker")?;
        }
        if let Some(name) = opt_str_arg(staleness, "staleness")? {
            config.staleness = staleness_arg(&name)?;
        }
        if let Some(prefix) = opt_str_arg(metrics_prefix, "metrics_prefix")? {
            config.metrics_prefix = prefix.to_string();
        }
        if let Some(lease) = lease_seconds {
            config.lease = seconds_arg(lease, "lease_seconds")?;
        }
        if let Some(after) = stale_after {
            config.stale_after = seconds_arg(after, "stale_after")?;
        }
        let (clock, _) = clock_arg(clock)?;
        let inner = loadgate::Monitor::with_config(config, clock)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Registers a worker of `model` with ranks `dp_start .. dp_start + dp_size`.
    #[pyo3(
        signature = (model, worker_id, *, dp_size = None, dp_start = None, kv_total_blocks = None, max_num_batched_tokens = None, max_num_seqs = None),
        text_signature = "($self, model, worker_id, *, dp_size=1, dp_start=0, kv_total_blocks=None, max_num_batched_tokens=None, max_num_seqs=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn add_worker(
        &self,
        model: &Bound<'_, PyAny>,
        worker_id: &Bound<'_, PyAny>,
        dp_size: Option<&Bound<'_, PyAny>>,
        dp_start: Option<&Bound<'_, PyAny>>,
        kv_total_blocks: Option<&Bound<'_, PyAny>>,
        max_num_batched_tokens: Option<&Bound<'_, PyAny>>,
        max_num_seqs: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let model = str_arg(model, "model")?;
        let id = u64_arg(worker_id, "worker_id")?;
        let spec = WorkerSpec {
            dp_size: dp_size.map_or(Ok(1), |v| u32_arg(v, "dp_size"))?,
            dp_start: dp_start.map_or(Ok(0), |v| u32_arg(v, "dp_start"))?,
            kv_total_blocks: opt_u64_arg(kv_total_blocks, "kv_total_blocks")?,
            max_num_batched_tokens: opt_u64_arg(max_num_batched_tokens, "max_num_batched_tokens")?,
            max_num_seqs: opt_u64_arg(max_num_seqs, "max_num_seqs")?,
        };
        self.inner
            .add_worker(&model, id, spec)
            .map_err(worker_error)
    }

    /// Unregisters a worker; `KeyError` if it is not registered.
    fn remove_worker(&self, worker_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = u64_arg(worker_id, "worker_id")?;
        self.inner.remove_worker(id).map_err(worker_error)
    }

    /// Ids of `model`'s workers (empty for an unknown model).
    fn workers(&self, model: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
        Ok(self.inner.workers(&str_arg(model, "model")?))
    }

    /// Every model this monitor knows, sorted.
    fn models(&self) -> Vec<String> {
        self.inner.models()
    }

    /// Applies one load report to one rank; absent (`None`) fields keep
    /// their value, a present 0 overwrites.
    #[pyo3(
        signature = (worker_id, dp_rank = None, *, active_decode_blocks = None, kv_used_blocks = None, active_prefill_tokens = None, kv_total_blocks = None, max_num_batched_tokens = None, waiting_requests = None, max_num_seqs = None),
        text_signature = "($self, worker_id, dp_rank=0, *, active_decode_blocks=None, kv_used_blocks=None, active_prefill_tokens=None, kv_total_blocks=None, max_num_batched_tokens=None, waiting_requests=None, max_num_seqs=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn report(
        &self,
        worker_id: &Bound<'_, PyAny>,
        dp_rank: Option<&Bound<'_, PyAny>>,
        active_decode_blocks: Option<&Bound<'_, PyAny>>,
        kv_used_blocks: Option<&Bound<'_, PyAny>>,
        active_prefill_tokens: Option<&Bound<'_, PyAny>>,
        kv_total_blocks: Option<&Bound<'_, PyAny>>,
        max_num_batched_tokens: Option<&Bound<'_, PyAny>>,
        waiting_requests: Option<&Bound<'_, PyAny>>,
        max_num_seqs: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let id = u64_arg(worker_id, "worker_id")?;
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
        self.inner.report(id, rank, &report).map_err(report_error)
    }

    /// Validates and merges a threshold update for `model` (fields given are
    /// set, fields named in `clear` are unset), re-evaluates its workers, and
    /// returns the thresholds now in force with their version.
    #[pyo3(
        signature = (model, *, active_decode_blocks_threshold = None, active_prefill_tokens_threshold = None, active_prefill_tokens_threshold_frac = None, waiting_requests_threshold = None, clear = None),
        text_signature = "($self, model, *, active_decode_blocks_threshold=None, active_prefill_tokens_threshold=None, active_prefill_tokens_threshold_frac=None, waiting_requests_threshold=None, clear=())"
    )]
    #[allow(clippy::too_many_arguments)]
    fn set_thresholds<'py>(
        &self,
        py: Python<'py>,
        model: &Bound<'py, PyAny>,
        active_decode_blocks_threshold: Option<&Bound<'py, PyAny>>,
        active_prefill_tokens_threshold: Option<&Bound<'py, PyAny>>,
        active_prefill_tokens_threshold_frac: Option<&Bound<'py, PyAny>>,
        waiting_requests_threshold: Option<&Bound<'py, PyAny>>,
        clear: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let model = str_arg(model, "model")?;
        let update = threshold_update(
            active_decode_blocks_threshold,
            active_prefill_tokens_threshold,
            active_prefill_tokens_threshold_frac,
            waiting_requests_threshold,
            clear,
        )?;
        let state = self
            .inner
            .set_thresholds(&model, &update)
            .map_err(threshold_error)?;
        threshold_dict(py, &model, &state)
    }

    /// Sets the thresholds every model created from now on starts with
    /// (the same fields as `set_thresholds`; models that exist keep
    /// theirs), and returns the defaults now in force.
    #[pyo3(
        signature = (*, active_decode_blocks_threshold = None, active_prefill_tokens_threshold = None, active_prefill_tokens_threshold_frac = None, waiting_requests_threshold = None, clear = None),
        text_signature = "($self, *, active_decode_blocks_threshold=None, active_prefill_tokens_threshold=None, active_prefill_tokens_threshold_frac=None, waiting_requests_threshold=None, clear=())"
    )]
    fn set_default_thresholds<'py>(
        &self,
        py: Python<'py>,
        active_decode_blocks_threshold: Option<&Bound<'py, PyAny>>,
        active_prefill_tokens_threshold: Option<&Bound<'py, PyAny>>,
        active_prefill_tokens_threshold_frac: Option<&Bound<'py, PyAny>>,
        waiting_requests_threshold: Option<&Bound<'py, PyAny>>,
        clear: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let update = threshold_update(
            active_decode_blocks_threshold,
            active_prefill_tokens_threshold,
            active_prefill_tokens_threshold_frac,
            waiting_requests_threshold,
            clear,
        )?;
        let thresholds = self
            .inner
            .set_default_thresholds(&update)
            .map_err(threshold_error)?;
        let state = ThresholdState {
            thresholds,
            version: 0,
        };
        threshold_dict(py, "", &state)
    }

    /// The thresholds of `model` (all `None` and version 0 for an unknown model).
    fn thresholds<'py>(
        &self,
        py: Python<'py>,
        model: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let model = str_arg(model, "model")?;
        let state = self.inner.thresholds(&model).unwrap_or_default();
        threshold_dict(py, &model, &state)
    }

    /// Sets `model`'s staleness policy (`keep`, `free` or `busy`) and
    /// silence limit, and re-sweeps.
    #[pyo3(signature = (model, staleness, stale_after = None))]
    fn set_staleness(
        &self,
        model: &Bound<'_, PyAny>,
        staleness: &Bound<'_, PyAny>,
        stale_after: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let model = str_arg(model, "model")?;
        let policy = staleness_arg(&str_arg(staleness, "staleness")?)?;
        let after = match stale_after {
            Some(v) => seconds_arg(v, "stale_after")?,
            None => self.inner.config().stale_after,
        };
        self.inner
            .set_staleness(&model, policy, after)
            .map_err(threshold_error)
    }

    /// Marks ranks silent for `stale_after` as stale, ends expired overload
    /// leases, and returns how many workers were re-evaluated, now. The
    /// monitor's maintenance sweeps by itself; this is for a check on
    /// demand.
    fn sweep(&self, py: Python<'_>) -> usize {
        py.detach(|| self.inner.sweep())
    }

    /// Does the monitor's maintenance now, on this thread: sends queued
    /// requests where workers are free, refuses what reached its deadline,
    /// sweeps for staleness, ends expired leases. With
    /// `maintenance="manual"` the host calls it; otherwise a thread of the
    /// monitor's own does. Returns the clock time (seconds) at which it
    /// next has work, or `None`.
    fn maintain(&self, py: Python<'_>) -> Option<f64> {
        py.detach(|| self.inner.maintain())
            .map(|ns| ns as f64 / 1e9)
    }

    /// Whether the worker is busy by its model's thresholds (leases aside).
    fn is_busy(&self, py: Python<'_>, worker_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = u64_arg(worker_id, "worker_id")?;
        self.inner.is_busy(id).map_err(|e| route_error(py, e))
    }

    /// Whether the worker is under an unexpired overload lease.
    fn is_leased(&self, py: Python<'_>, worker_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = u64_arg(worker_id, "worker_id")?;
        self.inner.is_leased(id).map_err(|e| route_error(py, e))
    }

    /// Ids of `model`'s busy workers, ascending.
    fn busy_workers(&self, model: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
        Ok(self.inner.busy_workers(&str_arg(model, "model")?))
    }

    /// Picks a worker of `model` that is not busy and not under a lease.
    /// Raises `Overloaded` (529) when none is eligible, `Unavailable` (503)
    /// when the model has no workers.
    #[pyo3(
        signature = (model, *, policy = None, endpoint = None),
        text_signature = "($self, model, *, policy='round_robin', endpoint=None)"
    )]
    fn select(
        &self,
        py: Python<'_>,
        model: &Bound<'_, PyAny>,
        policy: Option<&Bound<'_, PyAny>>,
        endpoint: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let model = str_ref(model, "model")?;
        let (policy, endpoint) = select_args(policy, endpoint)?;
        let picked = match endpoint {
            None => self.inner.select(model, policy),
            Some(e) => self.inner.select_at(model, policy, e),
        };
        picked.map_err(|e| route_error(py, e))
    }

    /// A routing handle for `model`: `route.select()` is `select(model)`
    /// without the name on each call. Creates the model (with no workers:
    /// `select` raises `Unavailable`) if it is new; a new model counts
    /// against `max_models` and `max_name_len` (`ValueError`).
    fn route(&self, model: &Bound<'_, PyAny>) -> PyResult<Route> {
        let model = str_ref(model, "model")?;
        self.inner
            .route(model)
            .map(Route::from)
            .map_err(worker_error)
    }

    /// Picks the eligible worker with the lowest cost in `costs` (worker id
    /// to cost); unknown, busy or leased workers are skipped.
    fn select_min_cost(
        &self,
        py: Python<'_>,
        model: &Bound<'_, PyAny>,
        costs: &Bound<'_, PyAny>,
    ) -> PyResult<u64> {
        let model = str_arg(model, "model")?;
        let items = match costs.cast::<PyDict>() {
            Ok(d) => d.items().into_any(),
            Err(_) => costs.call_method0("items").map_err(|_| {
                PyTypeError::new_err("costs must be a mapping of worker id to cost")
            })?,
        };
        let mut pairs = Vec::new();
        for item in items.try_iter()? {
            let (id, cost): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
            let id = u64_arg(&id, "costs key (worker id)")?;
            let cost = f64_arg(&cost, "costs value")?;
            pairs.push((id, cost));
        }
        self.inner
            .select_min_cost(&model, pairs)
            .map_err(|e| route_error(py, e))
    }

    /// Checks a pinned worker: raises `WorkerOverloaded` when it is busy or
    /// under a lease, `KeyError` when it is not registered.
    #[pyo3(signature = (worker_id, *, endpoint = None))]
    fn check(
        &self,
        py: Python<'_>,
        worker_id: &Bound<'_, PyAny>,
        endpoint: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let id = u64_arg(worker_id, "worker_id")?;
        let result = match opt_str_arg(endpoint, "endpoint")? {
            None => self.inner.check(id),
            Some(e) => self.inner.check_at(id, &e),
        };
        result.map_err(|e| route_error(py, e))
    }

    /// Marks a worker that refused with "Server overloaded": it is skipped
    /// for the lease time or until its next report shows it not busy.
    fn mark_overloaded(&self, py: Python<'_>, worker_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = u64_arg(worker_id, "worker_id")?;
        self.inner
            .mark_overloaded(id)
            .map_err(|e| route_error(py, e))
    }

    /// Books `blocks` KV blocks of a routed request on a worker rank; they
    /// count in its `active_decode_blocks` until the booking is released.
    /// `prefill_tokens` (the request's prompt tokens) count in the rank's
    /// `active_prefill_tokens` until `prefill_done()` or the release. In
    /// booking sync's leased mode, raises `WorkerOverloaded` when the
    /// blocks do not fit this frontend's share of the rank.
    #[pyo3(signature = (worker_id, dp_rank, blocks, *, prefill_tokens = None))]
    fn book(
        &self,
        worker_id: &Bound<'_, PyAny>,
        dp_rank: &Bound<'_, PyAny>,
        blocks: &Bound<'_, PyAny>,
        prefill_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Booking> {
        let id = u64_arg(worker_id, "worker_id")?;
        let rank = u32_arg(dp_rank, "dp_rank")?;
        let blocks = u64_arg(blocks, "blocks")?;
        let prefill = match prefill_tokens {
            Some(n) => u64_arg(n, "prefill_tokens")?,
            None => 0,
        };
        let booking = self
            .inner
            .book_with_prefill(id, rank, blocks, prefill)
            .map_err(report_error)?;
        Ok(Booking::new(id, rank, booking))
    }

    /// Serves `/busy_threshold` as Dynamo 1.6.1 answers it: (method, content
    /// type, body) to (status, headers, body), where headers is a list of
    /// (name, value) pairs to send besides the length (`content-type`, and
    /// `allow` with a 405 or `www-authenticate` with a 401). With `auth` (a
    /// `ControlAuth`), `authorization` (the request's `Authorization`
    /// header, `None` if absent) is checked: a write without the right
    /// bearer token is answered 401 and changes nothing.
    #[pyo3(signature = (method, content_type, body, *, authorization = None, auth = None))]
    fn handle_busy_threshold<'py>(
        &self,
        py: Python<'py>,
        method: &Bound<'py, PyAny>,
        content_type: Option<&Bound<'py, PyAny>>,
        body: &Bound<'py, PyAny>,
        authorization: Option<&Bound<'py, PyAny>>,
        auth: Option<&Bound<'py, ControlAuth>>,
    ) -> PyResult<ControlAnswer<'py>> {
        let request = (method, content_type, body, authorization);
        self.serve_control(py, serve_busy_threshold, request, auth)
    }

    /// Learns this monitor's workers from Dynamo's discovery store, so that
    /// no `add_worker` call is needed beside Dynamo workers: every model card
    /// of `namespace` (and of `component` and `endpoint`, when given)
    /// registers its worker under the card's model name, with its instance
    /// id, data-parallel ranks, KV blocks and prefill batch size, and a card
    /// that goes removes it. `backend="file"` watches Dynamo's file backend
    /// at `path` (default: `DYN_FILE_KV`, else `$TMPDIR/dynamo_store_kv`)
    /// every `interval` seconds, and a card its worker has not refreshed
    /// for `ttl` seconds (`None`: never) counts as gone. `backend="etcd"`
    /// watches etcd at `endpoints` (a URL or a list; default
    /// `ETCD_ENDPOINTS`, else `http://localhost:2379`), with `user` and
    /// `password` when etcd has authentication on, `connect_timeout`
    /// bounding each request. The store's workers are registered when this
    /// returns. Returns a `Discovery` whose `close()` stops it and removes
    /// the workers it registered. Raises `ValueError` for a bad argument and
    /// `ConnectionError` when etcd cannot be read.
    #[pyo3(
        signature = (namespace = None, *, backend = None, path = None, component = None, endpoint = None, interval = None, ttl = None, endpoints = None, user = None, password = None, connect_timeout = None),
        text_signature = "($self, namespace='dynamo', *, backend='file', path=None, component=None, endpoint=None, interval=0.5, ttl=10.0, endpoints=None, user=None, password=None, connect_timeout=2.0)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn discover_dynamo(
        &self,
        py: Python<'_>,
        namespace: Option<&Bound<'_, PyAny>>,
        backend: Option<&Bound<'_, PyAny>>,
        path: Option<&Bound<'_, PyAny>>,
        component: Option<&Bound<'_, PyAny>>,
        endpoint: Option<&Bound<'_, PyAny>>,
        interval: Option<&Bound<'_, PyAny>>,
        ttl: Option<&Bound<'_, PyAny>>,
        endpoints: Option<&Bound<'_, PyAny>>,
        user: Option<&Bound<'_, PyAny>>,
        password: Option<&Bound<'_, PyAny>>,
        connect_timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<crate::discovery::Discovery> {
        let args = crate::discovery::DiscoverArgs {
            namespace,
            backend,
            path,
            component,
            endpoint,
            interval,
            ttl,
            endpoints,
            user,
            password,
            connect_timeout,
        };
        crate::discovery::start(py, &self.inner, &args)
    }

    /// Polls a stock engine's Prometheus `/metrics` at `url` every
    /// `interval` seconds as worker `worker_id` of `model` (`None`: the
    /// engine's `model_name` label) and reports its KV cache usage,
    /// capacity and waiting requests per data-parallel rank. The worker is
    /// registered on the first successful scrape; the returned `Scrape`'s
    /// `close()` stops it and removes the worker. `engine` is `"vllm"` or
    /// `"sglang"`; a scrape taking longer than `timeout` seconds fails.
    /// `max_num_seqs` declares the requests each rank runs at once at most
    /// (vLLM's `--max-num-seqs`, SGLang's `--max-running-requests`), which
    /// neither engine's metrics carry; with an SLO set, the ranks are never
    /// taken to hold more.
    #[pyo3(
        signature = (model, worker_id, url, *, engine = None, interval = None, timeout = None, max_num_seqs = None),
        text_signature = "($self, model, worker_id, url, *, engine='vllm', interval=0.5, timeout=2.0, max_num_seqs=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn scrape(
        &self,
        model: Option<&Bound<'_, PyAny>>,
        worker_id: &Bound<'_, PyAny>,
        url: &Bound<'_, PyAny>,
        engine: Option<&Bound<'_, PyAny>>,
        interval: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
        max_num_seqs: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<crate::scrape::Scrape> {
        crate::scrape::start(
            &self.inner,
            model,
            worker_id,
            url,
            engine,
            interval,
            timeout,
            max_num_seqs,
        )
    }

    /// The frontend metrics in Prometheus text format.
    fn metrics_text(&self) -> String {
        self.inner.metrics_text()
    }

    fn __repr__(&self) -> String {
        format!("<loadgate.Monitor models={:?}>", self.inner.models())
    }
}

/// A threshold update from `set_thresholds`' keyword arguments.
fn threshold_update(
    active_decode_blocks_threshold: Option<&Bound<'_, PyAny>>,
    active_prefill_tokens_threshold: Option<&Bound<'_, PyAny>>,
    active_prefill_tokens_threshold_frac: Option<&Bound<'_, PyAny>>,
    waiting_requests_threshold: Option<&Bound<'_, PyAny>>,
    clear: Option<&Bound<'_, PyAny>>,
) -> PyResult<ThresholdUpdate> {
    let mut update = ThresholdUpdate {
        active_decode_blocks_threshold: opt_f64_arg(
            active_decode_blocks_threshold,
            "active_decode_blocks_threshold",
        )?,
        active_prefill_tokens_threshold: opt_u64_arg(
            active_prefill_tokens_threshold,
            "active_prefill_tokens_threshold",
        )?,
        active_prefill_tokens_threshold_frac: opt_f64_arg(
            active_prefill_tokens_threshold_frac,
            "active_prefill_tokens_threshold_frac",
        )?,
        waiting_requests_threshold: opt_u64_arg(
            waiting_requests_threshold,
            "waiting_requests_threshold",
        )?,
        clear: ThresholdFields::NONE,
    };
    if let Some(clear) = clear.filter(|c| !c.is_none()) {
        if clear.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(
                "clear must be a sequence of field names, not a str",
            ));
        }
        let items = clear
            .try_iter()
            .map_err(|_| PyTypeError::new_err("clear must be a sequence of field names"))?;
        for item in items {
            let item = item?;
            let name: PyBackedStr = item.extract().map_err(|_| {
                PyTypeError::new_err("clear must be a sequence of field names (str)")
            })?;
            update.clear.insert_name(&name).map_err(threshold_error)?;
        }
    }
    Ok(update)
}
