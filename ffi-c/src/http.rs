//! HTTP glue: the overload status, rejection bodies, and the
//! `/busy_threshold` handler with its optional bearer token
//! (`lg_control_auth`), for C/C++ servers.

use std::ffi::{c_char, c_int, CStr};
use std::time::Duration;

use loadgate_core::http::{self, BusyThresholdRequest, ControlAuth, ErrorStyle};

use crate::ffi::{
    boundary, guard, input, optional, optional_string, slice, string, Error, Out, TextBuf,
};
use crate::monitor::lg_monitor;
use crate::status::lg_status;

/// The shape of a rejection body: one of LG_ERROR_STYLE_*.
#[allow(non_camel_case_types)]
pub type lg_error_style = u32;
/// {"message", "type", "code"} (the reference's flat shape).
pub const LG_ERROR_STYLE_DYNAMO: lg_error_style = 0;
/// {"error": {"message", "type", "param", "code"}}.
pub const LG_ERROR_STYLE_OPENAI: lg_error_style = 1;
/// {"type": "error", "error": {"type", "message"}}.
pub const LG_ERROR_STYLE_ANTHROPIC: lg_error_style = 2;

/// The process's overload status: DYN_HTTP_OVERLOAD_STATUS_CODE (trimmed; a
/// status in 200..=999) read once and cached, else 529.
///
/// Ownership: no arguments, nothing to free.
/// Thread safety: any thread. Blocking: never (the first call reads the
/// environment).
#[no_mangle]
pub extern "C" fn lg_overload_status() -> u16 {
    boundary(http::DEFAULT_OVERLOAD_STATUS, http::overload_status)
}

/// Builds the answer to a rejection: `status` is a rejection status
/// (LG_OVERLOADED, LG_UNAVAILABLE, LG_WORKER_OVERLOADED, LG_AT_CAPACITY,
/// LG_QUEUE_TIMEOUT, LG_CLOSED, LG_WOULD_WAIT or LG_TIMED_OUT). On LG_OK:
/// *out_http_status receives the HTTP status (the overload status or 503),
/// *out_retry_after_s the Retry-After header value (retry_after_ms rounded
/// up to whole seconds, at least 1), and `buf` the JSON body in `style`,
/// with snprintf semantics as lg_monitor_metrics() describes. The
/// x-loadgate-reason header value is lg_status_reason(status).
///
/// Errors: LG_INVALID_ARGUMENT (NULL out-parameter, NULL buf with
/// buf_len > 0, a status that is not a rejection, unknown style),
/// LG_BUFFER_TOO_SMALL (then *out_http_status, *out_retry_after_s and
/// *out_needed are written too; the call has no side effect, so retry).
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: never (allocates).
///
/// # Safety
/// `out_http_status`, `out_retry_after_s` and `out_needed` are NULL or
/// valid for writes; `buf` is NULL or valid for writes of `buf_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn lg_error_response(
    status: c_int,
    style: lg_error_style,
    retry_after_ms: u64,
    out_http_status: *mut u16,
    out_retry_after_s: *mut u64,
    buf: *mut c_char,
    buf_len: usize,
    out_needed: *mut usize,
) -> lg_status {
    guard(|| {
        let out_status = Out::new(out_http_status, "out_http_status")?;
        let out_retry = Out::new(out_retry_after_s, "out_retry_after_s")?;
        let text = TextBuf::new(buf, buf_len, out_needed)?;
        let reason = lg_status::from_int(status)
            .and_then(lg_status::reason)
            .ok_or_else(|| Error::invalid(format_args!("status {status} is not a rejection")))?;
        let style = match style {
            LG_ERROR_STYLE_DYNAMO => ErrorStyle::Dynamo,
            LG_ERROR_STYLE_OPENAI => ErrorStyle::OpenAi,
            LG_ERROR_STYLE_ANTHROPIC => ErrorStyle::Anthropic,
            other => {
                return Err(Error::invalid(format_args!(
                    "style {other} is not one of LG_ERROR_STYLE_DYNAMO (0), \
                     LG_ERROR_STYLE_OPENAI (1), LG_ERROR_STYLE_ANTHROPIC (2)"
                )))
            }
        };
        let retry_after = Duration::from_millis(retry_after_ms);
        let response = http::error_response(reason, style, retry_after);
        // SAFETY: `out_http_status` is writable (contract).
        unsafe { out_status.write(response.status) };
        // SAFETY: `out_retry_after_s` is writable (contract).
        unsafe { out_retry.write(http::retry_after_seconds(retry_after)) };
        // SAFETY: `buf` and `out_needed` are writable (contract).
        unsafe { text.write(response.body.as_bytes()) }
    })
}

/// Serves /busy_threshold as a pure function of the request, answering as
/// Dynamo 1.6.1 answers: `method` ("GET", "HEAD" or "POST"), `content_type`
/// (the header's value; NULL if absent) and `body`. *out_http_status
/// receives the status and `buf` the body (snprintf semantics, as
/// lg_monitor_metrics() describes):
///
/// - GET: 200 {"thresholds": [{model, the four fields, version}, ...]}.
/// - POST {model, active_decode_blocks_threshold?,
///   active_prefill_tokens_threshold?, active_prefill_tokens_threshold_frac?,
///   waiting_requests_threshold?, clear?: [names]}: with nothing set or
///   cleared a read (200, all-null for an unknown model); otherwise an update
///   (200 echoing the model, the four fields and version).
/// - Refusals, in this order: 405 other methods (empty body); 415 a
///   content type that is not JSON and 413 a body over 2 MiB (plain text);
///   400 text that is not JSON (plain text); 422 JSON of the wrong shape,
///   400 a value out of range, 404 a write to an unknown model (all
///   {"error": "..."}).
///
/// The content type and the other headers of the answer come from
/// lg_monitor_handle_busy_threshold_auth() (its `auth` may be NULL).
///
/// The request takes effect once, whatever the buffer size: on
/// LG_BUFFER_TOO_SMALL, *out_http_status and *out_needed are still written.
/// Only a POST that changed thresholds has a side effect, and its body is
/// at most 6 * body_len + 256 bytes, so a buffer of that size always holds
/// it; every other request can simply be repeated with a larger buffer.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor, method or out-parameter, NULL
/// with a non-zero length, non-UTF-8 method or content type),
/// LG_BUFFER_TOO_SMALL. HTTP-level errors are LG_OK with a 4xx status.
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread. Blocking: takes model locks briefly; allocates
/// (cold path).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `method`, `content_type` and `body`
/// are NULL or valid for their lengths; `out_http_status` and `out_needed`
/// are NULL or valid for writes; `buf` is NULL or valid for writes of
/// `buf_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_handle_busy_threshold(
    monitor: *const lg_monitor,
    method: *const c_char,
    method_len: usize,
    content_type: *const c_char,
    content_type_len: usize,
    body: *const u8,
    body_len: usize,
    out_http_status: *mut u16,
    buf: *mut c_char,
    buf_len: usize,
    out_needed: *mut usize,
) -> lg_status {
    // SAFETY: the caller's contract, which is this one's, plus a NULL auth,
    // a NULL authorization of length 0 and a NULL out_headers,
    // all of which lg_monitor_handle_busy_threshold_auth() allows.
    unsafe {
        lg_monitor_handle_busy_threshold_auth(
            monitor,
            std::ptr::null(),
            method,
            method_len,
            content_type,
            content_type_len,
            std::ptr::null(),
            0,
            body,
            body_len,
            out_http_status,
            std::ptr::null_mut(),
            buf,
            buf_len,
            out_needed,
        )
    }
}

/// The bearer token guarding /busy_threshold, and whether reads need it too.
/// Opaque; create with lg_control_auth_new(), free with
/// lg_control_auth_free(); pass it to lg_monitor_handle_busy_threshold_auth().
/// Immutable: it may be used from any number of threads at once.
pub struct lg_control_auth {
    auth: ControlAuth,
}

/// The headers a /busy_threshold answer carries besides its length, each a
/// static NUL-terminated string (never freed), or NULL when not sent.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lg_http_headers {
    /// Content-Type: "application/json" or "text/plain; charset=utf-8";
    /// NULL for the empty body of a 405.
    pub content_type: *const c_char,
    /// Allow, with a 405: "POST,GET,HEAD".
    pub allow: *const c_char,
    /// WWW-Authenticate, with a 401: "Bearer".
    pub www_authenticate: *const c_char,
}

impl lg_http_headers {
    /// The C strings of `response`'s headers.
    fn of(response: &http::BusyThresholdResponse) -> Self {
        let c = |value: Option<&str>| -> *const c_char {
            let text: Option<&CStr> = match value {
                None => None,
                Some(http::JSON_CONTENT_TYPE) => Some(c"application/json"),
                Some(http::TEXT_CONTENT_TYPE) => Some(c"text/plain; charset=utf-8"),
                Some(http::BUSY_THRESHOLD_METHODS) => Some(c"POST,GET,HEAD"),
                Some(http::BEARER_CHALLENGE) => Some(c"Bearer"),
                Some(other) => unreachable!("a header value with no C string: {other}"),
            };
            text.map_or(std::ptr::null(), CStr::as_ptr)
        };
        lg_http_headers {
            content_type: c(response.content_type()),
            allow: c(response.header("allow")),
            www_authenticate: c(response.header("www-authenticate")),
        }
    }
}

/// Creates the guard of /busy_threshold: with it, a write (a POST that sets
/// or clears a threshold) must carry the header "Authorization: Bearer
/// <token>" (scheme in any case, token exact, compared in constant time);
/// reads (GET, HEAD, a POST that only reads) stay open unless
/// `protect_reads`.
///
/// Errors: LG_INVALID_ARGUMENT (NULL out_auth, NULL token with a non-zero
/// length, an empty token, a token with a byte that is not visible ASCII
/// 0x21..0x7e, such as a space).
/// Ownership: on LG_OK *out_auth owns a new guard; free it with
/// lg_control_auth_free(). The token is copied.
/// Thread safety: any thread. Blocking: never (allocates).
///
/// # Safety
/// `token` is NULL or valid for `token_len` bytes; `out_auth` is NULL or
/// valid for writes.
#[no_mangle]
pub unsafe extern "C" fn lg_control_auth_new(
    token: *const c_char,
    token_len: usize,
    protect_reads: bool,
    out_auth: *mut *mut lg_control_auth,
) -> lg_status {
    guard(|| {
        // SAFETY: `token` is NULL or valid for `token_len` bytes (contract).
        let token = unsafe { string(token, token_len, "token") }?;
        let out = Out::new(out_auth, "out_auth")?;
        let auth = ControlAuth::new(token, protect_reads).map_err(Error::invalid)?;
        let handle = Box::into_raw(Box::new(lg_control_auth { auth }));
        // SAFETY: writable by the contract.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Frees a guard made by lg_control_auth_new(). NULL is a no-op.
///
/// Ownership: takes `auth`.
/// Thread safety: no other thread may be using the guard.
/// Blocking: never.
///
/// # Safety
/// `auth` is NULL or was returned by lg_control_auth_new() and not freed
/// yet.
#[no_mangle]
pub unsafe extern "C" fn lg_control_auth_free(auth: *mut lg_control_auth) {
    boundary((), || {
        if !auth.is_null() {
            // SAFETY: a live handle from lg_control_auth_new(), given up by
            // the caller (contract), so this is the only owner.
            drop(unsafe { Box::from_raw(auth) });
        }
    })
}

/// Serves /busy_threshold as lg_monitor_handle_busy_threshold() does, with
/// the request's Authorization header value (`authorization`; NULL if
/// absent) checked against `auth` (NULL: no authentication, exactly
/// lg_monitor_handle_busy_threshold()).
///
/// With a guard, a write (a POST that sets or clears a threshold) without
/// "Authorization: Bearer <token>" is answered with status 401 and
/// {"error": "missing bearer token: ..."} or {"error": "invalid bearer
/// token"}, and changes nothing. Reads, and requests refused before any
/// state is touched (400, 405, 413, 415, 422), need no token unless the
/// guard protects reads; then every request needs it, and is checked first.
///
/// When `out_headers` is not NULL, it receives the headers the answer must
/// carry besides its length (lg_http_headers: static strings, do not free
/// them; NULL for a header not to send): Content-Type ("application/json",
/// or "text/plain; charset=utf-8" for 413, 415 and unparseable JSON; NULL
/// for the empty 405), WWW-Authenticate ("Bearer") with a 401, and Allow
/// ("POST,GET,HEAD") with a 405.
///
/// Buffer and side effects as lg_monitor_handle_busy_threshold(): the
/// request takes effect once whatever the buffer size; on
/// LG_BUFFER_TOO_SMALL, *out_http_status, *out_headers and *out_needed are
/// still written.
///
/// Errors: LG_INVALID_ARGUMENT (NULL monitor, method, out_http_status or
/// out_needed, NULL with a non-zero length, non-UTF-8 method, content type
/// or authorization), LG_BUFFER_TOO_SMALL. HTTP-level errors (401
/// included) are LG_OK with a 4xx status.
/// Ownership: borrows its arguments for the call only; keeps none of them.
/// Thread safety: any thread; one guard may serve any number of threads at
/// once. Blocking: takes model locks briefly; allocates (cold path).
///
/// # Safety
/// `monitor` is NULL or a live monitor; `auth` is NULL or a live guard;
/// `method`, `content_type`, `authorization` and `body` are NULL or valid
/// for their lengths; `out_http_status`, `out_headers` and `out_needed` are
/// NULL or valid for writes; `buf` is NULL or valid for
/// writes of `buf_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn lg_monitor_handle_busy_threshold_auth(
    monitor: *const lg_monitor,
    auth: *const lg_control_auth,
    method: *const c_char,
    method_len: usize,
    content_type: *const c_char,
    content_type_len: usize,
    authorization: *const c_char,
    authorization_len: usize,
    body: *const u8,
    body_len: usize,
    out_http_status: *mut u16,
    out_headers: *mut lg_http_headers,
    buf: *mut c_char,
    buf_len: usize,
    out_needed: *mut usize,
) -> lg_status {
    guard(|| {
        // SAFETY: `monitor` is NULL or live (contract).
        let m = unsafe { input(monitor, "monitor") }?;
        // SAFETY: `auth` is NULL or a live guard (contract).
        let auth = unsafe { optional(auth, "auth") }?;
        if method.is_null() {
            return Err(Error::invalid("method must not be NULL"));
        }
        // SAFETY: `method` is valid for `method_len` bytes (contract).
        let method = unsafe { string(method, method_len, "method") }?;
        // SAFETY: NULL or valid for `content_type_len` bytes (contract).
        let content_type =
            unsafe { optional_string(content_type, content_type_len, "content_type") }?;
        // SAFETY: NULL or valid for `authorization_len` bytes (contract).
        let authorization =
            unsafe { optional_string(authorization, authorization_len, "authorization") }?;
        // SAFETY: NULL (with length 0) or valid for `body_len` bytes.
        let body = unsafe { slice(body, body_len, "body") }?;
        let out_status = Out::new(out_http_status, "out_http_status")?;
        let out_headers = Out::optional(out_headers, "out_headers")?;
        let text = TextBuf::new(buf, buf_len, out_needed)?;
        let request = BusyThresholdRequest {
            method,
            content_type,
            authorization,
            body,
        };
        let response = http::serve_busy_threshold(&m.monitor, auth.map(|a| &a.auth), &request);
        // SAFETY: `out_http_status` is writable (contract).
        unsafe { out_status.write(response.status) };
        if let Some(out) = out_headers {
            let headers = lg_http_headers::of(&response);
            // SAFETY: `out_headers` is writable (contract).
            unsafe { out.write(headers) };
        }
        // SAFETY: `buf` and `out_needed` are writable (contract).
        unsafe { text.write(response.body.as_bytes()) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(p: *const c_char) -> Option<&'static str> {
        // SAFETY: NULL or one of the static C strings of lg_http_headers::of.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().unwrap())
    }

    #[test]
    fn every_header_core_sends_has_its_c_string() {
        let m = loadgate_core::Monitor::new();
        let auth = ControlAuth::new("t", true).unwrap();
        for (auth, method, content_type) in [
            (None, "GET", None),
            (None, "PUT", None),
            (None, "POST", Some("text/plain")),
            (Some(&auth), "GET", None),
        ] {
            let request = BusyThresholdRequest {
                method,
                content_type,
                ..Default::default()
            };
            let response = http::serve_busy_threshold(&m, auth, &request);
            let c = lg_http_headers::of(&response);
            assert_eq!(text(c.content_type), response.content_type());
            assert_eq!(text(c.allow), response.header("allow"));
            assert_eq!(
                text(c.www_authenticate),
                response.header("www-authenticate")
            );
        }
    }
}
