//! The HTTP helpers and status texts: the busy-threshold endpoint,
//! `lg_error_response`, `lg_status_str`/`_http`/`_reason`.

use std::ffi::CStr;
use std::ptr::{null, null_mut};

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use loadgate_ffi::*;

use crate::args::{Buf, Handle, Str};
use crate::state::{buf_ptr, check_text, checked, pick, refuses_null, text_buf, State, SENTINEL};

/// An HTTP or status call.
#[derive(Debug, Arbitrary)]
pub enum Call {
    BusyThreshold {
        m: Handle,
        method: Str,
        content_type: Option<Str>,
        body: Str,
        buf: Buf,
        status_null: bool,
        needed_null: bool,
    },
    ErrorResponse {
        status: i32,
        style: u32,
        retry_after_ms: u32,
        buf: Buf,
        nulls: u8,
    },
    StatusText(i32),
}

impl Call {
    /// Makes the call on the input's handles and checks its status,
    /// out-parameters and error message.
    pub fn apply(&self, state: &mut State) {
        match self {
            Call::BusyThreshold {
                m,
                method,
                content_type,
                body,
                buf: b,
                status_null,
                needed_null,
            } => {
                let m = pick(&state.monitors, *m);
                let (mut k1, mut k2, mut k3) = (Vec::new(), Vec::new(), Vec::new());
                let (mp, ml) = method.raw(&mut k1);
                let (cp, cl) = content_type
                    .as_ref()
                    .map_or((null(), 0), |s| s.raw(&mut k2));
                let (bodyp, bodyl) = body.raw(&mut k3);
                let mut buf = text_buf(*b);
                let (bp, bl) = buf_ptr(*b, &mut buf);
                let mut http = 0xAAAAu16;
                let mut needed = SENTINEL as usize;
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; the three strings
                // come from `Str::raw` (or NULL with 0); `(bp, bl)` is NULL or a local buffer of
                // `bl` bytes; each out-pointer is NULL or points at a local.
                let st = checked("lg_monitor_handle_busy_threshold", unsafe {
                    lg_monitor_handle_busy_threshold(
                        m,
                        mp.cast(),
                        ml,
                        cp.cast(),
                        cl,
                        bodyp,
                        bodyl,
                        if *status_null { null_mut() } else { &mut http },
                        bp,
                        bl,
                        if *needed_null {
                            null_mut()
                        } else {
                            &mut needed
                        },
                    )
                });
                let bad = m.is_null()
                    || *status_null
                    || *needed_null
                    || mp.is_null()
                    || method.invalid()
                    || content_type.as_ref().is_some_and(Str::invalid)
                    || (bodyp.is_null() && bodyl > 0)
                    || (bp.is_null() && bl > 0);
                refuses_null("lg_monitor_handle_busy_threshold", st, bad);
                if matches!(st, lg_status::LG_OK | lg_status::LG_BUFFER_TOO_SMALL) {
                    assert!(
                        [200, 400, 404, 405, 413, 415, 422].contains(&http),
                        "undocumented HTTP status {http}"
                    );
                } else {
                    assert_eq!(http, 0xAAAA, "HTTP status written on failure");
                }
                if !*needed_null {
                    check_text("lg_monitor_handle_busy_threshold", st, &buf, *b, needed);
                }
            }
            Call::ErrorResponse {
                status,
                style,
                retry_after_ms,
                buf: b,
                nulls,
            } => {
                let status = if *status % 3 == 0 {
                    *status
                } else {
                    7000 + status.rem_euclid(10)
                };
                let mut buf = text_buf(*b);
                let (bp, bl) = buf_ptr(*b, &mut buf);
                let (mut http, mut retry, mut needed) = (0xAAAAu16, SENTINEL, SENTINEL as usize);
                // SAFETY: `(bp, bl)` is NULL or a local buffer of `bl` bytes; each out-pointer is
                // NULL or points at a local.
                let st = checked("lg_error_response", unsafe {
                    lg_error_response(
                        status,
                        *style % 4,
                        u64::from(*retry_after_ms),
                        if nulls & 1 != 0 {
                            null_mut()
                        } else {
                            &mut http
                        },
                        if nulls & 2 != 0 {
                            null_mut()
                        } else {
                            &mut retry
                        },
                        bp,
                        bl,
                        if nulls & 4 != 0 {
                            null_mut()
                        } else {
                            &mut needed
                        },
                    )
                });
                refuses_null(
                    "lg_error_response",
                    st,
                    nulls & 7 != 0 || (bp.is_null() && bl > 0) || *style % 4 > 2,
                );
                if matches!(st, lg_status::LG_OK | lg_status::LG_BUFFER_TOO_SMALL) {
                    assert!(http == 503 || (200..=999).contains(&http), "{http}");
                    assert!(retry >= 1, "Retry-After {retry}");
                }
                if nulls & 4 == 0 {
                    check_text("lg_error_response", st, &buf, *b, needed);
                }
            }
            Call::StatusText(s) => {
                // Any int: a static string, an HTTP status, a reason or NULL.
                // SAFETY: `lg_status_str` returns a static NUL-terminated string for any int.
                let text = unsafe { CStr::from_ptr(lg_status_str(*s)) };
                assert!(!text.to_bytes().is_empty());
                let http = lg_status_http(*s);
                assert!((200..=999).contains(&http), "HTTP status {http}");
                let reason = lg_status_reason(*s);
                if !reason.is_null() {
                    // SAFETY: `reason` is not NULL, so it is a static NUL-terminated string.
                    assert!(!unsafe { CStr::from_ptr(reason) }.to_bytes().is_empty());
                }
            }
        }
    }
}
