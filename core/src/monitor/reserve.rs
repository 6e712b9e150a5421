//! The KV an answer will still need, reserved ahead: a booking's blocks
//! cover its prompt and, with a reservation, its answer as long as it is
//! expected to grow, so that answers admitted now cannot fill the cache
//! later and force the engine to preempt.
//!
//! # What is reserved
//!
//! A booking with a reservation ([`Booking::expect_output`], or any booking
//! of a model with an SLO) books, beside its prompt's blocks, the blocks of
//! `max(g, min(cap, E))` answer tokens, where `g` is what the answer has
//! produced so far ([`Booking::first_token`], [`Booking::tokens`]), `cap`
//! the request's `max_tokens` if given, and `E` the most an answer that
//! reached `g` is expected to hold at any one later moment, learned from
//! the model's answers ([`OutputLengths`](crate::slo::OutputLengths), fed
//! by [`Booking::finish`]; its module docs say why the peak and not the
//! expected total). Until the model has learned enough answers, `E` is
//! the cap, or nothing without one. So the reservation starts at what the
//! answer is expected to hold at its peak, follows it up as a long answer
//! outlives the short ones, settles on the actual once the answer passes
//! it, and is freed with the booking.
//!
//! # Cost
//!
//! Settling reads one published value (a relaxed load) per
//! [`Booking::tokens`] call and moves the rank's counters only when the
//! reserved blocks change: once per block of tokens at most. The table is
//! recomputed by the maintenance, off every request's path.
//!
//! [`Booking::expect_output`]: super::Booking::expect_output
//! [`Booking::first_token`]: super::Booking::first_token
//! [`Booking::tokens`]: super::Booking::tokens
//! [`Booking::finish`]: super::Booking::finish

use super::observe::ModelSlo;
use crate::slo::output_bucket;
use crate::sync::Ordering;
use crate::thresholds::DEFAULT_BLOCK_TOKENS;

impl ModelSlo {
    /// The blocks to reserve for an answer capped at `cap` tokens (0: no
    /// reservation; `u64::MAX`: no cap) that has produced `generated`
    /// (module docs).
    #[inline]
    pub(super) fn reservation(&self, cap: u64, generated: u64) -> u64 {
        if cap == 0 {
            return 0;
        }
        // Relaxed: a value published whole by the maintenance.
        let learned = self.output_peaks[output_bucket(generated)].load(Ordering::Relaxed);
        let expected = match (learned, cap) {
            (0, u64::MAX) => 0,
            (0, cap) => cap,
            (learned, cap) => learned.min(cap),
        };
        expected.max(generated).div_ceil(DEFAULT_BLOCK_TOKENS)
    }

    /// Publishes the learned table (the maintenance's).
    pub(super) fn publish_outputs(&self, peaks: &[u64]) {
        for (slot, &v) in self.output_peaks.iter().zip(peaks) {
            // Relaxed: each value whole; a reader mixing two tables reserves
            // between the two.
            slot.store(v, Ordering::Relaxed);
        }
    }
}
