//! Frontend flow control: `lg_flow_config_default`,
//! `lg_monitor_set_flow_control` (settings at and past the ends of their
//! ranges, tenant weights as an array or NULL with a count), dispatch
//! through the blocking `lg_monitor_dispatch` with a zero timeout (so no
//! call waits: a request that would queue gives up at once and leaves the
//! queue), a worker's refusal handed back with `lg_monitor_redispatch`
//! (any dispatch, on any monitor, also with a zero timeout), and the
//! `lg_dispatch_*` calls on the dispatches it made. The
//! callback form is not called: its callbacks run on the monitor's
//! maintenance thread.

use std::ptr::{null, null_mut};

use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use loadgate_ffi::*;

use crate::args::{worker_report, worker_spec, Count, Handle, Report, Small, Spec, Str, KNOWN};
use crate::state::{checked, dangling, pick, refuses_null, take, State, SENTINEL};

/// A tenant's weight or a cost weight: in range most of the time, at its
/// ends or anything (NaN, infinite, negative, zero) sometimes.
#[derive(Debug, Clone, Copy)]
pub struct Weight(pub f64);

impl<'a> Arbitrary<'a> for Weight {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        const TYPICAL: [f64; 6] = [1.0, 2.0, 0.5, 1e-6, 1e6, 3.25];
        Ok(Weight(match u.arbitrary::<u8>()? {
            0..=199 => TYPICAL[usize::from(u.int_in_range(0u8..=5)?)],
            200..=219 => [0.0, -1.0, f64::NAN, f64::INFINITY, 9.9e-7, 1.0000001e6]
                [usize::from(u.int_in_range(0u8..=5)?)],
            _ => u.arbitrary()?,
        }))
    }
}

/// Tenant weights: an array (a few entries, any strings), or NULL with a
/// count (refused unless the count is 0).
#[derive(Debug, Arbitrary)]
pub enum Weights {
    Array(Vec<(Str, Weight)>),
    Null(u8),
}

/// A queue's settings: lg_flow_config_default()'s, each overridden or not.
#[derive(Debug, Arbitrary)]
pub struct FlowSettings {
    pub queue_limit: Count,
    pub queue_tokens: Option<Small>,
    pub deadline_ms: Option<Small>,
    pub prompt_weight: Option<Weight>,
    pub output_weight: Option<Weight>,
    pub output_estimate: Option<Small>,
    pub max_tenants: Option<Count>,
    pub scale_up_limit: Option<Count>,
    pub policy: Option<u32>,
    pub weights: Option<Weights>,
}

/// A request's tenant: any string argument, or one of `len % 600` bytes
/// (past 256 is refused).
#[derive(Debug, Arbitrary)]
pub enum Tenant {
    Str(Str),
    Long(u16),
}

/// A dispatch request: lg_dispatch_request_default()'s, each field
/// overridden or not.
#[derive(Debug, Arbitrary)]
pub struct Request {
    pub tenant: Option<Tenant>,
    pub priority: Option<u8>,
    pub prompt_tokens: Option<Small>,
    pub max_tokens: Option<Small>,
    pub deadline_ms: Option<Small>,
    pub queue: Option<bool>,
    pub blocks: Option<Small>,
}

/// What a call does with a dispatch.
#[derive(Debug, Arbitrary)]
pub enum DispatchOp {
    Worker,
    DpRank,
    AddOutputBlocks(Small),
    ReportOutput(Small),
    PrefillDone,
    Complete(Small),
}

/// A flow-control call.
#[derive(Debug, Arbitrary)]
pub enum Call {
    FlowConfigDefault {
        queue_limit: Count,
        out_null: bool,
    },
    /// `lg_monitor_set_flow_control`; no settings: a NULL config (off).
    SetFlowControl {
        m: Handle,
        model: Str,
        settings: Option<FlowSettings>,
    },
    /// A new monitor whose model "llama" has one worker (id 1, 100 KV
    /// blocks, busy above half), busy or not, with a queue of these
    /// settings (default: 8 requests) or, if they are refused, none, and
    /// perhaps without its worker: the states where a request would wait.
    Fleet {
        busy: bool,
        remove_worker: bool,
        settings: Option<FlowSettings>,
    },
    DispatchRequestDefault {
        out_null: bool,
    },
    /// `lg_monitor_dispatch` with timeout_ms = 0; no request: NULL.
    Dispatch {
        m: Handle,
        model: Str,
        request: Option<Request>,
        out_null: bool,
    },
    /// `lg_monitor_redispatch` with timeout_ms = 0 of a dispatch (NULL or
    /// one of the live ones, which it takes), on any monitor.
    Redispatch {
        m: Handle,
        d: Handle,
        out_null: bool,
    },
    /// A call on a dispatch (NULL or one of the live ones).
    OnDispatch {
        d: Handle,
        op: DispatchOp,
    },
}

/// The statuses a dispatch may end in.
const DISPATCH_STATUSES: [lg_status; 7] = [
    lg_status::LG_OK,
    lg_status::LG_QUEUE_FULL,
    lg_status::LG_QUEUE_DEADLINE,
    lg_status::LG_OVERLOADED,
    lg_status::LG_UNAVAILABLE,
    lg_status::LG_TIMED_OUT,
    lg_status::LG_INVALID_ARGUMENT,
];

impl Call {
    /// Makes the call on the input's handles and checks its status,
    /// out-parameters and error message.
    pub fn apply(&self, state: &mut State) {
        match self {
            Call::FlowConfigDefault {
                queue_limit,
                out_null,
            } => {
                let mut out = std::mem::MaybeUninit::<lg_flow_config>::uninit();
                // SAFETY: each out-pointer is NULL or points at a local.
                let st = checked("lg_flow_config_default", unsafe {
                    lg_flow_config_default(
                        queue_limit.0,
                        if *out_null {
                            null_mut()
                        } else {
                            out.as_mut_ptr()
                        },
                    )
                });
                refuses_null("lg_flow_config_default", st, *out_null);
                if st == lg_status::LG_OK {
                    // SAFETY: written on LG_OK.
                    let config = unsafe { out.assume_init() };
                    assert_eq!(config.queue_limit, queue_limit.0);
                    assert!(config.tenant_weights.is_null() && config.tenant_weight_count == 0);
                }
            }
            Call::SetFlowControl { m, model, settings } => {
                let m = pick(&state.monitors, *m);
                let mut keep = Vec::new();
                let (p, len) = model.raw(&mut keep);
                let built = settings.as_ref().map(Built::new);
                let bad_weights = built.as_ref().is_some_and(|b| b.bad_weights);
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; `(p, len)` comes
                // from `Str::raw`: NULL or valid for `len` bytes; the config is NULL or one that
                // `Built` holds valid.
                let st = checked("lg_monitor_set_flow_control", unsafe {
                    lg_monitor_set_flow_control(
                        m,
                        p.cast(),
                        len,
                        built.as_ref().map_or(null(), |b| &b.config as *const _),
                    )
                });
                refuses_null(
                    "lg_monitor_set_flow_control",
                    st,
                    m.is_null() || model.invalid() || bad_weights,
                );
                assert!(
                    matches!(
                        st,
                        lg_status::LG_OK | lg_status::LG_NOT_FOUND | lg_status::LG_INVALID_ARGUMENT
                    ),
                    "lg_monitor_set_flow_control: {st:?}"
                );
            }
            Call::Fleet {
                busy,
                remove_worker,
                settings,
            } => state
                .monitors
                .push(fleet(*busy, *remove_worker, settings.as_ref())),
            Call::DispatchRequestDefault { out_null } => {
                let mut out = std::mem::MaybeUninit::<lg_dispatch_request>::uninit();
                // SAFETY: each out-pointer is NULL or points at a local.
                let st = checked("lg_dispatch_request_default", unsafe {
                    lg_dispatch_request_default(if *out_null {
                        null_mut()
                    } else {
                        out.as_mut_ptr()
                    })
                });
                refuses_null("lg_dispatch_request_default", st, *out_null);
                if st == lg_status::LG_OK {
                    // SAFETY: written on LG_OK.
                    let r = unsafe { out.assume_init() };
                    assert!(r.tenant.is_null() && r.tenant_len == 0 && r.queue);
                    assert_eq!(r.max_tokens, LG_NO_MAX_TOKENS);
                }
            }
            Call::Dispatch {
                m,
                model,
                request,
                out_null,
            } => {
                let m = pick(&state.monitors, *m);
                let mut keep = Vec::new();
                let (p, len) = model.raw(&mut keep);
                let mut tenant_keep = Vec::new();
                let mut tenant_bad = false;
                let mut tenant_long = false;
                let r = request.as_ref().map(|q| {
                    let mut r = std::mem::MaybeUninit::<lg_dispatch_request>::uninit();
                    // SAFETY: `r` is a local, writable.
                    let st = unsafe { lg_dispatch_request_default(r.as_mut_ptr()) };
                    assert_eq!(st, lg_status::LG_OK);
                    // SAFETY: written on LG_OK.
                    let mut r = unsafe { r.assume_init() };
                    match &q.tenant {
                        Some(Tenant::Str(s)) => {
                            let (tp, tl) = s.raw(&mut tenant_keep);
                            r.tenant = tp.cast();
                            r.tenant_len = tl;
                            tenant_bad = s.invalid();
                            tenant_long = tl > 256;
                        }
                        Some(Tenant::Long(n)) => {
                            tenant_keep = vec![b't'; usize::from(*n % 600)];
                            r.tenant = tenant_keep.as_ptr().cast();
                            r.tenant_len = tenant_keep.len();
                            tenant_long = tenant_keep.len() > 256;
                        }
                        None => {}
                    }
                    if let Some(v) = q.priority {
                        r.priority = v;
                    }
                    if let Some(v) = q.prompt_tokens {
                        r.prompt_tokens = v.0;
                    }
                    if let Some(v) = q.max_tokens {
                        r.max_tokens = v.0;
                    }
                    if let Some(v) = q.deadline_ms {
                        r.deadline_ms = v.0;
                    }
                    if let Some(v) = q.queue {
                        r.queue = v;
                    }
                    if let Some(v) = q.blocks {
                        r.blocks = v.0;
                    }
                    r
                });
                let mut out: *mut lg_dispatch = dangling();
                // SAFETY: `m` is NULL or a live monitor from `State::monitors`; `(p, len)` comes
                // from `Str::raw`: NULL or valid for `len` bytes; the request is NULL or a local
                // whose tenant is NULL or valid for its length (`Str::raw` or `tenant_keep`); the
                // out-pointer is NULL or a local. A zero timeout never waits.
                let st = checked("lg_monitor_dispatch", unsafe {
                    lg_monitor_dispatch(
                        m,
                        p.cast(),
                        len,
                        r.as_ref().map_or(null(), |r| r as *const _),
                        0,
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                let refused = m.is_null() || model.invalid() || r.is_none() || *out_null;
                refuses_null("lg_monitor_dispatch", st, refused || tenant_bad);
                assert!(
                    DISPATCH_STATUSES.contains(&st),
                    "lg_monitor_dispatch: {st:?}"
                );
                if st == lg_status::LG_INVALID_ARGUMENT {
                    assert!(
                        refused || tenant_bad || tenant_long,
                        "lg_monitor_dispatch refused a valid request: {}",
                        crate::state::last_error()
                    );
                }
                if st == lg_status::LG_OK {
                    assert!(!out.is_null());
                    // SAFETY: a dispatch just made, live.
                    let worker = unsafe { lg_dispatch_worker(out) };
                    assert!(worker < 8, "dispatched to worker {worker}, never added");
                    state.dispatches.push(out);
                } else {
                    assert_eq!(out, dangling(), "dispatch written on failure");
                }
                // A request that gave up left the queue: nothing waits.
                assert_no_waiting(m);
            }
            Call::Redispatch { m, d, out_null } => {
                let m = pick(&state.monitors, *m);
                let d = take(&mut state.dispatches, *d);
                let mut out: *mut lg_dispatch = dangling();
                let out_ptr = if *out_null { null_mut() } else { &mut out };
                // SAFETY: `m` is NULL or live; `take` removed `d` from the
                // state (or gave NULL), so the call takes it once; `out_ptr`
                // is NULL or points at a local.
                let st = checked("lg_monitor_redispatch", unsafe {
                    lg_monitor_redispatch(m, d, 0, out_ptr)
                });
                refuses_null(
                    "lg_monitor_redispatch",
                    st,
                    m.is_null() || d.is_null() || *out_null,
                );
                assert!(DISPATCH_STATUSES.contains(&st), "redispatch: {st:?}");
                if st == lg_status::LG_OK {
                    state.dispatches.push(out);
                } else {
                    assert_eq!(out, dangling(), "redispatch written on {st:?}");
                }
                // A request that gave up left the queue: nothing waits.
                assert_no_waiting(m);
            }
            Call::OnDispatch { d, op } => {
                if let DispatchOp::Complete(tokens) = op {
                    let d = take(&mut state.dispatches, *d);
                    // SAFETY: `take` removes the dispatch from `State::dispatches` (or gives NULL,
                    // a no-op), so it is completed once and never used again.
                    unsafe { lg_dispatch_complete(d, tokens.0) };
                    return;
                }
                let d = pick(&state.dispatches, *d);
                // SAFETY (each call below): `d` is NULL or a live dispatch from
                // `State::dispatches`, used by this thread alone.
                match op {
                    DispatchOp::Worker => {
                        // SAFETY: as above.
                        let w = unsafe { lg_dispatch_worker(d) };
                        assert!(if d.is_null() { w == 0 } else { w < 8 });
                    }
                    DispatchOp::DpRank => {
                        // SAFETY: as above.
                        let rank = unsafe { lg_dispatch_dp_rank(d) };
                        assert!(!d.is_null() || rank == 0);
                    }
                    DispatchOp::AddOutputBlocks(n) => {
                        // SAFETY: as above.
                        let st = checked("lg_dispatch_add_output_blocks", unsafe {
                            lg_dispatch_add_output_blocks(d, n.0)
                        });
                        refuses_null("lg_dispatch_add_output_blocks", st, d.is_null());
                        assert!(d.is_null() || st == lg_status::LG_OK);
                    }
                    DispatchOp::ReportOutput(n) => {
                        // SAFETY: as above.
                        let st = checked("lg_dispatch_report_output", unsafe {
                            lg_dispatch_report_output(d, n.0)
                        });
                        refuses_null("lg_dispatch_report_output", st, d.is_null());
                        assert!(d.is_null() || st == lg_status::LG_OK);
                    }
                    DispatchOp::PrefillDone => {
                        // SAFETY: as above.
                        let st = checked("lg_dispatch_prefill_done", unsafe {
                            lg_dispatch_prefill_done(d)
                        });
                        refuses_null("lg_dispatch_prefill_done", st, d.is_null());
                        assert!(d.is_null() || st == lg_status::LG_OK);
                    }
                    DispatchOp::Complete(_) => unreachable!("handled above"),
                }
            }
        }
    }
}

/// An lg_flow_config from lg_flow_config_default() and `FlowSettings`,
/// with what its pointers point at.
struct Built {
    config: lg_flow_config,
    /// Whether the tenant weights are refused as such (NULL with a count,
    /// or a name that is not a valid string).
    bad_weights: bool,
    /// Behind `config.tenant_weights`, and the cut names behind theirs (a
    /// Vec's buffer stays put when the Vec moves).
    weights: Vec<lg_tenant_weight>,
    names: Vec<Vec<u8>>,
}

impl Built {
    fn new(s: &FlowSettings) -> Self {
        let mut c = std::mem::MaybeUninit::<lg_flow_config>::uninit();
        // SAFETY: `c` is a local, writable.
        let st = unsafe { lg_flow_config_default(s.queue_limit.0, c.as_mut_ptr()) };
        assert_eq!(st, lg_status::LG_OK);
        // SAFETY: written on LG_OK.
        let mut c = unsafe { c.assume_init() };
        let or = |v: Option<Small>, d: u64| v.map_or(d, |v| v.0);
        c.queue_tokens = or(s.queue_tokens, c.queue_tokens);
        c.deadline_ms = or(s.deadline_ms, c.deadline_ms);
        c.output_estimate = or(s.output_estimate, c.output_estimate);
        c.prompt_weight = s.prompt_weight.map_or(c.prompt_weight, |w| w.0);
        c.output_weight = s.output_weight.map_or(c.output_weight, |w| w.0);
        c.max_tenants = s.max_tenants.map_or(c.max_tenants, |v| v.0);
        c.scale_up_limit = s.scale_up_limit.map_or(c.scale_up_limit, |v| v.0);
        if let Some(v) = s.policy {
            // 0 to 2 are policies; 3 and the largest are not.
            c.policy = if v > u32::MAX - 8 { v } else { v % 4 };
        }
        let mut built = Built {
            config: c,
            bad_weights: false,
            weights: Vec::new(),
            names: Vec::new(),
        };
        match &s.weights {
            Some(Weights::Array(list)) => {
                for (name, w) in list.iter().take(12) {
                    let mut k = Vec::new();
                    let (np, nl) = name.raw(&mut k);
                    built.bad_weights |= name.invalid();
                    built.names.push(k);
                    built.weights.push(lg_tenant_weight {
                        tenant: np.cast(),
                        tenant_len: nl,
                        weight: w.0,
                    });
                }
                built.config.tenant_weights = built.weights.as_ptr();
                built.config.tenant_weight_count = built.weights.len();
            }
            Some(Weights::Null(n)) => {
                built.config.tenant_weight_count = usize::from(*n % 3);
                built.bad_weights = built.config.tenant_weight_count > 0;
            }
            None => {}
        }
        built
    }
}

/// See `Call::Fleet`.
fn fleet(busy: bool, remove_worker: bool, settings: Option<&FlowSettings>) -> *mut lg_monitor {
    let model = KNOWN[0].as_bytes();
    let mut m: *mut lg_monitor = null_mut();
    // SAFETY: a NULL config takes the defaults; `m` is a local.
    assert_eq!(unsafe { lg_monitor_new(null(), &mut m) }, lg_status::LG_OK);
    let spec = worker_spec(&Spec {
        dp_size: 1,
        total: Some(Small(100)),
        ..Spec::default()
    });
    // SAFETY: `m` is live; `model` is valid for its length; `spec` is a local.
    let st = unsafe { lg_monitor_add_worker(m, model.as_ptr().cast(), model.len(), 1, &spec) };
    assert_eq!(st, lg_status::LG_OK);
    let update = lg_threshold_update {
        has_active_decode_blocks_threshold: true,
        active_decode_blocks_threshold: 0.5,
        has_active_prefill_tokens_threshold: false,
        active_prefill_tokens_threshold: 0,
        has_active_prefill_tokens_threshold_frac: false,
        active_prefill_tokens_threshold_frac: 0.0,
        clear: 0,
        has_waiting_requests_threshold: false,
        waiting_requests_threshold: 0,
    };
    // SAFETY: as above; `update` is a local; no thresholds out.
    let st = unsafe {
        lg_monitor_set_thresholds(m, model.as_ptr().cast(), model.len(), &update, null_mut())
    };
    assert_eq!(st, lg_status::LG_OK);
    if busy {
        let report = worker_report(&Report {
            used: Some(Small(90)),
            ..Report::default()
        });
        // SAFETY: `m` is live; `report` is a local.
        let st = unsafe { lg_monitor_report(m, 1, 0, &report) };
        assert_eq!(st, lg_status::LG_OK);
    }
    let defaults = FlowSettings {
        queue_limit: Count(8),
        queue_tokens: None,
        deadline_ms: None,
        prompt_weight: None,
        output_weight: None,
        output_estimate: None,
        max_tenants: None,
        scale_up_limit: None,
        policy: None,
        weights: None,
    };
    let built = Built::new(settings.unwrap_or(&defaults));
    // SAFETY: `m` is live; `model` is valid for its length; `Built` holds the config valid.
    let st = checked("lg_monitor_set_flow_control", unsafe {
        lg_monitor_set_flow_control(m, model.as_ptr().cast(), model.len(), &built.config)
    });
    assert!(
        matches!(st, lg_status::LG_OK | lg_status::LG_INVALID_ARGUMENT),
        "lg_monitor_set_flow_control on a known model: {st:?}"
    );
    if remove_worker {
        // SAFETY: `m` is live.
        assert_eq!(unsafe { lg_monitor_remove_worker(m, 1) }, lg_status::LG_OK);
    }
    m
}

/// No request waits in `m`'s queues (NULL: nothing to check), as its
/// `frontend_queue_requests` gauges show: every lg_monitor_dispatch here
/// gives up at once, and one that gives up leaves the queue.
fn assert_no_waiting(m: *mut lg_monitor) {
    if m.is_null() {
        return;
    }
    let mut buf: Vec<u8> = Vec::new();
    let text = loop {
        let mut needed = SENTINEL as usize;
        // SAFETY: `m` is a live monitor from `State::monitors`; `buf` is a local of `buf.len()`
        // bytes (NULL with 0 when empty, which asks for the size); `needed` is a local.
        let st = unsafe {
            lg_monitor_metrics(
                m,
                if buf.is_empty() {
                    null_mut()
                } else {
                    buf.as_mut_ptr().cast()
                },
                buf.len(),
                &mut needed,
            )
        };
        match st {
            lg_status::LG_OK => break std::str::from_utf8(&buf[..needed]).expect("UTF-8 metrics"),
            lg_status::LG_BUFFER_TOO_SMALL => buf = vec![0u8; needed + 1],
            other => panic!("lg_monitor_metrics: {other:?}"),
        }
    };
    for line in text.lines() {
        if !line.starts_with('#') && line.contains("frontend_queue_requests{") {
            assert!(line.ends_with(" 0"), "a request still waits: {line}");
        }
    }
}
