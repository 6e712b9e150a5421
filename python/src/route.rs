//! `loadgate.Route`: core's [`loadgate::Route`], a routing handle bound to
//! one model (from `Monitor.route(model)`).

use pyo3::prelude::*;

use crate::errors::route_error;
use crate::errors::select_args;

/// A routing handle for one model, from `Monitor.route(model)`:
/// `select()` picks like `Monitor.select(model)` without taking or looking
/// up the model name on each call.
///
/// The handle holds the model itself: it sees workers added and removed
/// after it was made, and keeps working (and keeps the model) when the
/// monitor is gone. Lock-free and GIL-holding like `Monitor.select`; may be
/// shared between threads.
#[pyclass(frozen, module = "loadgate")]
pub struct Route {
    inner: loadgate::Route,
}

impl From<loadgate::Route> for Route {
    fn from(inner: loadgate::Route) -> Self {
        Self { inner }
    }
}

#[pymethods]
impl Route {
    /// Picks a worker of the handle's model that is not busy and not under
    /// a lease. Raises `Overloaded` (529) when none is eligible,
    /// `Unavailable` (503) when the model has no workers.
    #[pyo3(
        signature = (*, policy = None, endpoint = None),
        text_signature = "($self, *, policy='round_robin', endpoint=None)"
    )]
    fn select(
        &self,
        py: Python<'_>,
        policy: Option<&Bound<'_, PyAny>>,
        endpoint: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let (policy, endpoint) = select_args(policy, endpoint)?;
        let picked = match endpoint {
            None => self.inner.select(policy),
            Some(e) => self.inner.select_at(policy, e),
        };
        picked.map_err(|e| route_error(py, e))
    }

    /// The model this handle routes to.
    #[getter]
    fn model(&self) -> &str {
        self.inner.model()
    }

    fn __repr__(&self) -> String {
        format!("<loadgate.Route model={:?}>", self.inner.model())
    }
}
