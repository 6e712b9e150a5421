//! Settings before the model exists (`monitor/defaults.rs`): the defaults
//! a monitor gives every new model (thresholds, flow control), read from
//! Dynamo's `DYN_ACTIVE_*` variables with its parsing, applied the moment a
//! model is created, overridden per model; a bad variable refused when the
//! monitor is built, naming it and its value.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use loadgate::flow::{FlowConfig, FlowRejection, FlowRequest};
use loadgate::monitor::{
    DispatchRequest, FlowControlConfig, ModelDefaults, ACTIVE_DECODE_BLOCKS_THRESHOLD_ENV,
    ACTIVE_PREFILL_TOKENS_THRESHOLD_ENV, ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC_ENV,
    SLO_ADVISORY_ENV, SLO_TPOT_ENV, SLO_TTFT_ENV,
};
use loadgate::slo::Slo;
use loadgate::SloMode;
use loadgate::{Limits, ManualClock, Monitor, MonitorConfig, Policy, Thresholds};
use support::monitor_fixture::{decode, spec, used, M};

fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| vars.get(name).cloned()
}

#[test]
fn dynamos_variables_are_read_as_dynamo_reads_them() {
    let d = ModelDefaults::from_lookup(lookup(&[
        (ACTIVE_DECODE_BLOCKS_THRESHOLD_ENV, " 0.85 "),
        (ACTIVE_PREFILL_TOKENS_THRESHOLD_ENV, "8192"),
        (ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC_ENV, "1.5"),
    ]))
    .unwrap();
    assert_eq!(d.thresholds.active_decode_blocks_threshold, Some(0.85));
    assert_eq!(d.thresholds.active_prefill_tokens_threshold, Some(8192));
    assert_eq!(d.thresholds.active_prefill_tokens_threshold_frac, Some(1.5));
    assert_eq!(d.flow_control, None);
    // Empty and "None" are unset, as in Dynamo; so is an absent variable.
    let d = ModelDefaults::from_lookup(lookup(&[
        (ACTIVE_DECODE_BLOCKS_THRESHOLD_ENV, ""),
        (ACTIVE_PREFILL_TOKENS_THRESHOLD_ENV, "None"),
    ]))
    .unwrap();
    assert_eq!(d, ModelDefaults::default());
}

#[test]
fn a_bad_variable_is_refused_naming_it_and_its_value() {
    for (var, value) in [
        (ACTIVE_DECODE_BLOCKS_THRESHOLD_ENV, "1.5"),
        (ACTIVE_DECODE_BLOCKS_THRESHOLD_ENV, "NaN"),
        (ACTIVE_DECODE_BLOCKS_THRESHOLD_ENV, "high"),
        (ACTIVE_PREFILL_TOKENS_THRESHOLD_ENV, "-1"),
        (ACTIVE_PREFILL_TOKENS_THRESHOLD_ENV, "2.5"),
        (ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC_ENV, "-0.5"),
        (ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC_ENV, "inf"),
    ] {
        let good = (ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC_ENV, "0.5");
        let vars = if var == good.0 {
            vec![(var, value)]
        } else {
            vec![good, (var, value)]
        };
        let e = ModelDefaults::from_lookup(lookup(&vars)).unwrap_err();
        let text = e.to_string();
        assert!(text.contains(var) && text.contains(value), "{text}");
    }
}

#[test]
fn a_new_model_starts_with_the_default_thresholds() {
    let defaults = ModelDefaults {
        thresholds: Thresholds {
            active_decode_blocks_threshold: Some(0.5),
            ..Thresholds::default()
        },
        flow_control: None,
        slo: None,
    };
    let config = MonitorConfig {
        defaults,
        ..MonitorConfig::default()
    };
    let m = Monitor::with_config(config, ManualClock::new()).unwrap();
    // The model comes with its first worker, as from discovery or NATS:
    // the busy rule holds at its first report, with no call for the model.
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.report(1, 0, &used(90)).unwrap();
    assert!(m.is_busy(1).unwrap());
    let state = m.thresholds(M).unwrap();
    assert_eq!(state.thresholds.active_decode_blocks_threshold, Some(0.5));
    // A per-model setting overrides them; a change of the defaults
    // reaches new models only.
    m.set_thresholds(M, &decode(0.95)).unwrap();
    assert!(!m.is_busy(1).unwrap());
    m.set_default_thresholds(&decode(0.8)).unwrap();
    assert_eq!(
        m.thresholds(M)
            .unwrap()
            .thresholds
            .active_decode_blocks_threshold,
        Some(0.95)
    );
    m.add_worker("other", 2, spec(1, 100)).unwrap();
    m.report(2, 0, &used(85)).unwrap();
    assert!(m.is_busy(2).unwrap());
    // A refused change leaves the defaults as they were.
    assert!(m.set_default_thresholds(&decode(2.0)).is_err());
    assert_eq!(
        m.model_defaults().thresholds.active_decode_blocks_threshold,
        Some(0.8)
    );
}

#[test]
fn a_new_model_starts_with_the_default_flow_control() {
    let flow = FlowControlConfig {
        queue: FlowConfig {
            deadline: Duration::from_secs(5),
            ..FlowConfig::new(8)
        },
        policy: Policy::RoundRobin,
    };
    let config = MonitorConfig {
        defaults: ModelDefaults {
            thresholds: Thresholds {
                active_decode_blocks_threshold: Some(0.5),
                ..Thresholds::default()
            },
            flow_control: Some(flow),
            slo: None,
        },
        ..MonitorConfig::default()
    };
    let m = Monitor::with_config(config, ManualClock::new()).unwrap();
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    m.report(1, 0, &used(90)).unwrap();
    let request = DispatchRequest {
        blocks: Some(1),
        ..DispatchRequest::new(FlowRequest::new("t"))
    };
    // It waits in the model's queue instead of being refused.
    let handle = m.dispatch_with_callback(M, &request, Box::new(drop));
    assert!(handle.is_waiting());
    // A per-model setting overrides it.
    m.set_flow_control(M, None).unwrap();
    assert!(!handle.is_waiting());
    let e = m
        .dispatch_blocking(M, &request, Some(Duration::ZERO))
        .unwrap_err();
    assert_eq!(e, FlowRejection::AllWorkersBusy);
}

#[test]
fn a_model_with_only_default_settings_can_still_be_evicted() {
    let config = MonitorConfig {
        limits: Limits {
            max_models: 1,
            ..Limits::default()
        },
        defaults: ModelDefaults {
            thresholds: Thresholds::default(),
            flow_control: Some(FlowControlConfig {
                queue: FlowConfig::new(8),
                policy: Policy::RoundRobin,
            }),
            slo: None,
        },
        ..MonitorConfig::default()
    };
    let m = Monitor::with_config(config, ManualClock::new()).unwrap();
    m.add_worker("a", 1, spec(1, 100)).unwrap();
    m.remove_worker(1).unwrap();
    // "a" has no worker and nothing of its own: "b" takes its place.
    m.add_worker("b", 2, spec(1, 100)).unwrap();
    assert!(m.thresholds("a").is_none());
    assert!(m.metrics_text().contains("queue_requests{model=\"b\"}"));
    assert!(!m.metrics_text().contains("queue_requests{model=\"a\"}"));
}

#[test]
fn invalid_defaults_are_refused_when_the_monitor_is_built() {
    let config = MonitorConfig {
        defaults: ModelDefaults {
            thresholds: Thresholds {
                active_decode_blocks_threshold: Some(7.0),
                ..Thresholds::default()
            },
            flow_control: None,
            slo: None,
        },
        ..MonitorConfig::default()
    };
    let e = Monitor::with_config(config, ManualClock::new()).unwrap_err();
    assert_eq!(e.field, "defaults.thresholds");
    let config = MonitorConfig {
        defaults: ModelDefaults {
            thresholds: Thresholds::default(),
            flow_control: Some(FlowControlConfig {
                queue: FlowConfig::new(0),
                policy: Policy::RoundRobin,
            }),
            slo: None,
        },
        ..MonitorConfig::default()
    };
    let e = Monitor::with_config(config, ManualClock::new()).unwrap_err();
    assert_eq!(e.field, "defaults.flow_control");
}

#[test]
fn the_slo_pair_is_read_and_every_new_model_starts_with_it() {
    let d = ModelDefaults::from_lookup(lookup(&[(SLO_TTFT_ENV, " 2 "), (SLO_TPOT_ENV, "0.1")]))
        .unwrap();
    let slo = Slo::from_secs(2.0, 0.1).unwrap();
    assert_eq!(d.slo, Some((slo, SloMode::Enforce)));
    let d = ModelDefaults::from_lookup(lookup(&[
        (SLO_TTFT_ENV, "2"),
        (SLO_TPOT_ENV, "0.1"),
        (SLO_ADVISORY_ENV, "true"),
    ]))
    .unwrap();
    assert_eq!(d.slo, Some((slo, SloMode::Advisory)));
    let config = MonitorConfig {
        defaults: d,
        ..MonitorConfig::default()
    };
    let m = Monitor::with_config(config, ManualClock::new()).unwrap();
    assert_eq!(m.slo(M), None);
    m.add_worker(M, 1, spec(1, 100)).unwrap();
    assert_eq!(m.slo(M), Some((slo, SloMode::Advisory)));
    // A per-model setting overrides it.
    m.set_slo(M, None, SloMode::Enforce).unwrap();
    assert_eq!(m.slo(M), None);
}

#[test]
fn a_bad_or_half_slo_pair_is_refused_naming_the_variable() {
    for (vars, named) in [
        (vec![(SLO_TTFT_ENV, "2")], SLO_TPOT_ENV),
        (vec![(SLO_TPOT_ENV, "0.1")], SLO_TTFT_ENV),
        (
            vec![(SLO_TTFT_ENV, "soon"), (SLO_TPOT_ENV, "0.1")],
            SLO_TTFT_ENV,
        ),
        (
            vec![(SLO_TTFT_ENV, "2"), (SLO_TPOT_ENV, "-1")],
            SLO_TPOT_ENV,
        ),
        (
            vec![(SLO_TTFT_ENV, "NaN"), (SLO_TPOT_ENV, "0.1")],
            SLO_TTFT_ENV,
        ),
        (
            vec![
                (SLO_TTFT_ENV, "2"),
                (SLO_TPOT_ENV, "0.1"),
                (SLO_ADVISORY_ENV, "maybe"),
            ],
            SLO_ADVISORY_ENV,
        ),
    ] {
        let e = ModelDefaults::from_lookup(lookup(&vars)).unwrap_err();
        assert!(e.to_string().contains(named), "{e} for {vars:?}");
    }
}
