//! The admission gate's calls: config (priority classes included),
//! `lg_gate_new`/`_from_env`/`_free`, admissions (try, blocking with a zero
//! or safe timeout, async with a callback; each also at a priority),
//! limits, close, expiry, classes, stats and metrics.

use std::ptr::{null, null_mut};

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use loadgate_ffi::*;

use crate::args::{Buf, Classes, GateConfig, Handle};
use crate::state::{
    buf_ptr, check_text, checked, dangling, on_admit, pick, refuses_null, stats, take, text_buf,
    CallbackLog, State, SENTINEL,
};

/// A gate call.
#[derive(Debug, Arbitrary)]
pub enum Call {
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
    /// `lg_gate_try_admit`, or `_at` the priority.
    TryAdmit {
        g: Handle,
        priority: Option<u8>,
        out_null: bool,
    },
    /// `lg_gate_admit`, or `_at` the priority.
    Admit {
        g: Handle,
        priority: Option<u8>,
        wait: bool,
        out_null: bool,
    },
    /// `lg_gate_admit_async`, or `_at` the priority.
    AdmitAsync {
        g: Handle,
        priority: Option<u8>,
        callback_null: bool,
        want_ticket: bool,
    },
    Classes {
        g: Handle,
        out_null: bool,
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
}

impl Call {
    /// Makes the call on the input's handles and checks its status,
    /// out-parameters and error message.
    pub fn apply(&self, state: &mut State) {
        match self {
            Call::GateConfigDefault { limit, out_null } => {
                let mut out = std::mem::MaybeUninit::<lg_gate_config>::uninit();
                // SAFETY: each out-pointer is NULL or points at a local.
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
                // The classes array (any length, within reason) or NULL
                // with a count.
                let classes: Vec<lg_gate_class> = match config
                    .as_ref()
                    .and_then(|c| c.classes.as_ref())
                {
                    Some(Classes::Array(list)) => list.iter().take(12).map(|k| k.raw()).collect(),
                    _ => Vec::new(),
                };
                let (classes_ptr, class_count) =
                    match config.as_ref().and_then(|c| c.classes.as_ref()) {
                        Some(Classes::Array(_)) => (classes.as_ptr(), classes.len()),
                        Some(Classes::Null(n)) => (null(), usize::from(*n % 10)),
                        None => (null(), 0),
                    };
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
                        // 0 is no wait limit; 255 is over the largest.
                        wait_limit: if c.wait_limit == 255 {
                            2_097_152
                        } else {
                            u32::from(c.wait_limit % 4)
                        },
                        classes: classes_ptr,
                        class_count,
                    }
                });
                let mut out: *mut lg_gate = dangling();
                // SAFETY: the config is NULL or a local whose prefix comes from `Str::raw`; the
                // out-pointer is NULL or a local.
                let st = checked("lg_gate_new", unsafe {
                    lg_gate_new(
                        cfg.as_ref().map_or(null(), |c| c as *const _),
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null(
                    "lg_gate_new",
                    st,
                    *out_null
                        || cfg.is_none()
                        || (classes_ptr.is_null() && class_count > 0)
                        || class_count > LG_MAX_CLASSES,
                );
                if let Some(c) = cfg.filter(|_| st == lg_status::LG_OK) {
                    // Accepted: every class fits the gate.
                    assert!(classes.len() <= LG_MAX_CLASSES);
                    for k in &classes {
                        assert!(
                            k.queue <= c.queue && k.reserved <= c.limit,
                            "{k:?} in {c:?}"
                        );
                    }
                    // SAFETY: `out` is the live gate just created.
                    let n = unsafe { gate_classes(out) };
                    assert_eq!(n, classes.len().max(1));
                    if !classes.is_empty() {
                        state
                            .reserved
                            .insert(out as usize, classes.iter().map(|k| k.reserved).collect());
                    }
                }
                if st == lg_status::LG_OK {
                    state.gates.push(out);
                } else {
                    assert_eq!(out, dangling(), "out_gate written on failure");
                }
            }
            Call::GateFromEnv { limit, out_null } => {
                let mut out: *mut lg_gate = dangling();
                // SAFETY: each out-pointer is NULL or points at a local.
                let st = checked("lg_gate_from_env", unsafe {
                    lg_gate_from_env(
                        u32::from(*limit % 4),
                        if *out_null { null_mut() } else { &mut out },
                    )
                });
                refuses_null("lg_gate_from_env", st, *out_null || *limit % 4 == 0);
                if st == lg_status::LG_OK {
                    state.gates.push(out);
                } else {
                    assert_eq!(out, dangling(), "out_gate written on failure");
                }
            }
            Call::GateFree(g) => {
                let g = take(&mut state.gates, *g);
                state.reserved.remove(&(g as usize));
                if !g.is_null() {
                    // Queued callbacks would outlive the input's log: close
                    // first so they run now.
                    // SAFETY: `g` is live: it was taken from `State::gates` and checked for NULL.
                    checked("lg_gate_close", unsafe { lg_gate_close(g) });
                }
                // SAFETY: `take` removed `g` from `State::gates` (or gave NULL), so it is freed
                // once and never used again.
                unsafe { lg_gate_free(g) }
            }
            Call::TryAdmit {
                g,
                priority,
                out_null,
            } => {
                let g = pick(&state.gates, *g);
                let mut out: *mut lg_permit = dangling();
                let out_ptr = if *out_null { null_mut() } else { &mut out };
                // SAFETY: `g` is NULL or a live gate from `State::gates`; each out-pointer is NULL
                // or points at a local.
                let st = checked("lg_gate_try_admit", unsafe {
                    match priority {
                        Some(p) => lg_gate_try_admit_at(g, *p, out_ptr),
                        None => lg_gate_try_admit(g, out_ptr),
                    }
                });
                refuses_null("lg_gate_try_admit", st, g.is_null() || *out_null);
                if st == lg_status::LG_OK {
                    state.permits.push(out);
                } else {
                    assert_eq!(out, dangling(), "permit written on failure");
                }
            }
            Call::Admit {
                g,
                priority,
                wait,
                out_null,
            } => {
                let g = pick(&state.gates, *g);
                // Wait without limit only when a slot is free for the
                // request's class (within its share, and a wait slot too)
                // and nobody queues (this thread is the only caller), else
                // time out at once: the target never sleeps.
                let free = !g.is_null() && {
                    let s = stats(g);
                    // The largest reservation of a class more important
                    // than the request's (a priority past the last class is
                    // the last class).
                    let above = state.reserved.get(&(g as usize)).map_or(0, |r| {
                        let class = usize::from(priority.unwrap_or(0)).min(r.len() - 1);
                        r[..class].iter().copied().max().unwrap_or(0)
                    });
                    s.closed
                        || (u64::from(s.running) + u64::from(above) < u64::from(s.limit)
                            && s.queued == 0
                            && (s.wait_limit == 0 || s.waiting < s.wait_limit))
                };
                let timeout = if *wait && free {
                    LG_TIMEOUT_INFINITE
                } else {
                    0
                };
                let mut out: *mut lg_permit = dangling();
                let out_ptr = if *out_null { null_mut() } else { &mut out };
                // SAFETY: `g` is NULL or a live gate from `State::gates`; each out-pointer is NULL
                // or points at a local; the timeout is infinite only when a slot is free, so the
                // call cannot block.
                let st = checked("lg_gate_admit", unsafe {
                    match priority {
                        Some(p) => lg_gate_admit_at(g, *p, timeout, out_ptr),
                        None => lg_gate_admit(g, timeout, out_ptr),
                    }
                });
                refuses_null("lg_gate_admit", st, g.is_null() || *out_null);
                if st == lg_status::LG_OK {
                    state.permits.push(out);
                } else {
                    assert_eq!(out, dangling(), "permit written on failure");
                }
            }
            Call::AdmitAsync {
                g,
                priority,
                callback_null,
                want_ticket,
            } => {
                let g = pick(&state.gates, *g);
                let mut ticket: *mut lg_ticket = dangling();
                let callback: lg_admit_callback =
                    if *callback_null { None } else { Some(on_admit) };
                // Counted before the call: the callback may run inside it.
                state.owed += 1;
                let user_data = (&*state.log as *const CallbackLog).cast_mut().cast();
                let ticket_ptr = if *want_ticket {
                    &mut ticket
                } else {
                    null_mut()
                };
                // SAFETY: `g` is NULL or a live gate from `State::gates`; `user_data` is the
                // input's `CallbackLog`, which outlives every request (gates are closed before it
                // is dropped) and `on_admit` only reads it; the ticket pointer is NULL or a local.
                let st = checked("lg_gate_admit_async", unsafe {
                    match priority {
                        Some(p) => lg_gate_admit_async_at(g, *p, callback, user_data, ticket_ptr),
                        None => lg_gate_admit_async(g, callback, user_data, ticket_ptr),
                    }
                });
                refuses_null("lg_gate_admit_async", st, g.is_null() || *callback_null);
                if st == lg_status::LG_OK {
                    if *want_ticket {
                        assert_ne!(ticket, dangling(), "no ticket");
                        state.tickets.push(ticket);
                    }
                } else {
                    state.owed -= 1;
                    assert_eq!(ticket, dangling(), "ticket written on failure");
                }
            }
            Call::SetLimit { g, limit } => {
                let g = pick(&state.gates, *g);
                let limit = if *limit > 2_097_151 {
                    *limit
                } else {
                    *limit % 6
                };
                // SAFETY: `g` is NULL or a live gate from `State::gates`.
                let st = checked("lg_gate_set_limit", unsafe { lg_gate_set_limit(g, limit) });
                refuses_null(
                    "lg_gate_set_limit",
                    st,
                    g.is_null() || limit == 0 || limit > 2_097_151,
                );
            }
            Call::Classes { g, out_null } => {
                let g = pick(&state.gates, *g);
                let mut out = SENTINEL as usize;
                // SAFETY: `g` is NULL or a live gate from `State::gates`; each out-pointer is NULL
                // or points at a local.
                let st = checked("lg_gate_classes", unsafe {
                    lg_gate_classes(g, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_gate_classes", st, g.is_null() || *out_null);
                if st == lg_status::LG_OK {
                    assert!((1..=LG_MAX_CLASSES).contains(&out), "{out} classes");
                } else {
                    assert_eq!(out, SENTINEL as usize, "out_classes written on failure");
                }
            }
            Call::Close(g) => {
                let g = pick(&state.gates, *g);
                // SAFETY: `g` is live: it was taken from `State::gates` and checked for NULL.
                let st = checked("lg_gate_close", unsafe { lg_gate_close(g) });
                refuses_null("lg_gate_close", st, g.is_null());
            }
            Call::Expire { g, out_null } => {
                let g = pick(&state.gates, *g);
                let mut out = SENTINEL as usize;
                // SAFETY: `g` is NULL or a live gate from `State::gates`; each out-pointer is NULL
                // or points at a local.
                let st = checked("lg_gate_expire", unsafe {
                    lg_gate_expire(g, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_gate_expire", st, g.is_null());
            }
            Call::NextDeadline { g, out_null } => {
                let g = pick(&state.gates, *g);
                let mut out = SENTINEL;
                // SAFETY: `g` is NULL or a live gate from `State::gates`; each out-pointer is NULL
                // or points at a local.
                let st = checked("lg_gate_next_deadline", unsafe {
                    lg_gate_next_deadline(g, if *out_null { null_mut() } else { &mut out })
                });
                refuses_null("lg_gate_next_deadline", st, g.is_null() || *out_null);
            }
            Call::Stats { g, out_null } => {
                let g = pick(&state.gates, *g);
                let mut out = std::mem::MaybeUninit::<lg_gate_stats>::uninit();
                // SAFETY: `g` is NULL or a live gate from `State::gates`; each out-pointer is NULL
                // or points at a local.
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
                    // SAFETY: `g` is a live gate (the call succeeded).
                    assert_eq!(s.class_count, unsafe { gate_classes(g) });
                    let (used, rest) = s.classes.split_at(s.class_count);
                    assert!(
                        rest.iter().all(|k| k.queue_limit == 0 && k.queued == 0),
                        "{s:?}"
                    );
                    // The classes' queues are read with the gauges; the
                    // totals are their sums.
                    assert_eq!(used.iter().map(|k| k.queued).sum::<u32>(), s.queued);
                    assert!(used.iter().all(|k| k.queued <= k.queue_limit), "{s:?}");
                    assert_eq!(used.iter().map(|k| k.displaced).sum::<u64>(), s.displaced);
                    assert_eq!(used[0].displaced, 0, "class 0 displaced");
                    let at_capacity = used.iter().map(|k| k.rejected_at_capacity).sum::<u64>();
                    assert_eq!(at_capacity, s.rejected_at_capacity);
                    assert_eq!(used.iter().map(|k| k.expired).sum::<u64>(), s.expired);
                    let closed = used.iter().map(|k| k.rejected_closed).sum::<u64>();
                    assert_eq!(closed, s.rejected_closed);
                }
            }
            Call::GateMetrics {
                g,
                buf: b,
                out_null,
            } => {
                let g = pick(&state.gates, *g);
                let mut buf = text_buf(*b);
                let (bp, bl) = buf_ptr(*b, &mut buf);
                let mut needed = SENTINEL as usize;
                // SAFETY: `g` is NULL or a live gate from `State::gates`; `(bp, bl)` is NULL or a
                // local buffer of `bl` bytes; each out-pointer is NULL or points at a local.
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
        }
    }
}

/// `lg_gate_classes` of a live gate.
///
/// # Safety
/// `g` is a live gate.
unsafe fn gate_classes(g: *const lg_gate) -> usize {
    let mut n = 0;
    // SAFETY: `g` is live (contract); `n` is a local.
    assert_eq!(unsafe { lg_gate_classes(g, &mut n) }, lg_status::LG_OK);
    n
}
