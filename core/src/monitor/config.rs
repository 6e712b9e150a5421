//! The monitor's settings and the small public types its API speaks:
//! [`MonitorConfig`] (checked by `Monitor::with_config`), [`Policy`],
//! [`Staleness`] and [`ThresholdState`]. No atomics here.

use std::fmt;
use std::time::Duration;

use crate::limits::Limits;
use crate::metrics;
use crate::thresholds::Thresholds;

pub use crate::thresholds::DEFAULT_BLOCK_TOKENS;

/// Endpoint label used when the caller names none.
pub const DEFAULT_ENDPOINT: &str = "generate";

/// Routing policy for [`Monitor::select`](super::Monitor::select).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Each eligible worker in turn (approximate under concurrent selects).
    #[default]
    RoundRobin,
    /// Uniformly random among eligible workers.
    Random,
    /// Two random eligible workers; the less loaded one wins.
    PowerOfTwo,
}

impl Policy {
    /// Parses `round_robin`, `random` or `power_of_two` (also `p2c`).
    pub fn from_name(name: &str) -> Option<Policy> {
        match name {
            "round_robin" => Some(Policy::RoundRobin),
            "random" => Some(Policy::Random),
            "power_of_two" | "p2c" => Some(Policy::PowerOfTwo),
            _ => None,
        }
    }
}

/// What a rank that stopped reporting counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Staleness {
    /// Keep its last values (the reference behaviour).
    #[default]
    Keep,
    /// Count it as free once silent for `stale_after`.
    Free,
    /// Count it as busy once silent for `stale_after`.
    Busy,
}

impl Staleness {
    /// Parses `keep`, `free` or `busy`.
    pub fn from_name(name: &str) -> Option<Staleness> {
        match name {
            "keep" => Some(Staleness::Keep),
            "free" => Some(Staleness::Free),
            "busy" => Some(Staleness::Busy),
            _ => None,
        }
    }

    /// The policy as a word for an atomic.
    pub(super) fn to_u64(self) -> u64 {
        self as u64
    }

    /// The inverse of [`to_u64`](Self::to_u64).
    pub(super) fn from_u64(v: u64) -> Staleness {
        match v {
            1 => Staleness::Free,
            2 => Staleness::Busy,
            _ => Staleness::Keep,
        }
    }
}

/// Who does the monitor's maintenance: dispatching queued requests when
/// workers free up, queue deadlines, staleness sweeps, lease ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Maintenance {
    /// A thread of the monitor's own, started by the first setting that
    /// needs it and ended with the monitor.
    #[default]
    Background,
    /// The host, by calling `Monitor::maintain` (a simulation that owns
    /// time; nothing happens between its calls).
    Manual,
}

impl Maintenance {
    /// Parses `background` or `manual`.
    pub fn from_name(name: &str) -> Option<Maintenance> {
        match name {
            "background" => Some(Maintenance::Background),
            "manual" => Some(Maintenance::Manual),
            _ => None,
        }
    }
}

/// Monitor settings.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// How long a worker that refused with "Server overloaded" is skipped.
    pub lease: Duration,
    /// Default staleness policy of new models.
    pub staleness: Staleness,
    /// Silence after which a rank is stale.
    pub stale_after: Duration,
    /// Bounds on models, workers, ranks and names (see [`Limits`]).
    pub limits: Limits,
    /// Metric name prefix.
    pub metrics_prefix: String,
    /// Who does the maintenance.
    pub maintenance: Maintenance,
    /// What every model starts with (`defaults.rs`); later changes through
    /// `Monitor::set_default_thresholds` and `set_default_flow_control`.
    pub defaults: super::ModelDefaults,
    /// How `Monitor::dispatch` picks a worker for a model without flow
    /// control (a model with flow control picks by its queue's policy).
    pub routing: Policy,
    /// How many times `Monitor::redispatch` routes a request again to
    /// another worker after workers refused it, for a model without flow
    /// control (at most [`MAX_REROUTES`]); then it is refused. With flow
    /// control the request goes back into the queue instead.
    pub reroutes: u32,
}

/// Most reroutes a monitor may be set to (`MonitorConfig::reroutes`).
pub const MAX_REROUTES: u32 = 16;

impl Default for MonitorConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(1),
            staleness: Staleness::Keep,
            stale_after: Duration::from_secs(3),
            limits: Limits::default(),
            metrics_prefix: metrics::DEFAULT_PREFIX.to_owned(),
            maintenance: Maintenance::Background,
            defaults: super::ModelDefaults::default(),
            routing: Policy::RoundRobin,
            reroutes: 1,
        }
    }
}

impl MonitorConfig {
    /// The first setting a monitor refuses, if any.
    pub(super) fn validate(&self) -> Result<(), MonitorConfigError> {
        let err = |field, problem: &str| MonitorConfigError {
            field,
            problem: problem.to_owned(),
        };
        if let Some((field, problem)) = self.limits.invalid_field() {
            return Err(err(field, problem));
        }
        if self.lease.is_zero() {
            return Err(err("lease", "must be longer than zero"));
        }
        if self.stale_after.is_zero() {
            return Err(err("stale_after", "must be longer than zero"));
        }
        if self.reroutes > MAX_REROUTES {
            return Err(err("reroutes", "must be at most 16"));
        }
        if !metrics::valid_prefix(&self.metrics_prefix) {
            return Err(err("metrics_prefix", "must match [a-zA-Z_:][a-zA-Z0-9_:]*"));
        }
        self.defaults.validate()
    }
}

/// A monitor setting that was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorConfigError {
    /// The setting.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl fmt::Display for MonitorConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid monitor setting {}: {}",
            self.field, self.problem
        )
    }
}

impl std::error::Error for MonitorConfigError {}

/// A model's thresholds and the version of the last update.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ThresholdState {
    /// The thresholds in force.
    pub thresholds: Thresholds,
    /// Bumped by every update; 0 before the first.
    pub version: u64,
}
