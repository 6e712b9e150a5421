//! HTTP glue without a server: status codes, error bodies, headers, and the
//! `/busy_threshold` and `/slo` handlers as pure functions any server can
//! mount.
//!
//! * [`overload_status`] reads `DYN_HTTP_OVERLOAD_STATUS_CODE` once and caches
//!   it; [`parse_overload_status`] is the pure rule (trimmed; a status in
//!   `100..=999` that is not 1xx is kept; anything else means 529).
//! * [`error_response`] builds the status, JSON body (dynamo, openai or
//!   anthropic shape) and headers (`Retry-After`, `x-loadgate-reason`) for a
//!   rejection.
//! * [`handle_busy_threshold`] maps (method, content type, body) to
//!   (status, body) for `GET`/`POST /busy_threshold`, as Dynamo 1.6.1
//!   answers; [`serve_busy_threshold`] does the same for a request that also
//!   carries its `Authorization` header, checks it against an optional
//!   [`ControlAuth`] bearer token, and returns the headers to send too
//!   (`Content-Type`, `WWW-Authenticate: Bearer` with a 401, `Allow` with a
//!   405).
//! * [`serve_slo`] does the same for `GET`/`POST /slo`: a model's SLO read,
//!   set or cleared at run time (`slo.rs`).
//! * [`PriorityNames`] and [`FlowHeaders`] read what a request asks for in
//!   headers: its priority class, and its tenant, deadline and opt-out of
//!   the frontend queue.

mod auth;
mod busy_threshold;
mod flow;
mod priority;
mod slo;

use std::time::Duration;

use serde_json::json;

use crate::error::Reason;

pub use crate::status::{
    is_status_code, overload_status, parse_overload_status, DEFAULT_OVERLOAD_STATUS,
    OVERLOAD_STATUS_ENV, STATUS_CODES,
};
pub use auth::{AuthFailure, ControlAuth, ControlAuthError, BEARER_CHALLENGE};
pub use busy_threshold::{
    handle_busy_threshold, serve_busy_threshold, BusyThresholdRequest, BusyThresholdResponse,
    BUSY_THRESHOLD_METHODS, JSON_CONTENT_TYPE, MAX_BODY_BYTES, TEXT_CONTENT_TYPE,
};
pub use flow::{FlowHeaderError, FlowHeaders, DEADLINE_HEADER, QUEUE_HEADER, TENANT_HEADER};
pub use priority::{PriorityNames, PRIORITY_HEADER};
pub use slo::serve_slo;

/// Header carrying the machine-readable rejection reason.
pub const REASON_HEADER: &str = "x-loadgate-reason";

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
    /// Every header but the body's length: `content-type`, `retry-after`
    /// and the reason header.
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
            ("content-type", "application/json".to_owned()),
            ("retry-after", retry_after_seconds(retry_after).to_string()),
            (REASON_HEADER, reason.as_str().to_owned()),
        ],
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use serde_json::Value;

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
                ("content-type", "application/json".to_owned()),
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
        assert_eq!(r.headers[1].1, "2");
        assert_eq!(r.headers[2].1, "no_workers");

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
