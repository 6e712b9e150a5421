//! `GET`/`POST /busy_threshold` as a pure function of the request, answering
//! as Dynamo 1.6.1's frontend answers: the same statuses, content types and
//! bodies, checked in the same order, with loadgate's extensions (the
//! `waiting_requests_threshold` field, `clear`, `version`, the bearer token)
//! added after them.
//!
//! The order of checks is 1.6.1's (an axum `Json` extractor, then the
//! handler): 405 for another method, 415 for a body that is not JSON by its
//! content type, 413 for a body over [`MAX_BODY_BYTES`], 400 (plain text)
//! for JSON that does not parse, 422 (JSON) for JSON of the wrong shape,
//! 400 (JSON) for a value out of range, 404 for a write to an unknown model.

use serde::{Deserialize, Serialize};

use super::auth::{ControlAuth, BEARER_CHALLENGE};
use crate::error::ThresholdError;
use crate::monitor::{Monitor, ThresholdState};
use crate::thresholds::{ThresholdField, ThresholdUpdate};

/// Largest `/busy_threshold` body accepted: 2 MiB, axum's default body
/// limit, which Dynamo 1.6.1 keeps (a body one byte longer gets 413).
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// The `Allow` header value sent with a 405 from `/busy_threshold`, as 1.6.1
/// sends it.
pub const BUSY_THRESHOLD_METHODS: &str = "POST,GET,HEAD";

/// The content type of a JSON answer.
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// The content type of a plain-text answer (415, 413, and 400 for JSON that
/// does not parse).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// Serves `/busy_threshold` without authentication: (method, content type,
/// body) to (status, body). The same as [`serve_busy_threshold`] with no
/// [`ControlAuth`], less the headers.
///
/// * `GET`/`HEAD` → 200 `{"thresholds": [{model, fields…, version}, …]}`.
/// * `POST` with `{model, active_decode_blocks_threshold?,
///   active_prefill_tokens_threshold?, active_prefill_tokens_threshold_frac?,
///   waiting_requests_threshold?, clear?: [names]}`: nothing set and no
///   `clear` → a read (200; all-null and version 0 for an unknown model);
///   otherwise an update (200 echoing model, the four fields and `version`).
/// * Refusals as the module docs order them.
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
    /// The body: JSON, plain text, or empty (405).
    pub body: String,
    /// Headers to send besides the length, names in lower case:
    /// `content-type` unless the body is empty, `www-authenticate: Bearer`
    /// with a 401, `allow: POST,GET,HEAD` with a 405.
    pub headers: Vec<(&'static str, &'static str)>,
}

impl BusyThresholdResponse {
    /// The `Content-Type` to send, `None` for the empty 405 body.
    pub fn content_type(&self) -> Option<&'static str> {
        self.header("content-type")
    }

    /// The value of header `name` (lower case), if the answer carries it.
    pub fn header(&self, name: &str) -> Option<&'static str> {
        self.headers.iter().find(|(n, _)| *n == name).map(|h| h.1)
    }
}

/// A refusal: its status and how its body is written.
pub(super) enum Refusal {
    /// `{"error": message}`, as JSON.
    Json(u16, String),
    /// The message itself, as plain text.
    Text(u16, String),
    /// 405 with an empty body.
    Method,
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
/// it, and is checked before anything else.
pub fn serve_busy_threshold(
    monitor: &Monitor,
    auth: Option<&ControlAuth>,
    request: &BusyThresholdRequest<'_>,
) -> BusyThresholdResponse {
    respond(serve(monitor, auth, request))
}

/// The complete answer for a handler's outcome: its body, content type and
/// headers (a control endpoint's, `/busy_threshold` or `/slo`).
pub(super) fn respond(outcome: Result<String, Refusal>) -> BusyThresholdResponse {
    let (status, body, content_type) = match outcome {
        Ok(body) => (200, body, Some(JSON_CONTENT_TYPE)),
        Err(Refusal::Json(status, message)) => {
            let body = serde_json::json!({ "error": message }).to_string();
            (status, body, Some(JSON_CONTENT_TYPE))
        }
        Err(Refusal::Text(status, message)) => (status, message, Some(TEXT_CONTENT_TYPE)),
        Err(Refusal::Method) => (405, String::new(), None),
    };
    let mut headers: Vec<_> = content_type
        .map(|t| ("content-type", t))
        .into_iter()
        .collect();
    match status {
        401 => headers.push(("www-authenticate", BEARER_CHALLENGE)),
        405 => headers.push(("allow", BUSY_THRESHOLD_METHODS)),
        _ => {}
    }
    BusyThresholdResponse {
        status,
        body,
        headers,
    }
}

/// 401 unless `auth` is absent or accepts `authorization`.
pub(super) fn authorize(
    auth: Option<&ControlAuth>,
    authorization: Option<&str>,
) -> Result<(), Refusal> {
    match auth {
        None => Ok(()),
        Some(auth) => auth
            .verify(authorization)
            .map_err(|failure| Refusal::Json(401, failure.message().to_owned())),
    }
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
            let thresholds: Vec<ThresholdAnswer<'_>> = models
                .iter()
                .map(|model| ThresholdAnswer::new(model, monitor.thresholds(model)))
                .collect();
            Ok(to_json(&ThresholdList { thresholds }))
        }
        "POST" => {
            let (model, update) = parse_post(request.content_type, request.body)?;
            if update.is_empty() {
                return Ok(to_json(&ThresholdAnswer::new(
                    &model,
                    monitor.thresholds(&model),
                )));
            }
            if !protect_reads {
                authorize(auth, request.authorization)?;
            }
            match monitor.set_thresholds(&model, &update) {
                Ok(state) => Ok(to_json(&ThresholdAnswer::new(&model, Some(state)))),
                Err(e) => Err(refusal(&e)),
            }
        }
        _ => Err(Refusal::Method),
    }
}

/// A refused update in 1.6.1's words where 1.6.1 has the check, in
/// loadgate's own otherwise.
fn refusal(e: &ThresholdError) -> Refusal {
    let message = match e {
        ThresholdError::UnknownModel(model) => {
            return Refusal::Json(
                404,
                format!(
                    "Model '{model}' not found. Thresholds can only be set for discovered \
                     models."
                ),
            )
        }
        ThresholdError::Invalid { field, value, .. }
            if *field == ThresholdField::ActiveDecodeBlocks.name() =>
        {
            format!("{field} must be between 0.0 and 1.0, got {value}")
        }
        ThresholdError::Invalid { field, value, .. }
            if *field == ThresholdField::ActivePrefillTokensFrac.name() =>
        {
            format!("{field} must be a finite value greater than or equal to 0.0, got {value}")
        }
        other => other.to_string(),
    };
    Refusal::Json(400, message)
}

/// One model's thresholds, keys in 1.6.1's order, loadgate's after them.
#[derive(Serialize)]
struct ThresholdAnswer<'a> {
    model: &'a str,
    active_decode_blocks_threshold: Option<f64>,
    active_prefill_tokens_threshold: Option<u64>,
    active_prefill_tokens_threshold_frac: Option<f64>,
    waiting_requests_threshold: Option<u64>,
    version: u64,
}

impl<'a> ThresholdAnswer<'a> {
    fn new(model: &'a str, state: Option<ThresholdState>) -> Self {
        let state = state.unwrap_or_default();
        let t = state.thresholds;
        ThresholdAnswer {
            model,
            active_decode_blocks_threshold: t.active_decode_blocks_threshold,
            active_prefill_tokens_threshold: t.active_prefill_tokens_threshold,
            active_prefill_tokens_threshold_frac: t.active_prefill_tokens_threshold_frac,
            waiting_requests_threshold: t.waiting_requests_threshold,
            version: state.version,
        }
    }
}

#[derive(Serialize)]
struct ThresholdList<'a> {
    thresholds: Vec<ThresholdAnswer<'a>>,
}

fn to_json(value: &impl Serialize) -> String {
    serde_json::to_string(value).expect("threshold answers serialize")
}

/// The body 1.6.1 reads, under 1.6.1's name: serde's messages carry the
/// struct's name and field count ("expected struct BusyThresholdRequest with
/// 4 elements").
mod dynamo {
    #[derive(serde::Deserialize)]
    pub(super) struct BusyThresholdRequest {
        pub(super) model: String,
        pub(super) active_decode_blocks_threshold: Option<f64>,
        pub(super) active_prefill_tokens_threshold: Option<u64>,
        pub(super) active_prefill_tokens_threshold_frac: Option<f64>,
    }
}

/// loadgate's additions to the body, read from the same text.
#[derive(Deserialize)]
struct Extensions {
    waiting_requests_threshold: Option<u64>,
    clear: Option<Vec<String>>,
}

/// Whether `content_type` is JSON as axum's `Json` decides it:
/// `application/json` or `application/*+json`, any parameters.
pub(super) fn is_json(content_type: Option<&str>) -> bool {
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

/// The `POST` body's checks before it is read, as 1.6.1 orders them: 415
/// for a body that is not JSON by its content type, 413 past
/// [`MAX_BODY_BYTES`].
pub(super) fn check_post(content_type: Option<&str>, body: &[u8]) -> Result<(), Refusal> {
    if !is_json(content_type) {
        let message = "Expected request with `Content-Type: application/json`";
        return Err(Refusal::Text(415, message.to_owned()));
    }
    if body.len() > MAX_BODY_BYTES {
        let message = "Failed to buffer the request body: length limit exceeded";
        return Err(Refusal::Text(413, message.to_owned()));
    }
    Ok(())
}

/// Reads `body` as `T` with the field path in errors, refusing it as 1.6.1
/// does: 400 plain text for text that is not JSON, 422 JSON for JSON of the
/// wrong shape.
pub(super) fn read_json<'de, T: Deserialize<'de>>(body: &'de [u8]) -> Result<T, Refusal> {
    let mut reader = serde_json::Deserializer::from_slice(body);
    let refuse = |e: &dyn std::fmt::Display, data: bool| {
        if data {
            let message = format!("Failed to deserialize the JSON body into the target type: {e}");
            Refusal::Json(422, message)
        } else {
            Refusal::Text(
                400,
                format!("Failed to parse the request body as JSON: {e}"),
            )
        }
    };
    let value = serde_path_to_error::deserialize(&mut reader)
        .map_err(|e| refuse(&e, e.inner().is_data()))?;
    reader.end().map_err(|e| refuse(&e, e.is_data()))?;
    Ok(value)
}

/// The model and update of a `POST` body, or the refusal.
fn parse_post(
    content_type: Option<&str>,
    body: &[u8],
) -> Result<(String, ThresholdUpdate), Refusal> {
    check_post(content_type, body)?;
    let dynamo: dynamo::BusyThresholdRequest = read_json(body)?;
    let extensions: Extensions = read_json(body)?;
    let mut update = ThresholdUpdate {
        active_decode_blocks_threshold: dynamo.active_decode_blocks_threshold,
        active_prefill_tokens_threshold: dynamo.active_prefill_tokens_threshold,
        active_prefill_tokens_threshold_frac: dynamo.active_prefill_tokens_threshold_frac,
        waiting_requests_threshold: extensions.waiting_requests_threshold,
        ..Default::default()
    };
    for name in extensions.clear.iter().flatten() {
        update
            .clear
            .insert_name(name)
            .map_err(|e| Refusal::Json(400, e.to_string()))?;
    }
    Ok((dynamo.model, update))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn json_content_types_follow_axum() {
        assert!(is_json(Some("application/json")));
        assert!(is_json(Some("Application/JSON; charset=utf-8")));
        assert!(is_json(Some("application/vnd.api+json")));
        assert!(!is_json(Some("text/plain")));
        assert!(!is_json(None));
    }

    #[test]
    fn syntax_and_shape_errors_are_told_apart() {
        let Err(Refusal::Text(400, m)) = read_json::<dynamo::BusyThresholdRequest>(b"{\"model\": ")
        else {
            panic!("a syntax error is a plain-text 400");
        };
        assert_eq!(
            m,
            "Failed to parse the request body as JSON: model: EOF while parsing a value at line 1 column 10"
        );
        let Err(Refusal::Json(422, m)) = read_json::<dynamo::BusyThresholdRequest>(b"[]") else {
            panic!("a shape error is a JSON 422");
        };
        assert_eq!(
            m,
            "Failed to deserialize the JSON body into the target type: invalid length 0, \
             expected struct BusyThresholdRequest with 4 elements at line 1 column 2"
        );
        assert!(matches!(
            read_json::<dynamo::BusyThresholdRequest>(b"{\"model\":\"m\"} x"),
            Err(Refusal::Text(400, _))
        ));
    }
}
