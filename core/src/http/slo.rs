//! `GET`/`POST /slo` as a pure function of the request: a model's SLO set,
//! read or cleared at run time (`Monitor::set_slo`), beside
//! `/busy_threshold`, with its request and answer types, its bearer token
//! and its refusals in the same order (405, 415, 413, 400, 422, then 400
//! for a value out of range and 404 for a write to an unknown model).
//!
//! * `GET`/`HEAD` → 200 `{"slos": [{model, ttft, tpot, advisory,
//!   would_admit, would_queue, would_refuse, refused_late}, …]}` for every model (`null` targets:
//!   none).
//! * `POST {model}` → that model's, a read; `POST {model, ttft, tpot,
//!   advisory?}` sets it (seconds; both or neither); `POST {model,
//!   clear: true}` clears it. A write answers with the model's SLO after
//!   it.

use serde::{Deserialize, Serialize};

use super::auth::ControlAuth;
use super::busy_threshold::{authorize, check_post, read_json, respond, Refusal};
use super::{BusyThresholdRequest, BusyThresholdResponse};
use crate::error::ThresholdError;
use crate::monitor::{Monitor, SloMode};
use crate::slo::Slo;

/// Serves `/slo` (module docs), checking a write's bearer token against
/// `auth` as [`serve_busy_threshold`](super::serve_busy_threshold) does.
pub fn serve_slo(
    monitor: &Monitor,
    auth: Option<&ControlAuth>,
    request: &BusyThresholdRequest<'_>,
) -> BusyThresholdResponse {
    respond(serve(monitor, auth, request))
}

/// A `POST /slo` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SloRequest {
    model: String,
    ttft: Option<f64>,
    tpot: Option<f64>,
    advisory: Option<bool>,
    #[serde(default)]
    clear: bool,
}

/// One model's SLO.
#[derive(Serialize)]
struct SloAnswer<'a> {
    model: &'a str,
    ttft: Option<f64>,
    tpot: Option<f64>,
    advisory: Option<bool>,
    would_admit: u64,
    would_queue: u64,
    would_refuse: u64,
    refused_late: u64,
}

impl<'a> SloAnswer<'a> {
    fn new(monitor: &Monitor, model: &'a str) -> Self {
        let slo = monitor.slo(model);
        let counts = monitor.slo_counts(model).unwrap_or_default();
        SloAnswer {
            model,
            ttft: slo.map(|(s, _)| s.ttft.as_secs_f64()),
            tpot: slo.map(|(s, _)| s.tpot.as_secs_f64()),
            advisory: slo.map(|(_, mode)| mode == SloMode::Advisory),
            would_admit: counts.would_admit,
            would_queue: counts.would_queue,
            would_refuse: counts.would_refuse,
            refused_late: counts.refused_late,
        }
    }
}

#[derive(Serialize)]
struct SloList<'a> {
    slos: Vec<SloAnswer<'a>>,
}

fn to_json(value: &impl Serialize) -> String {
    serde_json::to_string(value).expect("SLO answers serialize")
}

fn serve(
    monitor: &Monitor,
    auth: Option<&ControlAuth>,
    request: &BusyThresholdRequest<'_>,
) -> Result<String, Refusal> {
    let protect_reads = auth.is_some_and(ControlAuth::protect_reads);
    if protect_reads {
        authorize(auth, request.authorization)?;
    }
    match request.method.to_ascii_uppercase().as_str() {
        "GET" | "HEAD" => {
            let models = monitor.models();
            let slos = models.iter().map(|m| SloAnswer::new(monitor, m)).collect();
            Ok(to_json(&SloList { slos }))
        }
        "POST" => {
            check_post(request.content_type, request.body)?;
            let r: SloRequest = read_json(request.body)?;
            let setting = match (r.ttft, r.tpot, r.clear) {
                (None, None, false) if r.advisory.is_none() => {
                    return Ok(to_json(&SloAnswer::new(monitor, &r.model)))
                }
                (None, None, true) => None,
                (Some(ttft), Some(tpot), false) => Some(
                    Slo::from_secs(ttft, tpot).map_err(|e| Refusal::Json(400, e.to_string()))?,
                ),
                _ => {
                    let message = "set ttft and tpot together (seconds), or clear: true alone";
                    return Err(Refusal::Json(400, message.to_owned()));
                }
            };
            if !protect_reads {
                authorize(auth, request.authorization)?;
            }
            let mode = if r.advisory == Some(true) {
                SloMode::Advisory
            } else {
                SloMode::Enforce
            };
            match monitor.set_slo(&r.model, setting, mode) {
                Ok(()) => Ok(to_json(&SloAnswer::new(monitor, &r.model))),
                Err(ThresholdError::UnknownModel(model)) => Err(Refusal::Json(
                    404,
                    format!(
                        "Model '{model}' not found. An SLO can only be set for discovered models."
                    ),
                )),
                Err(e) => Err(Refusal::Json(400, e.to_string())),
            }
        }
        _ => Err(Refusal::Method),
    }
}
