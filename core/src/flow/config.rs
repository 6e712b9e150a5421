//! A model's flow-control settings, checked before a queue is built.

use std::fmt;
use std::time::Duration;

use crate::limits::DEFAULT_MAX_NAME_LEN;

/// Priority bands a queue keeps apart: priority 0 is the most important, and
/// a priority past the last band counts as the last (as the gate's classes).
pub const MAX_BANDS: usize = 8;
/// Most requests one model's queue may hold.
pub const MAX_FLOW_QUEUE: u32 = 1 << 20;
/// Default [`FlowConfig::deadline`]: llm-d's default request TTL.
pub const DEFAULT_FLOW_DEADLINE: Duration = Duration::from_secs(60);
/// Longest deadline a request may ask for; a longer one is cut to it.
pub const MAX_FLOW_DEADLINE: Duration = Duration::from_secs(3600);
/// Default [`FlowConfig::output_estimate`]: the output tokens reserved for a
/// request that gives no `max_tokens`. A setting, not a measurement: set it
/// to the fleet's typical output length.
pub const DEFAULT_OUTPUT_ESTIMATE: u64 = 256;
/// Smallest weight (of tokens or of a tenant): with the largest, a charge
/// stays finite whatever the token counts.
pub const MIN_WEIGHT: f64 = 1e-6;
/// Largest weight (of tokens or of a tenant).
pub const MAX_WEIGHT: f64 = 1e6;
const WEIGHT_RANGE: &str = "a number from 0.000001 to 1000000";
/// Default [`FlowConfig::max_tenants`].
pub const DEFAULT_MAX_TENANTS: usize = 4096;
/// Largest [`FlowConfig::max_tenants`].
pub const MAX_TENANTS_CEILING: usize = 1 << 20;

/// How one model's frontend queue behaves (docs/flow-control.md).
#[derive(Debug, Clone, PartialEq)]
pub struct FlowConfig {
    /// Most requests waiting (1 to [`MAX_FLOW_QUEUE`]).
    pub queue_limit: u32,
    /// Most estimated tokens waiting (prompt plus reserved output, summed
    /// over the queue); `None` for no token bound.
    pub queue_tokens: Option<u64>,
    /// How long a request waits unless it gives its own deadline (positive,
    /// at most [`MAX_FLOW_DEADLINE`]).
    pub deadline: Duration,
    /// VTC's `w_p`: what a prompt token costs its tenant ([`MIN_WEIGHT`]
    /// to [`MAX_WEIGHT`]).
    pub prompt_weight: f64,
    /// VTC's `w_q`: what an output token costs its tenant ([`MIN_WEIGHT`]
    /// to [`MAX_WEIGHT`]).
    pub output_weight: f64,
    /// Output tokens reserved for a request without `max_tokens`.
    pub output_estimate: u64,
    /// Tenants' weights ([`MIN_WEIGHT`] to [`MAX_WEIGHT`]; 1 for a tenant
    /// not named): a tenant
    /// of weight 2 is charged half as much for the same tokens, so it gets
    /// twice the service while both are backlogged.
    pub tenant_weights: Vec<(String, f64)>,
    /// Most tenants the queue remembers (1 to [`MAX_TENANTS_CEILING`]).
    pub max_tenants: usize,
    /// Most requests that may wait while the model has no workers, for one
    /// to join (at most `queue_limit`); 0 refuses them at once with
    /// `no_workers`.
    pub scale_up_limit: u32,
}

impl FlowConfig {
    /// A queue of `queue_limit` requests with every other setting at its
    /// default: no token bound, a 60 s deadline, weights 1 and 2, no wait
    /// for a worker to join.
    pub fn new(queue_limit: u32) -> Self {
        Self {
            queue_limit,
            queue_tokens: None,
            deadline: DEFAULT_FLOW_DEADLINE,
            prompt_weight: 1.0,
            output_weight: 2.0,
            output_estimate: DEFAULT_OUTPUT_ESTIMATE,
            tenant_weights: Vec::new(),
            max_tenants: DEFAULT_MAX_TENANTS,
            scale_up_limit: 0,
        }
    }

    /// Checks every field; a queue is built only from a valid config.
    pub fn validate(&self) -> Result<(), FlowConfigError> {
        let range = |field, ok: bool, expected| {
            if ok {
                Ok(())
            } else {
                Err(FlowConfigError::Invalid { field, expected })
            }
        };
        let weight = |w: f64| (MIN_WEIGHT..=MAX_WEIGHT).contains(&w);
        range(
            "queue_limit",
            (1..=MAX_FLOW_QUEUE).contains(&self.queue_limit),
            "an integer from 1 to 1048576",
        )?;
        range(
            "queue_tokens",
            self.queue_tokens != Some(0),
            "a positive number of tokens, or None",
        )?;
        range(
            "deadline",
            !self.deadline.is_zero() && self.deadline <= MAX_FLOW_DEADLINE,
            "a positive duration of at most 3600 s",
        )?;
        range("prompt_weight", weight(self.prompt_weight), WEIGHT_RANGE)?;
        range("output_weight", weight(self.output_weight), WEIGHT_RANGE)?;
        range(
            "max_tenants",
            (1..=MAX_TENANTS_CEILING).contains(&self.max_tenants),
            "an integer from 1 to 1048576",
        )?;
        range(
            "scale_up_limit",
            self.scale_up_limit <= self.queue_limit,
            "an integer from 0 to queue_limit",
        )?;
        range(
            "tenant_weights",
            self.tenant_weights.len() <= self.max_tenants,
            "at most max_tenants entries",
        )?;
        for (name, w) in &self.tenant_weights {
            if name.len() > DEFAULT_MAX_NAME_LEN {
                return Err(FlowConfigError::TenantName(name.len()));
            }
            if !weight(*w) {
                return Err(FlowConfigError::TenantWeight(name.clone()));
            }
        }
        Ok(())
    }
}

/// A flow-control configuration that was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlowConfigError {
    /// A setting is out of range.
    Invalid {
        /// The setting's name.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// A tenant's weight is out of range.
    TenantWeight(String),
    /// A tenant's name is longer than 256 bytes (its length).
    TenantName(usize),
}

impl fmt::Display for FlowConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid { field, expected } => write!(f, "{field} must be {expected}"),
            Self::TenantWeight(name) => {
                write!(f, "tenant_weights[{name:?}] must be {WEIGHT_RANGE}")
            }
            Self::TenantName(len) => write!(
                f,
                "a tenant name of {len} bytes is too long: at most {DEFAULT_MAX_NAME_LEN}"
            ),
        }
    }
}

impl std::error::Error for FlowConfigError {}
