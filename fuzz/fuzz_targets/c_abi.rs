//! C ABI call sequences (ffi-c/, `lg_*`) with NULL handles and
//! out-parameters, NULL-with-length and non-UTF-8 strings, short and NULL
//! text buffers, and out-of-range enums, policies, statuses and limits.
//!
//! Calls go straight to the `extern "C"` functions (ffi-c compiled as an
//! rlib, see `ffi-rlib/`), under AddressSanitizer and LeakSanitizer. Only
//! calls the header allows are made: no dangling or freed handle, no length
//! longer than its buffer. The NATS calls (reporter, subscription) are made
//! only with an argument they must refuse before connecting, so the target
//! never touches the network. Within that contract every call must:
//! * return a status and never `LG_PANIC` (and never crash or leak);
//! * give `LG_INVALID_ARGUMENT` for a NULL it cannot take;
//! * write its out-parameters only on success (snprintf-style text calls:
//!   the length always, a NUL-terminated prefix on `LG_BUFFER_TOO_SMALL`);
//! * leave a message for `lg_last_error_message()` when it fails.
//!
//! And every `lg_gate_admit_async` callback runs exactly once (LG_OK with a
//! permit, or a rejection with NULL) unless its ticket cancelled it.
#![no_main]

use std::ffi::{c_char, c_void, CStr};
use std::ptr::{null, null_mut};
use std::sync::Mutex;

use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use loadgate_ffi::*;

// ---- arguments --------------------------------------------------------------

/// A handle argument: NULL, or one of the live handles of its kind.
#[derive(Debug, Clone, Copy, Arbitrary)]
struct Handle(u8);

/// A string argument as pointer + length.
#[derive(Debug, Arbitrary)]
enum Str {
    /// A known-good value ("llama", "mistral", "GET", "application/json"...).
    Known(u8),
    /// Any bytes, UTF-8 or not.
    Bytes(Vec<u8>),
    /// A known value cut short (possibly inside a UTF-8 sequence).
    Cut(u8, u8),
    /// NULL with length 0 (allowed) or with a length (refused).
    Null(u8),
}

const KNOWN: [&str; 8] = [
    "llama",
    "mistral",
    "GET",
    "POST",
    "application/json",
    r#"{"model": "llama", "active_decode_blocks_threshold": 0.5}"#,
    "héllo",
    "dynamo_x",
];

impl Str {
    /// Pointer and length; `keep` holds the bytes for the call.
    fn raw<'a>(&'a self, keep: &'a mut Vec<u8>) -> (*const u8, usize) {
        match self {
            Str::Known(i) => {
                let s = KNOWN[usize::from(*i) % KNOWN.len()];
                (s.as_ptr(), s.len())
            }
            Str::Bytes(b) => (b.as_ptr(), b.len()),
            Str::Cut(i, n) => {
                let s = KNOWN[usize::from(*i) % KNOWN.len()].as_bytes();
                keep.extend_from_slice(&s[..usize::from(*n) % (s.len() + 1)]);
                (keep.as_ptr(), keep.len())
            }
            Str::Null(n) => (null(), usize::from(*n % 2) * 7),
        }
    }

    /// Whether the callee must refuse it as a string (NULL with a length or
    /// not UTF-8).
    fn invalid(&self) -> bool {
        let mut keep = Vec::new();
        let (p, len) = self.raw(&mut keep);
        if p.is_null() {
            return len != 0;
        }
        // SAFETY: `raw` returns a pointer valid for `len` bytes.
        std::str::from_utf8(unsafe { std::slice::from_raw_parts(p, len) }).is_err()
    }
}

/// A small value most of the time, an edge sometimes.
#[derive(Debug, Clone, Copy)]
struct Small(u64);

impl<'a> Arbitrary<'a> for Small {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Small(match u.arbitrary::<u8>()? {
            0..=199 => u64::from(u.int_in_range(0u8..=9)?),
            200..=239 => u.arbitrary()?,
            n => u64::MAX - u64::from(n % 3),
        }))
    }
}

/// A text buffer: NULL or `len` bytes (`len` may be 0 or too short).
#[derive(Debug, Clone, Copy, Arbitrary)]
struct Buf {
    null: bool,
    len: u16,
}

#[derive(Debug, Default, Arbitrary)]
struct Spec {
    dp_start_high: bool,
    dp_start: u8,
    dp_size: u8,
    total: Option<Small>,
    mnbt: Option<Small>,
}

#[derive(Debug, Default, Arbitrary)]
struct Report {
    decode: Option<Small>,
    used: Option<Small>,
    total: Option<Small>,
    prefill: Option<Small>,
    mnbt: Option<Small>,
}

#[derive(Debug, Arbitrary)]
struct Update {
    decode: Option<f64>,
    abs: Option<Small>,
    frac: Option<f64>,
    clear: u8,
}

#[derive(Debug, Arbitrary)]
struct MonitorConfig {
    lease_ms: u8,
    stale_after_ms: u16,
    staleness: u32,
    max_workers: u8,
    prefix: Option<Str>,
}

#[derive(Debug, Arbitrary)]
struct GateConfig {
    limit: u8,
    queue: u8,
    timeout_ms: u8,
    lifo: bool,
    prefix: Option<Str>,
}

#[derive(Debug, Arbitrary)]
enum Call {
    MonitorNew {
        config: Option<MonitorConfig>,
        out_null: bool,
    },
    MonitorFree(Handle),
    AddWorker {
        m: Handle,
        model: Str,
        id: u8,
        spec: Option<Spec>,
    },
    RemoveWorker {
        m: Handle,
        id: u8,
    },
    Report {
        m: Handle,
        id: u8,
        rank: u8,
        report: Option<Report>,
    },
    SetThresholds {
        m: Handle,
        model: Str,
        update: Option<Update>,
        out_null: bool,
    },
    GetThresholds {
        m: Handle,
        model: Str,
        out_null: bool,
    },
    SetStaleness {
        m: Handle,
        model: Str,
        policy: u32,
        stale_after_ms: u16,
    },
    Sweep {
        m: Handle,
        out_null: bool,
    },
    IsBusy {
        m: Handle,
        id: u8,
        leased: bool,
        out_null: bool,
    },
    Select {
        m: Handle,
        model: Str,
        policy: u32,
        out_null: bool,
    },
    SelectMinCost {
        m: Handle,
        model: Str,
        cands: Vec<(u8, f64)>,
        null_arrays: bool,
        out_null: bool,
    },
    Check {
        m: Handle,
        id: u8,
        mark: bool,
    },
    MonitorMetrics {
        m: Handle,
        buf: Buf,
        out_null: bool,
    },
    BusyThreshold {
        m: Handle,
        method: Str,
        content_type: Option<Str>,
        body: Str,
        buf: Buf,
        status_null: bool,
        needed_null: bool,
    },
    Book {
        m: Handle,
        id: u8,
        rank: u8,
        blocks: Small,
        out_null: bool,
    },
    BookingAdd {
        b: Handle,
        blocks: Small,
    },
    BookingBlocks {
        b: Handle,
        out_null: bool,
    },
    BookingFree(Handle),
    GateConfigDefault {
        limit: u32,
        out_null: bool,
    },
    GateNew {
        config: Option<GateConfig>,
        out_null: bool,
    },
    GateFromEnv {
        limit: u8,
        out_null: bool,
    },
    GateFree(Handle),
    TryAdmit {
        g: Handle,
        out_null: bool,
    },
    Admit {
        g: Handle,
        wait: bool,
        out_null: bool,
    },
    AdmitAsync {
        g: Handle,
        callback_null: bool,
        want_ticket: bool,
    },
    SetLimit {
        g: Handle,
        limit: u32,
    },
    Close(Handle),
    Expire {
        g: Handle,
        out_null: bool,
    },
    NextDeadline {
        g: Handle,
        out_null: bool,
    },
    Stats {
        g: Handle,
        out_null: bool,
    },
    GateMetrics {
        g: Handle,
        buf: Buf,
        out_null: bool,
    },
    PermitRelease(Handle),
    TicketCancel {
        t: Handle,
        out_null: bool,
    },
    TicketIsQueued {
        t: Handle,
        out_null: bool,
    },
    TicketFree(Handle),
    StatusText(i32),
    ErrorResponse {
        status: i32,
        style: u32,
        retry_after_ms: u32,
        buf: Buf,
        nulls: u8,
    },
    Version,
    MonitorConfigDefault {
        out_null: bool,
    },
    /// `lg_reporter_new` with one argument it must refuse (`fault`).
    ReporterNew {
        url: Str,
        namespace: Str,
        id: u8,
        model: Str,
        spec: Option<Spec>,
        fault: u8,
    },
    /// `lg_monitor_subscribe_nats` with one argument it must refuse.
    Subscribe {
        m: Handle,
        url: Str,
        namespace: Str,
        fault: u8,
    },
    /// The reporter and subscription calls on NULL handles.
    NullNatsHandles {
        out_null: bool,
    },
}

// ---- state --------------------------------------------------------------------

/// What callbacks report, shared with them through `user_data`.
#[derive(Default)]
struct CallbackLog {
    calls: Mutex<Vec<(lg_status, usize)>>,
}

unsafe extern "C" fn on_admit(user_data: *mut c_void, status: lg_status, permit: *mut lg_permit) {
    // SAFETY: user_data is the `CallbackLog` of the running input, which
    // outlives every request (all gates are closed before it is dropped).
    let log = unsafe { &*(user_data as *const CallbackLog) };
    log.calls.lock().unwrap().push((status, permit as usize));
}

/// Live handles of each kind; a freed handle leaves its list at once.
struct State {
    monitors: Vec<*mut lg_monitor>,
    gates: Vec<*mut lg_gate>,
    bookings: Vec<*mut lg_booking>,
    permits: Vec<*mut lg_permit>,
    tickets: Vec<*mut lg_ticket>,
    log: Box<CallbackLog>,
    /// Callbacks seen so far (`log` entries already checked).
    seen: usize,
    /// Async requests accepted and not cancelled: each owes one callback.
    owed: usize,
}

fn pick<T>(list: &[*mut T], h: Handle) -> *mut T {
    if h.0 == 0 || list.is_empty() {
        null_mut()
    } else {
        list[usize::from(h.0 - 1) % list.len()]
    }
}

fn take<T>(list: &mut Vec<*mut T>, h: Handle) -> *mut T {
    if h.0 == 0 || list.is_empty() {
        null_mut()
    } else {
        let i = usize::from(h.0 - 1) % list.len();
        list.swap_remove(i)
    }
}

const SENTINEL: u64 = 0x5a5a_5a5a_5a5a_5a5a;
fn dangling<T>() -> *mut T {
    SENTINEL as usize as *mut T
}

/// Every status: not a panic; a failure leaves a message.
fn checked(call: &str, status: lg_status) -> lg_status {
    assert_ne!(
        status,
        lg_status::LG_PANIC,
        "{call} panicked: {}",
        last_error()
    );
    if status != lg_status::LG_OK {
        assert!(
            !last_error().is_empty(),
            "{call} failed with {status:?} and no message"
        );
    }
    status
}

fn last_error() -> String {
    // SAFETY: lg_last_error_message returns a valid C string.
    unsafe { CStr::from_ptr(lg_last_error_message()) }
        .to_str()
        .expect("UTF-8 message")
        .to_owned()
}

/// A NULL this call cannot take must be refused.
fn refuses_null(call: &str, status: lg_status, null: bool) {
    if null {
        assert_eq!(
            status,
            lg_status::LG_INVALID_ARGUMENT,
            "{call} with a NULL argument"
        );
    }
}

/// snprintf semantics of the text calls.
fn check_text(call: &str, status: lg_status, buf: &[u8], b: Buf, needed: usize) {
    match status {
        lg_status::LG_OK => {
            assert!(
                needed < buf.len(),
                "{call}: OK with needed {needed} >= {}",
                buf.len()
            );
            assert_eq!(buf[needed], 0, "{call}: text not NUL-terminated");
            assert!(!buf[..needed].contains(&0), "{call}: NUL inside the text");
        }
        lg_status::LG_BUFFER_TOO_SMALL => {
            assert!(
                needed >= buf.len(),
                "{call}: too small with needed {needed}"
            );
            if !b.null && !buf.is_empty() {
                assert_eq!(buf[buf.len() - 1], 0, "{call}: cut text not NUL-terminated");
            }
        }
        _ => assert_eq!(
            needed, SENTINEL as usize,
            "{call}: needed written on failure"
        ),
    }
}

fn text_buf(b: Buf) -> Vec<u8> {
    vec![0xAA; if b.null { 0 } else { usize::from(b.len % 2048) }]
}

fn buf_ptr(b: Buf, buf: &mut [u8]) -> (*mut c_char, usize) {
    if b.null {
        // NULL with a length is refused; NULL with 0 asks for the size.
        (null_mut(), usize::from(b.len % 2))
    } else {
        (buf.as_mut_ptr().cast(), buf.len())
    }
}

impl State {
    fn new() -> Self {
        State {
            monitors: Vec::new(),
            gates: Vec::new(),
            bookings: Vec::new(),
            permits: Vec::new(),
            tickets: Vec::new(),
            log: Box::default(),
            seen: 0,
            owed: 0,
        }
    }

    /// New callbacks: each is owed, carries a permit exactly when LG_OK, and
    /// its permit joins the pool.
    fn drain_callbacks(&mut self) {
        let calls = self.log.calls.lock().unwrap();
        for &(status, permit) in &calls[self.seen..] {
            assert!(self.owed > 0, "a callback ran that nobody was owed");
            self.owed -= 1;
            match status {
                lg_status::LG_OK => {
                    assert_ne!(permit, 0, "LG_OK without a permit");
                    self.permits.push(permit as *mut lg_permit);
                }
                lg_status::LG_AT_CAPACITY | lg_status::LG_QUEUE_TIMEOUT | lg_status::LG_CLOSED => {
                    assert_eq!(permit, 0, "{status:?} with a permit")
                }
                other => panic!("callback status {other:?}"),
            }
        }
        self.seen = calls.len();
    }

    #[allow(clippy::too_many_lines)]
    fn call(&mut self, call: &Call) {
        // SAFETY (for every unsafe block below): handles come from the live
        // lists, strings and buffers are valid for their lengths, and
        // out-pointers are NULL or point at locals, as the header requires.
        match call {
            Call::MonitorNew { config, out_null } => {
                let mut keep = Vec::new();
                let cfg = config.as_ref().map(|c| {
                    let (prefix, prefix_len) =
                        c.prefix.as_ref().map_or((null(), 0), |s| s.raw(&mut keep));
                    lg_monitor_config {
                        lease_ms: u64::from(c.lease_ms),
                        stale_after_ms: u64::from(c.stale_after_ms),
                        staleness: c.staleness % 4,
                        max_workers_per_model: usize::from(c.max_workers % 16),
                        metrics_prefix: prefix.cast(),
                        metrics_prefix_len: prefix_len,
                        max_models: usize::from(c.max_workers % 5),
                        max_workers: usize::from(c.max_workers % 32),
                        max_ranks_per_worker: u32::from(c.max_workers % 9),
                        max_ranks: usize::from(c.max_workers % 64),
                        max_name_len: usize::from(c.max_workers % 24),
                    }
                });
                let mut out: *mut lg_monitor = dangling();
                let st = checked("lg_monitor_new", unsafe {
                    lg_monitor_new(
                        cfg.as_ref().map_or(null(), |c| c as *const _),
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null("lg_monitor_new", st, *out_null);
                if st == lg_status::LG_OK {
                    assert!(!out.is_null());
                    self.monitors.push(out);
                } else {
                    assert_eq!(out, dangling(), "out_monitor written on failure");
                }
            }
            Call::MonitorFree(h) => unsafe { lg_monitor_free(take(&mut self.monitors, *h)) },
            Call::AddWorker { m, model, id, spec } => {
                let m = pick(&self.monitors, *m);
                let mut keep = Vec::new();
                let (p, len) = model.raw(&mut keep);
                let spec = spec.as_ref().map(worker_spec);
                let st = checked("lg_monitor_add_worker", unsafe {
                    lg_monitor_add_worker(
                        m,
                        p.cast(),
                        len,
                        u64::from(*id % 8),
                        spec.as_ref().map_or(null(), |s| s as *const _),
                    )
                });
                refuses_null("lg_monitor_add_worker", st, m.is_null() || model.invalid());
            }
            Call::RemoveWorker { m, id } => {
                let m = pick(&self.monitors, *m);
                let st = checked("lg_monitor_remove_worker", unsafe {
                    lg_monitor_remove_worker(m, u64::from(*id % 8))
                });
                refuses_null("lg_monitor_remove_worker", st, m.is_null());
            }
            Call::Report {
                m,
                id,
                rank,
                report,
            } => {
                let m = pick(&self.monitors, *m);
                let r = report.as_ref().map(worker_report);
                let st = checked("lg_monitor_report", unsafe {
                    lg_monitor_report(
                        m,
                        u64::from(*id % 8),
                        u32::from(*rank % 5),
                        r.as_ref().map_or(null(), |r| r as *const _),
                    )
                });
                refuses_null("lg_monitor_report", st, m.is_null() || r.is_none());
            }
            Call::SetThresholds {
                m,
                model,
                update,
                out_null,
            } => {
                let m = pick(&self.monitors, *m);
                let mut keep = Vec::new();
                let (p, len) = model.raw(&mut keep);
                let u = update.as_ref().map(|u| lg_threshold_update {
                    has_active_decode_blocks_threshold: u.decode.is_some(),
                    active_decode_blocks_threshold: u.decode.unwrap_or(0.0),
                    has_active_prefill_tokens_threshold: u.abs.is_some(),
                    active_prefill_tokens_threshold: u.abs.map_or(0, |v| v.0),
                    has_active_prefill_tokens_threshold_frac: u.frac.is_some(),
                    active_prefill_tokens_threshold_frac: u.frac.unwrap_or(0.0),
                    clear: u32::from(u.clear % 16),
                });
                let mut out = sentinel_thresholds();
                let st = checked("lg_monitor_set_thresholds", unsafe {
                    lg_monitor_set_thresholds(
                        m,
                        p.cast(),
                        len,
                        u.as_ref().map_or(null(), |u| u as *const _),
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null(
                    "lg_monitor_set_thresholds",
                    st,
                    m.is_null() || u.is_none() || model.invalid(),
                );
                if st != lg_status::LG_OK {
                    assert_eq!(out.version, SENTINEL, "thresholds written on failure");
                }
            }
            Call::GetThresholds { m, model, out_null } => {
                let m = pick(&self.monitors, *m);
                let mut keep = Vec::new();
                let (p, len) = model.raw(&mut keep);
                let mut out = sentinel_thresholds();
                let st = checked("lg_monitor_get_thresholds", unsafe {
                    lg_monitor_get_thresholds(
                        m,
                        p.cast(),
                        len,
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null(
                    "lg_monitor_get_thresholds",
                    st,
                    m.is_null() || *out_null || model.invalid(),
                );
                if st != lg_status::LG_OK {
                    assert_eq!(out.version, SENTINEL, "thresholds written on failure");
                }
            }
            Call::SetStaleness {
                m,
                model,
                policy,
                stale_after_ms,
            } => {
                let m = pick(&self.monitors, *m);
                let mut keep = Vec::new();
                let (p, len) = model.raw(&mut keep);
                let st = checked("lg_monitor_set_staleness", unsafe {
                    lg_monitor_set_staleness(m, p.cast(), len, *policy, u64::from(*stale_after_ms))
                });
                refuses_null(
                    "lg_monitor_set_staleness",
                    st,
                    m.is_null() || model.invalid() || *policy > 2 || *stale_after_ms == 0,
                );
            }
            Call::Sweep { m, out_null } => {
                let m = pick(&self.monitors, *m);
                let mut out = SENTINEL as usize;
                let st = checked("lg_monitor_sweep", unsafe {
                    lg_monitor_sweep(m, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_monitor_sweep", st, m.is_null());
            }
            Call::IsBusy {
                m,
                id,
                leased,
                out_null,
            } => {
                let m = pick(&self.monitors, *m);
                let mut out = false;
                let out_ptr: *mut bool = if *out_null { null_mut() } else { &mut out };
                let st = if *leased {
                    checked("lg_monitor_is_leased", unsafe {
                        lg_monitor_is_leased(m, u64::from(*id % 8), out_ptr)
                    })
                } else {
                    checked("lg_monitor_is_busy", unsafe {
                        lg_monitor_is_busy(m, u64::from(*id % 8), out_ptr)
                    })
                };
                refuses_null("lg_monitor_is_busy/leased", st, m.is_null() || *out_null);
            }
            Call::Select {
                m,
                model,
                policy,
                out_null,
            } => {
                let m = pick(&self.monitors, *m);
                let mut keep = Vec::new();
                let (p, len) = model.raw(&mut keep);
                let mut out = SENTINEL;
                let st = checked("lg_monitor_select", unsafe {
                    lg_monitor_select(
                        m,
                        p.cast(),
                        len,
                        *policy,
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null(
                    "lg_monitor_select",
                    st,
                    m.is_null() || *out_null || model.invalid() || *policy > 2,
                );
                if st != lg_status::LG_OK {
                    assert_eq!(out, SENTINEL, "worker id written on failure");
                }
            }
            Call::SelectMinCost {
                m,
                model,
                cands,
                null_arrays,
                out_null,
            } => {
                let m = pick(&self.monitors, *m);
                let mut keep = Vec::new();
                let (p, len) = model.raw(&mut keep);
                let ids: Vec<u64> = cands.iter().take(16).map(|c| u64::from(c.0 % 10)).collect();
                let costs: Vec<f64> = cands.iter().take(16).map(|c| c.1).collect();
                let (ids_ptr, costs_ptr) = if *null_arrays {
                    (null(), null())
                } else {
                    (ids.as_ptr(), costs.as_ptr())
                };
                let mut out = SENTINEL;
                let st = checked("lg_monitor_select_min_cost", unsafe {
                    lg_monitor_select_min_cost(
                        m,
                        p.cast(),
                        len,
                        ids_ptr,
                        costs_ptr,
                        ids.len(),
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null(
                    "lg_monitor_select_min_cost",
                    st,
                    m.is_null()
                        || *out_null
                        || model.invalid()
                        || (*null_arrays && !ids.is_empty()),
                );
                if st == lg_status::LG_OK {
                    assert!(ids.contains(&out), "picked {out}, not a candidate");
                } else {
                    assert_eq!(out, SENTINEL, "worker id written on failure");
                }
            }
            Call::Check { m, id, mark } => {
                let m = pick(&self.monitors, *m);
                let st = if *mark {
                    checked("lg_monitor_mark_overloaded", unsafe {
                        lg_monitor_mark_overloaded(m, u64::from(*id % 8))
                    })
                } else {
                    checked("lg_monitor_check", unsafe {
                        lg_monitor_check(m, u64::from(*id % 8))
                    })
                };
                refuses_null("lg_monitor_check/mark", st, m.is_null());
            }
            Call::MonitorMetrics {
                m,
                buf: b,
                out_null,
            } => {
                let m = pick(&self.monitors, *m);
                let mut buf = text_buf(*b);
                let (bp, bl) = buf_ptr(*b, &mut buf);
                let mut needed = SENTINEL as usize;
                let st = checked("lg_monitor_metrics", unsafe {
                    lg_monitor_metrics(m, bp, bl, if *out_null { null_mut() } else { &mut needed })
                });
                refuses_null(
                    "lg_monitor_metrics",
                    st,
                    m.is_null() || *out_null || (bp.is_null() && bl > 0),
                );
                if !*out_null {
                    check_text("lg_monitor_metrics", st, &buf, *b, needed);
                }
            }
            Call::BusyThreshold {
                m,
                method,
                content_type,
                body,
                buf: b,
                status_null,
                needed_null,
            } => {
                let m = pick(&self.monitors, *m);
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
            Call::Book {
                m,
                id,
                rank,
                blocks,
                out_null,
            } => {
                let m = pick(&self.monitors, *m);
                let mut out: *mut lg_booking = dangling();
                let st = checked("lg_monitor_book", unsafe {
                    lg_monitor_book(
                        m,
                        u64::from(*id % 8),
                        u32::from(*rank % 5),
                        blocks.0,
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null("lg_monitor_book", st, m.is_null() || *out_null);
                if st == lg_status::LG_OK {
                    self.bookings.push(out);
                } else {
                    assert_eq!(out, dangling(), "booking written on failure");
                }
            }
            Call::BookingAdd { b, blocks } => {
                let b = pick(&self.bookings, *b);
                let st = checked("lg_booking_add_output_blocks", unsafe {
                    lg_booking_add_output_blocks(b, blocks.0)
                });
                refuses_null("lg_booking_add_output_blocks", st, b.is_null());
            }
            Call::BookingBlocks { b, out_null } => {
                let b = pick(&self.bookings, *b);
                let mut out = SENTINEL;
                let st = checked("lg_booking_blocks", unsafe {
                    lg_booking_blocks(b, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_booking_blocks", st, b.is_null() || *out_null);
            }
            Call::BookingFree(b) => unsafe { lg_booking_free(take(&mut self.bookings, *b)) },
            Call::GateConfigDefault { limit, out_null } => {
                let mut out = std::mem::MaybeUninit::<lg_gate_config>::uninit();
                let st = checked("lg_gate_config_default", unsafe {
                    lg_gate_config_default(
                        *limit,
                        if *out_null {
                            null_mut()
                        } else {
                            out.as_mut_ptr()
                        },
                    )
                });
                refuses_null("lg_gate_config_default", st, *out_null);
                if st == lg_status::LG_OK {
                    // SAFETY: written on LG_OK.
                    assert_eq!(unsafe { out.assume_init() }.limit, *limit);
                }
            }
            Call::GateNew { config, out_null } => {
                let mut keep = Vec::new();
                let cfg = config.as_ref().map(|c| {
                    let (prefix, prefix_len) =
                        c.prefix.as_ref().map_or((null(), 0), |s| s.raw(&mut keep));
                    lg_gate_config {
                        limit: if c.limit == 255 {
                            2_097_152
                        } else {
                            u32::from(c.limit % 5)
                        },
                        queue: if c.queue == 255 {
                            2_097_152
                        } else {
                            u32::from(c.queue % 40)
                        },
                        queue_timeout_ms: [0, 0, 1, 60_000][usize::from(c.timeout_ms % 4)],
                        adaptive_lifo: c.lifo,
                        metrics_prefix: prefix.cast(),
                        metrics_prefix_len: prefix_len,
                    }
                });
                let mut out: *mut lg_gate = dangling();
                let st = checked("lg_gate_new", unsafe {
                    lg_gate_new(
                        cfg.as_ref().map_or(null(), |c| c as *const _),
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null("lg_gate_new", st, *out_null || cfg.is_none());
                if st == lg_status::LG_OK {
                    self.gates.push(out);
                } else {
                    assert_eq!(out, dangling(), "out_gate written on failure");
                }
            }
            Call::GateFromEnv { limit, out_null } => {
                let mut out: *mut lg_gate = dangling();
                let st = checked("lg_gate_from_env", unsafe {
                    lg_gate_from_env(
                        u32::from(*limit % 4),
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null("lg_gate_from_env", st, *out_null || *limit % 4 == 0);
                if st == lg_status::LG_OK {
                    self.gates.push(out);
                } else {
                    assert_eq!(out, dangling(), "out_gate written on failure");
                }
            }
            Call::GateFree(g) => {
                let g = take(&mut self.gates, *g);
                if !g.is_null() {
                    // Queued callbacks would outlive the input's log: close
                    // first so they run now.
                    checked("lg_gate_close", unsafe { lg_gate_close(g) });
                }
                unsafe { lg_gate_free(g) }
            }
            Call::TryAdmit { g, out_null } => {
                let g = pick(&self.gates, *g);
                let mut out: *mut lg_permit = dangling();
                let st = checked("lg_gate_try_admit", unsafe {
                    lg_gate_try_admit(g, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_gate_try_admit", st, g.is_null() || *out_null);
                if st == lg_status::LG_OK {
                    self.permits.push(out);
                } else {
                    assert_eq!(out, dangling(), "permit written on failure");
                }
            }
            Call::Admit { g, wait, out_null } => {
                let g = pick(&self.gates, *g);
                // Wait without limit only when a slot is free and nobody
                // queues (this thread is the only caller), else time out at
                // once: the target never sleeps.
                let free = !g.is_null() && {
                    let s = stats(g);
                    s.closed || (s.running < s.limit && s.queued == 0)
                };
                let timeout = if *wait && free {
                    LG_TIMEOUT_INFINITE
                } else {
                    0
                };
                let mut out: *mut lg_permit = dangling();
                let st = checked("lg_gate_admit", unsafe {
                    lg_gate_admit(g, timeout, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_gate_admit", st, g.is_null() || *out_null);
                if st == lg_status::LG_OK {
                    self.permits.push(out);
                } else {
                    assert_eq!(out, dangling(), "permit written on failure");
                }
            }
            Call::AdmitAsync {
                g,
                callback_null,
                want_ticket,
            } => {
                let g = pick(&self.gates, *g);
                let mut ticket: *mut lg_ticket = dangling();
                let callback: lg_admit_callback =
                    if *callback_null { None } else { Some(on_admit) };
                // Counted before the call: the callback may run inside it.
                self.owed += 1;
                let st = checked("lg_gate_admit_async", unsafe {
                    lg_gate_admit_async(
                        g,
                        callback,
                        (&*self.log as *const CallbackLog).cast_mut().cast(),
                        if *want_ticket {
                            &mut ticket
                        } else {
                            null_mut()
                        },
                    )
                });
                refuses_null("lg_gate_admit_async", st, g.is_null() || *callback_null);
                if st == lg_status::LG_OK {
                    if *want_ticket {
                        assert_ne!(ticket, dangling(), "no ticket");
                        self.tickets.push(ticket);
                    }
                } else {
                    self.owed -= 1;
                    assert_eq!(ticket, dangling(), "ticket written on failure");
                }
            }
            Call::SetLimit { g, limit } => {
                let g = pick(&self.gates, *g);
                let limit = if *limit > 2_097_151 {
                    *limit
                } else {
                    *limit % 6
                };
                let st = checked("lg_gate_set_limit", unsafe { lg_gate_set_limit(g, limit) });
                refuses_null(
                    "lg_gate_set_limit",
                    st,
                    g.is_null() || limit == 0 || limit > 2_097_151,
                );
            }
            Call::Close(g) => {
                let g = pick(&self.gates, *g);
                let st = checked("lg_gate_close", unsafe { lg_gate_close(g) });
                refuses_null("lg_gate_close", st, g.is_null());
            }
            Call::Expire { g, out_null } => {
                let g = pick(&self.gates, *g);
                let mut out = SENTINEL as usize;
                let st = checked("lg_gate_expire", unsafe {
                    lg_gate_expire(g, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_gate_expire", st, g.is_null());
            }
            Call::NextDeadline { g, out_null } => {
                let g = pick(&self.gates, *g);
                let mut out = SENTINEL;
                let st = checked("lg_gate_next_deadline", unsafe {
                    lg_gate_next_deadline(g, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_gate_next_deadline", st, g.is_null() || *out_null);
            }
            Call::Stats { g, out_null } => {
                let g = pick(&self.gates, *g);
                let mut out = std::mem::MaybeUninit::<lg_gate_stats>::uninit();
                let st = checked("lg_gate_get_stats", unsafe {
                    lg_gate_get_stats(
                        g,
                        if *out_null {
                            null_mut()
                        } else {
                            out.as_mut_ptr()
                        },
                    )
                });
                refuses_null("lg_gate_get_stats", st, g.is_null() || *out_null);
                if st == lg_status::LG_OK {
                    // SAFETY: written on LG_OK.
                    let s = unsafe { out.assume_init() };
                    assert!(s.queued <= s.queue_limit, "{s:?}");
                }
            }
            Call::GateMetrics {
                g,
                buf: b,
                out_null,
            } => {
                let g = pick(&self.gates, *g);
                let mut buf = text_buf(*b);
                let (bp, bl) = buf_ptr(*b, &mut buf);
                let mut needed = SENTINEL as usize;
                let st = checked("lg_gate_metrics", unsafe {
                    lg_gate_metrics(g, bp, bl, if *out_null { null_mut() } else { &mut needed })
                });
                refuses_null(
                    "lg_gate_metrics",
                    st,
                    g.is_null() || *out_null || (bp.is_null() && bl > 0),
                );
                if !*out_null {
                    check_text("lg_gate_metrics", st, &buf, *b, needed);
                }
            }
            Call::PermitRelease(p) => unsafe { lg_permit_release(take(&mut self.permits, *p)) },
            Call::TicketCancel { t, out_null } => {
                let t = pick(&self.tickets, *t);
                let mut out = false;
                let st = checked("lg_ticket_cancel", unsafe {
                    lg_ticket_cancel(t, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_ticket_cancel", st, t.is_null() || *out_null);
                if st == lg_status::LG_OK && out {
                    // Its callback will never run.
                    self.drain_callbacks();
                    self.owed -= 1;
                }
            }
            Call::TicketIsQueued { t, out_null } => {
                let t = pick(&self.tickets, *t);
                let mut out = false;
                let st = checked("lg_ticket_is_queued", unsafe {
                    lg_ticket_is_queued(t, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_ticket_is_queued", st, t.is_null() || *out_null);
            }
            Call::TicketFree(t) => unsafe { lg_ticket_free(take(&mut self.tickets, *t)) },
            Call::StatusText(s) => {
                // Any int: a static string, an HTTP status, a reason or NULL.
                let text = unsafe { CStr::from_ptr(lg_status_str(*s)) };
                assert!(!text.to_bytes().is_empty());
                let http = lg_status_http(*s);
                assert!((200..=999).contains(&http), "HTTP status {http}");
                let reason = lg_status_reason(*s);
                if !reason.is_null() {
                    assert!(!unsafe { CStr::from_ptr(reason) }.to_bytes().is_empty());
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
            Call::MonitorConfigDefault { out_null } => {
                let mut out = std::mem::MaybeUninit::<lg_monitor_config>::uninit();
                let st = checked("lg_monitor_config_default", unsafe {
                    lg_monitor_config_default(if *out_null {
                        null_mut()
                    } else {
                        out.as_mut_ptr()
                    })
                });
                refuses_null("lg_monitor_config_default", st, *out_null);
                if st == lg_status::LG_OK {
                    // SAFETY: written on LG_OK; the defaults must be accepted.
                    let config = unsafe { out.assume_init() };
                    let mut m: *mut lg_monitor = null_mut();
                    let st = checked("lg_monitor_new", unsafe { lg_monitor_new(&config, &mut m) });
                    assert_eq!(st, lg_status::LG_OK, "the default config is refused");
                    self.monitors.push(m);
                }
            }
            Call::ReporterNew {
                url,
                namespace,
                id,
                model,
                spec,
                fault,
            } => {
                let (mut k1, mut k2, mut k3) = (Vec::new(), Vec::new(), Vec::new());
                let (mut up, mut ul) = url.raw(&mut k1);
                let (mut np, mut nl) = namespace.raw(&mut k2);
                let (mut mp, mut ml) = model.raw(&mut k3);
                let mut spec = spec.as_ref().map(worker_spec);
                let mut out: *mut lg_reporter = dangling();
                let mut out_ptr: *mut *mut lg_reporter = &mut out;
                match fault % 6 {
                    0 => out_ptr = null_mut(),
                    1 => (up, ul) = (null(), 7),
                    2 => (mp, ml) = (null(), 0), // empty model
                    3 => (np, nl) = (b"a.b".as_ptr(), 3),
                    4 => (np, nl) = (null(), 0), // empty namespace
                    _ => {
                        spec = Some(lg_worker_spec {
                            dp_start: u32::MAX,
                            dp_size: 2,
                            ..worker_spec(&Spec::default())
                        })
                    }
                }
                let st = checked("lg_reporter_new", unsafe {
                    lg_reporter_new(
                        up.cast(),
                        ul,
                        np.cast(),
                        nl,
                        u64::from(*id),
                        mp.cast(),
                        ml,
                        spec.as_ref().map_or(null(), |s| s as *const _),
                        out_ptr,
                    )
                });
                assert_eq!(
                    st,
                    lg_status::LG_INVALID_ARGUMENT,
                    "lg_reporter_new, fault {fault}"
                );
                assert_eq!(out, dangling(), "reporter written on failure");
            }
            Call::Subscribe {
                m,
                url,
                namespace,
                fault,
            } => {
                let mut m = pick(&self.monitors, *m);
                let (mut k1, mut k2) = (Vec::new(), Vec::new());
                let (mut up, mut ul) = url.raw(&mut k1);
                let (mut np, mut nl) = namespace.raw(&mut k2);
                let mut out: *mut lg_subscription = dangling();
                let mut out_ptr: *mut *mut lg_subscription = &mut out;
                match fault % 5 {
                    0 => out_ptr = null_mut(),
                    1 => m = null_mut(),
                    2 => (up, ul) = (null(), 3),
                    3 => (np, nl) = (b"x y".as_ptr(), 3),
                    _ => (np, nl) = (b">".as_ptr(), 1),
                }
                let st = checked("lg_monitor_subscribe_nats", unsafe {
                    lg_monitor_subscribe_nats(m, up.cast(), ul, np.cast(), nl, out_ptr)
                });
                assert_eq!(
                    st,
                    lg_status::LG_INVALID_ARGUMENT,
                    "lg_monitor_subscribe_nats, fault {fault}"
                );
                assert_eq!(out, dangling(), "subscription written on failure");
            }
            Call::NullNatsHandles { out_null } => {
                let report = worker_report(&Report::default());
                let st = checked("lg_reporter_report", unsafe {
                    lg_reporter_report(null(), 0, &report)
                });
                refuses_null("lg_reporter_report", st, true);
                let mut rs = std::mem::MaybeUninit::<lg_reporter_stats>::uninit();
                let st = checked("lg_reporter_get_stats", unsafe {
                    lg_reporter_get_stats(
                        null(),
                        if *out_null {
                            null_mut()
                        } else {
                            rs.as_mut_ptr()
                        },
                    )
                });
                refuses_null("lg_reporter_get_stats", st, true);
                let mut ss = std::mem::MaybeUninit::<lg_subscription_stats>::uninit();
                let st = checked("lg_subscription_get_stats", unsafe {
                    lg_subscription_get_stats(
                        null(),
                        if *out_null {
                            null_mut()
                        } else {
                            ss.as_mut_ptr()
                        },
                    )
                });
                refuses_null("lg_subscription_get_stats", st, true);
                unsafe {
                    lg_reporter_free(null_mut());
                    lg_subscription_free(null_mut());
                }
            }
            Call::Version => {
                let v = unsafe { CStr::from_ptr(lg_version()) }.to_str().unwrap();
                assert_eq!(v.split('.').count(), 3, "{v}");
                let _ = lg_overload_status();
            }
        }
        self.drain_callbacks();
    }

    /// Frees everything the input created; LeakSanitizer checks the rest.
    fn finish(mut self) {
        for g in std::mem::take(&mut self.gates) {
            unsafe {
                checked("lg_gate_close", lg_gate_close(g));
                lg_gate_free(g);
            }
        }
        self.drain_callbacks();
        assert_eq!(self.owed, 0, "callbacks owed after every gate closed");
        for p in std::mem::take(&mut self.permits) {
            unsafe { lg_permit_release(p) };
        }
        for t in std::mem::take(&mut self.tickets) {
            unsafe { lg_ticket_free(t) };
        }
        for b in std::mem::take(&mut self.bookings) {
            unsafe { lg_booking_free(b) };
        }
        for m in std::mem::take(&mut self.monitors) {
            unsafe { lg_monitor_free(m) };
        }
    }
}

fn worker_spec(s: &Spec) -> lg_worker_spec {
    lg_worker_spec {
        dp_start: if s.dp_start_high {
            u32::MAX - u32::from(s.dp_start % 4)
        } else {
            u32::from(s.dp_start % 4)
        },
        dp_size: u32::from(s.dp_size % 4),
        has_kv_total_blocks: s.total.is_some(),
        kv_total_blocks: s.total.map_or(0, |v| v.0),
        has_max_num_batched_tokens: s.mnbt.is_some(),
        max_num_batched_tokens: s.mnbt.map_or(0, |v| v.0),
    }
}

fn worker_report(r: &Report) -> lg_load_report {
    lg_load_report {
        has_active_decode_blocks: r.decode.is_some(),
        active_decode_blocks: r.decode.map_or(0, |v| v.0),
        has_kv_used_blocks: r.used.is_some(),
        kv_used_blocks: r.used.map_or(0, |v| v.0),
        has_kv_total_blocks: r.total.is_some(),
        kv_total_blocks: r.total.map_or(0, |v| v.0),
        has_active_prefill_tokens: r.prefill.is_some(),
        active_prefill_tokens: r.prefill.map_or(0, |v| v.0),
        has_max_num_batched_tokens: r.mnbt.is_some(),
        max_num_batched_tokens: r.mnbt.map_or(0, |v| v.0),
    }
}

fn sentinel_thresholds() -> lg_thresholds {
    lg_thresholds {
        has_active_decode_blocks_threshold: false,
        active_decode_blocks_threshold: 0.0,
        has_active_prefill_tokens_threshold: false,
        active_prefill_tokens_threshold: 0,
        has_active_prefill_tokens_threshold_frac: false,
        active_prefill_tokens_threshold_frac: 0.0,
        version: SENTINEL,
    }
}

fn stats(g: *mut lg_gate) -> lg_gate_stats {
    let mut out = std::mem::MaybeUninit::<lg_gate_stats>::uninit();
    // SAFETY: `g` is a live gate and `out` is writable.
    let st = unsafe { lg_gate_get_stats(g, out.as_mut_ptr()) };
    assert_eq!(st, lg_status::LG_OK);
    // SAFETY: written on LG_OK.
    unsafe { out.assume_init() }
}

fuzz_target!(|calls: Vec<Call>| {
    let mut state = State::new();
    for call in calls.iter().take(128) {
        state.call(call);
    }
    state.finish();
});
