//! Admission from a service-level objective: the pieces that predict, per
//! rank, how long a request will wait for its first token and between its
//! tokens.
//!
//! * [`Slo`]: a model's targets, time to first token and time per output
//!   token, checked when set.
//! * [`StepFit`] (`fit.rs`): one rank's engine step time as a function of
//!   what the step carries, fitted online, robust to bad observations.
//! * [`OutputLengths`] (`output.rs`): a model's answers' lengths, for the
//!   KV an answer will still need.

mod fit;
mod output;

use std::fmt;
use std::time::Duration;

pub use fit::{
    Refused, StepFit, StepLoad, GUARD_SAMPLES, MAX_LOAD, MAX_RELATIVE_ERROR, MAX_STEP, MIN_SAMPLES,
};
pub use output::{
    bucket as output_bucket, OutputLengths, BUCKETS as OUTPUT_BUCKETS, MAX_OUTPUT, MIN_OUTPUTS,
};

/// The share of a rank's KV cache the SLO's verdict lets bookings and
/// their reservations fill.
pub const KV_LINE: f64 = 0.95;
/// How far under its line a busy rank must come before the SLO's verdict
/// frees it: a rank turns busy when its predicted load reaches 1 (of the
/// SLO or of [`KV_LINE`]) and free again below `1 - HYSTERESIS` (by its
/// KV, as soon as a typical request fits under the line, if that is
/// nearer).
pub const HYSTERESIS: f64 = 0.1;

/// Longest target accepted for either field: an hour.
pub const MAX_TARGET: Duration = Duration::from_secs(3600);

/// A model's service-level objective.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slo {
    /// Time to first token.
    pub ttft: Duration,
    /// Time per output token after the first.
    pub tpot: Duration,
}

/// An SLO refused, naming the field.
#[derive(Debug, Clone, PartialEq)]
pub enum SloError {
    /// `field` is not a finite number of seconds above zero and at most
    /// [`MAX_TARGET`].
    OutOfRange {
        /// `ttft` or `tpot`.
        field: &'static str,
        /// The value given, in seconds.
        seconds: f64,
    },
}

impl fmt::Display for SloError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SloError::OutOfRange { field, seconds } => write!(
                f,
                "{field} of {seconds} s: must be above 0 and at most {} s",
                MAX_TARGET.as_secs()
            ),
        }
    }
}

impl std::error::Error for SloError {}

impl Slo {
    /// An SLO from seconds, as the bindings take it: each value finite,
    /// above zero and at most [`MAX_TARGET`], or an error naming it.
    pub fn from_secs(ttft: f64, tpot: f64) -> Result<Self, SloError> {
        let check = |field, seconds: f64| {
            if seconds.is_finite() && seconds > 0.0 && seconds <= MAX_TARGET.as_secs_f64() {
                Ok(Duration::from_secs_f64(seconds))
            } else {
                Err(SloError::OutOfRange { field, seconds })
            }
        };
        Ok(Self {
            ttft: check("ttft", ttft)?,
            tpot: check("tpot", tpot)?,
        })
    }
}

#[cfg(test)]
mod tests;
