//! The SLO's state that the load table and the models hold (`slo.rs` has
//! what reads and fits it): the queue of observations a booking's stream
//! hooks push into, and each rank's fit and published predictions. It
//! knows no worker or model, so the layers point one way: `rank.rs` and
//! `model.rs` hold these, `slo.rs` uses them all.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crossbeam_queue::ArrayQueue;

use super::busy_set::AtomicBits;
use super::freed::Releases;
use crate::clock::SharedClock;
use crate::flow::Rate;
use crate::slo::{OutputLengths, StepFit, StepLoad, OUTPUT_BUCKETS};
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Mutex, Ordering};

/// Observations waiting for the maintenance before it drops new ones.
pub const OBSERVATION_CAPACITY: usize = 16_384;
/// How often the maintenance fits while any model has an SLO.
pub const FIT_PERIOD: std::time::Duration = std::time::Duration::from_millis(20);

/// What a booking saw.
#[derive(Debug, Clone, Copy)]
pub(super) enum Sample {
    /// `share` (in (0, 1]) of one step of `seconds` under `load`: a
    /// request's mean token gap over `k` steps is `k/R` of a step, as its
    /// rank's `R` requests all saw them; an engine's mean gap between two
    /// scrapes is one step.
    Step {
        seconds: f64,
        load: StepLoad,
        share: f64,
    },
    /// A first token after `observed` seconds, where `predicted` was
    /// predicted at booking (negative: no trusted prediction then).
    FirstToken { observed: f64, predicted: f64 },
    /// An answer of `output` tokens to a prompt of `prompt` ended, after
    /// `tpot` seconds per output token (not positive: not seen, or booked
    /// without a trusted prediction).
    Answer { prompt: u64, output: u64, tpot: f64 },
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

/// How many mean absolute deviations above the mean time from dispatch to
/// first token a queue's wait budget keeps for it
/// (`ModelSlo::queue_budget`).
const BUDGET_SPREADS: f64 = 2.0;

/// Whether a model's SLO decides, only shows what it would decide, or is
/// not set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SloMode {
    /// The SLO's verdicts mark ranks busy, beside the static thresholds.
    Enforce,
    /// The SLO's verdicts are computed and counted, never acted on.
    Advisory,
}

/// A model's SLO and what its requests taught it (`slo.rs`).
pub(super) struct ModelSlo {
    /// The targets, nanoseconds (0: none).
    pub(super) ttft: AtomicU64,
    pub(super) tpot: AtomicU64,
    /// 0: no SLO, 1: enforced, 2: advisory; stored after the targets.
    pub(super) mode: AtomicU32,
    /// The monitor's queue of observations.
    pub(super) observations: Arc<Observations>,
    /// `OutputLengths::expected_peaks`, published by the maintenance.
    /// (On the heap, as the table below: a model is built on small stacks
    /// too, a loom model's among them.)
    pub(super) output_peaks: Box<[AtomicU64]>,
    /// Mean prompt of the answers seen, tokens (0 until one).
    pub(super) typical_prompt: AtomicU64,
    /// The maintenance's table of answer lengths.
    pub(super) outputs: Mutex<Box<OutputLengths>>,
    /// Each slot's SLO verdict (set: every rank would be busy), kept by
    /// the worker's publisher in either mode.
    pub(super) verdicts: AtomicBits,
    /// Requests picked while advisory whose worker the SLO would admit,
    /// and those it would refuse (a pick, or a wait in the queue
    /// predicted too long); requests it would let wait in the queue.
    pub(super) would_admit: AtomicU64,
    pub(super) would_refuse: AtomicU64,
    pub(super) would_queue: AtomicU64,
    /// Requests refused at arrival, enforced, because their wait in the
    /// queue was predicted too long (`flow/late.rs`).
    pub(super) refused_late: AtomicU64,
    /// Time from dispatch to first token as observed: its running mean and
    /// mean absolute deviation, `f64` bits of seconds (0 until the first);
    /// the maintenance's.
    pub(super) dispatch_ttft: [AtomicU64; 2],
    /// The maintenance's samples of the bookings that ended (`freed.rs`).
    pub(super) releases: Mutex<Box<Releases>>,
    /// The rate they end at over the queue's budget, and its variance,
    /// `f64` bits (NaN before two); the maintenance's (`freed.rs`).
    pub(super) freed: [AtomicU64; 2],
}

impl ModelSlo {
    pub(super) fn new(observations: &Arc<Observations>, slots: usize) -> Self {
        Self {
            ttft: AtomicU64::new(0),
            tpot: AtomicU64::new(0),
            mode: AtomicU32::new(0),
            observations: Arc::clone(observations),
            output_peaks: (0..OUTPUT_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            typical_prompt: AtomicU64::new(0),
            outputs: Mutex::new(Box::default()),
            verdicts: AtomicBits::new(slots),
            would_admit: AtomicU64::new(0),
            would_refuse: AtomicU64::new(0),
            would_queue: AtomicU64::new(0),
            refused_late: AtomicU64::new(0),
            dispatch_ttft: Default::default(),
            releases: Mutex::new(Box::default()),
            freed: [f64::NAN, f64::NAN].map(|x| AtomicU64::new(x.to_bits())),
        }
    }

    /// The mode, if an SLO is set. Relaxed: a setting.
    #[inline]
    pub(super) fn mode(&self) -> Option<SloMode> {
        match self.mode.load(Ordering::Relaxed) {
            0 => None,
            1 => Some(SloMode::Enforce),
            _ => Some(SloMode::Advisory),
        }
    }

    /// How long a request may wait in the model's queue and still meet the
    /// TTFT target (`flow/late.rs`): the target less the time from
    /// dispatch to first token the model's requests showed lately, the
    /// running mean plus [`BUDGET_SPREADS`] running mean absolute
    /// deviations; half the target before the first.
    pub(super) fn queue_budget(&self) -> Duration {
        // Relaxed: a setting, and gauges the maintenance publishes.
        let target = self.ttft.load(Ordering::Relaxed) as f64 * 1e-9;
        let [mean, spread] = &self.dispatch_ttft;
        let mean = f64::from_bits(mean.load(Ordering::Relaxed));
        let spread = f64::from_bits(spread.load(Ordering::Relaxed));
        let after = if mean > 0.0 {
            mean + BUDGET_SPREADS * spread
        } else {
            target / 2.0
        };
        Duration::try_from_secs_f64((target - after).max(0.0)).unwrap_or(Duration::ZERO)
    }

    /// The rate the model's bookings end at, over its queue's budget, as
    /// the maintenance last published it (`freed.rs`); `None` before two
    /// ended.
    pub(super) fn freed(&self) -> Option<Rate> {
        // Relaxed: values the maintenance publishes whole each; a rate and
        // the variance of the next sample are benign.
        let [rate, variance] = self
            .freed
            .each_ref()
            .map(|c| f64::from_bits(c.load(Ordering::Relaxed)));
        (!rate.is_nan()).then_some(Rate {
            per_second: rate,
            variance,
        })
    }
}

impl std::fmt::Debug for ModelSlo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelSlo")
            .field("mode", &self.mode())
            .finish_non_exhaustive()
    }
}

/// Smoothing of `RankSlo::mean_prefill` per step observed.
pub(super) const PREFILL_SMOOTH: f64 = 0.01;

/// `RankSlo::clean_bookings` when the last report showed requests waiting
/// (or none came yet).
pub(super) const NO_CLEAN_REPORT: u64 = u64::MAX;

/// The terms of a rank's verdict (`predict.rs`, "Deciding" in `slo.rs`):
/// which one turned it busy is counted, so an operator (and the lab) can
/// see what holds a rank back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BusyTerm {
    /// Its booked and reported KV, reservations included, over its line.
    Kv,
    /// Its predicted time to first token or per output token (or, before
    /// the fit has its first steps, its booked prefill).
    Time,
    /// Its bookings past its learned seats and their probe.
    Seats,
    /// Requests its engine reported waiting for a seat, not all seated
    /// since.
    Waiting,
}

impl BusyTerm {
    pub(super) const ALL: [BusyTerm; 4] = [Self::Kv, Self::Time, Self::Seats, Self::Waiting];

    /// Its `by` label in `frontend_slo_turned_busy_total`.
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Kv => "kv",
            Self::Time => "time",
            Self::Seats => "seats",
            Self::Waiting => "waiting",
        }
    }
}

/// One rank's fit and what it publishes (module docs).
pub(super) struct RankSlo {
    /// The coefficients, `f64` bits, published by the maintenance.
    pub(super) coefficients: [AtomicU64; 5],
    pub(super) trusted: AtomicBool,
    /// The fit has its first [`GUARD_SAMPLES`](crate::slo::GUARD_SAMPLES)
    /// steps: the verdict uses it, trusted or not (`predict.rs`).
    pub(super) fitted: AtomicBool,
    /// Bookings on the rank now (own and others').
    pub(super) bookings: AtomicU64,
    /// Bookings that ended on the rank since the maintenance last took
    /// them (`freed.rs`).
    pub(super) released: AtomicU64,
    /// Bookings on the rank now whose prefill is done: the engine seated
    /// them (`predict.rs`, `seats`).
    pub(super) started: AtomicU64,
    /// Running relative error of the time-to-first-token predictions
    /// (`f64` bits; 1 until the first).
    pub(super) ttft_error: AtomicU64,
    /// Running relative error of the step fit (`f64` bits; 1 until the
    /// first).
    pub(super) step_error: AtomicU64,
    /// What the verdict multiplies the predicted time per output token
    /// by, at least 1 (`f64` bits): raised by each answer that missed the
    /// target, lowered by each that met it (`slo.rs`, `TPOT_MISSES`).
    pub(super) tpot_margin: AtomicU64,
    /// The maintenance's.
    pub(super) fit: OnceLock<Mutex<StepFit>>,
    /// The prefill tokens of the rank's steps, running mean over about
    /// [`PREFILL_SMOOTH`]'s inverse of its steps (`f64` bits), the
    /// maintenance's: the prefill a request's steps will carry on average.
    pub(super) mean_prefill: AtomicU64,
    /// The fit's reach (`StepFit::reach`: running sequences, context
    /// tokens), `f64` bits, published with its coefficients.
    pub(super) reach: [AtomicU64; 2],
    /// The engine's seats as learned (`predict.rs`, `seats`; 0: none seen
    /// full yet); its publisher's.
    pub(super) seats: AtomicU64,
    /// The seats the engine has (its `max_num_seqs`), as declared or last
    /// reported (0: not known): the learned seats never pass them, and
    /// before any are learned they are the seats (`predict.rs`, `seats`).
    pub(super) engine_seats: AtomicU64,
    /// How far past its seats the rank is booked until the next report
    /// (`predict.rs`, `seat_probe`); its publisher's.
    pub(super) probe: AtomicU64,
    /// When the publisher last took a report, the monitor's clock's
    /// nanoseconds (0: none yet); its publisher's.
    pub(super) reported_at: AtomicU64,
    /// A report came since the publisher last learned the seats (set by
    /// every report, taken by the publisher).
    pub(super) reported: AtomicBool,
    /// The bookings when the last report came, if it showed none waiting
    /// (else [`NO_CLEAN_REPORT`]); the publisher's.
    pub(super) clean_bookings: AtomicU64,
    /// The bookings the last report showed seated (those when it came less
    /// those it showed waiting), if it showed some waiting (else
    /// [`NO_CLEAN_REPORT`]); the publisher's.
    pub(super) seated: AtomicU64,
    /// The SLO's verdict on the rank as last published (its publisher's).
    pub(super) busy: AtomicBool,
    /// The load the verdict last weighed (1 at the rank's line), `f64`
    /// bits: routing sends a request where it is lowest (`rank.rs`).
    pub(super) pressure: AtomicU64,
    /// How often that verdict changed.
    pub(super) flips: AtomicU64,
    /// How often it turned busy, by the term that weighed most then
    /// ([`BusyTerm`] order).
    pub(super) turned_busy: [AtomicU64; BusyTerm::ALL.len()],
    /// The bookings on the rank when the verdict last turned busy: the
    /// limit it holds (0 before the first); its publisher's.
    pub(super) line: AtomicU64,
}

impl RankSlo {
    /// A rank's state, its engine running `engine_seats` requests at most
    /// (0: not known).
    pub(super) fn new(engine_seats: u64) -> Self {
        Self {
            coefficients: Default::default(),
            trusted: AtomicBool::new(false),
            fitted: AtomicBool::new(false),
            bookings: AtomicU64::new(0),
            released: AtomicU64::new(0),
            started: AtomicU64::new(0),
            ttft_error: AtomicU64::new(1f64.to_bits()),
            step_error: AtomicU64::new(1f64.to_bits()),
            tpot_margin: AtomicU64::new(1f64.to_bits()),
            fit: OnceLock::new(),
            mean_prefill: AtomicU64::new(0),
            reach: Default::default(),
            seats: AtomicU64::new(0),
            engine_seats: AtomicU64::new(engine_seats),
            probe: AtomicU64::new(1),
            reported_at: AtomicU64::new(0),
            reported: AtomicBool::new(false),
            clean_bookings: AtomicU64::new(NO_CLEAN_REPORT),
            seated: AtomicU64::new(NO_CLEAN_REPORT),
            busy: AtomicBool::new(false),
            pressure: AtomicU64::new(0),
            flips: AtomicU64::new(0),
            turned_busy: Default::default(),
            line: AtomicU64::new(0),
        }
    }

    /// The load the verdict last weighed (`pressure`).
    pub(super) fn pressure(&self) -> f64 {
        // Relaxed: a hint routing compares.
        f64::from_bits(self.pressure.load(Ordering::Relaxed))
    }

    pub(super) fn coefficients(&self) -> [f64; 5] {
        // Relaxed: values published whole each; a mix of two fits is
        // benign (`slo.rs`).
        std::array::from_fn(|i| f64::from_bits(self.coefficients[i].load(Ordering::Relaxed)))
    }

    /// Publishes `fit`'s coefficients, trust and error (the maintenance's).
    pub(super) fn publish(&self, fit: &StepFit) {
        for (c, v) in self.coefficients.iter().zip(fit.coefficients()) {
            // Relaxed: each a value whole (`coefficients`).
            c.store(v.to_bits(), Ordering::Relaxed);
        }
        self.trusted.store(fit.trusted(), Ordering::Relaxed);
        for (r, v) in self.reach.iter().zip(fit.reach()) {
            // Relaxed: each a value whole.
            r.store(v.to_bits(), Ordering::Relaxed);
        }
        self.fitted.store(
            fit.samples() >= crate::slo::GUARD_SAMPLES,
            Ordering::Relaxed,
        );
        let e = fit.relative_error().to_bits();
        self.step_error.store(e, Ordering::Relaxed);
    }
}
