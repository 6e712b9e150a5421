//! `loadgate.Booking`: a request's KV blocks and prefill tokens booked on a
//! worker rank by `Monitor.book`.

use std::sync::{Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::errors::u64_arg;

/// A request's KV blocks booked on a worker rank; freed by `release()`, by
/// leaving its `with` block, or when it is garbage-collected.
#[pyclass(frozen, module = "loadgate")]
pub struct Booking {
    worker_id: u64,
    dp_rank: u32,
    inner: Mutex<Option<loadgate::Booking>>,
}

impl Booking {
    pub fn new(worker_id: u64, dp_rank: u32, booking: loadgate::Booking) -> Self {
        Self {
            worker_id,
            dp_rank,
            inner: Mutex::new(Some(booking)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<loadgate::Booking>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[pymethods]
impl Booking {
    /// Adds `n` generated output blocks to the booking.
    fn add_output_blocks(&self, n: &Bound<'_, PyAny>) -> PyResult<()> {
        let n = u64_arg(n, "n")?;
        match self.lock().as_mut() {
            Some(b) => {
                b.add_output_blocks(n);
                Ok(())
            }
            None => Err(PyRuntimeError::new_err("the booking was already released")),
        }
    }

    /// The request's prefill is done (its first token came): its prompt
    /// tokens stop counting; the blocks stay booked. Calling it again, or
    /// after `release()`, does nothing.
    fn prefill_done(&self) {
        if let Some(b) = self.lock().as_mut() {
            b.prefill_done();
        }
    }

    /// The request's first token came: its prefill is done (as
    /// `prefill_done()`) and, with an SLO set for its model
    /// (`Monitor.set_slo`), the time since it was booked is observed as its
    /// time to first token. Calling it again only marks the prefill done;
    /// after `release()` it does nothing.
    fn first_token(&self) {
        if let Some(b) = self.lock().as_mut() {
            b.first_token();
        }
    }

    /// `n` more tokens of the answer came, after the first: its
    /// reservation settles (`expect_output()`) and, with an SLO set for
    /// its model, the time since the last token, over `n`, is observed as
    /// one engine step of its rank. Before `first_token()`, for `n` of 0
    /// or after `release()`, it does nothing.
    #[pyo3(signature = (n = None), text_signature = "($self, n=1)")]
    fn tokens(&self, n: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let n = match n {
            Some(n) => u64_arg(n, "n")?,
            None => 1,
        };
        if let Some(b) = self.lock().as_mut() {
            b.tokens(n);
        }
        Ok(())
    }

    /// Reserves KV for the answer to come, up to `max_tokens` tokens (the
    /// request's limit; `None`: as long as the model's answers go),
    /// settling as tokens stream (`tokens()`). With an SLO set for its
    /// model every booking already reserves, unbounded; this bounds it.
    /// After `release()` it does nothing.
    #[pyo3(signature = (max_tokens = None))]
    fn expect_output(&self, max_tokens: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let cap = max_tokens.map(|n| u64_arg(n, "max_tokens")).transpose()?;
        if let Some(b) = self.lock().as_mut() {
            b.expect_output(cap);
        }
        Ok(())
    }

    /// The answer ended with `output_tokens` tokens (`None`: as many as
    /// `first_token()` and `tokens()` counted): with an SLO set for its
    /// model, its length is learned for the reservations of the answers to
    /// come, and its time per output token is weighed against the TPOT
    /// target (the rank's TPOT margin). Releases the booking; after
    /// `release()` it does nothing.
    #[pyo3(signature = (output_tokens = None))]
    fn finish(&self, output_tokens: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let n = output_tokens
            .map(|n| u64_arg(n, "output_tokens"))
            .transpose()?;
        let booking = self.lock().take();
        if let Some(b) = booking {
            b.finish(n);
        }
        Ok(())
    }

    /// Answer tokens counted so far (`first_token()` and `tokens()`).
    #[getter]
    fn output_tokens(&self) -> u64 {
        self.lock()
            .as_ref()
            .map_or(0, loadgate::Booking::output_tokens)
    }

    /// Blocks reserved now for the answer (part of `blocks`; 0 once
    /// released).
    #[getter]
    fn reserved_blocks(&self) -> u64 {
        self.lock()
            .as_ref()
            .map_or(0, loadgate::Booking::reserved_blocks)
    }

    /// Prompt tokens still booked (0 once the prefill is done or the booking
    /// released).
    #[getter]
    fn prefill_tokens(&self) -> u64 {
        self.lock()
            .as_ref()
            .map_or(0, loadgate::Booking::prefill_tokens)
    }

    /// Frees the booked blocks and prompt tokens; calling it again does
    /// nothing.
    fn release(&self) {
        let booking = self.lock().take();
        drop(booking);
    }

    /// Blocks currently booked (0 once released).
    #[getter]
    fn blocks(&self) -> u64 {
        self.lock().as_ref().map_or(0, loadgate::Booking::blocks)
    }

    /// The worker the blocks are booked on.
    #[getter]
    fn worker_id(&self) -> u64 {
        self.worker_id
    }

    /// The rank the blocks are booked on.
    #[getter]
    fn dp_rank(&self) -> u32 {
        self.dp_rank
    }

    /// Whether the booking was released.
    #[getter]
    fn released(&self) -> bool {
        self.lock().is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release();
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "<loadgate.Booking worker_id={} dp_rank={} blocks={}>",
            self.worker_id,
            self.dp_rank,
            self.blocks()
        )
    }
}
