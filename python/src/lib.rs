//! The native module `loadgate._loadgate`: thin wrappers over the `loadgate`
//! core crate. The public Python package `loadgate` re-exports it and adds
//! the exception classes and pure-Python helpers (ASGI, Prometheus, demo).
//!
//! Rules the wrappers follow:
//! * every class is `frozen` over a `&self`-only core object, so it can be
//!   shared between threads without a Python-side lock;
//! * calls that cannot block keep the GIL (an O(1) atomic call is cheaper
//!   than a GIL round trip); `AdmissionGate.admit_blocking` and the NATS
//!   connect and close calls release it;
//! * nothing starts a thread at import or for a gate or monitor: asyncio
//!   waiting is driven by the event loop. Only the NATS classes
//!   (`Monitor.subscribe_nats`, `Reporter`) run core's cluster threads, and
//!   the NATS runtime starts on the first connection.

use std::time::Duration;

use loadgate::http::{
    error_response_with_status, is_status_code, ErrorStyle, MAX_BODY_BYTES, REASON_HEADER,
    STATUS_CODES,
};
use loadgate::Reason;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

mod booking;
mod clock;
mod cluster;
mod control;
mod discovery;
mod errors;
mod flow;
mod gate;
mod monitor;
mod replicas;
mod route;
mod scrape;
mod slo;

use errors::{bad_value, str_arg};

/// `'a', 'b', 'c'`: core's names, as a message lists them.
fn quoted<const N: usize>(names: [&str; N]) -> String {
    names.map(|n| format!("'{n}'")).join(", ")
}

fn reason_arg(obj: &Bound<'_, PyAny>) -> PyResult<Reason> {
    let name = str_arg(obj, "reason")?;
    Reason::from_name(&name).ok_or_else(|| {
        bad_value(
            "reason",
            format!("{:?}", &*name),
            &format!("one of {}", quoted(Reason::ALL.map(Reason::as_str))),
        )
    })
}

/// A status code chosen for a rejection answer, by core's rule
/// (`loadgate::http::is_status_code`); `ValueError` otherwise.
fn status_arg(obj: &Bound<'_, PyAny>) -> PyResult<u16> {
    obj.extract::<u16>()
        .ok()
        .filter(|s| is_status_code(*s))
        .ok_or_else(|| {
            let shown = obj
                .repr()
                .map_or_else(|_| "?".to_owned(), |r| r.to_string());
            bad_value(
                "status_code",
                shown,
                &format!("from {} to {}", STATUS_CODES.start(), STATUS_CODES.end()),
            )
        })
}

/// Checks a status code chosen for a rejection answer and returns it;
/// `ValueError` when it is not one.
#[pyfunction]
fn _check_status_code(status_code: &Bound<'_, PyAny>) -> PyResult<u16> {
    status_arg(status_code)
}

/// The HTTP status answered for overloads: `DYN_HTTP_OVERLOAD_STATUS_CODE`
/// (read once per process), 529 when unset or invalid.
#[pyfunction]
fn overload_status_code() -> u16 {
    loadgate::http::overload_status()
}

/// `(message, status)` of a rejection reason.
#[pyfunction]
fn _reason_info(reason: &Bound<'_, PyAny>) -> PyResult<(&'static str, u16)> {
    let r = reason_arg(reason)?;
    Ok((r.message(), r.http_status()))
}

/// `(body, headers)` of the HTTP answer to a rejection: the JSON body text
/// in `style` and every header but its length (content type, `Retry-After`,
/// the reason header).
#[pyfunction]
#[pyo3(signature = (reason, style, status, retry_after))]
fn _error_response(
    reason: &Bound<'_, PyAny>,
    style: &Bound<'_, PyAny>,
    status: &Bound<'_, PyAny>,
    retry_after: Option<&Bound<'_, PyAny>>,
) -> PyResult<(String, Vec<(&'static str, String)>)> {
    let reason = reason_arg(reason)?;
    let style_name = str_arg(style, "style")?;
    let style = ErrorStyle::from_name(&style_name).ok_or_else(|| {
        bad_value(
            "style",
            format!("{:?}", &*style_name),
            &format!("one of {}", quoted(ErrorStyle::ALL.map(ErrorStyle::name))),
        )
    })?;
    let status = status_arg(status)?;
    let retry_after = match retry_after.filter(|r| !r.is_none()) {
        None => Duration::ZERO,
        Some(r) => errors::timeout_arg(Some(r), "retry_after")?.unwrap_or_default(),
    };
    let r = error_response_with_status(reason, style, retry_after, status);
    Ok((r.body, r.headers))
}

/// Does nothing; a baseline of `bench_calls.py` (a call without arguments).
#[pyfunction]
fn _noop() {}

/// Does nothing with one argument; a baseline of `bench_calls.py` (a call
/// with one positional argument, the shape of `Monitor.select(model)`).
#[pyfunction]
fn _noop_arg(_arg: &Bound<'_, PyAny>) {}

/// The native module.
#[pymodule]
fn _loadgate(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("REASON_HEADER", REASON_HEADER)?;
    m.add("MAX_BUSY_THRESHOLD_BODY", MAX_BODY_BYTES)?;
    let styles = PyTuple::new(m.py(), ErrorStyle::ALL.map(ErrorStyle::name))?;
    m.add("ERROR_STYLES", styles)?;
    m.add_function(wrap_pyfunction!(overload_status_code, m)?)?;
    m.add_function(wrap_pyfunction!(_reason_info, m)?)?;
    m.add_function(wrap_pyfunction!(_check_status_code, m)?)?;
    m.add_function(wrap_pyfunction!(_error_response, m)?)?;
    m.add_function(wrap_pyfunction!(_noop, m)?)?;
    m.add_function(wrap_pyfunction!(_noop_arg, m)?)?;
    m.add_class::<monitor::Monitor>()?;
    m.add_class::<route::Route>()?;
    m.add_class::<control::ControlAuth>()?;
    m.add_class::<control::PriorityNames>()?;
    m.add("_PRIORITY_HEADER", loadgate::http::PRIORITY_HEADER)?;
    m.add_function(wrap_pyfunction!(flow::_flow_headers, m)?)?;
    m.add("_TENANT_HEADER", loadgate::http::TENANT_HEADER)?;
    m.add("_DEADLINE_HEADER", loadgate::http::DEADLINE_HEADER)?;
    m.add("_QUEUE_HEADER", loadgate::http::QUEUE_HEADER)?;
    m.add_class::<booking::Booking>()?;
    m.add_class::<cluster::Subscription>()?;
    m.add_class::<replicas::BookingSync>()?;
    m.add_class::<cluster::Reporter>()?;
    m.add_class::<scrape::Scrape>()?;
    m.add_class::<discovery::Discovery>()?;
    m.add_class::<flow::FlowDispatch>()?;
    m.add_class::<flow::FlowTicket>()?;
    m.add_class::<gate::AdmissionGate>()?;
    m.add_class::<gate::PriorityClass>()?;
    m.add_class::<gate::Permit>()?;
    m.add_class::<gate::Admission>()?;
    m.add_class::<clock::ManualClock>()?;
    // `asyncio.iscoroutine` (so `create_task`, `gather`, ...) accepts an
    // admission: it is a coroutine in all but its type.
    m.py()
        .import("collections.abc")?
        .getattr("Coroutine")?
        .call_method1("register", (m.getattr("Admission")?,))?;
    Ok(())
}
