//! The SLO's state that the load table and the models hold (`slo.rs` has
//! what reads and fits it): the queue of observations a booking's stream
//! hooks push into, and each rank's fit and published predictions. It
//! knows no worker or model, so the layers point one way: `rank.rs` and
//! `model.rs` hold these, `slo.rs` uses them all.

use std::sync::OnceLock;

use crossbeam_queue::ArrayQueue;

use crate::clock::SharedClock;
use crate::slo::{StepFit, StepLoad};
use crate::sync::{AtomicBool, AtomicU64, Mutex, Ordering};

/// Observations waiting for the maintenance before it drops new ones.
pub const OBSERVATION_CAPACITY: usize = 16_384;
/// How often the maintenance fits while any model has an SLO.
pub const FIT_PERIOD: std::time::Duration = std::time::Duration::from_millis(20);

/// What a booking saw.
#[derive(Debug, Clone, Copy)]
pub(super) enum Sample {
    /// One step of `seconds` under `load`.
    Step { seconds: f64, load: StepLoad },
    /// A first token after `observed` seconds, where `predicted` was
    /// predicted at booking (negative: no trusted prediction then).
    FirstToken { observed: f64, predicted: f64 },
}

/// An observation of rank index `rank` of worker `worker_id` (by id: a
/// queued observation must not keep a worker, its model and so the queue
/// itself alive).
pub(super) struct Observation {
    pub(super) worker_id: u64,
    pub(super) rank: usize,
    pub(super) sample: Sample,
}

/// The monitor's queue of observations (module docs).
pub(crate) struct Observations {
    pub(super) queue: OnceLock<ArrayQueue<Observation>>,
    pub(super) lost: AtomicU64,
    clock: SharedClock,
}

impl std::fmt::Debug for Observations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observations").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for RankSlo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankSlo")
            .field("coefficients", &self.coefficients())
            .finish_non_exhaustive()
    }
}

impl Observations {
    pub(crate) fn new(clock: SharedClock) -> Self {
        Self {
            queue: OnceLock::new(),
            lost: AtomicU64::new(0),
            clock,
        }
    }

    /// The monitor's clock, nanoseconds.
    pub(super) fn now(&self) -> u64 {
        self.clock.now_nanos()
    }

    pub(super) fn push(&self, o: Observation) {
        let pushed = self.queue.get().is_some_and(|q| q.push(o).is_ok());
        if !pushed {
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One rank's fit and what it publishes (module docs).
pub(super) struct RankSlo {
    /// The coefficients, `f64` bits, published by the maintenance.
    pub(super) coefficients: [AtomicU64; 4],
    pub(super) trusted: AtomicBool,
    /// Bookings on the rank now (own and others').
    pub(super) bookings: AtomicU64,
    /// Running relative error of the time-to-first-token predictions
    /// (`f64` bits; 1 until the first).
    pub(super) ttft_error: AtomicU64,
    /// The maintenance's.
    pub(super) fit: OnceLock<Mutex<StepFit>>,
}

impl RankSlo {
    pub(super) fn new() -> Self {
        Self {
            coefficients: Default::default(),
            trusted: AtomicBool::new(false),
            bookings: AtomicU64::new(0),
            ttft_error: AtomicU64::new(1f64.to_bits()),
            fit: OnceLock::new(),
        }
    }

    pub(super) fn coefficients(&self) -> [f64; 4] {
        // Relaxed: values published whole each; a mix is benign (module
        // docs).
        std::array::from_fn(|i| f64::from_bits(self.coefficients[i].load(Ordering::Relaxed)))
    }
}
