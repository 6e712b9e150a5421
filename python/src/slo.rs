//! `Monitor.set_slo`, `Monitor.slo`, `Monitor.predict`: a model's SLO,
//! what each rank's fitted step time predicts, and the verdicts it gives
//! (core's `slo` and `monitor/slo.rs`). The streams are observed by
//! `Booking.first_token`, `Booking.tokens` and `Booking.finish`
//! (`booking.rs`).

use loadgate::slo::Slo;
use loadgate::SloMode;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::control::ControlAuth;
use crate::errors::{f64_arg, report_error, str_arg, threshold_error, u32_arg, u64_arg};
use crate::monitor::{ControlAnswer, Monitor};

#[pymethods]
impl Monitor {
    /// Sets model `model`'s SLO: `ttft` (time to first token) and `tpot`
    /// (time per output token), in seconds; `ttft=None, tpot=None` clears
    /// it. Requests' streams are observed (`Booking.first_token`,
    /// `Booking.tokens`, `Booking.finish`), each rank's engine step time is
    /// fitted, bookings reserve the answers they expect, and each rank gets
    /// the SLO's verdict, which marks it busy beside the thresholds; with
    /// `advisory=True` the verdicts are only counted and shown (`slo()`,
    /// the metrics). Raises `ValueError` for a value that is not a finite
    /// number of seconds above 0 and at most an hour (naming it), and
    /// `KeyError` for an unknown model.
    #[pyo3(signature = (model, *, ttft, tpot, advisory = false))]
    fn set_slo(
        &self,
        model: &Bound<'_, PyAny>,
        ttft: Option<&Bound<'_, PyAny>>,
        tpot: Option<&Bound<'_, PyAny>>,
        advisory: bool,
    ) -> PyResult<()> {
        let model = str_arg(model, "model")?;
        let slo = match (ttft, tpot) {
            (None, None) => None,
            (Some(ttft), Some(tpot)) => Some(
                Slo::from_secs(f64_arg(ttft, "ttft")?, f64_arg(tpot, "tpot")?)
                    .map_err(|e| PyValueError::new_err(e.to_string()))?,
            ),
            _ => {
                return Err(PyValueError::new_err(
                    "ttft and tpot are set together (or both None to clear)",
                ))
            }
        };
        let mode = if advisory {
            SloMode::Advisory
        } else {
            SloMode::Enforce
        };
        self.inner
            .set_slo(&model, slo, mode)
            .map_err(threshold_error)
    }

    /// Model `model`'s SLO as `{"ttft": s, "tpot": s, "advisory": bool,
    /// "would_admit": n, "would_queue": n, "would_refuse": n,
    /// "refused_late": n}` (`Monitor::slo_counts`: while advisory, requests
    /// the SLO would have admitted, let wait or refused; enforced, those
    /// refused at arrival as predicted late), or `None`.
    fn slo<'py>(
        &self,
        py: Python<'py>,
        model: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let model = str_arg(model, "model")?;
        let Some((slo, mode)) = self.inner.slo(&model) else {
            return Ok(None);
        };
        let counts = self.inner.slo_counts(&model).unwrap_or_default();
        let d = PyDict::new(py);
        d.set_item("ttft", slo.ttft.as_secs_f64())?;
        d.set_item("tpot", slo.tpot.as_secs_f64())?;
        d.set_item("advisory", mode == SloMode::Advisory)?;
        d.set_item("would_admit", counts.would_admit)?;
        d.set_item("would_queue", counts.would_queue)?;
        d.set_item("would_refuse", counts.would_refuse)?;
        d.set_item("refused_late", counts.refused_late)?;
        Ok(Some(d))
    }

    /// Serves `/slo` (a model's SLO read, set or cleared at run time, beside
    /// `/busy_threshold`): (method, content type, body) to (status,
    /// headers, body), as `handle_busy_threshold` does, with the same
    /// `authorization` and `auth`. `GET` lists every model's SLO; `POST
    /// {"model"}` reads one; `POST {"model", "ttft", "tpot", "advisory"?}`
    /// sets it; `POST {"model", "clear": true}` clears it.
    #[pyo3(signature = (method, content_type, body, *, authorization = None, auth = None))]
    fn handle_slo<'py>(
        &self,
        py: Python<'py>,
        method: &Bound<'py, PyAny>,
        content_type: Option<&Bound<'py, PyAny>>,
        body: &Bound<'py, PyAny>,
        authorization: Option<&Bound<'py, PyAny>>,
        auth: Option<&Bound<'py, ControlAuth>>,
    ) -> PyResult<ControlAnswer<'py>> {
        let request = (method, content_type, body, authorization);
        self.serve_control(py, loadgate::http::serve_slo, request, auth)
    }

    /// What rank `dp_rank` of `worker_id` would give a new request of
    /// `prompt_tokens` now, from its fitted step time: `{"ttft": s, "tpot":
    /// s, "trusted": bool, "fit_error": x, "ttft_error": x}` (`trusted`:
    /// enough observations within the fit's error; the errors are running
    /// relative errors, 1 until observed).
    fn predict<'py>(
        &self,
        py: Python<'py>,
        worker_id: &Bound<'py, PyAny>,
        dp_rank: &Bound<'py, PyAny>,
        prompt_tokens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let (w, r) = (
            u64_arg(worker_id, "worker_id")?,
            u32_arg(dp_rank, "dp_rank")?,
        );
        let p = self
            .inner
            .predict(w, r, u64_arg(prompt_tokens, "prompt_tokens")?)
            .map_err(report_error)?;
        let (fit_error, ttft_error) = self.inner.prediction_errors(w, r).map_err(report_error)?;
        let d = PyDict::new(py);
        d.set_item("ttft", p.ttft)?;
        d.set_item("tpot", p.tpot)?;
        d.set_item("trusted", p.trusted)?;
        d.set_item("fit_error", fit_error)?;
        d.set_item("ttft_error", ttft_error)?;
        Ok(d)
    }
}
