//! Bounds on everything input can make loadgate hold.
//!
//! A frontend registers workers and models from network messages, so every
//! size a message (or an API argument) chooses is checked against a
//! [`Limits`] before anything is allocated: a refusal is a typed
//! [`WorkerError`], never an allocation failure. `docs/limits.md` lists
//! every allocation sized by input and the bound that covers it.

use crate::error::WorkerError;
use crate::load::{check_model, check_ranks};

/// Default [`Limits::max_models`].
pub const DEFAULT_MAX_MODELS: usize = 256;
/// Default [`Limits::max_workers`].
pub const DEFAULT_MAX_WORKERS: usize = 16_384;
/// Default [`Limits::max_workers_per_model`].
pub const DEFAULT_MAX_WORKERS_PER_MODEL: usize = 4096;
/// Default [`Limits::max_ranks_per_worker`].
pub const DEFAULT_MAX_RANKS_PER_WORKER: u32 = 1024;
/// Default [`Limits::max_ranks`].
pub const DEFAULT_MAX_RANKS: usize = 65_536;
/// Default [`Limits::max_name_len`].
pub const DEFAULT_MAX_NAME_LEN: usize = 256;

/// Largest `max_workers_per_model` (slots are allocated per model up front).
const WORKERS_PER_MODEL_CEILING: usize = 1 << 24;

/// How much a monitor (or a publisher's declaration) may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most models one monitor holds (each allocates slots for
    /// `max_workers_per_model` workers when it is created).
    pub max_models: usize,
    /// Most workers one monitor holds, over all models.
    pub max_workers: usize,
    /// Most workers one model holds (its slots are allocated up front).
    pub max_workers_per_model: usize,
    /// Most data-parallel ranks one worker declares.
    pub max_ranks_per_worker: u32,
    /// Most ranks one monitor holds, over all workers.
    pub max_ranks: usize,
    /// Longest model name, in bytes.
    pub max_name_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_models: DEFAULT_MAX_MODELS,
            max_workers: DEFAULT_MAX_WORKERS,
            max_workers_per_model: DEFAULT_MAX_WORKERS_PER_MODEL,
            max_ranks_per_worker: DEFAULT_MAX_RANKS_PER_WORKER,
            max_ranks: DEFAULT_MAX_RANKS,
            max_name_len: DEFAULT_MAX_NAME_LEN,
        }
    }
}

impl Limits {
    /// The first setting out of range, as `(field, allowed range)`.
    pub fn invalid_field(&self) -> Option<(&'static str, &'static str)> {
        let checks: [(&'static str, bool, &'static str); 6] = [
            ("max_models", self.max_models >= 1, "must be at least 1"),
            ("max_workers", self.max_workers >= 1, "must be at least 1"),
            (
                "max_workers_per_model",
                (1..=WORKERS_PER_MODEL_CEILING).contains(&self.max_workers_per_model),
                "must be in 1..=16777216",
            ),
            (
                "max_ranks_per_worker",
                self.max_ranks_per_worker >= 1,
                "must be at least 1",
            ),
            ("max_ranks", self.max_ranks >= 1, "must be at least 1"),
            ("max_name_len", self.max_name_len >= 1, "must be at least 1"),
        ];
        checks
            .into_iter()
            .find(|(_, ok, _)| !ok)
            .map(|(field, _, range)| (field, range))
    }

    /// Checks a model name: non-empty, at most `max_name_len` bytes.
    pub fn check_model_name(&self, model: &str) -> Result<(), WorkerError> {
        check_model(model)?;
        if model.len() > self.max_name_len {
            return Err(WorkerError::NameTooLong {
                len: model.len(),
                limit: self.max_name_len,
            });
        }
        Ok(())
    }

    /// Checks one worker's declaration: a non-empty model name of at most
    /// `max_name_len` bytes, and ranks `dp_start..dp_start + dp_size` that
    /// fit in `u32` and number at most `max_ranks_per_worker`.
    pub fn check_declaration(
        &self,
        model: &str,
        dp_start: u32,
        dp_size: u32,
    ) -> Result<(), WorkerError> {
        self.check_model_name(model)?;
        check_ranks(dp_start, dp_size)?;
        if dp_size > self.max_ranks_per_worker {
            return Err(WorkerError::TooManyRanks {
                dp_size,
                limit: self.max_ranks_per_worker,
            });
        }
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn declarations_are_checked_against_every_bound() {
        let l = Limits {
            max_name_len: 4,
            max_ranks_per_worker: 8,
            ..Limits::default()
        };
        assert_eq!(l.check_declaration("abcd", 0, 8), Ok(()));
        assert_eq!(l.check_declaration("", 0, 1), Err(WorkerError::EmptyModel));
        assert_eq!(
            l.check_declaration("abcde", 0, 1),
            Err(WorkerError::NameTooLong { len: 5, limit: 4 })
        );
        assert_eq!(
            l.check_declaration("a", 0, 9),
            Err(WorkerError::TooManyRanks {
                dp_size: 9,
                limit: 8
            })
        );
        assert_eq!(
            l.check_declaration("a", u32::MAX, 1),
            Err(WorkerError::InvalidRanks {
                dp_start: u32::MAX,
                dp_size: 1
            })
        );
    }

    #[test]
    fn settings_out_of_range_are_named() {
        assert_eq!(Limits::default().invalid_field(), None);
        let zero_models = Limits {
            max_models: 0,
            ..Limits::default()
        };
        assert_eq!(zero_models.invalid_field().unwrap().0, "max_models");
        let huge = Limits {
            max_workers_per_model: (1 << 24) + 1,
            ..Limits::default()
        };
        assert_eq!(huge.invalid_field().unwrap().0, "max_workers_per_model");
    }
}
