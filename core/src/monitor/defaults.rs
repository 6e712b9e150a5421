//! Settings every model starts with: the thresholds, the flow control and
//! the SLO a model has the moment it is created (its first worker,
//! discovered or added; or its first `Route`), before any code of the host
//! noticed it. Per-model settings (`set_thresholds`, `set_flow_control`,
//! `set_slo`) override them.
//!
//! Dynamo's frontend applies its threshold flags to every model the same
//! way; [`ModelDefaults::from_env`] reads the same environment variables
//! it does, with its parsing: trimmed, and `""` or `None` for unset.

use std::sync::Arc;

use super::flow::{FlowControl, FlowControlConfig, FlowError};
use super::model::Model;
use super::SloMode;
use super::{Monitor, MonitorConfigError};
use crate::error::ThresholdError;
use crate::slo::Slo;
use crate::sync::{lock, Ordering};
use crate::thresholds::{ThresholdUpdate, Thresholds};

/// Dynamo's variable for the decode threshold: a fraction from 0 to 1.
pub const ACTIVE_DECODE_BLOCKS_THRESHOLD_ENV: &str = "DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD";
/// Dynamo's variable for the absolute prefill threshold: tokens, an integer
/// of at least 0.
pub const ACTIVE_PREFILL_TOKENS_THRESHOLD_ENV: &str = "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD";
/// Dynamo's variable for the fractional prefill threshold: a finite number
/// of at least 0 (of `max_num_batched_tokens`).
pub const ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC_ENV: &str =
    "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC";

/// loadgate's variable for a default SLO's time to first token, seconds
/// (set with [`SLO_TPOT_ENV`], or neither).
pub const SLO_TTFT_ENV: &str = "LOADGATE_SLO_TTFT";
/// loadgate's variable for a default SLO's time per output token, seconds.
pub const SLO_TPOT_ENV: &str = "LOADGATE_SLO_TPOT";
/// loadgate's variable for a default SLO's mode: `advisory` (or `1`,
/// `true`) only shows its verdicts; `enforce` (or `0`, `false`, unset)
/// acts on them.
pub const SLO_ADVISORY_ENV: &str = "LOADGATE_SLO_ADVISORY";

/// What a new model starts with (module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelDefaults {
    /// Its thresholds.
    pub thresholds: Thresholds,
    /// Its flow control, if any.
    pub flow_control: Option<FlowControlConfig>,
    /// Its SLO and the SLO's mode, if any (`Monitor::set_slo`).
    pub slo: Option<(Slo, SloMode)>,
}

impl ModelDefaults {
    /// The thresholds of Dynamo's `DYN_ACTIVE_*` variables
    /// ([`ACTIVE_DECODE_BLOCKS_THRESHOLD_ENV`] and the two prefill ones),
    /// the SLO of [`SLO_TTFT_ENV`] and [`SLO_TPOT_ENV`] (both or neither,
    /// in the mode of [`SLO_ADVISORY_ENV`]); no flow control. A variable
    /// that is set but malformed or out of range is an error naming it and
    /// its value.
    pub fn from_env() -> Result<Self, MonitorConfigError> {
        Self::from_lookup(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// [`from_env`](Self::from_env) over any variable lookup.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, MonitorConfigError> {
        let read = |var: &'static str| -> Option<(String, &'static str)> {
            let raw = lookup(var)?;
            let value = raw.trim();
            (!value.is_empty() && value != "None").then(|| (value.to_owned(), var))
        };
        let bad = |var: &'static str, value: &str, expected: &str| MonitorConfigError {
            field: var,
            problem: format!("{value:?} is not {expected}"),
        };
        let mut thresholds = Thresholds::default();
        if let Some((v, var)) = read(ACTIVE_DECODE_BLOCKS_THRESHOLD_ENV) {
            let t = v
                .parse::<f64>()
                .ok()
                .filter(|t| t.is_finite() && (0.0..=1.0).contains(t));
            thresholds.active_decode_blocks_threshold =
                Some(t.ok_or_else(|| bad(var, &v, "a number from 0.0 to 1.0"))?);
        }
        if let Some((v, var)) = read(ACTIVE_PREFILL_TOKENS_THRESHOLD_ENV) {
            let t = v.parse::<u64>().ok();
            thresholds.active_prefill_tokens_threshold =
                Some(t.ok_or_else(|| bad(var, &v, "an integer of at least 0"))?);
        }
        if let Some((v, var)) = read(ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC_ENV) {
            let t = v.parse::<f64>().ok().filter(|t| t.is_finite() && *t >= 0.0);
            thresholds.active_prefill_tokens_threshold_frac =
                Some(t.ok_or_else(|| bad(var, &v, "a finite number of at least 0"))?);
        }
        let slo = match (read(SLO_TTFT_ENV), read(SLO_TPOT_ENV)) {
            (None, None) => None,
            (Some((ttft, _)), Some((tpot, _))) => {
                let seconds = |v: &str, var| {
                    v.parse::<f64>()
                        .map_err(|_| bad(var, v, "a number of seconds"))
                };
                let slo =
                    Slo::from_secs(seconds(&ttft, SLO_TTFT_ENV)?, seconds(&tpot, SLO_TPOT_ENV)?)
                        .map_err(|e| MonitorConfigError {
                            field: match e {
                                crate::slo::SloError::OutOfRange { field: "ttft", .. } => {
                                    SLO_TTFT_ENV
                                }
                                _ => SLO_TPOT_ENV,
                            },
                            problem: e.to_string(),
                        })?;
                let mode = match read(SLO_ADVISORY_ENV) {
                    None => SloMode::Enforce,
                    Some((v, var)) => match v.to_ascii_lowercase().as_str() {
                        "1" | "true" | "advisory" => SloMode::Advisory,
                        "0" | "false" | "enforce" => SloMode::Enforce,
                        _ => return Err(bad(var, &v, "advisory or enforce")),
                    },
                };
                Some((slo, mode))
            }
            (Some((_, set)), None) | (None, Some((_, set))) => {
                let missing = if set == SLO_TTFT_ENV {
                    SLO_TPOT_ENV
                } else {
                    SLO_TTFT_ENV
                };
                return Err(MonitorConfigError {
                    field: missing,
                    problem: format!("is unset while {set} is set: an SLO needs both"),
                });
            }
        };
        Ok(Self {
            thresholds,
            flow_control: None,
            slo,
        })
    }

    /// The first setting that is refused, if any.
    pub(super) fn validate(&self) -> Result<(), MonitorConfigError> {
        Thresholds::default()
            .merged(&as_update(&self.thresholds))
            .map_err(|e| MonitorConfigError {
                field: "defaults.thresholds",
                problem: e.to_string(),
            })?;
        if let Some(flow) = &self.flow_control {
            flow.queue.validate().map_err(|e| MonitorConfigError {
                field: "defaults.flow_control",
                problem: e.to_string(),
            })?;
        }
        Ok(())
    }
}

impl Monitor {
    /// Sets the thresholds new models start with (an update applied to the
    /// current defaults; an empty one is a read). Models that exist keep
    /// theirs. A refused update changes nothing.
    pub fn set_default_thresholds(
        &self,
        update: &ThresholdUpdate,
    ) -> Result<Thresholds, ThresholdError> {
        let mut defaults = lock(&self.defaults);
        let merged = defaults.thresholds.merged(update)?;
        defaults.thresholds = merged;
        Ok(merged)
    }

    /// Sets the flow control new models start with (`None`: none). Models
    /// that exist keep theirs. A refused config changes nothing.
    pub fn set_default_flow_control(
        &self,
        config: Option<&FlowControlConfig>,
    ) -> Result<(), FlowError> {
        if let Some(c) = config {
            c.queue.validate().map_err(FlowError::Config)?;
        }
        lock(&self.defaults).flow_control = config.cloned();
        Ok(())
    }

    /// The settings new models start with.
    pub fn model_defaults(&self) -> ModelDefaults {
        lock(&self.defaults).clone()
    }

    /// A new model named `name`, with the defaults applied: its thresholds
    /// set, and its queue (if any) in the map of queues before the model
    /// can be found. The caller holds the writer lock and publishes the
    /// model.
    pub(super) fn create_model(&self, name: &str) -> Arc<Model> {
        let m = Arc::new(Model::new(
            name,
            &self.config,
            &self.share,
            (&self.outbox, &self.observations),
            &self.duty.signal,
        ));
        let defaults = lock(&self.defaults).clone();
        if defaults.thresholds.any() {
            m.thresholds.store(&defaults.thresholds);
            lock(&m.cold).thresholds.thresholds = defaults.thresholds;
        }
        if let Some((slo, mode)) = defaults.slo {
            self.store_slo(&m, Some(slo), mode);
        }
        if let Some(config) = &defaults.flow_control {
            let mut flow = FlowControl::new(Arc::clone(&m), &config.queue, config.policy)
                .expect("defaults are validated when set");
            flow.from_defaults = true;
            self.duty.start();
            let mut next = std::collections::HashMap::clone(&self.flows.load());
            next.insert(name.into(), Arc::new(flow));
            // Relaxed: a setting, stored before the model is published.
            m.flow_on.store(true, Ordering::Relaxed);
            self.flows.store(Arc::new(next));
        }
        m
    }

    /// Drops model `name`'s queue, if it came from the defaults (an evicted
    /// model: nothing waits in it).
    pub(super) fn drop_default_queue(&self, name: &str) {
        let mut next = std::collections::HashMap::clone(&self.flows.load());
        if let Some(old) = next.remove(name) {
            self.flows.store(Arc::new(next));
            old.close(crate::flow::FlowRejection::QueueFull);
        }
    }
}

/// `t` as the update that sets it on no thresholds.
fn as_update(t: &Thresholds) -> ThresholdUpdate {
    ThresholdUpdate {
        active_decode_blocks_threshold: t.active_decode_blocks_threshold,
        active_prefill_tokens_threshold: t.active_prefill_tokens_threshold,
        active_prefill_tokens_threshold_frac: t.active_prefill_tokens_threshold_frac,
        waiting_requests_threshold: t.waiting_requests_threshold,
        ..ThresholdUpdate::default()
    }
}
