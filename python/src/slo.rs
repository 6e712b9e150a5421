//! `Monitor.set_slo`, `Monitor.slo`, `Monitor.predict`: a model's SLO and
//! what each rank's fitted step time predicts (core's `slo` and
//! `monitor/slo.rs`), advisory for now. The streams are observed by
//! `Booking.first_token` and `Booking.tokens` (`booking.rs`).

use loadgate::slo::Slo;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{f64_arg, report_error, str_arg, threshold_error, u32_arg, u64_arg};
use crate::monitor::Monitor;

#[pymethods]
impl Monitor {
    /// Sets model `model`'s SLO: `ttft` (time to first token) and `tpot`
    /// (time per output token), in seconds; `ttft=None, tpot=None` clears
    /// it. Advisory for now: requests' streams are observed
    /// (`Booking.first_token`, `Booking.tokens`), each rank's engine step
    /// time is fitted, and `predict` and the metrics show what SLO
    /// admission would see; the thresholds still decide. Raises
    /// `ValueError` for a value that is not a finite number of seconds
    /// above 0 and at most an hour (naming it) or an unknown model.
    #[pyo3(signature = (model, *, ttft, tpot))]
    fn set_slo(
        &self,
        model: &Bound<'_, PyAny>,
        ttft: Option<&Bound<'_, PyAny>>,
        tpot: Option<&Bound<'_, PyAny>>,
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
        self.inner.set_slo(&model, slo).map_err(threshold_error)
    }

    /// Model `model`'s SLO as `{"ttft": s, "tpot": s}`, or `None`.
    fn slo<'py>(
        &self,
        py: Python<'py>,
        model: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let model = str_arg(model, "model")?;
        let Some(slo) = self.inner.slo(&model) else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("ttft", slo.ttft.as_secs_f64())?;
        d.set_item("tpot", slo.tpot.as_secs_f64())?;
        Ok(Some(d))
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
