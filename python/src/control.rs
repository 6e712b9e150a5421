//! `loadgate.ControlAuth`: the bearer token guarding `/busy_threshold`.

use loadgate::http::{self, BEARER_CHALLENGE};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::str_arg;

/// The bearer token guarding `/busy_threshold`, for
/// `Monitor.handle_busy_threshold(..., auth=...)` and `ControlApp(token=...)`.
///
/// With it, a write (a `POST` that sets or clears a threshold) must carry
/// `Authorization: Bearer <token>` (scheme in any case, token exact,
/// compared in constant time) or is answered 401 and changes nothing; reads
/// stay open unless `protect_reads` is true. An empty token, or one with a
/// space, control or non-ASCII character, raises `ValueError`. The token is
/// never shown by `repr`.
#[pyclass(frozen, module = "loadgate")]
pub struct ControlAuth {
    pub(crate) inner: http::ControlAuth,
}

#[pymethods]
impl ControlAuth {
    /// The `WWW-Authenticate` header value a 401 answer carries.
    #[classattr]
    const CHALLENGE: &'static str = BEARER_CHALLENGE;

    #[new]
    #[pyo3(signature = (token, *, protect_reads = false))]
    fn new(token: &Bound<'_, PyAny>, protect_reads: bool) -> PyResult<Self> {
        let token = str_arg(token, "token")?;
        let inner = http::ControlAuth::new(&*token, protect_reads)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self { inner })
    }

    /// Whether reads need the token too.
    #[getter]
    fn protect_reads(&self) -> bool {
        self.inner.protect_reads()
    }

    fn __repr__(&self) -> String {
        let protect = if self.inner.protect_reads() {
            "True"
        } else {
            "False"
        };
        format!("ControlAuth(token=<redacted>, protect_reads={protect})")
    }
}

/// How a request's priority header names a class (`loadgate.asgi`'s
/// `AdmissionMiddleware` asks it): the core's rule, see
/// [`loadgate::http::PriorityNames`].
#[pyclass(frozen, module = "loadgate._loadgate", name = "_PriorityNames")]
pub struct PriorityNames(http::PriorityNames);

#[pymethods]
impl PriorityNames {
    /// `names`: (name, class) pairs; `default`: the class without the
    /// header; `unknown`: the class of a value that names none.
    #[new]
    fn new(names: Vec<(String, u8)>, default: u8, unknown: u8) -> Self {
        // Header values are bytes, read as latin-1: a name with a character
        // past U+00FF can never equal one.
        let latin1 = |name: &str| -> Option<Vec<u8>> {
            name.chars()
                .map(|c| u8::try_from(u32::from(c)).ok())
                .collect()
        };
        let names = names
            .into_iter()
            .filter_map(|(name, class)| latin1(&name).map(|bytes| (bytes, class)));
        Self(http::PriorityNames::new(names, default, unknown))
    }

    /// The class a request names: `value` is the header's raw bytes, or
    /// `None` without the header.
    fn class_of(&self, value: Option<&[u8]>) -> u8 {
        self.0.class_of(value)
    }
}
