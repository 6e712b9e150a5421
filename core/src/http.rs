//! HTTP glue without a server: status codes, error bodies, headers, and the
//! `/busy_threshold` handler as a pure function any server can mount.
//!
//! * [`overload_status`] reads `DYN_HTTP_OVERLOAD_STATUS_CODE` once and caches
//!   it; [`parse_overload_status`] is the pure rule (trimmed; a status in
//!   `100..=999` that is not 1xx is kept; anything else means 529).
//! * [`error_response`] builds the status, JSON body (dynamo, openai or
//!   anthropic shape) and headers (`Retry-After`, `x-loadgate-reason`) for a
//!   rejection.
//! * [`handle_busy_threshold`] maps (method, content type, body) to
//!   (status, JSON body) for `GET`/`POST /busy_threshold`;
//!   [`serve_busy_threshold`] does the same for a request that also carries
//!   its `Authorization` header, checks it against an optional
//!   [`ControlAuth`] bearer token, and returns the headers to send too
//!   (`WWW-Authenticate: Bearer` with a 401, `Allow` with a 405).

mod auth;

use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::error::{Reason, ThresholdError};
use crate::monitor::{Monitor, ThresholdState};
use crate::thresholds::{ThresholdField, ThresholdUpdate};

pub use crate::status::{
    is_status_code, overload_status, parse_overload_status, DEFAULT_OVERLOAD_STATUS,
    OVERLOAD_STATUS_ENV, STATUS_CODES,
};
pub use auth::{AuthFailure, ControlAuth, ControlAuthError, BEARER_CHALLENGE};

/// Header carrying the machine-readable rejection reason.
pub const REASON_HEADER: &str = "x-loadgate-reason";
/// Largest `/busy_threshold` body accepted.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// The `Allow` header value sent with a 405 from `/busy_threshold`.
pub const BUSY_THRESHOLD_METHODS: &str = "GET, HEAD, POST";

/// The message of the `dynamo` style's overload body (Dynamo 1.6.1's, for
/// every kind of overload).
pub const OVERLOADED_MESSAGE: &str = "Service temporarily overloaded";

/// The message of every style's unavailable (503) body.
pub const UNAVAILABLE_MESSAGE: &str = "Service temporarily unavailable";

/// The `dynamo` style's flat body, its keys in Dynamo's order.
#[derive(serde::Serialize)]
struct FlatBody {
    message: &'static str,
    #[serde(rename = "type")]
    kind: &'static str,
    code: u16,
}

/// The shape of an error body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorStyle {
    /// `{"message", "type", "code"}` (the reference's flat shape, byte for
    /// byte as Dynamo 1.6.1 writes it: "Service temporarily overloaded" /
    /// "Overloaded" for every overload, "Service temporarily unavailable" /
    /// "Service Unavailable" for 503).
    #[default]
    Dynamo,
    /// `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}}`.
    Anthropic,
}

impl ErrorStyle {
    /// Every style, in a stable order.
    pub const ALL: [ErrorStyle; 3] = [
        ErrorStyle::Dynamo,
        ErrorStyle::OpenAi,
        ErrorStyle::Anthropic,
    ];

    /// The name bindings take: `dynamo`, `openai` or `anthropic`.
    pub const fn name(self) -> &'static str {
        match self {
            ErrorStyle::Dynamo => "dynamo",
            ErrorStyle::OpenAi => "openai",
            ErrorStyle::Anthropic => "anthropic",
        }
    }

    /// Parses `dynamo`, `openai` or `anthropic`.
    pub fn from_name(name: &str) -> Option<ErrorStyle> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// A complete HTTP error answer for a rejection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorResponse {
    /// HTTP status (the overload status, or 503).
    pub status: u16,
    /// JSON body.
    pub body: String,
    /// `Retry-After` and the reason header.
    pub headers: Vec<(&'static str, String)>,
}

/// `Retry-After` in whole seconds, rounded up, at least 1.
pub fn retry_after_seconds(retry_after: Duration) -> u64 {
    let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    secs.max(1)
}

/// The answer for a rejection with the process's overload status.
pub fn error_response(reason: Reason, style: ErrorStyle, retry_after: Duration) -> ErrorResponse {
    error_response_with_status(reason, style, retry_after, reason.http_status())
}

/// The answer for a rejection with an explicit status (for tests and for
/// servers that choose their own overload code).
pub fn error_response_with_status(
    reason: Reason,
    style: ErrorStyle,
    retry_after: Duration,
    status: u16,
) -> ErrorResponse {
    let overload = reason.is_overload();
    let message = if overload {
        reason.message()
    } else {
        UNAVAILABLE_MESSAGE
    };
    let body = match style {
        // Dynamo 1.6.1's bytes: these three keys in this order, one text for
        // every overload (the reason travels in `x-loadgate-reason`).
        ErrorStyle::Dynamo => {
            let flat = if overload {
                FlatBody {
                    message: OVERLOADED_MESSAGE,
                    kind: "Overloaded",
                    code: status,
                }
            } else {
                FlatBody {
                    message: UNAVAILABLE_MESSAGE,
                    kind: "Service Unavailable",
                    code: status,
                }
            };
            return finish(
                status,
                serde_json::to_string(&flat).expect("a flat body serializes"),
                reason,
                retry_after,
            );
        }
        ErrorStyle::OpenAi => json!({
            "error": {
                "message": message,
                "type": if overload { "overloaded_error" } else { "service_unavailable" },
                "param": null,
                "code": reason.as_str(),
            }
        }),
        ErrorStyle::Anthropic => json!({
            "type": "error",
            "error": {
                "type": if overload { "overloaded_error" } else { "api_error" },
                "message": message,
            }
        }),
    };
    finish(status, body.to_string(), reason, retry_after)
}

/// An answer with its `Retry-After` and reason headers.
fn finish(status: u16, body: String, reason: Reason, retry_after: Duration) -> ErrorResponse {
    ErrorResponse {
        status,
        body,
        headers: vec![
            ("retry-after", retry_after_seconds(retry_after).to_string()),
            (REASON_HEADER, reason.as_str().to_owned()),
        ],
    }
}

/// Serves `/busy_threshold` without authentication: (method, content type,
/// body) to (status, JSON body). The same as [`serve_busy_threshold`] with no
/// [`ControlAuth`], less the headers.
///
/// * `GET` → 200 `{"thresholds": [{model, fields…, version}, …]}` for every model.
/// * `POST` with `{model, active_decode_blocks_threshold?,
///   active_prefill_tokens_threshold?, active_prefill_tokens_threshold_frac?,
///   waiting_requests_threshold?, clear?: [names]}`: all thresholds
///   null/absent and no `clear` → a read (200; all-null and version 0 for an
///   unknown model); otherwise an update (200 echoing model, all four fields
///   and `version`).
/// * Errors, as `{"error": "..."}`: 404 set on an unknown model, 400 invalid
///   value or malformed JSON, 422 wrong types or missing model, 415 non-JSON
///   content type, 413 body over 64 KiB, 405 any other method.
pub fn handle_busy_threshold(
    monitor: &Monitor,
    method: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> (u16, String) {
    let request = BusyThresholdRequest {
        method,
        content_type,
        authorization: None,
        body,
    };
    let response = serve_busy_threshold(monitor, None, &request);
    (response.status, response.body)
}

/// One `/busy_threshold` request, as a server received it.
#[derive(Debug, Clone, Copy, Default)]
pub struct BusyThresholdRequest<'a> {
    /// The method, in any case (`GET`, `HEAD`, `POST`; others get 405).
    pub method: &'a str,
    /// The `Content-Type` header's value, `None` when absent.
    pub content_type: Option<&'a str>,
    /// The `Authorization` header's value, `None` when absent.
    pub authorization: Option<&'a str>,
    /// The body (ignored unless the method is `POST`).
    pub body: &'a [u8],
}

/// The complete answer to a `/busy_threshold` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusyThresholdResponse {
    /// HTTP status.
    pub status: u16,
    /// JSON body (`Content-Type: application/json`).
    pub body: String,
    /// Headers to send besides the content type and length, names in lower
    /// case: `www-authenticate: Bearer` with a 401 and
    /// `allow: GET, HEAD, POST` with a 405; none otherwise.
    pub headers: Vec<(&'static str, &'static str)>,
}

/// Serves `/busy_threshold`, checking the request's bearer token against
/// `auth` (`None`: no authentication, as [`handle_busy_threshold`]).
///
/// With a token configured, a write (a `POST` that sets or clears a
/// threshold) without `Authorization: Bearer <token>` is answered with 401
/// `{"error": "missing bearer token…"}` or `{"error": "invalid bearer
/// token"}` and changes nothing (no threshold, no version). Reads (`GET`,
/// `HEAD`, a `POST` that only reads) and requests refused before any state
/// is touched (405, 415, 413, 400, 422) are answered without the token,
/// unless [`ControlAuth::protect_reads`] is set: then every request needs
/// it, and is checked before anything else. Everything else is as
/// [`handle_busy_threshold`] describes.
pub fn serve_busy_threshold(
    monitor: &Monitor,
    auth: Option<&ControlAuth>,
    request: &BusyThresholdRequest<'_>,
) -> BusyThresholdResponse {
    let (status, body) = match serve(monitor, auth, request) {
        Ok(v) => (200, v.to_string()),
        Err((status, message)) => (status, json!({ "error": message }).to_string()),
    };
    let headers = match status {
        401 => vec![("www-authenticate", BEARER_CHALLENGE)],
        405 => vec![("allow", BUSY_THRESHOLD_METHODS)],
        _ => Vec::new(),
    };
    BusyThresholdResponse {
        status,
        body,
        headers,
    }
}

/// 401 unless `auth` is absent or accepts `authorization`.
fn authorize(auth: Option<&ControlAuth>, authorization: Option<&str>) -> Result<(), HttpError> {
    match auth {
        None => Ok(()),
        Some(auth) => auth
            .verify(authorization)
            .map_err(|failure| (401, failure.message().to_owned())),
    }
}

fn serve(
    monitor: &Monitor,
    auth: Option<&ControlAuth>,
    request: &BusyThresholdRequest<'_>,
) -> Result<Value, HttpError> {
    let protect_reads = auth.is_some_and(ControlAuth::protect_reads);
    if protect_reads {
        authorize(auth, request.authorization)?;
    }
    match request.method.to_ascii_uppercase().as_str() {
        "GET" | "HEAD" => {
            let list: Vec<Value> = monitor
                .models()
                .into_iter()
                .map(|m| {
                    let state = monitor.thresholds(&m).unwrap_or_default();
                    threshold_json(&m, &state)
                })
                .collect();
            Ok(json!({ "thresholds": list }))
        }
        "POST" => {
            let (model, update) = parse_post(request.content_type, request.body)?;
            if update.is_empty() {
                let state = monitor.thresholds(&model).unwrap_or_default();
                return Ok(threshold_json(&model, &state));
            }
            if !protect_reads {
                authorize(auth, request.authorization)?;
            }
            match monitor.set_thresholds(&model, &update) {
                Ok(state) => Ok(threshold_json(&model, &state)),
                Err(e @ ThresholdError::UnknownModel(_)) => Err((404, e.to_string())),
                Err(e) => Err((400, e.to_string())),
            }
        }
        other => Err((405, format!("method {other} not allowed; use GET or POST"))),
    }
}

fn threshold_json(model: &str, state: &ThresholdState) -> Value {
    let t = &state.thresholds;
    json!({
        "model": model,
        "active_decode_blocks_threshold": t.active_decode_blocks_threshold,
        "active_prefill_tokens_threshold": t.active_prefill_tokens_threshold,
        "active_prefill_tokens_threshold_frac": t.active_prefill_tokens_threshold_frac,
        "waiting_requests_threshold": t.waiting_requests_threshold,
        "version": state.version,
    })
}

fn is_json(content_type: Option<&str>) -> bool {
    let Some(ct) = content_type else { return false };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

type HttpError = (u16, String);

/// The model and update of a `POST` body, or the 4xx refusing it.
fn parse_post(
    content_type: Option<&str>,
    body: &[u8],
) -> Result<(String, ThresholdUpdate), HttpError> {
    if !is_json(content_type) {
        return Err((
            415,
            format!(
                "content type {:?} is not supported; send application/json",
                content_type.unwrap_or("")
            ),
        ));
    }
    if body.len() > MAX_BODY_BYTES {
        return Err((
            413,
            format!(
                "body of {} bytes exceeds the {MAX_BODY_BYTES}-byte limit",
                body.len()
            ),
        ));
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| (400, format!("malformed JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err((422, "body must be a JSON object".to_owned()));
    };
    let model = match obj.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(Value::String(_)) => return Err((422, "model must not be empty".to_owned())),
        Some(_) => return Err((422, "model must be a string".to_owned())),
        None => return Err((422, "missing field: model".to_owned())),
    };
    let update = parse_update(&obj)?;
    Ok((model, update))
}

fn parse_update(obj: &Map<String, Value>) -> Result<ThresholdUpdate, HttpError> {
    let field = |f: ThresholdField| obj.get(f.name()).filter(|v| !v.is_null());
    let wrong = |f: ThresholdField, want: &str| (422, format!("{} must be {want}", f.name()));
    let number = |f: ThresholdField| -> Result<Option<f64>, HttpError> {
        field(f)
            .map(|v| v.as_f64().ok_or_else(|| wrong(f, "a number")))
            .transpose()
    };
    let integer = |f: ThresholdField| -> Result<Option<u64>, HttpError> {
        field(f)
            .map(|v| match v {
                Value::Number(n) if n.is_u64() => Ok(n.as_u64().expect("checked u64")),
                Value::Number(n) if n.is_i64() => {
                    Err((400, format!("{} = {n} is invalid: must be >= 0", f.name())))
                }
                _ => Err(wrong(f, "a non-negative integer")),
            })
            .transpose()
    };
    let mut update = ThresholdUpdate {
        active_decode_blocks_threshold: number(ThresholdField::ActiveDecodeBlocks)?,
        active_prefill_tokens_threshold: integer(ThresholdField::ActivePrefillTokens)?,
        active_prefill_tokens_threshold_frac: number(ThresholdField::ActivePrefillTokensFrac)?,
        waiting_requests_threshold: integer(ThresholdField::WaitingRequests)?,
        ..Default::default()
    };
    match obj.get("clear") {
        None | Some(Value::Null) => {}
        Some(Value::Array(names)) => {
            for name in names {
                let Value::String(name) = name else {
                    return Err((422, "clear must be a list of field names".to_owned()));
                };
                update
                    .clear
                    .insert_name(name)
                    .map_err(|e| (400, e.to_string()))?;
            }
        }
        Some(_) => return Err((422, "clear must be a list of field names".to_owned())),
    }
    Ok(update)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_seconds(Duration::ZERO), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_seconds(Duration::from_secs(3)), 3);
    }

    #[test]
    fn error_styles_parse_their_own_names() {
        for style in ErrorStyle::ALL {
            assert_eq!(ErrorStyle::from_name(style.name()), Some(style));
        }
        assert_eq!(ErrorStyle::from_name("openai"), Some(ErrorStyle::OpenAi));
        assert_eq!(ErrorStyle::from_name("xml"), None);
    }

    #[test]
    fn error_bodies_in_every_style() {
        let r = error_response_with_status(
            Reason::AllWorkersBusy,
            ErrorStyle::Dynamo,
            Duration::from_secs(1),
            529,
        );
        assert_eq!(
            r.body,
            r#"{"message":"Service temporarily overloaded","type":"Overloaded","code":529}"#
        );
        assert_eq!(
            r.headers,
            vec![
                ("retry-after", "1".to_owned()),
                (REASON_HEADER, "all_workers_busy".to_owned())
            ]
        );

        let r = error_response_with_status(
            Reason::NoWorkers,
            ErrorStyle::Dynamo,
            Duration::from_secs(2),
            503,
        );
        assert_eq!(
            r.body,
            r#"{"message":"Service temporarily unavailable","type":"Service Unavailable","code":503}"#
        );
        assert_eq!(r.headers[0].1, "2");
        assert_eq!(r.headers[1].1, "no_workers");

        let r = error_response_with_status(
            Reason::WorkerAtCapacity,
            ErrorStyle::OpenAi,
            Duration::from_secs(1),
            429,
        );
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(
            v["error"]["message"],
            "Server overloaded: worker at capacity"
        );
        assert_eq!(v["error"]["code"], "worker_at_capacity");
        assert_eq!(r.status, 429);

        let r = error_response_with_status(
            Reason::QueueTimeout,
            ErrorStyle::Anthropic,
            Duration::from_secs(1),
            529,
        );
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "overloaded_error");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("admission queue delay"));
    }
}
